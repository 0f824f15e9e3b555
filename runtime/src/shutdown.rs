//! When a process is asked to stop.
//!
//! Kubernetes stops a container with SIGTERM (SIGKILL after the grace period), systemd
//! likewise; a person at a terminal presses Ctrl-C (SIGINT). In a container the binary is
//! PID 1, for which the kernel applies no default action: a SIGTERM nobody handles is
//! ignored, the pod lingers until SIGKILL, and a leader's Lease is never released — its
//! successor waits for the lease to expire instead of taking over at once.

use tokio::signal::unix::{SignalKind, signal};

/// Which signal asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: Kubernetes, systemd, `kill`.
    Terminate,
    /// SIGINT: Ctrl-C.
    Interrupt,
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        })
    }
}

/// Resolves at the first SIGTERM or SIGINT. If the SIGTERM handler cannot be installed (no
/// signal support in this environment), it waits for SIGINT alone and says so.
pub async fn requested() -> StopSignal {
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => tokio::select! {
            _ = terminate.recv() => StopSignal::Terminate,
            _ = tokio::signal::ctrl_c() => StopSignal::Interrupt,
        },
        Err(error) => {
            tracing::warn!(%error, "no SIGTERM handler: only Ctrl-C stops this process cleanly");
            let _ = tokio::signal::ctrl_c().await;
            StopSignal::Interrupt
        }
    }
}
