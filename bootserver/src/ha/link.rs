//! The pair's shells: the link to the partner, its heartbeats and the pair's clock. The
//! decisions are [`super::pair`]'s and the book's; this file moves bytes and events.
//!
//! Two TCP connections join a pair, one each way. Each server dials its partner and sends
//! on that connection what its own log wrote: first every record its log holds (the
//! catch-up, after which the partner counts as synced), then each batch the commit thread
//! made durable, and a heartbeat every second. The partner answers each batch with what its
//! book took, and each heartbeat with its own. Each server listens for its partner's
//! connection in the same way. A connection that carries nothing for
//! `interruptedAfterSeconds` is closed and dialed again, so a healed partition starts with
//! a catch-up. Records written while no connection stands are not queued: the next
//! connection's catch-up carries them.
//!
//! While the pair is up the commit thread waits for the partner's acknowledgement of each
//! batch before any ACK of it goes out ([`PairLink::replicate`]), at most
//! [`REPLICATION_WAIT`]; a wait that runs out, or a partner that could not write, makes
//! the pair interrupted.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::pair::{Event, Pair, PairState};
use super::parts::Part;
use super::settings::HaSettings;
use super::wire::{self, Message, PairKey, Refused, Session, TAG_LEN};
use crate::dhcp::now_unix;
use crate::leases::{Lease, Leases, Record};

/// How long the commit thread waits for the partner's acknowledgement of a batch while the
/// pair is up. Below the DHCP server's commit timeout (3 s), so that a partner that stopped
/// answering costs one slow ACK rather than a lost one.
pub const REPLICATION_WAIT: Duration = Duration::from_millis(1500);
/// How often each server sends a heartbeat, and the pair's clock ticks.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// The longest a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the pair's link could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The pair's key file could not be read, or is too short.
    #[error("ha.keyFile {path}: {why}")]
    Key {
        /// The file.
        path: std::path::PathBuf,
        /// Why (never its content).
        why: String,
    },
    /// The link's port could not be opened.
    #[error("ha.listen {addr}: {source}")]
    Listen {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A connection failed: closed, timed out, or refused by the protocol.
    #[error("{0}")]
    Connection(String),
}

impl From<Refused> for LinkError {
    fn from(refused: Refused) -> Self {
        Self::Connection(refused.to_string())
    }
}

impl From<std::io::Error> for LinkError {
    fn from(error: std::io::Error) -> Self {
        Self::Connection(error.to_string())
    }
}

/// Reads the pair's key: at least 16 bytes after trimming white space (`head -c 32
/// /dev/urandom | base64` makes one).
pub fn read_key(path: &std::path::Path) -> Result<PairKey, LinkError> {
    let error = |why: String| LinkError::Key {
        path: path.to_owned(),
        why,
    };
    let bytes = std::fs::read(path).map_err(|e| error(e.to_string()))?;
    if bytes.trim_ascii().len() < 16 {
        return Err(error(
            "the key is shorter than 16 bytes (make one with: head -c 32 /dev/urandom | base64)"
                .into(),
        ));
    }
    Ok(PairKey::new(&bytes))
}

/// A state label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// [`PairState::name`].
    pub state: &'static str,
}

/// A refusal label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LinkReasonLabel {
    /// Why a connection ended.
    pub reason: &'static str,
}

/// The pair's metrics.
#[derive(Debug, Default)]
pub struct LinkMetrics {
    /// 1 for this server's state of the pair, 0 for the others.
    pub state: Family<StateLabel, Gauge>,
    /// 1 for the state the partner last reported, 0 for the others.
    pub partner_state: Family<StateLabel, Gauge>,
    /// Records the partner acknowledged.
    pub replicated: Counter,
    /// Records the partner sent that this server's book took.
    pub received: Counter,
    /// Waits for the partner's acknowledgement that ran out (the pair became interrupted).
    pub replication_timeouts: Counter,
    /// ACKs of leases of the partner's part withheld: the partner did not take them.
    pub withheld: Counter,
    /// Connections of the link that ended, by reason.
    pub connections_ended: Family<LinkReasonLabel, Counter>,
}

impl LinkMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("unbounded_bootserver_pair");
        r.register(
            "state",
            "1 for this server's view of the pair (up, interrupted, partner-down, recovering)",
            m.state.clone(),
        );
        r.register(
            "partner_state",
            "1 for the state the partner last reported",
            m.partner_state.clone(),
        );
        r.register(
            "replicated_records",
            "Lease records the partner acknowledged",
            m.replicated.clone(),
        );
        r.register(
            "received_records",
            "Lease records from the partner that this server's book took",
            m.received.clone(),
        );
        r.register(
            "replication_timeouts",
            "Waits for the partner's acknowledgement that ran out",
            m.replication_timeouts.clone(),
        );
        r.register(
            "acks_withheld",
            "ACKs of the partner's part withheld because the partner did not take the lease",
            m.withheld.clone(),
        );
        r.register(
            "connections_ended",
            "Connections of the pair's link that ended, by reason",
            m.connections_ended.clone(),
        );
        m
    }

    fn show(family: &Family<StateLabel, Gauge>, current: &'static str) {
        for state in PairState::NAMES {
            family
                .get_or_create(&StateLabel { state })
                .set(i64::from(state == current));
        }
    }

    fn ended(&self, reason: &'static str) {
        self.connections_ended
            .get_or_create(&LinkReasonLabel { reason })
            .inc();
    }
}

/// A batch for the partner, and who waits for its acknowledgement.
#[derive(Debug)]
struct Outgoing {
    records: Vec<Record>,
    answer: Option<std::sync::mpsc::SyncSender<Option<Vec<bool>>>>,
}

/// The commit thread's side of the link.
#[derive(Debug)]
pub struct PairLink {
    pair: Arc<Mutex<Pair>>,
    outgoing: mpsc::UnboundedSender<Outgoing>,
    parts: Box<dyn Parts>,
    metrics: Arc<LinkMetrics>,
}

/// Which server's part of a pool an address lies in.
pub trait Parts: Send + Sync + std::fmt::Debug {
    /// The part `ip` lies in.
    fn part_of(&self, ip: IpAddr) -> Part;
}

impl Parts for Arc<crate::config::Settings> {
    fn part_of(&self, ip: IpAddr) -> Part {
        let IpAddr::V4(ip) = ip else {
            return Part::Outside;
        };
        self.dhcp
            .subnets
            .iter()
            .find_map(|subnet| {
                if subnet.in_partners_part(ip) {
                    Some(Part::Partners)
                } else if subnet.in_pool(ip) {
                    Some(Part::Own)
                } else {
                    None
                }
            })
            .unwrap_or(Part::Outside)
    }
}

fn lock(pair: &Mutex<Pair>) -> std::sync::MutexGuard<'_, Pair> {
    pair.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PairLink {
    /// Sends `records`, durable here, to the partner. While the pair is up, waits for the
    /// partner's acknowledgement (at most [`REPLICATION_WAIT`]) and says, per record,
    /// whether the partner's book took it; otherwise sends them on without waiting (or
    /// leaves them to the next connection's catch-up) and says none was taken.
    pub fn replicate(&self, records: &[Record]) -> Vec<bool> {
        let none = vec![false; records.len()];
        if records.is_empty() {
            return none;
        }
        if !lock(&self.pair).replicates_before_ack() {
            let _ = self.outgoing.send(Outgoing {
                records: records.to_vec(),
                answer: None,
            });
            return none;
        }
        let (answer, acknowledged) = std::sync::mpsc::sync_channel(1);
        let sent = self.outgoing.send(Outgoing {
            records: records.to_vec(),
            answer: Some(answer),
        });
        let taken = match sent {
            Ok(()) => acknowledged.recv_timeout(REPLICATION_WAIT).ok().flatten(),
            Err(_) => None,
        };
        match taken {
            Some(taken) if taken.len() == records.len() => {
                self.metrics.replicated.inc_by(records.len() as u64);
                taken
            }
            _ => {
                self.metrics.replication_timeouts.inc();
                lock(&self.pair).on(Event::ReplicationTimedOut, now_unix());
                none
            }
        }
    }

    /// Waits until the partner has taken everything sent to it before (an empty batch
    /// acknowledged on the same connection, whose batches it takes in order); `false` when
    /// no connection stands or no answer came within [`REPLICATION_WAIT`]. Blocks.
    pub fn barrier(&self) -> bool {
        let (answer, acknowledged) = std::sync::mpsc::sync_channel(1);
        let sent = self.outgoing.send(Outgoing {
            records: Vec::new(),
            answer: Some(answer),
        });
        sent.is_ok() && matches!(acknowledged.recv_timeout(REPLICATION_WAIT), Ok(Some(_)))
    }

    /// Whether the ACK of `lease`, durable here, may go out, given whether the partner
    /// took it ([`Pair::may_acknowledge`]).
    pub fn acknowledges(&self, lease: &Lease, partner_took: bool) -> bool {
        let allowed = lock(&self.pair).may_acknowledge(self.parts.part_of(lease.ip), partner_took);
        if !allowed {
            self.metrics.withheld.inc();
        }
        allowed
    }
}

/// Starts the pair's shells: the link's listener is bound here (so that a port in use
/// fails the start), the dialer, the listener and the clock run as tasks on the current
/// runtime. Returns the commit thread's side of the link.
pub async fn start(
    ha: &HaSettings,
    listen: SocketAddr,
    pair: Arc<Mutex<Pair>>,
    leases: Arc<Leases>,
    parts: Box<dyn Parts>,
    metrics: Arc<LinkMetrics>,
) -> Result<Arc<PairLink>, LinkError> {
    let key = read_key(&ha.key_file)?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| LinkError::Listen {
            addr: listen,
            source,
        })?;
    tracing::info!(%listen, partner = %ha.partner, partner_address = %ha.partner_address, "pair: listening for the partner's link");
    let (outgoing, queue) = mpsc::unbounded_channel();
    let ends = Ends {
        key,
        name: ha.name.clone(),
        partner: ha.partner.clone(),
        idle: ha.interrupted_after,
        pair: pair.clone(),
        leases,
        metrics: metrics.clone(),
    };
    let ends = Arc::new(ends);
    tokio::spawn(dial(ends.clone(), ha.partner_address, queue));
    tokio::spawn(listen_for_partner(ends.clone(), listener));
    tokio::spawn(clock(pair.clone(), metrics.clone()));
    Ok(Arc::new(PairLink {
        pair,
        outgoing,
        parts,
        metrics,
    }))
}

/// What both ends of the link share.
#[derive(Debug)]
struct Ends {
    key: PairKey,
    name: String,
    partner: String,
    idle: Duration,
    pair: Arc<Mutex<Pair>>,
    leases: Arc<Leases>,
    metrics: Arc<LinkMetrics>,
}

impl Ends {
    /// The partner answered on this server's own connection: the link that carries this
    /// server's records works (what "up" needs). A partner heard only on its own
    /// connection is alive, but cannot be replicated to.
    fn answered(&self) {
        lock(&self.pair).on(Event::Heard, now_unix());
    }

    fn partner_reports(&self, state: u8) {
        LinkMetrics::show(&self.metrics.partner_state, PairState::name_of_code(state));
    }

    /// What the partner said of its state on this server's own connection (`None`: the
    /// connection ended): whether it holds this server's part decides, without a fence,
    /// whether this server may bind in its part.
    fn partner_says(&self, state: Option<u8>) {
        lock(&self.pair).partner_reported(state);
    }

    fn state_code(&self) -> u8 {
        lock(&self.pair).reported_code(now_unix())
    }
}

/// The pair's clock: a tick a second, and the state shown in metrics and logged when it
/// changes.
async fn clock(pair: Arc<Mutex<Pair>>, metrics: Arc<LinkMetrics>) {
    let mut shown: Option<&'static str> = None;
    let mut interval = tokio::time::interval(HEARTBEAT);
    loop {
        interval.tick().await;
        let state = {
            let mut pair = lock(&pair);
            pair.on(Event::Tick, now_unix());
            pair.state()
        };
        if shown != Some(state.name()) {
            tracing::info!(
                state = state.name(),
                was = shown.unwrap_or("starting"),
                "pair: state"
            );
            LinkMetrics::show(&metrics.state, state.name());
            shown = Some(state.name());
        }
    }
}

fn challenge() -> [u8; TAG_LEN] {
    let mut challenge = [0u8; TAG_LEN];
    // The system's random source does not fail on Linux once booted; a zero challenge
    // would only make this connection's session key guessable from an earlier one's.
    if SystemRandom::new().fill(&mut challenge).is_err() {
        tracing::error!("pair: no random bytes for the link's challenge");
    }
    challenge
}

async fn timed<T>(
    what: &str,
    limit: Duration,
    future: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, LinkError> {
    match tokio::time::timeout(limit, future).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(LinkError::Connection(format!("{what} timed out"))),
    }
}

/// Reads one frame's bytes (after its length).
async fn read_frame(
    stream: &mut (impl AsyncReadExt + Unpin),
    idle: Duration,
) -> Result<Vec<u8>, LinkError> {
    let mut len = [0u8; 4];
    timed("waiting for the partner", idle, stream.read_exact(&mut len)).await?;
    let mut frame = vec![0u8; Session::frame_len(len)?];
    timed("reading a frame", idle, stream.read_exact(&mut frame)).await?;
    Ok(frame)
}

/// The dialer's end: connects to the partner again and again, and sends this server's
/// records and heartbeats on each connection.
async fn dial(ends: Arc<Ends>, partner: SocketAddr, mut queue: mpsc::UnboundedReceiver<Outgoing>) {
    let mut last_error = String::new();
    loop {
        let ended = match connect(&ends, partner).await {
            Ok((stream, session)) => {
                last_error.clear();
                tracing::info!(%partner, "pair: connected to the partner");
                let ended = carry(&ends, stream, session, &mut queue).await;
                ends.metrics.ended("dialer");
                ended
            }
            Err(error) => Err(error),
        };
        if let Err(error) = ended {
            let error = error.to_string();
            if error != last_error {
                tracing::warn!(%partner, %error, "pair: the link to the partner is down; dialing again");
                last_error = error;
            }
        }
        // Nothing can be replicated until the next connection: the ACKs waiting now would
        // only wait out their time.
        lock(&ends.pair).on(Event::ReplicationTimedOut, now_unix());
        // Nothing waits on a link that is down: what it would carry goes in the next
        // connection's catch-up.
        while let Ok(outgoing) = queue.try_recv() {
            drop(outgoing);
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

async fn connect(ends: &Ends, partner: SocketAddr) -> Result<(TcpStream, Session), LinkError> {
    let mut stream = timed("connecting", ends.idle, TcpStream::connect(partner)).await?;
    stream.set_nodelay(true)?;
    let mut hello_l = [0u8; wire::MAGIC.len() + TAG_LEN];
    timed(
        "the partner's hello",
        HANDSHAKE_TIMEOUT,
        stream.read_exact(&mut hello_l),
    )
    .await?;
    let challenge_d = challenge();
    let hello_d = ends.key.dialer_hello(&hello_l, &challenge_d, &ends.name)?;
    timed(
        "sending hello",
        HANDSHAKE_TIMEOUT,
        stream.write_all(&hello_d),
    )
    .await?;
    let mut proof = [0u8; TAG_LEN];
    timed(
        "the partner's proof",
        HANDSHAKE_TIMEOUT,
        stream.read_exact(&mut proof),
    )
    .await?;
    let session = ends
        .key
        .confirm(&hello_l, &challenge_d, &proof, &ends.partner)?;
    Ok((stream, session))
}

/// One connection of the dialer: the catch-up, then batches and heartbeats; the partner's
/// answers come back on it.
async fn carry(
    ends: &Ends,
    stream: TcpStream,
    session: Session,
    queue: &mut mpsc::UnboundedReceiver<Outgoing>,
) -> Result<(), LinkError> {
    let (mut reader, mut writer) = stream.into_split();
    let mut sealer = session.clone();
    let mut opener = session;
    // Batches queued before the catch-up are in it.
    while let Ok(outgoing) = queue.try_recv() {
        drop(outgoing);
    }
    let catch_up: Vec<Record> = ends
        .leases
        .log()
        .durable()
        .map(|index| index.records().collect())
        .map_err(|e| LinkError::Connection(format!("reading the log for the catch-up: {e}")))?;
    let mut out = Vec::new();
    for message in wire::catch_up(catch_up) {
        out.clear();
        sealer.seal(&message, &mut out);
        writer.write_all(&out).await?;
    }
    // The partner's answers, read by a task of their own (a read cancelled half-way would
    // lose the frame's bytes).
    let (answers_in, mut answers) = mpsc::channel::<Result<Message, LinkError>>(64);
    let idle = ends.idle;
    let read = tokio::spawn(async move {
        loop {
            let message = match read_frame(&mut reader, idle).await {
                Ok(frame) => opener.open(&frame).map_err(LinkError::from),
                Err(error) => Err(error),
            };
            let failed = message.is_err();
            if answers_in.send(message).await.is_err() || failed {
                return;
            }
        }
    });
    let mut pending: HashMap<u64, std::sync::mpsc::SyncSender<Option<Vec<bool>>>> = HashMap::new();
    let mut next_batch = 1u64;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let ended = loop {
        tokio::select! {
            outgoing = queue.recv() => {
                let Some(Outgoing { records, answer }) = outgoing else {
                    break Ok(());
                };
                let batch = next_batch;
                next_batch += 1;
                out.clear();
                sealer.seal(&Message::Records { batch, catch_up: false, records }, &mut out);
                if let Err(error) = writer.write_all(&out).await {
                    break Err(error.into());
                }
                if let Some(answer) = answer {
                    pending.insert(batch, answer);
                }
            }
            answer = answers.recv() => {
                match answer {
                    Some(Ok(Message::Ack { batch, taken })) => {
                        ends.answered();
                        if let Some(waiter) = pending.remove(&batch) {
                            let _ = waiter.try_send(taken);
                        }
                    }
                    Some(Ok(Message::Heartbeat { state })) => {
                        ends.answered();
                        ends.partner_reports(state);
                        ends.partner_says(Some(state));
                    }
                    Some(Ok(Message::Records { .. })) => {
                        break Err(LinkError::Connection("records from the listening end".into()));
                    }
                    Some(Err(error)) => break Err(error),
                    None => break Err(LinkError::Connection("the reader stopped".into())),
                }
            }
            _ = heartbeat.tick() => {
                out.clear();
                sealer.seal(&Message::Heartbeat { state: ends.state_code() }, &mut out);
                if let Err(error) = writer.write_all(&out).await {
                    break Err(error.into());
                }
            }
        }
    };
    read.abort();
    ends.partner_says(None);
    // Dropping `pending` answers every waiter: not acknowledged.
    ended
}

/// The listener's end: takes the partner's connections, one at a time (a newer one that
/// proves itself replaces the older, which is likely dead).
async fn listen_for_partner(ends: Arc<Ends>, listener: TcpListener) {
    let current: Arc<Mutex<Option<tokio::task::AbortHandle>>> = Arc::default();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(4));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "pair: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // A few handshakes at once: a flood of connections from elsewhere cannot hold the
        // partner's out.
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            ends.metrics.ended("busy");
            continue;
        };
        let (ends, current) = (ends.clone(), current.clone());
        tokio::spawn(async move {
            let accepted = accept(&ends, stream).await;
            drop(permit);
            let (stream, session) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%peer, %error, "pair: refused a connection to the link");
                    ends.metrics.ended("refused");
                    return;
                }
            };
            tracing::info!(%peer, "pair: the partner connected");
            let serving = tokio::spawn({
                let ends = ends.clone();
                async move {
                    if let Err(error) = take(&ends, stream, session).await {
                        tracing::warn!(%peer, %error, "pair: the partner's connection ended");
                    }
                    ends.metrics.ended("listener");
                }
            });
            let older = current
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .replace(serving.abort_handle());
            if let Some(older) = older {
                older.abort();
            }
        });
    }
}

async fn accept(ends: &Ends, mut stream: TcpStream) -> Result<(TcpStream, Session), LinkError> {
    stream.set_nodelay(true)?;
    let challenge_l = challenge();
    timed(
        "sending hello",
        HANDSHAKE_TIMEOUT,
        stream.write_all(&PairKey::listener_hello(&challenge_l)),
    )
    .await?;
    let mut head = [0u8; wire::MAGIC.len() + TAG_LEN + 1];
    timed(
        "the partner's hello",
        HANDSHAKE_TIMEOUT,
        stream.read_exact(&mut head),
    )
    .await?;
    let mut hello_d = head.to_vec();
    hello_d.resize(wire::dialer_hello_len(&head), 0);
    timed(
        "the partner's hello",
        HANDSHAKE_TIMEOUT,
        stream.read_exact(&mut hello_d[head.len()..]),
    )
    .await?;
    let (proof, session) = ends
        .key
        .accept(&challenge_l, &hello_d, &ends.partner, &ends.name)?;
    timed("sending proof", HANDSHAKE_TIMEOUT, stream.write_all(&proof)).await?;
    Ok((stream, session))
}

/// One connection of the listener: the partner's records go into the book (and the log),
/// each batch answered with what the book took; heartbeats are answered with ours.
async fn take(
    ends: &Arc<Ends>,
    mut stream: TcpStream,
    mut session: Session,
) -> Result<(), LinkError> {
    let mut out = Vec::new();
    loop {
        let frame = read_frame(&mut stream, ends.idle).await?;
        let reply = match session.open(&frame)? {
            Message::Records {
                batch,
                catch_up,
                records,
            } => {
                let leases = ends.leases.clone();
                let count = records.len();
                let taken = tokio::task::spawn_blocking(move || {
                    leases.replicate(&records, now_unix()).ok()
                })
                .await
                .map_err(|e| {
                    LinkError::Connection(format!("writing the partner's records: {e}"))
                })?;
                match &taken {
                    Some(taken) => {
                        let took = taken.iter().filter(|t| **t).count() as u64;
                        ends.metrics.received.inc_by(took);
                        if catch_up {
                            tracing::info!(
                                records = count,
                                taken = took,
                                "pair: caught up with the partner's log"
                            );
                            lock(&ends.pair).on(Event::Synced, now_unix());
                        }
                    }
                    None => tracing::error!(
                        records = count,
                        "pair: the partner's records could not be written here; not acknowledged"
                    ),
                }
                Message::Ack { batch, taken }
            }
            Message::Heartbeat { state } => {
                ends.partner_reports(state);
                Message::Heartbeat {
                    state: ends.state_code(),
                }
            }
            Message::Ack { .. } => {
                return Err(LinkError::Connection(
                    "an acknowledgement from the dialing end".into(),
                ));
            }
        };
        out.clear();
        session.seal(&reply, &mut out);
        timed("answering the partner", ends.idle, stream.write_all(&out)).await?;
    }
}
