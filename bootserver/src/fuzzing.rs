//! The fuzz targets' bodies (`bootserver/fuzz`, run by `scripts/fuzz`), here so that the
//! regression test `bootserver/tests/fuzz_corpus.rs` replays every checked-in seed and every
//! input that once failed through exactly the same code. Each function panics when an
//! invariant does not hold; a fuzzer reports that as a finding.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::backend::{MachineBackend, StaticBackend};
use crate::config::Settings;
use crate::dhcp::invariants::Ledger;
use crate::dhcp::wire::{self, code};
use crate::dhcp::{Decision, DropReason, Responder};
use crate::leases::{Leases, Record};
use crate::tftp;

/// Separates datagrams in one DHCP fuzz input (a session of several requests).
pub const DATAGRAM_SEPARATOR: &[u8] = b"\xffSEP";

const DHCP_CONFIG: &str = r#"
serverAddress: 10.99.0.1
dhcp:
  mode: full
  unknownMachines: discover
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.110]
      gateway: 10.99.0.1
      dns: [10.99.0.1]
      domain: lab.test
    - subnet: 10.98.0.0/24
      pool: [10.98.0.10, 10.98.0.12]
discovery:
  boot: {kernel: vmlinuz, initrd: initrd.img}
machines:
  - name: bios-node
    macs: ["52:54:00:00:01:01"]
    ipv4: 10.99.0.21
    firmware: bios
    boot: {kernel: vmlinuz, initrd: initrd.img}
  - name: uefi-node
    macs: ["52:54:00:00:01:02", "52:54:00:12:34:56"]
    firmware: uefi
  - name: arm-node
    macs: ["52:54:00:00:01:03"]
    architecture: arm64
    ipv4: 10.98.0.30
"#;

struct DhcpFixture {
    full: Arc<Settings>,
    proxy: Arc<Settings>,
    backend: Arc<dyn MachineBackend>,
}

fn dhcp_fixture() -> &'static DhcpFixture {
    static FIXTURE: OnceLock<DhcpFixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let full = match Settings::parse(DHCP_CONFIG) {
            Ok(s) => s,
            Err(error) => panic!("the fuzz configuration is invalid: {error}"),
        };
        let mut proxy = full.clone();
        proxy.dhcp.mode = crate::dhcp::settings::DhcpMode::Proxy;
        DhcpFixture {
            backend: Arc::new(StaticBackend::new(full.machines.clone())),
            full: Arc::new(full),
            proxy: Arc::new(proxy),
        }
    })
}

/// The options of an encoded reply, in order, up to End.
fn reply_options(bytes: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut i = wire::HEADER_LEN + 4;
    while let Some(&c) = bytes.get(i) {
        match c {
            code::PAD => i += 1,
            code::END => break,
            _ => {
                let len = usize::from(bytes[i + 1]);
                out.push((c, &bytes[i + 2..i + 2 + len]));
                i += 2 + len;
            }
        }
    }
    out
}

/// DHCP: the first byte picks full or proxy mode and port 67 or 4011; the rest is one or
/// more datagrams (split by [`DATAGRAM_SEPARATOR`]) that go through [`wire::parse`],
/// [`Responder::decide`] and the reply encoding as in the server, over leases in memory
/// and a static backend. Checks: nothing panics, the book always answers and keeps its
/// invariants, every reply encodes, is a BOOTREPLY for the request's transaction and MAC,
/// and echoes option 82 unchanged as its last option and option 61 unchanged; and no
/// address is offered or acknowledged to two clients ([`Ledger`]).
pub fn dhcp(data: &[u8]) {
    let fixture = dhcp_fixture();
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let settings = if control & 1 == 0 {
        fixture.full.clone()
    } else {
        fixture.proxy.clone()
    };
    let port = if control & 2 == 0 {
        settings.dhcp.port
    } else {
        settings.dhcp.proxy_port
    };
    let leases = Arc::new(Leases::in_memory());
    let responder = Responder::new(settings.clone(), fixture.backend.clone(), leases.clone());
    let mut ledger = Ledger::new(
        settings
            .machines
            .iter()
            .filter_map(|m| m.ipv4.map(|ip| (ip.into(), m.macs.clone()))),
    );
    let from = SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 50), 68);
    let mut now = 1_700_000_000;
    let mut rest = rest;
    loop {
        let (datagram, next) = match find(rest, DATAGRAM_SEPARATOR) {
            Some(at) => (&rest[..at], Some(&rest[at + DATAGRAM_SEPARATOR.len()..])),
            None => (rest, None),
        };
        if let Ok(request) = wire::parse(datagram) {
            let decision = responder.decide(&request, from, port, now);
            if let Err(broken) = ledger.decided(&decision, &request.client_key(), request.mac, now)
            {
                panic!("address invariant: {broken}");
            }
            match decision {
                Decision::Reply { reply, commit, .. } => {
                    let bytes = match reply.encode() {
                        Ok(b) => b,
                        Err(error) => panic!("a reply did not encode: {error}"),
                    };
                    assert_eq!(bytes[0], 2, "BOOTREPLY");
                    assert_eq!(&bytes[4..8], &request.xid.to_be_bytes());
                    assert_eq!(&bytes[28..34], &request.mac.0);
                    let options = reply_options(&bytes);
                    if let Some(info) = &request.relay_agent_info
                        && info.raw.len() <= 255
                    {
                        assert_eq!(
                            options.last(),
                            Some(&(code::RELAY_AGENT_INFO, &info.raw[..]))
                        );
                    }
                    if let Some(id) = request.client_id.as_deref().filter(|id| id.len() <= 255) {
                        assert!(options.contains(&(code::CLIENT_ID, id)));
                    }
                    if let Some((lease, ticket)) = commit {
                        match leases.persist(&[(Record::Commit(lease.clone()), Some(ticket))]) {
                            Ok(taken) if taken == [true] => {
                                if let Err(broken) = ledger.acknowledged(&lease, now) {
                                    panic!("address invariant: {broken}");
                                }
                            }
                            Ok(_) => ledger.not_acknowledged(&lease),
                            Err(error) => panic!("commit: {error}"),
                        }
                    }
                }
                Decision::Release { key, ip } => {
                    if let Err(error) =
                        leases.persist(&[(Record::Release { key, ip: ip.into() }, None)])
                    {
                        panic!("release: {error}");
                    }
                }
                Decision::Decline { ip, until } => {
                    if let Err(error) = leases.persist(&[(
                        Record::Decline {
                            ip: ip.into(),
                            until_unix: until,
                        },
                        None,
                    )]) {
                        panic!("decline: {error}");
                    }
                    ledger.decline_written(ip.into());
                }
                Decision::Drop(reason) => {
                    assert_ne!(reason, DropReason::LeaseStore);
                    assert_ne!(reason, DropReason::Panic);
                }
            }
        }
        match leases.book().map(|b| b.check()) {
            Ok(Ok(())) => {}
            Ok(Err(broken)) => panic!("address book: {broken}"),
            Err(error) => panic!("address book: {error}"),
        }
        now += 7;
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Files for the TFTP and HTTP targets: a root with files, a subdirectory, a link inside
/// and a link out, and a secret beside the root that must never be served.
struct Files {
    root: PathBuf,
    images: PathBuf,
}

const SECRET: &[u8] = b"SECRET-OUTSIDE-THE-ROOT";

fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(|| {
        let base = std::env::temp_dir().join("unbounded-fuzz-fixture");
        let root = base.join("tftp");
        let images = base.join("images");
        let made = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(root.join("arm64"))?;
            std::fs::create_dir_all(&images)?;
            std::fs::write(base.join("secret"), SECRET)?;
            std::fs::write(root.join("undionly.kpxe"), vec![0x55; 70_000])?;
            std::fs::write(root.join("snponly.efi"), vec![0xaa; 1468 * 3])?;
            std::fs::write(root.join("arm64/ipxe.efi"), b"arm")?;
            std::fs::write(root.join("empty"), b"")?;
            std::fs::write(images.join("vmlinuz"), vec![1u8; 10_000])?;
            std::fs::write(images.join("initrd.img"), b"initrd")?;
            for (link, target) in [
                (root.join("escape"), base.join("secret")),
                (root.join("inside"), root.join("undionly.kpxe")),
                (images.join("escape"), base.join("secret")),
            ] {
                if std::fs::symlink_metadata(&link).is_err() {
                    std::os::unix::fs::symlink(target, link)?;
                }
            }
            Ok(())
        })();
        if let Err(error) = made {
            panic!("making the fuzz fixture in {}: {error}", base.display());
        }
        let canonical = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
        Files {
            root: canonical(root),
            images: canonical(images),
        }
    })
}

/// TFTP: a datagram sent to port 69 goes through the server's [`tftp::serve::accept`]
/// (parsing and confinement) and, when accepted, option negotiation and the OACK. Checks:
/// nothing panics, an accepted path is a file inside the root (never the secret beside
/// it), negotiated values stay within the limits and the RFCs' ranges.
pub fn tftp(data: &[u8]) {
    let files = files();
    let limits = tftp::packet::Limits::default();
    let _ = tftp::packet::parse_reply(data);
    match tftp::serve::accept(&files.root, data) {
        Ok(accepted) => {
            assert!(accepted.path.starts_with(&files.root), "{accepted:?}");
            let content = std::fs::read(&accepted.path).unwrap_or_default();
            assert!(content != SECRET, "served the secret: {accepted:?}");
            let negotiated =
                tftp::packet::negotiate(&accepted.options, &limits, content.len() as u64);
            assert!((8..=limits.max_blksize).contains(&negotiated.blksize));
            assert!((1..=limits.max_windowsize).contains(&negotiated.windowsize));
            assert!(negotiated.timeout >= std::time::Duration::from_secs(1));
            let oack = tftp::packet::encode_oack(&negotiated.oack);
            assert!(oack.len() < 512, "an OACK fits the smallest block");
        }
        Err(refused) => {
            let _ = tftp::packet::encode_error(refused.code, refused.message);
        }
    }
}

struct Http {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

fn http_fixture() -> &'static Http {
    static HTTP: OnceLock<Http> = OnceLock::new();
    HTTP.get_or_init(|| {
        let files = files();
        let fixture = dhcp_fixture();
        let mut settings = (*fixture.full).clone();
        settings.tftp.root = files.root.clone();
        settings.http.images_dir = files.images.clone();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(crate::metrics::Metrics::register(&mut registry));
        let router = crate::http::router(crate::http::AppState {
            settings: Arc::new(settings),
            backend: fixture.backend.clone(),
            leases: Arc::new(Leases::in_memory()),
            metrics,
            registry: Arc::new(registry),
            issuer: None,
            discovery: None,
            exchanges: Arc::default(),
            tls: None,
        });
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(error) => panic!("a runtime for the HTTP target: {error}"),
        };
        Http { runtime, router }
    })
}

/// HTTP: a request head (`GET /path?query HTTP/1.1` and header lines, as captured) through
/// the bootserver's router, from a machine's reserved address. Checks: no 500 (a caught
/// panic answers 500), nothing outside the image and iPXE directories is served, and every
/// script answered is an iPXE script.
pub fn http(data: &[u8]) {
    use tower::ServiceExt;
    let fixture = http_fixture();
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split("\r\n");
    let Some(first) = lines.next() else {
        return;
    };
    let mut parts = first.split(' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return;
    };
    let mut builder = axum::http::Request::builder().method(method).uri(target);
    for line in lines.take_while(|l| !l.is_empty()) {
        if let Some((name, value)) = line.split_once(':') {
            builder = builder.header(name.trim(), value.trim());
        }
    }
    let Ok(mut request) = builder.body(axum::body::Body::empty()) else {
        return;
    };
    let peer = std::net::SocketAddr::from((Ipv4Addr::new(10, 99, 0, 21), 40000));
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    let path = request.uri().path().to_owned();
    let method = request.method().as_str().to_owned();
    let router = fixture.router.clone();
    let (status, body) = fixture.runtime.block_on(async move {
        let response = match router.oneshot(request).await {
            Ok(r) => r,
            Err(infallible) => match infallible {},
        };
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (status, body)
    });
    assert_ne!(status.as_u16(), 500, "{first}");
    assert!(
        !body.windows(SECRET.len()).any(|w| w == SECRET),
        "served the secret for {first}"
    );
    // HEAD answers carry no body (a false finding of the first campaign).
    if status.is_success() && path.ends_with(".ipxe") && method == "GET" {
        assert!(body.starts_with(b"#!ipxe\n"), "{first}: {body:?}");
    }
}

const DHCP6_CONFIG: &str = r#"
serverAddress: 10.99.0.1
dhcp:
  mode: off
  unknownMachines: discover
discovery:
  boot: {kernel: vmlinuz, initrd: initrd.img}
machines:
  - name: uefi-node
    macs: ["52:54:00:66:00:01"]
    firmware: uefi
  - name: arm-node
    macs: ["52:54:00:66:00:02"]
    architecture: arm64
"#;

const DHCP6_FULL: &str = "mode: full\nserverAddress: fd00:99::1\nsubnets:\n- prefix: fd00:99::/64\n  pool: [fd00:99::100, fd00:99::10f]\n  dns: [fd00:99::1]\n";
const DHCP6_PROXY: &str = "mode: proxy\nserverAddress: fd00:99::1\n";

/// The DHCPv6 target's machines and its full (`true`) or proxy settings, parsed once.
fn dhcp6_fixture(
    full: bool,
) -> (
    Arc<dyn MachineBackend>,
    Arc<crate::dhcp6::settings::Dhcp6Settings>,
) {
    use crate::dhcp6::settings::{Dhcp6File, Dhcp6Settings};
    type Fixture = (
        Arc<dyn MachineBackend>,
        Arc<Dhcp6Settings>,
        Arc<Dhcp6Settings>,
    );
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    let (backend, full_settings, proxy_settings) = FIXTURE.get_or_init(|| {
        let Ok(settings) = Settings::parse(DHCP6_CONFIG) else {
            panic!("the DHCPv6 fuzz configuration is invalid");
        };
        let mode = |text: &str| {
            let Ok(file) = serde_saphyr::from_str::<Dhcp6File>(text) else {
                panic!("the DHCPv6 fuzz settings do not parse");
            };
            let Ok(valid) = file.validate(settings.dhcp.unknown_machines, Some("br0")) else {
                panic!("the DHCPv6 fuzz settings are invalid");
            };
            Arc::new(valid.with_interface_mac([0x52, 0x54, 0, 0x99, 0, 1]))
        };
        let backend: Arc<dyn MachineBackend> =
            Arc::new(StaticBackend::new(settings.machines.clone()));
        (backend, mode(DHCP6_FULL), mode(DHCP6_PROXY))
    });
    let settings = if full { full_settings } else { proxy_settings };
    (backend.clone(), settings.clone())
}

/// DHCPv6: one session of datagrams (split at [`DATAGRAM_SEPARATOR`]) from one link:
/// bytes → relay envelopes → message → the decision in full or proxy mode (the first
/// byte's low bit) → leases made durable → the encoded reply, wrapped for its relays.
/// Invariants: nothing panics; a reply decodes again, answers the client's transaction and
/// identifier; a promised lease is the asking identity association's; the book's own
/// invariants hold after every message.
pub fn dhcp6(data: &[u8]) {
    use crate::dhcp6::decide::{Arrival, BootSettings6, Decision6, Responder6};
    use crate::dhcp6::relay;
    use crate::leases::ClientKey;
    use dhcproto::v6::{DhcpOption, Message, OptionCode};
    use dhcproto::{Decodable, Decoder, Encodable, Encoder};

    let Some((&control, mut rest)) = data.split_first() else {
        return;
    };
    let (backend, dhcp6) = dhcp6_fixture(control & 1 == 0);
    let leases = Arc::new(Leases::in_memory());
    let responder = Responder6::new(
        dhcp6,
        BootSettings6 {
            uefi_x64: "snponly.efi".to_owned(),
            http_base: "http://[fd00:99::1]:8080".to_owned(),
        },
        backend,
        leases.clone(),
    );
    let link: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
    let mut now = 1_700_000_000;
    loop {
        let (datagram, next) = match find(rest, DATAGRAM_SEPARATOR) {
            Some(at) => (&rest[..at], Some(&rest[at + DATAGRAM_SEPARATOR.len()..])),
            None => (rest, None),
        };
        if let Ok(relayed) = relay::unwrap(datagram)
            && let Ok(message) = crate::dhcp6::wire::decode(relayed.client)
        {
            let innermost = relayed.hops.last();
            let arrival = Arrival {
                source: innermost.map_or(
                    std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe66, 1),
                    |h| h.peer,
                ),
                link: innermost
                    .map(|h| h.link)
                    .filter(|l| !l.is_unspecified())
                    .unwrap_or(link),
                link_layer: relayed.client_link_layer(),
                unicast: control & 2 != 0,
            };
            if let Decision6::Reply {
                reply,
                commits,
                records,
            } = responder.decide(&message, &arrival, now)
            {
                let mut bytes = Vec::new();
                if let Err(error) = reply.encode(&mut Encoder::new(&mut bytes)) {
                    panic!("a DHCPv6 reply did not encode: {error}");
                }
                let again = match Message::decode(&mut Decoder::new(&bytes)) {
                    Ok(m) => m,
                    Err(error) => panic!("a DHCPv6 reply does not decode again: {error}"),
                };
                assert_eq!(again.xid(), message.xid(), "the reply's transaction");
                if let Some(DhcpOption::ClientId(id)) = message.opts().get(OptionCode::ClientId) {
                    assert_eq!(
                        again.opts().get(OptionCode::ClientId),
                        Some(&DhcpOption::ClientId(id.clone())),
                        "the client identifier echoed"
                    );
                    for (lease, _) in &commits {
                        assert!(
                            matches!(&lease.key, ClientKey::Ia { duid, .. } if duid[..] == id[..]),
                            "a lease promised to another client: {lease:?}"
                        );
                    }
                }
                if let Err(error) = relay::wrap(&relayed.hops, &bytes) {
                    panic!("a reply could not be wrapped for its relays: {error}");
                }
                let mut writes: Vec<_> = records.into_iter().map(|r| (r, None)).collect();
                writes.extend(
                    commits
                        .into_iter()
                        .map(|(lease, ticket)| (Record::Commit(lease), Some(ticket))),
                );
                if let Err(error) = leases.persist(&writes) {
                    panic!("the in-memory log failed: {error}");
                }
            }
            match leases.book() {
                Ok(book) => {
                    if let Err(broken) = book.check() {
                        panic!("address book invariant: {broken}");
                    }
                }
                Err(error) => panic!("the book is poisoned: {error}"),
            }
        }
        now += 7;
        match next {
            Some(next) => rest = next,
            None => break,
        }
    }
}
