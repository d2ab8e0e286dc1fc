//! The daemon's configuration: the TOML, its sections and their validation are pure and live in
//! `lb_core::config` (re-exported here); reading a file and checking it against this host is
//! [`node`]'s ([`ConfigFile`]).

pub use lb_core::config::*;

pub mod node;

pub use node::ConfigFile;
