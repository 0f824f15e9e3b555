//! The set-up of the controller benchmark and what the controller must make of it, as plain
//! data (issue 17):
//!
//! - configurations `mc-000`…: `priority: i % 7`, `machineSelector: {matchLabels: {rack:
//!   r<i % racks>}}`, so that with twice as many configurations as racks every Machine matches
//!   two and priority, then name, decides;
//! - Machines `m-00000`…: `provider: pxe`, one unique MAC each, label `rack: r<j % racks>`;
//! - the change: one configuration that wins its own rack gets a new template (a new version
//!   appears, as its version 1 is deployed), a priority above every other and a selector over
//!   enough racks to touch the wanted number of Machines. With `OnDelete` those Machines keep
//!   what they recorded; their `ConfigurationResolved` message names the version a repave
//!   would apply.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The label every benchmark Machine carries, and every configuration selects on.
pub const RACK_LABEL: &str = "rack";

/// Priorities of the set-up are `i % PRIORITY_SPREAD`.
const PRIORITY_SPREAD: usize = 7;

/// Above every priority of the set-up, so that the changed configuration wins its racks.
const CHANGED_PRIORITY: i64 = PRIORITY_SPREAD as i64;

/// The size of the set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Machines.
    pub machines: usize,
    /// MachineConfigurations.
    pub configurations: usize,
    /// Distinct `rack` labels.
    pub racks: usize,
    /// Racks the configuration change selects.
    pub change_racks: usize,
}

/// Why a layout cannot be benchmarked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A size is zero.
    #[error("machines, configurations, racks and change racks must all be at least 1")]
    Empty,
    /// Some rack would have no configuration, so its Machines would never resolve.
    #[error(
        "{configurations} configurations cannot cover {racks} racks: use at least as many configurations as racks"
    )]
    UncoveredRacks {
        /// Configurations asked for.
        configurations: usize,
        /// Racks asked for.
        racks: usize,
    },
    /// The change cannot select more racks than exist.
    #[error("the change selects {change_racks} racks but there are only {racks}")]
    TooManyChangeRacks {
        /// Racks the change selects.
        change_racks: usize,
        /// Racks that exist.
        racks: usize,
    },
}

impl Layout {
    /// The issue's set-up: 10,000 Machines, 100 configurations, 50 racks, and a change over
    /// 10 racks (2,000 Machines).
    pub const ISSUE: Layout = Layout {
        machines: 10_000,
        configurations: 100,
        racks: 50,
        change_racks: 10,
    };

    /// Checks that every Machine can resolve and the change is possible.
    pub fn validate(self) -> Result<Self, LayoutError> {
        if self.machines == 0
            || self.configurations == 0
            || self.racks == 0
            || self.change_racks == 0
        {
            return Err(LayoutError::Empty);
        }
        if self.configurations < self.racks {
            return Err(LayoutError::UncoveredRacks {
                configurations: self.configurations,
                racks: self.racks,
            });
        }
        if self.change_racks > self.racks {
            return Err(LayoutError::TooManyChangeRacks {
                change_racks: self.change_racks,
                racks: self.racks,
            });
        }
        Ok(self)
    }

    /// Name of configuration `i`.
    pub fn configuration_name(&self, i: usize) -> String {
        let width = digits(self.configurations.saturating_sub(1)).max(3);
        format!("mc-{i:0width$}")
    }

    /// Name of Machine `j`.
    pub fn machine_name(&self, j: usize) -> String {
        let width = digits(self.machines.saturating_sub(1)).max(5);
        format!("m-{j:0width$}")
    }

    /// Rack label value of Machine `j`.
    pub fn machine_rack(&self, j: usize) -> String {
        rack_name(j % self.racks)
    }

    /// The rack configuration `i` selects.
    pub fn configuration_rack(&self, i: usize) -> usize {
        i % self.racks
    }

    /// Priority of configuration `i` in the set-up.
    pub fn priority(&self, i: usize) -> i64 {
        // Bounded by PRIORITY_SPREAD, so the cast cannot truncate.
        (i % PRIORITY_SPREAD) as i64
    }

    /// The configuration that selection picks for the Machines of `rack` in the set-up:
    /// highest priority, ties to the name that sorts first.
    pub fn winner(&self, rack: usize) -> Option<usize> {
        (0..self.configurations)
            .filter(|i| self.configuration_rack(*i) == rack)
            .min_by(|a, b| {
                self.priority(*b).cmp(&self.priority(*a)).then_with(|| {
                    self.configuration_name(*a)
                        .cmp(&self.configuration_name(*b))
                })
            })
    }

    /// The configuration the change edits: the first that wins its own rack, so that its
    /// version 1 is deployed and a template change creates version 2.
    pub fn change_target(&self) -> Option<usize> {
        (0..self.configurations).find(|i| self.winner(self.configuration_rack(*i)) == Some(*i))
    }

    /// The racks the changed configuration selects: its own, then the lowest others.
    pub fn changed_racks(&self) -> Vec<usize> {
        let Some(target) = self.change_target() else {
            return Vec::new();
        };
        let own = self.configuration_rack(target);
        let mut racks = vec![own];
        racks.extend(
            (0..self.racks)
                .filter(|r| *r != own)
                .take(self.change_racks.saturating_sub(1)),
        );
        racks.sort_unstable();
        racks
    }

    /// The MachineConfiguration object `i` of the set-up.
    pub fn configuration_object(&self, i: usize) -> Value {
        json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "MachineConfiguration",
            "metadata": {"name": self.configuration_name(i)},
            "spec": {
                "priority": self.priority(i),
                "machineSelector": {"matchLabels": {RACK_LABEL: rack_name(self.configuration_rack(i))}},
                "updateStrategy": {"type": "OnDelete"},
                "template": template("images/host/vmlinuz"),
            },
        })
    }

    /// The Machine object `j` of the set-up.
    pub fn machine_object(&self, j: usize) -> Value {
        json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": self.machine_name(j), "labels": {RACK_LABEL: self.machine_rack(j)}},
            "spec": {
                "provider": "pxe",
                "pxe": {"macAddresses": [mac(j)], "architecture": "x86_64", "firmware": "uefi"},
            },
        })
    }

    /// The merge patch of the change, for the configuration [`Layout::change_target`] names.
    pub fn change_patch(&self) -> Value {
        let racks: Vec<String> = self.changed_racks().into_iter().map(rack_name).collect();
        json!({
            "spec": {
                "priority": CHANGED_PRIORITY,
                "machineSelector": {
                    "matchLabels": null,
                    "matchExpressions": [{"key": RACK_LABEL, "operator": "In", "values": racks}],
                },
                "template": template("images/host/vmlinuz-2"),
            }
        })
    }

    /// What the controller must have recorded once it converged on the set-up.
    pub fn expected_initial(&self) -> Expected {
        let mut expected = Expected::default();
        for j in 0..self.machines {
            let Some(winner) = self.winner(j % self.racks) else {
                continue;
            };
            let configuration = self.configuration_name(winner);
            expected.machines.insert(
                self.machine_name(j),
                ExpectedMachine {
                    configuration: configuration.clone(),
                    version: 1,
                    message: MessageRule::Exactly(format!(
                        "provisioned with {configuration} version 1"
                    )),
                },
            );
        }
        for i in 0..self.configurations {
            expected
                .configurations
                .insert(self.configuration_name(i), vec![1]);
        }
        expected
    }

    /// What the controller must show once it handled the change: the target has version 2,
    /// every Machine keeps its version (`OnDelete`), and each Machine of the changed racks
    /// names the target's version 1 (its newest deployed) as what a repave would apply.
    pub fn expected_after_change(&self) -> Expected {
        let mut expected = self.expected_initial();
        let Some(target) = self.change_target() else {
            return expected;
        };
        let target_name = self.configuration_name(target);
        let racks = self.changed_racks();
        for j in 0..self.machines {
            if !racks.contains(&(j % self.racks)) {
                continue;
            }
            if let Some(machine) = expected.machines.get_mut(&self.machine_name(j))
                && machine.configuration != target_name
            {
                machine.message = MessageRule::EndsWith(format!(
                    "; {target_name} version 1 is applied when the Node is deleted (repave)"
                ));
            }
        }
        expected.configurations.insert(target_name, vec![1, 2]);
        expected
    }
}

/// What a converged controller shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// Per Machine, what it records.
    pub machines: BTreeMap<String, ExpectedMachine>,
    /// Per configuration, the version numbers that exist (the highest is `latestVersion`).
    pub configurations: BTreeMap<String, Vec<i64>>,
}

impl Expected {
    /// How many Machines each version must count, from what the Machines must record.
    pub fn counts(&self) -> BTreeMap<(String, i64), i64> {
        let mut counts: BTreeMap<(String, i64), i64> = self
            .configurations
            .iter()
            .flat_map(|(c, versions)| versions.iter().map(move |v| ((c.clone(), *v), 0)))
            .collect();
        for machine in self.machines.values() {
            *counts
                .entry((machine.configuration.clone(), machine.version))
                .or_insert(0) += 1;
        }
        counts
    }
}

/// What one Machine must record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedMachine {
    /// `status.configuration.name`.
    pub configuration: String,
    /// `status.configuration.version`.
    pub version: i64,
    /// The message of its `ConfigurationResolved` condition.
    pub message: MessageRule,
}

/// A rule a condition message must satisfy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageRule {
    /// Exactly this text.
    Exactly(String),
    /// Ending with this text.
    EndsWith(String),
}

impl MessageRule {
    /// Whether `message` satisfies the rule.
    pub fn accepts(&self, message: &str) -> bool {
        match self {
            Self::Exactly(text) => message == text,
            Self::EndsWith(text) => message.ends_with(text.as_str()),
        }
    }
}

fn rack_name(rack: usize) -> String {
    format!("r{rack}")
}

fn digits(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// A locally administered unicast MAC address unique to Machine `j`.
fn mac(j: usize) -> String {
    let b = (j as u64).to_be_bytes();
    format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", b[4], b[5], b[6], b[7])
}

fn template(kernel: &str) -> Value {
    json!({
        "boot": {"kernelURL": kernel, "initrdURL": "images/host/initrd.zst"},
        "kubernetes": {"version": "v1.35.4"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_layout_winners_and_change() {
        let layout = Layout::ISSUE.validate().unwrap();
        // Rack r0: mc-000 (priority 0) and mc-050 (priority 1): mc-050 wins.
        assert_eq!(layout.winner(0), Some(50));
        // Rack r6: mc-006 (priority 6) and mc-056 (priority 0): mc-006 wins.
        assert_eq!(layout.winner(6), Some(6));
        // Rack r5: mc-005 (5) and mc-055 (55 % 7 = 6): mc-055 wins.
        assert_eq!(layout.winner(5), Some(55));
        assert_eq!(layout.change_target(), Some(6));
        assert_eq!(layout.changed_racks(), (0..10).collect::<Vec<_>>());
        let after = layout.expected_after_change();
        let touched = after
            .machines
            .values()
            .filter(|m| matches!(m.message, MessageRule::EndsWith(_)))
            .count();
        // 2,000 Machines in racks r0..r9; the 200 of r6 already run mc-006 version 1.
        assert_eq!(touched, 1_800);
        let counts = after.counts();
        assert_eq!(counts[&("mc-006".to_owned(), 1)], 200);
        assert_eq!(counts[&("mc-006".to_owned(), 2)], 0);
        assert_eq!(counts[&("mc-000".to_owned(), 1)], 0);
        assert_eq!(counts.values().sum::<i64>(), 10_000);
    }

    #[test]
    fn ties_go_to_the_first_name() {
        // Two configurations with priority 0 on one rack: mc-000 and mc-007.
        let layout = Layout {
            machines: 4,
            configurations: 14,
            racks: 7,
            change_racks: 1,
        };
        assert_eq!(layout.priority(0), layout.priority(7));
        assert_eq!(layout.winner(0), Some(0));
    }

    #[test]
    fn change_covers_the_target_rack_when_it_is_not_among_the_first() {
        // 5 racks, 10 configurations: rack r2's winner mc-002 (2) beats mc-007 (0); r0 and
        // r1 are won by mc-005 and mc-006, so the target is mc-002, on rack r2.
        let layout = Layout {
            machines: 10,
            configurations: 10,
            racks: 5,
            change_racks: 2,
        };
        assert_eq!(layout.change_target(), Some(2));
        assert_eq!(layout.changed_racks(), vec![0, 2]);
        let patch = layout.change_patch();
        assert_eq!(
            patch["spec"]["machineSelector"]["matchExpressions"][0]["values"],
            json!(["r0", "r2"])
        );
        assert_eq!(patch["spec"]["priority"], json!(7));
    }

    #[test]
    fn names_and_macs_are_unique_and_sortable() {
        let layout = Layout::ISSUE;
        assert_eq!(layout.configuration_name(7), "mc-007");
        assert_eq!(layout.machine_name(42), "m-00042");
        let big = Layout {
            machines: 200_000,
            configurations: 2_000,
            racks: 50,
            change_racks: 1,
        };
        assert_eq!(big.machine_name(42), "m-000042");
        assert_eq!(big.configuration_name(7), "mc-0007");
        assert_eq!(mac(0), "02:00:00:00:00:00");
        assert_eq!(mac(9_999), "02:00:00:00:27:0f");
        assert_ne!(mac(256), mac(1));
    }

    #[test]
    fn invalid_layouts_are_refused() {
        let cases = [
            (
                Layout {
                    machines: 0,
                    ..Layout::ISSUE
                },
                LayoutError::Empty,
            ),
            (
                Layout {
                    configurations: 10,
                    ..Layout::ISSUE
                },
                LayoutError::UncoveredRacks {
                    configurations: 10,
                    racks: 50,
                },
            ),
            (
                Layout {
                    change_racks: 51,
                    ..Layout::ISSUE
                },
                LayoutError::TooManyChangeRacks {
                    change_racks: 51,
                    racks: 50,
                },
            ),
        ];
        for (layout, expected) in cases {
            assert_eq!(layout.validate(), Err(expected));
        }
    }

    #[test]
    fn message_rules() {
        assert!(MessageRule::Exactly("a".into()).accepts("a"));
        assert!(!MessageRule::Exactly("a".into()).accepts("ab"));
        assert!(MessageRule::EndsWith("; b".into()).accepts("a; b"));
        assert!(!MessageRule::EndsWith("; b".into()).accepts("a"));
    }
}
