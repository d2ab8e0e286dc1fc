//! The operator's view through a real lbd (the DSR lab: static VIPs web4/web6, three backends
//! each): lbctl's conventions (`-o` formats, filters, `version`, `--watch` output, exit codes)
//! and the metrics' conventions. Needs root; `cargo xtask test`.

use std::{
    io::Read,
    process::Stdio,
    time::{Duration, Instant},
};

use lb_tests::{
    dsr::{VIP4, setup},
    lbctl_output,
};
use lb_userspace::status::{BackendRow, VipRow};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

use lb_tests::lbctl::lbctl_typed as json;

#[test]
fn lbctl_formats_filters_version_watch_and_exit_codes() {
    let l = setup(LABNODE);
    let socket = l.socket.as_str();

    // Filters: by VIP name and by address give that VIP's rows only.
    let all: Vec<BackendRow> = json(socket, &["backends", "list"]);
    assert_eq!(all.len(), 6);
    let by_name: Vec<BackendRow> = json(socket, &["backends", "list", "web4"]);
    let by_addr: Vec<BackendRow> = json(socket, &["backends", "list", VIP4]);
    assert_eq!(by_name.len(), 3, "{by_name:?}");
    assert!(by_name.iter().all(|r| r.vip_name == "web4"));
    // The same rows, but two reads apart: a health check may have run in between, so only
    // what does not move with each check is compared.
    let fixed =
        |rows: &[BackendRow]| -> Vec<(String, std::net::IpAddr, std::net::IpAddr, u16, String)> {
            rows.iter()
                .map(|r| {
                    (
                        r.vip_name.clone(),
                        r.vip,
                        r.backend,
                        r.port,
                        r.state.clone(),
                    )
                })
                .collect()
        };
    assert_eq!(fixed(&by_name), fixed(&by_addr));
    let vips: Vec<VipRow> = json(socket, &["vips", "list", "web6"]);
    assert_eq!(vips.len(), 1);
    assert_eq!(vips[0].name, "web6");
    let none: Vec<BackendRow> = json(socket, &["backends", "list", "nosuchvip"]);
    assert!(none.is_empty());

    // YAML is the same document as JSON.
    let out = lbctl_output(socket, &["-o", "yaml", "backends", "list", "web4"]);
    assert!(out.status.success(), "{out:?}");
    let yaml: Vec<BackendRow> = serde_norway::from_slice(&out.stdout).unwrap();
    assert_eq!(yaml.len(), 3);
    assert_eq!(
        yaml.iter().map(|r| r.backend).collect::<Vec<_>>(),
        by_name.iter().map(|r| r.backend).collect::<Vec<_>>()
    );

    // Table and wide: wide has every column of table and more.
    let text = |args: &[&str]| {
        let out = lbctl_output(socket, args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = text(&["backends", "list", "web4"]);
    let wide = text(&["-o", "wide", "backends", "list", "web4"]);
    let header = |t: &str| -> Vec<String> {
        t.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(header(&table).iter().all(|h| header(&wide).contains(h)));
    assert!(header(&wide).contains(&"MAC".to_string()), "{wide}");
    assert!(!header(&table).contains(&"MAC".to_string()), "{table}");

    // Version: client and daemon, the same build here.
    let v: serde_json::Value = json(socket, &["version"]);
    assert_eq!(v["client"]["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["daemon"], v["client"], "{v}");

    // Exit codes: lbd refuses (1) versus nobody answers (3).
    let refused = lbctl_output(socket, &["backends", "drain", "web4", "10.77.0.99"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("lbd answered 4"),
        "{refused:?}"
    );
    let gone = l.lab.dir.join("no-lbd-here.sock");
    let unreachable = lbctl_output(gone.to_str().unwrap(), &["stats"]);
    assert_eq!(unreachable.status.code(), Some(3), "{unreachable:?}");
    let version = lbctl_output(gone.to_str().unwrap(), &["version"]);
    assert_eq!(version.status.code(), Some(3), "{version:?}");
    assert!(String::from_utf8_lossy(&version.stdout).contains("lbctl "));
    // A socket that accepts but never answers (a wedged lbd): not reachable either.
    let wedged = l.lab.dir.join("wedged.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&wedged).unwrap();
    let out = lbctl_output(
        wedged.to_str().unwrap(),
        &["--timeout", "300ms", "vips", "list"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // --watch in JSON: a stream of documents, no terminal codes, even on a pipe.
    for (format, sep) in [("json", None), ("yaml", Some("---\n"))] {
        let mut child = lb_tests::lbctl::command()
            .args([
                "--socket", socket, "-o", format, "--watch", "200ms", "stats",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            buf
        });
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Our own child, by its handle.
        child.kill().unwrap();
        child.wait().unwrap();
        let buf = reader.join().unwrap();
        assert!(
            !buf.contains(&0x1b),
            "terminal codes in -o {format} --watch"
        );
        let docs: Vec<lb_userspace::status::StatsRow> = match sep {
            None => serde_json::Deserializer::from_slice(&buf)
                .into_iter()
                .collect::<Result<_, _>>()
                .unwrap(),
            Some(sep) => String::from_utf8(buf.clone())
                .unwrap()
                .split(sep)
                .filter(|d| !d.trim().is_empty())
                .map(|d| serde_norway::from_str(d).unwrap())
                .collect(),
        };
        assert!(
            docs.len() >= 2,
            "{format}: {}",
            String::from_utf8_lossy(&buf)
        );
        assert!(docs.iter().all(|d| d.interface == "eth0"));
    }
}

/// Sum of the samples of `name` whose labels include every `k="v"` of `labels`, or None when
/// the exposition has none.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (n, l) = series.split_once('{').unwrap_or((series, ""));
        if n != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(f64::NAN);
        }
    }
    found
}

fn nft(netns: &str, args: &[&str]) {
    let mut a = vec!["ip", "netns", "exec", netns, "nft"];
    a.extend_from_slice(args);
    lb_tests::lab::sh(&a);
}

/// Each alert of deploy/monitoring/prometheus-rule.yaml, caused with real lbds in a VRRP lab
/// (n1 priority 150, n2 100, and n3 on the same VRID with another VIP: a VRID collision),
/// and read from the metric the alert fires on, summed over the nodes as Prometheus would.
#[test]
fn each_alert_condition_shows_in_its_metric() {
    use lb_tests::vrrp_lab::{NodeOpts, VrrpLab};
    // A low flood threshold, so that the client's connections turn flood mode on.
    let top = "syn_flood_rate = 10\n".to_string();
    let l = VrrpLab::new(
        LABNODE,
        vec![
            NodeOpts {
                priority: 150,
                top: top.clone(),
                ..Default::default()
            },
            NodeOpts {
                priority: 100,
                top: top.clone(),
                ..Default::default()
            },
            NodeOpts {
                priority: 200,
                vip: Some("10.78.0.200"),
                ..Default::default()
            },
        ],
    );
    let pair = [0usize, 1];
    assert_eq!(
        l.wait_one_master(&pair, Duration::from_secs(15)),
        Some(0),
        "{}",
        l.logs()
    );
    let scrape = |i: usize| {
        let (status, body) = l.get(i, "/metrics");
        assert_eq!(status, 200, "{body}");
        body
    };
    // sum by (vip) (lbd_vip_owned) over the two nodes that share the VIP.
    let holders = || -> f64 {
        pair.iter()
            .map(|i| metric(&scrape(*i), "lbd_vip_owned", &[("vip", "api")]).unwrap())
            .sum()
    };
    let wait_metric = |what: &str, f: &dyn Fn() -> bool| {
        let ok = lb_tests::lab::wait_for(Duration::from_secs(20), || f().then_some(()));
        assert!(ok.is_some(), "{what}\n{}", l.logs());
    };
    wait_metric("one holder", &|| holders() == 1.0);
    let ready = metric(&scrape(0), "lbd_ready", &[]).unwrap();
    assert_eq!(ready, 1.0, "LbNotReady stays quiet on a ready lbd");

    // LbVrrpVridCollision: n3's adverts carry our VRID with another VIP.
    wait_metric("collisions counted", &|| {
        (0..3)
            .map(|i| metric(&scrape(i), "lbd_vrrp_collisions_total", &[("vrrp", "api")]).unwrap())
            .sum::<f64>()
            > 0.0
    });

    // LbVipWithTwoHolders, and LbVrrpFlapping: n2 stops hearing n1 (adverts dropped on input),
    // takes the VIP as well, and gives it back when it hears n1 again; three times.
    let netns = l.lab.node(&l.nodes[1]).netns.clone();
    let table = format!("{}_ops", l.lab.prefix.replace('-', "_"));
    let before = metric(&scrape(1), "lbd_vrrp_transitions_total", &[("vrrp", "api")]).unwrap();
    for round in 0..3 {
        nft(&netns, &["add", "table", "inet", &table]);
        nft(
            &netns,
            &[
                "add",
                "chain",
                "inet",
                &table,
                "in",
                "{ type filter hook input priority 0 ; }",
            ],
        );
        nft(
            &netns,
            &[
                "add", "rule", "inet", &table, "in", "meta", "l4proto", "112", "drop",
            ],
        );
        wait_metric(&format!("two holders (round {round})"), &|| {
            holders() == 2.0
        });
        nft(&netns, &["delete", "table", "inet", &table]);
        wait_metric(&format!("one holder again (round {round})"), &|| {
            holders() == 1.0
        });
    }
    let after = metric(&scrape(1), "lbd_vrrp_transitions_total", &[("vrrp", "api")]).unwrap();
    assert!(
        after - before > 4.0,
        "LbVrrpFlapping's increase > 4: {before} -> {after}"
    );

    // LbVipWithoutHolder: both nodes' links down (FAULT): nobody holds the VIP.
    l.set_link(0, false);
    l.set_link(1, false);
    wait_metric("no holder", &|| holders() == 0.0);
    l.set_link(0, true);
    l.set_link(1, true);
    wait_metric("a holder again", &|| holders() == 1.0);

    // LbSynFloodMode: short connections through the VIP, above 10 new connections/s.
    let flood = std::thread::scope(|s| {
        let traffic = s.spawn(|| l.probe_for(4, 300));
        let seen = lb_tests::lab::wait_for(Duration::from_secs(4), || {
            (metric(&scrape(0), "lbd_syn_flood_mode", &[]).unwrap() == 1.0).then_some(())
        });
        let _ = traffic.join();
        seen
    });
    assert!(flood.is_some(), "flood mode never showed\n{}", l.log(0));

    // LbBackendDown, then LbVipNoHealthyBackend: the backends' servers stop, one by one.
    let mut lab = l;
    let n2 = lab.addr(&lab.nodes[1].clone());
    lab.lab.stop("server-n2", libc::SIGKILL);
    let down = |lab: &VrrpLab, be: &str| {
        let text = {
            let (_, b) = lab.get(0, "/metrics");
            b
        };
        metric(&text, "lbd_backend_up", &[("vip", "api"), ("backend", be)]) == Some(0.0)
            && metric(
                &text,
                "lbd_backend_drained",
                &[("vip", "api"), ("backend", be)],
            ) == Some(0.0)
    };
    let ok = lb_tests::lab::wait_for(Duration::from_secs(20), || down(&lab, &n2).then_some(()));
    assert!(ok.is_some(), "backend down\n{}", lab.logs());
    let nodes = lab.nodes.clone();
    for n in &nodes {
        lab.lab.stop(&format!("server-{n}"), libc::SIGKILL);
    }
    let ok = lb_tests::lab::wait_for(Duration::from_secs(20), || {
        let (_, text) = lab.get(0, "/metrics");
        (metric(&text, "lbd_vip_backends_active", &[("vip", "api")]) == Some(0.0)
            && metric(&text, "lbd_vip_owned", &[("vip", "api")]) == Some(1.0))
        .then_some(())
    });
    assert!(
        ok.is_some(),
        "no healthy backend on the owner\n{}",
        lab.logs()
    );

    // LbReloadFailing: a config lbd refuses, then the good one again.
    let path = lab.config_path(0);
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        good.replace("[[vrrp]]", "[[vrrp]]\nno_such_field = 1"),
    )
    .unwrap();
    let out = lbctl_output(&lab.socket(0), &["reload"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let (_, text) = lab.get(0, "/metrics");
    assert_eq!(
        metric(&text, "lbd_config_last_reload_successful", &[]),
        Some(0.0)
    );
    std::fs::write(&path, good).unwrap();
    let out = lbctl_output(&lab.socket(0), &["reload"]);
    assert!(out.status.success(), "{out:?}");
    let (_, text) = lab.get(0, "/metrics");
    assert_eq!(
        metric(&text, "lbd_config_last_reload_successful", &[]),
        Some(1.0)
    );
}

/// `lbctl flows`: the connection table's entries of real connections, named by VIP and
/// backend, filtered and bounded, read while lbd forwards.
#[test]
fn flows_lists_the_connection_table() {
    use lb_userspace::status::FlowsRow;
    let l = setup(LABNODE);
    let socket = l.socket.as_str();
    let r = l.connect_many(LABNODE, VIP4, 50);
    assert_eq!(r["ok"], 50, "{r}");
    let client = l.lab.node("client").v4.clone();
    let backends: Vec<String> = ["b1", "b2", "b3"]
        .iter()
        .map(|n| l.lab.node(n).v4.clone())
        .collect();

    let all: FlowsRow = json(
        socket,
        &["flows", &format!("{VIP4}:8080"), "--limit", "1000"],
    );
    let ct: Vec<_> = all
        .flows
        .iter()
        .filter(|f| f.table == "conntrack")
        .collect();
    assert!(ct.len() >= 50, "{} entries: {all:?}", ct.len());
    assert!(!all.truncated);
    for f in &ct {
        assert_eq!(f.vip.to_string(), VIP4);
        assert_eq!(f.port, 8080);
        assert_eq!(f.client.to_string(), client);
        assert_eq!(f.vip_name.as_deref(), Some("web4"), "{f:?}");
        assert!(f.current, "{f:?}");
        let be = f.backend.expect("backend named").to_string();
        assert!(backends.contains(&be), "{be}");
    }
    // Every backend got some of the 50 (weights 1, 1, 2).
    for b in &backends {
        assert!(
            ct.iter().any(|f| f.backend.unwrap().to_string() == *b),
            "{b} has no entry"
        );
    }
    // By name, and bounded.
    let named: FlowsRow = json(socket, &["flows", "web4", "--limit", "5"]);
    assert_eq!(
        named
            .flows
            .iter()
            .filter(|f| f.table == "conntrack")
            .count(),
        5
    );
    assert!(named.truncated);
    // Filters that match nothing.
    let other: FlowsRow = json(socket, &["flows", VIP4, "--client", "10.77.0.250"]);
    assert!(other.flows.is_empty(), "{other:?}");
    let one_client: FlowsRow = json(
        socket,
        &[
            "flows",
            "--client",
            &format!("{client}:{}", ct[0].client_port),
        ],
    );
    assert!(
        one_client
            .flows
            .iter()
            .all(|f| f.client_port == ct[0].client_port),
        "{one_client:?}"
    );
    assert!(!one_client.flows.is_empty());
    // A bad filter is refused by name (exit 1), not ignored.
    let out = lbctl_output(socket, &["flows", "nosuchvip"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// LbNotReady: the interface disappears (renamed away): lbd is not ready, says why, and
/// `lbd_ready` shows it; with the interface back, ready again.
#[test]
fn lbd_ready_follows_the_interface() {
    let l = setup(LABNODE);
    let socket = l.socket.as_str();
    let metrics = || {
        let out = lb_tests::lab::try_sh(&[
            "curl",
            "-s",
            "-m",
            "10",
            "--unix-socket",
            socket,
            "http://lbd/metrics",
        ]);
        metric(&String::from_utf8_lossy(&out.stdout), "lbd_ready", &[])
    };
    assert_eq!(metrics(), Some(1.0));
    let netns = l.lab.node("lb").netns.clone();
    let rename = |from: &str, to: &str| {
        lb_tests::lab::sh(&["ip", "-n", &netns, "link", "set", "dev", from, "name", to]);
    };
    lb_tests::lab::sh(&["ip", "-n", &netns, "link", "set", "dev", "eth0", "down"]);
    rename("eth0", "ops-away");
    let gone = lb_tests::lab::wait_for(Duration::from_secs(20), || {
        (metrics() == Some(0.0)).then_some(())
    });
    let probe = lbctl_output(socket, &["probe", "ready"]);
    rename("ops-away", "eth0");
    lb_tests::lab::sh(&["ip", "-n", &netns, "link", "set", "dev", "eth0", "up"]);
    assert!(gone.is_some(), "lbd_ready stayed 1\n{}", l.lab.log("lbd"));
    assert_eq!(probe.status.code(), Some(1), "{probe:?}");
    assert!(
        String::from_utf8_lossy(&probe.stderr).contains("not attached"),
        "{probe:?}"
    );
    let back = lb_tests::lab::wait_for(Duration::from_secs(20), || {
        (metrics() == Some(1.0)).then_some(())
    });
    assert!(back.is_some(), "ready again\n{}", l.lab.log("lbd"));
}
