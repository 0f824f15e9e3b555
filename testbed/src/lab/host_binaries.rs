//! `--host-binaries`: the bootserver binary in the lab's namespace and the controller on
//! the host, each with its ServiceAccount's token and `deploy/`'s RBAC.

use std::fs;
use std::path::Path;

use super::base::{
    LAB_ADDRESS, LAB_ADDRESS6, LAB_API_PORT, LAB_PREFIX6, LabError, Provisioning, kubectl,
    service_account_kubeconfig,
};
use super::{Components, LabOptions, write};
use crate::appliance::BootArtifacts;
use crate::bmc;
use crate::cluster::LocalControlPlane;
use crate::failure::Failure;
use crate::images::Images;
use crate::netns::{HostRoute, Netns};
use crate::process::Process;

/// The controller and the bootserver binaries as `deploy/` runs them, each with its own
/// ServiceAccount's token and `deploy/`'s RBAC: the bootserver in the namespace, on the
/// bridge; the controller on the host. The boot artifacts are served from the bootserver's
/// image directory (links to the image cache).
pub(super) fn start_host_binaries(
    options: &LabOptions,
    ns: &Netns,
    plane: &LocalControlPlane,
    images: &Images,
    say: &dyn Fn(&str),
) -> Result<Components, LabError> {
    // As the pods lab's appliance does: without it the API server cannot reach a kubelet.
    say("routed link host ↔ provisioning network (10.99.0.0/24)");
    let (host_cidr, ns_cidr, subnet) = crate::appliance::HOST_ROUTE;
    let route = HostRoute::new(ns, host_cidr, ns_cidr, subnet).map_err(Failure::of)?;
    if options.provisioning != Provisioning::Ipv4 {
        let (host_cidr, ns_cidr) = HOST_ROUTE6;
        route
            .add_ipv6(ns, host_cidr, ns_cidr, LAB_PREFIX6)
            .map_err(Failure::of)?;
    }
    say("applying deploy/ (CRDs, policies, RBAC, Deployments)");
    kubectl(
        plane,
        &[
            "apply",
            "--server-side",
            "-k",
            &crate::cluster::deploy_dir().display().to_string(),
        ],
        None,
    )?;
    let ca = plane.data_dir().join("pki/ca.crt");
    let controller_kubeconfig = options.dir.join("controller.kubeconfig");
    let bootserver_kubeconfig = options.dir.join("bootserver.kubeconfig");
    write(
        &controller_kubeconfig,
        &service_account_kubeconfig(plane, "unbounded-controller", plane.server_url(), &ca)?,
    )?;
    write(
        &bootserver_kubeconfig,
        &service_account_kubeconfig(
            plane,
            "unbounded-bootserver",
            &format!("https://{LAB_ADDRESS}:{LAB_API_PORT}"),
            &ca,
        )?,
    )?;
    let images_dir = options.dir.join("images");
    fs::create_dir_all(&images_dir).map_err(Failure::of)?;
    for (name, source) in [
        ("vmlinuz", &images.host.kernel),
        ("initrd.img", &images.host.initrd),
        ("node.tar.zst", &images.node.archive),
    ] {
        let link = images_dir.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(source, &link)
            .map_err(|e| Failure::new(format!("linking {name}"), e))?;
    }

    let config = options.dir.join("bootserver.yaml");
    let artifacts = BootArtifacts::on_bootserver(&images.node.sha256);
    let settings = match options.provisioning {
        Provisioning::Ipv4 => {
            say(
                "bootserver (Kubernetes backend, full DHCP, router advertisements, agent credentials, discovery of unknown machines)",
            );
            super::discovery::with_discovery(
                &bootserver_config(&options.dir, &images_dir, &ca),
                &artifacts,
            )?
        }
        Provisioning::DualStack => {
            say(
                "bootserver (Kubernetes backend, full DHCP and DHCPv6, router advertisements with M and O, agent credentials, discovery of unknown machines)",
            );
            super::discovery::with_discovery(
                &format!(
                    "{}{}",
                    bootserver_config(&options.dir, &images_dir, &ca),
                    dhcp6_section()
                ),
                &artifacts,
            )?
        }
        Provisioning::Ipv6Only => {
            // Discovery answers over IPv4 only (docs/bootserver.md).
            say(
                "bootserver (Kubernetes backend, DHCPv4 off, full DHCPv6, router advertisements with M and O, agent credentials over IPv6)",
            );
            bootserver_config_ipv6(&options.dir, &images_dir, &ca)
        }
    };
    write(&config, &settings)?;
    let bootserver = Process::spawn(
        "bootserver",
        Some(ns),
        &options.bootserver,
        &[
            "--config".into(),
            config.display().to_string(),
            // Elects the PXE provider as in a cluster (deploy/'s RBAC allows its Lease).
            "--leader-election-identity".into(),
            "testbed-bootserver".into(),
        ],
        &[
            ("KUBECONFIG", bootserver_kubeconfig.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
        options.dir.join("bootserver.log"),
    )?;
    say("controller");
    let metrics_port = bmc::free_port(false).map_err(Failure::of)?;
    let controller = Process::spawn(
        "controller",
        None,
        &options.controller,
        &[
            "--metrics-addr".into(),
            format!("127.0.0.1:{metrics_port}"),
            "--leader-election-identity".into(),
            "testbed".into(),
        ],
        &[
            ("KUBECONFIG", controller_kubeconfig.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
        options.dir.join("controller.log"),
    )?;
    Ok(Components::HostBinaries {
        controller,
        bootserver,
        _route: route,
    })
}

/// DHCPv6 on the provisioning bridge, each Machine's `ipv6` reserved.
fn dhcp6_section() -> String {
    format!(
        "dhcp6:
  mode: full
  serverAddress: {LAB_ADDRESS6}
  subnets:
    - prefix: {LAB_PREFIX6}
      pool: [fd00:99::100, fd00:99::1ff]
"
    )
}

/// The host end and the namespace end of the routed link's IPv6 addresses.
const HOST_ROUTE6: (&str, &str) = ("fd00:98::1/126", "fd00:98::2/126");

/// An IPv6-only provisioning network: DHCPv4 off (TFTP and HTTP still listen on the v4
/// address too), DHCPv6 in full mode with each Machine's `ipv6` reserved, and the API
/// server as the machines reach it over IPv6.
fn bootserver_config_ipv6(dir: &Path, images: &Path, ca: &Path) -> String {
    format!(
        r#"interface: br0
serverAddress: {LAB_ADDRESS}
routerAdvertisements: true
backend: kubernetes
dhcp:
  mode: off
  leaseFile: "{dir}/leases.log"
{dhcp6}tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
power: {{enabled: true, pollSeconds: 10}}
credentials:
  apiServer: https://[{LAB_ADDRESS6}]:{LAB_API_PORT}
  caFile: "{ca}"
  nonceFile: "{dir}/nonces.json"
"#,
        dir = dir.display(),
        images = images.display(),
        ca = ca.display(),
        dhcp6 = dhcp6_section(),
    )
}

fn bootserver_config(dir: &Path, images: &Path, ca: &Path) -> String {
    format!(
        r#"interface: br0
serverAddress: {LAB_ADDRESS}
routerAdvertisements: true
backend: kubernetes
dhcp:
  mode: full
  leaseFile: "{dir}/leases.log"
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.199]
      gateway: {LAB_ADDRESS}
      leaseSeconds: 3600
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
power: {{enabled: true, pollSeconds: 10}}
credentials:
  apiServer: https://{LAB_ADDRESS}:{LAB_API_PORT}
  caFile: "{ca}"
  nonceFile: "{dir}/nonces.json"
"#,
        dir = dir.display(),
        images = images.display(),
        ca = ca.display(),
    )
}
