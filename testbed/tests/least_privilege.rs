//! What each identity `deploy/` creates may and may not do, asked of the real API server
//! (`kubectl auth can-i --as=system:serviceaccount:…` after `deploy/`'s namespaces, RBAC and
//! admission policies are applied), and the admission policies that narrow what RBAC cannot
//! (the controller's ClusterRole writes) tried for real by impersonation. The table in
//! docs/security.md is this test's output: `UNBOUNDED_WRITE_DOCS=1` rewrites it, otherwise
//! a difference fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::path::Path;

use unbounded_testbed::cluster::{LocalControlPlane, deploy_dir};

const BOOTSERVER: &str = "system:serviceaccount:unbounded-system:unbounded-bootserver";
const CONTROLLER: &str = "system:serviceaccount:unbounded-system:unbounded-controller";
const AZURE: &str = "system:serviceaccount:unbounded-system:unbounded-azure";

/// One question: who, which verb on what (`resource` or `resource/name`), in which
/// namespace (empty: cluster-wide), and the answer `deploy/` must give.
struct Ask {
    who: &'static str,
    verb: &'static str,
    what: &'static str,
    namespace: &'static str,
    allowed: bool,
    why: &'static str,
}

const fn ask(
    who: &'static str,
    verb: &'static str,
    what: &'static str,
    namespace: &'static str,
    allowed: bool,
    why: &'static str,
) -> Ask {
    Ask {
        who,
        verb,
        what,
        namespace,
        allowed,
        why,
    }
}

const TABLE: &[Ask] = &[
    ask(
        BOOTSERVER,
        "get",
        "secrets",
        "unbounded-bmc",
        true,
        "BMC credentials named by Machines",
    ),
    ask(
        BOOTSERVER,
        "get",
        "secrets",
        "unbounded-system",
        false,
        "no Azure service principal, no TLS key",
    ),
    ask(
        BOOTSERVER,
        "list",
        "secrets",
        "kube-system",
        false,
        "no Secret of the cluster's own",
    ),
    ask(
        BOOTSERVER,
        "create",
        "secrets",
        "kube-system",
        true,
        "bootstrap tokens only (policy unbounded-bootserver-bootstrap-tokens)",
    ),
    ask(
        BOOTSERVER,
        "create",
        "serviceaccounts/token",
        "unbounded-machines",
        true,
        "agents' tokens",
    ),
    ask(
        BOOTSERVER,
        "create",
        "serviceaccounts/token",
        "unbounded-system",
        false,
        "never its own or the controller's",
    ),
    ask(
        BOOTSERVER,
        "patch",
        "machines",
        "",
        true,
        "finalizer, hardware labels, an EK on first use (policy unbounded-bootserver-writes)",
    ),
    ask(
        BOOTSERVER,
        "delete",
        "machines",
        "",
        false,
        "an operator's decision",
    ),
    ask(
        BOOTSERVER,
        "patch",
        "machines/status",
        "",
        true,
        "power, addresses, TPMAttested",
    ),
    ask(
        BOOTSERVER,
        "delete",
        "nodes",
        "",
        false,
        "the controller's and the agent's",
    ),
    ask(
        BOOTSERVER,
        "create",
        "clusterroles",
        "",
        false,
        "no RBAC of its own making",
    ),
    ask(
        BOOTSERVER,
        "create",
        "pods",
        "unbounded-system",
        false,
        "no workloads",
    ),
    ask(
        CONTROLLER,
        "create",
        "clusterroles",
        "",
        true,
        "agent roles only (policy unbounded-controller-rbac-writes)",
    ),
    ask(
        CONTROLLER,
        "escalate",
        "clusterroles",
        "",
        false,
        "no role beyond its own rights",
    ),
    ask(
        CONTROLLER,
        "bind",
        "clusterroles",
        "",
        false,
        "no binding to a role it does not hold",
    ),
    ask(
        CONTROLLER,
        "get",
        "secrets",
        "unbounded-system",
        false,
        "no BMC or Azure credential",
    ),
    ask(
        CONTROLLER,
        "create",
        "serviceaccounts/token",
        "unbounded-machines",
        true,
        "held because it grants it to self-renewing agents (RBAC's escalation check); it mints none",
    ),
    ask(
        CONTROLLER,
        "patch",
        "machines/status",
        "",
        true,
        "phase, configuration, conditions",
    ),
    ask(
        CONTROLLER,
        "create",
        "pods",
        "unbounded-system",
        false,
        "no workloads",
    ),
    ask(
        AZURE,
        "get",
        "secrets",
        "unbounded-system",
        true,
        "the Azure credentials",
    ),
    ask(AZURE, "create", "clusterroles", "", false, "no RBAC"),
    ask(
        AZURE,
        "patch",
        "machines/status",
        "",
        true,
        "power, addresses, InfrastructureReady",
    ),
    ask(
        AZURE,
        "create",
        "serviceaccounts/token",
        "unbounded-machines",
        true,
        "an Azure VM's first token, in its custom data",
    ),
];

fn short(who: &str) -> &str {
    who.rsplit(':').next().unwrap_or(who)
}

fn can_i(cp: &LocalControlPlane, ask: &Ask) -> bool {
    let mut command = cp.kubectl();
    // `resource/sub` is a subresource (`resource/name` would name one object).
    let (resource, subresource) = ask.what.split_once('/').unwrap_or((ask.what, ""));
    command.args(["auth", "can-i", ask.verb, resource, "--as", ask.who]);
    if !subresource.is_empty() {
        command.arg(format!("--subresource={subresource}"));
    }
    if ask.namespace.is_empty() {
        command.arg("--all-namespaces=false");
    } else {
        command.args(["-n", ask.namespace]);
    }
    let out = command.output().unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl auth can-i {} {}: {answer} {}",
        ask.verb,
        ask.what,
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

fn apply(cp: &LocalControlPlane, path: &Path) {
    let out = cp
        .kubectl()
        .args(["apply", "--server-side", "-f"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "apply {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `kubectl create -f -` with `yaml` as `who`; its error output when refused.
fn create_as(cp: &LocalControlPlane, who: &str, yaml: &str) -> Result<(), String> {
    let out = cp
        .kubectl_with_input(&["create", "--as", who, "-f", "-"], Some(yaml))
        .map_err(|e| e.to_string())?;
    drop(out);
    Ok(())
}

const TABLE_START: &str = "<!-- can-i table: written by testbed/tests/least_privilege.rs -->";
const TABLE_END: &str = "<!-- end of the can-i table -->";

#[test]
fn each_identity_can_do_what_it_needs_and_nothing_named_here_beyond() {
    let cp = LocalControlPlane::shared().expect("control plane");
    let deploy = deploy_dir();
    apply(cp, &deploy.join("namespace.yaml"));
    apply(cp, &deploy.join("rbac"));
    apply(cp, &deploy.join("policies"));

    let mut rows = vec![
        "| identity | may | on | in | answer | why |".to_owned(),
        "|---|---|---|---|---|---|".to_owned(),
    ];
    let mut wrong = Vec::new();
    for ask in TABLE {
        let allowed = can_i(cp, ask);
        if allowed != ask.allowed {
            wrong.push(format!(
                "{} {} {} in {:?}: {allowed}, want {}",
                short(ask.who),
                ask.verb,
                ask.what,
                ask.namespace,
                ask.allowed
            ));
        }
        rows.push(format!(
            "| {} | {} | {} | {} | {} | {} |",
            short(ask.who),
            ask.verb,
            ask.what,
            if ask.namespace.is_empty() {
                "cluster"
            } else {
                ask.namespace
            },
            if allowed { "yes" } else { "no" },
            ask.why
        ));
    }
    assert!(
        wrong.is_empty(),
        "deploy/'s RBAC answers:\n{}",
        wrong.join("\n")
    );

    // What RBAC cannot say, the controller's policy does: only agent roles and bindings.
    let refused = create_as(
        cp,
        CONTROLLER,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: lp-not-an-agent-role}\nrules: []\n",
    )
    .expect_err("a ClusterRole that is no agent's");
    assert!(refused.contains("only agent roles"), "{refused}");
    create_as(
        cp,
        CONTROLLER,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: 'unbounded-agent:lp-m'}\nrules: []\n",
    )
    .expect("an agent role");
    let refused = create_as(
        cp,
        CONTROLLER,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: 'unbounded-agent:lp-m'}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'unbounded-agent:lp-m'}\n\
         subjects: [{kind: ServiceAccount, name: unbounded-controller, namespace: unbounded-system}]\n",
    )
    .expect_err("an agent binding to another subject");
    assert!(refused.contains("unbounded-machines only"), "{refused}");
    create_as(
        cp,
        CONTROLLER,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: 'unbounded-agent:lp-m'}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'unbounded-agent:lp-m'}\n\
         subjects: [{kind: ServiceAccount, name: lp-m, namespace: unbounded-machines}]\n",
    )
    .expect("the agent's own binding");
    for kind in ["clusterrolebinding", "clusterrole"] {
        let _ = cp
            .kubectl()
            .args(["delete", kind, "unbounded-agent:lp-m"])
            .output();
    }

    // The table in docs/security.md is this run's.
    let table = rows.join("\n");
    let doc_path = deploy.join("../docs/security.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let (Some(start), Some(end)) = (doc.find(TABLE_START), doc.find(TABLE_END)) else {
        panic!("docs/security.md has no can-i table markers");
    };
    let written = doc[start + TABLE_START.len()..end].trim();
    if written != table {
        if std::env::var_os("UNBOUNDED_WRITE_DOCS").is_some() {
            let new = format!("{}{TABLE_START}\n{table}\n{}", &doc[..start], &doc[end..]);
            std::fs::write(&doc_path, new).unwrap();
        } else {
            panic!(
                "docs/security.md's can-i table is not this run's (UNBOUNDED_WRITE_DOCS=1 rewrites it):\n{table}"
            );
        }
    }
}

/// Runs `kubectl patch machine <name> --type merge -p <patch>` as `who`; its error output when
/// refused.
fn patch_as(cp: &LocalControlPlane, who: &str, name: &str, patch: &str) -> Result<(), String> {
    let out = cp
        .kubectl()
        .args([
            "patch", "machine", name, "--type", "merge", "-p", patch, "--as", who,
        ])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// RBAC lets the bootserver patch any Machine; the policy `unbounded-bootserver-writes`
/// narrows it to what it writes. Each rule is shown by a write only it refuses, beside the
/// bootserver's own writes, which go through (with the policy gone, every refusal below
/// would be a success: RBAC allows them all).
#[test]
fn the_bootserver_may_change_on_machines_only_what_it_writes() {
    let cp = LocalControlPlane::shared().expect("control plane");
    let deploy = deploy_dir();
    apply(cp, &deploy.join("namespace.yaml"));
    apply(cp, &deploy.join("rbac"));
    apply(cp, &deploy.join("policies"));
    cp.kubectl_with_input(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {name: lp-pxe, labels: {team: a, hardware.unbounded-cloud.io/cpus: "4"}}
spec:
  provider: pxe
  configurationRef: {name: lp-config}
  pxe:
    macAddresses: ["52:54:00:1f:00:01"]
    bmc: {address: "redfish://10.0.0.9", credentialsSecretRef: {namespace: unbounded-system, name: lp-bmc}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {name: lp-waiting, labels: {unbounded-cloud.io/discovery: waiting}}
spec:
  provider: pxe
  pxe: {macAddresses: ["52:54:00:1f:00:02"]}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {name: lp-manual}
spec: {provider: manual}
"#,
        ),
    )
    .unwrap();
    let ok = |name: &str, patch: &str| {
        patch_as(cp, BOOTSERVER, name, patch)
            .unwrap_or_else(|e| panic!("the bootserver's own write {patch} on {name}: {e}"));
    };
    let refused = |name: &str, patch: &str, words: &str| match patch_as(cp, BOOTSERVER, name, patch)
    {
        Ok(()) => panic!("{patch} on {name}: the policy let it through"),
        Err(e) => assert!(
            e.contains(words),
            "{patch} on {name}: refused, but not by that rule: {e}"
        ),
    };
    // What it writes.
    ok(
        "lp-pxe",
        r#"{"metadata":{"finalizers":["unbounded-cloud.io/pxe-provider"]}}"#,
    );
    ok(
        "lp-pxe",
        r#"{"spec":{"providerID":"pxe://52:54:00:1f:00:01"}}"#,
    );
    ok(
        "lp-pxe",
        r#"{"spec":{"pxe":{"identity":{"endorsementKey":"000b0000000000000000000000000000000000000000000000000000000000000001"}}}}"#,
    );
    ok(
        "lp-pxe",
        r#"{"metadata":{"labels":{"hardware.unbounded-cloud.io/cpus":"8","hardware.unbounded-cloud.io/disputed":"true"}}}"#,
    );
    ok(
        "lp-waiting",
        r#"{"spec":{"pxe":{"macAddresses":["52:54:00:1f:00:02","52:54:00:1f:00:03"]}}}"#,
    );
    create_as(
        cp,
        BOOTSERVER,
        "apiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {name: lp-discovered, labels: {unbounded-cloud.io/discovery: waiting}}\nspec: {provider: pxe, pxe: {macAddresses: [\"52:54:00:1f:00:04\"]}}\n",
    )
    .expect("a waiting discovered Machine");
    // What it may not.
    let created = create_as(
        cp,
        BOOTSERVER,
        "apiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {name: lp-made-up, labels: {unbounded-cloud.io/discovery: waiting}}\nspec: {provider: pxe, configurationRef: {name: lp-config}, pxe: {macAddresses: [\"52:54:00:1f:00:05\"]}}\n",
    );
    assert!(
        created
            .as_ref()
            .is_err_and(|e| e.contains("only waiting discovered")),
        "{created:?}"
    );
    refused(
        "lp-manual",
        r#"{"metadata":{"labels":{"x":"y"}}}"#,
        "only PXE Machines",
    );
    refused(
        "lp-pxe",
        r#"{"spec":{"configurationRef":{"name":"other"}}}"#,
        "may not change a Machine's configurationRef",
    );
    refused(
        "lp-pxe",
        r#"{"spec":{"pxe":{"bmc":{"address":"redfish://10.0.0.66"}}}}"#,
        "may not change a Machine's configurationRef",
    );
    refused(
        "lp-pxe",
        r#"{"spec":{"pxe":{"identity":{"endorsementKey":"000b0000000000000000000000000000000000000000000000000000000000000002"}}}}"#,
        "only on first use",
    );
    refused(
        "lp-pxe",
        r#"{"spec":{"pxe":{"macAddresses":["52:54:00:1f:00:66"]}}}"#,
        "only of a waiting discovered Machine",
    );
    refused(
        "lp-pxe",
        r#"{"metadata":{"labels":{"team":"b"}}}"#,
        "only hardware.unbounded-cloud.io/ labels",
    );
    refused(
        "lp-waiting",
        r#"{"metadata":{"labels":{"unbounded-cloud.io/discovery":"claimed"}}}"#,
        "only hardware.unbounded-cloud.io/ labels",
    );
    refused(
        "lp-pxe",
        r#"{"metadata":{"annotations":{"unbounded-cloud.io/repave":"2026-01-01T00:00:00Z"}}}"#,
        "annotations or owners",
    );
    refused(
        "lp-pxe",
        r#"{"metadata":{"finalizers":["unbounded-cloud.io/pxe-provider","unbounded-cloud.io/machine"]}}"#,
        "only its own finalizer",
    );
    for name in ["lp-pxe", "lp-waiting", "lp-manual", "lp-discovered"] {
        let _ = cp
            .kubectl()
            .args([
                "patch",
                "machine",
                name,
                "--type",
                "merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ])
            .output();
        let _ = cp
            .kubectl()
            .args(["delete", "machine", name, "--wait=false"])
            .output();
    }
}
