//! `cargo xtask fuzz-xdp --frames N --seed S`: the forwarding-rule property test
//! (`lb_tests::xdp_fuzz`) for as long as asked. Needs root.
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Mutated frames to run.
    #[arg(long, default_value_t = 1_000_000)]
    frames: u64,
    /// Seed of the mutations (a failure names it, so it can be replayed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() {
    let a = Args::parse();
    let r = lb_tests::xdp_fuzz::run(a.frames, a.seed);
    println!(
        "seed {}: {} frames in {:.1}s = {:.0} frames/s; forwarded {}, passed {}, dropped {}; strict service packets {}; every property held",
        r.seed,
        r.frames,
        r.seconds,
        r.frames_per_second(),
        r.forwarded,
        r.passed,
        r.dropped,
        r.service_packets
    );
}
