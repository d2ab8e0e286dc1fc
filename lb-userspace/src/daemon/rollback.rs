//! `lbd teardown`: undo everything lbd added to a node, so a rollback to keepalived + haproxy
//! leaves nothing behind: the XDP program and its pins, the VIPs on the VRRP interfaces
//! (labelled ones of earlier configurations too), the DSR-backend VIPs on `lo`, and the ARP
//! sysctls (put back to the values lbd found), and the BGP announcements (lbd's routes, and
//! its part of FRR's configuration).

use std::path::PathBuf;

use anyhow::Result;

use super::load_options;
use crate::{bgp, config::Config, dataplane::Dataplane, net};

/// Where the ARP sysctls lbd replaced are saved (next to the API socket).
pub fn saved_sysctls(cfg: &Config) -> PathBuf {
    cfg.api_socket
        .with_file_name(format!("{}-sysctls.json", cfg.name))
}

/// Remove everything lbd added on this node for `cfg`. Run with lbd stopped.
pub async fn teardown(cfg: &Config) -> Result<()> {
    // Not under a running lbd: it would put back what this removes.
    let _lock = super::lock::InstanceLock::acquire(cfg, &load_options(cfg))?;
    Dataplane::teardown(&load_options(cfg))?;
    let nl = net::Netlink::new()?;
    let vips: Vec<std::net::IpAddr> = cfg.vrrp.iter().flat_map(|r| r.vips.clone()).collect();
    let mut interfaces: Vec<String> = cfg
        .vrrp
        .iter()
        .map(|r| r.interface.clone().unwrap_or_else(|| cfg.interface.clone()))
        .collect();
    interfaces.push(cfg.interface.clone());
    interfaces.sort();
    interfaces.dedup();
    for ifname in &interfaces {
        let mut removed = crate::net::addr::remove_stale(nl.handle(), ifname, &vips).await?;
        removed.extend(crate::net::addr::remove_orphans(nl.handle(), ifname, &[]).await?);
        if !removed.is_empty() {
            tracing::info!(interface = %ifname, ?removed, "removed VIPs");
        }
    }
    for vip in &vips {
        net::remove_local_vip(nl.handle(), *vip).await?;
    }
    withdraw_bgp(&nl, cfg).await?;
    let restored = net::restore_arp_sysctls(&saved_sysctls(cfg))?;
    tracing::info!(?restored, "restored ARP sysctls");
    let _ = std::fs::remove_file(&cfg.api_socket);
    let _ = std::fs::remove_file(super::lock::lock_path(cfg));
    Ok(())
}

/// Withdraw every announcement route (what FRR redistributes) and remove lbd's objects from
/// FRR's configuration. FRR not answering is logged, not fatal: the routes are what announce.
async fn withdraw_bgp(nl: &net::Netlink, cfg: &Config) -> Result<()> {
    let routes = bgp::routes::installed(nl.handle()).await?;
    for a in &routes {
        bgp::routes::remove(nl.handle(), *a).await?;
    }
    if !routes.is_empty() {
        tracing::info!(?routes, "withdrew the BGP announcement routes");
    }
    if let Some(b) = cfg.bgp.first() {
        let vtysh = bgp::frr::Vtysh::new(b);
        match vtysh.configure(&bgp::frr::render_removal(b)).await {
            Ok(()) => tracing::info!(asn = b.asn, "removed lbd's configuration from FRR"),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "FRR: lbd's configuration could not be removed")
            }
        }
    }
    Ok(())
}
