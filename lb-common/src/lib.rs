//! Types shared by the XDP program (`lb-ebpf`) and user space (`lb-userspace`).
//!
//! Every map key and value is `#[repr(C)]` with explicit padding and a size assertion, and holds
//! only plain integers: the kernel copies these bytes verbatim between the two sides.
//! By concern: `constants` (limits, families, protocols), `types` (map keys and values),
//! `hash` (flow hashes, table layout, filter bits), `flow_cache` (the flow cache's line layout), `counters` (counter indexes and names),
//! `maps` (pin names); all but `maps` are re-exported at the crate root.
#![no_std]

mod constants;
mod counters;
/// `lbctl explain`'s dry run (kept apart: its own module).
pub mod explain;
/// The flow cache's line layout.
mod flow_cache;
mod hash;
pub mod maps;
#[cfg(feature = "user")]
mod pod;
#[cfg(test)]
mod tests;
mod types;

pub use constants::*;
pub use counters::*;
pub use flow_cache::*;
pub use hash::*;
pub use types::*;
