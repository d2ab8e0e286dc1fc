//! VIP addresses on an interface through rtnetlink: adding one with lbd's label, removing only
//! what lbd added (never a node's own address), clean-up at start and restart, and the link's
//! state. The announcements that follow an add are the VRRP side's (`vrrp::announce`).

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};

use super::errno;
use super::iface::if_index;

pub use lb_core::net::{ListedAddr, VIP_LABEL_SUFFIX, added_by_lbd, is_vip_label, vip_label};

/// Add `vip` to `ifname`: IPv4 as /32 with the [`vip_label`], IPv6 as /128 without duplicate
/// address detection (the VIP moves between nodes; DAD would delay it and fail on the move).
/// Already present is fine.
pub async fn add_vip(handle: &Handle, ifname: &str, vip: IpAddr) -> Result<()> {
    let index = if_index(ifname)?;
    let prefix = if vip.is_ipv4() { 32 } else { 128 };
    let mut req = handle.address().add(index, vip, prefix);
    let msg = req.message_mut();
    match vip {
        IpAddr::V4(_) => {
            if let Some(label) = vip_label(ifname) {
                msg.attributes.push(AddressAttribute::Label(label));
            }
        }
        IpAddr::V6(_) => {
            msg.header.flags |= AddressHeaderFlags::Nodad;
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
            // Deprecated (preferred lifetime 0): never chosen as the source of this node's own
            // connections, or a backend holding the same VIP would answer itself.
            let mut lifetimes = rtnetlink::packet_route::address::CacheInfo::default();
            lifetimes.ifa_preferred = 0;
            lifetimes.ifa_valid = u32::MAX;
            msg.attributes.push(AddressAttribute::CacheInfo(lifetimes));
        }
    }
    match req.execute().await {
        Ok(()) => Ok(()),
        Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("add VIP {vip} to {ifname}")),
    }
}

/// The address a kernel address message lists, if it names one.
fn listed_addr(msg: &rtnetlink::packet_route::address::AddressMessage) -> Option<ListedAddr> {
    let mut out = ListedAddr {
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        prefix_len: msg.header.prefix_len,
        label: None,
        nodad: msg.header.flags.contains(AddressHeaderFlags::Nodad),
    };
    let mut found = false;
    for a in &msg.attributes {
        match a {
            // IFA_ADDRESS (the peer on point-to-point links, else the local address) is
            // the one `ip addr` shows and the one a delete names.
            AddressAttribute::Address(ip) => {
                out.addr = *ip;
                found = true;
            }
            AddressAttribute::Label(l) => out.label = Some(l.clone()),
            AddressAttribute::Flags(f) => out.nodad |= f.contains(AddressFlags::Nodad),
            _ => {}
        }
    }
    found.then_some(out)
}

/// Remove `vip` from `ifname` if lbd added it ([`added_by_lbd`]); any other address equal to
/// it (a node's own, another tool's) stays. Not present is fine.
pub async fn remove_vip(handle: &Handle, ifname: &str, vip: IpAddr) -> Result<()> {
    let index = match if_index(ifname) {
        Ok(i) => i,
        // No interface, no address.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let found = crate::net::dump(|| {
        handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(vip)
            .execute()
    })
    .await
    .with_context(|| format!("list addresses of {ifname}"))?;
    for msg in found {
        match listed_addr(&msg) {
            Some(a) if added_by_lbd(ifname, &a) => {}
            Some(a) => {
                tracing::warn!(
                    interface = ifname,
                    address = %a.addr,
                    prefix_len = a.prefix_len,
                    label = a.label.as_deref().unwrap_or(""),
                    "not removing an address lbd did not add (a VIP equal to a node address?)"
                );
                continue;
            }
            None => continue,
        }
        match handle.address().del(msg).execute().await {
            Ok(()) => {}
            Err(e)
                if matches!(
                    errno(&e),
                    Some(libc::EADDRNOTAVAIL | libc::ENOENT | libc::ENODEV)
                ) => {}
            Err(e) => return Err(e).with_context(|| format!("remove VIP {vip} from {ifname}")),
        }
    }
    Ok(())
}

/// Restart cleanup for one instance: remove its own VIPs from `ifname` (a crash must never leave
/// a VIP on a node that is not master). Never touches other addresses: another instance's VIPs
/// on the same interface belong to it.
pub async fn remove_stale(handle: &Handle, ifname: &str, vips: &[IpAddr]) -> Result<Vec<IpAddr>> {
    remove_matching(handle, ifname, |ip, _| vips.contains(&ip)).await
}

/// Start-up cleanup (before any instance runs): remove addresses carrying our label that no
/// configured instance owns (VIPs of an earlier configuration).
pub async fn remove_orphans(handle: &Handle, ifname: &str, keep: &[IpAddr]) -> Result<Vec<IpAddr>> {
    remove_matching(handle, ifname, |ip, labelled| {
        labelled && !keep.contains(&ip)
    })
    .await
}

async fn remove_matching(
    handle: &Handle,
    ifname: &str,
    wanted: impl Fn(IpAddr, bool) -> bool,
) -> Result<Vec<IpAddr>> {
    let index = match if_index(ifname) {
        Ok(i) => i,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut stale = Vec::new();
    let listed = crate::net::dump(|| {
        handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
    })
    .await
    .with_context(|| format!("list addresses of {ifname}"))?;
    for msg in listed {
        let Some(a) = listed_addr(&msg) else {
            continue;
        };
        let labelled = a.label.as_deref().is_some_and(|l| is_vip_label(ifname, l));
        if added_by_lbd(ifname, &a) && wanted(a.addr, labelled) && !stale.contains(&a.addr) {
            stale.push(a.addr);
        }
    }
    for ip in &stale {
        remove_vip(handle, ifname, *ip).await?;
    }
    Ok(stale)
}

/// The interface's state as rtnetlink reports it: `Some(up and running)`, or `None` when the
/// interface does not exist. The confirmation a poll that saw it down (or failed) needs before
/// the instance goes to FAULT.
pub async fn link_state(handle: &Handle, ifname: &str) -> Result<Option<bool>> {
    use rtnetlink::packet_route::link::LinkFlags;
    let mut s = handle.link().get().match_name(ifname.to_string()).execute();
    match s.try_next().await {
        Ok(Some(msg)) => Ok(Some(
            msg.header.flags.contains(LinkFlags::Up)
                && msg.header.flags.contains(LinkFlags::Running),
        )),
        Ok(None) => Ok(None),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("link state of {ifname}")),
    }
}
