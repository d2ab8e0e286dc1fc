//! Taking and giving up VIPs on an interface: the address itself (rtnetlink) and the
//! announcements that move neighbours' caches to us (gratuitous ARP for IPv4, unsolicited
//! neighbour advertisements for IPv6).

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};

use super::io::{if_index, interface_info};
use crate::netlink::errno;

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV4: u16 = 0x0800;
const ARPOP_REQUEST: u16 = 1;
const ICMPV6_NEIGHBOR_ADVERT: u8 = 136;
/// Neighbour advertisement flags: Override (RFC 4861 4.4), so caches replace the old MAC.
const NA_FLAG_OVERRIDE: u32 = 0x2000_0000;
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// A gratuitous ARP (an ARP request for the VIP from the VIP, RFC 5227 "announcement" form):
/// the 28-byte ARP payload; the kernel adds the broadcast Ethernet header.
pub fn arp_announcement(mac: [u8; 6], ip: Ipv4Addr) -> [u8; 28] {
    let mut p = [0u8; 28];
    p[0..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    p[2..4].copy_from_slice(&ETH_P_IPV4.to_be_bytes());
    p[4] = 6;
    p[5] = 4;
    p[6..8].copy_from_slice(&ARPOP_REQUEST.to_be_bytes());
    p[8..14].copy_from_slice(&mac);
    p[14..18].copy_from_slice(&ip.octets());
    // Target hardware address stays zero; target protocol address is the VIP again.
    p[24..28].copy_from_slice(&ip.octets());
    p
}

/// An unsolicited neighbour advertisement for `ip` with the override flag and our MAC as the
/// target link-layer address option. The checksum is left zero: the kernel fills it in on
/// ICMPv6 raw sockets.
pub fn unsolicited_na(mac: [u8; 6], ip: Ipv6Addr) -> [u8; 32] {
    let mut p = [0u8; 32];
    p[0] = ICMPV6_NEIGHBOR_ADVERT;
    p[4..8].copy_from_slice(&NA_FLAG_OVERRIDE.to_be_bytes());
    p[8..24].copy_from_slice(&ip.octets());
    p[24] = 2; // option: target link-layer address
    p[25] = 1; // length in units of 8 bytes
    p[26..32].copy_from_slice(&mac);
    p
}

/// Sends announcements for VIPs out of one interface.
pub struct Announcer {
    ifindex: u32,
    mac: [u8; 6],
    arp: OwnedFd,
    nd: socket2::Socket,
}

impl Announcer {
    pub fn new(ifname: &str) -> io::Result<Self> {
        let info = interface_info(ifname)?;
        let mac = info.mac.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface {ifname:?} has no Ethernet address"),
            )
        })?;
        // SAFETY: socket(2) calls; results checked before being owned.
        let arp = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ARP.to_be()),
            )
        };
        if arp < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let arp = unsafe { OwnedFd::from_raw_fd(arp) };
        // The ND socket through socket2 (no raw calls); the ARP one above stays libc because a
        // link-layer destination (sockaddr_ll) has no safe constructor in socket2.
        let nd = socket2::Socket::new(
            socket2::Domain::IPV6,
            socket2::Type::RAW.nonblocking().cloexec(),
            Some(socket2::Protocol::ICMPV6),
        )?;
        nd.bind_device(Some(ifname.as_bytes()))?;
        // Hop limit 255 or receivers discard the NA (RFC 4861 7.1.2).
        nd.set_multicast_hops_v6(255)?;
        nd.set_multicast_if_v6(info.index)?;
        Ok(Announcer {
            ifindex: info.index,
            mac,
            arp,
            nd,
        })
    }

    /// The MAC this announcer announces (the interface's when it was made).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Announce every VIP once. Errors are returned after trying all of them.
    pub fn announce(&self, vips: &[IpAddr]) -> io::Result<()> {
        let mut last_err = None;
        for vip in vips {
            let r = match vip {
                IpAddr::V4(ip) => self.send_arp(*ip),
                IpAddr::V6(ip) => self.send_na(*ip),
            };
            if let Err(e) = r {
                last_err = Some(e);
            }
        }
        last_err.map_or(Ok(()), Err)
    }

    fn send_arp(&self, ip: Ipv4Addr) -> io::Result<()> {
        let frame = arp_announcement(self.mac, ip);
        // SAFETY: all-zero is a valid sockaddr_ll; we then fill the fields.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ARP.to_be();
        sll.sll_ifindex = self.ifindex as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        // SAFETY: frame and address are valid for the call.
        let n = unsafe {
            libc::sendto(
                self.arp.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn send_na(&self, ip: Ipv6Addr) -> io::Result<()> {
        let msg = unsolicited_na(self.mac, ip);
        let to = std::net::SocketAddrV6::new(ALL_NODES, 0, 0, self.ifindex);
        self.nd.send_to(&msg, &socket2::SockAddr::from(to))?;
        Ok(())
    }
}

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
    let found = crate::netlink::dump(|| {
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
    let listed = crate::netlink::dump(|| {
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
    fn arp_announcement_layout() {
        let mac = [2, 0, 0, 0, 0, 1];
        let p = arp_announcement(mac, Ipv4Addr::new(192, 0, 2, 100));
        assert_eq!(&p[..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&p[8..14], &mac);
        assert_eq!(&p[14..18], &[192, 0, 2, 100]);
        assert_eq!(&p[18..24], &[0; 6]);
        assert_eq!(&p[24..28], &[192, 0, 2, 100]);
    }

    #[test]
    fn na_layout() {
        let mac = [2, 0, 0, 0, 0, 1];
        let ip: Ipv6Addr = "2001:db8::100".parse().unwrap();
        let p = unsolicited_na(mac, ip);
        assert_eq!(p[0], 136);
        assert_eq!(p[1], 0);
        // Override set; Router and Solicited clear.
        assert_eq!(&p[4..8], &[0x20, 0, 0, 0]);
        assert_eq!(&p[8..24], &ip.octets());
        assert_eq!(&p[24..32], &[2, 1, 2, 0, 0, 0, 0, 1]);
    }

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
