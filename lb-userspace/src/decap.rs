//! `lbd decap`, the run mode of a routed (L3 DSR) backend: loads `lb_decap`
//! (`dataplane::decap::Decap`, which owns its maps), keeps its address sets in step with the
//! host, serves the VIPs from `lo` and puts everything back on SIGTERM.

use std::net::IpAddr;

use anyhow::{Context, Result};

use crate::dataplane::decap::Decap;

/// What `lbd decap` runs with.
#[derive(Clone, Debug)]
pub struct DecapOptions {
    /// Names the pin directory (`<bpffs>/<name>-decap`) and the saved sysctls.
    pub name: String,
    pub interface: String,
    pub lb_nodes: Vec<IpAddr>,
    /// VIPs to serve: held on `lo`, never announced (arp_ignore/arp_announce as lbd sets them).
    pub vips: Vec<IpAddr>,
    pub mode: crate::config::XdpMode,
    /// A TCP port answered while unwrapping (lbd's check of a routed backend connects to it
    /// first); 0: none.
    pub health_port: u16,
    /// Where the ARP sysctls found at start are saved until the stop puts them back.
    pub state_dir: std::path::PathBuf,
}

/// `lbd decap`: unwrap the LB nodes' packets on the interface and serve the VIPs from `lo`
/// until SIGTERM or SIGINT; then detach, and take back the VIPs and sysctls it set.
pub async fn serve(o: DecapOptions) -> Result<()> {
    if o.lb_nodes.is_empty() {
        anyhow::bail!("lb_nodes: name at least one LB node (--lb-node)");
    }
    if o.vips.is_empty() {
        anyhow::bail!("vips: name at least one VIP (--vip): only packets for them are unwrapped");
    }
    let mut d = Decap::load(&o.name, std::path::Path::new("/sys/fs/bpf"))?;
    d.set_peers(&o.lb_nodes)?;
    d.set_vips(&o.vips)?;
    let nl = crate::net::Netlink::new()?;
    let saved = o.state_dir.join(format!("{}-decap-sysctls.json", o.name));
    if !o.vips.is_empty() {
        crate::net::set_arp_sysctls(&o.interface, &saved)?;
    }
    for vip in &o.vips {
        crate::net::ensure_local_vip(nl.handle(), *vip).await?;
    }
    // The VIPs are on `lo` now: part of the host's addresses, as the outer destination may be.
    d.set_local(&local_addrs()?)?;
    d.attach(&o.interface, o.mode)?;
    // Answered only from here on, and gone with the process: lbd's checks of this backend
    // pass only while it unwraps.
    let _health = if o.health_port != 0 {
        let l = tokio::net::TcpListener::bind(("::", o.health_port))
            .await
            .or(tokio::net::TcpListener::bind(("0.0.0.0", o.health_port)).await)
            .with_context(|| format!("health_port {}: listen", o.health_port))?;
        Some(tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        }))
    } else {
        None
    };
    tracing::info!(interface = %o.interface, lb_nodes = ?o.lb_nodes, vips = ?o.vips, "unwrapping IP-in-IP from the LB nodes");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    tick.tick().await;
    // The host's addresses may change (DHCP, an operator): followed within a second.
    let mut addrs = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = addrs.tick() => {
                if let Err(e) = local_addrs().and_then(|a| d.set_local(&a)) {
                    tracing::warn!(error = %format!("{e:#}"), "refreshing the local addresses");
                }
            }
            _ = tick.tick() => {
                if let Ok(s) = d.stats() {
                    tracing::info!(?s, "decap counters");
                }
            }
        }
    }
    if let Ok(s) = d.stats() {
        tracing::info!(?s, "decap counters; stopping");
    }
    drop(d);
    for vip in &o.vips {
        if let Err(e) = crate::net::remove_local_vip(nl.handle(), *vip).await {
            tracing::warn!(%vip, error = %format!("{e:#}"), "removing the VIP from lo");
        }
    }
    crate::net::restore_arp_sysctls(&saved)?;
    Ok(())
}

/// Every address of this host's interfaces (IPv4 and IPv6).
pub fn local_addrs() -> Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getifaddrs");
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a list getifaddrs returned, freed below.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.push(IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()));
                }
                libc::AF_INET6 => {
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.push(IpAddr::from(a.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        p = ifa.ifa_next;
    }
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    Ok(out)
}
