//! A small eBPF interpreter that runs an XDP program of our object on one frame and counts what
//! it executes, by kind: the basis of `bench insns` (instructions per path, and where they go).
//!
//! It runs the code as compiled and linked (aya-obj's relocations, before the kernel verifier's
//! rewrites), against a copy-on-read snapshot of the real maps: every map read is answered from
//! the kernel's map the first time and kept in an overlay after that; writes go to the overlay
//! only. The caller checks the verdict and output frame against the kernel's own run.
//!
//! Addresses are (region << 32 | offset): regions are the context, the packet, stack frames and
//! map values; a map pointer is its own region kind.
use std::collections::{BTreeMap, HashMap};

use aya_obj::generated::bpf_insn;

/// Where the program's maps come from: `lookup` answers a read of a key the overlay has not
/// seen (None: absent). Array maps answer every index below their size.
pub trait MapSource {
    fn lookup(&mut self, map: u32, key: &[u8]) -> Option<Vec<u8>>;
}

#[derive(Clone, Debug)]
pub struct MapDef {
    pub name: String,
    pub key_size: usize,
    pub value_size: usize,
}

/// What one run executed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Profile {
    /// Instructions executed (a 64-bit immediate load counts once).
    pub total: u64,
    /// Executed inside each called function (memcpy, memset, ... or a non-inlined Rust fn).
    pub in_function: BTreeMap<String, u64>,
    /// One-byte loads and stores (packet, stack or map memory).
    pub byte_accesses: u64,
    /// Of those, in packet memory, on the stack, in map values.
    pub byte_packet: u64,
    pub byte_stack: u64,
    pub byte_map: u64,
    /// Loads from and stores to the stack (spills, fills, and keys built on the stack).
    pub stack_loads: u64,
    pub stack_stores: u64,
    /// 64-bit division or modulus.
    pub div_mod_64: u64,
    /// 32-bit division or modulus.
    pub div_mod_32: u64,
    /// Helper calls by name (map lookups by map name).
    pub helpers: BTreeMap<String, u64>,
    /// bpf-to-bpf calls.
    pub calls: u64,
    pub verdict: u32,
}

const R_CTX: u64 = 1;
const R_PKT: u64 = 2;
const R_MAP: u64 = 3;
const R_RO: u64 = 4;
const R_STACK: u64 = 16;
const R_VALUE: u64 = 64;
const STACK: usize = 512;

fn addr(region: u64, off: u64) -> u64 {
    (region << 32) | off
}

pub struct Interp<'a> {
    prog: &'a [bpf_insn],
    /// Functions of the object by their first instructions, to name call targets.
    functions: &'a [(String, Vec<bpf_insn>)],
    maps: &'a [MapDef],
    /// Read-only data of `.rodata`-like maps by map index.
    rodata: &'a HashMap<u32, Vec<u8>>,
    source: &'a mut dyn MapSource,
    values: Vec<Vec<u8>>,
    overlay: HashMap<(u32, Vec<u8>), Option<usize>>,
    ctx: Vec<u8>,
    pub packet: Vec<u8>,
    stacks: Vec<Vec<u8>>,
    /// Times each instruction ran in the last `run`.
    pub hits: Vec<u64>,
}

fn insn_is_same(a: &bpf_insn, b: &bpf_insn) -> bool {
    a.code == b.code && a.dst_reg() == b.dst_reg() && a.src_reg() == b.src_reg() && a.off == b.off
}

impl<'a> Interp<'a> {
    pub fn new(
        prog: &'a [bpf_insn],
        functions: &'a [(String, Vec<bpf_insn>)],
        maps: &'a [MapDef],
        rodata: &'a HashMap<u32, Vec<u8>>,
        source: &'a mut dyn MapSource,
        packet: &[u8],
    ) -> Self {
        let mut ctx = vec![0u8; 24];
        ctx[12..16].copy_from_slice(&1u32.to_le_bytes());
        Interp {
            prog,
            functions,
            maps,
            rodata,
            source,
            values: Vec::new(),
            overlay: HashMap::new(),
            ctx,
            packet: packet.to_vec(),
            stacks: Vec::new(),
            hits: vec![0; prog.len()],
        }
    }

    fn mem(&mut self, a: u64, len: usize) -> Result<&mut [u8], String> {
        let (region, off) = (a >> 32, (a & 0xffff_ffff) as usize);
        let buf: &mut Vec<u8> = match region {
            R_CTX => &mut self.ctx,
            R_PKT => &mut self.packet,
            r if (R_STACK..R_VALUE).contains(&r) => self
                .stacks
                .get_mut((r - R_STACK) as usize)
                .ok_or("stale stack pointer")?,
            r if r >= R_VALUE => self
                .values
                .get_mut((r - R_VALUE) as usize)
                .ok_or("bad map value pointer")?,
            _ => return Err(format!("access to {a:#x}")),
        };
        buf.get_mut(off..off + len)
            .ok_or_else(|| format!("out of bounds: region {region} offset {off} len {len}"))
    }

    fn load(&mut self, a: u64, size: usize) -> Result<u64, String> {
        if a >> 32 == R_CTX && size == 4 {
            // xdp_md: data, data_end and data_meta read as packet pointers (no metadata: a
            // frame from the wire).
            match a & 0xffff_ffff {
                0 | 8 => return Ok(addr(R_PKT, 0)),
                4 => return Ok(addr(R_PKT, self.packet.len() as u64)),
                _ => {}
            }
        }
        if a >> 32 == R_RO {
            let map = ((a >> 20) & 0xfff) as u32;
            let off = (a & 0xf_ffff) as usize;
            let d = &self.rodata[&map];
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(&d[off..off + size]);
            return Ok(u64::from_le_bytes(b));
        }
        let m = self.mem(a, size)?;
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(m);
        Ok(u64::from_le_bytes(b))
    }

    fn store(&mut self, a: u64, size: usize, v: u64) -> Result<(), String> {
        let m = self.mem(a, size)?;
        m.copy_from_slice(&v.to_le_bytes()[..size]);
        Ok(())
    }

    fn map_of(&self, p: u64) -> Result<u32, String> {
        if p >> 32 != R_MAP {
            return Err(format!("not a map pointer: {p:#x}"));
        }
        Ok((p & 0xffff_ffff) as u32)
    }

    fn lookup(&mut self, map: u32, key: Vec<u8>) -> Option<usize> {
        if let Some(v) = self.overlay.get(&(map, key.clone())) {
            return *v;
        }
        let slot = self.source.lookup(map, &key).map(|mut v| {
            v.resize(self.maps[map as usize].value_size, 0);
            self.values.push(v);
            self.values.len() - 1
        });
        self.overlay.insert((map, key), slot);
        slot
    }

    fn helper(&mut self, id: i32, r: &[u64; 11], p: &mut Profile) -> Result<u64, String> {
        let name = match id {
            1..=3 => {
                let map = self.map_of(r[1])?;
                let def = self.maps[map as usize].clone();
                let key = self.mem(r[2], def.key_size)?.to_vec();
                let verb =
                    ["", "map_lookup_elem", "map_update_elem", "map_delete_elem"][id as usize];
                *p.helpers
                    .entry(format!("{verb}({})", def.name))
                    .or_default() += 1;
                return Ok(match id {
                    1 => self
                        .lookup(map, key)
                        .map(|i| addr(R_VALUE + i as u64, 0))
                        .unwrap_or(0),
                    2 => {
                        let v = self.mem(r[3], def.value_size)?.to_vec();
                        let slot = match self.lookup(map, key.clone()) {
                            Some(i) => {
                                self.values[i] = v;
                                i
                            }
                            None => {
                                self.values.push(v);
                                self.values.len() - 1
                            }
                        };
                        self.overlay.insert((map, key), Some(slot));
                        0
                    }
                    _ => {
                        self.overlay.insert((map, key), None);
                        0
                    }
                });
            }
            8 => "get_smp_processor_id",
            7 => {
                *p.helpers.entry("get_prandom_u32".into()).or_default() += 1;
                return Ok(4);
            }
            // Clocks: the real ones, so time-window logic (SYN flood rate) runs as in the
            // kernel.
            5 | 160 => {
                let name = if id == 5 {
                    "ktime_get_ns"
                } else {
                    "ktime_get_coarse_ns"
                };
                *p.helpers.entry(name.into()).or_default() += 1;
                let clock = if id == 5 {
                    libc::CLOCK_MONOTONIC
                } else {
                    libc::CLOCK_MONOTONIC_COARSE
                };
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                unsafe { libc::clock_gettime(clock, &mut ts) };
                return Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            23 => {
                *p.helpers.entry("redirect".into()).or_default() += 1;
                return Ok(4);
            }
            51 => {
                *p.helpers.entry("redirect_map".into()).or_default() += 1;
                return Ok(4);
            }
            25 => "perf_event_output",
            130 => "ringbuf_output",
            131 => "ringbuf_reserve",
            _ => return Err(format!("helper {id} not emulated")),
        };
        *p.helpers.entry(name.into()).or_default() += 1;
        Ok(0)
    }

    fn function_name(&self, pc: usize) -> String {
        for (name, body) in self.functions {
            let n = body.len().min(6);
            if n > 0
                && pc + n <= self.prog.len()
                && (0..n).all(|i| insn_is_same(&self.prog[pc + i], &body[i]))
            {
                return name.clone();
            }
        }
        format!("fn@{pc}")
    }

    /// Run the program from its first instruction; returns what it executed.
    pub fn run(&mut self, limit: u64) -> Result<Profile, String> {
        let mut p = Profile::default();
        let mut r = [0u64; 11];
        self.stacks = vec![vec![0; STACK]];
        r[1] = addr(R_CTX, 0);
        r[10] = addr(R_STACK, STACK as u64);
        // Call frames: (return pc, saved r6-r9, function name).
        let mut frames: Vec<(usize, [u64; 4], String)> = Vec::new();
        let mut pc = 0usize;
        loop {
            let i = *self.prog.get(pc).ok_or("pc out of range")?;
            p.total += 1;
            self.hits[pc] += 1;
            if let Some((_, _, f)) = frames.last() {
                *p.in_function.entry(f.clone()).or_default() += 1;
            }
            if p.total > limit {
                return Err("instruction limit".into());
            }
            let (code, dst, src) = (i.code, i.dst_reg() as usize, i.src_reg() as usize);
            let (off, imm) = (i.off as i64, i.imm as i64);
            let class = code & 7;
            pc += 1;
            match class {
                0 => {
                    // ld_imm64 (the only LD left in eBPF).
                    let next = self.prog[pc];
                    pc += 1;
                    r[dst] = match src {
                        0 => (i.imm as u32 as u64) | ((next.imm as u32 as u64) << 32),
                        1 => addr(R_MAP, i.imm as u32 as u64),
                        2 => addr(R_RO, ((i.imm as u64 & 0xfff) << 20) | next.imm as u64),
                        _ => return Err(format!("ld_imm64 src {src}")),
                    };
                }
                1..=3 => {
                    let size = [4, 2, 1, 8][((code >> 3) & 3) as usize];
                    let mode = code & 0xe0;
                    if size == 1 {
                        p.byte_accesses += 1;
                        let base = if class == 1 { r[src] } else { r[dst] };
                        match base >> 32 {
                            R_PKT => p.byte_packet += 1,
                            r if (R_STACK..R_VALUE).contains(&r) => p.byte_stack += 1,
                            r if r >= R_VALUE => p.byte_map += 1,
                            _ => {}
                        }
                    }
                    if class == 1 {
                        if src == 10 {
                            p.stack_loads += 1;
                        }
                        let v = self.load(r[src].wrapping_add(off as u64), size)?;
                        r[dst] = if mode == 0x80 {
                            // Sign-extending load.
                            let sh = 64 - 8 * size as u32;
                            (((v << sh) as i64) >> sh) as u64
                        } else {
                            v
                        };
                    } else {
                        if dst == 10 {
                            p.stack_stores += 1;
                        }
                        let a = r[dst].wrapping_add(off as u64);
                        let v = if class == 2 { imm as u64 } else { r[src] };
                        if mode == 0xc0 {
                            // Atomic: add (and fetch-add) are what counters use.
                            let old = self.load(a, size)?;
                            match imm & !1 {
                                0x00 => self.store(a, size, old.wrapping_add(v))?,
                                0x40 => self.store(a, size, old | v)?,
                                0x50 => self.store(a, size, old & v)?,
                                0xa0 => self.store(a, size, old ^ v)?,
                                _ => return Err(format!("atomic op {imm:#x}")),
                            }
                            if imm & 1 != 0 {
                                r[src] = old;
                            }
                        } else {
                            self.store(a, size, v)?;
                        }
                    }
                }
                4 | 7 => {
                    let wide = class == 7;
                    let op = code & 0xf0;
                    let b = if code & 8 != 0 { r[src] } else { imm as u64 };
                    let a = r[dst];
                    if op == 0x30 || op == 0x90 {
                        if wide {
                            p.div_mod_64 += 1;
                        } else {
                            p.div_mod_32 += 1;
                        }
                    }
                    let v = if op == 0xd0 && !wide {
                        // BPF_END: to big endian (source bit set) swaps, to little endian
                        // (a no-op on this host) truncates.
                        let be = code & 8 != 0;
                        match (imm, be) {
                            (16, true) => (a as u16).swap_bytes() as u64,
                            (32, true) => (a as u32).swap_bytes() as u64,
                            (64, true) => a.swap_bytes(),
                            (16, false) => a & 0xffff,
                            (32, false) => a & 0xffff_ffff,
                            _ => a,
                        }
                    } else if wide {
                        alu64(op, a, b, off, imm)?
                    } else {
                        alu32(op, a as u32, b as u32, off)? as u64
                    };
                    r[dst] = v;
                }
                5 | 6 => {
                    let op = code & 0xf0;
                    match op {
                        0x80 => {
                            if src == 1 {
                                // bpf-to-bpf call.
                                p.calls += 1;
                                let target = (pc as i64 + imm) as usize;
                                frames.push((
                                    pc,
                                    [r[6], r[7], r[8], r[9]],
                                    self.function_name(target),
                                ));
                                self.stacks.push(vec![0; STACK]);
                                r[10] = addr(R_STACK + self.stacks.len() as u64 - 1, STACK as u64);
                                pc = target;
                            } else {
                                r[0] = self.helper(i.imm, &r, &mut p)?;
                            }
                            continue;
                        }
                        0x90 => match frames.pop() {
                            None => {
                                p.verdict = r[0] as u32;
                                return Ok(p);
                            }
                            Some((ret, saved, _)) => {
                                self.stacks.pop();
                                r[6..10].copy_from_slice(&saved);
                                r[10] = addr(R_STACK + self.stacks.len() as u64 - 1, STACK as u64);
                                pc = ret;
                                continue;
                            }
                        },
                        0x00 => {
                            pc = if class == 6 {
                                (pc as i64 + imm) as usize
                            } else {
                                (pc as i64 + off) as usize
                            };
                            continue;
                        }
                        _ => {}
                    }
                    let b = if code & 8 != 0 { r[src] } else { imm as u64 };
                    let (a, b) = if class == 6 {
                        (r[dst] as u32 as u64, b as u32 as u64)
                    } else {
                        (r[dst], b)
                    };
                    let (sa, sb) = if class == 6 {
                        (a as u32 as i32 as i64, b as u32 as i32 as i64)
                    } else {
                        (a as i64, b as i64)
                    };
                    let taken = match op {
                        0x10 => a == b,
                        0x20 => a > b,
                        0x30 => a >= b,
                        0x40 => a & b != 0,
                        0x50 => a != b,
                        0x60 => sa > sb,
                        0x70 => sa >= sb,
                        0xa0 => a < b,
                        0xb0 => a <= b,
                        0xc0 => sa < sb,
                        0xd0 => sa <= sb,
                        _ => return Err(format!("jump op {op:#x}")),
                    };
                    if taken {
                        pc = (pc as i64 + off) as usize;
                    }
                }
                _ => return Err(format!("opcode {code:#x}")),
            }
        }
    }
}

fn alu64(op: u8, a: u64, b: u64, off: i64, imm: i64) -> Result<u64, String> {
    Ok(match op {
        0x00 => a.wrapping_add(b),
        0x10 => a.wrapping_sub(b),
        0x20 => a.wrapping_mul(b),
        0x30 if off == 1 => (a as i64).checked_div(b as i64).unwrap_or(0) as u64,
        0x30 => a.checked_div(b).unwrap_or(0),
        0x40 => a | b,
        0x50 => a & b,
        0x60 => a.wrapping_shl(b as u32 & 63),
        0x70 => a.wrapping_shr(b as u32 & 63),
        0x80 => (a as i64).wrapping_neg() as u64,
        0x90 if off == 1 => (a as i64).checked_rem(b as i64).unwrap_or(a as i64) as u64,
        0x90 => a.checked_rem(b).unwrap_or(a),
        0xa0 => a ^ b,
        0xb0 => match off {
            8 => b as i8 as i64 as u64,
            16 => b as i16 as i64 as u64,
            32 => b as i32 as i64 as u64,
            _ => b,
        },
        0xc0 => ((a as i64) >> (b & 63)) as u64,
        0xd0 => match imm {
            16 => (a as u16).swap_bytes() as u64,
            32 => (a as u32).swap_bytes() as u64,
            _ => a.swap_bytes(),
        },
        _ => return Err(format!("alu64 op {op:#x}")),
    })
}

fn alu32(op: u8, a: u32, b: u32, off: i64) -> Result<u32, String> {
    Ok(match op {
        0x00 => a.wrapping_add(b),
        0x10 => a.wrapping_sub(b),
        0x20 => a.wrapping_mul(b),
        0x30 if off == 1 => (a as i32).checked_div(b as i32).unwrap_or(0) as u32,
        0x30 => a.checked_div(b).unwrap_or(0),
        0x40 => a | b,
        0x50 => a & b,
        0x60 => a.wrapping_shl(b & 31),
        0x70 => a.wrapping_shr(b & 31),
        0x80 => (a as i32).wrapping_neg() as u32,
        0x90 if off == 1 => (a as i32).checked_rem(b as i32).unwrap_or(a as i32) as u32,
        0x90 => a.checked_rem(b).unwrap_or(a),
        0xa0 => a ^ b,
        0xb0 => match off {
            8 => b as i8 as i32 as u32,
            16 => b as i16 as i32 as u32,
            _ => b,
        },
        0xc0 => ((a as i32) >> (b & 31)) as u32,
        _ => return Err(format!("alu32 op {op:#x}")),
    })
}
