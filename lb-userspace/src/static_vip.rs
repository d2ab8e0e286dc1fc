//! VIPs owned statically (`owned = true` and no `vrrp`): lbd holds them the way a VRRP master
//! holds its VIPs, so a user who configures a static VIP gets a VIP that answers ARP/ND: the
//! address on the interface (IPv4 /32 labelled, IPv6 /128 nodad and deprecated), a GARP/NA
//! burst when it is added, and a refresh every minute.
//!
//! Unlike a VRRP VIP, a static VIP stays on the interface when lbd stops: like the pinned
//! program, it keeps serving across a restart. A reload that removes it gives it back;
//! `lbd teardown` is the way to stop serving. Addresses and announcements reuse the VRRP code
//! ([`crate::vrrp::announce`]), so both kinds of VIP look the same on the wire.

use std::{net::IpAddr, time::Duration};

use anyhow::Result;
use rtnetlink::Handle;

use crate::{
    config::Config,
    vrrp::{
        announce::Announcer,
        instance::{GARP_BURST, GARP_SPACING},
    },
};

/// Re-announce this often, as keepalived's `garp_master_refresh 60` does for a master.
const REFRESH: Duration = Duration::from_secs(60);

/// The statically owned VIP addresses of `cfg`, each once, in config order. Pure. A BGP VIP
/// is not one: every node forwards it, the routers reach it by the announced host route, and
/// an address on the interface would make the routing daemon prefer its connected route over
/// lbd's announcement.
pub fn static_vips(cfg: &Config) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for v in &cfg.vips {
        if v.vrrp.is_none()
            && v.held_statically()
            && v.announce != crate::config::Announce::Bgp
            && !out.contains(&v.address)
        {
            out.push(v.address);
        }
    }
    out
}

/// Every address lbd holds on an interface by `cfg`: the VRRP instances' VIPs and the static
/// VIPs. Start-up cleanup of an earlier configuration's VIPs keeps these: a static VIP on the
/// interface of a VRRP instance is not a leftover. Pure.
pub fn configured_vips(cfg: &Config) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = cfg.vrrp.iter().flat_map(|r| r.vips.clone()).collect();
    for v in static_vips(cfg) {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// The static VIPs lbd holds now, and the task announcing them.
pub struct StaticVips {
    ifname: String,
    held: Vec<IpAddr>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl StaticVips {
    pub fn new(ifname: &str) -> Self {
        StaticVips {
            ifname: ifname.into(),
            held: Vec::new(),
            task: None,
        }
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Hold exactly `want` (a config's [`static_vips`]): add new ones, give back removed ones,
    /// and announce.
    pub async fn set(&mut self, handle: &Handle, want: Vec<IpAddr>) -> Result<()> {
        let ifname = self.ifname.clone();
        let changed = want != self.held;
        change_held(
            &mut self.held,
            &want,
            |gone| {
                let ifname = ifname.clone();
                async move {
                    crate::net::addr::remove_vip(handle, &ifname, gone).await?;
                    tracing::info!(vip = %gone, "static VIP removed");
                    Ok(())
                }
            },
            |new| {
                let ifname = ifname.clone();
                async move {
                    crate::net::addr::add_vip(handle, &ifname, new).await?;
                    tracing::info!(vip = %new, interface = %ifname, "static VIP added");
                    Ok(())
                }
            },
        )
        .await?;
        self.held = want;
        if changed || self.task.is_none() {
            if let Some(t) = self.task.take() {
                t.abort();
            }
            if !self.held.is_empty() {
                self.task = Some(tokio::spawn(announce_loop(
                    self.ifname.clone(),
                    self.held.clone(),
                )));
            }
        }
        Ok(())
    }
}

/// Take `held` to `want`: remove what is not wanted, then add what is missing, `held` following
/// each step as it succeeds. On an error `held` is what the interface holds, so setting the
/// previous list again (a reload's rollback) puts back a VIP removed before the failure.
async fn change_held<R, A, RF, AF>(
    held: &mut Vec<IpAddr>,
    want: &[IpAddr],
    mut remove: R,
    mut add: A,
) -> Result<()>
where
    R: FnMut(IpAddr) -> RF,
    A: FnMut(IpAddr) -> AF,
    RF: std::future::Future<Output = Result<()>>,
    AF: std::future::Future<Output = Result<()>>,
{
    let gone: Vec<IpAddr> = held.iter().copied().filter(|a| !want.contains(a)).collect();
    for a in gone {
        remove(a).await?;
        held.retain(|h| *h != a);
    }
    let new: Vec<IpAddr> = want.iter().copied().filter(|a| !held.contains(a)).collect();
    for a in new {
        add(a).await?;
        held.push(a);
    }
    Ok(())
}

impl Drop for StaticVips {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A burst (so one lost frame does not matter), then a refresh every minute; a new burst at
/// once when the interface's MAC changes (a bond failing over, a cloned MAC), or clients keep
/// sending to the old one.
async fn announce_loop(ifname: String, vips: Vec<IpAddr>) {
    let mut announcer = match Announcer::new(&ifname) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(interface = %ifname, error = %e, "cannot announce static VIPs");
            return;
        }
    };
    let mut link_events = crate::net::link_changes().ok();
    let mut refresh = tokio::time::interval(LINK_POLL);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_burst = tokio::time::Instant::now();
    loop {
        if tokio::time::Instant::now() >= next_burst {
            for i in 0..GARP_BURST {
                if let Err(e) = announcer.announce(&vips) {
                    tracing::warn!(error = %e, "announcing static VIPs failed");
                }
                if i + 1 < GARP_BURST {
                    tokio::time::sleep(GARP_SPACING).await;
                }
            }
            next_burst = tokio::time::Instant::now() + REFRESH;
        }
        tokio::select! {
            _ = refresh.tick() => {}
            () = crate::net::next_link_change(&mut link_events) => {}
        }
        let mac = crate::net::iface::interface_info(&ifname)
            .ok()
            .and_then(|i| i.mac);
        if let Some(mac) = mac.filter(|m| *m != announcer.mac())
            && let Ok(a) = Announcer::new(&ifname)
        {
            tracing::info!(interface = %ifname, new = ?mac, "interface MAC changed; announcing the static VIPs again");
            announcer = a;
            next_burst = tokio::time::Instant::now();
        }
    }
}

/// How often the static VIPs' interface MAC is compared (link notifications make it sooner).
const LINK_POLL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_vips_without_vrrp_and_owned_are_static() {
        let cfg = Config::parse(
            r#"
interface = "eth0"
[[vips]]
name = "a"
address = "192.0.2.1"
owned = true
ports = [80]
[[vips]]
name = "a443"
address = "192.0.2.1"
owned = true
ports = [443]
[[vips]]
name = "c"
address = "192.0.2.3"
ports = [80]
vrrp = "v"
[[vips]]
name = "d"
address = "192.0.2.4"
ports = [80]
announce = "bgp"
[[vrrp]]
name = "v"
vrid = 1
vips = ["192.0.2.3"]
[[bgp]]
asn = 65001
[[bgp.peers]]
address = "192.0.2.254"
asn = 65000
"#,
        )
        .unwrap();
        assert_eq!(static_vips(&cfg), ["192.0.2.1".parse::<IpAddr>().unwrap()]);
        // Start-up cleanup keeps both kinds on the interface.
        let keep = configured_vips(&cfg);
        assert!(keep.contains(&"192.0.2.1".parse().unwrap()), "{keep:?}");
        assert!(keep.contains(&"192.0.2.3".parse().unwrap()), "{keep:?}");
        assert!(!keep.contains(&"192.0.2.4".parse().unwrap()), "{keep:?}");
    }
}

#[cfg(test)]
mod change_tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A reload swaps VIP A for B and adding B fails: the rollback (setting [A] again) adds A
    /// back, since `held` says it was removed.
    #[tokio::test]
    async fn a_failed_add_leaves_held_as_the_interface_is_and_the_rollback_restores() {
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let on_if = std::cell::RefCell::new(vec![a]);
        let remove = |x: IpAddr| {
            on_if.borrow_mut().retain(|h| *h != x);
            async { Ok(()) }
        };
        let mut held = vec![a];
        let r = change_held(&mut held, &[b], remove, |_| async {
            anyhow::bail!("no room")
        })
        .await;
        assert!(r.is_err());
        assert_eq!(held, Vec::<IpAddr>::new(), "A went, B never came");
        // The rollback.
        let add = |x: IpAddr| {
            on_if.borrow_mut().push(x);
            async { Ok(()) }
        };
        change_held(&mut held, &[a], remove, add).await.unwrap();
        assert_eq!(held, vec![a]);
        assert_eq!(*on_if.borrow(), vec![a]);
    }
}
