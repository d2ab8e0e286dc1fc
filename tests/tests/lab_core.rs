//! lbd's core as one owner: a stop that keeps the VIP single whatever FRR does, reloads that
//! are all or nothing, a reload racing a stop, and one lbd per config. lbd nodes in network
//! namespaces (`VrrpLab`). Needs root; `cargo xtask test`.

use std::time::Duration;

use lb_tests::{
    lab::{has_address, wait_for},
    vrrp_lab::{NodeOpts, VIP4, VrrpLab},
};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");
/// kubelet's termination grace the stop must fit (OpenShift static pods).
const TERMINATION_GRACE: Duration = Duration::from_secs(10);

fn prio(priority: u8) -> NodeOpts {
    NodeOpts {
        priority,
        ..Default::default()
    }
}

fn tag(l: &VrrpLab, i: usize) -> String {
    format!("lbd-{}", l.nodes[i])
}

fn wait_master(l: &VrrpLab, i: usize) {
    assert!(
        l.wait_master(i, Duration::from_secs(15)) && wait_holds(l, i, VIP4, true),
        "node {i} becomes master and holds the VIP\n{}",
        l.logs()
    );
}

/// Wait up to 10 s for node `i`'s eth0 to hold `vip` (or not).
fn wait_holds(l: &VrrpLab, i: usize, vip: &str, held: bool) -> bool {
    let netns = l.lab.node(&l.nodes[i]).netns.clone();
    wait_for(Duration::from_secs(10), || {
        (has_address(&netns, "eth0", vip) == held).then_some(())
    })
    .is_some()
}

fn holds(l: &VrrpLab, i: usize, vip: &str) -> bool {
    has_address(&l.lab.node(&l.nodes[i]).netns, "eth0", vip)
}

fn probe(l: &VrrpLab, i: usize, path: &str) -> (u16, String) {
    l.get(i, path)
}

fn reload(l: &VrrpLab, i: usize) -> (bool, String) {
    let out = lb_tests::lbctl_output(&l.socket(i), &["reload"]);
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), text)
}

/// Start node `i`'s lbd with the test-only fault injection `var` naming `file` (in its
/// environment alone).
fn start_with_delay_file(l: &mut VrrpLab, i: usize, var: &str, file: &std::path::Path) {
    unsafe { std::env::set_var(var, file) };
    l.start(i);
    unsafe { std::env::remove_var(var) };
}

/// Whether node `i`'s lbd has backend `addr` healthy (`None`: no answer, or no such row).
fn backend_up(l: &VrrpLab, i: usize, addr: &str) -> Option<bool> {
    let rows = l.lbctl(i, &["backends", "list"])?;
    rows.as_array()?
        .iter()
        .find(|r| r["backend"] == addr)
        .and_then(|r| r["healthy"].as_bool())
}

fn stats(l: &VrrpLab, i: usize) -> Value {
    l.lbctl(i, &["stats"]).expect("lbctl stats")
}

/// A `[[bgp]]` section whose vtysh is `vtysh` (the peer is never reached: FRR is not there).
fn bgp_section(vtysh: &str) -> String {
    format!(
        "\n[[bgp]]\nasn = 65001\nvtysh = \"{vtysh}\"\n[[bgp.peers]]\naddress = \"10.78.0.254\"\nasn = 65000\n"
    )
}

/// A hung bgpd (vtysh answers nothing for 30 s) must delay neither the loop (`/healthz`) nor the
/// stop: SIGTERM releases the VIP, and a backup takes it, within the termination grace.
#[test]
fn a_hung_vtysh_delays_neither_the_loop_nor_the_vip_release() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150), prio(100)]);
    let vtysh = l.lab.dir.join("vtysh-hung");
    std::fs::write(&vtysh, "#!/bin/sh\nexec sleep 30\n").unwrap();
    std::fs::set_permissions(&vtysh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg = l.config(0) + &bgp_section(&vtysh.display().to_string());
    std::fs::write(l.config_path(0), cfg).unwrap();
    l.write_config(1);
    l.start(0);
    l.start(1);
    // By the address, not the API: the API is what a stalled loop would not answer.
    let netns = l.lab.node(&l.nodes[0]).netns.clone();
    let held = wait_for(Duration::from_secs(30), || {
        has_address(&netns, "eth0", VIP4).then_some(())
    });
    assert!(held.is_some(), "node 0 holds the VIP\n{}", l.logs());
    // Running (its API answers), not starting: a SIGTERM before the signal handler is set
    // kills lbd at once, and the guardian gives the VIP back.
    let serving = wait_for(Duration::from_secs(60), || {
        (probe(&l, 0, "/readyz").0 != 0).then_some(())
    });
    assert!(serving.is_some(), "the API answers\n{}", l.log(0));
    // Longer than one vtysh timeout (10 s) and the liveness bound: the loop kept ticking.
    std::thread::sleep(Duration::from_secs(12));
    let healthz = probe(&l, 0, "/healthz");
    assert!(holds(&l, 0, VIP4), "still master\n{}", l.log(0));

    let sent = std::time::Instant::now();
    l.signal(0, libc::SIGTERM);
    let released = wait_for(TERMINATION_GRACE, || {
        (!has_address(&netns, "eth0", VIP4)).then_some(sent.elapsed())
    });
    println!("SIGTERM with a hung vtysh: VIP released after {released:?}");
    assert!(
        released.is_some(),
        "the VIP is released within the {TERMINATION_GRACE:?} grace\n{}",
        l.log(0)
    );
    assert!(
        wait_holds(&l, 1, VIP4, true),
        "the backup takes it\n{}",
        l.logs()
    );
    assert_eq!(
        healthz.0,
        200,
        "/healthz while vtysh hangs: {}\n{}",
        healthz.1,
        l.log(0)
    );
    let t = tag(&l, 0);
    let exited = l
        .lab
        .wait(&t, TERMINATION_GRACE.saturating_sub(sent.elapsed()));
    assert!(
        exited.is_some_and(|s| s.success()),
        "lbd exits cleanly within the grace: {exited:?}\n{}",
        l.log(0)
    );
}

/// Two new VRRP instances, the second on an interface this node does not have.
fn with_bad_interface(base: &str) -> String {
    base.to_string()
        + "\n[[vips]]\nname = \"good\"\naddress = \"10.78.0.103\"\nports = [8080]\nvrrp = \"good\"\n[[vips.backends]]\naddress = \"10.78.0.1\"\n"
        + "\n[[vips]]\nname = \"bad\"\naddress = \"10.78.0.102\"\nports = [8080]\nvrrp = \"bad\"\n[[vips.backends]]\naddress = \"10.78.0.1\"\n"
        + "\n[[vrrp]]\nname = \"good\"\nvrid = 54\npriority = 150\nvips = [\"10.78.0.103\"]\n"
        + "\n[[vrrp]]\nname = \"bad\"\nvrid = 53\npriority = 150\ninterface = \"nosuch0\"\nvips = [\"10.78.0.102\"]\n"
}

/// A reload that cannot be applied in full is applied not at all: no VIP, no instance, the
/// error in the log and in `lbctl stats`, by the API and by SIGHUP alike.
#[test]
fn a_reload_with_a_missing_interface_applies_nothing_and_says_why() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    l.write_config(0);
    let base = l.config(0);
    l.start(0);
    wait_master(&l, 0);
    let vips_before = l.lbctl(0, &["vips", "list"]).expect("vips");

    std::fs::write(l.config_path(0), with_bad_interface(&base)).unwrap();
    let (ok, text) = reload(&l, 0);
    assert!(!ok, "refused: {text}");
    assert!(text.contains("nosuch0"), "names the interface: {text}");
    let unchanged = |l: &VrrpLab, what: &str| {
        assert_eq!(
            l.lbctl(0, &["vips", "list"]).expect("vips"),
            vips_before,
            "{what}: the data plane keeps the running config"
        );
        let vrrp = l.lbctl(0, &["vrrp", "status"]).expect("vrrp");
        let names: Vec<&str> = vrrp
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["api"], "{what}: no instance started");
        // The good instance would be master at once (priority 150, alone): give it time.
        std::thread::sleep(Duration::from_secs(1));
        assert!(!holds(l, 0, "10.78.0.103"), "{what}: no VIP added");
        assert!(holds(l, 0, VIP4), "{what}: the running VIP stays");
    };
    unchanged(&l, "API reload");
    let s = stats(&l, 0);
    assert_eq!(s["reload_failures"], 1, "{s}");
    assert_eq!(s["reloads"], 0, "{s}");
    assert!(
        s["last_reload_error"]
            .as_str()
            .unwrap_or("")
            .contains("nosuch0"),
        "{s}"
    );
    let refused = |l: &VrrpLab| {
        l.log(0)
            .lines()
            .filter(|x| x.contains("config refused") && x.contains("nosuch0"))
            .count()
    };
    assert_eq!(refused(&l), 1, "logged\n{}", l.log(0));

    // SIGHUP: the same, and logged too.
    l.signal(0, libc::SIGHUP);
    let counted = wait_for(Duration::from_secs(10), || {
        (stats(&l, 0)["reload_failures"] == 2).then_some(())
    });
    assert!(counted.is_some(), "SIGHUP reload counted\n{}", l.log(0));
    unchanged(&l, "SIGHUP reload");
    assert_eq!(refused(&l), 2, "the SIGHUP failure is logged\n{}", l.log(0));

    // The running config still reloads.
    std::fs::write(l.config_path(0), &base).unwrap();
    let (ok, text) = reload(&l, 0);
    assert!(ok, "{text}");
    let s = stats(&l, 0);
    assert_eq!(s["reloads"], 1, "{s}");
    assert!(s["last_reload_error"].is_null(), "{s}");
}

fn late_instance(base: &str) -> String {
    base.to_string()
        + "\n[[vrrp]]\nname = \"late\"\nvrid = 55\npriority = 150\nadvert_interval_ms = 100\nvips = [\"10.78.0.104\"]\n"
}

/// A reload and a SIGTERM at once: whichever comes first, no VRRP instance outlives the stop
/// (its VIP would stay on the interface with nobody to give it back).
#[test]
fn reload_and_sigterm_at_once_leave_no_instance_behind() {
    let opts = NodeOpts {
        // A stop that takes a while (the handover grace): a window for the reload.
        top: "handover_grace_ms = 3000\n".into(),
        ..prio(150)
    };
    let mut l = VrrpLab::prepare(LABNODE, vec![opts]);
    l.write_config(0);
    let base = l.config(0);
    for (round, reload_after) in [(1, Duration::from_millis(300)), (2, Duration::ZERO)] {
        std::fs::write(l.config_path(0), &base).unwrap();
        l.start(0);
        wait_master(&l, 0);
        std::fs::write(l.config_path(0), late_instance(&base)).unwrap();
        let socket = l.socket(0);
        std::thread::scope(|s| {
            let r = s.spawn(|| {
                std::thread::sleep(reload_after);
                lb_tests::lbctl_output(&socket, &["reload"])
            });
            l.signal(0, libc::SIGTERM);
            let _ = r.join();
        });
        let t = tag(&l, 0);
        let exited = l.lab.wait(&t, Duration::from_secs(20));
        assert!(
            exited.is_some_and(|s| s.success()),
            "round {round}: lbd stops: {exited:?}\n{}",
            l.log(0)
        );
        // An instance that survived the stop would hold its VIP now (priority 150, alone).
        std::thread::sleep(Duration::from_secs(1));
        for vip in [VIP4, "10.78.0.104"] {
            assert!(
                !holds(&l, 0, vip),
                "round {round}: {vip} given back at the stop\n{}",
                l.log(0)
            );
        }
    }
}

/// A second lbd on the same config (same socket, same pins), or on the same pins with another
/// socket, refuses to start and leaves the running one alone; so does `lbd teardown`.
#[test]
fn a_second_lbd_on_the_same_config_refuses_to_start() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    l.write_config(0);
    l.start(0);
    wait_master(&l, 0);
    let node = l.nodes[0].clone();
    let lbd = lb_tests::bin_dir().join("lbd");
    let other_socket = l.lab.dir.join("other.sock").display().to_string();
    let same_pins = l.config(0).replace(&l.socket(0), &other_socket);
    let same_pins_path = l.lab.dir.join("same-pins.toml");
    std::fs::write(&same_pins_path, same_pins).unwrap();
    for (what, path, want) in [
        ("same config", l.config_path(0), "another lbd"),
        ("same pins", same_pins_path, "pinned maps"),
    ] {
        let t = format!("second-{}", what.replace(' ', "-"));
        let path = path.display().to_string();
        l.lab.spawn(&node, &t, &lbd, &["--config", &path]);
        let status = l.lab.wait(&t, Duration::from_secs(10));
        let log = l.lab.log(&t);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{what}: the second lbd exits with an error: {status:?}\n{log}"
        );
        assert!(log.contains(want), "{what}: says why\n{log}");
        assert!(
            !std::path::Path::new(&other_socket).exists(),
            "{what}: no second socket"
        );
        // The first one is untouched.
        let (code, body) = probe(&l, 0, "/healthz");
        assert_eq!(code, 200, "{what}: {body}");
        assert_eq!(
            l.state(0).as_deref(),
            Some("master"),
            "{what}\n{}",
            l.log(0)
        );
        assert!(holds(&l, 0, VIP4), "{what}: the VIP stays");
    }
    // `lbd teardown` would undo what the running lbd holds: refused too.
    let out = l.lbd(0, &["teardown"]);
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "teardown refused: {text}");
    assert!(text.contains("another lbd"), "{text}");
    assert!(holds(&l, 0, VIP4), "teardown removed nothing");
    assert_eq!(l.state(0).as_deref(), Some("master"));
}

fn routes76(l: &VrrpLab, i: usize) -> String {
    let netns = l.lab.node(&l.nodes[i]).netns.clone();
    let out = lb_tests::lab::try_sh(&["ip", "-n", &netns, "route", "show", "proto", "76"]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A node whose lbd died must not keep announcing: the guardian withdraws the BGP routes
/// (`proto 76`, what FRR redistributes), and `lbd teardown` removes any left.
#[test]
fn bgp_routes_are_withdrawn_by_the_guardian_and_by_teardown() {
    const BGP_VIP: &str = "10.78.0.120";
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    // FRR's stand-in: accepts every command, has no running config.
    let vtysh = l.lab.dir.join("vtysh-ok");
    std::fs::write(&vtysh, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&vtysh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let me = l.addr(&l.nodes[0].clone());
    let cfg = l.config(0)
        + &format!(
            "\n[[vips]]\nname = \"bgp\"\naddress = \"{BGP_VIP}\"\nports = [8080]\nannounce = \"bgp\"\n[vips.health]\nkind = \"tcp\"\n[[vips.backends]]\naddress = \"{me}\"\n"
        )
        + &bgp_section(&vtysh.display().to_string());
    std::fs::write(l.config_path(0), cfg).unwrap();
    l.start(0);
    wait_master(&l, 0);
    let announced = wait_for(Duration::from_secs(10), || {
        routes76(&l, 0).contains(BGP_VIP).then_some(())
    });
    assert!(
        announced.is_some(),
        "announced: {}\n{}",
        routes76(&l, 0),
        l.log(0)
    );

    // lbd dies without stopping: the guardian withdraws.
    l.stop(0, libc::SIGKILL);
    let withdrawn = wait_for(Duration::from_secs(5), || {
        (!routes76(&l, 0).contains(BGP_VIP)).then_some(())
    });
    assert!(
        withdrawn.is_some(),
        "the guardian withdrew: {}\n{}",
        routes76(&l, 0),
        l.log(0)
    );

    // A route left behind (an older lbd, a guardian killed too): teardown removes it.
    let netns = l.lab.node(&l.nodes[0]).netns.clone();
    lb_tests::lab::sh(&[
        "ip",
        "-n",
        &netns,
        "route",
        "add",
        "blackhole",
        "10.78.0.121/32",
        "proto",
        "76",
    ]);
    let out = l.lbd(0, &["teardown"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(routes76(&l, 0).trim(), "", "no proto-76 route left");
}

/// Static VIPs live on the interface: when it is deleted and created again (an OVS bridge
/// rebuilt), lbd puts them back on the new device, beside the VRRP VIP on the same interface.
#[test]
fn static_vips_come_back_on_a_recreated_interface() {
    const STATIC_VIP: &str = "10.78.0.110";
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    let me = l.addr(&l.nodes[0].clone());
    let cfg = l.config(0)
        + &format!(
            "\n[[vips]]\nname = \"static\"\naddress = \"{STATIC_VIP}\"\nports = [8080]\nowned = true\n[vips.health]\nkind = \"tcp\"\n[[vips.backends]]\naddress = \"{me}\"\n"
        );
    std::fs::write(l.config_path(0), cfg).unwrap();
    l.start(0);
    wait_master(&l, 0);
    assert!(
        wait_holds(&l, 0, STATIC_VIP, true),
        "the static VIP is held at start\n{}",
        l.log(0)
    );
    let node = l.nodes[0].clone();
    l.lab.delete_link(&node);
    l.lab.create_link(&node);
    assert!(
        wait_holds(&l, 0, STATIC_VIP, true),
        "the static VIP is back on the new device\n{}",
        l.log(0)
    );
    assert!(
        wait_holds(&l, 0, VIP4, true),
        "so is the VRRP VIP\n{}",
        l.log(0)
    );
}

/// The guardian children of `pid` (`lbd guardian`), from /proc.
fn guardians_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The fields after the command name (in parentheses): state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if ppid == Some(pid) && cmdline.ends_with(b"guardian\0") {
            out.push(child);
        }
    }
    out
}

/// A guardian that died (killed, OOM) is started again at once, not at the next reload: a crash
/// of lbd right after still gives the VIP back.
#[test]
fn a_dead_guardian_is_replaced_at_once() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    l.write_config(0);
    l.start(0);
    wait_master(&l, 0);
    let lbd = l.lab.pid(&tag(&l, 0)).expect("lbd runs");
    let first = guardians_of(lbd);
    assert_eq!(first.len(), 1, "one guardian: {first:?}");
    // Our lbd's own child: the test started it.
    unsafe { libc::kill(first[0] as i32, libc::SIGKILL) };
    let replaced = wait_for(Duration::from_secs(5), || {
        let now = guardians_of(lbd);
        (now.len() == 1 && now[0] != first[0]).then(|| now[0])
    });
    assert!(
        replaced.is_some(),
        "a new guardian: {:?}\n{}",
        guardians_of(lbd),
        l.log(0)
    );
    // It knows the VIPs: a crash now gives them back.
    l.stop(0, libc::SIGKILL);
    assert!(
        wait_holds(&l, 0, VIP4, false),
        "the new guardian gave the VIP back\n{}",
        l.log(0)
    );
}

/// A stalled netlink answer holds neither the owner's loop nor the rollback's order. The stall
/// is lbd's test-only fault injection (`LB_TEST_NETLINK_DELAY_FILE`, `daemon/netexec.rs`):
/// every address request of the netlink executor waits the file's milliseconds before it is
/// sent. Node 2 (backup) reloads a config adding a static VIP while its netlink stalls 6 s;
/// its master dies meanwhile. The reload gets no answer within the executor's 2 s deadline
/// and is undone; the takeover, its forwarding acknowledgement and the dead node's backend
/// leaving the table all happen during the stall; the late add lands, and the undo's removal
/// follows it.
#[test]
fn a_stalled_netlink_answer_delays_neither_health_nor_ownership_and_the_undo_follows_it() {
    const STATIC_VIP: &str = "10.78.0.110";
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150), prio(100)]);
    let delay = l.lab.dir.join("netlink-delay");
    l.start(0);
    wait_master(&l, 0);
    // Only node 2's lbd reads the delay file.
    start_with_delay_file(&mut l, 1, "LB_TEST_NETLINK_DELAY_FILE", &delay);
    let backend_up = |l: &VrrpLab, addr: &str| backend_up(l, 1, addr);
    let n1 = l.addr(&l.nodes[0].clone());
    let n2 = l.addr(&l.nodes[1].clone());
    assert!(
        wait_for(Duration::from_secs(15), || (l.state(1).as_deref()
            == Some("backup")
            && backend_up(&l, &n1) == Some(true))
        .then_some(()))
        .is_some(),
        "node 2 is a backup with node 1's backend up\n{}",
        l.logs()
    );
    let with_static = l.config(1)
        + &format!(
            "\n[[vips]]\nname = \"static\"\naddress = \"{STATIC_VIP}\"\nports = [8080]\nowned = true\n[[vips.backends]]\naddress = \"{n2}\"\n"
        );
    std::fs::write(l.config_path(1), with_static).unwrap();
    std::fs::write(&delay, "6000").unwrap();
    let stalled = std::time::Instant::now();
    l.signal(1, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    l.fail_node(0);
    // During the stall: node 2 takes over and forwards, node 1's backend is out.
    let took_over = wait_for(Duration::from_secs(5), || {
        (l.state(1).as_deref() == Some("master")
            && holds(&l, 1, VIP4)
            && backend_up(&l, &n1) == Some(false))
        .then_some(())
    });
    let during = stalled.elapsed();
    assert!(
        took_over.is_some() && during < Duration::from_millis(5800),
        "node 2 took over with node 1's backend out while netlink stalled ({during:?})\n{}",
        l.log(1)
    );
    assert!(
        !l.log(1).contains("data plane slow to forward"),
        "the forwarding acknowledgement did not wait for netlink\n{}",
        l.log(1)
    );
    // The reload got no answer in time and was undone.
    let failed = wait_for(Duration::from_secs(5), || {
        (stats(&l, 1)["reload_failures"] == 1).then_some(())
    });
    let s = stats(&l, 1);
    assert!(failed.is_some(), "reload failed: {s}\n{}", l.log(1));
    assert!(
        s["last_reload_error"]
            .as_str()
            .unwrap_or("")
            .contains("did not answer"),
        "{s}"
    );
    assert_eq!(s["reloads"], 0, "{s}");
    // The late add lands (the request was sent), then the undo's removal, queued behind it.
    let landed = wait_for(Duration::from_secs(10), || {
        holds(&l, 1, STATIC_VIP).then_some(())
    });
    assert!(landed.is_some(), "the late add landed\n{}", l.log(1));
    std::fs::remove_file(&delay).unwrap();
    assert!(
        wait_holds(&l, 1, STATIC_VIP, false),
        "the undo removed what the late add added\n{}",
        l.log(1)
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(!holds(&l, 1, STATIC_VIP), "and it stays removed");
    assert!(holds(&l, 1, VIP4), "the VRRP VIP stays");
}

/// A VRRP instance slow to leave at a reload holds neither the owner's loop nor its
/// successor's VIP. The stall is lbd's test-only fault injection
/// (`LB_TEST_VRRP_REMOVE_DELAY_FILE`, `vrrp/instance.rs`): each VIP removal of an instance
/// waits the file's milliseconds before it is sent. Node 1 (master) reloads a config that
/// restarts its instance (`unicast_src` set) while the old incarnation's VIP removal stalls
/// 6 s; node 2 dies meanwhile. The reload is done within the 2 s deadline, and node 2's
/// backend leaves node 1's table during the stall. The new incarnation starts only once the
/// old one has left: the late removal lands before its add, and node 1 ends master holding
/// the VIP.
#[test]
fn a_vrrp_instance_slow_to_leave_at_a_reload_holds_neither_the_loop_nor_its_successor() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150), prio(100)]);
    let delay = l.lab.dir.join("vrrp-remove-delay");
    // Only node 1's lbd reads the delay file.
    start_with_delay_file(&mut l, 0, "LB_TEST_VRRP_REMOVE_DELAY_FILE", &delay);
    wait_master(&l, 0);
    l.start(1);
    let backend_up = |l: &VrrpLab, addr: &str| backend_up(l, 0, addr);
    let n1 = l.addr(&l.nodes[0].clone());
    let n2 = l.addr(&l.nodes[1].clone());
    assert!(
        wait_for(Duration::from_secs(15), || (l.state(1).as_deref()
            == Some("backup")
            && backend_up(&l, &n2) == Some(true))
        .then_some(()))
        .is_some(),
        "node 2 is a backup, its backend up on node 1\n{}",
        l.logs()
    );
    // The [[vrrp]] table is the config's last: this sets its unicast_src (still multicast).
    let restarted = l.config(0) + &format!("unicast_src = \"{n1}\"\n");
    std::fs::write(l.config_path(0), restarted).unwrap();
    std::fs::write(&delay, "6000").unwrap();
    let stalled = std::time::Instant::now();
    l.signal(0, libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(5), || l
            .log(0)
            .contains("VRRP instance restarts")
            .then_some(()))
        .is_some(),
        "the reload restarts the instance\n{}",
        l.log(0)
    );
    // The old incarnation's removal has read the delay; nothing after it is delayed.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(&delay).unwrap();
    l.fail_node(1);
    // During the stall: the reload is done and node 2's backend is out.
    let served = wait_for(Duration::from_secs(5), || {
        (stats(&l, 0)["reloads"] == 1 && backend_up(&l, &n2) == Some(false)).then_some(())
    });
    let during = stalled.elapsed();
    assert!(
        served.is_some() && during < Duration::from_millis(5800),
        "node 1 reloaded and took node 2's backend out while its old instance stalled ({during:?})\n{}",
        l.log(0)
    );
    let s = stats(&l, 0);
    assert_eq!(s["reload_failures"], 0, "{s}");
    assert!(
        l.log(0).contains("has not left in time"),
        "the stop's deadline passed\n{}",
        l.log(0)
    );
    // After the stall: the late removal, then the new incarnation, master with the VIP.
    std::thread::sleep(Duration::from_millis(6500).saturating_sub(stalled.elapsed()));
    wait_master(&l, 0);
    assert!(
        l.log(0).contains("the previous incarnation has left"),
        "the new incarnation waited for the old one\n{}",
        l.log(0)
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        holds(&l, 0, VIP4) && l.state(0).as_deref() == Some("master"),
        "node 1 is master and keeps the VIP: no late removal after the new add\n{}",
        l.log(0)
    );
}

/// A SIGTERM while lbd is still starting (a kubelet stopping a pod it just started) is a clean
/// stop, not a kill by the signal's default action: lbd stops as always (exit 0, its guardian
/// told goodbye, nothing held). The start is held open by the membership join: node 0's peer
/// never answers, so it would wait `join_wait_ms` (60 s, the most it takes) after attaching its
/// program and before its loop runs; the join gives way to the stop, well within a kubelet's
/// grace period (the test waits 15 s).
#[test]
fn a_sigterm_during_the_start_is_a_clean_stop() {
    let opts = NodeOpts {
        unicast: true,
        ..prio(150)
    };
    let mut l = VrrpLab::prepare(LABNODE, vec![opts.clone(), opts]);
    let key = l.lab.dir.join("cluster.key");
    std::fs::write(&key, "lab-core-members-key-0123456789abcdef012345\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let members = format!(
        "\n[members]\nkey_file = \"{}\"\nannounce_ms = 200\nexpire_ms = 2000\njoin_wait_ms = 60000\n",
        key.display()
    );
    std::fs::write(l.config_path(0), l.config(0) + &members).unwrap();
    l.start(0);
    let attached = wait_for(Duration::from_secs(10), || {
        l.log(0).contains("attached XDP program").then_some(())
    });
    assert!(attached.is_some(), "lbd attaches\n{}", l.log(0));
    assert!(
        !l.log(0).contains("lbd running"),
        "still starting (the join waits)\n{}",
        l.log(0)
    );
    l.signal(0, libc::SIGTERM);
    let exited = l.lab.wait(&tag(&l, 0), Duration::from_secs(15));
    let log = l.log(0);
    assert!(
        exited.is_some_and(|s| s.success()),
        "lbd stops by itself, exit 0 (not killed by the signal): {exited:?}\n{log}"
    );
    assert!(log.contains("lbd stopping"), "the usual stop ran\n{log}");
    assert!(
        log.contains("stop signal while joining the members"),
        "the join (60 s at most) gave way to the stop\n{log}"
    );
    assert!(
        !log.contains("lbd died without stopping"),
        "the guardian was told goodbye\n{log}"
    );
    assert!(!holds(&l, 0, VIP4), "nothing held\n{log}");
}
