//! `discovery:` in the configuration file, validated into [`DiscoverySettings`].

use serde::Deserialize;

use crate::backend::standalone::BootFile;
use crate::setting::InvalidSetting;

/// `discovery:` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryFile {
    boot: BootFile,
    creations_per_minute: Option<usize>,
    max_unclaimed: Option<usize>,
    max_unclaimed_per_sender: Option<usize>,
    max_body_bytes: Option<usize>,
}

/// The bounds of the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryLimits {
    /// Machines created in any 60 seconds.
    pub creations_per_minute: usize,
    /// Discovered Machines waiting unclaimed.
    pub max_unclaimed: usize,
    /// Discovered Machines waiting unclaimed that one sender sent.
    pub max_unclaimed_per_sender: usize,
    /// Bytes of one report.
    pub max_body_bytes: usize,
}

impl Default for DiscoveryLimits {
    fn default() -> Self {
        Self {
            creations_per_minute: 30,
            max_unclaimed: 500,
            max_unclaimed_per_sender: 128,
            max_body_bytes: 256 * 1024,
        }
    }
}

/// Discovery's settings (`discovery` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverySettings {
    /// The host OS kernel the inspection boots: a path under `http.imagesDir` or a URL.
    pub kernel: String,
    /// Its initrd.
    pub initrd: String,
    /// Extra kernel arguments (a console, say).
    pub kernel_args: Vec<String>,
    /// The bounds of the door.
    pub limits: DiscoveryLimits,
}

/// Boot values iPXE takes as they are (no space, control character, `$` or `#`), and bounds
/// within reason (a rate of at least one, a report large enough for a real server's
/// inventory and small enough for one API object).
impl TryFrom<&DiscoveryFile> for DiscoverySettings {
    type Error = InvalidSetting;

    fn try_from(file: &DiscoveryFile) -> Result<Self, InvalidSetting> {
        let invalid = |m: String| InvalidSetting(format!("discovery.{m}"));
        let boot = &file.boot;
        for (field, value) in [("boot.kernel", &boot.kernel), ("boot.initrd", &boot.initrd)]
            .into_iter()
            .chain(boot.args.iter().map(|a| ("boot.args", a)))
        {
            if value.is_empty()
                || value
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '$' | '#'))
            {
                return Err(invalid(format!(
                    "{field}: {:?} must be non-empty, without spaces, control characters, '$' or '#'",
                    value.escape_default().to_string()
                )));
            }
        }
        let defaults = DiscoveryLimits::default();
        let bounded = |name: &str,
                       value: Option<usize>,
                       default: usize,
                       range: std::ops::RangeInclusive<usize>| {
            let value = value.unwrap_or(default);
            if range.contains(&value) {
                Ok(value)
            } else {
                Err(invalid(format!(
                    "{name} must be between {} and {}, not {value}",
                    range.start(),
                    range.end()
                )))
            }
        };
        let max_unclaimed = bounded(
            "maxUnclaimed",
            file.max_unclaimed,
            defaults.max_unclaimed,
            1..=10_000,
        )?;
        Ok(Self {
            kernel: boot.kernel.clone(),
            initrd: boot.initrd.clone(),
            kernel_args: boot.args.clone(),
            limits: DiscoveryLimits {
                creations_per_minute: bounded(
                    "creationsPerMinute",
                    file.creations_per_minute,
                    defaults.creations_per_minute,
                    1..=600,
                )?,
                max_unclaimed,
                max_unclaimed_per_sender: bounded(
                    "maxUnclaimedPerSender",
                    file.max_unclaimed_per_sender,
                    defaults.max_unclaimed_per_sender.min(max_unclaimed),
                    1..=max_unclaimed,
                )?,
                max_body_bytes: bounded(
                    "maxBodyBytes",
                    file.max_body_bytes,
                    defaults.max_body_bytes,
                    4096..=1024 * 1024,
                )?,
            },
        })
    }
}
