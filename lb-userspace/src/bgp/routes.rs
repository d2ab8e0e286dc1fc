//! The announcement itself: a blackhole host route for the VIP in the main table, tagged with
//! lbd's routing protocol number. FRR's zebra learns it as a kernel route and bgpd redistributes
//! it through the `lb-announce` route-map; removing the route withdraws the prefix.
//!
//! Why kernel routes rather than `network` statements through vtysh: the announcement state
//! lives in the kernel, not in FRR's running config, so it survives an FRR restart (zebra reads
//! the kernel's routes when it starts), costs one netlink message instead of a vtysh process,
//! and is visible with `ip route show proto 76`. The blackhole is also right for the node
//! itself: XDP serves the VIP's services before routing, and anything else sent to the VIP is
//! dropped here instead of being routed back upstream (a loop).

use std::{collections::BTreeSet, net::IpAddr};

use anyhow::{Context, Result};
use rtnetlink::{
    Handle, IpVersion, RouteMessageBuilder,
    packet_route::route::{RouteAttribute, RouteProtocol, RouteType},
};

/// Routing protocol number of lbd's announcement routes (`ip route show proto 76`).
pub const ROUTE_PROTO: u8 = 76;

fn message(addr: IpAddr) -> Result<rtnetlink::packet_route::route::RouteMessage> {
    let len = if addr.is_ipv4() { 32 } else { 128 };
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(addr, len)
        .context("route prefix")?
        .protocol(RouteProtocol::Other(ROUTE_PROTO))
        .kind(RouteType::BlackHole)
        .build())
}

pub async fn install(handle: &Handle, addr: IpAddr) -> Result<()> {
    handle
        .route()
        .add(message(addr)?)
        .replace()
        .execute()
        .await
        .with_context(|| format!("install the announcement route for {addr}"))
}

pub async fn remove(handle: &Handle, addr: IpAddr) -> Result<()> {
    match handle.route().del(message(addr)?).execute().await {
        Ok(()) => Ok(()),
        // Already gone (ESRCH): the goal is reached.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
        Err(e) => Err(e).with_context(|| format!("remove the announcement route for {addr}")),
    }
}

/// Host routes with lbd's protocol in the main table (what a previous lbd left announced).
pub async fn installed(handle: &Handle) -> Result<BTreeSet<IpAddr>> {
    let mut out = BTreeSet::new();
    for v in [IpVersion::V4, IpVersion::V6] {
        let req = match v {
            IpVersion::V4 => RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            IpVersion::V6 => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let routes = crate::net::dump(|| handle.route().get(req.clone()).execute())
            .await
            .context("list routes")?;
        for m in routes {
            if m.header.protocol != RouteProtocol::Other(ROUTE_PROTO) {
                continue;
            }
            for a in &m.attributes {
                if let RouteAttribute::Destination(d) = a {
                    use rtnetlink::packet_route::route::RouteAddress;
                    match d {
                        RouteAddress::Inet(a) => {
                            out.insert(IpAddr::V4(*a));
                        }
                        RouteAddress::Inet6(a) => {
                            out.insert(IpAddr::V6(*a));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(out)
}
