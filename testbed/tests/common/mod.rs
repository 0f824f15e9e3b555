//! Shared by the testbed's integration tests.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // a panic is the test failure report

use std::path::PathBuf;

/// A binary of this workspace, built beside this test.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|p| p.parent()).unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo test --workspace does)",
        path.display()
    );
    path
}
