//! The `power:` settings of the bootserver's configuration file, owned by the room that
//! uses them: the file's form ([`PowerFile`]) converts by `TryFrom` into the validated
//! [`PowerSettings`], and errors name the field as it is written (`power.pollSeconds`).

use std::time::Duration;

use serde::Deserialize;

use crate::power::Backoff;

/// `power:` as written in the configuration file.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerFile {
    /// Whether the PXE provider runs (the bootserver decides with its backend).
    pub enabled: Option<bool>,
    poll_seconds: Option<u64>,
    timeout_seconds: Option<u64>,
    graceful_shutdown_seconds: Option<u64>,
}

/// A `power:` setting out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("power.{field} must be at least {min}")]
pub struct SettingsError {
    field: &'static str,
    min: u64,
}

/// The provider's settings, validated.
#[derive(Debug, Clone, Copy)]
pub struct PowerSettings {
    /// Timeout of one BMC request.
    pub timeout: Duration,
    /// How long an OS gets to shut down before power is forced off.
    pub graceful_shutdown: Duration,
    /// Retries of transient BMC failures within one call.
    pub backoff: Backoff,
    /// The provider loop's pacing.
    pub loop_settings: unbounded_runtime::provider::Settings,
}

impl Default for PowerSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            graceful_shutdown: Duration::from_secs(60),
            backoff: Backoff::default(),
            loop_settings: unbounded_runtime::provider::Settings::default(),
        }
    }
}

impl TryFrom<&PowerFile> for PowerSettings {
    type Error = SettingsError;

    fn try_from(file: &PowerFile) -> Result<Self, Self::Error> {
        let seconds = |value: Option<u64>, field, min| match value {
            Some(v) if v < min => Err(SettingsError { field, min }),
            other => Ok(other.map(Duration::from_secs)),
        };
        let mut settings = Self::default();
        if let Some(d) = seconds(file.poll_seconds, "pollSeconds", 5)? {
            settings.loop_settings.poll = d;
        }
        if let Some(d) = seconds(file.timeout_seconds, "timeoutSeconds", 1)? {
            settings.timeout = d;
        }
        if let Some(d) = seconds(file.graceful_shutdown_seconds, "gracefulShutdownSeconds", 0)? {
            settings.graceful_shutdown = d;
        }
        Ok(settings)
    }
}
