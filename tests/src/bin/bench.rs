//! `cargo xtask bench [PART]`: see lb_tests::bench.
use lb_tests::bench;

fn main() {
    let part = std::env::args().nth(1).unwrap_or_else(|| "micro".into());
    let parts: &[(&str, fn())] = &[
        ("micro", bench::micro::run),
        ("insns", bench::insns::run),
        ("table", bench::table::run),
        ("throughput", bench::throughput::run),
        ("throughput-brex", bench::throughput_brex::run),
        ("detect", bench::detect::run),
        ("slowstart", bench::slowstart::run),
        ("e2e", bench::e2e::run),
        ("failover", bench::failover::run),
        ("scale", bench::scale::run),
        ("chaos", bench::chaos::run),
        ("sock", bench::sock::run),
        ("migrate", bench::migrate::run),
    ];
    let chosen: Vec<&(&str, fn())> = parts
        .iter()
        // `throughput-brex` needs Open vSwitch's datapath: `cargo xtask bench throughput-brex`
        // runs it in a VM, not in `all`.
        .filter(|(n, _)| (part == "all" && *n != "throughput-brex") || *n == part)
        .collect();
    if chosen.is_empty() {
        let names: Vec<&str> = parts.iter().map(|(n, _)| *n).collect();
        eprintln!(
            "bench: unknown part {part:?} (one of: {} | all)",
            names.join(" | ")
        );
        std::process::exit(2);
    }
    for (name, f) in chosen {
        println!("\n== bench {name}");
        f();
    }
}
