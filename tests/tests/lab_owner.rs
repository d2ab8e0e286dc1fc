//! The owner loop under abuse: whatever a local process asks of the API, health and VRRP events
//! are handled. Needs root; `cargo xtask test`.

use std::time::Duration;

use lb_tests::{dsr, lab::wait_for};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

/// A log without its terminal colours.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn a_dead_backend_leaves_the_rotation_under_64_keep_alive_metrics_clients() {
    let mut l = dsr::setup(LABNODE);
    // 64 keep-alive clients on the LB node ask /metrics back to back (what any local process
    // may do: `metrics_listen` needs no credentials).
    l.lab.spawn(
        "lb",
        "load",
        LABNODE,
        &["http-loop", "127.0.0.1:9444", "/metrics", "64", "20"],
    );
    std::thread::sleep(Duration::from_secs(3));
    let b1 = l.lab.node("b1").v4.clone();
    l.lab.stop("server-b1", libc::SIGKILL);
    let seen = wait_for(Duration::from_secs(15), || {
        plain(&l.lab.log("lbd"))
            .lines()
            .any(|line| {
                line.contains("backend health changed")
                    && line.contains(&format!("backend={b1}"))
                    && line.contains("healthy=false")
            })
            .then_some(())
    });
    assert!(
        l.lab.wait("load", Duration::from_secs(30)).is_some(),
        "the load ends"
    );
    let load = l.lab.log("load");
    let answers = load
        .lines()
        .rev()
        .find_map(|x| serde_json::from_str::<serde_json::Value>(x).ok())
        .and_then(|v| v["answers"].as_u64())
        .unwrap_or(0);
    assert!(answers > 64, "the load was served: {load}");
    assert!(
        seen.is_some(),
        "the owner never handled b1's failure while /metrics was asked {answers} times\n{}",
        l.lab.log("lbd")
    );
    // And with the load gone, the API answers: b1 is out.
    let rows = l.backends().expect("lbctl backends list");
    assert!(
        rows.iter()
            .any(|r| r["backend"] == b1.as_str() && r["state"] != "active"),
        "{rows:?}"
    );
}
