//! The control plane's PKI (a CA and the certificates of each component, by openssl) and
//! its kubeconfigs.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{ClusterError, io_err};

fn run_openssl(args: &[&str], dir: &Path) -> Result<(), ClusterError> {
    openssl_output(args, dir).map(drop)
}

/// What openssl printed on standard output.
fn openssl_output(args: &[&str], dir: &Path) -> Result<Vec<u8>, ClusterError> {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("running openssl"))?;
    if output.status.success() {
        Ok(output.stdout)
    } else {
        Err(ClusterError::Command {
            what: format!("openssl {}", args.first().copied().unwrap_or_default()),
            output: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// The PEM private key at `key` in PKCS#8 DER (what `ring` loads), for a test that signs as
/// the key's owner: a ServiceAccount token signed with the control plane's `pki/sa.key`.
pub fn pkcs8_der(key: &Path) -> Result<Vec<u8>, ClusterError> {
    let path = key.to_string_lossy();
    let dir = key.parent().unwrap_or(Path::new("."));
    openssl_output(
        &[
            "pkcs8", "-topk8", "-nocrypt", "-outform", "DER", "-in", &path,
        ],
        dir,
    )
}

/// A self-signed P-256 certificate for a server at `ip` (`tls.crt`) and its key (`tls.key`)
/// in `dir`, for a client that pins the certificate rather than trusting a CA (the
/// bootserver's `http.tls`). Returns their paths.
pub fn self_signed_server(
    dir: &Path,
    ip: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf), ClusterError> {
    let san = format!("subjectAltName=IP:{ip}");
    run_openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "365",
            "-subj",
            "/CN=unbounded-bootserver",
            "-addext",
            &san,
            "-keyout",
            "tls.key",
            "-out",
            "tls.crt",
        ],
        dir,
    )?;
    Ok((dir.join("tls.crt"), dir.join("tls.key")))
}

/// A certificate to issue from the local CA.
struct CertRequest<'a> {
    name: &'a str,
    subject: &'a str,
    usage: &'a str,
    alt_names: Option<&'a str>,
}

/// An ECDSA P-256 key: quick to generate.
const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// A CA (`ca.crt`, `ca.key`) in `dir`, named `cn`.
fn make_ca(dir: &Path, cn: &str) -> Result<(), ClusterError> {
    let subject = format!("/CN={cn}");
    let mut ca = vec!["req", "-x509"];
    ca.extend(EC);
    ca.extend([
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650", "-subj", &subject,
    ]);
    run_openssl(&ca, dir)
}

/// `<name>.crt` and `<name>.key` in `dir`, issued by the CA there.
fn issue(dir: &Path, cert: &CertRequest<'_>) -> Result<(), ClusterError> {
    let key = format!("{}.key", cert.name);
    let csr = format!("{}.csr", cert.name);
    let crt = format!("{}.crt", cert.name);
    let ext = format!("{}.ext", cert.name);
    let mut ext_text = format!(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={}\n",
        cert.usage
    );
    if let Some(alt) = cert.alt_names {
        ext_text.push_str(&format!("subjectAltName={alt}\n"));
    }
    fs::write(dir.join(&ext), ext_text).map_err(io_err("writing a certificate extension file"))?;
    let mut req = vec!["req"];
    req.extend(EC);
    req.extend(["-keyout", &key, "-out", &csr, "-subj", cert.subject]);
    run_openssl(&req, dir)?;
    run_openssl(
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-out",
            &crt,
            "-extfile",
            &ext,
        ],
        dir,
    )
}

/// A CA and a server certificate it issued for `ip`, for a client that trusts the CA (rustls
/// refuses a CA as a server's own certificate).
#[derive(Debug, Clone)]
pub struct ServerPki {
    /// The CA's certificate (PEM).
    pub ca: std::path::PathBuf,
    /// The server's certificate (PEM).
    pub cert: std::path::PathBuf,
    /// The server's key (PEM).
    pub key: std::path::PathBuf,
}

/// Makes a [`ServerPki`] for a server at `ip` in `dir`.
pub fn ca_and_server(dir: &Path, ip: &str) -> Result<ServerPki, ClusterError> {
    make_ca(dir, "unbounded-test-ca")?;
    let subject = format!("/CN={ip}");
    let alt = format!("IP:{ip}");
    issue(
        dir,
        &CertRequest {
            name: "server",
            subject: &subject,
            usage: "serverAuth",
            alt_names: Some(&alt),
        },
    )?;
    Ok(ServerPki {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    })
}

/// Generates the CA, the API server's serving certificate, client certificates and the
/// service-account key pair.
pub(super) fn generate_pki(dir: &Path) -> Result<(), ClusterError> {
    make_ca(dir, "unbounded-local-ca")?;
    let certs = [
        CertRequest {
            name: "apiserver",
            subject: "/CN=kube-apiserver",
            usage: "serverAuth",
            alt_names: Some(
                // 10.99.0.1 and fd00:99::1: the testbed's provisioning bridge, where VMs reach it.
                "IP:127.0.0.1,IP:10.99.0.1,IP:fd00:99::1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1",
            ),
        },
        CertRequest {
            name: "admin",
            subject: "/O=system:masters/CN=unbounded-admin",
            usage: "clientAuth",
            alt_names: None,
        },
        CertRequest {
            name: "kcm",
            subject: "/CN=system:kube-controller-manager",
            usage: "clientAuth",
            alt_names: None,
        },
        CertRequest {
            name: "scheduler",
            subject: "/CN=system:kube-scheduler",
            usage: "clientAuth",
            alt_names: None,
        },
        CertRequest {
            name: "apiserver-kubelet-client",
            subject: "/O=system:masters/CN=kube-apiserver-kubelet-client",
            usage: "clientAuth",
            alt_names: None,
        },
    ];
    for cert in &certs {
        issue(dir, cert)?;
    }
    run_openssl(
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "sa.key",
        ],
        dir,
    )?;
    run_openssl(&["ec", "-in", "sa.key", "-pubout", "-out", "sa.pub"], dir)?;
    Ok(())
}

pub(super) fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &str,
    cert: &str,
    key: &str,
) -> Result<(), ClusterError> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: unbounded-local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: user
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: unbounded-local
  context:
    cluster: unbounded-local
    user: user
current-context: unbounded-local
"
    );
    fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))
}
