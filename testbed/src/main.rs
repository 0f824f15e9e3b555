//! `unbounded-testbed`: the main job (`up`) and the local control plane for people and
//! scripts (`cluster up`, `cluster down`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use unbounded_testbed::cluster::{self, ClusterError, KUBERNETES_VERSION};
use unbounded_testbed::setup;

#[derive(Parser, Debug)]
#[command(name = "unbounded-testbed", version, about = "Unbounded's testbed")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Install what is missing, start the local control plane, and apply Unbounded's CRDs,
    /// policies, RBAC and examples. Prints `KUBECONFIG=<path>` as its last line.
    Up,
    /// Stop what `up` started.
    Down,
    /// Build (once, cached) or locate the Kubernetes binaries and print their paths.
    KubernetesBinaries,
    /// The local Kubernetes control plane alone.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Start etcd, kube-apiserver and kube-controller-manager on loopback, building them the
    /// first time. Prints `KUBECONFIG=<path>` as its last line.
    Up,
    /// Stop exactly what `cluster up` started.
    Down,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Commands::Up => up(true),
        Commands::Cluster {
            command: ClusterCommand::Up,
        } => up(false),
        Commands::Down
        | Commands::Cluster {
            command: ClusterCommand::Down,
        } => down(),
        Commands::KubernetesBinaries => kubernetes_binaries(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("unbounded-testbed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Setup(#[from] setup::SetupError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

fn up(apply_everything: bool) -> Result<(), CliError> {
    eprintln!("testbed: checking packages");
    setup::install_dependencies()?;
    eprintln!(
        "testbed: starting etcd, kube-apiserver and kube-controller-manager {KUBERNETES_VERSION}"
    );
    let state = cluster::start_detached()?;
    let kubeconfig = state.kubeconfig.display().to_string();
    let binaries = cluster::Binaries::ensure()?;
    if apply_everything {
        let deploy = cluster::deploy_dir();
        eprintln!(
            "testbed: applying {} (CRDs, policies, RBAC, Deployments)",
            deploy.display()
        );
        kubectl(
            &binaries,
            &kubeconfig,
            &[
                "apply",
                "--server-side",
                "-k",
                &deploy.display().to_string(),
            ],
        )?;
        let examples = deploy.join("examples");
        eprintln!("testbed: applying {}", examples.display());
        kubectl(
            &binaries,
            &kubeconfig,
            &[
                "apply",
                "--server-side",
                "-f",
                &examples.display().to_string(),
            ],
        )?;
    }
    eprintln!(
        "testbed: control plane running; logs and data in {}",
        state.dir.display()
    );
    eprintln!(
        "testbed: kubectl {KUBERNETES_VERSION} is {}",
        binaries.kubectl.display()
    );
    eprintln!("testbed: stop it with `cargo run -p unbounded-testbed -- down`");
    println!("KUBECONFIG={kubeconfig}");
    Ok(())
}

fn kubernetes_binaries() -> Result<(), CliError> {
    let binaries = cluster::Binaries::ensure()?;
    for path in [
        &binaries.kube_apiserver,
        &binaries.kube_controller_manager,
        &binaries.kubectl,
        &binaries.kubelet,
        &binaries.etcd,
    ] {
        println!("{}", path.display());
    }
    Ok(())
}

fn down() -> Result<(), CliError> {
    let state = cluster::stop_detached()?;
    for (name, pid, _) in &state.processes {
        eprintln!("testbed: stopped {name} (pid {pid})");
    }
    Ok(())
}

fn kubectl(
    binaries: &cluster::Binaries,
    kubeconfig: &str,
    args: &[&str],
) -> Result<(), ClusterError> {
    let output = std::process::Command::new(&binaries.kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .map_err(|source| ClusterError::Io {
            what: "running kubectl".to_owned(),
            source,
        })?;
    eprint!("{}", String::from_utf8_lossy(&output.stdout));
    if output.status.success() {
        Ok(())
    } else {
        Err(ClusterError::Command {
            what: format!("kubectl {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}
