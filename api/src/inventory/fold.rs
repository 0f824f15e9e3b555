//! How sources combine into one inventory ([`MachineInventorySpec::fold`]): by rank
//! ([`outranks`]: Redfish over IPMI FRU over in band), each section keeping its origin, and a
//! report's claims about its own origin or past reads never kept
//! ([`MachineInventorySpec::stamp`]).

use super::{FactOrigin, FactSource, InventoryRead, MachineInventorySpec, disputes};

impl MachineInventorySpec {
    /// Tags every section with `origin`: the bootserver tags a discovery report `InBand` at
    /// the time it received it, whatever the report claimed.
    pub fn stamp(&mut self, origin: &FactOrigin) {
        let origins = [
            self.cpu.as_mut().map(|s| &mut s.origin),
            self.memory.as_mut().map(|s| &mut s.origin),
            self.disks.as_mut().map(|s| &mut s.origin),
            self.nics.as_mut().map(|s| &mut s.origin),
            self.system.as_mut().map(|s| &mut s.origin),
            self.pci.as_mut().map(|s| &mut s.origin),
            self.firmware.as_mut().map(|s| &mut s.origin),
            self.bmc.as_mut().map(|s| &mut s.origin),
        ];
        for slot in origins.into_iter().flatten() {
            *slot = origin.clone();
        }
        // What a report claims about past reads, or about its own disputes, is not kept
        // either.
        self.reads.clear();
        self.disagreements.clear();
    }

    /// The MAC addresses of the inventory's NICs, lower case, sorted, deduplicated.
    pub fn mac_set(&self) -> Vec<String> {
        let mut macs: Vec<String> = self
            .nics
            .iter()
            .flat_map(|n| n.interfaces.iter())
            .map(|nic| nic.mac.to_ascii_lowercase())
            .collect();
        macs.sort();
        macs.dedup();
        macs
    }

    /// Folds one source's read into the inventory; the one rule by which every writer (the
    /// bootserver's discovery and Redfish reads, the agent's refresh) combines sources:
    /// - a section the read has replaces the current one, unless the current one comes from
    ///   a source that [`outranks`] the read's (Redfish over IPMI FRU over in band);
    /// - an in-band read that contradicts a BMC's section is recorded in `disagreements`
    ///   ([`disputes`]);
    /// - a section the read lacks is removed if the read's source wrote it (that source no
    ///   longer sees it), and kept if another source did;
    /// - the read is recorded in `reads`, replacing that source's previous record.
    ///
    /// Each section keeps the origin of the source it came from, so the result says which
    /// source each fact came from and when.
    pub fn fold(&mut self, read: MachineInventorySpec, record: InventoryRead) {
        let source = record.source;
        // Compared before anything moves: each in-band read judges afresh what the BMC
        // holds; a BMC read leaves the judgement to the next in-band one.
        if source == FactSource::InBand {
            self.disagreements = disputes::between(self, &read);
        }
        fn one<T>(
            current: &mut Option<T>,
            incoming: Option<T>,
            source: FactSource,
            origin: impl Fn(&T) -> FactSource,
        ) {
            let current_source = current.as_ref().map(&origin);
            match (incoming, current_source) {
                (Some(_), Some(held)) if outranks(held, source) => {}
                (Some(section), _) => *current = Some(section),
                (None, Some(held)) if held == source => *current = None,
                (None, _) => {}
            }
        }
        one(&mut self.cpu, read.cpu, source, |s| s.origin.source);
        one(&mut self.memory, read.memory, source, |s| s.origin.source);
        one(&mut self.disks, read.disks, source, |s| s.origin.source);
        one(&mut self.nics, read.nics, source, |s| s.origin.source);
        one(&mut self.system, read.system, source, |s| s.origin.source);
        one(&mut self.pci, read.pci, source, |s| s.origin.source);
        one(&mut self.firmware, read.firmware, source, |s| {
            s.origin.source
        });
        one(&mut self.bmc, read.bmc, source, |s| s.origin.source);
        self.reads.retain(|r| r.source != source);
        self.reads.push(record);
        self.reads.sort_by_key(|r| rank(r.source));
    }

    /// The read recorded for `source`, if any.
    pub fn read_of(&self, source: FactSource) -> Option<&InventoryRead> {
        self.reads.iter().find(|r| r.source == source)
    }
}

fn rank(source: FactSource) -> u8 {
    match source {
        FactSource::Redfish => 0,
        FactSource::IpmiFru => 1,
        FactSource::InBand => 2,
    }
}

/// Whether facts from `held` stay when `incoming` describes the same section: the BMC's
/// Redfish view outranks its IPMI FRU records, which outrank what the agent reports in band.
/// In band is what the OS of whoever answers on the machine's address says, the BMC is the
/// machine's own management controller: a report never replaces its reading (sections the
/// BMC does not read, such as disks by path, link speeds, PCI classes and LLDP, come from
/// in band alone). A source never outranks itself, so a source's newer read replaces its
/// older one.
pub fn outranks(held: FactSource, incoming: FactSource) -> bool {
    rank(held) < rank(incoming)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::*;

    fn origin(source: FactSource, second: i64) -> FactOrigin {
        FactOrigin {
            source,
            observed_at: Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap()),
        }
    }

    /// A read of `source` at `second` with a system section (its serial says which read it
    /// was) and, if `firmware`, a firmware section.
    fn read(source: FactSource, second: i64, system: bool, firmware: bool) -> MachineInventorySpec {
        MachineInventorySpec {
            system: system.then(|| SystemFacts {
                serial: Some(format!("{source:?}@{second}")),
                ..SystemFacts::empty(origin(source, second))
            }),
            firmware: firmware.then(|| FirmwareFacts {
                origin: origin(source, second),
                mode: crate::Firmware::Uefi,
                secure_boot: None,
            }),
            ..Default::default()
        }
    }

    fn record(source: FactSource, second: i64, reinspection: Option<&str>) -> InventoryRead {
        InventoryRead {
            source,
            observed_at: origin(source, second).observed_at,
            reinspection: reinspection.map(str::to_owned),
        }
    }

    /// A read in a sequence: its source, and whether it has a system and a firmware section.
    type Read = (FactSource, bool, bool);

    fn fold_all(reads: &[Read]) -> MachineInventorySpec {
        let mut spec = MachineInventorySpec::default();
        for (i, (source, system, firmware)) in reads.iter().enumerate() {
            let at = i64::try_from(i).unwrap() + 1;
            spec.fold(
                read(*source, at, *system, *firmware),
                record(*source, at, None),
            );
        }
        spec
    }

    #[test]
    fn sources_fold_by_rank_and_each_section_names_its_source() {
        use FactSource::{InBand, IpmiFru, Redfish};
        let serial =
            |spec: &MachineInventorySpec| spec.system.as_ref().and_then(|s| s.serial.clone());
        let firmware_source =
            |spec: &MachineInventorySpec| spec.firmware.as_ref().map(|f| f.origin.source);
        type Case<'a> = (&'a str, Vec<Read>, Option<&'a str>, Option<FactSource>);
        let cases: [Case<'_>; 7] = [
            (
                "Redfish first, then in band: Redfish stays, in band fills what it lacks",
                vec![(Redfish, true, false), (InBand, true, true)],
                Some("Redfish@1"),
                Some(InBand),
            ),
            (
                "in band first, then Redfish: Redfish replaces",
                vec![(InBand, true, false), (Redfish, true, true)],
                Some("Redfish@2"),
                Some(Redfish),
            ),
            (
                "Redfish fills what in band lacks",
                vec![(InBand, false, true), (Redfish, true, false)],
                Some("Redfish@2"),
                Some(InBand),
            ),
            (
                "a source's newer read replaces its older one",
                vec![(Redfish, true, false), (Redfish, true, false)],
                Some("Redfish@2"),
                None,
            ),
            (
                "a section its own source no longer sees goes",
                vec![(Redfish, true, true), (Redfish, false, true)],
                None,
                Some(Redfish),
            ),
            (
                "a section another source wrote stays when a read lacks it",
                vec![(InBand, true, false), (Redfish, false, true)],
                Some("InBand@1"),
                Some(Redfish),
            ),
            (
                "IPMI FRU never replaces Redfish",
                vec![(Redfish, true, false), (IpmiFru, true, true)],
                Some("Redfish@1"),
                Some(IpmiFru),
            ),
        ];
        for (case, reads, want_serial, want_firmware) in cases {
            let spec = fold_all(&reads);
            assert_eq!(serial(&spec).as_deref(), want_serial, "{case}");
            assert_eq!(firmware_source(&spec), want_firmware, "{case}");
        }
    }

    /// A report that contradicts the BMC never replaces its reading: the difference is
    /// recorded, the Machine's labels say disputed, and no hardware requirement admits it;
    /// a later in-band read that agrees settles it.
    #[test]
    fn an_in_band_report_that_contradicts_the_bmc_is_a_dispute_not_a_fact() {
        let system = |source, serial: &str, product: &str| SystemFacts {
            serial: Some(serial.into()),
            product: Some(product.into()),
            ..SystemFacts::empty(origin(source, 1))
        };
        let memory = |source, gib: i64| MemoryFacts {
            origin: origin(source, 1),
            total_bytes: gib << 30,
            usable_bytes: None,
            dimms: vec![],
        };
        let mut spec = MachineInventorySpec::default();
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::Redfish, "SN-1", "R650")),
                memory: Some(memory(FactSource::Redfish, 512)),
                ..Default::default()
            },
            record(FactSource::Redfish, 1, None),
        );
        let requirements = HardwareRequirements {
            min_memory_gib: Some(256),
            ..Default::default()
        };
        assert!(requirements.admits(&hardware_labels(&spec)));
        // A report whose memory is within the OS's reservations and whose identity matches.
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::InBand, " sn-1 ", "R650")),
                memory: Some(memory(FactSource::InBand, 503)),
                ..Default::default()
            },
            record(FactSource::InBand, 2, None),
        );
        assert!(spec.disagreements.is_empty(), "{:?}", spec.disagreements);
        // A forged report: another serial, four times the memory.
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::InBand, "SN-FORGED", "R650")),
                memory: Some(memory(FactSource::InBand, 2048)),
                ..Default::default()
            },
            record(FactSource::InBand, 3, None),
        );
        let sections: Vec<&str> = spec
            .disagreements
            .iter()
            .map(|d| d.section.as_str())
            .collect();
        assert_eq!(sections, ["memory", "system"]);
        assert_eq!(
            spec.system.as_ref().and_then(|s| s.serial.as_deref()),
            Some("SN-1"),
            "the BMC's reading stays"
        );
        assert_eq!(spec.memory.as_ref().map(|m| m.total_bytes), Some(512 << 30));
        let labels = hardware_labels(&spec);
        assert_eq!(
            labels.get(labels::DISPUTED).map(String::as_str),
            Some("true")
        );
        assert!(!requirements.admits(&labels), "kept off hardware claims");
        // The machine's own report again: settled.
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::InBand, "SN-1", "R650")),
                memory: Some(memory(FactSource::InBand, 510)),
                ..Default::default()
            },
            record(FactSource::InBand, 4, None),
        );
        assert!(spec.disagreements.is_empty());
        assert!(requirements.admits(&hardware_labels(&spec)));
    }

    #[test]
    fn reads_keep_one_record_per_source() {
        let mut spec = MachineInventorySpec::default();
        spec.fold(
            read(FactSource::Redfish, 1, true, false),
            record(FactSource::Redfish, 1, Some("a")),
        );
        spec.fold(
            read(FactSource::InBand, 2, true, false),
            record(FactSource::InBand, 2, None),
        );
        spec.fold(
            read(FactSource::Redfish, 3, true, false),
            record(FactSource::Redfish, 3, Some("b")),
        );
        assert_eq!(
            spec.reads,
            vec![
                record(FactSource::Redfish, 3, Some("b")),
                record(FactSource::InBand, 2, None),
            ]
        );
        assert_eq!(
            spec.read_of(FactSource::Redfish)
                .and_then(|r| r.reinspection.as_deref()),
            Some("b")
        );
        assert!(spec.read_of(FactSource::IpmiFru).is_none());
    }

    fn source() -> impl proptest::strategy::Strategy<Value = FactSource> {
        proptest::prop_oneof![
            proptest::strategy::Just(FactSource::InBand),
            proptest::strategy::Just(FactSource::Redfish),
            proptest::strategy::Just(FactSource::IpmiFru),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(26), ..proptest::test_runner::Config::default() })]

        /// Whatever the order of reads, for the system section:
        /// - if present, it is exactly what its source's latest read said (never a stale fact
        ///   of a source that since stopped seeing it);
        /// - no source that outranks it has read the section since;
        /// - if the latest read of all had it, it is present.
        #[test]
        fn folding_never_keeps_a_stale_or_outranked_section(
            reads in proptest::collection::vec((source(), proptest::bool::ANY), 1..24)
        ) {
            let full: Vec<Read> = reads.iter().map(|(s, sys)| (*s, *sys, false)).collect();
            let spec = fold_all(&full);
            let latest = |source: FactSource| reads.iter().rposition(|(s, _)| *s == source);
            if let Some(system) = &spec.system {
                let held = system.origin.source;
                let at = latest(held).unwrap();
                proptest::prop_assert!(reads[at].1, "its source's latest read lacks it");
                proptest::prop_assert_eq!(system.serial.clone(), Some(format!("{held:?}@{}", at + 1)));
                for (later, (s, had)) in reads.iter().enumerate().skip(at + 1) {
                    proptest::prop_assert!(!(outranks(*s, held) && *had), "read {later} of {s:?} outranks it");
                }
            }
            if reads.last().is_some_and(|(_, had)| *had) {
                proptest::prop_assert!(spec.system.is_some());
            }
            let mut sources: Vec<FactSource> = spec.reads.iter().map(|r| r.source).collect();
            sources.dedup();
            proptest::prop_assert_eq!(sources.len(), spec.reads.len());
        }
    }

    /// Every section a report has is stamped with the receiver's origin, whatever the report
    /// claimed; sections it lacks stay absent.
    #[test]
    fn stamp_tags_every_present_section() {
        let claimed = FactOrigin {
            source: FactSource::Redfish,
            observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let mut spec = MachineInventorySpec {
            system: Some(SystemFacts::empty(claimed.clone())),
            firmware: Some(FirmwareFacts {
                origin: claimed,
                mode: crate::Firmware::Bios,
                secure_boot: None,
            }),
            ..Default::default()
        };
        let received = FactOrigin {
            source: FactSource::InBand,
            observed_at: Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap()),
        };
        spec.stamp(&received);
        assert_eq!(spec.system.as_ref().map(|s| &s.origin), Some(&received));
        assert_eq!(spec.firmware.as_ref().map(|f| &f.origin), Some(&received));
        assert!(spec.cpu.is_none() && spec.nics.is_none());
    }
}
