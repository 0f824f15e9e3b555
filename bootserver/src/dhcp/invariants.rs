//! The address invariants, checked from outside the server: a [`Ledger`] of what the
//! server promised on the wire (offers sent, ACKs sent once their lease was durable), kept
//! independently of the address book, and the rules every promise must obey:
//!
//! 1. no address is offered to a client while another client holds it: a lease promised
//!    by an ACK that has not expired, an offer that has not lapsed (unless the server says
//!    it reclaimed that offer because the pool ran out), an ACK being made durable, or a
//!    decline;
//! 2. no REQUEST is accepted (ACK decided) for an address someone else holds, and no ACK
//!    is sent for one;
//! 3. no address reserved for a Machine is offered or acknowledged to a client that is not
//!    that Machine.
//!
//! The property test (below) drives random interleavings of clients, lapses, restarts,
//! failing disks and commit outcomes through the real [`Responder::decide`] and the real
//! [`Leases`]; the DHCP fuzz target ([`crate::fuzzing::dhcp`]) checks the same ledger.
//!
//! [`Responder::decide`]: super::Responder::decide
//! [`Leases`]: crate::leases::Leases

use std::collections::HashMap;
use std::net::IpAddr;
#[cfg(test)]
use std::net::Ipv4Addr;

use dhcproto::v4::MessageType;

use super::Decision;
use super::DropReason;
use super::allocate::OFFER_HOLD;
use crate::backend::MacAddr;
use crate::leases::{ClientKey, Lease};

/// A promise to one client, until a time, by one server (0 alone; 0 or 1 in a pair).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Promise {
    key: ClientKey,
    mac: MacAddr,
    until: u64,
    server: u8,
}

/// Which server of a pair decided (0 when there is one server).
pub type ServerId = u8;

/// What the servers promised, as seen on the wire (one server, or both of a pair: a
/// promise by either binds both).
#[derive(Debug, Default)]
pub struct Ledger {
    acked: HashMap<IpAddr, Promise>,
    offered: HashMap<IpAddr, Promise>,
    /// ACKs decided and not yet answered by a commit thread, by server and address.
    in_flight: HashMap<(ServerId, IpAddr), (ClientKey, MacAddr, u32)>,
    /// Declined addresses, by the server that heard the decline: until when, and whether
    /// it is on disk yet (one that is not is forgotten by a restart, as DECLINE is
    /// advisory; the other server of a pair may not have heard it at all).
    declined: HashMap<(ServerId, IpAddr), (u64, bool)>,
    reservations: HashMap<IpAddr, Vec<MacAddr>>,
}

impl Ledger {
    /// A ledger for a server whose Machines reserve these addresses.
    pub fn new(reservations: impl IntoIterator<Item = (IpAddr, Vec<MacAddr>)>) -> Self {
        Self {
            reservations: reservations.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Whether two identities are one client: the same key, or two MACs of one Machine
    /// with a reservation (its firmware and its OS send different client identifiers).
    fn same_client(&self, a: (&ClientKey, MacAddr), b: (&ClientKey, MacAddr)) -> bool {
        a.0 == b.0
            || self
                .reservations
                .values()
                .any(|macs| macs.contains(&a.1) && macs.contains(&b.1))
    }

    /// Who else holds `ip` at `now` as `server` must see it, if anyone: the reason, for
    /// the report.
    fn held_by_other(
        &self,
        server: ServerId,
        ip: IpAddr,
        key: &ClientKey,
        mac: MacAddr,
        now: u64,
    ) -> Option<String> {
        let other = |k: &ClientKey, m: MacAddr| !self.same_client((k, m), (key, mac));
        if let Some(p) = self
            .acked
            .get(&ip)
            .filter(|p| other(&p.key, p.mac) && p.until > now)
        {
            return Some(format!("leased to {} until {}", p.key, p.until));
        }
        // An ACK being made durable holds the address on its own server; the other server
        // of a pair cannot see it, and is bound only by what goes out on the wire.
        if let Some((k, _, _)) = self
            .in_flight
            .get(&(server, ip))
            .filter(|(k, m, _)| other(k, *m))
        {
            return Some(format!("being acknowledged to {k}"));
        }
        if let Some(p) = self
            .offered
            .get(&ip)
            .filter(|p| other(&p.key, p.mac) && p.until > now)
        {
            return Some(format!("offered to {} until {}", p.key, p.until));
        }
        if let Some((until, _)) = self.declined.get(&(server, ip)).filter(|(u, _)| *u > now) {
            return Some(format!("declined until {until}"));
        }
        None
    }

    fn reserved_for_other(&self, ip: IpAddr, mac: MacAddr) -> bool {
        self.reservations
            .get(&ip)
            .is_some_and(|macs| !macs.contains(&mac))
    }

    /// The client's offers end (it asked again, chose another server, or got an ACK).
    fn forget_offers(&mut self, key: &ClientKey) {
        self.offered.retain(|_, p| p.key != *key);
    }

    /// Checks a decision for a request from `key` (with `mac`) at `now`, and records it.
    pub fn decided(
        &mut self,
        decision: &Decision,
        key: &ClientKey,
        mac: MacAddr,
        now: u64,
    ) -> Result<(), String> {
        self.decided_by(0, decision, key, mac, now)
    }

    /// [`Ledger::decided`] by one server of a pair.
    pub fn decided_by(
        &mut self,
        server: ServerId,
        decision: &Decision,
        key: &ClientKey,
        mac: MacAddr,
        now: u64,
    ) -> Result<(), String> {
        match decision {
            Decision::Reply {
                reply,
                commit,
                reclaimed,
                ..
            } => match (reply.kind(), commit) {
                (Some(MessageType::Offer), None) => {
                    let ip = reply.message.yiaddr();
                    if ip.is_unspecified() {
                        return Ok(()); // ProxyDHCP: boot information, no address
                    }
                    let ip = IpAddr::V4(ip);
                    if *reclaimed && self.offered.get(&ip).is_some_and(|p| p.key != *key) {
                        self.offered.remove(&ip);
                    }
                    if let Some(other) = self.held_by_other(server, ip, key, mac, now) {
                        return Err(format!("{ip} offered to {key} while {other}"));
                    }
                    if self.reserved_for_other(ip, mac) {
                        return Err(format!(
                            "{ip} offered to {key}, another Machine's reservation"
                        ));
                    }
                    self.forget_offers(key);
                    self.offered.insert(
                        ip,
                        Promise {
                            key: key.clone(),
                            mac,
                            until: now + OFFER_HOLD.as_secs(),
                            server,
                        },
                    );
                    Ok(())
                }
                (Some(MessageType::Ack), Some((lease, _))) => {
                    if lease.key != *key || IpAddr::V4(reply.message.yiaddr()) != lease.ip {
                        return Err(format!(
                            "an ACK to {key} for {} promises {lease:?}",
                            reply.message.yiaddr()
                        ));
                    }
                    if let Some(other) = self.held_by_other(server, lease.ip, key, mac, now) {
                        return Err(format!("{} acknowledged to {key} while {other}", lease.ip));
                    }
                    if self.reserved_for_other(lease.ip, mac) {
                        return Err(format!(
                            "{} acknowledged to {key}, another Machine's reservation",
                            lease.ip
                        ));
                    }
                    self.forget_offers(key);
                    self.in_flight
                        .entry((server, lease.ip))
                        .or_insert_with(|| (key.clone(), mac, 0))
                        .2 += 1;
                    Ok(())
                }
                (Some(MessageType::Ack | MessageType::Nak), None) => Ok(()),
                (kind, commit) => Err(format!("a reply {kind:?} with commit {commit:?}")),
            },
            Decision::Release { key: k, ip } => {
                let ip = &IpAddr::V4(*ip);
                if k != key {
                    return Err(format!("a release by {key} decided for {k}"));
                }
                if self.acked.get(ip).is_some_and(|p| p.key == *key) {
                    self.acked.remove(ip);
                }
                // Its REQUESTs still being written here are withdrawn: no ACK will go out.
                if self
                    .in_flight
                    .get(&(server, *ip))
                    .is_some_and(|(k, _, _)| k == key)
                {
                    self.in_flight.remove(&(server, *ip));
                }
                self.forget_offers(key);
                Ok(())
            }
            Decision::Decline { ip, until } => {
                let ip = &IpAddr::V4(*ip);
                self.acked.remove(ip);
                self.offered.remove(ip);
                self.in_flight.remove(&(server, *ip));
                self.declined.insert((server, *ip), (*until, false));
                Ok(())
            }
            Decision::Drop(DropReason::OtherServer) => {
                self.forget_offers(key);
                Ok(())
            }
            Decision::Drop(_) => Ok(()),
        }
    }

    fn settle(&mut self, server: ServerId, lease: &Lease) {
        if let Some((k, _, n)) = self.in_flight.get_mut(&(server, lease.ip))
            && *k == lease.key
        {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&(server, lease.ip));
            }
        }
    }

    /// The lease is durable and its ACK goes out at `now`.
    pub fn acknowledged(&mut self, lease: &Lease, now: u64) -> Result<(), String> {
        self.acknowledged_by(0, lease, now)
    }

    /// [`Ledger::acknowledged`] by one server of a pair.
    pub fn acknowledged_by(
        &mut self,
        server: ServerId,
        lease: &Lease,
        now: u64,
    ) -> Result<(), String> {
        self.settle(server, lease);
        if self
            .declined
            .get(&(server, lease.ip))
            .is_some_and(|(u, _)| *u > now)
        {
            // Declined while the write was under way: the book drops it; so do we.
            return Ok(());
        }
        if let Some(other) = self.held_by_other(server, lease.ip, &lease.key, lease.mac, now) {
            return Err(format!(
                "ACK sent to {} for {} while {other}",
                lease.key, lease.ip
            ));
        }
        // The client's previous lease ends with this one.
        self.acked.retain(|_, p| p.key != lease.key);
        self.acked.insert(
            lease.ip,
            Promise {
                key: lease.key.clone(),
                mac: lease.mac,
                until: lease.expires_unix,
                server,
            },
        );
        Ok(())
    }

    /// The lease could not be made durable: no ACK.
    pub fn not_acknowledged(&mut self, lease: &Lease) {
        self.not_acknowledged_by(0, lease);
    }

    /// [`Ledger::not_acknowledged`] by one server of a pair.
    pub fn not_acknowledged_by(&mut self, server: ServerId, lease: &Lease) {
        self.settle(server, lease);
    }

    /// A decline of `ip` is on disk.
    pub fn decline_written(&mut self, ip: IpAddr) {
        self.decline_written_by(0, ip);
    }

    /// [`Ledger::decline_written`] by one server of a pair.
    pub fn decline_written_by(&mut self, server: ServerId, ip: IpAddr) {
        if let Some((_, durable)) = self.declined.get_mut(&(server, ip)) {
            *durable = true;
        }
    }

    /// The server restarted: it forgot its offers, and every write under way was lost.
    pub fn restarted(&mut self) {
        self.restarted_server(0);
    }

    /// One server of a pair restarted: its offers and writes under way are gone.
    pub fn restarted_server(&mut self, server: ServerId) {
        self.offered.retain(|_, p| p.server != server);
        self.in_flight.retain(|(s, _), _| *s != server);
        self.declined
            .retain(|(s, _), (_, durable)| *s != server || *durable);
    }

    /// One server of a pair lost its disk: every decline it heard is gone.
    pub fn lost_disk(&mut self, server: ServerId) {
        self.restarted_server(server);
        self.declined.retain(|(s, _), _| *s != server);
    }
}

/// The session property tests' shared parts (this file's and `pair_invariants.rs`).
#[cfg(test)]
pub(crate) mod sessions {
    use std::net::Ipv4Addr;

    use proptest::strategy::Strategy;
    use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

    use crate::dhcp::wire;

    /// A client's MAC: `52:54:00:00:00:<n>`.
    pub fn mac(n: u8) -> [u8; 6] {
        [0x52, 0x54, 0, 0, 0, n]
    }

    /// Address `n` of the sessions' pool, 10.99.0.100 being 1 (0 and 9 are its edges).
    pub fn pool_ip(n: u8) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 99, 0, 99 + n)
    }

    /// A request of message type `kind` from client `n` (its MAC and transaction id),
    /// having waited `secs`, with `options` and `ciaddr`.
    pub fn request(kind: u8, n: u8, secs: u16, options: &[u8], ciaddr: Ipv4Addr) -> wire::Request {
        let mut p = vec![0u8; wire::HEADER_LEN];
        p[..4].copy_from_slice(&[1, 1, 6, 0]);
        p[4..8].copy_from_slice(&[0, 0, 0, n]);
        p[8..10].copy_from_slice(&secs.to_be_bytes());
        p[12..16].copy_from_slice(&ciaddr.octets());
        p[28..34].copy_from_slice(&mac(n));
        p.extend_from_slice(&wire::MAGIC_COOKIE);
        p.extend_from_slice(&[53, 1, kind]);
        p.extend_from_slice(options);
        p.push(255);
        wire::parse(&p).expect("a well-formed test request")
    }

    /// Plays random sessions of up to `max_steps` steps with `play`, which says which step
    /// broke what. `default_cases` sessions from `default_seed`, unless
    /// `UNBOUNDED_PROPTEST_CASES` and `UNBOUNDED_PROPTEST_SEED` say otherwise (by hand:
    /// `UNBOUNDED_PROPTEST_CASES=100000 cargo test -p unbounded-bootserver invariants`).
    pub fn run<S: std::fmt::Debug + Clone>(
        default_cases: u32,
        default_seed: u64,
        steps: impl Strategy<Value = S>,
        max_steps: usize,
        play: impl Fn(&[S]) -> Result<(), (usize, String)>,
    ) {
        let cases = std::env::var("UNBOUNDED_PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(default_cases);
        let seed = std::env::var("UNBOUNDED_PROPTEST_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(default_seed);
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
        let result = runner.run(&proptest::collection::vec(steps, 1..max_steps), |session| {
            play(&session).map_err(|(i, broken)| {
                TestCaseError::fail(format!("step {i} {:?}: {broken}", session[i]))
            })
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }
}

#[cfg(test)]
mod tests {
    //! The property test: random sessions of a few clients over a small pool (with a
    //! reservation inside it) against the real decision code and address book.

    use std::collections::VecDeque;
    use std::net::SocketAddrV4;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::backend::StaticBackend;
    use crate::config::Settings;
    use crate::dhcp::{Responder, wire};
    use crate::leases::{LeaseLog, Leases, MemoryLog, Record};

    const CONFIG: &str = r#"
serverAddress: 10.99.0.1
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.104]
      leaseSeconds: 120
machines:
  - name: reserved
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.102
"#;
    const START: u64 = 1_700_000_000;
    const CLIENTS: u8 = 7;

    use super::sessions::{mac, pool_ip};

    /// One step of a session.
    #[derive(Debug, Clone)]
    enum Step {
        Discover {
            client: u8,
            asks: Option<u8>,
        },
        /// A REQUEST in SELECTING for an address (the one offered, or any).
        Select {
            client: u8,
            ip: Option<u8>,
        },
        /// INIT-REBOOT or RENEWING with an address.
        Reboot {
            client: u8,
            ip: u8,
            renewing: bool,
        },
        Release {
            client: u8,
        },
        Decline {
            client: u8,
        },
        /// Another server's offer was chosen.
        OtherServer {
            client: u8,
        },
        /// The commit thread writes the oldest queued records.
        Write {
            count: u8,
        },
        /// The disk fills up, or has room again.
        Disk {
            full: bool,
        },
        Wait {
            seconds: u16,
        },
        /// `kill -9` and a start on the same log: what was queued is lost.
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        let client = 1..=CLIENTS;
        let ip = 0u8..=7; // 10.99.0.99 ..= 10.99.0.106: the pool and its edges
        prop_oneof![
            4 => (client.clone(), proptest::option::of(ip.clone()))
                .prop_map(|(client, asks)| Step::Discover { client, asks }),
            4 => (client.clone(), proptest::option::of(ip.clone()))
                .prop_map(|(client, ip)| Step::Select { client, ip }),
            2 => (client.clone(), ip, any::<bool>())
                .prop_map(|(client, ip, renewing)| Step::Reboot { client, ip, renewing }),
            1 => client.clone().prop_map(|client| Step::Release { client }),
            1 => client.clone().prop_map(|client| Step::Decline { client }),
            1 => client.prop_map(|client| Step::OtherServer { client }),
            4 => (1u8..4).prop_map(|count| Step::Write { count }),
            1 => any::<bool>().prop_map(|full| Step::Disk { full }),
            3 => prop_oneof![0u16..5, 25u16..40, 100u16..700]
                .prop_map(|seconds| Step::Wait { seconds }),
            1 => Just(Step::Restart),
        ]
    }

    /// The server under test, its log, and what the clients remember.
    struct Session {
        settings: Arc<Settings>,
        backend: Arc<StaticBackend>,
        log: Arc<MemoryLog>,
        leases: Arc<Leases>,
        responder: Responder,
        /// Records waiting for the commit thread, in decision order.
        queue: VecDeque<(Record, Option<crate::leases::Ticket>)>,
        ledger: Ledger,
        now: u64,
        /// The address each client was last offered or given.
        remembered: HashMap<u8, Ipv4Addr>,
    }

    impl Session {
        fn new() -> Self {
            let settings = Arc::new(Settings::parse(CONFIG).unwrap());
            let backend = Arc::new(StaticBackend::new(settings.machines.clone()));
            let log = Arc::new(MemoryLog::default());
            let leases = Arc::new(Leases::open(log.clone()).unwrap());
            let responder = Responder::new(settings.clone(), backend.clone(), leases.clone());
            let ledger = Ledger::new([(IpAddr::from([10, 99, 0, 102]), vec![MacAddr(mac(1))])]);
            Self {
                settings,
                backend,
                log,
                leases,
                responder,
                queue: VecDeque::new(),
                ledger,
                now: START,
                remembered: HashMap::new(),
            }
        }

        fn packet(&self, kind: u8, client: u8, options: &[u8], ciaddr: Ipv4Addr) -> wire::Request {
            super::sessions::request(kind, client, 0, options, ciaddr)
        }

        fn ask(&mut self, client: u8, request: &wire::Request) -> Result<(), String> {
            let from = SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68);
            let decision = self
                .responder
                .decide(request, from, self.settings.dhcp.port, self.now);
            self.ledger
                .decided(&decision, &request.client_key(), request.mac, self.now)?;
            match decision {
                Decision::Reply {
                    reply,
                    commit: Some((lease, ticket)),
                    ..
                } => {
                    self.remembered.insert(client, reply.message.yiaddr());
                    self.queue.push_back((Record::Commit(lease), Some(ticket)));
                }
                Decision::Reply { reply, .. } if reply.kind() == Some(MessageType::Offer) => {
                    self.remembered.insert(client, reply.message.yiaddr());
                }
                Decision::Release { key, ip } => {
                    self.queue
                        .push_back((Record::Release { key, ip: ip.into() }, None));
                }
                Decision::Decline { ip, until } => self.queue.push_back((
                    Record::Decline {
                        ip: ip.into(),
                        until_unix: until,
                    },
                    None,
                )),
                Decision::Reply { .. } | Decision::Drop(_) => {}
            }
            Ok(())
        }

        fn run(&mut self, step: &Step) -> Result<(), String> {
            let server_id = [54, 4, 10, 99, 0, 1];
            let none = Ipv4Addr::UNSPECIFIED;
            match *step {
                Step::Discover { client, asks } => {
                    let options = asks.map(|n| {
                        let o = pool_ip(n).octets();
                        vec![50, 4, o[0], o[1], o[2], o[3]]
                    });
                    let request = self.packet(1, client, &options.unwrap_or_default(), none);
                    self.ask(client, &request)?;
                }
                Step::Select { client, ip } => {
                    let ip = ip
                        .map(pool_ip)
                        .or_else(|| self.remembered.get(&client).copied())
                        .unwrap_or(pool_ip(1));
                    let o = ip.octets();
                    let mut options = server_id.to_vec();
                    options.extend_from_slice(&[50, 4, o[0], o[1], o[2], o[3]]);
                    let request = self.packet(3, client, &options, none);
                    self.ask(client, &request)?;
                }
                Step::Reboot {
                    client,
                    ip,
                    renewing,
                } => {
                    let ip = pool_ip(ip);
                    let o = ip.octets();
                    let request = if renewing {
                        self.packet(3, client, &[], ip)
                    } else {
                        self.packet(3, client, &[50, 4, o[0], o[1], o[2], o[3]], none)
                    };
                    self.ask(client, &request)?;
                }
                Step::Release { client } => {
                    let ip = self.remembered.get(&client).copied().unwrap_or(pool_ip(1));
                    let request = self.packet(7, client, &server_id, ip);
                    self.ask(client, &request)?;
                }
                Step::Decline { client } => {
                    let o = self
                        .remembered
                        .get(&client)
                        .copied()
                        .unwrap_or(pool_ip(1))
                        .octets();
                    let mut options = server_id.to_vec();
                    options.extend_from_slice(&[50, 4, o[0], o[1], o[2], o[3]]);
                    let request = self.packet(4, client, &options, none);
                    self.ask(client, &request)?;
                }
                Step::OtherServer { client } => {
                    let request = self.packet(
                        3,
                        client,
                        &[54, 4, 10, 99, 0, 2, 50, 4, 10, 99, 0, 100],
                        none,
                    );
                    self.ask(client, &request)?;
                }
                Step::Write { count } => {
                    let n = usize::from(count).min(self.queue.len());
                    let batch: Vec<_> = self.queue.drain(..n).collect();
                    let taken = self.leases.persist(&batch);
                    let written = taken.is_ok();
                    let taken = taken.unwrap_or_default();
                    for (i, (record, _)) in batch.iter().enumerate() {
                        match record {
                            Record::Commit(lease) if taken.get(i) == Some(&true) => {
                                self.ledger.acknowledged(lease, self.now)?;
                            }
                            Record::Commit(lease) => self.ledger.not_acknowledged(lease),
                            Record::Decline { ip, .. } if written => {
                                self.ledger.decline_written(*ip);
                            }
                            Record::Decline { .. } | Record::Release { .. } => {}
                        }
                    }
                }
                Step::Disk { full } => self.log.set_failing(full),
                Step::Wait { seconds } => self.now += u64::from(seconds),
                Step::Restart => {
                    self.queue.clear();
                    self.ledger.restarted();
                    self.leases = Arc::new(Leases::open(self.log.clone()).unwrap());
                    self.responder = Responder::new(
                        self.settings.clone(),
                        self.backend.clone(),
                        self.leases.clone(),
                    );
                }
            }
            self.leases.book().unwrap().check()?;
            // Nothing the book holds as durable is missing from the log.
            let durable = self.log.durable().unwrap();
            let book = self.leases.book().unwrap();
            for n in 0..=7 {
                let ip = pool_ip(n);
                if let Some(lease) = book.lease_at(ip.into()) {
                    let on_disk = durable.by_client(&lease.key);
                    if on_disk.as_ref() != Some(&lease) {
                        return Err(format!("the book shows {lease:?}, the log {on_disk:?}"));
                    }
                }
            }
            Ok(())
        }
    }

    /// CI: a fixed seed and a bounded number of sessions ([`super::sessions::run`]).
    #[test]
    fn no_address_is_offered_or_acknowledged_to_two_clients() {
        super::sessions::run(2_000, 23, step(), 120, |steps| {
            let mut session = Session::new();
            for (i, step) in steps.iter().enumerate() {
                session.run(step).map_err(|broken| (i, broken))?;
            }
            Ok(())
        });
    }

    /// The ledger itself catches what it must: an offer of a leased address to another
    /// client (as the old offer maps allowed).
    #[test]
    fn the_ledger_catches_a_double_promise() {
        let mut ledger = Ledger::default();
        let a = ClientKey::Hardware(MacAddr(mac(1)));
        let lease = Lease {
            key: a,
            mac: MacAddr(mac(1)),
            ip: pool_ip(1).into(),
            expires_unix: START + 100,
        };
        ledger.acknowledged(&lease, START).unwrap();
        let settings = Settings::parse(CONFIG).unwrap();
        let request = Session::new().packet(1, 2, &[], Ipv4Addr::UNSPECIFIED);
        let mut reply =
            super::super::reply::Reply::to(&request, MessageType::Offer, settings.server_address);
        reply.message.set_yiaddr(pool_ip(1));
        let offer = Decision::Reply {
            reply,
            to: SocketAddrV4::new(Ipv4Addr::BROADCAST, 68),
            commit: None,
            reclaimed: false,
        };
        let b = ClientKey::Hardware(MacAddr(mac(2)));
        assert!(
            ledger
                .decided(&offer, &b, MacAddr(mac(2)), START + 1)
                .is_err()
        );
        assert!(
            ledger
                .decided(&offer, &b, MacAddr(mac(2)), START + 100)
                .is_ok()
        );
    }
}
