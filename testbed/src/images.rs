//! `unbounded-testbed images`: builds the host OS boot image, the node image and the
//! container images of the controller and the bootserver, each cached under
//! `~/.cache/unbounded/images/` by a key over everything that goes into it (recipes,
//! overlays, pinned versions, input binaries), so that a second run costs seconds and a
//! changed input rebuilds exactly what depends on it.
//!
//! The recipes live in the repository's `images/` directory (shell, so that an operator can
//! read and run them without Rust); this module orders them, computes the keys, builds the
//! Rust binaries that go in, writes the pause and container images as OCI layouts
//! ([`crate::oci`]) and reports progress per step.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::cluster::{self, KUBERNETES_VERSION};
use crate::oci::{self, ImageSpec, LayerFile};

/// Version pins that go into the node image (also in the keys).
pub const CONTAINERD_VERSION: &str = "v2.2.1";
/// The CNI plugins' release.
pub const CNI_PLUGINS_VERSION: &str = "v1.9.1";
/// The sandbox image name containerd 2.2 uses by default; the node image ships it.
pub const PAUSE_REFERENCE: &str = "registry.k8s.io/pause:3.10.1";
/// The project's version, which tags the container images.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Errors while building images.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    /// A step failed.
    #[error("{step}: {message}")]
    Step {
        /// Which step.
        step: &'static str,
        /// Why, with the tail of its output.
        message: String,
    },
    /// The Kubernetes binaries could not be built or found.
    #[error(transparent)]
    Kubernetes(#[from] cluster::ClusterError),
    /// Writing an OCI image failed.
    #[error(transparent)]
    Oci(#[from] oci::OciError),
}

fn step_err(step: &'static str, message: impl Into<String>) -> ImagesError {
    ImagesError::Step {
        step,
        message: message.into(),
    }
}

/// The host OS boot image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostImage {
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs (the whole root file system).
    pub initrd: PathBuf,
}

/// The node image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeImage {
    /// `node.tar.zst`.
    pub archive: PathBuf,
    /// Its SHA-256 (hex), as a MachineConfiguration's `image.sha256` names it.
    pub sha256: String,
}

/// A container image of one of our binaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerImage {
    /// Its reference, as `deploy/` names it.
    pub reference: String,
    /// The OCI layout directory.
    pub layout: PathBuf,
    /// A tar of the layout (`ctr images import`).
    pub archive: PathBuf,
}

/// Everything `images` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// The host OS boot image.
    pub host: HostImage,
    /// The node image.
    pub node: NodeImage,
    /// The controller's and the bootserver's container images, when asked for.
    pub containers: Vec<ContainerImage>,
}

/// What to build.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Also build the controller's and the bootserver's container images (a static release
    /// build of both: several minutes the first time).
    pub containers: bool,
}

/// The repository's `images/` directory.
pub fn recipes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../images")
}

/// Where built images are cached.
pub fn images_cache() -> PathBuf {
    cluster::cache_dir().join("images")
}

/// Progress lines, with the step number and how long each took.
#[derive(Debug)]
struct Progress {
    total: usize,
    done: usize,
}

impl Progress {
    fn run<T>(
        &mut self,
        what: &str,
        f: impl FnOnce() -> Result<(T, bool), ImagesError>,
    ) -> Result<T, ImagesError> {
        self.done += 1;
        eprintln!("images: [{}/{}] {what}", self.done, self.total);
        let started = Instant::now();
        let (value, cached) = f()?;
        let how = if cached { "cached" } else { "built" };
        eprintln!(
            "images: [{}/{}] {what}: {how} in {:.1} s",
            self.done,
            self.total,
            started.elapsed().as_secs_f64()
        );
        Ok(value)
    }
}

/// A cache key: SHA-256 over labelled parts, shortened.
#[derive(Debug, Default)]
pub struct Key(String);

impl Key {
    /// Adds a labelled string.
    pub fn text(mut self, label: &str, value: &str) -> Self {
        let _ = writeln!(self.0, "{label}={}", oci::sha256_hex(value.as_bytes()));
        self
    }

    /// Adds a file's content (and, for a tree, every file's relative path, mode and content).
    pub fn path(mut self, label: &str, path: &Path) -> Result<Self, ImagesError> {
        let mut entries = Vec::new();
        collect(path, path, &mut entries)?;
        entries.sort();
        for (relative, mode, digest) in entries {
            let _ = writeln!(self.0, "{label}:{relative}:{mode:o}={digest}");
        }
        Ok(self)
    }

    /// The key.
    pub fn finish(&self) -> String {
        oci::sha256_hex(self.0.as_bytes())
            .chars()
            .take(16)
            .collect()
    }
}

fn collect(
    base: &Path,
    path: &Path,
    out: &mut Vec<(String, u32, String)>,
) -> Result<(), ImagesError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = fs::symlink_metadata(path)
        .map_err(|e| step_err("cache key", format!("{}: {e}", path.display())))?;
    let relative = path
        .strip_prefix(base)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if meta.is_dir() {
        let entries = fs::read_dir(path)
            .map_err(|e| step_err("cache key", format!("{}: {e}", path.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| step_err("cache key", e.to_string()))?;
            collect(base, &entry.path(), out)?;
        }
    } else if meta.file_type().is_symlink() {
        let target = fs::read_link(path).map_err(|e| step_err("cache key", e.to_string()))?;
        out.push((relative, 0, format!("-> {}", target.display())));
    } else {
        let digest = file_sha256(path).map_err(|e| step_err("cache key", e))?;
        out.push((relative, meta.permissions().mode() & 0o7777, digest));
    }
    Ok(())
}

/// Hex SHA-256 of a file, streamed.
pub fn file_sha256(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let mut file = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        context.update(buf.get(..n).unwrap_or_default());
    }
    Ok(oci::hex(context.finish().as_ref()))
}

/// Runs a command with its output captured; on failure the error carries its tail.
fn run_logged(step: &'static str, command: &mut Command, log: &Path) -> Result<(), ImagesError> {
    let file = fs::File::create(log).map_err(|e| step_err(step, e.to_string()))?;
    let err = file
        .try_clone()
        .map_err(|e| step_err(step, e.to_string()))?;
    let status = command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(|e| step_err(step, format!("{command:?}: {e}")))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(25).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(step_err(
        step,
        format!("{status} (log {}):\n{}", log.display(), tail.join("\n")),
    ))
}

/// Builds into `cache/<name>-<key>/` unless a completed build is there; returns the dir
/// and whether it was cached.
fn cached_build(
    name: &str,
    key: &str,
    build: impl FnOnce(&Path) -> Result<(), ImagesError>,
) -> Result<(PathBuf, bool), ImagesError> {
    let dir = images_cache().join(format!("{name}-{key}"));
    let stamp = dir.join(".complete");
    if stamp.exists() {
        return Ok((dir, true));
    }
    if dir.exists() {
        let _ = fs::remove_dir_all(&dir);
    }
    fs::create_dir_all(&dir).map_err(|e| step_err("cache", format!("{}: {e}", dir.display())))?;
    build(&dir)?;
    fs::write(&stamp, b"").map_err(|e| step_err("cache", e.to_string()))?;
    prune(name, &dir);
    Ok((dir, false))
}

/// Keeps only the newest build of each artifact (they are hundreds of MB each).
fn prune(name: &str, keep: &Path) {
    let Ok(entries) = fs::read_dir(images_cache()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_sibling = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with('-') && rest.len() == 17);
        if is_sibling && path != keep {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Builds Rust binaries with cargo and returns each one's path.
pub fn cargo_build(
    packages: &[&str],
    binaries: &[&str],
    release: bool,
    static_target: bool,
) -> Result<Vec<PathBuf>, ImagesError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args(["build", "--message-format=json-render-diagnostics"]);
    if release {
        command.arg("--release");
    }
    if static_target {
        // glibc, linked statically: no musl toolchain needed, nothing to install in the image.
        command.args(["--target", "x86_64-unknown-linux-gnu"]);
        command.env("RUSTFLAGS", "-C target-feature=+crt-static");
    }
    for package in packages {
        command.args(["-p", package]);
    }
    for binary in binaries {
        command.args(["--bin", binary]);
    }
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| step_err("cargo build", e.to_string()))?;
    if !output.status.success() {
        return Err(step_err("cargo build", format!("{}", output.status)));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && let Some(executable) = message["executable"].as_str()
        {
            found.push(PathBuf::from(executable));
        }
    }
    binaries
        .iter()
        .map(|name| {
            found
                .iter()
                .find(|p| p.file_name().and_then(|n| n.to_str()) == Some(name))
                .cloned()
                .ok_or_else(|| step_err("cargo build", format!("no binary {name} was built")))
        })
        .collect()
}

/// Builds (or finds in the cache) every image.
pub fn build(options: &Options) -> Result<Images, ImagesError> {
    let recipes = recipes_dir();
    let mut progress = Progress {
        total: if options.containers { 7 } else { 6 },
        done: 0,
    };
    let kubelet = progress.run(
        &format!("Kubernetes {KUBERNETES_VERSION} (kubelet)"),
        || {
            let cached = cluster::cache_dir()
                .join(format!("kubernetes-{KUBERNETES_VERSION}/kubelet"))
                .is_file();
            Ok((cluster::Binaries::ensure()?.kubelet, cached))
        },
    )?;

    let tools = progress.run(
        &format!("containerd {CONTAINERD_VERSION}, CNI plugins {CNI_PLUGINS_VERSION}"),
        || {
            let script = recipes.join("node/build-tools.sh");
            let key = Key::default()
                .text("containerd", CONTAINERD_VERSION)
                .text("cni", CNI_PLUGINS_VERSION)
                .path("script", &script)?
                .finish();
            let (dir, cached) = cached_build("node-tools", &key, |dir| {
                run_logged(
                    "node tools",
                    Command::new("bash")
                        .arg(&script)
                        .arg(dir)
                        .env("CONTAINERD_VERSION", CONTAINERD_VERSION)
                        .env("CNI_PLUGINS_VERSION", CNI_PLUGINS_VERSION)
                        .env("PATH", go_path()),
                    &dir.join("build.log"),
                )
            })?;
            Ok((dir.join("bin"), cached))
        },
    )?;

    let pause = progress.run("pause image (static, OCI archive)", || {
        let source = recipes.join("node/pause.c");
        let key = Key::default()
            .text("reference", PAUSE_REFERENCE)
            .path("source", &source)?
            .finish();
        let (dir, cached) = cached_build("pause", &key, |dir| {
            let binary = dir.join("pause");
            run_logged(
                "pause image",
                Command::new("gcc")
                    .args(["-static", "-Os", "-s", "-o"])
                    .arg(&binary)
                    .arg(&source),
                &dir.join("build.log"),
            )?;
            oci::write_image(
                &ImageSpec {
                    reference: PAUSE_REFERENCE.into(),
                    files: vec![LayerFile {
                        path: "/pause".into(),
                        source: binary,
                        mode: 0o755,
                    }],
                    entrypoint: vec!["/pause".into()],
                    user: "65535:65535".into(),
                    env: vec![],
                },
                dir,
            )?;
            Ok(())
        })?;
        Ok((dir.join("image.tar"), cached))
    })?;

    let node = progress.run("node image (debootstrap, kubelet, containerd)", || {
        let key = Key::default()
            .path("recipe", &recipes.join("node/build.sh"))?
            .path("overlay", &recipes.join("node/overlay"))?
            .path("kubelet", &kubelet)?
            .path("tools", &tools)?
            .path("pause", &pause)?
            .text("mirror", &mirror())
            .finish();
        let (dir, cached) = cached_build("node", &key, |dir| {
            run_logged(
                "node image",
                Command::new("bash")
                    .arg(recipes.join("node/build.sh"))
                    .arg(dir)
                    .arg(&kubelet)
                    .arg(&tools)
                    .arg(&pause)
                    .env("DEBIAN_MIRROR", mirror()),
                &dir.join("build.log"),
            )
        })?;
        let sha256 = fs::read_to_string(dir.join("node.tar.zst.sha256"))
            .map_err(|e| step_err("node image", e.to_string()))?
            .trim()
            .to_owned();
        Ok((
            NodeImage {
                archive: dir.join("node.tar.zst"),
                sha256,
            },
            cached,
        ))
    })?;

    let agent = progress.run("unbounded-agent (release build)", || {
        let agent = cargo_build(&["unbounded-agent"], &["unbounded-agent"], true, false)?;
        let agent = agent
            .into_iter()
            .next()
            .ok_or_else(|| step_err("agent", "cargo built no agent"))?;
        Ok((agent, false))
    })?;

    let host = progress.run("host OS image (debootstrap, kernel, agent)", || {
        let key = Key::default()
            .path("recipe", &recipes.join("host/build.sh"))?
            .path("overlay", &recipes.join("host/overlay"))?
            .path("agent", &agent)?
            .text("mirror", &mirror())
            .finish();
        let (dir, cached) = cached_build("host", &key, |dir| {
            run_logged(
                "host image",
                Command::new("bash")
                    .arg(recipes.join("host/build.sh"))
                    .arg(dir)
                    .arg(&agent)
                    .env("DEBIAN_MIRROR", mirror()),
                &dir.join("build.log"),
            )
        })?;
        Ok((
            HostImage {
                kernel: dir.join("vmlinuz"),
                initrd: dir.join("initrd.img"),
            },
            cached,
        ))
    })?;

    let containers = if options.containers {
        progress.run(
            "container images of the controller and the bootserver",
            || Ok((container_images()?, false)),
        )?
    } else {
        Vec::new()
    };
    record_current(&host, &node, &containers)?;
    Ok(Images {
        host,
        node,
        containers,
    })
}

/// Where the paths of the newest host and node images are recorded.
pub fn current_path() -> PathBuf {
    images_cache().join("current.json")
}

/// Records what this run built; the container images only when it built them (a lab that
/// runs the pods needs the ones of this build, not an older one's).
fn record_current(
    host: &HostImage,
    node: &NodeImage,
    containers: &[ContainerImage],
) -> Result<(), ImagesError> {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|c| {
            serde_json::json!({
                "reference": c.reference, "layout": c.layout, "archive": c.archive,
            })
        })
        .collect();
    let json = serde_json::json!({
        "kernel": host.kernel, "initrd": host.initrd,
        "node": node.archive, "nodeSha256": node.sha256,
        "containers": containers,
    });
    fs::write(current_path(), json.to_string()).map_err(|e| step_err("cache", e.to_string()))
}

/// The images the last `images` run built (the container images if it was run with
/// `--containers`), without building anything (tests use them; the test command builds them
/// first).
pub fn cached() -> Result<Images, ImagesError> {
    let missing = || {
        step_err(
            "images",
            format!(
                "no built images recorded in {}: run `cargo run -p unbounded-testbed -- images` first",
                current_path().display()
            ),
        )
    };
    let text = fs::read_to_string(current_path()).map_err(|_| missing())?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|_| missing())?;
    let path = |key: &str| {
        value[key]
            .as_str()
            .map(PathBuf::from)
            .filter(|p| p.exists())
    };
    let (Some(kernel), Some(initrd), Some(node), Some(sha)) = (
        path("kernel"),
        path("initrd"),
        path("node"),
        value["nodeSha256"].as_str(),
    ) else {
        return Err(missing());
    };
    let containers = value["containers"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|c| {
                    Some(ContainerImage {
                        reference: c["reference"].as_str()?.to_owned(),
                        layout: PathBuf::from(c["layout"].as_str()?),
                        archive: PathBuf::from(c["archive"].as_str()?),
                    })
                })
                .filter(|c| c.layout.is_dir())
                .collect()
        })
        .unwrap_or_default();
    Ok(Images {
        host: HostImage { kernel, initrd },
        node: NodeImage {
            archive: node,
            sha256: sha.to_owned(),
        },
        containers,
    })
}

/// The Debian mirror the recipes use (`DEBIAN_MIRROR`, else Debian's CDN).
fn mirror() -> String {
    std::env::var("DEBIAN_MIRROR").unwrap_or_else(|_| "http://deb.debian.org/debian".into())
}

/// PATH with Go's usual install directory, where these machines keep it.
fn go_path() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    if path.split(':').any(|p| p == "/usr/local/go/bin") {
        path
    } else {
        format!("{path}:/usr/local/go/bin")
    }
}

/// The image references `deploy/` uses, by binary.
pub const CONTAINER_IMAGES: [(&str, &str, &str); 2] = [
    (
        "unbounded-controller",
        "unbounded-controller",
        "docker.io/unbounded/controller",
    ),
    (
        "unbounded-bootserver",
        "unbounded-bootserver",
        "docker.io/unbounded/bootserver",
    ),
];

/// Static release builds of the controller and the bootserver, each as an OCI image.
fn container_images() -> Result<Vec<ContainerImage>, ImagesError> {
    let packages: Vec<&str> = CONTAINER_IMAGES.iter().map(|(p, _, _)| *p).collect();
    let binaries: Vec<&str> = CONTAINER_IMAGES.iter().map(|(_, b, _)| *b).collect();
    let built = cargo_build(&packages, &binaries, true, true)?;
    let mut images = Vec::new();
    for ((_, binary, repository), path) in CONTAINER_IMAGES.iter().zip(built) {
        let reference = format!("{repository}:{VERSION}");
        let out = images_cache().join(format!("container-{binary}"));
        fs::create_dir_all(&out).map_err(|e| step_err("container images", e.to_string()))?;
        let written = oci::write_image(
            &ImageSpec {
                reference: reference.clone(),
                files: vec![
                    LayerFile {
                        path: format!("/usr/local/bin/{binary}"),
                        source: path,
                        mode: 0o755,
                    },
                    // CA certificates for the API server and Redfish BMCs with public CAs.
                    LayerFile {
                        path: "/etc/ssl/certs/ca-certificates.crt".into(),
                        source: PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
                        mode: 0o644,
                    },
                ],
                entrypoint: vec![format!("/usr/local/bin/{binary}")],
                user: "65532:65532".into(),
                env: vec!["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt".into()],
            },
            &out,
        )?;
        images.push(ContainerImage {
            reference,
            layout: written.layout,
            archive: written.archive,
        });
    }
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_any_input() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), b"one").unwrap();
        let key = || {
            Key::default()
                .text("v", "1")
                .path("tree", dir.path())
                .unwrap()
                .finish()
        };
        let first = key();
        assert_eq!(first, key(), "stable");
        fs::write(dir.path().join("a"), b"two").unwrap();
        let second = key();
        assert_ne!(first, second, "content");
        fs::write(dir.path().join("b"), b"").unwrap();
        assert_ne!(second, key(), "a new file");
        assert_ne!(
            Key::default().text("v", "1").finish(),
            Key::default().text("v", "2").finish()
        );
    }
}
