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

/// What follows the interface name in the label of IPv4 VIPs: it ends in `vip`, as
/// OVN-Kubernetes wants of addresses that are not the node's own (it skips them when it picks
/// the node's gateway address and host CIDRs, as it does keepalived's VIPs), and its `lb` tells
/// lbd's from keepalived's.
pub const VIP_LABEL_SUFFIX: &str = ":lbvip";

/// The label earlier versions gave their VIPs, still recognised as lbd's own (a restart after
/// an upgrade removes the VIPs the old version left, and keeps those it holds).
const OLD_VIP_LABEL_SUFFIX: &str = ":lb";

/// The label given to IPv4 VIPs, so `ip addr` shows which addresses lbd manages, a restart can
/// find them, and OVN-Kubernetes does not take them for node addresses. `None` when
/// `<ifname>:lbvip` does not fit in IFNAMSIZ (a name of more than 9 characters).
pub fn vip_label(ifname: &str) -> Option<String> {
    let label = format!("{ifname}{VIP_LABEL_SUFFIX}");
    (label.len() < libc::IFNAMSIZ).then_some(label)
}

/// Whether `label`, on `ifname`, is one lbd gives its VIPs: today's ([`vip_label`]) or the one
/// of earlier versions (`<ifname>:lb`). Pure.
pub fn is_vip_label(ifname: &str, label: &str) -> bool {
    label
        .strip_prefix(ifname)
        .is_some_and(|rest| rest == VIP_LABEL_SUFFIX || rest == OLD_VIP_LABEL_SUFFIX)
}

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

/// One address as the kernel lists it: what decides whether lbd may remove it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedAddr {
    pub addr: IpAddr,
    pub prefix_len: u8,
    /// IPv4 label (`None` when the kernel sent none).
    pub label: Option<String>,
    /// IFA_F_NODAD, from the header or the 32-bit flags attribute.
    pub nodad: bool,
}

impl ListedAddr {
    fn of(msg: &rtnetlink::packet_route::address::AddressMessage) -> Option<ListedAddr> {
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
}

/// Whether `a`, listed on `ifname`, is an address lbd adds (see [`add_vip`]) and so may ever
/// remove: IPv4 only as a /32 with our [`vip_label`] (when the interface name leaves no room
/// for the label, a /32), IPv6 only as a /128 without duplicate address detection. Pure.
///
/// A node's own address (its prefix, and with it the connected route) never matches, even when
/// a VIP was configured equal to it by mistake: lbd never takes a node off its network.
pub fn added_by_lbd(ifname: &str, a: &ListedAddr) -> bool {
    match a.addr {
        IpAddr::V4(_) => {
            a.prefix_len == 32
                && match vip_label(ifname) {
                    Some(_) => a.label.as_deref().is_some_and(|l| is_vip_label(ifname, l)),
                    None => true,
                }
        }
        IpAddr::V6(_) => a.prefix_len == 128 && a.nodad,
    }
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
        match ListedAddr::of(&msg) {
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
        let Some(a) = ListedAddr::of(&msg) else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_host_addresses_lbd_adds_are_ever_removed() {
        let a = |addr: &str, prefix_len, label: Option<&str>, nodad| ListedAddr {
            addr: addr.parse().unwrap(),
            prefix_len,
            label: label.map(str::to_string),
            nodad,
        };
        // What add_vip adds.
        assert!(added_by_lbd(
            "eth0",
            &a("10.0.0.5", 32, Some("eth0:lbvip"), false)
        ));
        // What earlier versions added.
        assert!(added_by_lbd(
            "eth0",
            &a("10.0.0.5", 32, Some("eth0:lb"), false)
        ));
        // keepalived's VIP (OpenShift's `label vip`) is not lbd's.
        assert!(!added_by_lbd(
            "eth0",
            &a("10.0.0.5", 32, Some("eth0:vip"), false)
        ));
        assert!(added_by_lbd("eth0", &a("fd00::5", 128, None, true)));
        // The node's own address, equal to a VIP by mistake: its prefix, no label, DAD done.
        assert!(!added_by_lbd(
            "eth0",
            &a("10.0.0.5", 24, Some("eth0"), false)
        ));
        assert!(!added_by_lbd(
            "eth0",
            &a("10.0.0.5", 24, Some("eth0:lbvip"), false)
        ));
        assert!(!added_by_lbd(
            "eth0",
            &a("10.0.0.5", 32, Some("eth0"), false)
        ));
        assert!(!added_by_lbd("eth0", &a("10.0.0.5", 32, None, false)));
        assert!(!added_by_lbd("eth0", &a("fd00::5", 64, None, false)));
        assert!(!added_by_lbd("eth0", &a("fd00::5", 64, None, true)));
        assert!(!added_by_lbd("eth0", &a("fd00::5", 128, None, false)));
        // Another interface's label is not ours.
        assert!(!added_by_lbd(
            "eth0",
            &a("10.0.0.5", 32, Some("eth1:lbvip"), false)
        ));
        // No room for a label: a /32 is the most that can be told.
        assert!(added_by_lbd(
            "enp0s31f6abcd",
            &a("10.0.0.5", 32, Some("enp0s31f6abcd"), false)
        ));
        assert!(!added_by_lbd(
            "enp0s31f6abcd",
            &a("10.0.0.5", 24, Some("enp0s31f6abcd"), false)
        ));
    }

    #[test]
    fn labels_fit_ifnamsiz_and_end_in_vip() {
        assert_eq!(vip_label("eth0").as_deref(), Some("eth0:lbvip"));
        assert_eq!(vip_label("br-ex").as_deref(), Some("br-ex:lbvip"));
        assert_eq!(vip_label("enp0s31f6").as_deref(), Some("enp0s31f6:lbvip"));
        assert_eq!(vip_label("enp0s31f6a").as_deref(), None);
        for name in ["lo", "eth0", "br-ex", "bond0", "enp0s31f6"] {
            let l = vip_label(name).unwrap();
            // What OVN-Kubernetes skips, and what the kernel takes (IFNAMSIZ with its NUL).
            assert!(
                l.ends_with("vip") && l.starts_with(name) && l.len() <= 15,
                "{l}"
            );
            assert!(is_vip_label(name, &l));
        }
    }

    #[test]
    fn lbd_recognises_its_labels_of_today_and_of_earlier_versions_only() {
        assert!(is_vip_label("eth0", "eth0:lbvip"));
        assert!(is_vip_label("eth0", "eth0:lb"));
        // keepalived's, the interface's own, another interface's.
        for other in [
            "eth0:vip",
            "eth0",
            "eth0:lbvip2",
            "eth1:lbvip",
            "eth0:lbx",
            "eth00:lb",
        ] {
            assert!(!is_vip_label("eth0", other), "{other}");
        }
    }
}
