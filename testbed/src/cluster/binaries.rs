//! The Kubernetes binaries: built from Kubernetes' own Go modules at [`KUBERNETES_VERSION`]
//! (`testbed/scripts/build-kubernetes.sh`) and cached, or taken from [`BIN_DIR_ENV`].

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{BIN_DIR_ENV, ClusterError, KUBERNETES_VERSION, cache_dir, io_err};

const BUILD_SCRIPT: &str = include_str!("../../scripts/build-kubernetes.sh");

/// Paths of the Kubernetes binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// kube-scheduler.
    pub kube_scheduler: PathBuf,
    /// kubectl.
    pub kubectl: PathBuf,
    /// kubelet.
    pub kubelet: PathBuf,
    /// etcd (Debian's etcd-server).
    pub etcd: PathBuf,
}

impl Binaries {
    /// Finds the binaries, building the Kubernetes ones into the cache when missing (with
    /// progress on stderr). Concurrent callers wait for one build.
    pub fn ensure() -> Result<Self, ClusterError> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let dir = cache_dir().join(format!("kubernetes-{KUBERNETES_VERSION}"));
                build_kubernetes(KUBERNETES_VERSION, &dir, &ALL_BINARIES)?;
                dir
            }
        };
        let in_dir = |name: &str| -> Result<PathBuf, ClusterError> {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(ClusterError::MissingProgram {
                    program: path.display().to_string(),
                    hint: format!(
                        "unset {BIN_DIR_ENV} to build Kubernetes {KUBERNETES_VERSION}, or put the binary there"
                    ),
                })
            }
        };
        Ok(Self {
            kube_apiserver: in_dir("kube-apiserver")?,
            kube_controller_manager: in_dir("kube-controller-manager")?,
            kube_scheduler: in_dir("kube-scheduler")?,
            kubectl: in_dir("kubectl")?,
            kubelet: in_dir("kubelet")?,
            etcd: find_program(
                "etcd",
                "run scripts/install-deps.sh (Debian package etcd-server)",
            )?,
        })
    }
}

/// Every binary the testbed's control plane and node image take from Kubernetes.
const ALL_BINARIES: [&str; 5] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
];

/// The kubelet of another Kubernetes release than the control plane's (a node image per
/// Kubernetes version: `images --kubelet`), built alone from that release's Go modules into
/// the cache once, as the control plane's binaries are.
pub fn kubelet_of(version: &str) -> Result<PathBuf, ClusterError> {
    let dir = cache_dir().join(format!("kubernetes-{version}"));
    build_kubernetes(version, &dir, &["kubelet"])?;
    Ok(dir.join("kubelet"))
}

/// Builds `wanted` of Kubernetes `version` into `out` unless they are there.
fn build_kubernetes(version: &str, out: &Path, wanted: &[&str]) -> Result<(), ClusterError> {
    if wanted.iter().all(|b| out.join(b).is_file()) {
        return Ok(());
    }
    let parent = out.parent().unwrap_or(Path::new("/tmp"));
    eprintln!(
        "testbed: building Kubernetes {version} ({}) into {} (first time only: ~10 min on 2 cores for all of them)",
        wanted.join(", "),
        out.display()
    );
    let mut args: Vec<&OsStr> = vec![OsStr::new(version), out.as_os_str()];
    args.extend(wanted.iter().map(OsStr::new));
    run_build_script(
        BUILD_SCRIPT,
        "Kubernetes",
        version,
        &parent.join(format!("kubernetes-{version}.lock")),
        &args,
    )
}

/// Runs a build `script` (passed to bash on its standard input, its output on ours) with
/// `args`, holding the lock file `lock` so that test binaries started together build once.
/// `project` and `version` name what is built in the error.
pub(super) fn run_build_script(
    script: &str,
    project: &str,
    version: &str,
    lock: &Path,
    args: &[&OsStr],
) -> Result<(), ClusterError> {
    find_program(
        "go",
        &format!("install the Go toolchain (it builds {project} from its Go modules)"),
    )?;
    find_program("flock", "install util-linux")?;
    if let Some(parent) = lock.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
    }
    let mut child = Command::new("flock")
        .arg(lock)
        .args(["bash", "-s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(io_err(format!("starting the {project} build")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(io_err("passing the build script"))?;
    }
    let status = child
        .wait()
        .map_err(io_err(format!("waiting for the {project} build")))?;
    if !status.success() {
        return Err(ClusterError::Build {
            project: project.to_owned(),
            version: version.to_owned(),
            status: status.to_string(),
        });
    }
    Ok(())
}

/// Finds a program on PATH.
pub fn find_program(name: &str, hint: &str) -> Result<PathBuf, ClusterError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| ClusterError::MissingProgram {
            program: name.to_owned(),
            hint: hint.to_owned(),
        })
}
