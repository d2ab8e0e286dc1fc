//! Project tasks. `cargo xtask setup | test | demo | fuzz-xdp | bench [PART]`.
//!
//! Everything a fresh machine of this project's kind needs is installed by `setup`, idempotently:
//! the nightly rust-src component, a bpf-linker linked against the nightly toolchain's own LLVM,
//! and the Debian packages the tests and the demo use. `test`, `demo` and `bench` run it first.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod debkernel;
mod vm;

#[derive(Parser)]
#[command(name = "xtask", about = "lb project tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the build and the tests need (idempotent; seconds when already done).
    Setup,
    /// Setup, then every test: unit tests, BPF_PROG_TEST_RUN tests, namespace labs, fuzzing.
    Test {
        /// Only tests whose name contains this (passed to the kernel/lab test binaries).
        filter: Option<String>,
        /// Skip the bounded fuzz run.
        #[arg(long)]
        no_fuzz: bool,
    },
    /// Setup, build, and run the demo lab (network namespaces; needs root).
    Demo,
    /// Setup, build, and run the forwarding-rule property test for longer than `test` does:
    /// mutated frames through the real XDP program, checked against a strict parser.
    FuzzXdp {
        /// Mutated frames to run.
        #[arg(long, default_value_t = 10_000_000)]
        frames: u64,
        /// Seed of the mutations (printed on failure, to replay it).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Build the container image (podman, from scratch: lbd, lbctl and their libraries only;
    /// nothing pulled). Writes target/image/<profile>/{image.txt, deploy/*.yaml}: the image
    /// reference by digest and the manifests pointing at it.
    Image {
        /// Package the debug binaries (what the tests use) instead of release ones.
        #[arg(long)]
        debug: bool,
    },
    /// Setup, build, and run the kernel matrix alone: the kernel tests in a VM on each
    /// distribution kernel under /boot (see docs/kernels.md).
    Kernels,
    /// Setup, build (release), and run benchmarks; JSON under target/bench/.
    Bench {
        /// micro | throughput | table | failover | detect | slowstart | e2e | insns | scale | chaos | sock | migrate | all;
        /// throughput-brex (generic on br-ex vs native below it, in the kernel matrix's VM)
        #[arg(default_value = "micro")]
        part: String,
    },
}

/// Debian packages used by the tests, the demo and the benchmarks.
const DEBIAN_PACKAGES: &[&str] = &[
    "iproute2",
    "iputils-arping",
    "ndisc6",
    "util-linux",
    "procps",
    "keepalived",
    "haproxy",
    "wrk",
    "tcpdump",
    // bench e2e (GRO for the owner-CPU phase, native mode) and bench throughput diagnostics.
    "ethtool",
    // `cargo xtask image` and the pod lab: podman with runc (crun fails on this machine kind's
    // hybrid cgroups, see tests/podman/containers.conf) and catatonit for the pod's infra
    // container; binutils strips the binaries that go into the image.
    "podman",
    "runc",
    "catatonit",
    "binutils",
    // BGP ECMP labs: the router and every LB node run FRR (zebra, bgpd, bfdd).
    "frr",
    // The chaos bench's partition: a bridge-family filter in the lab's switch namespace.
    "nftables",
    // The OpenShift-style check scripts of the keepalived labs and the migration rehearsal,
    // and the metrics scrapes of the operator labs.
    "curl",
    // deploy/lb-image-gate.sh (the pod lab runs it as shipped) reads lbd's stats with jq.
    "jq",
    // The monitoring lab: a real Prometheus scraping lbd, and promtool (same package in
    // bookworm) for the alert rules' unit tests.
    "prometheus",
    // The kernel matrix (xtask/src/vm.rs): Debian's kernel, booted in qemu by virtme-ng (from
    // PyPI), whose initramfs needs busybox.
    "qemu-system-x86",
    "busybox-static",
    "linux-image-amd64",
    // The br-ex lab (tests/lab_brex.rs, in the kernel matrix's guest): Open vSwitch's
    // userspace (ovsdb-server, ovs-vswitchd, ovs-vsctl, ovs-ofctl), run in a private directory
    // against the guest kernel's openvswitch module, as OVN-Kubernetes' br-ex.
    "openvswitch-switch",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cargo")
        })
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {:?}", cmd);
    let status = cmd.status().with_context(|| format!("spawn {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

fn step(name: &str) {
    eprintln!("\n== {name}");
}

fn setup() -> Result<()> {
    let t = Instant::now();
    step("setup: nightly rust-src");
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .unwrap_or_default();
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    } else {
        eprintln!("rust-src present");
    }

    step("setup: bpf-linker (against nightly's LLVM)");
    let linker = cargo_home().join("bin/bpf-linker");
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("the nightly toolchain is needed to build the XDP program")?;
    let lib = PathBuf::from(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .find(|n| n.starts_with("libLLVM") && n.contains(".so"))
        .with_context(|| format!("no libLLVM in {}", lib.display()))?;
    // bpf-linker links against this prefix and keeps an rpath to it, so the prefix must stay.
    // It holds the library under both names: libLLVM.so (to link) and its soname (to run).
    let prefix = cargo_home().join("lb-bpf-llvm");
    std::fs::create_dir_all(prefix.join("lib"))?;
    for name in ["libLLVM.so", llvm.as_str()] {
        let link = prefix.join("lib").join(name);
        if std::fs::read_link(&link).ok() != Some(lib.join(&llvm)) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(lib.join(&llvm), &link)?;
        }
    }
    let works = linker.exists() && output(Command::new(&linker).arg("--version")).is_some();
    if works {
        eprintln!("bpf-linker present");
    } else {
        let major = llvm
            .split(['-', '.'])
            .find_map(|p| p.parse::<u32>().ok())
            .unwrap_or(22);
        let install = |locked: bool| {
            let mut c = Command::new("cargo");
            c.args([
                "install",
                "bpf-linker",
                "--force",
                "--no-default-features",
                "--features",
            ])
            .arg(format!("llvm-{major}"))
            .env("LLVM_PREFIX", &prefix);
            if locked {
                c.arg("--locked");
            }
            run(&mut c)
        };
        install(true).or_else(|_| install(false))?;
    }

    step("setup: Debian packages");
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .map(|s| !s.contains("install ok installed"))
                .unwrap_or(true)
        })
        .collect();
    if missing.is_empty() {
        eprintln!("all present: {}", DEBIAN_PACKAGES.join(" "));
    } else {
        run(Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        // The packages just installed start their services; the labs start their own
        // instances, so disable the ones this run installed (through their unit, never by
        // process name: a host's own keepalived or haproxy is not ours to stop).
        for svc in ["keepalived", "haproxy", "frr", "openvswitch-switch"] {
            if missing.contains(&svc) {
                let _ = Command::new("systemctl")
                    .args(["disable", "--now", svc])
                    .status();
            }
        }
    }
    step("setup: the kernel matrix's kernels from Debian's other suites");
    debkernel::install(&root().join("target/vm"));
    step("setup: virtme-ng (the kernel matrix's VM runner)");
    vm::install_vng()?;
    eprintln!("setup done in {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn require_root() -> Result<()> {
    if unsafe { libc_geteuid() } != 0 {
        bail!("this needs root (XDP, BPF_PROG_TEST_RUN, network namespaces)");
    }
    Ok(())
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn test(filter: Option<String>, no_fuzz: bool) -> Result<()> {
    setup()?;
    require_root()?;
    let t = Instant::now();
    step("unit tests (default members: lb-common, lb-userspace, xtask)");
    run(cargo().args(["test"]))?;

    step("build lbd, lbctl and the test tools");
    run(cargo().args(["build", "-p", "lb-userspace", "--bins"]))?;
    run(cargo().args(["build", "-p", "lb-tests", "--bins"]))?;

    // The pod lab runs the manifests against an image of these debug binaries.
    image(true)?;

    step("kernel tests: BPF_PROG_TEST_RUN and network-namespace labs (root, one at a time)");
    let bin_dir = root().join("target/debug");
    let mut c = cargo();
    // Every lab runs even when one fails, so one failure does not hide the others.
    c.args([
        "test",
        "--no-fail-fast",
        "-p",
        "lb-tests",
        "--",
        "--test-threads=1",
    ]);
    if let Some(f) = &filter {
        c.arg(f);
    }
    run(c
        .env("LB_BIN_DIR", &bin_dir)
        .env("LB_IMAGE_DIR", image_dir(true)))?;

    // (Not for a filtered run: `cargo xtask kernels` runs the matrix alone.)
    if filter.is_none() {
        step("kernel matrix: the kernel tests in a VM on each distribution kernel");
        vm::matrix(&root(), cargo(), false)?;
    }

    if !no_fuzz && root().join("fuzz/Cargo.toml").exists() {
        step("bounded fuzz run of the VRRP decoder");
        fuzz()?;
    }
    eprintln!("\nall tests passed in {:.0}s", t.elapsed().as_secs_f64());
    Ok(())
}

fn fuzz() -> Result<()> {
    let have = output(Command::new("cargo").args(["fuzz", "--version"])).is_some();
    if !have {
        run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
            .or_else(|_| run(Command::new("cargo").args(["install", "cargo-fuzz"])))?;
    }
    let secs = std::env::var("LB_FUZZ_SECONDS").unwrap_or_else(|_| "30".into());
    run(Command::new("cargo")
        .current_dir(root().join("fuzz"))
        .args(["+nightly", "fuzz", "run", "vrrp_decode", "--"])
        .arg(format!("-max_total_time={secs}"))
        .env("LB_SKIP_EBPF", "1"))
}

fn tool(name: &str, release: bool) -> Result<PathBuf> {
    let mut c = cargo();
    c.args(["build", "-p", "lb-userspace", "--bins"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    let mut c = cargo();
    c.args(["build", "-p", "lb-tests", "--bins"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    Ok(root()
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join(name))
}

/// Where `cargo xtask image` puts its output for a profile.
fn image_dir(debug: bool) -> PathBuf {
    root()
        .join("target/image")
        .join(if debug { "debug" } else { "release" })
}

/// podman with this machine kind's settings, unless the caller chose a containers.conf.
fn podman() -> Command {
    let mut c = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        c.env(
            "CONTAINERS_CONF",
            root().join("tests/podman/containers.conf"),
        );
    }
    c
}

/// The shared libraries `bin` loads (absolute paths from ldd, including the loader).
fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out =
        output(Command::new("ldd").arg(bin)).with_context(|| format!("ldd {}", bin.display()))?;
    let mut libs = Vec::new();
    for line in out.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(PathBuf::from);
        if let Some(p) = path {
            libs.push(p);
        } else if line.contains("not found") {
            bail!("{}: {line}", bin.display());
        }
    }
    Ok(libs)
}

/// A CycloneDX SBOM of what `package` links: every crate reached from it through normal
/// dependencies (build scripts' and tests' crates are not in the binaries), by name, version and
/// package URL, from `cargo metadata`'s resolved graph. Pure: the caller runs cargo.
fn sbom(metadata: &serde_json::Value, package: &str) -> Result<serde_json::Value> {
    use std::collections::{BTreeMap, BTreeSet};
    let nodes: BTreeMap<&str, &serde_json::Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("metadata without resolve.nodes")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let packages: BTreeMap<&str, &serde_json::Value> = metadata["packages"]
        .as_array()
        .context("metadata without packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let root = packages
        .iter()
        .find(|(_, p)| p["name"] == package)
        .map(|(id, _)| *id)
        .with_context(|| format!("no package {package}"))?;
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for d in nodes
            .get(id)
            .and_then(|n| n["deps"].as_array())
            .into_iter()
            .flatten()
        {
            let normal = d["dep_kinds"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k["kind"].is_null()));
            if normal && let Some(pkg) = d["pkg"].as_str() {
                todo.push(pkg);
            }
        }
    }
    let component = |id: &str| {
        let p = packages[id];
        let (name, version) = (
            p["name"].as_str().unwrap_or(""),
            p["version"].as_str().unwrap_or(""),
        );
        let mut c = serde_json::json!({
            "type": if id == root { "application" } else { "library" },
            "bom-ref": id,
            "name": name,
            "version": version,
            "purl": format!("pkg:cargo/{name}@{version}"),
        });
        if let Some(l) = p["license"].as_str() {
            c["licenses"] = serde_json::json!([{"expression": l}]);
        }
        c
    };
    Ok(serde_json::json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {"component": component(root)},
        "components": seen.iter().filter(|id| **id != root).map(|id| component(id)).collect::<Vec<_>>(),
    }))
}

/// Build the image and the manifests that name it by digest. Returns the image reference.
fn image(debug: bool) -> Result<String> {
    setup()?;
    let t = Instant::now();
    step("image: build lbd and lbctl");
    let mut c = cargo();
    c.args(["build", "-p", "lb-userspace", "--bins"]);
    if !debug {
        c.arg("--release");
    }
    run(&mut c)?;
    let bins = root()
        .join("target")
        .join(if debug { "debug" } else { "release" });

    step("image: stage the root filesystem (binaries + the libraries ldd names)");
    let dir = image_dir(debug);
    let rootfs = dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    std::fs::create_dir_all(rootfs.join("usr/local/bin"))?;
    let mut libs = Vec::new();
    for name in ["lbd", "lbctl"] {
        let src = bins.join(name);
        // Debug info is for developers' machines, not for a node: strip it (10x smaller).
        run(Command::new("strip")
            .args(["--strip-debug", "-o"])
            .arg(rootfs.join("usr/local/bin").join(name))
            .arg(&src))?;
        libs.extend(libraries(&src)?);
    }
    libs.sort();
    libs.dedup();
    for lib in &libs {
        let dst = rootfs.join(lib.strip_prefix("/")?);
        std::fs::create_dir_all(dst.parent().unwrap())?;
        // Copy the file a symlink names, under the name the binaries ask for.
        std::fs::copy(lib, &dst).with_context(|| format!("copy {}", lib.display()))?;
    }
    step("image: SBOM of the crates in lbd and lbctl (CycloneDX, from cargo metadata)");
    let host = output(Command::new("rustc").arg("-vV"))
        .and_then(|v| {
            v.lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        })
        .context("rustc -vV")?;
    let meta = output(cargo().args([
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--filter-platform",
        &host,
    ]))
    .context("cargo metadata")?;
    let bom = serde_json::to_string_pretty(&sbom(&serde_json::from_str(&meta)?, "lb-userspace")?)?;
    // Next to the image for a pipeline, and in it for a scanner of the image.
    std::fs::write(dir.join("sbom.cdx.json"), &bom)?;
    std::fs::create_dir_all(rootfs.join("usr/share/sbom"))?;
    std::fs::write(rootfs.join("usr/share/sbom/lb.cdx.json"), &bom)?;
    // Mount points the manifests use, so the runtime never has to create them in the image.
    for d in ["etc/lb", "run/lbd", "sys/fs/bpf", "proc", "dev", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }

    step("image: podman build (FROM scratch, nothing pulled)");
    let tag = format!(
        "localhost/lb:{}-{}",
        env!("CARGO_PKG_VERSION"),
        if debug { "debug" } else { "release" }
    );
    run(podman()
        .args(["build", "--timestamp", "0", "--pull=never", "-f"])
        .arg(root().join("deploy/Containerfile"))
        .args(["-t", &tag])
        .arg(&dir))?;
    let inspect = |fmt: &str| {
        output(podman().args(["image", "inspect", "--format", fmt, &tag]))
            .map(|s| s.trim().to_string())
            .with_context(|| format!("podman image inspect {tag}"))
    };
    let digest = inspect("{{.Digest}}")?;
    let size: u64 = inspect("{{.Size}}")?.parse().context("image size")?;
    let reference = format!("localhost/lb@{digest}");
    std::fs::write(dir.join("image.txt"), format!("{reference}\n"))?;

    step("image: manifests naming the image by digest");
    let out = dir.join("deploy");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    for e in std::fs::read_dir(root().join("deploy"))? {
        let p = e?.path();
        if p.extension().and_then(|x| x.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&p)?;
        let rendered: Vec<String> = text
            .lines()
            .map(|l| match l.find("image: ") {
                Some(i) if l[..i].trim().is_empty() || l[..i].trim() == "-" => {
                    format!("{}image: {reference}", &l[..i])
                }
                _ => l.to_string(),
            })
            .collect();
        std::fs::write(out.join(p.file_name().unwrap()), rendered.join("\n") + "\n")?;
    }
    eprintln!(
        "\nimage {tag}\n  reference {reference}\n  size {:.1} MB ({} files: lbd, lbctl, {} libraries)\n  manifests {}\n  built in {:.0}s",
        size as f64 / 1e6,
        2 + libs.len(),
        libs.len(),
        out.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(reference)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Test { filter, no_fuzz } => test(filter, no_fuzz),
        Cmd::Demo => {
            setup()?;
            require_root()?;
            let demo = tool("demo", false)?;
            run(Command::new(demo).env("LB_BIN_DIR", root().join("target/debug")))
        }
        Cmd::FuzzXdp { frames, seed } => {
            setup()?;
            require_root()?;
            let fuzz = tool("xdpfuzz", false)?;
            run(Command::new(fuzz).args([
                "--frames",
                &frames.to_string(),
                "--seed",
                &seed.to_string(),
            ]))
        }
        Cmd::Kernels => {
            setup()?;
            require_root()?;
            tool("lbd", false)?;
            vm::matrix(&root(), cargo(), true)
        }
        Cmd::Image { debug } => image(debug).map(|r| println!("{r}")),
        // Open vSwitch's datapath is in the kernel matrix's kernels, not the lab kernel: in a
        // VM. Under software emulation only the ratio of its two cases means something, and what
        // it measures runs in the kernel (the generator is BPF_PROG_TEST_RUN): the debug build
        // the matrix uses serves.
        Cmd::Bench { part } if part == "throughput-brex" => {
            setup()?;
            require_root()?;
            let bench = tool("bench", false)?;
            vm::bench(&root(), &bench, &part)
        }
        Cmd::Bench { part } => {
            setup()?;
            require_root()?;
            let bench = tool("bench", true)?;
            std::fs::create_dir_all(root().join("target/bench"))?;
            run(Command::new(bench)
                .arg(&part)
                .env("LB_BIN_DIR", root().join("target/release"))
                .env("LB_BENCH_DIR", root().join("target/bench")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::root;

    /// The SBOM holds what the binaries link (normal dependencies, transitively) and not what
    /// only builds or tests them.
    #[test]
    fn sbom_follows_normal_dependencies_only() {
        let dep = |pkg: &str, kind: Option<&str>| serde_json::json!({"pkg": pkg, "dep_kinds": [{"kind": kind, "target": null}]});
        let pkg = |id: &str, name: &str| serde_json::json!({"id": id, "name": name, "version": "1.0.0", "license": "MIT"});
        let meta = serde_json::json!({
            "packages": [pkg("app", "lb-userspace"), pkg("a", "serde"), pkg("b", "itoa"),
                         pkg("c", "aya-build"), pkg("d", "rcgen")],
            "resolve": {"nodes": [
                {"id": "app", "deps": [dep("a", None), dep("c", Some("build")), dep("d", Some("dev"))]},
                {"id": "a", "deps": [dep("b", None)]},
                {"id": "b", "deps": []}, {"id": "c", "deps": []}, {"id": "d", "deps": []},
            ]},
        });
        let bom = super::sbom(&meta, "lb-userspace").unwrap();
        let names: Vec<&str> = bom["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["serde", "itoa"]);
        assert_eq!(bom["metadata"]["component"]["name"], "lb-userspace");
        assert_eq!(bom["components"][0]["purl"], "pkg:cargo/serde@1.0.0");
        assert!(super::sbom(&meta, "nope").is_err());
    }

    /// The tooling never stops processes by name (a host's own keepalived or haproxy would go
    /// too): labs and benches signal the pids they spawned.
    #[test]
    fn never_kills_processes_by_name() {
        // Built at run time so this file does not match itself.
        let needles = [["\"pk", "ill\""].concat(), ["\"kill", "all\""].concat()];
        let mut hits = Vec::new();
        for dir in ["xtask/src", "tests/src", "tests/tests", "lb-userspace/src"] {
            let mut stack = vec![root().join(dir)];
            while let Some(p) = stack.pop() {
                if p.is_dir() {
                    for e in std::fs::read_dir(&p).unwrap() {
                        stack.push(e.unwrap().path());
                    }
                } else if p.extension().is_some_and(|e| e == "rs" || e == "sh") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for n in &needles {
                        if text.contains(n.as_str()) {
                            hits.push(format!("{}: {n}", p.display()));
                        }
                    }
                }
            }
        }
        assert!(hits.is_empty(), "kills by process name: {hits:?}");
    }
}
