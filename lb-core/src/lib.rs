//! lbd's decisions without I/O. Everything here is a function of its inputs and a time the
//! caller passes in: no sockets, no clock reads, no async runtime. Cargo enforces it: this crate
//! depends on no tokio, aya, rtnetlink, libc or nix (`tests/purity.rs` fails if it does).
//! `lb-userspace` is the shell that reads the world, feeds these machines and carries out what
//! they return.
//!
//! - [`config`]: the TOML config, every section of it and their validation; which of a
//!   directory of rendered configs is this node's ([`config::rendered`]).
//! - [`config_error`]: one error type for every config, and validation that reports every
//!   problem ([`config_error::Validate`]).
//! - [`controller`]: the daemon's decisions as one machine, `handle(now, Input) -> Vec<Effect>`
//!   (the owner task is its shell).
//! - [`net`]: facts about the host's network as values (listed addresses, which ones lbd adds,
//!   the path to a routed backend).
//! - [`plan`]: from config and facts to what the data plane should hold ([`desired`]).
//! - [`render`]: every node's config from one cluster description (`lbctl render`).
//! - [`backends`]: backends' health facts and the decisions that change them: a check's
//!   result, a dead master's backends (fate sharing), the failed-backend hold.
//! - [`maglev`]: the weighted Maglev table builder.
//! - [`sync`]: the connection sync's datagram format and replay window.
//! - [`vrrp`]: the VRRP codec, the RFC state machine, tracked checks' weights, OpenShift's VRIDs.
//! - [`handover`]: the grace after a VIP leaves this node, and an adopted master's hold.
//! - [`vrrp::hold`]: what a VRRP master does with its VIPs (wait for forwarding, hold,
//!   announce), beside the RFC machine.

pub mod backends;
pub mod config;
pub mod config_error;
pub mod controller;
pub mod desired;
pub mod handover;
pub mod maglev;
pub mod net;
pub mod plan;
pub mod render;
pub mod sync;
pub mod vrrp;
