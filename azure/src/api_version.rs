//! The Azure Resource Manager api-versions this provider speaks, named in one place.
//!
//! Each request carries the api-version of its resource provider. These are GA versions whose
//! request and response shapes the tests' fixtures come from (azure-rest-api-specs,
//! `specification/compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2024-07-01` and
//! `specification/network/resource-manager/Microsoft.Network/stable/2024-05-01`). Moving to a
//! newer version means reading its changelog and the fixtures again, not only these strings.

/// `Microsoft.Compute` (virtual machines, disks).
pub const COMPUTE: &str = "2024-07-01";
/// `Microsoft.Network` (network interfaces).
pub const NETWORK: &str = "2024-05-01";
