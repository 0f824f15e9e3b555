//! Unbounded's Azure provider: creates a Machine's VM through the Azure Resource Manager REST
//! API and passes the agent's configuration as custom data.
//!
//! Not built yet: it arrives with its own issue. The Machine API it will serve
//! (`spec.azure`: subscriptionID, resourceGroup, location, vmSize, image, subnetID,
//! sshKeySecretRef) is defined and validated in `unbounded_api::machine::AzureSpec`.
