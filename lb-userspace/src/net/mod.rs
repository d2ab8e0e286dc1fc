//! The host's network, for every part of lbd that needs it (no protocol module below it):
//! - here: facts through rtnetlink (interfaces, local addresses, the neighbour table with the
//!   backends' MACs, routes), its dumps and change subscriptions, and the DSR backend role's
//!   VIP on `lo` and ARP sysctls; read-only otherwise except for [`trigger_resolution`], which
//!   makes the kernel resolve a missing neighbour;
//! - [`addr`]: VIP addresses on an interface (added with lbd's label, removed only if lbd's);
//! - [`iface`]: interfaces and the host's addresses from getifaddrs(3) and /proc.

pub mod addr;
pub mod iface;

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use anyhow::{Context, Result, anyhow};
use futures::{Stream, TryStreamExt};
use rtnetlink::{
    Handle,
    packet_route::{
        address::AddressAttribute,
        link::LinkAttribute,
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState},
    },
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: [u8; 6],
    pub up: bool,
    /// Some XDP program is attached (any mode).
    pub xdp_attached: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub mac: [u8; 6],
    pub state: String,
}

/// Test-only fault injection, for the labs that stall the kernel's answer: when the file named
/// by the environment variable `var` exists, the delay in milliseconds it holds. Unset in
/// production, it costs one `getenv`.
pub fn injected_delay(var: &str) -> Option<std::time::Duration> {
    let path = std::env::var_os(var)?;
    let ms: u64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    Some(std::time::Duration::from_millis(ms))
}

/// The errno of a netlink error answer, if `e` is one.
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// How long [`dump`] keeps asking while the socket's other dump runs.
const DUMP_BUSY_FOR: std::time::Duration = std::time::Duration::from_secs(3);

/// Collect a netlink dump (`start` sends the request each time it is called). The kernel runs
/// one dump at a time per netlink socket and answers EBUSY to a second one started before the
/// first ends (`netlink_dump_start`). Every connection here is shared by tasks that dump
/// concurrently (the facts refresh beside the daemon's loop, a VRRP instance starting, a VIP
/// being removed), so EBUSY means "ask again in a moment", never a failure of the caller's
/// step: the dump is asked again until the other one has ended, for up to 3 s (a dump of a
/// large neighbour table takes milliseconds). Any other error is returned at once.
pub async fn dump<T, S>(mut start: impl FnMut() -> S) -> Result<Vec<T>, rtnetlink::Error>
where
    S: Stream<Item = Result<T, rtnetlink::Error>>,
{
    let deadline = tokio::time::Instant::now() + DUMP_BUSY_FOR;
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        match start().try_collect::<Vec<T>>().await {
            Err(e) if errno(&e) == Some(libc::EBUSY) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// A connection to rtnetlink (its I/O runs as a tokio task).
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    pub fn new() -> Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection().context("open rtnetlink")?;
        tokio::spawn(conn);
        Ok(Netlink { handle })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    pub async fn links(&self) -> Result<Vec<Link>> {
        let mut out = Vec::new();
        for msg in dump(|| self.handle.link().get().execute()).await? {
            let mut link = Link {
                index: msg.header.index,
                name: String::new(),
                mac: [0; 6],
                up: msg
                    .header
                    .flags
                    .contains(rtnetlink::packet_route::link::LinkFlags::Up),
                xdp_attached: false,
            };
            for a in msg.attributes {
                match a {
                    LinkAttribute::IfName(n) => link.name = n,
                    LinkAttribute::Address(m) if m.len() == 6 => link.mac.copy_from_slice(&m),
                    LinkAttribute::Xdp(x) => {
                        use rtnetlink::packet_route::link::{LinkXdp, XdpAttached};
                        link.xdp_attached = x.iter().any(|a| {
                            matches!(a, LinkXdp::Attached(k) if *k != XdpAttached::None)
                                || matches!(a, LinkXdp::ProgId(id) if *id != 0)
                        });
                    }
                    _ => {}
                }
            }
            out.push(link);
        }
        Ok(out)
    }

    pub async fn link(&self, name: &str) -> Result<Link> {
        self.links()
            .await?
            .into_iter()
            .find(|l| l.name == name)
            .ok_or_else(|| anyhow!("interface {name:?} not found"))
    }

    /// Every address configured on this node (any interface, lo included).
    pub async fn local_addresses(&self) -> Result<HashSet<IpAddr>> {
        let mut out = HashSet::new();
        for msg in dump(|| self.handle.address().get().execute()).await? {
            for a in msg.attributes {
                if let AddressAttribute::Address(ip) = a {
                    out.insert(ip);
                }
            }
        }
        Ok(out)
    }

    /// Neighbour entries with a usable MAC (reachable, stale, delay, probe or permanent).
    pub async fn neighbours(&self) -> Result<Vec<Neighbour>> {
        let mut out = Vec::new();
        for msg in dump(|| self.handle.neighbours().get().execute()).await? {
            let state = msg.header.state;
            if matches!(
                state,
                NeighbourState::Incomplete | NeighbourState::Failed | NeighbourState::None
            ) {
                continue;
            }
            let mut addr = None;
            let mut mac = None;
            for a in msg.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                        addr = Some(IpAddr::V4(ip))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => {
                        addr = Some(IpAddr::V6(ip))
                    }
                    NeighbourAttribute::LinkLocalAddress(m) if m.len() == 6 => {
                        let mut b = [0u8; 6];
                        b.copy_from_slice(&m);
                        mac = Some(b);
                    }
                    _ => {}
                }
            }
            if let (Some(addr), Some(mac)) = (addr, mac) {
                out.push(Neighbour {
                    ifindex: msg.header.ifindex,
                    addr,
                    mac,
                    state: format!("{state:?}").to_lowercase(),
                });
            }
        }
        Ok(out)
    }

    /// How the kernel would route a packet to `dst` (`ip route get`): the next hop (the
    /// gateway, or `dst` itself when on-link), the out interface, the preferred source and
    /// that interface's MTU.
    pub async fn route_to(&self, dst: IpAddr) -> Result<RoutePath> {
        use rtnetlink::packet_route::{
            link::LinkAttribute,
            route::{RouteAddress, RouteAttribute},
        };
        let prefix = if dst.is_ipv4() { 32 } else { 128 };
        let msg = rtnetlink::RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst, prefix)
            .map_err(|e| anyhow!("route to {dst}: {e:?}"))?
            .build();
        let mut s = self.handle.route().get(msg).execute();
        let route = s
            .try_next()
            .await
            .with_context(|| format!("route to {dst}"))?
            .ok_or_else(|| anyhow!("no route to {dst}"))?;
        let as_ip = |a: RouteAddress| match a {
            RouteAddress::Inet(v) => Some(IpAddr::V4(v)),
            RouteAddress::Inet6(v) => Some(IpAddr::V6(v)),
            _ => None,
        };
        let (mut gateway, mut oif, mut src, mut route_mtu) = (None, None, None, None);
        for a in route.attributes {
            match a {
                RouteAttribute::Gateway(g) => gateway = as_ip(g),
                RouteAttribute::Oif(i) => oif = Some(i),
                RouteAttribute::PrefSource(p) => src = as_ip(p),
                // The route's MTU, or the path MTU the kernel learned for this destination (a
                // cached exception): both below the link's when a smaller hop is on the way.
                RouteAttribute::Metrics(m) => {
                    for metric in m {
                        if let rtnetlink::packet_route::route::RouteMetric::Mtu(v) = metric
                            && v != 0
                        {
                            route_mtu = Some(v);
                        }
                    }
                }
                _ => {}
            }
        }
        let oif = oif.ok_or_else(|| anyhow!("route to {dst} has no out interface"))?;
        let mut links = self.handle.link().get().match_index(oif).execute();
        let mut mtu = 1500;
        if let Some(link) = links.try_next().await? {
            for a in link.attributes {
                if let LinkAttribute::Mtu(m) = a {
                    mtu = m;
                }
            }
        }
        Ok(RoutePath {
            next_hop: gateway.unwrap_or(dst),
            oif,
            src,
            mtu: route_mtu.map_or(mtu, |r| r.min(mtu)),
        })
    }

    /// MACs of `addrs` on interface `ifindex`.
    pub async fn macs_on(
        &self,
        ifindex: u32,
        addrs: &[IpAddr],
    ) -> Result<HashMap<IpAddr, [u8; 6]>> {
        let want: HashSet<&IpAddr> = addrs.iter().collect();
        Ok(self
            .neighbours()
            .await?
            .into_iter()
            .filter(|n| n.ifindex == ifindex && want.contains(&n.addr))
            .map(|n| (n.addr, n.mac))
            .collect())
    }
}

pub use lb_core::net::RoutePath;

/// Make the kernel resolve `addr`'s MAC: a zero-length UDP datagram to the discard port, sent out
/// of `interface`. The backend's reply (if any) is irrelevant; the ARP/ND exchange is the point.
pub fn trigger_resolution(interface: &str, addr: IpAddr) {
    use socket2::{Domain, SockAddr, Socket, Type};
    let target = std::net::SocketAddr::new(addr, 9);
    let Ok(sock) = Socket::new(Domain::for_address(target), Type::DGRAM, None) else {
        return;
    };
    // Best effort: without the device binding the datagram may leave by another route, which
    // only means this attempt resolves nothing; the next refresh tries again.
    let _ = sock.bind_device(Some(interface.as_bytes()));
    let _ = sock.send_to(&[], &SockAddr::from(target));
}

/// A stream of "the neighbour table changed" signals (RTNLGRP_NEIGH notifications), so backend
/// MACs follow the kernel live. Each item is just a wake-up; the caller re-reads the table.
pub fn neighbour_changes() -> Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    const RTMGRP_NEIGH: u32 = 4;
    notifications(RTMGRP_NEIGH, "neighbour")
}

/// A stream of "some link changed" signals (RTNLGRP_LINK notifications: state, MAC, a device
/// added or removed), so VRRP instances and static VIPs follow their interface at once instead
/// of at their next poll. Each item is a wake-up; the caller reads the interface again.
pub fn link_changes() -> Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    const RTMGRP_LINK: u32 = 1;
    notifications(RTMGRP_LINK, "link")
}

/// One wake-up per rtnetlink notification of the multicast `groups`.
fn notifications(groups: u32, what: &str) -> Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    use rtnetlink::sys::{AsyncSocket, SocketAddr};
    let (mut conn, _handle, mut messages) =
        rtnetlink::new_connection().context("open rtnetlink")?;
    conn.socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(0, groups))
        .with_context(|| format!("subscribe to {what} notifications"))?;
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use futures::StreamExt;
        while messages.next().await.is_some() {
            if tx.send(()).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// The next wake-up from [`link_changes`], or never when there is no subscription (polling
/// alone then follows the interface).
pub async fn next_link_change(rx: &mut Option<tokio::sync::mpsc::UnboundedReceiver<()>>) {
    match rx {
        Some(r) => {
            if r.recv().await.is_none() {
                *rx = None;
            }
            // Several changes at once (a MAC change is a burst of messages): one wake-up.
            if let Some(r) = rx {
                while r.try_recv().is_ok() {}
            }
        }
        None => std::future::pending().await,
    }
}

/// Hold `vip` as a local address on `lo` that is never announced (the DSR backend role): IPv4
/// as /32, IPv6 as a nodad /128. Already present is fine.
pub async fn ensure_local_vip(handle: &Handle, vip: IpAddr) -> Result<()> {
    let lo = {
        let mut s = handle.link().get().match_name("lo".into()).execute();
        s.try_next()
            .await?
            .map(|m| m.header.index)
            .ok_or_else(|| anyhow!("no lo"))?
    };
    let prefix = if vip.is_ipv4() { 32 } else { 128 };
    let mut req = handle.address().add(lo, vip, prefix);
    // Labelled like every address lbd adds, so removal can tell it from the host's own.
    if vip.is_ipv4()
        && let Some(label) = crate::net::addr::vip_label("lo")
    {
        req.message_mut()
            .attributes
            .push(AddressAttribute::Label(label));
    }
    if vip.is_ipv6() {
        use rtnetlink::packet_route::address::{AddressFlags, AddressHeaderFlags};
        let msg = req.message_mut();
        msg.header.flags |= AddressHeaderFlags::Nodad;
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    match req.execute().await {
        Ok(()) => Ok(()),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => Ok(()),
        Err(e) => Err(e).with_context(|| format!("add {vip} to lo")),
    }
}

/// Make `interface` (and `all`) answer ARP only for addresses configured on the interface the
/// request came in on, and use such an address as ARP source: then a VIP on `lo` is never
/// announced, while the VRRP master's VIP on `interface` is. The values found the first time
/// are saved in `saved` (JSON) so a rollback can put them back ([`restore_arp_sysctls`]).
pub fn set_arp_sysctls(interface: &str, saved: &std::path::Path) -> Result<()> {
    let keys: Vec<String> = ["all", interface]
        .iter()
        .flat_map(|dev| {
            ["arp_ignore", "arp_announce"].map(|k| format!("/proc/sys/net/ipv4/conf/{dev}/{k}"))
        })
        .collect();
    if !saved.exists() {
        let mut before = serde_json::Map::new();
        for path in &keys {
            let v = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
            before.insert(path.clone(), v.trim().into());
        }
        if let Some(dir) = saved.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(saved, serde_json::Value::Object(before).to_string())
            .with_context(|| format!("save sysctls to {}", saved.display()))?;
    }
    for path in &keys {
        let v = if path.ends_with("arp_ignore") {
            "1"
        } else {
            "2"
        };
        std::fs::write(path, v).with_context(|| format!("write {path}"))?;
    }
    Ok(())
}

/// Put back the sysctls [`set_arp_sysctls`] saved, and forget them. Nothing saved: nothing to
/// do. Returns the paths restored.
pub fn restore_arp_sysctls(saved: &std::path::Path) -> Result<Vec<String>> {
    let Ok(text) = std::fs::read_to_string(saved) else {
        return Ok(Vec::new());
    };
    let before: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).with_context(|| format!("parse {}", saved.display()))?;
    let mut done = Vec::new();
    for (path, v) in before {
        // Only ARP sysctls, whatever the file says.
        if !path.starts_with("/proc/sys/net/ipv4/conf/") {
            continue;
        }
        if let Some(v) = v.as_str() {
            // The interface may be gone; that is fine for a rollback.
            if std::fs::write(&path, v).is_ok() {
                done.push(path);
            }
        }
    }
    std::fs::remove_file(saved)?;
    Ok(done)
}

/// Remove `vip` from `lo` (the DSR-backend address [`ensure_local_vip`] added). Absent is fine.
pub async fn remove_local_vip(handle: &Handle, vip: IpAddr) -> Result<()> {
    crate::net::addr::remove_vip(handle, "lo", vip).await
}
