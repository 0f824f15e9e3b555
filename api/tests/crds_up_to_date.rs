//! The CRDs checked in under deploy/crds/, and the reference page docs/reference.md, are
//! exactly what the types generate.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::path::Path;

/// Every rendered file is on disk under `dir` (relative to the repository), byte for byte.
fn assert_checked_in(dir: &str, rendered: Vec<(String, String)>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    for (name, yaml) in rendered {
        let path = dir.join(&name);
        let on_disk =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            on_disk == yaml,
            "{} is out of date: run `cargo run -p unbounded-api --bin crdgen`",
            path.display()
        );
    }
}

#[test]
fn checked_in_crds_match_the_types() {
    let rendered = unbounded_api::crds::render_all().expect("render CRDs");
    assert_eq!(rendered.len(), 6);
    assert_checked_in("deploy/crds", rendered);
}

#[test]
fn the_reference_page_matches_the_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md");
    let on_disk =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        on_disk == unbounded_api::reference::render(),
        "{} is out of date: run `cargo run -p unbounded-api --bin crdgen`",
        path.display()
    );
}

#[test]
fn checked_in_cluster_api_crds_match_the_types() {
    let rendered = unbounded_api::crds::render_cluster_api().expect("render CRDs");
    assert_eq!(
        rendered.len(),
        8,
        "four infrastructure, two bootstrap, two control-plane kinds"
    );
    assert_checked_in("deploy/cluster-api/crds", rendered);
}
