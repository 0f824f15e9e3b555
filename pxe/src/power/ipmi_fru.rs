//! IPMI FRU inventory (Platform Management FRU Information Storage Definition v1.0): the
//! identity an IPMI BMC holds for a machine without Redfish. [`parse`] (pure) reads the
//! common header and the Chassis, Board and Product Info areas of FRU device 0 into the
//! inventory's `system` section, tagged `IpmiFru`; the bytes come from
//! [`super::ipmi::IpmiBmc::fru_bytes`].
//!
//! The bytes are the BMC's, so nothing in them is trusted: a header whose checksum fails is
//! refused; an area that runs past the data or fails its checksum is left out (the others
//! still count); text is decoded by its type/length byte (8-bit Latin-1, 6-bit packed ASCII,
//! BCD plus; binary fields are skipped), stripped of control characters and cut to the
//! inventory's 128 characters.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use unbounded_api::inventory::{FactOrigin, FactSource, MachineInventorySpec, SystemFacts};

/// The longest text the inventory keeps.
const MAX_TEXT: usize = 128;
/// The type/length byte that ends an area's fields.
const END_OF_FIELDS: u8 = 0xC1;

/// Why FRU data could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FruError {
    /// Fewer than the common header's 8 bytes.
    #[error("the FRU data is {0} bytes, shorter than its 8-byte header")]
    Short(usize),
    /// The header's format version is not 1.
    #[error("the FRU header's format version is {0:#04x}, not 0x01")]
    Version(u8),
    /// The header's checksum fails.
    #[error("the FRU header's checksum fails")]
    Checksum,
    /// No Chassis, Board or Product area could be read.
    #[error("the FRU data has no readable chassis, board or product area")]
    Empty,
}

/// The text fields of the areas that were read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FruAreas {
    /// Chassis serial number.
    pub chassis_serial: Option<String>,
    /// Board manufacturer.
    pub board_vendor: Option<String>,
    /// Board product name.
    pub board_product: Option<String>,
    /// Board serial number.
    pub board_serial: Option<String>,
    /// Product manufacturer.
    pub product_vendor: Option<String>,
    /// Product name.
    pub product_name: Option<String>,
    /// Product serial number.
    pub product_serial: Option<String>,
}

/// The inventory sections FRU data tells: `system` only (identity; FRU has no CPUs, memory
/// or disks).
pub fn parse(data: &[u8], now: Time) -> Result<MachineInventorySpec, FruError> {
    let areas = read_areas(data)?;
    let system = SystemFacts {
        vendor: areas
            .product_vendor
            .clone()
            .or_else(|| areas.board_vendor.clone()),
        product: areas.product_name.clone(),
        serial: areas
            .product_serial
            .clone()
            .or_else(|| areas.chassis_serial.clone()),
        board_vendor: areas.board_vendor,
        board_product: areas.board_product,
        board_serial: areas.board_serial,
        ..SystemFacts::empty(FactOrigin {
            source: FactSource::IpmiFru,
            observed_at: now,
        })
    };
    Ok(MachineInventorySpec {
        system: Some(system),
        ..MachineInventorySpec::default()
    })
}

/// The header, then each area it points at.
pub fn read_areas(data: &[u8]) -> Result<FruAreas, FruError> {
    let header = data.get(..8).ok_or(FruError::Short(data.len()))?;
    if header[0] != 0x01 {
        return Err(FruError::Version(header[0]));
    }
    if !sums_to_zero(header) {
        return Err(FruError::Checksum);
    }
    // The fixed bytes before an area's first field: version and length, then the chassis
    // type (chassis), language and 3 bytes of manufacturing date (board), language (product).
    let area = |offset_byte: u8, fixed: usize| -> Option<Vec<String>> {
        let start = usize::from(offset_byte) * 8;
        (start != 0)
            .then(|| area_fields(data, start, fixed))
            .flatten()
    };
    // Chassis: part number, serial number.
    let chassis = area(header[2], 3);
    // Board: manufacturer, product name, serial number, part number.
    let board = area(header[3], 6);
    // Product: manufacturer, name, part/model, version, serial number, asset tag.
    let product = area(header[4], 3);
    if chassis.is_none() && board.is_none() && product.is_none() {
        return Err(FruError::Empty);
    }
    let field = |fields: &Option<Vec<String>>, i: usize| -> Option<String> {
        fields.as_ref()?.get(i).filter(|s| !s.is_empty()).cloned()
    };
    Ok(FruAreas {
        chassis_serial: field(&chassis, 1),
        board_vendor: field(&board, 0),
        board_product: field(&board, 1),
        board_serial: field(&board, 2),
        product_vendor: field(&product, 0),
        product_name: field(&product, 1),
        product_serial: field(&product, 4),
    })
}

/// The text fields of the area at `start` (its first field `fixed` bytes in), in order (a
/// binary field is an empty string, so that positions keep their meaning), or `None` when
/// the area runs past the data, has another version or fails its checksum.
fn area_fields(data: &[u8], start: usize, fixed: usize) -> Option<Vec<String>> {
    let version = *data.get(start)?;
    let length = usize::from(*data.get(start + 1)?) * 8;
    if version != 0x01 || length <= fixed {
        return None;
    }
    let bytes = data.get(start..start.checked_add(length)?)?;
    if !sums_to_zero(bytes) {
        return None;
    }
    let mut fields = Vec::new();
    let mut at = fixed;
    // The last byte is the checksum.
    while at < bytes.len() - 1 {
        let type_length = bytes[at];
        if type_length == END_OF_FIELDS {
            break;
        }
        let len = usize::from(type_length & 0x3F);
        let Some(raw) = bytes.get(at + 1..at + 1 + len) else {
            break;
        };
        fields.push(decode(type_length >> 6, raw));
        at += 1 + len;
    }
    // A field list cut short by the area's end: what was read stands.
    Some(fields)
}

/// A field's text by its type (bits 7:6 of the type/length byte).
fn decode(kind: u8, raw: &[u8]) -> String {
    let text: String = match kind {
        // 8-bit ASCII + Latin-1.
        3 => raw.iter().map(|&b| char::from(b)).collect(),
        // 6-bit packed ASCII: four characters in three bytes, least significant bits first.
        2 => raw
            .chunks(3)
            .flat_map(|c| {
                let word = c
                    .iter()
                    .enumerate()
                    .fold(0u32, |w, (i, &b)| w | (u32::from(b) << (8 * i)));
                let chars = c.len() * 8 / 6;
                (0..chars).map(move |i| char::from(((word >> (6 * i)) & 0x3F) as u8 + 0x20))
            })
            .collect(),
        // BCD plus: digits, space, dash, period.
        1 => raw
            .iter()
            .flat_map(|&b| [b >> 4, b & 0x0F])
            .filter_map(|n| match n {
                0..=9 => Some(char::from(b'0' + n)),
                0x0A => Some(' '),
                0x0B => Some('-'),
                0x0C => Some('.'),
                _ => None,
            })
            .collect(),
        // Binary: not text.
        _ => String::new(),
    };
    let clean: String = text.chars().filter(|c| !c.is_control()).collect();
    clean.trim().chars().take(MAX_TEXT).collect()
}

fn sums_to_zero(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |sum, &b| sum.wrapping_add(b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use unbounded_testbed::bmc::fru::{area, image, text};

    fn sample() -> Vec<u8> {
        image(
            Some(area(&[0x17], &[text("CH-PART"), text("CHASSIS-SN-1")])),
            Some(area(
                &[0x00, 0x10, 0x20, 0x30],
                &[
                    text("Acme Boards"),
                    text("X11-DPi"),
                    text("BRD-SN-9"),
                    text("BRD-PN"),
                ],
            )),
            Some(area(
                &[0x00],
                &[
                    text("Acme Systems"),
                    text("Rack Server 2U"),
                    text("RS2U-01"),
                    text("v2"),
                    text("SYS-SN-42"),
                    text("asset-7"),
                ],
            )),
        )
    }

    #[test]
    fn reads_chassis_board_and_product_into_the_system_section() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let spec = parse(&sample(), now.clone()).unwrap();
        let system = spec.system.unwrap();
        assert_eq!(system.origin.source, FactSource::IpmiFru);
        assert_eq!(system.vendor.as_deref(), Some("Acme Systems"));
        assert_eq!(system.product.as_deref(), Some("Rack Server 2U"));
        assert_eq!(system.serial.as_deref(), Some("SYS-SN-42"));
        assert_eq!(system.board_vendor.as_deref(), Some("Acme Boards"));
        assert_eq!(system.board_product.as_deref(), Some("X11-DPi"));
        assert_eq!(system.board_serial.as_deref(), Some("BRD-SN-9"));
        assert_eq!(system.uuid, None);
        assert!(spec.cpu.is_none() && spec.disks.is_none());
    }

    #[test]
    fn without_a_product_area_the_board_and_chassis_stand_in() {
        let data = image(
            Some(area(&[0x17], &[text("CH-PART"), text("CHASSIS-SN-1")])),
            Some(area(&[0, 0, 0, 0], &[text("Acme Boards"), text("X11")])),
            None,
        );
        let areas = read_areas(&data).unwrap();
        assert_eq!(areas.chassis_serial.as_deref(), Some("CHASSIS-SN-1"));
        let system = parse(&data, Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
            .unwrap()
            .system
            .unwrap();
        assert_eq!(system.vendor.as_deref(), Some("Acme Boards"));
        assert_eq!(system.serial.as_deref(), Some("CHASSIS-SN-1"));
        assert_eq!(system.product, None);
    }

    #[test]
    fn decodes_each_text_type() {
        // "IPMI" in 6-bit packed ASCII: I=0x29, P=0x30, M=0x2D, I=0x29.
        let word: u32 = 0x29 | (0x30 << 6) | (0x2D << 12) | (0x29 << 18);
        let packed = [word as u8, (word >> 8) as u8, (word >> 16) as u8];
        let cases: [(&str, u8, &[u8], &str); 5] = [
            ("8-bit", 3, b"Dell Inc.", "Dell Inc."),
            ("6-bit packed", 2, &packed, "IPMI"),
            ("BCD plus", 1, &[0x12, 0xB3, 0xC4], "12-3.4"),
            ("binary is not text", 0, &[0xDE, 0xAD], ""),
            (
                "control characters and padding go",
                3,
                b"  ab\x1b[2Jc\0 ",
                "ab[2Jc",
            ),
        ];
        for (case, kind, raw, want) in cases {
            assert_eq!(decode(kind, raw), want, "{case}");
        }
        assert_eq!(
            decode(3, &[b'x'; 300]).len(),
            MAX_TEXT,
            "cut to the inventory's limit"
        );
    }

    #[test]
    fn bad_data_gets_a_clear_error_or_loses_only_the_bad_area() {
        let good = sample();
        let cases: [(&str, Vec<u8>, Result<(), FruError>); 4] = [
            ("short", good[..5].to_vec(), Err(FruError::Short(5))),
            (
                "version",
                {
                    let mut d = good.clone();
                    d[0] = 0x02;
                    d
                },
                Err(FruError::Version(0x02)),
            ),
            (
                "header checksum",
                {
                    let mut d = good.clone();
                    d[7] = d[7].wrapping_add(1);
                    d
                },
                Err(FruError::Checksum),
            ),
            (
                "every area cut off",
                good[..8].to_vec(),
                Err(FruError::Empty),
            ),
        ];
        for (case, data, want) in cases {
            assert_eq!(read_areas(&data).map(drop), want, "{case}");
        }
        // A product area with a broken checksum is left out; board and chassis stay.
        let mut data = good.clone();
        let last = data.len() - 1;
        data[last] = data[last].wrapping_add(1);
        let areas = read_areas(&data).unwrap();
        assert_eq!(areas.product_name, None);
        assert_eq!(areas.board_serial.as_deref(), Some("BRD-SN-9"));
    }

    proptest! {
        /// Whatever a BMC sends, parsing ends with facts or an error, never a panic, and every
        /// text is printable and within the inventory's limit.
        #[test]
        fn any_bytes_parse_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(areas) = read_areas(&data) {
                for text in [areas.board_vendor, areas.product_name, areas.product_serial].into_iter().flatten() {
                    prop_assert!(text.chars().count() <= MAX_TEXT);
                    prop_assert!(!text.chars().any(char::is_control));
                }
            }
        }

        /// Random corruption of one byte of a valid image never panics.
        #[test]
        fn one_corrupted_byte_never_panics(at in 0usize..120, value in any::<u8>()) {
            let mut data = sample();
            if at < data.len() {
                data[at] = value;
            }
            let _ = read_areas(&data);
        }
    }
}
