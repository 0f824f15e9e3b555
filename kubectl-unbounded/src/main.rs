//! `kubectl-unbounded`: parses the command line and runs it (see the library).

use std::process::ExitCode;

use clap::Parser;
use kubectl_unbounded::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match kubectl_unbounded::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
