//! `dhcp-load`: a DHCP load generator that acts as a relay agent (like Kea's perfdhcp):
//! it runs DISCOVER → OFFER → REQUEST → ACK for many simulated clients from one UDP socket
//! on port 67 of `--relay`, and prints DORA/s. With `--leases-out` it writes every
//! acknowledged lease as `<mac> <ip>` lines, which the crash tests compare across restarts.
//!
//! `--server` may be given twice, as a relay's two helper addresses: every message goes to
//! each server (a pair of bootservers). As real clients do, each message says in `secs` how
//! long its client has been trying, and a client whose REQUEST goes unanswered twice starts
//! over with a DISCOVER.
//!
//! With `--rate`, new clients start at that many per second (a steady offered load, still
//! capped by `--window`) instead of as fast as the window allows; `--latencies-out` writes
//! when each acknowledged client began and when its ACK came (the benchmarks' takeover
//! time after a server is killed).
//!
//! ```sh
//! ip netns exec <client-ns> dhcp-load --relay 10.99.0.2 --server 10.99.0.1 --clients 5000
//! ```

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use tokio::net::UdpSocket;

/// Runs DORA for many simulated clients through a relay socket.
#[derive(Debug, Parser)]
struct Args {
    /// The relay address (ours, in the client namespace); replies come to it on port 67.
    #[arg(long)]
    relay: Ipv4Addr,
    /// The DHCP server; given again, another one that gets every message too.
    #[arg(long, required = true)]
    server: Vec<Ipv4Addr>,
    /// Number of clients.
    #[arg(long, default_value_t = 1000)]
    clients: u32,
    /// First client index (MACs are 02:00:<index as 4 bytes>), so runs can reuse or extend
    /// the same clients.
    #[arg(long, default_value_t = 0)]
    first: u32,
    /// Transactions in flight at once.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Give up on a client after this many seconds without an answer.
    #[arg(long, default_value_t = 3)]
    timeout_seconds: u64,
    /// Write each acknowledged lease as `<mac> <ip>` to this file.
    #[arg(long)]
    leases_out: Option<PathBuf>,
    /// A client that gets a NAK starts over with a DISCOVER (RFC 2131's clients do)
    /// rather than giving up.
    #[arg(long)]
    retry_naks: bool,
    /// New clients per second (a steady offered load; `--window` still caps the clients in
    /// flight). Without it, a new client starts whenever the window has room.
    #[arg(long)]
    rate: Option<u32>,
    /// Write each acknowledged client as `<mac> <began> <acked>`, both in microseconds since
    /// the Unix epoch (its first DISCOVER and its ACK), to this file.
    #[arg(long)]
    latencies_out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Discovering,
    Requesting(Ipv4Addr, Ipv4Addr),
}

fn mac_of(index: u32) -> [u8; 6] {
    let b = index.to_be_bytes();
    [0x02, 0x00, b[0], b[1], b[2], b[3]]
}

fn request(index: u32, relay: Ipv4Addr, phase: Phase, secs: u16) -> Message {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(index)
        .set_secs(secs)
        .set_flags(Flags::default())
        .set_giaddr(relay)
        .set_chaddr(&mac_of(index));
    let opts = m.opts_mut();
    match phase {
        Phase::Discovering => {
            opts.insert(DhcpOption::MessageType(MessageType::Discover));
        }
        Phase::Requesting(ip, server) => {
            opts.insert(DhcpOption::MessageType(MessageType::Request));
            opts.insert(DhcpOption::RequestedIpAddress(ip));
            opts.insert(DhcpOption::ServerIdentifier(server));
        }
    }
    m
}

fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("dhcp-load: {error}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> std::io::Result<bool> {
    let socket = UdpSocket::bind(SocketAddrV4::new(args.relay, 67)).await?;
    let servers: Vec<SocketAddrV4> = args
        .server
        .iter()
        .map(|server| SocketAddrV4::new(*server, 67))
        .collect();
    let send = |bytes: Vec<u8>| {
        let (socket, servers) = (&socket, &servers);
        async move {
            for server in servers {
                socket.send_to(&bytes, server).await?;
            }
            std::io::Result::Ok(())
        }
    };
    let mut out = match &args.leases_out {
        Some(path) => Some(std::io::BufWriter::new(std::fs::File::create(path)?)),
        None => None,
    };
    let mut latencies = match &args.latencies_out {
        Some(path) => Some(std::io::BufWriter::new(std::fs::File::create(path)?)),
        None => None,
    };
    let last = args.first + args.clients;
    let mut next = args.first;
    // Per client: its phase, when the phase began, its retransmissions, and when the client
    // began (for `secs`).
    let mut in_flight: HashMap<u32, (Phase, Instant, u8, Instant)> = HashMap::new();
    let secs = |began: Instant| u16::try_from(began.elapsed().as_secs()).unwrap_or(u16::MAX);
    let (mut acked, mut naks, mut lost) = (0u32, 0u32, 0u32);
    let started = Instant::now();
    // The wall clock at `started`, for `--latencies-out`.
    let epoch_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let wall_us = |at: Instant| epoch_us + (at - started).as_micros();
    // With `--rate`: whether client `index` is due to start by now.
    let due = |index: u32| match args.rate {
        Some(rate) => {
            f64::from(index - args.first) < f64::from(rate) * started.elapsed().as_secs_f64() + 1.0
        }
        None => true,
    };
    let mut buf = vec![0u8; 1500];
    let retry = Duration::from_millis(1000);
    let give_up = Duration::from_secs(args.timeout_seconds);
    loop {
        while in_flight.len() < args.window && next < last && due(next) {
            let bytes = request(next, args.relay, Phase::Discovering, 0)
                .to_vec()
                .map_err(std::io::Error::other)?;
            send(bytes).await?;
            let now = Instant::now();
            in_flight.insert(next, (Phase::Discovering, now, 0, now));
            next += 1;
        }
        // (Paced, the window may be empty while the next client is not due yet.)
        if in_flight.is_empty() && next >= last {
            break;
        }
        // Paced: wake up for the next client's start.
        let wait = if args.rate.is_some() && next < last {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(200)
        };
        match tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
            Ok(Ok((len, _))) => {
                let Some(reply) = buf
                    .get(..len)
                    .and_then(|b| Message::decode(&mut Decoder::new(b)).ok())
                else {
                    continue;
                };
                let xid = reply.xid();
                let Some((phase, _, _, began)) = in_flight.get(&xid).copied() else {
                    continue;
                };
                match (phase, reply.opts().msg_type()) {
                    (Phase::Discovering, Some(MessageType::Offer)) => {
                        let server_id = match reply.opts().get(OptionCode::ServerIdentifier) {
                            Some(DhcpOption::ServerIdentifier(s)) => *s,
                            _ => args
                                .server
                                .first()
                                .copied()
                                .unwrap_or(Ipv4Addr::UNSPECIFIED),
                        };
                        let phase = Phase::Requesting(reply.yiaddr(), server_id);
                        let bytes = request(xid, args.relay, phase, secs(began))
                            .to_vec()
                            .map_err(std::io::Error::other)?;
                        send(bytes).await?;
                        in_flight.insert(xid, (phase, Instant::now(), 0, began));
                    }
                    (Phase::Requesting(..), Some(MessageType::Ack)) => {
                        in_flight.remove(&xid);
                        acked += 1;
                        if let Some(out) = out.as_mut() {
                            writeln!(out, "{} {}", format_mac(reply.chaddr()), reply.yiaddr())?;
                        }
                        if let Some(latencies) = latencies.as_mut() {
                            writeln!(
                                latencies,
                                "{} {} {}",
                                format_mac(reply.chaddr()),
                                wall_us(began),
                                wall_us(Instant::now())
                            )?;
                        }
                    }
                    (_, Some(MessageType::Nak)) => {
                        naks += 1;
                        if args.retry_naks {
                            let bytes = request(xid, args.relay, Phase::Discovering, secs(began))
                                .to_vec()
                                .map_err(std::io::Error::other)?;
                            send(bytes).await?;
                            in_flight.insert(xid, (Phase::Discovering, Instant::now(), 0, began));
                        } else {
                            in_flight.remove(&xid);
                        }
                    }
                    _ => {}
                }
            }
            Ok(Err(error)) => return Err(error),
            Err(_) => {}
        }
        // Retransmit what waited too long; give up on what waited far too long.
        let now = Instant::now();
        let mut resend = Vec::new();
        in_flight.retain(|xid, (phase, sent, tries, began)| {
            let waited = now - *sent;
            if waited > give_up {
                lost += 1;
                return false;
            }
            if waited > retry * u32::from(*tries + 1) {
                *tries += 1;
                if matches!(phase, Phase::Requesting(..)) && *tries > 2 {
                    // Its server does not answer: start over, as RFC 2131's clients do.
                    (*phase, *sent, *tries) = (Phase::Discovering, now, 0);
                }
                resend.push((*xid, *phase, secs(*began)));
            }
            true
        });
        for (xid, phase, secs) in resend {
            let bytes = request(xid, args.relay, phase, secs)
                .to_vec()
                .map_err(std::io::Error::other)?;
            send(bytes).await?;
        }
    }
    if let Some(out) = out.as_mut() {
        out.flush()?;
    }
    if let Some(latencies) = latencies.as_mut() {
        latencies.flush()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "clients={} acked={acked} naks={naks} lost={lost} seconds={seconds:.2} dora_per_second={:.0}",
        args.clients,
        f64::from(acked) / seconds
    );
    Ok(acked == args.clients)
}
