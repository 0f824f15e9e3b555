//! What a recipe's output holds (`contents.txt`) and what `contents.lock` pins, one line a
//! Debian package or a file made from one: read, checked against the lock, and turned into
//! an image's files and SBOM packages.

use std::path::{Path, PathBuf};

use super::ContainerError;
use crate::failure::Failure;
use crate::oci::LayerFile;
use crate::sbom::{self, Package};

/// A line of `contents.lock` or of the `contents.txt` the recipe writes: kind, name,
/// version, SHA-256, origin (`-` for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentLine {
    /// `deb` (a Debian package) or `file` (a file made from one).
    pub kind: String,
    /// The package or file name.
    pub name: String,
    /// The version, if any.
    pub version: Option<String>,
    /// The SHA-256, if any.
    pub sha256: Option<String>,
    /// Where a file comes from (`deb:<package>:<path>`, `bundle:<package>:<directory>`).
    pub origin: Option<String>,
}

/// Parses the lock's format (comments with `#`, blank lines ignored).
pub fn parse_contents(text: &str) -> Result<Vec<ContentLine>, String> {
    let dash = |s: &str| (s != "-").then(|| s.to_owned());
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [kind, name, version, sha256, origin] = words[..] else {
                return Err(format!("expected 5 columns: {line:?}"));
            };
            if !matches!(kind, "deb" | "file") {
                return Err(format!("unknown kind {kind:?}: {line:?}"));
            }
            Ok(ContentLine {
                kind: kind.to_owned(),
                name: name.to_owned(),
                version: dash(version),
                sha256: dash(sha256),
                origin: dash(origin),
            })
        })
        .collect()
}

/// The recipe's output: the files and what it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    /// Its directory.
    pub dir: PathBuf,
    /// `contents.txt`.
    pub lines: Vec<ContentLine>,
}

impl Contents {
    /// Reads a recipe output directory.
    pub fn read(dir: &Path) -> Result<Self, ContainerError> {
        let path = dir.join("contents.txt");
        let text = std::fs::read_to_string(&path).map_err(|e| Failure::new(path.display(), e))?;
        let lines = parse_contents(&text)
            .map_err(|e| ContainerError::Input(format!("{}: {e}", path.display())))?;
        Ok(Self {
            dir: dir.to_owned(),
            lines,
        })
    }

    fn line(&self, kind: &str, name: &str) -> Result<&ContentLine, ContainerError> {
        self.lines
            .iter()
            .find(|l| l.kind == kind && l.name == name)
            .ok_or_else(|| ContainerError::Input(format!("the contents list no {kind} {name}")))
    }

    /// The `file` lines under `prefix` (such as `ipxe/`).
    pub fn files_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a ContentLine> {
        self.lines
            .iter()
            .filter(move |l| l.kind == "file" && l.name.starts_with(prefix))
    }

    /// The SBOM keys of the packages a file comes from: `deb:<package>@<suite>` of an origin
    /// `deb:<package>@<suite>:<path>` or `bundle:<package>@<suite>:<directory>`.
    fn origin_keys(line: &ContentLine) -> Vec<String> {
        let origin = line.origin.as_deref().unwrap_or_default();
        let mut parts = origin.splitn(3, ':');
        match (parts.next(), parts.next()) {
            (Some("deb" | "bundle"), Some(package)) => vec![format!("deb:{package}")],
            _ => Vec::new(),
        }
    }

    /// An image file from the line `file <name>`, checked against the digest recorded.
    pub(super) fn image_file(
        &self,
        name: &str,
        path_in_image: &str,
    ) -> Result<(LayerFile, sbom::File), ContainerError> {
        let line = self.line("file", name)?;
        let source = self.dir.join(name);
        let file = sbom::File::of_path(
            path_in_image,
            &source,
            Self::origin_keys(line),
            &format!("from {}", line.origin.as_deref().unwrap_or("?")),
        )?;
        if line.sha256.as_deref() != Some(file.sha256.as_str()) {
            return Err(ContainerError::Input(format!(
                "{}: sha256 {}, contents.txt says {:?}",
                source.display(),
                file.sha256,
                line.sha256
            )));
        }
        Ok((LayerFile::copy(path_in_image, source, 0o644), file))
    }

    /// The Debian packages behind `keys`, for an SBOM. A `deb` line's origin is
    /// `<archive>/<suite>` (`debian/trixie`); its key `deb:<name>@<suite>`.
    pub(super) fn packages(&self, keys: &[String]) -> Vec<Package> {
        self.lines
            .iter()
            .filter(|l| l.kind == "deb")
            .filter_map(|line| {
                let origin = line.origin.as_deref().unwrap_or_default();
                let (archive, suite) = origin.split_once('/').unwrap_or(("debian", origin));
                let key = format!("deb:{}@{suite}", line.name);
                keys.contains(&key).then(|| {
                    let version = line.version.clone().unwrap_or_default();
                    // The purl names the release by its codename (`bookworm` of
                    // `bookworm-security`).
                    let codename = suite.split('-').next().unwrap_or(suite);
                    Package {
                        key,
                        name: line.name.clone(),
                        version: version.clone(),
                        download: "NOASSERTION".into(),
                        sha256: line.sha256.clone(),
                        license: None,
                        purl: Some(format!(
                            "pkg:deb/debian/{}@{version}?arch=all&distro={codename}",
                            line.name
                        )),
                        purpose: "LIBRARY",
                        depends_on: Vec::new(),
                        comment: Some(format!(
                            "Debian binary package from {archive} {suite} (the checksum is the .deb's, as Debian's signed index lists it), pinned in images/containers/contents.lock"
                        )),
                    }
                })
            })
            .collect()
    }
}
