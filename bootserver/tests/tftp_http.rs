#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! TFTP against atftp and HTTP against curl, from a client namespace.

mod common;

use common::*;
use unbounded_testbed::netns::Link;

fn link_with_address() -> Link {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    link
}

/// A TFTP root with the iPXE builds, a large file, and a symbolic link that points out.
fn tftp_root(secret: &std::path::Path) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    // The builds the configuration's BIOS and UEFI machines ask for (the start-up check
    // wants both).
    for file in ["undionly.kpxe", "snponly.efi"] {
        std::fs::copy(
            std::path::Path::new("/usr/lib/ipxe").join(file),
            root.path().join(file),
        )
        .unwrap();
    }
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 253) as u8).collect();
    std::fs::write(root.path().join("big.bin"), big).unwrap();
    std::os::unix::fs::symlink(secret, root.path().join("escape")).unwrap();
    root
}

#[test]
fn tftp_serves_with_negotiated_options_and_refuses_hostile_paths() {
    let link = link_with_address();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "do not serve").unwrap();
    let root = tftp_root(&secret);
    let images = fake_images();
    let config = full_config(images.path(), "").replace(
        "tftp: {root: /usr/lib/ipxe}",
        &format!("tftp: {{root: \"{}\"}}", root.path().display()),
    );
    let server = Bootserver::start(&link.server, &config);
    let out = tempfile::tempdir().unwrap();

    let variants: [(&str, &[&str]); 4] = [
        ("plain 512-byte blocks", &[]),
        (
            "blksize and tsize",
            &["--option", "blksize 1468", "--option", "tsize 0"],
        ),
        (
            "windowsize",
            &["--option", "blksize 1468", "--option", "windowsize 8"],
        ),
        ("small blocks", &["--option", "blksize 8"]),
    ];
    let mut bytes_served = 0u64;
    for (file, expected) in [
        ("undionly.kpxe", "/usr/lib/ipxe/undionly.kpxe"),
        ("big.bin", ""),
    ] {
        for (case, options) in variants {
            if file == "big.bin" && case == "small blocks" {
                continue; // 375,000 round trips: a benchmark, not a test
            }
            let local = out
                .path()
                .join(format!("{file}.{}", case.replace(' ', "_")));
            let mut args = vec!["atftp", "--get", "-r", file, "-l"];
            let local_arg = local.display().to_string();
            args.push(&local_arg);
            args.extend_from_slice(options);
            args.extend([SERVER, "69"]);
            let result = link.client.exec(&args);
            assert!(
                result.is_ok(),
                "{file} {case}: {result:?}\n{}",
                server.log()
            );
            let got = std::fs::read(&local).unwrap();
            let want = if expected.is_empty() {
                std::fs::read(root.path().join(file)).unwrap()
            } else {
                std::fs::read(expected).unwrap()
            };
            assert!(
                got == want,
                "{file} {case}: {} bytes, want {}",
                got.len(),
                want.len()
            );
            bytes_served += got.len() as u64;
        }
    }

    let hostile = [
        "../secret",
        "/etc/passwd",
        "../../../../etc/passwd",
        "escape",
        "missing.efi",
    ];
    for path in hostile {
        let local = out.path().join("hostile");
        let local_arg = local.display().to_string();
        let result = link
            .client
            .exec(&["atftp", "--get", "-r", path, "-l", &local_arg, SERVER, "69"]);
        assert!(result.is_err(), "{path} must be refused");
        let leaked = std::fs::read_to_string(&local).unwrap_or_default();
        assert!(
            !leaked.contains("do not serve") && !leaked.contains("root:"),
            "{path}"
        );
    }
    // Read-only: a write is refused.
    let upload = out.path().join("upload");
    std::fs::write(&upload, "x").unwrap();
    let upload_arg = upload.display().to_string();
    let put = link.client.exec(&[
        "atftp",
        "--put",
        "-r",
        "new",
        "-l",
        &upload_arg,
        SERVER,
        "69",
    ]);
    assert!(put.is_err(), "write refused");
    assert!(!root.path().join("new").exists());

    let metrics = server.metrics(&link.server);
    assert!(
        metric(&metrics, "unbounded_bootserver_tftp_transfers_total", "") >= 7.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "unbounded_bootserver_tftp_refused_total", "") >= 6.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "unbounded_bootserver_tftp_bytes_total", "") >= bytes_served as f64,
        "{bytes_served} bytes served:\n{metrics}"
    );
}

fn curl(link: &Link, args: &[&str]) -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let headers = dir.path().join("headers");
    let headers_arg = headers.display().to_string();
    let mut full = vec!["curl", "-s", "-D", &headers_arg];
    full.extend_from_slice(args);
    let out = link.client.exec(&full).unwrap();
    (std::fs::read_to_string(&headers).unwrap(), out.stdout)
}

#[test]
fn http_serves_scripts_images_with_ranges_and_a_machine_only_its_own_configuration() {
    let link = link_with_address();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));
    let base = format!("http://{SERVER}:8080");

    // The per-machine script: kernel, initrd, identity and bootserver on the command line.
    let (_, body) = curl(&link, &[&format!("{base}/boot.ipxe?mac=52:54:00:00:00:01")]);
    let script = String::from_utf8(body).unwrap();
    assert!(script.starts_with("#!ipxe\n"), "{script}");
    assert!(
        script.contains(&format!(
            "kernel {base}/images/vmlinuz initrd=initrd unbounded.machine=node-1 unbounded.bootserver={base} console=ttyS0"
        )),
        "{script}"
    );
    assert!(
        script.contains(&format!("initrd --name initrd {base}/images/initrd.img")),
        "{script}"
    );
    // Upper-case and dashes are the same MAC.
    let (_, body) = curl(&link, &[&format!("{base}/boot.ipxe?mac=52-54-00-00-00-01")]);
    assert_eq!(String::from_utf8(body).unwrap(), script);
    // An unknown MAC: a script that says why and exits (no loop).
    let (_, body) = curl(&link, &[&format!("{base}/boot.ipxe?mac=52:54:00:00:00:99")]);
    let refusal = String::from_utf8(body).unwrap();
    assert!(
        refusal.contains("belongs to no Machine") && refusal.ends_with("exit 1\n"),
        "{refusal}"
    );
    // No MAC: a script that asks again with iPXE's own.
    let (_, body) = curl(&link, &[&format!("{base}/boot.ipxe")]);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!("#!ipxe\nchain {base}/boot.ipxe?mac=${{net0/mac}}\n")
    );

    // A name no file can have (longer than NAME_MAX): 404, not a 500.
    let (headers, _) = curl(&link, &[&format!("{base}/images/{}", "a".repeat(300))]);
    assert!(headers.starts_with("HTTP/1.1 404"), "{headers}");
    // A NUL in a name, asked with HEAD: 404, not a 500.
    let (headers, _) = curl(&link, &["-I", &format!("{base}/images/a%00b")]);
    assert!(headers.starts_with("HTTP/1.1 404"), "{headers}");

    // Images: ranges, HEAD, lengths.
    let kernel = std::fs::read(images.path().join("vmlinuz")).unwrap();
    let (headers, body) = curl(
        &link,
        &["-r", "1000-1999", &format!("{base}/images/vmlinuz")],
    );
    assert!(headers.starts_with("HTTP/1.1 206"), "{headers}");
    assert!(
        headers
            .to_lowercase()
            .contains("content-range: bytes 1000-1999/200000"),
        "{headers}"
    );
    assert_eq!(body, kernel[1000..2000]);
    let (headers, body) = curl(&link, &["-I", &format!("{base}/images/vmlinuz")]);
    assert!(
        headers.to_lowercase().contains("content-length: 200000"),
        "{headers}"
    );
    // curl -I prints the headers as its output; no body came.
    assert!(body.len() < 1_000, "{} bytes", body.len());

    // Files leave by `sendfile` between the scripts of one keep-alive connection, as iPXE
    // asks: script, a 5 MB image (several placeholder chunks), script, kernel; each byte
    // the file's, and the connection used again each time.
    let image: Vec<u8> = (0..5_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
    std::fs::write(images.path().join("node.img"), &image).unwrap();
    let script_url = format!("{base}/boot.ipxe?mac=52:54:00:00:00:01");
    let out = link
        .client
        .exec(&[
            "curl",
            "-sv",
            &script_url,
            &format!("{base}/images/node.img"),
            &script_url,
            &format!("{base}/images/vmlinuz"),
        ])
        .unwrap();
    let expected = [script.as_bytes(), &image, script.as_bytes(), &kernel].concat();
    assert_eq!(out.stdout.len(), expected.len());
    assert!(out.stdout == expected, "the bytes differ");
    let verbose = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        verbose.matches("Re-using existing connection").count(),
        3,
        "{verbose}"
    );
    // The kernel sent them, not a copy through the server (the 1000-byte range above was
    // read: too small to be worth it).
    let sent = metric(
        &server.metrics(&link.server),
        "unbounded_bootserver_http_file_bytes_sent_total",
        "",
    );
    assert!(sent >= (image.len() + kernel.len()) as f64, "{sent}");
    let (headers, _) = curl(
        &link,
        &[
            "--path-as-is",
            &format!("{base}/images/../../../etc/passwd"),
        ],
    );
    assert!(!headers.starts_with("HTTP/1.1 200"), "{headers}");
    // The iPXE builds for UEFI HTTP boot.
    let (headers, body) = curl(&link, &[&format!("{base}/ipxe/snponly.efi")]);
    assert!(headers.starts_with("HTTP/1.1 200"), "{headers}");
    assert_eq!(body, std::fs::read("/usr/lib/ipxe/snponly.efi").unwrap());

    // The agent's configuration: only from the machine's own address.
    let (headers, _) = curl(&link, &[&format!("{base}/machines/node-1/config")]);
    assert!(
        headers.starts_with("HTTP/1.1 403"),
        "from 10.99.0.2: {headers}"
    );
    link.client
        .ip(&["addr", "add", "10.99.0.21/24", "dev", "eth0"])
        .unwrap();
    let (headers, body) = curl(
        &link,
        &[
            "--interface",
            "10.99.0.21",
            &format!("{base}/machines/node-1/config"),
        ],
    );
    assert!(headers.starts_with("HTTP/1.1 200"), "{headers}");
    let config: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(config["machine"], "node-1");
    let (headers, _) = curl(
        &link,
        &[
            "--interface",
            "10.99.0.21",
            &format!("{base}/machines/node-2/config"),
        ],
    );
    assert!(
        headers.starts_with("HTTP/1.1 403"),
        "node-1 may not read node-2's: {headers}"
    );

    let (headers, _) = curl(&link, &[&format!("{base}/readyz")]);
    assert!(headers.starts_with("HTTP/1.1 200"), "{headers}");
    let metrics = server.metrics(&link.server);
    assert!(
        metric(
            &metrics,
            "unbounded_bootserver_http_requests_total",
            "code=\"403\""
        ) >= 2.0,
        "{metrics}"
    );
}
