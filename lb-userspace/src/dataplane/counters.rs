//! What the data plane reports: counters, the flood view, the connection table's fill, and
//! BPF_PROG_TEST_RUN for tests and benchmarks. Reads only; `mod.rs` writes.

use anyhow::{Context, Result, anyhow};
use aya::{
    maps::{MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
};
use lb_common::{Counters, stat};

use super::Dataplane;

/// The flood view of `lbctl stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FloodStatus {
    /// Misses that would write a connection-table entry, per second, node-wide.
    pub new_connections_per_s: u64,
    pub conntrack_size: u32,
    /// `syn_flood_rate`: the node-wide rate above which flood mode starts.
    pub threshold_per_s: u32,
    /// Flood mode holds: no miss writes an entry.
    pub active: bool,
}

/// Counters of one service or backend, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

impl Dataplane {
    pub fn global_stats(&self) -> Result<Vec<(&'static str, u64)>> {
        let per_cpu = self.stats.get(&0, 0)?;
        Ok(stat::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, per_cpu.iter().map(|c| c[i]).sum()))
            .collect())
    }

    fn sum(map: &PerCpuArray<MapData, Counters>, id: u32) -> Result<Traffic> {
        let v = map.get(&id, 0)?;
        Ok(v.iter().fold(Traffic::default(), |t, c| Traffic {
            packets: t.packets + c.packets,
            bytes: t.bytes + c.bytes,
            new_flows: t.new_flows + c.new_flows,
        }))
    }

    /// A VIP's counters: what its retired pairs left (`LB_VIP_STATS`, see `carry_counters`)
    /// plus its current pairs' (`LB_BACKEND_STATS`): the program counts each forwarded packet
    /// in one per-CPU entry, its pair's.
    pub fn vip_traffic(&self, vip_id: u32) -> Result<Traffic> {
        let mut t = Self::sum(&self.vip_stats, vip_id)?;
        if let Some(svc) = self.services.values().find(|s| s.vip_id == vip_id) {
            for b in svc.backends.values() {
                let c = Self::sum(&self.backend_stats, b.id)?;
                t.packets += c.packets;
                t.bytes += c.bytes;
                t.new_flows += c.new_flows;
            }
        }
        Ok(t)
    }

    pub fn backend_traffic(&self, backend_id: u32) -> Result<Traffic> {
        Self::sum(&self.backend_stats, backend_id)
    }

    /// Connection-table misses per second that would write an entry (new flows, real or
    /// spoofed, to owned VIPs: node-wide, from the last full 100 ms window) against the
    /// connection table's size, and whether flood mode holds now.
    pub fn flood_status(&self) -> Result<FloodStatus> {
        let s = self.flood.get(&0, 0)?;
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // The program uses bpf_ktime_get_coarse_ns: CLOCK_MONOTONIC, at tick resolution.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        let window = lb_common::FLOOD_WINDOW_NS;
        let age = now.saturating_sub(s.window_start);
        // A window is only current if it started within the last two windows.
        let n = match age {
            a if a < window => s.last_count,
            a if a < 2 * window => s.count,
            _ => 0,
        };
        Ok(FloodStatus {
            new_connections_per_s: n as u64 * (1_000_000_000 / window),
            conntrack_size: self.opts.conntrack_size,
            threshold_per_s: self.opts.syn_flood_rate,
            active: now < s.flood_until,
        })
    }

    /// Entries in the connection table (walks the map: for status, not for hot paths).
    pub fn conntrack_entries(&self) -> usize {
        self.conntrack.keys().filter(|k| k.is_ok()).count()
    }

    /// Run one of the object's XDP programs on `frame` with BPF_PROG_TEST_RUN.
    /// Returns (verdict, output frame, average ns per run).
    pub fn test_run(
        &mut self,
        program: &str,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(u32, Vec<u8>, f64)> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("no program {program}"))?
            .try_into()?;
        run(prog, frame, repeat)
    }
}

/// BPF_PROG_TEST_RUN of `prog` on `frame`, `repeat` times: verdict, output frame, ns per run.
fn run(prog: &mut Xdp, frame: &[u8], repeat: u32) -> Result<(u32, Vec<u8>, f64)> {
    let mut out = vec![0u8; frame.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        repeat: repeat.max(1),
        ..TestRunOptions::new()
    };
    let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
    out.truncate(r.data_size_out as usize);
    Ok((r.return_value, out, r.duration.as_nanos() as f64))
}

/// One run of `prog` on `frame`: verdict and output frame.
pub(super) fn run_once(prog: &mut Xdp, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
    run(prog, frame, 1).map(|(v, out, _)| (v, out))
}
