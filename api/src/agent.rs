//! What the agent, the bootserver (the credential issuer) and the controller agree on about
//! an agent's identity and access.
//!
//! - Every Machine that may run an agent gets a ServiceAccount named like the Machine in
//!   [`AGENT_NAMESPACE`], and a ClusterRole and ClusterRoleBinding named
//!   [`role_name`]`(machine)`, all owned by the Machine (garbage-collected with it) and kept
//!   up to date by the controller: the role lists, by `resourceNames`, exactly the Machine,
//!   its Node, the configuration versions it may read and the MachineOperations routed to it
//!   ([`AgentAccess::rules`]). Another machine's objects are not in it, so the API server
//!   refuses them.
//! - The agent learns which operations are routed to it by watching its own role
//!   ([`operations_in`]): the role is its inbox, and the moment an operation appears there
//!   it may also read it.
//! - The bootserver mints the ServiceAccount's tokens (TokenRequest, bounded expiry) and
//!   kubelet's bootstrap tokens (with `unbounded_runtime::tokens`), and hands them out over
//!   its HTTP API ([`CredentialRequest`], [`Credentials`]).

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde::{Deserialize, Serialize};

/// The namespace of the agents' ServiceAccounts (one per Machine, named like it).
pub const AGENT_NAMESPACE: &str = "unbounded-machines";

/// The username prefix of agents: `system:serviceaccount:<namespace>:`.
pub const AGENT_USER_PREFIX: &str = "system:serviceaccount:unbounded-machines:";

/// The group every bootstrap token of an Unbounded machine carries (besides
/// `system:bootstrappers`): what `deploy/rbac/node-bootstrap.yaml` binds.
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers:unbounded";

/// The label on a bootstrap token Secret: the Machine it was made for.
pub const BOOTSTRAP_MACHINE_LABEL: &str = "unbounded-cloud.io/machine";

/// Where a machine that is not network-booted (an Azure VM, a `manual` machine) finds the
/// credentials it starts with ([`Credentials`] as JSON); the agent takes them over and
/// removes the file.
pub const CREDENTIALS_FILE: &str = "/etc/unbounded/credentials.json";

/// The name of a Machine's agent ClusterRole and ClusterRoleBinding.
pub fn role_name(machine: &str) -> String {
    format!("unbounded-agent:{machine}")
}

/// The agent's username for a Machine.
pub fn agent_username(machine: &str) -> String {
    format!("{AGENT_USER_PREFIX}{machine}")
}

/// What one Machine's agent may touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentAccess {
    /// The Machine's name.
    pub machine: String,
    /// Its Node's name.
    pub node: String,
    /// MachineConfigurationVersions it may read (the one it records, the one it pins).
    pub versions: BTreeSet<String>,
    /// MachineOperations routed to it (running, or finished a short while ago).
    pub operations: BTreeSet<String>,
    /// The agent renews its own token through the TokenRequest API (machines without a
    /// bootserver: Azure VMs, `manual` machines); PXE machines renew through the bootserver,
    /// which checks their address.
    pub self_refresh: bool,
}

fn rule(resource: &str, verbs: &[&str], names: &BTreeSet<String>, core: bool) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![if core {
            String::new()
        } else {
            crate::well_known::GROUP.to_owned()
        }]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        resource_names: Some(names.iter().cloned().collect()),
        non_resource_urls: None,
    }
}

impl AgentAccess {
    /// The role's rules. Lists and watches are allowed by name (`fieldSelector
    /// metadata.name=…`); writes only to status subresources and to its own
    /// MachineInventory, and `delete` of its own Node
    /// (a repave removes the Node that the old kubelet re-registered, whose labels kubelet
    /// would never update). Empty sets give no rule.
    pub fn rules(&self) -> Vec<PolicyRule> {
        let one = |name: &str| BTreeSet::from([name.to_owned()]);
        let read = ["get", "list", "watch"];
        let mut rules = vec![
            rule("machines", &read, &one(&self.machine), false),
            rule(
                "machines/status",
                &["get", "patch"],
                &one(&self.machine),
                false,
            ),
            rule(
                "nodes",
                &["get", "list", "watch", "delete"],
                &one(&self.node),
                true,
            ),
            rule(
                "clusterroles",
                &read,
                &one(&role_name(&self.machine)),
                false,
            ),
        ];
        // clusterroles live in the RBAC group.
        if let Some(roles) = rules.last_mut() {
            roles.api_groups = Some(vec!["rbac.authorization.k8s.io".to_owned()]);
        }
        // Its own MachineInventory (the in-band facts; the admission policy keeps the
        // other sources' sections as they are). `create` by name works for the apply that
        // creates it (the API server checks it with the object's name).
        rules.push(rule(
            "machineinventories",
            &["get", "create", "patch", "update"],
            &one(&self.machine),
            false,
        ));
        if !self.versions.is_empty() {
            rules.push(rule(
                "machineconfigurationversions",
                &read,
                &self.versions,
                false,
            ));
        }
        if !self.operations.is_empty() {
            rules.push(rule("machineoperations", &read, &self.operations, false));
            rules.push(rule(
                "machineoperations/status",
                &["get", "patch"],
                &self.operations,
                false,
            ));
        }
        rules
    }
}

/// The rules of the namespaced Role (in [`AGENT_NAMESPACE`], named [`role_name`]) with
/// which an agent renews its own token: `create` on its own ServiceAccount's `token`
/// subresource, nothing else. Namespaced, so that it names one ServiceAccount only.
pub fn self_refresh_rules(machine: &str) -> Vec<PolicyRule> {
    vec![PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["serviceaccounts/token".to_owned()]),
        verbs: vec!["create".to_owned()],
        resource_names: Some(vec![machine.to_owned()]),
        non_resource_urls: None,
    }]
}

/// The MachineOperations a role lets its agent read: the agent's inbox.
pub fn operations_in(rules: &[PolicyRule]) -> BTreeSet<String> {
    rules
        .iter()
        .filter(|r| {
            r.resources
                .as_ref()
                .is_some_and(|res| res.iter().any(|x| x == "machineoperations"))
        })
        .flat_map(|r| r.resource_names.clone().unwrap_or_default())
        .collect()
}

/// What an agent asks the bootserver for (`POST /machines/<name>/credentials`). The first
/// request of a boot carries the nonce of that boot's iPXE script, or, where the bootserver
/// speaks TLS, only `ticket` (the script carried no secret: the bootserver holds this boot's
/// ticket, bound to the address it served the script to, and takes it over TLS only); later
/// ones authenticate with the current token (`Authorization: Bearer`).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialRequest {
    /// The one-time nonce from the kernel command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Also mint a bootstrap token for kubelet (a pave needs one).
    #[serde(default)]
    pub bootstrap_token: bool,
    /// Redeem this boot's ticket (TLS only; see above).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ticket: bool,
    /// A TPM-mode machine's proof that it holds its TPM: the activated challenge and a quote
    /// ([`crate::identity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<crate::identity::AttestationProof>,
}

impl std::fmt::Debug for CredentialRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialRequest")
            .field("nonce", &self.nonce.as_ref().map(|_| "<redacted>"))
            .field("bootstrap_token", &self.bootstrap_token)
            .field("ticket", &self.ticket)
            .field("attestation", &self.attestation)
            .finish()
    }
}

/// What the bootserver answers.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// The Machine's ServiceAccount token.
    pub token: String,
    /// When it expires (RFC 3339).
    pub expiration_timestamp: String,
    /// Its lifetime in seconds when issued (the agent refreshes at 70 % of it).
    pub lifetime_seconds: u64,
    /// The API server URL machines reach.
    pub server: String,
    /// The cluster's CA certificates (PEM).
    pub certificate_authority: String,
    /// A kubelet bootstrap token (`<id>.<secret>`), when one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token: Option<String>,
    /// The SHA-256 digests (hex) of the bootserver certificates the agent accepts from now
    /// on, beside the one its boot pinned: the current one and, during a rotation, the next
    /// (`http.tls.nextCertFile`). Empty over plain HTTP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_sha256: Vec<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &"<redacted>")
            .field("expiration_timestamp", &self.expiration_timestamp)
            .field("server", &self.server)
            .field(
                "bootstrap_token",
                &self.bootstrap_token.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_name_exactly_the_machines_objects() {
        let access = AgentAccess {
            machine: "m1".into(),
            node: "n1".into(),
            versions: BTreeSet::from(["general-v3".into()]),
            operations: BTreeSet::from(["reboot-m1".into(), "restart-kubelet".into()]),
            self_refresh: false,
        };
        let rules = access.rules();
        let names = |resource: &str| -> Vec<String> {
            rules
                .iter()
                .find(|r| r.resources.as_deref() == Some(&[resource.to_owned()][..]))
                .and_then(|r| r.resource_names.clone())
                .unwrap_or_default()
        };
        assert_eq!(names("machines"), ["m1"]);
        assert_eq!(names("nodes"), ["n1"]);
        let deletes: Vec<_> = rules
            .iter()
            .filter(|r| r.verbs.iter().any(|v| v == "delete"))
            .flat_map(|r| r.resources.clone().unwrap_or_default())
            .collect();
        assert_eq!(deletes, ["nodes"], "only its own Node may be deleted");
        assert_eq!(names("machineconfigurationversions"), ["general-v3"]);
        assert_eq!(names("clusterroles"), ["unbounded-agent:m1"]);
        assert_eq!(
            operations_in(&rules),
            BTreeSet::from(["reboot-m1".into(), "restart-kubelet".into()])
        );
        assert!(
            rules
                .iter()
                .all(|r| r.resource_names.as_ref().is_some_and(|n| !n.is_empty())),
            "every rule is by name"
        );
        assert!(
            rules
                .iter()
                .filter(|r| r.verbs.iter().any(|v| v == "patch"))
                .all(|r| r.resources.as_ref().is_some_and(|res| res
                    .iter()
                    .all(|x| x.ends_with("/status") || x == "machineinventories"))),
            "writes only to status and to its own inventory"
        );
        assert_eq!(names("machineinventories"), ["m1"]);
        let idle = AgentAccess {
            machine: "m1".into(),
            node: "m1".into(),
            ..Default::default()
        };
        let refresh = self_refresh_rules("m1");
        assert_eq!(refresh.len(), 1);
        assert_eq!(
            refresh[0].resource_names.as_deref(),
            Some(&["m1".to_owned()][..])
        );
        assert_eq!(refresh[0].verbs, ["create"]);
        assert!(operations_in(&idle.rules()).is_empty());
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        let credentials = Credentials {
            token: "eyJhbGciOi.secret".into(),
            expiration_timestamp: "2026-01-01T00:00:00Z".into(),
            lifetime_seconds: 3600,
            server: "https://10.99.0.1:6443".into(),
            certificate_authority: String::new(),
            bootstrap_token: Some("abcdef.0123456789abcdef".into()),
            tls_sha256: Vec::new(),
        };
        let text = format!("{credentials:?}");
        assert!(
            !text.contains("secret") && !text.contains("0123456789abcdef"),
            "{text}"
        );
        let request = CredentialRequest {
            nonce: Some("00112233".into()),
            bootstrap_token: true,
            ticket: false,
            attestation: Some(crate::identity::AttestationProof {
                secret: "feedface".into(),
                ..Default::default()
            }),
        };
        assert!(!format!("{request:?}").contains("0011"));
        assert!(!format!("{request:?}").contains("feedface"));
    }
}
