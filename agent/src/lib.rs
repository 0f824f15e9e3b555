//! unbounded-agent
