//! Versioned boot images on disk: `unbounded-bootserver install-images --from <set> --to
//! <imagesDir>` installs one set ([`unbounded_api::boot_images`]: a kernel, an initrd and a
//! node image with their digests in `manifest.json`) into `<imagesDir>/<version>/`, and
//! [`check_installed`] tells the start-up check ([`crate::preflight`]) whether each installed
//! set still matches its manifest.
//!
//! The Deployment runs the installer as an init container from the boot images' own OCI
//! image (`unbounded/boot-images:<version>`, which carries this binary beside the set), one
//! init container per version that MachineConfigurations still name; see docs/images.md
//! ("Boot images: versions and rolls").
//!
//! Rules, decided by [`plan_install`] from what is on disk:
//! - every byte is verified while it is copied: a file whose size or SHA-256 differs from
//!   the manifest is refused and nothing of the set is installed;
//! - a set appears at once or not at all: it is written into a hidden directory of the
//!   images directory, synced, then renamed into place;
//! - a version never changes: a manifest whose version is installed with other contents is
//!   refused (give the new set a new version); the same set again is a no-op (an init
//!   container that runs at every pod start costs one verification), and an installed copy
//!   that no longer matches its manifest (a damaged disk, a hand edit) is replaced.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use unbounded_api::boot_images::{BootImageFile, BootImagesManifest, MANIFEST_FILE, ManifestError};

/// Why a set was not installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The set's manifest is not valid.
    #[error("{path}: {source}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ManifestError,
    },
    /// A file of the set is not what the manifest says.
    #[error("refusing to install boot images {version}: {fault}")]
    Mismatch {
        /// The set's version.
        version: String,
        /// Which file and how it differs.
        fault: FileFault,
    },
    /// The version is installed with other contents.
    #[error(
        "refusing to install boot images {version}: {dir} holds that version with other contents, and a version never changes (give the new images a new version, or remove the directory if nothing boots from it)"
    )]
    VersionTaken {
        /// The version.
        version: String,
        /// The installed directory.
        dir: PathBuf,
    },
    /// The installed version's manifest cannot be read.
    #[error(
        "refusing to install boot images {version}: {dir} exists but its manifest cannot be read ({message}); remove the directory if nothing boots from it"
    )]
    UnreadableInstalled {
        /// The version.
        version: String,
        /// The installed directory.
        dir: PathBuf,
        /// Why.
        message: String,
    },
}

impl InstallError {
    /// A short label of the kind of failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Manifest { .. } => "manifest",
            Self::Mismatch { .. } => "mismatch",
            Self::VersionTaken { .. } => "version_taken",
            Self::UnreadableInstalled { .. } => "unreadable_installed",
        }
    }
}

/// How a file differs from its manifest entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileFault {
    /// It is not there (or not a regular file).
    #[error("{name} is missing or not a regular file")]
    Missing {
        /// The file.
        name: String,
    },
    /// Its size differs.
    #[error("{name} has {actual} bytes, the manifest says {expected}")]
    Size {
        /// The file.
        name: String,
        /// The manifest's size.
        expected: u64,
        /// The file's.
        actual: u64,
    },
    /// Its digest differs.
    #[error("{name} has sha256 {actual}, the manifest says {expected}")]
    Digest {
        /// The file.
        name: String,
        /// The manifest's digest.
        expected: String,
        /// The file's.
        actual: String,
    },
}

/// What the installer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallOutcome {
    /// The set was copied in.
    Installed {
        /// Its version.
        version: String,
        /// Bytes copied.
        bytes: u64,
    },
    /// The same set was already there, intact.
    AlreadyInstalled {
        /// Its version.
        version: String,
    },
    /// The same set was there but damaged; it was replaced.
    Repaired {
        /// Its version.
        version: String,
        /// What was wrong with the old copy.
        faults: Vec<FileFault>,
    },
}

/// A version directory as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Its manifest, or why it could not be read.
    pub manifest: Result<BootImagesManifest, String>,
    /// Files that differ from that manifest.
    pub faults: Vec<FileFault>,
}

/// What the installer will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallPlan {
    /// Nothing there yet: copy.
    Copy,
    /// The same set, intact.
    Nothing,
    /// The same set, damaged: copy and replace.
    Repair(Vec<FileFault>),
    /// Another set under this version: refuse.
    VersionTaken,
    /// A directory whose manifest cannot be read: refuse (it is not ours to delete).
    Unreadable(String),
}

/// Decides what to do with `source` given what is installed under its version.
pub fn plan_install(source: &BootImagesManifest, installed: Option<&Installed>) -> InstallPlan {
    let Some(installed) = installed else {
        return InstallPlan::Copy;
    };
    match &installed.manifest {
        Err(message) => InstallPlan::Unreadable(message.clone()),
        Ok(manifest) if manifest != source => InstallPlan::VersionTaken,
        Ok(_) if installed.faults.is_empty() => InstallPlan::Nothing,
        Ok(_) => InstallPlan::Repair(installed.faults.clone()),
    }
}

/// Digests already computed, by path, valid while the file's size, modification time and
/// inode stay the same: the start-up check runs again while it waits for a problem to be
/// fixed, and must not read every image each time.
#[derive(Debug, Default)]
pub struct DigestCache {
    known: HashMap<PathBuf, (FileStamp, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl FileStamp {
    fn of(metadata: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            len: metadata.len(),
            modified: metadata.modified().ok(),
            inode: metadata.ino(),
        }
    }
}

impl DigestCache {
    /// The file's SHA-256, computed once per version of the file.
    pub fn sha256(&mut self, path: &Path, metadata: &fs::Metadata) -> std::io::Result<String> {
        let stamp = FileStamp::of(metadata);
        if let Some((known, digest)) = self.known.get(path)
            && *known == stamp
        {
            return Ok(digest.clone());
        }
        let digest = sha256_file(path)?;
        self.known.insert(path.to_owned(), (stamp, digest.clone()));
        Ok(digest)
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A file's SHA-256, streamed.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        context.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hex(context.finish().as_ref()))
}

/// Compares one file with its manifest entry: size first (cheap), then the digest.
pub fn check_file(
    path: &Path,
    expected: &BootImageFile,
    cache: &mut DigestCache,
) -> std::io::Result<Option<FileFault>> {
    let metadata = match fs::metadata(path) {
        Ok(m) if m.is_file() => m,
        Ok(_) => {
            return Ok(Some(FileFault::Missing {
                name: expected.name.clone(),
            }));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Some(FileFault::Missing {
                name: expected.name.clone(),
            }));
        }
        Err(e) => return Err(e),
    };
    if metadata.len() != expected.size {
        return Ok(Some(FileFault::Size {
            name: expected.name.clone(),
            expected: expected.size,
            actual: metadata.len(),
        }));
    }
    let actual = cache.sha256(path, &metadata)?;
    if actual != expected.sha256 {
        return Ok(Some(FileFault::Digest {
            name: expected.name.clone(),
            expected: expected.sha256.clone(),
            actual,
        }));
    }
    Ok(None)
}

/// Reads a version directory: its manifest and how its files compare with it. `None` when
/// there is no such directory.
pub fn inspect(dir: &Path, cache: &mut DigestCache) -> std::io::Result<Option<Installed>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let manifest = match fs::read(dir.join(MANIFEST_FILE)) {
        Ok(bytes) => BootImagesManifest::parse(&bytes).map_err(|e| e.to_string()),
        Err(e) => Err(format!("{MANIFEST_FILE}: {e}")),
    };
    let mut faults = Vec::new();
    if let Ok(manifest) = &manifest {
        for file in &manifest.files {
            if let Some(fault) = check_file(&dir.join(&file.name), file, cache)? {
                faults.push(fault);
            }
        }
    }
    Ok(Some(Installed { manifest, faults }))
}

/// One installed version as the start-up check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledVersion {
    /// The directory's name.
    pub version: String,
    /// What it holds.
    pub installed: Installed,
}

/// Every version directory under the images directory that has a manifest (hidden
/// directories, the installer's work in progress, are skipped; so are directories without
/// a manifest, which hold images served as they are).
pub fn check_installed(
    images_dir: &Path,
    cache: &mut DigestCache,
) -> std::io::Result<Vec<InstalledVersion>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(images_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !name.starts_with('.') && path.is_dir() && path.join(MANIFEST_FILE).exists() {
            dirs.push((name, path));
        }
    }
    dirs.sort();
    for (version, path) in dirs {
        if let Some(mut installed) = inspect(&path, cache)? {
            // A manifest that names another version than its directory would make
            // MachineConfigurations' URLs and digests disagree.
            if let Ok(manifest) = &installed.manifest
                && manifest.version != version
            {
                installed.manifest = Err(format!(
                    "the manifest says version {}, the directory is {version}",
                    manifest.version
                ));
            }
            out.push(InstalledVersion { version, installed });
        }
    }
    Ok(out)
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_owned();
    move |source| InstallError::Io { what, path, source }
}

/// Copies `from` to `to`, hashing what is written; the copy is synced. Returns the size
/// and the digest of the bytes copied.
fn copy_hashed(from: &Path, to: &Path) -> Result<(u64, String), InstallError> {
    let mut source = fs::File::open(from).map_err(io_err("opening", from))?;
    let mut target = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(io_err("creating", to))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = source.read(&mut buf).map_err(io_err("reading", from))?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        context.update(chunk);
        target.write_all(chunk).map_err(io_err("writing", to))?;
        total += n as u64;
    }
    target.sync_all().map_err(io_err("syncing", to))?;
    Ok((total, hex(context.finish().as_ref())))
}

fn sync_dir(dir: &Path) -> Result<(), InstallError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("syncing", dir))
}

/// Installs the set in `from` (its `manifest.json` and files) under `to/<version>/`.
pub fn install(from: &Path, to: &Path) -> Result<InstallOutcome, InstallError> {
    let manifest_path = from.join(MANIFEST_FILE);
    let bytes = fs::read(&manifest_path).map_err(io_err("reading", &manifest_path))?;
    let manifest = BootImagesManifest::parse(&bytes).map_err(|source| InstallError::Manifest {
        path: manifest_path.clone(),
        source,
    })?;
    let version = manifest.version.clone();
    fs::create_dir_all(to).map_err(io_err("creating", to))?;
    let target = to.join(&version);
    let mut cache = DigestCache::default();
    let installed = inspect(&target, &mut cache).map_err(io_err("reading", &target))?;
    let faults = match plan_install(&manifest, installed.as_ref()) {
        InstallPlan::Nothing => return Ok(InstallOutcome::AlreadyInstalled { version }),
        InstallPlan::VersionTaken => {
            return Err(InstallError::VersionTaken {
                version,
                dir: target,
            });
        }
        InstallPlan::Unreadable(message) => {
            return Err(InstallError::UnreadableInstalled {
                version,
                dir: target,
                message,
            });
        }
        InstallPlan::Copy => None,
        InstallPlan::Repair(faults) => Some(faults),
    };

    let pid = std::process::id();
    let work = to.join(format!(".install-{version}-{pid}"));
    if work.exists() {
        fs::remove_dir_all(&work).map_err(io_err("removing", &work))?;
    }
    fs::create_dir(&work).map_err(io_err("creating", &work))?;
    let copied = copy_set(from, &work, &manifest);
    let bytes = match copied {
        Ok(bytes) => bytes,
        Err(error) => {
            let _ = fs::remove_dir_all(&work);
            return Err(error);
        }
    };
    match &faults {
        None => {
            fs::rename(&work, &target).map_err(io_err("renaming into place", &target))?;
        }
        Some(_) => {
            let old = to.join(format!(".old-{version}-{pid}"));
            fs::rename(&target, &old).map_err(io_err("moving aside", &target))?;
            fs::rename(&work, &target).map_err(io_err("renaming into place", &target))?;
            let _ = fs::remove_dir_all(&old);
        }
    }
    sync_dir(to)?;
    Ok(match faults {
        None => InstallOutcome::Installed { version, bytes },
        Some(faults) => InstallOutcome::Repaired { version, faults },
    })
}

/// Copies and verifies each file of the set into `work`, then its manifest (last: a
/// directory with a manifest is complete).
fn copy_set(from: &Path, work: &Path, manifest: &BootImagesManifest) -> Result<u64, InstallError> {
    let mut bytes = 0;
    for file in &manifest.files {
        let source = from.join(&file.name);
        if !source.is_file() {
            return Err(InstallError::Mismatch {
                version: manifest.version.clone(),
                fault: FileFault::Missing {
                    name: file.name.clone(),
                },
            });
        }
        let (size, sha256) = copy_hashed(&source, &work.join(&file.name))?;
        let fault = if size != file.size {
            Some(FileFault::Size {
                name: file.name.clone(),
                expected: file.size,
                actual: size,
            })
        } else if sha256 != file.sha256 {
            Some(FileFault::Digest {
                name: file.name.clone(),
                expected: file.sha256.clone(),
                actual: sha256,
            })
        } else {
            None
        };
        if let Some(fault) = fault {
            return Err(InstallError::Mismatch {
                version: manifest.version.clone(),
                fault,
            });
        }
        bytes += size;
    }
    let manifest_path = work.join(MANIFEST_FILE);
    let mut out = fs::File::create(&manifest_path).map_err(io_err("creating", &manifest_path))?;
    out.write_all(&manifest.to_json())
        .and_then(|()| out.sync_all())
        .map_err(io_err("writing", &manifest_path))?;
    sync_dir(work)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::boot_images::{BootImageRole, content_version};

    /// A set of three small files in a directory, with its manifest.
    fn set(dir: &Path, node: &[u8]) -> BootImagesManifest {
        fs::create_dir_all(dir).unwrap();
        let contents: [(&str, BootImageRole, &[u8]); 3] = [
            ("vmlinuz", BootImageRole::Kernel, b"kernel"),
            ("initrd.img", BootImageRole::Initrd, b"initrd"),
            ("node.tar.zst", BootImageRole::NodeImage, node),
        ];
        let files: Vec<BootImageFile> = contents
            .iter()
            .map(|(name, role, bytes)| {
                fs::write(dir.join(name), bytes).unwrap();
                BootImageFile {
                    name: (*name).into(),
                    role: *role,
                    size: bytes.len() as u64,
                    sha256: hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref()),
                }
            })
            .collect();
        let manifest = BootImagesManifest {
            version: content_version(&files),
            files,
            kubernetes_version: None,
        };
        fs::write(dir.join(MANIFEST_FILE), manifest.to_json()).unwrap();
        manifest
    }

    #[test]
    fn plans_follow_what_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        let source = set(dir.path(), b"node");
        let other = BootImagesManifest {
            version: source.version.clone(),
            files: source.files.iter().rev().cloned().collect(),
            kubernetes_version: None,
        };
        let fault = FileFault::Missing {
            name: "vmlinuz".into(),
        };
        let installed = |manifest: Result<BootImagesManifest, String>, faults: Vec<FileFault>| {
            Installed { manifest, faults }
        };
        let cases = [
            ("nothing there", None, InstallPlan::Copy),
            (
                "the same, intact",
                Some(installed(Ok(source.clone()), vec![])),
                InstallPlan::Nothing,
            ),
            (
                "the same, damaged",
                Some(installed(Ok(source.clone()), vec![fault.clone()])),
                InstallPlan::Repair(vec![fault.clone()]),
            ),
            (
                "another set under the version",
                Some(installed(Ok(other), vec![])),
                InstallPlan::VersionTaken,
            ),
            (
                "an unreadable manifest",
                Some(installed(Err("bad".into()), vec![])),
                InstallPlan::Unreadable("bad".into()),
            ),
        ];
        for (case, installed, plan) in cases {
            assert_eq!(plan_install(&source, installed.as_ref()), plan, "{case}");
        }
    }

    #[test]
    fn a_set_installs_once_and_is_then_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("images");
        let manifest = set(&from, b"node image");
        let outcome = install(&from, &to).unwrap();
        assert_eq!(
            outcome,
            InstallOutcome::Installed {
                version: manifest.version.clone(),
                bytes: 22
            }
        );
        let installed = to.join(&manifest.version);
        assert_eq!(
            fs::read(installed.join("node.tar.zst")).unwrap(),
            b"node image"
        );
        assert_eq!(
            BootImagesManifest::parse(&fs::read(installed.join(MANIFEST_FILE)).unwrap()).unwrap(),
            manifest
        );
        assert_eq!(
            install(&from, &to).unwrap(),
            InstallOutcome::AlreadyInstalled {
                version: manifest.version.clone()
            }
        );
        let leftovers: Vec<_> = fs::read_dir(&to)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [std::ffi::OsString::from(&manifest.version)]);
    }

    #[test]
    fn a_file_that_does_not_match_is_refused_and_nothing_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("images");
        let manifest = set(&from, b"node image");
        // Same size, other bytes: only the digest can tell.
        fs::write(from.join("node.tar.zst"), b"NODE IMAGE").unwrap();
        let error = install(&from, &to).unwrap_err();
        assert_eq!(error.reason(), "mismatch");
        let text = error.to_string();
        assert!(
            text.contains(&format!(
                "refusing to install boot images {}",
                manifest.version
            )) && text.contains("node.tar.zst has sha256")
                && text.contains(&format!("the manifest says {}", manifest.files[2].sha256)),
            "{text}"
        );
        assert_eq!(fs::read_dir(&to).unwrap().count(), 0, "nothing left behind");

        fs::write(from.join("node.tar.zst"), b"short").unwrap();
        let text = install(&from, &to).unwrap_err().to_string();
        assert!(
            text.contains("node.tar.zst has 5 bytes, the manifest says 10"),
            "{text}"
        );
    }

    #[test]
    fn a_damaged_copy_is_repaired_and_another_set_under_its_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let to = dir.path().join("images");
        let manifest = set(&from, b"node image");
        install(&from, &to).unwrap();
        let installed = to.join(&manifest.version);
        fs::write(installed.join("vmlinuz"), b"kernek").unwrap();
        match install(&from, &to).unwrap() {
            InstallOutcome::Repaired { faults, .. } => {
                assert!(
                    matches!(&faults[..], [FileFault::Digest { name, .. }] if name == "vmlinuz")
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(fs::read(installed.join("vmlinuz")).unwrap(), b"kernel");

        // Other contents under the same version name.
        let mut other = manifest.clone();
        fs::write(from.join("node.tar.zst"), b"other node").unwrap();
        other.files[2].sha256 =
            hex(ring::digest::digest(&ring::digest::SHA256, b"other node").as_ref());
        fs::write(from.join(MANIFEST_FILE), other.to_json()).unwrap();
        let error = install(&from, &to).unwrap_err();
        assert_eq!(error.reason(), "version_taken", "{error}");
        assert!(error.to_string().contains("a version never changes"));
        assert_eq!(
            fs::read(installed.join("node.tar.zst")).unwrap(),
            b"node image"
        );
    }

    #[test]
    fn installed_versions_are_checked_against_their_manifests() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("images");
        let good = set(&dir.path().join("good"), b"good node");
        let bad = set(&dir.path().join("bad"), b"bad node!");
        install(&dir.path().join("good"), &images).unwrap();
        install(&dir.path().join("bad"), &images).unwrap();
        fs::write(images.join(&bad.version).join("node.tar.zst"), b"bad nodeX").unwrap();
        // Files served as they are (no manifest) and the installer's work are not checked.
        fs::write(images.join("vmlinuz"), b"flat").unwrap();
        fs::create_dir(images.join(".install-x-1")).unwrap();
        let mut cache = DigestCache::default();
        let found = check_installed(&images, &mut cache).unwrap();
        let summary: Vec<(&str, usize)> = found
            .iter()
            .map(|v| (v.version.as_str(), v.installed.faults.len()))
            .collect();
        let mut expected = vec![(good.version.as_str(), 0), (bad.version.as_str(), 1)];
        expected.sort();
        assert_eq!(summary, expected);

        // A renamed directory no longer agrees with its manifest.
        fs::rename(images.join(&good.version), images.join("renamed")).unwrap();
        let found = check_installed(&images, &mut cache).unwrap();
        let renamed = found.iter().find(|v| v.version == "renamed").unwrap();
        assert!(
            renamed
                .installed
                .manifest
                .as_ref()
                .is_err_and(|e| e.contains("the directory is renamed")),
            "{renamed:?}"
        );
    }
}
