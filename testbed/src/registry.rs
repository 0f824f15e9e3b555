//! The lab's container registry: Debian's `docker-registry` (the CNCF distribution
//! registry, 2.8) on the provisioning bridge, over plain HTTP, with its storage on tmpfs.
//!
//! It is how the project's images reach the appliance node's containerd as in a real
//! cluster (pulled by reference, not imported by hand): the OCI layouts that `images
//! --containers` writes are pushed with `skopeo` (digests preserved, so the lab names them
//! by digest), and containerd trusts the plain-HTTP registry through a `hosts.toml` that the
//! appliance's MachineConfiguration writes into the node container.
//!
//! It also serves the boot artifacts by digest before any bootserver runs: a file pushed as
//! a blob is `GET /v2/<repository>/blobs/sha256:<hex>`, and its digest is the SHA-256 a
//! MachineConfiguration's `image.sha256` names. The appliance's own node image cannot come
//! from the bootserver that will run on it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::netns::Netns;
use crate::process::Process;

fn step(message: impl Into<String>) -> LabError {
    LabError::Step(message.into())
}

/// The registry's port on the bridge.
pub const REGISTRY_PORT: u16 = 5000;

/// Where a running registry is reached: `host:port`, plain HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAddress(pub String);

impl RegistryAddress {
    /// The base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.0)
    }

    /// The URL of a blob.
    pub fn blob_url(&self, repository: &str, sha256: &str) -> String {
        format!("{}/v2/{repository}/blobs/sha256:{sha256}", self.url())
    }

    /// An image reference in this registry by digest.
    pub fn by_digest(&self, repository: &str, digest: &str) -> String {
        format!("{}/{repository}@{digest}", self.0)
    }

    /// containerd's `hosts.toml` for this registry (plain HTTP, pull and resolve), and the
    /// path where containerd 2 looks for it (its default `config_path`).
    pub fn containerd_hosts(&self) -> (String, String) {
        (
            format!("/etc/containerd/certs.d/{}/hosts.toml", self.0),
            format!(
                "# The testbed's registry: plain HTTP on the provisioning network.\n\
                 server = \"{url}\"\n\n[host.\"{url}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                url = self.url()
            ),
        )
    }

    /// Pushes the image of an OCI layout (the manifest tagged `layout_tag` in it) as
    /// `<repository>:<tag>`, digests preserved; returns the manifest's digest.
    pub fn push_layout(
        &self,
        layout: &Path,
        layout_tag: &str,
        repository: &str,
        tag: &str,
    ) -> Result<String, LabError> {
        let digest_file = tempfile::NamedTempFile::new().map_err(Failure::of)?;
        let output = Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--quiet", "--preserve-digests"])
            .args(["--dest-tls-verify=false", "--digestfile"])
            .arg(digest_file.path())
            .arg(format!("oci:{}:{layout_tag}", layout.display()))
            .arg(format!("docker://{}/{repository}:{tag}", self.0))
            .env("NO_PROXY", self.host())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Failure::new("skopeo", e))?;
        if !output.status.success() {
            return Err(step(format!(
                "pushing {} to {}/{repository}:{tag}: {}",
                layout.display(),
                self.0,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let digest = fs::read_to_string(digest_file.path())
            .map_err(|e| Failure::new("skopeo's digest file", e))?;
        Ok(digest.trim().to_owned())
    }

    /// Uploads `file` (whose SHA-256 is `sha256`) as a blob of `repository` unless it is
    /// there, and returns its URL.
    pub fn push_blob(
        &self,
        repository: &str,
        file: &Path,
        sha256: &str,
    ) -> Result<String, LabError> {
        let url = self.blob_url(repository, sha256);
        if curl(&["-sf", "-o", "/dev/null", "-I", &url], &self.host()).is_ok() {
            return Ok(url);
        }
        // The registry's upload protocol: open an upload, then PUT the whole blob to the
        // location it answered, naming the digest it must have.
        let headers = curl(
            &[
                "-sf",
                "-D",
                "-",
                "-o",
                "/dev/null",
                "-X",
                "POST",
                &format!("{}/v2/{repository}/blobs/uploads/", self.url()),
            ],
            &self.host(),
        )?;
        let location = upload_location(&headers).ok_or_else(|| {
            step(format!(
                "the registry answered no upload location for {repository}: {headers}"
            ))
        })?;
        let separator = if location.contains('?') { '&' } else { '?' };
        let target = format!("{location}{separator}digest=sha256:{sha256}");
        curl(
            &[
                "-sf",
                "-o",
                "/dev/null",
                "-X",
                "PUT",
                "-H",
                "Content-Type: application/octet-stream",
                "--data-binary",
                &format!("@{}", file.display()),
                &target,
            ],
            &self.host(),
        )
        .map_err(|e| Failure::new(format!("uploading {}", file.display()), e))?;
        Ok(url)
    }

    fn host(&self) -> String {
        self.0.split(':').next().unwrap_or_default().to_owned()
    }
}

fn curl(args: &[&str], no_proxy: &str) -> Result<String, LabError> {
    let output = Command::new("curl")
        .args(["--max-time", "300"])
        .args(args)
        .env("NO_PROXY", no_proxy)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failure::new("curl", e))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(step(format!(
            "curl {} failed ({}): {}",
            args.last().copied().unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// The `Location` of an upload from response headers; a relative location is made absolute
/// by the caller's base (the registry answers absolute ones).
fn upload_location(headers: &str) -> Option<String> {
    headers.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("location")
            .then(|| value.trim().to_owned())
    })
}

/// The registry process.
#[derive(Debug)]
pub struct LabRegistry {
    /// Where it listens.
    pub address: RegistryAddress,
    _process: Process,
    storage: PathBuf,
}

impl LabRegistry {
    /// Starts `docker-registry` in `ns` on `bind:`[`REGISTRY_PORT`], its configuration and
    /// log in `dir`, its storage on tmpfs when there is one; waits until it answers `/v2/`.
    pub fn start(ns: &Netns, bind: &str, dir: &Path) -> Result<Self, LabError> {
        let program = crate::cluster::find_program(
            "docker-registry",
            "run scripts/install-deps.sh (Debian package docker-registry)",
        )
        .map_err(Failure::of)?;
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let storage = base.join(format!("unbounded-registry-{}", std::process::id()));
        let _ = fs::remove_dir_all(&storage);
        fs::create_dir_all(&storage).map_err(|e| Failure::new(storage.display(), e))?;
        let address = RegistryAddress(format!("{bind}:{REGISTRY_PORT}"));
        let config = dir.join("registry.yml");
        fs::write(&config, registry_config(&address, &storage))
            .map_err(|e| Failure::new(config.display(), e))?;
        let process = Process::spawn(
            "registry",
            Some(ns),
            &program,
            &["serve".into(), config.display().to_string()],
            &[],
            dir.join("registry.log"),
        )?;
        let registry = Self {
            address,
            _process: process,
            storage,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let probe = format!("{}/v2/", registry.address.url());
        while ns
            .exec(&["curl", "-sf", "-o", "/dev/null", "--max-time", "2", &probe])
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(step(format!(
                    "the registry did not answer {probe} within 30 s; its log: {}",
                    dir.join("registry.log").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(registry)
    }
}

impl Drop for LabRegistry {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.storage);
    }
}

/// The registry's configuration: plain HTTP on the lab's address, filesystem storage, no
/// deletes, warnings only (no access log: every pull would be a line).
pub fn registry_config(address: &RegistryAddress, storage: &Path) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog: {{disabled: true}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: false}}\nhttp:\n  addr: {}\n",
        storage.display(),
        address.0
    )
}

/// Writes into `out` a copy of the OCI layout `layout` (its manifest tagged `tag`) whose
/// image config carries one more label, `key=value`, tagged `new_tag`: the same files, a new
/// config and so a new manifest digest (what an upgrade to a new build looks like to
/// Kubernetes). Returns the new manifest's digest.
pub fn relabelled_layout(
    layout: &Path,
    tag: &str,
    out: &Path,
    new_tag: &str,
    key: &str,
    value: &str,
) -> Result<String, LabError> {
    use serde_json::Value;
    let read_json = |path: &Path| -> Result<Value, LabError> {
        let bytes = fs::read(path).map_err(|e| Failure::new(path.display(), e))?;
        serde_json::from_slice(&bytes).map_err(|e| Failure::new(path.display(), e).into())
    };
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let index = read_json(&layout.join("index.json"))?;
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    let entry = manifests
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .ok_or_else(|| step(format!("{} has no image tagged {tag}", layout.display())))?;
    let manifest_digest = entry["digest"].as_str().unwrap_or_default();
    let mut manifest = read_json(&blob(manifest_digest))?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut config = read_json(&blob(&config_digest))?;
    if !config["config"]["Labels"].is_object() {
        config["config"]["Labels"] = serde_json::json!({});
    }
    config["config"]["Labels"][key] = Value::String(value.to_owned());

    let _ = fs::remove_dir_all(out);
    let blobs = out.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(|e| Failure::new(blobs.display(), e))?;
    for layer in manifest["layers"].as_array().cloned().unwrap_or_default() {
        let digest = layer["digest"].as_str().unwrap_or_default();
        let name = digest.trim_start_matches("sha256:");
        fs::copy(blob(digest), blobs.join(name))
            .map_err(|e| Failure::new(format!("layer {digest}"), e))?;
    }
    let put = |bytes: Vec<u8>| -> Result<(String, usize), LabError> {
        let hex = crate::oci::sha256_hex(&bytes);
        fs::write(blobs.join(&hex), &bytes).map_err(Failure::of)?;
        Ok((format!("sha256:{hex}"), bytes.len()))
    };
    let (new_config, config_size) = put(serde_json::to_vec(&config).map_err(Failure::of)?)?;
    manifest["config"]["digest"] = Value::String(new_config);
    manifest["config"]["size"] = Value::from(config_size);
    let (new_manifest, manifest_size) = put(serde_json::to_vec(&manifest).map_err(Failure::of)?)?;
    let mut new_entry = entry.clone();
    new_entry["digest"] = Value::String(new_manifest.clone());
    new_entry["size"] = Value::from(manifest_size);
    new_entry["annotations"]["org.opencontainers.image.ref.name"] = Value::String(new_tag.into());
    if let Some(name) = new_entry["annotations"]["io.containerd.image.name"].as_str() {
        let repository = name.rsplit_once(':').map_or(name, |(r, _)| r).to_owned();
        new_entry["annotations"]["io.containerd.image.name"] =
            Value::String(format!("{repository}:{new_tag}"));
    }
    let new_index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [new_entry],
    });
    fs::write(
        out.join("index.json"),
        serde_json::to_vec(&new_index).map_err(Failure::of)?,
    )
    .map_err(Failure::of)?;
    fs::write(out.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(Failure::of)?;
    Ok(new_manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upload_location_is_read_from_any_header_case() {
        let headers = "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nlocation: http://10.99.0.1:5000/v2/x/blobs/uploads/u?_state=s\r\n\r\n";
        assert_eq!(
            upload_location(headers).as_deref(),
            Some("http://10.99.0.1:5000/v2/x/blobs/uploads/u?_state=s")
        );
        assert_eq!(upload_location("HTTP/1.1 500\r\n\r\n"), None);
    }

    #[test]
    fn containerd_is_told_to_pull_over_plain_http() {
        let address = RegistryAddress("10.99.0.1:5000".into());
        let (path, content) = address.containerd_hosts();
        assert_eq!(path, "/etc/containerd/certs.d/10.99.0.1:5000/hosts.toml");
        assert!(
            content.contains("server = \"http://10.99.0.1:5000\""),
            "{content}"
        );
        assert!(
            content.contains("[host.\"http://10.99.0.1:5000\"]"),
            "{content}"
        );
        assert_eq!(
            address.by_digest("unbounded/controller", "sha256:ab"),
            "10.99.0.1:5000/unbounded/controller@sha256:ab"
        );
    }

    #[test]
    fn a_relabelled_layout_keeps_the_files_and_gets_a_new_digest() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::write(&bin, b"\x7fELF...").unwrap();
        let written = crate::oci::write_image(
            &crate::oci::ImageSpec {
                references: vec!["example.invalid/x:1".into()],
                layers: vec![crate::oci::Layer {
                    files: vec![crate::oci::LayerFile::copy("/usr/local/bin/x", bin, 0o755)],
                    compression: crate::oci::LayerCompression::Gzip,
                    comment: "x".into(),
                }],
                entrypoint: vec!["/usr/local/bin/x".into()],
                user: "65532:65532".into(),
                env: vec![],
                labels: vec![],
            },
            &dir.path().join("a"),
        )
        .unwrap();
        let out = dir.path().join("b");
        let digest =
            relabelled_layout(&written.layout, "1", &out, "1-r2", "io.example/rev", "2").unwrap();
        assert_ne!(digest, written.manifest_digest);
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("index.json")).unwrap()).unwrap();
        assert_eq!(index["manifests"][0]["digest"], digest.as_str());
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "1-r2"
        );
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "example.invalid/x:1-r2"
        );
        let blob = |d: &str| {
            out.join("blobs/sha256")
                .join(d.trim_start_matches("sha256:"))
        };
        let manifest: serde_json::Value =
            serde_json::from_slice(&fs::read(blob(&digest)).unwrap()).unwrap();
        let old: serde_json::Value = serde_json::from_slice(
            &fs::read(
                written
                    .layout
                    .join("blobs/sha256")
                    .join(written.manifest_digest.trim_start_matches("sha256:")),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(manifest["layers"], old["layers"], "the same files");
        let config: serde_json::Value = serde_json::from_slice(
            &fs::read(blob(manifest["config"]["digest"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        assert_eq!(config["config"]["Labels"]["io.example/rev"], "2");
        assert!(blob(manifest["layers"][0]["digest"].as_str().unwrap()).is_file());
    }
}
