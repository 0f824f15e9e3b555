//! What the lab's parts and the appliance share: the provisioning bridge's fixed facts, the
//! lab's error, kubectl against the local control plane and ServiceAccount kubeconfigs.
//! It imports nothing of the lab's own, so that those parts need not import the lab.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::LocalControlPlane;
use crate::failure::Failure;

/// The bootserver's (and the API server's, for the VMs) address on the provisioning bridge.
pub const LAB_ADDRESS: &str = "10.99.0.1";
/// The bootserver's and the API server's IPv6 address on the provisioning bridge, in a lab
/// whose machines provision over IPv6 only ([`Provisioning::Ipv6Only`]).
pub const LAB_ADDRESS6: &str = "fd00:99::1";
/// The provisioning bridge's IPv6 prefix.
pub const LAB_PREFIX6: &str = "fd00:99::/64";
/// Which family the lab's machines provision over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provisioning {
    /// DHCPv4, PXE and iPXE over IPv4; BIOS and UEFI machines alternate (the default).
    #[default]
    Ipv4,
    /// DHCPv6 only (the bootserver's DHCPv4 is off): UEFI machines boot by PXE over IPv6
    /// and the Node registers with its IPv6 address. BIOS machines cannot: iPXE's BIOS
    /// build has no IPv6. The BMC emulators stay on IPv4: they are the management network,
    /// not the machines' provisioning network.
    Ipv6Only,
    /// Both: the machines boot over IPv4 as in [`Provisioning::Ipv4`], and the bootserver's
    /// DHCPv6 also gives each its reserved IPv6 address, which the host OS takes; the Node
    /// registers with both (the API server's family, IPv4, first).
    DualStack,
}
/// The API server's port as the VMs reach it.
pub const LAB_API_PORT: u16 = 6443;
/// The label every lab Machine carries (the configuration selects by it).
pub const LAB_LABEL: &str = "unbounded-cloud.io/testbed";
/// Errors of the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A step failed.
    #[error("{0}")]
    Step(String),
    /// A step failed on another error, which it keeps.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A machine did not reach a stage in time.
    #[error(
        "{machine} did not reach {stage} within {seconds} s (last: {last}); console tail:\n{console}\n{logs}"
    )]
    Timeout {
        /// The machine.
        machine: String,
        /// The stage waited for.
        stage: &'static str,
        /// How long.
        seconds: u64,
        /// The last stage it reached.
        last: &'static str,
        /// The tail of its serial console.
        console: String,
        /// Tails of the components' logs.
        logs: String,
    },
}

pub(crate) fn step(message: impl Into<String>) -> LabError {
    LabError::Step(message.into())
}

pub(crate) fn kubectl(
    plane: &LocalControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, LabError> {
    run_kubectl(plane.kubectl(), args, stdin)
}

pub(crate) fn run_kubectl(
    command: Command,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, LabError> {
    crate::cluster::run_kubectl(command, args, stdin).map_err(|e| Failure::of(e).into())
}

/// A kubeconfig for a ServiceAccount of `unbounded-system`, with a token that does not
/// expire while the lab runs (a ServiceAccount token Secret, filled by the token controller).
pub(crate) fn service_account_kubeconfig(
    plane: &LocalControlPlane,
    account: &str,
    server: &str,
    ca: &Path,
) -> Result<String, LabError> {
    let secret = format!("{account}-testbed-token");
    kubectl(
        plane,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {secret}\n  namespace: unbounded-system\n  \
             annotations: {{kubernetes.io/service-account.name: {account}}}\ntype: kubernetes.io/service-account-token\n"
        )),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let token = loop {
        let encoded = kubectl(
            plane,
            &[
                "get",
                "secret",
                "-n",
                "unbounded-system",
                &secret,
                "-o",
                "jsonpath={.data.token}",
            ],
            None,
        )
        .unwrap_or_default();
        if !encoded.is_empty() {
            let out = Command::new("base64")
                .arg("-d")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    if let Some(mut i) = c.stdin.take() {
                        i.write_all(encoded.as_bytes())?;
                    }
                    c.wait_with_output()
                })
                .map_err(|e| Failure::new("base64", e))?;
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        if Instant::now() > deadline {
            return Err(step(format!("the token controller did not fill {secret}")));
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {account}\n\
         current-context: lab\n",
        ca = ca.display()
    ))
}
