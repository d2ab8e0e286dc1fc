//! Dry runs for `lbctl explain` (see `lb_common::explain`): the same program, the same path,
//! with every map write the data plane reads left out and the decision's steps noted.
//!
//! Why a real packet can never be taken for a dry run: the ask is in the frame's XDP metadata,
//! which a NIC or the stack does not fill (a driver starts every frame with none; generic XDP
//! marks it absent), and must carry `LB_EXPLAIN_TOKEN`, a random word lbd writes at load time
//! and never shows. So a frame from the wire, whatever its bytes, takes the ordinary path; the
//! check costs one compare of two context fields for it. The scratch entry is per-CPU and only
//! dry runs touch it; lbd runs them one at a time.
use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
    programs::XdpContext,
};
use lb_common::explain::{ExplainRecord, META_LEN, NONE16, step};

/// lbd's token (zero until written: no dry runs).
#[map]
static LB_EXPLAIN_TOKEN: Array<u64> = Array::with_max_entries(1, 0);

/// The trail of the dry run in progress on this CPU.
#[map]
static LB_EXPLAIN: PerCpuArray<ExplainRecord> = PerCpuArray::with_max_entries(1, 0);

/// Whether this frame asks for a dry run; if so, the trail is started.
#[inline(always)]
pub fn asked(ctx: &XdpContext) -> bool {
    let meta = ctx.metadata();
    // No (or too little) metadata: every frame from the wire.
    if meta + META_LEN > ctx.data() {
        return false;
    }
    // SAFETY: META_LEN bytes of metadata at `meta`, checked above.
    asked_slow(unsafe { (meta as *const u64).read_unaligned() })
}

/// The token compare, apart so the common case above stays two loads and a compare.
#[inline(never)]
fn asked_slow(got: u64) -> bool {
    let Some(token) = LB_EXPLAIN_TOKEN.get(0) else {
        return false;
    };
    if *token == 0 || got != *token {
        return false;
    }
    let Some(r) = LB_EXPLAIN.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's scratch entry; only dry runs write it.
    unsafe {
        *r = ExplainRecord {
            token: got,
            steps: step::DRY,
            reason: NONE16,
            conntrack: NONE16,
            ..Default::default()
        };
    }
    true
}

/// Add to the trail of a dry run (nothing for a real packet).
#[inline(always)]
pub fn note(dry: bool, f: impl FnOnce(&mut ExplainRecord)) {
    if !dry {
        return;
    }
    if let Some(r) = LB_EXPLAIN.get_ptr_mut(0) {
        // SAFETY: this CPU's scratch entry.
        f(unsafe { &mut *r });
    }
}

/// Set `bits` in the trail of a dry run.
#[inline(always)]
pub fn steps(dry: bool, bits: u32) {
    note(dry, |r| r.steps |= bits);
}

/// End a dry run: the reason and connection-table counter, and the trail copied over the
/// metadata (which moved with `data` if the frame was wrapped), for user space to read.
#[inline(never)]
pub fn finish(ctx: &XdpContext, reason: u32, conntrack: u32) {
    let Some(r) = LB_EXPLAIN.get_ptr_mut(0) else {
        return;
    };
    let meta = ctx.metadata();
    if meta + META_LEN > ctx.data() {
        return;
    }
    let small = |v: u32| {
        if v > u16::MAX as u32 {
            NONE16
        } else {
            v as u16
        }
    };
    // SAFETY: this CPU's scratch entry; META_LEN bytes of metadata checked above.
    unsafe {
        (*r).reason = small(reason);
        (*r).conntrack = small(conntrack);
        let from = r as *const u64;
        let to = meta as *mut u64;
        for i in 0..META_LEN / 8 {
            to.add(i).write_unaligned(from.add(i).read());
        }
    }
}
