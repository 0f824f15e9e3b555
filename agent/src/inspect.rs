//! Inspection mode (`unbounded.inspect=1` on the kernel command line): the boot an unknown
//! server gets with discovery on. The agent has no Machine name, no nonce and asks for no
//! credentials: it reads the machine and listens for its switches' LLDP frames
//! ([`crate::inventory::collect_live`]), posts the report to
//! the bootserver (`POST /discovery/inventory`) and waits, posting again every
//! [`REREPORT`] so that a changed machine (a disk added while it waits) is described afresh.
//!
//! What follows each answer is decided by [`next_step`], a pure function:
//! - 201/200 (created, updated): wait [`REREPORT`], then report again; meanwhile ask every
//!   [`CLAIM_POLL`] whether the Machine was claimed (`GET /discovery/claim/<boot MAC>`, a
//!   lookup in the bootserver's Machine index), so that a claimed machine reboots within
//!   seconds rather than at its next report ([`after_poll`]);
//! - 429, 503 or no answer: retry with backoff (1 s up to 5 minutes, or `Retry-After`);
//! - 409 `known`: the MACs belong now to a Machine that is not waiting (an operator or a pool
//!   claimed it): reboot, so that the firmware network-boots the Machine's own script;
//! - any other 4xx: the report will never be taken as it is; say why on the console and
//!   report again only after [`REREPORT`] (the machine may change, the bounds may be raised).

use std::time::Duration;

use unbounded_api::inventory::{
    DISCOVERY_CLAIM_PATH, DISCOVERY_REPORT_PATH, DiscoveryReport, REFUSAL_HEADER,
};

/// How often a waiting machine reports again.
pub const REREPORT: Duration = Duration::from_secs(300);

/// How often a waiting machine asks whether it was claimed.
pub const CLAIM_POLL: Duration = Duration::from_secs(15);

/// The kernel argument that selects this mode.
pub const CMDLINE_INSPECT: &str = "unbounded.inspect";

/// Whether the kernel command line asks for inspection mode.
pub fn requested(cmdline: &str) -> bool {
    crate::identity::cmdline_value(cmdline, CMDLINE_INSPECT) == Some("1")
}

/// The MAC the machine network-booted from, from the kernel's `BOOTIF=01-aa-bb-…`.
pub fn boot_mac(cmdline: &str) -> Option<String> {
    let value = crate::identity::cmdline_value(cmdline, "BOOTIF")?;
    let hex = value.strip_prefix("01-").unwrap_or(value);
    let mac = hex.replace('-', ":").to_ascii_lowercase();
    let valid = mac.len() == 17
        && mac
            .split(':')
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
    valid.then_some(mac)
}

/// What the bootserver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP status, the refusal label (if any) and `Retry-After` in seconds (if any).
    Status {
        /// The status code.
        code: u16,
        /// The `unbounded-refusal` header.
        refusal: Option<String>,
        /// `Retry-After`, seconds.
        retry_after: Option<u64>,
    },
    /// No answer (connection refused, timeout, reset).
    Unreachable,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Report again after this long; `attempt` is the backoff's next attempt number (0
    /// after an answer that settled the report).
    ReportAfter {
        /// How long to wait.
        wait: Duration,
        /// The next attempt's number for the backoff.
        attempt: u32,
    },
    /// Reboot into the network boot: this machine is a Machine that is not waiting now.
    Reboot,
}

/// Decides the next step after `answer` to the `attempt`-th try in a row.
pub fn next_step(answer: &Answer, attempt: u32) -> Step {
    let retry = |hint: Option<u64>| Step::ReportAfter {
        wait: hint.map_or_else(
            || backoff_bound(attempt),
            |s| Duration::from_secs(s.clamp(1, 3600)),
        ),
        attempt: attempt.saturating_add(1),
    };
    let settled = Step::ReportAfter {
        wait: REREPORT,
        attempt: 0,
    };
    match answer {
        Answer::Unreachable => retry(None),
        Answer::Status { code, .. } if (200..300).contains(code) => settled,
        Answer::Status {
            code: 409,
            refusal: Some(reason),
            ..
        } if reason == "known" => Step::Reboot,
        Answer::Status {
            code: 429 | 500..=599,
            retry_after,
            ..
        } => retry(*retry_after),
        Answer::Status { .. } => settled,
    }
}

/// What to do after a claim poll, while waiting after a report that was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPoll {
    /// Keep waiting (still waiting, or no clear answer: the next report settles it).
    Wait,
    /// The Machine is not waiting any more: reboot into its own boot.
    Reboot,
    /// No Machine has the MAC any more (deleted while waiting): report now.
    ReportNow,
}

/// Decides what a claim poll's answer means.
pub fn after_poll(answer: &Answer) -> AfterPoll {
    match answer {
        Answer::Status {
            code: 409,
            refusal: Some(reason),
            ..
        } if reason == "known" => AfterPoll::Reboot,
        Answer::Status { code: 404, .. } => AfterPoll::ReportNow,
        _ => AfterPoll::Wait,
    }
}

/// Asks the bootserver whether the Machine of `boot_mac` was claimed.
pub async fn poll_claim(http: &reqwest::Client, bootserver: &str, boot_mac: &str) -> Answer {
    let url = format!(
        "{}{DISCOVERY_CLAIM_PATH}/{boot_mac}",
        bootserver.trim_end_matches('/')
    );
    match http.get(&url).send().await {
        Ok(response) => Answer::Status {
            code: response.status().as_u16(),
            refusal: response
                .headers()
                .get(REFUSAL_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            retry_after: None,
        },
        Err(_) => Answer::Unreachable,
    }
}

/// The backoff without its jitter (the loop adds it): 1 s doubling up to 5 minutes.
fn backoff_bound(attempt: u32) -> Duration {
    Duration::from_secs(1)
        .saturating_mul(1u32 << attempt.min(16))
        .min(REREPORT)
}

/// Posts one report.
pub async fn post(http: &reqwest::Client, bootserver: &str, report: &DiscoveryReport) -> Answer {
    let url = format!(
        "{}{DISCOVERY_REPORT_PATH}",
        bootserver.trim_end_matches('/')
    );
    match http.post(&url).json(report).send().await {
        Ok(response) => {
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let refusal = header(REFUSAL_HEADER);
            let retry_after = header("retry-after").and_then(|v| v.parse().ok());
            let code = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            let body: String = body.trim().chars().take(300).collect();
            if (200..300).contains(&code) {
                println!("unbounded-agent: inspection reported: {body}");
            } else {
                println!(
                    "unbounded-agent: inspection report refused ({code}, {}): {body}",
                    refusal.as_deref().unwrap_or("-")
                );
            }
            Answer::Status {
                code,
                refusal,
                retry_after,
            }
        }
        Err(error) => {
            println!("unbounded-agent: inspection report to {url} failed: {error}");
            Answer::Unreachable
        }
    }
}

/// Where the inspection keeps the TPM's key context (the root is in RAM).
const INSPECTION_TPM_DIR: &str = "/run/unbounded-inspection/tpm";

/// Runs inspection mode: reports, waits, reports again; returns only to reboot.
pub async fn run(bootserver: &str, boot_mac: Option<String>, root: &std::path::Path) {
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
    {
        Ok(http) => http,
        Err(error) => {
            println!("unbounded-agent: no HTTP client: {error}");
            return;
        }
    };
    // The TPM's endorsement key, where the machine has one: the Machine discovery creates
    // records it, and the machine attests with that TPM once claimed.
    let endorsement_key = match crate::tpm::Tpm::system(std::path::Path::new(INSPECTION_TPM_DIR)) {
        Ok(tpm) => match tpm.endorsement_key_name().await {
            Ok(name) => Some(name),
            Err(error) => {
                println!("unbounded-agent: the TPM's endorsement key could not be read: {error}");
                None
            }
        },
        Err(_) => None,
    };
    let mut attempt = 0;
    loop {
        let now =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(unbounded_api::condition::now());
        // Listening for LLDP first delays a report by at most 35 s (the switches' default
        // interval), once per report: a discovered Machine then names its switch ports.
        let inventory = crate::inventory::collect_live(
            root,
            std::env::consts::ARCH,
            boot_mac.as_deref(),
            now,
            crate::inventory::lldp_capture::DEFAULT_WAIT,
        )
        .await;
        let report = DiscoveryReport {
            boot_mac: boot_mac.clone().unwrap_or_default(),
            inventory,
            endorsement_key: endorsement_key.clone(),
        };
        let answer = post(&http, bootserver, &report).await;
        match next_step(&answer, attempt) {
            Step::Reboot => {
                println!(
                    "unbounded-agent: this machine's MACs are a Machine that is not waiting any more (claimed): rebooting into its own boot"
                );
                return;
            }
            Step::ReportAfter {
                wait,
                attempt: next,
            } => {
                // Jitter (up to a quarter less) so that a rack powered on at once spreads out.
                let wait = if next > 0 {
                    crate::retry::backoff(0, wait, wait)
                } else {
                    wait
                };
                attempt = next;
                let taken =
                    matches!(&answer, Answer::Status { code, .. } if (200..300).contains(code));
                match (&boot_mac, taken) {
                    (Some(mac), true) => {
                        if wait_polling_claim(&http, bootserver, mac, wait).await {
                            return;
                        }
                    }
                    _ => tokio::time::sleep(wait).await,
                }
            }
        }
    }
}

/// Waits up to `wait`, asking every [`CLAIM_POLL`] whether the Machine was claimed. True when
/// it was (reboot); false when the wait is over or the Machine is gone (report again).
async fn wait_polling_claim(
    http: &reqwest::Client,
    bootserver: &str,
    boot_mac: &str,
    wait: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        tokio::time::sleep(CLAIM_POLL.min(left)).await;
        match after_poll(&poll_claim(http, bootserver, boot_mac).await) {
            AfterPoll::Wait => {}
            AfterPoll::ReportNow => return false,
            AfterPoll::Reboot => {
                println!(
                    "unbounded-agent: this machine was claimed while it waited: rebooting into its own boot"
                );
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, refusal: Option<&str>, retry_after: Option<u64>) -> Answer {
        Answer::Status {
            code,
            refusal: refusal.map(str::to_owned),
            retry_after,
        }
    }

    #[test]
    fn what_follows_each_answer() {
        let after = |secs: u64, attempt: u32| Step::ReportAfter {
            wait: Duration::from_secs(secs),
            attempt,
        };
        let cases = [
            ("created", status(201, None, None), 3, after(300, 0)),
            ("updated", status(200, None, None), 0, after(300, 0)),
            ("no answer, first", Answer::Unreachable, 0, after(1, 1)),
            ("no answer, fourth", Answer::Unreachable, 3, after(8, 4)),
            ("no answer, many", Answer::Unreachable, 40, after(300, 41)),
            (
                "rate limited, Retry-After",
                status(429, Some("rate_limited"), Some(60)),
                0,
                after(60, 1),
            ),
            (
                "API server failed, no hint",
                status(503, Some("api_error"), None),
                2,
                after(4, 3),
            ),
            (
                "claimed: reboot",
                status(409, Some("known"), None),
                0,
                Step::Reboot,
            ),
            (
                "MACs of two Machines: wait, never reboot",
                status(409, Some("mac_conflict"), None),
                0,
                after(300, 0),
            ),
            (
                "invalid: give up until the next period",
                status(422, Some("invalid"), None),
                5,
                after(300, 0),
            ),
            (
                "too large",
                status(413, Some("too_large"), None),
                0,
                after(300, 0),
            ),
            ("discovery off", status(404, None, None), 0, after(300, 0)),
            (
                "an absurd Retry-After is bounded",
                status(429, None, Some(999_999)),
                0,
                after(3600, 1),
            ),
        ];
        for (case, answer, attempt, want) in cases {
            assert_eq!(next_step(&answer, attempt), want, "{case}");
        }
    }

    #[test]
    fn the_command_line_says_inspect_and_which_mac_booted() {
        let cmdline = "initrd=initrd console=ttyS0 unbounded.inspect=1 unbounded.bootserver=http://10.99.0.1:8080 BOOTIF=01-52-54-00-AB-00-01\n";
        assert!(requested(cmdline));
        assert_eq!(boot_mac(cmdline).as_deref(), Some("52:54:00:ab:00:01"));
        assert!(!requested("unbounded.machine=n unbounded.inspect=0"));
        assert!(!requested("unbounded.machine=n"));
        assert_eq!(boot_mac("BOOTIF=01-52-54-00"), None);
        assert_eq!(boot_mac("BOOTIF=01-52-54-00-ab-00-zz"), None);
    }

    #[test]
    fn after_poll_table() {
        let cases = [
            ("still waiting", status(200, None, None), AfterPoll::Wait),
            (
                "claimed",
                status(409, Some("known"), None),
                AfterPoll::Reboot,
            ),
            (
                "409 without the label",
                status(409, None, None),
                AfterPoll::Wait,
            ),
            (
                "the Machine is gone",
                status(404, None, None),
                AfterPoll::ReportNow,
            ),
            (
                "bootserver busy",
                status(503, None, Some(60)),
                AfterPoll::Wait,
            ),
            ("no answer", Answer::Unreachable, AfterPoll::Wait),
        ];
        for (case, answer, want) in cases {
            assert_eq!(after_poll(&answer), want, "{case}");
        }
    }
}
