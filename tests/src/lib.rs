//! Test support for lb: a data plane loaded into the real kernel for BPF_PROG_TEST_RUN (here),
//! the XDP tests' tools (`xdp`), network-namespace labs (`labs`), benchmarks (`bench`) and the
//! chaos run (`chaos`). Everything here needs root. tests/README.md says what lives where.

pub mod bench;
pub mod chaos;
pub mod labs;
pub mod lbctl;
pub mod monitoring;
pub mod xdp;

// Each lab and tool is also named at the crate root, as tests and tools use them.
pub use labs::{
    bgp_lab, brex, cluster, dsr, keepalived_haproxy, lab, openshift, pods, vrrp_lab, vrrp_send,
};
pub use lbctl::{lbctl_json, lbctl_output};
pub use xdp::{frames, strict, xdp_fuzz};

use std::{
    net::IpAddr,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use lb_userspace::dataplane::{BackendSpec, Dataplane, LoadOptions};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A unique short name for kernel objects of this test run.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100_000,
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// A data plane loaded (not attached) with its pins in a directory of its own, removed on drop.
pub struct TestDataplane {
    pub dp: Dataplane,
    pub opts: LoadOptions,
}

impl TestDataplane {
    pub fn new(table_size: u32) -> Self {
        Self::with_conntrack(table_size, 4096)
    }

    /// Like [`TestDataplane::new`] with a connection table of `conntrack_size` entries
    /// (benchmarks use the production default, `lb_common::DEFAULT_CONNTRACK_SIZE`).
    pub fn with_conntrack(table_size: u32, conntrack_size: u32) -> Self {
        Self::with_options(
            table_size,
            conntrack_size,
            lb_common::DEFAULT_SYN_FLOOD_RATE,
        )
    }

    /// Like [`TestDataplane::new`] with flood mode's threshold `syn_flood_rate` (0: off),
    /// loaded once (a load verifies the programs: seconds under a VM's software emulation).
    pub fn with_flood_rate(table_size: u32, syn_flood_rate: u32) -> Self {
        Self::with_options(table_size, 4096, syn_flood_rate)
    }

    fn with_options(table_size: u32, conntrack_size: u32, syn_flood_rate: u32) -> Self {
        let opts = LoadOptions {
            name: unique("lbt"),
            bpffs_root: PathBuf::from("/sys/fs/bpf"),
            table_size,
            conntrack_size,
            hash_seed: 0x1b_5eed,
            syn_flood_rate,
        };
        let dp = Dataplane::load(opts.clone())
            .expect("load the XDP program (needs root and `cargo xtask setup`)");
        TestDataplane { dp, opts }
    }
}

impl TestDataplane {
    /// What a restarted `lbd` does: load the program again on the same pins, possibly with other
    /// settings, and adopt what is there.
    pub fn restart(&mut self, table_size: u32, hash_seed: u32) {
        self.opts.table_size = table_size;
        self.opts.hash_seed = hash_seed;
        // The new instance replaces the old one; the pins stay.
        self.dp = Dataplane::load(self.opts.clone()).expect("reload on the same pins");
    }

    /// Another instance of the program on the same maps (to run packets from another thread
    /// while this one is updated).
    pub fn second_instance(&self) -> Dataplane {
        Dataplane::load(self.opts.clone()).expect("load a second instance")
    }
}

impl Drop for TestDataplane {
    fn drop(&mut self) {
        let _ = Dataplane::teardown(&self.opts);
    }
}

/// Load a data plane and attach its pass program to `ifaces` inside namespace `netns` (what a
/// veth needs to receive the frames its peer's native XDP program sends: a veth delivers an
/// XDP_TX only to a peer that runs an XDP program). Detached when the result is dropped.
pub fn attach_pass(netns: &str, ifaces: &[&str]) -> crate::TestDataplane {
    let netns = netns.to_string();
    let ifaces: Vec<String> = ifaces.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {netns}");
        let mut t = TestDataplane::new(257);
        for i in &ifaces {
            t.dp.attach_pass(i)
                .unwrap_or_else(|e| panic!("attach lb_pass to {i}: {e:#}"));
        }
        t
    })
    .join()
    .unwrap()
}

/// A remote backend with a resolved MAC whose last byte is `n`.
pub fn backend(addr: &str, n: u8) -> BackendSpec {
    BackendSpec {
        addr: addr.parse::<IpAddr>().unwrap(),
        weight: 1,
        mac: Some([0x02, 0xbe, 0, 0, 0, n]),
        src_mac: frames::LB_MAC,
        ifindex: 0,
        local: false,
        healthy: true,
        drained: false,
        failing: false,
        encap: None,
        step: lb_userspace::plan::SLOW_START_STEPS,
    }
}

/// Directory of the workspace's binaries (lbd, lbctl): LB_BIN_DIR, or next to the test binary.
/// The sum of a JSON object's counts (labnode's `survived_by_id`, `failed_by_id`...; 0 for
/// anything else).
pub fn sum_counts(v: &serde_json::Value) -> u64 {
    v.as_object()
        .map(|m| m.values().filter_map(|n| n.as_u64()).sum())
        .unwrap_or(0)
}

pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LB_BIN_DIR") {
        return d.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    // Tests live in target/<profile>/deps/, binaries in target/<profile>/.
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("target dir")
    } else {
        dir
    }
    .to_path_buf()
}
