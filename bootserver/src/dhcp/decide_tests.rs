//! The decisions the RFCs prescribe, with raw requests: table by table.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use dhcproto::v4::{DhcpOption, MessageType, OptionCode};

use super::Decision;
use super::DropReason;
use super::decide::Responder;
use super::wire::{self, Request};
use crate::backend::{MacAddr, StaticBackend};
use crate::config::Settings;
use crate::leases::{ClientKey, Leases, Record};

const CONFIG: &str = r#"
serverAddress: 10.99.0.1
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.199]
    - subnet: 10.98.0.0/24
      pool: [10.98.0.100, 10.98.0.199]
    - subnet: 10.97.0.0/24
      pool: [10.97.0.100, 10.97.0.199]
machines:
  - name: node-1
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.21
"#;

const NOW: u64 = 1_700_000_000;
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

struct Server {
    responder: Responder,
    leases: Arc<Leases>,
}

fn server() -> Server {
    server_with(CONFIG)
}

fn server_with(config: &str) -> Server {
    let settings = Settings::parse(config).unwrap();
    let backend = Arc::new(StaticBackend::new(settings.machines.clone()));
    let leases = Arc::new(Leases::in_memory());
    Server {
        responder: Responder::new(Arc::new(settings), backend, leases.clone()),
        leases,
    }
}

/// A request datagram.
#[derive(Clone)]
struct Packet {
    mac: [u8; 6],
    ciaddr: Ipv4Addr,
    giaddr: Ipv4Addr,
    options: Vec<u8>,
}

fn packet(kind: u8, mac: u8) -> Packet {
    Packet {
        mac: [0x52, 0x54, 0, 0, 0, mac],
        ciaddr: Ipv4Addr::UNSPECIFIED,
        giaddr: Ipv4Addr::UNSPECIFIED,
        options: vec![53, 1, kind],
    }
}

impl Packet {
    fn option(mut self, code: u8, value: &[u8]) -> Self {
        self.options.push(code);
        self.options.push(value.len() as u8);
        self.options.extend_from_slice(value);
        self
    }
    fn requested(self, ip: [u8; 4]) -> Self {
        self.option(50, &ip)
    }
    fn server_id(self) -> Self {
        self.option(54, &SERVER.octets())
    }
    fn ciaddr(mut self, ip: [u8; 4]) -> Self {
        self.ciaddr = ip.into();
        self
    }
    fn relayed_by(mut self, giaddr: [u8; 4]) -> Self {
        self.giaddr = giaddr.into();
        self
    }
    fn parse(&self) -> Request {
        let mut p = vec![0u8; wire::HEADER_LEN];
        p[..4].copy_from_slice(&[1, 1, 6, 0]);
        p[4..8].copy_from_slice(&[0, 0, 0x12, 0x34]);
        p[12..16].copy_from_slice(&self.ciaddr.octets());
        p[24..28].copy_from_slice(&self.giaddr.octets());
        p[28..34].copy_from_slice(&self.mac);
        p.extend_from_slice(&wire::MAGIC_COOKIE);
        p.extend_from_slice(&self.options);
        p.push(255);
        wire::parse(&p).unwrap()
    }
}

impl Server {
    /// Decides, and persists what the socket loop would (commit, release, decline).
    fn ask(&self, p: &Packet) -> Decision {
        self.ask_at(p, NOW)
    }

    fn ask_at(&self, p: &Packet, now: u64) -> Decision {
        let decision = self.responder.decide(
            &p.parse(),
            SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68),
            67,
            now,
        );
        let write = match &decision {
            Decision::Reply {
                commit: Some((lease, ticket)),
                ..
            } => Some((Record::Commit(lease.clone()), Some(*ticket))),
            Decision::Release { key, ip } => Some((
                Record::Release {
                    key: key.clone(),
                    ip: (*ip).into(),
                },
                None,
            )),
            Decision::Decline { ip, until } => Some((
                Record::Decline {
                    ip: (*ip).into(),
                    until_unix: *until,
                },
                None,
            )),
            _ => None,
        };
        if let Some(write) = write {
            assert_eq!(self.leases.persist(&[write]).unwrap(), [true]);
        }
        self.leases.book().unwrap().check().unwrap();
        decision
    }

    /// DISCOVER then REQUEST: the address acknowledged.
    fn lease(&self, discover: Packet) -> Ipv4Addr {
        let offered = yiaddr(&self.ask(&discover));
        let mut request = discover.clone();
        request.options[2] = 3;
        let request = request.server_id().requested(offered.octets());
        assert_eq!(kind(&self.ask(&request)), Some(MessageType::Ack));
        offered
    }
}

fn kind(decision: &Decision) -> Option<MessageType> {
    match decision {
        Decision::Reply { reply, .. } => reply.kind(),
        _ => None,
    }
}

fn yiaddr(decision: &Decision) -> Ipv4Addr {
    match decision {
        Decision::Reply { reply, .. } => reply.message.yiaddr(),
        other => panic!("no reply: {other:?}"),
    }
}

fn destination(decision: &Decision) -> SocketAddrV4 {
    match decision {
        Decision::Reply { to, .. } => *to,
        other => panic!("no reply: {other:?}"),
    }
}

/// The options of the encoded reply, in order.
fn encoded_options(decision: &Decision) -> Vec<(u8, Vec<u8>)> {
    let Decision::Reply { reply, .. } = decision else {
        panic!("no reply: {decision:?}");
    };
    let bytes = reply.encode().unwrap();
    let mut out = Vec::new();
    let mut i = wire::HEADER_LEN + 4;
    while bytes[i] != 255 {
        let len = usize::from(bytes[i + 1]);
        out.push((bytes[i], bytes[i + 2..i + 2 + len].to_vec()));
        i += 2 + len;
    }
    out
}

#[test]
fn init_reboot_on_the_wrong_network_gets_a_nak_at_once() {
    let s = server();
    // RFC 2131 §4.3.2: no server identifier, requested address, no ciaddr.
    let moved = packet(3, 9).requested([192, 168, 5, 20]);
    let nak = s.ask(&moved);
    assert_eq!(kind(&nak), Some(MessageType::Nak), "{nak:?}");
    assert_eq!(
        destination(&nak),
        SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
    );
    // Relayed from the 10.98 rack with a 10.99 address: NAK through the relay, broadcast bit.
    let relayed = packet(3, 9)
        .requested([10, 99, 0, 150])
        .relayed_by([10, 98, 0, 1]);
    let nak = s.ask(&relayed);
    assert_eq!(kind(&nak), Some(MessageType::Nak));
    assert_eq!(
        destination(&nak),
        SocketAddrV4::new(Ipv4Addr::new(10, 98, 0, 1), 67)
    );
    let Decision::Reply { reply, .. } = &nak else {
        unreachable!()
    };
    assert!(reply.message.flags().broadcast());
}

#[test]
fn init_reboot_on_the_right_network_is_answered_only_with_a_record() {
    let s = server();
    // Nobody we know: silent, another server may own it.
    let stranger = packet(3, 9).requested([10, 99, 0, 150]);
    assert_eq!(s.ask(&stranger), Decision::Drop(DropReason::UnknownClient));
    // A client with a lease gets it back, and a NAK for any other address.
    let ip = s.lease(packet(1, 9));
    assert_eq!(
        kind(&s.ask(&packet(3, 9).requested(ip.octets()))),
        Some(MessageType::Ack)
    );
    let other = packet(3, 9).requested([10, 99, 0, 199]);
    assert_eq!(kind(&s.ask(&other)), Some(MessageType::Nak));
    // A Machine's reservation is a record too.
    let reserved = packet(3, 1).requested([10, 99, 0, 21]);
    assert_eq!(kind(&s.ask(&reserved)), Some(MessageType::Ack));
}

#[test]
fn the_client_identifier_keys_the_lease_and_is_echoed() {
    let s = server();
    let id = b"\x00my-client";
    let ip = s.lease(packet(1, 0x31).option(61, id));
    // Same identifier from another NIC: the same lease (RFC 2131 §4.2).
    let offer = s.ask(&packet(1, 0x32).option(61, id));
    assert_eq!(yiaddr(&offer), ip);
    assert!(
        encoded_options(&offer).contains(&(61, id.to_vec())),
        "RFC 6842 echo"
    );
    assert_eq!(s.lease(packet(1, 0x32).option(61, id)), ip);
    // The first NIC without the identifier is another client.
    assert_ne!(yiaddr(&s.ask(&packet(1, 0x31))), ip);
    assert_eq!(
        s.leases
            .book()
            .unwrap()
            .lease_of(&ClientKey::Id(Box::from(&id[..])))
            .map(|l| l.mac),
        Some(MacAddr([0x52, 0x54, 0, 0, 0, 0x32]))
    );
}

#[test]
fn a_machines_mac_wins_over_its_client_identifier() {
    let s = server();
    // The booted OS sends a DUID: the Machine's reservation all the same.
    let duid = [255, 0, 0, 0, 1, 0, 2, 0, 0, 0, 9];
    assert_eq!(
        s.lease(packet(1, 1).option(61, &duid)),
        Ipv4Addr::new(10, 99, 0, 21)
    );
    // And its firmware without one: the same address.
    assert_eq!(s.lease(packet(1, 1)), Ipv4Addr::new(10, 99, 0, 21));
    // Moved behind a relay on another network: an address of that network, not its
    // reservation, which it could not use there.
    let moved = s.ask(&packet(1, 1).relayed_by([10, 98, 0, 1]));
    assert!(
        yiaddr(&moved).octets().starts_with(&[10, 98, 0]),
        "{moved:?}"
    );
}

#[test]
fn relay_information_is_echoed_and_selects_the_subnet() {
    let s = server();
    let circuit = [1, 4, b'p', b'o', b'r', b't'];
    let with_link = |link: [u8; 4]| {
        let mut v = circuit.to_vec();
        v.extend_from_slice(&[5, 4]);
        v.extend_from_slice(&link);
        v
    };
    let cases: [(&str, Packet, Option<[u8; 3]>); 5] = [
        (
            "giaddr",
            packet(1, 0x41)
                .relayed_by([10, 98, 0, 1])
                .option(82, &circuit),
            Some([10, 98, 0]),
        ),
        (
            "link selection over giaddr",
            packet(1, 0x42)
                .relayed_by([10, 98, 0, 1])
                .option(82, &with_link([10, 97, 0, 0])),
            Some([10, 97, 0]),
        ),
        (
            "link selection over option 118",
            packet(1, 0x43)
                .relayed_by([10, 98, 0, 1])
                .option(118, &[10, 99, 0, 0])
                .option(82, &with_link([10, 97, 0, 0])),
            Some([10, 97, 0]),
        ),
        (
            "option 118 over giaddr",
            packet(1, 0x44)
                .relayed_by([10, 98, 0, 1])
                .option(118, &[10, 97, 0, 0]),
            Some([10, 97, 0]),
        ),
        (
            "link selection ignored without a relay",
            packet(1, 0x45).option(82, &with_link([10, 97, 0, 0])),
            Some([10, 99, 0]),
        ),
    ];
    for (case, request, subnet) in cases {
        let decision = s.ask(&request);
        let ip = yiaddr(&decision).octets();
        assert_eq!(Some([ip[0], ip[1], ip[2]]), subnet, "{case}");
        let options = encoded_options(&decision);
        let parsed = request.parse();
        if let Some(info) = &parsed.relay_agent_info {
            assert_eq!(
                options.last(),
                Some(&(82, info.raw.clone())),
                "{case}: option 82 last, unchanged"
            );
        }
        if let Some(selection) = parsed.subnet_selection {
            assert!(
                options.contains(&(118, selection.octets().to_vec())),
                "{case}: 118 echoed"
            );
        }
        if parsed.relayed() {
            assert_eq!(
                destination(&decision),
                SocketAddrV4::new(parsed.giaddr, 67),
                "{case}"
            );
        }
    }
    // A relay for a network we do not serve.
    let foreign = packet(1, 0x46).relayed_by([172, 16, 0, 1]);
    assert_eq!(s.ask(&foreign), Decision::Drop(DropReason::UnknownSubnet));
}

#[test]
fn relayed_acks_and_naks_echo_option_82() {
    let s = server();
    let info = [2, 3, 9, 9, 9, 1, 1, 7];
    let discover = packet(1, 0x51).relayed_by([10, 98, 0, 1]).option(82, &info);
    let ip = yiaddr(&s.ask(&discover));
    let mut request = discover.clone();
    request.options[2] = 3;
    let ack = s.ask(&request.clone().server_id().requested(ip.octets()));
    assert_eq!(encoded_options(&ack).last(), Some(&(82, info.to_vec())));
    let nak = s.ask(&request.requested([10, 97, 0, 5]));
    assert_eq!(kind(&nak), Some(MessageType::Nak));
    assert_eq!(encoded_options(&nak).last(), Some(&(82, info.to_vec())));
}

#[test]
fn only_the_holder_may_decline_or_release_an_address() {
    let s = server();
    let ip = s.lease(packet(1, 0x61));
    let intruder = packet(4, 0x62).requested(ip.octets());
    assert_eq!(s.ask(&intruder), Decision::Drop(DropReason::NotHeld));
    let release = packet(7, 0x62).ciaddr(ip.octets());
    assert_eq!(s.ask(&release), Decision::Drop(DropReason::NotHeld));
    let release = packet(7, 0x61).ciaddr(ip.octets());
    assert!(matches!(s.ask(&release), Decision::Release { .. }));
    let ip = s.lease(packet(1, 0x61));
    assert_eq!(
        s.ask(&packet(4, 0x61).requested(ip.octets())),
        Decision::Decline {
            ip,
            until: NOW + super::decide::DECLINE_HOLD.as_secs()
        }
    );
    // A declined address is not offered again.
    assert_ne!(yiaddr(&s.ask(&packet(1, 0x63))), ip);
}

#[test]
fn a_server_id_of_another_server_is_not_ours_to_answer() {
    let s = server();
    let request = packet(3, 0x71)
        .option(54, &[10, 99, 0, 2])
        .requested([10, 99, 0, 150]);
    assert_eq!(s.ask(&request), Decision::Drop(DropReason::OtherServer));
    // And the NAK carries a message for the operator reading a capture.
    let nak = s.ask(&packet(3, 9).requested([192, 168, 5, 20]));
    let Decision::Reply { reply, .. } = nak else {
        unreachable!()
    };
    assert!(matches!(
        reply.message.opts().get(OptionCode::Message),
        Some(DhcpOption::Message(m)) if m.contains("not on this network")
    ));
}

/// A REQUEST for the address offered to `mac`, as a client in SELECTING sends it.
fn select(mac: u8, ip: Ipv4Addr) -> Packet {
    packet(3, mac).server_id().requested(ip.octets())
}

/// The defect seen with raw packets: client 1's offer lapses, client 2 is offered the
/// address, client 1 comes back and is offered another one (which erased 2's hold), a third
/// client was then offered 2's address too, and both REQUESTs were acknowledged.
#[test]
fn a_lapsed_offer_never_leads_to_two_acks_for_one_address() {
    let s = server_with(
        r#"
serverAddress: 10.99.0.1
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.102]
"#,
    );
    let hold = super::allocate::OFFER_HOLD.as_secs();
    let first = yiaddr(&s.ask_at(&packet(1, 1), NOW));
    // 1's offer lapses; 2 is offered the same address.
    let t = NOW + hold + 1;
    let second = yiaddr(&s.ask_at(&packet(1, 2).requested(first.octets()), t));
    assert_eq!(second, first);
    // 1 comes back and is offered another address.
    let again = yiaddr(&s.ask_at(&packet(1, 1), t + 1));
    assert_ne!(again, first);
    // A third client must not be offered 2's address.
    let third = yiaddr(&s.ask_at(&packet(1, 3).requested(first.octets()), t + 2));
    assert_ne!(third, first, "2's offer still holds {first}");
    // Both REQUESTs for that address: only the holder's is acknowledged.
    assert_eq!(
        kind(&s.ask_at(&select(2, first), t + 3)),
        Some(MessageType::Ack)
    );
    assert_eq!(
        kind(&s.ask_at(&select(3, first), t + 3)),
        Some(MessageType::Nak)
    );
    assert_eq!(
        kind(&s.ask_at(&select(1, first), t + 3)),
        Some(MessageType::Nak)
    );
}

/// A Machine's reservation inside the pool is never given to another client, whatever it
/// asks for, and the Machine gets it.
#[test]
fn a_reservation_inside_the_pool_is_only_the_machines() {
    let s = server_with(
        r#"
serverAddress: 10.99.0.1
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.101]
machines:
  - name: reserved
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.100
"#,
    );
    let reserved = Ipv4Addr::new(10, 99, 0, 100);
    // Others are offered the rest of the pool, never the reservation, even when asking
    // for it (a third client gets the second's offer, reclaimed: the pool ran out).
    let other = Ipv4Addr::new(10, 99, 0, 101);
    assert_eq!(yiaddr(&s.ask(&packet(1, 2))), other);
    assert_eq!(
        yiaddr(&s.ask(&packet(1, 3).requested(reserved.octets()))),
        other
    );
    s.lease(packet(1, 3));
    assert_eq!(
        s.ask(&packet(1, 4).requested(reserved.octets())),
        Decision::Drop(DropReason::PoolExhausted)
    );
    assert_eq!(kind(&s.ask(&select(3, reserved))), Some(MessageType::Nak));
    // INIT-REBOOT with it, as if it had it before: no record, no answer.
    assert_eq!(
        s.ask(&packet(3, 5).requested(reserved.octets())),
        Decision::Drop(DropReason::UnknownClient)
    );
    assert_eq!(s.lease(packet(1, 1)), reserved);
}

/// A flood of DISCOVERs from made-up MACs exhausts the pool with offers nobody requests: a
/// new client still gets an address (the oldest offer is reclaimed, and counted), and a
/// Machine with a reservation is always answered.
#[test]
fn a_discover_flood_does_not_starve_real_clients() {
    let s = server_with(
        r#"
serverAddress: 10.99.0.1
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.109]
machines:
  - name: reserved
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.21
"#,
    );
    let mut reclaimed = 0;
    for n in 0..200u8 {
        let mut flood = packet(1, 0);
        flood.mac = [0x02, 0xff, 0, 0, n, 7];
        if let Decision::Reply {
            reclaimed: true, ..
        } = s.ask(&flood)
        {
            reclaimed += 1;
        }
    }
    assert_eq!(
        reclaimed, 190,
        "every offer past the pool's ten reclaimed one"
    );
    let ip = s.lease(packet(1, 0x33));
    assert!((100..=109).contains(&ip.octets()[3]), "{ip}");
    assert_eq!(s.lease(packet(1, 1)), Ipv4Addr::new(10, 99, 0, 21));
    // A lease is not an offer: once every address is leased, nothing is reclaimed.
    for n in 0..9u8 {
        s.lease(packet(1, 0x80 + n));
    }
    assert_eq!(
        s.ask(&packet(1, 0x90)),
        Decision::Drop(DropReason::PoolExhausted)
    );
}

/// The largest datagram a client may send (far past 1,500 bytes, as option 57 allows) is
/// read whole and answered.
#[test]
fn a_long_request_is_answered() {
    let s = server();
    let mut big = packet(1, 0x21);
    for _ in 0..30 {
        big = big.option(250, &[7u8; 200]);
    }
    let offer = s.ask(&big);
    assert_eq!(kind(&offer), Some(MessageType::Offer));
}

const PROXY: &str = r#"
serverAddress: 10.99.0.1
dhcp: {mode: proxy}
machines:
  - name: node-1
    macs: ["52:54:00:00:00:01"]
    boot: {kernel: vmlinuz, initrd: initrd.img}
"#;

/// In proxy mode iPXE is offered no boot file on port 67 (so that it asks on port 4011,
/// from the address the other server gave it), and the boot-server exchange on 4011
/// answers the script's URL and pairs the MAC with the address it came from, only when
/// that address is the request's `ciaddr`.
#[test]
fn proxy_mode_sends_ipxe_to_port_4011_and_pairs_the_mac_with_its_address() {
    let server = server_with(PROXY);
    let ipxe = |kind: u8| {
        packet(kind, 1)
            .option(77, b"iPXE")
            .option(60, b"PXEClient:Arch:00007:UNDI:003010")
    };
    let offer = server.responder.decide(
        &ipxe(1).parse(),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68),
        67,
        NOW,
    );
    assert_eq!(kind(&offer), Some(MessageType::Offer));
    let options = encoded_options(&offer);
    assert!(
        options.iter().any(|(c, v)| *c == 60 && v == b"PXEClient"),
        "{options:?}"
    );
    assert!(
        !options.iter().any(|(c, _)| *c == 67),
        "no boot file on 67: {options:?}"
    );
    let Decision::Reply { reply, .. } = &offer else {
        unreachable!()
    };
    assert_eq!(reply.message.siaddr(), Ipv4Addr::UNSPECIFIED);

    let machine_ip = Ipv4Addr::new(10, 99, 0, 61);
    let exchanges = server.responder.exchanges();
    let mac = [MacAddr([0x52, 0x54, 0, 0, 0, 1])];
    // From an address that is not its ciaddr: answered, nothing paired.
    let spoofed = server.responder.decide(
        &ipxe(3).ciaddr(machine_ip.octets()).parse(),
        SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68),
        4011,
        NOW,
    );
    assert_eq!(kind(&spoofed), Some(MessageType::Ack));
    assert!(exchanges.addresses(&mac, NOW).is_empty());
    let ack = server.responder.decide(
        &ipxe(3).ciaddr(machine_ip.octets()).parse(),
        SocketAddrV4::new(machine_ip, 68),
        4011,
        NOW,
    );
    let options = encoded_options(&ack);
    let boot_file = options
        .iter()
        .find(|(c, _)| *c == 67)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default();
    assert!(boot_file.contains("/boot.ipxe"), "{options:?}");
    assert_eq!(exchanges.addresses(&mac, NOW), vec![machine_ip]);
    // A firmware PXE client still gets its boot file on 67 (it never asks on 4011).
    let firmware = packet(1, 1)
        .option(60, b"PXEClient:Arch:00007:UNDI:003016")
        .option(93, &[0, 7]);
    let options = encoded_options(&server.responder.decide(
        &firmware.parse(),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68),
        67,
        NOW,
    ));
    assert!(options.iter().any(|(c, _)| *c == 67), "{options:?}");
}

/// `dhcp.limits`: a relay at its limit of unknown clients holding pool addresses gets no new
/// one, whether asked by DISCOVER or by a REQUEST without one; the relay's own clients keep
/// theirs (a renewal is no new address); a client that gives its address back frees a
/// place; a Machine of ours is never limited; another relay, and a port over its own limit
/// behind the same relay, are counted apart.
#[test]
fn a_relay_or_port_at_its_limit_gets_no_new_pool_address() {
    let config = CONFIG.replace("dhcp:\n", "dhcp:\n  limits: {perRelay: 2, perCircuit: 1}\n");
    let s = server_with(&config);
    let relay_a = [10, 98, 0, 1];
    let behind_a = |mac: u8| packet(1, mac).relayed_by(relay_a);
    let first = s.lease(behind_a(0x71));
    s.lease(behind_a(0x72));
    assert_eq!(
        s.ask(&behind_a(0x73)),
        Decision::Drop(DropReason::SourceLimit)
    );
    // A REQUEST for a free address, with no DISCOVER first: the same.
    let sneak = packet(3, 0x73)
        .relayed_by(relay_a)
        .server_id()
        .requested([10, 98, 0, 150]);
    assert_eq!(s.ask(&sneak), Decision::Drop(DropReason::SourceLimit));
    // A client of the relay renews: no new address, no refusal.
    let renew = packet(3, 0x71).relayed_by(relay_a).ciaddr(first.octets());
    assert_eq!(kind(&s.ask(&renew)), Some(MessageType::Ack));
    // Another relay is counted apart.
    s.lease(packet(1, 0x74).relayed_by([10, 98, 0, 2]));
    // One of the relay's clients gives its address back: a new client takes its place.
    let release = packet(7, 0x71).relayed_by(relay_a).ciaddr(first.octets());
    assert!(matches!(s.ask(&release), Decision::Release { .. }));
    s.lease(behind_a(0x73));
    // A Machine of ours behind the full relay is served.
    let mut machine = packet(1, 0x01).relayed_by(relay_a);
    machine.mac = [0x52, 0x54, 0, 0, 0, 0x01];
    assert_eq!(kind(&s.ask(&machine)), Some(MessageType::Offer));
    // Option 82 with a circuit ID: one client per port.
    let port = |mac: u8, id: &[u8]| {
        let mut info = vec![1, id.len() as u8];
        info.extend_from_slice(id);
        packet(1, mac).relayed_by([10, 98, 0, 3]).option(82, &info)
    };
    s.lease(port(0x75, b"eth1/1"));
    assert_eq!(
        s.ask(&port(0x76, b"eth1/1")),
        Decision::Drop(DropReason::SourceLimit)
    );
    s.lease(port(0x77, b"eth1/2"));
}

/// The limit as a property of the real decision and the real address book: over random
/// sequences of DISCOVERs, REQUESTs (for the offered address, or straight for a free one),
/// RELEASEs and waits from eight unknown clients behind two relays, no relay ever has more
/// than its limit of clients holding a pool address (an offer that has not lapsed, a lease
/// that has not expired). Within one process: a restart forgets who was given what.
#[test]
fn no_relay_holds_more_than_its_limit() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    const LIMIT: usize = 2;
    #[derive(Debug, Clone)]
    enum Step {
        Discover(u8),
        Select(u8),
        Straight(u8, u8),
        Release(u8),
        Wait(u64),
    }
    let client = 0u8..8;
    let steps = prop::collection::vec(
        prop_oneof![
            4 => client.clone().prop_map(Step::Discover),
            4 => client.clone().prop_map(Step::Select),
            2 => (client.clone(), 100u8..120).prop_map(|(c, ip)| Step::Straight(c, ip)),
            2 => client.prop_map(Step::Release),
            2 => prop_oneof![1u64..10, 25u64..40, 500u64..700].prop_map(Step::Wait),
        ],
        1..80,
    );
    let config = CONFIG
        .replace(
            "dhcp:\n",
            &format!("dhcp:\n  limits: {{perRelay: {LIMIT}}}\n"),
        )
        .replace(
            "      pool: [10.98.0.100, 10.98.0.199]\n",
            "      pool: [10.98.0.100, 10.98.0.199]\n      leaseSeconds: 600\n",
        );
    let relay = |c: u8| [10, 98, 0, 1 + c % 2];
    let mac = |c: u8| [0x02, 0, 0, 0, 0x20, c];
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 128,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[82; 32]),
    );
    runner
        .run(&steps, |steps| {
            let s = server_with(&config);
            let mut now = NOW;
            let mut offered: std::collections::HashMap<u8, Ipv4Addr> = Default::default();
            for step in &steps {
                let ask = |kind: u8, c: u8| {
                    let mut p = packet(kind, 0).relayed_by(relay(c));
                    p.mac = mac(c);
                    p
                };
                match *step {
                    Step::Discover(c) => {
                        if let decision @ Decision::Reply { .. } = s.ask_at(&ask(1, c), now) {
                            offered.insert(c, yiaddr(&decision));
                        }
                    }
                    Step::Select(c) => {
                        if let Some(ip) = offered.get(&c) {
                            s.ask_at(&ask(3, c).server_id().requested(ip.octets()), now);
                        }
                    }
                    Step::Straight(c, last) => {
                        let ip = [10, 98, 0, last];
                        s.ask_at(&ask(3, c).server_id().requested(ip), now);
                    }
                    Step::Release(c) => {
                        let key = ClientKey::of(None, MacAddr(mac(c)));
                        let held = s
                            .leases
                            .book()
                            .unwrap()
                            .lease_of(&key)
                            .and_then(|l| l.ipv4());
                        if let Some(ip) = held {
                            s.ask_at(&ask(7, c).ciaddr(ip.octets()), now);
                        }
                    }
                    Step::Wait(seconds) => now += seconds,
                }
                let book = s.leases.book().unwrap();
                for r in 0..2u8 {
                    let holding = (0..8u8)
                        .filter(|c| c % 2 == r)
                        .filter(|c| {
                            let key = ClientKey::of(None, MacAddr(mac(*c)));
                            book.claim_of(&key, now).is_some()
                                || book.lease_of(&key).is_some_and(|l| l.expires_unix > now)
                        })
                        .count();
                    prop_assert!(
                        holding <= LIMIT,
                        "relay {r} has {holding} clients holding addresses after {step:?}"
                    );
                }
            }
            Ok(())
        })
        .unwrap();
}
