//! What moving a running Machine from one configuration version to another takes, decided
//! field by field: [`decide`] compares two templates and says what can be applied in place
//! (and by whom) and what only a repave applies. The `applyConfiguration` operation carries
//! the plan out; a field that is not in [`FIELDS`] fails the field-walk test, so a new
//! template field cannot be added without a decision.
//!
//! The agent's rows are carried out by an `applyFiles` operation that the controller's
//! `applyConfiguration` creates for the Machine's agent ([`AgentApply`] is its parameters,
//! [`ApplyPlan::agent_steps`] the order of its steps: every file, then each unit once).
//!
//! | field | how it is applied |
//! |---|---|
//! | `kubernetes.nodeLabels` | in place: the controller patches the Node's labels |
//! | `kubernetes.nodeTaints` | in place: the controller patches the Node's taints |
//! | `kubernetes.kubeletExtraArgs` | in place (agent): kubelet's flags rewritten, `kubelet.service` restarted |
//! | `files[]` content, mode (and a new file) | in place (agent): the file written, its `restartUnits` restarted |
//! | `files[].restartUnits` | nothing to do: it only says what a later change restarts |
//! | `image.maxSizeBytes` | nothing to do: a download limit, read at the next pave |
//! | `files[]` removed (or its path changed) | repave: the image's own file cannot be restored in place |
//! | `image.url`, `image.sha256` | repave: another node container |
//! | `kubernetes.version` | repave: another kubelet |
//! | `nspawn.*` | repave: the container's settings are read when it starts |
//! | `boot.kernelURL`, `boot.initrdURL`, `boot.kernelArgs` | repave: the host OS is read when the machine network-boots |
//! | `boot.measurements`, `identity.*` | recorded: read by the machine's next TPM attestation |
//! | `storage.*` | repave: the disk is chosen, laid out and mounted before the container is paved |

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Taint;

use crate::configuration::{FileSpec, KubernetesSpec, MachineTemplate};

/// The unit the agent restarts after rewriting kubelet's flags.
pub const KUBELET_UNIT: &str = "kubelet.service";

/// How a change of one template field is applied to a running Machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Treatment {
    /// The controller patches the Node's labels.
    NodeLabels,
    /// The controller patches the Node's taints.
    NodeTaints,
    /// The agent rewrites kubelet's flags and restarts kubelet.
    KubeletRestart,
    /// The agent writes the file and restarts the units that read it.
    WriteFile,
    /// Nothing on the machine changes; the new version is only recorded.
    RecordOnly,
    /// Only a repave (a new node container) applies it.
    Repave,
}

/// Every field of a template (as JSON paths, `[]` for a list element) and how a change of
/// it is applied. The field-walk test checks that every field a template serializes to is
/// here, and that [`decide`] treats a change of each field as written here.
pub const FIELDS: &[(&str, Treatment)] = &[
    ("boot.kernelURL", Treatment::Repave),
    ("boot.initrdURL", Treatment::Repave),
    ("boot.kernelArgs[]", Treatment::Repave),
    // What a boot must measure and how a machine proves itself are checked at its next
    // attestation: nothing on a running machine changes.
    ("boot.measurements[]", Treatment::RecordOnly),
    ("identity.mode", Treatment::RecordOnly),
    ("identity.endorsementKey", Treatment::RecordOnly),
    ("identity.trustOnFirstUse", Treatment::RecordOnly),
    ("image.url", Treatment::Repave),
    ("image.sha256", Treatment::Repave),
    ("image.maxSizeBytes", Treatment::RecordOnly),
    ("kubernetes.version", Treatment::Repave),
    ("kubernetes.kubeletExtraArgs", Treatment::KubeletRestart),
    ("kubernetes.nodeLabels", Treatment::NodeLabels),
    ("kubernetes.nodeTaints[].key", Treatment::NodeTaints),
    ("kubernetes.nodeTaints[].value", Treatment::NodeTaints),
    ("kubernetes.nodeTaints[].effect", Treatment::NodeTaints),
    ("kubernetes.nodeTaints[].timeAdded", Treatment::NodeTaints),
    ("nspawn.bindMounts[].source", Treatment::Repave),
    ("nspawn.bindMounts[].target", Treatment::Repave),
    ("nspawn.bindMounts[].readOnly", Treatment::Repave),
    ("nspawn.network", Treatment::Repave),
    // A path change removes the file at the old path: see `files_plan`.
    ("files[].path", Treatment::Repave),
    ("files[].content", Treatment::WriteFile),
    ("files[].mode", Treatment::WriteFile),
    ("files[].restartUnits[]", Treatment::RecordOnly),
    // The disk is chosen and laid out before a pave; the wipe policy is the one the
    // Machine's version says at the moment of the wipe, and a new version of it is applied
    // with the rest of the storage section, by a repave (one rule for the whole section).
    ("storage.disk.minSizeGiB", Treatment::Repave),
    ("storage.disk.maxSizeGiB", Treatment::Repave),
    ("storage.disk.rotational", Treatment::Repave),
    ("storage.disk.model", Treatment::Repave),
    ("storage.disk.serial", Treatment::Repave),
    ("storage.disk.wwn", Treatment::Repave),
    ("storage.disk.byPath", Treatment::Repave),
    ("storage.layout", Treatment::Repave),
    ("storage.filesystem", Treatment::Repave),
    ("storage.wipe", Treatment::Repave),
    ("storage.wipeMethod", Treatment::Repave),
    ("storage.allowForeign", Treatment::Repave),
];

/// The part of `boot` the machine runs (kernel, initrd, arguments), without the accepted
/// measurements, which only the next attestation reads.
fn host_os(boot: Option<&crate::configuration::BootSpec>) -> Option<(&str, &str, &[String])> {
    boot.map(|b| {
        (
            b.kernel_url.as_str(),
            b.initrd_url.as_str(),
            b.kernel_args.as_slice(),
        )
    })
}

/// Why a change needs a repave.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RepaveReason {
    /// `boot` changed: the host OS is read when the machine network-boots.
    Boot,
    /// `image.url` or `image.sha256` changed.
    Image,
    /// `kubernetes.version` changed.
    KubernetesVersion,
    /// `nspawn` changed.
    Nspawn,
    /// A file the old version wrote is no longer in the new one.
    FileRemoved(String),
    /// `storage` changed: the disk is chosen and laid out before a pave.
    Storage,
}

impl RepaveReason {
    /// For a person.
    pub fn describe(&self) -> String {
        match self {
            Self::Boot => "boot (the host OS) changed".into(),
            Self::Image => "the node image changed".into(),
            Self::KubernetesVersion => "kubernetes.version changed".into(),
            Self::Nspawn => "the nspawn settings changed".into(),
            Self::FileRemoved(path) => format!("file {path} is no longer in the configuration"),
            Self::Storage => "the storage (local disk) settings changed".into(),
        }
    }
}

/// The Node labels to set and to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelChange {
    /// Labels to set (new or with another value).
    pub set: BTreeMap<String, String>,
    /// Labels the old version set that the new one does not.
    pub remove: Vec<String>,
}

/// The Node taints the configuration manages, before and after.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaintChange {
    /// The taints the old version registered (removed from the Node unless in `new`).
    pub old: Vec<Taint>,
    /// The taints the new version registers.
    pub new: Vec<Taint>,
}

/// Everything moving from one version to another takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApplyPlan {
    /// Node labels, when they changed (controller).
    pub labels: Option<LabelChange>,
    /// Node taints, when they changed (controller).
    pub taints: Option<TaintChange>,
    /// The new kubelet flags, when they changed (agent: rewrite and restart kubelet).
    pub kubelet_args: Option<BTreeMap<String, String>>,
    /// Files to write (agent), new or changed.
    pub files: Vec<FileSpec>,
    /// Units to restart after the files are written (agent), sorted.
    pub restart_units: BTreeSet<String>,
    /// What only a repave applies; empty when everything is applied in place.
    pub repave: Vec<RepaveReason>,
}

impl ApplyPlan {
    /// Whether a repave is needed.
    pub fn needs_repave(&self) -> bool {
        !self.repave.is_empty()
    }

    /// Whether the agent has something to do (files, kubelet).
    pub fn has_agent_steps(&self) -> bool {
        self.kubelet_args.is_some() || !self.files.is_empty()
    }

    /// Whether the controller has something to do on the Node.
    pub fn has_node_steps(&self) -> bool {
        self.labels.is_some() || self.taints.is_some()
    }

    /// The treatments this plan uses, for tests and messages.
    pub fn treatments(&self) -> BTreeSet<Treatment> {
        let mut out = BTreeSet::new();
        if self.labels.is_some() {
            out.insert(Treatment::NodeLabels);
        }
        if self.taints.is_some() {
            out.insert(Treatment::NodeTaints);
        }
        if self.kubelet_args.is_some() {
            out.insert(Treatment::KubeletRestart);
        }
        if !self.files.is_empty() {
            out.insert(Treatment::WriteFile);
        }
        if self.needs_repave() {
            out.insert(Treatment::Repave);
        }
        out
    }

    /// The repave reasons, for a message.
    pub fn repave_summary(&self) -> String {
        self.repave
            .iter()
            .map(RepaveReason::describe)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// One step of the agent's part of a plan, in the order the agent carries them out.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentStep {
    /// Write this file of the new version into the node container's root.
    WriteFile(FileSpec),
    /// Rewrite kubelet's flags file with these extra flags (and the new version's labels).
    WriteKubeletFlags(BTreeMap<String, String>),
    /// Restart this unit inside the node container.
    Restart(String),
}

impl ApplyPlan {
    /// The agent's steps: every file first (in the new version's order), then kubelet's
    /// flags, then each unit to restart once (sorted by name), so that a unit reading two
    /// changed files starts once, with both in place. Empty when the agent has nothing to do.
    pub fn agent_steps(&self) -> Vec<AgentStep> {
        let mut steps: Vec<AgentStep> = self
            .files
            .iter()
            .cloned()
            .map(AgentStep::WriteFile)
            .collect();
        if let Some(args) = &self.kubelet_args {
            steps.push(AgentStep::WriteKubeletFlags(args.clone()));
        }
        steps.extend(self.restart_units.iter().cloned().map(AgentStep::Restart));
        steps
    }
}

/// The parameters of an `applyFiles` operation (the agent's part of an
/// `applyConfiguration`): which configuration, the version the Machine records and the
/// target. The controller writes them, the agent and the agent's role read them: one format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentApply {
    /// The configuration's name.
    pub configuration: String,
    /// The version the Machine records (what the container holds).
    pub from: i64,
    /// The target version.
    pub version: i64,
}

impl AgentApply {
    /// As the operation's parameters.
    pub fn to_parameters(&self) -> BTreeMap<String, String> {
        use crate::well_known::operations as names;
        BTreeMap::from([
            (
                names::CONFIGURATION_PARAMETER.to_owned(),
                self.configuration.clone(),
            ),
            (names::FROM_PARAMETER.to_owned(), self.from.to_string()),
            (
                names::VERSION_PARAMETER.to_owned(),
                self.version.to_string(),
            ),
        ])
    }

    /// From the operation's parameters; an unknown, missing or malformed one is an error
    /// that names it.
    pub fn from_parameters(parameters: &BTreeMap<String, String>) -> Result<Self, String> {
        use crate::well_known::operations as names;
        let known = [
            names::CONFIGURATION_PARAMETER,
            names::FROM_PARAMETER,
            names::VERSION_PARAMETER,
        ];
        if let Some(unknown) = parameters.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!(
                "{} does not know the parameter {unknown:?} (known: {})",
                names::APPLY_FILES,
                known.join(", ")
            ));
        }
        let number = |key: &str| {
            parameters
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .filter(|v| *v >= 1)
                .ok_or_else(|| {
                    format!(
                        "{} needs the parameter {key}, a version number",
                        names::APPLY_FILES
                    )
                })
        };
        let configuration = parameters
            .get(names::CONFIGURATION_PARAMETER)
            .filter(|c| !c.is_empty())
            .cloned()
            .ok_or_else(|| {
                format!(
                    "{} needs the parameter {}",
                    names::APPLY_FILES,
                    names::CONFIGURATION_PARAMETER
                )
            })?;
        Ok(Self {
            configuration,
            from: number(names::FROM_PARAMETER)?,
            version: number(names::VERSION_PARAMETER)?,
        })
    }

    /// The MachineConfigurationVersion the agent reads for the target.
    pub fn target_version_name(&self) -> String {
        crate::version_name(&self.configuration, self.version)
    }

    /// The MachineConfigurationVersion of what the container holds now.
    pub fn from_version_name(&self) -> String {
        crate::version_name(&self.configuration, self.from)
    }
}

/// Decides what moving a Machine from `old` to `new` takes.
pub fn decide(old: &MachineTemplate, new: &MachineTemplate) -> ApplyPlan {
    let mut plan = ApplyPlan::default();
    if host_os(old.boot.as_ref()) != host_os(new.boot.as_ref()) {
        plan.repave.push(RepaveReason::Boot);
    }
    let image = |t: &MachineTemplate| t.image.as_ref().map(|i| (i.url.clone(), i.sha256.clone()));
    if image(old) != image(new) {
        plan.repave.push(RepaveReason::Image);
    }
    if old.nspawn.clone().unwrap_or_default() != new.nspawn.clone().unwrap_or_default() {
        plan.repave.push(RepaveReason::Nspawn);
    }
    if old.storage != new.storage {
        plan.repave.push(RepaveReason::Storage);
    }
    let empty = KubernetesSpec::default();
    let (ok, nk) = (
        old.kubernetes.as_ref().unwrap_or(&empty),
        new.kubernetes.as_ref().unwrap_or(&empty),
    );
    if ok.version != nk.version {
        plan.repave.push(RepaveReason::KubernetesVersion);
    }
    if ok.node_labels != nk.node_labels {
        plan.labels = Some(LabelChange {
            set: nk
                .node_labels
                .iter()
                .filter(|(k, v)| ok.node_labels.get(*k) != Some(v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            remove: ok
                .node_labels
                .keys()
                .filter(|k| !nk.node_labels.contains_key(*k))
                .cloned()
                .collect(),
        });
    }
    if ok.node_taints != nk.node_taints {
        plan.taints = Some(TaintChange {
            old: ok.node_taints.clone(),
            new: nk.node_taints.clone(),
        });
    }
    if ok.kubelet_extra_args != nk.kubelet_extra_args {
        plan.kubelet_args = Some(nk.kubelet_extra_args.clone());
        plan.restart_units.insert(KUBELET_UNIT.to_owned());
    }
    files_plan(&old.files, &new.files, &mut plan);
    plan
}

/// Files: a new or changed file (content, mode) is written and its units restarted; a file
/// that is gone needs a repave (what the image held at that path cannot be restored); a
/// change of `restartUnits` alone changes nothing on the machine.
fn files_plan(old: &[FileSpec], new: &[FileSpec], plan: &mut ApplyPlan) {
    let by_path: BTreeMap<&str, &FileSpec> = old.iter().map(|f| (f.path.as_str(), f)).collect();
    for file in new {
        let unchanged = by_path
            .get(file.path.as_str())
            .is_some_and(|o| o.content == file.content && o.mode == file.mode);
        if !unchanged {
            plan.files.push(file.clone());
            plan.restart_units
                .extend(file.restart_units.iter().cloned());
        }
    }
    let kept: BTreeSet<&str> = new.iter().map(|f| f.path.as_str()).collect();
    for file in old {
        if !kept.contains(file.path.as_str()) {
            plan.repave
                .push(RepaveReason::FileRemoved(file.path.clone()));
        }
    }
}

/// The taints a Node should have after moving from `change.old` to `change.new`: the
/// Node's own taints (those the configuration did not set: `node.kubernetes.io/*` set by
/// the node lifecycle controller, a person's) are kept; the old version's are replaced by
/// the new version's. Taints are matched by key and effect, as Kubernetes does.
pub fn taints_after(current: &[Taint], change: &TaintChange) -> Vec<Taint> {
    let same = |a: &Taint, b: &Taint| a.key == b.key && a.effect == b.effect;
    let mut out: Vec<Taint> = current
        .iter()
        .filter(|t| !change.old.iter().any(|o| same(o, t)))
        .filter(|t| !change.new.iter().any(|n| same(n, t)))
        .cloned()
        .collect();
    out.extend(change.new.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A template with every field set.
    fn full(variant: u8) -> Value {
        let (a, b) = if variant == 0 {
            ("a", false)
        } else {
            ("b", true)
        };
        json!({
            "boot": {"kernelURL": format!("k-{a}"), "initrdURL": format!("i-{a}"), "kernelArgs": [format!("arg-{a}")],
                     "measurements": [{"4": a.repeat(64)}]},
            "identity": {"mode": if b { "tpm" } else { "network" }, "endorsementKey": format!("000b{}", a.repeat(64)),
                         "trustOnFirstUse": b},
            "image": {"url": format!("u-{a}"), "sha256": a.repeat(64), "maxSizeBytes": if b { 2 } else { 1 }},
            "kubernetes": {
                "version": format!("v1.35.{}", u8::from(b)),
                "kubeletExtraArgs": {"max-pods": a},
                "nodeLabels": {"tier": a},
                "nodeTaints": [{"key": format!("t-{a}"), "value": a, "effect": if b { "NoExecute" } else { "NoSchedule" },
                                "timeAdded": if b { "2026-01-01T00:00:00Z" } else { "2025-01-01T00:00:00Z" }}],
            },
            "nspawn": {"bindMounts": [{"source": format!("/s-{a}"), "target": format!("/t-{a}"), "readOnly": b}],
                       "network": if b { "private" } else { "host" }},
            "files": [{"path": format!("/etc/{a}"), "content": a, "mode": if b { "0600" } else { "0644" },
                       "restartUnits": [format!("{a}.service")]}],
            "storage": {
                "disk": {"minSizeGiB": if b { 32 } else { 16 }, "maxSizeGiB": if b { 64 } else { 48 },
                         "rotational": b, "model": format!("m-{a}"), "serial": format!("s-{a}"),
                         "wwn": format!("w-{a}"), "byPath": format!("pci-{a}")},
                "layout": if b { "wholeDisk" } else { "partition" },
                // One filesystem exists: the second fixture leaves it out (its default).
                "filesystem": if b { Value::Null } else { json!("ext4") },
                "wipe": if b { "always" } else { "never" },
                "wipeMethod": if b { "overwrite" } else { "fast" },
                "allowForeign": b,
            },
        })
    }

    /// Every leaf of a JSON value as `(path, value)`; a map (a JSON object whose keys are
    /// data, such as labels) is one leaf, named by the paths in [`MAPS`].
    fn leaves(value: &Value, path: &str, out: &mut Vec<String>) {
        const MAPS: [&str; 3] = [
            "kubernetes.kubeletExtraArgs",
            "kubernetes.nodeLabels",
            "boot.measurements[]",
        ];
        match value {
            Value::Object(map) if !MAPS.contains(&path) => {
                for (k, v) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, &p, out);
                }
            }
            Value::Array(items) => {
                for item in items {
                    leaves(item, &format!("{path}[]"), out);
                }
            }
            _ => out.push(path.to_owned()),
        }
    }

    /// Writes `source`'s value at `path` into `target` (the first element of each list).
    fn copy_leaf(target: &mut Value, source: &Value, path: &str) {
        let mut t = target;
        let mut s = source;
        for part in path.split('.') {
            let (key, list) = match part.strip_suffix("[]") {
                Some(k) => (k, true),
                None => (part, false),
            };
            t = &mut t[key];
            s = &s[key];
            if list {
                t = &mut t[0];
                s = &s[0];
            }
        }
        *t = s.clone();
    }

    fn template(value: Value) -> MachineTemplate {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("template: {e}"))
    }

    /// Every field a template serializes to has a decision in [`FIELDS`], and no entry
    /// names a field that does not exist: adding a template field fails here until it is
    /// decided.
    #[test]
    fn every_template_field_has_a_decision() {
        let a = serde_json::to_value(template(full(0))).unwrap_or_default();
        let b = serde_json::to_value(template(full(1))).unwrap_or_default();
        let mut found = Vec::new();
        leaves(&a, "", &mut found);
        let found: BTreeSet<String> = found.into_iter().collect();
        let tabled: BTreeSet<String> = FIELDS.iter().map(|(p, _)| (*p).to_owned()).collect();
        assert_eq!(
            found, tabled,
            "every template field needs a row in FIELDS (and every row a field)"
        );
        // The second fixture differs in every field, so that each row below is exercised.
        let mut found_b = Vec::new();
        leaves(&b, "", &mut found_b);
        for path in &found_b {
            let mut only = a.clone();
            copy_leaf(&mut only, &b, path);
            assert_ne!(only, a, "{path}: the fixtures do not differ");
        }
    }

    /// The schema's property names at every level, to catch a field the fixtures miss.
    fn schema_properties(schema: &Value, defs: &Value, path: &str, out: &mut BTreeSet<String>) {
        let resolved = match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => defs
                .get(r.rsplit('/').next().unwrap_or_default())
                .unwrap_or(&Value::Null),
            None => schema,
        };
        let inner = resolved
            .get("anyOf")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|v| v.get("type") != Some(&json!("null"))))
            .unwrap_or(resolved);
        if let Some(items) = inner.get("items") {
            schema_properties(items, defs, &format!("{path}[]"), out);
            return;
        }
        match inner.get("properties").and_then(Value::as_object) {
            Some(props) => {
                for (k, v) in props {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    schema_properties(v, defs, &p, out);
                }
            }
            None => {
                out.insert(path.to_owned());
            }
        }
    }

    /// The schema of a template (what the CRD accepts) names exactly the fields of
    /// [`FIELDS`]: a new field in the types fails here even before a fixture sets it.
    #[test]
    fn the_schema_has_exactly_the_tabled_fields() {
        let schema =
            serde_json::to_value(schemars::schema_for!(MachineTemplate)).unwrap_or_default();
        let defs = schema
            .get("$defs")
            .or_else(|| schema.get("definitions"))
            .cloned()
            .unwrap_or(Value::Null);
        let mut found = BTreeSet::new();
        schema_properties(&schema, &defs, "", &mut found);
        let tabled: BTreeSet<String> = FIELDS.iter().map(|(p, _)| (*p).to_owned()).collect();
        assert_eq!(found, tabled);
    }

    /// A change of each field alone is treated as [`FIELDS`] says.
    #[test]
    fn each_field_changed_alone_is_treated_as_tabled() {
        let a = full(0);
        let b = full(1);
        for (path, treatment) in FIELDS {
            let mut changed = a.clone();
            copy_leaf(&mut changed, &b, path);
            let plan = decide(&template(a.clone()), &template(changed));
            let expected: BTreeSet<Treatment> = match treatment {
                Treatment::RecordOnly => BTreeSet::new(),
                // A path change writes the new file too.
                Treatment::Repave if *path == "files[].path" => {
                    [Treatment::WriteFile, Treatment::Repave].into()
                }
                t => [*t].into(),
            };
            assert_eq!(plan.treatments(), expected, "{path}");
        }
        assert_eq!(
            decide(&template(a.clone()), &template(a)),
            ApplyPlan::default(),
            "no change, nothing to do"
        );
    }

    fn file(path: &str, content: &str, units: &[&str]) -> FileSpec {
        FileSpec {
            path: path.into(),
            content: content.into(),
            mode: None,
            restart_units: units.iter().map(|u| (*u).to_owned()).collect(),
        }
    }

    fn with_files(files: Vec<FileSpec>) -> MachineTemplate {
        MachineTemplate {
            files,
            ..MachineTemplate::default()
        }
    }

    #[test]
    fn files_table() {
        let cni = file("/etc/cni/x.conf", "1", &["containerd.service"]);
        let cni2 = file("/etc/cni/x.conf", "2", &["containerd.service"]);
        let motd = file("/etc/motd", "hi", &[]);
        // (case, old files, new files, written, restarted, repave)
        type Case = (
            &'static str,
            Vec<FileSpec>,
            Vec<FileSpec>,
            Vec<&'static str>,
            Vec<&'static str>,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                "unchanged",
                vec![cni.clone()],
                vec![cni.clone()],
                vec![],
                vec![],
                false,
            ),
            (
                "content changed: written, its unit restarted",
                vec![cni.clone()],
                vec![cni2.clone()],
                vec!["/etc/cni/x.conf"],
                vec!["containerd.service"],
                false,
            ),
            (
                "a new file without units: written, nothing restarted",
                vec![cni.clone()],
                vec![cni.clone(), motd.clone()],
                vec!["/etc/motd"],
                vec![],
                false,
            ),
            (
                "a file removed: repave",
                vec![cni.clone(), motd.clone()],
                vec![cni.clone()],
                vec![],
                vec![],
                true,
            ),
            (
                "only restartUnits changed: nothing to do",
                vec![cni.clone()],
                vec![file("/etc/cni/x.conf", "1", &["kubelet.service"])],
                vec![],
                vec![],
                false,
            ),
        ];
        for (case, old, new, written, units, repave) in cases {
            let plan = decide(&with_files(old), &with_files(new));
            let paths: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
            assert_eq!(paths, written, "{case}");
            let restarted: Vec<&str> = plan.restart_units.iter().map(String::as_str).collect();
            assert_eq!(restarted, units, "{case}");
            assert_eq!(plan.needs_repave(), repave, "{case}");
        }
    }

    #[test]
    fn labels_and_kubelet_table() {
        let k = |labels: &[(&str, &str)], args: &[(&str, &str)]| MachineTemplate {
            kubernetes: Some(KubernetesSpec {
                node_labels: labels
                    .iter()
                    .map(|(a, b)| ((*a).into(), (*b).into()))
                    .collect(),
                kubelet_extra_args: args
                    .iter()
                    .map(|(a, b)| ((*a).into(), (*b).into()))
                    .collect(),
                ..KubernetesSpec::default()
            }),
            ..MachineTemplate::default()
        };
        let plan = decide(
            &k(&[("tier", "a"), ("old", "x")], &[]),
            &k(&[("tier", "b"), ("new", "y")], &[]),
        );
        assert_eq!(
            plan.labels,
            Some(LabelChange {
                set: [("new".into(), "y".into()), ("tier".into(), "b".into())].into(),
                remove: vec!["old".into()],
            })
        );
        assert!(!plan.needs_repave() && !plan.has_agent_steps() && plan.has_node_steps());
        let plan = decide(&k(&[], &[("max-pods", "50")]), &k(&[], &[]));
        assert_eq!(plan.kubelet_args, Some(BTreeMap::new()));
        assert!(plan.restart_units.contains(KUBELET_UNIT));
        // No kubernetes section and an empty one are the same.
        assert_eq!(
            decide(&MachineTemplate::default(), &k(&[], &[])),
            ApplyPlan::default()
        );
    }

    #[test]
    fn agent_steps_table() {
        let cni = file(
            "/etc/cni/x.conf",
            "1",
            &["containerd.service", "kubelet.service"],
        );
        let cni2 = file(
            "/etc/cni/x.conf",
            "2",
            &["containerd.service", "kubelet.service"],
        );
        let motd = file("/etc/motd", "hi", &[]);
        let extra = file("/etc/extra", "e", &["containerd.service"]);
        let with = |files: Vec<FileSpec>, args: &[(&str, &str)]| MachineTemplate {
            files,
            kubernetes: Some(KubernetesSpec {
                kubelet_extra_args: args
                    .iter()
                    .map(|(a, b)| ((*a).into(), (*b).into()))
                    .collect(),
                ..KubernetesSpec::default()
            }),
            ..MachineTemplate::default()
        };
        let w = |f: &FileSpec| AgentStep::WriteFile(f.clone());
        let r = |u: &str| AgentStep::Restart(u.into());
        // (case, old, new, steps)
        let cases: Vec<(&str, MachineTemplate, MachineTemplate, Vec<AgentStep>)> = vec![
            (
                "nothing changed",
                with(vec![cni.clone()], &[]),
                with(vec![cni.clone()], &[]),
                vec![],
            ),
            (
                "two changed files share a unit: both written, then each unit once",
                with(vec![cni.clone()], &[]),
                with(vec![cni2.clone(), extra.clone(), motd.clone()], &[]),
                vec![
                    w(&cni2),
                    w(&extra),
                    w(&motd),
                    r("containerd.service"),
                    r("kubelet.service"),
                ],
            ),
            (
                "kubelet flags and a file naming kubelet: kubelet restarted once, after both",
                with(vec![cni.clone()], &[]),
                with(vec![cni2.clone()], &[("max-pods", "50")]),
                vec![
                    w(&cni2),
                    AgentStep::WriteKubeletFlags([("max-pods".to_owned(), "50".to_owned())].into()),
                    r("containerd.service"),
                    r("kubelet.service"),
                ],
            ),
            (
                "an unchanged file's units are not restarted",
                with(vec![cni.clone(), motd.clone()], &[]),
                with(vec![cni.clone(), file("/etc/motd", "bye", &[])], &[]),
                vec![w(&file("/etc/motd", "bye", &[]))],
            ),
        ];
        for (case, old, new, steps) in cases {
            assert_eq!(decide(&old, &new).agent_steps(), steps, "{case}");
        }
    }

    #[test]
    fn agent_apply_parameters() {
        let apply = AgentApply {
            configuration: "general".into(),
            from: 2,
            version: 3,
        };
        assert_eq!(
            AgentApply::from_parameters(&apply.to_parameters()),
            Ok(apply.clone())
        );
        assert_eq!(apply.target_version_name(), "general-v3");
        assert_eq!(apply.from_version_name(), "general-v2");
        let mut unknown = apply.to_parameters();
        unknown.insert("force".into(), "true".into());
        assert!(AgentApply::from_parameters(&unknown).is_err_and(|e| e.contains("\"force\"")));
        let mut bad = apply.to_parameters();
        bad.insert("from".into(), "0".into());
        assert!(AgentApply::from_parameters(&bad).is_err_and(|e| e.contains("from")));
        let mut missing = apply.to_parameters();
        missing.remove("configuration");
        assert!(AgentApply::from_parameters(&missing).is_err_and(|e| e.contains("configuration")));
    }

    mod agent_steps_properties {
        use super::*;
        use proptest::prelude::*;

        const UNITS: [&str; 4] = ["a.service", "b.service", "kubelet.service", "c.socket"];

        fn files() -> impl Strategy<Value = Vec<FileSpec>> {
            // Paths from a small set (so that old and new share some), unique per version.
            proptest::collection::btree_map(
                0..5u8,
                (
                    0..3u8,
                    proptest::option::of(0..2u8),
                    proptest::sample::subsequence(UNITS.to_vec(), 0..=3),
                ),
                0..5,
            )
            .prop_map(|m| {
                m.into_iter()
                    .map(|(p, (c, mode, units))| FileSpec {
                        path: format!("/etc/f{p}"),
                        content: format!("c{c}"),
                        mode: mode.map(|m| format!("06{m}4")),
                        restart_units: units.into_iter().map(str::to_owned).collect(),
                    })
                    .collect()
            })
        }

        fn template() -> impl Strategy<Value = MachineTemplate> {
            (files(), proptest::option::of(0..3u8)).prop_map(|(files, pods)| MachineTemplate {
                files,
                kubernetes: Some(KubernetesSpec {
                    kubelet_extra_args: pods
                        .map(|p| [("max-pods".to_owned(), p.to_string())].into())
                        .unwrap_or_default(),
                    ..KubernetesSpec::default()
                }),
                ..MachineTemplate::default()
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 512,
                rng_seed: proptest::test_runner::RngSeed::Fixed(28),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// Every changed or new file is written exactly once and nothing else is; every
            /// unit a changed file names (and kubelet, when its flags changed) is restarted
            /// exactly once, after every write; no unit is restarted for unchanged files only.
            #[test]
            fn writes_first_then_each_named_unit_once(old in template(), new in template()) {
                let steps = decide(&old, &new).agent_steps();
                let changed: Vec<&FileSpec> = new
                    .files
                    .iter()
                    .filter(|f| !old.files.iter().any(|o| o.path == f.path && o.content == f.content && o.mode == f.mode))
                    .collect();
                let written: Vec<&str> = steps.iter().filter_map(|s| match s {
                    AgentStep::WriteFile(f) => Some(f.path.as_str()),
                    _ => None,
                }).collect();
                let expected_written: Vec<&str> = changed.iter().map(|f| f.path.as_str()).collect();
                prop_assert_eq!(written, expected_written);
                let restarted: Vec<&str> = steps.iter().filter_map(|s| match s {
                    AgentStep::Restart(u) => Some(u.as_str()),
                    _ => None,
                }).collect();
                let unique: BTreeSet<&str> = restarted.iter().copied().collect();
                prop_assert_eq!(unique.len(), restarted.len(), "a unit restarted twice: {:?}", restarted);
                let kubelet_changed = old.kubernetes.as_ref().map(|k| &k.kubelet_extra_args)
                    != new.kubernetes.as_ref().map(|k| &k.kubelet_extra_args);
                let mut expected_units: BTreeSet<&str> = changed
                    .iter()
                    .flat_map(|f| f.restart_units.iter().map(String::as_str))
                    .collect();
                if kubelet_changed {
                    expected_units.insert(KUBELET_UNIT);
                }
                prop_assert_eq!(unique, expected_units);
                let flags_written = steps.iter().any(|s| matches!(s, AgentStep::WriteKubeletFlags(_)));
                prop_assert_eq!(flags_written, kubelet_changed);
                if let Some(first_restart) = steps.iter().position(|s| matches!(s, AgentStep::Restart(_))) {
                    prop_assert!(steps[first_restart..].iter().all(|s| matches!(s, AgentStep::Restart(_))));
                }
            }
        }
    }

    #[test]
    fn taints_after_keeps_what_the_configuration_did_not_set() {
        let t = |key: &str, effect: &str| Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        };
        let current = vec![
            t("node.kubernetes.io/unreachable", "NoExecute"),
            t("old", "NoSchedule"),
            t("kept", "NoSchedule"),
        ];
        let change = TaintChange {
            old: vec![t("old", "NoSchedule"), t("kept", "NoSchedule")],
            new: vec![t("kept", "NoSchedule"), t("new", "NoExecute")],
        };
        assert_eq!(
            taints_after(&current, &change),
            vec![
                t("node.kubernetes.io/unreachable", "NoExecute"),
                t("kept", "NoSchedule"),
                t("new", "NoExecute"),
            ]
        );
    }

    #[test]
    fn repave_reasons_are_described() {
        let plan = decide(
            &with_files(vec![file("/a", "1", &[])]),
            &MachineTemplate {
                kubernetes: Some(KubernetesSpec {
                    version: Some("v1.34.2".into()),
                    ..KubernetesSpec::default()
                }),
                ..MachineTemplate::default()
            },
        );
        assert_eq!(
            plan.repave_summary(),
            "kubernetes.version changed; file /a is no longer in the configuration"
        );
    }
}
