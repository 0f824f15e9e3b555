//! BMC credential Secrets against a real kube-apiserver: read from a watch once it has
//! listed, changes and deletions seen through it; read with a GET where the bootserver may
//! only `get` Secrets (a ServiceAccount with such a Role, impersonated).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use unbounded_pxe::secrets::{BmcSecrets, Source};
use unbounded_testbed::cluster::LocalControlPlane;

/// Applies `manifest`.
fn apply(cp: &LocalControlPlane, manifest: &str) {
    unbounded_testbed::testkit::kubectl_ok(cp, &["apply", "-f", "-"], Some(manifest));
}

fn password(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .unwrap_or_default()
}

/// Reads `bmcs-watched/rack-1` until the answer comes from the watch with the password
/// `expected` (`None`: no such Secret), or panics after 30 s.
async fn watch_shows(secrets: &BmcSecrets, expected: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (secret, source) = secrets.get("bmcs-watched", "rack-1").await.expect("read");
        let seen = secret.as_deref().map(password);
        if source == Source::Watch && seen.as_deref() == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waiting for {expected:?} from the watch: last read {seen:?} by {source:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_come_from_a_watch_and_from_a_get_where_only_get_is_allowed() {
    let cp = LocalControlPlane::shared().expect("control plane");
    let admin = cp.client().await.expect("client");
    apply(
        cp,
        r#"apiVersion: v1
kind: Namespace
metadata: {name: bmcs-watched}
---
apiVersion: v1
kind: Secret
metadata: {name: rack-1, namespace: bmcs-watched}
stringData: {username: admin, password: first}
---
apiVersion: v1
kind: Namespace
metadata: {name: bmcs-get-only}
---
apiVersion: v1
kind: Secret
metadata: {name: rack-2, namespace: bmcs-get-only}
stringData: {username: admin, password: only-get}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: get-only, namespace: bmcs-get-only}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: get-secrets, namespace: bmcs-get-only}
rules: [{apiGroups: [""], resources: [secrets], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: get-secrets, namespace: bmcs-get-only}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: get-secrets}
subjects: [{kind: ServiceAccount, name: get-only, namespace: bmcs-get-only}]
"#,
    );

    // Watched: the first read may be a GET (the list is under way), then the watch answers,
    // and follows a rotation, a deletion and a re-creation.
    let secrets = BmcSecrets::new(admin.clone());
    let (first, _) = secrets.get("bmcs-watched", "rack-1").await.expect("read");
    assert_eq!(first.as_deref().map(password).as_deref(), Some("first"));
    watch_shows(&secrets, Some("first")).await;
    apply(
        cp,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: rack-1, namespace: bmcs-watched}\nstringData: {username: admin, password: rotated}\n",
    );
    watch_shows(&secrets, Some("rotated")).await;
    let api: Api<Secret> = Api::namespaced(admin.clone(), "bmcs-watched");
    api.delete("rack-1", &DeleteParams::default())
        .await
        .expect("delete");
    watch_shows(&secrets, None).await;
    let again: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "rack-1"},
        "stringData": {"username": "admin", "password": "again"}
    }))
    .expect("secret");
    api.create(&PostParams::default(), &again)
        .await
        .expect("create");
    watch_shows(&secrets, Some("again")).await;
    let (absent, source) = secrets.get("bmcs-watched", "no-such").await.expect("read");
    assert!(absent.is_none());
    assert_eq!(source, Source::Watch);

    // Only `get` allowed: every read is a GET, and answers.
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info.impersonate = Some("system:serviceaccount:bmcs-get-only:get-only".into());
    let restricted = kube::Client::try_from(config).expect("client");
    let secrets = BmcSecrets::new(restricted);
    for _ in 0..5 {
        let (secret, source) = secrets.get("bmcs-get-only", "rack-2").await.expect("read");
        assert_eq!(source, Source::Get);
        assert_eq!(secret.as_deref().map(password).as_deref(), Some("only-get"));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (absent, _) = secrets.get("bmcs-get-only", "no-such").await.expect("read");
    assert!(absent.is_none());
}
