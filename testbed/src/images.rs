//! `unbounded-testbed images`: builds the host OS boot image, the node image and, with
//! `--containers`, the project's container images ([`crate::containers`]: controller,
//! bootserver, Azure provider, and the boot images image), each cached under
//! `~/.cache/unbounded/images/` by a key over everything that goes into it (recipes,
//! overlays, pinned versions, input binaries, the code that writes it), so that a second
//! run costs seconds and a changed input rebuilds exactly what depends on it.
//!
//! The recipes live in the repository's `images/` directory (shell, so that an operator can
//! read and run them without Rust); this module orders them, computes the keys, builds the
//! Rust binaries that go in, writes the pause and container images as OCI layouts
//! ([`crate::oci`]) and reports progress per step. What `--containers` built is recorded
//! in `containers.json` ([`cached_containers`]).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::cluster::{self, KUBERNETES_VERSION};
use crate::containers::{
    self, BootSet, BuiltContainers, BuiltImage, ContainerError, Contents, PROJECT_IMAGES,
    RustBinary,
};
use crate::oci::{self, ImageSpec, Layer, LayerCompression, LayerFile};
use crate::sbom;

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
    /// Putting a container image together failed.
    #[error(transparent)]
    Container(#[from] ContainerError),
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

/// Everything `images` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// The host OS boot image.
    pub host: HostImage,
    /// The node image.
    pub node: NodeImage,
    /// The container images, when asked for.
    pub containers: Option<BuiltContainers>,
}

/// What to build.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Also build the container images (controller, bootserver, Azure provider, boot
    /// images): a static release build of three binaries, several minutes the first time.
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

/// The variables among `names` that `cargo run` set for this program and a nested
/// `cargo build` must not inherit: a build script that tracks one (ring's tracks
/// `CARGO_MANIFEST_DIR`) reruns when its value differs from the last build's, and everything
/// above it rebuilds, each time `cargo run -p unbounded-testbed` and the builds it starts
/// alternate (minutes per `bench` run).
pub fn set_by_cargo_run(names: impl Iterator<Item = String>) -> Vec<String> {
    names
        .filter(|name| {
            name.starts_with("CARGO_PKG_")
                || matches!(
                    name.as_str(),
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_MANIFEST_LINKS"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                )
        })
        .collect()
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
    for name in set_by_cargo_run(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok())) {
        command.env_remove(name);
    }
    if release {
        command.arg("--release");
    }
    if static_target {
        // glibc, linked statically: no musl toolchain needed, nothing to install in the image.
        // Source paths (in panic messages) are remapped, so that the same commit gives the
        // same binary in any checkout and under any home directory.
        command.args(["--target", containers::TARGET]);
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let cargo_home = std::env::var_os("CARGO_HOME").map_or_else(
            || {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                    .join(".cargo")
            },
            PathBuf::from,
        );
        command.env(
            "RUSTFLAGS",
            format!(
                "-C target-feature=+crt-static --remap-path-prefix={}=/unbounded --remap-path-prefix={}=/cargo",
                workspace.display(),
                cargo_home.display()
            ),
        );
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
        total: if options.containers { 10 } else { 6 },
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
                    references: vec![PAUSE_REFERENCE.into()],
                    layers: vec![Layer {
                        files: vec![LayerFile::copy("/pause", binary, 0o755)],
                        compression: LayerCompression::Gzip,
                        comment: "one layer of static files".into(),
                    }],
                    entrypoint: vec!["/pause".into()],
                    user: "65535:65535".into(),
                    env: vec![],
                    labels: vec![],
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

    let (agent, image_binaries) = progress.run(
        if options.containers {
            "release build (static): agent, controller, bootserver, azure"
        } else {
            "release build (static): agent"
        },
        || Ok((release_builds(options.containers)?, false)),
    )?;

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

    record_current(&host, &node)?;
    let containers = if options.containers {
        Some(container_images(
            &mut progress,
            &recipes,
            &host,
            &node,
            image_binaries,
        )?)
    } else {
        None
    };
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

fn record_current(host: &HostImage, node: &NodeImage) -> Result<(), ImagesError> {
    let json = serde_json::json!({
        "kernel": host.kernel, "initrd": host.initrd,
        "node": node.archive, "nodeSha256": node.sha256,
    });
    fs::write(current_path(), json.to_string()).map_err(|e| step_err("cache", e.to_string()))
}

/// The images the last `images` run built, without building anything (tests use them; the
/// test command builds them first).
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
    Ok(Images {
        host: HostImage { kernel, initrd },
        node: NodeImage {
            archive: node,
            sha256: sha.to_owned(),
        },
        containers: None,
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

/// The code that writes the container images: part of their keys, so that a change to
/// how an image is put together rebuilds it.
const IMAGE_WRITER: [&str; 3] = [
    include_str!("oci.rs"),
    include_str!("sbom.rs"),
    include_str!("containers.rs"),
];

fn writer_key(key: Key) -> Key {
    IMAGE_WRITER
        .iter()
        .fold(key, |key, source| key.text("writer", source))
        .text("version", VERSION)
        .text("created", &sbom::creation_time())
}

/// Where `images --containers` records what it built.
pub fn containers_path() -> PathBuf {
    images_cache().join("containers.json")
}

/// The container images the last `images --containers` built, without building anything.
pub fn cached_containers() -> Result<BuiltContainers, ImagesError> {
    let missing = |why: String| {
        step_err(
            "images",
            format!(
                "no container images recorded ({why}): run `cargo run -p unbounded-testbed -- images --containers` first"
            ),
        )
    };
    let text = fs::read_to_string(containers_path())
        .map_err(|e| missing(format!("{}: {e}", containers_path().display())))?;
    let built: BuiltContainers = serde_json::from_str(&text).map_err(|e| missing(e.to_string()))?;
    for image in built
        .images
        .iter()
        .chain(std::iter::once(&built.boot_images))
    {
        if !image.layout.join("index.json").exists() {
            return Err(missing(format!("{} is gone", image.layout.display())));
        }
    }
    Ok(built)
}

/// One line of a command's standard output, or an error naming the command.
fn command_line(step: &'static str, command: &mut Command) -> Result<String, ImagesError> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| step_err(step, format!("{command:?}: {e}")))?;
    if !output.status.success() {
        return Err(step_err(step, format!("{command:?}: {}", output.status)));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The crates linked into `package`'s binary for the image target, from `cargo tree`.
fn crates_of(package: &str) -> Result<Vec<sbom::Crate>, ImagesError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let text = command_line(
        "SBOM",
        Command::new(cargo)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .args([
                "tree",
                "--locked",
                "-p",
                package,
                "--target",
                containers::TARGET,
            ])
            .args(["--edges", "normal,no-proc-macro", "--prefix", "none"])
            .args(["--format", "{p}|{l}"]),
    )?;
    sbom::parse_cargo_tree(&text).map_err(|e| step_err("SBOM", e))
}

/// `rustc`'s version and the Debian version of the static C library.
fn toolchain_versions() -> Result<(String, String), ImagesError> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = command_line("SBOM", Command::new(rustc).arg("--version"))?;
    let rustc = rustc
        .split_whitespace()
        .nth(1)
        .unwrap_or("unknown")
        .to_owned();
    let libc = command_line(
        "SBOM",
        Command::new("dpkg-query").args(["-W", "-f=${Version}", "libc6-dev"]),
    )?;
    Ok((rustc, libc.trim().to_owned()))
}

/// The agent's static release build and, for the container images, the three binaries'
/// in the same cargo run: one set of dependencies compiled once for both (a release build
/// of the dependencies is the longest step of a cold `images --containers`).
fn release_builds(containers: bool) -> Result<(PathBuf, Vec<PathBuf>), ImagesError> {
    let mut packages = vec!["unbounded-agent"];
    if containers {
        packages.extend(PROJECT_IMAGES.iter().map(|i| i.package));
    }
    let mut built = cargo_build(&packages, &packages, true, true)?.into_iter();
    let agent = built
        .next()
        .ok_or_else(|| step_err("agent", "cargo built no agent"))?;
    Ok((agent, built.collect()))
}

/// The three images' binaries (as `release_builds` made them), each with its SBOM packages.
fn rust_binaries(built: Vec<PathBuf>) -> Result<Vec<RustBinary>, ImagesError> {
    let packages: Vec<&str> = PROJECT_IMAGES.iter().map(|i| i.package).collect();
    let lock = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"))
        .map_err(|e| step_err("SBOM", format!("Cargo.lock: {e}")))?;
    let checksums = sbom::lock_checksums(&lock);
    let (rustc, libc) = toolchain_versions()?;
    packages
        .iter()
        .zip(built)
        .map(|(package, path)| {
            let crates = crates_of(package)?;
            Ok(RustBinary {
                package: (*package).to_owned(),
                path,
                packages: sbom::rust_packages(package, &crates, &checksums, &rustc, &libc),
            })
        })
        .collect()
}

/// What `images/containers/build-contents.sh` makes: the iPXE builds and the CA bundle,
/// from the pinned Debian packages; each file checked again against the lock here, built
/// now or cached.
fn container_contents(recipes: &Path) -> Result<(Contents, bool), ImagesError> {
    let script = recipes.join("containers/build-contents.sh");
    let lock_path = recipes.join("containers/contents.lock");
    let key = Key::default()
        .path("script", &script)?
        .path("lock", &lock_path)?
        .finish();
    let (dir, cached) = cached_build("contents", &key, |dir| {
        run_logged(
            "container contents",
            Command::new("bash").arg(&script).arg(dir),
            &dir.join("build.log"),
        )
    })?;
    let contents = Contents::read(&dir)?;
    let lock = fs::read_to_string(&lock_path)
        .map_err(|e| {
            step_err(
                "container contents",
                format!("{}: {e}", lock_path.display()),
            )
        })
        .and_then(|t| {
            containers::parse_contents(&t).map_err(|e| step_err("container contents", e))
        })?;
    for pinned in lock.iter().filter(|l| l.kind == "file") {
        let actual =
            file_sha256(&dir.join(&pinned.name)).map_err(|e| step_err("container contents", e))?;
        if pinned.sha256.as_deref() != Some(actual.as_str()) {
            return Err(step_err(
                "container contents",
                format!(
                    "{}: sha256 {actual}, contents.lock pins {}",
                    pinned.name,
                    pinned.sha256.as_deref().unwrap_or("-")
                ),
            ));
        }
    }
    Ok((contents, cached))
}

fn built_image(
    name: &str,
    dir: &Path,
    written: &oci::WrittenImage,
    spec: &ImageSpec,
) -> BuiltImage {
    BuiltImage {
        name: name.to_owned(),
        references: spec.references.clone(),
        layout: written.layout.clone(),
        archive: written.archive.clone(),
        manifest_digest: written.manifest_digest.clone(),
        sbom: dir.join("sbom.spdx.json"),
    }
}

/// The recorded image of a cached build directory.
fn recorded(dir: &Path) -> Result<BuiltImage, ImagesError> {
    let path = dir.join("image.json");
    let text = fs::read_to_string(&path).map_err(|e| step_err("images", e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| step_err("images", e.to_string()))
}

fn record(dir: &Path, image: &BuiltImage) -> Result<(), ImagesError> {
    let text =
        serde_json::to_string_pretty(image).map_err(|e| step_err("images", e.to_string()))?;
    fs::write(dir.join("image.json"), text).map_err(|e| step_err("images", e.to_string()))
}

/// The four container images, each cached by its inputs; records them in
/// `containers.json`.
fn container_images(
    progress: &mut Progress,
    recipes: &Path,
    host: &HostImage,
    node: &NodeImage,
    built: Vec<PathBuf>,
) -> Result<BuiltContainers, ImagesError> {
    let contents = progress.run("container contents (iPXE builds, CA certificates)", || {
        container_contents(recipes)
    })?;
    let binaries = progress.run(
        "controller, bootserver, Azure provider (SBOMs of their static builds)",
        || Ok((rust_binaries(built)?, false)),
    )?;
    let created = sbom::creation_time();
    let images = progress.run("container images (controller, bootserver, azure)", || {
        let mut all_cached = true;
        let mut out = Vec::new();
        for (image, binary) in PROJECT_IMAGES.iter().zip(&binaries) {
            let key = writer_key(Key::default())
                .text("image", image.name)
                .path("binary", &binary.path)?
                .path("contents", &contents.dir)?
                .path(
                    "lock",
                    &Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"),
                )?
                .finish();
            let mut built = None;
            let (dir, cached) = cached_build(&format!("image-{}", image.name), &key, |dir| {
                let assembled =
                    containers::project_image(image, binary, &contents, VERSION, &created)?;
                let written = containers::write(&assembled, dir)?;
                let b = built_image(image.name, dir, &written, &assembled.spec);
                record(dir, &b)?;
                built = Some(b);
                Ok(())
            })?;
            all_cached &= cached;
            out.push(match built {
                Some(b) => b,
                None => recorded(&dir)?,
            });
        }
        Ok((out, all_cached))
    })?;
    let bootserver = binaries
        .iter()
        .find(|b| b.package == "unbounded-bootserver")
        .ok_or_else(|| step_err("boot images", "no bootserver was built"))?;
    let (boot_images, manifest) = progress.run("boot images image (host OS, node image, installer)", || {
        let key = writer_key(Key::default())
            .path("installer", &bootserver.path)?
            .path("kernel", &host.kernel)?
            .path("initrd", &host.initrd)?
            .text("node", &node.sha256)
            .finish();
        let mut built = None;
        let (dir, cached) = cached_build("image-boot-images", &key, |dir| {
            let text = |path: &Path| {
                fs::read_to_string(path.with_file_name("manifest.txt"))
                    .unwrap_or_default()
                    .lines()
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let set = BootSet {
                kernel: host.kernel.clone(),
                initrd: host.initrd.clone(),
                node: node.archive.clone(),
                host_description: format!(
                    "Unbounded's host OS (images/host/build.sh): {}",
                    text(&host.kernel)
                ),
                node_description: format!(
                    "Unbounded's node image (images/node/build.sh): {}; containerd {CONTAINERD_VERSION}, CNI plugins {CNI_PLUGINS_VERSION}",
                    text(&node.archive)
                ),
            };
            let boot = containers::boot_images_image(bootserver, &set, VERSION, &created)?;
            let written = containers::write(&boot.assembled, dir)?;
            let b = built_image(containers::BOOT_IMAGES_NAME, dir, &written, &boot.assembled.spec);
            record(dir, &b)?;
            fs::write(dir.join("manifest.json"), boot.manifest.to_json())
                .map_err(|e| step_err("boot images", e.to_string()))?;
            if let Some(values) = boot.values() {
                fs::write(
                    dir.join("machineconfiguration.yaml"),
                    format!(
                        "# spec.template of a MachineConfiguration that boots the set {v}\n# (installed by {r}):\n{}",
                        values.template_yaml(),
                        v = boot.manifest.version,
                        r = b.references.first().map_or("", String::as_str),
                    ),
                )
                .map_err(|e| step_err("boot images", e.to_string()))?;
            }
            built = Some(b);
            Ok(())
        })?;
        let image = match built {
            Some(b) => b,
            None => recorded(&dir)?,
        };
        let manifest = fs::read(dir.join("manifest.json"))
            .map_err(|e| step_err("boot images", e.to_string()))
            .and_then(|bytes| {
                unbounded_api::boot_images::BootImagesManifest::parse(&bytes)
                    .map_err(|e| step_err("boot images", e.to_string()))
            })?;
        Ok(((image, manifest), cached))
    })?;
    let machine_configuration = boot_images
        .layout
        .with_file_name("machineconfiguration.yaml");
    let built = BuiltContainers {
        version: VERSION.to_owned(),
        images,
        boot_images,
        boot_images_manifest: manifest,
        machine_configuration,
    };
    let text =
        serde_json::to_string_pretty(&built).map_err(|e| step_err("images", e.to_string()))?;
    fs::write(containers_path(), text).map_err(|e| step_err("images", e.to_string()))?;
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_build_does_not_inherit_what_cargo_run_set() {
        let names = [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_PRIMARY_PACKAGE",
            // What the nested build needs stays.
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "PATH",
        ];
        assert_eq!(
            set_by_cargo_run(names.iter().map(|n| (*n).to_owned())),
            vec![
                "CARGO_MANIFEST_DIR",
                "CARGO_PKG_NAME",
                "CARGO_PKG_VERSION_MAJOR",
                "CARGO_PRIMARY_PACKAGE"
            ]
        );
    }

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
