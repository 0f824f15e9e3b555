#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The node image path against a real HTTP server (axum on loopback, in this process): a
//! good archive is verified and then unpacked; an archive with the wrong digest is never
//! unpacked, not even while it downloads; an image over the size limit is refused before
//! its body is read when its length is announced, and as soon as it passes the limit when
//! it is not, without the rest being downloaded; a truncated download, garbage and a
//! missing file each give their own error; none leaves a staging directory behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use tokio::sync::Notify;
use unbounded_agent::rootfs::{self, ImageSource, RootfsError};

/// What the server serves, and what the tests can see of it.
#[derive(Default)]
struct Served {
    /// Files by name, served with their length.
    files: HashMap<String, Vec<u8>>,
    /// Served with a chunked body that ends only once `release` is notified.
    held: Vec<u8>,
    release: Notify,
    /// Bytes of the endless bodies that the server has handed to the connection.
    pulled: AtomicU64,
}

const CHUNK: usize = 64 * 1024;

async fn file(State(served): State<Arc<Served>>, UrlPath(name): UrlPath<String>) -> Response {
    match served.files.get(&name) {
        Some(bytes) => bytes.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The archive at once, then an open body until the test releases it.
async fn held(State(served): State<Arc<Served>>) -> Response {
    let first = Bytes::from(served.held.clone());
    let stream = futures::stream::unfold((Some(first), served), |(first, served)| async move {
        match first {
            Some(bytes) => Some((Ok::<_, std::io::Error>(bytes), (None, served))),
            None => {
                served.release.notified().await;
                None
            }
        }
    });
    Body::from_stream(stream).into_response()
}

/// Zeros without end, counted as the connection takes them; with `announced`, a
/// Content-Length of 1 GiB is announced first.
fn endless(served: Arc<Served>, announced: bool) -> Response {
    let stream = futures::stream::unfold(served, |served| async move {
        served.pulled.fetch_add(CHUNK as u64, Ordering::SeqCst);
        Some((
            Ok::<_, std::io::Error>(Bytes::from(vec![0u8; CHUNK])),
            served,
        ))
    });
    let mut response = Body::from_stream(stream).into_response();
    if announced {
        response.headers_mut().insert(
            header::CONTENT_LENGTH,
            header::HeaderValue::from(1u64 << 30),
        );
    }
    response
}

async fn serve(served: Served) -> (String, Arc<Served>) {
    let served = Arc::new(served);
    let app = Router::new()
        .route("/images/{name}", get(file))
        .route("/held", get(held))
        .route(
            "/endless",
            get(|State(s): State<Arc<Served>>| async move { endless(s, false) }),
        )
        .route(
            "/announced",
            get(|State(s): State<Arc<Served>>| async move { endless(s, true) }),
        )
        .with_state(served.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, served)
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

fn image(url: String, sha256: String, max_bytes: u64) -> ImageSource {
    ImageSource {
        url,
        sha256,
        max_bytes,
    }
}

/// Sizes of this process's open files that were created in `dir` and have no name
/// (where the download is staged until it is verified).
fn unnamed_files_in(dir: &Path) -> Vec<u64> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let target = target.to_string_lossy();
            (target.starts_with(&prefix) && target.ends_with("(deleted)"))
                .then(|| std::fs::metadata(fd.path()).ok().map(|m| m.len()))
                .flatten()
        })
        .collect()
}

fn is_empty_or_absent(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_image_is_verified_then_unpacked() {
    let bytes = archive();
    let (base, _served) = serve(Served {
        files: HashMap::from([("node.tar.zst".to_owned(), bytes.clone())]),
        ..Served::default()
    })
    .await;
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let url = rootfs::image_url("node.tar.zst", Some(&base)).unwrap();
    let total = rootfs::fetch_verify_unpack(
        &http(),
        &image(url, sha256(&bytes), rootfs::DEFAULT_MAX_IMAGE_BYTES),
        &staging,
    )
    .await
    .unwrap();
    assert_eq!(total, bytes.len() as u64);
    assert_eq!(
        std::fs::read(staging.join("etc/hostname")).unwrap(),
        b"node\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(staging.join("usr/bin/kubelet"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "modes from the archive");
    assert!(
        unnamed_files_in(machines.path()).is_empty(),
        "the downloaded archive is gone once unpacked"
    );

    // An image exactly at the limit is fine; a leftover staging directory is replaced.
    std::fs::write(staging.join("leftover"), b"x").unwrap();
    let url = rootfs::image_url("node.tar.zst", Some(&base)).unwrap();
    rootfs::fetch_verify_unpack(
        &http(),
        &image(url, sha256(&bytes), bytes.len() as u64),
        &staging,
    )
    .await
    .unwrap();
    assert!(!staging.join("leftover").exists());
    assert!(staging.join("etc/hostname").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_with_the_wrong_digest_is_never_unpacked() {
    let bytes = archive();
    let (base, served) = serve(Served {
        held: bytes.clone(),
        ..Served::default()
    })
    .await;
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let wrong = "0".repeat(64);
    let source = image(
        format!("{base}/held"),
        wrong.clone(),
        rootfs::DEFAULT_MAX_IMAGE_BYTES,
    );
    let fetch = tokio::spawn({
        let staging = staging.clone();
        async move { rootfs::fetch_verify_unpack(&http(), &source, &staging).await }
    });

    // The whole archive has arrived, the body is still open (its digest cannot be known
    // yet): the agent holds every byte, and nothing of it may be in the staging directory.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let downloaded = unnamed_files_in(machines.path()).contains(&(bytes.len() as u64));
        if downloaded || !is_empty_or_absent(&staging) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the archive never arrived in full"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        is_empty_or_absent(&staging),
        "files of an unverified archive were unpacked: {:?}",
        std::fs::read_dir(&staging).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );

    served.release.notify_one();
    let error = fetch.await.unwrap().unwrap_err();
    assert!(matches!(error, RootfsError::Checksum { .. }), "{error}");
    assert!(
        error.to_string().contains(&sha256(&bytes)) && error.to_string().contains(&wrong),
        "names what it got and what it expected: {error}"
    );
    assert!(!staging.exists(), "a wrong digest leaves nothing");
    assert!(unnamed_files_in(machines.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_over_the_limit_is_refused_without_downloading_it() {
    let (base, served) = serve(Served::default()).await;
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let limit = 1 << 20;

    // Announced: refused on the headers.
    let error = rootfs::fetch_verify_unpack(
        &http(),
        &image(format!("{base}/announced"), "0".repeat(64), limit),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RootfsError::TooLarge { .. }), "{error}");
    assert_eq!(error.reason(), "ImageTooLarge");
    let message = error.to_string();
    assert!(
        message.contains("announced 1073741824 bytes") && message.contains("maxSizeBytes"),
        "{message}"
    );
    assert!(!staging.exists());

    // Not announced: refused once past the limit, long before the end.
    served.pulled.store(0, Ordering::SeqCst);
    let error = rootfs::fetch_verify_unpack(
        &http(),
        &image(format!("{base}/endless"), "0".repeat(64), limit),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RootfsError::TooLarge { .. }), "{error}");
    assert!(error.to_string().contains("received"), "{error}");
    assert!(!staging.exists());
    assert!(unnamed_files_in(machines.path()).is_empty());
    // Whatever the socket buffers held besides, the download stopped near the limit.
    let pulled = served.pulled.load(Ordering::SeqCst);
    assert!(
        pulled < 64 * limit,
        "{pulled} bytes served for a limit of {limit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_missing_images_leave_nothing() {
    let bytes = archive();
    let truncated = bytes[..bytes.len() / 2].to_vec();
    let garbage = b"not an archive at all".to_vec();
    let (base, _served) = serve(Served {
        files: HashMap::from([
            ("truncated.tar.zst".to_owned(), truncated.clone()),
            ("garbage.tar.zst".to_owned(), garbage.clone()),
        ]),
        ..Served::default()
    })
    .await;
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let url = |name: &str| rootfs::image_url(name, Some(&base)).unwrap();
    let max = rootfs::DEFAULT_MAX_IMAGE_BYTES;

    let error = rootfs::fetch_verify_unpack(
        &http(),
        &image(url("truncated.tar.zst"), sha256(&truncated), max),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RootfsError::Unpack { .. }), "{error}");
    assert!(!staging.exists());

    let error = rootfs::fetch_verify_unpack(
        &http(),
        &image(url("garbage.tar.zst"), sha256(&garbage), max),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, RootfsError::Unpack { .. }), "{error}");
    assert!(!staging.exists());

    let error = rootfs::fetch_verify_unpack(
        &http(),
        &image(url("absent.tar.zst"), "0".repeat(64), max),
        &staging,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, RootfsError::Download { .. }) && error.to_string().contains("404"),
        "{error}"
    );
    assert!(!staging.exists());
    assert!(unnamed_files_in(machines.path()).is_empty());
}

/// The real node image, as `unbounded-testbed images` built it (the test command builds
/// the images before the tests, so a missing one is an error, not a reason to pass), and
/// how fast this build verifies and unpacks it: a figure, not a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_node_image_unpacks() {
    let images = unbounded_testbed::images::cached().unwrap_or_else(|e| {
        panic!(
            "{e} (the cache is {}: UNBOUNDED_CACHE_DIR, else XDG_CACHE_HOME/unbounded, else ~/.cache/unbounded)",
            unbounded_testbed::images::images_cache().display()
        )
    });
    let archive: PathBuf = images.node.archive.clone();
    let bytes = std::fs::read(&archive).unwrap();
    let (base, _served) = serve(Served {
        files: HashMap::from([("node.tar.zst".to_owned(), bytes)]),
        ..Served::default()
    })
    .await;
    let machines = tempfile::tempdir().unwrap();
    let staging = machines.path().join(".node.staging");
    let started = Instant::now();
    let total = rootfs::fetch_verify_unpack(
        &http(),
        &image(
            format!("{base}/images/node.tar.zst"),
            images.node.sha256.clone(),
            rootfs::DEFAULT_MAX_IMAGE_BYTES,
        ),
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
