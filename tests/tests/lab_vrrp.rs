//! VRRP between lbd nodes in network namespaces. Needs root; `cargo xtask test`.

use std::time::Duration;

use lb_tests::vrrp_lab::{NodeOpts, VrrpLab};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

#[test]
fn three_nodes_elect_one_master_and_fail_over_on_kill() {
    let opts = vec![
        NodeOpts {
            priority: 150,
            ..Default::default()
        },
        NodeOpts::default(),
        NodeOpts {
            priority: 50,
            ..Default::default()
        },
    ];
    let mut l = VrrpLab::new(LABNODE, opts);
    let master = l
        .wait_one_master(&[0, 1, 2], Duration::from_secs(10))
        .unwrap_or_else(|| {
            panic!(
                "no single master; logs:\n{}\n{}",
                l.lab.log("lbd-n1"),
                l.lab.log("lbd-n2")
            )
        });
    assert_eq!(master, 0, "the highest priority wins");
    assert!(
        l.wait_serving(Duration::from_secs(10)),
        "client reaches the VIP"
    );

    l.stop(0, libc::SIGKILL);
    let took = l
        .time_to_answer(Duration::from_secs(5))
        .expect("a backup takes over");
    println!("kill -9 of the master: client answered again after {took:?}");
    let new_master = l
        .wait_one_master(&[1, 2], Duration::from_secs(5))
        .expect("one new master");
    assert_eq!(new_master, 1);
}
