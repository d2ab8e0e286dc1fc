//! lb-core stays without I/O: no crate of the async runtime, the BPF loader, netlink or the C
//! library's bindings is among its dependencies, direct or not (as Cargo resolves them for
//! lb-core alone, with the features lb-core asks for: lb-common brings aya only with `user`).

use std::process::Command;

/// Crates that do I/O (or exist to), which lb-core must never pull in.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "aya",
    "aya-log",
    "rtnetlink",
    "netlink-proto",
    "libc",
    "nix",
    "socket2",
    "mio",
];

/// The names of every crate lb-core depends on when built (normal and build dependencies).
fn dependencies() -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "lb-core",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{lib}",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or("").replace('_', "-"))
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn lb_core_depends_on_no_io_crate() {
    let deps = dependencies();
    // The listing is real: lb-core itself and its direct dependencies are in it.
    for expected in ["lb-core", "lb-common", "serde"] {
        assert!(
            deps.iter().any(|d| d == expected),
            "{expected} missing from {deps:?}"
        );
    }
    let bad: Vec<&String> = deps
        .iter()
        .filter(|d| FORBIDDEN.contains(&d.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "lb-core must stay without I/O, but depends on {bad:?} (see lb-core/src/lib.rs)"
    );
}
