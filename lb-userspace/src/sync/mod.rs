//! Connection-state sync between lbd nodes: the connection-table entries another node could not
//! rebuild from the shared Maglev table (see docs/architecture.md, "Connection sync").
//!
//! The config section (`config`, from `lb_core::config::sync`, with the reading of the key
//! files), the authenticated datagram (`wire`), the replay window (`replay`) and what is an
//! exception and where a received one goes (`view`).
//! The task that scans, sends and installs is `daemon/sync.rs`.

pub mod config;
pub use lb_core::sync::replay;
pub mod status;
pub mod view;
pub mod wire;
