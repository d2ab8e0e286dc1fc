//! Facts about the host's network as plain values: an address as the kernel lists it, which
//! addresses lbd adds (and so may ever remove), the path to a routed backend. Pure: reading them
//! (rtnetlink, getifaddrs) is lb-userspace's `net`.

use std::net::IpAddr;

/// The kernel's IFNAMSIZ: an interface name or label with its NUL.
pub const IFNAMSIZ: usize = 16;

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
    (label.len() < IFNAMSIZ).then_some(label)
}

/// Whether `label`, on `ifname`, is one lbd gives its VIPs: today's ([`vip_label`]) or the one
/// of earlier versions (`<ifname>:lb`). Pure.
pub fn is_vip_label(ifname: &str, label: &str) -> bool {
    label
        .strip_prefix(ifname)
        .is_some_and(|rest| rest == VIP_LABEL_SUFFIX || rest == OLD_VIP_LABEL_SUFFIX)
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

/// Whether `a`, listed on `ifname`, is an address lbd adds (lb-userspace's `net::addr::add_vip`)
/// and so may ever remove: IPv4 only as a /32 with our [`vip_label`] (when the interface name
/// leaves no room for the label, a /32), IPv6 only as a /128 without duplicate address
/// detection. Pure.
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

/// The path to a destination, as lb-userspace's `Netlink::route_to` reads it from the routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutePath {
    pub next_hop: IpAddr,
    pub oif: u32,
    pub src: Option<IpAddr>,
    /// The path's MTU: the out interface's, or the route's (its `mtu` metric, or a path MTU the
    /// kernel learned for the destination) when smaller.
    pub mtu: u32,
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
