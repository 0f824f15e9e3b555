#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! An IPv6-only UEFI network boot through the bootserver: DHCPv4 off (`dhcp.mode: off`),
//! DHCPv6 in full mode with router advertisements (M and O), and OVMF's own PXEv6 under
//! QEMU (TCG on machines without usable KVM). Every step is read off the wire (a capture
//! on the provisioning bridge, decoded here) and off the VM's console:
//!
//! 1. OVMF's PXEv6 Solicit (DUID-LLT of the NIC, vendor class `PXEClient:Arch:00007`), our
//!    Advertise and Reply with an address of the pool and option 59
//!    `tftp://[fd00:99::1]/snponly.efi`;
//! 2. TFTP over IPv6 of `snponly.efi` from that address;
//! 3. iPXE's DHCPv6 after our router advertisement: user class `iPXE`, and option 59
//!    naming its script, `http://[fd00:99::1]:8080/boot.ipxe?mac=…`;
//! 4. the script, kernel and initrd over HTTP from iPXE's DHCPv6 address;
//! 5. the marker image's line: the machine's name and the v6 bootserver URL.
//!
//! The test prints the timings it measured (seconds from QEMU's start). Measured under TCG:
//! marker at ~47 s. OVMF's PXEv6 exchange takes ~4.9 s (it collects Advertises until its
//! first retransmission, 4 s), then ~10 s pass before its TFTP request (its wait for a route
//! to the server); snponly.efi loads in well under a second; iPXE's DHCPv6 takes ~10 ms,
//! but its "Configuring" lasts ~15 s more: it waits for DHCPv4, unanswered here, to give up.
//! OVMF also runs a second stateful exchange of its own (Ip6Config, answering the RA's M
//! flag: DUID-LLT, another IAID, only DNS asked) and releases both addresses before
//! starting iPXE, which keeps a third (DUID-UUID, all zeros under QEMU without `-uuid`).

mod common;

use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use dhcproto::v6::{DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder};
use unbounded_testbed::netns::{Netns, unique};
use unbounded_testbed::qemu::{Firmware, Vm, marker_image};

/// Long enough for TCG on 2 busy cores (measured ~47 s per boot on an idle machine).
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// The bootserver's IPv6 address on the provisioning bridge.
const SERVER6: &str = "fd00:99::1";
const MAC: &str = "52:54:00:00:06:02";
/// The DHCPv6 boot file URL option (RFC 5970).
const OPTION_BOOTFILE_URL: u16 = 59;

/// IPv6-only provisioning: DHCPv4 off (the v4 server address is still required: TFTP and
/// HTTP listen on it too), DHCPv6 in full mode on the bridge.
fn config(images: &Path) -> String {
    format!(
        r#"interface: br0
serverAddress: {SERVER}
dhcp:
  mode: off
  leaseFile: "{{dir}}/leases.log"
dhcp6:
  mode: full
  serverAddress: {SERVER6}
  subnets:
    - prefix: fd00:99::/64
      pool: [fd00:99::100, fd00:99::1ff]
      dns: [{SERVER6}]
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
machines:
  - name: uefi-node
    macs: ["{MAC}"]
    firmware: uefi
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
"#,
        images = images.display()
    )
}

/// The provisioning network of `pxe.rs` (bridge `br0` with 10.99.0.1, the VM's tap on
/// it) with the server's IPv6 address on the bridge, without duplicate address detection
/// (DHCPv6 binds it when the bootserver starts).
fn provisioning_network() -> (Netns, String) {
    let ns = bridge_namespace("ub6");
    ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{SERVER6}/64"),
        "dev",
        "br0",
        "nodad",
    ])
    .unwrap();
    let tap = unique("tap");
    ns.ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])
        .unwrap();
    ns.ip(&["link", "set", &tap, "master", "br0"]).unwrap();
    ns.ip(&["link", "set", &tap, "up"]).unwrap();
    (ns, tap)
}

/// tcpdump on the bridge, writing a pcap file; stopped on drop.
struct Tcpdump {
    child: Child,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tcpdump {
    fn start(ns: &Netns) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("br0.pcap");
        let child = ns
            .command("tcpdump")
            .args(["-i", "br0", "-n", "--immediate-mode", "-U", "-s", "0", "-w"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // tcpdump writes the file's header once it captures.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(&file).map_or(0, |m| m.len()) < 24 {
            assert!(Instant::now() < deadline, "tcpdump did not start on br0");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            file,
            _dir: dir,
        }
    }

    /// What was captured so far (`-U` writes each packet as it comes).
    fn read(&self) -> Capture {
        Capture::parse(&std::fs::read(&self.file).unwrap())
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A UDP datagram over IPv6.
#[derive(Debug, Clone)]
struct Udp6 {
    time: f64,
    src: Ipv6Addr,
    sport: u16,
    dst: Ipv6Addr,
    dport: u16,
    payload: Vec<u8>,
}

/// The first line of an HTTP request over IPv6, and who sent it.
#[derive(Debug, Clone)]
struct Request {
    time: f64,
    src: Ipv6Addr,
    line: String,
}

/// A DHCPv6 message on the wire.
#[derive(Debug, Clone)]
struct Dhcp6 {
    time: f64,
    /// Sent to port 547 (a client's), else from it (ours).
    from_client: bool,
    message: Message,
}

/// What the capture holds, decoded: Ethernet frames with IPv6 UDP and TCP, and DHCPv4.
#[derive(Debug, Default)]
struct Capture {
    udp6: Vec<Udp6>,
    requests: Vec<Request>,
    /// DHCPv4 messages sent to port 67 (clients) and from it (servers).
    dhcp4_to_server: Vec<f64>,
    dhcp4_from_server: usize,
}

impl Capture {
    /// Reads a pcap file (microsecond timestamps, Ethernet, as tcpdump writes on x86).
    fn parse(bytes: &[u8]) -> Self {
        let mut capture = Self::default();
        assert_eq!(
            bytes.get(..4),
            Some(&0xa1b2_c3d4u32.to_le_bytes()[..]),
            "not a little-endian microsecond pcap"
        );
        assert_eq!(u32_le(&bytes[20..24]), 1, "not an Ethernet capture");
        let mut at = 24;
        while at + 16 <= bytes.len() {
            let time = f64::from(u32_le(&bytes[at..at + 4]))
                + f64::from(u32_le(&bytes[at + 4..at + 8])) / 1e6;
            let len = u32_le(&bytes[at + 8..at + 12]) as usize;
            let Some(frame) = bytes.get(at + 16..at + 16 + len) else {
                break; // the last record is still being written
            };
            capture.frame(time, frame);
            at += 16 + len;
        }
        capture
    }

    fn frame(&mut self, time: f64, frame: &[u8]) {
        let Some(ethertype) = frame.get(12..14) else {
            return;
        };
        let ip = &frame[14..];
        match ethertype {
            [0x86, 0xdd] if ip.len() >= 40 => {
                let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
                let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
                let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
                let Some(l4) = ip.get(40..40 + payload_len) else {
                    return;
                };
                match ip[6] {
                    17 if l4.len() >= 8 => self.udp6.push(Udp6 {
                        time,
                        src,
                        sport: u16::from_be_bytes([l4[0], l4[1]]),
                        dst,
                        dport: u16::from_be_bytes([l4[2], l4[3]]),
                        payload: l4[8..].to_vec(),
                    }),
                    6 if l4.len() >= 20 => {
                        let offset = usize::from(l4[12] >> 4) * 4;
                        let data = l4.get(offset..).unwrap_or_default();
                        if data.starts_with(b"GET ") || data.starts_with(b"HEAD ") {
                            let line = data.split(|b| *b == b'\r').next().unwrap_or_default();
                            self.requests.push(Request {
                                time,
                                src,
                                line: String::from_utf8_lossy(line).into_owned(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            [0x08, 0x00] if ip.len() >= 20 && ip[9] == 17 => {
                let header = usize::from(ip[0] & 0x0f) * 4;
                let Some(udp) = ip.get(header..header + 4) else {
                    return;
                };
                let (sport, dport) = (
                    u16::from_be_bytes([udp[0], udp[1]]),
                    u16::from_be_bytes([udp[2], udp[3]]),
                );
                if dport == 67 {
                    self.dhcp4_to_server.push(time);
                }
                if sport == 67 {
                    self.dhcp4_from_server += 1;
                }
            }
            _ => {}
        }
    }

    /// The DHCPv6 messages, decoded.
    fn dhcp6(&self) -> Vec<Dhcp6> {
        self.udp6
            .iter()
            .filter(|u| u.dport == 547 || u.sport == 547)
            .filter_map(|u| {
                Some(Dhcp6 {
                    time: u.time,
                    from_client: u.dport == 547,
                    message: Message::decode(&mut Decoder::new(&u.payload)).ok()?,
                })
            })
            .collect()
    }
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn client_id(message: &Message) -> Option<&[u8]> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::ClientId(id) => Some(id.as_slice()),
        _ => None,
    })
}

/// The DUID type (1 LLT, 2 EN, 3 LL, 4 UUID) of a message's client ID.
fn duid_type(message: &Message) -> Option<u16> {
    let id = client_id(message)?;
    Some(u16::from_be_bytes([*id.first()?, *id.get(1)?]))
}

fn iaid(message: &Message) -> Option<u32> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::IANA(ia) => Some(ia.id),
        _ => None,
    })
}

/// The first address of the first IA_NA.
fn ia_address(message: &Message) -> Option<Ipv6Addr> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::IANA(ia) => ia.opts.iter().find_map(|o| match o {
            DhcpOption::IAAddr(a) => Some(a.addr),
            _ => None,
        }),
        _ => None,
    })
}

fn boot_file_url(message: &Message) -> Option<String> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::Unknown(u) if u.code() == OptionCode::from(OPTION_BOOTFILE_URL) => {
            Some(String::from_utf8_lossy(u.data()).into_owned())
        }
        _ => None,
    })
}

fn vendor_class(message: &Message) -> Option<(u32, String)> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::VendorClass(v) => Some((
            v.num,
            String::from_utf8_lossy(&v.data.concat()).into_owned(),
        )),
        _ => None,
    })
}

fn user_class(message: &Message) -> Option<String> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::UserClass(u) => Some(String::from_utf8_lossy(&u.data.concat()).into_owned()),
        _ => None,
    })
}

fn requested_options(message: &Message) -> Vec<u16> {
    message
        .opts()
        .iter()
        .find_map(|o| match o {
            DhcpOption::ORO(oro) => Some(oro.opts.iter().map(|c| u16::from(*c)).collect()),
            _ => None,
        })
        .unwrap_or_default()
}

/// One client's stateful exchange: its first Solicit, then the Request of the same IA and
/// the Reply to that Request.
#[derive(Debug)]
struct Exchange {
    solicit: Dhcp6,
    advertise: Option<Dhcp6>,
    request: Option<Dhcp6>,
    reply: Option<Dhcp6>,
}

impl Exchange {
    /// The first exchange whose Solicit `matches`.
    fn find(messages: &[Dhcp6], matches: impl Fn(&Message) -> bool) -> Option<Self> {
        let solicit = messages
            .iter()
            .find(|m| {
                m.from_client && m.message.msg_type() == MessageType::Solicit && matches(&m.message)
            })?
            .clone();
        let (id, ia) = (client_id(&solicit.message), iaid(&solicit.message));
        let answer = |to: &Dhcp6, kind: MessageType| {
            messages
                .iter()
                .find(|m| {
                    !m.from_client
                        && m.message.msg_type() == kind
                        && m.message.xid() == to.message.xid()
                        && m.time >= to.time
                })
                .cloned()
        };
        let advertise = answer(&solicit, MessageType::Advertise);
        let request = messages
            .iter()
            .find(|m| {
                m.from_client
                    && m.time >= solicit.time
                    && m.message.msg_type() == MessageType::Request
                    && client_id(&m.message) == id
                    && iaid(&m.message) == ia
            })
            .cloned();
        let reply = request.as_ref().and_then(|r| answer(r, MessageType::Reply));
        Some(Self {
            solicit,
            advertise,
            request,
            reply,
        })
    }
}

/// The TFTP transfers of a file over IPv6: each RRQ, and the time of the transfer's last
/// packet (its port pair's last datagram).
fn tftp_transfers(capture: &Capture, file: &str) -> Vec<(Udp6, f64)> {
    let rrq = |u: &Udp6| {
        u.dport == 69
            && u.payload.starts_with(&[0, 1])
            && u.payload[2..].starts_with(file.as_bytes())
    };
    capture
        .udp6
        .iter()
        .filter(|u| rrq(u))
        .map(|request| {
            let end = capture
                .udp6
                .iter()
                .filter(|u| {
                    u.time >= request.time
                        && ((u.dst == request.src && u.dport == request.sport)
                            || (u.src == request.src && u.sport == request.sport))
                })
                .map(|u| u.time)
                .fold(request.time, f64::max);
            (request.clone(), end)
        })
        .collect()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The script, the kernel and the initrd as iPXE fetched them over HTTP on IPv6, each
/// from `ipxe_address`.
fn ipxe_fetched(
    capture: &Capture,
    ipxe_address: Ipv6Addr,
    context: &dyn Fn() -> String,
) -> (Request, Request, Request) {
    let request = |path: &str| {
        let found = capture
            .requests
            .iter()
            // iPXE percent-encodes the colons of the MAC.
            .find(|r| {
                r.line
                    .replace("%3A", ":")
                    .starts_with(&format!("GET {path}"))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no GET {path} over IPv6\n{}", context()));
        assert_eq!(found.src, ipxe_address, "{found:?}");
        found
    };
    (
        request(&format!("/boot.ipxe?mac={MAC}")),
        request("/images/vmlinuz"),
        request("/images/initrd.img"),
    )
}

/// The marker's line: booted as its Machine, told the v6 bootserver URL.
fn assert_booted_as_uefi_node(line: &str) {
    assert!(line.contains("unbounded.machine=uefi-node"), "{line}");
    assert!(
        line.contains(&format!("unbounded.bootserver=http://[{SERVER6}]:8080")),
        "{line}"
    );
}

#[test]
fn uefi_pxev6_boots_an_ipv6_only_machine_through_tftp_and_ipxe_to_the_marker() {
    let images = marker_image().unwrap();
    let (ns, tap) = provisioning_network();
    let tcpdump = Tcpdump::start(&ns);
    // `dhcp.mode: off` beside `dhcp6.mode: full` is a valid configuration.
    let server = Bootserver::start(&ns, &config(&images));
    let server6: Ipv6Addr = SERVER6.parse().unwrap();
    let started = unix_now();
    let vm = Vm::start(&ns, &tap, MAC, Firmware::UefiPxe6).unwrap();
    let outcome = vm.wait_for("UNBOUNDED-MARKER", BOOT_TIMEOUT);
    let marker_at = unix_now() - started;
    let capture = tcpdump.read();
    let context = || {
        format!(
            "console:\n{}\nbootserver log:\n{}\nDHCPv6 on the wire:\n{:#?}\nHTTP requests: {:#?}",
            vm.console(),
            server.log(),
            capture
                .dhcp6()
                .iter()
                .map(|m| format!("{:.3} {:?}", m.time - started, m.message))
                .collect::<Vec<_>>(),
            capture.requests
        )
    };
    let line = outcome.unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let messages = capture.dhcp6();
    let at = |t: f64| t - started;

    // 1. OVMF's PXEv6: a stateful exchange with its NIC's DUID-LLT and the PXE vendor class,
    //    answered with an address of the pool and the TFTP URL of snponly.efi.
    let pxe = Exchange::find(&messages, |m| {
        vendor_class(m).is_some_and(|(num, class)| num == 343 && class.starts_with("PXEClient"))
            && user_class(m).is_none()
    })
    .unwrap_or_else(|| panic!("no PXEv6 Solicit from OVMF\n{}", context()));
    assert_eq!(
        duid_type(&pxe.solicit.message),
        Some(1),
        "OVMF sends DUID-LLT"
    );
    assert!(
        client_id(&pxe.solicit.message).is_some_and(|id| id.ends_with(&[0x52, 0x54, 0, 0, 6, 2])),
        "OVMF's DUID carries the NIC's MAC: {:?}",
        pxe.solicit.message
    );
    let pxe_reply = pxe
        .reply
        .as_ref()
        .unwrap_or_else(|| panic!("no Reply to OVMF's PXEv6 Request\n{}", context()));
    let station = ia_address(&pxe_reply.message).expect("an address in the PXEv6 Reply");
    assert!(
        station.segments()[..4] == [0xfd00, 0x99, 0, 0]
            && (0x100..=0x1ff).contains(&station.segments()[7]),
        "{station} is not from the pool"
    );
    assert_eq!(
        boot_file_url(&pxe_reply.message).as_deref(),
        Some("tftp://[fd00:99::1]/snponly.efi")
    );
    // OVMF prints the address uncompressed: FD00:99:0:0:0:0:0:11B.
    let printed: Vec<String> = station
        .segments()
        .iter()
        .map(|s| format!("{s:X}"))
        .collect();
    assert!(
        vm.console()
            .contains(&format!("Station IP address is {}", printed.join(":"))),
        "{}",
        context()
    );

    // 2. TFTP over IPv6 from that address.
    let transfers = tftp_transfers(&capture, "snponly.efi");
    let (rrq, tftp_end) = transfers
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("no TFTP request for snponly.efi over IPv6\n{}", context()));
    assert_eq!((rrq.src, rrq.dst), (station, server6));
    assert!(
        server
            .log()
            .lines()
            .any(|l| l.contains("TFTP transfer") && l.contains(&format!("[{station}]"))),
        "{}",
        server.log()
    );

    // 3. iPXE's DHCPv6 (after our router advertisement): its own client ID, the user class
    //    "iPXE", and its script's URL in the Reply.
    let ipxe = Exchange::find(&messages, |m| user_class(m).as_deref() == Some("iPXE"))
        .unwrap_or_else(|| {
            panic!(
                "no DHCPv6 Solicit from iPXE with user class iPXE\n{}",
                context()
            )
        });
    let ipxe_reply = ipxe
        .reply
        .as_ref()
        .unwrap_or_else(|| panic!("no Reply to iPXE's Request\n{}", context()));
    let ipxe_address = ia_address(&ipxe_reply.message).expect("an address for iPXE");
    let script_url = format!("http://[{SERVER6}]:8080/boot.ipxe?mac={MAC}");
    assert_eq!(
        boot_file_url(&ipxe_reply.message).as_deref(),
        Some(script_url.as_str())
    );
    assert!(
        vm.console().contains(&format!("Filename: {script_url}")),
        "{}",
        context()
    );

    // 4. The script, the kernel and the initrd over HTTP on IPv6, from iPXE's DHCPv6 address.
    let (script, kernel, initrd) = ipxe_fetched(&capture, ipxe_address, &context);

    // 5. The marker: booted as its Machine, told the v6 bootserver URL.
    assert_booted_as_uefi_node(&line);

    // No DHCPv4 answer on the link: the boot was IPv6 only (iPXE asks on v4 too, unanswered).
    assert_eq!(capture.dhcp4_from_server, 0, "a DHCPv4 answer on the link");
    let metrics = server.metrics(&ns);
    assert_eq!(
        metric(&metrics, "unbounded_bootserver_dhcp_sent_total", ""),
        0.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "unbounded_bootserver_tftp_transfers_total", "") >= 1.0,
        "{metrics}"
    );

    // What it took, in seconds from QEMU's start.
    let pxe_solicit = pxe.solicit.time;
    let time_of = |m: &Option<Dhcp6>| m.as_ref().map_or(f64::NAN, |m| at(m.time));
    let dhcp4 = &capture.dhcp4_to_server;
    // Every stateful exchange on the link, as (Solicit time, DUID type, IAID, classes, address).
    let exchanges: Vec<String> = messages
        .iter()
        .filter(|m| m.from_client && m.message.msg_type() == MessageType::Solicit)
        .filter_map(|m| {
            let exchange = Exchange::find(&messages, |s| {
                client_id(s) == client_id(&m.message) && iaid(s) == iaid(&m.message)
            })?;
            Some(format!(
                "{:.2} DUID type {:?} IAID {:?} vendor class {:?} user class {:?} -> {:?}",
                at(m.time),
                duid_type(&m.message),
                iaid(&m.message),
                vendor_class(&m.message).map(|(_, c)| c),
                user_class(&m.message),
                exchange.reply.as_ref().and_then(|r| ia_address(&r.message)),
            ))
        })
        .collect();
    eprintln!(
        "IPv6-only UEFI PXE boot under QEMU ({}), seconds from QEMU start:\n\
         DHCPv6 Solicits (first of each client and IA):\n  {}\n\
         OVMF PXEv6 Solicit {:.2}, Advertise {:.2}, Request {:.2}, Reply {:.2} \
         (Solicit to Reply {:.2} s; DUID type {:?}, ORO {:?})\n\
         TFTP snponly.efi: {} request(s), {:.2} s after the PXEv6 Reply; the last from {:.2} \
         to {:.2} ({:.2} s)\n\
         iPXE Solicit {:.2} (DUID type {:?}, vendor class {:?}, user class {:?}, ORO {:?}), \
         Reply {:.2} (Solicit to Reply {:.3} s)\n\
         DHCPv4 Discovers (unanswered): {} from {} to {}\n\
         GET boot.ipxe {:.2} from {} ({:.2} s after iPXE's Reply), kernel {:.2}, initrd {:.2}\n\
         marker {:.1}",
        unbounded_testbed::qemu::accelerator(),
        exchanges.join("\n  "),
        at(pxe_solicit),
        time_of(&pxe.advertise),
        time_of(&pxe.request),
        at(pxe_reply.time),
        pxe_reply.time - pxe_solicit,
        duid_type(&pxe.solicit.message),
        requested_options(&pxe.solicit.message),
        transfers.len(),
        transfers
            .first()
            .map_or(f64::NAN, |(r, _)| r.time - pxe_reply.time),
        at(rrq.time),
        at(tftp_end),
        tftp_end - rrq.time,
        at(ipxe.solicit.time),
        duid_type(&ipxe.solicit.message),
        vendor_class(&ipxe.solicit.message),
        user_class(&ipxe.solicit.message),
        requested_options(&ipxe.solicit.message),
        at(ipxe_reply.time),
        ipxe_reply.time - ipxe.solicit.time,
        dhcp4.len(),
        dhcp4
            .first()
            .map_or("-".to_owned(), |t| format!("{:.2}", at(*t))),
        dhcp4
            .last()
            .map_or("-".to_owned(), |t| format!("{:.2}", at(*t))),
        at(script.time),
        IpAddr::V6(script.src),
        script.time - ipxe_reply.time,
        at(kernel.time),
        at(initrd.time),
        marker_at,
    );
}

/// UEFI HTTP boot over IPv6 (OVMF's HTTPv6, the IPv4 stack off): the firmware's Solicit
/// says `HTTPClient`, our Reply names iPXE by an `http://[…]` URL and echoes the class (UEFI
/// refuses the offer otherwise: dhcproto 0.15 wrote option 16's length wrong, found here),
/// iPXE is fetched over HTTP, not TFTP, and the machine boots to the marker over IPv6.
#[test]
fn uefi_http_boot_over_ipv6_reaches_the_marker() {
    let images = marker_image().unwrap();
    let (ns, tap) = provisioning_network();
    let tcpdump = Tcpdump::start(&ns);
    let server = Bootserver::start(&ns, &config(&images));
    let started = unix_now();
    let vm = Vm::start(&ns, &tap, MAC, Firmware::UefiHttp6).unwrap();
    let outcome = vm.wait_for("UNBOUNDED-MARKER", BOOT_TIMEOUT);
    let marker_at = unix_now() - started;
    let capture = tcpdump.read();
    let context = || {
        format!(
            "console:\n{}\nbootserver log:\n{}\nDHCPv6 on the wire:\n{:#?}",
            vm.console(),
            server.log(),
            capture
                .dhcp6()
                .iter()
                .map(|m| format!("{:.3} {:?}", m.time - started, m.message))
                .collect::<Vec<_>>(),
        )
    };
    let line = outcome.unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let messages = capture.dhcp6();
    let http = Exchange::find(&messages, |m| {
        vendor_class(m).is_some_and(|(num, class)| num == 343 && class.starts_with("HTTPClient"))
    })
    .unwrap_or_else(|| panic!("no HTTPv6 Solicit from OVMF\n{}", context()));
    let reply = http
        .reply
        .as_ref()
        .unwrap_or_else(|| panic!("no Reply to OVMF's HTTPv6 Request\n{}", context()));
    assert_eq!(
        boot_file_url(&reply.message).as_deref(),
        Some(format!("http://[{SERVER6}]:8080/ipxe/snponly.efi").as_str())
    );
    assert_eq!(
        vendor_class(&reply.message),
        Some((343, "HTTPClient".to_owned())),
        "the class echoed, as UEFI HTTP boot requires"
    );
    assert!(
        capture
            .requests
            .iter()
            .any(|r| r.line.starts_with("GET /ipxe/snponly.efi")),
        "iPXE not fetched over HTTP\n{}",
        context()
    );
    assert_booted_as_uefi_node(&line);
    let metrics = server.metrics(&ns);
    assert_eq!(
        metric(&metrics, "unbounded_bootserver_tftp_transfers_total", ""),
        0.0,
        "with PXE off, iPXE came over HTTP: {metrics}"
    );
    eprintln!(
        "IPv6-only UEFI HTTP boot under QEMU ({}): HTTPv6 Solicit {:.2}, Reply {:.2}, marker {:.1} s from QEMU start",
        unbounded_testbed::qemu::accelerator(),
        http.solicit.time - started,
        reply.time - started,
        marker_at
    );
}

/// The site's DHCPv6 server for the proxy test: dnsmasq in a namespace of its own, on the
/// bridge by a veth, owning the addresses of `fd00:99::/64` and sending the router
/// advertisements (M and O set: a DHCPv6 range with `--enable-ra`).
struct Dnsmasq6 {
    child: Child,
    _ns: Netns,
    dir: tempfile::TempDir,
}

impl Dnsmasq6 {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn leases(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("leases")).unwrap_or_default()
    }
}

impl Drop for Dnsmasq6 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// dnsmasq's address on the link.
const DNSMASQ6: &str = "fd00:99::254";

fn start_dnsmasq6(provisioning: &Netns, extra: &[&str]) -> Dnsmasq6 {
    let ns = Netns::new("ub6d").unwrap();
    let (a, b) = (unique("vd"), unique("ve"));
    let run = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    run(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
    run(&["link", "set", &a, "netns", provisioning.name()]);
    run(&["link", "set", &b, "netns", ns.name()]);
    provisioning
        .ip(&["link", "set", &a, "master", "br0"])
        .unwrap();
    provisioning.ip(&["link", "set", &a, "up"]).unwrap();
    ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{DNSMASQ6}/64"),
        "dev",
        &b,
        "nodad",
    ])
    .unwrap();
    ns.ip(&["link", "set", &b, "up"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let child = ns
        .command("setpriv")
        .args([
            "--pdeathsig",
            "KILL",
            "--",
            "dnsmasq",
            "--no-daemon",
            "--port=0",
        ])
        .arg(format!("--interface={b}"))
        .args([
            "--bind-interfaces",
            "--dhcp-range=fd00:99::100,fd00:99::1ff,64,600",
            "--enable-ra",
            "--user=root",
            "--log-dhcp",
        ])
        .args(extra)
        .arg(format!(
            "--dhcp-leasefile={}",
            dir.path().join("leases").display()
        ))
        .arg(format!("--pid-file={}", dir.path().join("pid").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Dnsmasq6 {
        child,
        _ns: ns,
        dir,
    }
}

/// The bootserver beside dnsmasq: DHCPv4 off, DHCPv6 in proxy mode, no router
/// advertisements of its own (dnsmasq advertises).
fn proxy_config(images: &Path) -> String {
    format!(
        r#"interface: br0
serverAddress: {SERVER}
routerAdvertisements: false
dhcp:
  mode: off
  leaseFile: "{{dir}}/leases.log"
dhcp6:
  mode: proxy
  serverAddress: {SERVER6}
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
machines:
  - name: uefi-node
    macs: ["{MAC}"]
    firmware: uefi
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
"#,
        images = images.display()
    )
}

/// A DHCPv6 message with where it went, for a test that tells two servers apart.
#[derive(Debug, Clone)]
struct Sent6 {
    time: f64,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    message: Message,
}

fn dhcp6_on_ports(capture: &Capture, ports: &[u16]) -> Vec<Sent6> {
    capture
        .udp6
        .iter()
        .filter(|u| ports.contains(&u.dport) || ports.contains(&u.sport))
        .filter_map(|u| {
            Some(Sent6 {
                time: u.time,
                src: u.src,
                dst: u.dst,
                sport: u.sport,
                message: Message::decode(&mut Decoder::new(&u.payload)).ok()?,
            })
        })
        .collect()
}

fn server_id(message: &Message) -> Option<&[u8]> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::ServerId(id) => Some(id.as_slice()),
        _ => None,
    })
}

/// DHCPv6 proxy mode beside the network's own DHCPv6 server (issue 42): dnsmasq owns the
/// addresses and sends the router advertisements (M and O); the bootserver, with
/// `dhcp6.mode: proxy` and `routerAdvertisements: false`, answers network-boot clients with
/// an Advertise without an address. Measured, step by step off the wire:
///
/// 1. OVMF's PXEv6 Solicit gets both Advertises; OVMF requests its address from dnsmasq
///    (the only offer with one) and keeps ours as a proxy offer;
/// 2. it then asks us for the boot file with a Request to `[fd00:99::1]:4011` (edk2's
///    `PxeBcRequestBootService`: unicast, from and to port 4011, our Server Identifier),
///    which our Reply from port 4011 answers with option 59;
/// 3. it fetches snponly.efi over TFTP from dnsmasq's address;
/// 4. iPXE ignores our Advertise (an Advertise without a usable IA address is dropped by
///    its `dhcpv6_rx`) and takes its address and all its options from dnsmasq's Reply:
///    the script's URL must come from the network's server (here dnsmasq's option 59 for
///    user class `iPXE`, with `${net0/mac}`, which iPXE expands);
/// 5. the script, kernel and initrd over HTTP from iPXE's dnsmasq address, then the marker.
#[test]
fn uefi_pxev6_boots_beside_dnsmasq_with_dhcpv6_proxy() {
    let images = marker_image().unwrap();
    let (ns, tap) = provisioning_network();
    let tcpdump = Tcpdump::start(&ns);
    let script_url = format!("http://[{SERVER6}]:8080/boot.ipxe?mac={MAC}");
    let dnsmasq = start_dnsmasq6(
        &ns,
        &[
            "--dhcp-userclass=set:ipxe,iPXE",
            &format!(
                "--dhcp-option=tag:ipxe,option6:bootfile-url,http://[{SERVER6}]:8080/boot.ipxe?mac=${{net0/mac}}"
            ),
        ],
    );
    let server = Bootserver::start(&ns, &proxy_config(&images));
    let server6: Ipv6Addr = SERVER6.parse().unwrap();
    let started = unix_now();
    let vm = Vm::start(&ns, &tap, MAC, Firmware::UefiPxe6).unwrap();
    let outcome = vm.wait_for("UNBOUNDED-MARKER", BOOT_TIMEOUT);
    let marker_at = unix_now() - started;
    let capture = tcpdump.read();
    let messages = dhcp6_on_ports(&capture, &[547, 4011]);
    let context = || {
        format!(
            "console:\n{}\nbootserver log:\n{}\ndnsmasq log:\n{}\nDHCPv6 on the wire:\n{:#?}\nHTTP requests: {:#?}",
            vm.console(),
            server.log(),
            dnsmasq.log(),
            messages
                .iter()
                .map(|m| format!(
                    "{:.3} {} -> {} {:?}",
                    m.time - started,
                    m.src,
                    m.dst,
                    m.message
                ))
                .collect::<Vec<_>>(),
            capture.requests
        )
    };
    let line = outcome.unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let at = |t: f64| t - started;
    let is_solicit = |m: &Sent6, client: &dyn Fn(&Message) -> bool| {
        m.message.msg_type() == MessageType::Solicit && client(&m.message)
    };
    let answer = |to: &Sent6, kind: MessageType, ours: bool| {
        messages
            .iter()
            .find(|m| {
                m.message.msg_type() == kind
                    && m.message.xid() == to.message.xid()
                    && m.time >= to.time
                    && (m.src == server6) == ours
            })
            .cloned()
    };
    let request_after = |solicit: &Sent6| {
        messages
            .iter()
            .find(|m| {
                m.time >= solicit.time
                    && m.message.msg_type() == MessageType::Request
                    && m.sport == 546
                    && client_id(&m.message) == client_id(&solicit.message)
                    && iaid(&m.message) == iaid(&solicit.message)
            })
            .cloned()
    };

    // 1. OVMF's PXEv6 Solicit: dnsmasq offers an address, we offer the boot file only.
    let pxe_client = |m: &Message| {
        vendor_class(m).is_some_and(|(num, class)| num == 343 && class.starts_with("PXEClient"))
            && user_class(m).is_none()
    };
    let pxe = messages
        .iter()
        .find(|m| is_solicit(m, &pxe_client))
        .cloned()
        .unwrap_or_else(|| panic!("no PXEv6 Solicit from OVMF\n{}", context()));
    let theirs = answer(&pxe, MessageType::Advertise, false)
        .unwrap_or_else(|| panic!("no Advertise from dnsmasq to PXEv6\n{}", context()));
    let ours = answer(&pxe, MessageType::Advertise, true)
        .unwrap_or_else(|| panic!("no proxy Advertise from us to PXEv6\n{}", context()));
    assert!(
        ia_address(&theirs.message).is_some(),
        "{:?}",
        theirs.message
    );
    assert_eq!(ia_address(&ours.message), None, "{:?}", ours.message);
    assert_eq!(
        vendor_class(&ours.message),
        Some((343, "PXEClient".to_owned()))
    );
    assert_eq!(
        boot_file_url(&ours.message).as_deref(),
        Some("tftp://[fd00:99::1]/snponly.efi")
    );
    //    OVMF requests its address from dnsmasq, not from us.
    let pxe_request =
        request_after(&pxe).unwrap_or_else(|| panic!("no PXEv6 Request\n{}", context()));
    assert_eq!(
        server_id(&pxe_request.message),
        server_id(&theirs.message),
        "OVMF requested from dnsmasq"
    );
    let pxe_reply = answer(&pxe_request, MessageType::Reply, false)
        .unwrap_or_else(|| panic!("no Reply from dnsmasq to PXEv6\n{}", context()));
    let station = ia_address(&pxe_reply.message).expect("dnsmasq's address in its Reply");
    assert_eq!(
        boot_file_url(&pxe_reply.message),
        None,
        "dnsmasq gives no boot file"
    );

    // 2. The boot-service Request to our port 4011, and our Reply from it.
    let service = messages
        .iter()
        .find(|m| m.dst == server6 && m.sport == 4011)
        .cloned()
        .unwrap_or_else(|| panic!("no boot-service Request to port 4011\n{}", context()));
    assert_eq!(service.message.msg_type(), MessageType::Request);
    assert_eq!(server_id(&service.message), server_id(&ours.message));
    assert_eq!(ia_address(&service.message), None);
    let service_reply = messages
        .iter()
        .find(|m| m.src == server6 && m.sport == 4011 && m.dst == service.src)
        .cloned()
        .unwrap_or_else(|| panic!("no Reply from port 4011\n{}", context()));
    assert_eq!(service_reply.message.msg_type(), MessageType::Reply);
    assert_eq!(
        boot_file_url(&service_reply.message).as_deref(),
        Some("tftp://[fd00:99::1]/snponly.efi")
    );
    let printed: Vec<String> = station
        .segments()
        .iter()
        .map(|s| format!("{s:X}"))
        .collect();
    assert!(
        vm.console()
            .contains(&format!("Station IP address is {}", printed.join(":"))),
        "{}",
        context()
    );

    // 3. TFTP of snponly.efi from dnsmasq's address.
    let transfers = tftp_transfers(&capture, "snponly.efi");
    let (rrq, tftp_end) = transfers
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("no TFTP request for snponly.efi over IPv6\n{}", context()));
    assert_eq!((rrq.src, rrq.dst), (station, server6));

    // 4. iPXE: our Advertise (no address) is not taken; address and script from dnsmasq.
    let ipxe = messages
        .iter()
        .find(|m| is_solicit(m, &|m| user_class(m).as_deref() == Some("iPXE")))
        .cloned()
        .unwrap_or_else(|| panic!("no Solicit from iPXE\n{}", context()));
    let ipxe_theirs = answer(&ipxe, MessageType::Advertise, false)
        .unwrap_or_else(|| panic!("no Advertise from dnsmasq to iPXE\n{}", context()));
    let ipxe_ours = answer(&ipxe, MessageType::Advertise, true);
    let ipxe_request =
        request_after(&ipxe).unwrap_or_else(|| panic!("no Request from iPXE\n{}", context()));
    assert_eq!(
        server_id(&ipxe_request.message),
        server_id(&ipxe_theirs.message),
        "iPXE requested from dnsmasq"
    );
    let ipxe_reply = answer(&ipxe_request, MessageType::Reply, false)
        .unwrap_or_else(|| panic!("no Reply from dnsmasq to iPXE\n{}", context()));
    let ipxe_address = ia_address(&ipxe_reply.message).expect("an address for iPXE");
    assert!(
        boot_file_url(&ipxe_reply.message).is_some_and(|u| u.contains("${net0/mac}")),
        "{:?}",
        ipxe_reply.message
    );
    assert!(
        vm.console().contains(&format!("Filename: {script_url}")),
        "{}",
        context()
    );
    // We never answered a Request on port 547 in proxy mode (nothing asked us there).
    assert!(
        !messages.iter().any(|m| m.src == server6
            && m.sport == 547
            && m.message.msg_type() == MessageType::Reply),
        "{}",
        context()
    );

    // 5. The script, kernel and initrd from iPXE's address, and the marker.
    let (script, kernel, initrd) = ipxe_fetched(&capture, ipxe_address, &context);
    assert_booted_as_uefi_node(&line);
    let leases = dnsmasq.leases();
    assert!(leases.contains(&ipxe_address.to_string()), "{leases}");

    eprintln!(
        "UEFI PXEv6 beside dnsmasq, DHCPv6 proxy mode, under QEMU ({}), seconds from QEMU start:\n\
         OVMF PXEv6 Solicit {:.2}; Advertises: dnsmasq {:.3} ({}), ours {:.3} (no address); \
         Request to dnsmasq {:.2} ({:.2} s after the Solicit), Reply {:.2}\n\
         boot-service Request to [{}]:4011 from {} at {:.2}, our Reply {:.3}\n\
         TFTP snponly.efi from {} {:.2} to {:.2}\n\
         iPXE Solicit {:.2}; Advertises: dnsmasq {:.3}, ours {}; Request to dnsmasq {:.2}, \
         Reply {:.2} ({})\n\
         GET boot.ipxe {:.2} from {}, kernel {:.2}, initrd {:.2}; marker {:.1}",
        unbounded_testbed::qemu::accelerator(),
        at(pxe.time),
        at(theirs.time),
        station,
        at(ours.time),
        at(pxe_request.time),
        pxe_request.time - pxe.time,
        at(pxe_reply.time),
        SERVER6,
        service.src,
        at(service.time),
        at(service_reply.time),
        rrq.src,
        at(rrq.time),
        at(tftp_end),
        at(ipxe.time),
        at(ipxe_theirs.time),
        ipxe_ours.map_or("none".to_owned(), |m| format!(
            "{:.3} (ignored)",
            at(m.time)
        )),
        at(ipxe_request.time),
        at(ipxe_reply.time),
        ipxe_address,
        at(script.time),
        script.src,
        at(kernel.time),
        at(initrd.time),
        marker_at,
    );
}
