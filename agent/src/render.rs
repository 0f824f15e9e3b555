//! The files a pave writes, rendered from plain data: the container's `.nspawn` settings and
//! kubelet's configuration, flags and bootstrap kubeconfig. The node image is the contract
//! on the other side: its `kubelet.service` reads `/etc/unbounded/kubelet.env`
//! (`KUBELET_ARGS`), `/etc/unbounded/kubelet-config.yaml` and
//! `/etc/unbounded/bootstrap-kubeconfig` (see `images/node/`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Taint;
use unbounded_api::{BindMount, NspawnNetwork, NspawnSpec};

/// Where kubelet's files live inside the container.
pub const KUBELET_ENV: &str = "/etc/unbounded/kubelet.env";
/// kubelet's configuration file.
pub const KUBELET_CONFIG: &str = "/etc/unbounded/kubelet-config.yaml";
/// kubelet's bootstrap kubeconfig.
pub const BOOTSTRAP_KUBECONFIG: &str = "/etc/unbounded/bootstrap-kubeconfig";
/// The cluster's CA certificate.
pub const CA_FILE: &str = "/etc/unbounded/ca.crt";
/// Inside the container, where its system bus socket is (bound to a host directory so that
/// the agent can reach the container's systemd for `restartService`).
pub const CONTAINER_BUS_DIR: &str = "/run/dbus";

/// Why a configuration cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A kubelet flag or value that cannot be passed safely.
    #[error("kubeletExtraArgs {0:?}: {1}")]
    Flag(String, &'static str),
    /// A bind mount that cannot be expressed.
    #[error("bind mount {0:?}: {1}")]
    Bind(String, &'static str),
}

/// Flags the agent sets itself; a configuration may not override them.
const RESERVED_FLAGS: [&str; 5] = [
    "config",
    "kubeconfig",
    "bootstrap-kubeconfig",
    "hostname-override",
    "node-labels",
];

/// The `.nspawn` settings of the node container. `bus_dir` is the host directory bound over
/// the container's `/run/dbus`; `log_dir` the agent's log directory, shown read-only at
/// [`crate::log_file::CONTAINER_LOG_DIR`] (kubelet serves it: `kubectl unbounded logs`).
pub fn nspawn_settings(
    spec: Option<&NspawnSpec>,
    bus_dir: &str,
    log_dir: &str,
) -> Result<String, RenderError> {
    let mut out = String::from(
        "# Written by unbounded-agent; replaced on every pave.\n\
         [Exec]\n\
         Boot=yes\n\
         # kubelet's OOM watcher and /dev/kmsg need the host's user namespace.\n\
         PrivateUsers=no\n\
         Capability=all\n\
         # runc's session keyring and cgroup device filters (BPF).\n\
         SystemCallFilter=@keyring bpf\n\
         ResolvConf=off\n\
         \n\
         [Files]\n\
         Bind=/dev/kmsg\n\
         BindReadOnly=/lib/modules\n",
    );
    let _ = writeln!(out, "Bind={bus_dir}:{CONTAINER_BUS_DIR}");
    let _ = writeln!(
        out,
        "BindReadOnly={log_dir}:{}",
        crate::log_file::CONTAINER_LOG_DIR
    );
    for mount in spec.map(|s| s.bind_mounts.as_slice()).unwrap_or_default() {
        let _ = writeln!(out, "{}", bind_line(mount)?);
    }
    let private = spec.and_then(|s| s.network) == Some(NspawnNetwork::Private);
    out.push_str("\n[Network]\n");
    if private {
        out.push_str("Private=yes\nVirtualEthernet=yes\n");
    } else {
        out.push_str("Private=no\nVirtualEthernet=no\n");
    }
    Ok(out)
}

fn bind_line(mount: &BindMount) -> Result<String, RenderError> {
    let target = mount.target.as_deref().unwrap_or(&mount.source);
    for path in [mount.source.as_str(), target] {
        if !path.starts_with('/')
            || path.split('/').any(|c| c == "..")
            || path
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == ':')
        {
            return Err(RenderError::Bind(
                path.to_owned(),
                "must be absolute, without '..', ':' or whitespace",
            ));
        }
    }
    let key = if mount.read_only {
        "BindReadOnly"
    } else {
        "Bind"
    };
    Ok(format!("{key}={}:{target}", mount.source))
}

/// What kubelet's files are made from.
#[derive(Debug, Clone)]
pub struct KubeletInput<'a> {
    /// The Node name.
    pub node_name: &'a str,
    /// The API server URL the machine reaches.
    pub server: &'a str,
    /// The bootstrap token (`<id>.<secret>`).
    pub bootstrap_token: &'a str,
    /// `spec.providerID` of the Machine, if set.
    pub provider_id: Option<&'a str>,
    /// Node labels from the configuration.
    pub labels: &'a BTreeMap<String, String>,
    /// Node taints from the configuration.
    pub taints: &'a [Taint],
    /// Extra kubelet flags (without `--`).
    pub extra_args: &'a BTreeMap<String, String>,
    /// The Node's address (`--node-ip`, see [`crate::node_address`]), unless `extra_args`
    /// names one.
    pub node_ip: Option<crate::node_address::NodeIps>,
}

/// Label prefixes under `kubernetes.io` and `k8s.io` that a kubelet may set on its own Node
/// (the NodeRestriction admission plugin's list; kubelet refuses to start with others).
const KUBELET_LABEL_PREFIXES: [&str; 3] = [
    "kubelet.kubernetes.io/",
    "node.kubernetes.io/",
    "beta.kubernetes.io/",
];
const KUBELET_LABELS: [&str; 8] = [
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "node.kubernetes.io/instance-type",
];

/// Whether kubelet may register its Node with this label. Others (such as
/// `node-role.kubernetes.io/worker`) are applied to the Node by the controller.
pub fn kubelet_may_set_label(key: &str) -> bool {
    let (prefix, _) = key.rsplit_once('/').unwrap_or(("", key));
    let restricted_domain = prefix == "kubernetes.io"
        || prefix.ends_with(".kubernetes.io")
        || prefix == "k8s.io"
        || prefix.ends_with(".k8s.io");
    !restricted_domain
        || KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_PREFIXES.iter().any(|p| key.starts_with(p))
}

fn safe_token(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '"' | '\'' | '\\' | '$' | '`')
        })
}

/// kubelet's environment file (`KUBELET_ARGS`).
pub fn kubelet_env(input: &KubeletInput<'_>) -> Result<String, RenderError> {
    let mut args = vec![format!("--hostname-override={}", input.node_name)];
    let labels: Vec<String> = input
        .labels
        .iter()
        .filter(|(k, _)| kubelet_may_set_label(k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !labels.is_empty() {
        let joined = labels.join(",");
        if !safe_token(&joined) {
            return Err(RenderError::Flag(
                "node-labels".into(),
                "labels contain unsafe characters",
            ));
        }
        args.push(format!("--node-labels={joined}"));
    }
    if let Some(ip) = input.node_ip
        && !input.extra_args.contains_key("node-ip")
    {
        args.push(format!("--node-ip={ip}"));
    }
    for (flag, value) in input.extra_args {
        let name_ok = flag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !flag.is_empty()
            && !flag.starts_with('-');
        if !name_ok {
            return Err(RenderError::Flag(
                flag.clone(),
                "flag names are lower-case words joined by '-', without leading dashes",
            ));
        }
        if RESERVED_FLAGS.contains(&flag.as_str()) {
            return Err(RenderError::Flag(
                flag.clone(),
                "set by the agent; use nodeLabels for labels",
            ));
        }
        if !value.is_empty() && !safe_token(value) {
            return Err(RenderError::Flag(
                flag.clone(),
                "values may not contain whitespace, quotes, '\\', '$' or '`'",
            ));
        }
        args.push(if value.is_empty() {
            format!("--{flag}")
        } else {
            format!("--{flag}={value}")
        });
    }
    Ok(format!(
        "# Written by unbounded-agent from the MachineConfigurationVersion.\nKUBELET_ARGS=\"{}\"\n",
        args.join(" ")
    ))
}

fn yaml_string(s: &str) -> String {
    // JSON strings are valid YAML scalars, with every character escaped as needed.
    serde_json::Value::String(s.to_owned()).to_string()
}

/// kubelet's configuration (KubeletConfiguration v1beta1).
pub fn kubelet_config(input: &KubeletInput<'_>) -> String {
    let mut out = String::from(
        "# Written by unbounded-agent.\n\
         apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         cgroupDriver: systemd\n\
         containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
         rotateCertificates: true\n\
         failSwapOn: false\n\
         nodeStatusUpdateFrequency: 4s\n\
         authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\n",
    );
    let _ = writeln!(out, "  x509:\n    clientCAFile: {CA_FILE}");
    out.push_str("authorization:\n  mode: Webhook\n");
    if let Some(id) = input.provider_id {
        let _ = writeln!(out, "providerID: {}", yaml_string(id));
    }
    if !input.taints.is_empty() {
        out.push_str("registerWithTaints:\n");
        for taint in input.taints {
            let _ = writeln!(out, "  - key: {}", yaml_string(&taint.key));
            if let Some(value) = &taint.value {
                let _ = writeln!(out, "    value: {}", yaml_string(value));
            }
            let _ = writeln!(out, "    effect: {}", yaml_string(&taint.effect));
        }
    }
    out
}

/// kubelet's bootstrap kubeconfig: the bootstrap token it exchanges for a client
/// certificate (TLS bootstrapping, signed by kube-controller-manager).
pub fn bootstrap_kubeconfig(input: &KubeletInput<'_>) -> String {
    format!(
        "# Written by unbounded-agent: a per-machine bootstrap token with an expiry.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: unbounded\n  cluster:\n    server: {server}\n    certificate-authority: {CA_FILE}\n\
         users:\n\
         - name: kubelet-bootstrap\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: default\n  context:\n    cluster: unbounded\n    user: kubelet-bootstrap\n\
         current-context: default\n",
        server = yaml_string(input.server),
        token = yaml_string(input.bootstrap_token),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(
        labels: &'a BTreeMap<String, String>,
        taints: &'a [Taint],
        extra: &'a BTreeMap<String, String>,
    ) -> KubeletInput<'a> {
        KubeletInput {
            node_name: "node-1",
            server: "https://10.99.0.1:6443",
            bootstrap_token: "abcdef.0123456789abcdef",
            provider_id: Some("pxe://52:54:00:00:00:01"),
            labels,
            taints,
            extra_args: extra,
            node_ip: None,
        }
    }

    #[test]
    fn nspawn_settings_host_network_and_binds() {
        let spec = NspawnSpec {
            bind_mounts: vec![BindMount {
                source: "/srv/data".into(),
                target: Some("/data".into()),
                read_only: true,
            }],
            network: None,
        };
        let text = nspawn_settings(
            Some(&spec),
            "/run/unbounded/bus/node-1",
            "/var/log/unbounded",
        )
        .unwrap();
        for line in [
            "Boot=yes",
            "PrivateUsers=no",
            "SystemCallFilter=@keyring bpf",
            "Bind=/dev/kmsg",
            "Bind=/run/unbounded/bus/node-1:/run/dbus",
            "BindReadOnly=/var/log/unbounded:/var/log/unbounded",
            "BindReadOnly=/srv/data:/data",
            "Private=no",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let hostile = NspawnSpec {
            bind_mounts: vec![BindMount {
                source: "/srv:/etc".into(),
                target: None,
                read_only: false,
            }],
            network: Some(NspawnNetwork::Private),
        };
        assert!(nspawn_settings(Some(&hostile), "/b", "/l").is_err());
    }

    #[test]
    fn labels_kubelet_may_set() {
        let cases = [
            ("example.com/rack", true),
            ("rack", true),
            ("kubernetes.io/hostname", true),
            (
                "node.kubernetes.io/exclude-from-external-load-balancers",
                true,
            ),
            ("node-role.kubernetes.io/worker", false),
            ("k8s.io/anything", false),
            ("sub.k8s.io/anything", false),
            ("topology.kubernetes.io/zone", true),
        ];
        for (key, expected) in cases {
            assert_eq!(kubelet_may_set_label(key), expected, "{key}");
        }
    }

    #[test]
    fn kubelet_flags_from_the_configuration() {
        let labels = BTreeMap::from([
            ("rack".to_owned(), "r1".to_owned()),
            ("node-role.kubernetes.io/worker".to_owned(), String::new()),
        ]);
        let extra = BTreeMap::from([
            ("max-pods".to_owned(), "50".to_owned()),
            ("v".to_owned(), "2".to_owned()),
        ]);
        let env = kubelet_env(&input(&labels, &[], &extra)).unwrap();
        assert_eq!(
            env.lines().last().unwrap(),
            "KUBELET_ARGS=\"--hostname-override=node-1 --node-labels=rack=r1 --max-pods=50 --v=2\""
        );
        // The agent's address toward the API server, unless the configuration names one.
        let node_ip = Some(crate::node_address::NodeIps::single(
            std::net::IpAddr::from([10, 99, 0, 21]),
        ));
        let env = kubelet_env(&KubeletInput {
            node_ip,
            ..input(&labels, &[], &extra)
        })
        .unwrap();
        assert!(
            env.contains("--node-labels=rack=r1 --node-ip=10.99.0.21 --max-pods=50"),
            "{env}"
        );
        let theirs = BTreeMap::from([("node-ip".to_owned(), "192.0.2.7".to_owned())]);
        let env = kubelet_env(&KubeletInput {
            node_ip,
            ..input(&labels, &[], &theirs)
        })
        .unwrap();
        assert!(env.contains("--node-ip=192.0.2.7\""), "{env}");
        assert!(!env.contains("10.99.0.21"), "{env}");
        for (flag, value) in [
            ("config", "/etc/x"),
            ("Max-Pods", "1"),
            ("--v", "1"),
            ("max-pods", "5 --anonymous-auth=true"),
            ("max-pods", "$(reboot)"),
        ] {
            let extra = BTreeMap::from([(flag.to_owned(), value.to_owned())]);
            assert!(
                kubelet_env(&input(&labels, &[], &extra)).is_err(),
                "{flag}={value}"
            );
        }
    }

    #[test]
    fn kubelet_config_with_taints_and_provider_id() {
        let taints = [Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        let empty = BTreeMap::new();
        let config = kubelet_config(&input(&empty, &taints, &empty));
        assert!(config.contains("cgroupDriver: systemd"));
        assert!(config.contains("nodeStatusUpdateFrequency: 4s\n"));
        assert!(config.contains("providerID: \"pxe://52:54:00:00:00:01\""));
        assert!(config.contains(
            "registerWithTaints:\n  - key: \"dedicated\"\n    value: \"gpu\"\n    effect: \"NoSchedule\"\n"
        ));
        let kubeconfig = bootstrap_kubeconfig(&input(&empty, &taints, &empty));
        assert!(kubeconfig.contains("token: \"abcdef.0123456789abcdef\""));
        assert!(kubeconfig.contains("server: \"https://10.99.0.1:6443\""));
    }
}
