//! IPMI v2.0 over LAN (RMCP+) through `ipmi-rs`, which authenticates with RAKP-HMAC-SHA1
//! and protects the session with HMAC-SHA1-96 integrity and AES-CBC-128 confidentiality
//! (cipher suite 3; the only one it speaks, and the one BMCs enable by default). `ipmi-rs`
//! is blocking, so every call runs on tokio's blocking pool, one session per call. It has
//! no chassis commands: they are sent as raw messages (IPMI v2.0 §28).
//!
//! A blocking call is not cancelled when the future awaiting it is dropped (a leader that
//! stepped down), so the session asks the driver's leadership [`Term`] before every
//! command it sends, from the blocking thread itself, and each packet waits for its answer
//! only as long as the term granted when the session opened. The caller always waits for the
//! thread to end, so a retry never overlaps a call that is still running.

use std::time::Duration;

use ipmi_rs::connection::{IpmiConnection, LogicalUnit, Message, Request, RequestTargetAddress};
use ipmi_rs::rmcp::{ActivationError, Rmcp};

use unbounded_runtime::leader::Term;

use super::{Credentials, Power, PowerDriver, PowerError};

/// NetFn Chassis.
const NETFN_CHASSIS: u8 = 0x00;
const GET_CHASSIS_STATUS: u8 = 0x01;
const CHASSIS_CONTROL: u8 = 0x02;
const SET_SYSTEM_BOOT_OPTIONS: u8 = 0x08;
/// NetFn App, Set Session Privilege Level (§22.18), to Administrator (4).
const NETFN_APP: u8 = 0x06;
const SET_SESSION_PRIVILEGE_LEVEL: u8 = 0x3B;
/// NetFn App, Close Session (§22.19).
const CLOSE_SESSION: u8 = 0x3C;
/// NetFn Storage: Get FRU Inventory Area Info and Read FRU Data (§34.1, §34.2).
const NETFN_STORAGE: u8 = 0x0A;
const GET_FRU_INVENTORY_AREA_INFO: u8 = 0x10;
const READ_FRU_DATA: u8 = 0x11;
/// The FRU bytes read at most: the header and the chassis, board and product areas fit in
/// a few hundred; a BMC that claims more is not read further.
pub const MAX_FRU_BYTES: usize = 2048;
/// Bytes per Read FRU Data: small enough for every BMC's message size.
const FRU_CHUNK: usize = 16;
const ADMINISTRATOR: u8 = 0x04;

/// Chassis Control actions (§28.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChassisControl {
    /// Power down (hard).
    PowerDown = 0x00,
    /// Power up.
    PowerUp = 0x01,
    /// Power cycle.
    PowerCycle = 0x02,
    /// ACPI soft shutdown.
    SoftShutdown = 0x05,
}

/// The data of Set System Boot Options parameter 5 (boot flags, §28.13): valid, this boot
/// only (persistent bit clear), the EFI bit for UEFI, boot device PXE (0001b in bits 5:2).
pub fn pxe_boot_flags(uefi: bool) -> [u8; 6] {
    let valid_once = 0x80 | if uefi { 0x20 } else { 0x00 };
    [0x05, valid_once, 0x04, 0x00, 0x00, 0x00]
}

/// Whether Get Chassis Status's first data byte says power is on.
pub fn power_is_on(status: &[u8]) -> Option<bool> {
    status.first().map(|b| b & 0x01 == 0x01)
}

/// An IPMI BMC.
#[derive(Debug, Clone)]
pub struct IpmiBmc {
    host: String,
    port: u16,
    credentials: Credentials,
    timeout: Duration,
    term: Term,
}

/// One open session, as the commands of a call see it.
struct Session<'a> {
    rmcp: &'a mut Rmcp,
    bmc: &'a str,
    term: &'a Term,
    /// How long each packet waits for its answer (the socket's timeout).
    wait: Duration,
}

impl Session<'_> {
    /// Sends one raw command, if the term still allows a command that waits this session's
    /// wait; returns the response data after the completion code.
    fn send(&mut self, netfn: u8, cmd: u8, data: Vec<u8>) -> Result<Vec<u8>, PowerError> {
        self.term
            .check(self.wait)
            .map_err(|why| PowerError::not_leading(self.bmc, why))?;
        send(self.rmcp, self.bmc, netfn, cmd, data)
    }
}

impl IpmiBmc {
    /// A driver; no I/O until a call.
    pub fn new(host: &str, port: u16, credentials: Credentials, timeout: Duration) -> Self {
        Self {
            host: host.to_owned(),
            port,
            credentials,
            timeout,
            term: Term::unbounded(),
        }
    }

    /// The same driver, sending only within `term`.
    pub fn fenced_by(self, term: Term) -> Self {
        Self { term, ..self }
    }

    fn name(&self) -> String {
        format!("ipmi://{}:{}", self.host, self.port)
    }

    /// Opens a session and sends one raw chassis command; returns the response data.
    async fn chassis(&self, cmd: u8, data: Vec<u8>) -> Result<Vec<u8>, PowerError> {
        self.in_session(move |session| {
            raise_to_administrator(session)?;
            session.send(NETFN_CHASSIS, cmd, data)
        })
        .await
    }

    /// Reads FRU device 0 (the machine's identity: chassis, board, product), up to
    /// [`MAX_FRU_BYTES`], [`FRU_CHUNK`] bytes per Read FRU Data. User privilege suffices.
    pub async fn fru_bytes(&self) -> Result<Vec<u8>, PowerError> {
        self.in_session(|session| {
            let info = session.send(NETFN_STORAGE, GET_FRU_INVENTORY_AREA_INFO, vec![0])?;
            let size = match info.as_slice() {
                [lsb, msb, ..] => usize::from(u16::from_le_bytes([*lsb, *msb])),
                _ => {
                    return Err(PowerError::Failed {
                        bmc: session.bmc.to_owned(),
                        message: "Get FRU Inventory Area Info answered without a size".into(),
                    });
                }
            };
            let size = size.min(MAX_FRU_BYTES);
            let mut bytes = Vec::with_capacity(size);
            while bytes.len() < size {
                let offset = u16::try_from(bytes.len()).unwrap_or(u16::MAX).to_le_bytes();
                let count = (size - bytes.len()).min(FRU_CHUNK) as u8;
                let answer = session.send(
                    NETFN_STORAGE,
                    READ_FRU_DATA,
                    vec![0, offset[0], offset[1], count],
                )?;
                // The first byte is how many bytes follow.
                match answer.split_first() {
                    Some((&n, data)) if n > 0 && usize::from(n) <= data.len() => {
                        bytes.extend_from_slice(&data[..usize::from(n)]);
                    }
                    _ => break,
                }
            }
            Ok(bytes)
        })
        .await
    }

    /// Runs `commands` in a session of their own on tokio's blocking pool and closes the
    /// session however they end. Each packet waits at most the driver's timeout or half of
    /// what was left of the term when the session opened, if less, and a session is
    /// a bounded number of packets, so the thread ends on its own; it is awaited to the end
    /// and never abandoned, so that a retry cannot overlap it.
    async fn in_session<T, F>(&self, commands: F) -> Result<T, PowerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Session<'_>) -> Result<T, PowerError> + Send + 'static,
    {
        let this = self.clone();
        let bmc = self.name();
        let name = bmc.clone();
        let call = tokio::task::spawn_blocking(move || {
            let bmc = name;
            // Half of what is left of the term (or the timeout, if shorter): a session is
            // several packets, and each must still fit when it is sent.
            let left = this
                .term
                .grant(Duration::MAX)
                .map_err(|why| PowerError::not_leading(&bmc, why))?;
            let wait = this.timeout.min(left / 2);
            let mut rmcp = this.open_session(&bmc, wait)?;
            let result = commands(&mut Session {
                rmcp: &mut rmcp,
                bmc: &bmc,
                term: &this.term,
                wait,
            });
            close_session(&mut rmcp, &bmc);
            result
        });
        match call.await {
            Ok(result) => result,
            Err(join) => Err(PowerError::Failed {
                bmc,
                message: format!("the IPMI call stopped: {join}"),
            }),
        }
    }

    fn open_session(&self, bmc: &str, wait: Duration) -> Result<Rmcp, PowerError> {
        let mut rmcp = Rmcp::new((self.host.as_str(), self.port), wait).map_err(|e| {
            PowerError::Unreachable {
                bmc: bmc.to_owned(),
                message: e.to_string(),
            }
        })?;
        rmcp.activate(
            true,
            Some(&self.credentials.username),
            Some(self.credentials.password().as_bytes()),
        )
        .map_err(|e| activation_error(bmc, wait, &e))?;
        Ok(rmcp)
    }

    async fn control(&self, action: ChassisControl) -> Result<(), PowerError> {
        self.chassis(CHASSIS_CONTROL, vec![action as u8])
            .await
            .map(drop)
    }
}

/// A session starts at User level; chassis control and boot options need Administrator.
fn raise_to_administrator(session: &mut Session<'_>) -> Result<(), PowerError> {
    match session.send(NETFN_APP, SET_SESSION_PRIVILEGE_LEVEL, vec![ADMINISTRATOR]) {
        Err(PowerError::Failed { bmc, message }) => Err(PowerError::Failed {
            bmc,
            message: format!("the user may not act as Administrator ({message})"),
        }),
        other => other.map(drop),
    }
}

/// Sends one raw command to the BMC; returns the response data after the completion code.
fn send(
    rmcp: &mut Rmcp,
    bmc: &str,
    netfn: u8,
    cmd: u8,
    data: Vec<u8>,
) -> Result<Vec<u8>, PowerError> {
    let mut request = Request::new(
        Message::new_raw(netfn, cmd, data),
        RequestTargetAddress::Bmc(LogicalUnit::Zero),
    );
    let response = rmcp
        .send_recv(&mut request)
        .map_err(|e| PowerError::Unreachable {
            bmc: bmc.to_owned(),
            message: format!("{e:?}"),
        })?;
    match response.cc() {
        0x00 => Ok(response.data().to_vec()),
        // Node busy, or "command not supported in present state" (during POST).
        cc @ (0xC0 | 0xD5) => Err(PowerError::Busy {
            bmc: bmc.to_owned(),
            message: format!("completion code {cc:#04x}"),
        }),
        cc => Err(PowerError::Failed {
            bmc: bmc.to_owned(),
            message: format!("completion code {cc:#04x} for command {netfn:#04x}/{cmd:#04x}"),
        }),
    }
}

/// Closes the session, best effort: a BMC's session table is small (often 4 to 16 slots), and
/// a session left to its inactivity timeout holds a slot that an operator's `ipmitool` or a
/// Serial-over-LAN console needs. A failed close is logged and the BMC's timeout ends it.
fn close_session(rmcp: &mut Rmcp, bmc: &str) {
    let Some(id) = session_id(&format!("{rmcp:?}")) else {
        tracing::debug!(
            bmc,
            "no session ID to close; the BMC's timeout ends the session"
        );
        return;
    };
    let mut close = Request::new(
        Message::new_raw(NETFN_APP, CLOSE_SESSION, id.to_le_bytes().to_vec()),
        RequestTargetAddress::Bmc(LogicalUnit::Zero),
    );
    match rmcp.send_recv(&mut close) {
        Ok(response) if response.cc() == 0 => {}
        Ok(response) => {
            tracing::debug!(
                bmc,
                cc = response.cc(),
                "the BMC refused to close the session"
            );
        }
        Err(error) => tracing::debug!(bmc, ?error, "closing the session failed"),
    }
}

/// The Managed System Session ID of an active session, read from ipmi-rs's `Debug` output
/// of the connection: ipmi-rs 0.6 keeps the ID private and shows it only there (with the
/// password and keys redacted), and Close Session needs it (ipmi_sim closes by ID only).
/// `None` when the output has no such field.
pub fn session_id(debug: &str) -> Option<u32> {
    let rest = debug.split("session_id: ").nth(1)?;
    let rest = rest.strip_prefix("Some(").unwrap_or(rest);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|id| *id != 0)
}

/// Maps a session-activation failure: a timeout or socket error is the network's, anything
/// in the RAKP exchange is the credentials' (a BMC answers a wrong password there).
fn activation_error(bmc: &str, timeout: Duration, error: &ActivationError) -> PowerError {
    let text = format!("{error:?}");
    match error {
        ActivationError::BindSocket(e) | ActivationError::PingSend(e) => PowerError::Unreachable {
            bmc: bmc.to_owned(),
            message: e.to_string(),
        },
        ActivationError::PongReceive(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            PowerError::Timeout {
                bmc: bmc.to_owned(),
                seconds: timeout.as_secs().max(1),
            }
        }
        ActivationError::PongReceive(e) => PowerError::Unreachable {
            bmc: bmc.to_owned(),
            message: e.to_string(),
        },
        ActivationError::V2_0(_) | ActivationError::V1_5(_)
            if text.contains("Timed") || text.contains("WouldBlock") =>
        {
            PowerError::Timeout {
                bmc: bmc.to_owned(),
                seconds: timeout.as_secs().max(1),
            }
        }
        ActivationError::V2_0(_) | ActivationError::V1_5(_) => PowerError::Unauthorized {
            bmc: bmc.to_owned(),
        },
        _ => PowerError::Failed {
            bmc: bmc.to_owned(),
            message: format!("starting an IPMI session: {text}"),
        },
    }
}

impl PowerDriver for IpmiBmc {
    async fn power_state(&self) -> Result<Power, PowerError> {
        let data = self.chassis(GET_CHASSIS_STATUS, Vec::new()).await?;
        match power_is_on(&data) {
            Some(true) => Ok(Power::On),
            Some(false) => Ok(Power::Off),
            None => Err(PowerError::Failed {
                bmc: self.name(),
                message: "empty chassis status".into(),
            }),
        }
    }

    async fn power_on(&self) -> Result<(), PowerError> {
        if self.power_state().await? == Power::On {
            return Ok(());
        }
        self.control(ChassisControl::PowerUp).await
    }

    async fn power_off(&self, grace: Duration) -> Result<(), PowerError> {
        if self.power_state().await? == Power::Off {
            return Ok(());
        }
        // Not every BMC offers a soft shutdown; then go straight to power down.
        if self.control(ChassisControl::SoftShutdown).await.is_err() {
            return self.control(ChassisControl::PowerDown).await;
        }
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if self.power_state().await? == Power::Off {
                return Ok(());
            }
        }
        tracing::info!(bmc = %self.name(), "no shutdown within the grace period; forcing power off");
        self.control(ChassisControl::PowerDown).await
    }

    async fn power_cycle(&self) -> Result<(), PowerError> {
        // Off, then on: a real power cycle (a warm reset keeps device state that a freshly
        // booted kernel may trip over, and not every BMC offers a cycle of its own).
        if self.power_state().await? == Power::On {
            self.control(ChassisControl::PowerDown).await?;
            super::wait_until_off(self, &self.name()).await?;
        }
        self.control(ChassisControl::PowerUp).await
    }

    async fn set_one_time_pxe_boot(&self, uefi: bool) -> Result<(), PowerError> {
        self.chassis(SET_SYSTEM_BOOT_OPTIONS, pxe_boot_flags(uefi).to_vec())
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_id_is_read_from_the_connection_debug_output() {
        let cases = [
            (
                "RMCP+",
                "State { socket: RmcpIpmiSocket { buffer: [0, 1] }, session_id: 305419896, session_sequence_number: 3, state: CryptoState { password: \"<redacted>\" } }",
                Some(305_419_896),
            ),
            (
                "IPMI v1.5",
                "State { session_id: Some(42), auth_type: MD5 }",
                Some(42),
            ),
            (
                "no session yet",
                "Rmcp { unbound_state: RmcpWithState(Unbound), active_state: None }",
                None,
            ),
            ("zero is no session", "State { session_id: 0 }", None),
            ("v1.5 before activation", "State { session_id: None }", None),
        ];
        for (case, debug, want) in cases {
            assert_eq!(session_id(debug), want, "{case}");
        }
    }

    #[test]
    fn boot_flags_are_valid_one_time_pxe_with_the_efi_bit_for_uefi() {
        assert_eq!(pxe_boot_flags(false), [0x05, 0x80, 0x04, 0, 0, 0]);
        assert_eq!(pxe_boot_flags(true), [0x05, 0xA0, 0x04, 0, 0, 0]);
    }

    #[test]
    fn chassis_status_power_bit() {
        assert_eq!(power_is_on(&[0x01, 0x00, 0x40]), Some(true));
        assert_eq!(power_is_on(&[0x60, 0x00]), Some(false));
        assert_eq!(power_is_on(&[]), None);
    }
}
