//! What the benchmark sees of the controller's work, fed by watches (cheaper for the API
//! server than polling lists of 10,000 Machines), and the check of that view against what a
//! converged controller shows.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::layout::Expected;

/// A Machine, as far as the check needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineView {
    /// `status.configuration` as `(name, version)`.
    pub recorded: Option<(String, i64)>,
    /// `spec.configurationRef` as `(name, version)`.
    pub pinned: Option<(String, Option<i64>)>,
    /// The message of the `ConfigurationResolved` condition.
    pub resolved_message: Option<String>,
}

/// A MachineConfigurationVersion, as far as the check needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionView {
    /// `spec.configurationName`.
    pub configuration: String,
    /// `spec.version`.
    pub version: i64,
    /// `status.machineCount`.
    pub machine_count: i64,
}

/// A MachineConfiguration's status, as far as the check needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigurationView {
    /// `status.latestVersion`.
    pub latest_version: i64,
    /// `status.versions` as `(version, machineCount)`.
    pub versions: Vec<(i64, i64)>,
}

/// Everything the watches saw, by object name.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Machines.
    pub machines: HashMap<String, MachineView>,
    /// MachineConfigurationVersions.
    pub versions: HashMap<String, VersionView>,
    /// MachineConfigurations.
    pub configurations: HashMap<String, ConfigurationView>,
}

/// Reads a Machine object (as JSON) into its view.
pub fn machine_view(object: &Value) -> MachineView {
    let status = &object["status"];
    let recorded = match (
        status["configuration"]["name"].as_str(),
        status["configuration"]["version"].as_i64(),
    ) {
        (Some(name), Some(version)) => Some((name.to_owned(), version)),
        _ => None,
    };
    let reference = &object["spec"]["configurationRef"];
    let pinned = reference["name"]
        .as_str()
        .map(|name| (name.to_owned(), reference["version"].as_i64()));
    let resolved_message = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "ConfigurationResolved")
        .and_then(|c| c["message"].as_str())
        .map(str::to_owned);
    MachineView {
        recorded,
        pinned,
        resolved_message,
    }
}

/// Reads a MachineConfigurationVersion object into its view.
pub fn version_view(object: &Value) -> VersionView {
    VersionView {
        configuration: object["spec"]["configurationName"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        version: object["spec"]["version"].as_i64().unwrap_or_default(),
        machine_count: object["status"]["machineCount"]
            .as_i64()
            .unwrap_or_default(),
    }
}

/// Reads a MachineConfiguration object's status into its view.
pub fn configuration_view(object: &Value) -> ConfigurationView {
    let status = &object["status"];
    ConfigurationView {
        latest_version: status["latestVersion"].as_i64().unwrap_or_default(),
        versions: status["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                (
                    v["version"].as_i64().unwrap_or_default(),
                    v["machineCount"].as_i64().unwrap_or_default(),
                )
            })
            .collect(),
    }
}

/// How far the controller is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Machines that record a configuration version.
    pub resolved: usize,
    /// Machines that record what they should, with the condition message they should have.
    pub as_expected: usize,
    /// Machines expected.
    pub machines: usize,
    /// Versions whose object and configuration status both count the right number.
    pub versions_right: usize,
    /// Versions expected.
    pub versions: usize,
    /// The first thing found wrong, for the report when time runs out.
    pub first_problem: Option<String>,
}

impl Progress {
    /// Everything is as expected.
    pub fn done(&self) -> bool {
        self.first_problem.is_none()
    }
}

/// Checks the view against what a converged controller shows: every Machine records what
/// it should (with the right condition message), exactly the expected versions exist, and
/// every version's `machineCount`, in its object and in its configuration's status, is the
/// number of Machines that record or pin it.
pub fn check(view: &View, expected: &Expected) -> Progress {
    let mut progress = Progress {
        machines: expected.machines.len(),
        ..Progress::default()
    };
    let problem = |text: String, progress: &mut Progress| {
        progress.first_problem.get_or_insert(text);
    };

    for (name, want) in &expected.machines {
        let Some(machine) = view.machines.get(name) else {
            problem(format!("Machine {name} is not there"), &mut progress);
            continue;
        };
        let Some((configuration, version)) = &machine.recorded else {
            problem(
                format!("Machine {name} records no configuration"),
                &mut progress,
            );
            continue;
        };
        progress.resolved += 1;
        if *configuration != want.configuration || *version != want.version {
            problem(
                format!(
                    "Machine {name} records {configuration} v{version}, expected {} v{}",
                    want.configuration, want.version
                ),
                &mut progress,
            );
            continue;
        }
        let message = machine.resolved_message.as_deref().unwrap_or_default();
        if !want.message.accepts(message) {
            problem(
                format!(
                    "Machine {name}: ConfigurationResolved says {message:?}, expected {:?}",
                    want.message
                ),
                &mut progress,
            );
            continue;
        }
        progress.as_expected += 1;
    }

    // The counts the objects must show, from what the Machines actually record and pin.
    let mut actual_counts: BTreeMap<(&str, i64), i64> = BTreeMap::new();
    for machine in view.machines.values() {
        let recorded = machine.recorded.as_ref().map(|(c, v)| (c.as_str(), *v));
        let pinned = machine
            .pinned
            .as_ref()
            .and_then(|(c, v)| v.map(|v| (c.as_str(), v)));
        for key in [recorded, pinned.filter(|p| Some(*p) != recorded)]
            .into_iter()
            .flatten()
        {
            *actual_counts.entry(key).or_insert(0) += 1;
        }
    }

    let mut by_configuration: BTreeMap<&str, Vec<&VersionView>> = BTreeMap::new();
    for version in view.versions.values() {
        by_configuration
            .entry(version.configuration.as_str())
            .or_default()
            .push(version);
    }
    for (configuration, numbers) in &expected.configurations {
        progress.versions += numbers.len();
        let mut existing: Vec<i64> = by_configuration
            .get(configuration.as_str())
            .map(|vs| vs.iter().map(|v| v.version).collect())
            .unwrap_or_default();
        existing.sort_unstable();
        if existing != *numbers {
            problem(
                format!("{configuration} has versions {existing:?}, expected {numbers:?}"),
                &mut progress,
            );
        }
        let status = view.configurations.get(configuration.as_str());
        let latest = numbers.iter().copied().max().unwrap_or_default();
        if status.is_none_or(|s| s.latest_version != latest) {
            problem(
                format!(
                    "{configuration} status.latestVersion is {:?}, expected {latest}",
                    status.map(|s| s.latest_version)
                ),
                &mut progress,
            );
        }
        for number in numbers {
            let want = actual_counts
                .get(&(configuration.as_str(), *number))
                .copied()
                .unwrap_or(0);
            let object = by_configuration
                .get(configuration.as_str())
                .and_then(|vs| vs.iter().find(|v| v.version == *number))
                .map(|v| v.machine_count);
            let summary = status.and_then(|s| {
                s.versions
                    .iter()
                    .find(|(v, _)| v == number)
                    .map(|(_, count)| *count)
            });
            if object == Some(want) && summary == Some(want) {
                progress.versions_right += 1;
            } else {
                problem(
                    format!(
                        "{configuration} v{number} counts {object:?} (object) and {summary:?} (configuration status), {want} Machines reference it"
                    ),
                    &mut progress,
                );
            }
        }
    }
    progress
}

#[cfg(test)]
mod tests {
    use super::super::layout::{ExpectedMachine, MessageRule};
    use super::*;
    use serde_json::json;

    fn expected() -> Expected {
        let mut e = Expected::default();
        for name in ["m-1", "m-2"] {
            e.machines.insert(
                name.to_owned(),
                ExpectedMachine {
                    configuration: "a".into(),
                    version: 1,
                    message: MessageRule::Exactly("provisioned with a version 1".into()),
                },
            );
        }
        e.configurations.insert("a".into(), vec![1]);
        e
    }

    fn converged() -> View {
        let machine = MachineView {
            recorded: Some(("a".into(), 1)),
            pinned: None,
            resolved_message: Some("provisioned with a version 1".into()),
        };
        View {
            machines: [
                ("m-1".to_owned(), machine.clone()),
                ("m-2".to_owned(), machine),
            ]
            .into(),
            versions: [(
                "a-v1".to_owned(),
                VersionView {
                    configuration: "a".into(),
                    version: 1,
                    machine_count: 2,
                },
            )]
            .into(),
            configurations: [(
                "a".to_owned(),
                ConfigurationView {
                    latest_version: 1,
                    versions: vec![(1, 2)],
                },
            )]
            .into(),
        }
    }

    #[test]
    fn check_table() {
        type Mutation = Box<dyn Fn(&mut View)>;
        let cases: Vec<(&str, Mutation, bool, usize)> = vec![
            ("converged", Box::new(|_| {}), true, 2),
            (
                "a machine without a configuration",
                Box::new(|v| {
                    v.machines.get_mut("m-1").unwrap().recorded = None;
                }),
                false,
                1,
            ),
            (
                "a machine on the wrong version",
                Box::new(|v| {
                    v.machines.get_mut("m-1").unwrap().recorded = Some(("a".into(), 2));
                }),
                false,
                1,
            ),
            (
                "a stale condition message",
                Box::new(|v| {
                    v.machines.get_mut("m-2").unwrap().resolved_message = Some("old".into());
                }),
                false,
                1,
            ),
            (
                "a version count behind",
                Box::new(|v| {
                    v.versions.get_mut("a-v1").unwrap().machine_count = 1;
                }),
                false,
                2,
            ),
            (
                "a configuration status count behind",
                Box::new(|v| {
                    v.configurations.get_mut("a").unwrap().versions = vec![(1, 1)];
                }),
                false,
                2,
            ),
            (
                "an extra version",
                Box::new(|v| {
                    v.versions.insert(
                        "a-v2".into(),
                        VersionView {
                            configuration: "a".into(),
                            version: 2,
                            machine_count: 0,
                        },
                    );
                }),
                false,
                2,
            ),
            (
                "latestVersion not recorded",
                Box::new(|v| {
                    v.configurations.get_mut("a").unwrap().latest_version = 0;
                }),
                false,
                2,
            ),
            (
                "a pinned version counts once beside the recorded one",
                Box::new(|v| {
                    v.machines.get_mut("m-1").unwrap().pinned = Some(("a".into(), Some(1)));
                }),
                true,
                2,
            ),
        ];
        let want = expected();
        for (case, mutate, done, as_expected) in cases {
            let mut view = converged();
            mutate(&mut view);
            let progress = check(&view, &want);
            assert_eq!(
                progress.done(),
                done,
                "{case}: {:?}",
                progress.first_problem
            );
            assert_eq!(progress.as_expected, as_expected, "{case}");
        }
    }

    #[test]
    fn views_read_the_fields() {
        let machine = json!({
            "spec": {"configurationRef": {"name": "a", "version": 3}},
            "status": {
                "configuration": {"name": "a", "version": 1},
                "conditions": [
                    {"type": "NodeReady", "message": "no"},
                    {"type": "ConfigurationResolved", "message": "provisioned with a version 1"},
                ],
            },
        });
        assert_eq!(
            machine_view(&machine),
            MachineView {
                recorded: Some(("a".into(), 1)),
                pinned: Some(("a".into(), Some(3))),
                resolved_message: Some("provisioned with a version 1".into()),
            }
        );
        assert_eq!(machine_view(&json!({})), MachineView::default());
        let version = json!({"spec": {"configurationName": "a", "version": 2}, "status": {"machineCount": 5}});
        assert_eq!(
            version_view(&version),
            VersionView {
                configuration: "a".into(),
                version: 2,
                machine_count: 5
            }
        );
        let configuration = json!({"status": {"latestVersion": 2, "versions": [{"version": 1, "machineCount": 4}]}});
        assert_eq!(
            configuration_view(&configuration),
            ConfigurationView {
                latest_version: 2,
                versions: vec![(1, 4)]
            }
        );
    }
}
