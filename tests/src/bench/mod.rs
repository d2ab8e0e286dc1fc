//! Benchmarks behind `cargo xtask bench`: each part prints a table and writes JSON under
//! target/bench/ (LB_BENCH_DIR). Ratios are measured in one run against a baseline.

pub mod chaos;
pub mod detect;
pub mod e2e;
mod e2e_owner;
mod e2e_report;
pub mod failover;
pub mod insns;
mod interp;
pub(crate) mod live;
pub mod micro;
pub mod migrate;
pub mod scale;
pub mod slowstart;
pub mod sock;
pub mod table;
pub mod throughput;
pub mod throughput_brex;

use std::path::PathBuf;

pub fn out_dir() -> PathBuf {
    let d = std::env::var_os("LB_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| "target/bench".into());
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Write `doc` as pretty JSON to `<out_dir>/<name>.json` and say so.
pub fn write_json(name: &str, doc: &serde_json::Value) {
    let path = out_dir().join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(doc).unwrap()).unwrap();
    println!("wrote {}", path.display());
}
