//! The announcements that move neighbours' caches to the node that took a VIP (gratuitous ARP
//! for IPv4, unsolicited neighbour advertisements for IPv6). The address itself is
//! `net::addr`'s.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::net::iface::interface_info;

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
}
