//! `lbctl explain`'s dry run (lb-ebpf `explain.rs`) with the real XDP program through
//! BPF_PROG_TEST_RUN and the real maps:
//! - the dry run's answer is the real packet's (backend, output MACs, skipped slot of a drained
//!   backend, entry found), for IPv4 and IPv6;
//! - it writes nothing the data plane keeps: no connection-table or cache entry, no counter, no
//!   pair traffic, no flood accounting;
//! - a frame whose metadata lacks the token (a forged ask) is an ordinary packet.
//! - with the noted program's slot empty (its tail call fails), an ask writes nothing and a
//!   packet while a trace is attached is forwarded as an ordinary one.
//!
//! Needs root; `cargo xtask test`.

use std::net::IpAddr;

use lb_common::{FlowCacheLine, PROTO_TCP, explain::step};
use lb_tests::{TestDataplane, backend, frames::*};
use lb_userspace::{
    dataplane::{Desired, ServiceSpec, vip_key},
    explain::{ExplainQuery, frame, ids, out_frame},
};

const TX: u32 = 3;
const PORT: u16 = 6443;

fn desired(vip: IpAddr, drained: Option<usize>) -> Desired {
    let backends = (0..3u8)
        .map(|i| {
            let addr = match vip {
                IpAddr::V4(_) => format!("10.69.0.{}", 11 + i),
                IpAddr::V6(_) => format!("fd69::{}", 11 + i),
            };
            let mut b = backend(&addr, 11 + i);
            b.drained = drained == Some(i as usize);
            b
        })
        .collect();
    Desired {
        services: vec![ServiceSpec {
            key: vip_key(vip, PORT, PROTO_TCP),
            owned: true,
            backends,
        }],
        ..Default::default()
    }
}

fn query(client: IpAddr, vip: IpAddr, sport: u16, syn: bool) -> ExplainQuery {
    ExplainQuery {
        client,
        client_port: sport,
        vip,
        port: PORT,
        protocol: PROTO_TCP,
        syn,
    }
}

/// Everything a packet may write, as one comparable snapshot.
type State = (
    Vec<(&'static str, u64)>,
    usize,
    Vec<u64>,
    (u64, u64, u64),
    Vec<FlowCacheLine>,
);

fn state(t: &TestDataplane) -> State {
    let dp = &t.dp;
    let traffic = (0..8)
        .map(|id| {
            let x = dp.backend_traffic(id).unwrap();
            x.packets + x.bytes + x.new_flows
        })
        .collect();
    use aya::maps::{Array, Map, MapData};
    let pin = |name: &str| MapData::from_pin(t.opts.pin_dir().join(name)).unwrap();
    // The raw flood accounting (the rate `flood_status` derives also moves with the clock).
    let f: Array<MapData, lb_common::FloodState> =
        Array::try_from(Map::Array(pin(lb_common::maps::FLOOD))).unwrap();
    let f = f.get(&0, 0).unwrap();
    let flood = (
        f.window_start,
        f.count as u64 | (f.last_count as u64) << 32,
        f.flood_until,
    );
    let cache = {
        let m = pin(lb_common::maps::FLOW_CACHE);
        let a: Array<MapData, FlowCacheLine> = Array::try_from(Map::Array(m)).unwrap();
        // Whole lines: entries, use marks and the last-written way.
        (0..a.len()).map(|i| a.get(&i, 0).unwrap()).collect()
    };
    (
        dp.global_stats().unwrap(),
        dp.conntrack_entries(),
        traffic,
        flood,
        cache,
    )
}

fn real_frame(q: &ExplainQuery, flags: u8) -> Vec<u8> {
    let l4 = tcp(q.client_port, PORT, flags);
    match (q.client, q.vip) {
        (IpAddr::V4(c), IpAddr::V4(v)) => ipv4_frame(c.octets(), v.octets(), PROTO_TCP, &l4),
        (IpAddr::V6(c), IpAddr::V6(v)) => ipv6_frame(c.octets(), v.octets(), PROTO_TCP, &l4),
        _ => unreachable!(),
    }
}

fn dry_run_answers_as_the_real_packet_and_writes_nothing(client: IpAddr, vip: IpAddr) {
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, None)).unwrap();
    let token = t.dp.explain_token().unwrap();
    assert_ne!(token, 0);
    let installed = t.dp.installed(&vip_key(vip, PORT, PROTO_TCP));
    let mac_of = |id: u32| {
        installed
            .iter()
            .find(|b| b.id == id)
            .and_then(|b| b.spec.mac)
            .unwrap()
    };

    let before = state(&t);
    for sport in 20000..20040u16 {
        let q = query(client, vip, sport, true);
        let dry = t.dp.explain(&frame(&q, token, [0xaa; 6])).unwrap();
        let r = dry.record;
        assert_eq!(dry.verdict, TX);
        assert!(r.steps & step::DRY != 0);
        let (entry, slot, chosen) = ids(&r);
        assert_eq!(entry, None);
        assert_eq!(slot, chosen, "nothing drained: the slot's backend");
        assert!(r.steps & step::WOULD_REMEMBER != 0);
        assert_eq!(
            lb_userspace::explain::stat_name(r.reason),
            Some("forwarded")
        );
        assert_eq!(
            lb_userspace::explain::stat_name(r.conntrack),
            Some("conntrack_miss")
        );
        // The output frame: the metadata, then the frame with the backend's MAC.
        let out = out_frame(&dry.out).unwrap();
        assert_eq!(out.dst_mac, mac_of(chosen.unwrap()));
        assert_eq!(state(&t), before, "a dry run wrote to the data plane");
    }

    // The real packets go where the dry runs said; then the entries are found and followed.
    for sport in 20000..20040u16 {
        let q = query(client, vip, sport, true);
        let said = t.dp.explain(&frame(&q, token, [0xaa; 6])).unwrap();
        let (v, out, _) = t.dp.test_run("lb_xdp", &real_frame(&q, SYN), 1).unwrap();
        assert_eq!(v, TX);
        assert_eq!(&out[..6], &out_frame(&said.out).unwrap().dst_mac);
        let est =
            t.dp.explain(&frame(&query(client, vip, sport, false), token, [0xaa; 6]));
        let r = est.unwrap().record;
        assert!(
            r.steps & (step::ENTRY_CACHE | step::ENTRY_TABLE) != 0,
            "{r:?}"
        );
        assert!(r.steps & step::ENTRY_USED != 0, "{r:?}");
        assert_eq!(ids(&r).2, ids(&said.record).2);
        assert_eq!(r.steps & step::WOULD_REMEMBER, 0);
    }
    let after = state(&t);
    assert_eq!(after.1, 40, "the real SYNs wrote their entries");

    // Drain each backend in turn: a SYN whose slot names it skips it, as the real SYN does;
    // an ACK without an entry stays with it.
    for d in 0..3 {
        t.dp.apply(&desired(vip, Some(d))).unwrap();
        let drained_id =
            t.dp.installed(&vip_key(vip, PORT, PROTO_TCP))
                .iter()
                .find(|b| b.spec.drained)
                .unwrap()
                .id;
        let mut seen = 0;
        for sport in 30000..30100u16 {
            let q = query(client, vip, sport, true);
            let r = t.dp.explain(&frame(&q, token, [0xaa; 6])).unwrap().record;
            let (_, slot, chosen) = ids(&r);
            if slot != Some(drained_id) {
                assert_eq!(r.steps & step::SKIPPED, 0);
                continue;
            }
            seen += 1;
            assert!(r.steps & step::SKIPPED != 0, "{r:?}");
            assert_ne!(chosen, Some(drained_id));
            let ack = query(client, vip, sport, false);
            let a = t.dp.explain(&frame(&ack, token, [0xaa; 6])).unwrap().record;
            assert_eq!(ids(&a).2, Some(drained_id), "mid-flow stays: {a:?}");
            assert_eq!(a.steps & step::SKIPPED, 0);
            // The real packet agrees: a SYN on one flow, an ACK (no entry) on the next (the
            // first packet of either writes the flow's entry).
            let (real, want) = if seen % 2 == 1 {
                (real_frame(&q, SYN), chosen.unwrap())
            } else {
                (real_frame(&ack, ACK), drained_id)
            };
            let (_, out, _) = t.dp.test_run("lb_xdp", &real, 1).unwrap();
            assert_eq!(&out[..6], &mac_of(want));
        }
        assert!(seen > 1, "ports hash to backend {d}");
    }
}

#[test]
fn dry_run_answers_as_the_real_packet_and_writes_nothing_v4() {
    dry_run_answers_as_the_real_packet_and_writes_nothing(
        "10.69.1.1".parse().unwrap(),
        "10.69.0.100".parse().unwrap(),
    );
}

#[test]
fn dry_run_answers_as_the_real_packet_and_writes_nothing_v6() {
    dry_run_answers_as_the_real_packet_and_writes_nothing(
        "fd69::1:1".parse().unwrap(),
        "fd69::100".parse().unwrap(),
    );
}

/// Metadata without lbd's token is no ask: the program handles the frame as any packet (it
/// writes its entry and counts), and says nothing in the metadata.
#[test]
fn a_forged_ask_is_an_ordinary_packet() {
    let vip: IpAddr = "10.69.0.100".parse().unwrap();
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, None)).unwrap();
    let token = t.dp.explain_token().unwrap();
    for (i, forged) in [token ^ 1, token ^ (1 << 63), 0, u64::MAX]
        .into_iter()
        .enumerate()
    {
        let before = t.dp.conntrack_entries();
        let q = query("10.69.1.2".parse().unwrap(), vip, 21000 + i as u16, true);
        let e = t.dp.explain(&frame(&q, forged, [0xaa; 6])).err();
        let e = e.expect("refused: not a dry run");
        assert!(format!("{e:#}").contains("dry mode"), "{e:#}");
        assert_eq!(
            t.dp.conntrack_entries(),
            before + 1,
            "treated as a real SYN"
        );
    }
    // The token is the program's alone: another load of the program gets another one.
    let mut other = TestDataplane::new(251);
    assert_ne!(other.dp.explain_token().unwrap(), token);
}

#[test]
fn without_the_noted_program_a_dry_run_writes_nothing_and_a_traced_packet_is_forwarded() {
    // `lb_xdp` reaches dry runs and traced packets by a tail call; if its slot is empty, an ask
    // carrying the token must still write nothing, and a packet while a trace is attached is
    // an ordinary one.
    let vip: IpAddr = "10.69.0.100".parse().unwrap();
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, None)).unwrap();
    let token = t.dp.explain_token().unwrap();
    t.dp.empty_noted_slot().unwrap();
    let before = state(&t);
    let q = query("10.69.1.3".parse().unwrap(), vip, 22000, true);
    let e = t.dp.explain(&frame(&q, token, [0xaa; 6])).err();
    assert!(e.is_some(), "no dry run without the noted program");
    assert_eq!(state(&t), before, "the ask wrote nothing");

    let mut tap = t.dp.take_trace().unwrap().expect("trace maps");
    tap.set(true).unwrap();
    let (v, _, _) = t.dp.test_run("lb_xdp", &real_frame(&q, SYN), 1).unwrap();
    assert_eq!(v, TX, "forwarded as without a trace");
    assert_eq!(t.dp.conntrack_entries(), before.1 + 1, "its entry written");
    assert!(tap.next_record().is_none(), "not traced");
}
