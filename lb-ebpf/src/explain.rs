//! Dry runs for `lbctl explain` and traced packets for `lbctl trace` (see `lb_common::explain`):
//! the same program, the same path, with the decision's steps noted; a dry run also leaves out
//! every map write the data plane reads.
//!
//! Why a real packet can never be taken for a dry run: the ask is in the frame's XDP metadata,
//! which a NIC or the stack does not fill (a driver starts every frame with none; generic XDP
//! marks it absent), and must carry `LB_EXPLAIN_TOKEN`, a random word lbd writes at load time
//! and never shows. So a frame from the wire, whatever its bytes, takes the ordinary path; the
//! check costs one compare of two context fields for it.
//!
//! Tracing: while lbd has a trace attached it sets `LB_TRACE_ON`, and each packet's trail goes to
//! the `LB_TRACE` ring buffer; otherwise nothing is noted and nothing is written (one load of a
//! global per packet). Dry runs and traced packets note into separate per-CPU scratch
//! entries; a test run also runs with bottom halves off, so no packet of this CPU interleaves.
use aya_ebpf::{
    bindings::xdp_md,
    macros::map,
    maps::{Array, PerCpuArray, ProgramArray, RingBuf},
    programs::XdpContext,
};
use lb_common::{
    FlowKey,
    explain::{ExplainRecord, META_LEN, NONE16, SCRATCH_DRY, SCRATCH_TRACE, TraceRecord, step},
};

/// Whose trail a packet notes: none, a dry run's, or a traced packet's.
pub type Rec = u32;
pub const OFF: Rec = 0;
pub const DRY: Rec = SCRATCH_DRY + 1;
pub const TRACE: Rec = SCRATCH_TRACE + 1;

/// lbd's token (zero until written: no dry runs).
#[map]
static LB_EXPLAIN_TOKEN: Array<u64> = Array::with_max_entries(1, 0);

/// The trails in progress on this CPU: `SCRATCH_DRY`, `SCRATCH_TRACE`.
#[map]
static LB_EXPLAIN: PerCpuArray<TraceRecord> = PerCpuArray::with_max_entries(2, 0);

/// Non-zero while lbd has a trace attached. A global, the object's only `.bss` variable (aya
/// makes the section a one-entry array map, `TRACE_ON_MAP`, that lbd writes): the entry reads
/// it with one load, without a helper call or a stack slot for a key.
#[unsafe(no_mangle)]
static mut LB_TRACE_ON: u32 = 0;

/// Slot 0: `lb_xdp_noted`, the path that notes (filled by lbd at load).
#[map]
pub static LB_NOTED: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Traced decisions, read by lbd while a trace is attached.
#[map]
static LB_TRACE: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Whether this frame is a dry run, a traced packet, or neither; the trail is started. Asked
/// only for a frame with metadata or while a trace is attached. The
/// context comes as an integer: LLVM would otherwise pass the two fields read from it instead
/// of the pointer, which the verifier refuses.
#[inline(never)]
pub fn mode(raw: usize) -> Rec {
    let ctx = XdpContext::new(raw as *mut xdp_md);
    let meta = ctx.metadata();
    // Metadata: never on a frame from the wire.
    if meta + META_LEN <= ctx.data() {
        // SAFETY: META_LEN bytes of metadata at `meta`, checked above.
        let got = unsafe { (meta as *const u64).read_unaligned() };
        if asked(got) {
            return DRY;
        }
    }
    if tracing() { traced() } else { OFF }
}

/// Whether lbd has a trace attached (read for every packet; volatile: user space writes it).
#[inline(always)]
pub fn tracing() -> bool {
    // SAFETY: a plain u32 of the program's `.bss`, only read here.
    unsafe { core::ptr::read_volatile(&raw const LB_TRACE_ON) != 0 }
}

/// The token compare, apart so the common case above stays short.
#[inline(never)]
fn asked(got: u64) -> bool {
    let Some(token) = LB_EXPLAIN_TOKEN.get(0) else {
        return false;
    };
    *token != 0 && got == *token && start(SCRATCH_DRY, got)
}

#[inline(never)]
fn traced() -> Rec {
    if start(SCRATCH_TRACE, 0) { TRACE } else { OFF }
}

#[inline(always)]
fn start(index: u32, token: u64) -> bool {
    let Some(r) = LB_EXPLAIN.get_ptr_mut(index) else {
        return false;
    };
    // SAFETY: this CPU's scratch entry.
    unsafe {
        *r = TraceRecord {
            trail: ExplainRecord {
                token,
                steps: step::DRY * (index == SCRATCH_DRY) as u32,
                reason: NONE16,
                conntrack: NONE16,
                ..Default::default()
            },
            ..Default::default()
        };
    }
    true
}

/// Add to the trail (nothing for a packet neither explained nor traced).
#[inline(always)]
pub fn note(rec: Rec, f: impl FnOnce(&mut ExplainRecord)) {
    if rec == OFF {
        return;
    }
    if let Some(r) = LB_EXPLAIN.get_ptr_mut(rec - 1) {
        // SAFETY: this CPU's scratch entry.
        f(unsafe { &mut (*r).trail });
    }
}

/// Set `bits` in the trail.
#[inline(always)]
pub fn steps(rec: Rec, bits: u32) {
    note(rec, |r| r.steps |= bits);
}

/// Note the packet's flow (it reached the connection table).
#[inline(always)]
pub fn flow(rec: Rec, flow: &FlowKey) {
    if rec == OFF {
        return;
    }
    if let Some(r) = LB_EXPLAIN.get_ptr_mut(rec - 1) {
        // SAFETY: this CPU's scratch entry.
        unsafe {
            (*r).flow = *flow;
            (*r).trail.steps |= step::FLOW;
        }
    }
}

fn small(v: u32) -> u16 {
    if v > u16::MAX as u32 {
        NONE16
    } else {
        v as u16
    }
}

/// End a dry run: the reason and connection-table counter, and the trail copied over the
/// metadata (which moved with `data` if the frame was wrapped), for user space to read.
#[inline(never)]
pub fn finish(ctx: &XdpContext, reason: u32, conntrack: u32) {
    let Some(r) = LB_EXPLAIN.get_ptr_mut(SCRATCH_DRY) else {
        return;
    };
    let meta = ctx.metadata();
    if meta + META_LEN > ctx.data() {
        return;
    }
    // SAFETY: this CPU's scratch entry; META_LEN bytes of metadata checked above.
    unsafe {
        (*r).trail.reason = small(reason);
        (*r).trail.conntrack = small(conntrack);
        let from = r as *const u64;
        let to = meta as *mut u64;
        for i in 0..META_LEN / 8 {
            to.add(i).write_unaligned(from.add(i).read());
        }
    }
}

/// End a traced packet: its record to the ring buffer if it reached the connection table (a
/// full ring drops it: lbd reads as fast as it can, a trace is a sample).
#[inline(never)]
pub fn emit(verdict: u32, reason: u32, conntrack: u32) {
    let Some(r) = LB_EXPLAIN.get_ptr_mut(SCRATCH_TRACE) else {
        return;
    };
    // SAFETY: this CPU's scratch entry.
    unsafe {
        if (*r).trail.steps & step::FLOW == 0 {
            return;
        }
        (*r).trail.reason = small(reason);
        (*r).trail.conntrack = small(conntrack);
        (*r).verdict = verdict;
        let _ = LB_TRACE.output::<TraceRecord>(&*r, 0);
    }
}
