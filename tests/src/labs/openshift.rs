//! What OpenShift runs today on an on-prem node, rendered from lb's cluster description
//! ([`lb_userspace::render::ClusterSpec`]), for labs that put a real keepalived next to lbd.
//!
//! The keepalived.conf follows the machine-config-operator's on-prem template as
//! baremetal-runtimecfg fills it (read there, written here): one `<cluster>_API_<i>` and one
//! `<cluster>_INGRESS_<i>` instance per VIP pair, `state BACKUP`, priorities 40 and 20,
//! `advert_int 1`, PASS authentication with `<cluster>_api_vip` / `<cluster>_ingress_vip`,
//! unicast peers (API: the control-plane nodes; ingress: every node), the VRIDs runtimecfg
//! derives from the cluster name, and the tracked scripts with OpenShift's weights, intervals,
//! rise and fall. Only the scripts' commands are the lab's own ([`Checks`]).
//!
//! Also the API path of a control-plane node: haproxy's config ([`haproxy_api_cfg`]) and
//! haproxy-monitor's nftables redirect ([`ocp_nat_rules`]).

use std::net::IpAddr;

use lb_userspace::render::{ClusterSpec, NodeSpec, Role, node_address};

use super::keepalived_haproxy::{Globals, Instance, global_defs, vrrp_script};

/// The commands of OpenShift's tracked scripts on one node (each one exits 0 for "passing").
#[derive(Clone, Debug)]
pub struct Checks {
    /// `chk_ocp_lb`: the local haproxy is ready (and its nftables redirect is in place).
    pub ocp_lb: String,
    /// `chk_ocp_both`: `chk_ocp_lb` OR the local apiserver is ready.
    pub ocp_both: String,
    /// `chk_mcs`: the machine-config server runs here.
    pub mcs: String,
    /// `chk_ingress`: the router's /healthz (weight 0: FAULT while it fails).
    pub ingress: String,
    /// `chk_ingress_ready`: the router's /healthz/ready.
    pub ingress_ready: String,
    /// `chk_default_ingress`: a default router pod is ready here.
    pub default_ingress: String,
}

/// (name, command, interval s, weight, rise, fall) of one of OpenShift's vrrp_scripts.
type Script<'a> = (&'static str, &'a str, u32, Option<i32>, u32, u32);

fn scripts(c: &Checks, control_plane: bool) -> Vec<Script<'_>> {
    let mut v = Vec::new();
    if control_plane {
        v.push(("chk_ocp_lb", c.ocp_lb.as_str(), 2, Some(20), 3, 3));
        v.push(("chk_ocp_both", c.ocp_both.as_str(), 2, Some(5), 3, 3));
        v.push(("chk_mcs", c.mcs.as_str(), 2, Some(3), 3, 3));
    }
    v.push((
        "chk_ingress_ready",
        c.ingress_ready.as_str(),
        1,
        Some(10),
        3,
        2,
    ));
    // No weight: keepalived's 0, FAULT while failing.
    v.push(("chk_ingress", c.ingress.as_str(), 1, None, 3, 2));
    v.push((
        "chk_default_ingress",
        c.default_ingress.as_str(),
        5,
        Some(50),
        3,
        2,
    ));
    v
}

/// keepalived.conf of node `me` of `spec`. `chk_mcs` is tracked when the API serves 22623
/// (as lb renders it).
pub fn keepalived_conf(spec: &ClusterSpec, me: &NodeSpec, checks: &Checks) -> String {
    let control_plane = me.roles.contains(&Role::ControlPlane);
    let mut c = global_defs(&Globals {
        scripts: true,
        max_auto_priority: true,
        ..Default::default()
    });
    for (name, cmd, interval, weight, rise, fall) in scripts(checks, control_plane) {
        c += &vrrp_script(name, cmd, interval, weight, rise, fall);
    }
    let (api_vrid, ingress_vrid) = spec.vrids();
    let api = spec.api_vips();
    let ingress = spec.ingress_vips();
    let mcs = spec.api_ports.contains(&22623);
    let control: Vec<&NodeSpec> = spec
        .nodes
        .iter()
        .filter(|n| n.roles.contains(&Role::ControlPlane))
        .collect();
    let all: Vec<&NodeSpec> = spec.nodes.iter().collect();
    for i in 0..api.len().max(ingress.len()) {
        if control_plane && let Some(vip) = api.get(i) {
            let mut tracks = vec!["chk_ocp_lb", "chk_ocp_both"];
            if mcs {
                tracks.push("chk_mcs");
            }
            c += &instance(
                spec,
                &format!("{}_API_{i}", spec.name),
                api_vrid,
                40,
                &format!("{}_api_vip", spec.name),
                *vip,
                me,
                &control,
                &tracks,
            );
        }
        if let Some(vip) = ingress.get(i) {
            c += &instance(
                spec,
                &format!("{}_INGRESS_{i}", spec.name),
                ingress_vrid,
                20,
                &format!("{}_ingress_vip", spec.name),
                *vip,
                me,
                &all,
                &["chk_ingress", "chk_ingress_ready", "chk_default_ingress"],
            );
        }
    }
    c
}

#[allow(clippy::too_many_arguments)]
fn instance(
    spec: &ClusterSpec,
    name: &str,
    vrid: u8,
    priority: u8,
    pass: &str,
    vip: IpAddr,
    me: &NodeSpec,
    peers: &[&NodeSpec],
    tracks: &[&str],
) -> String {
    let v4 = vip.is_ipv4();
    let src = node_address(me, v4).expect("the node has an address of the VIP's family");
    let peers = peers
        .iter()
        .filter(|p| p.name != me.name)
        .filter_map(|p| node_address(p, v4))
        .map(|a| a.to_string())
        .collect();
    Instance {
        name,
        interface: &spec.interface,
        vrid,
        priority,
        advert: "1".into(),
        preempt: true,
        unicast: Some((src.to_string(), peers)),
        auth_pass: Some(pass.into()),
        vip: format!("{vip}/{}", if v4 { 32 } else { 128 }),
        // The kernel wants an IPv4 label to start with the interface name (OpenShift's "vip").
        label: v4.then(|| format!("{}:vip", spec.interface)),
        track_scripts: tracks.to_vec(),
    }
    .render()
        + "\n"
}

/// What OpenShift's election makes of one node's checks (keepalived's rules): `None` in FAULT,
/// else the effective priority.
pub fn ingress_priority(live: bool, ready: bool, default_ready: bool) -> Option<u8> {
    live.then_some(20 + if ready { 10 } else { 0 } + if default_ready { 50 } else { 0 })
}

/// The API instance's effective priority from its tracked scripts.
pub fn api_priority(lb: bool, both: bool, mcs: bool) -> u8 {
    40 + if lb { 20 } else { 0 } + if both { 5 } else { 0 } + if mcs { 3 } else { 0 }
}

/// Who may own the VIP after an election among `(address, priority or FAULT)`: the nodes of
/// the highest priority (none when every node is in FAULT). VRRP breaks a tie by address only
/// between two masters; a backup never preempts a master of equal priority, so which of tied
/// nodes holds the VIP depends on who held it first.
pub fn top(candidates: &[(IpAddr, Option<u8>)]) -> Vec<IpAddr> {
    let best = candidates.iter().filter_map(|(_, p)| *p).max();
    candidates
        .iter()
        .filter(|(_, p)| best.is_some() && *p == best)
        .map(|(a, _)| *a)
        .collect()
}

/// The port haproxy listens on for the API on an OpenShift node (its `ocp_nat` redirect's
/// target).
pub const HAPROXY_API_PORT: u16 = 9445;
/// The apiserver's port, where haproxy's checks ask `/readyz` over TLS.
pub const APISERVER_PORT: u16 = 6443;

/// haproxy.cfg of a control-plane node as OpenShift's on-prem haproxy balances the API: TCP
/// mode on [`HAPROXY_API_PORT`], round robin over every control-plane node, each checked with
/// `GET /readyz` over TLS without verification (`check-ssl verify none`) on the apiserver's
/// port. `servers` are `(address, port)` of the traffic; in the labs the readiness endpoint
/// may be another process than the one carrying the traffic, hence `port` on the check.
pub fn haproxy_api_cfg(servers: &[(String, u16)]) -> String {
    let mut c = format!(
        "global\n    maxconn 4096\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n    timeout check 2s\nlisten api\n    bind :::{HAPROXY_API_PORT} v4v6\n    mode tcp\n    balance roundrobin\n    option httpchk GET /readyz HTTP/1.0\n    http-check expect status 200\n"
    );
    for (k, (addr, port)) in servers.iter().enumerate() {
        c += &format!(
            "    server s{k} {addr}:{port} check check-ssl verify none port {APISERVER_PORT} inter 5s fall 3 rise 1\n"
        );
    }
    c
}

/// The nftables table haproxy-monitor installs (`ocp_nat`): VIP:`port` redirected to the
/// local haproxy both for traffic arriving at the node (PREROUTING) and for the node's own
/// connections (OUTPUT: kubelet and host-network pods reach the API through haproxy too).
pub fn ocp_nat_rules(vip: IpAddr, port: u16) -> String {
    let (family, daddr) = if vip.is_ipv4() {
        ("ip", "ip daddr")
    } else {
        ("ip6", "ip6 daddr")
    };
    let rule = format!("{daddr} {vip} tcp dport {port} redirect to :{HAPROXY_API_PORT}");
    format!(
        "table {family} ocp_nat {{\n  chain PREROUTING {{\n    type nat hook prerouting priority -100;\n    {rule}\n  }}\n  chain OUTPUT {{\n    type nat hook output priority -100;\n    {rule}\n  }}\n}}\n"
    )
}
