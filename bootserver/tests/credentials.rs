#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Agent credentials on a real control plane: the bootserver (running as its own
//! ServiceAccount with `deploy/`'s RBAC) hands a machine its token only for the nonce of its
//! own boot script, from its own address, once; the token reads and writes exactly that
//! machine's objects (its role from the controller, the admission policy on top), never
//! another machine's; an expired token is refused; a refresh needs a valid token of the same
//! machine; a bootstrap token joins the bootstrappers group; nothing secret is logged.
//! And when the API server is slow, the agent (its own credential code, run at the
//! machine's address) is told to retry, never that its nonce is spent, and gets its
//! credentials once the API server answers.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::*;
use unbounded_testbed::cluster::{LocalControlPlane, deploy_dir};
use unbounded_testbed::netns::{Link, LoopbackForward};
use unbounded_testbed::stall::StallableForward;
use unbounded_testbed::testkit::{kubectl, kubectl_ok as ok, wait_until_blocking as wait_until};

const MAC_A: &str = "52:54:00:00:0a:01";
const MAC_B: &str = "52:54:00:00:0b:01";
const MAC_SLOW: &str = "52:54:00:00:0c:01";
const MAC_PROXY: &str = "52:54:00:00:0d:01";
const MAC_TLS: &str = "52:54:00:00:0e:01";
const MAC_TPM: &str = "52:54:00:00:0f:01";
const MAC_V6: &str = "52:54:00:00:06:21";
const MAC_V6_TLS: &str = "52:54:00:00:06:22";

/// The tests share the control plane of this binary and each runs a controller: one at a
/// time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `kubectl` as a bearer token (no admin credentials).
fn as_token(
    cp: &LocalControlPlane,
    token: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String) {
    let ca = cp.data_dir().join("pki/ca.crt");
    let mut full = vec![
        "--kubeconfig=/dev/null".to_owned(),
        format!("--server={}", cp.server_url()),
        format!("--certificate-authority={}", ca.display()),
        format!("--token={token}"),
    ];
    full.extend(args.iter().map(|a| (*a).to_owned()));
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    let mut command = std::process::Command::new(&cp.binaries().kubectl);
    command.args(&refs);
    use std::io::Write as _;
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// curl from the machine's namespace: (HTTP status, body).
fn curl(link: &Link, args: &[&str]) -> (u16, String) {
    let mut full = vec!["curl", "-s", "-w", "\n%{http_code}"];
    full.extend_from_slice(args);
    let out = link
        .client
        .command(full[0])
        .args(&full[1..])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn post_credentials(link: &Link, machine: &str, body: &str, bearer: Option<&str>) -> (u16, String) {
    let url = format!("http://{SERVER}:8080/machines/{machine}/credentials");
    let header;
    let mut args = vec![
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
    ];
    if let Some(token) = bearer {
        header = format!("Authorization: Bearer {token}");
        args.extend(["-H", &header]);
    }
    args.push(&url);
    curl(link, &args)
}

fn nonce_from_script(script: &str) -> String {
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("unbounded.nonce="))
        .unwrap_or_else(|| panic!("no nonce in:\n{script}"))
        .to_owned()
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// A ServiceAccount token signed with the control plane's own key, expiring at `exp`: the
/// same kind the API server issues, so that only its expiry differs.
fn signed_token(
    cp: &LocalControlPlane,
    namespace: &str,
    account: &str,
    uid: &str,
    exp: i64,
) -> String {
    let der = unbounded_testbed::cluster::pkcs8_der(&cp.data_dir().join("pki/sa.key")).unwrap();
    let rng = ring::rand::SystemRandom::new();
    let key = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &der,
        &rng,
    )
    .unwrap();
    let issuer = "https://kubernetes.default.svc.cluster.local";
    let header = base64url(br#"{"alg":"ES256","typ":"JWT"}"#);
    let claims = serde_json::json!({
        "iss": issuer, "aud": [issuer], "sub": format!("system:serviceaccount:{namespace}:{account}"),
        "iat": exp - 3600, "nbf": exp - 3600, "exp": exp,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": account, "uid": uid}},
    });
    let payload = base64url(claims.to_string().as_bytes());
    let input = format!("{header}.{payload}");
    let signature = key.sign(&rng, input.as_bytes()).unwrap();
    format!("{input}.{}", base64url(signature.as_ref()))
}

/// The configuration and, for each (name, MAC, address), a Machine and its Node.
fn machines_yaml(machines: &[(&str, &str, &str)]) -> String {
    let mut yaml = r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {name: cr-config}
spec:
  machineSelector: {matchLabels: {lab: credentials}}
  template:
    boot: {kernelURL: vmlinuz, initrdURL: initrd.img}
"#
    .to_owned();
    for (name, mac, ip) in machines {
        let family = if ip.contains(':') { "ipv6" } else { "ipv4" };
        yaml.push_str(&format!(
            r#"---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: {name}, labels: {{lab: credentials}}}}
spec:
  provider: pxe
  pxe: {{macAddresses: ["{mac}"], {family}: {ip}, firmware: bios}}
---
apiVersion: v1
kind: Node
metadata: {{name: {name}}}
"#
        ));
    }
    yaml
}

/// Marks a Machine's infrastructure ready, as its provider would.
fn infrastructure_ready(cp: &LocalControlPlane, machine: &str) {
    let patch = r#"{"status":{"conditions":[{"type":"InfrastructureReady","status":"True","reason":"Provisioned","message":"test","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    ok(
        cp,
        &[
            "patch",
            "machine",
            machine,
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ],
        None,
    );
}

fn service_account_token(cp: &LocalControlPlane, namespace: &str, account: &str) -> String {
    ok(
        cp,
        &["create", "token", account, "-n", namespace, "--duration=1h"],
        None,
    )
    .trim()
    .to_owned()
}

fn token_kubeconfig(cp: &LocalControlPlane, dir: &Path, token: &str) -> std::path::PathBuf {
    let path = dir.join("bootserver.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            cp.data_dir().join("pki/ca.crt").display()
        ),
    )
    .unwrap();
    path
}

/// A provisioning site on the shared control plane: `deploy/`'s namespaces and RBAC, the
/// controller (it gives each Machine's agent its ServiceAccount and role), the Machines
/// (configuration resolved, infrastructure ready), and the bootserver running as its own
/// ServiceAccount on a provisioning link whose client side is the first Machine at its
/// reserved address. The bootserver reaches the API server at `api_target` (the API
/// server itself, or a forwarder in front of it).
struct Site {
    /// Runs the controller.
    _runtime: tokio::runtime::Runtime,
    link: Link,
    _forward: LoopbackForward,
    bootserver: Bootserver,
    bootserver_token: String,
    _images: tempfile::TempDir,
    _dir: tempfile::TempDir,
}

/// The bootserver as the DHCP server of the link.
const FULL_DHCP: &str = r#"  mode: full
  leaseFile: "{dir}/leases.log"
  subnets: [{subnet: 10.99.0.0/24, pool: [10.99.0.100, 10.99.0.199]}]"#;

impl Site {
    fn start(
        cp: &'static LocalControlPlane,
        machines: &[(&str, &str, &str)],
        api_target: &str,
        credentials_extra: &str,
    ) -> Self {
        Self::start_with_dhcp(cp, machines, api_target, credentials_extra, FULL_DHCP)
    }

    /// [`Site::start`] with the configuration's `dhcp` section's lines.
    fn start_with_dhcp(
        cp: &'static LocalControlPlane,
        machines: &[(&str, &str, &str)],
        api_target: &str,
        credentials_extra: &str,
        dhcp: &str,
    ) -> Self {
        Self::start_with(cp, machines, api_target, credentials_extra, dhcp, "")
    }

    /// [`Site::start_with_dhcp`] with more of the `http` section (`, tls: {…}`).
    fn start_with(
        cp: &'static LocalControlPlane,
        machines: &[(&str, &str, &str)],
        api_target: &str,
        credentials_extra: &str,
        dhcp: &str,
        http_extra: &str,
    ) -> Self {
        let deploy = deploy_dir();
        for part in ["namespace.yaml", "rbac"] {
            let path = deploy.join(part).display().to_string();
            ok(cp, &["apply", "--server-side", "-f", &path], None);
        }
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime.block_on(cp.client()).unwrap();
        runtime.spawn(unbounded_controller::runner::run(
            client,
            unbounded_controller::context::Settings::default(),
            Arc::new(unbounded_controller::metrics::Metrics::new(
                &mut prometheus_client::registry::Registry::default(),
            )),
            std::future::pending(),
        ));
        ok(cp, &["apply", "-f", "-"], Some(&machines_yaml(machines)));
        for (name, _, _) in machines {
            infrastructure_ready(cp, name);
        }
        let names: Vec<&str> = machines.iter().map(|(name, _, _)| *name).collect();
        wait_until("agent ServiceAccounts", Duration::from_secs(60), || {
            let mut args = vec!["get", "serviceaccount", "-n", "unbounded-machines"];
            args.extend(&names);
            kubectl(cp, &args, None).0
        });
        for name in &names {
            wait_until("configurations resolved", Duration::from_secs(60), || {
                kubectl(
                    cp,
                    &[
                        "get",
                        "machine",
                        name,
                        "-o",
                        "jsonpath={.status.configuration.version}",
                    ],
                    None,
                )
                .1 == "1"
            });
        }

        let (_, mac, ip) = machines[0];
        let images = fake_images();
        let link = Link::new(&format!("{SERVER}/24"), mac).unwrap();
        if ip.contains(':') {
            // An IPv6 site: the machine at its reserved v6 address, the server at fd00:99::1.
            link.server
                .ip(&["-6", "addr", "add", "fd00:99::1/64", "dev", "pxe0", "nodad"])
                .unwrap();
            link.client
                .ip(&[
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip}/64"),
                    "dev",
                    "eth0",
                    "nodad",
                ])
                .unwrap();
        } else {
            link.client
                .ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])
                .unwrap();
        }
        let forward = LoopbackForward::new(&link.server, 6443, api_target).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bootserver_token =
            service_account_token(cp, "unbounded-system", "unbounded-bootserver");
        let kubeconfig = token_kubeconfig(cp, dir.path(), &bootserver_token);
        let config = format!(
            r#"interface: pxe0
serverAddress: {SERVER}
routerAdvertisements: false
backend: kubernetes
power: {{enabled: false}}
dhcp:
{dhcp}
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"{http_extra}}}
credentials:
  apiServer: {server}
  caFile: "{ca}"
  tokenSeconds: 600
{credentials_extra}"#,
            images = images.path().display(),
            server = cp.server_url(),
            ca = cp.data_dir().join("pki/ca.crt").display(),
        );
        let kubeconfig_env = kubeconfig.display().to_string();
        let bootserver = Bootserver::start_with_env(
            &link.server,
            &config,
            &[("KUBECONFIG", kubeconfig_env.as_str())],
        );
        let ready = if ip.contains(':') {
            "http://[fd00:99::1]:8080/readyz".to_owned()
        } else {
            format!("http://{SERVER}:8080/readyz")
        };
        wait_until("bootserver synced", Duration::from_secs(60), || {
            curl(&link, &["-g", &ready]).0 == 200
        });
        Self {
            _runtime: runtime,
            link,
            _forward: forward,
            bootserver,
            bootserver_token,
            _images: images,
            _dir: dir,
        }
    }

    /// The nonce in `mac`'s boot script, fetched from the client side.
    fn nonce(&self, mac: &str) -> String {
        let url = format!("http://{SERVER}:8080/boot.ipxe?mac={mac}");
        let mut script = String::new();
        wait_until("the machine's script", Duration::from_secs(60), || {
            script = curl(&self.link, &[&url]).1;
            script.contains("unbounded.nonce=")
        });
        nonce_from_script(&script)
    }

    fn metrics(&self) -> String {
        self.bootserver.metrics(&self.link.server)
    }
}

#[test]
fn a_machine_gets_only_its_own_credentials_and_they_reach_only_its_own_objects() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let site = Site::start(
        cp,
        &[("cr-a", MAC_A, "10.99.0.21"), ("cr-b", MAC_B, "10.99.0.22")],
        &api_server_target(cp),
        "  replaySeconds: 3\n",
    );
    let (link, bootserver, bootserver_token) =
        (&site.link, &site.bootserver, &site.bootserver_token);

    // The boot script carries a nonce; a script fetched for another MAC from here does not
    // (this address is not that machine's).
    let script_url = |mac: &str| format!("http://{SERVER}:8080/boot.ipxe?mac={mac}");
    let nonce = site.nonce(MAC_A);
    let (_, script_b) = curl(link, &[&script_url(MAC_B)]);
    assert!(!script_b.contains("unbounded.nonce="), "{script_b}");

    // Refused: another machine's name, a wrong nonce, no proof at all.
    let body = |nonce: &str| format!(r#"{{"nonce":"{nonce}","bootstrapToken":true}}"#);
    let (code, text) = post_credentials(link, "cr-b", &body(&nonce), None);
    assert_eq!(code, 403, "another machine's credentials: {text}");
    let (code, text) = post_credentials(
        link,
        "cr-a",
        &body("00112233445566778899aabbccddeeff"),
        None,
    );
    assert_eq!(code, 403, "a wrong nonce: {text}");
    let (code, _) = post_credentials(link, "cr-a", "{}", None);
    assert_eq!(code, 401, "no proof");

    // The machine's own nonce works once.
    let (code, text) = post_credentials(link, "cr-a", &body(&nonce), None);
    assert_eq!(code, 200, "{text}");
    let credentials: unbounded_api::agent::Credentials = serde_json::from_str(&text).unwrap();
    let token = credentials.token.clone();
    let bootstrap = credentials
        .bootstrap_token
        .clone()
        .expect("a bootstrap token");
    assert!(
        credentials
            .certificate_authority
            .contains("BEGIN CERTIFICATE")
    );
    // The same nonce again at once (the first answer was lost on its way): the same
    // credentials, nothing new minted; once the replay window (3 s here) has passed: spent.
    let (code, text) = post_credentials(link, "cr-a", &body(&nonce), None);
    assert_eq!(code, 200, "a lost answer asked for again: {text}");
    let again: unbounded_api::agent::Credentials = serde_json::from_str(&text).unwrap();
    assert_eq!(again.token, token, "the same token, not a new one");
    assert_eq!(again.bootstrap_token.as_deref(), Some(bootstrap.as_str()));
    let (code, _) = post_credentials(
        link,
        "cr-a",
        r#"{"nonce":"NONCE","bootstrapToken":false}"#.replace("NONCE", &nonce).as_str(),
        None,
    );
    assert_eq!(code, 403, "asking for something else with a spent nonce");
    std::thread::sleep(Duration::from_millis(3200));
    let (code, _) = post_credentials(link, "cr-a", &body(&nonce), None);
    assert_eq!(code, 403, "a spent nonce");

    // What the token reaches: its own Machine, Node and role, nothing else.
    let allowed = |args: &[&str]| {
        let (success, out) = as_token(cp, &token, args, None);
        assert!(success, "{args:?} should be allowed: {out}");
    };
    let refused = |args: &[&str]| {
        let (success, out) = as_token(cp, &token, args, None);
        assert!(
            !success && (out.contains("Forbidden") || out.contains("forbidden")),
            "{args:?} should be refused: {out}"
        );
    };
    allowed(&["get", "machine", "cr-a"]);
    allowed(&["get", "node", "cr-a"]);
    allowed(&["get", "clusterrole", "unbounded-agent:cr-a"]);
    allowed(&["get", "machineconfigurationversion", "cr-config-v1"]);
    refused(&["get", "machine", "cr-b"]);
    refused(&["get", "machines"]);
    refused(&["get", "node", "cr-b"]);
    refused(&["get", "clusterrole", "unbounded-agent:cr-b"]);
    refused(&["get", "secrets", "-n", "unbounded-system"]);
    let agent_patch = |machine: &str, status: &str| {
        format!(
            r#"{{"apiVersion":"unbounded-cloud.io/v1alpha1","kind":"Machine","metadata":{{"name":"{machine}"}},"status":{status}}}"#
        )
    };
    let apply_status = |machine: &str, status: &str| {
        as_token(
            cp,
            &token,
            &[
                "apply",
                "--server-side",
                "--subresource=status",
                "--field-manager=unbounded-agent",
                // Forced, so that what refuses a write is the authorizer or the policy, not a
                // field-ownership conflict.
                "--force-conflicts",
                "-f",
                "-",
            ],
            Some(&agent_patch(machine, status)),
        )
    };
    let (success, out) = apply_status(
        "cr-a",
        r#"{"agent":{"version":"test","containerState":"running"}}"#,
    );
    assert!(success, "its own agent status: {out}");
    let (success, out) = apply_status("cr-a", r#"{"phase":"Failed"}"#);
    assert!(
        !success && out.contains("only status.agent"),
        "the controller's phase: {out}"
    );
    let (success, out) = apply_status("cr-b", r#"{"agent":{"version":"test"}}"#);
    assert!(!success, "another machine's status: {out}");

    // Operations: the one routed to cr-a's agent is readable by it, cr-b's is not.
    ok(
        cp,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachineOperation\nmetadata: {name: cr-op-a}\nspec: {machineRef: {name: cr-a}, operationName: reboot}\n---\n\
             apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachineOperation\nmetadata: {name: cr-op-b}\nspec: {machineRef: {name: cr-b}, operationName: reboot}\n",
        ),
    );
    wait_until("cr-op-a in cr-a's role", Duration::from_secs(60), || {
        kubectl(
            cp,
            &["get", "clusterrole", "unbounded-agent:cr-a", "-o", "yaml"],
            None,
        )
        .1
        .contains("cr-op-a")
    });
    allowed(&["get", "machineoperation", "cr-op-a"]);
    refused(&["get", "machineoperation", "cr-op-b"]);
    refused(&["get", "machineoperations"]);

    // A refresh needs this machine's valid token; garbage is refused.
    let (code, text) = post_credentials(link, "cr-a", "{}", Some(&token));
    assert_eq!(code, 200, "refresh: {text}");
    let (code, _) = post_credentials(link, "cr-a", "{}", Some("not-a-token"));
    assert_eq!(code, 401);

    // An expired token is refused, by the API server and by the bootserver; the same token
    // with a future expiry is accepted (so only the expiry differs).
    let uid = ok(
        cp,
        &[
            "get",
            "serviceaccount",
            "-n",
            "unbounded-machines",
            "cr-a",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    );
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let fresh = signed_token(cp, "unbounded-machines", "cr-a", &uid, now + 600);
    let expired = signed_token(cp, "unbounded-machines", "cr-a", &uid, now - 60);
    let (success, out) = as_token(cp, &fresh, &["get", "machine", "cr-a"], None);
    assert!(success, "a valid self-signed token: {out}");
    let (success, out) = as_token(cp, &expired, &["get", "machine", "cr-a"], None);
    assert!(!success && out.contains("Unauthorized"), "expired: {out}");
    let (code, _) = post_credentials(link, "cr-a", "{}", Some(&expired));
    assert_eq!(code, 401, "an expired token buys no refresh");

    // The bootstrap token authenticates as a bootstrapper of Unbounded's group.
    let (success, out) = as_token(cp, &bootstrap, &["auth", "whoami", "-o", "json"], None);
    assert!(
        success && out.contains("system:bootstrappers:unbounded"),
        "{out}"
    );

    // The bootserver may create only bootstrap tokens in kube-system.
    let (success, out) = as_token(
        cp,
        bootserver_token,
        &[
            "create",
            "secret",
            "generic",
            "sneaky",
            "-n",
            "kube-system",
            "--from-literal=a=b",
        ],
        None,
    );
    assert!(!success && out.contains("bootstrap tokens"), "{out}");

    // Nothing secret in the bootserver's log.
    let log = bootserver.log();
    assert!(log.contains("issued agent credentials"), "{log}");
    for secret in [
        token.as_str(),
        &nonce,
        bootstrap.split('.').nth(1).unwrap_or("x"),
    ] {
        assert!(!log.contains(secret), "a secret leaked into the log");
    }
    ok(
        cp,
        &["delete", "machines", "cr-a", "cr-b", "--wait=false"],
        None,
    );
    ok(
        cp,
        &[
            "delete",
            "machineoperations",
            "cr-op-a",
            "cr-op-b",
            "--wait=false",
        ],
        None,
    );
}

/// `curl -i` from the machine's namespace: (HTTP status, headers and body).
fn post_nonce_with_headers(link: &Link, machine: &str, nonce: &str) -> (u16, String) {
    let url = format!("http://{SERVER}:8080/machines/{machine}/credentials");
    let body = format!(r#"{{"nonce":"{nonce}"}}"#);
    curl(
        link,
        &[
            "-i",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
            &url,
        ],
    )
}

#[test]
fn a_slow_mint_is_retried_and_the_agent_gets_its_credentials() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    // The bootserver reaches the API server through a forwarder that the test stalls: a
    // real API server that does not answer for a while.
    let api = StallableForward::start(&api_server_target(cp)).unwrap();
    let site = Site::start(
        cp,
        &[("cr-slow", MAC_SLOW, "10.99.0.23")],
        &api.address(),
        "  mintTimeoutSeconds: 8\n",
    );
    let nonce = site.nonce(MAC_SLOW);
    let gauge = |site: &Site| {
        metric(
            &site.metrics(),
            "unbounded_bootserver_credential_requests_in_flight",
            "",
        )
    };
    let refused = |site: &Site, reason: &str| {
        metric(
            &site.metrics(),
            "unbounded_bootserver_credentials_refused_total",
            &format!("reason=\"{reason}\""),
        )
    };

    // The agent's own credential code, run at the machine's address with this boot's nonce.
    api.stall();
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_path_buf();
    let identity = unbounded_agent::identity::Identity {
        machine: "cr-slow".into(),
        bootserver: Some(format!("http://{SERVER}:8080")),
        nonce: Some(nonce.clone()),
        secure: None,
        ticket: false,
        attest: None,
    };
    let agent = site
        .link
        .client
        .spawn_inside(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let http = reqwest::Client::new();
                let store = unbounded_agent::credentials::Store::new(&state_dir).unwrap();
                unbounded_agent::credential_upkeep::obtain_until_issued(
                    &http, &identity, &store, false,
                )
                .await
            })
        })
        .unwrap();

    // Its request waits for the stalled API server.
    wait_until(
        "the agent's request at the API server",
        Duration::from_secs(30),
        || gauge(&site) >= 1.0 && api.holding() > 0,
    );
    // Meanwhile the same nonce again (an agent restarted mid-request) is busy: retry, not
    // refused.
    let (code, answer) = post_nonce_with_headers(&site.link, "cr-slow", &nonce);
    assert_eq!(code, 503, "a nonce whose mint is under way: {answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 2"),
        "{answer}"
    );
    assert!(answer.contains("being redeemed"), "{answer}");
    // The bootserver stops waiting for the API server before the agent would have, and
    // says "retry" then too; the nonce is not spent.
    wait_until("the mint deadline", Duration::from_secs(30), || {
        refused(&site, "api_timeout") >= 1.0
    });
    let store = unbounded_agent::credentials::Store::new(state.path()).unwrap();
    assert!(
        !store.meta().is_some_and(|m| m.nonce_used),
        "the agent took a busy or slow bootserver for a refusal and marked its nonce spent"
    );

    // The API server answers again: the agent's next attempt gets its credentials.
    api.resume();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !agent.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the agent did not get its credentials; its store says {:?}",
            store.meta()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let credentials = agent.join().unwrap().unwrap();
    let (success, out) = as_token(cp, &credentials.token, &["get", "machine", "cr-slow"], None);
    assert!(success, "the agent's token reads its Machine: {out}");
    assert!(store.meta().is_some_and(|m| m.nonce_used));
    assert!(refused(&site, "nonce_busy") >= 1.0, "{}", site.metrics());
    // Spent by the mint that succeeded: asked again at once by the machine (as an agent
    // whose answer was lost), the same credentials and nothing new (replaySeconds; after
    // it, refused: the first test checks that).
    let (code, answer) = post_nonce_with_headers(&site.link, "cr-slow", &nonce);
    assert_eq!(code, 200, "{answer}");
    assert!(
        answer.contains(&credentials.token),
        "the same token: {answer}"
    );
    assert!(
        !site.bootserver.log().contains(&nonce),
        "a nonce in the log"
    );
    assert!(
        !site.bootserver.log().contains(&credentials.token),
        "a token in the log"
    );
    ok(cp, &["delete", "machines", "cr-slow", "--wait=false"], None);
}

/// Events of `reason` on Machine `machine`.
fn machine_events(cp: &LocalControlPlane, machine: &str, reason: &str) -> String {
    kubectl(
        cp,
        &[
            "get",
            "events",
            "-A",
            "--field-selector",
            &format!("involvedObject.kind=Machine,involvedObject.name={machine},reason={reason}"),
            "-o",
            "jsonpath={.items[*].message}",
        ],
        None,
    )
    .1
}

/// ProxyDHCP: the bootserver knows no lease, so a nonce goes only to the address that the
/// machine's own PXE exchange (port 4011) came from, and only to the hardware that holds
/// it. Another host on the link, asking for the machine's script from its own address,
/// with or without a forged exchange in the machine's name, gets no nonce and cannot
/// displace the machine's; the machine gets its credentials; the refusals are on the
/// Machine as Events and in the metrics.
#[test]
fn in_proxy_mode_a_nonce_goes_only_to_the_host_of_the_machine_s_pxe_exchange() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let machine_ip = "10.99.0.31";
    let site = Site::start_with_dhcp(
        cp,
        &[("cr-proxy", MAC_PROXY, machine_ip)],
        &api_server_target(cp),
        "",
        "  mode: proxy",
    );
    let link = &site.link;
    let script_url = format!("http://{SERVER}:8080/boot.ipxe?mac={MAC_PROXY}");
    let script_from = |ns: &unbounded_testbed::netns::Netns| {
        let out = ns
            .command("curl")
            .args(["-s", &script_url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // The machine itself, before its PXE exchange: nothing vouches for its address yet.
    let script = script_from(&link.client);
    assert!(!script.contains("unbounded.nonce="), "{script}");
    assert!(script.contains("no PXE boot-server exchange"), "{script}");

    // Another host on the same link, with its own MAC: refused, with or without a forged
    // exchange that names the machine's MAC from the host's address.
    let intruder_ip = "10.99.0.50";
    let intruder = link
        .host("02:00:00:00:0e:01", &format!("{intruder_ip}/24"))
        .unwrap();
    let script = script_from(&intruder);
    assert!(!script.contains("unbounded.nonce="), "{script}");
    let forged = pxe_exchange(&intruder, MAC_PROXY, intruder_ip);
    assert!(
        forged.is_some(),
        "the boot-server exchange answers boot information"
    );
    let script = script_from(&intruder);
    assert!(!script.contains("unbounded.nonce="), "{script}");
    assert!(
        script.contains("not one of this machine's MACs"),
        "{script}"
    );

    // The machine's own exchange: its answer is the script's URL, and its script carries a
    // nonce.
    let boot_file = pxe_exchange(&link.client, MAC_PROXY, machine_ip).expect("an answer on 4011");
    assert!(boot_file.contains("boot.ipxe"), "{boot_file}");
    let nonce = site.nonce(MAC_PROXY);

    // The other host cannot displace it, nor use it from its address.
    let script = script_from(&intruder);
    assert!(!script.contains("unbounded.nonce="), "{script}");
    let body = format!(r#"{{"nonce":"{nonce}","bootstrapToken":true}}"#);
    let url = format!("http://{SERVER}:8080/machines/cr-proxy/credentials");
    let out = intruder
        .command("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", "Content-Type: application/json", "-d", &body, &url])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "403",
        "the nonce from another host"
    );

    // The machine gets its credentials with the nonce of its own script.
    let (code, text) = post_credentials(link, "cr-proxy", &body, None);
    assert_eq!(code, 200, "{text}");
    let credentials: unbounded_api::agent::Credentials = serde_json::from_str(&text).unwrap();
    assert!(credentials.bootstrap_token.is_some());

    // What was refused, where an operator looks.
    wait_until("the refusal Event", Duration::from_secs(30), || {
        machine_events(cp, "cr-proxy", "ScriptRefusedOtherHardware").contains("10.99.0.50")
    });
    let metrics = site.metrics();
    for reason in ["no_pxe_exchange", "other_hardware"] {
        assert!(
            metric(
                &metrics,
                "unbounded_bootserver_boot_scripts_refused_total",
                &format!("reason=\"{reason}\"")
            ) >= 1.0,
            "{reason}: {metrics}"
        );
    }
    // The bootserver restarts (where the last credentials went is kept in memory): the
    // machine's refresh with its token is still taken from its own hardware, and still
    // refused from the other host.
    let mut site = site;
    site.bootserver.crash_and_restart(&site.link.server);
    wait_until("the bootserver again", Duration::from_secs(60), || {
        curl(&site.link, &[&format!("http://{SERVER}:8080/readyz")]).0 == 200
    });
    let link = &site.link;
    let (code, text) = post_credentials(link, "cr-proxy", "{}", Some(&credentials.token));
    assert_eq!(code, 200, "a refresh after a restart: {text}");
    let header = format!("Authorization: Bearer {}", credentials.token);
    let out = intruder
        .command("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args([
            "-H",
            "Content-Type: application/json",
            "-H",
            &header,
            "-d",
            "{}",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "403",
        "the machine's token from another host"
    );

    let log = site.bootserver.log();
    assert!(!log.contains(&nonce), "a nonce leaked into the log");
    assert!(
        !log.contains(&credentials.token),
        "a token leaked into the log"
    );
    ok(cp, &["delete", "machine", "cr-proxy", "--wait=false"], None);
}

/// A self-signed certificate and key (P-256) for the bootserver's TLS endpoint in `dir`, and
/// the certificate's SHA-256 (hex).
fn tls_pair(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let (cert, key) = unbounded_testbed::cluster::self_signed_server(dir, SERVER).unwrap();
    let der = CertificateDer::from_pem_file(&cert).unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    let hex = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    (cert, key, hex)
}

/// Runs `work` with the agent's credential code's parts on a thread in `ns`.
fn as_agent_in<T: Send + 'static>(
    ns: &unbounded_testbed::netns::Netns,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    ns.spawn_inside(work).unwrap().join().unwrap().unwrap()
}

/// The agent's own `credentials::obtain` on a thread in `ns`, its state in `dir`.
fn obtain_in(
    ns: &unbounded_testbed::netns::Netns,
    identity: unbounded_agent::identity::Identity,
    dir: std::path::PathBuf,
    bootstrap: bool,
) -> Result<unbounded_api::agent::Credentials, unbounded_agent::credentials::CredentialError> {
    as_agent_in(ns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = unbounded_agent::credentials::Store::new(&dir).unwrap();
            unbounded_agent::credentials::obtain(
                &reqwest::Client::new(),
                &identity,
                &store,
                bootstrap,
            )
            .await
        })
    })
}

/// With `http.tls`, nothing secret crosses the link in clear: the boot script carries no
/// nonce, only the HTTPS endpoint, its certificate's digest and a ticket that the bootserver
/// holds for the address it served the script to; credentials are refused over plain HTTP;
/// the agent's own code pins the certificate (a wrong pin gets nothing, and spends nothing)
/// and redeems the ticket over TLS; and a capture of the whole exchange on the link holds
/// neither the token nor the bootstrap token.
#[test]
fn over_tls_no_secret_crosses_the_link_in_clear() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let pki = tempfile::tempdir().unwrap();
    let (cert, key, pin) = tls_pair(pki.path());
    let machine_ip = "10.99.0.41";
    let site = Site::start_with(
        cp,
        &[("cr-tls", MAC_TLS, machine_ip)],
        &api_server_target(cp),
        "",
        FULL_DHCP,
        &format!(
            r#", tls: {{port: 8443, certFile: "{}", keyFile: "{}"}}"#,
            cert.display(),
            key.display()
        ),
    );
    let link = &site.link;
    let capture_file = pki.path().join("link.pcap");
    let mut capture = link
        .server
        .command("tcpdump")
        .args(["-i", "pxe0", "--immediate-mode", "-U", "-s", "0", "-w"])
        .arg(&capture_file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(pki.path().join("tcpdump.log")).unwrap())
        .spawn()
        .unwrap();
    wait_until("the capture to start", Duration::from_secs(30), || {
        std::fs::metadata(&capture_file).is_ok_and(|m| m.len() >= 24)
    });

    // The script: where to go, what to trust, and no secret.
    let url = format!("http://{SERVER}:8080/boot.ipxe?mac={MAC_TLS}");
    let mut script = String::new();
    wait_until("the machine's script", Duration::from_secs(60), || {
        script = curl(link, &[&url]).1;
        script.contains("unbounded.ticket=1")
    });
    assert!(!script.contains("unbounded.nonce="), "{script}");
    assert!(
        script.contains(&format!("unbounded.credentials=https://{SERVER}:8443")),
        "{script}"
    );
    assert!(
        script.contains(&format!("unbounded.tls-sha256={pin}")),
        "{script}"
    );
    let kernel_line = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap()
        .to_owned();
    let identity = unbounded_agent::identity::from_cmdline(&kernel_line).unwrap();

    // Over plain HTTP: refused before anything is read.
    let (code, text) = post_credentials(link, "cr-tls", r#"{"ticket":true}"#, None);
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("HTTPS only"), "{text}");

    // The agent with another pin: it does not talk to that server, and spends nothing.
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_path_buf();
    let mut impostor = identity.clone();
    if let Some(secure) = impostor.secure.as_mut() {
        secure.sha256 = [0; 32];
    }
    let refused = obtain_in(&link.client, impostor, state_dir.clone(), true);
    let error = refused.expect_err("a certificate that is not the pinned one");
    assert!(error.to_string().contains("pinned"), "{error}");

    // The agent with the boot's pin: credentials over TLS, by the ticket.
    let issued = obtain_in(&link.client, identity, state_dir.clone(), true).unwrap();
    let bootstrap = issued.bootstrap_token.clone().expect("a bootstrap token");
    let store = unbounded_agent::credentials::Store::new(state.path()).unwrap();
    assert!(
        store.meta().is_some_and(|m| m.nonce_used),
        "the ticket is spent"
    );
    // The ticket once more, from the machine, over TLS: spent.
    let out = link
        .client
        .command("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"ticket":true}"#,
        ])
        .arg(format!("https://{SERVER}:8443/machines/cr-tls/credentials"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "403",
        "a spent ticket"
    );

    // The link saw the script, and neither token.
    std::thread::sleep(Duration::from_millis(500));
    // SIGTERM: tcpdump writes out what it holds before it exits.
    let _ = std::process::Command::new("kill")
        .arg(capture.id().to_string())
        .status();
    capture.wait().unwrap();
    let captured = std::fs::read(&capture_file).unwrap();
    let seen = |needle: &str| {
        captured
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    assert!(
        seen("unbounded.ticket=1"),
        "the capture holds the plain script ({} bytes; tcpdump: {})",
        captured.len(),
        std::fs::read_to_string(pki.path().join("tcpdump.log")).unwrap_or_default()
    );
    assert!(!seen(&issued.token), "the token crossed the link in clear");
    let secret_part = bootstrap.split('.').nth(1).unwrap();
    assert!(
        !seen(secret_part),
        "the bootstrap token crossed the link in clear"
    );
    assert!(!seen("unbounded.nonce="), "a nonce crossed the link");
    ok(cp, &["delete", "machine", "cr-tls", "--wait=false"], None);
}

/// One credential request of the agent's own code (attestation included where `attest`
/// names a TPM), run at the machine's address in `ns`, with a fresh state directory.
fn agent_obtains(
    ns: &unbounded_testbed::netns::Netns,
    machine: &str,
    nonce: &str,
    attest: Option<String>,
) -> Result<unbounded_api::agent::Credentials, String> {
    let identity = unbounded_agent::identity::Identity {
        machine: machine.into(),
        bootserver: Some(format!("http://{SERVER}:8080")),
        nonce: Some(nonce.to_owned()),
        secure: None,
        ticket: false,
        attest: attest.map(|tcti| unbounded_agent::identity::Attestor { tcti: Some(tcti) }),
    };
    let state = tempfile::tempdir().unwrap();
    obtain_in(ns, identity, state.path().to_path_buf(), false).map_err(|e| e.to_string())
}

/// Waits until cr-tpm's `TPMAttested` condition's `field` (`status` or `reason`) is `want`.
fn wait_for_attestation(cp: &LocalControlPlane, field: &str, want: &str) {
    let path = format!("{{.status.conditions[?(@.type=='TPMAttested')].{field}}}");
    wait_until(
        &format!("TPMAttested {field} {want}"),
        Duration::from_secs(30),
        || machine_field(cp, "cr-tpm", &path) == want,
    );
}

fn machine_field(cp: &LocalControlPlane, machine: &str, path: &str) -> String {
    kubectl(
        cp,
        &["get", "machine", machine, "-o", &format!("jsonpath={path}")],
        None,
    )
    .1
}

/// TPM identity mode, with real software TPMs (swtpm) driven by the agent's own code
/// through tpm2-tools: the Machine's configuration asks for TPM attestation with trust on
/// first use and one accepted measurement of PCR 9. A TPM whose PCR 9 does not show that
/// boot gets nothing and leaves no endorsement key behind; the same TPM once it does gets
/// credentials, and its endorsement key is recorded on the Machine with `TPMAttested`
/// true; a second TPM presenting the same MAC, the same address and a fresh nonce of the
/// machine's gets nothing, and the Machine's condition and Events say why.
#[test]
fn only_the_machine_s_own_tpm_gets_its_credentials() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let boot_digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, b"unbounded test boot")
        .as_ref()
        .try_into()
        .unwrap();
    let pcr9: Vec<u8> = ring::digest::digest(
        &ring::digest::SHA256,
        &[[0u8; 32].as_slice(), boot_digest.as_slice()].concat(),
    )
    .as_ref()
    .to_vec();
    let pcr9: String = pcr9.iter().map(|b| format!("{b:02x}")).collect();
    // Ahead of the Site's own configuration (priority 0), while this test runs (the guard
    // deletes it however the test ends: the other tests' machines resolve the Site's).
    struct Remove(&'static LocalControlPlane);
    impl Drop for Remove {
        fn drop(&mut self) {
            kubectl(
                self.0,
                &["delete", "machineconfiguration", "cr-tpm-config"],
                None,
            );
        }
    }
    let _remove = Remove(cp);
    ok(
        cp,
        &["apply", "-f", "-"],
        Some(&format!(
            r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {{name: cr-tpm-config}}
spec:
  machineSelector: {{matchLabels: {{lab: credentials}}}}
  priority: 10
  template:
    boot:
      kernelURL: vmlinuz
      initrdURL: initrd.img
      measurements: [{{"9": "{pcr9}"}}]
    identity: {{mode: tpm, trustOnFirstUse: true}}
"#
        )),
    );
    let site = Site::start_with(
        cp,
        &[("cr-tpm", MAC_TPM, "10.99.0.51")],
        &api_server_target(cp),
        "",
        FULL_DHCP,
        "",
    );
    ok(
        cp,
        &[
            "label",
            "machine",
            "cr-tpm",
            "lab=credentials-tpm",
            "--overwrite",
        ],
        None,
    );
    wait_until(
        "the TPM configuration resolved",
        Duration::from_secs(60),
        || machine_field(cp, "cr-tpm", "{.status.configuration.name}") == "cr-tpm-config",
    );
    let genuine = unbounded_testbed::swtpm::Swtpm::start(&site.link.client, 2321).unwrap();
    let impostor = unbounded_testbed::swtpm::Swtpm::start(&site.link.client, 2331).unwrap();
    let genuine_ek = genuine.endorsement_key_name().unwrap();
    assert_ne!(genuine_ek, impostor.endorsement_key_name().unwrap());

    // The script tells the agent to attest.
    let script = curl(
        &site.link,
        &[&format!("http://{SERVER}:8080/boot.ipxe?mac={MAC_TPM}")],
    )
    .1;
    assert!(script.contains("unbounded.attest=tpm"), "{script}");

    // A boot chain that is not the accepted one: nothing, and no EK recorded.
    let nonce = site.nonce(MAC_TPM);
    let refused = agent_obtains(&site.link.client, "cr-tpm", &nonce, Some(genuine.tcti()))
        .expect_err("PCR 9 does not show the accepted boot");
    assert!(refused.contains("accepted measurements"), "{refused}");
    assert_eq!(
        machine_field(cp, "cr-tpm", "{.spec.pxe.identity.endorsementKey}"),
        ""
    );
    wait_for_attestation(cp, "reason", "MeasurementMismatch");

    // Its own TPM, booted as accepted: credentials, and its EK recorded.
    genuine.extend(9, &boot_digest).unwrap();
    let nonce = site.nonce(MAC_TPM);
    let issued = agent_obtains(&site.link.client, "cr-tpm", &nonce, Some(genuine.tcti()))
        .expect("the machine's own TPM attests");
    assert!(!issued.token.is_empty());
    assert_eq!(
        machine_field(cp, "cr-tpm", "{.spec.pxe.identity.endorsementKey}"),
        genuine_ek,
        "recorded on first use"
    );
    wait_for_attestation(cp, "status", "True");

    // Another TPM with the same MAC, address and a valid nonce of the machine: nothing.
    impostor.extend(9, &boot_digest).unwrap();
    let nonce = site.nonce(MAC_TPM);
    let refused = agent_obtains(&site.link.client, "cr-tpm", &nonce, Some(impostor.tcti()))
        .expect_err("another TPM");
    assert!(refused.contains("409"), "{refused}");
    assert!(refused.contains(&genuine_ek), "{refused}");
    wait_for_attestation(cp, "reason", "EndorsementKeyMismatch");
    assert!(
        !machine_events(cp, "cr-tpm", "EndorsementKeyMismatch").is_empty(),
        "a Warning Event on the Machine"
    );
    assert_eq!(
        machine_field(cp, "cr-tpm", "{.spec.pxe.identity.endorsementKey}"),
        genuine_ek,
        "the recorded key stays"
    );
    // Another host on the link cannot even ask for the machine's challenge (it would
    // displace the pending one of a machine that is booting).
    let intruder = site
        .link
        .host("02:00:00:00:0f:01", "10.99.0.52/24")
        .unwrap();
    let out = intruder
        .command("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"endorsementKey":"00","attestationKey":"00"}"#)
        .arg(format!("http://{SERVER}:8080/machines/cr-tpm/attestation"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "403",
        "a challenge for another host"
    );
    // No attestation at all (an agent that skips it, or a host with only the nonce).
    let nonce = site.nonce(MAC_TPM);
    let refused =
        agent_obtains(&site.link.client, "cr-tpm", &nonce, None).expect_err("no attestation");
    assert!(refused.contains("TPM identity mode"), "{refused}");
    let log = site.bootserver.log();
    assert!(!log.contains(&issued.token), "a token in the log");
    ok(cp, &["delete", "machine", "cr-tpm", "--wait=false"], None);
    ok(
        cp,
        &["delete", "machineconfiguration", "cr-tpm-config"],
        None,
    );
}

const MAC_ROTATION: &str = "52:54:00:00:10:01";

/// A certificate rotation without rebooting a machine: with `http.tls.nextCertFile` set,
/// every credential answer over TLS names the current and the next certificate; once the
/// bootserver serves the next one, the agent of a boot that pinned the old one still
/// refreshes (by what it learned), while an agent that never learned it refuses the new
/// certificate.
#[test]
fn agents_follow_a_certificate_rotation_without_a_reboot() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (cert, key, pin) = tls_pair(old.path());
    let (next_cert, next_key, next_pin) = tls_pair(new.path());
    assert_ne!(pin, next_pin);
    let mut site = Site::start_with(
        cp,
        &[("cr-rotation", MAC_ROTATION, "10.99.0.61")],
        &api_server_target(cp),
        "",
        FULL_DHCP,
        &format!(
            r#", tls: {{port: 8443, certFile: "{}", keyFile: "{}", nextCertFile: "{}"}}"#,
            cert.display(),
            key.display(),
            next_cert.display()
        ),
    );
    let url = format!("http://{SERVER}:8080/boot.ipxe?mac={MAC_ROTATION}");
    let mut script = String::new();
    wait_until("the machine's script", Duration::from_secs(60), || {
        script = curl(&site.link, &[&url]).1;
        script.contains("unbounded.ticket=1")
    });
    let kernel_line = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap()
        .to_owned();
    assert!(kernel_line.contains(&format!("unbounded.tls-sha256={pin}")));
    let identity = unbounded_agent::identity::from_cmdline(&kernel_line).unwrap();
    let state = tempfile::tempdir().unwrap();
    let obtain = |identity: &unbounded_agent::identity::Identity, dir: &Path| {
        let (identity, dir) = (identity.clone(), dir.to_path_buf());
        as_agent_in(&site.link.client, move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let store = unbounded_agent::credentials::Store::new(&dir).unwrap();
                unbounded_agent::credentials::obtain(
                    &reqwest::Client::new(),
                    &identity,
                    &store,
                    false,
                )
                .await
                .map_err(|e| e.to_string())
            })
        })
    };
    let issued = obtain(&identity, state.path()).expect("credentials by the ticket");
    assert_eq!(issued.tls_sha256, vec![pin.clone(), next_pin.clone()]);

    // The rotation: the next certificate is served now.
    let config = std::fs::read_to_string(&site.bootserver.config).unwrap();
    let rotated = config
        .replace(&format!(r#", nextCertFile: "{}""#, next_cert.display()), "")
        .replace(
            &cert.display().to_string(),
            &next_cert.display().to_string(),
        )
        .replace(&key.display().to_string(), &next_key.display().to_string());
    assert_ne!(config, rotated);
    std::fs::write(&site.bootserver.config, rotated).unwrap();
    site.bootserver.crash_and_restart(&site.link.server);

    // The agent that learned the next certificate refreshes over it.
    let refreshed = obtain(&identity, state.path()).expect("a refresh after the rotation");
    assert_ne!(refreshed.token, issued.token);
    assert_eq!(refreshed.tls_sha256, vec![next_pin]);
    // One that knows only the boot's pin does not talk to the new certificate.
    let unaware = tempfile::tempdir().unwrap();
    let refused = obtain(&identity, unaware.path()).expect_err("only the boot's pin");
    assert!(refused.contains("pinned"), "{refused}");
    ok(
        cp,
        &["delete", "machine", "cr-rotation", "--wait=false"],
        None,
    );
}

/// The bootserver as the DHCPv6 server of the link, DHCPv4 off.
const FULL_DHCP6: &str = r#"  mode: off
  leaseFile: "{dir}/leases.log"
dhcp6:
  mode: full
  serverAddress: fd00:99::1
  subnets: [{prefix: "fd00:99::/64", pool: ["fd00:99::100", "fd00:99::1ff"]}]"#;

/// Over IPv6 the same rules hold: the nonce in the script fetched from the machine's
/// reserved v6 address, credentials for it from that address only.
#[test]
fn over_ipv6_credentials_go_only_to_the_machine_s_own_address() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let site = Site::start_with_dhcp(
        cp,
        &[("cr-v6", MAC_V6, "fd00:99::21")],
        &api_server_target(cp),
        "",
        FULL_DHCP6,
    );
    let link = &site.link;
    link.client
        .ip(&[
            "-6",
            "addr",
            "add",
            "fd00:99::77/64",
            "dev",
            "eth0",
            "nodad",
        ])
        .unwrap();
    let base = "http://[fd00:99::1]:8080";
    let from = |address: &str, args: &[&str]| {
        let mut full = vec!["-g", "--interface", address];
        full.extend_from_slice(args);
        curl(link, &full)
    };
    let script_url = format!("{base}/boot.ipxe?mac={MAC_V6}");
    let mut script = String::new();
    wait_until(
        "the machine's script over IPv6",
        Duration::from_secs(60),
        || {
            script = from("fd00:99::21", &[&script_url]).1;
            script.contains("unbounded.nonce=")
        },
    );
    assert!(script.contains(&format!("{base}/")), "{script}");
    let nonce = nonce_from_script(&script);
    let (_, stranger_script) = from("fd00:99::77", &[&script_url]);
    assert!(
        !stranger_script.contains("unbounded.nonce="),
        "a script with a nonce for another address of the link: {stranger_script}"
    );
    let body = format!(r#"{{"nonce":"{nonce}","bootstrapToken":false}}"#);
    let post = |address: &str| {
        from(
            address,
            &[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                &body,
                &format!("{base}/machines/cr-v6/credentials"),
            ],
        )
    };
    let (code, text) = post("fd00:99::77");
    assert_eq!(code, 403, "from another address: {text}");
    let (code, text) = post("fd00:99::21");
    assert_eq!(code, 200, "{text}\n{}", site.bootserver.log());
    let credentials: unbounded_api::agent::Credentials = serde_json::from_str(&text).unwrap();
    assert!(!credentials.token.is_empty());
    assert!(
        !site.bootserver.log().contains(&credentials.token),
        "the token was logged"
    );
}

/// With `http.tls` and DHCPv6, a machine provisioned over IPv6 is sent to the HTTPS
/// endpoint on the v6 address (it may have no IPv4 at all) and redeems its ticket there
/// with the agent's own code, pinned to the boot's certificate.
#[test]
fn over_ipv6_and_tls_the_agent_redeems_its_ticket_at_the_v6_address() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    let pki = tempfile::tempdir().unwrap();
    let (cert, key, pin) = tls_pair(pki.path());
    let site = Site::start_with(
        cp,
        &[("cr-v6-tls", MAC_V6_TLS, "fd00:99::22")],
        &api_server_target(cp),
        "",
        FULL_DHCP6,
        &format!(
            r#", tls: {{port: 8443, certFile: "{}", keyFile: "{}"}}"#,
            cert.display(),
            key.display()
        ),
    );
    let link = &site.link;
    // The site gave the client the machine's address, its only global one: the agent's
    // requests leave from it.
    let url = format!("http://[fd00:99::1]:8080/boot.ipxe?mac={MAC_V6_TLS}");
    let mut script = String::new();
    wait_until(
        "the machine's script over IPv6",
        Duration::from_secs(60),
        || {
            script = curl(link, &["-g", &url]).1;
            script.contains("unbounded.ticket=1")
        },
    );
    assert!(
        script.contains("unbounded.credentials=https://[fd00:99::1]:8443"),
        "a v6 machine is sent to the v6 HTTPS endpoint: {script}"
    );
    assert!(
        script.contains(&format!("unbounded.tls-sha256={pin}")),
        "{script}"
    );
    assert!(!script.contains("unbounded.nonce="), "{script}");
    let kernel_line = script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap()
        .to_owned();
    let identity = unbounded_agent::identity::from_cmdline(&kernel_line).unwrap();
    let state = tempfile::tempdir().unwrap();
    let issued = obtain_in(&link.client, identity, state.path().to_path_buf(), true)
        .unwrap_or_else(|e| panic!("{e}\n{}", site.bootserver.log()));
    assert!(!issued.token.is_empty());
    assert!(
        !site.bootserver.log().contains(&issued.token),
        "the token was logged"
    );
    ok(
        cp,
        &["delete", "machine", "cr-v6-tls", "--wait=false"],
        None,
    );
}
