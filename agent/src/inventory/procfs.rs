//! `/proc/cpuinfo` and `/proc/meminfo`, parsed from their text.

use std::collections::BTreeSet;

/// The processor flags worth recording (the full list is hundreds long): virtualization,
/// vector units, crypto, and whether this is itself a VM.
pub const FLAGS_OF_INTEREST: [&str; 12] = [
    "vmx",
    "svm",
    "hypervisor",
    "avx2",
    "avx512f",
    "amx_tile",
    "aes",
    "sha_ni",
    "asimd",
    "sve",
    "sha2",
    "pmull",
];

/// What `/proc/cpuinfo` tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSummary {
    /// First processor's model name (`model name` on x86).
    pub model: Option<String>,
    /// Distinct `physical id`s (1 where the kernel does not say, as on arm64).
    pub sockets: i32,
    /// Distinct (`physical id`, `core id`) pairs (the thread count where not said).
    pub cores: i32,
    /// `processor` entries.
    pub threads: i32,
    /// The flags of interest the first processor has, in [`FLAGS_OF_INTEREST`] order.
    pub flags: Vec<String>,
}

/// Parses `/proc/cpuinfo` (x86 `flags` or arm64 `Features`). `None` without any
/// `processor` entry.
pub fn parse_cpuinfo(text: &str) -> Option<CpuSummary> {
    let mut threads = 0i32;
    let mut model = None;
    let mut sockets = BTreeSet::new();
    let mut cores = BTreeSet::new();
    let mut flags: BTreeSet<&str> = BTreeSet::new();
    // Each processor is a block of `key : value` lines separated by a blank line.
    for block in text.split("\n\n") {
        let mut physical = None;
        let mut core = None;
        let mut is_processor = false;
        for line in block.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "processor" if value.parse::<u32>().is_ok() => is_processor = true,
                "model name" if model.is_none() && !value.is_empty() => {
                    model = Some(value.to_owned())
                }
                "physical id" => physical = Some(value.to_owned()),
                "core id" => core = Some(value.to_owned()),
                "flags" | "Features" if flags.is_empty() => {
                    flags = value
                        .split_whitespace()
                        .filter(|f| FLAGS_OF_INTEREST.contains(f))
                        .collect();
                }
                _ => {}
            }
        }
        if is_processor {
            threads = threads.saturating_add(1);
            if let Some(p) = &physical {
                sockets.insert(p.clone());
                if let Some(c) = core {
                    cores.insert((p.clone(), c));
                }
            }
        }
    }
    if threads == 0 {
        return None;
    }
    let count = |n: usize, fallback: i32| {
        if n == 0 {
            fallback
        } else {
            i32::try_from(n).unwrap_or(i32::MAX)
        }
    };
    Some(CpuSummary {
        model,
        sockets: count(sockets.len(), 1),
        cores: count(cores.len(), threads),
        threads,
        flags: FLAGS_OF_INTEREST
            .iter()
            .filter(|f| flags.contains(*f))
            .map(|f| (*f).to_owned())
            .collect(),
    })
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<i64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let kib: i64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sockets, two cores each, two threads per core (the shape of a small Xeon box),
    /// cut to the lines the parser reads plus a few it must skip.
    const XEON_2S: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu vme sse2 ht vmx aes avx2 avx512f sha_ni\n\n\
processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu vmx\n\n\
processor\t: 2\nphysical id\t: 0\ncore id\t\t: 1\n\n\
processor\t: 3\nphysical id\t: 0\ncore id\t\t: 1\n\n\
processor\t: 4\nphysical id\t: 1\ncore id\t\t: 0\n\n\
processor\t: 5\nphysical id\t: 1\ncore id\t\t: 0\n\n\
processor\t: 6\nphysical id\t: 1\ncore id\t\t: 1\n\n\
processor\t: 7\nphysical id\t: 1\ncore id\t\t: 1\n\n";

    /// An Ampere Altra-style arm64 listing: no model name, no topology, `Features`.
    const ARM64: &str = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\nCPU implementer\t: 0x41\n\n\
processor\t: 1\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n\n\
processor\t: 2\n\nprocessor\t: 3\n";

    /// A QEMU guest with one socket of two cores.
    const QEMU_VM: &str = "processor\t: 0\nmodel name\t: QEMU Virtual CPU version 2.5+\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu sse2 hypervisor\n\nprocessor\t: 1\nmodel name\t: QEMU Virtual CPU version 2.5+\nphysical id\t: 0\ncore id\t\t: 1\nflags\t\t: fpu sse2 hypervisor\n";

    #[test]
    fn cpuinfo_of_several_machines() {
        let cases = [
            (
                "xeon",
                XEON_2S,
                Some(CpuSummary {
                    model: Some("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz".into()),
                    sockets: 2,
                    cores: 4,
                    threads: 8,
                    flags: vec![
                        "vmx".into(),
                        "avx2".into(),
                        "avx512f".into(),
                        "aes".into(),
                        "sha_ni".into(),
                    ],
                }),
            ),
            (
                "arm64",
                ARM64,
                Some(CpuSummary {
                    model: None,
                    sockets: 1,
                    cores: 4,
                    threads: 4,
                    flags: vec!["aes".into(), "asimd".into(), "sha2".into(), "pmull".into()],
                }),
            ),
            (
                "qemu",
                QEMU_VM,
                Some(CpuSummary {
                    model: Some("QEMU Virtual CPU version 2.5+".into()),
                    sockets: 1,
                    cores: 2,
                    threads: 2,
                    flags: vec!["hypervisor".into()],
                }),
            ),
            ("empty", "", None),
            ("garbage", "processor: x\nnot a cpuinfo\n", None),
        ];
        for (what, text, want) in cases {
            assert_eq!(parse_cpuinfo(text), want, "{what}");
        }
    }

    #[test]
    fn meminfo_total() {
        let cases = [
            (
                "MemTotal:       65747160 kB\nMemFree:        62000000 kB\n",
                Some(65_747_160 * 1024),
            ),
            ("MemFree: 1 kB\nMemTotal: 2048 kB\n", Some(2048 * 1024)),
            ("MemTotal: lots\n", None),
            ("MemTotal: 9223372036854775807 kB\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_meminfo_total(text), want, "{text:?}");
        }
    }
}
