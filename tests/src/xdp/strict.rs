//! A strict reading of a frame, written from the forwarding rule (docs/architecture.md) and the
//! RFCs, not from the XDP parser: the oracle of the randomized property test (`xdp_fuzz`).
//!
//! It answers one question: is this frame a packet the load balancer may forward, and for which
//! service? Everything it does not accept is "not a service packet".

use std::net::IpAddr;

/// A VIP service as the oracle knows it.
#[derive(Clone, Debug)]
pub struct Service {
    pub addr: IpAddr,
    /// 0 = every port.
    pub port: u16,
    pub proto: u8,
    pub owned: bool,
    /// MACs of the backends in the set (may keep flows).
    pub in_set: Vec<[u8; 6]>,
    /// Whether any backend is in the table (new flows have somewhere to go).
    pub has_table: bool,
}

/// What the oracle says about a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// A well-formed, unfragmented TCP/UDP packet (or an ICMP too-big quoting one) of the
    /// service at this index, from a MAC that is not another lbd node's.
    Service(usize),
    /// Anything else, with why.
    Not(&'static str),
}

const TCP: u8 = 6;
const UDP: u8 = 17;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The transport ports of a TCP or UDP header that must lie entirely inside `l4` (the
/// datagram's payload by its own length fields).
fn ports(proto: u8, l4: &[u8]) -> Result<(u16, u16), &'static str> {
    match proto {
        TCP => {
            if l4.len() < 20 {
                return Err("TCP header beyond the IP length");
            }
            let data_offset = (l4[12] >> 4) as usize;
            if data_offset < 5 {
                return Err("TCP data offset below 5");
            }
            if data_offset * 4 > l4.len() {
                return Err("TCP options beyond the IP length");
            }
        }
        UDP => {
            if l4.len() < 8 {
                return Err("UDP header beyond the IP length");
            }
            let len = be16(l4, 4).unwrap_or(0) as usize;
            if len < 8 || len > l4.len() {
                return Err("UDP length impossible");
            }
        }
        _ => return Err("not TCP or UDP"),
    }
    Ok((be16(l4, 0).unwrap_or(0), be16(l4, 2).unwrap_or(0)))
}

/// A flow as the client sent it.
struct Flow {
    dst: IpAddr,
    dport: u16,
    proto: u8,
}

/// IPv4 datagram -> (src, dst, proto, payload by total length); fragments are refused.
fn ipv4(d: &[u8]) -> Result<(IpAddr, IpAddr, u8, &[u8]), &'static str> {
    if d.len() < 20 {
        return Err("short IPv4 header");
    }
    if d[0] >> 4 != 4 {
        return Err("IPv4 version");
    }
    let ihl = (d[0] & 0xf) as usize * 4;
    if ihl < 20 || ihl > d.len() {
        return Err("IPv4 IHL");
    }
    let total = be16(d, 2).unwrap_or(0) as usize;
    if total < ihl || total > d.len() {
        return Err("IPv4 total length");
    }
    let frag = be16(d, 6).unwrap_or(0);
    if frag & 0x2000 != 0 || frag & 0x1fff != 0 {
        return Err("IPv4 fragment");
    }
    let src = IpAddr::from([d[12], d[13], d[14], d[15]]);
    let dst = IpAddr::from([d[16], d[17], d[18], d[19]]);
    Ok((src, dst, d[9], &d[ihl..total]))
}

/// IPv6 datagram -> (src, dst, upper protocol, its payload); extension headers are walked up to
/// four (hop-by-hop, routing, destination options, AH), fragments are refused.
fn ipv6(d: &[u8]) -> Result<(IpAddr, IpAddr, u8, &[u8]), &'static str> {
    if d.len() < 40 {
        return Err("short IPv6 header");
    }
    if d[0] >> 4 != 6 {
        return Err("IPv6 version");
    }
    let plen = be16(d, 4).unwrap_or(0) as usize;
    if plen == 0 || 40 + plen > d.len() {
        return Err("IPv6 payload length");
    }
    let src: [u8; 16] = d[8..24].try_into().unwrap();
    let dst: [u8; 16] = d[24..40].try_into().unwrap();
    let payload = &d[40..40 + plen];
    let mut next = d[6];
    let mut at = 0usize;
    let mut walked = 0;
    loop {
        let len = match next {
            0 | 43 | 60 => {
                (*payload
                    .get(at + 1)
                    .ok_or("extension header beyond payload")? as usize
                    + 1)
                    * 8
            }
            51 => {
                (*payload
                    .get(at + 1)
                    .ok_or("extension header beyond payload")? as usize
                    + 2)
                    * 4
            }
            44 => return Err("IPv6 fragment"),
            _ => break,
        };
        if walked == 4 {
            return Err("more than four extension headers");
        }
        if at + len > payload.len() {
            return Err("extension header beyond payload");
        }
        next = payload[at];
        at += len;
        walked += 1;
    }
    Ok((IpAddr::from(src), IpAddr::from(dst), next, &payload[at..]))
}

/// The flow an ICMP "fragmentation needed" / "packet too big" quotes, swapped back into the
/// client's direction. `outer_dst` must be the quoted packet's source (the VIP answered).
fn quoted(v6: bool, icmp: &[u8], outer_dst: IpAddr) -> Result<Flow, &'static str> {
    if icmp.len() < 8 {
        return Err("short ICMP header");
    }
    let (ty, code) = (icmp[0], icmp[1]);
    let q = &icmp[8..];
    let (src, dst, proto, ihl) = if v6 {
        if (ty, code) != (2, 0) {
            return Err("ICMPv6 other than packet too big");
        }
        if q.len() < 40 {
            return Err("quoted IPv6 header beyond the IP length");
        }
        if q[0] >> 4 != 6 {
            return Err("quoted IPv6 version");
        }
        let s: [u8; 16] = q[8..24].try_into().unwrap();
        let d: [u8; 16] = q[24..40].try_into().unwrap();
        (IpAddr::from(s), IpAddr::from(d), q[6], 40)
    } else {
        if (ty, code) != (3, 4) {
            return Err("ICMP other than fragmentation needed");
        }
        if q.len() < 20 {
            return Err("quoted IPv4 header beyond the IP length");
        }
        let ihl = (q[0] & 0xf) as usize * 4;
        if q[0] >> 4 != 4 || ihl < 20 {
            return Err("quoted IPv4 header");
        }
        if be16(q, 6).unwrap_or(0) & 0x1fff != 0 {
            return Err("quoted later fragment");
        }
        (
            IpAddr::from([q[12], q[13], q[14], q[15]]),
            IpAddr::from([q[16], q[17], q[18], q[19]]),
            q[9],
            ihl,
        )
    };
    if proto != TCP && proto != UDP {
        return Err("quoted protocol");
    }
    // RFC 792 / 4443: the quote holds at least the first 8 bytes of the transport header.
    if q.len() < ihl + 8 {
        return Err("quoted transport header beyond the IP length");
    }
    if src != outer_dst {
        return Err("quoted source is not the VIP");
    }
    let _ = dst;
    Ok(Flow {
        dst: src,
        dport: be16(q, ihl).unwrap_or(0),
        proto,
    })
}

/// Read `frame`; `peers` are the source MACs of other lbd nodes (never forwarded again).
pub fn read(frame: &[u8], services: &[Service], peers: &[[u8; 6]]) -> Reading {
    match flow(frame) {
        Err(why) => Reading::Not(why),
        Ok(f) => {
            let src_mac: [u8; 6] = frame[6..12].try_into().unwrap();
            let exact = services
                .iter()
                .position(|s| s.addr == f.dst && s.proto == f.proto && s.port == f.dport);
            let any = services
                .iter()
                .position(|s| s.addr == f.dst && s.proto == f.proto && s.port == 0);
            match exact.or(any) {
                None => Reading::Not("no service"),
                Some(_) if peers.contains(&src_mac) => Reading::Not("from another lbd node"),
                Some(i) => Reading::Service(i),
            }
        }
    }
}

fn flow(frame: &[u8]) -> Result<Flow, &'static str> {
    if frame.len() < 14 {
        return Err("short Ethernet header");
    }
    let ethertype = be16(frame, 12).unwrap_or(0);
    let l3 = &frame[14..];
    let (v6, (_, dst, proto, payload)) = match ethertype {
        0x0800 => (false, ipv4(l3)?),
        0x86dd => (true, ipv6(l3)?),
        _ => return Err("not untagged IPv4/IPv6"),
    };
    match (v6, proto) {
        (false, 1) | (true, 58) => quoted(v6, payload, dst),
        _ => {
            let (_, dport) = ports(proto, payload)?;
            Ok(Flow { dst, dport, proto })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::*;

    fn svc() -> Vec<Service> {
        vec![Service {
            addr: IpAddr::from([10, 0, 0, 100]),
            port: 80,
            proto: TCP,
            owned: true,
            in_set: vec![],
            has_table: true,
        }]
    }

    #[test]
    fn reads_the_rule() {
        let s = svc();
        let ok = ipv4_frame([10, 0, 0, 1], [10, 0, 0, 100], TCP, &tcp(1000, 80, SYN));
        assert_eq!(read(&ok, &s, &[]), Reading::Service(0));
        let mut padded = ok.clone();
        padded.extend_from_slice(&[0; 20]);
        assert_eq!(
            read(&padded, &s, &[]),
            Reading::Service(0),
            "padding is not payload"
        );
        let mut short_total = ok.clone();
        short_total[16..18].copy_from_slice(&30u16.to_be_bytes());
        assert!(matches!(read(&short_total, &s, &[]), Reading::Not(_)));
        let mut doff = ok.clone();
        doff[14 + 20 + 12] = 4 << 4;
        assert_eq!(
            read(&doff, &s, &[]),
            Reading::Not("TCP data offset below 5")
        );
        assert!(matches!(read(&ok, &s, &[CLIENT_MAC]), Reading::Not(_)));
    }
}
