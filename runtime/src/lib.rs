//! What every Unbounded component runs on. For now: [`leader`], the leader election that the
//! controller, the PXE provider (in the bootserver) and the Azure provider share, so that at
//! most one replica of each acts at a time.

pub mod leader;
