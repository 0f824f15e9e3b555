//! systemd and logind over D-Bus (zbus): start, stop and restart units, read a unit's
//! state, reboot and power off. The host's system bus runs the node container's unit
//! (`systemd-nspawn@<node>.service`) and reboots; the container's own system bus (its
//! `/run/dbus` is bound to a host directory) restarts services inside it.

use std::time::{Duration, Instant};

use zbus::proxy::CacheProperties;
use zbus::{Connection, proxy};

use crate::plan::ContainerState;

/// Errors talking to systemd.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The bus could not be reached or a call failed.
    #[error("{what}: {source}")]
    Bus {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: zbus::Error,
    },
    /// A unit did not reach the wanted state in time.
    #[error("{unit} did not become {wanted} within {seconds} s (it is {state})")]
    Timeout {
        /// The unit.
        unit: String,
        /// What was waited for.
        wanted: &'static str,
        /// How long.
        seconds: u64,
        /// Its last state.
        state: String,
    },
    /// A unit failed.
    #[error("{unit} failed to start ({state}); see `journalctl -u {unit}`")]
    Failed {
        /// The unit.
        unit: String,
        /// Its state.
        state: String,
    },
}

fn bus(what: impl Into<String>) -> impl FnOnce(zbus::Error) -> SystemdError {
    let what = what.into();
    move |source| SystemdError::Bus { what, source }
}

#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::OwnedObjectPath>;
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::OwnedObjectPath>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    fn load_unit(&self, name: &str) -> zbus::Result<zbus::OwnedObjectPath>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
trait Unit {
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
}

#[proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Login {
    fn reboot(&self, interactive: bool) -> zbus::Result<()>;
    fn power_off(&self, interactive: bool) -> zbus::Result<()>;
}

/// The node container's unit name.
pub fn container_unit(node: &str) -> String {
    format!("systemd-nspawn@{node}.service")
}

/// Whether a unit name is one `restartService` may name: a plain systemd unit name.
pub fn valid_unit_name(name: &str) -> bool {
    let (stem, suffix) = name.rsplit_once('.').unwrap_or((name, "service"));
    !stem.is_empty()
        && name.len() <= 255
        && matches!(suffix, "service" | "socket" | "timer" | "target" | "path")
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '@' | '\\'))
}

/// Maps systemd's ActiveState to the container state the plan reads.
pub fn container_state(load_state: &str, active_state: &str) -> ContainerState {
    if load_state != "loaded" {
        return ContainerState::Absent;
    }
    match active_state {
        "active" | "reloading" => ContainerState::Running,
        "activating" => ContainerState::Starting,
        "failed" => ContainerState::Failed,
        _ => ContainerState::Stopped,
    }
}

/// A connection to one systemd (the host's, or the node container's).
#[derive(Debug, Clone)]
pub struct Systemd {
    connection: Connection,
    name: &'static str,
}

impl Systemd {
    /// The host's system bus.
    pub async fn host() -> Result<Self, SystemdError> {
        let connection = Connection::system()
            .await
            .map_err(bus("connecting to the system bus"))?;
        Ok(Self {
            connection,
            name: "host",
        })
    }

    /// The node container's system bus, through the socket bound out of it.
    pub async fn container(socket: &str) -> Result<Self, SystemdError> {
        let address = format!("unix:path={socket}");
        let connection = zbus::connection::Builder::address(address.as_str())
            .build()
            .await
            .map_err(bus(format!(
                "connecting to the container's bus at {socket}"
            )))?;
        Ok(Self {
            connection,
            name: "node container",
        })
    }

    async fn manager(&self) -> Result<ManagerProxy<'_>, SystemdError> {
        ManagerProxy::new(&self.connection)
            .await
            .map_err(bus("systemd manager"))
    }

    async fn unit(&self, name: &str) -> Result<UnitProxy<'_>, SystemdError> {
        let path = self
            .manager()
            .await?
            .load_unit(name)
            .await
            .map_err(bus(format!("loading {name} ({})", self.name)))?;
        UnitProxy::builder(&self.connection)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(bus(format!("unit {name}")))
    }

    /// A unit's (load state, active state).
    pub async fn unit_state(&self, name: &str) -> Result<(String, String), SystemdError> {
        let unit = self.unit(name).await?;
        let load = unit
            .load_state()
            .await
            .map_err(bus(format!("reading {name}")))?;
        let active = unit
            .active_state()
            .await
            .map_err(bus(format!("reading {name}")))?;
        Ok((load, active))
    }

    /// Starts a unit and waits until it is active (or failed).
    pub async fn start(&self, name: &str, timeout: Duration) -> Result<(), SystemdError> {
        let manager = self.manager().await?;
        // A failed unit keeps its failure (and rate limit) until reset.
        let _ = manager.reset_failed_unit(name).await;
        manager
            .start_unit(name, "replace")
            .await
            .map_err(bus(format!("starting {name} ({})", self.name)))?;
        self.wait_for(name, "active", timeout).await
    }

    /// Restarts a unit and waits until it is active again.
    pub async fn restart(&self, name: &str, timeout: Duration) -> Result<(), SystemdError> {
        let manager = self.manager().await?;
        let _ = manager.reset_failed_unit(name).await;
        manager
            .restart_unit(name, "replace")
            .await
            .map_err(bus(format!("restarting {name} ({})", self.name)))?;
        self.wait_for(name, "active", timeout).await
    }

    /// Stops a unit and waits until it is inactive (a unit that is not loaded is stopped).
    pub async fn stop(&self, name: &str, timeout: Duration) -> Result<(), SystemdError> {
        let (load, active) = self.unit_state(name).await?;
        if load != "loaded" || matches!(active.as_str(), "inactive" | "failed") {
            return Ok(());
        }
        self.manager()
            .await?
            .stop_unit(name, "replace")
            .await
            .map_err(bus(format!("stopping {name} ({})", self.name)))?;
        self.wait_for(name, "inactive", timeout).await
    }

    async fn wait_for(
        &self,
        name: &str,
        wanted: &'static str,
        timeout: Duration,
    ) -> Result<(), SystemdError> {
        let deadline = Instant::now() + timeout;
        loop {
            let (_, state) = self.unit_state(name).await?;
            match (wanted, state.as_str()) {
                ("active", "active") | ("inactive", "inactive" | "failed") => return Ok(()),
                ("active", "failed") => {
                    return Err(SystemdError::Failed {
                        unit: name.to_owned(),
                        state,
                    });
                }
                _ => {}
            }
            if Instant::now() > deadline {
                return Err(SystemdError::Timeout {
                    unit: name.to_owned(),
                    wanted,
                    seconds: timeout.as_secs(),
                    state,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Reboots through logind.
    pub async fn reboot(&self) -> Result<(), SystemdError> {
        LoginProxy::new(&self.connection)
            .await
            .map_err(bus("logind"))?
            .reboot(false)
            .await
            .map_err(bus("rebooting through logind"))
    }

    /// Powers off through logind.
    pub async fn power_off(&self) -> Result<(), SystemdError> {
        LoginProxy::new(&self.connection)
            .await
            .map_err(bus("logind"))?
            .power_off(false)
            .await
            .map_err(bus("powering off through logind"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names() {
        for ok in [
            "kubelet",
            "kubelet.service",
            "containerd.service",
            "getty@tty1.service",
            "x.timer",
        ] {
            assert!(valid_unit_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".service",
            "a b.service",
            "../x.service",
            "x.device",
            "x;reboot",
        ] {
            assert!(!valid_unit_name(bad), "{bad}");
        }
    }

    #[test]
    fn states() {
        let cases = [
            ("not-found", "inactive", ContainerState::Absent),
            ("loaded", "active", ContainerState::Running),
            ("loaded", "activating", ContainerState::Starting),
            ("loaded", "failed", ContainerState::Failed),
            ("loaded", "inactive", ContainerState::Stopped),
            ("loaded", "deactivating", ContainerState::Stopped),
        ];
        for (load, active, expected) in cases {
            assert_eq!(container_state(load, active), expected, "{load} {active}");
        }
    }
}
