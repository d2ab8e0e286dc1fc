//! IngressController shards: an extra ingress VIP (or a dual-stack pair) per IngressController
//! that publishes its routers on the host network with its own ports, served by the nodes its
//! `nodePlacement.nodeSelector` picks, rendered beside the default ingress VIP. Pure.
//!
//! Each shard gets its own VRRP instance (`ingress-<shard>`, peers: the selected nodes), its own
//! backends (the selected nodes) checked on its own router's readiness (`/healthz/ready` on its
//! stats port), and its own tracked checks. So a node that runs the default router and a shard's
//! router serves each VIP by the readiness of that VIP's router only, and a router of another
//! controller on the node never answers for a VIP that is not its own.

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};

use super::{
    ClusterSpec, INGRESS_PRIORITY, NodeSpec, Platform, ROUTER_STATS_PORT, Role, W_DEFAULT_INGRESS,
    W_INGRESS, backend, check_vip_list, checks, indexed, loopback, node_address,
};
use crate::{
    config::health::CheckKind,
    config::{Config, ConfigErrors, TrackConfig, VipConfig},
    vrrp::vrids::openshift_vrids,
};

/// One IngressController shard (`[[ingress_shards]]` of the cluster description).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngressShard {
    /// The IngressController's name (`metadata.name`, e.g. `internal`): names its VIP
    /// (`ingress-<name>`), VRRP instance and tracked checks.
    pub name: String,
    /// Its VIPs: one, or an IPv4 and an IPv6 one.
    pub vips: Vec<IpAddr>,
    /// The host ports its routers serve on (`endpointPublishingStrategy.hostNetwork.httpPort`
    /// and `httpsPort`): the VIP's service ports (L2 DSR keeps the port).
    #[serde(default = "super::default_ingress_ports")]
    pub ports: Vec<u16>,
    /// Its routers' stats port (`hostNetwork.statsPort`): readiness at `/healthz/ready` there.
    pub stats_port: u16,
    /// `nodePlacement.nodeSelector.matchLabels`: the nodes whose `labels` hold all of these;
    /// empty: every worker (as the default IngressController).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Its VRRP instance's VRID; default: runtimecfg's ingress VRID of `<cluster>-<shard>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrid: Option<u8>,
}

impl IngressShard {
    /// The VIP (and instance) name of its `i`-th VIP.
    pub fn vip_name(&self, i: usize) -> String {
        indexed(&format!("ingress-{}", self.name), i)
    }

    /// Whether node `n` runs this shard's routers.
    pub fn selects(&self, n: &NodeSpec) -> bool {
        if self.node_selector.is_empty() {
            return n.roles.contains(&Role::Worker);
        }
        self.node_selector
            .iter()
            .all(|(k, v)| n.labels.get(k) == Some(v))
    }

    fn vrid_in(&self, cluster: &str) -> u8 {
        self.vrid
            .unwrap_or_else(|| openshift_vrids(&format!("{cluster}-{}", self.name)).1)
    }
}

impl ClusterSpec {
    /// The shards' part of [`ClusterSpec::validate`]: names, VIPs, ports and VRIDs that cannot
    /// clash with the default ingress, the API or each other.
    pub(super) fn validate_shards(&self, errors: &mut ConfigErrors) {
        let (api_vrid, ingress_vrid) = self.vrids();
        let mut taken_vips: Vec<IpAddr> = self.api_vips();
        taken_vips.extend(self.ingress_vips());
        let mut vrids = vec![(api_vrid, "the API VIP".to_string())];
        if !self.ingress_vips().is_empty() {
            vrids.push((ingress_vrid, "the default ingress VIP".to_string()));
        }
        let mut names = HashSet::new();
        let default_ingress = (!self.ingress_vips().is_empty()).then(|| {
            (
                "the default IngressController".to_string(),
                self.ingress_ports.clone(),
                ROUTER_STATS_PORT,
                self.routers()
                    .into_iter()
                    .map(|n| n.name.clone())
                    .collect::<Vec<_>>(),
            )
        });
        let mut placed: Vec<(String, Vec<u16>, u16, Vec<String>)> =
            default_ingress.into_iter().collect();
        for (i, s) in self.ingress_shards.iter().enumerate() {
            let f = format!("ingress_shards[{i}]");
            let ok_name = !s.name.is_empty()
                && s.name.len() <= 40
                && s.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok_name || s.name == "default" {
                errors.add(
                    format!("{f}.name"),
                    format!(
                        "{:?}: lower-case letters, digits and '-', at most 40, not \"default\" (the default IngressController is ingress_vip)",
                        s.name
                    ),
                );
            }
            if !names.insert(s.name.as_str()) {
                errors.add(format!("{f}.name"), "two shards of this name");
            }
            let mut vips = ConfigErrors::new();
            check_vip_list(&format!("{f}.vip"), None, &s.vips, true, &mut vips);
            for e in vips {
                errors.add(format!("{f}.vips"), e.reason);
            }
            for (j, v) in s.vips.iter().enumerate() {
                if taken_vips.contains(v) {
                    errors.add(
                        format!("{f}.vips[{j}]"),
                        format!("{v} is already a VIP of the cluster"),
                    );
                }
                if self
                    .nodes
                    .iter()
                    .any(|n| node_address(n, v.is_ipv4()) == Some(*v))
                {
                    errors.add(format!("{f}.vips[{j}]"), "is a node's address");
                }
                taken_vips.push(*v);
            }
            if s.ports.is_empty() || s.ports.contains(&0) {
                errors.add(format!("{f}.ports"), "one or more ports, 1-65535");
            }
            if s.stats_port == 0 {
                errors.add(format!("{f}.stats_port"), "must be 1-65535");
            }
            let selected: Vec<&NodeSpec> = self.nodes.iter().filter(|n| s.selects(n)).collect();
            if selected.is_empty() {
                errors.add(
                    format!("{f}.node_selector"),
                    "selects no node (labels are matched against nodes[].labels)",
                );
            }
            for n in &selected {
                for v in &s.vips {
                    if node_address(n, v.is_ipv4()).is_none() {
                        errors.add(
                            format!("{f}.vips"),
                            format!(
                                "node {} has no address of {v}'s family (secondary_address)",
                                n.name
                            ),
                        );
                    }
                }
            }
            // Routers of two controllers on one node cannot share a host port.
            let nodes: Vec<String> = selected.iter().map(|n| n.name.clone()).collect();
            for (other, ports, stats, on) in &placed {
                let Some(shared) = nodes.iter().find(|n| on.contains(n)) else {
                    continue;
                };
                if let Some(p) = s.ports.iter().find(|p| ports.contains(p)) {
                    errors.add(
                        format!("{f}.ports"),
                        format!("port {p} is also {other}'s, whose routers share node {shared}"),
                    );
                }
                if s.stats_port == *stats || ports.contains(&s.stats_port) {
                    errors.add(
                        format!("{f}.stats_port"),
                        format!(
                            "port {} is also {other}'s, whose routers share node {shared}",
                            s.stats_port
                        ),
                    );
                }
            }
            placed.push((
                format!("shard {}", s.name),
                s.ports.clone(),
                s.stats_port,
                nodes,
            ));
            let vrid = s.vrid_in(&self.name);
            if vrid == 0 {
                errors.add(format!("{f}.vrid"), "must be 1-255");
            }
            if let Some((_, whose)) = vrids.iter().find(|(v, _)| *v == vrid) {
                errors.add(
                    format!("{f}.vrid"),
                    format!("VRID {vrid} is also {whose}'s: set another one"),
                );
            }
            vrids.push((vrid, format!("shard {}", s.name)));
        }
    }

    /// The shards node `me` serves: their VIPs, VRRP instances and tracked checks, added to
    /// `cfg` after the default ingress VIP.
    pub(super) fn render_shards(&self, me: &NodeSpec, cfg: &mut Config) {
        for s in self.ingress_shards.iter().filter(|s| s.selects(me)) {
            let group: Vec<&NodeSpec> = self.nodes.iter().filter(|n| s.selects(n)).collect();
            let first = cfg.vrrp.len();
            for (i, vip) in s.vips.iter().copied().enumerate() {
                let name = s.vip_name(i);
                cfg.vips.push(VipConfig {
                    announce: crate::config::Announce::Owner,
                    name: name.clone(),
                    address: vip,
                    ports: s.ports.clone(),
                    protocol: crate::config::Protocol::Tcp,
                    owned: None,
                    vrrp: Some(name.clone()),
                    health: checks::router_health(s.stats_port),
                    backends: group
                        .iter()
                        .filter_map(|n| node_address(n, vip.is_ipv4()))
                        .map(backend)
                        .collect(),
                });
                cfg.vrrp.push(self.instance(
                    (&name, &name),
                    s.vrid_in(&self.name),
                    INGRESS_PRIORITY,
                    vip,
                    me,
                    &group,
                ));
                let router = |script: &str, weight: i32, path: &str| {
                    let mut t = TrackConfig {
                        instance: name.clone(),
                        name: indexed(&format!("{script}_{}", s.name), i),
                        weight,
                        address: Some(SocketAddr::new(loopback(vip), s.stats_port)),
                        or_lb_ready: false,
                        health: crate::config::health::HealthConfig::http(path),
                    };
                    t.health.kind = CheckKind::Http;
                    (t.health.rise, t.health.fall) = checks::track_counts(script);
                    t
                };
                // FAULT while this shard's router is not alive here; +50 while it is ready
                // (the shard's `chk_ingress` and `chk_default_ingress`).
                cfg.track
                    .push(router("chk_ingress", W_INGRESS, checks::ROUTER_LIVE_PATH));
                cfg.track.push(router(
                    "chk_ingress_ready",
                    W_DEFAULT_INGRESS,
                    checks::ROUTER_READY_PATH,
                ));
            }
            // Both families of a shard move together where the platform asks for it.
            if self.platform == Platform::Openstack && s.vips.len() > 1 {
                for r in &mut cfg.vrrp[first..] {
                    r.group = Some(s.vip_name(0));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// worker-0 runs the default router and the `internal` shard's; worker-1 only the default.
    const SHARDED: &str = r#"
name = "ostest"
interface = "br-ex"
api_vip = "192.168.111.5"
ingress_vip = "192.168.111.4"
[[ingress_shards]]
name = "internal"
vips = ["192.168.111.7"]
ports = [10080, 10443]
stats_port = 10936
node_selector = { "node-role.kubernetes.io/infra" = "" }
[[nodes]]
name = "master-0"
address = "192.168.111.20"
roles = ["control-plane"]
[[nodes]]
name = "worker-0"
address = "192.168.111.30"
roles = ["worker"]
labels = { "node-role.kubernetes.io/infra" = "" }
[[nodes]]
name = "worker-1"
address = "192.168.111.31"
roles = ["worker"]
"#;

    fn err(text: &str) -> String {
        ClusterSpec::parse(text)
            .and_then(|s| s.render().map_err(Into::into))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_node_with_two_routers_serves_each_vip_by_its_own_routers_readiness() {
        let spec = ClusterSpec::parse(SHARDED).unwrap();
        let out = spec.render().unwrap();
        let w0 = &out[1].config;
        let names: Vec<&str> = w0.vips.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["ingress", "ingress-internal"]);
        let (default, shard) = (&w0.vips[0], &w0.vips[1]);
        assert_eq!(
            (default.health.path.as_str(), default.health.port),
            ("/healthz/ready", Some(1936))
        );
        assert_eq!(
            (shard.health.path.as_str(), shard.health.port),
            ("/healthz/ready", Some(10936))
        );
        assert!(default.health.absent_when_refused && shard.health.absent_when_refused);
        assert_eq!(shard.ports, [10080, 10443]);
        assert_eq!(shard.address, "192.168.111.7".parse::<IpAddr>().unwrap());
        // The shard's backends and VRRP peers are the nodes it selects; the default's all
        // workers.
        let addrs = |v: &VipConfig| {
            v.backends
                .iter()
                .map(|b| b.address.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(addrs(shard), ["192.168.111.30"]);
        assert_eq!(addrs(default), ["192.168.111.30", "192.168.111.31"]);
        let inst = |n: &str| w0.vrrp.iter().find(|r| r.name == n).unwrap();
        assert!(inst("ingress-internal").unicast_peers.is_empty());
        assert_ne!(inst("ingress-internal").vrid, inst("ingress").vrid);
        assert_eq!(
            inst("ingress-internal").vrid,
            openshift_vrids("ostest-internal").1
        );
        // Its tracked checks probe its own stats port.
        let tracks: Vec<(&str, i32, u16, &str)> = w0
            .track
            .iter()
            .filter(|t| t.instance == "ingress-internal")
            .map(|t| {
                (
                    t.name.as_str(),
                    t.weight,
                    t.address.unwrap().port(),
                    t.health.path.as_str(),
                )
            })
            .collect();
        assert_eq!(
            tracks,
            [
                ("chk_ingress_internal", 0, 10936, "/healthz"),
                ("chk_ingress_ready_internal", 50, 10936, "/healthz/ready"),
            ]
        );
        // worker-1 runs no router of the shard: no shard VIP; the API node neither.
        let w1 = &out[2].config;
        assert!(w1.vips.iter().all(|v| v.name != "ingress-internal"));
        assert!(
            out[0]
                .config
                .vips
                .iter()
                .all(|v| v.name != "ingress-internal")
        );
        // The description round-trips.
        let back: ClusterSpec = toml::from_str(&toml::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn clashes_are_refused_naming_the_field() {
        let with = |from: &str, to: &str| SHARDED.replacen(from, to, 1);
        let e = err(&with("ports = [10080, 10443]", "ports = [80, 10443]"));
        assert!(
            e.starts_with("ingress_shards[0].ports:") && e.contains("node worker-0"),
            "{e}"
        );
        let e = err(&with("stats_port = 10936", "stats_port = 1936"));
        assert!(e.starts_with("ingress_shards[0].stats_port:"), "{e}");
        let e = err(&with(
            "vips = [\"192.168.111.7\"]",
            "vips = [\"192.168.111.4\"]",
        ));
        assert!(e.starts_with("ingress_shards[0].vips[0]:"), "{e}");
        let e = err(&with("vips = [\"192.168.111.7\"]", "vips = []"));
        assert!(e.starts_with("ingress_shards[0].vips:"), "{e}");
        let e = err(&with("name = \"internal\"", "name = \"Internal\""));
        assert!(e.starts_with("ingress_shards[0].name:"), "{e}");
        let e = err(&with(
            "\"node-role.kubernetes.io/infra\" = \"\" }",
            "\"nope\" = \"x\" }",
        ));
        assert!(e.starts_with("ingress_shards[0].node_selector:"), "{e}");
        let api_vrid = openshift_vrids("ostest").0;
        let e = err(&with(
            "stats_port = 10936",
            &format!("stats_port = 10936\nvrid = {api_vrid}"),
        ));
        assert!(e.starts_with("ingress_shards[0].vrid:"), "{e}");
        let e = err(&with("stats_port = 10936", "stats_port = 10936\nbogus = 1"));
        assert!(e.contains("bogus"), "{e}");
        // Routers on different nodes may share ports.
        let apart = with("ports = [10080, 10443]", "ports = [80, 443]")
            .replacen("stats_port = 10936", "stats_port = 1936", 1)
            .replacen(
                "roles = [\"worker\"]\nlabels",
                "roles = [\"control-plane\"]\nlabels",
                1,
            );
        ClusterSpec::parse(&apart).unwrap().render().unwrap();
    }
}
