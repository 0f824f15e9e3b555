#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The node image path against a real HTTP server (Python's `http.server` on loopback): a
//! good archive is verified and unpacked; a wrong digest, a truncated download, a missing
//! file and garbage each give their own error and leave no staging directory behind.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use unbounded_agent::rootfs::{self, RootfsError};

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("/usr/bin/python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "http.server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Server(child, port)
}

fn archive() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content) in [
        ("etc/hostname", &b"node\n"[..]),
        ("usr/bin/kubelet", &[7u8; 100_000][..]),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o755);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        builder.append_data(&mut header, path, content).unwrap();
    }
    zstd::encode_all(&builder.into_inner().unwrap()[..], 3).unwrap()
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn sha256(bytes: &[u8]) -> String {
    rootfs::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

#[tokio::test]
async fn images_are_verified_while_they_unpack_and_bad_ones_leave_nothing() {
    // Laid out as the bootserver serves images: relative image URLs live under /images/.
    let served = tempfile::tempdir().unwrap();
    let images = served.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let bytes = archive();
    std::fs::write(images.join("node.tar.zst"), &bytes).unwrap();
    std::fs::write(images.join("truncated.tar.zst"), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(images.join("garbage.tar.zst"), b"not an archive at all").unwrap();
    let server = serve(served.path());
    let base = format!("http://127.0.0.1:{}", server.1);
    let http = http();
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let url = |name: &str| rootfs::image_url(name, Some(&base)).unwrap();

    let total = rootfs::fetch_and_unpack(&http, &url("node.tar.zst"), &sha256(&bytes), &staging)
        .await
        .unwrap();
    assert_eq!(total, bytes.len() as u64);
    assert_eq!(
        std::fs::read(staging.join("etc/hostname")).unwrap(),
        b"node\n"
    );
    std::fs::remove_dir_all(&staging).unwrap();

    let wrong = "0".repeat(64);
    let error = rootfs::fetch_and_unpack(&http, &url("node.tar.zst"), &wrong, &staging)
        .await
        .unwrap_err();
    assert!(matches!(error, RootfsError::Checksum { .. }), "{error}");
    assert!(
        error.to_string().contains(&sha256(&bytes)),
        "names what it got: {error}"
    );
    assert!(!staging.exists(), "a wrong digest leaves nothing");

    let truncated = std::fs::read(images.join("truncated.tar.zst")).unwrap();
    let error = rootfs::fetch_and_unpack(
        &http,
        &url("truncated.tar.zst"),
        &sha256(&truncated),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RootfsError::Unpack { .. }), "{error}");
    assert!(!staging.exists());

    let error = rootfs::fetch_and_unpack(
        &http,
        &url("garbage.tar.zst"),
        &sha256(b"not an archive at all"),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RootfsError::Unpack { .. }), "{error}");

    let error = rootfs::fetch_and_unpack(&http, &url("absent.tar.zst"), &wrong, &staging)
        .await
        .unwrap_err();
    assert!(
        matches!(error, RootfsError::Download { .. }) && error.to_string().contains("404"),
        "{error}"
    );
    assert!(!staging.exists());
}

/// How fast this build unpacks the real node image (when `images` has built one): a figure
/// for the README, not a pass/fail bound.
#[tokio::test]
async fn the_real_node_image_unpacks() {
    let Ok(images) = unbounded_testbed::images::cached() else {
        eprintln!("no node image built yet; skipping the figure");
        return;
    };
    let dir = images.node.archive.parent().unwrap().to_path_buf();
    let server = serve(&dir);
    let name = images
        .node
        .archive
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let started = Instant::now();
    let total = rootfs::fetch_and_unpack(
        &http(),
        &format!("http://127.0.0.1:{}/{name}", server.1),
        &images.node.sha256,
        &staging,
    )
    .await
    .unwrap();
    eprintln!(
        "node image: {} MB fetched, verified and unpacked in {:.2} s",
        total / 1_000_000,
        started.elapsed().as_secs_f64()
    );
    assert!(staging.join("usr/local/bin/kubelet").exists());
}
