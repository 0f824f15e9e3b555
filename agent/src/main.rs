//! `unbounded-agent`: not built yet (see the crate documentation).

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "unbounded-agent: not built yet; it arrives with the agent issue (see agent/src/lib.rs)"
    );
    ExitCode::from(2)
}
