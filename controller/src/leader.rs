//! Leader election with a `coordination.k8s.io/v1` Lease: one replica leads; the others wait
//! until its lease expires.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::error::{Error, is_not_found, kube_err};

/// Settings of leader election.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
}

/// Whether a lease held by `holder`, renewed at `renewed`, is ours to take at `now`.
pub fn can_take(
    holder: Option<&str>,
    identity: &str,
    renewed_ms: Option<i64>,
    duration: Duration,
    now_ms: i64,
) -> bool {
    match (holder, renewed_ms) {
        (None, _) | (Some(""), _) | (_, None) => true,
        (Some(h), _) if h == identity => true,
        (Some(_), Some(renewed)) => {
            now_ms.saturating_sub(renewed) > i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
        }
    }
}

/// A leader-election participant.
#[derive(Debug, Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
}

impl LeaderElector {
    /// A participant for the Lease in `settings`.
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) -> Result<(), Error> {
        loop {
            if self.try_acquire_or_renew().await? {
                tracing::info!(lease = %self.settings.name, identity = %self.settings.identity, "became leader");
                return Ok(());
            }
            tokio::time::sleep(self.settings.duration / 3).await;
        }
    }

    /// Renews the lease until renewal fails for longer than the lease lasts; returns then
    /// (the caller must stop acting as leader).
    pub async fn keep_renewing(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.settings.duration / 3).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!("lost the lease to another replica");
                    return;
                }
                Err(error) => tracing::warn!(%error, "renewing the lease failed"),
            }
            if last_renewal.elapsed() > self.settings.duration {
                tracing::error!("could not renew the lease in time");
                return;
            }
        }
    }

    /// Takes or renews the lease if it is free, expired or ours. A conflicting write means
    /// another replica won.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let seconds = i32::try_from(self.settings.duration.as_secs()).unwrap_or(15);
        let current = match self.api.get(&self.settings.name).await {
            Ok(lease) => lease,
            Err(e) if is_not_found(&e) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.settings.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(kube_err("creating the leader Lease")(e)),
                };
            }
            Err(e) => return Err(kube_err("reading the leader Lease")(e)),
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref();
        let renewed = spec.renew_time.as_ref().map(|t| t.0.as_millisecond());
        if !can_take(
            holder,
            &self.settings.identity,
            renewed,
            self.settings.duration,
            now.as_millisecond(),
        ) {
            return Ok(false);
        }
        let ours = holder == Some(self.settings.identity.as_str());
        let mut lease = current;
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if ours {
                spec.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!ours)),
            ..spec
        });
        // replace carries the resourceVersion: a concurrent writer makes this a 409.
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(kube_err("renewing the leader Lease")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn can_take_table() {
        let d = Duration::from_secs(15);
        let cases = [
            ("free", None, None, 0, true),
            ("ours", Some("me"), Some(0), 100_000, true),
            ("other, fresh", Some("other"), Some(90_000), 100_000, false),
            ("other, expired", Some("other"), Some(80_000), 100_000, true),
            ("other, never renewed", Some("other"), None, 0, true),
            ("empty holder", Some(""), Some(99_000), 100_000, true),
        ];
        for (case, holder, renewed, now, expected) in cases {
            assert_eq!(can_take(holder, "me", renewed, d, now), expected, "{case}");
        }
    }
}
