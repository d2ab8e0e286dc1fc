//! `lbctl explain`: the XDP program run on one synthesized frame (BPF_PROG_TEST_RUN) in dry
//! mode, telling what it decided and why. `lbctl trace`: the same trail, of real packets, sent to
//! a ring buffer while a trace is attached.
//!
//! The ask lives in the frame's XDP metadata (the bytes before `data`, which only the kernel's
//! test run or another BPF program can put there; a frame from the wire arrives with none):
//! [`META_LEN`] bytes whose first word is the token lbd wrote into `LB_EXPLAIN_TOKEN`. A dry run
//! writes no map the data plane reads (no connection-table or cache entry, no handshake entry,
//! no counter, no flood accounting); it writes its trail into a per-CPU scratch entry
//! (`LB_EXPLAIN`) and copies it over the metadata at the end, so user space reads the
//! [`ExplainRecord`] from the test run's output frame, whatever CPU it ran on.

use core::mem::size_of;

use crate::FlowKey;

/// Bytes of metadata an explain run carries: the kernel allows at most 32.
pub const META_LEN: usize = 32;

/// Map names (unpinned: each loaded program has its own).
pub const TOKEN_MAP: &str = "LB_EXPLAIN_TOKEN";
pub const SCRATCH_MAP: &str = "LB_EXPLAIN";
/// `lbctl trace`: the switch (u32, non-zero while a trace is attached: the global
/// `LB_TRACE_ON`, alone in the object's `.bss`, which aya loads as a one-entry array map of that
/// name) and the ring buffer of [`TraceRecord`]s.
pub const TRACE_ON_MAP: &str = ".bss";
pub const TRACE_MAP: &str = "LB_TRACE";
/// The program of dry runs and traced packets (`lb_xdp` tail-calls it through `NOTED_MAP`, a
/// one-slot program array lbd fills at load).
pub const NOTED_PROGRAM: &str = "lb_xdp_noted";
pub const NOTED_MAP: &str = "LB_NOTED";
/// Scratch entries (`LB_EXPLAIN`): one for dry runs, one for traced packets.
pub const SCRATCH_DRY: u32 = 0;
pub const SCRATCH_TRACE: u32 = 1;

/// What a dry run saw and decided. In: `token` (the rest zero). Out: the trail.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExplainRecord {
    /// In: lbd's token. Out: unchanged.
    pub token: u64,
    /// [`step`] bits.
    pub steps: u32,
    /// The `stat` reason and connection-table counter of the decision (`NONE16` for none).
    pub reason: u16,
    pub conntrack: u16,
    /// The Maglev slot the flow hashes to (valid with [`step::MAGLEV`]).
    pub slot: u32,
    /// The backend id the live table names at that slot (before any skip).
    pub slot_backend: u32,
    /// The backend id the packet went to (valid with [`step::CHOSEN`]).
    pub backend: u32,
    /// The backend id of the connection-table entry found (valid with an `ENTRY_*` step).
    pub entry_backend: u32,
}
const _: () = assert!(size_of::<ExplainRecord>() == META_LEN);

/// One traced decision (`lbctl trace`): the trail, the flow, the XDP verdict.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceRecord {
    pub trail: ExplainRecord,
    /// Valid with [`step::FLOW`].
    pub flow: FlowKey,
    pub verdict: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<TraceRecord>() == 80);

#[cfg(feature = "user")]
unsafe impl aya::Pod for TraceRecord {}

impl TraceRecord {
    /// A record from a ring buffer item's bytes.
    pub fn from_bytes(b: &[u8]) -> Option<TraceRecord> {
        let b: [u8; 80] = b.get(..80)?.try_into().ok()?;
        // SAFETY: every bit pattern of these integers is valid.
        Some(unsafe { core::mem::transmute::<[u8; 80], TraceRecord>(b) })
    }
}

/// "No counter" in [`ExplainRecord::reason`] / `conntrack`.
pub const NONE16: u16 = u16::MAX;

/// The steps of a decision, as bits of [`ExplainRecord::steps`].
pub mod step {
    /// The program ran in dry mode (the token matched): nothing else is trusted without it.
    pub const DRY: u32 = 1 << 0;
    /// A connection-table entry was found in the flow cache.
    pub const ENTRY_CACHE: u32 = 1 << 1;
    /// A connection-table entry was found in the LRU table.
    pub const ENTRY_TABLE: u32 = 1 << 2;
    /// The entry's pair still stands (same epoch, in its set).
    pub const ENTRY_GOOD: u32 = 1 << 3;
    /// The decision followed the entry.
    pub const ENTRY_USED: u32 = 1 << 4;
    /// A VIP service matched the destination.
    pub const VIP_FOUND: u32 = 1 << 5;
    /// ... and this node forwards for it.
    pub const VIP_OWNED: u32 = 1 << 6;
    /// The flow hashed to a Maglev slot (`slot`, `slot_backend`).
    pub const MAGLEV: u32 = 1 << 7;
    /// The packet starts a flow (a SYN, a UDP datagram): it skips backends taking no new flows.
    pub const STARTS_FLOW: u32 = 1 << 8;
    /// The slot's backend takes no new flows: the new-flow table's backend was taken instead.
    pub const SKIPPED: u32 = 1 << 9;
    /// Followed the handshake table (its SYN skipped the slot in flood mode).
    pub const HANDSHAKE: u32 = 1 << 10;
    /// Flood mode is on: a real packet would not write an entry.
    pub const FLOOD: u32 = 1 << 11;
    /// A real packet would write a connection-table entry for this flow.
    pub const WOULD_REMEMBER: u32 = 1 << 12;
    /// A backend was chosen (`backend`).
    pub const CHOSEN: u32 = 1 << 13;
    /// The loop guard: the source MAC is another lbd node's.
    pub const FROM_PEER: u32 = 1 << 14;
    /// The flow key was noted (`TraceRecord::flow`): the packet reached the connection table.
    pub const FLOW: u32 = 1 << 15;
    /// The entry's connection was closed by the client (a FIN or RST went through): a SYN
    /// opens a new connection on the 5-tuple and is placed afresh once the close is
    /// `FLOW_CLOSE_HOLD` old (at once if the entry's pair left the set).
    pub const ENTRY_CLOSED: u32 = 1 << 16;
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for ExplainRecord {}

impl ExplainRecord {
    /// The record as the metadata bytes of a test run's input.
    pub fn to_bytes(&self) -> [u8; META_LEN] {
        // SAFETY: plain integers, no padding (size asserted above).
        unsafe { core::mem::transmute(*self) }
    }

    /// The record from the first [`META_LEN`] bytes of a test run's output.
    pub fn from_bytes(b: &[u8]) -> Option<ExplainRecord> {
        let b: [u8; META_LEN] = b.get(..META_LEN)?.try_into().ok()?;
        // SAFETY: every bit pattern of these integers is valid.
        Some(unsafe { core::mem::transmute::<[u8; META_LEN], ExplainRecord>(b) })
    }
}
