//! Minting an agent's credentials, for the bootserver (the credential issuer), the Azure
//! provider (a VM's first credentials) and the agent (renewing its own token): a token of
//! the Machine's agent ServiceAccount (TokenRequest, bounded expiry) and a kubelet
//! bootstrap token. What they are for, and who may do what with them, is in
//! [`unbounded_api::agent`].

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use unbounded_api::Machine;
use unbounded_api::agent::{AGENT_NAMESPACE, BOOTSTRAP_GROUP, BOOTSTRAP_MACHINE_LABEL};

/// Why a credential could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// The Machine's ServiceAccount does not exist yet (the controller creates it).
    #[error("the machine's ServiceAccount does not exist yet")]
    NotReady,
    /// The API server refused or failed.
    #[error("the API server failed: {0}")]
    Kube(#[source] kube::Error),
    /// The API server answered a TokenRequest without a token.
    #[error("the API server answered the TokenRequest without a status")]
    NoStatus,
    /// The system has no randomness to offer.
    #[error("no randomness for a token")]
    Randomness,
}

/// A fresh token of `machine`'s agent ServiceAccount for `seconds` (TokenRequest): the token
/// and its expiry (RFC 3339).
pub async fn mint_service_account_token(
    client: &Client,
    machine: &str,
    seconds: i64,
) -> Result<(String, String), MintError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), AGENT_NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(seconds),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    };
    let token = match accounts
        .create_token_request(machine, &PostParams::default(), &request)
        .await
    {
        Ok(t) => t,
        Err(kube::Error::Api(status)) if status.code == 404 => return Err(MintError::NotReady),
        Err(e) => return Err(MintError::Kube(e)),
    };
    let status = token.status.ok_or(MintError::NoStatus)?;
    Ok((status.token, status.expiration_timestamp.0.to_string()))
}

/// Random characters from `[a-z0-9]` (bootstrap token IDs and secrets), uniformly.
fn random_token_chars(n: usize) -> Option<String> {
    use ring::rand::SecureRandom;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut buf = vec![0u8; n * 3];
    ring::rand::SystemRandom::new().fill(&mut buf).ok()?;
    // Rejection sampling keeps the distribution uniform (252 = 7 * 36).
    let chars: String = buf
        .iter()
        .filter(|b| **b < 252)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .take(n)
        .collect();
    (chars.len() == n).then_some(chars)
}

/// Creates a kubelet bootstrap token for `machine` that expires after `seconds` (a
/// `bootstrap-token-<id>` Secret in kube-system, group [`BOOTSTRAP_GROUP`], owned by the
/// Machine): returns `<id>.<secret>` and the public id.
pub async fn create_bootstrap_token(
    client: &Client,
    machine: &Machine,
    seconds: u64,
) -> Result<(String, String), MintError> {
    let name = machine.name_any();
    let (Some(id), Some(secret)) = (random_token_chars(6), random_token_chars(16)) else {
        return Err(MintError::Randomness);
    };
    let expiration = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(seconds);
    let data = [
        ("token-id", id.clone()),
        ("token-secret", secret.clone()),
        ("expiration", expiration.to_string()),
        ("usage-bootstrap-authentication", "true".to_owned()),
        ("auth-extra-groups", BOOTSTRAP_GROUP.to_owned()),
        (
            "description",
            format!("kubelet bootstrap of Unbounded machine {name}"),
        ),
    ];
    let owner = machine.controller_owner_ref(&()).map(|mut o| {
        // The Machine does not control the Secret; it only takes it along when deleted.
        o.controller = None;
        o.block_owner_deletion = None;
        o
    });
    let object = Secret {
        metadata: ObjectMeta {
            name: Some(format!("bootstrap-token-{id}")),
            namespace: Some("kube-system".into()),
            labels: Some([(BOOTSTRAP_MACHINE_LABEL.to_owned(), name)].into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(data.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &object)
        .await
        .map_err(MintError::Kube)?;
    Ok((format!("{id}.{secret}"), id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_characters() {
        let id = random_token_chars(6).unwrap();
        assert_eq!(id.len(), 6);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_ne!(random_token_chars(16), random_token_chars(16));
    }
}
