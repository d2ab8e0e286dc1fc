//! `bench insns`: how many BPF instructions each path of lb_xdp executes, and where they go
//! (copy/memset calls, byte-wise accesses, stack traffic, 64-bit division, helper calls per map).
//!
//! The compiled object (as aya links it: maps and calls relocated, before the kernel verifier's
//! rewrites, e.g. its inlining of array lookups) runs in a small interpreter (`interp.rs`)
//! against the real maps of a data plane set up like `bench micro`'s; each path's verdict and
//! output frame are checked against the kernel's own BPF_PROG_TEST_RUN of the same frame.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::MapData;
use aya_obj::Object;
use serde_json::json;

use super::{
    interp::{Interp, MapDef, MapSource},
    live,
    micro::{client_frame, setup},
    write_json,
};
use crate::frames::ACK;

const PERCPU_TYPES: [u32; 3] = [5, 6, 10];
const ARRAY_TYPES: [u32; 2] = [2, 6];

/// The kernel's maps of the test data plane, read through their pins; maps of the object the
/// data plane does not pin (the bench programs', aya-log's) read as empty.
struct KernelMaps {
    /// Per map index: (fd holder, map type, full value length to read, max entries).
    maps: Vec<(Option<MapData>, u32, usize, u32)>,
}

impl MapSource for KernelMaps {
    fn lookup(&mut self, map: u32, key: &[u8]) -> Option<Vec<u8>> {
        let (data, ty, len, max) = &self.maps[map as usize];
        match data {
            Some(d) => {
                let v = live::map_lookup(d.fd().as_fd().as_raw_fd(), key, *len)?;
                // Per-CPU values: CPU 0's.
                Some(v)
            }
            None if ARRAY_TYPES.contains(ty) => {
                let i = u32::from_le_bytes(key[..4].try_into().ok()?);
                (i < *max).then(|| vec![0; *len])
            }
            None => None,
        }
    }
}

/// Print the counts and write `target/bench/insns.json`.
pub fn run() {
    write_json("insns", &measure());
}

/// Interpret every path (panicking if the interpreter and the kernel disagree on a verdict or
/// an output frame), print the table, and return the JSON document.
pub fn measure() -> serde_json::Value {
    let (mut t, mut cases) = setup();
    cases.push((
        "tcp_midstream_new",
        client_frame(78, 7, [10, 77, 0, 100], ACK),
    ));

    let mut obj = Object::parse(lb_userspace::EBPF_OBJECT).expect("parse the XDP object");
    let mut names: Vec<String> = obj.maps.keys().cloned().collect();
    names.sort();
    let cpus = aya::util::nr_cpus().unwrap();
    let pin_dir = t.opts.pin_dir();
    let mut defs = Vec::new();
    let mut kernel = KernelMaps { maps: Vec::new() };
    let mut rodata = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let m = &obj.maps[name];
        let (ty, vsize) = (m.map_type(), m.value_size() as usize);
        defs.push(MapDef {
            name: name.clone(),
            key_size: m.key_size() as usize,
            value_size: vsize,
        });
        if !m.data().is_empty() {
            rodata.insert(i as u32, m.data().to_vec());
        }
        let len = if PERCPU_TYPES.contains(&ty) {
            cpus * vsize.div_ceil(8) * 8
        } else {
            vsize
        };
        let pinned = pin_dir.join(name);
        let data = pinned
            .exists()
            .then(|| MapData::from_pin(&pinned).expect("open a pinned map"));
        kernel.maps.push((data, ty, len, m.max_entries()));
    }
    let text: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    let maps = obj.maps.clone();
    obj.relocate_maps(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i as i32, &maps[n])),
        &text,
    )
    .expect("relocate maps");
    obj.relocate_calls(&text).expect("relocate calls");
    let program_names: HashSet<&String> = obj.programs.keys().collect();
    let functions: Vec<(String, Vec<_>)> = obj
        .functions
        .values()
        .filter(|f| !program_names.contains(&f.name))
        .map(|f| (f.name.clone(), f.instructions.clone()))
        .collect();
    let prog_insns = |name: &str| {
        let key = obj.programs[name].function_key();
        obj.functions[&key].instructions.clone()
    };
    let lb = prog_insns("lb_xdp");
    let lines = SourceLines::new(&obj, "lb_xdp");
    // The baseline lives in the benches' own object; it uses no maps and calls nothing.
    let bench_obj = Object::parse(lb_userspace::BENCH_OBJECT).expect("parse the bench object");
    let baseline = {
        let key = bench_obj.programs["lb_baseline"].function_key();
        bench_obj.functions[&key].instructions.clone()
    };
    let wide = lb.iter().filter(|i| i.code == 0x18).count();

    println!(
        "lb_xdp: {} instructions as linked ({} slots), lb_baseline: {}",
        lb.len() - wide,
        lb.len(),
        baseline.len()
    );
    // What the kernel made of them: after the verifier's rewrites, and JIT-compiled.
    let mut kernel_sizes = serde_json::Map::new();
    let mut loaded =
        super::throughput::BenchProgs::load_from(lb_userspace::EBPF_OBJECT, &["lb_xdp"]);
    let mut base = super::throughput::BenchProgs::load_programs(&["lb_baseline"]);
    for name in ["lb_xdp", "lb_baseline"] {
        let progs = if name == "lb_xdp" {
            &mut loaded
        } else {
            &mut base
        };
        let info = progs.prog(name).info().expect("program info");
        let (xlated, jited) = (info.size_translated().unwrap_or(0) / 8, info.size_jitted());
        // What the verifier walked to accept it (this kernel's; the kernel matrix records
        // the other kernels', docs/kernels.md).
        let verified = info.verified_instruction_count().unwrap_or(0);
        println!(
            "{name}: {xlated} instructions after the verifier, {jited} bytes of machine code, {verified} instructions processed by the verifier"
        );
        kernel_sizes.insert(
            name.into(),
            json!({"xlated_insns": xlated, "jited_bytes": jited, "verified_insns": verified}),
        );
    }
    drop(loaded);
    println!(
        "{:<20} {:>6} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6}  helper calls",
        "path", "insns", "in fns", "bytes", "st ld", "st st", "div64", "calls"
    );
    let mut rows = Vec::new();
    let mut run_one = |name: &str,
                       prog: &[aya_obj::generated::bpf_insn],
                       program: &str,
                       frame: &[u8]| {
        let mut interp = Interp::new(prog, &functions, &defs, &rodata, &mut kernel, frame);
        let p = interp
            .run(100_000)
            .unwrap_or_else(|e| panic!("interpreting {program} on {name}: {e}"));
        let out = interp.packet.clone();
        let hot = if program == "lb_xdp" {
            // `LB_INSNS_LINES=N`: more of the hottest source lines (default 12).
            let n = std::env::var("LB_INSNS_LINES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(12);
            lines.hottest(&interp.hits, n)
        } else {
            Vec::new()
        };
        let (verdict, kout, _) = if program == "lb_baseline" {
            base.test_run(program, frame, 1)
        } else {
            t.dp.test_run(program, frame, 1).unwrap()
        };
        assert_eq!(
            (p.verdict, &out),
            (verdict, &kout),
            "{name}: the interpreter must agree with the kernel on the verdict and the frame"
        );
        let in_fns: u64 = p.in_function.values().sum();
        let helpers: Vec<String> = p.helpers.iter().map(|(k, v)| format!("{k}x{v}")).collect();
        println!(
            "{:<20} {:>6} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6}  {}",
            name,
            p.total,
            in_fns,
            p.byte_accesses,
            p.stack_loads,
            p.stack_stores,
            p.div_mod_64,
            p.calls,
            helpers.join(" ")
        );
        if !p.in_function.is_empty() {
            println!("{:<20} in functions: {:?}", "", p.in_function);
        }
        println!(
            "{:<20} one-byte accesses: {} packet, {} stack, {} map",
            "", p.byte_packet, p.byte_stack, p.byte_map
        );
        for (n, at, text) in &hot {
            println!("{:<20} {:>5}  {:<18} {}", "", n, at, text);
        }
        let hot: Vec<_> = hot
            .iter()
            .map(|(n, at, text)| json!({"insns": n, "at": at, "source": text}))
            .collect();
        rows.push(json!({"name": name, "program": program, "profile": p, "hottest_lines": hot}));
    };
    run_one("baseline", &baseline, "lb_baseline", &cases[2].1);
    for (name, frame) in &cases {
        run_one(name, &lb, "lb_xdp", frame);
    }
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for (n, body) in &functions {
        sizes.insert(n.clone(), body.len());
    }
    println!("called functions' sizes (instructions): {sizes:?}");
    println!(
        "insns: executed; in fns: of them inside called functions (memcpy, memset, ...); bytes: \
         one-byte loads/stores; st ld/st st: stack loads/stores; div64: 64-bit div/mod; calls: \
         bpf-to-bpf calls"
    );
    json!({
        "lb_xdp_static_insns": lb.len() - wide,
        "lb_baseline_static_insns": baseline.len(),
        "function_sizes": sizes,
        "kernel_sizes": kernel_sizes,
        "paths": rows,
        "method": "compiled object as linked by aya-obj, interpreted on each frame against the real maps; verdict and output checked against BPF_PROG_TEST_RUN",
    })
}

/// Source lines of a linked program (BTF line info): which line each instruction came from.
struct SourceLines {
    /// (first instruction, "file:line", source text), sorted by instruction.
    lines: Vec<(u32, String, String)>,
}

impl SourceLines {
    fn new(obj: &Object, program: &str) -> SourceLines {
        let key = obj.programs[program].function_key();
        let f = &obj.functions[&key];
        let Some(btf) = obj.btf.as_ref() else {
            return SourceLines { lines: Vec::new() };
        };
        // The string section of the BTF blob: header fields hdr_len (4), str_off (16), str_len (20).
        let raw = btf.to_bytes();
        let u32_at = |o: usize| u32::from_le_bytes(raw[o..o + 4].try_into().unwrap()) as usize;
        let (hdr, off, len) = (u32_at(4), u32_at(16), u32_at(20));
        let strings = &raw[hdr + off..hdr + off + len];
        let string = |o: u32| {
            let s = &strings[(o as usize).min(strings.len())..];
            let end = s.iter().position(|b| *b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).to_string()
        };
        let mut lines: Vec<(u32, String, String)> = f
            .line_info
            .line_info
            .iter()
            .map(|l| {
                let file = string(l.file_name_off);
                let file = file.rsplit('/').next().unwrap_or("").to_string();
                (
                    l.insn_off,
                    format!("{file}:{}", l.line_col >> 10),
                    string(l.line_off).trim().to_string(),
                )
            })
            .collect();
        lines.sort_by_key(|l| l.0);
        SourceLines { lines }
    }

    /// The `n` source lines that executed the most instructions: (count, "file:line", text).
    fn hottest(&self, hits: &[u64], n: usize) -> Vec<(u64, String, String)> {
        let mut by_line: HashMap<(String, String), u64> = HashMap::new();
        for (pc, h) in hits.iter().enumerate().filter(|(_, h)| **h > 0) {
            let i = self.lines.partition_point(|l| l.0 as usize <= pc);
            let (at, text) = match i.checked_sub(1).map(|i| &self.lines[i]) {
                Some((_, at, text)) => (at.clone(), text.clone()),
                None => ("?".into(), String::new()),
            };
            *by_line.entry((at, text)).or_default() += h;
        }
        let mut v: Vec<(u64, String, String)> =
            by_line.into_iter().map(|((a, t), n)| (n, a, t)).collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.truncate(n);
        v
    }
}
