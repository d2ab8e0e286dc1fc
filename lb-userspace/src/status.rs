//! The daemon's status rows: what `lbctl` shows and metrics export. They belong to neither the
//! daemon (which fills them) nor the metrics or the CLI (which read them), so no two of those
//! modules import each other.

use std::net::IpAddr;

use serde::Serialize;

/// `*` for a service of every port of its address, else the port.
pub fn port_label(port: u16) -> String {
    if port == lb_common::ALL_PORTS {
        "*".into()
    } else {
        port.to_string()
    }
}

/// The last health check of a backend.
#[derive(Clone, Debug, Serialize)]
pub struct CheckRow {
    /// `"ok"`, the failure, or `""` before the first check.
    pub result: String,
    pub duration_ms: Option<u64>,
    pub at_unix_ms: Option<u64>,
    pub checks_run: u64,
    pub checks_failed: u64,
}

/// One row of `lbctl backends list`.
#[derive(Clone, Debug, Serialize)]
pub struct BackendRow {
    pub vip_name: String,
    pub vip: IpAddr,
    /// 0: every port (`*`).
    pub port: u16,
    pub protocol: &'static str,
    pub backend: IpAddr,
    pub mac: String,
    pub weight: u32,
    pub state: &'static str,
    pub reason: String,
    pub local: bool,
    /// The health verdict (true when not checked).
    pub healthy: bool,
    pub drained: bool,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    /// None when the VIP has no health check.
    pub check: Option<CheckRow>,
}

impl BackendRow {
    pub fn port_label(&self) -> String {
        port_label(self.port)
    }
}

/// One row of `lbctl vips list`.
#[derive(Clone, Debug, Serialize)]
pub struct VipRow {
    pub name: String,
    pub vip: IpAddr,
    /// 0: every port (`*`).
    pub port: u16,
    pub protocol: &'static str,
    pub owned: bool,
    pub vrrp: Option<String>,
    pub backends_active: usize,
    pub backends_total: usize,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

impl VipRow {
    pub fn port_label(&self) -> String {
        port_label(self.port)
    }
}
