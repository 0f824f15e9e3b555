//! One-time nonces: handed out with a machine's boot script, bound to its address, spent
//! when a token was minted; kept across restarts in the nonce file when one is set.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use crate::nonce_file::{NonceFile, NonceFileError, StoredNonce, digest_hex};

/// Why a nonce was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NonceRefusal {
    /// No script with a nonce was served to this machine (or its nonce was spent).
    #[error("no unspent nonce was issued to this machine")]
    NoneIssued,
    /// It is not the nonce of the machine's latest script.
    #[error("it is not the nonce of this machine's latest boot script")]
    Mismatch,
    /// It expired.
    #[error("it expired")]
    Expired,
    /// It is being redeemed by another request right now.
    #[error("it is being redeemed by another request")]
    Busy,
}

#[derive(Debug, Clone)]
pub(super) struct NonceEntry {
    /// SHA-256 of the nonce (hex): what is kept, in memory and on disk.
    digest: String,
    ip: IpAddr,
    expires_unix: u64,
    reserved: bool,
}

/// One-time nonces per machine, bound to the address their script was served to; kept in
/// the nonce file too when there is one ([`crate::nonce_file`]), so that a restart keeps them.
#[derive(Debug, Default)]
pub struct Nonces {
    entries: Mutex<HashMap<String, NonceEntry>>,
    file: Option<NonceFile>,
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Nonces {
    /// Nonces kept in `file`, starting with the unexpired ones it holds.
    pub fn persistent(file: NonceFile, now: u64) -> Result<Self, NonceFileError> {
        let entries = file
            .load(now)?
            .into_iter()
            .map(|(machine, stored)| {
                (
                    machine,
                    NonceEntry {
                        digest: stored.sha256,
                        ip: stored.ip,
                        expires_unix: stored.expires_unix,
                        reserved: false,
                    },
                )
            })
            .collect();
        Ok(Self {
            entries: Mutex::new(entries),
            file: Some(file),
        })
    }

    /// How many unspent nonces it holds.
    pub fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn persist(&self, entries: &HashMap<String, NonceEntry>) -> Result<(), NonceFileError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        file.store(
            &entries
                .iter()
                .map(|(machine, e)| {
                    (
                        machine.clone(),
                        StoredNonce {
                            sha256: e.digest.clone(),
                            ip: e.ip,
                            expires_unix: e.expires_unix,
                        },
                    )
                })
                .collect(),
        )
    }

    /// Records `value` as `machine`'s nonce for `ip` until `expires_unix`; the previous one
    /// is forgotten. With a nonce file, it is on disk when this returns `Ok` (and not
    /// recorded at all when writing failed: the script must not carry it).
    pub fn insert(
        &self,
        machine: &str,
        value: &str,
        ip: IpAddr,
        expires_unix: u64,
    ) -> Result<(), NonceFileError> {
        let Ok(mut entries) = self.entries.lock() else {
            return Ok(());
        };
        let previous = entries.insert(
            machine.to_owned(),
            NonceEntry {
                digest: digest_hex(value),
                ip,
                expires_unix,
                reserved: false,
            },
        );
        if let Err(error) = self.persist(&entries) {
            match previous {
                Some(previous) => entries.insert(machine.to_owned(), previous),
                None => entries.remove(machine),
            };
            return Err(error);
        }
        Ok(())
    }

    /// The address the machine's current nonce is bound to.
    pub fn bound_ip(&self, machine: &str) -> Option<IpAddr> {
        self.entries.lock().ok()?.get(machine).map(|e| e.ip)
    }

    /// Checks a presented nonce and reserves it (so that two requests cannot both use it).
    /// The reservation is released when it is dropped unless it was spent: a mint that
    /// failed, timed out or was abandoned leaves the nonce usable.
    pub fn reserve(
        &self,
        machine: &str,
        presented: &str,
        now: u64,
    ) -> Result<Reservation<'_>, NonceRefusal> {
        let presented = digest_hex(presented);
        self.reserve_if(machine, now, |entry| {
            constant_time_eq(entry.digest.as_bytes(), presented.as_bytes())
        })
    }

    /// Reserves `machine`'s current nonce as a ticket: no value is presented (the script
    /// carried none); the request must come from the address the script went to. Spent and
    /// released like a nonce's reservation.
    pub fn reserve_ticket(
        &self,
        machine: &str,
        peer: IpAddr,
        now: u64,
    ) -> Result<Reservation<'_>, NonceRefusal> {
        self.reserve_if(machine, now, |entry| entry.ip == peer)
    }

    /// Reserves `machine`'s entry if `matches` says the request is for it
    /// ([`NonceRefusal::Mismatch`] otherwise), it has not expired and nobody holds it.
    fn reserve_if(
        &self,
        machine: &str,
        now: u64,
        matches: impl FnOnce(&NonceEntry) -> bool,
    ) -> Result<Reservation<'_>, NonceRefusal> {
        let mut entries = self.entries.lock().map_err(|_| NonceRefusal::Busy)?;
        let entry = entries.get_mut(machine).ok_or(NonceRefusal::NoneIssued)?;
        if !matches(entry) {
            return Err(NonceRefusal::Mismatch);
        }
        if entry.expires_unix <= now {
            entries.remove(machine);
            return Err(NonceRefusal::Expired);
        }
        if entry.reserved {
            return Err(NonceRefusal::Busy);
        }
        entry.reserved = true;
        Ok(Reservation {
            nonces: self,
            machine: machine.to_owned(),
            digest: entry.digest.clone(),
            spent: false,
        })
    }
}

/// A nonce reserved for one request: [`Reservation::spend`] once credentials were minted;
/// dropped otherwise (the mint failed or timed out, or the request was abandoned when its
/// client went away), it releases the nonce, which may then be presented again.
#[derive(Debug)]
pub struct Reservation<'a> {
    nonces: &'a Nonces,
    machine: String,
    digest: String,
    spent: bool,
}

impl Reservation<'_> {
    /// Spends the nonce: it is never accepted again (by this process; the file forgets it
    /// too unless writing fails, which is logged: the nonce still expires).
    pub fn spend(mut self) {
        self.spent = true;
        let Ok(mut entries) = self.nonces.entries.lock() else {
            return;
        };
        // A newer boot script may have replaced it while the mint ran: that one stays.
        if entries
            .get(&self.machine)
            .is_some_and(|e| e.digest == self.digest)
        {
            entries.remove(&self.machine);
            if let Err(error) = self.nonces.persist(&entries) {
                tracing::warn!(machine = %self.machine, %error, "a spent nonce stays in the nonce file until it expires");
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.spent {
            return;
        }
        if let Ok(mut entries) = self.nonces.entries.lock()
            && let Some(entry) = entries
                .get_mut(&self.machine)
                .filter(|e| e.digest == self.digest)
        {
            entry.reserved = false;
        }
    }
}
