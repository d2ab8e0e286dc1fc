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
//!   on a compact cluster, the control-plane nodes that are also workers), checked on the
//!   router's readiness (`/healthz/ready` on 1936; a node without a router is absent),
//!   priority 20, +50 while the local router is ready.
//! - IngressController shards (`[[ingress_shards]]`): a VIP each, on the nodes they select
//!   (`render/shards.rs`). The checks and their timing beside OpenShift's: `render/checks.rs`.
//!
//! A node with both roles (compact three-node clusters) gets one config with both VIPs and
//! both VRRP instances: one lbd, one XDP attach, one API socket.
//!
//! Every rendered config passes [`Config::validate`]; errors name the field of the cluster
//! description (`nodes[2].address: ...`) or, for a rendered node, the node and the field of its
//! config, in the same `field: reason` form as lbd's own config errors.

mod checks;
mod manifests;
mod shards;

pub use checks::{api_health, router_health};
pub use manifests::{ignition, machine_config, node_disruption_policy};
pub use shards::IngressShard;

use std::{collections::HashSet, net::IpAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    config::health::{CheckKind, HealthConfig},
    config::vrrp::InstanceConfig,
    config::{
        BackendConfig, Config, ConfigErrors, LoadError, TrackConfig, Validate, VipConfig, XdpMode,
        from_toml,
    },
    vrrp::vrids::openshift_vrids,
};

/// The cluster description (`cluster.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// The cluster's name (metadata.name of the install config): the VRIDs derive from it.
    pub name: String,
    /// Interface the VIPs live on (OpenShift: `br-ex`).
    pub interface: String,
    /// One API VIP (`apiVIP`), or write `api_vips`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_vip: Option<IpAddr>,
    /// The install config's `apiVIPs` (4.12+): one VIP, or two of different families (dual
    /// stack). Each one gets its own VRRP instance, as runtimecfg renders `<cluster>_API_<i>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_vips: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_vip: Option<IpAddr>,
    /// `ingressVIPs`, as `api_vips`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_vips: Vec<IpAddr>,
    #[serde(default = "default_api_ports")]
    pub api_ports: Vec<u16>,
    #[serde(default = "default_ingress_ports")]
    pub ingress_ports: Vec<u16>,
    /// 3 (default: centisecond adverts, sub-second failover) or 2 while keepalived nodes are
    /// still in the cluster: the migration profile (see [`ClusterSpec::render`]).
    #[serde(default = "default_version")]
    pub vrrp_version: u8,
    /// Default: 100 ms with VRRPv3, 1000 ms in the migration profile (keepalived's
    /// `advert_int 1`).
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
    /// The devices the XDP program attaches to on every node, if not `interface`: on
    /// OVN-Kubernetes' `br-ex` its uplink (the NIC, or the bond), where it runs in driver mode
    /// below the bridge's flows. Empty: `interface` itself, and on `br-ex` (an OVS internal
    /// port, generic mode only) `xdp_mode = "skb"` from `auto`. A node's own
    /// `xdp_interfaces` overrides it (a node whose uplink has another name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xdp_interfaces: Vec<String>,
    /// Pin directory name under /sys/fs/bpf on every node.
    #[serde(default = "default_lb_name")]
    pub lb_name: String,
    #[serde(default = "default_socket")]
    pub api_socket: PathBuf,
    /// Probes and Prometheus (the manifests' probes and ServiceMonitor use it). Never a port
    /// OpenShift's on-prem pods bind ([`OPENSHIFT_HOST_PORTS`]).
    #[serde(default = "default_metrics")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The port of lbd's HTTPS /metrics listener on every node (`[metrics_tls]`: the kubelet's
    /// serving certificate and client CA, see lb-userspace's `metrics_tls`), which cluster monitoring
    /// scrapes (deploy/monitoring/service-monitor.yaml names the same port). 0: none.
    #[serde(default = "default_metrics_tls_port")]
    pub metrics_tls_port: u16,
    /// The connection sync (`[sync]` of every node): the cluster key's path on the nodes; the
    /// peers come from the node list. On by default (the key at [`DEFAULT_KEY_FILE`], made by
    /// `lbctl render`); `enabled = false` turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<ClusterSync>,
    /// The install config's platform. On `openstack` the VIPs of a role (both families of a
    /// dual-stack cluster) move together: their instances form one group (keepalived's
    /// `vrrp_sync_group`, see lb-userspace's `vrrp::group`).
    #[serde(default)]
    pub platform: Platform,
    /// IngressController shards, each with its own VIPs, ports, router stats port and node
    /// selection, rendered beside the default ingress VIP (see `render/shards.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_shards: Vec<IngressShard>,
    /// The install's bootstrap node, while it exists (`[bootstrap]`): it holds the API VIP
    /// until a control-plane node's load balancer is ready, and serves as a backend of the API
    /// VIPs on every control-plane node. Remove it and render again once the bootstrap is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,
    pub nodes: Vec<NodeSpec>,
}

/// `[bootstrap]` of the description: the install's temporary bootstrap node. Before any
/// control-plane node exists, the API VIP (6443 and the machine-config server on 22623, from
/// which the control-plane nodes fetch their Ignition) must reach the bootstrap's apiserver.
/// `lbctl render` writes its config and an Ignition fragment for it; the control-plane nodes
/// take it as a VRRP peer and as a backend of the API VIPs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapSpec {
    #[serde(default = "default_bootstrap_name")]
    pub name: String,
    pub address: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_address: Option<IpAddr>,
    /// The bootstrap's interface: it runs no OVN-Kubernetes, so it has no br-ex (default: the
    /// cluster's `interface`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

fn default_bootstrap_name() -> String {
    "bootstrap".into()
}

/// The bootstrap's API priority: above a control-plane node whose load balancer is not ready
/// yet (40, +5 and +3 with a ready local apiserver and machine-config server: 48), below one
/// whose load balancer is (60 and more). As on OpenShift, the VIP starts on the bootstrap
/// and moves once, to the first control-plane node that can forward it.
pub const BOOTSTRAP_PRIORITY: u8 = 50;

/// `[sync]` of the description: what is the same on every node. Each node's peers are the
/// other nodes that may forward one of its VIPs next: the other control-plane nodes for the
/// API VIPs, the other routers for the ingress VIPs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSync {
    /// The cluster key file, at this path on every node (the same key everywhere). The
    /// membership announcements are signed with it too, with or without the sync.
    #[serde(default = "default_key_file")]
    pub key_file: PathBuf,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
}

/// Where the cluster runs (`platform` of the install config), as far as the election differs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    #[default]
    Baremetal,
    Openstack,
    Vsphere,
    Nutanix,
    Ovirt,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    /// The node's address on `interface` (OpenShift: the node's InternalIP).
    pub address: IpAddr,
    /// Dual stack: the node's address of the other family (its second InternalIP), the
    /// source and peer address of the instances of that family's VIPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_address: Option<IpAddr>,
    pub roles: Vec<Role>,
    /// This node's attach devices, if not the cluster's `xdp_interfaces` (e.g. `["bond0"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp_interfaces: Option<Vec<String>>,
    /// The Node object's labels that IngressController shards select on
    /// (`ingress_shards[].node_selector`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    #[serde(alias = "master")]
    ControlPlane,
    Worker,
}

/// OVN-Kubernetes' bridge that holds the node's address (and so the VIPs) on OpenShift.
pub const OVN_K8S_BRIDGE: &str = "br-ex";

/// Where `lbctl render`'s MachineConfigs put the cluster key on every node (mode 0600).
pub const DEFAULT_KEY_FILE: &str = "/etc/lb/cluster.key";

fn default_key_file() -> PathBuf {
    DEFAULT_KEY_FILE.into()
}
fn default_true() -> bool {
    true
}

impl Default for ClusterSync {
    fn default() -> Self {
        ClusterSync {
            key_file: default_key_file(),
            enabled: true,
            port: None,
            interval_ms: None,
        }
    }
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
    Some(([127, 0, 0, 1], DEFAULT_METRICS_PORT).into())
}

fn default_metrics_tls_port() -> u16 {
    DEFAULT_METRICS_TLS_PORT
}

/// The port of the authenticated /metrics listener cluster monitoring scrapes, next to
/// [`DEFAULT_METRICS_PORT`] and, like it, outside [`OPENSHIFT_HOST_PORTS`].
pub const DEFAULT_METRICS_TLS_PORT: u16 = 29445;

/// The kubelet's files on an OpenShift node that the metrics TLS listener uses (rotated by the
/// kubelet and the machine-config daemon; lbd reads them again when they change).
pub const KUBELET_SERVING_CERT: &str = "/var/lib/kubelet/pki/kubelet-server-current.pem";
pub const KUBELET_CLIENT_CA: &str = "/etc/kubernetes/kubelet-ca.crt";

/// lbd's metrics and probe port on rendered nodes: outside every range of
/// [`OPENSHIFT_HOST_PORTS`] (9444, the earlier default, is haproxy's health port).
pub const DEFAULT_METRICS_PORT: u16 = 29444;

/// Host ports OpenShift's on-prem nodes bind or reserve (inclusive ranges): routers 80/443 and
/// 1936, etcd 2379-2380, the API 6443, host-level services 9000-9999 (haproxy 9443 stats, 9444
/// health, 9445 API frontend; node exporter, the health monitors), kubelet and friends
/// 10250-10259, kube-proxy/ovn 10256, the machine-config server 22623/22624, node ports
/// 30000-32767.
pub const OPENSHIFT_HOST_PORTS: &[(u16, u16)] = &[
    (80, 80),
    (443, 443),
    (1936, 1936),
    (2379, 2380),
    (6443, 6443),
    (9000, 9999),
    (10250, 10259),
    (22623, 22624),
    (30000, 32767),
];

/// Whether `port` is one OpenShift's on-prem pods bind ([`OPENSHIFT_HOST_PORTS`]).
pub fn openshift_port(port: u16) -> bool {
    OPENSHIFT_HOST_PORTS
        .iter()
        .any(|(lo, hi)| (*lo..=*hi).contains(&port))
}

/// OpenShift's keepalived priorities and tracked-script weights (machine-config-operator,
/// templates/*/on-prem keepalived.conf.tmpl).
pub const API_PRIORITY: u8 = 40;
pub const INGRESS_PRIORITY: u8 = 20;
const MCS_PORT: u16 = 22623;
const ROUTER_STATS_PORT: u16 = 1936;
/// `chk_ocp_lb`: the local load balancer is ready.
pub const W_OCP_LB: i32 = 20;
/// `chk_ocp_both`: the local load balancer is ready OR the local apiserver is.
pub const W_OCP_BOTH: i32 = 5;
/// `chk_mcs`: the machine-config server runs here.
pub const W_MCS: i32 = 3;
/// `chk_ingress`: weight 0, the instance is in FAULT while the router's /healthz fails.
pub const W_INGRESS: i32 = 0;
/// `chk_ingress_ready`: the router's /healthz/ready.
pub const W_INGRESS_READY: i32 = 10;
/// `chk_default_ingress`: a default router is ready on this node.
pub const W_DEFAULT_INGRESS: i32 = 50;

/// One node's rendered config.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub node: String,
    pub config: Config,
}

impl ClusterSpec {
    pub fn parse(text: &str) -> Result<ClusterSpec, LoadError> {
        let spec: ClusterSpec = from_toml(text)?;
        spec.validate()?;
        Ok(spec)
    }

    fn has(&self, role: Role) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(move |n| n.roles.contains(&role))
    }

    /// Nodes that run routers: the workers. A compact cluster's nodes have both roles.
    fn routers(&self) -> Vec<&NodeSpec> {
        self.has(Role::Worker).collect()
    }

    /// The API VIPs: `api_vips`, or `api_vip` alone.
    pub fn api_vips(&self) -> Vec<IpAddr> {
        vip_list(self.api_vip, &self.api_vips)
    }

    /// The ingress VIPs: `ingress_vips`, or `ingress_vip` alone (none: no ingress instance).
    pub fn ingress_vips(&self) -> Vec<IpAddr> {
        vip_list(self.ingress_vip, &self.ingress_vips)
    }
}

/// What the description itself must satisfy (every problem, each named); the rendered configs
/// are checked after.
impl Validate for ClusterSpec {
    fn validate_into(&self, errors: &mut ConfigErrors) {
        if self.name.is_empty() {
            errors.add("name", "must not be empty (the VRIDs derive from it)");
        }
        if !matches!(self.vrrp_version, 2 | 3) {
            errors.add(
                "vrrp_version",
                format!("must be 2 or 3, got {}", self.vrrp_version),
            );
        }
        if self.fast_failover && self.vrrp_version != 3 {
            errors.add(
                "fast_failover",
                "needs vrrp_version = 3: keepalived nodes still in the cluster (VRRPv2) advertise every second",
            );
        }
        if self.fast_failover && self.advert_interval_ms.is_some() {
            errors.add(
                "fast_failover",
                "sets the advert interval itself: remove advert_interval_ms",
            );
        }
        check_vip_list("api", self.api_vip, &self.api_vips, true, errors);
        check_vip_list(
            "ingress",
            self.ingress_vip,
            &self.ingress_vips,
            false,
            errors,
        );
        let api = self.api_vips();
        let ingress = self.ingress_vips();
        for (i, v) in ingress.iter().enumerate() {
            if api.contains(v) {
                errors.add(
                    list_field("ingress", &self.ingress_vips, i),
                    format!("{v} is also an API VIP"),
                );
            }
        }
        if let Some([a, i]) = self.vrids
            && (a == 0 || i == 0 || a == i)
        {
            errors.add("vrids", "two different VRIDs in 1..=255");
        }
        if let Some(m) = self.metrics_listen
            && openshift_port(m.port())
        {
            errors.add(
                "metrics_listen",
                format!(
                    "port {} is one OpenShift's on-prem pods bind or reserve (haproxy 9443-9445, 9000-9999, 6443, 22623-22624, 1936...); the default is {DEFAULT_METRICS_PORT}",
                    m.port()
                ),
            );
        }
        if self.metrics_tls_port != 0
            && (openshift_port(self.metrics_tls_port)
                || self.metrics_listen.map(|m| m.port()) == Some(self.metrics_tls_port))
        {
            errors.add(
                "metrics_tls_port",
                format!(
                    "port {} is one OpenShift's on-prem pods bind or reserve, or metrics_listen's; the default is {DEFAULT_METRICS_TLS_PORT}",
                    self.metrics_tls_port
                ),
            );
        }
        if self.nodes.is_empty() {
            errors.add("nodes", "at least one node");
        }
        // Address families every node needs an address of: those of the VIPs.
        let families: Vec<bool> = {
            let mut f: Vec<bool> = api.iter().chain(&ingress).map(|v| v.is_ipv4()).collect();
            f.sort();
            f.dedup();
            f
        };
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let f = format!("nodes[{i}]");
            if n.name.is_empty() || !names.insert(n.name.as_str()) {
                errors.add(format!("{f}.name"), "must be non-empty and unique");
            }
            for (field, a) in [
                ("address", Some(n.address)),
                ("secondary_address", n.secondary_address),
            ] {
                let Some(a) = a else { continue };
                if !addrs.insert(a) {
                    errors.add(format!("{f}.{field}"), "used by two nodes");
                }
                if api.contains(&a) || ingress.contains(&a) {
                    errors.add(format!("{f}.{field}"), "is a VIP");
                }
                if !families.contains(&a.is_ipv4()) {
                    errors.add(
                        format!("{f}.{field}"),
                        "no VIP of this address family (unicast VRRP peers and L2 DSR need the VIP's family)",
                    );
                }
            }
            if let Some(b) = n.secondary_address
                && b.is_ipv4() == n.address.is_ipv4()
            {
                errors.add(
                    format!("{f}.secondary_address"),
                    "must be of the other address family than address (dual stack)",
                );
            }
            for v4 in &families {
                if node_address(n, *v4).is_none() {
                    errors.add(
                        format!("{f}.secondary_address"),
                        format!(
                            "needed: the cluster has {} VIPs and this node has no {} address",
                            if *v4 { "IPv4" } else { "IPv6" },
                            if *v4 { "IPv4" } else { "IPv6" }
                        ),
                    );
                }
            }
            if n.roles.is_empty() {
                errors.add(
                    format!("{f}.roles"),
                    "at least one of \"control-plane\", \"worker\"",
                );
            }
        }
        if self.has(Role::ControlPlane).next().is_none() {
            errors.add(
                "nodes",
                "no node has the control-plane role (the API VIP needs one)",
            );
        }
        if !ingress.is_empty() && self.routers().is_empty() {
            errors.add(
                "nodes",
                "ingress VIPs are set but no node has the worker role (routers)",
            );
        }
        self.validate_bootstrap(&names, &addrs, errors);
        self.validate_shards(errors);
    }
}

impl ClusterSpec {
    fn validate_bootstrap(
        &self,
        names: &HashSet<&str>,
        addrs: &HashSet<IpAddr>,
        errors: &mut ConfigErrors,
    ) {
        let Some(b) = &self.bootstrap else {
            return;
        };
        if b.name.is_empty() || names.contains(b.name.as_str()) {
            errors.add("bootstrap.name", "must be non-empty and not a node's name");
        }
        if b.interface.as_deref() == Some("") {
            errors.add("bootstrap.interface", "must not be empty");
        }
        let api = self.api_vips();
        let node = b.as_node();
        for (field, a) in [
            ("address", Some(b.address)),
            ("secondary_address", b.secondary_address),
        ] {
            let Some(a) = a else { continue };
            if addrs.contains(&a) {
                errors.add(format!("bootstrap.{field}"), "is a node's address");
            }
            if api.contains(&a) || self.ingress_vips().contains(&a) {
                errors.add(format!("bootstrap.{field}"), "is a VIP");
            }
        }
        if let Some(s) = b.secondary_address
            && s.is_ipv4() == b.address.is_ipv4()
        {
            errors.add(
                "bootstrap.secondary_address",
                "must be of the other address family than address (dual stack)",
            );
        }
        for v in &api {
            if node_address(&node, v.is_ipv4()).is_none() {
                errors.add(
                    "bootstrap.address",
                    format!("no address of the API VIP {v}'s family"),
                );
            }
        }
    }

    /// `(api, ingress)` VRIDs: OpenShift's, from the cluster name, unless overridden. Every
    /// VIP of a role uses its role's VRID (IPv4 and IPv6 VRRP are separate protocols), as
    /// runtimecfg renders `<cluster>_API_0` and `_API_1`.
    pub fn vrids(&self) -> (u8, u8) {
        match self.vrids {
            Some([a, i]) => (a, i),
            None => openshift_vrids(&self.name),
        }
    }

    /// Every node's config, in the order of `nodes`; each one validated as lbd would.
    ///
    /// `vrrp_version = 2` is the migration profile, for a cluster where keepalived still runs
    /// on some nodes: IPv4 instances are VRRPv3 with `v2_compat` (they send VRRPv2 adverts with
    /// OpenShift's PASS password, which keepalived counts, and VRRPv3 ones, and accept both),
    /// IPv6 instances VRRPv3 (keepalived speaks v3 for IPv6), all at keepalived's 1 s interval.
    /// Once no keepalived is left, rendering with `vrrp_version = 3` only drops `v2_compat`,
    /// the password and the long interval: lbd applies that in place on reload (same version,
    /// so no instance restarts and no VIP moves), and a half-switched cluster still hears
    /// itself through the VRRPv3 adverts both profiles send.
    pub fn render(&self) -> Result<Vec<Rendered>, ConfigErrors> {
        self.validate()?;
        let mut out = Vec::new();
        let mut errors = ConfigErrors::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let config = self.node_config(n);
            errors.within(&format!("nodes[{i}] ({}): ", n.name), &config);
            out.push(Rendered {
                node: n.name.clone(),
                config,
            });
        }
        errors.into_result()?;
        Ok(out)
    }

    /// The bootstrap node's config (see [`BootstrapSpec`]), validated as lbd would; none
    /// without `[bootstrap]`. Only the API VIPs: their instances at [`BOOTSTRAP_PRIORITY`] with
    /// no tracked checks (the bootstrap holds the VIP until a control-plane node's load
    /// balancer is ready, whatever its own apiserver does), the same backends as on the
    /// control-plane nodes (the Maglev table agrees, so the VIP's move keeps connections); no
    /// sync, no membership, no cluster key, no metrics TLS (the bootstrap has no kubelet
    /// serving certificate).
    pub fn render_bootstrap(&self) -> Result<Option<Rendered>, ConfigErrors> {
        self.validate()?;
        let Some(b) = &self.bootstrap else {
            return Ok(None);
        };
        let mut cfg = self.node_config(&b.as_node());
        cfg.vips.retain(|v| {
            self.api_vips().contains(&v.address) && !self.ingress_vips().contains(&v.address)
        });
        let api: Vec<String> = cfg.vips.iter().map(|v| v.name.clone()).collect();
        cfg.vrrp.retain(|i| api.contains(&i.name));
        for i in cfg.vrrp.iter_mut() {
            i.priority = BOOTSTRAP_PRIORITY;
            i.group = None;
        }
        cfg.track.clear();
        cfg.sync = None;
        cfg.members = None;
        cfg.metrics_tls = None;
        if let Some(i) = &b.interface {
            cfg.interface = i.clone();
        }
        // No OVS bridge on the bootstrap (unless it is named so): the description's mode.
        if cfg.interface != OVN_K8S_BRIDGE {
            cfg.xdp_mode = self.xdp_mode;
        }
        cfg.validate_at(&format!("bootstrap ({}): ", b.name))?;
        Ok(Some(Rendered {
            node: b.name.clone(),
            config: cfg,
        }))
    }

    /// The nodes serving the API VIPs: the control-plane nodes, and the bootstrap while the
    /// description has one.
    fn api_group(&self) -> Vec<NodeSpec> {
        self.has(Role::ControlPlane)
            .cloned()
            .chain(self.bootstrap.as_ref().map(BootstrapSpec::as_node))
            .collect()
    }

    /// The VRRP instance `name` of `vip` on node `me`, with `group` as the nodes taking part.
    fn instance(
        &self,
        (name, role): (&str, &str),
        vrid: u8,
        priority: u8,
        vip: IpAddr,
        me: &NodeSpec,
        group: &[&NodeSpec],
    ) -> InstanceConfig {
        let v4 = vip.is_ipv4();
        let migrating = self.vrrp_version == 2;
        let interval = self.advert_interval_ms.unwrap_or(if migrating {
            1000
        } else if self.fast_failover {
            crate::config::vrrp::FAST_ADVERT_INTERVAL_MS
        } else {
            100
        });
        InstanceConfig {
            name: name.into(),
            interface: None,
            vrid,
            version: 3,
            priority,
            advert_interval_ms: Some(interval),
            // OpenShift renders `<cluster>_<role>_vip`; keepalived sends its first 8 bytes,
            // which is what a mixed keepalived/lb instance must agree on.
            auth_pass: (migrating && v4).then(|| {
                let full = format!("{}_{role}_vip", self.name);
                truncate_bytes(&full, 8).to_string()
            }),
            preempt: true,
            preempt_delay_ms: 0,
            unicast_src: node_address(me, v4),
            unicast_peers: group
                .iter()
                .filter(|p| p.name != me.name)
                .filter_map(|p| node_address(p, v4))
                .collect(),
            check_unicast_src: true,
            // Every node runs lbd (not the migration profile), and lbd sends every advert with
            // hop limit 255: IPv6 unicast adverts from fewer hops away than on-link are
            // refused, so an off-link host that spoofs a peer's address cannot move the VIP.
            // (keepalived sends IPv6 unicast with hop limit 64: no bounds while it may run.)
            unicast_peer_ttl: if v4 || migrating {
                Vec::new()
            } else {
                group
                    .iter()
                    .filter(|p| p.name != me.name)
                    .filter_map(|p| node_address(p, v4))
                    .map(|address| crate::config::vrrp::PeerTtl {
                        address,
                        min_ttl: 255,
                        max_ttl: 255,
                    })
                    .collect()
            },
            garp_master_delay_s: 5,
            v2_compat: migrating && v4,
            vips: vec![vip],
            garp_refresh_s: 60,
            group: None,
        }
    }

    /// `me`'s `[sync]`: peers are the other nodes sharing a role that forwards a VIP with it
    /// (control-plane: the API VIPs; worker: the ingress VIPs), by their `address`.
    fn sync_config(&self, s: &ClusterSync, me: &NodeSpec) -> crate::config::sync::SyncConfig {
        use crate::config::sync as sc;
        let forwards = |n: &NodeSpec| {
            (n.roles.contains(&Role::ControlPlane) && me.roles.contains(&Role::ControlPlane))
                || (!self.ingress_vips().is_empty()
                    && n.roles.contains(&Role::Worker)
                    && me.roles.contains(&Role::Worker))
        };
        let peers: Vec<std::net::IpAddr> = self
            .nodes
            .iter()
            .filter(|n| n.name != me.name && forwards(n))
            .map(|n| n.address)
            .collect();
        // The peers' exceptions fit half of the connection table (`SyncConfig::fits`): many
        // workers each get a smaller share.
        let share = lb_common::DEFAULT_CONNTRACK_SIZE / 2 / (peers.len() as u32).max(1);
        sc::SyncConfig {
            peers,
            key_file: s.key_file.clone(),
            accept_key_files: Vec::new(),
            port: s.port.unwrap_or(sc::DEFAULT_PORT),
            listen: None,
            interval_ms: s.interval_ms.unwrap_or(sc::DEFAULT_INTERVAL_MS),
            max_entries: sc::DEFAULT_MAX_ENTRIES.min(share),
        }
    }

    /// The description's `[sync]`, or the default: on, with the cluster key at
    /// [`DEFAULT_KEY_FILE`].
    pub fn sync_settings(&self) -> ClusterSync {
        self.sync.clone().unwrap_or_default()
    }

    /// `me`'s `[sync]`: none when turned off, and none by default for a node nobody else
    /// forwards with (a lone control-plane node); a `[sync]` written in the description
    /// refuses such a node (`sync.peers`).
    fn sync_of(&self, me: &NodeSpec) -> Option<crate::config::sync::SyncConfig> {
        let s = self.sync_settings();
        if !s.enabled {
            return None;
        }
        let c = self.sync_config(&s, me);
        (self.sync.is_some() || !c.peers.is_empty()).then_some(c)
    }

    /// Every node's `[members]`: the announcements that make joining and leaving nodes peers
    /// without a new config (see lb-userspace's `members`), signed with the cluster key.
    fn members_of(&self) -> crate::config::members::MembersConfig {
        use crate::config::members as mc;
        mc::MembersConfig {
            key_file: self.sync_settings().key_file,
            accept_key_files: Vec::new(),
            port: mc::DEFAULT_PORT,
            listen: None,
            announce_ms: mc::DEFAULT_ANNOUNCE_MS,
            expire_ms: mc::DEFAULT_EXPIRE_MS,
            join_wait_ms: mc::DEFAULT_JOIN_WAIT_MS,
        }
    }

    /// The XDP mode of node `me`: as configured, except `auto` on OVN-Kubernetes' `br-ex` itself
    /// (no uplink named), an OVS internal port that has generic mode only: `skb`, said so
    /// rather than found by a failed driver-mode attach.
    fn xdp_mode_of(&self, me: &NodeSpec) -> XdpMode {
        let on_bridge = me
            .xdp_interfaces
            .as_ref()
            .unwrap_or(&self.xdp_interfaces)
            .is_empty()
            && self.interface == OVN_K8S_BRIDGE;
        match self.xdp_mode {
            XdpMode::Auto if on_bridge => XdpMode::Skb,
            m => m,
        }
    }

    fn node_config(&self, me: &NodeSpec) -> Config {
        let (api_vrid, ingress_vrid) = self.vrids();
        let mut cfg = Config {
            interface: self.interface.clone(),
            name: self.lb_name.clone(),
            api_socket: self.api_socket.clone(),
            metrics_listen: self.metrics_listen,
            metrics_tls: (self.metrics_tls_port != 0).then(|| {
                crate::config::metrics_tls::MetricsTlsConfig {
                    // Every address of the node's family: Prometheus scrapes the pod's IP.
                    listen: match me.address {
                        IpAddr::V4(_) => {
                            (std::net::Ipv4Addr::UNSPECIFIED, self.metrics_tls_port).into()
                        }
                        IpAddr::V6(_) => {
                            (std::net::Ipv6Addr::UNSPECIFIED, self.metrics_tls_port).into()
                        }
                    },
                    cert_file: KUBELET_SERVING_CERT.into(),
                    key_file: KUBELET_SERVING_CERT.into(),
                    client_ca_file: KUBELET_CLIENT_CA.into(),
                    allowed_clients: vec![crate::config::metrics_tls::PROMETHEUS_K8S.into()],
                }
            }),
            xdp_mode: self.xdp_mode_of(me),
            xdp_interfaces: me
                .xdp_interfaces
                .clone()
                .unwrap_or_else(|| self.xdp_interfaces.clone()),
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
            sync: self.sync_of(me),
            members: Some(self.members_of()),
            vrrp_rt_priority: crate::config::DEFAULT_RT_PRIORITY,
        };
        // OpenShift's tracked script `script` of instance `instance` (named `script`, with a
        // `-<i>` suffix for the i-th VIP of a role, track names being unique): a probe of a
        // local port, or (None) the load balancer's own readiness.
        let track = |instance: &str,
                     i: usize,
                     script: &str,
                     weight: i32,
                     vip: IpAddr,
                     check: Option<(u16, CheckKind, &str)>| {
            let mut t = TrackConfig {
                instance: instance.into(),
                name: indexed(script, i),
                weight,
                address: None,
                or_lb_ready: false,
                health: HealthConfig::default(),
            };
            if let Some((port, kind, path)) = check {
                t.address = Some(std::net::SocketAddr::new(loopback(vip), port));
                t.health.kind = kind;
                t.health.path = path.into();
                (t.health.rise, t.health.fall) = checks::track_counts(script);
            }
            t
        };
        if me.roles.contains(&Role::ControlPlane) {
            let api_group = self.api_group();
            let group: Vec<&NodeSpec> = api_group.iter().collect();
            for (i, vip) in self.api_vips().into_iter().enumerate() {
                let name = indexed("api", i);
                cfg.vips.push(VipConfig {
                    announce: crate::config::Announce::Owner,
                    name: name.clone(),
                    address: vip,
                    ports: self.api_ports.clone(),
                    protocol: crate::config::Protocol::Tcp,
                    owned: None,
                    vrrp: Some(name.clone()),
                    health: api_health(),
                    backends: group
                        .iter()
                        .filter_map(|n| node_address(n, vip.is_ipv4()))
                        .map(backend)
                        .collect(),
                });
                cfg.vrrp.push(self.instance(
                    (&name, "api"),
                    api_vrid,
                    API_PRIORITY,
                    vip,
                    me,
                    &group,
                ));
                cfg.track
                    .push(track(&name, i, "chk_ocp_lb", W_OCP_LB, vip, None));
                let mut both = track(
                    &name,
                    i,
                    "chk_ocp_both",
                    W_OCP_BOTH,
                    vip,
                    Some((6443, CheckKind::Https, "/readyz")),
                );
                both.or_lb_ready = true;
                cfg.track.push(both);
                if self.api_ports.contains(&MCS_PORT) {
                    cfg.track.push(track(
                        &name,
                        i,
                        "chk_mcs",
                        W_MCS,
                        vip,
                        Some((MCS_PORT, CheckKind::Tcp, "")),
                    ));
                }
            }
        }
        // Every node takes part in the ingress election, masters included (they list each
        // other as peers, as runtimecfg's ingress peers are all nodes); a node without a ready
        // router is in FAULT (chk_ingress) and never takes the VIP.
        let group: Vec<&NodeSpec> = self.nodes.iter().collect();
        let routers = self.routers();
        for (i, vip) in self.ingress_vips().into_iter().enumerate() {
            let name = indexed("ingress", i);
            cfg.vips.push(VipConfig {
                announce: crate::config::Announce::Owner,
                name: name.clone(),
                address: vip,
                ports: self.ingress_ports.clone(),
                protocol: crate::config::Protocol::Tcp,
                owned: None,
                vrrp: Some(name.clone()),
                health: router_health(ROUTER_STATS_PORT),
                backends: routers
                    .iter()
                    .filter_map(|n| node_address(n, vip.is_ipv4()))
                    .map(backend)
                    .collect(),
            });
            cfg.vrrp.push(self.instance(
                (&name, "ingress"),
                ingress_vrid,
                INGRESS_PRIORITY,
                vip,
                me,
                &group,
            ));
            let router = |path| Some((ROUTER_STATS_PORT, CheckKind::Http, path));
            cfg.track.push(track(
                &name,
                i,
                "chk_ingress",
                W_INGRESS,
                vip,
                router("/healthz"),
            ));
            cfg.track.push(track(
                &name,
                i,
                "chk_ingress_ready",
                W_INGRESS_READY,
                vip,
                router("/healthz/ready"),
            ));
            // OpenShift asks the container runtime whether a pod of the default router is
            // ready here; lb asks that router itself: its readiness endpoint on the default
            // stats port (the pod's readiness probe).
            cfg.track.push(track(
                &name,
                i,
                "chk_default_ingress",
                W_DEFAULT_INGRESS,
                vip,
                router("/healthz/ready"),
            ));
        }
        if self.platform == Platform::Openstack {
            group_roles(&mut cfg.vrrp);
        }
        self.render_shards(me, &mut cfg);
        cfg
    }
}

/// One group per role (`api`, `ingress`) for a role with several instances (see
/// [`Platform::Openstack`]); the first VIP's instance leads.
fn group_roles(vrrp: &mut [InstanceConfig]) {
    for role in ["api", "ingress"] {
        // `ingress-1`, not a shard's `ingress-<shard>` (grouped by its own rule).
        let of_role = |r: &InstanceConfig| {
            r.name == role
                || r.name
                    .strip_prefix(&format!("{role}-"))
                    .is_some_and(|i| i.parse::<usize>().is_ok())
        };
        if vrrp.iter().filter(|r| of_role(r)).count() > 1 {
            for r in vrrp.iter_mut().filter(|r| of_role(r)) {
                r.group = Some(role.to_string());
            }
        }
    }
}

/// `base` for the first VIP of a role, `base-<i>` for the others (runtimecfg's `_API_<i>`).
fn indexed(base: &str, i: usize) -> String {
    if i == 0 {
        base.to_string()
    } else {
        format!("{base}-{i}")
    }
}

fn vip_list(one: Option<IpAddr>, list: &[IpAddr]) -> Vec<IpAddr> {
    if list.is_empty() {
        one.into_iter().collect()
    } else {
        list.to_vec()
    }
}

fn list_field(role: &str, list: &[IpAddr], i: usize) -> String {
    if list.is_empty() {
        format!("{role}_vip")
    } else {
        format!("{role}_vips[{i}]")
    }
}

/// `<role>_vip` or `<role>_vips`, not both; at most one VIP per address family.
fn check_vip_list(
    role: &str,
    one: Option<IpAddr>,
    list: &[IpAddr],
    required: bool,
    errors: &mut ConfigErrors,
) {
    if one.is_some() && !list.is_empty() {
        errors.add(
            format!("{role}_vips"),
            format!("write {role}_vip or {role}_vips, not both"),
        );
    }
    let vips = vip_list(one, list);
    if required && vips.is_empty() {
        errors.add(
            format!("{role}_vips"),
            format!("at least one VIP ({role}_vip or {role}_vips)"),
        );
    }
    if vips.len() > 2 {
        errors.add(
            format!("{role}_vips"),
            "at most two VIPs: one IPv4 and one IPv6 (dual stack)",
        );
    }
    for (i, v) in vips.iter().enumerate() {
        if v.is_unspecified() || v.is_multicast() || v.is_loopback() {
            errors.add(list_field(role, list, i), "must be a unicast address");
        }
    }
    if let [a, b] = vips[..]
        && a.is_ipv4() == b.is_ipv4()
    {
        errors.add(
            format!("{role}_vips[1]"),
            "must be of the other address family than the first (dual stack: one IPv4 and one IPv6 VIP)",
        );
    }
}

impl BootstrapSpec {
    /// The bootstrap as a node of the API VIPs' group.
    fn as_node(&self) -> NodeSpec {
        NodeSpec {
            name: self.name.clone(),
            address: self.address,
            secondary_address: self.secondary_address,
            roles: vec![Role::ControlPlane],
            labels: Default::default(),
            // The program attaches to the bootstrap's own interface.
            xdp_interfaces: Some(Vec::new()),
        }
    }
}

/// `n`'s address of the family (IPv4 if `v4`), if it has one.
pub fn node_address(n: &NodeSpec, v4: bool) -> Option<IpAddr> {
    [Some(n.address), n.secondary_address]
        .into_iter()
        .flatten()
        .find(|a| a.is_ipv4() == v4)
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

/// Where a MachineConfig puts each node's config and the static pod.
pub const NODE_CONFIG_DIR: &str = "/etc/lb/nodes";
pub const STATIC_POD_PATH: &str = "/etc/kubernetes/manifests/lb.yaml";
/// The image gate (deploy/lb-image-gate.sh) and its oneshot unit, which the MCO restarts after
/// it changed the static pod (see [`node_disruption_policy`]).
pub const GATE_PATH: &str = "/usr/local/bin/lb-image-gate";
pub const GATE_UNIT: &str = "lb-image-gate.service";
/// The gate's script and unit, as the MachineConfigs ship them.
pub const GATE_SCRIPT: &str = include_str!("../../deploy/lb-image-gate.sh");
pub const GATE_UNIT_CONTENTS: &str = "[Unit]\nDescription=Wait until lb's static pod runs a ready lbd (the guard of lb image rollouts, docs/openshift.md)\n\n[Service]\nType=oneshot\nExecStart=/usr/local/bin/lb-image-gate\n# The gate's own timeout (300 s) and a margin.\nTimeoutStartSec=330\n";

/// The machine-config pool a node belongs to: control-plane nodes (also on compact clusters,
/// where they are workers too) are in `master`.
pub fn pool(node: &NodeSpec) -> &'static str {
    if node.roles.contains(&Role::ControlPlane) {
        "master"
    } else {
        "worker"
    }
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
            .and_then(|c| c.render().map_err(Into::into))
            .unwrap_err()
            .to_string()
    }

    /// SPLIT with the install's bootstrap node.
    fn with_bootstrap(extra: &str) -> String {
        SPLIT.replace(
            "[[nodes]]\nname = \"master-0\"",
            &format!(
                "[bootstrap]\naddress = \"192.168.111.10\"\n{extra}\n[[nodes]]\nname = \"master-0\""
            ),
        )
    }

    #[test]
    fn a_bootstrap_node_holds_the_api_vip_until_a_control_plane_load_balancer_is_ready() {
        let spec = ClusterSpec::parse(&with_bootstrap("interface = \"ens3\"")).unwrap();
        let b: IpAddr = "192.168.111.10".parse().unwrap();
        let masters: Vec<IpAddr> = ["192.168.111.20", "192.168.111.21"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let out = spec.render().unwrap();
        assert_eq!(out.len(), 4, "the bootstrap is not one of the nodes");
        for r in &out {
            let c = &r.config;
            let api = c.vrrp.iter().find(|i| i.name == "api");
            if r.node.starts_with("master") {
                // Control-plane nodes: the bootstrap is a VRRP peer and an API backend.
                let api = api.unwrap();
                assert!(api.unicast_peers.contains(&b), "{}", r.node);
                let backends: Vec<IpAddr> = c.vips[0].backends.iter().map(|x| x.address).collect();
                assert_eq!(backends, [masters[0], masters[1], b], "{}", r.node);
                // It is not a sync peer, nor in the ingress election.
                assert!(!c.sync.as_ref().unwrap().peers.contains(&b));
                assert!(
                    c.vrrp
                        .iter()
                        .filter(|i| i.name != "api")
                        .all(|i| !i.unicast_peers.contains(&b))
                );
            } else {
                assert!(api.is_none(), "{}", r.node);
                assert!(
                    c.vrrp.iter().all(|i| !i.unicast_peers.contains(&b)),
                    "{}",
                    r.node
                );
            }
        }
        let boot = spec
            .render_bootstrap()
            .unwrap()
            .expect("a bootstrap config");
        assert_eq!(boot.node, "bootstrap");
        let c = &boot.config;
        assert_eq!(c.interface, "ens3");
        // No br-ex on the bootstrap: the program attaches to its interface, in the
        // description's mode (not the generic mode of an OVS bridge).
        assert!(c.xdp_interfaces.is_empty());
        assert_eq!(c.xdp_mode, XdpMode::Auto);
        let names: Vec<&str> = c.vips.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["api"], "only the API VIPs");
        assert_eq!(c.vrrp.len(), 1);
        let i = &c.vrrp[0];
        assert_eq!(i.priority, BOOTSTRAP_PRIORITY);
        assert_eq!(
            i.vrid, out[0].config.vrrp[0].vrid,
            "the API instance's VRID"
        );
        assert_eq!(i.unicast_src, Some(b));
        assert_eq!(i.unicast_peers, masters);
        // The same backends as on the control-plane nodes: one Maglev table for the move.
        assert_eq!(c.vips[0].backends, out[0].config.vips[0].backends);
        assert!(c.track.is_empty() && c.sync.is_none() && c.members.is_none());
        assert!(c.metrics_tls.is_none());
        // Priorities: above a control-plane node with nothing ready (40 + 5 + 3), below one
        // whose load balancer is ready (40 + 20).
        assert!(BOOTSTRAP_PRIORITY > API_PRIORITY + (W_OCP_BOTH + W_MCS) as u8);
        assert!(BOOTSTRAP_PRIORITY < API_PRIORITY + W_OCP_LB as u8);
        // Without [bootstrap]: nothing for it, and the masters no longer name it.
        let after = ClusterSpec::parse(SPLIT).unwrap();
        assert!(after.render_bootstrap().unwrap().is_none());
        for r in after.render().unwrap() {
            assert!(r.config.vrrp.iter().all(|i| !i.unicast_peers.contains(&b)));
            assert!(
                r.config
                    .vips
                    .iter()
                    .all(|v| v.backends.iter().all(|x| x.address != b))
            );
        }
    }

    #[test]
    fn a_bad_bootstrap_is_refused_naming_its_field() {
        let e = |extra: &str| {
            ClusterSpec::parse(&with_bootstrap(extra))
                .unwrap_err()
                .to_string()
        };
        assert!(
            e("name = \"master-1\"").starts_with("bootstrap.name:"),
            "{}",
            e("name = \"master-1\"")
        );
        assert!(e("interface = \"\"").starts_with("bootstrap.interface:"));
        assert!(
            e("secondary_address = \"192.168.111.11\"").starts_with("bootstrap.secondary_address:")
        );
        let dup = SPLIT.replace(
            "[[nodes]]\nname = \"master-0\"",
            "[bootstrap]\naddress = \"192.168.111.21\"\n[[nodes]]\nname = \"master-0\"",
        );
        let d = ClusterSpec::parse(&dup).unwrap_err().to_string();
        assert!(
            d.starts_with("bootstrap.address:") && d.contains("node"),
            "{d}"
        );
        let vip = SPLIT.replace(
            "[[nodes]]\nname = \"master-0\"",
            "[bootstrap]\naddress = \"192.168.111.5\"\n[[nodes]]\nname = \"master-0\"",
        );
        let v = ClusterSpec::parse(&vip).unwrap_err().to_string();
        assert!(
            v.starts_with("bootstrap.address:") && v.contains("VIP"),
            "{v}"
        );
        let v6 = SPLIT.replace(
            "[[nodes]]\nname = \"master-0\"",
            "[bootstrap]\naddress = \"fd00::10\"\n[[nodes]]\nname = \"master-0\"",
        );
        let f = ClusterSpec::parse(&v6).unwrap_err().to_string();
        assert!(f.starts_with("bootstrap.address:"), "{f}");
        let typo = with_bootstrap("adress = \"192.168.111.12\"");
        assert!(
            ClusterSpec::parse(&typo)
                .unwrap_err()
                .to_string()
                .contains("adress")
        );
    }

    #[test]
    fn on_br_ex_the_program_attaches_below_the_bridge_when_an_uplink_is_named() {
        // No uplink named: br-ex itself, in generic mode (an OVS internal port has no other).
        let out = ClusterSpec::parse(COMPACT).unwrap().render().unwrap();
        for r in &out {
            assert_eq!(r.config.attach_interfaces(), vec!["br-ex"]);
            assert_eq!(r.config.xdp_mode, XdpMode::Skb);
        }
        // The uplink named for the cluster, and a node with a bond: driver mode below br-ex,
        // the VIPs still on br-ex.
        let text = COMPACT.replacen(
            "interface = \"br-ex\"\n",
            "interface = \"br-ex\"\nxdp_interfaces = [\"ens3\"]\n",
            1,
        );
        let text = text.replacen(
            "name = \"master-1\"\n",
            "name = \"master-1\"\nxdp_interfaces = [\"bond0\"]\n",
            1,
        );
        let out = ClusterSpec::parse(&text).unwrap().render().unwrap();
        let of = |n: &str| out.iter().find(|r| r.node == n).unwrap();
        assert_eq!(of("master-0").config.attach_interfaces(), vec!["ens3"]);
        assert_eq!(of("master-1").config.attach_interfaces(), vec!["bond0"]);
        for r in &out {
            assert_eq!(r.config.interface, "br-ex");
            assert_eq!(r.config.xdp_mode, XdpMode::Auto);
            // What lbd reads back is what render wrote.
            let back = Config::parse(&to_toml("ostest", r)).unwrap();
            assert_eq!(back.xdp_interfaces, r.config.xdp_interfaces);
        }
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
            let tracks: Vec<(&str, &str, i32, Option<&str>, bool)> = c
                .track
                .iter()
                .map(|t| {
                    (
                        t.instance.as_str(),
                        t.name.as_str(),
                        t.weight,
                        t.address.map(|_| t.health.path.as_str()),
                        t.or_lb_ready,
                    )
                })
                .collect();
            // OpenShift's tracked scripts and weights.
            assert_eq!(
                tracks,
                [
                    ("api", "chk_ocp_lb", 20, None, false),
                    ("api", "chk_ocp_both", 5, Some("/readyz"), true),
                    ("api", "chk_mcs", 3, Some(""), false),
                    ("ingress", "chk_ingress", 0, Some("/healthz"), false),
                    (
                        "ingress",
                        "chk_ingress_ready",
                        10,
                        Some("/healthz/ready"),
                        false
                    ),
                    (
                        "ingress",
                        "chk_default_ingress",
                        50,
                        Some("/healthz/ready"),
                        false
                    ),
                ]
            );
            assert_eq!(c.metrics_listen, Some("127.0.0.1:29444".parse().unwrap()));
            // What lbd reads back is what was rendered.
            let text = to_toml("ostest", r);
            assert_eq!(&Config::parse(&text).unwrap(), c);
        }
    }

    #[test]
    fn split_roles_get_their_own_instance_and_peers() {
        let out = ClusterSpec::parse(SPLIT).unwrap().render().unwrap();
        let m0 = &out[0].config;
        let ips = |v: &[&str]| {
            v.iter()
                .map(|a| a.parse().unwrap())
                .collect::<Vec<IpAddr>>()
        };
        assert_eq!(m0.vips.len(), 2);
        assert_eq!(m0.vrrp[0].name, "api");
        assert_eq!(m0.vrrp[0].unicast_peers, ips(&["192.168.111.21"]));
        // Masters are peers of the ingress instance too (FAULT without a router), and the
        // ingress backends stay the routers.
        assert_eq!(m0.vrrp[1].name, "ingress");
        assert_eq!(
            m0.vrrp[1].unicast_peers,
            ips(&["192.168.111.21", "192.168.111.30", "192.168.111.31"])
        );
        assert_eq!(m0.vips[1].backends.len(), 2);
        // A DSR backend of the API VIP, not of the ingress VIP (no router here): lbd holds
        // only the former on lo.
        let lo: Vec<bool> = m0
            .vrrp
            .iter()
            .map(|r| m0.backend_here(r, r.vips[0]))
            .collect();
        assert_eq!(lo, [true, false]);
        let w1 = &out[3].config;
        assert!(w1.backend_here(&w1.vrrp[0], w1.vrrp[0].vips[0]));
        assert_eq!(w1.vips.len(), 1);
        assert_eq!(w1.vips[0].name, "ingress");
        assert_eq!(w1.vrrp[0].vrid, 93);
        assert_eq!(
            w1.vrrp[0].unicast_peers,
            ips(&["192.168.111.20", "192.168.111.21", "192.168.111.30"])
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
        // VRRPv3 that also speaks VRRPv2: keepalived counts the v2 adverts, and the switch to
        // plain v3 later keeps the version (in place on reload).
        assert_eq!((api.version, api.v2_compat), (3, true));
        assert_eq!(api.advert_interval_ms, Some(1000));
        // "ostest_api_vip" cut to 8 bytes, as keepalived puts it on the wire.
        assert_eq!(api.auth_pass.as_deref(), Some("ostest_a"));
        assert_eq!(out[2].config.vrrp[0].auth_pass.as_deref(), Some("ostest_i"));
        // The switch once no keepalived is left: every instance applies it in place, and
        // none is refused by lbd's version rule.
        let done = ClusterSpec::parse(SPLIT).unwrap().render().unwrap();
        for (a, b) in out.iter().zip(&done) {
            for (x, y) in a.config.vrrp.iter().zip(&b.config.vrrp) {
                assert_eq!(x.restart_needed(y), None, "{}", a.node);
                assert_eq!(x.version_switch_refused(y), None);
                assert!(!y.v2_compat && y.auth_pass.is_none());
                assert_eq!(y.advert_interval_ms, Some(100));
            }
        }
    }

    #[test]
    fn dual_stack_vip_lists_get_an_instance_per_family_with_the_roles_vrid() {
        let text = SPLIT
            .replace(
                "api_vip = \"192.168.111.5\"",
                "api_vips = [\"192.168.111.5\", \"fd2e:6f44:5dd8::5\"]",
            )
            .replace(
                "ingress_vip = \"192.168.111.4\"",
                "ingress_vips = [\"192.168.111.4\", \"fd2e:6f44:5dd8::4\"]",
            )
            .replace(
                "address = \"192.168.111.20\"",
                "address = \"192.168.111.20\"\nsecondary_address = \"fd2e:6f44:5dd8::20\"",
            )
            .replace(
                "address = \"192.168.111.21\"",
                "address = \"192.168.111.21\"\nsecondary_address = \"fd2e:6f44:5dd8::21\"",
            )
            .replace(
                "address = \"192.168.111.30\"",
                "address = \"192.168.111.30\"\nsecondary_address = \"fd2e:6f44:5dd8::30\"",
            );
        // worker-1 lacks its IPv6 address.
        let e = err(&text);
        assert!(e.starts_with("nodes[3].secondary_address:"), "{e}");
        let text = text.replace(
            "address = \"192.168.111.31\"",
            "address = \"192.168.111.31\"\nsecondary_address = \"fd2e:6f44:5dd8::31\"",
        );
        let out = ClusterSpec::parse(&text).unwrap().render().unwrap();
        let m1 = &out[1].config;
        let inst: Vec<(&str, u8, String, Option<IpAddr>)> = m1
            .vrrp
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.vrid,
                    r.vips[0].to_string(),
                    r.unicast_src,
                )
            })
            .collect();
        assert_eq!(
            inst,
            [
                (
                    "api",
                    14,
                    "192.168.111.5".into(),
                    "192.168.111.21".parse().ok()
                ),
                (
                    "api-1",
                    14,
                    "fd2e:6f44:5dd8::5".into(),
                    "fd2e:6f44:5dd8::21".parse().ok()
                ),
                (
                    "ingress",
                    93,
                    "192.168.111.4".into(),
                    "192.168.111.21".parse().ok()
                ),
                (
                    "ingress-1",
                    93,
                    "fd2e:6f44:5dd8::4".into(),
                    "fd2e:6f44:5dd8::21".parse().ok()
                ),
            ]
        );
        // Each family's peers and backends are that family's addresses.
        assert_eq!(
            m1.vrrp[1].unicast_peers,
            ["fd2e:6f44:5dd8::20".parse::<IpAddr>().unwrap()]
        );
        assert!(m1.vips[3].backends.iter().all(|b| b.address.is_ipv6()));
        // Each instance tracks its own checks, on its family's loopback.
        let v6: Vec<&str> = m1
            .track
            .iter()
            .filter(|t| t.instance == "ingress-1")
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(
            v6,
            [
                "chk_ingress-1",
                "chk_ingress_ready-1",
                "chk_default_ingress-1"
            ]
        );
        assert!(
            m1.track
                .iter()
                .filter(|t| t.instance.ends_with("-1"))
                .all(|t| t
                    .address
                    .is_none_or(|a| a.ip() == IpAddr::from(std::net::Ipv6Addr::LOCALHOST)))
        );
        // Bare metal: each family's VIP is elected on its own; OpenStack groups them per role.
        assert!(m1.vrrp.iter().all(|r| r.group.is_none()));
        let stack = ClusterSpec::parse(&format!("platform = \"openstack\"\n{text}"))
            .unwrap()
            .render()
            .unwrap();
        let groups: Vec<(&str, Option<&str>)> = stack[1]
            .config
            .vrrp
            .iter()
            .map(|r| (r.name.as_str(), r.group.as_deref()))
            .collect();
        assert_eq!(
            groups,
            [
                ("api", Some("api")),
                ("api-1", Some("api")),
                ("ingress", Some("ingress")),
                ("ingress-1", Some("ingress"))
            ]
        );
        // The migration profile: IPv4 instances speak v2 too, IPv6 ones v3 (as keepalived).
        let mig = ClusterSpec::parse(&format!("vrrp_version = 2\n{text}"))
            .unwrap()
            .render()
            .unwrap();
        let flags: Vec<(bool, bool)> = mig[0]
            .config
            .vrrp
            .iter()
            .map(|r| (r.v2_compat, r.auth_pass.is_some()))
            .collect();
        assert_eq!(
            flags,
            [(true, true), (false, false), (true, true), (false, false)]
        );
        // Two VIPs of one family, both forms at once, three VIPs: refused by name.
        let e = err(&text.replace("fd2e:6f44:5dd8::5\"]", "192.168.111.6\"]"));
        assert!(e.starts_with("api_vips[1]:"), "{e}");
        let e = err(&format!("api_vip = \"192.168.111.7\"\n{text}"));
        assert!(e.starts_with("api_vips:"), "{e}");
        let e = err(&text.replace(
            "fd2e:6f44:5dd8::5\"]",
            "fd2e:6f44:5dd8::5\", \"192.168.111.9\"]",
        ));
        assert!(e.starts_with("api_vips:"), "{e}");
        let e = err(&text.replace("fd2e:6f44:5dd8::4\"]", "fd2e:6f44:5dd8::5\"]"));
        assert!(e.starts_with("ingress_vips[1]:"), "{e}");
    }

    #[test]
    fn nothing_lb_listens_on_is_an_openshift_port() {
        let spec = ClusterSpec::parse(SPLIT).unwrap();
        for r in spec.render().unwrap() {
            let m = r.config.metrics_listen.expect("probes need the listener");
            assert!(!openshift_port(m.port()), "{m}");
            let t = r
                .config
                .metrics_tls
                .as_ref()
                .expect("cluster monitoring scrapes it");
            assert!(!openshift_port(t.listen.port()), "{}", t.listen);
            assert_ne!(t.listen.port(), m.port());
            assert_eq!(t.cert_file, std::path::Path::new(KUBELET_SERVING_CERT));
            assert_eq!(t.client_ca_file, std::path::Path::new(KUBELET_CLIENT_CA));
        }
        for port in [9445, 29444] {
            let e = err(&format!("metrics_tls_port = {port}\n{SPLIT}"));
            assert!(e.starts_with("metrics_tls_port:"), "{port}: {e}");
        }
        let off = ClusterSpec::parse(&format!("metrics_tls_port = 0\n{SPLIT}")).unwrap();
        assert!(
            off.render()
                .unwrap()
                .iter()
                .all(|r| r.config.metrics_tls.is_none())
        );
        for port in [
            9443, 9444, 9445, 6443, 22623, 22624, 1936, 80, 443, 10250, 30080,
        ] {
            assert!(openshift_port(port), "{port}");
            let e = err(&format!("metrics_listen = \"127.0.0.1:{port}\"\n{SPLIT}"));
            assert!(e.starts_with("metrics_listen:"), "{port}: {e}");
        }
        assert!(ClusterSpec::parse(&format!("metrics_listen = \"0.0.0.0:8444\"\n{SPLIT}")).is_ok());
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
    fn control_plane_nodes_are_in_the_master_pool() {
        let spec = ClusterSpec::parse(SPLIT).unwrap();
        let pools: Vec<&str> = spec.nodes.iter().map(pool).collect();
        assert_eq!(pools, ["master", "master", "worker", "worker"]);
        let compact = ClusterSpec::parse(COMPACT).unwrap();
        assert!(compact.nodes.iter().all(|n| pool(n) == "master"));
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
        // The migration profile on IPv6: VRRPv3 (keepalived speaks v3 for IPv6) at 1 s, no
        // password.
        let mig = ClusterSpec::parse(&format!("vrrp_version = 2\n{text}"))
            .unwrap()
            .render()
            .unwrap();
        let r = &mig[0].config.vrrp[0];
        assert_eq!(
            (r.version, r.v2_compat, r.advert_interval_ms),
            (3, false, Some(1000))
        );
        assert_eq!(r.auth_pass, None);
        // Every node runs lbd: IPv6 unicast adverts only from on-link (hop limit 255), every
        // peer; while keepalived may run (it sends 64), no bounds.
        for r in &out[0].config.vrrp {
            assert!(!r.unicast_peers.is_empty());
            let bounded: Vec<(IpAddr, u8, u8)> = r
                .unicast_peer_ttl
                .iter()
                .map(|t| (t.address, t.min_ttl, t.max_ttl))
                .collect();
            let want: Vec<(IpAddr, u8, u8)> =
                r.unicast_peers.iter().map(|a| (*a, 255, 255)).collect();
            assert_eq!(bounded, want, "{}", r.name);
        }
        assert!(
            mig[0]
                .config
                .vrrp
                .iter()
                .all(|r| r.unicast_peer_ttl.is_empty())
        );
    }

    #[test]
    fn many_workers_share_half_the_connection_table_for_their_peers_exceptions() {
        // Ten workers: nine peers each, 9 x the default max_entries would be more than half of
        // the default connection table (refused by lbd's own checks).
        let mut text = SPLIT.to_string();
        for i in 2..10 {
            text += &format!(
                "[[nodes]]\nname = \"worker-{i}\"\naddress = \"192.168.111.{}\"\nroles = [\"worker\"]\n",
                30 + i
            );
        }
        let rendered = ClusterSpec::parse(&text).unwrap().render().unwrap();
        let w = rendered
            .iter()
            .find(|r| r.config.sync.as_ref().is_some_and(|s| s.peers.len() == 9))
            .expect("a worker with nine peers");
        let s = w.config.sync.as_ref().unwrap();
        assert_eq!(
            s.max_entries,
            lb_common::DEFAULT_CONNTRACK_SIZE / 2 / 9,
            "the share of nine peers"
        );
        for r in &rendered {
            r.config.validate().unwrap();
        }
        // Three control-plane nodes keep the default.
        let compact = ClusterSpec::parse(COMPACT).unwrap().render().unwrap();
        assert_eq!(
            compact[0].config.sync.as_ref().unwrap().max_entries,
            crate::config::sync::DEFAULT_MAX_ENTRIES
        );
    }

    #[test]
    fn sync_peers_are_the_nodes_that_forward_the_same_vips() {
        let with = |text: &str| {
            // `[sync]` after the nodes is still a top-level table.
            let t = format!("{text}\n[sync]\nkey_file = \"/etc/lb/sync.key\"\n");
            ClusterSpec::parse(&t).unwrap().render().unwrap()
        };
        let peers = |r: &Rendered| -> Vec<String> {
            let s = r.config.sync.as_ref().expect("a [sync] section");
            assert_eq!(s.key_file, PathBuf::from("/etc/lb/sync.key"));
            assert_eq!(s.port, crate::config::sync::DEFAULT_PORT);
            s.peers.iter().map(|p| p.to_string()).collect()
        };
        let split = with(SPLIT);
        assert_eq!(peers(&split[0]), ["192.168.111.21"]);
        assert_eq!(peers(&split[1]), ["192.168.111.20"]);
        assert_eq!(peers(&split[2]), ["192.168.111.31"]);
        assert_eq!(peers(&split[3]), ["192.168.111.30"]);
        let compact = with(COMPACT);
        assert_eq!(peers(&compact[1]), ["192.168.111.20", "192.168.111.22"]);
        // Every rendered config passes lbd's own checks, the key file read at start only.
        for r in &compact {
            r.config.validate().unwrap();
        }
        // Without the section: sync on, with the cluster key render makes.
        let default = ClusterSpec::parse(SPLIT).unwrap().render().unwrap();
        for r in &default {
            let s = r.config.sync.as_ref().expect("sync on by default");
            assert_eq!(s.key_file, PathBuf::from(DEFAULT_KEY_FILE));
            let m = r.config.members.as_ref().expect("members on every node");
            assert_eq!(m.key_file, PathBuf::from(DEFAULT_KEY_FILE));
        }
        // Turned off: no sync; the announcements stay (same key).
        let off = ClusterSpec::parse(&format!("{SPLIT}\n[sync]\nenabled = false\n"))
            .unwrap()
            .render()
            .unwrap();
        assert!(
            off.iter()
                .all(|r| r.config.sync.is_none() && r.config.members.is_some())
        );
        // A node with nobody to sync with is refused, naming the node and the field.
        let lone = SPLIT.replace("roles = [\"control-plane\"]\n[[nodes]]\nname = \"master-1\"\naddress = \"192.168.111.21\"\nroles = [\"control-plane\"]", "roles = [\"control-plane\"]");
        assert_ne!(lone, SPLIT);
        let e = err(&format!("{lone}\n[sync]\nkey_file = \"/k\"\n"));
        assert!(e.contains("(master-0): sync.peers"), "{e}");
        // By default such a node just has no sync.
        let lone_default = ClusterSpec::parse(&lone).unwrap().render().unwrap();
        assert!(lone_default[0].config.sync.is_none());
        assert!(lone_default[1].config.sync.is_some());
        let e = err(&format!(
            "{SPLIT}\n[sync]\nkey_file = \"/k\"\ninterval_ms = 5\n"
        ));
        assert!(e.contains("sync.interval_ms"), "{e}");
    }
}
