#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use unbounded_api::inventory::{FactOrigin, FactSource, MachineInventorySpec, Nic, NicFacts};

use super::*;

fn mac(n: u8) -> String {
    format!("52:54:00:00:00:{n:02x}")
}

fn inventory(macs: &[u8]) -> MachineInventorySpec {
    MachineInventorySpec {
        nics: Some(NicFacts {
            origin: FactOrigin {
                source: FactSource::InBand,
                observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            },
            interfaces: macs
                .iter()
                .enumerate()
                .map(|(i, m)| Nic {
                    name: format!("eth{i}"),
                    mac: mac(*m),
                    driver: None,
                    speed_mbps: None,
                    link: true,
                    pxe_booted: i == 0,
                    lldp: None,
                })
                .collect(),
        }),
        ..Default::default()
    }
}

fn report(macs: &[u8]) -> Report {
    Report {
        body_bytes: 2000,
        boot_mac: mac(macs[0]),
        inventory: inventory(macs),
        sender: "10.0.0.0-24".into(),
    }
}

fn report_from(macs: &[u8], sender: &str) -> Report {
    Report {
        sender: sender.into(),
        ..report(macs)
    }
}

fn known(name: &str, macs: &[u8], waiting: bool) -> KnownMachine {
    KnownMachine {
        name: name.into(),
        macs: macs.iter().map(|m| mac(*m)).collect(),
        waiting,
        last_report_at: None,
        sender: Some("10.0.0.0-24".into()),
    }
}

const LIMITS: DiscoveryLimits = DiscoveryLimits {
    creations_per_minute: 2,
    max_unclaimed: 3,
    max_unclaimed_per_sender: 3,
    max_body_bytes: 10_000,
};

#[test]
fn decisions() {
    let refuse = Decision::Refuse;
    let mut too_big = report(&[1]);
    too_big.body_bytes = 10_001;
    let mut wrong_boot = report(&[1, 2]);
    wrong_boot.boot_mac = mac(9);
    let mut bad = report(&[1]);
    bad.inventory.nics.as_mut().unwrap().interfaces[0].name = "eth\u{7}".into();
    let discovered = known("discovered-525400000001", &[1], true);
    let mut reported = discovered.clone();
    reported.last_report_at = Some(950);
    type Case = (&'static str, Vec<KnownMachine>, Vec<u64>, Report, Decision);
    let cases: Vec<Case> = vec![
        (
            "a new machine is created with its boot MAC only",
            vec![],
            vec![],
            report(&[1, 2]),
            Decision::Create {
                name: "discovered-525400000001".into(),
                macs: vec![mac(1)],
            },
        ),
        (
            "too large",
            vec![],
            vec![],
            too_big,
            refuse(Refusal::TooLarge { max: 10_000 }),
        ),
        (
            "invalid inventory",
            vec![],
            vec![],
            bad,
            refuse(Refusal::Invalid(
                unbounded_api::inventory::InventoryError::BadCharacter {
                    field: "nics.interfaces[0].name".into(),
                },
            )),
        ),
        (
            "boot MAC not among the NICs",
            vec![],
            vec![],
            wrong_boot,
            refuse(Refusal::BootMacNotInInventory),
        ),
        (
            "no NICs at all",
            vec![],
            vec![],
            Report {
                body_bytes: 10,
                boot_mac: mac(1),
                inventory: MachineInventorySpec::default(),
                sender: "10.0.0.0-24".into(),
            },
            refuse(Refusal::BootMacNotInInventory),
        ),
        (
            "a declared machine's MAC",
            vec![known("r12u07", &[2], false)],
            vec![],
            report(&[1, 2]),
            refuse(Refusal::Known("r12u07".into())),
        ),
        (
            "a claimed machine's MAC",
            vec![known("discovered-525400000001", &[1], false)],
            vec![],
            report(&[1]),
            refuse(Refusal::Known("discovered-525400000001".into())),
        ),
        (
            "the same machine again updates its inventory; a new NIC does not join",
            vec![discovered.clone()],
            vec![],
            report(&[1, 3]),
            Decision::Update {
                name: "discovered-525400000001".into(),
                macs: vec![mac(1)],
            },
        ),
        (
            "a report naming another waiting Machine's MAC (to have it joined)",
            vec![known("discovered-victim", &[2], true)],
            vec![],
            report(&[1, 2]),
            refuse(Refusal::OtherMachine("discovered-victim".into())),
        ),
        (
            "one sender's cap, while others may still create",
            vec![
                known("a", &[1], true),
                known("b", &[2], true),
                known("c", &[3], false),
            ],
            vec![],
            report(&[5]),
            Decision::Create {
                name: "discovered-525400000005".into(),
                macs: vec![mac(5)],
            },
        ),
        (
            "again within a minute",
            vec![reported.clone()],
            vec![],
            report(&[1]),
            refuse(Refusal::TooSoon),
        ),
        (
            "again after a minute",
            vec![{
                let mut r = reported.clone();
                r.last_report_at = Some(940);
                r
            }],
            vec![],
            report(&[1]),
            Decision::Update {
                name: "discovered-525400000001".into(),
                macs: vec![mac(1)],
            },
        ),
        (
            "MACs of two machines",
            vec![known("a", &[1], true), known("b", &[2], true)],
            vec![],
            report(&[1, 2]),
            refuse(Refusal::MacSetConflict),
        ),
        (
            "rate: two creations in the last minute",
            vec![],
            vec![950, 990],
            report(&[5]),
            refuse(Refusal::RateLimited),
        ),
        (
            "rate: the older one left the minute",
            vec![],
            vec![940, 990],
            report(&[5]),
            Decision::Create {
                name: "discovered-525400000005".into(),
                macs: vec![mac(5)],
            },
        ),
        (
            "cap: three wait unclaimed",
            vec![
                known("a", &[1], true),
                known("b", &[2], true),
                known("c", &[3], true),
                known("d", &[4], false),
            ],
            vec![],
            report(&[5]),
            refuse(Refusal::TooManyUnclaimed(3)),
        ),
        (
            "the cap does not stop an update",
            vec![
                known("a", &[1], true),
                known("b", &[2], true),
                known("c", &[3], true),
            ],
            vec![],
            report(&[3]),
            Decision::Update {
                name: "c".into(),
                macs: vec![mac(3)],
            },
        ),
        (
            "more MACs than a Machine holds",
            vec![],
            vec![],
            report(&(1..=17).collect::<Vec<u8>>()),
            refuse(Refusal::TooManyMacs(17)),
        ),
        (
            "an update never gives the Machine a MAC",
            vec![known("a", &(1..=16).collect::<Vec<u8>>(), true)],
            vec![],
            report(&[1, 17]),
            Decision::Update {
                name: "a".into(),
                macs: (1..=16).map(mac).collect(),
            },
        ),
        (
            "the name is taken by a machine without the MAC",
            vec![known("discovered-525400000005", &[6], true)],
            vec![],
            report(&[5]),
            refuse(Refusal::MacSetConflict),
        ),
    ];
    for (what, machines, creations, report, want) in cases {
        assert_eq!(
            decide(&LIMITS, &machines, &creations, &report, 1000),
            want,
            "{what}"
        );
    }
}

/// One sender (a /24) cannot fill the global cap: its own cap refuses it while another
/// sender still creates.
#[test]
fn the_per_sender_cap_leaves_room_for_other_senders() {
    let limits = DiscoveryLimits {
        max_unclaimed: 10,
        max_unclaimed_per_sender: 2,
        creations_per_minute: 100,
        ..LIMITS
    };
    let from = |name: &str, macs: &[u8], sender: &str| KnownMachine {
        sender: Some(sender.into()),
        ..known(name, macs, true)
    };
    let machines = vec![
        from("a", &[1], "s1"),
        from("b", &[2], "s1"),
        from("c", &[3], "s2"),
    ];
    assert_eq!(
        decide(&limits, &machines, &[], &report_from(&[4], "s1"), 1000),
        Decision::Refuse(Refusal::TooManyFromSender(2))
    );
    assert!(matches!(
        decide(&limits, &machines, &[], &report_from(&[4], "s2"), 1000),
        Decision::Create { .. }
    ));
    assert_eq!(sender_of("10.99.0.21".parse().unwrap()), "10.99.0.0-24");
}

#[test]
fn the_inspection_script_boots_the_host_os_without_identity_or_nonce() {
    let script = inspection_script(
        "http://10.0.0.1:8080/images/k",
        "http://10.0.0.1:8080/images/i",
        &["console=ttyS0".to_owned()],
        "http://10.0.0.1:8080",
        "52:54:00:AB:00:01",
    );
    assert_eq!(
        script,
        "#!ipxe\necho Unbounded: inspecting 52:54:00:AB:00:01 (discovery)\n\
         kernel http://10.0.0.1:8080/images/k initrd=initrd console=ttyS0 unbounded.inspect=1 unbounded.bootserver=http://10.0.0.1:8080 BOOTIF=01-52-54-00-ab-00-01\n\
         initrd --name initrd http://10.0.0.1:8080/images/i\nboot\n"
    );
    assert!(!script.contains("unbounded.nonce") && !script.contains("unbounded.machine"));
    let refused = inspection_script(
        "http://x/k ${evil}",
        "http://x/i",
        &[],
        "http://x",
        "52:54:00:ab:00:01",
    );
    assert!(refused.contains("exit 1") && !refused.contains("kernel"));
    let refused = inspection_script(
        "http://x/k",
        "http://x/i",
        &["x=${net0/ip}".to_owned()],
        "http://x",
        "52:54:00:ab:00:01",
    );
    assert!(refused.contains("exit 1") && !refused.contains("kernel"));
}

#[test]
fn names_come_from_the_boot_mac() {
    assert_eq!(
        discovered_name("B4:96:91:A0:3E:10"),
        "discovered-b49691a03e10"
    );
}

/// One step of a random history: a report from up to three of eight MACs, a claim, or time.
#[derive(Debug, Clone)]
enum Step {
    Report(Vec<u8>),
    Claim(usize),
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => proptest::collection::vec(0u8..8, 1..4).prop_map(Step::Report),
        1 => (0usize..8).prop_map(Step::Claim),
        2 => (1u64..90).prop_map(Step::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(26), ..ProptestConfig::default() })]

    /// Applying the decisions of any sequence of reports keeps the caps, never gives one
    /// MAC to two Machines, and never gives a Machine a MAC but the boot MAC it was created
    /// for.
    #[test]
    fn caps_hold_and_no_mac_gets_two_machines(steps in proptest::collection::vec(step(), 1..60)) {
        let mut machines: Vec<KnownMachine> = Vec::new();
        let mut creations: Vec<u64> = Vec::new();
        let mut now = 1000u64;
        for step in steps {
            match step {
                Step::Wait(s) => now += s,
                Step::Claim(i) => if let Some(m) = machines.get_mut(i) { m.waiting = false },
                Step::Report(mut macs) => {
                    macs.dedup();
                    let macs: Vec<u8> = macs.into_iter().collect::<BTreeSet<_>>().into_iter().collect();
                    let boot = mac(macs[0]);
                    match decide(&LIMITS, &machines, &creations, &report(&macs), now) {
                        Decision::Create { name, macs } => {
                            prop_assert_eq!(&macs, &vec![boot], "created with its boot MAC only");
                            creations.push(now);
                            machines.push(KnownMachine { name, macs: macs.into_iter().collect(), waiting: true, last_report_at: Some(now), sender: Some("10.0.0.0-24".into()) });
                        }
                        Decision::Update { name, macs } => {
                            let m = machines.iter_mut().find(|m| m.name == name).expect("updates an existing Machine");
                            prop_assert!(m.waiting, "only an unclaimed Machine is updated");
                            let after: BTreeSet<String> = macs.into_iter().collect();
                            prop_assert_eq!(&after, &m.macs, "a report never changes a Machine's MACs");
                            prop_assert!(m.macs.contains(&boot), "only the Machine of the boot MAC is updated");
                            m.last_report_at = Some(now);
                        }
                        Decision::Refuse(_) => {}
                    }
                }
            }
            let mut seen = BTreeSet::new();
            for m in &machines {
                for mac in &m.macs {
                    prop_assert!(seen.insert(mac.clone()), "{mac} belongs to two Machines");
                }
            }
            let names: BTreeSet<&str> = machines.iter().map(|m| m.name.as_str()).collect();
            prop_assert_eq!(names.len(), machines.len(), "two Machines with one name");
            prop_assert!(machines.iter().filter(|m| m.waiting).count() <= LIMITS.max_unclaimed);
            for t in &creations {
                let window = creations.iter().filter(|u| **u >= *t && *u - *t < 60).count();
                prop_assert!(window <= LIMITS.creations_per_minute, "{window} creations within a minute");
            }
        }
    }
}

#[test]
fn claim_state_table() {
    let waiting = known("discovered-a", &[1, 2], true);
    let claimed = known("worker-7", &[3], false);
    let cases = [
        (
            "waiting",
            vec![waiting.clone()],
            1,
            ClaimState::Waiting("discovered-a".into()),
        ),
        (
            "a second MAC of the waiting Machine",
            vec![waiting.clone()],
            2,
            ClaimState::Waiting("discovered-a".into()),
        ),
        (
            "claimed",
            vec![claimed.clone()],
            3,
            ClaimState::Claimed("worker-7".into()),
        ),
        (
            "a declared Machine took a waiting one's MAC: it wins",
            vec![waiting.clone(), known("declared", &[1], false)],
            1,
            ClaimState::Claimed("declared".into()),
        ),
        (
            "nobody has it",
            vec![waiting, claimed],
            9,
            ClaimState::Unknown,
        ),
        ("no Machines", vec![], 1, ClaimState::Unknown),
    ];
    for (case, machines, boot, want) in cases {
        assert_eq!(claim_state(&machines, &mac(boot)), want, "{case}");
    }
}
