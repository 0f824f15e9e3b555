//! IPMI FRU images (Platform Management FRU Information Storage Definition v1.0) for the
//! BMC emulator: `ipmi_sim` serves them as FRU device 0 ([`super::IpmiSim::start_with_fru`]),
//! and the bootserver's FRU parser is tested against them. Areas are built from parts so
//! that a test can also build broken ones.

/// An 8-bit ASCII field (type/length byte `11` + length, then the bytes).
pub fn text(s: &str) -> Vec<u8> {
    let bytes = &s.as_bytes()[..s.len().min(63)];
    let mut out = vec![0xC0 | bytes.len() as u8];
    out.extend_from_slice(bytes);
    out
}

/// An area: version 1, its length in 8-byte units, the `fixed` bytes (chassis: the type;
/// board: language and 3 date bytes; product: language), the fields, the end marker
/// (`0xC1`), zero padding and the checksum that makes the area sum to zero.
pub fn area(fixed: &[u8], fields: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![0x01, 0x00];
    out.extend_from_slice(fixed);
    for field in fields {
        out.extend_from_slice(field);
    }
    out.push(0xC1);
    while (out.len() + 1) % 8 != 0 {
        out.push(0);
    }
    out[1] = ((out.len() + 1) / 8) as u8;
    out.push(checksum(&out));
    out
}

/// A FRU image: the common header (version 1, the areas' offsets, its checksum), then the
/// chassis, board and product areas that are given.
pub fn image(
    chassis: Option<Vec<u8>>,
    board: Option<Vec<u8>>,
    product: Option<Vec<u8>>,
) -> Vec<u8> {
    let mut header = vec![0x01, 0, 0, 0, 0, 0, 0];
    let mut body = Vec::new();
    for (slot, area) in [(2, chassis), (3, board), (4, product)] {
        if let Some(area) = area {
            header[slot] = ((8 + body.len()) / 8) as u8;
            body.extend(area);
        }
    }
    header.push(checksum(&header));
    header.extend(body);
    header
}

/// The identity of one machine, as most servers' FRU holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FruIdentity {
    /// Chassis serial number.
    pub chassis_serial: String,
    /// Board manufacturer.
    pub board_vendor: String,
    /// Board product name.
    pub board_product: String,
    /// Board serial number.
    pub board_serial: String,
    /// Product manufacturer.
    pub vendor: String,
    /// Product name.
    pub product: String,
    /// Product serial number.
    pub serial: String,
}

impl FruIdentity {
    /// The image with all three areas (chassis type 0x17, rack mount chassis).
    pub fn image(&self) -> Vec<u8> {
        image(
            Some(area(
                &[0x17],
                &[text("CH-PART"), text(&self.chassis_serial)],
            )),
            Some(area(
                &[0x00, 0x10, 0x20, 0x30],
                &[
                    text(&self.board_vendor),
                    text(&self.board_product),
                    text(&self.board_serial),
                    text("BRD-PART"),
                ],
            )),
            Some(area(
                &[0x00],
                &[
                    text(&self.vendor),
                    text(&self.product),
                    text("MODEL-1"),
                    text("v1"),
                    text(&self.serial),
                    text("asset-1"),
                ],
            )),
        )
    }
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |sum, &b| sum.wrapping_add(b)))
}
