//! `unbounded-azure`: the Azure provider (see the crate documentation and the README).

use std::process::ExitCode;

use clap::Parser;
use unbounded_azure::config::{Flags, Settings};

fn main() -> ExitCode {
    let flags = Flags::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if flags.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    let workload_identity = std::env::var_os("AZURE_FEDERATED_TOKEN_FILE").is_some();
    let settings = match Settings::from_flags(&flags, workload_identity) {
        Ok(s) => s,
        Err(error) => {
            eprintln!("unbounded-azure: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(error) => {
            eprintln!("unbounded-azure: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let client = match kube::Client::try_default().await {
            Ok(c) => c,
            Err(error) => {
                eprintln!("unbounded-azure: connecting to the cluster: {error}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            arm = %settings.arm_endpoint,
            cluster = %settings.cluster_name,
            "Azure provider starting"
        );
        tokio::select! {
            result = unbounded_azure::run(client, settings) => match result {
                Ok(()) => ExitCode::FAILURE, // the loops never end on their own
                Err(error) => {
                    eprintln!("unbounded-azure: {error}");
                    ExitCode::FAILURE
                }
            },
            _ = tokio::signal::ctrl_c() => ExitCode::SUCCESS,
        }
    })
}
