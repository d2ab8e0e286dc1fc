//! `lbctl trace`: the switch the XDP program reads (its global `LB_TRACE_ON`, the `.bss` map) and
//! the ring buffer it writes traced decisions to (`LB_TRACE`), taken out of the object for
//! whoever serves traces.

use anyhow::{Context, Result, anyhow};
use aya::maps::{Array, Map, MapData, RingBuf};
use lb_common::explain::{TRACE_MAP, TRACE_ON_MAP, TraceRecord};

use super::Dataplane;

/// The program's trace maps. Nothing is written to the ring unless the switch is on.
pub struct TraceTap {
    pub ring: RingBuf<MapData>,
    on: Array<MapData, u32>,
}

impl Dataplane {
    /// Take the trace maps (once: `None` after), with the noted path loaded (a traced packet
    /// runs it: [`Dataplane::arm_noted`]).
    pub fn take_trace(&mut self) -> Result<Option<TraceTap>> {
        if self.ebpf.map(TRACE_MAP).is_none() {
            return Ok(None);
        }
        self.arm_noted().context("load the noted path for traces")?;
        let ring = self
            .ebpf
            .take_map(TRACE_MAP)
            .ok_or_else(|| anyhow!("map {TRACE_MAP} gone"))?;
        let ring = RingBuf::try_from(ring).with_context(|| format!("map {TRACE_MAP}"))?;
        let on = match self.ebpf.take_map(TRACE_ON_MAP) {
            Some(m @ Map::Array(_)) => Array::try_from(m)?,
            _ => return Err(anyhow!("map {TRACE_ON_MAP} missing or not an array")),
        };
        Ok(Some(TraceTap { ring, on }))
    }
}

impl TraceTap {
    /// Turn tracing on or off in the program.
    pub fn set(&mut self, on: bool) -> Result<()> {
        self.on.set(0, on as u32, 0).context("set LB_TRACE_ON")
    }

    pub fn is_on(&self) -> Result<bool> {
        Ok(self.on.get(&0, 0)? != 0)
    }

    /// The next traced decision in the ring, if any.
    pub fn next_record(&mut self) -> Option<TraceRecord> {
        let item = self.ring.next()?;
        TraceRecord::from_bytes(&item)
    }
}
