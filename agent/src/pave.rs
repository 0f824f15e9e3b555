//! Paving: the node image fetched, verified and unpacked into a staging root, kubelet's and
//! the configuration's files written into it, the old container stopped and replaced, the
//! new one started. Everything that can be refused (the image URL, the nspawn settings, the
//! files' modes, kubelet's flags) is checked before anything on the host changes, and the
//! state file says a pave is under way, so that an agent restarted in the middle starts it
//! over ([`crate::plan`]).
//!
//! With `spec.template.storage`, the disk comes first ([`crate::storage::shell`]): it is
//! chosen, laid out or reused and mounted on the machines directory before the image is
//! fetched, so the staging root and the container live on it. On the first pave of a boot,
//! a container on the disk that was paved with the same configuration version and image
//! (its marker says so, and that the pave finished) is started as it is: kubelet's and the
//! configuration's files are written again (a fresh bootstrap token), nothing is
//! downloaded or unpacked.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use unbounded_api::{Machine, MachineConfigurationVersion, ResolvedConfiguration};

use crate::container_root::{self, ContainerRootError};
use crate::context::Context;
use crate::credentials::{self, CredentialError};
use crate::kubelet_version::{self, KubeletVersionError};
use crate::node_address;
use crate::plan::{PaveReason, Paved};
use crate::render::{self, KubeletInput};
use crate::rootfs::{self, RootfsError};
use crate::state::KeptState;
use crate::status;
use crate::storage::ContainerStep;
use crate::storage::shell::{self as storage, StorageStepError};
use crate::systemd::{self, SystemdError};

/// Why a pave failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PaveError {
    #[error("the configuration version has no node image (spec.template.image)")]
    NoImage,
    #[error(
        "the node image URL {0:?} is relative, and this machine has no bootserver to resolve it against: give the configuration an absolute http(s) URL"
    )]
    RelativeImage(String),
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error("the credentials carried no bootstrap token")]
    NoBootstrapToken,
    #[error(transparent)]
    Root(#[from] ContainerRootError),
    #[error(transparent)]
    Storage(#[from] StorageStepError),
    #[error(transparent)]
    Kubelet(#[from] KubeletVersionError),
}

impl PaveError {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::NoImage | Self::RelativeImage(_) | Self::Render(_) | Self::Kubelet(_) => {
                status::reasons::INVALID_CONFIGURATION
            }
            Self::Rootfs(e) => e.reason(),
            Self::Credentials(_) | Self::NoBootstrapToken => status::reasons::CREDENTIALS_FAILED,
            Self::Systemd(_) => status::reasons::CONTAINER_FAILED,
            Self::Root(e) => e.reason(),
            Self::Storage(e) => e.reason(),
        }
    }
}

/// Paves the node container with `version` of `configuration`, and starts it.
pub(crate) async fn pave(
    ctx: &Context,
    kept: &mut KeptState,
    machine: &Machine,
    configuration: &ResolvedConfiguration,
    version: &MachineConfigurationVersion,
    reason: PaveReason,
) -> Result<(), PaveError> {
    let template = &version.spec.template;
    let image = template.image.as_ref().ok_or(PaveError::NoImage)?;
    let kubernetes = template.kubernetes.clone().unwrap_or_default();
    let bus_dir = ctx.paths.bus.join(&ctx.node);
    // Everything that can be refused is checked before anything changes.
    let nspawn = render::nspawn_settings(
        template.nspawn.as_ref(),
        &bus_dir.display().to_string(),
        &ctx.paths.log.display().to_string(),
    )?;
    let mut files = Vec::new();
    for file in &template.files {
        files.push((
            file.path.clone(),
            file.content.clone(),
            rootfs::parse_mode(file.mode.as_deref()).map_err(RootfsError::from)?,
        ));
    }
    let empty_check = KubeletInput {
        node_name: &ctx.node,
        server: "",
        bootstrap_token: "",
        provider_id: machine.spec.provider_id.as_deref(),
        labels: &kubernetes.node_labels,
        taints: &kubernetes.node_taints,
        extra_args: &kubernetes.kubelet_extra_args,
        node_ip: None,
    };
    render::kubelet_env(&empty_check)?;

    let url = rootfs::image_url(&image.url, ctx.identity.bootserver.as_deref())
        .ok_or_else(|| PaveError::RelativeImage(image.url.clone()))?;

    // The disk first (spec.template.storage): chosen, laid out or reused and mounted on
    // the machines directory, before anything of the container is written; a refusal
    // touches nothing.
    let disk = match &template.storage {
        Some(spec) => Some(
            storage::prepare(
                ctx,
                machine.metadata.uid.as_deref(),
                machine
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(unbounded_api::well_known::annotations::CLAIMED_AT))
                    .map(String::as_str),
                spec,
                configuration,
                &image.sha256,
                reason == PaveReason::Initial,
            )
            .await?,
        ),
        None => None,
    };
    let from_disk = disk
        .as_ref()
        .is_some_and(|d| d.step == ContainerStep::StartFromDisk);

    kept.state.paving = Some(configuration.clone());
    kept.save();
    let root = ctx.paths.machines.join(&ctx.node);
    let staging = ctx.paths.machines.join(format!(".{}.staging", ctx.node));
    // Starting the container on the disk as it is: kubelet's and the configuration's files
    // are written again into its root (a fresh bootstrap token, the same content
    // otherwise), and nothing is downloaded or unpacked.
    let target = if from_disk { &root } else { &staging };
    if !from_disk {
        // An image already unpacked once and refused for its kubelet is refused again
        // without a download.
        kubelet_version::known_refusal(
            kubernetes.version.as_deref(),
            &image.sha256,
            kept.state.image_kubelet.as_ref(),
        )?;
        let source = rootfs::ImageSource {
            url,
            sha256: image.sha256.clone(),
            max_bytes: rootfs::size_limit(image.max_size_bytes),
        };
        let started = Instant::now();
        let bytes = rootfs::fetch_verify_unpack(&ctx.http, &source, &staging).await?;
        println!(
            "unbounded-agent: node image {} MB fetched, verified and unpacked in {:.1} s",
            bytes / 1_000_000,
            started.elapsed().as_secs_f64()
        );
    }
    // The kubelet it carries is the one the configuration asks for (kubernetes.version),
    // checked before anything of the running container changes.
    let carried = kubelet_version::carried(target);
    if !from_disk {
        kept.state.image_kubelet = Some(kubelet_version::ImageKubelet {
            sha256: image.sha256.clone(),
            carried: carried.clone(),
        });
        kept.save();
    }
    kubelet_version::check(kubernetes.version.as_deref(), carried.as_deref())?;
    let credentials = credentials::obtain(&ctx.http, &ctx.identity, &ctx.store, true).await?;
    let token = credentials
        .bootstrap_token
        .clone()
        .ok_or(PaveError::NoBootstrapToken)?;
    let node_ip = node_address::toward(&credentials.server).await;
    let input = KubeletInput {
        server: &credentials.server,
        bootstrap_token: &token,
        node_ip,
        ..empty_check
    };
    let rendered = [
        (render::KUBELET_ENV, render::kubelet_env(&input)?, 0o644),
        (
            render::KUBELET_CONFIG,
            render::kubelet_config(&input),
            0o644,
        ),
        (
            render::BOOTSTRAP_KUBECONFIG,
            render::bootstrap_kubeconfig(&input),
            0o600,
        ),
        (
            render::CA_FILE,
            credentials.certificate_authority.clone(),
            0o644,
        ),
    ];
    let writes = rendered
        .into_iter()
        .map(|(path, content, mode)| (path.to_owned(), content.into_bytes(), mode))
        .chain(
            files
                .into_iter()
                .map(|(path, content, mode)| (path, content.into_bytes(), mode)),
        )
        .collect();
    container_root::write_files(target, writes).await?;
    let unit = systemd::container_unit(&ctx.node);
    if !from_disk {
        // The Node's identity survives a repave (kubelet's client certificate and
        // kubeconfig), so it joins again without a new bootstrap token, as the same Node
        // user; when the disk was formatted or wiped, the storage step kept it in RAM.
        let identity = disk
            .as_ref()
            .and_then(|d| d.identity.clone())
            .unwrap_or_else(|| root.clone());
        container_root::carry_kubelet_identity(&identity, &staging).await?;
    }
    // The new root is ready: only now does the old container go.
    ctx.host.stop(&unit, Duration::from_secs(120)).await?;
    if reason == PaveReason::NodeDeleted {
        remove_reregistered_node(&ctx.nodes, &ctx.node).await;
    }
    if !from_disk {
        container_root::replace(&staging, &root).await?;
    }
    if let Some(d) = &disk
        && !from_disk
    {
        storage::pave_finished(&ctx.paths.machines, &d.marker).await?;
    }
    container_root::write_settings(
        &ctx.paths.nspawn,
        &ctx.node,
        nspawn,
        &bus_dir,
        &ctx.paths.log,
    )
    .await?;
    kept.state.paved = Some(Paved {
        container: ctx.node.clone(),
        configuration: configuration.clone(),
        image_sha256: image.sha256.clone(),
        joined_node_uid: None,
        starts: 1,
        node_ip,
    });
    kept.state.paving = None;
    kept.save();
    // Goes out with the next status write (the loop's, right after the pave). A version
    // without storage runs from RAM; a disk that still carries this Machine's layout from
    // an earlier version is reported as `left`, so that the release wipes it.
    let storage = match disk {
        Some(d) => Some(d.status),
        None => {
            storage::layout_left(
                machine.metadata.uid.as_deref(),
                crate::storage::probe::DiskScope::All,
            )
            .await
        }
    };
    let _ = ctx
        .reporter
        .report(move |agent| agent.storage = storage, None)
        .await;
    if from_disk {
        let bytes = container_root::read_ahead(&root).await;
        tracing::debug!(
            bytes,
            "read ahead the container's start files from the disk"
        );
    }
    ctx.host.start(&unit, Duration::from_secs(120)).await?;
    Ok(())
}

/// Deletes the Node that the old container's kubelet registered again after the operator
/// deleted it (kubelet does so within seconds): the new kubelet would find it and never
/// apply its own labels and taints to an existing Node, so a rollback that changes them
/// would not show. The old container is stopped, so nothing registers it again before the
/// new kubelet does. Not fatal: without it the Node keeps its old labels, as said.
async fn remove_reregistered_node(nodes: &Api<Node>, name: &str) {
    match nodes
        .delete(name, &kube::api::DeleteParams::default())
        .await
    {
        Ok(_) => {
            println!("unbounded-agent: removed Node {name}, which the old kubelet registered again")
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => println!(
            "unbounded-agent: could not remove the re-registered Node {name} ({error}); its labels and taints stay as the old kubelet left them"
        ),
    }
}
