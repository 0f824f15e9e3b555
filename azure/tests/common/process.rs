//! The provider binary and kubectl, for the tests that run the provider against the local
//! control plane and the fake.

use std::process::{Child, Command};

use unbounded_testbed::cluster::LocalControlPlane;

use super::FakeAzure;

pub const AGENT_URL: &str = "https://downloads.example.invalid/unbounded-agent";
/// The provider's identity in its Lease.
pub const IDENTITY: &str = "azure-acceptance";
pub const AGENT_SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

// Not every test binary uses it.
#[allow(unused_imports)]
pub use unbounded_testbed::testkit::kubectl_ok as kubectl;

pub fn get(cp: &LocalControlPlane, kind: &str, name: &str, path: &str) -> String {
    cp.kubectl_output(&["get", kind, name, "-o", &format!("jsonpath={path}")])
        .unwrap_or_default()
}

/// The provider binary, logging to a file.
pub struct ProviderProcess {
    child: Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl ProviderProcess {
    pub fn start(cp: &LocalControlPlane, fake: &FakeAzure) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("provider.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_unbounded-azure"))
            .args([
                "--cluster-name",
                "acceptance",
                // Any free port: tests run side by side.
                "--probe-addr",
                "127.0.0.1:0",
                "--bootserver-url",
                "http://192.0.2.1:8080",
                "--api-server-url",
                cp.server_url(),
                "--cluster-ca-file",
                &cp.data_dir().join("pki/ca.crt").display().to_string(),
                "--agent-url",
                AGENT_URL,
                "--agent-sha256",
                AGENT_SHA,
                "--identity",
                "none",
                "--arm-endpoint",
                &fake.origin,
                "--authority-host",
                &fake.origin,
                "--extra-ca-file",
                &fake.ca_file.display().to_string(),
                "--poll-seconds",
                "2",
                "--first-backoff-seconds",
                "2",
                "--max-backoff-seconds",
                "5",
                "--operation-timeout-seconds",
                "8",
                "--request-attempts",
                "4",
                // Elected as in a cluster, its Lease in `default`.
                "--leader-election-namespace",
                "default",
                "--leader-election-identity",
                IDENTITY,
            ])
            .env("KUBECONFIG", cp.kubeconfig_path())
            // Our crates and the Azure SDK at debug level: nothing they log may hold a secret.
            .env(
                "RUST_LOG",
                "info,unbounded_azure=debug,unbounded_api=debug,azure_core=debug,azure_identity=debug,typespec_client_core=debug,reqwest=debug",
            )
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            _dir: dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
