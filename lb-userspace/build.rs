//! Builds the XDP program (lb-ebpf) with aya-build and puts the object in OUT_DIR/lb.
//!
//! The eBPF build needs the nightly toolchain's rust-src and bpf-linker, which `cargo xtask setup`
//! installs. Without them (e.g. a plain `cargo test` on a machine that never ran setup) we write
//! an empty object instead and say so: the pure-logic tests still run, and loading the program at
//! run time fails with an error that names the missing setup step.
use std::{env, fs, path::PathBuf};

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR")?).join("lb");
    println!("cargo:rerun-if-env-changed=LB_SKIP_EBPF");
    let have_linker = which("bpf-linker");
    if env::var_os("LB_SKIP_EBPF").is_some() || !have_linker {
        println!(
            "cargo:warning=bpf-linker not found (or LB_SKIP_EBPF set): building lbd without the XDP program; run `cargo xtask setup`"
        );
        fs::write(&out, b"")?;
        fs::write(out.with_file_name("lb-bench"), b"")?;
        println!("cargo:rerun-if-changed=../lb-ebpf/src");
        // Build again once setup has installed the linker.
        let home = env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
        if let Some(home) = home {
            println!(
                "cargo:rerun-if-changed={}",
                home.join("bin/bpf-linker").display()
            );
        }
        return Ok(());
    }
    // aya-build watches lb-ebpf only; the program is built from lb-common too.
    println!("cargo:rerun-if-changed=../lb-common/src");
    let package = aya_build::Package {
        name: "lb-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../lb-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}

fn which(name: &str) -> bool {
    env::var_os("PATH")
        .map(|p| env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}
