//! `bench table`: time to build a 65537-slot Maglev table (`maglev::build`) and to install it
//! atomically (`Dataplane::apply` of one service into the real kernel maps: rebuild, write the
//! idle half through the memory-mapped array, fence, flip the VIP entry), for 3, 100 and 1000
//! backends. Medians of repeated runs.
//!
//! Each install changes the table: it alternates between every backend in the table and the
//! last one drained, as a health change or a drain does, so `apply` never short-cuts.

use std::{net::IpAddr, time::Instant};

use lb_common::PROTO_TCP;
use lb_userspace::{
    dataplane::{BackendSpec, Desired, ServiceSpec, vip_key},
    maglev,
};
use serde_json::json;

use super::{median, write_json};
use crate::{TestDataplane, backend};

const TABLE_SIZE: u32 = 65537;
const TARGET_INSTALL_MS: f64 = 20.0;

fn backends(n: usize) -> Vec<BackendSpec> {
    (0..n)
        .map(|i| {
            backend(
                &format!("10.80.{}.{}", i / 200, i % 200 + 1),
                (i % 250) as u8,
            )
        })
        .collect()
}

pub fn run() {
    let vip: IpAddr = "10.77.0.100".parse().unwrap();
    let rounds = 15;
    println!("table size {TABLE_SIZE}, {rounds} rounds each, medians");
    println!(
        "{:>9} {:>10} {:>12} {:>12}",
        "backends", "build ms", "install ms", "max install"
    );
    let mut cases = Vec::new();
    for n in [3usize, 100, 1000] {
        let specs = backends(n);
        let entries: Vec<maglev::Entry> = specs
            .iter()
            .enumerate()
            .map(|(i, b)| maglev::Entry {
                addr: b.addr,
                weight: b.weight,
                id: i as u32,
            })
            .collect();
        let build: Vec<f64> = (0..rounds)
            .map(|_| {
                let t = Instant::now();
                let table = maglev::build(&entries, TABLE_SIZE);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                assert_eq!(table.len(), TABLE_SIZE as usize);
                ms
            })
            .collect();

        let mut t = TestDataplane::new(TABLE_SIZE);
        let desired = |drain_last: bool| {
            let mut b = specs.clone();
            if drain_last {
                b.last_mut().unwrap().drained = true;
            }
            Desired {
                services: vec![ServiceSpec {
                    key: vip_key(vip, 6443, PROTO_TCP),
                    owned: true,
                    backends: b,
                }],
                ..Default::default()
            }
        };
        // Warm-up: the first apply also creates the service and writes every backend.
        t.dp.apply(&desired(false)).unwrap();
        let install: Vec<f64> = (0..rounds)
            .map(|i| {
                let d = desired(i % 2 == 0);
                let start = Instant::now();
                t.dp.apply(&d).unwrap();
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        let key = vip_key(vip, 6443, PROTO_TCP);
        let shares = t.dp.table_shares(&key);
        assert_eq!(
            shares.values().sum::<usize>(),
            TABLE_SIZE as usize,
            "installed table"
        );
        let max_install = install.iter().copied().fold(0.0, f64::max);
        let (b, i) = (median(build), median(install));
        println!("{n:>9} {b:>10.2} {i:>12.2} {max_install:>12.2}");
        cases.push(json!({"backends": n, "build_ms": b, "install_ms": i}));
    }
    let worst = cases
        .iter()
        .map(|c| c["install_ms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    println!(
        "install (rebuild + write + flip) target < {TARGET_INSTALL_MS} ms: worst median {worst:.2} ms -> {}",
        if worst < TARGET_INSTALL_MS {
            "met"
        } else {
            "NOT met"
        }
    );
    write_json(
        "table",
        &json!({"table_size": TABLE_SIZE, "rounds": rounds, "cases": cases}),
    );
}
