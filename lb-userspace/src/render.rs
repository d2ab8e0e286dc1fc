//! From one cluster description to every node's `lbd.toml` (`lbctl render`). Pure.
//!
//! OpenShift renders keepalived.conf and haproxy.cfg on each node from the install config
//! (baremetal-runtimecfg): the VRIDs come from the cluster name, the unicast peers from the
//! other nodes, priorities and tracked checks are fixed per role. This module does the same for
//! lb, so an operator writes the cluster once and every node gets a config that agrees with its
//! peers (same VRIDs, same hash seed, same backend lists, peers that list each other).
//!
//! Roles, as on OpenShift:
//! - `control-plane` (alias `master`): the API VIP (6443 and 22623 by default), backends are
//!   the control-plane nodes, VRRP priority 40, +20 while this node's load balancer has an
//!   active backend, +5 while the local kube-apiserver is ready, +3 while the local
//!   machine-config server accepts connections (when 22623 is served).
//! - `worker`: the ingress VIP (80 and 443), backends are the nodes that run routers (workers;
//!   on a compact cluster, the control-plane nodes that are also workers), priority 20, +50
//!   while the local router's /healthz on 1936 answers.
//!
//! A node with both roles (compact three-node clusters) gets one config with both VIPs and
//! both VRRP instances: one lbd, one XDP attach, one API socket.
//!
//! Every rendered config passes [`Config::validate`]; errors name the field of the cluster
//! description (`nodes[2].address: ...`) or, for a rendered node, the node and the field of its
//! config, in the same `field: reason` form as lbd's own config errors.

use std::{collections::HashSet, net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    config::{BackendConfig, Config, ConfigError, TrackConfig, VipConfig, XdpMode, from_toml},
    health::{CheckKind, HealthConfig},
    vrrp::{InstanceConfig, vrids::openshift_vrids},
};

/// The cluster description (`cluster.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// The cluster's name (metadata.name of the install config): the VRIDs derive from it.
    pub name: String,
    /// Interface the VIPs live on (OpenShift: `br-ex`).
    pub interface: String,
    pub api_vip: IpAddr,
    #[serde(default)]
    pub ingress_vip: Option<IpAddr>,
    #[serde(default = "default_api_ports")]
    pub api_ports: Vec<u16>,
    #[serde(default = "default_ingress_ports")]
    pub ingress_ports: Vec<u16>,
    /// 3 (default: centisecond adverts, sub-second failover) or 2 while keepalived nodes are
    /// still in the cluster (IPv4 only; OpenShift's PASS authentication and 1 s adverts).
    #[serde(default = "default_version")]
    pub vrrp_version: u8,
    /// Default: 100 ms with VRRPv3, 1000 ms with VRRPv2 (keepalived's `advert_int 1`).
    #[serde(default)]
    pub advert_interval_ms: Option<u32>,
    /// Fast failover, for clusters that run lb on every node: VRRPv3 adverts every
    /// `FAST_ADVERT_INTERVAL_MS` (20 ms), so a new owner answers within about 100 ms of the
    /// old one's death. Needs `vrrp_version = 3` and no `advert_interval_ms`.
    #[serde(default)]
    pub fast_failover: bool,
    /// Override the VRIDs derived from the cluster name (`[api, ingress]`).
    #[serde(default)]
    pub vrids: Option<[u8; 2]>,
    #[serde(default)]
    pub xdp_mode: XdpMode,
    /// Pin directory name under /sys/fs/bpf on every node.
    #[serde(default = "default_lb_name")]
    pub lb_name: String,
    #[serde(default = "default_socket")]
    pub api_socket: PathBuf,
    /// Probes and Prometheus (the manifests' probes and ServiceMonitor use it).
    #[serde(default = "default_metrics")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub nodes: Vec<NodeSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    /// The node's address on `interface` (OpenShift: the node's InternalIP).
    pub address: IpAddr,
    pub roles: Vec<Role>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    #[serde(alias = "master")]
    ControlPlane,
    Worker,
}

fn default_api_ports() -> Vec<u16> {
    vec![6443, 22623]
}
fn default_ingress_ports() -> Vec<u16> {
    vec![80, 443]
}
fn default_version() -> u8 {
    3
}
fn default_lb_name() -> String {
    "lb".into()
}
fn default_socket() -> PathBuf {
    "/run/lbd/lbd.sock".into()
}
fn default_metrics() -> Option<std::net::SocketAddr> {
    Some(([127, 0, 0, 1], 9444).into())
}

/// OpenShift's keepalived priorities and tracked-check weights.
pub const API_PRIORITY: u8 = 40;
pub const INGRESS_PRIORITY: u8 = 20;
const MCS_PORT: u16 = 22623;

/// One node's rendered config.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub node: String,
    pub config: Config,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl ClusterSpec {
    pub fn parse(text: &str) -> Result<ClusterSpec, ConfigError> {
        let spec: ClusterSpec = from_toml(text)?;
        spec.validate()?;
        Ok(spec)
    }

    pub fn load(path: &std::path::Path) -> Result<ClusterSpec, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::parse(&text)
    }

    fn has(&self, role: Role) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(move |n| n.roles.contains(&role))
    }

    /// Nodes that run routers: the workers. A compact cluster's nodes have both roles.
    fn routers(&self) -> Vec<&NodeSpec> {
        self.has(Role::Worker).collect()
    }

    /// What the description itself must satisfy; the rendered configs are checked after.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(invalid(
                "name",
                "must not be empty (the VRIDs derive from it)",
            ));
        }
        if !matches!(self.vrrp_version, 2 | 3) {
            return Err(invalid(
                "vrrp_version",
                format!("must be 2 or 3, got {}", self.vrrp_version),
            ));
        }
        if self.vrrp_version == 2 && self.api_vip.is_ipv6() {
            return Err(invalid("vrrp_version", "VRRPv2 is IPv4 only; use 3"));
        }
        if self.fast_failover && self.vrrp_version != 3 {
            return Err(invalid(
                "fast_failover",
                "needs vrrp_version = 3: keepalived nodes still in the cluster (VRRPv2) advertise every second",
            ));
        }
        if self.fast_failover && self.advert_interval_ms.is_some() {
            return Err(invalid(
                "fast_failover",
                "sets the advert interval itself: remove advert_interval_ms",
            ));
        }
        if let Some(ing) = self.ingress_vip {
            if ing.is_ipv4() != self.api_vip.is_ipv4() {
                return Err(invalid(
                    "ingress_vip",
                    "must be the same address family as api_vip",
                ));
            }
            if ing == self.api_vip {
                return Err(invalid("ingress_vip", "must differ from api_vip"));
            }
        }
        if let Some([a, i]) = self.vrids
            && (a == 0 || i == 0 || a == i)
        {
            return Err(invalid("vrids", "two different VRIDs in 1..=255"));
        }
        if self.nodes.is_empty() {
            return Err(invalid("nodes", "at least one node"));
        }
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let f = format!("nodes[{i}]");
            if n.name.is_empty() || !names.insert(n.name.as_str()) {
                return Err(invalid(format!("{f}.name"), "must be non-empty and unique"));
            }
            if n.name.contains('/') || n.name.starts_with('.') {
                return Err(invalid(
                    format!("{f}.name"),
                    "is a file name: no '/' and no leading '.'",
                ));
            }
            if !addrs.insert(n.address) {
                return Err(invalid(format!("{f}.address"), "used by two nodes"));
            }
            if n.address.is_ipv4() != self.api_vip.is_ipv4() {
                return Err(invalid(
                    format!("{f}.address"),
                    "must be the same address family as api_vip (unicast VRRP peers, L2 DSR)",
                ));
            }
            if n.address == self.api_vip || Some(n.address) == self.ingress_vip {
                return Err(invalid(format!("{f}.address"), "is a VIP"));
            }
            if n.roles.is_empty() {
                return Err(invalid(
                    format!("{f}.roles"),
                    "at least one of \"control-plane\", \"worker\"",
                ));
            }
        }
        if self.has(Role::ControlPlane).next().is_none() {
            return Err(invalid(
                "nodes",
                "no node has the control-plane role (the API VIP needs one)",
            ));
        }
        if self.ingress_vip.is_some() && self.routers().is_empty() {
            return Err(invalid(
                "nodes",
                "ingress_vip is set but no node has the worker role (routers)",
            ));
        }
        Ok(())
    }

    /// `(api, ingress)` VRIDs: OpenShift's, from the cluster name, unless overridden.
    pub fn vrids(&self) -> (u8, u8) {
        match self.vrids {
            Some([a, i]) => (a, i),
            None => openshift_vrids(&self.name),
        }
    }

    /// Every node's config, in the order of `nodes`; each one validated as lbd would.
    pub fn render(&self) -> Result<Vec<Rendered>, ConfigError> {
        self.validate()?;
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let config = self.node_config(n);
            config.validate().map_err(|e| match e {
                ConfigError::Invalid { field, reason } => {
                    invalid(format!("nodes[{i}] ({}): {field}", n.name), reason)
                }
                other => invalid(format!("nodes[{i}] ({})", n.name), other.to_string()),
            })?;
            out.push(Rendered {
                node: n.name.clone(),
                config,
            });
        }
        Ok(out)
    }

    fn instance(
        &self,
        name: &str,
        vrid: u8,
        priority: u8,
        vip: IpAddr,
        me: &NodeSpec,
        group: &[&NodeSpec],
    ) -> InstanceConfig {
        let v2 = self.vrrp_version == 2;
        InstanceConfig {
            name: name.into(),
            interface: None,
            vrid,
            version: self.vrrp_version,
            priority,
            advert_interval_ms: Some(self.advert_interval_ms.unwrap_or(if v2 {
                1000
            } else if self.fast_failover {
                crate::vrrp::config::FAST_ADVERT_INTERVAL_MS
            } else {
                100
            })),
            // OpenShift renders `<cluster>_<name>_vip`; keepalived sends its first 8 bytes,
            // which is what a mixed keepalived/lb instance must agree on.
            auth_pass: v2.then(|| {
                let full = format!("{}_{name}_vip", self.name);
                truncate_bytes(&full, 8).to_string()
            }),
            preempt: true,
            preempt_delay_ms: 0,
            unicast_src: Some(me.address),
            unicast_peers: group
                .iter()
                .filter(|p| p.name != me.name)
                .map(|p| p.address)
                .collect(),
            check_unicast_src: true,
            unicast_peer_ttl: Vec::new(),
            garp_master_delay_s: 5,
            v2_compat: false,
            vips: vec![vip],
            garp_refresh_s: 60,
        }
    }

    fn node_config(&self, me: &NodeSpec) -> Config {
        let (api_vrid, ingress_vrid) = self.vrids();
        let mut cfg = Config {
            interface: self.interface.clone(),
            name: self.lb_name.clone(),
            api_socket: self.api_socket.clone(),
            metrics_listen: self.metrics_listen,
            xdp_mode: self.xdp_mode,
            hash_seed: crate::config::DEFAULT_HASH_SEED,
            table_size: lb_common::DEFAULT_TABLE_SIZE,
            conntrack_size: lb_common::DEFAULT_CONNTRACK_SIZE,
            vips: Vec::new(),
            vrrp: Vec::new(),
            track: Vec::new(),
            dsr_backend: true,
            handover_grace_ms: crate::handover::DEFAULT_GRACE.as_millis() as u64,
            syn_flood_rate: lb_common::DEFAULT_SYN_FLOOD_RATE,
            bgp: Vec::new(),
            failed_backend_hold_ms: crate::config::DEFAULT_FAILED_BACKEND_HOLD_MS,
            socket_lb: true,
        };
        // A tracked check of a local port, or (None) of the load balancer's own readiness.
        let track =
            |instance: &str, name: &str, weight: i32, check: Option<(u16, CheckKind, &str)>| {
                let mut t = TrackConfig {
                    instance: instance.into(),
                    name: name.into(),
                    weight,
                    address: None,
                    health: HealthConfig::default(),
                };
                if let Some((port, kind, path)) = check {
                    t.address = Some(std::net::SocketAddr::new(loopback(self.api_vip), port));
                    t.health.kind = kind;
                    t.health.path = path.into();
                }
                t
            };
        if me.roles.contains(&Role::ControlPlane) {
            let group: Vec<&NodeSpec> = self.has(Role::ControlPlane).collect();
            cfg.vips.push(VipConfig {
                announce: crate::config::Announce::Owner,
                name: "api".into(),
                address: self.api_vip,
                ports: self.api_ports.clone(),
                protocol: crate::config::Protocol::Tcp,
                owned: None,
                vrrp: Some("api".into()),
                health: HealthConfig {
                    kind: CheckKind::Https,
                    path: "/readyz".into(),
                    port: Some(6443),
                    ..HealthConfig::default()
                },
                backends: group.iter().map(|n| backend(n.address)).collect(),
            });
            cfg.vrrp
                .push(self.instance("api", api_vrid, API_PRIORITY, self.api_vip, me, &group));
            cfg.track.push(track("api", "lb-ready", 20, None));
            cfg.track.push(track(
                "api",
                "local-apiserver",
                5,
                Some((6443, CheckKind::Https, "/readyz")),
            ));
            if self.api_ports.contains(&MCS_PORT) {
                cfg.track.push(track(
                    "api",
                    "local-mcs",
                    3,
                    Some((MCS_PORT, CheckKind::Tcp, "")),
                ));
            }
        }
        if let Some(vip) = self.ingress_vip
            && me.roles.contains(&Role::Worker)
        {
            let group = self.routers();
            cfg.vips.push(VipConfig {
                announce: crate::config::Announce::Owner,
                name: "ingress".into(),
                address: vip,
                ports: self.ingress_ports.clone(),
                protocol: crate::config::Protocol::Tcp,
                owned: None,
                vrrp: Some("ingress".into()),
                health: HealthConfig {
                    kind: CheckKind::Http,
                    path: "/healthz".into(),
                    port: Some(1936),
                    ..HealthConfig::default()
                },
                backends: group.iter().map(|n| backend(n.address)).collect(),
            });
            cfg.vrrp.push(self.instance(
                "ingress",
                ingress_vrid,
                INGRESS_PRIORITY,
                vip,
                me,
                &group,
            ));
            cfg.track.push(track(
                "ingress",
                "local-router",
                50,
                Some((1936, CheckKind::Http, "/healthz")),
            ));
        }
        cfg
    }
}

fn backend(address: IpAddr) -> BackendConfig {
    BackendConfig {
        address,
        weight: 1,
        encap: Default::default(),
        decap_health_port: crate::config::DEFAULT_DECAP_HEALTH_PORT,
    }
}

fn loopback(family_of: IpAddr) -> IpAddr {
    if family_of.is_ipv4() {
        std::net::Ipv4Addr::LOCALHOST.into()
    } else {
        std::net::Ipv6Addr::LOCALHOST.into()
    }
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character boundary.
fn truncate_bytes(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The config this node runs when `path` is a directory of rendered configs (a MachineConfig
/// ships every node's to every node of a pool): the one whose VRRP source address is an
/// address of this host. Exactly one must match. A file path is returned as is.
///
/// Matching on the address, not the hostname, works whatever the node's hostname looks like
/// (short, FQDN) and whether or not the container shares the node's UTS namespace. Only the
/// matching file is parsed and validated (by the caller, as any config): another node's file,
/// even a broken one, never stops this node. "An address of this host" is read from the
/// interfaces, not tried with bind(2), which `ip_nonlocal_bind=1` lets succeed for any
/// address.
pub fn node_config_path(path: &std::path::Path) -> Result<PathBuf, ConfigError> {
    if !path.is_dir() {
        return Ok(path.to_owned());
    }
    let read_err = |error| ConfigError::Read {
        path: path.to_owned(),
        error,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("toml"))
        .collect();
    files.sort();
    let texts: Vec<(PathBuf, String)> = files
        .iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap_or_default()))
        .collect();
    let host: Vec<IpAddr> = crate::vrrp::io::host_addresses()
        .map_err(read_err)?
        .into_iter()
        .map(|(_, a)| a.addr)
        .collect();
    pick_node_config(path, &texts, &host)
}

/// Just enough of a rendered config to tell whose it is (unknown fields ignored).
#[derive(Deserialize)]
struct Identity {
    #[serde(default)]
    vrrp: Vec<IdentityVrrp>,
}

#[derive(Deserialize)]
struct IdentityVrrp {
    #[serde(default)]
    unicast_src: Option<IpAddr>,
}

/// The file of `files` (path, text) whose `[[vrrp]]` `unicast_src` is one of `host`'s addresses.
/// Pure. Files are only skimmed for `unicast_src`; one that cannot even be skimmed is skipped
/// (it is another node's problem unless none matches, and then the error names it).
pub fn pick_node_config(
    dir: &std::path::Path,
    files: &[(PathBuf, String)],
    host: &[IpAddr],
) -> Result<PathBuf, ConfigError> {
    let mut mine = Vec::new();
    let mut unreadable = Vec::new();
    for (f, text) in files {
        match toml::from_str::<Identity>(text) {
            Ok(id) => {
                if id
                    .vrrp
                    .iter()
                    .filter_map(|r| r.unicast_src)
                    .any(|a| host.contains(&a))
                {
                    mine.push(f.clone());
                }
            }
            Err(_) => unreadable.push(f.display().to_string()),
        }
    }
    match mine.len() {
        1 => Ok(mine.remove(0)),
        0 => Err(invalid(
            dir.display().to_string(),
            format!(
                "none of the {} configs has a unicast_src that is an address of this host{}",
                files.len(),
                if unreadable.is_empty() {
                    String::new()
                } else {
                    format!(" (not TOML: {})", unreadable.join(", "))
                }
            ),
        )),
        _ => Err(invalid(
            dir.display().to_string(),
            format!("several configs match this host: {mine:?}"),
        )),
    }
}

/// Where a MachineConfig puts each node's config and the static pod.
pub const NODE_CONFIG_DIR: &str = "/etc/lb/nodes";
pub const STATIC_POD_PATH: &str = "/etc/kubernetes/manifests/lb.yaml";

/// The machine-config pool a node belongs to: control-plane nodes (also on compact clusters,
/// where they are workers too) are in `master`.
pub fn pool(node: &NodeSpec) -> &'static str {
    if node.roles.contains(&Role::ControlPlane) {
        "master"
    } else {
        "worker"
    }
}

/// A MachineConfig for `pool` that writes `files` (path, contents, mode). The MCO rolls it out
/// node by node, and owns the files afterwards: nobody edits them by hand (a node whose
/// MCO-managed files differ from its rendered config is marked degraded).
pub fn machine_config(pool: &str, files: &[(String, String, u32)]) -> String {
    let mut y = [
        format!("# Rendered by `lbctl render`: lb's files for the {pool} pool (docs/deploy.md)."),
        "apiVersion: machineconfiguration.openshift.io/v1".into(),
        "kind: MachineConfig".into(),
        "metadata:".into(),
        format!("  name: 99-{pool}-lb"),
        "  labels:".into(),
        format!("    machineconfiguration.openshift.io/role: {pool}"),
        "spec:".into(),
        "  config:".into(),
        "    ignition:".into(),
        "      version: 3.2.0".into(),
        "    storage:".into(),
        "      files:".into(),
    ]
    .join("\n")
        + "\n";
    for (path, contents, mode) in files {
        y += &format!(
            "      - path: {path}\n        mode: {mode}\n        overwrite: true\n        contents:\n          source: \"data:,{}\"\n",
            percent_encode(contents)
        );
    }
    y
}

/// RFC 3986 percent-encoding of everything but unreserved characters (an Ignition data URL).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

/// A node's config as TOML, with a header saying where it came from.
pub fn to_toml(cluster: &str, r: &Rendered) -> String {
    let body = toml::to_string_pretty(&r.config).unwrap_or_else(|e| format!("# {e}\n"));
    format!(
        "# lbd config of node {} of cluster {cluster:?}.\n# Rendered by `lbctl render`; edit the cluster description and render again.\n\n{body}",
        r.node
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPACT: &str = r#"
name = "ostest"
interface = "br-ex"
api_vip = "192.168.111.5"
ingress_vip = "192.168.111.4"
[[nodes]]
name = "master-0"
address = "192.168.111.20"
roles = ["control-plane", "worker"]
[[nodes]]
name = "master-1"
address = "192.168.111.21"
roles = ["master", "worker"]
[[nodes]]
name = "master-2"
address = "192.168.111.22"
roles = ["control-plane", "worker"]
"#;

    const SPLIT: &str = r#"
name = "ostest"
interface = "br-ex"
api_vip = "192.168.111.5"
ingress_vip = "192.168.111.4"
[[nodes]]
name = "master-0"
address = "192.168.111.20"
roles = ["control-plane"]
[[nodes]]
name = "master-1"
address = "192.168.111.21"
roles = ["control-plane"]
[[nodes]]
name = "worker-0"
address = "192.168.111.30"
roles = ["worker"]
[[nodes]]
name = "worker-1"
address = "192.168.111.31"
roles = ["worker"]
"#;

    fn err(text: &str) -> String {
        ClusterSpec::parse(text)
            .and_then(|c| c.render())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn compact_cluster_one_config_with_both_vips_per_node() {
        let out = ClusterSpec::parse(COMPACT).unwrap().render().unwrap();
        assert_eq!(out.len(), 3);
        for (i, r) in out.iter().enumerate() {
            let c = &r.config;
            assert_eq!(c.interface, "br-ex");
            let names: Vec<&str> = c.vips.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(names, ["api", "ingress"], "{}", r.node);
            let vrids: Vec<(u8, u8)> = c.vrrp.iter().map(|v| (v.vrid, v.priority)).collect();
            assert_eq!(vrids, [(14, 40), (93, 20)], "OpenShift's VRIDs for ostest");
            let me: IpAddr = format!("192.168.111.2{i}").parse().unwrap();
            for inst in &c.vrrp {
                assert_eq!(inst.unicast_src, Some(me));
                assert_eq!(inst.unicast_peers.len(), 2);
                assert!(!inst.unicast_peers.contains(&me));
            }
            assert_eq!(c.vips[0].backends.len(), 3);
            assert_eq!(c.vips[1].backends.len(), 3);
            let tracks: Vec<(&str, i32)> = c
                .track
                .iter()
                .map(|t| (t.name.as_str(), t.weight))
                .collect();
            assert_eq!(
                tracks,
                [
                    ("lb-ready", 20),
                    ("local-apiserver", 5),
                    ("local-mcs", 3),
                    ("local-router", 50)
                ]
            );
            // What lbd reads back is what was rendered.
            let text = to_toml("ostest", r);
            assert_eq!(&Config::parse(&text).unwrap(), c);
        }
    }

    #[test]
    fn split_roles_get_their_own_instance_and_peers() {
        let out = ClusterSpec::parse(SPLIT).unwrap().render().unwrap();
        let m0 = &out[0].config;
        assert_eq!(m0.vips.len(), 1);
        assert_eq!(m0.vrrp[0].name, "api");
        assert_eq!(
            m0.vrrp[0].unicast_peers,
            ["192.168.111.21".parse::<IpAddr>().unwrap()]
        );
        let w1 = &out[3].config;
        assert_eq!(w1.vips[0].name, "ingress");
        assert_eq!(w1.vrrp[0].vrid, 93);
        assert_eq!(
            w1.vrrp[0].unicast_peers,
            ["192.168.111.30".parse::<IpAddr>().unwrap()]
        );
        let backends: Vec<String> = w1.vips[0]
            .backends
            .iter()
            .map(|b| b.address.to_string())
            .collect();
        assert_eq!(backends, ["192.168.111.30", "192.168.111.31"]);
        // Every node agrees on what must be equal cluster-wide.
        assert!(out.iter().all(|r| r.config.hash_seed == m0.hash_seed));
    }

    #[test]
    fn keepalived_interop_mode_uses_openshift_auth_and_one_second_adverts() {
        let out = ClusterSpec::parse(&format!("vrrp_version = 2\n{SPLIT}"))
            .unwrap()
            .render()
            .unwrap();
        let api = &out[0].config.vrrp[0];
        assert_eq!(api.version, 2);
        assert_eq!(api.advert_interval_ms, Some(1000));
        // "ostest_api_vip" cut to 8 bytes, as keepalived puts it on the wire.
        assert_eq!(api.auth_pass.as_deref(), Some("ostest_a"));
        assert_eq!(out[2].config.vrrp[0].auth_pass.as_deref(), Some("ostest_i"));
    }

    #[test]
    fn fast_failover_renders_20_ms_adverts_and_only_with_vrrpv3() {
        let out = ClusterSpec::parse(&format!("fast_failover = true\n{SPLIT}"))
            .unwrap()
            .render()
            .unwrap();
        for r in &out {
            for inst in &r.config.vrrp {
                assert_eq!(inst.version, 3);
                assert_eq!(inst.advert_interval_ms, Some(20), "{}", r.node);
            }
            assert_eq!(&Config::parse(&to_toml("ostest", r)).unwrap(), &r.config);
        }
        let e = err(&format!("fast_failover = true\nvrrp_version = 2\n{SPLIT}"));
        assert!(e.starts_with("fast_failover:"), "{e}");
        let e = err(&format!(
            "fast_failover = true\nadvert_interval_ms = 100\n{SPLIT}"
        ));
        assert!(e.starts_with("fast_failover:"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = err(&SPLIT.replace("192.168.111.31", "192.168.111.30"));
        assert!(e.starts_with("nodes[3].address:"), "{e}");
        let e = err(&SPLIT.replace("\"192.168.111.31\"", "\"fd00::31\""));
        assert!(e.starts_with("nodes[3].address:"), "{e}");
        let e = err(&SPLIT.replace("roles = [\"worker\"]", "roles = [\"router\"]"));
        assert!(e.starts_with("nodes[2].roles[0]:"), "{e}");
        let e = err(&SPLIT.replace("name = \"worker-1\"", "name = \"worker-0\""));
        assert!(e.starts_with("nodes[3].name:"), "{e}");
        let e = err(&format!("vrrp_version = 4\n{SPLIT}"));
        assert!(e.starts_with("vrrp_version:"), "{e}");
        let e = err(&format!("api_ports = [6443, \"x\"]\n{SPLIT}"));
        assert!(e.starts_with("api_ports[1]:"), "{e}");
        let e = err(&SPLIT.replace(
            "interface = \"br-ex\"",
            "interface = \"an-interface-name-too-long\"",
        ));
        assert!(e.starts_with("nodes[0] (master-0): interface:"), "{e}");
        let e = err(&SPLIT.replace("roles = [\"worker\"]", "roles = [\"control-plane\"]"));
        assert!(e.starts_with("nodes:"), "ingress without routers: {e}");
        let e = err(&format!("{SPLIT}\nfoo = 1\n"));
        assert!(e.contains("foo"), "{e}");
    }

    #[test]
    fn a_directory_of_rendered_configs_resolves_to_this_hosts() {
        // 127.0.0.1 is local on every host; 192.0.2.x (TEST-NET-1) is not assigned here.
        let text = SPLIT
            .replace("192.168.111.20", "127.0.0.1")
            .replace("192.168.111.", "192.0.2.");
        let out = ClusterSpec::parse(&text).unwrap().render().unwrap();
        let dir = std::env::temp_dir().join(format!("lb-render-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for r in &out {
            std::fs::write(dir.join(format!("{}.toml", r.node)), to_toml("t", r)).unwrap();
        }
        let got = node_config_path(&dir);
        let none = {
            std::fs::remove_file(dir.join("master-0.toml")).unwrap();
            node_config_path(&dir).unwrap_err().to_string()
        };
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got.unwrap(), dir.join("master-0.toml"));
        assert!(none.contains("none of the 3 configs"), "{none}");
        let file = std::path::Path::new("/etc/lb/lbd.toml");
        assert_eq!(node_config_path(file).unwrap(), file);
    }

    #[test]
    fn only_this_nodes_file_is_picked_and_others_may_be_broken() {
        let dir = std::path::Path::new("/etc/lb/nodes");
        let node = |src: &str| {
            format!(
                "interface = \"eth0\"\n[[vrrp]]\nname = \"api\"\nvrid = 5\nunicast_src = \"{src}\"\nvips = [\"10.0.0.5\"]\n"
            )
        };
        let files = vec![
            (PathBuf::from("a.toml"), node("10.0.0.11")),
            // Another node's file with a validation error and one that is not TOML at all.
            (
                PathBuf::from("b.toml"),
                node("10.0.0.12") + "table_size = 4\n[[vips]]\nname = \"\"\n",
            ),
            (PathBuf::from("c.toml"), "this is [not toml".into()),
        ];
        let host = ["10.0.0.11".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        assert_eq!(
            pick_node_config(dir, &files, &host).unwrap(),
            PathBuf::from("a.toml")
        );
        // Ours is the broken one: picked anyway, so that the caller's validation says why.
        let host_b = ["10.0.0.12".parse().unwrap()];
        assert_eq!(
            pick_node_config(dir, &files, &host_b).unwrap(),
            PathBuf::from("b.toml")
        );
        // None matches: the error says which files could not be read.
        let e = pick_node_config(dir, &files, &["10.9.9.9".parse().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("none of the 3") && e.contains("c.toml"), "{e}");
        let both = vec![files[0].clone(), files[0].clone()];
        assert!(
            pick_node_config(dir, &both, &host)
                .unwrap_err()
                .to_string()
                .contains("several")
        );
    }

    #[test]
    fn machine_configs_carry_every_node_of_the_pool() {
        let spec = ClusterSpec::parse(SPLIT).unwrap();
        let masters: Vec<&NodeSpec> = spec.nodes.iter().filter(|n| pool(n) == "master").collect();
        assert_eq!(masters.len(), 2);
        let mc = machine_config(
            "master",
            &[(
                "/etc/lb/nodes/master-0.toml".into(),
                "a = \"x y\"\n".into(),
                0o644,
            )],
        );
        assert!(mc.contains("name: 99-master-lb"), "{mc}");
        assert!(mc.contains("machineconfiguration.openshift.io/role: master"));
        assert!(mc.contains("mode: 420"));
        assert!(
            mc.contains("source: \"data:,a%20%3D%20%22x%20y%22%0A\""),
            "{mc}"
        );
    }

    #[test]
    fn ipv6_clusters_render_vrrpv3() {
        let text = SPLIT
            .replace("192.168.111.5", "fd00::5")
            .replace("192.168.111.4", "fd00::4")
            .replace("192.168.111.", "fd00::");
        let out = ClusterSpec::parse(&text).unwrap().render().unwrap();
        assert_eq!(out[0].config.vrrp[0].version, 3);
        assert_eq!(
            out[0].config.track[1].address,
            Some("[::1]:6443".parse().unwrap())
        );
        assert!(err(&format!("vrrp_version = 2\n{text}")).starts_with("vrrp_version:"));
    }
}
