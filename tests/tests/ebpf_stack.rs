//! Every program of the objects lbd and the benches load fits the verifier's 512-byte stack
//! limit for a call chain, whatever kernel verifies it (see `lb_tests::xdp::stack`): a newer
//! kernel that happens to accept a deeper chain must not hide one an older kernel refuses.
//! No kernel needed: the check reads the compiled objects.
use aya_obj::generated::bpf_insn;
use lb_tests::xdp::stack::{MAX_STACK, analyse, program_stack, rounded};

fn check(object: &[u8], must_have: &[&str]) {
    let programs = analyse(object);
    for name in must_have {
        assert!(
            programs.iter().any(|p| p.program == *name),
            "the object has no program {name}"
        );
    }
    let mut problems = Vec::new();
    for p in &programs {
        println!("{:<24} {:>4} bytes: {}", p.program, p.combined, p.chain());
        if let Some(why) = p.problem() {
            problems.push(why);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_program_of_the_data_plane_fits_the_stack_limit_on_every_call_chain() {
    let object = lb_userspace::EBPF_OBJECT;
    assert!(
        !object.is_empty(),
        "lbd was built without its XDP program: run `cargo xtask setup`"
    );
    check(
        object,
        &[
            "lb_xdp",
            "lb_xdp_noted",
            "lb_decap",
            "lb_pass",
            "lb_sock_connect4",
            "lb_sock_sendmsg6",
        ],
    );
    // Not vacuous: the forwarding program has a frame of its own and calls subprograms.
    let lb = analyse(object)
        .into_iter()
        .find(|p| p.program == "lb_xdp")
        .unwrap();
    assert!(lb.frames[&0].1 > 0, "lb_xdp's frame was read as empty");
    assert!(
        lb.frames.len() > 1 && lb.deepest.len() > 1,
        "lb_xdp calls no subprogram: {lb:?}"
    );
}

#[test]
fn every_program_of_the_bench_object_fits_the_stack_limit() {
    assert!(!lb_userspace::BENCH_OBJECT.is_empty());
    check(lb_userspace::BENCH_OBJECT, &[]);
}

/// One instruction.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> bpf_insn {
    // SAFETY: a plain C struct of integers.
    let mut i: bpf_insn = unsafe { std::mem::zeroed() };
    i.code = code;
    i.set_dst_reg(dst);
    i.set_src_reg(src);
    i.off = off;
    i.imm = imm;
    i
}

/// `*(u64 *)(r10 + off) = r0`
fn st_fp(off: i16) -> bpf_insn {
    insn(0x7b, 10, 0, off, 0)
}

/// A call of the subprogram `imm + 1` instructions ahead.
fn call_rel(imm: i32) -> bpf_insn {
    insn(0x85, 0, 1, 0, imm)
}

fn exit() -> bpf_insn {
    insn(0x95, 0, 0, 0, 0)
}

/// `reg = r10; reg += add`
fn fp_ptr(reg: u8, add: i32) -> [bpf_insn; 2] {
    [insn(0xbf, reg, 10, 0, 0), insn(0x07, reg, 0, 0, add)]
}

/// The shape Debian 12's 6.1 verifier refused in lb_xdp: a 240-byte frame calling one of 272
/// bytes, 256 + 288 = 544 as the verifier rounds them.
#[test]
fn the_check_adds_frames_along_a_call_chain_as_the_verifier_does() {
    let [mov, add] = fp_ptr(2, -272);
    let insns = vec![
        st_fp(-240), // 0: main's frame, 240 bytes
        call_rel(1), // 1: call 3
        exit(),      // 2
        mov,         // 3: the subprogram forms r10 - 272 (a helper's buffer)
        add,         // 4
        st_fp(-8),   // 5
        exit(),      // 6
    ];
    let p = program_stack("main", &insns, |s| {
        if s == 0 {
            "main".into()
        } else {
            format!("sub{s}")
        }
    });
    assert_eq!(p.frames[&0].1, 240);
    assert_eq!(p.frames[&3].1, 272);
    assert_eq!((rounded(240), rounded(272)), (256, 288));
    assert_eq!(p.combined, 544);
    assert_eq!(p.deepest, ["main", "sub3"]);
    let why = p.problem().expect("544 bytes is over the limit");
    assert!(
        why.contains("combined stack size of 2 calls is 544"),
        "{why}"
    );
    assert!(p.combined > MAX_STACK);
    // The same two frames side by side (main calls one, then the other) fit.
    let insns = vec![
        st_fp(-200),
        call_rel(2),
        call_rel(3),
        exit(),
        st_fp(-256),
        exit(),
        st_fp(-64),
        exit(),
    ];
    let p = program_stack("main", &insns, |s| format!("f{s}"));
    assert_eq!(p.combined, 224 + 256);
    assert!(p.problem().is_none());
}
