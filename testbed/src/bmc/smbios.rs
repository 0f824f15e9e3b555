//! SMBIOS structures a real server's firmware carries and QEMU does not make itself, built
//! for the testbed's VMs (`-smbios file=`) and for the agent's parser tests.

use std::net::Ipv4Addr;

/// A Redfish host interface structure (SMBIOS type 42) as firmware writes it: a USB network
/// host interface with one Redfish-over-IP record. QEMU takes it as
/// `-smbios file=`; the agent's parser is tested on it.
pub fn host_interface_structure(
    service: Ipv4Addr,
    port: u16,
    uuid: [u8; 16],
    hostname: &str,
) -> Vec<u8> {
    let mut record = Vec::with_capacity(0x5b + hostname.len());
    record.extend_from_slice(&uuid);
    record.push(3); // the host's address: auto-configured
    record.push(1); // IPv4
    record.extend_from_slice(&[169, 254, 95, 120]);
    record.extend_from_slice(&[0; 12]);
    record.extend_from_slice(&[255, 255, 0, 0]);
    record.extend_from_slice(&[0; 12]);
    record.push(1); // the service's address: static
    record.push(1); // IPv4
    record.extend_from_slice(&service.octets());
    record.extend_from_slice(&[0; 12]);
    record.extend_from_slice(&[255, 255, 0, 0]);
    record.extend_from_slice(&[0; 12]);
    record.extend_from_slice(&port.to_le_bytes());
    record.extend_from_slice(&0u32.to_le_bytes()); // no VLAN
    let name = hostname.as_bytes();
    record.push(u8::try_from(name.len()).unwrap_or(0));
    record.extend_from_slice(name.get(..usize::from(u8::MAX)).unwrap_or(name));
    // USB network interface: device type, then its descriptor (vendor and product IDs, serial
    // number descriptor length and type).
    let specific = [0x02, 0x6b, 0x1d, 0x04, 0x01, 0x02, 0x03];
    let mut formatted = vec![42, 0, 0x2a, 0x00, 0x40];
    formatted.push(u8::try_from(specific.len()).unwrap_or(0));
    formatted.extend_from_slice(&specific);
    formatted.push(1);
    formatted.push(0x04);
    formatted.push(u8::try_from(record.len()).unwrap_or(u8::MAX));
    formatted.extend_from_slice(&record);
    formatted[1] = u8::try_from(formatted.len()).unwrap_or(u8::MAX);
    // No strings: the formatted area ends in two NULs.
    formatted.extend_from_slice(&[0, 0]);
    formatted
}
