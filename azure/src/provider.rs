//! The Azure provider: `provider: azure` Machines on the shared provider loop
//! ([`unbounded_runtime::provider`]).
//!
//! - create: the NIC, then the VM with the agent's custom data; waits for both operations;
//!   reports the power state, the NIC's addresses and the provider ID
//!   (`azure:///subscriptions/…/virtualMachines/<name>`), which the loop records in
//!   `spec.providerID`. A VM that exists already is reused (or awaited while Azure is still
//!   creating it; PUT again when its provisioning failed).
//! - observe: the VM's provisioning and power state (one GET with its instance view) and the
//!   NIC's addresses.
//! - delete: the VM, then its NIC and OS disk; each missing one counts as deleted.
//!
//! A VM that disappears behind the operator's back (deleted in the portal, say) is reported,
//! not recreated: once `spec.providerID` is recorded, a missing VM makes `InfrastructureReady`
//! False with reason `VmNotFound` and a message that says what to do (delete the Machine,
//! which releases the NIC and disk, and create it again). Recreating silently would hand the
//! Node a new disk and address without anyone deciding it.

use unbounded_api::agent;
use unbounded_api::well_known::{field_managers, finalizers};
use unbounded_api::{AzureSpec, Machine, MachineProvider};
use unbounded_runtime::provider::{Observed, Provider, ProviderError, Step, next_step};
use unbounded_runtime::tokens::{self, MintError};

use crate::arm::{ArmClient, Credential};
use crate::credentials::Credentials;
use crate::custom_data::{self, AgentLaunch, AgentSource};
use crate::error::ArmError;
use crate::lro;
use crate::resources::{self, VmRequest, VmResources, VmView};

/// What `create` does, given what it finds (a pure decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatePlan {
    /// Create (or update) the NIC and the VM.
    Create,
    /// The VM is being created or updated by an earlier call: wait for it.
    Wait,
    /// The VM exists and is provisioned: use it.
    Reuse,
    /// The VM was created before (its provider ID is recorded) and is gone: report it.
    Gone,
    /// `spec.providerID` names another VM.
    Mismatch {
        /// What the Machine says.
        recorded: String,
    },
}

/// Decides `create`'s plan from the recorded provider ID, this Machine's provider ID and the
/// VM's provisioning state (`None` when the VM does not exist).
pub fn plan_create(
    recorded: Option<&str>,
    ours: &str,
    vm_state: Option<Option<&str>>,
) -> CreatePlan {
    if let Some(recorded) = recorded.filter(|r| *r != ours) {
        return CreatePlan::Mismatch {
            recorded: recorded.to_owned(),
        };
    }
    match vm_state {
        None if recorded.is_some() => CreatePlan::Gone,
        None => CreatePlan::Create,
        Some(None) => CreatePlan::Reuse,
        Some(Some(state)) if state.eq_ignore_ascii_case("succeeded") => CreatePlan::Reuse,
        Some(Some(state)) if lro::is_terminal(state) => CreatePlan::Create,
        Some(Some(_)) => CreatePlan::Wait,
    }
}

/// What the provider needs besides the API clients.
#[derive(Debug, Clone)]
pub struct AzureSettings {
    /// Written into the `unbounded-cluster` tag.
    pub cluster_name: String,
    /// A bootserver's URL as the VMs reach it, for relative node image URLs.
    pub bootserver_url: Option<String>,
    /// Where the agent comes from.
    pub agent: AgentSource,
    /// The API server as the VMs reach it.
    pub api_server_url: String,
    /// The cluster CA the VMs trust (PEM).
    pub cluster_ca_pem: String,
    /// Lifetime of a VM's first agent token.
    pub agent_token_seconds: u64,
    /// Lifetime of a VM's kubelet bootstrap token.
    pub bootstrap_token_seconds: u64,
}

/// The Azure provider.
#[allow(missing_debug_implementations)] // holds credentials
pub struct AzureProvider {
    arm: ArmClient,
    credentials: Credentials,
    kube: kube::Client,
    settings: AzureSettings,
}

/// A minting failure as a provider error: the ServiceAccount not existing yet is waited for.
fn mint_failure(error: MintError) -> ProviderError {
    match error {
        MintError::NotReady => ProviderError::new(
            "AgentIdentityPending",
            "waiting for the controller to create the Machine's agent ServiceAccount",
        ),
        other => ProviderError::new(
            "AgentCredentialsFailed",
            format!("minting the VM's first agent credentials: {other}"),
        ),
    }
}

/// An ARM failure as a provider error (its reason and message; never a token).
pub fn arm_failure(error: ArmError) -> ProviderError {
    if error.is_terminal() {
        ProviderError::terminal(error.reason(), error.to_string())
    } else {
        ProviderError::new(error.reason(), error.to_string())
    }
}

/// The report for a VM that vanished.
fn vanished(resources: &VmResources) -> ProviderError {
    ProviderError::gone(
        "VmNotFound",
        format!(
            "VM {} ({}) no longer exists in Azure: it was deleted outside Unbounded. The \
             provider does not recreate it: delete this Machine (its NIC and OS disk are \
             released) and create it again to get a new VM",
            resources.vm,
            resources.provider_id()
        ),
    )
}

/// Condition reasons that mean no credential was ever usable for this Machine.
const NO_CREDENTIALS: [&str; 4] = [
    "CredentialsMissing",
    "CredentialsUnavailable",
    "CredentialsInvalid",
    "AzureAuthenticationFailed",
];

impl AzureProvider {
    /// A provider over these clients.
    pub fn new(
        arm: ArmClient,
        credentials: Credentials,
        kube: kube::Client,
        settings: AzureSettings,
    ) -> Self {
        Self {
            arm,
            credentials,
            kube,
            settings,
        }
    }

    /// The agent's first credentials for a VM about to be created, as the JSON it reads: a
    /// token of the Machine's agent ServiceAccount and a kubelet bootstrap token.
    async fn agent_credentials(&self, machine: &Machine) -> Result<String, ProviderError> {
        let name = machine.metadata.name.as_deref().unwrap_or_default();
        let seconds = i64::try_from(self.settings.agent_token_seconds).unwrap_or(86_400);
        let (token, expiration_timestamp) =
            tokens::mint_service_account_token(&self.kube, name, seconds)
                .await
                .map_err(mint_failure)?;
        let (bootstrap, _) = tokens::create_bootstrap_token(
            &self.kube,
            machine,
            self.settings.bootstrap_token_seconds,
        )
        .await
        .map_err(mint_failure)?;
        let credentials = agent::Credentials {
            token,
            expiration_timestamp,
            lifetime_seconds: self.settings.agent_token_seconds,
            server: self.settings.api_server_url.clone(),
            certificate_authority: self.settings.cluster_ca_pem.clone(),
            bootstrap_token: Some(bootstrap),
            tls_sha256: Vec::new(),
        };
        serde_json::to_string(&credentials)
            .map_err(|e| ProviderError::new("AgentCredentialsFailed", e.to_string()))
    }

    /// The Machine's Azure settings, resources and credential.
    pub async fn context<'m>(
        &self,
        machine: &'m Machine,
    ) -> Result<(&'m AzureSpec, VmResources, Credential), ProviderError> {
        let azure = machine.spec.azure.as_ref().ok_or_else(|| {
            ProviderError::new("SpecInvalid", "an azure Machine needs spec.azure")
        })?;
        let resources = VmResources::of(machine)
            .map_err(|e| ProviderError::new("SpecInvalid", e.to_string()))?;
        let credential = self.credentials.for_machine(azure).await?;
        Ok((azure, resources, credential))
    }

    /// The VM with its instance view, or `None`.
    pub async fn read_vm(
        &self,
        resources: &VmResources,
        credential: &Credential,
    ) -> Result<Option<serde_json::Value>, ProviderError> {
        self.arm
            .get(
                credential,
                &format!("reading VM {}", resources.vm),
                &resources.vm_view_path(),
            )
            .await
            .map_err(arm_failure)
    }

    /// Creates the NIC and the VM; `vm_exists` when re-sending the PUT of a VM whose
    /// provisioning failed (its custom data stays as first sent).
    async fn create_resources(
        &self,
        machine: &Machine,
        azure: &AzureSpec,
        resources: &VmResources,
        credential: &Credential,
        vm_exists: bool,
    ) -> Result<(), ProviderError> {
        let ssh_public_key = self.credentials.ssh_public_key(azure).await?;
        let name = &resources.vm;
        let tags = resources::tags(name, &self.settings.cluster_name, &azure.tags);
        self.arm
            .put(
                credential,
                &format!("creating NIC {}", resources.nic),
                &resources.nic_path(),
                &resources::nic_body(azure, &tags),
            )
            .await
            .map_err(arm_failure)?;
        let provider_id = resources.provider_id();
        let custom_data = if vm_exists {
            None
        } else {
            // Minted only now, when the VM is about to be created. A create whose PUT failed
            // outright mints again next time (the earlier tokens expire unused; the
            // bootstrap Secret goes with the Machine).
            let credentials_json = self.agent_credentials(machine).await?;
            let cloud_config = custom_data::render(&AgentLaunch {
                machine: machine.metadata.name.as_deref().unwrap_or(name),
                bootserver_url: self.settings.bootserver_url.as_deref(),
                provider_id: &provider_id,
                source: &self.settings.agent,
                credentials_json: &credentials_json,
            })
            .map_err(|e| ProviderError::new("SpecInvalid", e.to_string()))?;
            Some(custom_data::encode(&cloud_config))
        };
        let body = resources::vm_body(&VmRequest {
            azure,
            resources,
            tags: &tags,
            ssh_public_key: &ssh_public_key,
            custom_data_base64: custom_data.as_deref(),
        });
        self.arm
            .put(
                credential,
                &format!("creating VM {name}"),
                &resources.vm_path(),
                &body,
            )
            .await
            .map_err(arm_failure)?;
        tracing::info!(machine = %name, vm = %resources.vm_id(), "VM created");
        Ok(())
    }

    /// The VM's state and the NIC's addresses.
    async fn observe_resources(
        &self,
        resources: &VmResources,
        credential: &Credential,
    ) -> Result<Observed, ProviderError> {
        let vm = self
            .read_vm(resources, credential)
            .await?
            .ok_or_else(|| vanished(resources))?;
        let view = VmView::of(&vm);
        let nic = self
            .arm
            .get(
                credential,
                &format!("reading NIC {}", resources.nic),
                &resources.nic_path(),
            )
            .await
            .map_err(arm_failure)?;
        Ok(Observed {
            power: view.power,
            addresses: nic
                .as_ref()
                .map(resources::nic_addresses)
                .unwrap_or_default(),
            provider_id: Some(resources.provider_id()),
            detail: Some(view.describe(&resources.vm)),
        })
    }

    async fn delete_resources(
        &self,
        resources: &VmResources,
        credential: &Credential,
    ) -> Result<(), ArmError> {
        let steps = [
            (format!("deleting VM {}", resources.vm), resources.vm_path()),
            (
                format!("deleting NIC {}", resources.nic),
                resources.nic_path(),
            ),
            (
                format!("deleting OS disk {}", resources.os_disk),
                resources.os_disk_path(),
            ),
        ];
        for (action, path) in steps {
            self.arm.delete(credential, &action, &path).await?;
        }
        Ok(())
    }

    /// Runs a VM action and waits for it; returns the VM's state afterwards.
    pub async fn act(&self, machine: &Machine, action: &str) -> Result<VmView, ProviderError> {
        let (_, resources, credential) = self.context(machine).await?;
        if self.read_vm(&resources, &credential).await?.is_none() {
            return Err(vanished(&resources));
        }
        self.arm
            .post(
                &credential,
                &format!("{action} VM {}", resources.vm),
                &resources.vm_action_path(action),
            )
            .await
            .map_err(arm_failure)?;
        let vm = self
            .read_vm(&resources, &credential)
            .await?
            .ok_or_else(|| vanished(&resources))?;
        Ok(VmView::of(&vm))
    }
}

impl Provider for AzureProvider {
    const KIND: MachineProvider = MachineProvider::Azure;
    const FINALIZER: &'static str = finalizers::AZURE_PROVIDER;
    const FIELD_MANAGER: &'static str = field_managers::AZURE_PROVIDER;

    async fn create(&self, machine: &Machine) -> Result<Observed, ProviderError> {
        let (azure, resources, credential) = self.context(machine).await?;
        let vm = self.read_vm(&resources, &credential).await?;
        let state = vm.as_ref().map(|v| VmView::of(v).provisioning_state);
        let plan = plan_create(
            machine.spec.provider_id.as_deref(),
            &resources.provider_id(),
            state.as_ref().map(Option::as_deref),
        );
        match plan {
            CreatePlan::Mismatch { recorded } => {
                return Err(ProviderError::new(
                    "ProviderIDMismatch",
                    format!(
                        "spec.providerID is {recorded}, not this Machine's VM {}; \
                         spec.providerID is immutable: delete and recreate the Machine",
                        resources.provider_id()
                    ),
                ));
            }
            CreatePlan::Gone => return Err(vanished(&resources)),
            CreatePlan::Reuse => {}
            CreatePlan::Wait => self
                .arm
                .wait_for_resource(
                    &credential,
                    &format!("waiting for VM {}", resources.vm),
                    &resources.vm_path(),
                )
                .await
                .map_err(arm_failure)?,
            CreatePlan::Create => {
                self.create_resources(machine, azure, &resources, &credential, vm.is_some())
                    .await?;
            }
        }
        self.observe_resources(&resources, &credential).await
    }

    async fn observe(&self, machine: &Machine) -> Result<Observed, ProviderError> {
        let (_, resources, credential) = self.context(machine).await?;
        self.observe_resources(&resources, &credential).await
    }

    async fn delete(&self, machine: &Machine) -> Result<(), ProviderError> {
        // Nothing could have been created for a Machine without resources.
        let Ok(resources) = VmResources::of(machine) else {
            return Ok(());
        };
        let result = match self.context(machine).await {
            Ok((_, _, credential)) => self
                .delete_resources(&resources, &credential)
                .await
                .map_err(arm_failure),
            Err(error) => Err(error),
        };
        match result {
            Ok(()) => {
                tracing::info!(machine = %resources.vm, "VM, NIC and OS disk deleted");
                Ok(())
            }
            // Never provisioned and no credential works: nothing was ever created with one.
            // Keeping the Machine would only block its deletion.
            Err(error)
                if next_step(machine) == Step::Create
                    && NO_CREDENTIALS.contains(&error.reason.as_str()) =>
            {
                tracing::warn!(machine = %resources.vm, nic = %resources.nic_id(), %error, "released without deleting: no usable credentials and never provisioned");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// A failed create can leave a NIC (or a VM whose provisioning failed) behind: always
    /// clean up.
    fn must_release(&self, _machine: &Machine) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_plans() {
        let ours = "azure:///subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/m";
        let other = "azure:///subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/x";
        let cases = [
            ("first time", None, None, CreatePlan::Create),
            (
                "created, provisioned",
                None,
                Some(Some("Succeeded")),
                CreatePlan::Reuse,
            ),
            (
                "recorded, provisioned",
                Some(ours),
                Some(Some("Succeeded")),
                CreatePlan::Reuse,
            ),
            (
                "still creating",
                None,
                Some(Some("Creating")),
                CreatePlan::Wait,
            ),
            (
                "updating",
                Some(ours),
                Some(Some("Updating")),
                CreatePlan::Wait,
            ),
            (
                "provisioning failed: PUT again",
                None,
                Some(Some("Failed")),
                CreatePlan::Create,
            ),
            ("no state reported", None, Some(None), CreatePlan::Reuse),
            (
                "vanished after it was recorded",
                Some(ours),
                None,
                CreatePlan::Gone,
            ),
            (
                "another VM recorded",
                Some(other),
                None,
                CreatePlan::Mismatch {
                    recorded: other.into(),
                },
            ),
        ];
        for (case, recorded, state, expected) in cases {
            assert_eq!(plan_create(recorded, ours, state), expected, "{case}");
        }
    }
}
