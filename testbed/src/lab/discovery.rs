//! Discovery in the lab's bootserver: `dhcp.unknownMachines: discover` and a `discovery`
//! section that boots the lab's own host OS (the kernel and initrd its MachineConfiguration
//! names) in inspection mode. It is part of the lab's standard configuration, in both modes:
//! the lab's machines are all declared before they are powered on (their BMCs start them
//! only once their Machines exist), so only a VM that nobody declared — the `discovery`
//! scenario's ([`crate::discovery_scenario`]) — is discovered, and the configuration the
//! lab starts with is the one every scenario runs against (no bootserver restart).
//!
//! The host-binary lab writes the section into the file it generates; the pods lab adds it
//! to `testbed/overlay`'s ConfigMap through a patch in the kustomization it writes for the
//! run, because the boot image set's version (its directory under `imagesDir`) is known only
//! once the images are built.

use super::LAB_KERNEL_ARGS;
use super::base::{LabError, step};
use crate::boot_artifacts::BootArtifacts;

/// The ConfigMap key that holds the bootserver's configuration.
const CONFIG_KEY: &str = "bootserver.yaml";

/// The `discovery` section: the lab's host OS with the lab's kernel arguments (the agent's
/// inspection arguments are the bootserver's to add), default bounds.
pub fn discovery_section(artifacts: &BootArtifacts) -> String {
    format!(
        "# Unknown machines boot the lab's host OS in inspection mode (scenario discovery).\n\
         discovery:\n  boot:\n    kernel: \"{}\"\n    initrd: \"{}\"\n    args: [{}]\n",
        artifacts.kernel_url,
        artifacts.initrd_url,
        LAB_KERNEL_ARGS.join(", ")
    )
}

/// `config` (a bootserver configuration with a block-style top-level `dhcp:` section) with
/// discovery on: `unknownMachines: discover` as the first key of `dhcp`, the
/// [`discovery_section`] at the end.
pub fn with_discovery(config: &str, artifacts: &BootArtifacts) -> Result<String, LabError> {
    if config.contains("unknownMachines:") || config.contains("\ndiscovery:") {
        return Err(step(
            "the lab's bootserver configuration already says what to do with unknown machines",
        ));
    }
    let mut out = String::new();
    let mut found = false;
    for line in config.lines() {
        out.push_str(line);
        out.push('\n');
        if line.trim_end() == "dhcp:" {
            found = true;
            out.push_str("  unknownMachines: discover\n");
        }
    }
    if !found {
        return Err(step(
            "the lab's bootserver configuration has no block `dhcp:` section to turn discovery on in",
        ));
    }
    out.push_str(&discovery_section(artifacts));
    Ok(out)
}

/// The bootserver configuration inside a ConfigMap manifest (the block scalar under
/// `bootserver.yaml: |`), unindented.
pub fn configmap_config(manifest: &str) -> Option<String> {
    let mut lines = manifest
        .lines()
        .skip_while(|l| l.trim() != format!("{CONFIG_KEY}: |"));
    let header = lines.next()?;
    let indent = header.len() - header.trim_start().len() + 2;
    let text: String = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or_default()))
        .collect();
    (!text.trim().is_empty()).then_some(text)
}

/// A strategic-merge patch of `testbed/overlay`'s bootserver ConfigMap (`overlay_configmap`,
/// the manifest's text) that replaces its configuration with the same one, discovery on.
pub fn configmap_patch(
    overlay_configmap: &str,
    artifacts: &BootArtifacts,
) -> Result<String, LabError> {
    let config = configmap_config(overlay_configmap).ok_or_else(|| {
        step(format!(
            "testbed/overlay's bootserver ConfigMap has no `{CONFIG_KEY}: |` block"
        ))
    })?;
    let config = with_discovery(&config, artifacts)?;
    let mut out = format!(
        "# Written by unbounded-testbed for this run: testbed/overlay's bootserver configuration\n\
         # with discovery on (testbed/src/lab/discovery.rs).\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: unbounded-bootserver\n  namespace: unbounded-system\n\
         data:\n  {CONFIG_KEY}: |\n"
    );
    for line in config.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("    ");
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifacts() -> BootArtifacts {
        BootArtifacts {
            kernel_url: "v-abc/vmlinuz".into(),
            initrd_url: "v-abc/initrd.img".into(),
            node_url: "v-abc/node.tar.zst".into(),
            node_sha256: "0".repeat(64),
        }
    }

    #[test]
    fn discovery_goes_into_the_dhcp_section_and_boots_the_lab_s_host_os() {
        let config = "interface: br0\ndhcp:\n  mode: full\n  subnets: []\ntftp: {root: /x}\n";
        let on = with_discovery(config, &artifacts()).unwrap();
        assert!(
            on.starts_with("interface: br0\ndhcp:\n  unknownMachines: discover\n  mode: full\n"),
            "{on}"
        );
        assert!(
            on.ends_with(
                "discovery:\n  boot:\n    kernel: \"v-abc/vmlinuz\"\n    initrd: \"v-abc/initrd.img\"\n    args: [console=ttyS0, quiet, systemd.show_status=true]\n"
            ),
            "{on}"
        );
    }

    #[test]
    fn a_configuration_it_cannot_change_safely_is_refused() {
        let cases = [
            ("no dhcp section", "interface: br0\n"),
            ("a flow-style dhcp section", "dhcp: {mode: full}\n"),
            (
                "unknown machines decided already",
                "dhcp:\n  unknownMachines: ignore\n",
            ),
            (
                "a discovery section already",
                "dhcp:\n  mode: full\ndiscovery:\n  boot: {}\n",
            ),
        ];
        for (what, config) in cases {
            assert!(with_discovery(config, &artifacts()).is_err(), "{what}");
        }
    }

    /// The patch of the real overlay carries the overlay's configuration unchanged but for
    /// discovery, under the ConfigMap's key, so that kustomize replaces the whole value.
    #[test]
    fn the_overlay_s_configmap_is_patched_with_discovery() {
        let overlay = include_str!("../../overlay/bootserver-config.yaml");
        let original = configmap_config(overlay).unwrap();
        assert!(original.starts_with("interface: prov0\n"), "{original}");
        let patch = configmap_patch(overlay, &artifacts()).unwrap();
        assert!(
            patch.contains(
                "metadata:\n  name: unbounded-bootserver\n  namespace: unbounded-system\n"
            ),
            "{patch}"
        );
        let patched = configmap_config(&patch).unwrap();
        assert_eq!(patched, with_discovery(&original, &artifacts()).unwrap());
        assert!(
            patched.contains("\ndhcp:\n  unknownMachines: discover\n  mode: full\n"),
            "{patched}"
        );
    }
}
