//! Hand-built Ethernet frames for BPF_PROG_TEST_RUN tests and benchmarks.

use std::net::IpAddr;

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

fn csum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += w as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn eth(ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&LB_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A TCP header (SYN unless `flags` says otherwise) without options.
pub fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&1u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t
}

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

pub fn udp(sport: u16, dport: u16, payload_len: usize) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload_len];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    u
}

/// IPv4 header with `options` (a multiple of 4 bytes) and a correct checksum.
pub fn ipv4_header(
    src: [u8; 4],
    dst: [u8; 4],
    proto: u8,
    options: &[u8],
    payload_len: usize,
    frag: u16,
) -> Vec<u8> {
    let ihl = 20 + options.len();
    let mut h = vec![0u8; 20];
    h[0] = 0x40 | (ihl / 4) as u8;
    h[2..4].copy_from_slice(&((ihl + payload_len) as u16).to_be_bytes());
    h[6..8].copy_from_slice(&frag.to_be_bytes());
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    h.extend_from_slice(options);
    let c = csum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

pub fn ipv4_frame(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv4_frame_opts(src, dst, proto, &[], l4, 0x4000)
}

pub fn ipv4_frame_opts(
    src: [u8; 4],
    dst: [u8; 4],
    proto: u8,
    options: &[u8],
    l4: &[u8],
    frag: u16,
) -> Vec<u8> {
    let mut f = eth(0x0800);
    f.extend(ipv4_header(src, dst, proto, options, l4.len(), frag));
    f.extend_from_slice(l4);
    f
}

/// IPv6 with a chain of extension headers: each `(type, body_len_in_8_octets_minus_1)`.
pub fn ipv6_frame_ext(
    src: [u8; 16],
    dst: [u8; 16],
    proto: u8,
    ext: &[(u8, u8)],
    l4: &[u8],
) -> Vec<u8> {
    let mut exts = Vec::new();
    for (i, (_, len)) in ext.iter().enumerate() {
        let next = ext.get(i + 1).map(|e| e.0).unwrap_or(proto);
        let mut h = vec![0u8; (*len as usize + 1) * 8];
        h[0] = next;
        h[1] = *len;
        exts.extend(h);
    }
    let first = ext.first().map(|e| e.0).unwrap_or(proto);
    let mut f = eth(0x86DD);
    let mut h = vec![0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&((exts.len() + l4.len()) as u16).to_be_bytes());
    h[6] = first;
    h[7] = 64;
    h[8..24].copy_from_slice(&src);
    h[24..40].copy_from_slice(&dst);
    f.extend(h);
    f.extend(exts);
    f.extend_from_slice(l4);
    f
}

pub fn ipv6_frame(src: [u8; 16], dst: [u8; 16], proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv6_frame_ext(src, dst, proto, &[], l4)
}

/// IPv6 fragment header frame (first fragment, more to come).
pub fn ipv6_fragment(src: [u8; 16], dst: [u8; 16], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = ipv6_frame_ext(src, dst, proto, &[(44, 0)], l4);
    // fragment header: offset 0, M flag set
    f[14 + 40 + 3] = 1;
    f
}

/// ICMPv4 "fragmentation needed" quoting a packet the VIP sent to the client.
pub fn icmp4_frag_needed(
    router: [u8; 4],
    vip: [u8; 4],
    client: [u8; 4],
    vport: u16,
    cport: u16,
) -> Vec<u8> {
    icmp4_frag_needed_proto(router, vip, client, vport, cport, 6)
}

/// The same, quoting a TCP (6) or UDP (17) packet.
pub fn icmp4_frag_needed_proto(
    router: [u8; 4],
    vip: [u8; 4],
    client: [u8; 4],
    vport: u16,
    cport: u16,
    proto: u8,
) -> Vec<u8> {
    let quoted_l4 = if proto == 17 {
        udp(vport, cport, 1372)
    } else {
        tcp(vport, cport, ACK)
    };
    let mut quoted = ipv4_header(vip, client, proto, &[], 1400, 0x4000);
    quoted.extend_from_slice(&quoted_l4[..8]);
    let mut icmp = vec![3u8, 4, 0, 0, 0, 0, 0x05, 0x78];
    icmp.extend(quoted);
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4_frame(router, vip, 1, &icmp)
}

/// ICMPv6 "packet too big" quoting a packet the VIP sent to the client.
pub fn icmp6_too_big(
    router: [u8; 16],
    vip: [u8; 16],
    client: [u8; 16],
    vport: u16,
    cport: u16,
) -> Vec<u8> {
    let quoted_l4 = tcp(vport, cport, ACK);
    let mut q = vec![0u8; 40];
    q[0] = 0x60;
    q[4..6].copy_from_slice(&1400u16.to_be_bytes());
    q[6] = 6;
    q[7] = 64;
    q[8..24].copy_from_slice(&vip);
    q[24..40].copy_from_slice(&client);
    q.extend_from_slice(&quoted_l4);
    let mut icmp = vec![2u8, 0, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend(q);
    ipv6_frame(router, vip, 58, &icmp)
}

pub fn v4(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        _ => panic!("not IPv4"),
    }
}

pub fn v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        _ => panic!("not IPv6"),
    }
}
