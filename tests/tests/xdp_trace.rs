//! `lbctl trace`'s data-plane side (lb-ebpf `explain.rs`) with the real XDP program through
//! BPF_PROG_TEST_RUN: while the trace switch is off the program writes nothing to the ring
//! buffer, whatever the packets; while it is on, each decision of a packet that reached the
//! connection table is there with its flow, verdict, reason and backend, and the decisions are
//! the same as with the switch off.
//!
//! Needs root; `cargo xtask test`.

use std::net::IpAddr;

use lb_common::{PROTO_TCP, explain::step};
use lb_tests::{TestDataplane, backend, frames::*};
use lb_userspace::{
    dataplane::{Desired, ServiceSpec, vip_key},
    explain::{flow_addrs, stat_name},
};

const TX: u32 = 3;
const PORT: u16 = 6443;

fn desired(vip: IpAddr) -> Desired {
    Desired {
        services: vec![ServiceSpec {
            key: vip_key(vip, PORT, PROTO_TCP),
            owned: true,
            backends: (0..3u8)
                .map(|i| backend(&format!("10.70.0.{}", 11 + i), 11 + i))
                .collect(),
        }],
        ..Default::default()
    }
}

fn frame(client: [u8; 4], vip: [u8; 4], sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    ipv4_frame(client, vip, PROTO_TCP, &tcp(sport, dport, flags))
}

#[test]
fn the_ring_is_written_only_while_a_trace_is_attached() {
    let vip = [10, 70, 0, 100];
    let client = [10, 70, 1, 1];
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(IpAddr::from(vip))).unwrap();
    let mut tap =
        t.dp.take_trace()
            .unwrap()
            .expect("the program has trace maps");
    assert!(!tap.is_on().unwrap(), "off after load");

    // Off: new flows, established ones (fast path and not), another port, a non-VIP address.
    let mut off_out = Vec::new();
    for sport in 30000..30020u16 {
        for flags in [SYN, ACK, ACK] {
            let (v, out, _) =
                t.dp.test_run("lb_xdp", &frame(client, vip, sport, PORT, flags), 1)
                    .unwrap();
            assert_eq!(v, TX);
            off_out.push(out);
        }
        t.dp.test_run("lb_xdp", &frame(client, vip, sport, 9999, SYN), 1)
            .unwrap();
        t.dp.test_run(
            "lb_xdp",
            &frame(client, [10, 70, 0, 200], sport, PORT, SYN),
            1,
        )
        .unwrap();
    }
    assert!(
        tap.next_record().is_none(),
        "nothing written while no trace is attached"
    );

    // On: the same flows' next packets (established) and new ones.
    tap.set(true).unwrap();
    let mut on_out = Vec::new();
    for sport in 30000..30020u16 {
        let (_, out, _) =
            t.dp.test_run("lb_xdp", &frame(client, vip, sport, PORT, ACK), 1)
                .unwrap();
        on_out.push(out);
    }
    for sport in 31000..31010u16 {
        t.dp.test_run("lb_xdp", &frame(client, vip, sport, PORT, SYN), 1)
            .unwrap();
    }
    t.dp.test_run("lb_xdp", &frame(client, vip, 31000, 9999, SYN), 1)
        .unwrap();
    let mut recs = Vec::new();
    while let Some(r) = tap.next_record() {
        recs.push(r);
    }
    assert_eq!(
        recs.len(),
        31,
        "one record per packet that reached the connection table"
    );
    // Tracing changes no decision: an established flow's packet leaves as it did.
    for (i, out) in on_out.iter().enumerate() {
        assert_eq!(out, &off_out[i * 3 + 1], "flow {i}");
    }
    for (i, r) in recs.iter().enumerate() {
        let (c, v) = flow_addrs(&r.flow);
        assert_eq!((c, v), (IpAddr::from(client), IpAddr::from(vip)));
        assert!(r.trail.steps & step::FLOW != 0);
        assert_eq!(r.trail.steps & step::DRY, 0, "a real packet");
        match i {
            0..20 => {
                assert_eq!(r.flow.sport, 30000 + i as u16);
                assert_eq!(r.verdict, TX);
                assert_eq!(stat_name(r.trail.reason), Some("forwarded"));
                assert_eq!(stat_name(r.trail.conntrack), Some("conntrack_hit"));
                assert!(r.trail.steps & step::ENTRY_USED != 0, "{r:?}");
                assert_eq!(r.trail.backend, r.trail.entry_backend);
                // The MAC the packet left with is its backend's (last byte 11 + index).
                let id_mac = on_out[i][5];
                assert!((11..14).contains(&id_mac));
            }
            20..30 => {
                assert_eq!(r.flow.sport, 31000 + (i - 20) as u16);
                assert_eq!(stat_name(r.trail.conntrack), Some("conntrack_miss"));
                assert!(r.trail.steps & (step::MAGLEV | step::CHOSEN | step::WOULD_REMEMBER) != 0);
                assert_eq!(r.trail.backend, r.trail.slot_backend);
            }
            _ => {
                assert_eq!(r.flow.dport, 9999);
                assert_eq!(stat_name(r.trail.reason), Some("pass_not_vip"));
            }
        }
    }

    // Off again: nothing more.
    tap.set(false).unwrap();
    for sport in 32000..32020u16 {
        t.dp.test_run("lb_xdp", &frame(client, vip, sport, PORT, SYN), 1)
            .unwrap();
        t.dp.test_run("lb_xdp", &frame(client, vip, sport, PORT, ACK), 1)
            .unwrap();
    }
    assert!(
        tap.next_record().is_none(),
        "nothing written after the trace detached"
    );
}
