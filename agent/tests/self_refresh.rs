#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! A machine that is not network-booted (an Azure VM) against a real control plane: the
//! agent takes over the credentials file it was given, removes it, and renews its token
//! through the TokenRequest API with the Role the controller gives it (made here from the
//! same rules); an expired token is reported as such and marked as not worth a quick retry.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use unbounded_agent::credentials::{self, CredentialError, Store};
use unbounded_agent::identity::Identity;
use unbounded_api::agent::{AGENT_NAMESPACE, Credentials, role_name, self_refresh_rules};
use unbounded_runtime::tokens::mint_service_account_token;
use unbounded_testbed::cluster::LocalControlPlane;

const MACHINE: &str = "selfrenew-1";

async fn create<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating {:?}: {e}", object.meta().name),
    }
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        ..ObjectMeta::default()
    }
}

#[tokio::test]
async fn an_agent_renews_its_own_token_from_a_credentials_file() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = LocalControlPlane::shared().unwrap();
    let admin = cp.client().await.unwrap();
    create(
        &Api::<Namespace>::all(admin.clone()),
        &Namespace {
            metadata: meta(AGENT_NAMESPACE, None),
            ..Namespace::default()
        },
    )
    .await;
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), AGENT_NAMESPACE);
    create(
        &accounts,
        &ServiceAccount {
            metadata: meta(MACHINE, Some(AGENT_NAMESPACE)),
            ..ServiceAccount::default()
        },
    )
    .await;
    let name = role_name(MACHINE);
    create(
        &Api::<Role>::namespaced(admin.clone(), AGENT_NAMESPACE),
        &Role {
            metadata: meta(&name, Some(AGENT_NAMESPACE)),
            rules: Some(self_refresh_rules(MACHINE)),
        },
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(admin.clone(), AGENT_NAMESPACE),
        &RoleBinding {
            metadata: meta(&name, Some(AGENT_NAMESPACE)),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: MACHINE.into(),
                namespace: Some(AGENT_NAMESPACE.into()),
                api_group: None,
            }]),
        },
    )
    .await;

    // What the Azure provider writes into the VM's custom data.
    let (token, expiration_timestamp) = mint_service_account_token(&admin, MACHINE, 3600)
        .await
        .unwrap();
    let ca = std::fs::read_to_string(cp.data_dir().join("pki/ca.crt")).unwrap();
    let given = Credentials {
        token: token.clone(),
        expiration_timestamp,
        lifetime_seconds: 3600,
        server: cp.server_url().to_owned(),
        certificate_authority: ca,
        bootstrap_token: Some("abcdef.0123456789abcdef".into()),
        tls_sha256: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.json");
    std::fs::write(&file, serde_json::to_vec(&given).unwrap()).unwrap();
    let store = Store::new(&dir.path().join("state")).unwrap();
    assert!(credentials::import(&store, &file).unwrap());
    assert!(!file.exists());

    let identity = Identity {
        machine: MACHINE.into(),
        bootserver: None,
        nonce: None,
        secure: None,
        ticket: false,
        attest: None,
    };
    let http = reqwest::Client::new();
    let renewed = credentials::obtain(&http, &identity, &store, true)
        .await
        .unwrap();
    assert_ne!(renewed.token, token, "a new token");
    assert_eq!(store.token().as_deref(), Some(renewed.token.as_str()));
    assert_eq!(
        renewed.bootstrap_token.as_deref(),
        Some("abcdef.0123456789abcdef"),
        "the kubelet's bootstrap token from the file"
    );
    let meta = store.meta().unwrap();
    assert!(meta.self_refresh);
    assert!(meta.expires_unix > credentials::now_unix() + 3000);

    // The renewed token renews again (the chain goes on), without the bootstrap token.
    let again = credentials::obtain(&http, &identity, &store, false)
        .await
        .unwrap();
    assert_ne!(again.token, renewed.token);
    assert_eq!(again.bootstrap_token, None);

    // Another machine's name with this token: refused, and said so.
    let other = Identity {
        machine: "someone-else".into(),
        ..identity.clone()
    };
    let error = credentials::obtain(&http, &other, &store, false)
        .await
        .unwrap_err();
    assert!(matches!(error, CredentialError::Renewal { .. }), "{error}");
    assert!(
        !error.to_string().contains(&again.token),
        "no token in errors"
    );

    // A token that expired while the machine was off cannot renew itself.
    let expired = Credentials {
        expiration_timestamp: "2020-01-01T00:00:00Z".into(),
        ..given
    };
    std::fs::write(&file, serde_json::to_vec(&expired).unwrap()).unwrap();
    assert!(credentials::import(&store, &file).unwrap());
    let error = credentials::obtain(&http, &identity, &store, false)
        .await
        .unwrap_err();
    assert!(matches!(error, CredentialError::Expired), "{error}");
    assert!(!error.is_retryable());
}
