//! `[sync]` on reload and key rotation (issue 31): two lbd nodes syncing; each step rewrites
//! one node's config (renamed over it, as the MCO writes files) and lbd reloads it in place.
//! Rotating the cluster key in three steps (accept the new key; sign with it, accept the old;
//! drop the old), one node at a time, never makes a node refuse the other's datagrams; a
//! rotation without the overlap does, which shows the check can fail. Needs root;
//! `cargo xtask test`. Cost: about 25 s.

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use lb_tests::{
    lab::wait_for,
    vrrp_lab::{NodeOpts, VrrpLab},
};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn sync(l: &VrrpLab, i: usize) -> Value {
    l.lbctl(i, &["stats"])
        .map(|v| v["sync"].clone())
        .unwrap_or(Value::Null)
}

fn n(v: &Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0)
}

fn key(l: &VrrpLab, name: &str, fill: char) -> String {
    let p = l.lab.dir.join(name);
    std::fs::write(&p, format!("{}\n", fill.to_string().repeat(40))).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// Node `i`'s config with `[sync]` signing with `sign` and accepting `accept` besides.
fn config(l: &VrrpLab, i: usize, sign: &str, accept: &[&str]) -> String {
    let peer = l.addr(&l.nodes[1 - i]);
    let accept: Vec<String> = accept.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "{}\n[sync]\npeers = [\"{peer}\"]\nkey_file = \"{sign}\"\naccept_key_files = [{}]\ninterval_ms = 300\n",
        l.config(i),
        accept.join(", ")
    )
}

/// Rewrite node `i`'s config and wait until lbd applied it (its reload count grew).
fn reload(l: &VrrpLab, i: usize, text: &str) {
    let reloads = |l: &VrrpLab| {
        l.lbctl(i, &["stats"])
            .map(|v| n(&v, &["reloads"]))
            .unwrap_or(0)
    };
    let before = reloads(l);
    replace(&l.config_path(i), text);
    let ok = wait_for(Duration::from_secs(15), || {
        (reloads(l) > before).then_some(())
    });
    assert!(
        ok.is_some(),
        "n{} never reloaded: {}\n{}",
        i + 1,
        l.lbctl(i, &["stats"]).unwrap_or(Value::Null)["last_reload_error"],
        l.logs()
    );
}

/// Both nodes keep receiving the other's datagrams (each count grows by a few scans).
fn both_receive(l: &VrrpLab, step: &str) {
    let before: Vec<u64> = (0..2)
        .map(|i| n(&sync(l, i), &["received_datagrams"]))
        .collect();
    let ok = wait_for(Duration::from_secs(15), || {
        (0..2)
            .all(|i| n(&sync(l, i), &["received_datagrams"]) >= before[i] + 3)
            .then_some(())
    });
    assert!(
        ok.is_some(),
        "{step}: a node stopped receiving: {} / {}",
        sync(l, 0),
        sync(l, 1)
    );
}

fn refused_auth(l: &VrrpLab) -> u64 {
    (0..2).map(|i| n(&sync(l, i), &["refused", "auth"])).sum()
}

#[test]
fn a_key_rotation_with_an_overlap_refuses_nothing_and_one_without_it_does() {
    let opts = NodeOpts {
        unicast: true,
        ..Default::default()
    };
    let mut l = VrrpLab::prepare(LABNODE, vec![opts; 2]);
    let (a, b, c) = (
        key(&l, "a.key", 'a'),
        key(&l, "b.key", 'b'),
        key(&l, "c.key", 'c'),
    );
    for i in 0..2 {
        std::fs::write(l.config_path(i), config(&l, i, &a, &[])).unwrap();
    }
    l.start(0);
    l.start(1);
    assert!(
        l.wait_one_master(&[0, 1], Duration::from_secs(20))
            .is_some(),
        "{}",
        l.logs()
    );
    both_receive(&l, "start");
    // 1. Accept the new key, n2 first.
    for i in [1, 0] {
        reload(&l, i, &config(&l, i, &a, &[&b]));
        both_receive(&l, "accept b");
    }
    // 2. Sign with it, the old one accepted.
    for i in [0, 1] {
        reload(&l, i, &config(&l, i, &b, &[&a]));
        both_receive(&l, "sign with b");
    }
    // 3. Drop the old one.
    for i in [1, 0] {
        reload(&l, i, &config(&l, i, &b, &[]));
        both_receive(&l, "drop a");
    }
    assert_eq!(refused_auth(&l), 0, "{} / {}", sync(&l, 0), sync(&l, 1));

    // Without the overlap: n1 signs with a key n2 does not accept yet.
    reload(&l, 0, &config(&l, 0, &c, &[]));
    let refused = wait_for(Duration::from_secs(15), || {
        (refused_auth(&l) > 0).then_some(())
    });
    assert!(
        refused.is_some(),
        "a key switch without overlap must be refused: {} / {}",
        sync(&l, 0),
        sync(&l, 1)
    );
}
