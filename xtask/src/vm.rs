//! The kernel matrix: the kernel tests again, in a VM, on each distribution kernel that setup
//! installs (Debian's `linux-image-amd64`, under /boot), with the host's files shared in
//! (virtme-ng's `vng`: the guest runs the test binaries built on the host as they are).
//!
//! The guest runs under KVM only where the host's KVM is a hardware one (the `kvm_intel` or
//! `kvm_amd` module, or `LB_VM_KVM=1`); on this machine kind /dev/kvm is `kvm_pvm`, which boots
//! only kernels built as PVM guests (a distribution kernel's boot code creeps there, emulated
//! instruction by instruction), so the guest runs under software emulation: slow (the verifier
//! alone takes seconds per program), which is why the guest runs a chosen set of test binaries
//! (`GUEST_TESTS`), not all of them, two tests at a time where they are independent.
//! docs/kernels.md holds the matrix and what each kernel ran.

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

/// Test binaries of lb-tests the guest runs: (name, tests at a time, arguments: filters and
/// options). Two at a time on the VM's two CPUs: each test loads a data plane of its own
/// (unique pins), and the verifier of one load runs on one CPU.
pub const GUEST_TESTS: &[(&str, u32, &[&str])] = &[
    // Every program of the object loads and attaches. `--show-output`: its `LBVM-INSNS` lines
    // (the verifier's counts) come out whole, each on a line of its own.
    ("kernel_load", 1, &["--show-output"]),
    // The forwarding rules through the kernel's BPF_PROG_TEST_RUN.
    ("xdp", 2, &[]),
    // Three flood tests need a flood faster than `syn_flood_rate` (10,000 misses a second), more
    // than BPF_PROG_TEST_RUN pushes under software emulation (about 4,400 to 12,000 a second,
    // by the load on the host): flood mode then does not hold, whatever the kernel. They run on
    // the lab kernel only.
    (
        "xdp_flood",
        2,
        &[
            "--skip",
            "idle_established_flows_survive_a_spoofed_syn_flood_of_ten_times_the_table",
            "--skip",
            "idle_established_flows_survive_a_spoofed_ack_flood_that_leaves_the_table_empty",
            "--skip",
            "the_flood_is_visible_next_to_the_table_size",
        ],
    ),
    ("xdp_flows", 2, &[]),
    // OVN-Kubernetes' br-ex (Open vSwitch with its shared-gateway flows, the VIP on the
    // bridge): VRRP failover, DSR to the other node, connections through the VIP's move, host
    // traffic, with the program on the uplink (native) and on br-ex (generic); then a node whose
    // br-ex port is a bond, the program on the bond, the VIP moving onto it and a member losing
    // its link under held connections. Needs the openvswitch module, which only the
    // distribution kernels have: ignored on the lab kernel. One lab at a time, two lbds each:
    // with three lbds in the guest at once lbctl read no state from any of them within 50 s
    // (under emulation, the host loaded by other work).
    ("lab_brex", 1, &["--include-ignored"]),
    // The VRRP lab on veths and a Linux bridge (only in `cargo xtask kernels`, see `LABS`).
    (
        "lab_vrrp",
        1,
        &[
            "lbd_crash_alone_does_not_interrupt_and_a_backup_takes_over",
            "--exact",
        ],
    ),
];

/// The tests of `GUEST_TESTS` that `cargo xtask test` leaves out (docs/kernels.md, "Not yet
/// shown"): `lab_vrrp`'s start-up waits (a master within 15 s) assume data planes that load in
/// seconds; under emulation three lbds load theirs for minutes and it fails before any
/// failover. `lab_brex` shows VRRP failover and DSR in the VM instead.
pub const LABS: &[&str] = &["lab_vrrp"];

/// The marker of a result line the guest script prints: `LBVM <test> <rc> <seconds>`.
const MARK: &str = "LBVM ";
/// The marker of the verifier's count for a program (`kernel_load` prints it):
/// `LBVM-INSNS <program> <instructions processed>`.
const INSNS: &str = "LBVM-INSNS ";

/// The kernels of the matrix besides the running one: (release, vmlinuz), oldest first. Those
/// the host's apt installs are under /boot; those of Debian's other suites under
/// `target/vm/kernels` (xtask/src/debkernel.rs).
pub fn kernels(root: &Path) -> Vec<(String, PathBuf)> {
    let running = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut found: Vec<(String, PathBuf)> = [
        PathBuf::from("/boot"),
        crate::debkernel::kernel_dir(&root.join("target/vm")),
    ]
    .iter()
    .filter_map(|dir| std::fs::read_dir(dir).ok())
    .flatten()
    .filter_map(|e| e.ok())
    .filter_map(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        let release = name.strip_prefix("vmlinuz-")?.to_string();
        (release != running.trim()).then(|| (release, e.path()))
    })
    .collect();
    found.sort_by_key(|(release, _)| version(release));
    found
}

/// The kernels of the matrix, or with `LB_VM_KERNELS=6.1,5.10` those whose release starts
/// with one of these; oldest first.
fn selected_kernels(root: &Path) -> Vec<(String, PathBuf)> {
    let only = std::env::var("LB_VM_KERNELS").ok();
    kernels(root)
        .into_iter()
        .filter(|(release, _)| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|k| release.starts_with(k.trim())))
        })
        .collect()
}

/// A release's leading numbers (`6.12.117+deb13-amd64` -> [6, 12, 117]), to order kernels
/// oldest first (`6.1` before `6.12`, `6.9` before `6.10`).
fn version(release: &str) -> Vec<u64> {
    release
        .split(|c: char| !c.is_ascii_digit())
        .take_while(|p| !p.is_empty())
        .map(|p| p.parse().unwrap_or(0))
        .collect()
}

/// What `cargo xtask test` runs on the kernels of the matrix after the oldest supported: every
/// program loads and attaches. The oldest supported (its verifier the strictest) runs all of
/// `GUEST_TESTS`;
/// `cargo xtask kernels` runs all of them on every kernel. (The whole set costs about 13
/// minutes a kernel under software emulation, more than CI's budget holds twice.)
pub const NEWER_KERNELS_IN_TEST: &[&str] = &["kernel_load"];

/// lb's oldest supported release (`lb_userspace::dataplane::kernel::oldest_supported`, checked
/// by `kernel_load`'s refusal test itself). A kernel of the matrix older than this runs only
/// that test: lbd must stop there, naming the kernel and the reason.
pub const OLDEST_SUPPORTED: [u64; 2] = [5, 12];
pub const REFUSAL_TEST: &str =
    "on_a_kernel_older_than_the_oldest_supported_lbd_stops_naming_the_kernel_and_the_reason";

/// virtme-ng from PyPI, if `vng` is missing.
pub fn install_vng() -> Result<()> {
    if crate::output(Command::new("vng").arg("--version")).is_some() {
        eprintln!("vng present");
        return Ok(());
    }
    crate::run(Command::new("pip").args(["install", "--quiet", "virtme-ng"]))
        .or_else(|_| crate::run(Command::new("pip3").args(["install", "--quiet", "virtme-ng"])))
        .context("install virtme-ng (vng) from PyPI")
}

/// One test binary the guest runs.
pub struct GuestTest {
    pub name: String,
    pub exe: PathBuf,
    pub threads: u32,
    pub args: Vec<String>,
}

/// Whether the guest runs under KVM: `LB_VM_KVM=1` or `0` decides; otherwise where the host's
/// KVM is a hardware one (`kvm_intel`, `kvm_amd`). A PVM host (`kvm_pvm`, this machine kind)
/// boots only kernels built as PVM guests: a distribution kernel creeps through its boot code
/// there (past "Probing EDD" its decompressor runs emulated, far slower than software
/// emulation), so the guest runs under software emulation.
fn hardware_kvm() -> bool {
    match std::env::var("LB_VM_KVM").ok().as_deref() {
        Some("1") => true,
        Some(_) => false,
        None => {
            Path::new("/dev/kvm").exists()
                && ["kvm_intel", "kvm_amd"]
                    .iter()
                    .any(|m| Path::new("/sys/module").join(m).exists())
        }
    }
}

/// One test binary's result in one kernel.
#[derive(Debug, serde::Serialize)]
pub struct Outcome {
    pub test: String,
    pub passed: bool,
    pub seconds: u64,
}

/// One kernel's run: its tests, what the verifier processed per program, the VM's whole time.
#[derive(Debug, serde::Serialize)]
pub struct KernelRun {
    pub kernel: String,
    pub tests: Vec<Outcome>,
    pub verified_insns: BTreeMap<String, u64>,
    pub vm_seconds: u64,
}

/// The guest's script: bpffs and cgroup2 mounted, then each test binary, one line of result
/// each.
fn guest_script(root: &Path, tests: &[&GuestTest]) -> String {
    let mut s = String::from(GUEST_SETUP);
    s += "# Software emulation: the labs' start-up waits scale (tests/src/labs/brex.rs).\n\
          export LB_TIME_SCALE=${LB_TIME_SCALE:-10}\n";
    s += &format!(
        "cd {}\nexport LB_BIN_DIR={}\necho \"kernel $(uname -r)\"\n",
        root.display(),
        root.join("target/debug").display()
    );
    for GuestTest {
        name,
        exe,
        threads,
        args,
    } in tests
    {
        s += &format!(
            "t0=$(date +%s); {} --test-threads={threads} {}; rc=$?; echo \"{MARK} {name} $rc $(( $(date +%s) - t0 ))\"\n",
            exe.display(),
            args.join(" ")
        );
    }
    s
}

/// The guest's set-up of a script: bpffs and cgroup2 mounted, locked memory unlimited.
const GUEST_SETUP: &str = "#!/bin/sh\n\
     # Written by `cargo xtask` for a VM (xtask/src/vm.rs).\n\
     mount -t bpf bpf /sys/fs/bpf 2>/dev/null\n\
     grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup\n\
     ulimit -l unlimited\n";

/// `vng` booting `vmlinuz` (the host's files shared in, read-only) to run `script` in the guest,
/// ended after LB_VM_TIMEOUT seconds (default an hour): a guest that hangs (a kernel that never
/// boots) must not hang the run.
fn vng(vmlinuz: &Path, script: &Path, cpus: u32) -> Command {
    let limit = std::env::var("LB_VM_TIMEOUT").unwrap_or_else(|_| "3600".into());
    let mut c = Command::new("timeout");
    c.arg(limit).arg("vng").arg("--run").arg(vmlinuz).args([
        "--memory",
        "2G",
        "--cpus",
        &cpus.to_string(),
    ]);
    if !hardware_kvm() {
        c.arg("--disable-kvm");
    }
    c.arg("--exec").arg(format!("sh {}", script.display()));
    c
}

/// `bench PART` in a VM on the newest kernel of the matrix, or the newest `LB_VM_KERNELS`
/// selects (`cargo xtask bench throughput-brex`: Open vSwitch's datapath, which the lab kernel
/// lacks). `bench` is the
/// bench binary; its JSON goes to target/bench (shared read-write into the guest).
pub fn bench(root: &Path, bench: &Path, part: &str) -> Result<()> {
    let Some((release, vmlinuz)) = selected_kernels(root).pop() else {
        bail!("no distribution kernel: `cargo xtask setup` installs them");
    };
    let out = root.join("target/bench");
    let dir = root.join("target/vm");
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&dir)?;
    let script = dir.join(format!("bench-{release}.sh"));
    std::fs::write(
        &script,
        format!(
            "{GUEST_SETUP}cd {}\necho \"kernel $(uname -r)\"\nLB_BIN_DIR={} LB_BENCH_DIR={} {} {part}\n",
            root.display(),
            root.join("target/debug").display(),
            out.display(),
            bench.display()
        ),
    )?;
    let mut c = vng(&vmlinuz, &script, 2);
    c.arg(format!("--rwdir={}", out.display()))
        .stdout(Stdio::piped());
    eprintln!("+ {c:?}");
    let mut child = c.spawn().context("run vng (virtme-ng)")?;
    // Through a pipe: qemu's console would truncate a file given as stdout.
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        println!("[{release}] {}", line?);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("bench {part} in the VM on {release}: {status}");
    }
    Ok(())
}

/// Boot `vmlinuz` with the host's files and run the tests there; the guest's output is shown
/// as it comes.
pub fn run_kernel(
    root: &Path,
    release: &str,
    vmlinuz: &Path,
    tests: &[&GuestTest],
    cpus: u32,
) -> Result<KernelRun> {
    let dir = root.join("target/vm");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join(format!("guest-{release}.sh"));
    std::fs::write(&script, guest_script(root, tests))?;
    // A guest that hangs (a kernel that never boots) must not hang the run: `timeout` ends
    // the VM it started (LB_VM_TIMEOUT seconds, default an hour).
    let mut c = vng(vmlinuz, &script, cpus);
    c.stdout(Stdio::piped());
    eprintln!("+ {c:?}");
    let t = Instant::now();
    let mut child = c.spawn().context("run vng (virtme-ng)")?;
    let mut outcomes = Vec::new();
    let mut verified_insns = BTreeMap::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line?;
        println!("[{release}] {line}");
        if let Some(rest) = line.strip_prefix(INSNS) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let [program, n] = f[..] {
                verified_insns.insert(program.to_string(), n.parse().unwrap_or(0));
            }
        }
        if let Some(rest) = line.strip_prefix(MARK) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let [test, rc, secs] = f[..] {
                outcomes.push(Outcome {
                    test: test.to_string(),
                    passed: rc == "0",
                    seconds: secs.parse().unwrap_or(0),
                });
            }
        }
    }
    let status = child.wait()?;
    eprintln!(
        "{release}: VM done in {:.0}s ({status})",
        t.elapsed().as_secs_f64()
    );
    for GuestTest { name, .. } in tests {
        if !outcomes.iter().any(|o| &o.test == name) {
            outcomes.push(Outcome {
                test: name.clone(),
                passed: false,
                seconds: 0,
            });
        }
    }
    Ok(KernelRun {
        kernel: release.to_string(),
        tests: outcomes,
        verified_insns,
        vm_seconds: t.elapsed().as_secs(),
    })
}

/// The test binaries of lb-tests by target name, as cargo built them.
pub fn test_executables(mut cargo: Command) -> Result<HashMap<String, PathBuf>> {
    let out = cargo
        .args([
            "test",
            "-p",
            "lb-tests",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the kernel tests failed");
    }
    let mut found = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(m) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if m["reason"] == "compiler-artifact"
            && m["target"]["kind"][0] == "test"
            && let Some(exe) = m["executable"].as_str()
        {
            let name = m["target"]["name"].as_str().unwrap_or_default().to_string();
            found.insert(name, PathBuf::from(exe));
        }
    }
    Ok(found)
}

/// Every kernel of the matrix: boot, run `GUEST_TESTS`, and write `target/vm/matrix.json`.
/// Fails if any test failed in any kernel, or if there is no kernel to run.
pub fn matrix(root: &Path, cargo: Command, with_lab: bool) -> Result<()> {
    let kernels = selected_kernels(root);
    if kernels.is_empty() {
        bail!("no distribution kernel under /boot: `cargo xtask setup` installs linux-image-amd64");
    }
    let exes = test_executables(cargo)?;
    // LB_VM_TESTS=kernel_load,xdp: only these of GUEST_TESTS (a quicker look at one kernel).
    let only = std::env::var("LB_VM_TESTS").ok();
    let tests: Vec<GuestTest> = GUEST_TESTS
        .iter()
        .filter(|(name, _, _)| with_lab || !LABS.contains(name))
        .filter(|(name, _, _)| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|n| n.trim() == *name))
        })
        .map(|(name, threads, args)| {
            let exe = exes
                .get(*name)
                .with_context(|| format!("no test binary {name}"))?;
            Ok(GuestTest {
                name: name.to_string(),
                exe: exe.clone(),
                threads: *threads,
                args: args.iter().map(|a| a.to_string()).collect(),
            })
        })
        .collect::<Result<_>>()?;
    // The oldest supported kernel runs everything (its verifier the strictest).
    let oldest = self::kernels(root)
        .into_iter()
        .map(|(release, _)| release)
        .find(|r| version(r) >= OLDEST_SUPPORTED.to_vec())
        .unwrap_or_default();
    let refusal = GuestTest {
        name: "kernel_load".into(),
        exe: exes
            .get("kernel_load")
            .context("no test binary kernel_load")?
            .clone(),
        threads: 1,
        args: ["--ignored", "--exact", "--show-output", REFUSAL_TEST]
            .map(String::from)
            .to_vec(),
    };
    let whole = |release: &str| with_lab || release == oldest;
    let these = |release: &str| -> Vec<&GuestTest> {
        if version(release) < OLDEST_SUPPORTED.to_vec() {
            vec![&refusal]
        } else {
            tests
                .iter()
                .filter(|t| whole(release) || NEWER_KERNELS_IN_TEST.contains(&t.name.as_str()))
                .collect()
        }
    };
    // Kernels that run every test: one at a time, two CPUs each (two tests at a time).
    let mut all = Vec::new();
    for (release, vmlinuz) in kernels.iter().filter(|(r, _)| whole(r)) {
        all.push(run_kernel(root, release, vmlinuz, &these(release), 2)?);
    }
    // The others run one short test binary each, mostly the VM's boot (one emulated CPU's
    // work): side by side, a CPU each.
    let quick: Vec<Result<KernelRun>> = std::thread::scope(|scope| {
        let runs: Vec<_> = kernels
            .iter()
            .filter(|(r, _)| !whole(r))
            .map(|(release, vmlinuz)| {
                let tests = these(release);
                scope.spawn(move || run_kernel(root, release, vmlinuz, &tests, 1))
            })
            .collect();
        runs.into_iter()
            .map(|h| h.join().expect("a VM's thread"))
            .collect()
    });
    for run in quick {
        all.push(run?);
    }
    std::fs::write(
        root.join("target/vm/matrix.json"),
        serde_json::to_string_pretty(&all)?,
    )?;
    println!("\n{:<24} {:<12} {:>8}  result", "kernel", "test", "seconds");
    let mut failed = Vec::new();
    for k in &all {
        for o in &k.tests {
            println!(
                "{:<24} {:<12} {:>8}  {}",
                k.kernel,
                o.test,
                o.seconds,
                if o.passed { "ok" } else { "FAILED" }
            );
            if !o.passed {
                failed.push(format!("{} on {}", o.test, k.kernel));
            }
        }
        println!(
            "{:<24} the VM took {} s; the verifier processed {:?} instructions",
            k.kernel, k.vm_seconds, k.verified_insns
        );
    }
    if !failed.is_empty() {
        bail!("kernel matrix: {} failed", failed.join(", "));
    }
    Ok(())
}
