//! unbounded-azure
