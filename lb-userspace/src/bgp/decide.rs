//! Which VIP prefixes this node announces, and why the others are withdrawn. Pure: a function of
//! the config, the plan's backend rows and two operator/lifecycle facts.
//!
//! A node announces a VIP's host route (/32, /128) when it is ready to serve it: every BGP VIP
//! on that address has an active backend here (the same readiness VRRP tracks), the operator has
//! not drained the node, and lbd is not stopping. The data plane forwards a BGP VIP whether or
//! not it is announced, so packets still in flight towards a withdrawn node are served.

use std::net::IpAddr;

use serde::Serialize;

use super::BgpVip;
use crate::plan::{BackendPlan, BackendState};

/// Node-wide facts that withdraw every prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// `lbctl bgp drain`: the operator takes this node out of the ECMP group.
    pub drained: bool,
    /// lbd is shutting down.
    pub stopping: bool,
    /// The XDP program is not attached to the interface (re-attach failed, interface gone):
    /// this node cannot serve what it would announce.
    pub detached: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrefixDecision {
    /// The VIP address; announced as a host route.
    pub prefix: IpAddr,
    pub prefix_len: u8,
    /// The BGP VIPs (config names) on this address.
    pub vips: Vec<String>,
    pub announce: bool,
    /// Why (the first reason that withdraws it, or what makes it announced).
    pub reason: String,
}

/// One decision per distinct address of the VIPs with `announce = "bgp"`, in config order.
pub fn decide(vips: &[BgpVip], rows: &[BackendPlan], node: NodeState) -> Vec<PrefixDecision> {
    let mut out: Vec<PrefixDecision> = Vec::new();
    for v in vips {
        if let Some(d) = out.iter_mut().find(|d| d.prefix == v.address) {
            d.vips.push(v.name.clone());
            continue;
        }
        out.push(PrefixDecision {
            prefix: v.address,
            prefix_len: if v.address.is_ipv4() { 32 } else { 128 },
            vips: vec![v.name.clone()],
            announce: false,
            reason: String::new(),
        });
    }
    for d in &mut out {
        let not_ready: Vec<String> = d
            .vips
            .iter()
            .filter(|name| {
                !rows
                    .iter()
                    .any(|r| &r.vip == *name && r.state.serves())
            })
            .map(|name| {
                let mine: Vec<&BackendPlan> = rows.iter().filter(|r| &r.vip == name).collect();
                let count = |s: BackendState| mine.iter().filter(|r| r.state == s).count();
                format!(
                    "VIP {name} has no active backend ({} down, {} drained, {} unresolved, {} disabled)",
                    count(BackendState::Down),
                    count(BackendState::Drained),
                    count(BackendState::Unresolved),
                    count(BackendState::Disabled),
                )
            })
            .collect();
        (d.announce, d.reason) = if node.stopping {
            (false, "lbd is stopping".into())
        } else if node.detached {
            (false, "XDP program not attached to the interface".into())
        } else if node.drained {
            (false, "node drained by operator (lbctl bgp drain)".into())
        } else if !not_ready.is_empty() {
            (false, not_ready.join("; "))
        } else {
            (
                true,
                "ready: every VIP on this address has an active backend".into(),
            )
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::Config,
        plan::{Facts, HealthFact, plan},
    };

    const CFG: &str = r#"
interface = "eth0"
[[bgp]]
asn = 65001
[[bgp.peers]]
address = "10.0.0.1"
asn = 65000
[[vips]]
name = "api"
address = "10.9.0.5"
ports = [6443]
announce = "bgp"
[[vips.backends]]
address = "10.0.0.21"
[[vips.backends]]
address = "10.0.0.22"
[[vips]]
name = "mcs"
address = "10.9.0.5"
ports = [22623]
announce = "bgp"
[[vips.backends]]
address = "10.0.0.21"
[[vips]]
name = "web6"
address = "fd00::5"
ports = [443]
announce = "bgp"
[[vips.backends]]
address = "fd00::21"
[[vips]]
name = "elected"
address = "10.9.0.7"
owned = true
ports = [80]
[[vips.backends]]
address = "10.0.0.21"
"#;

    fn facts() -> Facts {
        let mut f = Facts::default();
        for (a, n) in [("10.0.0.21", 1), ("10.0.0.22", 2), ("fd00::21", 3)] {
            f.macs.insert(a.parse().unwrap(), [2, 0, 0, 0, 0, n]);
        }
        f
    }

    fn run(f: &Facts, node: NodeState) -> Vec<PrefixDecision> {
        let cfg = Config::parse(CFG).unwrap();
        let (_, rows) = plan(&cfg, f);
        decide(&cfg.bgp_vips(), &rows, node)
    }

    #[test]
    fn one_host_route_per_bgp_address() {
        let d = run(&facts(), NodeState::default());
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0].prefix.to_string(), "10.9.0.5");
        assert_eq!(d[0].prefix_len, 32);
        assert_eq!(d[0].vips, ["api", "mcs"]);
        assert_eq!(d[1].prefix_len, 128);
        assert!(d.iter().all(|d| d.announce), "{d:?}");
    }

    #[test]
    fn withdrawn_when_a_vip_on_the_address_has_no_active_backend() {
        let mut f = facts();
        f.health.insert(
            ("mcs".into(), "10.0.0.21".parse().unwrap()),
            HealthFact {
                healthy: false,
                reason: "timeout".into(),
                hold_until: None,
                ..Default::default()
            },
        );
        let d = run(&f, NodeState::default());
        assert!(!d[0].announce);
        assert!(
            d[0].reason
                .contains("VIP mcs has no active backend (1 down"),
            "{}",
            d[0].reason
        );
        assert!(d[1].announce, "the other address is unaffected");
        // One of two backends down: still ready.
        let mut f = facts();
        f.drained
            .insert(("api".into(), "10.0.0.21".parse().unwrap()));
        assert!(run(&f, NodeState::default())[0].announce);
        // Both api backends out: withdrawn.
        f.drained
            .insert(("api".into(), "10.0.0.22".parse().unwrap()));
        let d = run(&f, NodeState::default());
        assert!(!d[0].announce && d[0].reason.contains("2 drained"), "{d:?}");
    }

    #[test]
    fn drain_and_stop_withdraw_everything() {
        let d = run(
            &facts(),
            NodeState {
                drained: true,
                stopping: false,
                detached: false,
            },
        );
        assert!(
            d.iter()
                .all(|d| !d.announce && d.reason.contains("drained"))
        );
        let d = run(
            &facts(),
            NodeState {
                drained: true,
                stopping: true,
                detached: true,
            },
        );
        assert!(
            d.iter()
                .all(|d| !d.announce && d.reason == "lbd is stopping")
        );
        // A node whose XDP program is not attached cannot serve what it would announce.
        let d = run(
            &facts(),
            NodeState {
                detached: true,
                ..NodeState::default()
            },
        );
        assert!(
            d.iter()
                .all(|d| !d.announce && d.reason.contains("not attached")),
            "{d:?}"
        );
    }

    #[test]
    fn unresolved_backends_are_not_ready() {
        let d = run(&Facts::default(), NodeState::default());
        assert!(
            d.iter()
                .all(|d| !d.announce && d.reason.contains("unresolved"))
        );
    }
}
