//! Health checks: is each backend (and each locally tracked service) fit for new flows?
//!
//! - [`config`]: the `health` table of a service, its defaults (and why) and validation (pure;
//!   `lb_core::config::health`).
//! - [`probe`]: one HTTPS/HTTP/TCP probe under one hard timeout (I/O).
//! - [`tracker`]: rise/fall over probe results; the initial-state policy (pure).
//! - [`monitor`]: one tokio task per target, events on every change, status for the API.
//!
//! Local tracking for VRRP priority (OpenShift's tracked scripts) uses the same machinery: a
//! [`Target`] for `127.0.0.1:6443` with `HealthConfig::https("/readyz")` tracks the local
//! kube-apiserver, one for `127.0.0.1:1936` with `HealthConfig::http("/healthz")` the router.

pub use lb_core::config::health as config;
pub mod monitor;
pub mod probe;
pub mod tracker;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testsupport;

pub use config::{CheckKind, HealthConfig, StatusRange};
pub use monitor::{HealthEvent, HealthMonitor, Target, TargetStatus};
pub use probe::{FailureClass, ProbeFailure, ProbeSpec, Stage};
pub use tracker::{Health, Tracker, Transition};
