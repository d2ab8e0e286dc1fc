//! The forwarding rule as a property of the real XDP program: mutated frames from valid seeds
//! (TCP/UDP, IPv4 options, IPv6 extension headers, ICMP errors, fragments, VLAN tags) checked
//! one by one against an independent strict parser (`lb_tests::strict`). See `lb_tests::xdp_fuzz`
//! for the properties; `cargo xtask fuzz-xdp --frames N --seed S` runs longer.
//!
//! The bounded run uses fixed seeds (reproducible) plus `LB_XDP_FUZZ_SEED` if set.

use lb_tests::xdp_fuzz;

#[test]
fn mutated_frames_follow_the_forwarding_rule() {
    let mut seeds = vec![0x1b5eed_u64, 8];
    if let Some(s) = std::env::var("LB_XDP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        seeds.push(s);
    }
    for seed in seeds {
        let r = xdp_fuzz::run(200_000, seed);
        eprintln!(
            "seed {seed}: {} frames in {:.1}s ({:.0} frames/s): {} forwarded, {} passed, {} dropped; {} service packets by the strict reading",
            r.frames,
            r.seconds,
            r.frames_per_second(),
            r.forwarded,
            r.passed,
            r.dropped,
            r.service_packets
        );
        // The run must exercise both sides of the rule, or it proves nothing.
        assert!(r.forwarded > r.frames / 20, "too few forwarded: {r:?}");
        assert!(
            r.passed + r.dropped > r.frames / 5,
            "too few refused: {r:?}"
        );
    }
}
