//! VRRP sockets: raw IP protocol 112 for IPv4 and IPv6, bound to one interface, multicast
//! (224.0.0.18 / ff02::12, joined on that interface) or unicast to configured peers.
//!
//! Sent with TTL / hop limit 255 and DSCP CS6 (as keepalived does). Every received IPv4 advert,
//! multicast or unicast, must arrive with TTL 255 (RFC 5798 5.1.1.3): a router sends with 255
//! and the first forwarding hop lowers it, so a host off the segment cannot forge a peer even
//! when it knows the peer's address, VRID and VIPs. IPv6 multicast adverts need hop limit 255
//! too; IPv6 unicast adverts are passed with their hop limit (keepalived sends them with the
//! default 64 unless `unicast_ttl` is set, so OpenShift's IPv6 keepalived would otherwise never
//! be heard) and checked against the optional per-peer bounds of `unicast_peer_ttl` by the
//! admission policy. A drop is reported as [`DecodeError::BadTtl`]. IPv4 uses
//! `IP_HDRINCL` so the source address (which the v3 checksum covers) is exactly ours without
//! binding the socket, which would also filter out multicast on receive; IPv6 sets the source
//! per packet with `IPV6_PKTINFO` and reads the hop limit and destination from control messages.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;

use super::codec::{self, Advert, DecodeError, IPPROTO_VRRP, VRRP_TOS, VRRP_TTL};
use crate::net::iface::if_index;

/// What one receive produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    Advert {
        src: IpAddr,
        /// Where it was sent: a multicast group or one of our addresses.
        dst: IpAddr,
        /// The TTL / hop limit it arrived with (IPv6 unicast: checked by the admission policy
        /// against the peer's bounds; everything else is 255 here).
        hops: u8,
        advert: Advert,
    },
    Dropped {
        src: Option<IpAddr>,
        reason: DecodeError,
    },
}

/// A raw VRRP socket on one interface, for one address family.
pub struct VrrpSocket {
    fd: AsyncFd<OwnedFd>,
    ifindex: u32,
    src: IpAddr,
    /// Multicast instance: every advert must arrive with TTL / hop limit 255.
    multicast: bool,
}

impl VrrpSocket {
    /// Open a socket on `ifname` that sends from `src` (its family selects IPv4 or IPv6). With
    /// `multicast`, join the VRRP group on the interface.
    pub fn open(ifname: &str, src: IpAddr, multicast: bool) -> io::Result<Self> {
        let ifindex = if_index(ifname)?;
        let v6 = src.is_ipv6();
        // Socket options through socket2; the two it has no setter for (IPV6_RECVPKTINFO and
        // IP_MULTICAST_IF by interface index) through `setsockopt`.
        let sock = socket2::Socket::new(
            if v6 {
                socket2::Domain::IPV6
            } else {
                socket2::Domain::IPV4
            },
            socket2::Type::RAW.nonblocking().cloexec(),
            Some(socket2::Protocol::from(i32::from(IPPROTO_VRRP))),
        )?;
        sock.bind_device(Some(ifname.as_bytes()))?;
        let s = sock.as_raw_fd();
        if v6 {
            sock.set_multicast_hops_v6(u32::from(VRRP_TTL))?;
            sock.set_unicast_hops_v6(u32::from(VRRP_TTL))?;
            sock.set_tclass_v6(u32::from(VRRP_TOS))?;
            sock.set_multicast_loop_v6(false)?;
            sock.set_multicast_if_v6(ifindex)?;
            sock.set_recv_hoplimit_v6(true)?;
            setsockopt_int(s, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
            if multicast {
                sock.join_multicast_v6(&codec::MCAST_V6, ifindex)?;
            }
        } else {
            sock.set_header_included_v4(true)?;
            sock.set_multicast_loop_v4(false)?;
            let mreq = libc::ip_mreqn {
                imr_multiaddr: in_addr(codec::MCAST_V4),
                imr_address: in_addr(Ipv4Addr::UNSPECIFIED),
                imr_ifindex: ifindex as i32,
            };
            setsockopt(s, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &mreq)?;
            if multicast {
                setsockopt(s, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq)?;
            }
        }
        let fd = OwnedFd::from(sock);
        // SAFETY: the OwnedFd is moved in and only closed when the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register(fd) }?;
        Ok(VrrpSocket {
            fd,
            ifindex,
            src,
            multicast,
        })
    }

    pub fn src(&self) -> IpAddr {
        self.src
    }

    /// The interface index the socket is bound to (a recreated interface gets a new one).
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Send one encoded advert (the VRRP payload) to `dst`.
    pub async fn send(&self, payload: &[u8], dst: IpAddr) -> io::Result<()> {
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| self.send_now(fd.as_raw_fd(), payload, dst)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    fn send_now(&self, s: RawFd, payload: &[u8], dst: IpAddr) -> io::Result<()> {
        match (self.src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let packet = ipv4_packet(src, dst, payload)?;
                let sa = sockaddr_in(dst);
                // SAFETY: buffer and address are valid for the duration of the call.
                let n = unsafe {
                    libc::sendto(
                        s,
                        packet.as_ptr().cast(),
                        packet.len(),
                        0,
                        (&sa as *const libc::sockaddr_in).cast(),
                        size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    )
                };
                check_len(n)
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let mut sa = sockaddr_in6(dst, self.ifindex);
                let info = libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr {
                        s6_addr: src.octets(),
                    },
                    ipi6_ifindex: self.ifindex,
                };
                let mut cbuf = [0u64; 8]; // aligned, larger than one in6_pktinfo cmsg
                let mut iov = libc::iovec {
                    iov_base: payload.as_ptr() as *mut libc::c_void,
                    iov_len: payload.len(),
                };
                // SAFETY: msghdr points at live locals; the cmsg is written inside `cbuf`,
                // whose size CMSG_SPACE covers.
                let n = unsafe {
                    let mut msg: libc::msghdr = zeroed();
                    msg.msg_name = (&mut sa as *mut libc::sockaddr_in6).cast();
                    msg.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
                    msg.msg_iov = &mut iov;
                    msg.msg_iovlen = 1;
                    msg.msg_control = cbuf.as_mut_ptr().cast();
                    msg.msg_controllen =
                        libc::CMSG_SPACE(size_of::<libc::in6_pktinfo>() as u32) as usize;
                    let cmsg = libc::CMSG_FIRSTHDR(&msg);
                    (*cmsg).cmsg_level = libc::IPPROTO_IPV6;
                    (*cmsg).cmsg_type = libc::IPV6_PKTINFO;
                    (*cmsg).cmsg_len =
                        libc::CMSG_LEN(size_of::<libc::in6_pktinfo>() as u32) as usize;
                    std::ptr::write_unaligned(
                        libc::CMSG_DATA(cmsg).cast::<libc::in6_pktinfo>(),
                        info,
                    );
                    libc::sendmsg(s, &msg, 0)
                };
                check_len(n)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "destination and source address families differ",
            )),
        }
    }

    /// Receive the next packet: a decoded advert with its source, or a drop with its reason.
    /// The advert is only decoded, not checked against the instance (see [`codec::check`]).
    pub async fn recv(&self) -> io::Result<Incoming> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| self.recv_now(fd.as_raw_fd())) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// A packet already queued on the socket, without waiting (`None`: the queue is empty).
    /// Reads the socket directly, not through the reactor's readiness, which may not have
    /// seen the packet yet when this task ran late.
    pub fn try_recv(&self) -> Option<io::Result<Incoming>> {
        match self.recv_now(self.fd.as_raw_fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            r => Some(r),
        }
    }

    fn recv_now(&self, s: RawFd) -> io::Result<Incoming> {
        let mut buf = [0u8; 2048];
        if self.src.is_ipv4() {
            // SAFETY: writing at most buf.len() bytes into buf.
            let n = unsafe { libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0) };
            let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
            return Ok(parse_ipv4(&buf[..n.min(buf.len())], self.multicast));
        }
        let mut sa: libc::sockaddr_in6 = unsafe { zeroed() };
        let mut cbuf = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr points at live locals of the stated sizes; control messages are read
        // only through the CMSG_* helpers within msg_controllen, with unaligned reads.
        unsafe {
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut sa as *mut libc::sockaddr_in6).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<[u64; 16]>();
            let n = libc::recvmsg(s, &mut msg, 0);
            let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
            let src = IpAddr::V6(Ipv6Addr::from(sa.sin6_addr.s6_addr));
            let mut hops = None;
            let mut dst = None;
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let (level, ty) = ((*cmsg).cmsg_level, (*cmsg).cmsg_type);
                if level == libc::IPPROTO_IPV6 && ty == libc::IPV6_HOPLIMIT {
                    hops = Some(std::ptr::read_unaligned(
                        libc::CMSG_DATA(cmsg).cast::<i32>(),
                    ));
                } else if level == libc::IPPROTO_IPV6 && ty == libc::IPV6_PKTINFO {
                    let info =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::in6_pktinfo>());
                    dst = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
            let truncated = msg.msg_flags & libc::MSG_TRUNC != 0;
            Ok(classify(
                src,
                dst,
                hops,
                truncated,
                &buf[..n.min(buf.len())],
                self.multicast,
            ))
        }
    }
}

/// Whether an advert arriving with `ttl` may be decoded at all: IPv4 always needs 255; IPv6
/// needs 255 on a multicast instance and for anything sent to a group. An IPv6 unicast advert
/// on a unicast instance passes here and meets its peer's bounds in the admission policy.
pub fn ttl_ok(src: IpAddr, dst: Option<IpAddr>, ttl: Option<i32>, multicast: bool) -> bool {
    let strict = src.is_ipv4() || multicast || dst.is_none_or(|d| d.is_multicast());
    !strict || ttl == Some(i32::from(VRRP_TTL))
}

/// Check TTL / hop limit (see [`ttl_ok`]) and decode. `dst` is needed for the v3
/// pseudo-header.
fn classify(
    src: IpAddr,
    dst: Option<IpAddr>,
    ttl: Option<i32>,
    truncated: bool,
    payload: &[u8],
    multicast: bool,
) -> Incoming {
    let dropped = |reason| Incoming::Dropped {
        src: Some(src),
        reason,
    };
    if !ttl_ok(src, dst, ttl, multicast) {
        return dropped(DecodeError::BadTtl);
    }
    let Some(hops) = ttl.and_then(|t| u8::try_from(t).ok()) else {
        return dropped(DecodeError::BadTtl);
    };
    if truncated {
        return dropped(DecodeError::LengthMismatch);
    }
    let Some(dst) = dst else {
        return dropped(DecodeError::Truncated);
    };
    match codec::decode(payload, src, dst) {
        Ok(advert) => Incoming::Advert {
            src,
            dst,
            hops,
            advert,
        },
        Err(reason) => dropped(reason),
    }
}

/// Raw IPv4 sockets receive the IP header too: take source, destination and TTL from it.
fn parse_ipv4(pkt: &[u8], multicast: bool) -> Incoming {
    let bad = Incoming::Dropped {
        src: None,
        reason: DecodeError::Truncated,
    };
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return bad;
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    if ihl < 20 || total < ihl || total > pkt.len() {
        return bad;
    }
    let src = IpAddr::V4(Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]));
    let dst = IpAddr::V4(Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]));
    classify(
        src,
        Some(dst),
        Some(i32::from(pkt[8])),
        false,
        &pkt[ihl..total],
        multicast,
    )
}

/// An IPv4 packet for `IP_HDRINCL`: the kernel fills in the ID and header checksum.
fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> io::Result<Vec<u8>> {
    let total = u16::try_from(20 + payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "advert too large"))?;
    let mut p = Vec::with_capacity(usize::from(total));
    p.extend_from_slice(&[0x45, VRRP_TOS]);
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, VRRP_TTL, IPPROTO_VRRP, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    Ok(p)
}

fn check_len(n: isize) -> io::Result<()> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(crate) fn setsockopt<T>(s: RawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T of the stated size.
    let r = unsafe {
        libc::setsockopt(
            s,
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn setsockopt_int(s: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    setsockopt(s, level, name, &value)
}

fn in_addr(a: Ipv4Addr) -> libc::in_addr {
    libc::in_addr {
        s_addr: u32::from_ne_bytes(a.octets()),
    }
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_addr = in_addr(a);
    sa
}

pub(crate) fn sockaddr_in6(a: Ipv6Addr, ifindex: u32) -> libc::sockaddr_in6 {
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut sa: libc::sockaddr_in6 = unsafe { zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_addr = libc::in6_addr {
        s6_addr: a.octets(),
    };
    // Link-local and multicast destinations need the interface as scope.
    sa.sin6_scope_id = ifindex;
    sa
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adv() -> (Advert, Ipv4Addr, Ipv4Addr) {
        let a = Advert {
            version: codec::Version::V3,
            vrid: 9,
            priority: 100,
            interval_cs: 10,
            addrs: vec!["192.0.2.50".parse().unwrap()],
            auth: codec::Auth::None,
        };
        (a, Ipv4Addr::new(192, 0, 2, 1), codec::MCAST_V4)
    }

    #[test]
    fn ipv4_packet_parses_back() {
        let (a, src, dst) = adv();
        let payload = codec::encode(&a, src.into(), dst.into()).unwrap();
        let pkt = ipv4_packet(src, dst, &payload).unwrap();
        assert_eq!(
            parse_ipv4(&pkt, true),
            Incoming::Advert {
                src: src.into(),
                dst: dst.into(),
                hops: 255,
                advert: a
            }
        );
    }

    #[test]
    fn ttl_below_255_is_dropped() {
        let (a, src, dst) = adv();
        let payload = codec::encode(&a, src.into(), dst.into()).unwrap();
        let mut pkt = ipv4_packet(src, dst, &payload).unwrap();
        pkt[8] = 254;
        assert_eq!(
            parse_ipv4(&pkt, true),
            Incoming::Dropped {
                src: Some(src.into()),
                reason: DecodeError::BadTtl
            }
        );
        assert_eq!(
            classify(src.into(), Some(dst.into()), None, false, &payload, true),
            Incoming::Dropped {
                src: Some(src.into()),
                reason: DecodeError::BadTtl
            }
        );
    }

    #[test]
    fn ipv4_needs_ttl_255_in_every_mode() {
        let a = adv().0;
        let (src, peer) = (Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
        let payload = codec::encode(&a, src.into(), peer.into()).unwrap();
        let mut pkt = ipv4_packet(src, peer, &payload).unwrap();
        assert!(matches!(
            parse_ipv4(&pkt, false),
            Incoming::Advert { hops: 255, .. }
        ));
        // A forged peer one or more hops away: unicast, on a unicast instance, still dropped.
        for ttl in [0u8, 1, 64, 128, 254] {
            pkt[8] = ttl;
            for multicast in [false, true] {
                assert!(
                    matches!(
                        parse_ipv4(&pkt, multicast),
                        Incoming::Dropped {
                            reason: DecodeError::BadTtl,
                            ..
                        }
                    ),
                    "ttl {ttl} multicast {multicast}"
                );
            }
        }
        let group = codec::encode(&adv().0, src.into(), codec::MCAST_V4.into()).unwrap();
        let mut mpkt = ipv4_packet(src, codec::MCAST_V4, &group).unwrap();
        mpkt[8] = 64;
        assert!(matches!(
            parse_ipv4(&mpkt, false),
            Incoming::Dropped {
                reason: DecodeError::BadTtl,
                ..
            }
        ));
    }

    #[test]
    fn ipv6_unicast_passes_its_hop_limit_on_multicast_needs_255() {
        let a = adv().0;
        let (s6, p6): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let a6 = Advert {
            addrs: vec!["fd00::100".parse().unwrap()],
            ..a
        };
        // keepalived's IPv6 unicast adverts: default hop limit; the peer's bounds decide later.
        let payload6 = codec::encode(&a6, s6, p6).unwrap();
        assert!(matches!(
            classify(s6, Some(p6), Some(64), false, &payload6, false),
            Incoming::Advert { hops: 64, .. }
        ));
        let g6: IpAddr = codec::MCAST_V6.into();
        let mpayload6 = codec::encode(&a6, s6, g6).unwrap();
        for multicast in [false, true] {
            assert!(matches!(
                classify(s6, Some(g6), Some(64), false, &mpayload6, multicast),
                Incoming::Dropped {
                    reason: DecodeError::BadTtl,
                    ..
                }
            ));
        }
        assert!(matches!(
            classify(s6, Some(g6), Some(255), false, &mpayload6, true),
            Incoming::Advert { hops: 255, .. }
        ));
        // A unicast advert on a multicast instance needs 255 too.
        assert!(matches!(
            classify(s6, Some(p6), Some(64), false, &payload6, true),
            Incoming::Dropped {
                reason: DecodeError::BadTtl,
                ..
            }
        ));
    }

    #[test]
    fn malformed_ipv4_headers_do_not_panic() {
        for len in 0..40 {
            let mut p = vec![0x4fu8; len];
            let _ = parse_ipv4(&p, true);
            if len > 4 {
                p[2] = 0xff;
                let _ = parse_ipv4(&p, true);
            }
        }
    }
}
