//! `lbctl explain` (pure parts): the question (`GET /v1/explain`'s query), the frame it becomes,
//! and the answer read back from the XDP program's dry run (`lb_common::explain`).
//!
//! The decision itself is never computed here: the data plane's own program makes it on the
//! synthesized frame (`Dataplane::explain`), so the answer cannot drift from what packets get.

use std::net::IpAddr;

use lb_common::{
    NO_BACKEND, PROTO_TCP, PROTO_UDP,
    explain::{ExplainRecord, META_LEN, NONE16, step},
    stat,
};

/// The query of `GET /v1/explain`: `client`, `client_port`, `vip`, `port`, `protocol`
/// (`tcp` or `udp`), `packet` (`syn`, the first segment of a connection, the default; or `ack`,
/// a segment of a connection already open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExplainQuery {
    pub client: IpAddr,
    pub client_port: u16,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: u8,
    /// TCP only: a SYN (else an ACK).
    pub syn: bool,
}

impl ExplainQuery {
    /// Parse `a=b&c=d`; every field is named in its error.
    pub fn parse(query: &str) -> Result<ExplainQuery, String> {
        let (mut client, mut client_port, mut vip, mut port) = (None, None, None, None);
        let (mut protocol, mut syn) = (PROTO_TCP, true);
        for pair in crate::api::query_pairs(query) {
            let (k, v) = pair?;
            let bad = |what: &str| format!("{k}: {v:?} is not {what}");
            match k {
                "client" => client = Some(v.parse().map_err(|_| bad("an IP address"))?),
                "vip" => vip = Some(v.parse().map_err(|_| bad("an IP address"))?),
                "client_port" => client_port = Some(v.parse().map_err(|_| bad("a port"))?),
                "port" => port = Some(v.parse().map_err(|_| bad("a port"))?),
                "protocol" => {
                    protocol = match v {
                        "tcp" => PROTO_TCP,
                        "udp" => PROTO_UDP,
                        _ => return Err(bad("tcp or udp")),
                    }
                }
                "packet" => {
                    syn = match v {
                        "syn" => true,
                        "ack" => false,
                        _ => return Err(bad("syn or ack")),
                    }
                }
                _ => {
                    return Err(format!(
                        "{k}: unknown (want client, client_port, vip, port, protocol, packet)"
                    ));
                }
            }
        }
        let need = |name: &str| format!("{name}: missing");
        let q = ExplainQuery {
            client: client.ok_or_else(|| need("client"))?,
            client_port: client_port.ok_or_else(|| need("client_port"))?,
            vip: vip.ok_or_else(|| need("vip"))?,
            port: port.ok_or_else(|| need("port"))?,
            protocol,
            syn,
        };
        if q.client.is_ipv4() != q.vip.is_ipv4() {
            return Err("client: not the VIP's address family".into());
        }
        Ok(q)
    }

    /// The query string for [`ExplainQuery::parse`].
    pub fn query(&self) -> String {
        let q = format!(
            "client={}&client_port={}&vip={}&port={}&protocol={}",
            self.client,
            self.client_port,
            self.vip,
            self.port,
            protocol_name(self.protocol),
        );
        // (A UDP datagram has no SYN or ACK.)
        if self.protocol == PROTO_TCP {
            format!("{q}&packet={}", self.packet())
        } else {
            q
        }
    }

    /// `syn`, `ack` or `datagram`.
    pub fn packet(&self) -> &'static str {
        match (self.protocol, self.syn) {
            (PROTO_TCP, true) => "syn",
            (PROTO_TCP, false) => "ack",
            _ => "datagram",
        }
    }
}

fn protocol_name(p: u8) -> &'static str {
    if p == PROTO_UDP { "udp" } else { "tcp" }
}

/// A source MAC no lbd node has (locally administered): the loop guard does not fire.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0x6c, 0x62, 0x65, 0x78, 0x70];

/// The test run's input: `META_LEN` bytes of metadata (the ask, with `token`), then an Ethernet
/// frame to `dst_mac` carrying one packet of the flow (no payload; checksums as a client's).
pub fn frame(q: &ExplainQuery, token: u64, dst_mac: [u8; 6]) -> Vec<u8> {
    let mut f = ExplainRecord {
        token,
        ..Default::default()
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&CLIENT_MAC);
    let l4 = l4_header(q);
    match (q.client, q.vip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let total = (20 + l4.len()) as u16;
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[8] = 64;
            ip[9] = q.protocol;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let sum = !fold(sum16(&ip));
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
            ip[6] = q.protocol;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            f.extend_from_slice(&ip);
        }
        // Refused by `parse`.
        _ => {}
    }
    f.extend_from_slice(&l4);
    f
}

fn l4_header(q: &ExplainQuery) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&q.client_port.to_be_bytes());
    h.extend_from_slice(&q.port.to_be_bytes());
    if q.protocol == PROTO_UDP {
        h.extend_from_slice(&8u16.to_be_bytes());
        h.extend_from_slice(&[0, 0]);
        return h;
    }
    // Sequence and acknowledgement numbers, data offset 5, flags, window.
    h.extend_from_slice(&1u32.to_be_bytes());
    h.extend_from_slice(&(if q.syn { 0u32 } else { 1 }).to_be_bytes());
    h.push(0x50);
    h.push(if q.syn { 0x02 } else { 0x10 });
    h.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
    h
}

fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// What the output frame shows: the destination and source MACs, and the outer destination
/// address when the program wrapped the packet for a routed backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutFrame {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub encap_dst: Option<IpAddr>,
}

/// Read the output frame (after the metadata).
pub fn out_frame(out: &[u8]) -> Option<OutFrame> {
    let f = out.get(META_LEN..)?;
    let mut o = OutFrame {
        dst_mac: f.get(0..6)?.try_into().ok()?,
        src_mac: f.get(6..12)?.try_into().ok()?,
        encap_dst: None,
    };
    let ip = f.get(14..)?;
    let (proto, dst) = match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 if ip.len() >= 20 => (ip[9], IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).ok()?)),
        0x86dd if ip.len() >= 40 => (ip[6], IpAddr::from(<[u8; 16]>::try_from(&ip[24..40]).ok()?)),
        _ => return Some(o),
    };
    // IP-in-IP (4) or IPv6-in-IP (41): the frame was wrapped (a client's packet to a VIP
    // service is TCP or UDP).
    if proto == 4 || proto == 41 {
        o.encap_dst = Some(dst);
    }
    Some(o)
}

/// A `stat` index's name (`None` for "no counter").
pub fn stat_name(i: u16) -> Option<&'static str> {
    if i == NONE16 {
        return None;
    }
    stat::NAMES.get(i as usize).copied()
}

/// An XDP verdict's name.
pub fn verdict_name(v: u32) -> &'static str {
    match v {
        0 => "aborted",
        1 => "drop",
        2 => "pass",
        3 => "tx",
        4 => "redirect",
        _ => "unknown",
    }
}

/// Backend ids the record names, in order: (entry's, slot's, chosen), `None` where the trail
/// has no such step.
pub fn ids(r: &ExplainRecord) -> (Option<u32>, Option<u32>, Option<u32>) {
    let entry = (r.steps & (step::ENTRY_CACHE | step::ENTRY_TABLE) != 0).then_some(r.entry_backend);
    let slot =
        (r.steps & step::MAGLEV != 0 && r.slot_backend != NO_BACKEND).then_some(r.slot_backend);
    let chosen = (r.steps & step::CHOSEN != 0).then_some(r.backend);
    (entry, slot, chosen)
}

/// The query of `GET /v1/trace`: `vip`, `port` (optional filters), `count` (decisions to
/// return, default 20, at most [`MAX_TRACE`]), `wait_ms` (how long to wait for them, default
/// 10000, at most 60000).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceQuery {
    pub vip: Option<IpAddr>,
    pub port: Option<u16>,
    pub count: usize,
    pub wait_ms: u64,
}

/// Most decisions one trace returns.
pub const MAX_TRACE: usize = 10_000;

impl Default for TraceQuery {
    fn default() -> Self {
        TraceQuery {
            vip: None,
            port: None,
            count: 20,
            wait_ms: 10_000,
        }
    }
}

impl TraceQuery {
    pub fn parse(query: &str) -> Result<TraceQuery, String> {
        let mut t = TraceQuery::default();
        for pair in crate::api::query_pairs(query) {
            let (k, v) = pair?;
            let bad = |what: &str| format!("{k}: {v:?} is not {what}");
            match k {
                "vip" => t.vip = Some(v.parse().map_err(|_| bad("an IP address"))?),
                "port" => t.port = Some(v.parse().map_err(|_| bad("a port"))?),
                "count" => {
                    t.count = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_TRACE).contains(n))
                        .ok_or_else(|| bad(&format!("a number from 1 to {MAX_TRACE}")))?
                }
                "wait_ms" => {
                    t.wait_ms = v
                        .parse()
                        .ok()
                        .filter(|n| *n <= 60_000)
                        .ok_or_else(|| bad("a number of ms up to 60000"))?
                }
                _ => return Err(format!("{k}: unknown (want vip, port, count, wait_ms)")),
            }
        }
        Ok(t)
    }

    pub fn query(&self) -> String {
        let mut q = vec![
            format!("count={}", self.count),
            format!("wait_ms={}", self.wait_ms),
        ];
        if let Some(a) = self.vip {
            q.push(format!("vip={a}"));
        }
        if let Some(p) = self.port {
            q.push(format!("port={p}"));
        }
        q.join("&")
    }

    /// The traced flow is one this trace asked for.
    pub fn wants(&self, vip: IpAddr, port: u16) -> bool {
        self.vip.is_none_or(|a| a == vip) && self.port.is_none_or(|p| p == port)
    }
}

/// A flow key's addresses.
pub fn flow_addrs(k: &lb_common::FlowKey) -> (IpAddr, IpAddr) {
    let a = |b: &[u8; 16]| {
        if k.family == lb_common::FAMILY_V4 {
            IpAddr::from([b[0], b[1], b[2], b[3]])
        } else {
            IpAddr::from(*b)
        }
    };
    (a(&k.src), a(&k.dst))
}

/// A traced decision as a row; `addr_of` names backend ids.
pub fn trace_row(
    t: &lb_common::explain::TraceRecord,
    addr_of: impl Fn(u32) -> Option<IpAddr>,
) -> crate::status::TraceRow {
    let r = &t.trail;
    let (client, vip) = flow_addrs(&t.flow);
    let (entry, slot, chosen) = ids(r);
    let has = |bit: u32| r.steps & bit != 0;
    crate::status::TraceRow {
        client,
        client_port: t.flow.sport,
        vip,
        port: t.flow.dport,
        protocol: match t.flow.proto {
            PROTO_TCP => "tcp".into(),
            PROTO_UDP => "udp".into(),
            p => p.to_string(),
        },
        verdict: verdict_name(t.verdict).into(),
        reason: stat_name(r.reason).unwrap_or("none").into(),
        conntrack: stat_name(r.conntrack).map(str::to_owned),
        entry: if has(step::ENTRY_CACHE) {
            Some("cache".into())
        } else if has(step::ENTRY_TABLE) {
            Some("conntrack".into())
        } else {
            None
        },
        entry_used: has(step::ENTRY_USED),
        slot: has(step::MAGLEV).then_some(r.slot),
        skipped: has(step::SKIPPED),
        slot_backend: slot.and_then(&addr_of),
        backend_id: chosen,
        backend: chosen.and_then(&addr_of),
        remembered: has(step::WOULD_REMEMBER),
        flood: has(step::FLOOD),
        entry_backend_id: entry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<ExplainQuery, String> {
        ExplainQuery::parse(s)
    }

    #[test]
    fn queries_name_their_bad_field() {
        let ok = q("client=10.0.0.1&client_port=40000&vip=10.0.0.100&port=6443").unwrap();
        assert_eq!(ok.protocol, PROTO_TCP);
        assert!(ok.syn);
        assert_eq!(q(&ok.query()).unwrap(), ok);
        let udp = q("client=fd00::1&client_port=5&vip=fd00::64&port=53&protocol=udp").unwrap();
        assert_eq!(udp.packet(), "datagram");
        assert_eq!(q(&udp.query()).unwrap(), udp);
        for (bad, field) in [
            ("client=x&client_port=1&vip=10.0.0.1&port=1", "client"),
            (
                "client=10.0.0.1&client_port=70000&vip=10.0.0.1&port=1",
                "client_port",
            ),
            ("client=10.0.0.1&client_port=1&vip=10.0.0.1", "port"),
            (
                "client=10.0.0.1&client_port=1&vip=10.0.0.1&port=1&protocol=sctp",
                "protocol",
            ),
            (
                "client=10.0.0.1&client_port=1&vip=10.0.0.1&port=1&packet=fin",
                "packet",
            ),
            ("client=fd00::1&client_port=1&vip=10.0.0.1&port=1", "client"),
            ("client=10.0.0.1&client_port=1&vip=10.0.0.1&port=1&x=1", "x"),
        ] {
            let e = q(bad).unwrap_err();
            assert!(e.starts_with(field), "{bad}: {e}");
        }
    }

    #[test]
    fn frames_carry_the_ask_and_the_flow() {
        let q4 =
            q("client=10.0.0.1&client_port=40000&vip=10.0.0.100&port=6443&packet=ack").unwrap();
        let f = frame(&q4, 0x1122, [1; 6]);
        assert_eq!(ExplainRecord::from_bytes(&f).unwrap().token, 0x1122);
        let e = &f[META_LEN..];
        assert_eq!(e.len(), 14 + 20 + 20);
        assert_eq!(fold(sum16(&e[14..34])), 0xffff, "IPv4 header checksum");
        assert_eq!(&e[26..30], &[10, 0, 0, 1]);
        assert_eq!(u16::from_be_bytes([e[34], e[35]]), 40000);
        assert_eq!(u16::from_be_bytes([e[36], e[37]]), 6443);
        assert_eq!(e[47], 0x10, "an ACK");
        let q6 = q("client=fd00::1&client_port=5&vip=fd00::64&port=53&protocol=udp").unwrap();
        let f = frame(&q6, 1, [1; 6]);
        assert_eq!(f.len(), META_LEN + 14 + 40 + 8);
        let o = out_frame(&f).unwrap();
        assert_eq!(o.dst_mac, [1; 6]);
        assert_eq!(o.encap_dst, None);
    }

    #[test]
    fn trace_queries_and_rows() {
        let t = TraceQuery::parse("vip=10.0.0.100&count=5").unwrap();
        assert_eq!(TraceQuery::parse(&t.query()).unwrap(), t);
        assert!(t.wants("10.0.0.100".parse().unwrap(), 1));
        assert!(!t.wants("10.0.0.101".parse().unwrap(), 1));
        for (bad, field) in [
            ("count=0", "count"),
            ("count=x", "count"),
            ("wait_ms=70000", "wait_ms"),
            ("vip=x", "vip"),
            ("z=1", "z"),
        ] {
            assert!(
                TraceQuery::parse(bad).unwrap_err().starts_with(field),
                "{bad}"
            );
        }
        let rec = lb_common::explain::TraceRecord {
            trail: ExplainRecord {
                steps: step::FLOW | step::MAGLEV | step::CHOSEN | step::WOULD_REMEMBER,
                reason: stat::FORWARDED as u16,
                conntrack: stat::CONNTRACK_MISS as u16,
                slot: 7,
                slot_backend: 2,
                backend: 2,
                ..Default::default()
            },
            flow: lb_common::FlowKey {
                src: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                dst: [10, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                sport: 40000,
                dport: 6443,
                proto: PROTO_TCP,
                family: lb_common::FAMILY_V4,
                _pad: [0; 2],
            },
            verdict: 3,
            _pad: 0,
        };
        let row = trace_row(&rec, |id| (id == 2).then(|| "10.0.0.21".parse().unwrap()));
        assert_eq!(row.client.to_string(), "10.0.0.1");
        assert_eq!(row.vip.to_string(), "10.0.0.100");
        assert_eq!(
            (row.verdict.as_str(), row.reason.as_str()),
            ("tx", "forwarded")
        );
        assert_eq!(row.backend, Some("10.0.0.21".parse().unwrap()));
        assert_eq!(row.slot, Some(7));
        assert!(row.remembered && !row.skipped && row.entry.is_none());
    }

    #[test]
    fn records_name_their_backends() {
        let r = ExplainRecord {
            steps: step::DRY | step::MAGLEV | step::SKIPPED | step::CHOSEN,
            slot_backend: 3,
            backend: 4,
            ..Default::default()
        };
        assert_eq!(ids(&r), (None, Some(3), Some(4)));
        assert_eq!(stat_name(stat::FORWARDED as u16), Some("forwarded"));
        assert_eq!(stat_name(NONE16), None);
    }
}
