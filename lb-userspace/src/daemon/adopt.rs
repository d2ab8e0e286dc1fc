//! State a previous lbd left in the pinned maps, adopted at start so a restart changes no
//! table and moves no VIP by itself.

use std::{collections::HashSet, net::IpAddr};

use crate::{
    config::Config,
    dataplane::{BackendSpec, Dataplane, vip_key},
};

/// VRRP instances some of whose VIP services the previous lbd left forwarding, as owned.
pub(super) fn adopted_ownership(
    cfg: &Config,
    dp: &Dataplane,
) -> std::collections::HashMap<String, bool> {
    let mut out = std::collections::HashMap::new();
    for (i, port) in cfg.services() {
        let v = &cfg.vips[i];
        if let Some(name) = &v.vrrp
            && dp.owned(&vip_key(v.address, port, v.protocol.number())) == Some(true)
        {
            out.insert(name.clone(), true);
        }
    }
    out
}

/// (VIP name, backend) pairs that a previous lbd left drained: drains survive restarts.
pub(super) fn adopted_drained(cfg: &Config, dp: &Dataplane) -> HashSet<(String, IpAddr)> {
    installed_where(cfg, dp, |b| b.drained)
}

/// (VIP name, backend) pairs that a previous lbd left in the set: known good at adoption.
pub(super) fn adopted_up(cfg: &Config, dp: &Dataplane) -> HashSet<(String, IpAddr)> {
    installed_where(cfg, dp, |b| b.healthy)
}

/// (VIP name, backend) pairs installed in the maps whose spec passes `keep`.
fn installed_where(
    cfg: &Config,
    dp: &Dataplane,
    keep: impl Fn(&BackendSpec) -> bool,
) -> HashSet<(String, IpAddr)> {
    let mut out = HashSet::new();
    for (i, port) in cfg.services() {
        let v = &cfg.vips[i];
        for b in dp.installed(&vip_key(v.address, port, v.protocol.number())) {
            if keep(&b.spec) {
                out.insert((v.name.clone(), b.spec.addr));
            }
        }
    }
    out
}
