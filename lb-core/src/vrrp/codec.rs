//! VRRP advertisement wire format: VRRPv3 (RFC 9568) for IPv4 and IPv6, VRRPv2 (RFC 3768) for
//! IPv4 with no authentication or simple-text authentication.
//!
//! Pure and std-only on purpose: the fuzz target (`fuzz/`) includes this file directly, so it
//! must not refer to the rest of the crate. [`decode`] never panics, whatever the bytes.
//!
//! Wire layout (both versions share the first 8 bytes):
//!
//! ```text
//!  0: version(4) | type(4)      1: VRID      2: priority      3: address count
//!  v2: 4: auth type   5: advert interval (seconds)     6-7: checksum
//!  v3: 4-5: reserved(4) | max advert interval (12 bits, centiseconds)   6-7: checksum
//!  8..: addresses (4 or 16 bytes each), then for v2 only 8 bytes of authentication data
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol number of VRRP.
pub const IPPROTO_VRRP: u8 = 112;
/// IPv4 multicast group of VRRP.
pub const MCAST_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// IPv6 multicast group of VRRP.
pub const MCAST_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x12);
/// Adverts are sent with this TTL / hop limit and anything else is dropped on receipt: it proves
/// the sender is on the link.
pub const VRRP_TTL: u8 = 255;
/// keepalived (and RFC 9568 examples) send with DSCP CS6, "network control".
pub const VRRP_TOS: u8 = 0xc0;

const TYPE_ADVERT: u8 = 1;
const HEADER_LEN: usize = 8;
const AUTH_LEN: usize = 8;
const AUTH_TYPE_NONE: u8 = 0;
const AUTH_TYPE_SIMPLE: u8 = 1;
/// The v3 interval field is 12 bits wide.
pub const MAX_V3_INTERVAL_CS: u16 = 0x0fff;

/// Protocol version of an advert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    V2,
    V3,
}

impl Version {
    pub fn number(self) -> u8 {
        match self {
            Version::V2 => 2,
            Version::V3 => 3,
        }
    }
}

/// VRRPv2 authentication. VRRPv3 has none, so v3 adverts always carry [`Auth::None`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Auth {
    None,
    /// Simple text password: up to 8 bytes, zero padded on the wire.
    Simple([u8; AUTH_LEN]),
}

impl Auth {
    /// A simple-text password from a string, as keepalived does: the first 8 bytes, zero padded.
    /// (keepalived silently truncates longer passwords; config validation refuses them.)
    pub fn simple(pass: &str) -> Auth {
        let mut data = [0u8; AUTH_LEN];
        for (d, s) in data.iter_mut().zip(pass.as_bytes()) {
            *d = *s;
        }
        Auth::Simple(data)
    }
}

/// A decoded (or to-be-encoded) advertisement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advert {
    pub version: Version,
    pub vrid: u8,
    pub priority: u8,
    /// Advertisement interval in centiseconds. For v2 this is the wire's seconds x 100.
    pub interval_cs: u16,
    /// The virtual addresses, all of the packet's family.
    pub addrs: Vec<IpAddr>,
    pub auth: Auth,
}

/// Why a received packet was dropped. One variant per counter; [`DecodeError::reason`] is the
/// counter's label. Some reasons are found by the decoder, others by [`check`] against the local
/// instance or by the socket layer (TTL), but they all live here so drops are counted one way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DecodeError {
    /// Shorter than the header, or than the address count implies.
    Truncated,
    /// Longer than the address count implies.
    LengthMismatch,
    /// Version field is not 2 or 3 (or v2 over IPv6, which RFC 3768 does not define).
    BadVersion,
    /// Type field is not 1 (advertisement).
    BadType,
    BadChecksum,
    /// v2 authentication type other than 0 or 1 (type 2, IP AH, is obsolete).
    BadAuthType,
    /// VRID 0 is reserved.
    BadVrid,
    /// Advert interval of zero.
    BadInterval,
    /// Source and destination addresses of different families.
    BadFamily,
    /// TTL / hop limit is not 255, or (IPv6 unicast) outside the peer's `unicast_peer_ttl`
    /// bounds: the sender is not on our segment.
    BadTtl,
    /// A valid advert of the other VRRP version than the instance's.
    WrongVersion,
    /// Authentication type or password differs from ours (v2).
    WrongAuth,
    /// v2 advert whose interval differs from ours (RFC 3768 requires dropping it).
    WrongInterval,
    /// Another virtual router's advert (not an error; counted so it can be seen).
    OtherVrid,
    /// Multicast advert on a unicast instance, or unicast on a multicast one.
    WrongMode,
    /// Unicast advert from an address outside `unicast_peers` (keepalived's `check_unicast_src`).
    NotAPeer,
    /// Advert with an address count of 0.
    NoAddresses,
    /// Our VRID with another VIP set: a collision, never a vote.
    OtherVips,
}

impl DecodeError {
    /// Every variant, for initialising counters.
    pub const ALL: [DecodeError; 18] = [
        DecodeError::Truncated,
        DecodeError::LengthMismatch,
        DecodeError::BadVersion,
        DecodeError::BadType,
        DecodeError::BadChecksum,
        DecodeError::BadAuthType,
        DecodeError::BadVrid,
        DecodeError::BadInterval,
        DecodeError::BadFamily,
        DecodeError::BadTtl,
        DecodeError::WrongVersion,
        DecodeError::WrongAuth,
        DecodeError::WrongInterval,
        DecodeError::OtherVrid,
        DecodeError::WrongMode,
        DecodeError::NotAPeer,
        DecodeError::NoAddresses,
        DecodeError::OtherVips,
    ];

    /// Stable snake_case name, used as a metric label and in `lbctl vrrp status`.
    pub fn reason(self) -> &'static str {
        match self {
            DecodeError::Truncated => "truncated",
            DecodeError::LengthMismatch => "length_mismatch",
            DecodeError::BadVersion => "bad_version",
            DecodeError::BadType => "bad_type",
            DecodeError::BadChecksum => "bad_checksum",
            DecodeError::BadAuthType => "bad_auth_type",
            DecodeError::BadVrid => "bad_vrid",
            DecodeError::BadInterval => "bad_interval",
            DecodeError::BadFamily => "bad_family",
            DecodeError::BadTtl => "bad_ttl",
            DecodeError::WrongVersion => "wrong_version",
            DecodeError::WrongAuth => "wrong_auth",
            DecodeError::WrongInterval => "wrong_interval",
            DecodeError::OtherVrid => "other_vrid",
            DecodeError::WrongMode => "wrong_mode",
            DecodeError::NotAPeer => "not_a_peer",
            DecodeError::NoAddresses => "no_addresses",
            DecodeError::OtherVips => "other_vips",
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for DecodeError {}

/// Why an advert could not be encoded (a programming or config error, never packet input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// v2 intervals are whole seconds, 1..=255.
    V2Interval,
    /// v3 intervals are 1..=4095 centiseconds.
    V3Interval,
    /// v2 is IPv4 only.
    V2OverIpv6,
    /// Virtual addresses, source and destination must all be one family.
    MixedFamily,
    /// More than 255 addresses.
    TooManyAddrs,
    /// VRRPv3 carries no authentication.
    V3Auth,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EncodeError::V2Interval => "VRRPv2 advert interval must be 1..=255 whole seconds",
            EncodeError::V3Interval => "VRRPv3 advert interval must be 1..=4095 centiseconds",
            EncodeError::V2OverIpv6 => "VRRPv2 is IPv4 only",
            EncodeError::MixedFamily => "addresses of mixed families",
            EncodeError::TooManyAddrs => "more than 255 virtual addresses",
            EncodeError::V3Auth => "VRRPv3 has no authentication",
        })
    }
}

impl std::error::Error for EncodeError {}

/// Decode the VRRP payload of an IP packet (the bytes after the IP header) that went from `src`
/// to `dst`; the addresses are needed for the v3 pseudo-header checksum.
pub fn decode(bytes: &[u8], src: IpAddr, dst: IpAddr) -> Result<Advert, DecodeError> {
    let v6 = match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => false,
        (IpAddr::V6(_), IpAddr::V6(_)) => true,
        _ => return Err(DecodeError::BadFamily),
    };
    let header: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(DecodeError::Truncated)?;
    let version = match header[0] >> 4 {
        2 if !v6 => Version::V2,
        3 => Version::V3,
        _ => return Err(DecodeError::BadVersion),
    };
    if header[0] & 0x0f != TYPE_ADVERT {
        return Err(DecodeError::BadType);
    }
    let count = usize::from(header[3]);
    let addr_len = if v6 { 16 } else { 4 };
    let trailer = if version == Version::V2 { AUTH_LEN } else { 0 };
    let expected = HEADER_LEN + count * addr_len + trailer;
    if bytes.len() < expected {
        return Err(DecodeError::Truncated);
    }
    if bytes.len() > expected {
        return Err(DecodeError::LengthMismatch);
    }
    let sum = match version {
        Version::V2 => checksum(&[bytes]),
        Version::V3 => checksum(&[&pseudo_header(src, dst, bytes.len()), bytes]),
    };
    if sum != 0 {
        return Err(DecodeError::BadChecksum);
    }
    let vrid = header[1];
    if vrid == 0 {
        return Err(DecodeError::BadVrid);
    }
    let (interval_cs, auth) = match version {
        Version::V2 => {
            let auth_data: [u8; AUTH_LEN] = bytes[expected - AUTH_LEN..]
                .try_into()
                .map_err(|_| DecodeError::Truncated)?;
            let auth = match header[4] {
                AUTH_TYPE_NONE => Auth::None,
                AUTH_TYPE_SIMPLE => Auth::Simple(auth_data),
                _ => return Err(DecodeError::BadAuthType),
            };
            (u16::from(header[5]) * 100, auth)
        }
        Version::V3 => (
            u16::from_be_bytes([header[4], header[5]]) & MAX_V3_INTERVAL_CS,
            Auth::None,
        ),
    };
    if interval_cs == 0 {
        return Err(DecodeError::BadInterval);
    }
    let addrs = bytes[HEADER_LEN..HEADER_LEN + count * addr_len]
        .chunks_exact(addr_len)
        .map(|c| match <[u8; 16]>::try_from(c) {
            Ok(b16) => IpAddr::V6(Ipv6Addr::from(b16)),
            Err(_) => {
                let mut b4 = [0u8; 4];
                b4.copy_from_slice(&c[..4]);
                IpAddr::V4(Ipv4Addr::from(b4))
            }
        })
        .collect();
    Ok(Advert {
        version,
        vrid,
        priority: header[2],
        interval_cs,
        addrs,
        auth,
    })
}

/// What the local instance expects of adverts on its link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    pub version: Version,
    pub vrid: u8,
    /// Our own interval (v2 adverts must match it).
    pub interval_cs: u16,
    pub auth: Auth,
}

/// Check a decoded advert against the local instance (RFC 3768 section 7.1, RFC 9568 section
/// 7.1). Differences in the address list are not checked here: they are a collision to report,
/// not a reason to drop (see the shell's `vrrp::collision`).
pub fn check(advert: &Advert, expect: &Expect) -> Result<(), DecodeError> {
    if advert.vrid != expect.vrid {
        return Err(DecodeError::OtherVrid);
    }
    if advert.version != expect.version {
        return Err(DecodeError::WrongVersion);
    }
    if advert.version == Version::V2 {
        if advert.auth != expect.auth {
            return Err(DecodeError::WrongAuth);
        }
        if advert.interval_cs != expect.interval_cs {
            return Err(DecodeError::WrongInterval);
        }
    }
    Ok(())
}

/// Encode `advert` as the VRRP payload of a packet from `src` to `dst`.
pub fn encode(advert: &Advert, src: IpAddr, dst: IpAddr) -> Result<Vec<u8>, EncodeError> {
    let v6 = src.is_ipv6();
    if dst.is_ipv6() != v6 || advert.addrs.iter().any(|a| a.is_ipv6() != v6) {
        return Err(EncodeError::MixedFamily);
    }
    let count = u8::try_from(advert.addrs.len()).map_err(|_| EncodeError::TooManyAddrs)?;
    let mut out = Vec::with_capacity(HEADER_LEN + advert.addrs.len() * 16 + AUTH_LEN);
    out.push((advert.version.number() << 4) | TYPE_ADVERT);
    out.push(advert.vrid);
    out.push(advert.priority);
    out.push(count);
    match advert.version {
        Version::V2 => {
            if v6 {
                return Err(EncodeError::V2OverIpv6);
            }
            let secs = advert.interval_cs / 100;
            if !advert.interval_cs.is_multiple_of(100) || !(1..=255).contains(&secs) {
                return Err(EncodeError::V2Interval);
            }
            out.push(match advert.auth {
                Auth::None => AUTH_TYPE_NONE,
                Auth::Simple(_) => AUTH_TYPE_SIMPLE,
            });
            out.push(secs as u8);
        }
        Version::V3 => {
            if advert.auth != Auth::None {
                return Err(EncodeError::V3Auth);
            }
            if !(1..=MAX_V3_INTERVAL_CS).contains(&advert.interval_cs) {
                return Err(EncodeError::V3Interval);
            }
            out.extend_from_slice(&advert.interval_cs.to_be_bytes());
        }
    }
    out.extend_from_slice(&[0, 0]); // checksum, filled in below
    for addr in &advert.addrs {
        match addr {
            IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
        }
    }
    if advert.version == Version::V2 {
        match advert.auth {
            Auth::None => out.extend_from_slice(&[0; AUTH_LEN]),
            Auth::Simple(data) => out.extend_from_slice(&data),
        }
    }
    let sum = match advert.version {
        Version::V2 => checksum(&[&out]),
        Version::V3 => checksum(&[&pseudo_header(src, dst, out.len()), &out]),
    };
    out[6..8].copy_from_slice(&sum.to_be_bytes());
    Ok(out)
}

/// The IPv4 or IPv6 pseudo-header that VRRPv3's checksum covers (RFC 9568 section 5.2.8).
fn pseudo_header(src: IpAddr, dst: IpAddr, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(40);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&[0, IPPROTO_VRRP]);
            // Callers bound len by the packet they hold; an oversized value only fails the check.
            p.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (s, d) => {
            p.extend_from_slice(&v6_octets(s));
            p.extend_from_slice(&v6_octets(d));
            p.extend_from_slice(&(len as u32).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, IPPROTO_VRRP]);
        }
    }
    p
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The Internet checksum (RFC 1071) over the concatenation of `parts`. Over data that includes
/// a correct checksum it yields 0. Odd-length parts are padded as if concatenated.
pub fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &b in *part {
            match odd.take() {
                Some(hi) => sum += u64::from(u16::from_be_bytes([hi, b])),
                None => odd = Some(b),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Split a captured IPv4/IPv6 packet into (src, dst, ttl, VRRP payload).
    fn split_ip(pkt: &[u8]) -> (IpAddr, IpAddr, u8, &[u8]) {
        match pkt[0] >> 4 {
            4 => {
                let ihl = usize::from(pkt[0] & 0x0f) * 4;
                assert_eq!(pkt[9], IPPROTO_VRRP);
                let src = Ipv4Addr::from(<[u8; 4]>::try_from(&pkt[12..16]).unwrap());
                let dst = Ipv4Addr::from(<[u8; 4]>::try_from(&pkt[16..20]).unwrap());
                (src.into(), dst.into(), pkt[8], &pkt[ihl..])
            }
            6 => {
                assert_eq!(pkt[6], IPPROTO_VRRP);
                let src = Ipv6Addr::from(<[u8; 16]>::try_from(&pkt[8..24]).unwrap());
                let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&pkt[24..40]).unwrap());
                (src.into(), dst.into(), pkt[7], &pkt[40..])
            }
            v => panic!("not IP: version {v}"),
        }
    }

    // Golden vectors: whole IP packets sent by keepalived v2.2.7 (Debian package) inside a
    // throwaway network namespace pair, captured with tcpdump on the peer side. The configs are
    // in the comments; "prio 0" packets were sent when keepalived was stopped with SIGTERM.

    /// `version 2`, vrid 51, priority 150, advert_int 1, auth_type PASS, auth_pass lbtest,
    /// VIPs 192.0.2.100 and .101, multicast, from 192.0.2.1.
    const KA_V2_PASS: &str =
        "45c0002c00010000ff70188dc0000201e00000122133960201016ec2c0000264c00002656c62746573740000";
    const KA_V2_PASS_PRIO0: &str =
        "45c0002c00030000ff70188bc0000201e000001221330002010104c3c0000264c00002656c62746573740000";
    /// OpenShift style: vrid 55, priority 40, PASS `ocp_api_vip` (keepalived truncates it to 8
    /// bytes), VIP 192.0.2.130, unicast 192.0.2.1 -> 192.0.2.2.
    const KA_V2_UNICAST: &str =
        "45c0002800010000ff7036a1c0000201c000020221372801010148b1c00002826f63705f6170695f";
    /// `version 3`, vrid 52, priority 200, advert_int 0.5, VIP 192.0.2.110, multicast.
    const KA_V3: &str = "45c0002000010000ff701899c0000201e00000123134c8010032a198c000026e";
    const KA_V3_PRIO0: &str = "45c0002000080000ff701892c0000201e00000123134000100326999c000026e";
    /// `version 3`, vrid 53, priority 100, advert_int 1, VIPs 192.0.2.120 and .121, unicast
    /// 192.0.2.1 -> 192.0.2.2: the pseudo-header uses the unicast destination.
    const KA_V3_UNICAST: &str =
        "45c0002400010000ff7036a5c0000201c000020231356402006460edc0000278c0000279";
    /// `version 3`, `native_ipv6`, vrid 54, priority 254, advert_int 1, VIP 2001:db8::100,
    /// from fe80::ff:fe00:1 to ff02::12.
    const KA_V3_V6: &str = "6c0bbee9001870fffe80000000000000000000fffe000001ff0200000000000000000000000000123136fe010064a48b20010db8000000000000000000000100";
    const KA_V3_V6_PRIO0: &str = "6c0bbee9001870fffe80000000000000000000fffe000001ff020000000000000000000000000012313600010064a28c20010db8000000000000000000000100";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Decode a golden packet, compare with `want`, and re-encode byte for byte.
    fn golden(pkt_hex: &str, want: Advert) {
        let pkt = hex(pkt_hex);
        let (src, dst, ttl, payload) = split_ip(&pkt);
        assert_eq!(ttl, VRRP_TTL);
        let got = decode(payload, src, dst).unwrap();
        assert_eq!(got, want);
        assert_eq!(encode(&want, src, dst).unwrap(), payload);
    }

    #[test]
    fn keepalived_v2_pass() {
        let mut want = Advert {
            version: Version::V2,
            vrid: 51,
            priority: 150,
            interval_cs: 100,
            addrs: vec![ip("192.0.2.100"), ip("192.0.2.101")],
            auth: Auth::simple("lbtest"),
        };
        golden(KA_V2_PASS, want.clone());
        want.priority = 0;
        golden(KA_V2_PASS_PRIO0, want);
    }

    #[test]
    fn keepalived_v2_unicast_truncated_pass() {
        golden(
            KA_V2_UNICAST,
            Advert {
                version: Version::V2,
                vrid: 55,
                priority: 40,
                interval_cs: 100,
                addrs: vec![ip("192.0.2.130")],
                auth: Auth::simple("ocp_api_"),
            },
        );
        assert_eq!(Auth::simple("ocp_api_vip"), Auth::simple("ocp_api_"));
    }

    #[test]
    fn keepalived_v3_v4() {
        let mut want = Advert {
            version: Version::V3,
            vrid: 52,
            priority: 200,
            interval_cs: 50,
            addrs: vec![ip("192.0.2.110")],
            auth: Auth::None,
        };
        golden(KA_V3, want.clone());
        want.priority = 0;
        golden(KA_V3_PRIO0, want);
        golden(
            KA_V3_UNICAST,
            Advert {
                version: Version::V3,
                vrid: 53,
                priority: 100,
                interval_cs: 100,
                addrs: vec![ip("192.0.2.120"), ip("192.0.2.121")],
                auth: Auth::None,
            },
        );
    }

    #[test]
    fn keepalived_v3_v6() {
        let mut want = Advert {
            version: Version::V3,
            vrid: 54,
            priority: 254,
            interval_cs: 100,
            addrs: vec![ip("2001:db8::100")],
            auth: Auth::None,
        };
        golden(KA_V3_V6, want.clone());
        want.priority = 0;
        golden(KA_V3_V6_PRIO0, want);
    }

    #[test]
    fn v3_checksum_depends_on_pseudo_header() {
        let pkt = hex(KA_V3_UNICAST);
        let (src, _, _, payload) = split_ip(&pkt);
        // Same bytes, but as if sent to the multicast group: the checksum no longer matches.
        assert_eq!(
            decode(payload, src, MCAST_V4.into()),
            Err(DecodeError::BadChecksum)
        );
    }

    #[test]
    fn drop_reasons() {
        let pkt = hex(KA_V2_PASS);
        let (src, dst, _, good) = split_ip(&pkt);
        let dec = |b: &[u8]| decode(b, src, dst);
        assert_eq!(dec(&good[..7]), Err(DecodeError::Truncated));
        assert_eq!(dec(&good[..good.len() - 1]), Err(DecodeError::Truncated));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(dec(&long), Err(DecodeError::LengthMismatch));
        let mut b = good.to_vec();
        b[0] = 0x41;
        assert_eq!(dec(&b), Err(DecodeError::BadVersion));
        b[0] = 0x22;
        assert_eq!(dec(&b), Err(DecodeError::BadType));
        let mut b = good.to_vec();
        b[2] ^= 1;
        assert_eq!(dec(&b), Err(DecodeError::BadChecksum));
        let mut b = good.to_vec();
        b[3] = 3; // one more address than present
        assert_eq!(dec(&b), Err(DecodeError::Truncated));
        assert_eq!(decode(good, src, ip("::1")), Err(DecodeError::BadFamily));
    }

    /// Rebuild a packet with a bad field but a correct checksum, so the later checks are reached.
    fn with_fixed_sum(mut b: Vec<u8>, src: IpAddr, dst: IpAddr) -> Vec<u8> {
        b[6] = 0;
        b[7] = 0;
        let sum = if b[0] >> 4 == 2 {
            checksum(&[&b])
        } else {
            checksum(&[&pseudo_header(src, dst, b.len()), &b])
        };
        b[6..8].copy_from_slice(&sum.to_be_bytes());
        b
    }

    #[test]
    fn semantic_drop_reasons() {
        let pkt = hex(KA_V2_PASS);
        let (src, dst, _, good) = split_ip(&pkt);
        let mut b = good.to_vec();
        b[4] = 2; // IP AH auth
        assert_eq!(
            decode(&with_fixed_sum(b, src, dst), src, dst),
            Err(DecodeError::BadAuthType)
        );
        let mut b = good.to_vec();
        b[1] = 0;
        assert_eq!(
            decode(&with_fixed_sum(b, src, dst), src, dst),
            Err(DecodeError::BadVrid)
        );
        let mut b = good.to_vec();
        b[5] = 0;
        assert_eq!(
            decode(&with_fixed_sum(b, src, dst), src, dst),
            Err(DecodeError::BadInterval)
        );
        // A v2 packet over IPv6 does not exist.
        let (s6, d6) = (ip("fe80::1"), ip("ff02::12"));
        assert_eq!(decode(good, s6, d6), Err(DecodeError::BadVersion));
    }

    #[test]
    fn check_against_instance() {
        let pkt = hex(KA_V2_PASS);
        let (src, dst, _, payload) = split_ip(&pkt);
        let advert = decode(payload, src, dst).unwrap();
        let ours = Expect {
            version: Version::V2,
            vrid: 51,
            interval_cs: 100,
            auth: Auth::simple("lbtest"),
        };
        assert_eq!(check(&advert, &ours), Ok(()));
        let e = |f: fn(&mut Expect)| {
            let mut x = ours.clone();
            f(&mut x);
            check(&advert, &x)
        };
        assert_eq!(e(|x| x.vrid = 52), Err(DecodeError::OtherVrid));
        assert_eq!(
            e(|x| x.version = Version::V3),
            Err(DecodeError::WrongVersion)
        );
        assert_eq!(
            e(|x| x.auth = Auth::simple("other")),
            Err(DecodeError::WrongAuth)
        );
        assert_eq!(e(|x| x.auth = Auth::None), Err(DecodeError::WrongAuth));
        assert_eq!(e(|x| x.interval_cs = 200), Err(DecodeError::WrongInterval));
    }

    #[test]
    fn round_trip_and_encode_errors() {
        let (s, d) = (ip("fe80::1"), IpAddr::V6(MCAST_V6));
        let a = Advert {
            version: Version::V3,
            vrid: 255,
            priority: 1,
            interval_cs: MAX_V3_INTERVAL_CS,
            addrs: vec![ip("2001:db8::1"), ip("2001:db8::2"), ip("fd00::3")],
            auth: Auth::None,
        };
        let bytes = encode(&a, s, d).unwrap();
        assert_eq!(bytes.len(), 8 + 3 * 16);
        assert_eq!(decode(&bytes, s, d).unwrap(), a);

        let mut bad = a.clone();
        bad.interval_cs = 0x1000;
        assert_eq!(encode(&bad, s, d), Err(EncodeError::V3Interval));
        bad.interval_cs = 0;
        assert_eq!(encode(&bad, s, d), Err(EncodeError::V3Interval));
        let mut bad = a.clone();
        bad.version = Version::V2;
        bad.interval_cs = 100;
        assert_eq!(encode(&bad, s, d), Err(EncodeError::V2OverIpv6));
        let mut bad = a.clone();
        bad.addrs.push(ip("192.0.2.1"));
        assert_eq!(encode(&bad, s, d), Err(EncodeError::MixedFamily));

        let (s4, d4) = (ip("192.0.2.1"), IpAddr::V4(MCAST_V4));
        let v2 = Advert {
            version: Version::V2,
            vrid: 1,
            priority: 100,
            interval_cs: 150,
            addrs: vec![ip("192.0.2.9")],
            auth: Auth::None,
        };
        assert_eq!(encode(&v2, s4, d4), Err(EncodeError::V2Interval));
        let v2 = Advert {
            interval_cs: 25500,
            ..v2
        };
        let bytes = encode(&v2, s4, d4).unwrap();
        assert_eq!(&bytes[bytes.len() - 8..], &[0; 8]);
        assert_eq!(decode(&bytes, s4, d4).unwrap(), v2);
    }

    #[test]
    fn never_panics_on_short_or_odd_input() {
        let (s4, d4) = (ip("192.0.2.1"), ip("224.0.0.18"));
        let (s6, d6) = (ip("fe80::1"), ip("ff02::12"));
        // Every length up to a bit past the largest header, with every first-byte value that
        // selects a version and type, and a large address count.
        for len in 0..64 {
            for first in [0x21u8, 0x31, 0x00, 0xff] {
                let mut b = vec![0xffu8; len];
                if let Some(x) = b.first_mut() {
                    *x = first;
                }
                let _ = decode(&b, s4, d4);
                let _ = decode(&b, s6, d6);
            }
        }
        // An address count of 255 with a short body.
        let _ = decode(&[0x31, 1, 1, 255, 0, 100, 0, 0], s6, d6);
    }

    #[test]
    fn reasons_are_unique() {
        let mut names: Vec<_> = DecodeError::ALL.iter().map(|e| e.reason()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), DecodeError::ALL.len());
    }
}
