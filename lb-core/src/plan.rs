//! From what we know to what the data plane should do. Pure: the daemon gathers [`Facts`]
//! (neighbour table, local addresses, health, drains, VRRP ownership) and this module decides,
//! per service and backend, what goes into the maps and why. Fail-open and slow start, the
//! policies over a service's backends as a whole: [`health`].

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    time::{Duration, Instant},
};

use lb_common::IPV6_MIN_MTU;
use serde::Serialize;

use crate::{
    config::Config,
    desired::{BackendSpec, Desired, ServiceSpec, vip_key},
};

pub mod health;
use health::fail_open;

/// Everything outside the config that decides the data plane.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// MAC of the XDP interface (source of rewritten frames).
    pub if_mac: [u8; 6],
    /// Resolved backend MACs on the XDP interface.
    pub macs: HashMap<IpAddr, [u8; 6]>,
    /// Addresses of this node: a backend that is one of them is served locally.
    pub local_addrs: HashSet<IpAddr>,
    /// Health per (VIP name, backend): `Some(false)` failed, `None` not checked yet / no check.
    pub health: HashMap<(String, IpAddr), HealthFact>,
    /// Drained (VIP name, backend) pairs.
    pub drained: HashSet<(String, IpAddr)>,
    /// Ownership decided by VRRP, per VRRP instance name (true = master, or within the
    /// handover grace after it stopped being master, see `handover`).
    pub vrrp_master: HashMap<String, bool>,
    /// Resolved MACs of VRRP peers (unicast peers, the current master) on the XDP interface.
    pub peer_macs: HashMap<IpAddr, [u8; 6]>,
    /// Routed backends (`encap = "ipip"`): the path to each, when it leaves by the XDP
    /// interface (its next hop's MAC is in `macs`, under the next hop's address).
    pub paths: HashMap<IpAddr, crate::net::RoutePath>,
    /// The time the plan is made at (holds of failed backends end by it); `None`: every
    /// hold still applies.
    pub now: Option<Instant>,
}

pub use crate::backends::{HealthFact, flows_held};

pub use health::{
    FAIL_OPEN_WINDOW, SLOW_START_MIN_OUTAGE, SLOW_START_STEPS, failing_open, slow_start_from,
    slow_start_step,
};

/// The state of one backend as `lbctl backends list` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendState {
    /// In the table, receiving new flows.
    Active,
    /// Established flows only.
    Drained,
    /// Failing health checks.
    Down,
    /// No MAC in the neighbour table yet.
    Unresolved,
    /// Weight 0.
    Disabled,
    /// Failing its checks, but every backend of the service is, by being slow or answering
    /// wrong: new flows go to it anyway rather than nowhere (see [`plan`]).
    FailOpen,
    /// Nothing listens on its check port and the check says that means "not here"
    /// (`absent_when_refused`: a node without a router): out, and not expected up.
    Absent,
}

impl BackendState {
    /// Takes new flows: active, or serving by fail-open.
    pub fn serves(self) -> bool {
        matches!(self, BackendState::Active | BackendState::FailOpen)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BackendState::Active => "active",
            BackendState::Drained => "drained",
            BackendState::Down => "down",
            BackendState::Unresolved => "unresolved",
            BackendState::Disabled => "disabled",
            BackendState::FailOpen => "fail-open",
            BackendState::Absent => "absent",
        }
    }
}

/// Why a backend is in the state it is in (for operators).
#[derive(Clone, Debug, PartialEq)]
pub struct BackendPlan {
    pub vip: String,
    pub addr: IpAddr,
    pub weight: u32,
    pub mac: Option<[u8; 6]>,
    pub local: bool,
    pub state: BackendState,
    pub reason: String,
    /// Expected to serve: false for an absent backend (see [`BackendState::Absent`]), which a
    /// "backend down" alert should leave alone.
    pub expected: bool,
    /// Slow start: the step of its weight it has for new flows, out of [`SLOW_START_STEPS`].
    pub step: u32,
}

impl BackendPlan {
    /// Still climbing through slow start (the plan changes with time alone).
    pub fn ramping(&self) -> bool {
        self.state == BackendState::Active && self.step < SLOW_START_STEPS
    }
}

/// What the tracked checks of VRRP instance `instance` add up to, by keepalived's rules
/// ([`crate::vrrp::track`]): checks with an address pass when `passing` says so; the load
/// balancer's own readiness (a track without an address) passes when every VIP of the instance
/// has an active backend here; a track with `or_lb_ready` passes on either.
pub fn track_weight(
    cfg: &Config,
    instance: &str,
    passing: &HashMap<String, bool>,
    rows: &[BackendPlan],
) -> crate::vrrp::track::Tracking {
    let lb_ready = lb_ready(cfg, instance, rows);
    crate::vrrp::track::tracking(
        cfg.track
            .iter()
            .filter(|t| t.instance == instance)
            .map(|t| {
                let ok = match t.address {
                    Some(_) => {
                        passing.get(&t.name).copied().unwrap_or(false)
                            || (t.or_lb_ready && lb_ready)
                    }
                    None => lb_ready,
                };
                (t.weight, ok)
            }),
    )
}

/// The load balancer's own readiness for a VRRP instance: every VIP of the instance has an
/// active backend here. Failing open does not count: OpenShift's election sees a node none of
/// whose backends pass as not ready, and when every node fails open they all lose the same.
pub fn lb_ready(cfg: &Config, instance: &str, rows: &[BackendPlan]) -> bool {
    let vips: Vec<&str> = cfg
        .vips
        .iter()
        .filter(|v| v.vrrp.as_deref() == Some(instance))
        .map(|v| v.name.as_str())
        .collect();
    !vips.is_empty()
        && vips.iter().all(|v| {
            rows.iter()
                .any(|r| r.vip == *v && r.state == BackendState::Active)
        })
}

/// Whether this node owns VIP `i` of the config.
pub fn owned(cfg: &Config, i: usize, facts: &Facts) -> bool {
    let v = &cfg.vips[i];
    // Every node forwards a BGP VIP, announced or not: ECMP decides which one a flow reaches.
    if v.announce == crate::config::Announce::Bgp {
        return true;
    }
    match &v.vrrp {
        Some(name) => facts.vrrp_master.get(name).copied().unwrap_or(false),
        None => v.held_statically(),
    }
}

/// Fate sharing: the (VIP name, backend) pairs that live on a node whose VRRP master role we
/// just took over because it went silent. They take no new flows at once instead of after
/// their checks fail; only checked backends qualify, since a passing check is what brings them
/// back (an unchecked backend would stay out for good).
pub fn fate_shared(cfg: &Config, dead: IpAddr) -> Vec<(String, IpAddr)> {
    cfg.vips
        .iter()
        .filter(|v| v.health.kind != crate::config::health::CheckKind::None)
        .flat_map(|v| {
            v.backends
                .iter()
                .filter(|b| b.address == dead)
                .map(|b| (v.name.clone(), b.address))
        })
        .collect()
}

/// The outer header lb_xdp puts in front of a packet for a routed backend at `addr`.
fn encap_hlen(addr: IpAddr) -> u32 {
    if addr.is_ipv4() {
        lb_common::ENCAP_HLEN_V4
    } else {
        lb_common::ENCAP_HLEN_V6
    }
}

pub fn plan(cfg: &Config, facts: &Facts) -> (Desired, Vec<BackendPlan>) {
    let mut rows = Vec::new();
    let mut specs_per_vip: Vec<Vec<BackendSpec>> = Vec::new();
    for v in &cfg.vips {
        let mut specs = Vec::new();
        for b in &v.backends {
            let local = facts.local_addrs.contains(&b.address);
            let routed = b.encap == crate::config::EncapMode::Ipip && !local;
            let path = facts.paths.get(&b.address).filter(|_| routed);
            let encap = path.and_then(|p| {
                Some(crate::desired::Encap {
                    src: p.src?,
                    mtu: u16::try_from(p.mtu).unwrap_or(u16::MAX),
                })
            });
            // A routed backend is only usable wrapped: without its path, not at all.
            let mac = if local {
                None
            } else if routed {
                encap
                    .and(path)
                    .and_then(|p| facts.macs.get(&p.next_hop))
                    .copied()
            } else {
                facts.macs.get(&b.address).copied()
            };
            let pair = (v.name.clone(), b.address);
            let health = facts.health.get(&pair);
            let held = health.is_some_and(|h| flows_held(h, facts.now));
            let healthy = health.map(|h| h.healthy).unwrap_or(true) || held;
            let drained = facts.drained.contains(&pair);
            // An IPv6 VIP's client never lowers its path MTU below 1280: a routed path that
            // cannot carry 1280 bytes once wrapped would black-hole its larger packets (the
            // data plane drops them, with no "packet too big" the client could use). Such a
            // pair takes no new flows; its established ones stay.
            let narrow = v.address.is_ipv6()
                && encap.is_some_and(|e| u32::from(e.mtu) < IPV6_MIN_MTU + encap_hlen(b.address));
            let drained = drained || narrow;
            let absent =
                !healthy && v.health.absent_when_refused && health.is_some_and(|h| h.refused);
            let step = match (health.and_then(|h| h.up_since), facts.now) {
                (Some(t), Some(now)) if healthy && !held => slow_start_step(
                    now.saturating_duration_since(t),
                    Duration::from_millis(v.health.slow_start_ms),
                ),
                _ => SLOW_START_STEPS,
            };
            let mut spec = BackendSpec {
                addr: b.address,
                weight: b.weight,
                mac,
                src_mac: facts.if_mac,
                ifindex: 0,
                local,
                healthy,
                drained,
                failing: held,
                encap,
                step: SLOW_START_STEPS,
            };
            let (state, reason) = if held {
                let h = health.expect("held implies a fact");
                let left = h
                    .hold_until
                    .zip(facts.now)
                    .map(|(t, n)| t.saturating_duration_since(n).as_secs_f64())
                    .unwrap_or(0.0);
                (
                    BackendState::Down,
                    format!("{}; established flows stay for {left:.0}s more", h.reason),
                )
            } else if absent {
                (
                    BackendState::Absent,
                    format!(
                        "{}: nothing serves here (absent_when_refused)",
                        health.map(|h| h.reason.as_str()).unwrap_or_default()
                    ),
                )
            } else if !healthy {
                (
                    BackendState::Down,
                    health.map(|h| h.reason.clone()).unwrap_or_default(),
                )
            } else if routed && path.is_none() {
                (
                    BackendState::Unresolved,
                    "no route to it through the XDP interface".to_string(),
                )
            } else if routed && path.is_some_and(|p| p.src.is_none()) {
                (
                    BackendState::Unresolved,
                    "its route names no source address to wrap from".to_string(),
                )
            } else if !local && mac.is_none() {
                (
                    BackendState::Unresolved,
                    if routed {
                        "the next hop's MAC is not in the neighbour table yet".to_string()
                    } else {
                        "no MAC in the neighbour table yet".to_string()
                    },
                )
            } else if narrow {
                (
                    BackendState::Drained,
                    format!(
                        "its path MTU {} cannot carry a 1280-byte IPv6 packet wrapped (needs {}): no new flows",
                        encap.map_or(0, |e| e.mtu),
                        IPV6_MIN_MTU + encap_hlen(b.address)
                    ),
                )
            } else if drained {
                (BackendState::Drained, "drained by operator".to_string())
            } else if b.weight == 0 {
                (BackendState::Disabled, "weight 0".to_string())
            } else if step < SLOW_START_STEPS {
                spec.step = step;
                let full = Duration::from_millis(v.health.slow_start_ms)
                    .saturating_sub(
                        facts
                            .now
                            .zip(health.and_then(|h| h.up_since))
                            .map(|(n, t)| n.saturating_duration_since(t))
                            .unwrap_or_default(),
                    )
                    .as_secs_f64();
                (
                    BackendState::Active,
                    format!(
                        "slow start: {}% of its weight for new flows, full in {full:.0}s",
                        step * 100 / SLOW_START_STEPS
                    ),
                )
            } else {
                (
                    BackendState::Active,
                    health.map(|h| h.reason.clone()).unwrap_or_default(),
                )
            };
            debug_assert_eq!(spec.in_table(), state == BackendState::Active);
            rows.push(BackendPlan {
                vip: v.name.clone(),
                addr: b.address,
                weight: b.weight,
                mac,
                local,
                state,
                reason,
                expected: !absent,
                step: spec.step,
            });
            specs.push(spec);
        }
        let first = rows.len() - specs.len();
        fail_open(v, facts, &mut specs, &mut rows[first..]);
        specs_per_vip.push(specs);
    }
    let services = cfg
        .services()
        .into_iter()
        .map(|(i, port)| {
            let v = &cfg.vips[i];
            ServiceSpec {
                key: vip_key(v.address, port, v.protocol.number()),
                owned: owned(cfg, i, facts),
                backends: specs_per_vip[i].clone(),
            }
        })
        .collect();
    let peers = loop_guard_macs(cfg, facts);
    (Desired { services, peers }, rows)
}

/// The MACs of the other lbd nodes this one knows: its backends (on an on-premises cluster every
/// backend runs lbd as a DSR backend) and its VRRP peers. A VIP packet from one of them was
/// already forwarded by that node: the loop guard gives it to the local stack.
pub fn loop_guard_macs(cfg: &Config, facts: &Facts) -> Vec<[u8; 6]> {
    let backends = cfg
        .vips
        .iter()
        .flat_map(|v| v.backends.iter())
        .filter(|b| !facts.local_addrs.contains(&b.address))
        // A routed backend's frames go to a router, whose MAC also brings client traffic.
        .filter(|b| b.encap == crate::config::EncapMode::None)
        .filter_map(|b| facts.macs.get(&b.address));
    let mut macs: Vec<[u8; 6]> = backends
        .chain(facts.peer_macs.values())
        .copied()
        .filter(|m| *m != facts.if_mac && *m != [0; 6])
        .collect();
    macs.sort();
    macs.dedup();
    macs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four backends of one owned VIP (also the fixture of `plan::health`'s tests).
    pub(in crate::plan) fn cfg() -> Config {
        Config::parse(
            r#"
interface = "eth0"
[[vips]]
name = "api"
address = "10.0.0.100"
owned = true
ports = [6443]
[[vips.backends]]
address = "10.0.0.1"
[[vips.backends]]
address = "10.0.0.2"
[[vips.backends]]
address = "10.0.0.3"
[[vips.backends]]
address = "10.0.0.4"
"#,
        )
        .unwrap()
    }

    /// OpenShift's API checks: `chk_ocp_lb` (+20, the load balancer is ready), `chk_ocp_both`
    /// (+5, the load balancer OR the local apiserver), `chk_mcs` (+3).
    #[test]
    fn or_lb_ready_passes_on_either_the_check_or_the_load_balancer() {
        let cfg = Config::parse(
            r#"
interface = "eth0"
[[vips]]
name = "api"
address = "10.0.0.100"
ports = [6443]
vrrp = "api"
[[vips.backends]]
address = "10.0.0.1"
[[vrrp]]
name = "api"
vrid = 14
vips = ["10.0.0.100"]
[[track]]
instance = "api"
name = "chk_ocp_lb"
weight = 20
[[track]]
instance = "api"
name = "chk_ocp_both"
weight = 5
address = "127.0.0.1:6443"
or_lb_ready = true
[[track]]
instance = "api"
name = "chk_mcs"
weight = 3
address = "127.0.0.1:22623"
health.kind = "tcp"
"#,
        )
        .unwrap();
        let row = |state| BackendPlan {
            vip: "api".into(),
            addr: "10.0.0.1".parse().unwrap(),
            weight: 1,
            mac: None,
            local: false,
            state,
            reason: String::new(),
            expected: true,
            step: SLOW_START_STEPS,
        };
        let passing = |both: bool, mcs: bool| {
            HashMap::from([
                ("chk_ocp_both".to_string(), both),
                ("chk_mcs".to_string(), mcs),
            ])
        };
        for (lb, both, mcs, want) in [
            (true, false, false, 25),
            (true, true, true, 28),
            (false, true, false, 5),
            (false, false, true, 3),
            (false, false, false, 0),
        ] {
            let rows = [row(if lb {
                BackendState::Active
            } else {
                BackendState::Down
            })];
            let t = track_weight(&cfg, "api", &passing(both, mcs), &rows);
            assert_eq!(t.weight, want, "lb {lb} apiserver {both} mcs {mcs}");
            assert!(!t.fault);
        }
        // Without an address there is nothing to OR with: refused by name.
        let e = Config::parse(
            "interface = \"eth0\"\n[[vrrp]]\nname = \"a\"\nvrid = 5\nvips = [\"10.0.0.9\"]\n[[track]]\ninstance = \"a\"\nname = \"x\"\nweight = 5\nor_lb_ready = true\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("track[0].or_lb_ready:"), "{e}");
    }

    #[test]
    fn a_routed_backend_goes_wrapped_to_its_next_hop_and_never_into_the_loop_guard() {
        let cfg = Config::parse(
            r#"
interface = "eth0"
[[vips]]
name = "api"
address = "10.0.0.100"
owned = true
ports = [6443]
[[vips.backends]]
address = "10.9.0.1"
encap = "ipip"
[[vips.backends]]
address = "10.9.0.2"
encap = "ipip"
[[vips.backends]]
address = "10.0.0.3"
"#,
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let router = [2, 0, 0, 0, 0, 0xfe];
        let mut f = Facts::default();
        f.macs.insert(ip("10.0.0.254"), router);
        f.macs.insert(ip("10.0.0.3"), [2, 0, 0, 0, 0, 3]);
        let path = crate::net::RoutePath {
            next_hop: ip("10.0.0.254"),
            oif: 2,
            src: Some(ip("10.0.0.10")),
            mtu: 9000,
        };
        f.paths.insert(ip("10.9.0.1"), path);
        let (want, rows) = plan(&cfg, &f);
        let b = &want.services[0].backends;
        assert_eq!(b[0].mac, Some(router), "to the next hop");
        assert_eq!(
            b[0].encap,
            Some(crate::desired::Encap {
                src: ip("10.0.0.10"),
                mtu: 9000
            })
        );
        assert!(b[0].in_table());
        // No path through the XDP interface: not usable, and the reason says why.
        assert_eq!((b[1].mac, b[1].encap), (None, None));
        assert!(!b[1].in_set());
        assert_eq!(rows[1].state, BackendState::Unresolved);
        assert!(rows[1].reason.contains("route"), "{}", rows[1].reason);
        // The on-link backend is unchanged.
        assert_eq!((b[2].mac, b[2].encap), (Some([2, 0, 0, 0, 0, 3]), None));
        // The router brings client traffic too: its MAC is never a loop-guard peer.
        assert_eq!(want.peers, vec![[2, 0, 0, 0, 0, 3]]);
        // A path without a source address cannot be wrapped from.
        f.paths
            .insert(ip("10.9.0.1"), crate::net::RoutePath { src: None, ..path });
        let (want, rows) = plan(&cfg, &f);
        assert!(!want.services[0].backends[0].in_set());
        assert!(rows[0].reason.contains("source"), "{}", rows[0].reason);
    }

    #[test]
    fn a_routed_path_too_narrow_for_1280_bytes_wrapped_takes_no_new_ipv6_flows() {
        // Paths that carry less than 1280 bytes once wrapped: fine for an IPv4 VIP (any
        // packet can be told the path's true MTU), not for an IPv6 one (no client goes below
        // 1280, so its larger packets would never get through).
        let cfg = Config::parse(
            r#"
interface = "eth0"
[[vips]]
name = "v4"
address = "10.0.0.100"
owned = true
ports = [443]
[[vips.backends]]
address = "10.9.0.1"
encap = "ipip"
[[vips]]
name = "v6"
address = "fd00::100"
owned = true
ports = [443]
[[vips.backends]]
address = "fd09::1"
encap = "ipip"
"#,
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut f = Facts::default();
        f.macs.insert(ip("10.0.0.254"), [2, 0, 0, 0, 0, 0xfe]);
        f.macs.insert(ip("fd00::fe"), [2, 0, 0, 0, 0, 0xfe]);
        let path = |hop: &str, src: &str, mtu| crate::net::RoutePath {
            next_hop: ip(hop),
            oif: 2,
            src: Some(ip(src)),
            mtu,
        };
        f.paths
            .insert(ip("10.9.0.1"), path("10.0.0.254", "10.0.0.10", 1200));
        f.paths
            .insert(ip("fd09::1"), path("fd00::fe", "fd00::10", 1319));
        let (want, rows) = plan(&cfg, &f);
        assert!(want.services[0].backends[0].in_table(), "IPv4 VIP");
        assert_eq!(rows[0].state, BackendState::Active);
        let v6 = &want.services[1].backends[0];
        assert!(v6.in_set() && !v6.in_table(), "established flows only");
        assert_eq!(rows[1].state, BackendState::Drained);
        assert!(rows[1].reason.contains("1319"), "{}", rows[1].reason);
        // 1320 carries 1280 behind the 40-byte outer header.
        f.paths
            .insert(ip("fd09::1"), path("fd00::fe", "fd00::10", 1320));
        let (want, rows) = plan(&cfg, &f);
        assert!(want.services[1].backends[0].in_table());
        assert_eq!(rows[1].state, BackendState::Active);
    }

    #[test]
    fn states_follow_facts() {
        let cfg = cfg();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut f = Facts::default();
        f.macs.insert(ip("10.0.0.1"), [2, 0, 0, 0, 0, 1]);
        f.macs.insert(ip("10.0.0.2"), [2, 0, 0, 0, 0, 2]);
        f.local_addrs.insert(ip("10.0.0.3"));
        f.drained.insert(("api".into(), ip("10.0.0.2")));
        f.health.insert(
            ("api".into(), ip("10.0.0.1")),
            HealthFact {
                healthy: false,
                reason: "timeout".into(),
                hold_until: None,
                ..Default::default()
            },
        );
        let (d, rows) = plan(&cfg, &f);
        let states: Vec<_> = rows.iter().map(|r| r.state).collect();
        assert_eq!(
            states,
            [
                BackendState::Down,
                BackendState::Drained,
                BackendState::Active,
                BackendState::Unresolved
            ]
        );
        assert_eq!(rows[0].reason, "timeout");
        let s = &d.services[0];
        assert!(s.owned);
        assert_eq!(s.key.port, 6443);
        assert!(!s.backends[0].in_set(), "failed backend leaves the set");
        assert!(
            s.backends[1].in_set() && !s.backends[1].in_table(),
            "drained keeps flows only"
        );
        assert!(s.backends[2].local && s.backends[2].in_table());
        assert!(!s.backends[3].in_set(), "no MAC, not in the set");
    }

    #[test]
    fn loop_guard_lists_backends_and_peers_but_not_this_node() {
        let cfg = cfg();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut f = Facts {
            if_mac: [2, 0, 0, 0, 0, 9],
            ..Default::default()
        };
        f.macs.insert(ip("10.0.0.1"), [2, 0, 0, 0, 0, 1]);
        f.macs.insert(ip("10.0.0.2"), [2, 0, 0, 0, 0, 2]);
        // Same MAC twice (two addresses on one node), and this node's own MAC.
        f.macs.insert(ip("10.0.0.4"), [2, 0, 0, 0, 0, 2]);
        f.macs.insert(ip("10.0.0.3"), [2, 0, 0, 0, 0, 9]);
        f.peer_macs.insert(ip("10.0.0.50"), [2, 0, 0, 0, 0, 50]);
        // Not a backend nor a peer: a router's MAC in the neighbour table is not a peer.
        f.macs.insert(ip("10.0.0.254"), [2, 0, 0, 0, 0, 0xfe]);
        let (d, _) = plan(&cfg, &f);
        assert_eq!(
            d.peers,
            vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 50]]
        );
    }

    #[test]
    fn vrrp_decides_ownership_when_named() {
        let mut cfg = cfg();
        cfg.vips[0].vrrp = Some("api".into());
        let mut f = Facts::default();
        assert!(
            !plan(&cfg, &f).0.services[0].owned,
            "not master until VRRP says so"
        );
        f.vrrp_master.insert("api".into(), true);
        assert!(plan(&cfg, &f).0.services[0].owned);
    }

    #[test]
    fn fate_shared_takes_the_dead_nodes_checked_backends() {
        let mut cfg = Config::parse(
            r#"
interface = "eth0"
[[vips]]
name = "api"
address = "10.0.0.100"
owned = true
ports = [6443]
[vips.health]
kind = "tcp"
[[vips.backends]]
address = "10.0.0.1"
[[vips.backends]]
address = "10.0.0.2"
[[vips]]
name = "ingress"
address = "10.0.0.101"
owned = true
ports = [443]
[vips.health]
kind = "tcp"
[[vips.backends]]
address = "10.0.0.1"
[[vips]]
name = "unchecked"
address = "10.0.0.102"
owned = true
ports = [80]
[vips.health]
kind = "none"
[[vips.backends]]
address = "10.0.0.1"
"#,
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            fate_shared(&cfg, ip("10.0.0.1")),
            vec![
                ("api".to_string(), ip("10.0.0.1")),
                ("ingress".to_string(), ip("10.0.0.1"))
            ]
        );
        assert!(fate_shared(&cfg, ip("10.0.0.9")).is_empty());
        cfg.vips.truncate(1);
        // With the fact set, the plan takes it out of the table.
        let mut f = Facts::default();
        f.macs.insert(ip("10.0.0.1"), [2, 0, 0, 0, 0, 1]);
        f.macs.insert(ip("10.0.0.2"), [2, 0, 0, 0, 0, 2]);
        for pair in fate_shared(&cfg, ip("10.0.0.1")) {
            f.health.insert(
                pair,
                HealthFact {
                    healthy: false,
                    reason: "VRRP master failed".into(),
                    hold_until: None,
                    ..Default::default()
                },
            );
        }
        let (d, rows) = plan(&cfg, &f);
        assert!(!d.services[0].backends[0].in_table());
        assert!(d.services[0].backends[1].in_table());
        assert_eq!(rows[0].state, BackendState::Down);
    }

    #[test]
    fn a_failed_backend_keeps_its_established_flows_for_the_hold_only() {
        let cfg = cfg();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let t0 = Instant::now();
        let mut f = Facts::default();
        for (i, b) in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
            .iter()
            .enumerate()
        {
            f.macs.insert(ip(b), [2, 0, 0, 0, 0, i as u8]);
        }
        let pair = ("api".to_string(), ip("10.0.0.1"));
        f.health.insert(
            pair.clone(),
            HealthFact::failed("HTTP 500".into(), t0, Duration::from_secs(10)),
        );
        f.now = Some(t0 + Duration::from_secs(3));
        let (d, rows) = plan(&cfg, &f);
        let b = &d.services[0].backends[0];
        assert!(b.in_set(), "established flows stay during the hold");
        assert!(!b.in_table(), "no new flows at once");
        assert_eq!(rows[0].state, BackendState::Down);
        assert!(rows[0].reason.contains("7s more"), "{}", rows[0].reason);
        f.now = Some(t0 + Duration::from_secs(10));
        let (d, _) = plan(&cfg, &f);
        assert!(
            !d.services[0].backends[0].in_set(),
            "after the hold, flows move"
        );
        // No hold (never up, or a zero hold): out of the set at once.
        f.health.insert(
            pair,
            HealthFact::failed("timeout".into(), t0, Duration::ZERO),
        );
        f.now = Some(t0);
        assert!(!plan(&cfg, &f).0.services[0].backends[0].in_set());
    }
}
