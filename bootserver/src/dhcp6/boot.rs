//! Which boot file URL (option 59, RFC 5970) a DHCPv6 client gets: the v4 decision
//! ([`crate::boot::classify`], [`crate::boot::boot_file`]) over what the v6 message says
//! (architecture 61, vendor class 16, user class 15), so that v4 and v6 clients of one kind
//! get the same file, and iPXE gets its script (the loop break) in both. Option 59 is always
//! a URL: a TFTP file is `tftp://[server]/file`.

use std::net::Ipv6Addr;

use dhcproto::v6::{DhcpOption, Message, OptionCode, UnknownOption};

use crate::backend::MacAddr;
use crate::boot::{self, BootFiles, ClientHints, ClientKind};

/// The IANA enterprise number PXE and UEFI HTTP boot put in their vendor class (Intel's).
pub const PXE_ENTERPRISE: u32 = 343;

/// What a DHCPv6 message says about its client, in the v4 decision's terms: the first
/// architecture type of option 61, the first vendor class data item under enterprise 343
/// (`PXEClient:…`, `HTTPClient:…`), and the user class (`iPXE`).
pub fn hints(message: &Message) -> ClientHints {
    let mut hints = ClientHints::default();
    for option in message.opts().iter() {
        match option {
            DhcpOption::ClientArchType(types) => {
                hints.architecture = types.first().map(|a| u16::from(*a));
            }
            DhcpOption::VendorClass(class) if class.num == PXE_ENTERPRISE => {
                hints.vendor_class = class.data.first().cloned();
            }
            DhcpOption::UserClass(class) => {
                hints.user_class = Some(class.data.concat());
            }
            _ => {}
        }
    }
    hints
}

/// Option 16 (vendor class, RFC 8415 §21.16) under `enterprise` with one data item, written
/// as raw bytes: dhcproto 0.15 encodes the option's length as 4 plus the number of items
/// (and option 15's as the number of items), which UEFI refuses ("Remote boot cancelled":
/// found booting OVMF over HTTPv6). Its decoder is right, so the option reads back as a
/// `VendorClass`.
pub fn vendor_class(enterprise: u32, item: &[u8]) -> DhcpOption {
    let mut data = Vec::with_capacity(6 + item.len());
    data.extend_from_slice(&enterprise.to_be_bytes());
    data.extend_from_slice(&u16::try_from(item.len()).unwrap_or(u16::MAX).to_be_bytes());
    data.extend_from_slice(&item[..item.len().min(usize::from(u16::MAX))]);
    DhcpOption::Unknown(UnknownOption::new(OptionCode::VendorClass, data))
}

/// The boot file URL for a client kind, or `None` for a client that is not network
/// booting or that cannot boot over IPv6 (BIOS: iPXE's BIOS build has no IPv6). `files`
/// carries the v6 HTTP base (`http://[fd00::1]:8080`); `tftp_server` is the address TFTP
/// is served on.
pub fn boot_file_url(
    kind: ClientKind,
    files: &BootFiles<'_>,
    mac: &MacAddr,
    tftp_server: Ipv6Addr,
) -> Option<String> {
    if kind == ClientKind::BiosPxe {
        return None;
    }
    let file = boot::boot_file(kind, files, mac)?;
    Some(if file.name.contains("://") {
        file.name
    } else {
        format!("tftp://[{tftp_server}]/{}", file.name)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use dhcproto::v6::{UserClass, VendorClass};
    use dhcproto::{Decodable, Decoder};

    fn message_with(options: Vec<DhcpOption>) -> Message {
        let mut message = Message::new(dhcproto::v6::MessageType::Solicit);
        for option in options {
            message.opts_mut().insert(option);
        }
        message
    }

    fn vendor(text: &str) -> DhcpOption {
        DhcpOption::VendorClass(VendorClass {
            num: PXE_ENTERPRISE,
            data: vec![text.as_bytes().to_vec()],
        })
    }

    fn arch(n: u16) -> DhcpOption {
        DhcpOption::ClientArchType(vec![n.into()])
    }

    /// The vendor class we send is what RFC 8415 says, byte for byte, and reads back.
    #[test]
    fn the_vendor_class_option_has_its_real_length() {
        use dhcproto::{Encodable, Encoder};
        let mut message = Message::new_with_id(dhcproto::v6::MessageType::Advertise, [0, 0, 1]);
        message
            .opts_mut()
            .insert(vendor_class(PXE_ENTERPRISE, b"HTTPClient"));
        let mut bytes = Vec::new();
        message.encode(&mut Encoder::new(&mut bytes)).unwrap();
        let mut expected = vec![0, 16, 0, 16, 0, 0, 1, 0x57, 0, 10];
        expected.extend_from_slice(b"HTTPClient");
        assert_eq!(&bytes[4..], &expected[..]);
        let back = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(
            hints(&back).vendor_class.as_deref(),
            Some(&b"HTTPClient"[..])
        );
    }

    #[test]
    fn v6_clients_get_what_v4_clients_of_their_kind_get() {
        let files = BootFiles {
            uefi_x64: "snponly.efi",
            http_base: "http://[fd00::1]:8080",
        };
        let mac = MacAddr([0x52, 0x54, 0x00, 0x66, 0x00, 0x01]);
        let server: Ipv6Addr = "fd00::1".parse().unwrap();
        let url = |m: &Message| boot_file_url(boot::classify(&hints(m)), &files, &mac, server);

        let ovmf = Message::decode(&mut Decoder::new(
            &crate::dhcp6::identify::tests_fixture::ovmf_solicit(),
        ))
        .unwrap();
        assert_eq!(boot::classify(&hints(&ovmf)), ClientKind::UefiX64Pxe);
        assert_eq!(url(&ovmf).as_deref(), Some("tftp://[fd00::1]/snponly.efi"));

        let http = message_with(vec![arch(16), vendor("HTTPClient:Arch:00016:UNDI:003000")]);
        assert_eq!(
            url(&http).as_deref(),
            Some("http://[fd00::1]:8080/ipxe/snponly.efi")
        );
        let arm = message_with(vec![arch(11), vendor("PXEClient:Arch:00011:UNDI:003000")]);
        assert_eq!(
            url(&arm).as_deref(),
            Some("tftp://[fd00::1]/arm64/ipxe.efi")
        );
        // iPXE: its own script, never another iPXE.
        let ipxe = message_with(vec![
            arch(7),
            vendor("PXEClient:Arch:00007:UNDI:003000"),
            DhcpOption::UserClass(UserClass {
                data: vec![b"iPXE".to_vec()],
            }),
        ]);
        assert_eq!(
            url(&ipxe).as_deref(),
            Some("http://[fd00::1]:8080/boot.ipxe?mac=52:54:00:66:00:01")
        );
        // BIOS has no v6; an OS's client, and a vendor class under another enterprise, are
        // not network booting.
        assert_eq!(
            url(&message_with(vec![
                arch(0),
                vendor("PXEClient:Arch:00000:UNDI:002001")
            ])),
            None
        );
        assert_eq!(url(&message_with(vec![])), None);
        let foreign = message_with(vec![
            arch(7),
            DhcpOption::VendorClass(VendorClass {
                num: 4491,
                data: vec![b"PXEClient".to_vec()],
            }),
        ]);
        assert_eq!(url(&foreign), None);
    }
}
