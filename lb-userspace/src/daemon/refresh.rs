//! Kernel facts (the interface, neighbours, local addresses, routes to routed backends),
//! gathered by a task beside the owner every second and on netlink notifications. The dumps
//! can be slow on a busy host; the owner hands the task what to look up, keeps working, and
//! applies the answer when it arrives as [`Msg::Gathered`]. A gather that misses its deadline
//! reports an error instead, so one stuck dump never stops later refreshes.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    time::Duration,
};

use anyhow::{Context, Result};
use lb_core::controller::Input;

use super::owner::{Msg, Owner};
use crate::{
    config::EncapMode,
    net::{self, Link, Netlink, RoutePath},
};

/// A gather that has not answered by then is given up (and the next one starts).
const GATHER_DEADLINE: Duration = Duration::from_secs(5);

/// What to look up: a copy of what the owner knows now.
pub struct GatherInput {
    iface: String,
    ifindex: u32,
    backends: Vec<IpAddr>,
    routed: Vec<IpAddr>,
    peers: Vec<IpAddr>,
    /// Look the interface up through netlink too (see `churn`).
    link_check: bool,
}

/// What a gather found.
pub struct Gathered {
    /// The interface index the neighbours were read on.
    ifindex: u32,
    /// The interface through netlink, when asked for.
    link: Option<Result<Link>>,
    paths: HashMap<IpAddr, RoutePath>,
    macs: HashMap<IpAddr, [u8; 6]>,
    peer_macs: HashMap<IpAddr, [u8; 6]>,
    local_addrs: HashSet<IpAddr>,
}

/// Read the facts `input` names (beside the owner; no owner state).
pub async fn gather(nl: Netlink, input: GatherInput) -> Result<Gathered> {
    let link = if input.link_check {
        Some(nl.link(&input.iface).await)
    } else {
        None
    };
    // Routed backends: the path to each; only one through the XDP interface can be used.
    let mut paths = HashMap::new();
    for b in &input.routed {
        match nl.route_to(*b).await {
            Ok(p) if p.oif == input.ifindex => {
                paths.insert(*b, p);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(backend = %b, error = %format!("{e:#}"), "no route"),
        }
    }
    let next_hops: Vec<IpAddr> = paths.values().map(|p| p.next_hop).collect();
    let all: Vec<IpAddr> = input
        .backends
        .iter()
        .chain(&input.peers)
        .chain(&next_hops)
        .copied()
        .collect();
    let mut macs = nl.macs_on(input.ifindex, &all).await?;
    let local_addrs = nl.local_addresses().await?;
    for b in &all {
        if !macs.contains_key(b) && !local_addrs.contains(b) {
            net::trigger_resolution(&input.iface, *b);
        }
    }
    let peer_macs = input
        .peers
        .iter()
        .filter(|p| !input.backends.contains(p))
        .filter_map(|p| macs.remove(p).map(|m| (*p, m)))
        .collect();
    Ok(Gathered {
        ifindex: input.ifindex,
        link,
        paths,
        macs,
        peer_macs,
        local_addrs,
    })
}

impl Owner {
    /// What a gather should look up now.
    pub(super) fn gather_input(&mut self, force_link_check: bool) -> GatherInput {
        let link_check = force_link_check || self.link_check_due();
        let (routed, backends): (Vec<&crate::config::BackendConfig>, Vec<_>) = self
            .cfg
            .vips
            .iter()
            .flat_map(|v| v.backends.iter())
            .partition(|b| b.encap == EncapMode::Ipip);
        let addrs = |v: Vec<&crate::config::BackendConfig>| -> Vec<IpAddr> {
            v.into_iter().map(|b| b.address).collect()
        };
        GatherInput {
            iface: self.cfg.interface.clone(),
            ifindex: self.ifindex,
            backends: addrs(backends),
            routed: addrs(routed),
            peers: self.vrrp_peers(),
            link_check,
        }
    }

    /// Read the kernel facts beside the owner (the controller allows one at a time).
    pub(super) fn start_gather(&mut self) {
        let input = self.gather_input(false);
        let (nl, tx) = (self.netlink.clone(), self.tx.clone());
        tokio::spawn(async move {
            let got = tokio::time::timeout(GATHER_DEADLINE, gather(nl, input))
                .await
                .unwrap_or_else(|_| {
                    Err(anyhow::anyhow!(
                        "netlink did not answer within {GATHER_DEADLINE:?}"
                    ))
                });
            let _ = tx.send(Msg::Gathered(Box::new(got)));
        });
    }

    /// A gather's answer: the controller decides whether the plan is applied again.
    pub(super) async fn gathered(&mut self, got: Result<Gathered>) -> Result<()> {
        let taken = self.take_facts(got).await;
        let changed = match &taken {
            Ok(Taken::Facts { changed }) => Some(*changed),
            _ => None,
        };
        self.feed(Input::Gathered { changed }).await;
        if matches!(taken, Ok(Taken::Moved)) {
            // Read on the old device: gather again on the new one.
            self.feed(Input::GatherWanted).await;
        }
        taken.map(|_| ())
    }

    /// Follow the interface, then hold the facts read on it.
    async fn take_facts(&mut self, got: Result<Gathered>) -> Result<Taken> {
        let got = got.context("gather kernel facts")?;
        if let Some(link) = got.link {
            let before = self.ifindex;
            let r = self.follow_interface(link).await;
            self.sync_bgp();
            r?;
            if self.ifindex != before {
                return Ok(Taken::Moved);
            }
        }
        if got.ifindex != self.ifindex {
            return Ok(Taken::Stale);
        }
        // Only unicast addresses of real interfaces count; VIPs themselves are not backends.
        let vips: HashSet<IpAddr> = self.cfg.vips.iter().map(|v| v.address).collect();
        let local_addrs: HashSet<IpAddr> = got
            .local_addrs
            .into_iter()
            .filter(|a| !vips.contains(a))
            .collect();
        // Refreshes come every second and on every neighbour notification (many under load):
        // with nothing new, re-applying would only rebuild every Maglev table to find it equal.
        let f = &mut self.facts;
        let changed = !(f.macs == got.macs
            && f.peer_macs == got.peer_macs
            && f.local_addrs == local_addrs
            && f.paths == got.paths);
        f.paths = got.paths;
        f.macs = got.macs;
        f.peer_macs = got.peer_macs;
        f.local_addrs = local_addrs;
        Ok(Taken::Facts { changed })
    }
}

/// What a gather's answer was.
enum Taken {
    /// Facts of the interface as it is; `changed` from the ones held.
    Facts { changed: bool },
    /// The interface was recreated: the facts were read on the old device.
    Moved,
    /// Read on a device the interface no longer is.
    Stale,
}
