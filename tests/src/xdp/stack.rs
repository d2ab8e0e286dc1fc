//! The 512-byte stack limit, checked on the compiled object, kernel by kernel alike.
//!
//! Every kernel's verifier adds up the frames of a call chain (each subprogram's stack depth
//! rounded up to 32 bytes, at least 32) and refuses a program whose deepest chain passes 512
//! bytes ("combined stack size of N calls is M. Too large"). How deep a frame is depends on
//! how much of it the verifier walks, which differs between kernels: a newer one may accept a
//! chain an older one refuses. So the check here reads the frames from the instructions
//! themselves (every stack address the code forms: an access through r10, or a pointer made
//! from r10 plus a constant), an upper bound of what any verifier can count, and adds them up
//! along the call graph as the verifier does. It also checks the verifier's rule for tail
//! calls made from a subprogram (the frames above it must stay under 256 bytes).
use std::collections::{BTreeMap, BTreeSet, HashSet};

use aya_obj::{Object, generated::bpf_insn};

/// The kernel's limit for a call chain (MAX_BPF_STACK).
pub const MAX_STACK: u32 = 512;
/// The frames above a subprogram that makes a tail call stay below this.
pub const TAIL_CALL_STACK: u32 = 256;

/// One program of the object: its subprograms' frames and its deepest call chain.
#[derive(Debug, Clone)]
pub struct ProgramStack {
    pub program: String,
    /// Per subprogram, by its first instruction: (name, the frame as the code forms it).
    pub frames: BTreeMap<usize, (String, u32)>,
    /// The deepest chain, from the program down: subprogram names.
    pub deepest: Vec<String>,
    /// Its size as the verifier adds it up (frames rounded up to 32 bytes).
    pub combined: u32,
    /// A tail call from a subprogram whose callers' frames reach 256 bytes: (name, their size).
    pub tail_call_too_deep: Option<(String, u32)>,
}

impl ProgramStack {
    /// What is wrong with it, if anything, in the verifier's words.
    pub fn problem(&self) -> Option<String> {
        if self.combined > MAX_STACK {
            return Some(format!(
                "{}: combined stack size of {} calls is {} (limit {MAX_STACK}): {}",
                self.program,
                self.deepest.len(),
                self.combined,
                self.chain()
            ));
        }
        self.tail_call_too_deep.as_ref().map(|(name, depth)| {
            format!(
                "{}: a tail call in {name} under {depth} bytes of callers' frames (limit {TAIL_CALL_STACK})",
                self.program
            )
        })
    }

    /// The deepest chain with each frame as the verifier counts it: `a (256) -> b (96)`.
    pub fn chain(&self) -> String {
        let by_name: BTreeMap<&str, u32> = self
            .frames
            .values()
            .map(|(n, f)| (n.as_str(), *f))
            .collect();
        self.deepest
            .iter()
            .map(|n| format!("{n} ({})", rounded(by_name[n.as_str()])))
            .collect::<Vec<_>>()
            .join(" -> ")
    }
}

/// A frame as the verifier counts it toward the limit.
pub fn rounded(frame: u32) -> u32 {
    frame.max(1).div_ceil(32) * 32
}

/// Every program of an object (as the loader links it: called functions appended), analysed.
pub fn analyse(object: &[u8]) -> Vec<ProgramStack> {
    let mut obj = Object::parse(object).expect("parse the eBPF object");
    let text: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    let mut names: Vec<String> = obj.maps.keys().cloned().collect();
    names.sort();
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
    // Names of functions by their instructions, to name the subprograms of a linked program.
    let mut programs: Vec<String> = obj.programs.keys().cloned().collect();
    programs.sort();
    programs
        .iter()
        .map(|p| {
            let key = obj.programs[p].function_key();
            let f = &obj.functions[&key];
            let named = |start: usize| -> String {
                if start == 0 {
                    return p.clone();
                }
                obj.functions
                    .values()
                    .filter(|g| !g.instructions.is_empty() && g.name != *p)
                    .find(|g| {
                        f.instructions.len() >= start + g.instructions.len()
                            && same_code(&f.instructions[start..], &g.instructions)
                    })
                    .map(|g| readable(&g.name))
                    .unwrap_or_else(|| format!("subprogram@{start}"))
            };
            program_stack(p, &f.instructions, named)
        })
        .collect()
}

/// A Rust symbol's path without its crate (`flows::take` for `_RNvNtCs..._2lb5flows4take`);
/// other names as they are.
fn readable(symbol: &str) -> String {
    let Some(rest) = symbol.strip_prefix("_R") else {
        return symbol.to_string();
    };
    // After the crate's disambiguator (`Cs<base62>_`): length-prefixed identifiers.
    let Some(at) = rest
        .find("Cs")
        .and_then(|c| rest[c..].find('_').map(|u| c + u + 1))
    else {
        return symbol.to_string();
    };
    let b = &rest.as_bytes()[at..];
    let (mut parts, mut i) = (Vec::new(), 0);
    while i < b.len() {
        let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            i += 1;
            continue;
        }
        let n: usize = rest[at + i..at + i + digits].parse().unwrap_or(0);
        let from = i + digits;
        if from + n > b.len() {
            break;
        }
        parts.push(&rest[at + from..at + from + n]);
        i = from + n;
    }
    match parts.split_first() {
        Some((_crate, path)) if !path.is_empty() => path.join("::"),
        _ => symbol.to_string(),
    }
}

/// The opcodes and registers of `linked`'s first instructions are `body`'s (immediates of
/// calls and map loads differ once linked).
fn same_code(linked: &[bpf_insn], body: &[bpf_insn]) -> bool {
    body.iter()
        .zip(linked)
        .all(|(a, b)| a.code == b.code && a.dst_reg() == b.dst_reg() && a.off == b.off)
}

const BPF_CALL: u8 = 0x85;
const BPF_PSEUDO_CALL: u8 = 1;
const BPF_PSEUDO_FUNC: u8 = 4;
const LD_IMM64: u8 = 0x18;
/// `bpf_tail_call`'s helper number.
const TAIL_CALL: i32 = 12;
const FP: u8 = 10;

/// The frames and call chains of one linked program (`insns`: the program, then the functions
/// it calls).
pub fn program_stack(
    program: &str,
    insns: &[bpf_insn],
    name_of: impl Fn(usize) -> String,
) -> ProgramStack {
    // Subprograms start at 0 and at every call or callback target, as the verifier finds them.
    let mut starts = BTreeSet::from([0usize]);
    for (pc, i) in insns.iter().enumerate() {
        let target = pc as i64 + 1 + i64::from(i.imm);
        if (i.code == BPF_CALL && i.src_reg() == BPF_PSEUDO_CALL)
            || (i.code == LD_IMM64 && i.src_reg() == BPF_PSEUDO_FUNC)
        {
            starts.insert(target as usize);
        }
    }
    let bounds: Vec<usize> = starts.iter().copied().collect();
    let end_of = |s: usize| {
        bounds
            .iter()
            .find(|b| **b > s)
            .copied()
            .unwrap_or(insns.len())
    };
    let mut frames = BTreeMap::new();
    let mut callees: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut tail_calls = BTreeSet::new();
    for &s in &bounds {
        let body = &insns[s..end_of(s)];
        frames.insert(s, (name_of(s), frame_of(body)));
        let mut out = BTreeSet::new();
        for (k, i) in body.iter().enumerate() {
            let pc = s + k;
            if i.code == BPF_CALL && i.src_reg() == BPF_PSEUDO_CALL {
                out.insert((pc as i64 + 1 + i64::from(i.imm)) as usize);
            }
            if i.code == BPF_CALL && i.src_reg() == 0 && i.imm == TAIL_CALL {
                tail_calls.insert(s);
            }
        }
        callees.insert(s, out);
    }
    // The deepest chain (the call graph of a verified program has no cycles).
    fn deepest(
        at: usize,
        frames: &BTreeMap<usize, (String, u32)>,
        callees: &BTreeMap<usize, BTreeSet<usize>>,
        seen: &mut Vec<usize>,
    ) -> (u32, Vec<usize>) {
        assert!(!seen.contains(&at), "recursion through subprogram {at}");
        seen.push(at);
        let own = rounded(frames[&at].1);
        let mut best = (0, Vec::new());
        for &c in &callees[&at] {
            let d = deepest(c, frames, callees, seen);
            if d.0 > best.0 {
                best = d;
            }
        }
        seen.pop();
        let mut chain = vec![at];
        chain.extend(best.1);
        (own + best.0, chain)
    }
    let (combined, chain) = deepest(0, &frames, &callees, &mut Vec::new());
    // Tail calls from a subprogram: the callers' frames above it, along every chain to it.
    let mut tail_call_too_deep = None;
    fn above(
        at: usize,
        target: usize,
        depth: u32,
        frames: &BTreeMap<usize, (String, u32)>,
        callees: &BTreeMap<usize, BTreeSet<usize>>,
    ) -> Option<u32> {
        if at == target {
            return Some(depth);
        }
        let depth = depth + rounded(frames[&at].1);
        callees[&at]
            .iter()
            .filter_map(|c| above(*c, target, depth, frames, callees))
            .max()
    }
    for &t in tail_calls.iter().filter(|t| **t != 0) {
        if let Some(d) = above(0, t, 0, &frames, &callees)
            && d >= TAIL_CALL_STACK
        {
            tail_call_too_deep = Some((frames[&t].0.clone(), d));
        }
    }
    ProgramStack {
        program: program.to_string(),
        deepest: chain.iter().map(|s| frames[s].0.clone()).collect(),
        frames,
        combined,
        tail_call_too_deep,
    }
}

/// The deepest stack address a subprogram's code forms: accesses through r10 and pointers made
/// as r10 plus a constant (then used with offsets, or passed to a helper as a key or buffer:
/// such an object lies above the pointer, so the pointer's depth bounds it).
fn frame_of(body: &[bpf_insn]) -> u32 {
    // Registers known to hold r10 + constant, within a straight run of code.
    let mut fp: [Option<i64>; 11] = [None; 11];
    fp[FP as usize] = Some(0);
    let mut deepest = 0i64;
    for i in body {
        let (class, dst, src) = (i.code & 7, i.dst_reg() as usize, i.src_reg() as usize);
        let off = i64::from(i.off);
        match class {
            // LDX: src is the base.
            1 if src < 11 => {
                if let Some(b) = fp[src] {
                    deepest = deepest.max(-(b + off));
                }
                if dst < 10 {
                    fp[dst] = None;
                }
            }
            // ST, STX: dst is the base.
            2 | 3 if dst < 11 => {
                if let Some(b) = fp[dst] {
                    deepest = deepest.max(-(b + off));
                }
                // An atomic fetch writes its source register.
                if class == 3 && i.code & 0xe0 == 0xc0 && src < 10 {
                    fp[src] = None;
                }
            }
            // ALU64: moves and constant adds keep a frame pointer's copy.
            7 if dst < 10 => {
                let op = i.code & 0xf0;
                let from_reg = i.code & 0x08 != 0;
                fp[dst] = match (op, from_reg) {
                    (0xb0, true) if src < 11 => fp[src],
                    (0x00, false) => fp[dst].map(|b| b + i64::from(i.imm)),
                    (0x10, false) => fp[dst].map(|b| b - i64::from(i.imm)),
                    _ => None,
                };
                if let Some(b) = fp[dst] {
                    deepest = deepest.max(-b);
                }
            }
            // Calls clobber r0-r5; jumps end a straight run (kept simple: the compiler forms
            // a stack address right before it is used).
            5 | 6 => {
                if i.code == BPF_CALL {
                    for r in fp.iter_mut().take(6) {
                        *r = None;
                    }
                }
            }
            _ => {
                if dst < 10 {
                    fp[dst] = None;
                }
            }
        }
    }
    deepest.max(0) as u32
}
