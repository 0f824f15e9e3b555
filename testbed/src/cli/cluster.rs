//! `cluster up|down`, `kubernetes-binaries` and `cluster-api-binaries`: the local control
//! plane alone, and what it and Cluster API's core manager run.

use unbounded_testbed::cluster::{self, ClusterError, KUBERNETES_VERSION};
use unbounded_testbed::setup;

use crate::CliError;

pub(crate) fn cluster_up() -> Result<(), CliError> {
    eprintln!("testbed: checking packages");
    setup::install_dependencies()?;
    eprintln!(
        "testbed: starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler {KUBERNETES_VERSION}"
    );
    let state = cluster::start_detached()?;
    let kubeconfig = state.kubeconfig.display().to_string();
    let binaries = cluster::Binaries::ensure()?;
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
    eprintln!(
        "testbed: control plane running; logs and data in {}",
        state.dir.display()
    );
    eprintln!(
        "testbed: kubectl {KUBERNETES_VERSION} is {}",
        binaries.kubectl.display()
    );
    eprintln!("testbed: stop it with `cargo run -p unbounded-testbed -- cluster down`");
    println!("KUBECONFIG={kubeconfig}");
    Ok(())
}

pub(crate) fn kubernetes_binaries() -> Result<(), CliError> {
    let binaries = cluster::Binaries::ensure()?;
    for path in [
        &binaries.kube_apiserver,
        &binaries.kube_controller_manager,
        &binaries.kube_scheduler,
        &binaries.kubectl,
        &binaries.kubelet,
        &binaries.etcd,
    ] {
        println!("{}", path.display());
    }
    Ok(())
}

pub(crate) fn cluster_api_binaries() -> Result<(), CliError> {
    let binaries = cluster::ClusterApiBinaries::ensure()?;
    for path in [
        &binaries.manager,
        &binaries.clusterctl,
        &binaries.config,
        &binaries.metadata,
    ] {
        println!("{}", path.display());
    }
    Ok(())
}

pub(crate) fn cluster_down() -> Result<(), CliError> {
    let state = cluster::stop_detached()?;
    for (name, pid, _) in &state.processes {
        eprintln!("testbed: stopped {name} (pid {pid})");
    }
    Ok(())
}

pub(crate) fn kubectl(
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
