//! Azure credentials: `azure_identity` 1.x credentials over our own HTTP transport.
//!
//! Each Machine's calls use the service principal of its `spec.azure.credentialsSecretRef`
//! (keys `tenantID`, `clientID`, `clientSecret`), or, without one, the provider's own
//! identity ([`AmbientIdentity`]): AKS workload identity (a federated service-account token)
//! or a managed identity (IMDS). `azure_identity` caches and renews tokens; a credential built
//! from a Secret is rebuilt when the Secret changes (a rotated secret takes effect at once).
//!
//! `azure_core` and `azure_identity` are used without default features: their default HTTP
//! client is reqwest 0.12 with aws-lc (a C build and a second TLS stack). [`ReqwestTransport`]
//! hands their requests to the provider's reqwest 0.13 client (rustls with ring, plus any
//! extra CA), so there is one HTTP stack.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::Secret as AzureSecret;
use azure_core::error::ErrorKind;
use azure_core::http::headers::{HeaderName, HeaderValue, Headers};
use azure_core::http::{AsyncRawResponse, Body, ClientOptions, HttpClient, Request, Transport};
use azure_identity::{
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions,
    ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId,
    WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use reqwest::Url;
use unbounded_api::{AzureSpec, SecretReference};
use unbounded_runtime::provider::ProviderError;

use crate::arm::Credential;

/// `azure_core`'s HTTP client trait, served by reqwest 0.13.
#[derive(Debug, Clone)]
pub struct ReqwestTransport(pub reqwest::Client);

#[async_trait::async_trait]
impl HttpClient for ReqwestTransport {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
        let method = reqwest::Method::from_bytes(request.method().as_str().as_bytes())
            .map_err(|e| azure_core::Error::with_error(ErrorKind::Other, e, "HTTP method"))?;
        let mut outgoing = self.0.request(method, request.url().as_str());
        for (name, value) in request.headers().iter() {
            outgoing = outgoing.header(name.as_str(), value.as_str());
        }
        match request.body() {
            Body::Bytes(bytes) => outgoing = outgoing.body(bytes.to_vec()),
            Body::SeekableStream(_) => {
                return Err(azure_core::Error::with_message(
                    ErrorKind::Other,
                    "streamed request bodies are not used by token requests",
                ));
            }
        }
        let response = outgoing.send().await.map_err(|e| {
            let kind = if e.is_connect() {
                ErrorKind::Connection
            } else {
                ErrorKind::Io
            };
            azure_core::Error::with_error(kind, e, "sending a token request")
        })?;
        let status = response.status().as_u16();
        let headers: HashMap<HeaderName, HeaderValue> = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((
                    HeaderName::from(name.as_str().to_owned()),
                    HeaderValue::from(value.to_str().ok()?.to_owned()),
                ))
            })
            .collect();
        let body = response.bytes().await.map_err(|e| {
            azure_core::Error::with_error(ErrorKind::Io, e, "reading a token response")
        })?;
        Ok(AsyncRawResponse::from_bytes(
            status.into(),
            Headers::from(headers),
            body.to_vec(),
        ))
    }
}

/// The provider's own identity, for Machines without a credentials Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmbientIdentity {
    /// AKS workload identity: `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and
    /// `AZURE_FEDERATED_TOKEN_FILE`, as the workload-identity webhook sets them.
    Workload,
    /// A managed identity through the instance metadata service: system-assigned, or the
    /// user-assigned identity with this client ID.
    Managed {
        /// The user-assigned identity's client ID.
        client_id: Option<String>,
    },
    /// None: every Machine must name a credentials Secret.
    None,
}

/// Errors building credentials at start-up.
#[derive(Debug, thiserror::Error)]
#[error("setting up the {identity} credential: {source}")]
pub struct CredentialsError {
    identity: &'static str,
    #[source]
    source: azure_core::Error,
}

/// Builds `azure_identity` options: our transport, the authority host.
#[derive(Debug, Clone)]
pub struct IdentityOptions {
    transport: Transport,
    cloud: Arc<CloudConfiguration>,
}

impl IdentityOptions {
    /// Options that send token requests through `http` to `authority_host`.
    pub fn new(http: reqwest::Client, authority_host: &Url) -> Self {
        let mut custom = CustomConfiguration::default();
        custom.authority_host = authority_host.as_str().trim_end_matches('/').to_owned();
        Self {
            transport: Transport::new(Arc::new(ReqwestTransport(http))),
            cloud: Arc::new(custom.into()),
        }
    }

    /// Client options for a credential.
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions {
            transport: Some(self.transport.clone()),
            cloud: Some(self.cloud.clone()),
            ..ClientOptions::default()
        }
    }

    /// A service principal's client-secret credential.
    pub fn client_secret(
        &self,
        tenant: &str,
        client: &str,
        secret: String,
    ) -> azure_core::Result<Credential> {
        let options = ClientSecretCredentialOptions {
            client_options: self.client_options(),
        };
        let credential: Credential = ClientSecretCredential::new(
            tenant,
            client.to_owned(),
            AzureSecret::new(secret),
            Some(options),
        )?;
        Ok(credential)
    }

    /// A workload-identity credential; `None` fields come from the environment.
    pub fn workload(
        &self,
        tenant: Option<String>,
        client: Option<String>,
        token_file: Option<PathBuf>,
    ) -> azure_core::Result<Credential> {
        let options = WorkloadIdentityCredentialOptions {
            credential_options: ClientAssertionCredentialOptions {
                client_options: self.client_options(),
            },
            client_id: client,
            tenant_id: tenant,
            token_file_path: token_file,
        };
        let credential: Credential = WorkloadIdentityCredential::new(Some(options))?;
        Ok(credential)
    }

    /// A managed-identity credential.
    pub fn managed(&self, client_id: Option<String>) -> azure_core::Result<Credential> {
        let options = ManagedIdentityCredentialOptions {
            user_assigned_id: client_id.map(UserAssignedId::ClientId),
            client_options: self.client_options(),
        };
        let credential: Credential = ManagedIdentityCredential::new(Some(options))?;
        Ok(credential)
    }
}

type SecretKey = (String, String);

/// Credentials per Machine.
#[allow(missing_debug_implementations)] // holds credentials
pub struct Credentials {
    kube: kube::Client,
    options: IdentityOptions,
    ambient: Option<Credential>,
    from_secrets: Mutex<HashMap<SecretKey, (String, Credential)>>,
}

impl Credentials {
    /// Credentials that read Secrets through `kube`; the ambient identity is set up now.
    pub fn new(
        kube: kube::Client,
        options: IdentityOptions,
        ambient: &AmbientIdentity,
    ) -> Result<Self, CredentialsError> {
        let ambient = match ambient {
            AmbientIdentity::Workload => Some(options.workload(None, None, None).map_err(
                |source| CredentialsError {
                    identity: "workload identity",
                    source,
                },
            )?),
            AmbientIdentity::Managed { client_id } => Some(
                options
                    .managed(client_id.clone())
                    .map_err(|source| CredentialsError {
                        identity: "managed identity",
                        source,
                    })?,
            ),
            AmbientIdentity::None => None,
        };
        Ok(Self {
            kube,
            options,
            ambient,
            from_secrets: Mutex::new(HashMap::new()),
        })
    }

    /// The credential a Machine's calls use.
    pub async fn for_machine(&self, azure: &AzureSpec) -> Result<Credential, ProviderError> {
        let Some(reference) = &azure.credentials_secret_ref else {
            return self.ambient.clone().ok_or_else(|| {
                ProviderError::new(
                    "CredentialsMissing",
                    "spec.azure.credentialsSecretRef is not set and the provider runs without \
                     an identity of its own (--identity none)",
                )
            });
        };
        let secret = read_secret(&self.kube, reference).await?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let key = (reference.namespace.clone(), reference.name.clone());
        if let Ok(cache) = self.from_secrets.lock()
            && let Some((cached_version, credential)) = cache.get(&key)
            && *cached_version == version
        {
            return Ok(credential.clone());
        }
        let tenant = secret_key(&secret, reference, "tenantID")?;
        let client = secret_key(&secret, reference, "clientID")?;
        let client_secret = secret_key(&secret, reference, "clientSecret")?;
        let credential = self
            .options
            .client_secret(&tenant, &client, client_secret)
            .map_err(|e| {
                ProviderError::new(
                    "CredentialsInvalid",
                    format!("Secret {}/{}: {e}", reference.namespace, reference.name),
                )
            })?;
        if let Ok(mut cache) = self.from_secrets.lock() {
            cache.insert(key, (version, credential.clone()));
        }
        Ok(credential)
    }

    /// The SSH public key of a Machine: `spec.azure.sshPublicKey`, or the `ssh-publickey` key of
    /// `spec.azure.sshKeySecretRef`.
    pub async fn ssh_public_key(&self, azure: &AzureSpec) -> Result<String, ProviderError> {
        if let Some(key) = &azure.ssh_public_key {
            return Ok(key.clone());
        }
        let Some(reference) = &azure.ssh_key_secret_ref else {
            return Err(ProviderError::new(
                "SpecInvalid",
                "set spec.azure.sshPublicKey or spec.azure.sshKeySecretRef",
            ));
        };
        let secret = read_secret(&self.kube, reference).await?;
        secret_key(&secret, reference, "ssh-publickey")
    }
}

async fn read_secret(
    kube: &kube::Client,
    reference: &SecretReference,
) -> Result<Secret, ProviderError> {
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), &reference.namespace);
    secrets
        .get_opt(&reference.name)
        .await
        .map_err(|e| {
            ProviderError::new(
                "CredentialsUnavailable",
                format!(
                    "reading Secret {}/{}: {e}",
                    reference.namespace, reference.name
                ),
            )
        })?
        .ok_or_else(|| {
            ProviderError::new(
                "CredentialsMissing",
                format!(
                    "Secret {}/{} does not exist",
                    reference.namespace, reference.name
                ),
            )
        })
}

/// A non-empty key of a Secret (from `data`, or `stringData` on objects not yet stored).
fn secret_key(
    secret: &Secret,
    reference: &SecretReference,
    name: &str,
) -> Result<String, ProviderError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(name))
        .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(name))
                .map(|v| v.trim().to_owned())
        })
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ProviderError::new(
                "CredentialsMissing",
                format!(
                    "Secret {}/{} has no key {name:?}",
                    reference.namespace, reference.name
                ),
            )
        })
}
