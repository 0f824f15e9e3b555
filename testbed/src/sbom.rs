//! Software bills of materials for the images `images --containers` builds: SPDX 2.3 JSON,
//! written into each image (`/usr/share/unbounded/sbom.spdx.json`) and beside its layout.
//!
//! What one lists:
//! - every file of the image with its SHA-256 (and the SHA-1 SPDX 2.3 asks of files) and
//!   where it came from (a `GENERATED_FROM` relationship to its package, and a comment);
//! - for a Rust binary, its crate and every crate linked into it, with the version and
//!   the checksum from `Cargo.lock` (`cargo tree` for the binary's package: normal
//!   dependencies for the image's target, no build scripts, no proc macros), the Rust
//!   toolchain and the static C library;
//! - the Debian packages other files come from, with their version and the `.deb`'s
//!   SHA-256 as pinned in `images/containers/contents.lock`.
//!
//! Lean on purpose: no SPDX library, the document is built from plain data here.
//! Reproducible: no time of day (the creation time is `SOURCE_DATE_EPOCH`, else the Unix
//! epoch), everything sorted, and the document namespace is derived from the contents.

use std::collections::BTreeMap;

use serde_json::json;

/// A package an image's files come from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    /// Kind and name, unique in the document (`crate:tokio@1.48.0`, `deb:ipxe`).
    pub key: String,
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Where it can be downloaded (`NOASSERTION` when nowhere public).
    pub download: String,
    /// SHA-256 of what was downloaded, when pinned.
    pub sha256: Option<String>,
    /// The declared licence (SPDX expression), when known.
    pub license: Option<String>,
    /// A package URL (`pkg:cargo/...`, `pkg:deb/debian/...`).
    pub purl: Option<String>,
    /// SPDX `primaryPackagePurpose` (`APPLICATION`, `LIBRARY`, `SOURCE`, `CONTAINER`).
    pub purpose: &'static str,
    /// Keys of packages it depends on (for a binary's crate: every linked crate).
    pub depends_on: Vec<String>,
    /// Free text: how it was used.
    pub comment: Option<String>,
}

/// A file of an image.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct File {
    /// Its absolute path in the image.
    pub path: String,
    /// Its SHA-256.
    pub sha256: String,
    /// Its SHA-1 (SPDX 2.3 requires one for a file).
    pub sha1: String,
    /// Keys of the packages it was made from.
    pub from: Vec<String>,
    /// Where it came from, in words.
    pub origin: String,
}

impl File {
    /// A file described by its bytes.
    pub fn of_bytes(path: &str, bytes: &[u8], from: Vec<String>, origin: &str) -> Self {
        Self {
            path: path.to_owned(),
            sha256: crate::oci::sha256_hex(bytes),
            sha1: crate::oci::hex(
                ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, bytes).as_ref(),
            ),
            from,
            origin: origin.to_owned(),
        }
    }

    /// A file on this machine, read to hash it.
    pub fn of_path(
        path: &str,
        source: &std::path::Path,
        from: Vec<String>,
        origin: &str,
    ) -> Result<Self, crate::failure::Failure> {
        use std::io::Read;
        let unreadable = |e| crate::failure::Failure::new(source.display(), e);
        let mut file = std::fs::File::open(source).map_err(unreadable)?;
        let mut sha256 = ring::digest::Context::new(&ring::digest::SHA256);
        let mut sha1 = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(unreadable)?;
            if n == 0 {
                break;
            }
            let chunk = buf.get(..n).unwrap_or_default();
            sha256.update(chunk);
            sha1.update(chunk);
        }
        Ok(Self {
            path: path.to_owned(),
            sha256: crate::oci::hex(sha256.finish().as_ref()),
            sha1: crate::oci::hex(sha1.finish().as_ref()),
            from,
            origin: origin.to_owned(),
        })
    }
}

/// One image's bill of materials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sbom {
    /// The image's name (`unbounded/bootserver`).
    pub name: String,
    /// Its version (the tag).
    pub version: String,
    /// Its files (the SBOM's own file is not among them: it cannot hash itself).
    pub files: Vec<File>,
    /// The packages they come from.
    pub packages: Vec<Package>,
}

/// A crate as `cargo tree` lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Whether it is one of this workspace's (a path dependency).
    pub local: bool,
    /// Its licence expression, as its manifest declares it.
    pub license: Option<String>,
}

/// Parses `cargo tree --prefix none --format '{p}|{l}'` output: one crate per line,
/// repeated ones marked ` (*)`, path crates followed by their directory in parentheses.
pub fn parse_cargo_tree(text: &str) -> Result<Vec<Crate>, String> {
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let line = line.strip_suffix(" (*)").unwrap_or(line);
        let (package, license) = line
            .split_once('|')
            .ok_or_else(|| format!("unexpected cargo tree line {line:?}"))?;
        let mut words = package.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            return Err(format!("unexpected cargo tree line {line:?}"));
        };
        let version = version
            .strip_prefix('v')
            .ok_or_else(|| format!("unexpected version in {line:?}"))?;
        let rest: Vec<&str> = words.collect();
        let local = rest.iter().any(|w| w.starts_with("(/"));
        let license = license.trim();
        out.insert(Crate {
            name: name.to_owned(),
            version: version.to_owned(),
            local,
            license: (!license.is_empty()).then(|| license.to_owned()),
        });
    }
    Ok(out.into_iter().collect())
}

/// The checksums `Cargo.lock` records, by (name, version).
pub fn lock_checksums(lock: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let (mut name, mut version) = (None, None);
    for line in lock.lines() {
        let value = |l: &str, key: &str| {
            l.strip_prefix(key)
                .map(|v| v.trim_matches(|c| c == '"' || c == ' ').to_owned())
        };
        if line == "[[package]]" {
            name = None;
            version = None;
        } else if let Some(v) = value(line, "name = ") {
            name = Some(v);
        } else if let Some(v) = value(line, "version = ") {
            version = Some(v);
        } else if let Some(v) = value(line, "checksum = ")
            && let (Some(n), Some(ver)) = (&name, &version)
        {
            out.insert((n.clone(), ver.clone()), v);
        }
    }
    out
}

/// The packages of a Rust binary: its crate (the application, depending on all others),
/// the crates linked into it, the Rust standard library of `rustc_version` and the static C
/// library (`libc`, a Debian package version).
pub fn rust_packages(
    binary_crate: &str,
    crates: &[Crate],
    checksums: &BTreeMap<(String, String), String>,
    rustc_version: &str,
    libc: &str,
) -> Vec<Package> {
    let key = |c: &Crate| format!("crate:{}@{}", c.name, c.version);
    let mut packages = Vec::new();
    let mut depends_on = Vec::new();
    for c in crates {
        if c.name == binary_crate {
            continue;
        }
        depends_on.push(key(c));
        packages.push(Package {
            key: key(c),
            name: c.name.clone(),
            version: c.version.clone(),
            download: if c.local {
                "NOASSERTION".into()
            } else {
                format!(
                    "https://crates.io/api/v1/crates/{}/{}/download",
                    c.name, c.version
                )
            },
            sha256: checksums.get(&(c.name.clone(), c.version.clone())).cloned(),
            license: c.license.clone(),
            purl: (!c.local).then(|| format!("pkg:cargo/{}@{}", c.name, c.version)),
            purpose: "LIBRARY",
            depends_on: Vec::new(),
            comment: c.local.then(|| "a crate of this workspace".to_owned()),
        });
    }
    for (name, version, comment) in [
        (
            "rust-std",
            rustc_version,
            "the Rust standard library of the compiler that built the binary",
        ),
        (
            "libc6-dev",
            libc,
            "Debian's C library, linked statically (glibc crt-static)",
        ),
    ] {
        let key = format!("toolchain:{name}");
        depends_on.push(key.clone());
        packages.push(Package {
            key,
            name: name.into(),
            version: version.into(),
            download: "NOASSERTION".into(),
            sha256: None,
            license: None,
            purl: (name == "libc6-dev")
                .then(|| format!("pkg:deb/debian/libc6-dev@{version}?arch=amd64")),
            purpose: "LIBRARY",
            depends_on: Vec::new(),
            comment: Some(comment.into()),
        });
    }
    let own = crates.iter().find(|c| c.name == binary_crate);
    packages.push(Package {
        key: format!(
            "crate:{binary_crate}@{}",
            own.map_or("0.0.0", |c| c.version.as_str())
        ),
        name: binary_crate.into(),
        version: own.map_or_else(String::new, |c| c.version.clone()),
        download: "NOASSERTION".into(),
        sha256: None,
        license: own.and_then(|c| c.license.clone()),
        purl: None,
        purpose: "APPLICATION",
        depends_on,
        comment: Some(
            "built by `unbounded-testbed images --containers` (cargo build --release, static)"
                .into(),
        ),
    });
    packages
}

/// An SPDX identifier: `SPDXRef-` and letters, digits, `.` and `-`.
fn spdx_id(kind: &str, text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("SPDXRef-{kind}-{}", cleaned.trim_matches('-'))
}

/// An RFC 3339 UTC time of seconds since the epoch (days to civil date: Howard Hinnant's
/// algorithm).
pub fn rfc3339(seconds: u64) -> String {
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    let rest = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The document's creation time: `SOURCE_DATE_EPOCH` (the reproducible-builds convention)
/// when set, else the epoch: never the time of the build.
pub fn creation_time() -> String {
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    rfc3339(seconds)
}

impl Sbom {
    /// The SPDX 2.3 JSON document, created at `created` (RFC 3339).
    pub fn to_spdx(&self, created: &str) -> Vec<u8> {
        let mut files = self.files.clone();
        files.sort();
        let mut packages = self.packages.clone();
        packages.sort();
        let image_id = "SPDXRef-Image".to_owned();
        let package_ids: BTreeMap<&str, String> = packages
            .iter()
            .map(|p| (p.key.as_str(), spdx_id("Package", &p.key)))
            .collect();

        let mut spdx_packages = vec![json!({
            "SPDXID": image_id,
            "name": self.name,
            "versionInfo": self.version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "primaryPackagePurpose": "CONTAINER",
            "supplier": "Organization: Unbounded",
            "copyrightText": "NOASSERTION",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
        })];
        for p in &packages {
            let mut entry = json!({
                "SPDXID": package_ids[p.key.as_str()],
                "name": p.name,
                "versionInfo": p.version,
                "downloadLocation": p.download,
                "filesAnalyzed": false,
                "primaryPackagePurpose": p.purpose,
                "copyrightText": "NOASSERTION",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": p.license.as_deref().unwrap_or("NOASSERTION"),
            });
            if let Some(sha) = &p.sha256 {
                entry["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": sha}]);
            }
            if let Some(purl) = &p.purl {
                entry["externalRefs"] = json!([{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": purl,
                }]);
            }
            if let Some(comment) = &p.comment {
                entry["comment"] = json!(comment);
            }
            spdx_packages.push(entry);
        }

        let mut spdx_files = Vec::new();
        let mut relationships = vec![json!({
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": image_id,
        })];
        for f in &files {
            let id = spdx_id("File", &f.path);
            spdx_files.push(json!({
                "SPDXID": id,
                "fileName": format!(".{}", f.path),
                "checksums": [
                    {"algorithm": "SHA1", "checksumValue": f.sha1},
                    {"algorithm": "SHA256", "checksumValue": f.sha256},
                ],
                "licenseConcluded": "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "comment": f.origin,
            }));
            relationships.push(json!({
                "spdxElementId": image_id,
                "relationshipType": "CONTAINS",
                "relatedSpdxElement": id,
            }));
            for from in &f.from {
                if let Some(package) = package_ids.get(from.as_str()) {
                    relationships.push(json!({
                        "spdxElementId": id,
                        "relationshipType": "GENERATED_FROM",
                        "relatedSpdxElement": package,
                    }));
                }
            }
        }
        for p in &packages {
            for dependency in &p.depends_on {
                if let Some(related) = package_ids.get(dependency.as_str()) {
                    relationships.push(json!({
                        "spdxElementId": package_ids[p.key.as_str()],
                        "relationshipType": "DEPENDS_ON",
                        "relatedSpdxElement": related,
                    }));
                }
            }
        }

        // The namespace must be unique per document: derived from everything else in it.
        let body = json!({
            "packages": spdx_packages,
            "files": spdx_files,
            "relationships": relationships,
        });
        let fingerprint = crate::oci::sha256_hex(body.to_string().as_bytes());
        let slug: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let document = json!({
            "spdxVersion": "SPDX-2.3",
            "dataLicense": "CC0-1.0",
            "SPDXID": "SPDXRef-DOCUMENT",
            "name": format!("{}:{}", self.name, self.version),
            "documentNamespace": format!(
                "https://example.invalid/unbounded/spdx/{slug}-{}-{}",
                self.version,
                &fingerprint[..32]
            ),
            "creationInfo": {
                "created": created,
                "creators": [format!("Tool: unbounded-testbed-{}", env!("CARGO_PKG_VERSION"))],
            },
            "packages": body["packages"],
            "files": body["files"],
            "relationships": body["relationships"],
        });
        let mut bytes = serde_json::to_vec_pretty(&document).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_tree_lines_are_parsed_and_deduplicated() {
        let text = "unbounded-bootserver v0.1.0 (/work/x/bootserver)|Apache-2.0\n\
                    tokio v1.48.0|MIT\n\
                    unbounded-api v0.1.0 (/work/x/api)|Apache-2.0\n\
                    tokio v1.48.0|MIT (*)\n\
                    ring v0.17.14|Apache-2.0 AND ISC\n\
                    odd v0.1.0|\n";
        let crates = parse_cargo_tree(text).unwrap();
        let summary: Vec<(&str, &str, bool, Option<&str>)> = crates
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.version.as_str(),
                    c.local,
                    c.license.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("odd", "0.1.0", false, None),
                ("ring", "0.17.14", false, Some("Apache-2.0 AND ISC")),
                ("tokio", "1.48.0", false, Some("MIT")),
                ("unbounded-api", "0.1.0", true, Some("Apache-2.0")),
                ("unbounded-bootserver", "0.1.0", true, Some("Apache-2.0")),
            ]
        );
        assert!(parse_cargo_tree("garbage\n").is_err());
    }

    #[test]
    fn lock_checksums_are_read() {
        let lock = "version = 4\n\n[[package]]\nname = \"tokio\"\nversion = \"1.48.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"abc\"\ndependencies = [\n \"bytes\",\n]\n\n[[package]]\nname = \"unbounded-api\"\nversion = \"0.1.0\"\n";
        let sums = lock_checksums(lock);
        assert_eq!(sums.len(), 1);
        assert_eq!(sums[&("tokio".to_owned(), "1.48.0".to_owned())], "abc");
    }

    #[test]
    fn times_are_rfc3339() {
        for (seconds, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_700_000_000, "2023-11-14T22:13:20Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ] {
            assert_eq!(rfc3339(seconds), text);
        }
    }

    fn sbom() -> Sbom {
        let crates = vec![
            Crate {
                name: "tokio".into(),
                version: "1.48.0".into(),
                local: false,
                license: Some("MIT".into()),
            },
            Crate {
                name: "demo".into(),
                version: "0.1.0".into(),
                local: true,
                license: None,
            },
        ];
        let checksums = BTreeMap::from([(("tokio".into(), "1.48.0".into()), "ab".repeat(32))]);
        let mut packages = rust_packages("demo", &crates, &checksums, "1.95.0", "2.36-9");
        packages.push(Package {
            key: "deb:ipxe".into(),
            name: "ipxe".into(),
            version: "1.0".into(),
            download: "NOASSERTION".into(),
            sha256: Some("cd".repeat(32)),
            license: None,
            purl: Some("pkg:deb/debian/ipxe@1.0?arch=all".into()),
            purpose: "LIBRARY",
            depends_on: vec![],
            comment: None,
        });
        Sbom {
            name: "unbounded/demo".into(),
            version: "0.1.0".into(),
            files: vec![
                File::of_bytes(
                    "/usr/local/bin/demo",
                    b"bin",
                    vec!["crate:demo@0.1.0".into()],
                    "cargo",
                ),
                File::of_bytes(
                    "/usr/share/unbounded/ipxe/undionly.kpxe",
                    b"pxe",
                    vec!["deb:ipxe".into()],
                    "deb",
                ),
            ],
            packages,
        }
    }

    #[test]
    fn documents_are_spdx_2_3_and_reproducible() {
        let one = sbom().to_spdx("1970-01-01T00:00:00Z");
        let mut shuffled = sbom();
        shuffled.files.reverse();
        shuffled.packages.reverse();
        assert_eq!(
            one,
            shuffled.to_spdx("1970-01-01T00:00:00Z"),
            "order does not matter"
        );
        let doc: serde_json::Value = serde_json::from_slice(&one).unwrap();
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["dataLicense"], "CC0-1.0");
        let names: Vec<&str> = doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "unbounded/demo",
                "demo",
                "tokio",
                "ipxe",
                "libc6-dev",
                "rust-std"
            ]
        );
        let tokio = &doc["packages"][2];
        assert_eq!(tokio["checksums"][0]["checksumValue"], "ab".repeat(32));
        assert_eq!(
            tokio["externalRefs"][0]["referenceLocator"],
            "pkg:cargo/tokio@1.48.0"
        );
        let file = &doc["files"][1];
        assert_eq!(file["fileName"], "./usr/share/unbounded/ipxe/undionly.kpxe");
        assert_eq!(
            file["checksums"][1]["checksumValue"],
            crate::oci::sha256_hex(b"pxe")
        );
        let relationships = doc["relationships"].as_array().unwrap();
        let has = |from: &str, kind: &str, to: &str| {
            relationships.iter().any(|r| {
                r["spdxElementId"] == from
                    && r["relationshipType"] == kind
                    && r["relatedSpdxElement"] == to
            })
        };
        assert!(has("SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-Image"));
        assert!(has(
            "SPDXRef-File-usr-share-unbounded-ipxe-undionly.kpxe",
            "GENERATED_FROM",
            "SPDXRef-Package-deb-ipxe"
        ));
        assert!(has(
            "SPDXRef-Package-crate-demo-0.1.0",
            "DEPENDS_ON",
            "SPDXRef-Package-crate-tokio-1.48.0"
        ));
        // Every identifier is unique and well formed.
        let mut ids = std::collections::BTreeSet::new();
        for entry in doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .chain(doc["files"].as_array().unwrap())
        {
            let id = entry["SPDXID"].as_str().unwrap();
            assert!(
                id.starts_with("SPDXRef-")
                    && id[8..]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'),
                "{id}"
            );
            assert!(ids.insert(id.to_owned()), "{id} twice");
        }
        // Other contents, another namespace.
        let mut other = sbom();
        other.files.pop();
        let other: serde_json::Value =
            serde_json::from_slice(&other.to_spdx("1970-01-01T00:00:00Z")).unwrap();
        assert_ne!(doc["documentNamespace"], other["documentNamespace"]);
    }
}
