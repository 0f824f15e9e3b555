//! Where machines get their kernel, initramfs and node image: plain data the appliance
//! publishes and the lab's configurations (discovery's included) name.

use serde::{Deserialize, Serialize};

/// Where machines get their kernel, initramfs and node image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootArtifacts {
    /// `boot.kernelURL`.
    pub kernel_url: String,
    /// `boot.initrdURL`.
    pub initrd_url: String,
    /// `image.url`.
    pub node_url: String,
    /// `image.sha256`.
    pub node_sha256: String,
}

impl BootArtifacts {
    /// Paths on the bootserver (the host-binary lab serves them from its image directory).
    pub fn on_bootserver(node_sha256: &str) -> Self {
        Self {
            kernel_url: "vmlinuz".into(),
            initrd_url: "initrd.img".into(),
            node_url: "node.tar.zst".into(),
            node_sha256: node_sha256.into(),
        }
    }
}
