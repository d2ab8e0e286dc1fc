//! Programs for `cargo xtask bench throughput`, never attached by lbd: a traffic generator run
//! with BPF_PROG_TEST_RUN in live-frames mode, and a sink that counts and drops what the load
//! balancer sends back. Their maps are small, unpinned, and not shared with the data plane.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_TX},
    macros::{map, xdp},
    maps::PerCpuArray,
    programs::XdpContext,
};

use crate::packet::ptr_at;

/// The generator's per-CPU state: `[flows, step, next, _]`. With `flows` > 1 every frame gets
/// the source address 10.x.y.z of flow `next` (x.y.z = the flow number + 1), and `next` moves
/// by `step` (coprime with `flows`) modulo `flows`, so consecutive frames belong to flows far
/// apart and every flow comes once per `flows` frames.
#[map]
static BENCH_GEN: PerCpuArray<[u32; 4]> = PerCpuArray::with_max_entries(1, 0);

/// Frames the sink received, per CPU.
#[map]
static BENCH_SINK: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Offset of the IPv4 source address in an untagged Ethernet frame.
const IPV4_SRC: usize = 14 + 12;

/// The generator: sends every frame out of the interface it "arrived" on (XDP_TX), optionally
/// spreading frames over many flows (see `BENCH_GEN`).
#[xdp]
pub fn bench_gen(ctx: XdpContext) -> u32 {
    if let Some(state) = BENCH_GEN.get_ptr_mut(0) {
        let s = unsafe { &mut *state };
        let (flows, step) = (s[0], s[1]);
        if flows > 1
            && let Ok(src) = ptr_at::<[u8; 4]>(&ctx, IPV4_SRC)
        {
            let flow = s[2] + 1;
            unsafe { *src = [10, (flow >> 16) as u8, (flow >> 8) as u8, flow as u8] };
            let mut next = s[2] + step;
            if next >= flows {
                next -= flows;
            }
            s[2] = next;
        }
    }
    XDP_TX
}

/// The sink on the generator's side: counts and drops. (It also makes the veth deliver the
/// load balancer's XDP_TX frames at all: a native-mode veth only delivers to an XDP peer.)
#[xdp]
pub fn bench_sink(_ctx: XdpContext) -> u32 {
    if let Some(n) = BENCH_SINK.get_ptr_mut(0) {
        unsafe { *n += 1 };
    }
    XDP_DROP
}
