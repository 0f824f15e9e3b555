#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The elector against a real API server: a leader whose route to it stalls (a TCP proxy that
//! stops forwarding without closing anything) drops its work before the follower's work
//! starts, and campaigns again, and a thread that its work left behind (as a blocking BMC
//! call is) is refused by the leader's [`Term`] before the follower starts; a leader that
//! releases the Lease hands over at once.

use std::future::ready;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use unbounded_runtime::leader::{ElectionConfig, Elector, Term, Timing, lead_repeatedly};
use unbounded_testbed::cluster::{LocalControlPlane, client_from_kubeconfig};
use unbounded_testbed::stall::StallableForward;
use unbounded_testbed::testkit::{CapturedLog, TIMEOUT, wait_until};

fn timing() -> Timing {
    Timing::new(
        Duration::from_secs(6),
        Duration::from_secs(4),
        Duration::from_secs(1),
    )
    .unwrap()
}

fn config(lease: &str, identity: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: "default".into(),
        lease_name: lease.into(),
        identity: identity.into(),
        timing: timing(),
    }
}

/// Who did what when: a replica's work `started` or `stopped`, its blocking thread's last
/// granted command `answered by` an instant, or `refused`, by this process's clock.
type Entry = (String, &'static str, Instant);

/// What the replicas' work did, in order.
#[derive(Clone, Default)]
struct Activity(Arc<Mutex<Vec<Entry>>>);

impl Activity {
    fn record(&self, who: &str, what: &'static str) {
        self.record_at(who, what, Instant::now());
    }

    fn record_at(&self, who: &str, what: &'static str, at: Instant) {
        self.0.lock().unwrap().push((who.to_owned(), what, at));
    }

    /// The latest instant recorded for `what` by `who`.
    fn latest(&self, who: &str, what: &str) -> Option<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, e, _)| w == who && *e == what)
            .map(|(_, _, at)| *at)
            .max()
    }

    fn when(&self, who: &str, what: &str, nth: usize) -> Option<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, e, _)| w == who && *e == what)
            .nth(nth)
            .map(|(_, _, at)| *at)
    }

    /// Work that runs until dropped, recording both ends. It also starts a thread that, like
    /// an IPMI call on tokio's blocking pool, is not stopped by the drop: it asks the term for
    /// a command's wait every 20 ms, records when each granted command would be answered by,
    /// and stops at the first refusal.
    fn work(&self, who: &str, term: Term) -> impl Future<Output = ()> + use<> {
        let commands = self.clone();
        let sender = who.to_owned();
        std::thread::spawn(move || {
            loop {
                let asked = Instant::now();
                match term.grant(Duration::from_millis(500)) {
                    Ok(wait) => commands.record_at(&sender, "answered by", asked + wait),
                    Err(_) => {
                        commands.record(&sender, "refused");
                        return;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        struct Stopped(Activity, String);
        impl Drop for Stopped {
            fn drop(&mut self) {
                self.0.record(&self.1, "stopped");
            }
        }
        let activity = self.clone();
        let who = who.to_owned();
        async move {
            activity.record(&who, "started");
            let _stopped = Stopped(activity.clone(), who);
            std::future::pending::<()>().await;
        }
    }
}

/// This process's log, kept in memory, so that a test can wait for what a replica said.
fn captured_log() -> &'static CapturedLog {
    CapturedLog::install("unbounded_runtime=debug")
}

async fn holder(client: &kube::Client, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get_opt(lease)
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_leader_stops_before_the_follower_starts_and_campaigns_again() {
    let log = captured_log();
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let proxy = StallableForward::start(cp.server_url().trim_start_matches("https://")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("proxied.kubeconfig");
    std::fs::write(
        &kubeconfig,
        std::fs::read_to_string(cp.kubeconfig_path())
            .unwrap()
            .replace(cp.server_url(), &format!("https://{}", proxy.address())),
    )
    .unwrap();
    let client_a = client_from_kubeconfig(&kubeconfig).await.unwrap();
    let lease = "rt-stall";
    let activity = Activity::default();

    let mut a = Elector::new(client_a, config(lease, "rt-a"));
    let work_a = activity.clone();
    let replica_a =
        tokio::spawn(
            async move { lead_repeatedly(&mut a, |term| work_a.work("rt-a", term)).await },
        );
    wait_until("rt-a to lead", TIMEOUT, || {
        ready(activity.when("rt-a", "started", 0).is_some())
    })
    .await;
    let mut b = Elector::new(client.clone(), config(lease, "rt-b"));
    let work_b = activity.clone();
    let replica_b =
        tokio::spawn(
            async move { lead_repeatedly(&mut b, |term| work_b.work("rt-b", term)).await },
        );

    // rt-a's route stalls: it stops (its work dropped) before rt-b starts.
    let stalled = Instant::now();
    proxy.stall();
    wait_until("rt-b to lead", TIMEOUT, || {
        ready(activity.when("rt-b", "started", 0).is_some())
    })
    .await;
    let a_stopped = activity.when("rt-a", "stopped", 0).expect("rt-a stopped");
    let b_started = activity.when("rt-b", "started", 0).unwrap();
    assert!(a_stopped > stalled);
    assert!(
        a_stopped < b_started,
        "rt-a stopped {:?} after rt-b started",
        a_stopped - b_started
    );
    assert_eq!(holder(&client, lease).await.as_deref(), Some("rt-b"));
    // The thread rt-a's dropped work left behind was refused, and every command it was
    // granted would have been answered before rt-b started.
    let refused = activity
        .when("rt-a", "refused", 0)
        .expect("rt-a's thread was refused");
    let last_answer = activity.latest("rt-a", "answered by").unwrap();
    assert!(
        refused <= b_started,
        "refused {:?} after rt-b started",
        refused - b_started
    );
    assert!(
        last_answer < b_started,
        "a command granted to rt-a could be answered {:?} after rt-b started",
        last_answer - b_started
    );
    eprintln!(
        "rt-a stopped {:.1} s after the stall, rt-b started {:.1} s after that",
        (a_stopped - stalled).as_secs_f64(),
        (b_started - a_stopped).as_secs_f64()
    );

    // The route back: rt-a campaigns again but rt-b renews. rt-b then dies without a word
    // (its task aborted, no release): rt-a leads again once the lease has expired for it.
    proxy.resume();
    wait_until("rt-a to see rt-b's lease", TIMEOUT, || {
        ready(log.text().contains("following: the lease is held by rt-b"))
    })
    .await;
    assert!(
        activity.when("rt-a", "started", 1).is_none(),
        "rt-a took a held lease"
    );
    replica_b.abort();
    wait_until("rt-a to lead again", TIMEOUT, || {
        ready(activity.when("rt-a", "started", 1).is_some())
    })
    .await;
    let b_stopped = activity.when("rt-b", "stopped", 0).expect("rt-b stopped");
    assert!(b_stopped < activity.when("rt-a", "started", 1).unwrap());
    assert_eq!(holder(&client, lease).await.as_deref(), Some("rt-a"));
    replica_a.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_released_lease_is_taken_at_once() {
    captured_log();
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let lease = "rt-release";
    let mut a = Elector::new(client.clone(), config(lease, "rt-c"));
    a.acquire().await;
    assert_eq!(a.lead(async { "done" }).await, Ok("done"));
    a.release().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let spec = leases.get(lease).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity, None);

    // A newcomer takes a released lease at its first read, not a lease duration later.
    let mut b = Elector::new(client.clone(), config(lease, "rt-d"));
    let started = Instant::now();
    tokio::time::timeout(timing().retry_period(), b.acquire())
        .await
        .expect("taken at the first attempt");
    eprintln!("taken {:?} after the release", started.elapsed());
    let spec = leases.get(lease).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("rt-d"));
    assert_eq!(spec.lease_duration_seconds, Some(6));
}

/// `deploy/`'s RBAC lets each component hold its own Lease (create it, renew it, release
/// it: the elector's requests, made as the component's ServiceAccount), and only its own.
#[tokio::test(flavor = "multi_thread")]
async fn deploys_rbac_lets_each_component_hold_its_own_lease_only() {
    captured_log();
    let cp = LocalControlPlane::shared().unwrap();
    let deploy = unbounded_testbed::cluster::deploy_dir();
    let mut apply = vec!["apply", "--server-side", "-f"];
    let files: Vec<String> = [
        "namespace.yaml",
        "rbac/controller.yaml",
        "rbac/bootserver.yaml",
        "rbac/azure.yaml",
    ]
    .iter()
    .map(|f| deploy.join(f).display().to_string())
    .collect();
    apply.push(&files[0]);
    cp.kubectl_output(&apply).unwrap();
    for file in &files[1..] {
        cp.kubectl_output(&["apply", "--server-side", "-f", file])
            .unwrap();
    }
    let components = [
        ("unbounded-controller", "unbounded-controller"),
        ("unbounded-bootserver", "unbounded-pxe-provider"),
        ("unbounded-azure", "unbounded-azure-provider"),
    ];
    for (account, lease) in components {
        let user = format!("system:serviceaccount:unbounded-system:{account}");
        let kubeconfig = kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
        let mut api_config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        api_config.auth_info.impersonate = Some(user.clone());
        let client = kube::Client::try_from(api_config).unwrap();
        let mut elector = Elector::new(
            client,
            ElectionConfig {
                namespace: "unbounded-system".into(),
                ..config(lease, account)
            },
        );
        tokio::time::timeout(Duration::from_secs(20), elector.acquire())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{account} could not take {lease}:\n{}",
                    captured_log().text()
                )
            });
        // Long enough for renewals (every second).
        let renewals = elector.lead(tokio::time::sleep(Duration::from_millis(2_500)));
        assert_eq!(renewals.await, Ok(()), "{account} renews {lease}");
        elector.release().await;
        let leases: Api<Lease> = Api::namespaced(cp.client().await.unwrap(), "unbounded-system");
        let spec = leases.get(lease).await.unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity, None, "{account} released {lease}");
        assert!(
            spec.renew_time > spec.acquire_time,
            "{account} renewed {lease}"
        );
        // Not another component's Lease.
        for (_, other) in components.iter().filter(|(a, _)| *a != account) {
            if account == "unbounded-controller" {
                continue; // its Role predates this one and is not limited by name
            }
            // `can-i` answers on stdout, and exits 1 for "no".
            let output = cp
                .kubectl()
                .args(["auth", "can-i", "update"])
                .arg(format!("leases/{other}"))
                .args(["-n", "unbounded-system", "--as", &user])
                .output()
                .unwrap();
            let answer = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                answer.trim() == "no",
                "{account} may update {other}: {answer}"
            );
        }
    }
}
