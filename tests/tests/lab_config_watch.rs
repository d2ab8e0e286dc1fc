//! Config changes without `lbctl reload` or a reboot: lbd reloads when its config file changes
//! (as the machine-config-operator writes it: a new file renamed over the old one), a peer
//! list change applies in place (the VIP stays, nobody changes state), and a node whose
//! address is in none of the rendered configs stays up and not ready, saying why, until its
//! config appears. Needs root; `cargo xtask test`.

use std::{path::Path, time::Duration};

use lb_tests::{
    bin_dir,
    lab::{Lab, wait_for},
    lbctl_output,
    vrrp_lab::{NodeOpts, VrrpLab},
};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

/// Write `text` to `path` the way the MCO and editors do: a new file renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn stat(l: &VrrpLab, i: usize, key: &str) -> u64 {
    l.lbctl(i, &["stats"])
        .and_then(|v| v[key].as_u64())
        .unwrap_or(0)
}

#[test]
fn a_peer_list_change_in_the_file_applies_in_place() {
    let opts = vec![
        NodeOpts {
            unicast: true,
            priority: 150,
            ..Default::default()
        },
        NodeOpts {
            unicast: true,
            priority: 100,
            ..Default::default()
        },
    ];
    let l = VrrpLab::new(LABNODE, opts);
    let master = l
        .wait_one_master(&[0, 1], Duration::from_secs(20))
        .unwrap_or_else(|| panic!("one master\n{}", l.logs()));
    assert_eq!(master, 0);
    let transitions = (l.transitions(0), l.transitions(1));
    assert_eq!(stat(&l, 0, "reloads"), 0);

    // A scale-up: the rendered config of n1 lists a third peer.
    let text = l
        .config(0)
        .replace("unicast_peers = [", "unicast_peers = [\"10.78.0.99\", ");
    assert_ne!(text, l.config(0));
    replace(&l.config_path(0), &text);
    assert!(
        wait_for(Duration::from_secs(10), || (stat(&l, 0, "reloads") == 1)
            .then_some(()))
        .is_some(),
        "lbd reloaded on its own\n{}",
        l.logs()
    );
    let s = l.status(0).unwrap();
    assert!(
        s["unicast_peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "10.78.0.99"),
        "{s}"
    );
    // In place: still master, the VIP never moved, nobody changed state.
    assert_eq!(s["state"], "master", "{s}");
    assert_eq!(l.holders(&[0, 1]), vec![0]);
    assert_eq!((l.transitions(0), l.transitions(1)), transitions);

    // The same bytes written again: no reload. A broken file: refused, the running config
    // stays, and the failure is counted.
    replace(&l.config_path(0), &text);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(stat(&l, 0, "reloads"), 1);
    replace(&l.config_path(0), &format!("{text}\nbogus = 1\n"));
    assert!(
        wait_for(Duration::from_secs(10), || (stat(&l, 0, "reload_failures")
            == 1)
            .then_some(()))
        .is_some(),
        "{}",
        l.logs()
    );
    assert_eq!(l.state(0).as_deref(), Some("master"));
    assert_eq!((l.transitions(0), l.transitions(1)), transitions);
}

#[test]
fn a_node_missing_from_the_rendered_configs_waits_not_ready_and_says_why() {
    let mut lab = Lab::new("cw");
    lab.add_node("n1", "10.77.0.11", "fd77::11");
    let dir = lab.dir.join("nodes");
    std::fs::create_dir_all(&dir).unwrap();
    let socket = lab.dir.join("n1.sock").display().to_string();
    let pin = format!("{}_n1", lab.prefix.replace('-', "_"));
    let config = |src: &str| {
        format!(
            "interface = \"eth0\"\nname = \"{pin}\"\napi_socket = \"{socket}\"\nxdp_mode = \"skb\"\n\
             [[vips]]\nname = \"api\"\naddress = \"10.77.0.100\"\nports = [8080]\nvrrp = \"api\"\nhealth.kind = \"tcp\"\n\
             [[vips.backends]]\naddress = \"10.77.0.11\"\n\
             [[vrrp]]\nname = \"api\"\nvrid = 61\nunicast_src = \"{src}\"\nunicast_peers = [\"10.77.0.12\"]\nvips = [\"10.77.0.100\"]\n"
        )
    };
    // Another node's config only: this one (10.77.0.11) is not in the description yet.
    std::fs::write(dir.join("n2.toml"), config("10.77.0.12")).unwrap();
    lab.cleanup(Path::new("/sys/fs/bpf").join(&pin));
    lab.spawn(
        "n1",
        "lbd-n1",
        bin_dir().join("lbd"),
        &["--config", &dir.display().to_string()],
    );
    let probe = |what: &str| lbctl_output(&socket, &["probe", what]);
    assert!(
        wait_for(Duration::from_secs(10), || probe("live")
            .status
            .success()
            .then_some(()))
        .is_some(),
        "alive while waiting\n{}",
        lab.log("lbd-n1")
    );
    let ready = probe("ready");
    assert!(!ready.status.success(), "not ready without a config");
    let why = format!(
        "{}{}",
        String::from_utf8_lossy(&ready.stdout),
        String::from_utf8_lossy(&ready.stderr)
    );
    assert!(why.contains("none of the 1 configs"), "{why}");
    // Any other question gets the same answer.
    let stats = lbctl_output(&socket, &["stats"]);
    assert!(!stats.status.success());
    assert!(
        String::from_utf8_lossy(&stats.stderr).contains("no config for this node"),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    // Still running a while later (no crash loop), and the log says why.
    std::thread::sleep(Duration::from_secs(2));
    assert!(lab.pid("lbd-n1").is_some());
    assert!(
        lab.log("lbd-n1").contains("has no config"),
        "{}",
        lab.log("lbd-n1")
    );

    // The description grows to this node: its config appears, lbd starts and becomes ready.
    replace(&dir.join("n1.toml"), &config("10.77.0.11"));
    assert!(
        wait_for(Duration::from_secs(20), || probe("ready")
            .status
            .success()
            .then_some(()))
        .is_some(),
        "ready once its config appeared\n{}",
        lab.log("lbd-n1")
    );
    assert!(lab.log("lbd-n1").contains("config appeared"));
}
