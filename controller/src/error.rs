//! The controller's errors.

/// Errors of reconciliation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Not an error: a step waits for something outside the controller (a provider's
    /// finalizer, a draining Node); reconcile again soon.
    #[error("waiting: {0}")]
    Waiting(String),
    /// A reflector store stopped.
    #[error("reflector store for {0} stopped before it was ready")]
    StoreNotReady(&'static str),
    /// Serialization of an object failed.
    #[error("serializing {what}: {source}")]
    Serialize {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A short name for the metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.metric_label(),
                _ => "finalizer",
            },
            Self::Waiting(_) => "waiting",
            Self::StoreNotReady(_) => "store",
            Self::Serialize { .. } => "serialize",
        }
    }

    /// Whether this is only a wait, not a failure. Adding or removing a finalizer from a
    /// copy of the object that was already stale is refused (the JSON patch's test, or the
    /// resourceVersion): the next reconcile works from the newer copy. Removing the
    /// finalizer of an object that is gone already (a second reconcile of its deletion) is
    /// done, not failed.
    pub fn is_waiting(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        let stale =
            |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422);
        match self {
            Self::Waiting(_) => true,
            Self::Finalizer(inner) => match inner.as_ref() {
                F::CleanupFailed(Error::Waiting(_)) | F::ApplyFailed(Error::Waiting(_)) => true,
                F::AddFinalizer(e) => stale(e),
                F::RemoveFinalizer(e) => stale(e) || is_not_found(e),
                _ => false,
            },
            _ => false,
        }
    }
}

/// Wraps a kube error with what was being done.
pub fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// Whether a kube error is the API server's 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::finalizer::Error as F;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn finalizer_races_are_waits_and_other_errors_are_not() {
        let finalizer = |e: F<Error>| Error::Finalizer(Box::new(e));
        assert!(
            finalizer(F::RemoveFinalizer(api(404))).is_waiting(),
            "gone already"
        );
        assert!(finalizer(F::RemoveFinalizer(api(409))).is_waiting());
        assert!(finalizer(F::AddFinalizer(api(422))).is_waiting());
        assert!(!finalizer(F::AddFinalizer(api(404))).is_waiting());
        assert!(!finalizer(F::RemoveFinalizer(api(500))).is_waiting());
    }
}
