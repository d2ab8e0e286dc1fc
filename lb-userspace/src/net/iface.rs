//! This host's interfaces and addresses as getifaddrs(3) and /proc report them: an
//! interface's index, MAC, state and addresses, and every address of the host with what tells
//! lbd's own from the host's. No netlink: cheap enough to poll.

use std::io;
use std::net::{IpAddr, Ipv6Addr};

use super::addr::ListedAddr;

pub fn if_index(ifname: &str) -> io::Result<u32> {
    match nix::net::if_::if_nametoindex(ifname) {
        Ok(0) | Err(nix::Error::ENODEV) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("interface {ifname:?} not found"),
        )),
        Ok(idx) => Ok(idx),
        // A name with a NUL, or a name too long: no interface has it.
        Err(nix::Error::EINVAL) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {ifname:?} is not valid"),
        )),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Facts about one interface from getifaddrs(3): cheap enough to poll for link state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub index: u32,
    pub mac: Option<[u8; 6]>,
    /// Administratively up and with carrier (IFF_UP and IFF_RUNNING).
    pub up: bool,
    pub addrs: Vec<IpAddr>,
}

pub fn interface_info(ifname: &str) -> io::Result<InterfaceInfo> {
    let mut info = InterfaceInfo {
        index: if_index(ifname)?,
        ..Default::default()
    };
    for ifa in nix::ifaddrs::getifaddrs()?.filter(|a| a.interface_name == ifname) {
        use nix::net::if_::InterfaceFlags as F;
        if ifa.flags.contains(F::IFF_UP) && ifa.flags.contains(F::IFF_RUNNING) {
            info.up = true;
        }
        let Some(sa) = ifa.address else { continue };
        if let Some(a) = sa.as_sockaddr_in() {
            info.addrs.push(IpAddr::V4(a.ip()));
        } else if let Some(a) = sa.as_sockaddr_in6() {
            info.addrs.push(IpAddr::V6(a.ip()));
        } else if let Some(l) = sa.as_link_addr()
            && l.halen() == 6
        {
            info.mac = l.addr();
        }
    }
    Ok(info)
}

/// Every address of this host, with its interface and what tells lbd's own from the host's
/// (see [`super::addr::added_by_lbd`]): IPv4 from getifaddrs(3) (the name it reports is
/// the address label, `eth0:lbvip`), IPv6 from /proc/net/if_inet6 (which carries the flags).
pub fn host_addresses() -> io::Result<Vec<(String, ListedAddr)>> {
    use ListedAddr;
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let Some(sa) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) else {
            continue;
        };
        let prefix_len = ifa
            .netmask
            .as_ref()
            .and_then(|m| m.as_sockaddr_in())
            .map_or(32, |m| u32::from(m.ip()).count_ones() as u8);
        // getifaddrs(3) reports the address label (`eth0:lbvip`) as the name.
        let label = ifa.interface_name;
        let ifname = label.split(':').next().unwrap_or_default().to_string();
        out.push((
            ifname,
            ListedAddr {
                addr: IpAddr::V4(sa.ip()),
                prefix_len,
                label: Some(label),
                nodad: false,
            },
        ));
    }
    // No IPv6 at all (disabled): nothing to add.
    if let Ok(text) = std::fs::read_to_string("/proc/net/if_inet6") {
        out.extend(parse_if_inet6(&text));
    }
    Ok(out)
}

/// `/proc/net/if_inet6` lines: address (32 hex digits), ifindex, prefix length, scope, flags
/// (hex), interface name. Pure.
pub fn parse_if_inet6(text: &str) -> Vec<(String, ListedAddr)> {
    const IFA_F_NODAD: u32 = 0x02;
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || f[0].len() != 32 {
                return None;
            }
            let addr = u128::from_str_radix(f[0], 16).ok()?;
            let prefix_len = u8::from_str_radix(f[2], 16).ok()?;
            let flags = u32::from_str_radix(f[4], 16).ok()?;
            Some((
                f[5].to_string(),
                ListedAddr {
                    addr: IpAddr::V6(Ipv6Addr::from(addr)),
                    prefix_len,
                    label: None,
                    nodad: flags & IFA_F_NODAD != 0,
                },
            ))
        })
        .collect()
}

impl InterfaceInfo {
    /// The address adverts are sent from: for IPv6 the first link-local address (RFC 9568), for
    /// IPv4 the first address that is not one of our VIPs.
    pub fn primary_addr(&self, v6: bool, vips: &[IpAddr]) -> Option<IpAddr> {
        self.addrs.iter().copied().find(|a| match a {
            IpAddr::V4(_) => !v6 && !vips.contains(a),
            IpAddr::V6(a6) => v6 && a6.segments()[0] & 0xffc0 == 0xfe80,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Loopback is in every network namespace, up, with 127.0.0.1/8 labelled `lo`.
    #[test]
    fn interfaces_and_addresses_of_this_host() {
        assert_eq!(if_index("lo").unwrap(), interface_info("lo").unwrap().index);
        let e = if_index("no-such-if0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("no-such-if0"), "{e}");
        assert!(if_index("bad\0name").is_err());
        let lo = interface_info("lo").unwrap();
        assert!(lo.up);
        assert!(
            lo.addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{lo:?}"
        );
        let all = host_addresses().unwrap();
        assert!(
            all.iter().any(|(ifname, a)| ifname == "lo"
                && a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)
                && a.prefix_len == 8
                && a.label.as_deref() == Some("lo")),
            "{all:?}"
        );
    }

    #[test]
    fn if_inet6_lines_parse() {
        let text = "fd000000000000000000000000000005 02 80 00 82 eth0\n\
                    fe800000000000000000000000000001 02 40 20 80 eth0\n\
                    garbage\n";
        let got = parse_if_inet6(text);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "eth0");
        assert_eq!(got[0].1.addr, "fd00::5".parse::<IpAddr>().unwrap());
        assert_eq!(got[0].1.prefix_len, 128);
        assert!(got[0].1.nodad);
        assert_eq!(got[1].1.prefix_len, 64);
        assert!(!got[1].1.nodad);
    }

    #[test]
    fn host_addresses_include_loopback() {
        let all = host_addresses().unwrap();
        assert!(all.iter().any(|(i, a)| i == "lo"
            && a.addr == IpAddr::from(Ipv4Addr::LOCALHOST)
            && a.prefix_len == 8));
    }

    #[test]
    fn loopback_has_no_mac_but_exists() {
        let info = interface_info("lo").unwrap();
        assert!(info.index > 0);
        assert!(info.addrs.contains(&"127.0.0.1".parse().unwrap()));
        assert!(interface_info("no-such-if0").is_err());
    }
}
