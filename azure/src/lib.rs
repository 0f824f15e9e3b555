//! Unbounded's Azure provider: `provider: azure` Machines become Azure VMs that join the
//! cluster exactly like PXE servers (same agent, configuration versions and operations).
//!
//! The second implementation of [`unbounded_runtime::provider::Provider`]: for each Machine it
//! creates a NIC in `spec.azure.subnetID` and a VM whose custom data (cloud-init) installs and
//! starts the agent ([`custom_data`]); it records `spec.providerID`
//! (`azure:///subscriptions/…/virtualMachines/<name>`), the NIC's addresses and the VM's
//! power state; when the Machine is deleted it deletes the VM, its NIC and its OS disk.
//! MachineOperations `powerOn`, `powerOff` (`deallocate: "true"` to release the compute),
//! `powerCycle` and `redeploy` run VM actions ([`operations`]).
//!
//! It speaks the Azure Resource Manager REST API directly ([`arm`]: reqwest 0.13 with ring;
//! api-versions pinned in [`api_version`]), with long-running operations ([`lro`]), throttling
//! and transient failures ([`retry`]) and Azure's errors turned into condition reasons
//! ([`error`]). Tokens come from `azure_identity` ([`credentials`]): a service principal's
//! client secret from a Kubernetes Secret, AKS workload identity, or a managed identity.
//!
//! Decisions are pure functions over plain data with table tests ([`resources`],
//! [`custom_data`], [`lro`], [`retry`], [`error`], [`provider::plan_create`],
//! [`operations::action_of`]); the tests in `tests/` run it against a local fake of Azure
//! Resource Manager that plays its documented behaviour. It has not run against a live
//! subscription: docs/azure.md gives the smoke test an operator runs.

pub mod api_version;
pub mod arm;
pub mod config;
pub mod credentials;
pub mod custom_data;
pub mod error;
pub mod lro;
pub mod operations;
pub mod provider;
pub mod resources;
pub mod retry;

use std::sync::Arc;

use crate::arm::ArmClient;
use crate::config::Settings;
use crate::credentials::{Credentials, IdentityOptions};
use crate::provider::{AzureProvider, AzureSettings};

/// Errors starting the provider.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Http(#[source] reqwest::Error),
    /// The extra CA file could not be read as PEM.
    #[error("--extra-ca-file: {0}")]
    Ca(#[source] reqwest::Error),
    /// The extra CA file holds no certificate.
    #[error("--extra-ca-file: no PEM certificate in the file")]
    NoCa,
    /// The ambient identity could not be set up.
    #[error(transparent)]
    Credentials(#[from] credentials::CredentialsError),
}

/// The HTTP client for ARM and the identity platform: rustls with ring (no C build), the
/// system's roots plus any extra CA, no redirects (ARM sends none; a redirect must not carry
/// the token elsewhere).
pub fn http_client(settings: &Settings) -> Result<reqwest::Client, StartError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(settings.request_timeout)
        .connect_timeout(
            settings
                .request_timeout
                .min(std::time::Duration::from_secs(10)),
        )
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("unbounded-azure/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = &settings.extra_ca_pem {
        let certificates = reqwest::Certificate::from_pem_bundle(pem).map_err(StartError::Ca)?;
        if certificates.is_empty() {
            return Err(StartError::NoCa);
        }
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder.build().map_err(StartError::Http)
}

/// Builds the provider from its settings.
pub fn provider(client: kube::Client, settings: &Settings) -> Result<AzureProvider, StartError> {
    let http = http_client(settings)?;
    let arm = ArmClient::new(
        http.clone(),
        settings.arm_endpoint.clone(),
        settings.retry,
        settings.lro,
    );
    let credentials = Credentials::new(
        client.clone(),
        IdentityOptions::new(http, &settings.authority_host),
        &settings.identity,
    )?;
    Ok(AzureProvider::new(
        arm,
        credentials,
        client,
        AzureSettings {
            cluster_name: settings.cluster_name.clone(),
            bootserver_url: settings.bootserver_url.clone(),
            agent: settings.agent.clone(),
            api_server_url: settings.api_server_url.clone(),
            cluster_ca_pem: settings.cluster_ca_pem.clone(),
            agent_token_seconds: settings.agent_token_seconds,
            bootstrap_token_seconds: settings.bootstrap_token_seconds,
        },
    ))
}

/// Runs the provider loop and the operation handler until one of them ends.
pub async fn run(client: kube::Client, settings: Settings) -> Result<(), StartError> {
    let provider = Arc::new(provider(client.clone(), &settings)?);
    let operations =
        |machines| operations::AzureOperations::new(provider.clone(), machines, client.clone());
    unbounded_runtime::provider::run_with_operations(
        client.clone(),
        provider.clone(),
        settings.loop_settings,
        operations,
    )
    .await;
    Ok(())
}
