//! `images`: the host, node and (with `--containers`) container images.

use unbounded_testbed::{images, setup};

use crate::CliError;

pub(crate) fn build_images(containers: bool, kubelet: Option<&str>) -> Result<(), CliError> {
    setup::install_dependencies()?;
    if let Some(version) = kubelet {
        let node = images::node_image_for(version)?;
        println!("node image    {}", node.archive.display());
        println!("node sha256   {}", node.sha256);
        println!("kubelet       {version}");
        return Ok(());
    }
    let built = images::build(&images::Options { containers })?;
    println!("host kernel   {}", built.host.kernel.display());
    println!("host initrd   {}", built.host.initrd.display());
    println!("node image    {}", built.node.archive.display());
    println!("node sha256   {}", built.node.sha256);
    if let Some(containers) = &built.containers {
        for image in containers
            .images
            .iter()
            .chain(std::iter::once(&containers.boot_images))
        {
            for reference in &image.references {
                println!(
                    "{reference}  oci:{}:{}  {}",
                    image.layout.display(),
                    unbounded_testbed::oci::tag_of(reference),
                    image.manifest_digest
                );
            }
            println!("    archive {}", image.archive.display());
            println!("    sbom    {}", image.sbom.display());
        }
        println!(
            "boot images {}: MachineConfiguration values in {}",
            containers.boot_images_manifest.version,
            containers.machine_configuration.display()
        );
        println!("recorded in {}", images::containers_path().display());
    }
    Ok(())
}
