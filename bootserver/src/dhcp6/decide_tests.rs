//! The DHCPv6 decisions, message by message (RFC 8415 §16, §18.3), and the one-owner
//! property over random interleavings of clients, lapses, failed writes and restarts.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::sync::Arc;

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, ORO, OptionCode, Status,
};
use dhcproto::{Decodable, Decoder};

use super::*;
use crate::backend::StaticBackend;
use crate::config::Settings;
use crate::dhcp6::settings::Dhcp6File;
use crate::leases::{LeaseLog, MemoryLog};

const CONFIG: &str = r#"
serverAddress: 10.99.0.1
dhcp:
  mode: off
machines:
  - name: node-1
    macs: ["52:54:00:66:00:01"]
  - name: reserved
    macs: ["52:54:00:66:00:09"]
    ipv6: fd00:99::103
"#;

const DHCP6: &str = "mode: full\nserverAddress: fd00:99::1\nsubnets:\n- prefix: fd00:99::/64\n  pool: [fd00:99::100, fd00:99::107]\n  dns: [fd00:99::1]\n";

const NOW: u64 = 1_700_000_000;
const SERVER_MAC: [u8; 6] = [0x52, 0x54, 0, 0x99, 0, 1];

struct Server {
    responder: Responder6,
    leases: Arc<Leases>,
    log: Arc<MemoryLog>,
    settings: Arc<Dhcp6Settings>,
}

fn server() -> Server {
    server_with(DHCP6, UnknownMachines::Ignore)
}

fn server_with(dhcp6: &str, unknown: UnknownMachines) -> Server {
    server_on(dhcp6, unknown, Arc::new(MemoryLog::default()))
}

fn server_on(dhcp6: &str, unknown: UnknownMachines, log: Arc<MemoryLog>) -> Server {
    let settings = Settings::parse(CONFIG).unwrap();
    let backend = Arc::new(StaticBackend::new(settings.machines.clone()));
    let file: Dhcp6File = serde_saphyr::from_str(dhcp6).unwrap();
    let dhcp6 = Arc::new(
        file.validate(unknown, Some("br0"))
            .unwrap()
            .with_interface_mac(SERVER_MAC),
    );
    let leases = Arc::new(Leases::open(log.clone()).unwrap());
    Server {
        responder: Responder6::new(
            dhcp6.clone(),
            BootSettings6 {
                uefi_x64: "snponly.efi".to_owned(),
                http_base: "http://[fd00:99::1]:8080".to_owned(),
            },
            backend,
            leases.clone(),
        ),
        leases,
        log,
        settings: dhcp6,
    }
}

/// DUID-EN (type 2) of client `n`: yields no MAC.
fn duid(n: u8) -> Vec<u8> {
    vec![0, 2, 0, 0, 0x01, 0x57, n, n]
}

fn on_link() -> Arrival<'static> {
    Arrival {
        source: "fe80::1234".parse().unwrap(),
        link: "fd00:99::1".parse().unwrap(),
        link_layer: None,
        unicast: false,
    }
}

fn message(kind: MessageType, client: u8) -> Message {
    let mut m = Message::new_with_id(kind, [client, 1, 2]);
    m.opts_mut().insert(DhcpOption::ClientId(duid(client)));
    m
}

fn with_ia(mut m: Message, iaid: u32, addresses: &[Ipv6Addr]) -> Message {
    let mut opts = DhcpOptions::new();
    for a in addresses {
        opts.insert(DhcpOption::IAAddr(IAAddr {
            addr: *a,
            preferred_life: 0,
            valid_life: 0,
            opts: DhcpOptions::new(),
        }));
    }
    m.opts_mut().insert(DhcpOption::IANA(IANA {
        id: iaid,
        t1: 0,
        t2: 0,
        opts,
    }));
    m
}

fn ours(mut m: Message, s: &Server) -> Message {
    m.opts_mut()
        .insert(DhcpOption::ServerId(s.settings.server_duid.clone()));
    m
}

impl Server {
    fn decide(&self, m: &Message) -> Decision6 {
        self.responder.decide(m, &on_link(), NOW)
    }

    /// Decides and, for a reply, writes what it asks to be written: the reply goes out only
    /// if its commits are durable (as the serving loop does).
    fn exchange(&self, m: &Message, now: u64) -> Option<Message> {
        match self.responder.decide(m, &on_link(), now) {
            Decision6::Reply {
                reply,
                commits,
                records,
            } => {
                let mut writes: Vec<_> = records.into_iter().map(|r| (r, None)).collect();
                writes.extend(
                    commits
                        .into_iter()
                        .map(|(l, t)| (Record::Commit(l), Some(t))),
                );
                let taken = self.leases.persist(&writes).ok()?;
                taken.iter().all(|t| *t).then_some(reply)
            }
            Decision6::Drop(_) => None,
        }
    }
}

fn reply_of(d: Decision6) -> (Message, Vec<(Lease, Ticket)>) {
    match d {
        Decision6::Reply { reply, commits, .. } => (reply, commits),
        Decision6::Drop(why) => panic!("dropped: {why:?}"),
    }
}

fn dropped(d: Decision6) -> Drop6 {
    match d {
        Decision6::Drop(why) => why,
        Decision6::Reply { reply, .. } => panic!("answered: {reply}"),
    }
}

/// The address and status of each IA_NA of a reply.
fn ia_answers(m: &Message) -> Vec<(u32, Option<Ipv6Addr>, Option<Status>)> {
    ianas(m)
        .map(|ia| {
            let address = ia.opts.iter().find_map(|o| match o {
                DhcpOption::IAAddr(a) if a.valid_life > 0 => Some(a.addr),
                _ => None,
            });
            let status = ia.opts.iter().find_map(|o| match o {
                DhcpOption::StatusCode(s) => Some(s.status),
                _ => None,
            });
            (ia.id, address, status)
        })
        .collect()
}

fn top_status(m: &Message) -> Option<Status> {
    match m.opts().get(OptionCode::StatusCode) {
        Some(DhcpOption::StatusCode(s)) => Some(s.status),
        _ => None,
    }
}

#[test]
fn solicit_advertise_request_reply_makes_a_durable_lease() {
    let s = server();
    let (advertise, commits) =
        reply_of(s.decide(&with_ia(message(MessageType::Solicit, 1), 7, &[])));
    assert_eq!(advertise.msg_type(), MessageType::Advertise);
    assert!(commits.is_empty(), "an Advertise promises nothing");
    assert_eq!(advertise.xid(), [1, 1, 2]);
    assert_eq!(
        advertise.opts().get(OptionCode::ClientId),
        Some(&DhcpOption::ClientId(duid(1)))
    );
    let [(7, Some(offered), None)] = ia_answers(&advertise)[..] else {
        panic!("{advertise}");
    };
    assert!(s.settings.subnets[0].in_pool(offered));

    let request = ours(with_ia(message(MessageType::Request, 1), 7, &[offered]), &s);
    let reply = s.exchange(&request, NOW).unwrap();
    assert_eq!(reply.msg_type(), MessageType::Reply);
    assert_eq!(ia_answers(&reply), vec![(7, Some(offered), None)]);
    let lease = s.leases.lease_at(offered).unwrap().unwrap();
    assert_eq!(
        lease.key,
        ClientKey::Ia {
            duid: duid(1).into(),
            iaid: 7
        }
    );
    assert_eq!(lease.expires_unix, NOW + 7200);
    // What the log holds is what the book holds.
    assert_eq!(
        s.log.durable().unwrap().by_client(&lease.key),
        Some(lease.clone())
    );
    // T1 and T2 are half and four fifths of the preferred lifetime.
    let ia = ianas(&reply).next().unwrap();
    assert_eq!((ia.t1, ia.t2), (1800, 2880));
}

#[test]
fn rapid_commit_answers_a_solicit_with_a_reply_and_a_commit() {
    let s = server();
    let mut solicit = with_ia(message(MessageType::Solicit, 1), 1, &[]);
    solicit.opts_mut().insert(DhcpOption::RapidCommit);
    let (reply, commits) = reply_of(s.decide(&solicit));
    assert_eq!(reply.msg_type(), MessageType::Reply);
    assert!(reply.opts().get(OptionCode::RapidCommit).is_some());
    assert_eq!(commits.len(), 1);

    let s = server_with(
        &format!("{DHCP6}rapidCommit: false\n"),
        UnknownMachines::Ignore,
    );
    let (advertise, commits) = reply_of(s.decide(&solicit));
    assert_eq!(advertise.msg_type(), MessageType::Advertise);
    assert!(commits.is_empty());
}

#[test]
fn identifiers_are_checked_as_rfc_8415_section_16_says() {
    let s = server();
    let other_server = |m: Message| {
        let mut m = m;
        m.opts_mut()
            .insert(DhcpOption::ServerId(vec![0, 3, 0, 1, 1, 2, 3, 4, 5, 6]));
        m
    };
    let no_client = |kind| Message::new_with_id(kind, [0, 0, 1]);
    for (m, expected) in [
        (no_client(MessageType::Solicit), Drop6::Malformed),
        (ours(message(MessageType::Solicit, 1), &s), Drop6::Malformed),
        (message(MessageType::Request, 1), Drop6::Malformed),
        (
            other_server(message(MessageType::Request, 1)),
            Drop6::OtherServer,
        ),
        (
            other_server(message(MessageType::Renew, 1)),
            Drop6::OtherServer,
        ),
        (ours(no_client(MessageType::Release), &s), Drop6::Malformed),
        (ours(message(MessageType::Rebind, 1), &s), Drop6::Malformed),
        (ours(message(MessageType::Confirm, 1), &s), Drop6::Malformed),
        (
            other_server(message(MessageType::InformationRequest, 1)),
            Drop6::OtherServer,
        ),
        (
            with_ia(message(MessageType::InformationRequest, 1), 1, &[]),
            Drop6::Malformed,
        ),
        (message(MessageType::Advertise, 1), Drop6::NotForServers),
        (message(MessageType::Reply, 1), Drop6::NotForServers),
    ] {
        assert_eq!(dropped(s.decide(&m)), expected, "{m}");
    }
    // A DUID longer than RFC 8415 allows.
    let mut long = Message::new_with_id(MessageType::Solicit, [0, 0, 2]);
    long.opts_mut().insert(DhcpOption::ClientId(vec![0; 131]));
    assert_eq!(dropped(s.decide(&long)), Drop6::Malformed);
}

#[test]
fn unicast_requests_are_told_to_use_multicast() {
    let s = server();
    let unicast = Arrival {
        unicast: true,
        ..on_link()
    };
    let request = ours(with_ia(message(MessageType::Request, 1), 1, &[]), &s);
    let (reply, commits) = reply_of(s.responder.decide(&request, &unicast, NOW));
    assert_eq!(top_status(&reply), Some(Status::UseMulticast));
    assert!(commits.is_empty() && ianas(&reply).next().is_none());
    let solicit = with_ia(message(MessageType::Solicit, 1), 1, &[]);
    assert_eq!(
        dropped(s.responder.decide(&solicit, &unicast, NOW)),
        Drop6::Unicast
    );
}

#[test]
fn each_identity_association_gets_its_own_address_and_keeps_it() {
    let s = server();
    let solicit = with_ia(with_ia(message(MessageType::Solicit, 1), 1, &[]), 2, &[]);
    let mut solicit_rapid = solicit.clone();
    solicit_rapid.opts_mut().insert(DhcpOption::RapidCommit);
    let reply = s.exchange(&solicit_rapid, NOW).unwrap();
    let answers = ia_answers(&reply);
    assert_eq!(answers.len(), 2);
    let (a, b) = (answers[0].1.unwrap(), answers[1].1.unwrap());
    assert_ne!(a, b);
    // Asked again, later: the same addresses.
    let again = s.exchange(&solicit_rapid, NOW + 100).unwrap();
    assert_eq!(ia_answers(&again), answers);
    // Another client gets neither.
    let other = s
        .exchange(
            &{
                let mut m = with_ia(message(MessageType::Solicit, 2), 1, &[a]);
                m.opts_mut().insert(DhcpOption::RapidCommit);
                m
            },
            NOW + 100,
        )
        .unwrap();
    let c = ia_answers(&other)[0].1.unwrap();
    assert!(c != a && c != b, "{c} given twice");
}

#[test]
fn a_full_pool_says_no_addrs_avail() {
    let s = server();
    // Eight addresses, one of them a Machine's reservation.
    for client in 1..=7 {
        let mut m = with_ia(message(MessageType::Solicit, client), 1, &[]);
        m.opts_mut().insert(DhcpOption::RapidCommit);
        assert!(ia_answers(&s.exchange(&m, NOW).unwrap())[0].1.is_some());
    }
    let (advertise, _) = reply_of(s.decide(&with_ia(message(MessageType::Solicit, 9), 1, &[])));
    assert_eq!(
        ia_answers(&advertise),
        vec![(1, None, Some(Status::NoAddrsAvail))]
    );
}

#[test]
fn renew_extends_only_a_binding_the_book_has() {
    let s = server();
    let mut solicit = with_ia(message(MessageType::Solicit, 1), 1, &[]);
    solicit.opts_mut().insert(DhcpOption::RapidCommit);
    let ip = ia_answers(&s.exchange(&solicit, NOW).unwrap())[0]
        .1
        .unwrap();

    let renew = ours(with_ia(message(MessageType::Renew, 1), 1, &[ip]), &s);
    let reply = s.exchange(&renew, NOW + 1800).unwrap();
    assert_eq!(ia_answers(&reply), vec![(1, Some(ip), None)]);
    assert_eq!(
        s.leases.lease_at(ip).unwrap().unwrap().expires_unix,
        NOW + 1800 + 7200
    );
    // Another IAID of the same client has no binding.
    let stranger = ours(with_ia(message(MessageType::Renew, 1), 9, &[ip]), &s);
    let (reply, commits) = reply_of(s.decide(&stranger));
    assert_eq!(ia_answers(&reply), vec![(9, None, Some(Status::NoBinding))]);
    assert!(commits.is_empty());
    // An address of another link gets lifetimes 0.
    let moved: Ipv6Addr = "fd00:42::5".parse().unwrap();
    let rebind = with_ia(message(MessageType::Rebind, 1), 1, &[moved]);
    let (reply, commits) = reply_of(s.decide(&rebind));
    let ia = ianas(&reply).next().unwrap();
    assert!(commits.is_empty());
    assert!(
        ia.opts
            .iter()
            .any(|o| matches!(o, DhcpOption::IAAddr(a) if a.addr == moved && a.valid_life == 0))
    );
}

#[test]
fn rebind_restores_a_lease_a_lost_book_forgot_when_nobody_took_it() {
    let s = server();
    let ip: Ipv6Addr = "fd00:99::104".parse().unwrap();
    let rebind = with_ia(message(MessageType::Rebind, 1), 1, &[ip]);
    let reply = s.exchange(&rebind, NOW).unwrap();
    assert_eq!(ia_answers(&reply), vec![(1, Some(ip), None)]);
    // Someone else's address is not restored to it.
    let other = with_ia(message(MessageType::Rebind, 2), 1, &[ip]);
    let (reply, commits) = reply_of(s.decide(&other));
    assert_eq!(ia_answers(&reply), vec![(1, None, Some(Status::NoBinding))]);
    assert!(commits.is_empty());
}

#[test]
fn release_frees_and_decline_is_the_holders_alone() {
    let s = server();
    let mut solicit = with_ia(message(MessageType::Solicit, 1), 1, &[]);
    solicit.opts_mut().insert(DhcpOption::RapidCommit);
    let ip = ia_answers(&s.exchange(&solicit, NOW).unwrap())[0]
        .1
        .unwrap();

    // Client 2 cannot decline client 1's address.
    let foreign = ours(with_ia(message(MessageType::Decline, 2), 1, &[ip]), &s);
    let reply = s.exchange(&foreign, NOW).unwrap();
    assert_eq!(top_status(&reply), Some(Status::Success));
    assert!(s.leases.lease_at(ip).unwrap().is_some());

    let release = ours(with_ia(message(MessageType::Release, 1), 1, &[ip]), &s);
    let reply = s.exchange(&release, NOW + 10).unwrap();
    assert_eq!(top_status(&reply), Some(Status::Success));
    assert!(s.leases.lease_at(ip).unwrap().is_none());
    assert_eq!(s.log.durable().unwrap().by_ip(ip), None);
    // Released twice: NoBinding for the IA.
    let (reply, _) = reply_of(s.decide(&release));
    assert_eq!(ia_answers(&reply), vec![(1, None, Some(Status::NoBinding))]);

    // Its holder declines it: out of the pool, on disk.
    let ip = ia_answers(&s.exchange(&solicit, NOW + 20).unwrap())[0]
        .1
        .unwrap();
    let decline = ours(with_ia(message(MessageType::Decline, 1), 1, &[ip]), &s);
    s.exchange(&decline, NOW + 30).unwrap();
    assert!(matches!(
        s.log.durable().unwrap().by_ip(ip),
        Some(crate::leases::Binding::Declined { .. })
    ));
    let next = ia_answers(&s.exchange(&solicit, NOW + 40).unwrap())[0]
        .1
        .unwrap();
    assert_ne!(next, ip);
}

#[test]
fn a_machine_gets_its_reservation_and_nobody_else_does() {
    let s = server();
    let reserved: Ipv6Addr = "fd00:99::103".parse().unwrap();
    // Its firmware (DUID-LLT of its NIC), then its OS (another DUID, the same MAC by the
    // link-local address): the address follows the Machine.
    let firmware = |kind| {
        let mut m = Message::new_with_id(kind, [9, 9, 9]);
        m.opts_mut().insert(DhcpOption::ClientId(vec![
            0, 1, 0, 1, 0x31, 0xe5, 0x16, 0xf7, 0x52, 0x54, 0, 0x66, 0, 9,
        ]));
        with_ia(m, 1, &[])
    };
    let mut solicit = firmware(MessageType::Solicit);
    solicit.opts_mut().insert(DhcpOption::RapidCommit);
    assert_eq!(
        ia_answers(&s.exchange(&solicit, NOW).unwrap())[0].1,
        Some(reserved)
    );
    let os = Arrival {
        source: "fe80::5054:ff:fe66:9".parse().unwrap(),
        ..on_link()
    };
    let mut os_solicit = with_ia(message(MessageType::Solicit, 40), 3, &[]);
    os_solicit.opts_mut().insert(DhcpOption::RapidCommit);
    let (reply, commits) = reply_of(s.responder.decide(&os_solicit, &os, NOW + 60));
    assert_eq!(ia_answers(&reply)[0].1, Some(reserved));
    assert_eq!(commits.len(), 1);
    // A stranger that asks for it by name gets another address.
    let mut greedy = with_ia(message(MessageType::Solicit, 41), 1, &[reserved]);
    greedy.opts_mut().insert(DhcpOption::RapidCommit);
    let got = ia_answers(&s.exchange(&greedy, NOW + 60).unwrap())[0]
        .1
        .unwrap();
    assert_ne!(got, reserved);
}

#[test]
fn confirm_says_whether_addresses_are_on_link() {
    let s = server();
    let on: Ipv6Addr = "fd00:99::abc".parse().unwrap();
    let off: Ipv6Addr = "fd00:1::1".parse().unwrap();
    let (reply, _) = reply_of(s.decide(&with_ia(message(MessageType::Confirm, 1), 1, &[on])));
    assert_eq!(top_status(&reply), Some(Status::Success));
    let (reply, _) = reply_of(s.decide(&with_ia(message(MessageType::Confirm, 1), 1, &[on, off])));
    assert_eq!(top_status(&reply), Some(Status::NotOnLink));
    assert_eq!(
        dropped(s.decide(&with_ia(message(MessageType::Confirm, 1), 1, &[]))),
        Drop6::NothingToSay
    );
}

fn ovmf_solicit() -> Message {
    Message::decode(&mut Decoder::new(
        &crate::dhcp6::identify::tests_fixture::ovmf_solicit(),
    ))
    .unwrap()
}

fn boot_url(m: &Message) -> Option<String> {
    m.opts().iter().find_map(|o| match o {
        DhcpOption::Unknown(u) if u16::from(u.code()) == OPTION_BOOTFILE_URL => {
            Some(String::from_utf8_lossy(u.data()).into_owned())
        }
        _ => None,
    })
}

#[test]
fn ovmf_pxe_v6_gets_an_address_and_its_boot_file_when_it_is_a_machine() {
    let s = server();
    let arrival = Arrival {
        source: "fe80::5054:ff:fe66:1".parse().unwrap(),
        ..on_link()
    };
    let (advertise, _) = reply_of(s.responder.decide(&ovmf_solicit(), &arrival, NOW));
    assert_eq!(advertise.msg_type(), MessageType::Advertise);
    assert_eq!(
        boot_url(&advertise).as_deref(),
        Some("tftp://[fd00:99::1]/snponly.efi")
    );
    assert!(ia_answers(&advertise)[0].1.is_some());

    // The same firmware on a NIC no Machine has, discovery off: silence.
    let mut stranger = ovmf_solicit();
    stranger.opts_mut().insert(DhcpOption::ClientId(vec![
        0, 1, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 9,
    ]));
    let stranger_arrival = Arrival {
        source: "fe80::9".parse().unwrap(),
        ..on_link()
    };
    // ClientId is a single option: the fixture's is replaced by the insert above only if
    // dhcproto keeps one per code; check what the message now names.
    let named = option_data(&stranger, OptionCode::ClientId)
        .unwrap()
        .to_vec();
    if named == [0, 1, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 9] {
        assert_eq!(
            dropped(s.responder.decide(&stranger, &stranger_arrival, NOW)),
            Drop6::UnknownBootClient
        );
    }
    // With discovery on it boots.
    let s = server_with(DHCP6, UnknownMachines::Discover);
    let (advertise, _) = reply_of(s.responder.decide(&ovmf_solicit(), &stranger_arrival, NOW));
    assert!(boot_url(&advertise).is_some());
}

#[test]
fn information_request_gets_configuration_and_no_address() {
    let s = server();
    let mut m = message(MessageType::InformationRequest, 1);
    m.opts_mut().insert(DhcpOption::ORO(ORO {
        opts: vec![OptionCode::DomainNameServers],
    }));
    let (reply, commits) = reply_of(s.decide(&m));
    assert!(commits.is_empty() && ianas(&reply).next().is_none());
    assert_eq!(
        reply.opts().get(OptionCode::DomainNameServers),
        Some(&DhcpOption::DomainNameServers(vec![
            "fd00:99::1".parse().unwrap()
        ]))
    );
}

#[test]
fn proxy_mode_gives_boot_options_and_never_an_address() {
    let s = server_with(
        "mode: proxy\nserverAddress: fd00:99::1\n",
        UnknownMachines::Ignore,
    );
    let arrival = Arrival {
        source: "fe80::5054:ff:fe66:1".parse().unwrap(),
        ..on_link()
    };
    let (advertise, commits) = reply_of(s.responder.decide(&ovmf_solicit(), &arrival, NOW));
    assert_eq!(advertise.msg_type(), MessageType::Advertise);
    assert!(commits.is_empty());
    assert!(ianas(&advertise).next().is_none());
    assert!(boot_url(&advertise).is_some());
    // As the client reads it: encoded, then decoded.
    let advertise = {
        use dhcproto::{Encodable, Encoder};
        let mut bytes = Vec::new();
        advertise.encode(&mut Encoder::new(&mut bytes)).unwrap();
        Message::decode(&mut Decoder::new(&bytes)).unwrap()
    };
    assert!(matches!(
        advertise.opts().get(OptionCode::VendorClass),
        Some(DhcpOption::VendorClass(v)) if v.num == 343 && v.data == vec![b"PXEClient".to_vec()]
    ));
    // An OS's DHCPv6 client is the network's own server's business.
    assert_eq!(
        dropped(s.decide(&with_ia(message(MessageType::Solicit, 1), 1, &[]))),
        Drop6::NotBooting
    );
}

/// Encoded and decoded, as the client reads it.
fn on_the_wire(m: &Message) -> Message {
    use dhcproto::{Encodable, Encoder};
    let mut bytes = Vec::new();
    m.encode(&mut Encoder::new(&mut bytes)).unwrap();
    Message::decode(&mut Decoder::new(&bytes)).unwrap()
}

/// The Request UEFI PXEv6 sends a proxy offer's server on port 4011 (edk2's
/// `PxeBcRequestBootService`, measured in `tests/pxe6.rs`): its Request's options without
/// the IA, our Server Identifier, unicast from the address the network's server gave it.
#[test]
fn proxy_mode_answers_the_pxe_boot_service_request_with_the_boot_file_only() {
    let s = server_with(
        "mode: proxy\nserverAddress: fd00:99::1\n",
        UnknownMachines::Ignore,
    );
    let solicit = ovmf_solicit();
    let mut request = Message::new_with_id(MessageType::Request, solicit.xid());
    for option in solicit.opts().iter() {
        if !matches!(option, DhcpOption::IANA(_)) {
            request.opts_mut().insert(option.clone());
        }
    }
    request
        .opts_mut()
        .insert(DhcpOption::ServerId(s.settings.server_duid.clone()));
    let from_firmware = Arrival {
        source: "fd00:99::1d6".parse().unwrap(),
        ..on_link()
    };
    let (reply, commits) = reply_of(s.responder.decide(&request, &from_firmware, NOW));
    let reply = on_the_wire(&reply);
    assert_eq!(reply.msg_type(), MessageType::Reply);
    assert!(commits.is_empty() && ianas(&reply).next().is_none());
    assert_eq!(
        boot_url(&reply).as_deref(),
        Some("tftp://[fd00:99::1]/snponly.efi")
    );
    // On port 547 the same unicast Request is told to multicast (RFC 8415 §16): which is
    // why port 4011 is served apart, as not unicast.
    let on_547 = Arrival {
        unicast: true,
        ..from_firmware
    };
    let (told, _) = reply_of(s.responder.decide(&request, &on_547, NOW));
    assert!(matches!(
        told.opts().get(OptionCode::StatusCode),
        Some(DhcpOption::StatusCode(c)) if c.status == Status::UseMulticast
    ));
    // Another server's Request is not ours to answer.
    let mut theirs = request.clone();
    theirs.opts_mut().remove(OptionCode::ServerId);
    theirs
        .opts_mut()
        .insert(DhcpOption::ServerId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 9]));
    assert_eq!(
        dropped(s.responder.decide(&theirs, &from_firmware, NOW)),
        Drop6::OtherServer
    );
}

/// UEFI HTTP boot's Solicit in proxy mode: the Advertise carries one vendor class, its own
/// `HTTPClient` echoed, not `PXEClient` beside it (found on the VM: both were sent).
#[test]
fn a_proxy_advertise_to_http_boot_carries_its_class_alone() {
    let s = server_with(
        "mode: proxy\nserverAddress: fd00:99::1\n",
        UnknownMachines::Ignore,
    );
    let mut solicit = ovmf_solicit();
    solicit.opts_mut().remove(OptionCode::VendorClass);
    solicit.opts_mut().remove(OptionCode::ClientArchType);
    solicit.opts_mut().insert(crate::dhcp6::boot::vendor_class(
        343,
        b"HTTPClient:Arch:00016:UNDI:003000",
    ));
    solicit.opts_mut().insert(DhcpOption::ClientArchType(vec![
        dhcproto::v6::Architecture::from(16),
    ]));
    let solicit = on_the_wire(&solicit);
    let (advertise, _) = reply_of(s.responder.decide(&solicit, &on_link(), NOW));
    let advertise = on_the_wire(&advertise);
    assert_eq!(advertise.msg_type(), MessageType::Advertise);
    let classes: Vec<_> = advertise
        .opts()
        .get_all(OptionCode::VendorClass)
        .unwrap_or_default()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::VendorClass(v) => Some(v.data.concat()),
            _ => None,
        })
        .collect();
    assert_eq!(classes, vec![b"HTTPClient".to_vec()]);
    assert!(boot_url(&advertise).is_some_and(|u| u.starts_with("http://[fd00:99::1]:8080/")));
}

#[test]
fn v4_and_v6_leases_share_one_book_and_one_log() {
    let s = server();
    let v4 = Lease {
        key: ClientKey::Hardware(MacAddr([0x52, 0x54, 0, 0, 0, 1])),
        mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
        ip: "10.99.0.100".parse().unwrap(),
        expires_unix: NOW + 3600,
    };
    let ticket = s
        .leases
        .book()
        .unwrap()
        .begin_commit(&v4.key, v4.mac, v4.ip, NOW)
        .unwrap();
    s.leases
        .persist(&[(Record::Commit(v4.clone()), Some(ticket))])
        .unwrap();
    let mut solicit = with_ia(message(MessageType::Solicit, 1), 1, &[]);
    solicit.opts_mut().insert(DhcpOption::RapidCommit);
    let ip = ia_answers(&s.exchange(&solicit, NOW).unwrap())[0]
        .1
        .unwrap();
    // A restart reads both back from the one log.
    let again = server_on(DHCP6, UnknownMachines::Ignore, s.log.clone());
    assert_eq!(again.leases.lease_at(v4.ip).unwrap(), Some(v4));
    assert!(again.leases.lease_at(ip).unwrap().is_some());
    again.leases.book().unwrap().check().unwrap();
    // A v6 key cannot be given a v4 address.
    let key = ClientKey::Ia {
        duid: duid(1).into(),
        iaid: 1,
    };
    assert_eq!(
        again.leases.book().unwrap().begin_commit(
            &key,
            MacAddr([0; 6]),
            "10.99.0.101".parse().unwrap(),
            NOW
        ),
        Err(Refused::OtherFamily)
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// One step of the interleaving.
    #[derive(Debug, Clone)]
    enum Step {
        Solicit {
            client: u8,
            iaid: u8,
            rapid: bool,
        },
        /// Request what the client was last advertised (or a pool address it names).
        Request {
            client: u8,
            iaid: u8,
            pick: u8,
        },
        Renew {
            client: u8,
            iaid: u8,
        },
        Rebind {
            client: u8,
            iaid: u8,
            pick: u8,
        },
        Release {
            client: u8,
            iaid: u8,
        },
        Decline {
            client: u8,
            iaid: u8,
        },
        Wait(u64),
        /// The log fails its writes from now on (`true`) or works again.
        Disk(bool),
        /// A restart: the book is read back from the log.
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        let client = 1u8..=5;
        let iaid = 0u8..2;
        prop_oneof![
            (client.clone(), iaid.clone(), any::<bool>()).prop_map(|(client, iaid, rapid)| {
                Step::Solicit {
                    client,
                    iaid,
                    rapid,
                }
            }),
            (client.clone(), iaid.clone(), 0u8..10)
                .prop_map(|(client, iaid, pick)| Step::Request { client, iaid, pick }),
            (client.clone(), iaid.clone()).prop_map(|(client, iaid)| Step::Renew { client, iaid }),
            (client.clone(), iaid.clone(), 0u8..10).prop_map(|(client, iaid, pick)| Step::Rebind {
                client,
                iaid,
                pick
            }),
            (client.clone(), iaid.clone())
                .prop_map(|(client, iaid)| Step::Release { client, iaid }),
            (client, iaid).prop_map(|(client, iaid)| Step::Decline { client, iaid }),
            prop_oneof![Just(10u64), Just(40), Just(3000), Just(8000)].prop_map(Step::Wait),
            any::<bool>().prop_map(Step::Disk),
            Just(Step::Restart),
        ]
    }

    fn pool(pick: u8) -> Ipv6Addr {
        Ipv6Addr::from(
            u128::from(Ipv6Addr::from([0xfd00, 0x99, 0, 0, 0, 0, 0, 0x100])) + u128::from(pick),
        )
    }

    /// What was promised: address → (key, until), from every Reply that went out.
    #[derive(Default)]
    struct Promises(HashMap<Ipv6Addr, (ClientKey, u64)>);

    impl Promises {
        /// A Reply promising `ip` to `key` until `until`, sent at `now`: nobody else may
        /// hold a promise of it that has not expired, nor a decline.
        fn promise(
            &mut self,
            ip: Ipv6Addr,
            key: &ClientKey,
            until: u64,
            now: u64,
        ) -> Result<(), String> {
            if let Some((other, end)) = self.0.get(&ip)
                && other != key
                && *end > now
            {
                return Err(format!(
                    "{ip} promised to {key} while {other}'s until {end} (now {now})"
                ));
            }
            // An identity association holds one address: its earlier one ends here.
            self.0.retain(|_, (k, _)| k != key);
            self.0.insert(ip, (key.clone(), until));
            Ok(())
        }
    }

    fn run(steps: Vec<Step>) -> Result<(), String> {
        let log = Arc::new(MemoryLog::default());
        let mut s = server_on(DHCP6, UnknownMachines::Ignore, log.clone());
        let mut now = NOW;
        let mut promises = Promises::default();
        // The last address each (client, iaid) was advertised or given.
        let mut known: HashMap<(u8, u8), Ipv6Addr> = HashMap::new();
        for step in steps {
            let (m, client, iaid) = match step {
                Step::Wait(seconds) => {
                    now += seconds;
                    continue;
                }
                Step::Disk(failing) => {
                    log.set_failing(failing);
                    continue;
                }
                Step::Restart => {
                    s = server_on(DHCP6, UnknownMachines::Ignore, log.clone());
                    continue;
                }
                Step::Solicit {
                    client,
                    iaid,
                    rapid,
                } => {
                    let mut m = with_ia(message(MessageType::Solicit, client), iaid.into(), &[]);
                    if rapid {
                        m.opts_mut().insert(DhcpOption::RapidCommit);
                    }
                    (m, client, iaid)
                }
                Step::Request { client, iaid, pick } => {
                    let ip = known.get(&(client, iaid)).copied().unwrap_or(pool(pick));
                    (
                        ours(
                            with_ia(message(MessageType::Request, client), iaid.into(), &[ip]),
                            &s,
                        ),
                        client,
                        iaid,
                    )
                }
                Step::Renew { client, iaid } => {
                    let Some(ip) = known.get(&(client, iaid)).copied() else {
                        continue;
                    };
                    (
                        ours(
                            with_ia(message(MessageType::Renew, client), iaid.into(), &[ip]),
                            &s,
                        ),
                        client,
                        iaid,
                    )
                }
                Step::Rebind { client, iaid, pick } => {
                    let ip = known.get(&(client, iaid)).copied().unwrap_or(pool(pick));
                    (
                        with_ia(message(MessageType::Rebind, client), iaid.into(), &[ip]),
                        client,
                        iaid,
                    )
                }
                Step::Release { client, iaid } => {
                    let Some(ip) = known.get(&(client, iaid)).copied() else {
                        continue;
                    };
                    (
                        ours(
                            with_ia(message(MessageType::Release, client), iaid.into(), &[ip]),
                            &s,
                        ),
                        client,
                        iaid,
                    )
                }
                Step::Decline { client, iaid } => {
                    let Some(ip) = known.get(&(client, iaid)).copied() else {
                        continue;
                    };
                    (
                        ours(
                            with_ia(message(MessageType::Decline, client), iaid.into(), &[ip]),
                            &s,
                        ),
                        client,
                        iaid,
                    )
                }
            };
            let key = ClientKey::Ia {
                duid: duid(client).into(),
                iaid: iaid.into(),
            };
            let decision = s.responder.decide(&m, &on_link(), now);
            let gives_back = matches!(m.msg_type(), MessageType::Release | MessageType::Decline);
            if let Decision6::Reply {
                reply,
                commits,
                records,
            } = decision
            {
                if gives_back {
                    // The client gave the address up whether or not our reply reaches it.
                    if let Some(ip) = known.remove(&(client, iaid)) {
                        promises.0.retain(|a, (k, _)| !(*a == ip && *k == key));
                    }
                }
                let mut writes: Vec<_> = records.into_iter().map(|r| (r, None)).collect();
                let promised: Vec<Lease> = commits.iter().map(|(l, _)| l.clone()).collect();
                writes.extend(
                    commits
                        .into_iter()
                        .map(|(l, t)| (Record::Commit(l), Some(t))),
                );
                let sent = match s.leases.persist(&writes) {
                    Ok(taken) => taken.iter().all(|t| *t),
                    Err(_) => false,
                };
                if sent {
                    for lease in &promised {
                        if lease.ip == IpAddr::from(pool(3)) {
                            return Err(format!("{lease:?}: another Machine's reservation"));
                        }
                        let ip = v6(lease.ip).ok_or("a v4 address in a v6 reply")?;
                        if lease.key != key {
                            return Err(format!("a reply to {key} promises {lease:?}"));
                        }
                        promises.promise(ip, &lease.key, lease.expires_unix, now)?;
                    }
                    if !gives_back && let Some((_, Some(ip), _)) = ia_answers(&reply).first() {
                        known.insert((client, iaid), *ip);
                    }
                }
            }
            s.leases.book().map_err(|e| e.to_string())?.check()?;
            // The book shows nothing as durable that the log lacks.
            let durable = log.durable().map_err(|e| e.to_string())?;
            let book = s.leases.book().map_err(|e| e.to_string())?;
            for pick in 0..8 {
                if let Some(lease) = book.lease_at(pool(pick).into())
                    && durable.by_client(&lease.key).as_ref() != Some(&lease)
                {
                    return Err(format!("the book shows {lease:?}, the log does not"));
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every address a Reply promised is promised to one identity association at a
        /// time, whatever the interleaving of clients, lapses, failed writes and restarts,
        /// and the book's own invariants hold after every step.
        /// Arbitrary bytes, and the OVMF Solicit with bytes changed, through the fuzz
        /// target's body (relay envelopes, decoding, the decision, persisting, encoding):
        /// nothing panics and every invariant it checks holds.
        #[test]
        fn damaged_messages_never_break_the_server(
            noise in proptest::collection::vec(any::<u8>(), 0..400),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            control in any::<u8>(),
        ) {
            crate::fuzzing::dhcp6(&noise);
            let mut solicit = crate::dhcp6::identify::tests_fixture::ovmf_solicit();
            for (at, byte) in flips {
                let len = solicit.len();
                solicit[at % len] = byte;
            }
            let mut data = vec![control];
            data.extend_from_slice(&solicit);
            crate::fuzzing::dhcp6(&data);
        }

        #[test]
        fn one_owner_per_v6_address(steps in proptest::collection::vec(step(), 1..60)) {
            prop_assert_eq!(run(steps), Ok(()));
        }
    }
}
