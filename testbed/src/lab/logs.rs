//! What the lab's components said: the tails of their logs and the pods', and a scan of
//! them for the secrets the lab handed out.

use std::fs;
use std::path::PathBuf;

use super::{BMC_PASSWORD, Components, Lab};
use crate::process::tail_text;

impl Lab {
    /// The tails of the components' logs.
    pub fn logs(&self) -> String {
        let mut out = match &self.components {
            Components::HostBinaries {
                controller,
                bootserver,
                ..
            } => vec![bootserver.tail(40), controller.tail(30)],
            Components::Pods(appliance) => {
                let mut out = vec![
                    format!(
                        "--- pods of unbounded-system:\n{}",
                        crate::appliance::pod_summary(&self.plane)
                    ),
                    appliance.console_tail(20),
                ];
                for (pod, lines) in self.pod_logs(40) {
                    out.push(format!("--- pod {pod}:\n{}", tail_text(&lines, 40)));
                }
                out
            }
        };
        out.push(format!(
            "--- libvirtd:\n{}",
            tail_text(&self.libvirtd.log(), 10)
        ));
        if let Some(s) = &self.sushy {
            out.push(format!("--- sushy-emulator:\n{}", tail_text(&s.log(), 10)));
        }
        out.join("\n")
    }

    /// `(pod, log)` of every pod of the project's namespace (all containers; the last
    /// `lines` lines, or all with 0), through the API server and the kubelets.
    fn pod_logs(&self, lines: usize) -> Vec<(String, String)> {
        use crate::scenario::LabAccess as _;
        let pods = self
            .kubectl(
                &[
                    "get",
                    "pods",
                    "-n",
                    crate::appliance::SYSTEM_NAMESPACE,
                    "-o",
                    "jsonpath={.items[*].metadata.name}",
                ],
                None,
            )
            .unwrap_or_default();
        let tail = if lines == 0 {
            "-1".to_owned()
        } else {
            lines.to_string()
        };
        pods.split_whitespace()
            .map(|pod| {
                let log = self
                    .kubectl(
                        &[
                            "logs",
                            "-n",
                            crate::appliance::SYSTEM_NAMESPACE,
                            pod,
                            "--all-containers",
                            "--tail",
                            &tail,
                        ],
                        None,
                    )
                    .unwrap_or_else(|e| format!("(no log: {e})"));
                (pod.to_owned(), log)
            })
            .collect()
    }

    /// Every secret or credential that a component's log or a machine's console shows: the
    /// BMC password, a token, a bootstrap token (`leaks::find`), as `file:line: what`.
    pub fn secret_leaks(&self) -> Vec<String> {
        let mut files: Vec<PathBuf> = match &self.components {
            Components::HostBinaries {
                controller,
                bootserver,
                ..
            } => vec![
                bootserver.log_path().to_path_buf(),
                controller.log_path().to_path_buf(),
            ],
            Components::Pods(appliance) => appliance.logs(),
        };
        files.extend(self.machines.iter().map(|m| m.domain.console_path()));
        let mut texts: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|f| (f.display().to_string(), fs::read(f).unwrap_or_default()))
            .collect();
        if matches!(self.components, Components::Pods(_)) {
            texts.extend(
                self.pod_logs(0)
                    .into_iter()
                    .map(|(pod, log)| (format!("pod {pod}"), log.into_bytes())),
            );
        }
        texts.push(("libvirtd".into(), self.libvirtd.log().into_bytes()));
        if let Some(s) = &self.sushy {
            texts.push(("sushy-emulator".into(), s.log().into_bytes()));
        }
        texts.extend(self.machines.iter().filter_map(|m| {
            m.ipmi
                .as_ref()
                .map(|sim| (format!("ipmi_sim {}", m.name), sim.log().into_bytes()))
        }));
        let mut leaks: Vec<String> = texts
            .iter()
            .flat_map(|(name, text)| {
                crate::leaks::find(text, &[BMC_PASSWORD])
                    .into_iter()
                    .map(move |leak| format!("{name}:{}: {}", leak.line, leak.what))
            })
            .collect();
        // The pods lab's bootserver speaks TLS (testbed/overlay): nothing secret may cross
        // the bridge in clear, no token and no nonce. (The host-binaries lab's exchange is
        // plain HTTP by its configuration, so its capture is not held to that.)
        if matches!(self.components, Components::Pods(_)) {
            let capture = self.dir.join(super::BRIDGE_CAPTURE);
            let bytes = fs::read(&capture).unwrap_or_default();
            let name = capture.display().to_string();
            leaks.extend(
                crate::leaks::find(&bytes, &[BMC_PASSWORD])
                    .into_iter()
                    .map(|leak| format!("{name}: packet {}: {}", leak.line, leak.what)),
            );
            if bytes.windows(16).any(|w| w == b"unbounded.nonce=") {
                leaks.push(format!("{name}: a boot script's nonce in clear"));
            }
            // A capture that saw no boot script saw nothing: the scan would pass vacuously.
            if !self.machines.is_empty() && !bytes.windows(18).any(|w| w == b"unbounded.ticket=1") {
                leaks.push(format!(
                    "{name}: holds no boot script (was the capture running?), so it proves nothing"
                ));
            }
        }
        leaks
    }
}
