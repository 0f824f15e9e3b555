//! Replies: built from a validated [`Request`] and our own values, encoded with `dhcproto`,
//! then the options a server must echo (61, 118, 82) appended as the client or relay sent
//! them, and where to send them (RFC 2131 §4.1).

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::Encodable;
use dhcproto::v4::{
    DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode, UnknownOption,
};

use super::settings::Subnet;
use super::wire::{Request, code};
use crate::backend::{MacAddr, MachineRecord};
use crate::boot::{self, BootFiles, ClientKind};
use crate::config::Settings;

/// Replies are padded to the BOOTP minimum: some relays and old clients drop shorter ones.
const MIN_LEN: usize = 300;

/// A reply: the message and the options echoed from the request.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The message (without the echoed options).
    pub message: Box<Message>,
    /// Option 61 as received (RFC 6842).
    client_id: Option<Vec<u8>>,
    /// Option 118 as received (RFC 3011 §3).
    subnet_selection: Option<Ipv4Addr>,
    /// Option 82 as received (RFC 3046 §2.2), appended last.
    relay_agent_info: Option<Vec<u8>>,
}

/// The reply could not be encoded.
#[derive(Debug, thiserror::Error)]
#[error("encoding a DHCP reply: {0}")]
pub struct EncodeError(#[source] dhcproto::error::EncodeError);

fn put_option(out: &mut Vec<u8>, code: u8, value: &[u8]) {
    // An empty value is still an option (an empty option 82 is echoed empty: found by the
    // DHCP fuzz target, `fuzz/regressions/dhcp/empty-option-82-not-echoed`).
    if value.is_empty() {
        out.extend_from_slice(&[code, 0]);
    }
    // RFC 3396: a value longer than 255 bytes goes in consecutive instances.
    for chunk in value.chunks(255) {
        out.push(code);
        out.push(chunk.len() as u8);
        out.extend_from_slice(chunk);
    }
}

impl Reply {
    /// A reply of `kind` to `request` from `server`: header fields copied from the request,
    /// options 53 and 54, and the echoes.
    pub fn to(request: &Request, kind: MessageType, server: Ipv4Addr) -> Self {
        let mut message = Message::default();
        message
            .set_opcode(Opcode::BootReply)
            .set_htype(HType::Eth)
            .set_xid(request.xid)
            .set_flags(Flags::from(request.flags))
            .set_giaddr(request.giaddr)
            .set_chaddr(&request.mac.0);
        message.opts_mut().insert(DhcpOption::MessageType(kind));
        message
            .opts_mut()
            .insert(DhcpOption::ServerIdentifier(server));
        Self {
            message: Box::new(message),
            client_id: request.client_id.clone(),
            subnet_selection: request.subnet_selection,
            relay_agent_info: request.relay_agent_info.as_ref().map(|r| r.raw.clone()),
        }
    }

    /// The message type.
    pub fn kind(&self) -> Option<MessageType> {
        self.message.opts().msg_type()
    }

    /// The bytes to send.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = self.message.to_vec().map_err(EncodeError)?;
        // dhcproto ends the options with End; the echoes go before it, option 82 last.
        if out.last() == Some(&code::END) {
            out.pop();
        }
        if let Some(id) = &self.client_id {
            put_option(&mut out, code::CLIENT_ID, id);
        }
        if let Some(subnet) = self.subnet_selection {
            put_option(&mut out, code::SUBNET_SELECTION, &subnet.octets());
        }
        if let Some(info) = &self.relay_agent_info {
            put_option(&mut out, code::RELAY_AGENT_INFO, info);
        }
        out.push(code::END);
        if out.len() < MIN_LEN {
            out.resize(MIN_LEN, code::PAD);
        }
        Ok(out)
    }
}

/// Where a reply goes (RFC 2131 §4.1): the relay, else a client that has an address and
/// did not ask for broadcast, else broadcast.
pub fn destination(request: &Request, dhcp_port: u16) -> SocketAddrV4 {
    if request.relayed() {
        return SocketAddrV4::new(request.giaddr, dhcp_port);
    }
    if !request.ciaddr.is_unspecified() && !request.broadcast() {
        return SocketAddrV4::new(request.ciaddr, 68);
    }
    SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
}

/// Where a DHCPNAK goes (RFC 2131 §4.1): the relay (which broadcasts it: the broadcast bit
/// is set), else broadcast.
pub fn nak_destination(request: &Request, reply: &mut Reply, dhcp_port: u16) -> SocketAddrV4 {
    if request.relayed() {
        reply.message.set_flags(Flags::from(request.flags | 0x8000));
        return SocketAddrV4::new(request.giaddr, dhcp_port);
    }
    SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
}

/// The boot options a reply carries: the decision of [`crate::dhcp::decide`]'s boot-option
/// step, shared by the full server, the ProxyDHCP answer and the PXE boot server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootOptions {
    /// None: not a network-boot client we boot.
    None,
    /// The boot file for the client's kind; with `discovery_control`, PXE firmware is also
    /// told to take it as it is (option 43), as a ProxyDHCP or boot-server answer must.
    File {
        /// Add PXE_DISCOVERY_CONTROL for PXE firmware.
        discovery_control: bool,
    },
    /// A ProxyDHCP offer to iPXE that names no boot file, so that iPXE asks for it on port
    /// 4011 (what vouches for its address in proxy mode).
    AskBootServer,
}

/// Adds `options` to the reply for a client of `kind` with `mac`.
pub fn add_boot_options(
    reply: &mut Reply,
    options: BootOptions,
    settings: &Settings,
    kind: ClientKind,
    mac: &MacAddr,
) {
    match options {
        BootOptions::None => {}
        BootOptions::File { discovery_control } => {
            add_boot(reply, settings, kind, mac);
            if discovery_control {
                add_pxe_discovery_control(reply, kind);
            }
        }
        BootOptions::AskBootServer => add_proxy_offer_without_boot(reply),
    }
}

/// Adds the boot file (BOOTP `file` and option 67, `siaddr`), option 60 as PXE and UEFI
/// HTTP boot expect it, and for iPXE option 175 with `no-pxedhcp`.
fn add_boot(reply: &mut Reply, settings: &Settings, client: ClientKind, mac: &MacAddr) {
    let base = settings.http_base();
    let files = BootFiles {
        uefi_x64: &settings.dhcp.uefi_boot_file,
        http_base: &base,
    };
    let Some(file) = boot::boot_file(client, &files, mac) else {
        return;
    };
    let message = &mut reply.message;
    message.set_siaddr(settings.server_address);
    message.set_fname_str(&file.name);
    let opts = message.opts_mut();
    opts.insert(DhcpOption::BootfileName(file.name.into_bytes()));
    opts.insert(DhcpOption::TFTPServerName(
        settings.server_address.to_string().into_bytes(),
    ));
    opts.insert(DhcpOption::ClassIdentifier(if file.echo_http_client {
        b"HTTPClient".to_vec()
    } else {
        b"PXEClient".to_vec()
    }));
    if client.is_network_boot() {
        // Option 175 with no-pxedhcp (176 = 1): iPXE does not wait for ProxyDHCP offers.
        opts.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::Unknown(code::IPXE),
            vec![176, 1, 1],
        )));
    }
}

/// A ProxyDHCP offer that names no boot file: option 60 `PXEClient` (what makes it a
/// ProxyDHCP offer to iPXE) and no `siaddr`, `file` or option 67, so that iPXE asks for its
/// boot file with a ProxyDHCP REQUEST on port 4011.
fn add_proxy_offer_without_boot(reply: &mut Reply) {
    reply
        .message
        .opts_mut()
        .insert(DhcpOption::ClassIdentifier(b"PXEClient".to_vec()));
}

/// Option 43, sub-option 6 (PXE_DISCOVERY_CONTROL) = 8: "the boot file in this offer is the
/// one; download it", so PXE firmware does not go through boot-server discovery.
fn add_pxe_discovery_control(reply: &mut Reply, client: ClientKind) {
    if !client.is_http_boot() && client != ClientKind::Ipxe {
        reply
            .message
            .opts_mut()
            .insert(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
    }
}

/// The subnet's options: mask, router, DNS, domain, and the machine's host name.
pub fn add_config(reply: &mut Reply, subnet: &Subnet, machine: Option<&MachineRecord>) {
    let opts = reply.message.opts_mut();
    opts.insert(DhcpOption::SubnetMask(subnet.mask()));
    if let Some(gw) = subnet.gateway {
        opts.insert(DhcpOption::Router(vec![gw]));
    }
    if !subnet.dns.is_empty() {
        opts.insert(DhcpOption::DomainNameServer(subnet.dns.clone()));
    }
    if let Some(domain) = &subnet.domain {
        opts.insert(DhcpOption::DomainName(domain.clone()));
    }
    if let Some(hostname) = machine.and_then(|m| m.hostname.clone()) {
        opts.insert(DhcpOption::Hostname(hostname));
    }
}

/// Options 51, 58 and 59.
pub fn add_lease_times(reply: &mut Reply, seconds: u32) {
    let opts = reply.message.opts_mut();
    opts.insert(DhcpOption::AddressLeaseTime(seconds));
    opts.insert(DhcpOption::Renewal(seconds / 2));
    opts.insert(DhcpOption::Rebinding(seconds / 8 * 7));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp::wire;

    #[test]
    fn echoed_options_come_back_unchanged_and_option_82_last() {
        // Sub-options out of order, an unknown one, and a duplicate: a map would reorder
        // or drop them; the relay needs them as it sent them.
        let info = [
            9, 2, 0xaa, 0xbb, 1, 3, b'e', b't', b'h', 1, 1, b'x', 5, 4, 10, 99, 0, 0,
        ];
        let mut options = vec![53, 1, 1, 61, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        options.extend_from_slice(&[118, 4, 10, 99, 0, 0, 82, info.len() as u8]);
        options.extend_from_slice(&info);
        options.push(255);
        let mut datagram = vec![0u8; wire::HEADER_LEN];
        datagram[..4].copy_from_slice(&[1, 1, 6, 1]);
        datagram[24..28].copy_from_slice(&[10, 99, 0, 1]);
        datagram[28..34].copy_from_slice(&[2, 0, 0, 0, 0, 7]);
        datagram.extend_from_slice(&wire::MAGIC_COOKIE);
        datagram.extend_from_slice(&options);
        let request = wire::parse(&datagram).unwrap();

        let reply = Reply::to(&request, MessageType::Offer, Ipv4Addr::new(10, 99, 0, 1));
        let bytes = reply.encode().unwrap();
        assert!(bytes.len() >= MIN_LEN);
        // Walk the reply's options: 82 is the last before End, each echo unchanged.
        let mut found = Vec::new();
        let mut i = wire::HEADER_LEN + 4;
        while bytes[i] != 255 {
            let (c, len) = (bytes[i], usize::from(bytes[i + 1]));
            found.push((c, bytes[i + 2..i + 2 + len].to_vec()));
            i += 2 + len;
        }
        let last = found.last().unwrap();
        assert_eq!(last, &(82, info.to_vec()));
        assert!(found.contains(&(61, vec![0, 1, 2, 3, 4, 5, 6, 7, 8])));
        assert!(found.contains(&(118, vec![10, 99, 0, 0])));
        assert!(found.contains(&(53, vec![2])));
        assert_eq!(&bytes[28..34], &[2, 0, 0, 0, 0, 7]);
        assert_eq!(bytes[2], 6, "hlen");
        assert_eq!(&bytes[24..28], &[10, 99, 0, 1], "giaddr");
    }

    #[test]
    fn empty_echoes_are_kept() {
        let mut out = Vec::new();
        put_option(&mut out, 82, &[]);
        assert_eq!(out, [82, 0]);
    }

    #[test]
    fn long_echoes_are_split() {
        let mut out = Vec::new();
        put_option(&mut out, 82, &[7; 300]);
        assert_eq!(out.len(), 2 + 255 + 2 + 45);
        assert_eq!((out[0], out[1], out[257], out[258]), (82, 255, 82, 45));
    }
}
