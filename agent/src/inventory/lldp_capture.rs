//! Listening for the switch's LLDP frames: one `AF_PACKET` socket per NIC whose link is up,
//! bound to that interface and to EtherType `0x88cc`, subscribed to LLDP's nearest-bridge
//! multicast address, read until one frame from a neighbour arrives or the wait ends. The
//! frames are parsed by [`super::lldp::parse_frame`]; [`attach`] puts what was heard on the
//! NICs of the inventory.
//!
//! # How long to listen
//!
//! A switch sends LLDP every `msgTxInterval`, 30 s by default (IEEE 802.1AB-2016 §9.2.5.7; the
//! default of Arista, Cisco NX-OS, Juniper, SONiC and lldpd), and nothing on demand. A listener
//! that starts at a random moment hears the next frame within 30 s, so [`DEFAULT_WAIT`] is
//! 35 s: the interval and a margin for the jitter some switches add. All NICs listen at once,
//! so the wait is 35 s in all, not per NIC, and it ends early as soon as every NIC heard one.
//! A link without an LLDP sender (a lab bridge, a switch with LLDP off) costs the full wait
//! once per inventory read: bounded, and only where nothing could be learned anyway.
//!
//! # Why two `unsafe` calls
//!
//! Binding a packet socket to one interface (`bind` with a `sockaddr_ll`) and joining a
//! link-layer multicast group (`PACKET_ADD_MEMBERSHIP`, without which many NICs drop
//! `01:80:c2:00:00:0e` in hardware) have no safe wrapper in `socket2` or `rustix`.
//! `SO_BINDTODEVICE` (which `socket2` offers safely) does not filter what a packet socket
//! receives: checked on Linux 6.18, a socket so bound got the frames of another interface.
//! The two calls live in [`sys`], each on a fully initialised `repr(C)` value whose size is
//! passed with it.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use unbounded_api::inventory::{LldpNeighbour, NicFacts};

use super::lldp::{ETHERTYPE, NEAREST_BRIDGE, parse_frame};

/// How long to listen on all NICs together (see the module's documentation for why).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(35);

/// Why one interface could not be listened on.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The interface name is not a MAC's interface here.
    #[error("interface {0}: no such interface")]
    NoSuchInterface(String),
    /// A socket call failed (no `CAP_NET_RAW`, an interface that went away).
    #[error("interface {interface}: {call}: {source}")]
    Socket {
        /// The interface.
        interface: String,
        /// The call that failed.
        call: &'static str,
        /// What the kernel said.
        source: std::io::Error,
    },
}

/// An interface to listen on: its kernel name and its own MAC (frames from that MAC are its
/// own, looped back, not a neighbour's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Kernel name, such as `eno1`.
    pub interface: String,
    /// Its MAC, lower case, colon-separated.
    pub mac: String,
}

/// The NICs of an inventory worth listening on: those whose link is up (a frame cannot
/// arrive on a link that is down).
pub fn listeners(nics: &NicFacts) -> Vec<Listener> {
    nics.interfaces
        .iter()
        .filter(|nic| nic.link)
        .map(|nic| Listener {
            interface: nic.name.clone(),
            mac: nic.mac.to_ascii_lowercase(),
        })
        .collect()
}

/// The neighbour a received frame announces, if it is an LLDP frame sent by someone else
/// than `own_mac` (the interface's own frames can come back on a packet socket).
pub fn neighbour_in(frame: &[u8], own_mac: &str) -> Option<LldpNeighbour> {
    let source = frame.get(6..12)?;
    let source = source
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    if source == own_mac {
        return None;
    }
    parse_frame(frame).ok()
}

/// Puts the neighbours heard (by interface name) on the inventory's NICs. A NIC nothing was
/// heard on keeps no neighbour: what a past read heard may be another switch by now.
pub fn attach(nics: &mut NicFacts, heard: &BTreeMap<String, LldpNeighbour>) {
    for nic in &mut nics.interfaces {
        nic.lldp = heard.get(&nic.name).cloned();
    }
}

/// Listens on every listener at once for at most `wait`, and returns what each heard
/// first. An interface that cannot be listened on is reported on the console and left out.
pub async fn capture(listeners: &[Listener], wait: Duration) -> BTreeMap<String, LldpNeighbour> {
    let deadline = tokio::time::Instant::now() + wait;
    let reads = listeners.iter().map(|l| async move {
        let heard = capture_one(l, deadline).await;
        (l.interface.clone(), heard)
    });
    let mut found = BTreeMap::new();
    for (interface, heard) in futures::future::join_all(reads).await {
        match heard {
            Ok(Some(neighbour)) => {
                found.insert(interface, neighbour);
            }
            Ok(None) => {}
            Err(error) => println!("unbounded-agent: LLDP: {error}"),
        }
    }
    found
}

/// Reads frames on one interface until a neighbour's LLDP frame arrives or `deadline`.
pub async fn capture_one(
    listener: &Listener,
    deadline: tokio::time::Instant,
) -> Result<Option<LldpNeighbour>, CaptureError> {
    let interface = listener.interface.as_str();
    let failed = |call: &'static str| {
        move |source: std::io::Error| CaptureError::Socket {
            interface: interface.to_owned(),
            call,
            source,
        }
    };
    // Protocol 0 receives nothing until the bind names the interface and EtherType: no frame
    // of another interface is queued in between.
    let socket = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0)))
        .map_err(failed("socket"))?;
    let index = rustix::net::netdevice::name_to_index(socket.as_fd(), interface)
        .map_err(|_| CaptureError::NoSuchInterface(interface.to_owned()))?;
    let index =
        i32::try_from(index).map_err(|_| CaptureError::NoSuchInterface(interface.to_owned()))?;
    sys::bind(&socket, index, ETHERTYPE).map_err(failed("bind"))?;
    sys::join(&socket, index, NEAREST_BRIDGE).map_err(failed("PACKET_ADD_MEMBERSHIP"))?;
    // A blocking read on a thread of its own, bounded by the socket's receive timeout: the
    // socket is created above, on the caller's thread, so it belongs to the caller's network
    // namespace whichever thread reads it.
    let own_mac = listener.mac.clone();
    let name = interface.to_owned();
    let read = tokio::task::spawn_blocking(move || {
        let failed = |call: &'static str| {
            let name = name.clone();
            move |source: std::io::Error| CaptureError::Socket {
                interface: name,
                call,
                source,
            }
        };
        let mut buffer = vec![0u8; 1600];
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            socket
                .set_read_timeout(Some(left))
                .map_err(failed("SO_RCVTIMEO"))?;
            match (&socket).read(&mut buffer) {
                Ok(len) => {
                    if let Some(neighbour) = neighbour_in(&buffer[..len], &own_mac) {
                        return Ok(Some(neighbour));
                    }
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(error) => return Err(failed("recv")(error)),
            }
        }
    });
    match read.await {
        Ok(result) => result,
        // The reading thread panicked or the runtime is shutting down: nothing was heard.
        Err(_) => Ok(None),
    }
}

/// The two packet-socket calls without a safe wrapper.
#[allow(unsafe_code)]
mod sys {
    use std::os::fd::AsRawFd as _;

    use socket2::Socket;

    fn check(result: libc::c_int) -> std::io::Result<()> {
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// `bind(2)` to one interface and one EtherType.
    pub(super) fn bind(socket: &Socket, ifindex: i32, ethertype: u16) -> std::io::Result<()> {
        let address = libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as libc::c_ushort,
            sll_protocol: ethertype.to_be(),
            sll_ifindex: ifindex,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        // SAFETY: `address` is a fully initialised sockaddr_ll that outlives the call, and
        // the length passed is its size; the descriptor is owned by `socket`.
        check(unsafe {
            libc::bind(
                socket.as_raw_fd(),
                std::ptr::from_ref(&address).cast::<libc::sockaddr>(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
    }

    /// `PACKET_ADD_MEMBERSHIP` of a link-layer multicast address on one interface; the
    /// membership ends with the socket.
    pub(super) fn join(socket: &Socket, ifindex: i32, group: [u8; 6]) -> std::io::Result<()> {
        let mut address = [0u8; 8];
        address[..6].copy_from_slice(&group);
        let request = libc::packet_mreq {
            mr_ifindex: ifindex,
            mr_type: libc::PACKET_MR_MULTICAST as libc::c_ushort,
            mr_alen: 6,
            mr_address: address,
        };
        // SAFETY: `request` is a fully initialised packet_mreq that outlives the call, and
        // the length passed is its size; the descriptor is owned by `socket`.
        check(unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                std::ptr::from_ref(&request).cast::<libc::c_void>(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use unbounded_api::inventory::{FactOrigin, FactSource, Nic};

    use super::*;
    use crate::inventory::lldp::build_frame;

    fn nic(name: &str, mac: &str, link: bool) -> Nic {
        Nic {
            name: name.into(),
            mac: mac.into(),
            driver: None,
            speed_mbps: None,
            link,
            pxe_booted: false,
            lldp: None,
        }
    }

    fn nics(list: Vec<Nic>) -> NicFacts {
        NicFacts {
            origin: FactOrigin {
                source: FactSource::InBand,
                observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            },
            interfaces: list,
        }
    }

    fn neighbour(port: &str) -> LldpNeighbour {
        LldpNeighbour {
            chassis_id: "44:4c:a8:12:34:00".into(),
            port_id: port.into(),
            system_name: Some("leaf-r12-1".into()),
            port_description: None,
        }
    }

    #[test]
    fn only_links_that_are_up_are_listened_on() {
        let facts = nics(vec![
            nic("eno1", "52:54:00:AA:00:01", true),
            nic("eno2", "52:54:00:aa:00:02", false),
        ]);
        assert_eq!(
            listeners(&facts),
            vec![Listener {
                interface: "eno1".into(),
                mac: "52:54:00:aa:00:01".into()
            }]
        );
    }

    #[test]
    fn a_frame_is_a_neighbour_only_from_someone_else() {
        let own = "52:54:00:aa:00:01";
        let switch = build_frame(
            [0x44, 0x4c, 0xa8, 0x12, 0x34, 0x07],
            &neighbour("Ethernet7"),
        );
        let looped = build_frame([0x52, 0x54, 0x00, 0xaa, 0x00, 0x01], &neighbour("eno1"));
        let cases: [(&str, &[u8], Option<LldpNeighbour>); 4] = [
            ("the switch's frame", &switch, Some(neighbour("Ethernet7"))),
            ("our own frame looped back", &looped, None),
            ("not LLDP", &switch[..13], None),
            ("empty", &[], None),
        ];
        for (case, frame, want) in cases {
            assert_eq!(neighbour_in(frame, own), want, "{case}");
        }
    }

    #[test]
    fn neighbours_land_on_their_nics_and_stale_ones_go() {
        let mut facts = nics(vec![
            nic("eno1", "52:54:00:aa:00:01", true),
            Nic {
                lldp: Some(neighbour("old")),
                ..nic("eno2", "52:54:00:aa:00:02", true)
            },
        ]);
        let heard = BTreeMap::from([("eno1".to_owned(), neighbour("Ethernet7"))]);
        attach(&mut facts, &heard);
        assert_eq!(facts.interfaces[0].lldp, Some(neighbour("Ethernet7")));
        assert_eq!(facts.interfaces[1].lldp, None);
    }

    /// A name that is no interface is a clear error, not a wait.
    #[tokio::test]
    async fn an_unknown_interface_is_an_error() {
        let listener = Listener {
            interface: "ub-no-such-if".into(),
            mac: "02:00:00:00:00:01".into(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        match capture_one(&listener, deadline).await {
            Err(CaptureError::NoSuchInterface(name)) => assert_eq!(name, "ub-no-such-if"),
            // Without CAP_NET_RAW the socket itself is refused first.
            Err(CaptureError::Socket { call: "socket", .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
