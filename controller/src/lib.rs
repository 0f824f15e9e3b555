//! Unbounded controller.
