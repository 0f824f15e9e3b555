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

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::{self, KUBERNETES_VERSION};
use crate::containers::{BuiltContainers, ContainerError};
use crate::failure::Failure;
use crate::oci::{self, ImageSpec, Layer, LayerCompression, LayerFile};
use cache::{Progress, cached_build, run_logged};
use cargo::release_builds;
use container_set::container_images;

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
    /// A step failed on another error, which it keeps.
    #[error("{step}: {source}")]
    Failed {
        /// Which step.
        step: &'static str,
        /// Why.
        #[source]
        source: Failure,
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

fn step_failed(step: &'static str, source: Failure) -> ImagesError {
    ImagesError::Failed { step, source }
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

/// Builds (or finds in the cache) every image.
pub fn build(options: &Options) -> Result<Images, ImagesError> {
    let recipes = recipes_dir();
    let mut progress = Progress {
        total: if options.containers { 10 } else { 6 },
        done: 0,
    };
    let kubelet = kubelet_step(&mut progress, KUBERNETES_VERSION)?;

    let node = node_image_steps(&mut progress, &recipes, &kubelet, "node")?;

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

/// Kubernetes `version`'s kubelet: the control plane's build for the testbed's release (all
/// its binaries), that release's kubelet alone for another.
fn kubelet_step(progress: &mut Progress, version: &str) -> Result<PathBuf, ImagesError> {
    progress.run(&format!("Kubernetes {version} (kubelet)"), || {
        let cached = cluster::cache_dir()
            .join(format!("kubernetes-{version}/kubelet"))
            .is_file();
        let kubelet = if version == KUBERNETES_VERSION {
            cluster::Binaries::ensure()?.kubelet
        } else {
            cluster::kubelet_of(version)?
        };
        Ok((kubelet, cached))
    })
}

/// The node image around `kubelet`: containerd and the CNI plugins, the pause image, then
/// the image itself (each cached by its inputs).
fn node_image_steps(
    progress: &mut Progress,
    recipes: &Path,
    kubelet: &Path,
    cache_name: &str,
) -> Result<NodeImage, ImagesError> {
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

    progress.run("node image (debootstrap, kubelet, containerd)", || {
        let key = Key::default()
            .path("recipe", &recipes.join("node/build.sh"))?
            .path("overlay", &recipes.join("node/overlay"))?
            .path("kubelet", kubelet)?
            .path("tools", &tools)?
            .path("pause", &pause)?
            .text("mirror", &mirror())
            .finish();
        let (dir, cached) = cached_build(cache_name, &key, |dir| {
            run_logged(
                "node image",
                Command::new("bash")
                    .arg(recipes.join("node/build.sh"))
                    .arg(dir)
                    .arg(kubelet)
                    .arg(&tools)
                    .arg(&pause)
                    .env("DEBIAN_MIRROR", mirror()),
                &dir.join("build.log"),
            )
        })?;
        let sha256 = fs::read_to_string(dir.join("node.tar.zst.sha256"))
            .map_err(|e| step_failed("node image", Failure::of(e)))?
            .trim()
            .to_owned();
        Ok((
            NodeImage {
                archive: dir.join("node.tar.zst"),
                sha256,
            },
            cached,
        ))
    })
}

/// The node image of another Kubernetes release than the testbed's (`images --kubelet`):
/// its kubelet built from that release's Go modules, the rest as the default image's, each
/// step cached. A MachineConfiguration runs it with `kubernetes.version` set to `version`
/// (the agent refuses an image whose kubelet is another).
pub fn node_image_for(version: &str) -> Result<NodeImage, ImagesError> {
    if !unbounded_api::boot_images::valid_release(version) {
        return Err(step_err(
            "node image",
            format!("{version:?} is not a Kubernetes release such as v1.34.4"),
        ));
    }
    let recipes = recipes_dir();
    let mut progress = Progress { total: 4, done: 0 };
    let kubelet = kubelet_step(&mut progress, version)?;
    // A cache entry of its own: the cache keeps one build per name, and the testbed's
    // default image (which a running lab serves) must not make way for this one.
    let cache_name = if version == KUBERNETES_VERSION {
        "node".to_owned()
    } else {
        format!("node-{version}")
    };
    node_image_steps(&mut progress, &recipes, &kubelet, &cache_name)
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
    fs::write(current_path(), json.to_string()).map_err(|e| step_failed("cache", Failure::of(e)))
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

mod cache;
mod cargo;
mod container_set;

pub use cache::{Key, file_sha256};
pub use cargo::{host_build, set_by_cargo_run};
pub use container_set::{cached_containers, containers_path};
