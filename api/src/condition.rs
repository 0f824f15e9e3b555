//! Small helpers over `metav1.Condition` lists.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Builds a condition stamped now.
pub fn new_condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: Time(now()),
    }
}

/// The current time in the form Kubernetes timestamps use.
pub fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of this type is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Inserts or replaces the condition of `new.type_`. The transition time is kept when the
/// status did not change, so that it tells when the status last flipped.
pub fn set(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = new;
        }
        None => conditions.push(new),
    }
}

/// Whether two conditions say the same thing (ignoring the transition time).
pub fn same_meaning(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_keeps_transition_time_when_status_unchanged() {
        let mut list = vec![new_condition("Ready", true, "A", "first", None)];
        let first_time = list[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        set(&mut list, new_condition("Ready", true, "B", "second", None));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].reason, "B");
        assert_eq!(list[0].last_transition_time, first_time);
    }

    #[test]
    fn set_moves_transition_time_when_status_flips() {
        let mut list = vec![new_condition("Ready", true, "A", "", None)];
        let first_time = list[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        set(&mut list, new_condition("Ready", false, "A", "", None));
        assert_ne!(list[0].last_transition_time, first_time);
        assert!(!is_true(&list, "Ready"));
    }

    #[test]
    fn set_appends_new_types_and_find_reads_them() {
        let mut list = Vec::new();
        set(&mut list, new_condition("A", true, "R", "", None));
        set(&mut list, new_condition("B", false, "R", "", None));
        assert_eq!(list.len(), 2);
        assert!(is_true(&list, "A"));
        assert!(!is_true(&list, "B"));
        assert!(!is_true(&list, "C"));
        assert!(find(&list, "B").is_some());
    }
}
