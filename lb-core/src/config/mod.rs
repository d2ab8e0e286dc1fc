//! The daemon's configuration (TOML), every section of it and its validation. Pure: parsing
//! never touches the system (reading a file and this host's addresses is lb-userspace's
//! `config::node`: `ConfigFile::load`).
//!
//! Every error names the field (`vips[1].backends[0].weight`) and the reason, so a bad config is
//! refused with something an operator can act on; validation reports every problem of a file,
//! not the first ([`crate::config_error`]). See `docs/config.md` for an example.

use std::{collections::HashSet, net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

pub mod bgp;
pub mod health;
pub mod members;
pub mod metrics_tls;
pub mod rendered;
pub mod sync;
pub mod vrrp;

use crate::maglev::is_prime;
use bgp::BgpConfig;
use health::HealthConfig;
use vrrp::InstanceConfig;

pub use crate::config_error::{ConfigError, ConfigErrors, Validate};

/// Why a config file was not taken: it could not be read, it is not TOML of the right shape,
/// or its values are wrong (every wrong field, each named).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    // Not a `source`: the message already carries the reason, and error chains would print it
    // twice.
    #[error("cannot read {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(ConfigErrors),
}

impl From<ConfigErrors> for LoadError {
    fn from(e: ConfigErrors) -> Self {
        LoadError::Invalid(e)
    }
}

impl From<ConfigError> for LoadError {
    fn from(e: ConfigError) -> Self {
        LoadError::Invalid(e.into())
    }
}

impl LoadError {
    /// The fields named, in order (none for a file that could not be read or parsed).
    pub fn fields(&self) -> Vec<&str> {
        match self {
            LoadError::Invalid(e) => e.fields(),
            _ => Vec::new(),
        }
    }
}

/// Parse TOML into `T`. A type error names the field's path (`vips[0].backends[1].weight`) like
/// validation errors do, so both read `field: reason`.
pub fn from_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, LoadError> {
    let de = toml::Deserializer::parse(text).map_err(|e| LoadError::Parse(e.to_string()))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let reason = e.into_inner().to_string();
        if field == "." {
            // Nothing to name (e.g. a syntax error): toml's message carries the line.
            LoadError::Parse(reason)
        } else {
            ConfigError::new(field, reason.trim_end()).into()
        }
    })
}

pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(field, reason)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// Driver mode, falling back to generic (skb) mode if the driver has no XDP support.
    #[default]
    Auto,
    Driver,
    Skb,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => lb_common::PROTO_TCP,
            Protocol::Udp => lb_common::PROTO_UDP,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Interface the XDP program attaches to and the VIPs live on.
    pub interface: String,
    /// Name of this load balancer: maps and links are pinned under `/sys/fs/bpf/<name>/`.
    #[serde(default = "default_name")]
    pub name: String,
    /// The API's unix socket.
    #[serde(default = "default_socket")]
    pub api_socket: PathBuf,
    /// Optional TCP listener for /metrics, /healthz and /readyz only (e.g. "0.0.0.0:9444").
    #[serde(default)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The authenticated /metrics listener cluster monitoring scrapes (HTTPS with client
    /// certificates, see lb-userspace's `metrics_tls` and docs/metrics.md). Restart to change; its
    /// certificate files are read again when they change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_tls: Option<metrics_tls::MetricsTlsConfig>,
    #[serde(default)]
    pub xdp_mode: XdpMode,
    /// The devices the XDP program attaches to, if not `interface` (which still holds the VIPs
    /// and speaks VRRP). On an OVS bridge such as OVN-Kubernetes' `br-ex`, whose XDP is generic
    /// only and whose frames sent back go through the bridge's flows, name its uplink (the NIC,
    /// or the bond) to forward in driver mode below the bridge: docs/kernels.md has the choice
    /// and its numbers. Empty: `interface`. Attach devices that are deleted and come back are
    /// not followed (restart lbd); `interface` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xdp_interfaces: Vec<String>,
    /// Flow-hash seed; must be the same on every node so flows keep their backend on failover.
    #[serde(default = "default_seed")]
    pub hash_seed: u32,
    /// Maglev table size: a prime, at least 10x the largest backend count of a VIP.
    #[serde(default = "default_table_size")]
    pub table_size: u32,
    /// Connection-table entries (LRU).
    #[serde(default = "default_conntrack_size")]
    pub conntrack_size: u32,
    #[serde(default)]
    pub vips: Vec<VipConfig>,
    #[serde(default)]
    pub vrrp: Vec<InstanceConfig>,
    /// Local checks that raise a VRRP instance's priority while they pass (OpenShift's tracked
    /// scripts).
    #[serde(default)]
    pub track: Vec<TrackConfig>,
    /// This node also serves the VIPs of its VRRP instances as a DSR backend: lbd holds each such
    /// VIP on `lo` (never announced; only where this node is a backend, see
    /// [`Config::backend_here`]) and sets `arp_ignore=1`, `arp_announce=2`.
    #[serde(default = "default_true")]
    pub dsr_backend: bool,
    /// After this node stops being a VIP's VRRP master (lbd stopping, a tracked check failing,
    /// preemption), it keeps forwarding the VIP's packets that still reach it for this long, so
    /// connections survive until clients' ARP/ND caches take the new owner (0 turns it off). On
    /// SIGTERM lbd stays alive through it. See docs/operations.md.
    #[serde(default = "default_handover_grace_ms")]
    pub handover_grace_ms: u64,
    /// Flood mode: above this many connection-table misses per second on the node (every CPU
    /// counted together, in 100 ms windows), no miss writes an entry (a connection placed by a
    /// skip writes one at its handshake's ACK), so a spoofed flood cannot push established
    /// flows out of the table. 0 turns it off. See docs/architecture.md, "Floods".
    #[serde(default = "default_syn_flood_rate")]
    pub syn_flood_rate: u32,
    /// A backend that fails its checks (or whose node is taken for dead by fate sharing) gets
    /// no new flows at once; its established flows stay on it this long, then move to other
    /// backends. A backend back within it loses nothing (0: flows move at once).
    #[serde(default = "default_failed_backend_hold_ms")]
    pub failed_backend_hold_ms: u64,
    /// BGP announcement of VIPs with `announce = "bgp"` through FRR (at most one section).
    #[serde(default)]
    pub bgp: Vec<BgpConfig>,
    /// Socket load balancing: this node's own connections to a VIP service (kubelet to
    /// api-int, host-network pods) get a healthy backend by the VIP's Maglev table at connect
    /// time, instead of always the local one. Needs a cgroup v2 hierarchy lbd can mount; if the
    /// hooks cannot be attached lbd logs it and runs without them. See docs/architecture.md.
    #[serde(default = "default_true")]
    pub socket_lb: bool,
    /// Connection sync with the other lbd nodes (see docs/architecture.md, "Connection sync").
    #[serde(default)]
    pub sync: Option<sync::SyncConfig>,
    /// Membership announcements: nodes that join or leave become or stop being peers of the
    /// VRRP instances and the sync without a new config (see docs/architecture.md,
    /// "Membership").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<members::MembersConfig>,
    /// Real-time priority (`SCHED_RR`, 1..=99) of each VRRP instance's thread, as keepalived's
    /// `vrrp_rt_priority`: adverts are sent and read on time on a node whose cores are busy.
    /// 0: normal scheduling. Without CAP_SYS_NICE lbd logs a warning and runs them at normal
    /// priority. Restart to change.
    #[serde(default = "default_vrrp_rt_priority")]
    pub vrrp_rt_priority: u8,
}

/// How the network learns that this node serves a VIP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Announce {
    /// One owner: static (`owned`) or elected by the VRRP instance named in `vrrp`.
    #[default]
    Owner,
    /// Every ready node announces the host route over BGP and forwards (active-active ECMP).
    Bgp,
}

/// A tracked local check, with keepalived's weight rules (lb-userspace's `vrrp::track`): a positive
/// `weight` is added to the instance's priority while the check passes, a negative one while it
/// fails, and weight 0 puts the instance in FAULT while it fails.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackConfig {
    /// VRRP instance whose priority this changes.
    pub instance: String,
    pub name: String,
    pub weight: i32,
    /// What to check, e.g. "127.0.0.1:6443" for the local kube-apiserver. Without it, the check
    /// is the load balancer's own readiness: this node has an active backend for every VIP of
    /// the instance.
    #[serde(default)]
    pub address: Option<std::net::SocketAddr>,
    /// With an `address`: the track also passes while the load balancer is ready (as a track
    /// without an address), i.e. "the local load balancer is fine OR the local service is":
    /// OpenShift's `chk_ocp_both`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub or_lb_ready: bool,
    #[serde(default, deserialize_with = "health_table")]
    pub health: HealthConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipConfig {
    /// Short name used by lbctl and metrics (e.g. "api", "ingress").
    pub name: String,
    pub address: IpAddr,
    /// Service ports; empty means every port of the address.
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default = "default_protocol")]
    pub protocol: Protocol,
    /// Static ownership: `owned = true` makes this node hold the VIP whatever the others do
    /// (every node with this config holds it); `owned = false` says this node never holds it
    /// (it only balances its own connections to it, or is only a backend). Written out, never
    /// assumed: a VIP names either `vrrp`, `owned` or `announce = "bgp"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned: Option<bool>,
    /// Name of the VRRP instance whose master state makes this node the owner.
    #[serde(default)]
    pub vrrp: Option<String>,
    /// `"bgp"`: announced by every ready node through `[[bgp]]` instead of one owner.
    #[serde(default)]
    pub announce: Announce,
    #[serde(default, deserialize_with = "health_table")]
    pub health: HealthConfig,
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
}

impl VipConfig {
    /// `owned = true`: held on this node without an election.
    pub fn held_statically(&self) -> bool {
        self.owned == Some(true)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub address: IpAddr,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// How packets reach the backend: `"none"` (the default: on this node's segment, only the
    /// MACs change) or `"ipip"` (a routed backend: IP-in-IP to it through the next hop; the
    /// backend runs `lbd decap`). See docs/architecture.md, "L3 direct server return".
    #[serde(default)]
    pub encap: EncapMode,
    /// With `encap = "ipip"`: the TCP port the backend's `lbd decap` answers on. The health
    /// check connects to it first, so a backend that cannot unwrap is taken out even though
    /// its own address still answers. 0: no such check.
    #[serde(default = "default_decap_health_port")]
    pub decap_health_port: u16,
}

/// `lbd decap --health-port`'s default.
pub const DEFAULT_DECAP_HEALTH_PORT: u16 = 1938;

fn default_decap_health_port() -> u16 {
    DEFAULT_DECAP_HEALTH_PORT
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncapMode {
    #[default]
    None,
    Ipip,
}

fn default_name() -> String {
    "lb".into()
}
fn default_socket() -> PathBuf {
    "/run/lbd/lbd.sock".into()
}
/// The flow-hash seed every node uses unless the config says otherwise.
pub const DEFAULT_HASH_SEED: u32 = 0x1b_5eed;

fn default_seed() -> u32 {
    DEFAULT_HASH_SEED
}
fn default_table_size() -> u32 {
    lb_common::DEFAULT_TABLE_SIZE
}
/// A `health` table, never an array: serde's reading of a struct also takes a sequence, so
/// `health = []` would pass as a table of defaults and hide the mistake.
fn health_table<'de, D: serde::Deserializer<'de>>(d: D) -> Result<HealthConfig, D::Error> {
    struct Table;
    impl<'de> serde::de::Visitor<'de> for Table {
        type Value = HealthConfig;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a health table (`[vips.health]` or `health = { ... }`)")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<HealthConfig, A::Error> {
            HealthConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(Table)
}

fn default_conntrack_size() -> u32 {
    lb_common::DEFAULT_CONNTRACK_SIZE
}
fn default_syn_flood_rate() -> u32 {
    lb_common::DEFAULT_SYN_FLOOD_RATE
}
fn default_failed_backend_hold_ms() -> u64 {
    DEFAULT_FAILED_BACKEND_HOLD_MS
}
/// Long enough for a readiness flap, a link flap or a partition to heal; short enough that a
/// dead backend's clients get resets (and reconnect elsewhere) within seconds.
pub const DEFAULT_FAILED_BACKEND_HOLD_MS: u64 = 10_000;
fn default_handover_grace_ms() -> u64 {
    crate::handover::DEFAULT_GRACE.as_millis() as u64
}
fn default_protocol() -> Protocol {
    Protocol::Tcp
}
/// The real-time priority lbd's VRRP threads ask for unless `vrrp_rt_priority` says otherwise:
/// above every normal thread, below the kernel's interrupt threads (50) and watchdogs (99).
pub const DEFAULT_RT_PRIORITY: u8 = 10;
/// The highest `SCHED_RR` priority Linux accepts.
pub const MAX_RT_PRIORITY: u8 = 99;

fn default_vrrp_rt_priority() -> u8 {
    DEFAULT_RT_PRIORITY
}
fn default_true() -> bool {
    true
}
fn default_weight() -> u32 {
    1
}

/// Highest weight: keeps the Maglev credit arithmetic small and the shares meaningful.
pub const MAX_WEIGHT: u32 = 1000;
pub const MAX_TABLE_SIZE: u32 = 1_000_003;

impl Config {
    /// Refuse a VIP that is one of this node's own addresses (not one lbd added, see
    /// [`crate::net::added_by_lbd`]) on an interface lbd holds VIPs on, or for a
    /// BGP VIP on any interface: a typo or an RFC "address owner" setup would have lbd
    /// announce, and on a step-down remove, the node's own address. `host` is (interface,
    /// address) as lb-userspace's `net::iface::host_addresses` lists them. Pure.
    pub fn check_host(
        &self,
        host: &[(String, crate::net::ListedAddr)],
    ) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::new();
        let owned_by_host = |ifname: Option<&str>, vip: IpAddr| {
            host.iter().find(|(i, a)| {
                a.addr == vip && ifname.is_none_or(|n| n == i) && !crate::net::added_by_lbd(i, a)
            })
        };
        let refuse = |field: String, (i, a): &(String, crate::net::ListedAddr)| {
            invalid(
                field,
                format!(
                    "{}/{} is an address of this node's interface {i}: a VIP must be an address no node has (lbd would announce it and, on stepping down, remove it)",
                    a.addr, a.prefix_len
                ),
            )
        };
        for (i, v) in self.vips.iter().enumerate() {
            let ifname = match (&v.vrrp, v.announce) {
                (_, Announce::Bgp) => None,
                (Some(name), _) => Some(
                    self.vrrp
                        .iter()
                        .find(|r| &r.name == name)
                        .and_then(|r| r.interface.as_deref())
                        .unwrap_or(&self.interface),
                ),
                (None, _) => Some(self.interface.as_str()),
            };
            if let Some(hit) = owned_by_host(ifname, v.address) {
                errors.push(refuse(format!("vips[{i}].address"), hit));
            }
        }
        for (i, r) in self.vrrp.iter().enumerate() {
            let ifname = r.interface.as_deref().unwrap_or(&self.interface);
            for (j, vip) in r.vips.iter().enumerate() {
                if let Some(hit) = owned_by_host(Some(ifname), *vip) {
                    errors.push(refuse(format!("vrrp[{i}].vips[{j}]"), hit));
                }
            }
        }
        errors.into_result()
    }

    pub fn parse(text: &str) -> Result<Config, LoadError> {
        let mut cfg: Config = from_toml(text)?;
        let conntrack_size = cfg.conntrack_size;
        if let Some(s) = cfg.sync.as_mut() {
            s.settle(conntrack_size);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Whether this node holds `vip` of VRRP instance `r` on `lo` as a DSR backend (with
    /// `dsr_backend`): unless the VIP's `[[vips]]` entries list backends and none of them is
    /// this node (the instance's `unicast_src`). A node that only takes part in the election
    /// (OpenShift's masters in the ingress instance, without a router) must not: `lo` would
    /// swallow its own traffic to the VIP. Without `unicast_src` or a `[[vips]]` entry, it does.
    pub fn backend_here(&self, r: &InstanceConfig, vip: IpAddr) -> bool {
        let Some(me) = r.unicast_src else {
            return true;
        };
        let entries: Vec<&VipConfig> = self
            .vips
            .iter()
            .filter(|v| v.address == vip && !v.backends.is_empty())
            .collect();
        entries.is_empty()
            || entries
                .iter()
                .any(|v| v.backends.iter().any(|b| b.address == me))
    }

    /// Every VIP service (address, port, protocol) this config defines, in config order.
    pub fn services(&self) -> Vec<(usize, u16)> {
        let mut out = Vec::new();
        for (i, v) in self.vips.iter().enumerate() {
            if v.ports.is_empty() {
                out.push((i, lb_common::ALL_PORTS));
            } else {
                out.extend(v.ports.iter().map(|p| (i, *p)));
            }
        }
        out
    }

    /// The VIPs with `announce = "bgp"`, in config order: what the `bgp` module needs of the
    /// config (it takes them as arguments and never reads a `Config`).
    pub fn bgp_vips(&self) -> Vec<bgp::BgpVip> {
        self.vips
            .iter()
            .filter(|v| v.announce == Announce::Bgp)
            .map(|v| bgp::BgpVip {
                name: v.name.clone(),
                address: v.address,
            })
            .collect()
    }

    /// The devices the XDP program attaches to: `xdp_interfaces`, or `interface`.
    pub fn attach_interfaces(&self) -> Vec<&str> {
        if self.xdp_interfaces.is_empty() {
            vec![self.interface.as_str()]
        } else {
            self.xdp_interfaces.iter().map(String::as_str).collect()
        }
    }
}

/// Every field's problems at once: an operator sees all that is wrong with a file in one run.
impl Validate for Config {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        if self.interface.is_empty() || self.interface.len() > 15 {
            errors.add("interface", "must be an interface name of 1-15 characters");
        }
        for (i, x) in self.xdp_interfaces.iter().enumerate() {
            if x.is_empty() || x.len() > 15 || x.contains(['/', ' ']) {
                errors.add(
                    format!("xdp_interfaces[{i}]"),
                    "must be an interface name of 1-15 characters",
                );
            }
            if self.xdp_interfaces[..i].contains(x) {
                errors.add(
                    format!("xdp_interfaces[{i}]"),
                    format!("{x:?} is named twice"),
                );
            }
        }
        if self.name.is_empty()
            || self.name.len() > 32
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            errors.add("name", "must be 1-32 characters of [A-Za-z0-9_-]");
        }
        if !is_prime(self.table_size) || self.table_size > MAX_TABLE_SIZE {
            errors.add(
                "table_size",
                format!(
                    "must be a prime <= {MAX_TABLE_SIZE}, got {}",
                    self.table_size
                ),
            );
        }
        if let Some(s) = &self.sync {
            errors.within("sync", s);
            s.fits(self.conntrack_size, errors);
        }
        if let Some(t) = &self.metrics_tls {
            errors.within("metrics_tls", t);
        }
        if let Some(m) = &self.members {
            errors.within("members", m);
        }
        if self.conntrack_size < 1024 {
            errors.add("conntrack_size", "must be at least 1024");
        }
        if self.failed_backend_hold_ms > 600_000 {
            errors.add(
                "failed_backend_hold_ms",
                format!(
                    "must be at most 600000 (ten minutes), got {}",
                    self.failed_backend_hold_ms
                ),
            );
        }
        if self.vrrp_rt_priority > MAX_RT_PRIORITY {
            errors.add(
                "vrrp_rt_priority",
                format!(
                    "must be 0 (normal scheduling) or a real-time priority 1..={}, got {}",
                    MAX_RT_PRIORITY, self.vrrp_rt_priority
                ),
            );
        }
        if self.handover_grace_ms > 60_000 {
            errors.add(
                "handover_grace_ms",
                format!(
                    "must be at most 60000 (a minute), got {}",
                    self.handover_grace_ms
                ),
            );
        }
        let services = self.services();
        if services.len() > lb_common::MAX_VIPS as usize {
            errors.add(
                "vips",
                format!(
                    "{} services (address, port) exceed the limit of {}",
                    services.len(),
                    lb_common::MAX_VIPS
                ),
            );
        }
        let mut names = HashSet::new();
        let mut keys = HashSet::new();
        let mut pairs = 0usize;
        for (i, v) in self.vips.iter().enumerate() {
            let f = format!("vips[{i}]");
            if v.name.is_empty() || !names.insert(v.name.as_str()) {
                errors.add(format!("{f}.name"), "must be non-empty and unique");
            }
            if v.address.is_unspecified() || v.address.is_multicast() {
                errors.add(format!("{f}.address"), "must be a unicast address");
            }
            let ports: Vec<u16> = if v.ports.is_empty() {
                vec![0]
            } else {
                v.ports.clone()
            };
            for (j, p) in v.ports.iter().enumerate() {
                if *p == 0 {
                    errors.add(
                        format!("{f}.ports[{j}]"),
                        "0 is not a port; leave `ports` empty for all ports",
                    );
                }
            }
            for p in ports {
                if !keys.insert((v.address, p, v.protocol)) {
                    errors.add(
                        f.to_string(),
                        format!(
                            "{} port {p} {} is defined twice",
                            v.address,
                            v.protocol.name()
                        ),
                    );
                }
            }
            if let Some(name) = &v.vrrp
                && !self.vrrp.iter().any(|r| &r.name == name)
            {
                errors.add(
                    format!("{f}.vrrp"),
                    format!("no VRRP instance named {name:?}"),
                );
            }
            errors.within(&format!("{f}.health"), &v.health);
            if v.health.kind != health::CheckKind::None
                && v.health.port.is_none()
                && v.ports.is_empty()
            {
                errors.add(
                    format!("{f}.health.port"),
                    "required when the VIP serves all ports (which port should be checked?)",
                );
            }
            if v.name.contains('/') {
                errors.add(format!("{f}.name"), "must not contain '/'");
            }
            if v.name == RESERVED_VIP_NAME {
                errors.add(
                    format!("{f}.name"),
                    format!(
                        "{RESERVED_VIP_NAME:?} is reserved for tracked checks; pick another name"
                    ),
                );
            }
            self.validate_ownership(i, v, errors);
            let mut seen = HashSet::new();
            for (j, b) in v.backends.iter().enumerate() {
                let bf = format!("{f}.backends[{j}]");
                if b.address.is_ipv4() != v.address.is_ipv4() {
                    errors.add(
                        format!("{bf}.address"),
                        "must be the same address family as the VIP (L2 DSR does not translate)",
                    );
                }
                if b.address.is_unspecified() || b.address.is_multicast() {
                    errors.add(format!("{bf}.address"), "must be a unicast address");
                }
                if !seen.insert(b.address) {
                    errors.add(format!("{bf}.address"), "listed twice");
                }
                if b.weight > MAX_WEIGHT {
                    errors.add(
                        format!("{bf}.weight"),
                        format!("must be 0..={MAX_WEIGHT}, got {}", b.weight),
                    );
                }
            }
            if (self.table_size as usize) < v.backends.len() * 10 {
                errors.add(
                    "table_size",
                    format!(
                        "must be at least 10x the backends of {f} ({})",
                        v.backends.len()
                    ),
                );
            }
            pairs += v.backends.len() * v.ports.len().max(1);
        }
        if pairs > lb_common::MAX_BACKENDS as usize {
            errors.add(
                "vips",
                format!(
                    "{pairs} (service, backend) pairs exceed {}",
                    lb_common::MAX_BACKENDS
                ),
            );
        }
        let mut vrrp_names = HashSet::new();
        let mut vrids = HashSet::new();
        for (i, r) in self.vrrp.iter().enumerate() {
            if !vrrp_names.insert(r.name.as_str()) {
                errors.add(format!("vrrp[{i}].name"), "must be unique");
            }
            errors.within(&format!("vrrp[{i}]"), r);
            // One address, one election: when one instance goes backup it would delete the
            // address the other holds as master.
            for (j, vip) in r.vips.iter().enumerate() {
                if let Some(other) = self.vrrp[..i].iter().find(|o| o.vips.contains(vip)) {
                    errors.add(
                        format!("vrrp[{i}].vips[{j}]"),
                        format!(
                            "{vip} is also a VIP of instance {:?}: each VIP belongs to one instance",
                            other.name
                        ),
                    );
                }
            }
            let family = r.vips.first().map(|a| a.is_ipv4());
            let iface = r.interface.as_deref().unwrap_or(&self.interface);
            if !vrids.insert((iface.to_string(), r.vrid, family)) {
                errors.add(
                    format!("vrrp[{i}].vrid"),
                    format!("VRID {} is used twice on {iface}", r.vrid),
                );
            }
        }
        self.validate_groups(errors);
        for (i, v) in self.vips.iter().enumerate() {
            if let Some(name) = &v.vrrp
                && let Some(r) = self.vrrp.iter().find(|r| &r.name == name)
                && !r.vips.contains(&v.address)
            {
                errors.add(
                    format!("vips[{i}].vrrp"),
                    format!("instance {name:?} does not list {} in its vips", v.address),
                );
            }
        }
        self.validate_bgp(errors);
        let mut track_names = HashSet::new();
        for (i, t) in self.track.iter().enumerate() {
            let f = format!("track[{i}]");
            if !self.vrrp.iter().any(|r| r.name == t.instance) {
                errors.add(
                    format!("{f}.instance"),
                    format!("no VRRP instance named {:?}", t.instance),
                );
            }
            if t.name.is_empty() || t.name.contains('/') || !track_names.insert(t.name.as_str()) {
                errors.add(
                    format!("{f}.name"),
                    "must be non-empty, unique and without '/'",
                );
            }
            if !(-254..=254).contains(&t.weight) {
                errors.add(
                    format!("{f}.weight"),
                    format!("must be -254..=254, got {}", t.weight),
                );
            }
            if t.address.is_some() {
                errors.within(&format!("{f}.health"), &t.health);
            } else if t.or_lb_ready {
                errors.add(
                    format!("{f}.or_lb_ready"),
                    "needs an address: a track without one is the load balancer's readiness already",
                );
            }
        }
    }
}

impl Config {
    /// A group (see lb-userspace's `vrrp::group`) has at least two members with one priority and
    /// one preemption: the members' elections must rank the nodes alike.
    fn validate_groups(&self, errors: &mut ConfigErrors) {
        for (i, r) in self.vrrp.iter().enumerate() {
            let Some(g) = &r.group else { continue };
            let mut members = self.vrrp.iter().filter(|o| o.group.as_ref() == Some(g));
            let first = members.next().expect("r is a member");
            if members.next().is_none() {
                errors.add(
                    format!("vrrp[{i}].group"),
                    format!(
                        "group {g:?} has only this instance: instances move together with others of the same group"
                    ),
                );
            }
            if r.priority != first.priority {
                errors.add(
                    format!("vrrp[{i}].priority"),
                    format!(
                        "{} differs from {} of {:?}, the first instance of group {g:?}: members need one priority",
                        r.priority, first.priority, first.name
                    ),
                );
            }
            if r.preempt != first.preempt {
                errors.add(
                    format!("vrrp[{i}].preempt"),
                    format!(
                        "differs from {:?}, the first instance of group {g:?}",
                        first.name
                    ),
                );
            }
        }
    }
}

/// Tracked checks' ids start with this; a VIP of that name would share their id space.
pub const RESERVED_VIP_NAME: &str = "track";

impl Config {
    /// Who holds VIP `i`: exactly one of `vrrp`, `owned = true` or `announce = "bgp"`.
    fn validate_ownership(&self, i: usize, v: &VipConfig, errors: &mut ConfigErrors) {
        let f = format!("vips[{i}]");
        let bgp = v.announce == Announce::Bgp;
        if v.held_statically() && (v.vrrp.is_some() || bgp) {
            errors.add(
                format!("{f}.owned"),
                if bgp {
                    "a BGP VIP is forwarded by every ready node; remove `owned`"
                } else {
                    "a VIP is either elected by VRRP (`vrrp`) or held statically (`owned = true`), not both"
                },
            );
        }
        if v.vrrp.is_none() && v.owned.is_none() && !bgp {
            errors.add(
                &f,
                format!(
                    "{}: who holds it? Set `vrrp = \"<instance>\"` to have a VRRP instance elect one node, `owned = true` to hold it on this node statically (every node given this config holds it), `owned = false` if this node never holds it, or `announce = \"bgp\"`",
                    v.address
                ),
            );
        }
        if v.held_statically()
            && let Some(r) = self.vrrp.iter().find(|r| r.vips.contains(&v.address))
        {
            errors.add(
                format!("{f}.owned"),
                format!(
                    "{} is a VIP of VRRP instance {:?}: it cannot also be held statically",
                    v.address, r.name
                ),
            );
        }
    }

    fn validate_bgp(&self, errors: &mut ConfigErrors) {
        if self.bgp.len() > 1 {
            errors.add(
                "bgp[1]",
                "only one [[bgp]] section: one routing daemon, one local AS per node",
            );
        }
        for (i, b) in self.bgp.iter().enumerate() {
            errors.within(&format!("bgp[{i}]"), b);
        }
        for (i, v) in self.vips.iter().enumerate() {
            if v.announce != Announce::Bgp {
                continue;
            }
            if self.bgp.is_empty() {
                errors.add(
                    format!("vips[{i}].announce"),
                    "\"bgp\" needs a [[bgp]] section (local ASN and peers)",
                );
            }
            if v.vrrp.is_some() {
                errors.add(
                    format!("vips[{i}].announce"),
                    "a VIP is either announced over BGP or elected by VRRP, not both (remove `vrrp`)",
                );
            }
            // Its blackhole host route would swallow the session to that peer (or this node's
            // own traffic).
            for b in &self.bgp {
                if let Some(p) = b.peers.iter().find(|p| p.address == v.address) {
                    errors.add(
                        format!("vips[{i}].address"),
                        format!(
                            "{} is the address of BGP peer {}: its host route would cut the session",
                            v.address, p.address
                        ),
                    );
                }
                if b.router_id.is_some_and(|id| IpAddr::V4(id) == v.address) {
                    errors.add(
                        format!("vips[{i}].address"),
                        format!("{} is this node's BGP router id", v.address),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
interface = "eth0"
[[vips]]
name = "api"
address = "192.168.111.5"
ports = [6443, 22623]
owned = true
[[vips.backends]]
address = "192.168.111.20"
[[vips.backends]]
address = "192.168.111.21"
weight = 2
"#;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn every_problem_of_a_file_is_reported_each_by_its_field() {
        // Five independent mistakes in five parts (top level, the sync section, a VIP's health
        // table, its backend, a VRRP instance): all named in one refusal.
        let text = format!(
            "table_size = 65536\n{}[[vrrp]]\nname = \"v\"\nvrid = 0\nvips = [\"192.168.111.9\"]\n[sync]\npeers = []\nkey_file = \"/k\"\n",
            GOOD.replace("weight = 2", "weight = 5000").replace(
                "owned = true\n",
                "owned = true\nhealth = { interval_ms = 1, timeout_ms = 1 }\n"
            )
        );
        let e = Config::parse(&text).unwrap_err();
        assert_eq!(
            e.fields(),
            [
                "table_size",
                "sync.peers",
                "vips[0].health.interval_ms",
                "vips[0].backends[1].weight",
                "vrrp[0].vrid",
            ],
            "{e}"
        );
        assert_eq!(e.to_string().lines().count(), 5, "{e}");
        // One mistake reads as before: `field: reason`.
        let one = err(&GOOD.replace("weight = 2", "weight = 5000"));
        assert_eq!(
            one,
            "vips[0].backends[1].weight: must be 0..=1000, got 5000"
        );
    }

    #[test]
    fn a_health_array_is_refused_naming_the_field() {
        let e = err(&GOOD.replace("owned = true\n", "owned = true\nhealth = []\n"));
        assert!(e.contains("vips[0].health"), "{e}");
        assert!(e.contains("health table"), "{e}");
        // A table (inline or not) still reads, with defaults for what it leaves out.
        let c = Config::parse(&GOOD.replace(
            "owned = true\n",
            "owned = true\nhealth = { kind = \"tcp\" }\n",
        ))
        .unwrap();
        assert_eq!(c.vips[0].health.kind, health::CheckKind::Tcp);
        assert_eq!(c.vips[0].health.interval_ms, 200);
        let track = format!(
            "{GOOD}[[vrrp]]\nname = \"a\"\nvrid = 5\nvips = [\"192.168.111.9\"]\n[[track]]\ninstance = \"a\"\nname = \"t\"\nweight = 10\nhealth = []\n"
        );
        let e = err(&track);
        assert!(e.contains("track[0].health"), "{e}");
    }

    #[test]
    fn groups_need_two_members_of_one_priority() {
        let two = |a: &str, b: &str| {
            format!(
                "{GOOD}[[vrrp]]\nname = \"a\"\nvrid = 5\nvips = [\"192.168.111.9\"]\n{a}\n[[vrrp]]\nname = \"b\"\nvrid = 5\nvips = [\"fd00::9\"]\n{b}\n"
            )
        };
        let c = Config::parse(&two("group = \"api\"", "group = \"api\"")).unwrap();
        assert_eq!(c.vrrp[1].group.as_deref(), Some("api"));
        let e = err(&two("group = \"api\"", ""));
        assert!(
            e.starts_with("vrrp[0].group:") && e.contains("only this instance"),
            "{e}"
        );
        let e = err(&two("group = \"api\"", "group = \"api\"\npriority = 50"));
        assert!(e.starts_with("vrrp[1].priority:"), "{e}");
        let e = err(&two("group = \"api\"", "group = \"api\"\npreempt = false"));
        assert!(e.starts_with("vrrp[1].preempt:"), "{e}");
        let e = err(&two("group = \"\"", "group = \"\""));
        assert!(e.starts_with("vrrp[0].group:"), "{e}");
    }

    #[test]
    fn parses_a_good_config_with_defaults() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.table_size, 65537);
        assert_eq!(c.vips[0].protocol, Protocol::Tcp);
        assert!(c.vips[0].held_statically());
        assert_eq!(c.vips[0].backends[1].weight, 2);
        assert_eq!(c.services(), vec![(0, 6443), (0, 22623)]);
        assert_eq!(c.handover_grace_ms, 2000);
        assert_eq!(c.syn_flood_rate, lb_common::DEFAULT_SYN_FLOOD_RATE);
    }

    #[test]
    fn routed_backends_and_their_decap_health_port() {
        let c = Config::parse(&GOOD.replace(
            "weight = 2",
            "weight = 2\nencap = \"ipip\"\ndecap_health_port = 4000",
        ))
        .unwrap();
        let b = &c.vips[0].backends;
        assert_eq!(
            (b[0].encap, b[0].decap_health_port),
            (EncapMode::None, 1938)
        );
        assert_eq!(
            (b[1].encap, b[1].decap_health_port),
            (EncapMode::Ipip, 4000)
        );
        let e = err(&GOOD.replace("weight = 2", "weight = 2\nencap = \"gre\""));
        assert!(e.starts_with("vips[0].backends[1].encap:"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = err(&GOOD.replace("weight = 2", "weight = 5000"));
        assert!(e.starts_with("vips[0].backends[1].weight:"), "{e}");
        let e = err(&format!("table_size = 65536\n{GOOD}"));
        assert!(e.starts_with("table_size:"), "{e}");
        let e = err(&GOOD.replace("192.168.111.21", "fd00::21"));
        assert!(e.contains("vips[0].backends[1].address"), "{e}");
        let e = err(&GOOD.replace("192.168.111.21", "192.168.111.20"));
        assert!(e.contains("listed twice"), "{e}");
        let e = err(&GOOD.replace("ports = [6443, 22623]", "ports = [0]"));
        assert!(e.starts_with("vips[0].ports[0]:"), "{e}");
        let e = err(&GOOD.replace("name = \"api\"", "name = \"api\"\nvrrp = \"nope\""));
        assert!(e.starts_with("vips[0].vrrp:"), "{e}");
        assert_eq!(
            Config::parse(GOOD).unwrap().vrrp_rt_priority,
            DEFAULT_RT_PRIORITY
        );
        let e = err(&format!("vrrp_rt_priority = 100\n{GOOD}"));
        assert!(e.starts_with("vrrp_rt_priority:"), "{e}");
        for ok in [0, 1, 99] {
            let c = Config::parse(&format!("vrrp_rt_priority = {ok}\n{GOOD}")).unwrap();
            assert_eq!(c.vrrp_rt_priority, ok);
        }
        let e = err(&format!("handover_grace_ms = 600000\n{GOOD}"));
        assert!(e.starts_with("handover_grace_ms:"), "{e}");
        assert!(Config::parse(&format!("handover_grace_ms = 0\n{GOOD}")).is_ok());
    }

    #[test]
    fn who_holds_a_vip_is_written_out() {
        // Neither `vrrp` nor `owned`: refused, with how to choose.
        let e = err(&GOOD.replace("owned = true\n", ""));
        assert!(e.starts_with("vips[0]:"), "{e}");
        assert!(
            e.contains("owned = true") && e.contains("vrrp = "),
            "says how to choose: {e}"
        );
        // `owned = false` written out: a VIP this node never holds (socket load balancing or
        // backend only) is a choice, not a forgotten line.
        let c = Config::parse(&GOOD.replace("owned = true", "owned = false")).unwrap();
        assert!(!c.vips[0].held_statically());
        // Both: refused.
        let both = format!(
            "{}\n[[vrrp]]\nname = \"v\"\nvrid = 5\nvips = [\"192.168.111.5\"]\n",
            GOOD.replace("owned = true", "owned = true\nvrrp = \"v\"")
        );
        let e = err(&both);
        assert!(e.starts_with("vips[0].owned:"), "{e}");
        // Static at one port, elected at another: one address, two holders.
        let split = format!(
            "{GOOD}[[vips]]\nname = \"api2\"\naddress = \"192.168.111.5\"\nports = [80]\nvrrp = \"v\"\n[[vrrp]]\nname = \"v\"\nvrid = 5\nvips = [\"192.168.111.5\"]\n"
        );
        let e = err(&split);
        assert!(e.starts_with("vips[0].owned:"), "{e}");
    }

    #[test]
    fn one_vip_one_vrrp_instance() {
        let text = format!(
            "{GOOD}[[vrrp]]\nname = \"a\"\nvrid = 5\nvips = [\"192.168.111.9\"]\n[[vrrp]]\nname = \"b\"\nvrid = 6\nvips = [\"192.168.111.8\", \"192.168.111.9\"]\n"
        );
        let e = err(&text);
        assert!(e.starts_with("vrrp[1].vips[1]:"), "{e}");
        assert!(e.contains("\"a\""), "{e}");
        assert!(
            Config::parse(
                &text.replace("\"192.168.111.8\", \"192.168.111.9\"", "\"192.168.111.8\"")
            )
            .is_ok()
        );
    }

    #[test]
    fn the_vip_name_track_is_reserved() {
        let e = err(&GOOD.replace("name = \"api\"", "name = \"track\""));
        assert!(e.starts_with("vips[0].name:"), "{e}");
        assert!(e.contains("reserved"), "{e}");
    }

    fn host(
        entries: &[(&str, &str, u8, Option<&str>, bool)],
    ) -> Vec<(String, crate::net::ListedAddr)> {
        entries
            .iter()
            .map(|(i, a, p, l, nodad)| {
                (
                    i.to_string(),
                    crate::net::ListedAddr {
                        addr: a.parse().unwrap(),
                        prefix_len: *p,
                        label: l.map(str::to_string),
                        nodad: *nodad,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_vip_equal_to_a_node_address_is_refused() {
        let c = Config::parse(GOOD).unwrap();
        let node = host(&[("eth0", "192.168.111.5", 24, Some("eth0"), false)]);
        let e = c.check_host(&node).unwrap_err().to_string();
        assert!(e.starts_with("vips[0].address:"), "{e}");
        assert!(e.contains("eth0"), "{e}");
        // The same address as lbd's own labelled /32 (held since before a restart): fine.
        let ours = host(&[
            ("eth0", "192.168.111.20", 24, Some("eth0"), false),
            ("eth0", "192.168.111.5", 32, Some("eth0:lbvip"), false),
        ]);
        c.check_host(&ours).unwrap();
        // Another interface's address is not this interface's.
        c.check_host(&host(&[("eth1", "192.168.111.5", 24, Some("eth1"), false)]))
            .unwrap();
        // A VRRP VIP, IPv6, on the instance's interface.
        let v6 = Config::parse(
            "interface = \"eth0\"\n[[vips]]\nname = \"a\"\naddress = \"fd00::5\"\nports = [80]\nvrrp = \"v\"\n[[vrrp]]\nname = \"v\"\nvrid = 5\ninterface = \"br0\"\nvips = [\"fd00::5\"]\n",
        )
        .unwrap();
        let e = v6
            .check_host(&host(&[("br0", "fd00::5", 64, None, false)]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("vips[0].address:"), "{e}");
        v6.check_host(&host(&[("br0", "fd00::5", 128, None, true)]))
            .unwrap();
        v6.check_host(&host(&[("eth0", "fd00::5", 64, None, false)]))
            .unwrap();
    }

    #[test]
    fn shipped_examples_are_valid() {
        for (name, text) in [
            (
                "control-plane",
                include_str!("../../../deploy/examples/control-plane.toml"),
            ),
            (
                "worker",
                include_str!("../../../deploy/examples/worker.toml"),
            ),
        ] {
            let c = Config::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.vrrp.len(), 1, "{name}");
            assert!(c.vips[0].vrrp.is_some(), "{name}");
        }
    }

    #[test]
    fn unknown_fields_and_type_errors_are_refused() {
        let e = err(&GOOD.replace("weight = 2", "wieght = 2"));
        assert!(e.contains("wieght"), "{e}");
        let e = err(&GOOD.replace("\"192.168.111.5\"", "\"not-an-ip\""));
        assert!(e.starts_with("vips[0].address:"), "{e}");
        let e = err(&GOOD.replace("weight = 2", "weight = \"2\""));
        assert!(e.starts_with("vips[0].backends[1].weight:"), "{e}");
        let e = err(&GOOD.replace("ports = [6443, 22623]", "ports = [6443, 70000]"));
        assert!(e.starts_with("vips[0].ports[1]:"), "{e}");
        let e = err(&format!("xdp_mode = \"fast\"\n{GOOD}"));
        assert!(e.starts_with("xdp_mode:"), "{e}");
        let e = err(&format!("xdp_interfaces = [\"eth0\", \"\"]\n{GOOD}"));
        assert!(e.starts_with("xdp_interfaces[1]:"), "{e}");
        let e = err(&format!("xdp_interfaces = [\"eth0\", \"eth0\"]\n{GOOD}"));
        assert!(e.starts_with("xdp_interfaces[1]:"), "{e}");
    }
}
