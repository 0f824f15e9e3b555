//! The one-owner property for a pair of servers (docs/bootserver.md, "Two bootservers on
//! one network"): two real [`Responder`]s, each with its own lease log and book and its half
//! of the pool, the real pair state ([`crate::ha::pair`]) and the real replication into the
//! book ([`crate::leases::Leases::replicate`]), joined by a link that delays records, loses
//! them and is cut; clients talk to either server, servers restart, one may lose its disk.
//! One [`Ledger`] holds what either server promised on the wire, and checks after every
//! decision that no address is offered or acknowledged to two clients by whichever server.
//! While the pair is up, every acknowledged lease is in the partner's book before the ACK.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use dhcproto::v4::MessageType;
use proptest::prelude::*;

use super::invariants::{Ledger, ServerId};
use super::{Decision, Responder, wire};
use crate::backend::{MacAddr, StaticBackend};
use crate::config::Settings;
use crate::ha::pair::{Event, Pair, StartBook};
use crate::ha::parts::Part;
use crate::leases::{LeaseLog, Leases, MemoryLog, Record, Ticket};

const START: u64 = 1_700_000_000;

const CLIENTS: u8 = 7;
const LEASE_SECONDS: u64 = 120;
const INTERRUPTED_AFTER: u64 = 10;
/// A part fence's Lease: taken by another only once unrenewed for this long.
const FENCE_SECONDS: u64 = 15;
/// The pool 10.99.0.100–107: a owns .100–.103 (with the reservation .102), b .104–.107.
fn config(name: &str, partner: &str, address: &str) -> String {
    format!(
        r#"
serverAddress: {address}
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.107]
      leaseSeconds: {LEASE_SECONDS}
machines:
  - name: reserved
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.102
ha:
  name: {name}
  partner: {{name: {partner}, address: "10.99.0.9:8647"}}
  keyFile: /k
  interruptedAfterSeconds: {INTERRUPTED_AFTER}
"#
    )
}

use super::invariants::sessions::{mac, pool_ip};

/// One step of a session.
#[derive(Debug, Clone)]
enum Step {
    Discover {
        server: u8,
        client: u8,
        asks: Option<u8>,
        secs: u16,
    },
    /// A REQUEST in SELECTING for the offer of `chosen` (the server id it names).
    Select {
        server: u8,
        client: u8,
        chosen: u8,
        ip: Option<u8>,
    },
    /// INIT-REBOOT or RENEWING with an address (a RENEW is unicast to one server).
    Reboot {
        server: u8,
        client: u8,
        ip: u8,
        renewing: bool,
    },
    Release {
        server: u8,
        client: u8,
    },
    Decline {
        server: u8,
        client: u8,
    },
    /// A server's commit thread writes its oldest queued records.
    Write {
        server: u8,
        count: u8,
    },
    /// The link carries the oldest records of one server's outbox to its partner.
    Deliver {
        from: u8,
        count: u8,
    },
    /// The oldest record of an outbox is lost.
    Lose {
        from: u8,
    },
    /// A heartbeat each way, if the link is up.
    Heartbeat,
    /// The link between the servers is cut, or heals.
    Partition {
        cut: bool,
    },
    /// A server takes every record its partner holds (the catch-up after a restart or an
    /// interruption), if the link is up.
    Sync {
        server: u8,
    },
    Wait {
        seconds: u16,
    },
    /// `kill -9` and a start; `lose_disk`: on an empty disk.
    Restart {
        server: u8,
        lose_disk: bool,
    },
    Disk {
        server: u8,
        full: bool,
    },
    /// A server reaches the API server, or no longer does (then it renews no fence: it
    /// steps down at once, which a real one does before the Lease can expire for others).
    Api {
        server: u8,
        up: bool,
    },
    /// A server takes its partner's part fence, if it may: the partner does not answer
    /// and the part's Lease went unrenewed for [`FENCE_SECONDS`].
    TakeFence {
        server: u8,
    },
    /// A server holding its partner's fence hands it back, if the partner answers: it stops
    /// binding there, the partner takes every record it holds (the barrier), then the
    /// fence goes back.
    HandBack {
        server: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    steps(1)
}

/// The steps, with the fence steps weighted `fences` (more where fences are the subject).
fn steps(fences: u32) -> impl Strategy<Value = Step> {
    let server = 0u8..2;
    let client = 1..=CLIENTS;
    let ip = 0u8..=9; // 10.99.0.99 ..= 10.99.0.108: the pool and its edges
    prop_oneof![
        5 => (server.clone(), client.clone(), proptest::option::of(ip.clone()), prop_oneof![Just(0u16), Just(30u16)])
            .prop_map(|(server, client, asks, secs)| Step::Discover { server, client, asks, secs }),
        5 => (server.clone(), client.clone(), server.clone(), proptest::option::of(ip.clone()))
            .prop_map(|(server, client, chosen, ip)| Step::Select { server, client, chosen, ip }),
        3 => (server.clone(), client.clone(), ip, any::<bool>())
            .prop_map(|(server, client, ip, renewing)| Step::Reboot { server, client, ip, renewing }),
        1 => (server.clone(), client.clone()).prop_map(|(server, client)| Step::Release { server, client }),
        1 => (server.clone(), client).prop_map(|(server, client)| Step::Decline { server, client }),
        5 => (server.clone(), 1u8..4).prop_map(|(server, count)| Step::Write { server, count }),
        3 => (server.clone(), 1u8..4).prop_map(|(from, count)| Step::Deliver { from, count }),
        1 => server.clone().prop_map(|from| Step::Lose { from }),
        2 => Just(Step::Heartbeat),
        1 => any::<bool>().prop_map(|cut| Step::Partition { cut }),
        1 => server.clone().prop_map(|server| Step::Sync { server }),
        3 => prop_oneof![0u16..5, 8u16..15, 25u16..40, 100u16..300]
            .prop_map(|seconds| Step::Wait { seconds }),
        1 => (server.clone(), any::<bool>())
            .prop_map(|(server, lose_disk)| Step::Restart { server, lose_disk }),
        1 => (server.clone(), any::<bool>()).prop_map(|(server, full)| Step::Disk { server, full }),
        fences => (server.clone(), any::<bool>()).prop_map(|(server, up)| Step::Api { server, up }),
        fences => server.clone().prop_map(|server| Step::TakeFence { server }),
        fences => server.prop_map(|server| Step::HandBack { server }),
    ]
}

/// One server of the pair.
struct Server {
    id: ServerId,
    address: Ipv4Addr,
    settings: Arc<Settings>,
    backend: Arc<StaticBackend>,
    log: Arc<MemoryLog>,
    leases: Arc<Leases>,
    pair: Arc<Mutex<Pair>>,
    responder: Responder,
    /// Records waiting for the commit thread, in decision order.
    queue: VecDeque<(Record, Option<Ticket>)>,
    /// Records written here and not yet carried to the partner, in order.
    outbox: VecDeque<Record>,
    /// When the disk was found empty (kept durably beside the log by a real server).
    lost_at: Option<u64>,
    /// Whether the pair's parts are fenced (an API server holds a Lease per part).
    fenced: bool,
}

impl Server {
    fn start(id: ServerId, now: u64, fenced: bool) -> Self {
        let (name, partner, address) = if id == 0 {
            ("a", "b", Ipv4Addr::new(10, 99, 0, 1))
        } else {
            ("b", "a", Ipv4Addr::new(10, 99, 0, 2))
        };
        let settings =
            Arc::new(Settings::parse(&config(name, partner, &address.to_string())).unwrap());
        let backend = Arc::new(StaticBackend::new(settings.machines.clone()));
        let log = Arc::new(MemoryLog::default());
        let mut server = Self {
            id,
            address,
            settings: settings.clone(),
            backend,
            leases: Arc::new(Leases::open(log.clone()).unwrap()),
            log,
            pair: Arc::new(Mutex::new(Pair::starting(
                StartBook::Trusted,
                now,
                INTERRUPTED_AFTER,
                LEASE_SECONDS,
            ))),
            responder: Responder::new(
                settings,
                Arc::new(StaticBackend::new(Vec::new())),
                Arc::new(Leases::in_memory()),
            ),
            queue: VecDeque::new(),
            outbox: VecDeque::new(),
            lost_at: None,
            fenced,
        };
        server.restart(StartBook::Trusted, now);
        server
    }

    /// A start on the log as it is.
    fn restart(&mut self, book: StartBook, now: u64) {
        self.queue.clear();
        self.outbox.clear();
        self.leases = Arc::new(Leases::open(self.log.clone()).unwrap());
        let pair = Pair::starting(book, now, INTERRUPTED_AFTER, LEASE_SECONDS);
        self.pair = Arc::new(Mutex::new(if self.fenced {
            pair.with_fences()
        } else {
            pair
        }));
        self.responder = Responder::new(
            self.settings.clone(),
            self.backend.clone(),
            self.leases.clone(),
        )
        .with_pair(self.pair.clone());
    }

    fn on(&self, event: Event, now: u64) {
        self.pair.lock().unwrap().on(event, now);
    }

    fn up(&self) -> bool {
        self.pair.lock().unwrap().replicates_before_ack()
    }
}

struct Session {
    servers: [Server; 2],
    ledger: Ledger,
    now: u64,
    cut: bool,
    /// The address each client was last offered or given.
    remembered: HashMap<u8, Ipv4Addr>,
    /// Whether each server reaches the API server (fenced sessions).
    api: [bool; 2],
    /// Each part's fence (the part of server `i` is `fences[i]`).
    fences: [Fence; 2],
}

/// A part's Lease in the API server.
#[derive(Debug, Clone, Copy)]
struct Fence {
    holder: Option<usize>,
    renewed_at: u64,
}

impl Fence {
    fn expired(&self, now: u64) -> bool {
        self.holder.is_none() || now >= self.renewed_at + FENCE_SECONDS
    }
}

impl Session {
    fn new(fenced: bool) -> Self {
        let servers = [
            Server::start(0, START, fenced),
            Server::start(1, START, fenced),
        ];
        // Started together on empty logs: each one's catch-up reaches the other.
        for server in &servers {
            server.on(Event::Synced, START);
            server.on(Event::Heard, START);
        }
        let mut session = Self {
            servers,
            ledger: Ledger::new([(IpAddr::from([10, 99, 0, 102]), vec![MacAddr(mac(1))])]),
            now: START,
            cut: false,
            remembered: HashMap::new(),
            api: [fenced; 2],
            fences: [Fence {
                holder: None,
                renewed_at: START,
            }; 2],
        };
        session.keep_fences();
        session
    }

    /// What the servers' electors do as time passes: renew what they hold, take their own
    /// part's fence when it is free, and take it back when the partner let it expire.
    fn keep_fences(&mut self) {
        if !self.servers[0].fenced {
            return;
        }
        let now = self.now;
        for part in 0..2 {
            let fence = &mut self.fences[part];
            if let Some(holder) = fence.holder
                && self.api[holder]
            {
                fence.renewed_at = now;
            }
            if !self.api[part] || fence.holder == Some(part) {
                continue;
            }
            let returned = fence.holder == Some(1 - part);
            if fence.expired(now) {
                *fence = Fence {
                    holder: Some(part),
                    renewed_at: now,
                };
                if returned {
                    self.servers[part].on(Event::OwnFenceReturned, now);
                }
            }
        }
        for (part, server) in self.servers.iter().enumerate() {
            let mut pair = server.pair.lock().unwrap();
            pair.set_own_fence(self.api[part] && self.fences[part].holder == Some(part));
            // The partner's fence it held is lost once it cannot renew it.
            if self.fences[1 - part].holder == Some(part) && !self.api[part] {
                pair.on(Event::FenceLost, now);
            }
        }
    }

    /// Each server hears the other's state (a heartbeat's answer), or nothing (`None`).
    fn report_states(&self, heard: bool) {
        let codes = [0, 1].map(|s| self.servers[s].pair.lock().unwrap().reported_code(self.now));
        for (s, server) in self.servers.iter().enumerate() {
            server
                .pair
                .lock()
                .unwrap()
                .partner_reported(heard.then_some(codes[1 - s]));
        }
    }

    fn packet(kind: u8, client: u8, secs: u16, options: &[u8], ciaddr: Ipv4Addr) -> wire::Request {
        super::invariants::sessions::request(kind, client, secs, options, ciaddr)
    }

    fn server_id(&self, server: u8) -> Vec<u8> {
        let o = self.servers[usize::from(server % 2)].address.octets();
        vec![54, 4, o[0], o[1], o[2], o[3]]
    }

    fn ask(&mut self, server: u8, client: u8, request: &wire::Request) -> Result<(), String> {
        let s = usize::from(server % 2);
        let from = SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68);
        let port = self.servers[s].settings.dhcp.port;
        let decision = self.servers[s]
            .responder
            .decide(request, from, port, self.now);
        self.ledger.decided_by(
            self.servers[s].id,
            &decision,
            &request.client_key(),
            request.mac,
            self.now,
        )?;
        let queue = &mut self.servers[s].queue;
        match decision {
            Decision::Reply {
                reply,
                commit: Some((lease, ticket)),
                ..
            } => {
                self.remembered.insert(client, reply.message.yiaddr());
                queue.push_back((Record::Commit(lease), Some(ticket)));
            }
            Decision::Reply { reply, .. } if reply.kind() == Some(MessageType::Offer) => {
                self.remembered.insert(client, reply.message.yiaddr());
            }
            Decision::Release { key, ip } => {
                queue.push_back((Record::Release { key, ip: ip.into() }, None));
            }
            Decision::Decline { ip, until } => queue.push_back((
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

    /// Carries records to server `to`'s book; both hear each other. Says for each record
    /// whether the receiver's book took it (another holder there: a decline it heard, a
    /// Machine's reservation under another identity), or `None` when it could not write
    /// them (its disk is full): then they are not acknowledged.
    fn carry(&mut self, to: usize, records: &[Record]) -> Option<Vec<bool>> {
        let now = self.now;
        let taken = self.servers[to].leases.replicate(records, now).ok();
        self.servers[to].on(Event::Heard, now);
        self.servers[1 - to].on(Event::Heard, now);
        taken
    }

    /// One server's commit thread writes a batch; each durable record goes to the partner
    /// before its ACK while the pair is up, and waits in the outbox otherwise.
    fn write(&mut self, s: usize, count: u8) -> Result<(), String> {
        let n = usize::from(count).min(self.servers[s].queue.len());
        let batch: Vec<_> = self.servers[s].queue.drain(..n).collect();
        let taken = self.servers[s].leases.persist(&batch);
        let written = taken.is_ok();
        let taken = taken.unwrap_or_default();
        let id = self.servers[s].id;
        for (i, (record, _)) in batch.iter().enumerate() {
            let durable = match record {
                Record::Commit(_) => taken.get(i) == Some(&true),
                Record::Release { .. } | Record::Decline { .. } => written,
            };
            // Whether the partner's book took it before the ACK.
            let mut partner_took = false;
            if durable {
                let carried = if self.servers[s].up() && !self.cut {
                    self.carry(1 - s, std::slice::from_ref(record))
                } else {
                    None
                };
                partner_took = carried.as_deref() == Some(&[true]);
                if carried.is_none() {
                    if self.servers[s].up() {
                        // The partner did not acknowledge in time (cut off, or it could
                        // not write): ACK on local durability alone.
                        self.servers[s].on(Event::ReplicationTimedOut, self.now);
                    }
                    self.servers[s].outbox.push_back(record.clone());
                }
            }
            match record {
                // A lease of the partner's part is acknowledged only once the partner, its
                // owner, took it: it may have given the address to someone else, or may
                // give it once the lease it knows ends.
                Record::Commit(lease)
                    if durable
                        && !self.servers[s]
                            .pair
                            .lock()
                            .unwrap()
                            .may_acknowledge(self.part_of(s, lease), partner_took) =>
                {
                    self.ledger.not_acknowledged_by(id, lease);
                }
                Record::Commit(lease) if durable => {
                    if partner_took {
                        let partner = self.servers[1 - s]
                            .leases
                            .book()
                            .map_err(|e| e.to_string())?;
                        let held = partner.lease_at(lease.ip);
                        // Or held from everyone until it ends: the partner has a newer
                        // lease of the client's elsewhere.
                        let kept = matches!(
                            partner.slot(lease.ip),
                            Some(crate::leases::book::Slot::Declined { until }) if *until >= lease.expires_unix
                        );
                        if !kept
                            && held.as_ref().is_none_or(|h| {
                                h.key != lease.key || h.expires_unix < lease.expires_unix
                            })
                        {
                            return Err(format!(
                                "ACK of {lease:?} while the pair is up, and the partner's book has {held:?}"
                            ));
                        }
                    }
                    self.ledger.acknowledged_by(id, lease, self.now)?;
                }
                Record::Commit(lease) => self.ledger.not_acknowledged_by(id, lease),
                Record::Decline { ip, .. } if written => self.ledger.decline_written_by(id, *ip),
                Record::Decline { .. } | Record::Release { .. } => {}
            }
        }
        Ok(())
    }

    /// The part `lease` lies in for server `s`.
    fn part_of(&self, s: usize, lease: &crate::leases::Lease) -> Part {
        let IpAddr::V4(ip) = lease.ip else {
            return Part::Outside;
        };
        let subnets = &self.servers[s].settings.dhcp.subnets;
        if subnets.iter().any(|subnet| subnet.in_partners_part(ip)) {
            Part::Partners
        } else if subnets.iter().any(|subnet| subnet.in_pool(ip)) {
            Part::Own
        } else {
            Part::Outside
        }
    }

    fn run(&mut self, step: &Step) -> Result<(), String> {
        let none = Ipv4Addr::UNSPECIFIED;
        match *step {
            Step::Discover {
                server,
                client,
                asks,
                secs,
            } => {
                let options = asks.map(|n| {
                    let o = pool_ip(n).octets();
                    vec![50, 4, o[0], o[1], o[2], o[3]]
                });
                let request = Self::packet(1, client, secs, &options.unwrap_or_default(), none);
                self.ask(server, client, &request)?;
            }
            Step::Select {
                server,
                client,
                chosen,
                ip,
            } => {
                let ip = ip
                    .map(pool_ip)
                    .or_else(|| self.remembered.get(&client).copied())
                    .unwrap_or(pool_ip(1));
                let o = ip.octets();
                let mut options = self.server_id(chosen);
                options.extend_from_slice(&[50, 4, o[0], o[1], o[2], o[3]]);
                let request = Self::packet(3, client, 0, &options, none);
                self.ask(server, client, &request)?;
            }
            Step::Reboot {
                server,
                client,
                ip,
                renewing,
            } => {
                let ip = pool_ip(ip);
                let o = ip.octets();
                let request = if renewing {
                    Self::packet(3, client, 0, &[], ip)
                } else {
                    Self::packet(3, client, 0, &[50, 4, o[0], o[1], o[2], o[3]], none)
                };
                self.ask(server, client, &request)?;
            }
            Step::Release { server, client } => {
                let ip = self.remembered.get(&client).copied().unwrap_or(pool_ip(1));
                let request = Self::packet(7, client, 0, &self.server_id(server), ip);
                self.ask(server, client, &request)?;
            }
            Step::Decline { server, client } => {
                let o = self
                    .remembered
                    .get(&client)
                    .copied()
                    .unwrap_or(pool_ip(1))
                    .octets();
                let mut options = self.server_id(server);
                options.extend_from_slice(&[50, 4, o[0], o[1], o[2], o[3]]);
                let request = Self::packet(4, client, 0, &options, none);
                self.ask(server, client, &request)?;
            }
            Step::Write { server, count } => self.write(usize::from(server % 2), count)?,
            Step::Deliver { from, count } => {
                let s = usize::from(from % 2);
                if !self.cut {
                    let n = usize::from(count).min(self.servers[s].outbox.len());
                    let records: Vec<Record> = self.servers[s].outbox.drain(..n).collect();
                    if self.carry(1 - s, &records).is_none() {
                        // Not written there: sent again later.
                        for record in records.into_iter().rev() {
                            self.servers[s].outbox.push_front(record);
                        }
                    }
                }
            }
            Step::Lose { from } => {
                self.servers[usize::from(from % 2)].outbox.pop_front();
            }
            Step::Heartbeat => {
                if !self.cut {
                    for server in &self.servers {
                        server.on(Event::Heard, self.now);
                    }
                    self.report_states(true);
                }
            }
            Step::Partition { cut } => {
                self.cut = cut;
                if cut {
                    self.report_states(false);
                }
            }
            Step::Api { server, up } => {
                self.api[usize::from(server % 2)] = up;
                self.keep_fences();
            }
            Step::TakeFence { server } => {
                let s = usize::from(server % 2);
                let partners = self.fences[1 - s];
                let may = self.servers[s].fenced
                    && self.api[s]
                    && self.servers[s].pair.lock().unwrap().may_take_fence()
                    && partners.holder != Some(s)
                    && partners.expired(self.now);
                if may {
                    self.fences[1 - s] = Fence {
                        holder: Some(s),
                        renewed_at: self.now,
                    };
                    self.servers[s].on(Event::FenceTaken, self.now);
                    self.keep_fences();
                }
            }
            Step::HandBack { server } => {
                let s = usize::from(server % 2);
                let holding = self.fences[1 - s].holder == Some(s)
                    && matches!(
                        self.servers[s].pair.lock().unwrap().state(),
                        crate::ha::pair::PairState::PartnerDown { .. }
                    );
                if holding && !self.cut {
                    // First it stops binding there; the fence goes back once its offers
                    // there lapsed (a later HandBack step).
                    self.servers[s].on(Event::HandingBack, self.now);
                    let may = self.servers[s].pair.lock().unwrap().may_hand_back(self.now);
                    // The barrier: the partner takes every record this server holds.
                    let durable = self.servers[s].log.durable().map_err(|e| e.to_string())?;
                    let records: Vec<Record> = durable.records().collect();
                    if may
                        && self.servers[1 - s]
                            .leases
                            .replicate(&records, self.now)
                            .is_ok()
                    {
                        self.servers[1 - s].on(Event::Synced, self.now);
                        self.fences[1 - s] = Fence {
                            holder: None,
                            renewed_at: self.now,
                        };
                        self.servers[s].on(Event::PartnerRecovered, self.now);
                        self.keep_fences();
                    }
                }
            }
            Step::Sync { server } => {
                let s = usize::from(server % 2);
                if !self.cut {
                    let durable = self.servers[1 - s]
                        .log
                        .durable()
                        .map_err(|e| e.to_string())?;
                    let records: Vec<Record> = durable.records().collect();
                    if self.servers[s].leases.replicate(&records, self.now).is_ok() {
                        self.servers[s].on(Event::Synced, self.now);
                        self.servers[s].on(Event::Heard, self.now);
                        self.servers[1 - s].on(Event::Heard, self.now);
                    }
                }
            }
            Step::Wait { seconds } => {
                self.now += u64::from(seconds);
                for server in &self.servers {
                    server.on(Event::Tick, self.now);
                    // A connection silent this long is closed: what the partner said on
                    // it is gone with it.
                    let mut pair = server.pair.lock().unwrap();
                    if !pair.partner_answers(self.now) {
                        pair.partner_reported(None);
                    }
                }
                self.keep_fences();
            }
            Step::Restart { server, lose_disk } => {
                let s = usize::from(server % 2);
                let id = self.servers[s].id;
                if lose_disk {
                    self.ledger.lost_disk(id);
                    self.servers[s].log = Arc::new(MemoryLog::default());
                } else {
                    self.ledger.restarted_server(id);
                }
                let now = self.now;
                if lose_disk {
                    self.servers[s].lost_at = Some(now);
                }
                // Until the wait after a lost disk is over, a restart resumes it.
                let book = match self.servers[s].lost_at {
                    Some(lost_at) if now < lost_at + LEASE_SECONDS => StartBook::Empty { lost_at },
                    _ => StartBook::Trusted,
                };
                self.servers[s].restart(book, now);
                self.report_states(false);
                self.keep_fences();
            }
            Step::Disk { server, full } => {
                self.servers[usize::from(server % 2)].log.set_failing(full)
            }
        }
        for server in &self.servers {
            server.leases.book().map_err(|e| e.to_string())?.check()?;
        }
        Ok(())
    }
}

/// CI: a fixed seed and a bounded number of sessions ([`super::invariants::sessions::run`]).
#[test]
fn a_pair_never_promises_one_address_to_two_clients() {
    super::invariants::sessions::run(1_000, 43, step(), 150, |steps| {
        let mut session = Session::new(false);
        for (i, step) in steps.iter().enumerate() {
            session.run(step).map_err(|broken| (i, broken))?;
        }
        Ok(())
    });
}

/// The same with each part fenced by a Lease in an API server that either server may lose:
/// a server takes its partner's part only once the partner's fence expired while it could
/// not hear it, binds there only the longest lease later, and hands the part back.
#[test]
fn a_fenced_pair_never_promises_one_address_to_two_clients() {
    super::invariants::sessions::run(1_000, 4343, steps(4), 150, |steps| {
        let mut session = Session::new(true);
        for (i, step) in steps.iter().enumerate() {
            session.run(step).map_err(|broken| (i, broken))?;
        }
        Ok(())
    });
}

/// Each server allocates only in its half, and a DISCOVER is answered by one server while
/// the pair is up (by the client's hash), by both once a client says it waited.
#[test]
fn each_server_offers_its_own_half_and_one_answers_while_up() {
    let session = Session::new(false);
    for server in &session.servers {
        server.on(Event::Heard, START);
    }
    let mut answered = 0;
    for client in 1..=CLIENTS {
        for server in 0..2u8 {
            let request = Session::packet(1, client, 0, &[], Ipv4Addr::UNSPECIFIED);
            let s = usize::from(server);
            let from = SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68);
            match session.servers[s]
                .responder
                .decide(&request, from, 67, START)
            {
                Decision::Reply { reply, .. } => {
                    answered += 1;
                    let ip = u32::from(reply.message.yiaddr());
                    let own = if s == 0 { 100..=103 } else { 104..=107 };
                    let last = ip & 0xff;
                    assert!(
                        own.contains(&last) || last == 102 && client == 1,
                        "server {s} offered {} to client {client}",
                        reply.message.yiaddr()
                    );
                }
                Decision::Drop(super::DropReason::PartnersClient) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(
        answered,
        usize::from(CLIENTS),
        "one answer per client while up"
    );
    // Waited 30 s: both answer.
    let request = Session::packet(1, 3, 30, &[], Ipv4Addr::UNSPECIFIED);
    let from = SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68);
    for s in 0..2 {
        assert!(matches!(
            session.servers[s]
                .responder
                .decide(&request, from, 67, START + 1),
            Decision::Reply { .. }
        ));
    }
}
