//! Cluster monitoring, proven against a real Prometheus (Debian's `prometheus` and `promtool`):
//! the shipped alert rules' unit tests, and a lab where Prometheus scrapes every lbd over the
//! path OpenShift uses (HTTPS with the node's serving certificate, a client certificate for
//! prometheus-k8s checked against the client CA), loads the rules extracted from the shipped
//! PrometheusRule, and sees each alert fire and resolve. Needs root; `cargo xtask test`.
//!
//! The lab's time scale: every duration of the rules (`for:` and range selectors) is divided by
//! [`SCALE`] (`lb_tests::monitoring::rules_file`), and Prometheus scrapes and evaluates every
//! 500 ms, so what takes minutes on a cluster takes seconds here. Nothing else of a rule changes.

use std::time::Duration;

use lb_tests::{
    lab::wait_for,
    monitoring::{Ca, Prometheus, promtool_test_rules, rules_file, shipped},
    vrrp_lab::{NodeOpts, PORT, VRID, VrrpLab},
};
use lb_userspace::metrics_tls::PROMETHEUS_K8S;
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

/// Rule durations are divided by this in the lab (5m -> 5 s, 30s -> 500 ms, 1h -> 60 s).
const SCALE: u32 = 60;
/// The metrics TLS port, as `lbctl render` sets it.
const TLS_PORT: u16 = lb_userspace::render::DEFAULT_METRICS_TLS_PORT;
/// The tracked check every node's instance needs (weight 0: FAULT while it fails), served by a
/// `gate-<node>` process: stopping them all leaves the VIP without a holder while every lbd runs.
const GATE_PORT: &str = "7999";

#[test]
fn promtool_unit_tests_of_every_alert_pass_and_catch_a_broken_rule() {
    let dir = std::env::temp_dir().join(format!("lb-promtool-{}", std::process::id()));
    let out = promtool_test_rules(&dir);
    assert!(
        out.status.success(),
        "promtool test rules: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every alert of the rule has a unit test.
    let tests: Value =
        serde_norway::from_str(&shipped("deploy/monitoring/rule-tests.yaml")).unwrap();
    let tested: Vec<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|a| !a["exp_alerts"].as_array().unwrap().is_empty())
        .map(|a| a["alertname"].as_str().unwrap())
        .collect();
    let rules: Value = serde_norway::from_str(&rules_file(1, false)).unwrap();
    for g in rules["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let name = r["alert"].as_str().unwrap();
            assert!(
                tested.contains(&name),
                "{name} has no promtool test where it fires"
            );
        }
    }
    // The tests can fail: a rule that never fires for a down target is caught.
    let broken = rules_file(1, false).replace("up{job=\"lb\"} == 0", "up{job=\"lb\"} == 2");
    std::fs::write(dir.join("lb-rules.yaml"), broken).unwrap();
    let out = lb_tests::lab::try_sh(&[
        "promtool",
        "test",
        "rules",
        &dir.join("rule-tests.yaml").display().to_string(),
    ]);
    assert!(!out.status.success(), "a broken LbDown passed");
    let _ = std::fs::remove_dir_all(&dir);
}

fn gate_track() -> String {
    format!(
        "\n[[track]]\ninstance = \"api\"\nname = \"gate\"\nweight = 0\naddress = \"127.0.0.1:{GATE_PORT}\"\n[track.health]\nkind = \"tcp\"\ninterval_ms = 200\n"
    )
}

fn start_gate(l: &mut VrrpLab, i: usize) {
    let n = l.nodes[i].clone();
    l.lab.spawn(
        &n,
        &format!("gate-{n}"),
        LABNODE,
        &["serve-id", GATE_PORT, &n],
    );
}

fn start_server(l: &mut VrrpLab, i: usize) {
    let n = l.nodes[i].clone();
    l.lab
        .spawn(&n, &format!("server-{n}"), LABNODE, &["serve-id", PORT, &n]);
}

/// The file-based target list (what the Service's endpoints are on a cluster: one target per
/// lb pod), written atomically.
fn write_targets(l: &VrrpLab, nodes: &[usize]) {
    let targets: Vec<Value> = nodes
        .iter()
        .map(|i| {
            let n = &l.nodes[*i];
            serde_json::json!({
                "targets": [format!("{}:{TLS_PORT}", l.addr(n))],
                "labels": {"node": n},
            })
        })
        .collect();
    let tmp = l.lab.dir.join("targets.json.tmp");
    std::fs::write(&tmp, serde_json::to_string(&targets).unwrap()).unwrap();
    std::fs::rename(tmp, l.lab.dir.join("targets.json")).unwrap();
}

struct Watch<'a> {
    p: &'a Prometheus,
    /// Dashboard queries that have not returned data yet.
    panels: std::cell::RefCell<Vec<(String, String)>>,
}

impl Watch<'_> {
    fn check_panels(&self, l: &VrrpLab) {
        self.panels
            .borrow_mut()
            .retain(|(_, q)| self.p.query(&l.lab, q).is_empty());
    }

    fn context(&self, l: &VrrpLab) -> String {
        format!(
            "alerts: {:?}\nprometheus: {}\n{}",
            self.p.alerts(&l.lab),
            l.lab.log(&self.p.tag),
            l.logs()
        )
    }

    /// Wait for `name` to fire; its firing alerts' labels.
    fn fires(&self, l: &VrrpLab, name: &str, why: &str) -> Vec<Value> {
        let got = wait_for(Duration::from_secs(60), || {
            self.check_panels(l);
            let f = self.p.firing(&l.lab, name);
            (!f.is_empty()).then_some(f)
        });
        got.unwrap_or_else(|| panic!("{name} never fired ({why})\n{}", self.context(l)))
    }

    /// Wait for `name` to be neither pending nor firing.
    fn resolves(&self, l: &VrrpLab, name: &str) {
        let ok = wait_for(Duration::from_secs(90), || {
            self.p.inactive(&l.lab, name).then_some(())
        });
        assert!(ok.is_some(), "{name} never resolved\n{}", self.context(l));
    }

    /// Wait until no alert is pending or firing: all is well, so all is quiet.
    fn quiet(&self, l: &VrrpLab, when: &str) {
        let ok = wait_for(Duration::from_secs(60), || {
            self.check_panels(l);
            self.p.alerts(&l.lab).is_empty().then_some(())
        });
        assert!(
            ok.is_some(),
            "alerts while all is well ({when})\n{}",
            self.context(l)
        );
    }
}

fn curl_metrics(l: &VrrpLab, node: &str, cert: Option<(&str, &str)>, ca: &str) -> (bool, String) {
    let url = format!("https://{}:{TLS_PORT}/metrics", l.addr(node));
    let mut c = l.lab.cmd("client", "curl");
    c.args(["-s", "-m", "5", "-w", "\n%{http_code}", "--cacert", ca]);
    if let Some((crt, key)) = cert {
        c.args(["--cert", crt, "--key", key]);
    }
    let out = c.arg(url).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

fn nft(l: &VrrpLab, i: usize, args: &[&str]) {
    let netns = l.lab.node(&l.nodes[i]).netns.clone();
    let mut a = vec!["ip", "netns", "exec", netns.as_str(), "nft"];
    a.extend_from_slice(args);
    lb_tests::lab::sh(&a);
}

/// n1 cannot send adverts (an nftables output drop: sendmsg fails) while `on`.
fn block_adverts(l: &VrrpLab, table: &str, on: bool) {
    if on {
        nft(l, 0, &["add", "table", "inet", table]);
        nft(
            l,
            0,
            &[
                "add",
                "chain",
                "inet",
                table,
                "out",
                "{ type filter hook output priority 0 ; }",
            ],
        );
        nft(
            l,
            0,
            &[
                "add", "rule", "inet", table, "out", "meta", "l4proto", "112", "drop",
            ],
        );
    } else {
        nft(l, 0, &["delete", "table", "inet", table]);
    }
}

/// Node `i` drops TCP SYNs to its server's port while `on`: a health check of that server then
/// times out (a soft failure), where a stopped server would refuse (a hard one).
fn drop_checks(l: &VrrpLab, i: usize, on: bool) {
    let table = "lbmonslow";
    if on {
        nft(l, i, &["add", "table", "inet", table]);
        nft(
            l,
            i,
            &[
                "add",
                "chain",
                "inet",
                table,
                "in",
                "{ type filter hook input priority 0 ; }",
            ],
        );
        nft(
            l,
            i,
            &[
                "add", "rule", "inet", table, "in", "tcp", "dport", PORT, "tcp", "flags", "syn",
                "drop",
            ],
        );
    } else {
        nft(l, i, &["delete", "table", "inet", table]);
    }
}

#[test]
fn prometheus_scrapes_every_lbd_over_tls_and_each_alert_fires_and_resolves() {
    // Three lbd nodes with unicast peers (n1 150, n2 100, n3 50), a tracked gate each, sync,
    // a low SYN flood threshold, and the TLS metrics listener with the node's certificate.
    let opts = (0..3)
        .map(|i| NodeOpts {
            priority: [150, 100, 50][i],
            unicast: true,
            ..Default::default()
        })
        .collect();
    let mut l = VrrpLab::prepare(LABNODE, opts);
    let dir = l.lab.dir.clone();
    let path = |f: &str| dir.join(f).display().to_string();
    let serving = Ca::new("kubelet-serving");
    let client_ca = Ca::new("kubelet client CA");
    let write = |f: &str, s: &str| std::fs::write(dir.join(f), s).unwrap();
    write("serving-ca.crt", &serving.pem);
    write("client-ca.crt", &client_ca.pem);
    let (crt, key) = client_ca.leaf(PROMETHEUS_K8S, &[]);
    write("prometheus.crt", &crt);
    write("prometheus.key", &key);
    let (crt, key) = client_ca.leaf("system:serviceaccount:default:nosy", &[]);
    write("nosy.crt", &crt);
    write("nosy.key", &key);
    let (crt, key) = Ca::new("someone else's CA").leaf(PROMETHEUS_K8S, &[]);
    write("stranger.crt", &crt);
    write("stranger.key", &key);
    write("sync.key", "monitoring-lab-cluster-key-0123456789abcdef");
    {
        use std::os::unix::fs::PermissionsExt;
        let key = dir.join("sync.key");
        std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let addrs: Vec<String> = l.nodes.iter().map(|n| l.addr(n)).collect();
    for i in 0..3 {
        let n = l.nodes[i].clone();
        // The node's serving certificate, as the kubelet's: one PEM with chain and key.
        let (crt, key) = serving.leaf(&n, &[&addrs[i], &n]);
        write(&format!("{n}-serving.pem"), &format!("{crt}{key}"));
        let peers: Vec<String> = addrs
            .iter()
            .filter(|a| **a != addrs[i])
            .map(|a| format!("\"{a}\""))
            .collect();
        l.opts[i].top = format!(
            "syn_flood_rate = 10\nmetrics_tls = {{ listen = \"0.0.0.0:{TLS_PORT}\", cert_file = \"{pem}\", key_file = \"{pem}\", client_ca_file = \"{ca}\" }}\nsync = {{ peers = [{peers}], key_file = \"{key}\" }}\n",
            pem = path(&format!("{n}-serving.pem")),
            ca = path("client-ca.crt"),
            peers = peers.join(", "),
            key = path("sync.key"),
        );
        std::fs::write(l.config_path(i), l.config(i) + &gate_track()).unwrap();
        start_gate(&mut l, i);
        l.start(i);
    }
    assert!(
        l.wait_one_master(&[0, 1, 2], Duration::from_secs(20))
            .is_some(),
        "{}",
        l.logs()
    );

    // The scrape path itself: Prometheus's certificate reads the metrics; another user of the
    // same CA gets 403; a certificate of another CA, or none, gets no TLS session.
    let ok = wait_for(Duration::from_secs(10), || {
        let (ok, body) = curl_metrics(
            &l,
            "n1",
            Some((&path("prometheus.crt"), &path("prometheus.key"))),
            &path("serving-ca.crt"),
        );
        (ok && body.ends_with("\n200") && body.contains("lbd_build_info")).then_some(())
    });
    assert!(
        ok.is_some(),
        "prometheus-k8s cannot read n1's metrics\n{}",
        l.logs()
    );
    let (_, body) = curl_metrics(
        &l,
        "n1",
        Some((&path("nosy.crt"), &path("nosy.key"))),
        &path("serving-ca.crt"),
    );
    assert!(body.ends_with("\n403"), "{body}");
    assert!(!body.contains("lbd_build_info"));
    for cert in [None, Some((path("stranger.crt"), path("stranger.key")))] {
        let (ok, body) = curl_metrics(
            &l,
            "n1",
            cert.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
            &path("serving-ca.crt"),
        );
        assert!(!ok && !body.contains("lbd_build_info"), "{cert:?}: {body}");
    }

    // Prometheus in the client namespace, scraping every node as the ServiceMonitor does.
    write("lb-rules.yaml", &rules_file(SCALE, true));
    write_targets(&l, &[0, 1, 2]);
    let config = format!(
        "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n  evaluation_interval: 500ms\nrule_files: [{rules}]\nscrape_configs:\n- job_name: lb\n  scheme: https\n  metrics_path: /metrics\n  tls_config:\n    ca_file: {ca}\n    cert_file: {crt}\n    key_file: {key}\n    insecure_skip_verify: false\n  file_sd_configs:\n  - files: [{targets}]\n    refresh_interval: 1s\n",
        rules = path("lb-rules.yaml"),
        ca = path("serving-ca.crt"),
        crt = path("prometheus.crt"),
        key = path("prometheus.key"),
        targets = path("targets.json"),
    );
    let p = Prometheus::start(&mut l.lab, "client", &dir, &config);
    let dash: Value = serde_json::from_str(&shipped("deploy/monitoring/dashboard.json")).unwrap();
    let panels = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| {
            panel["targets"].as_array().unwrap().iter().map(move |t| {
                (
                    panel["title"].as_str().unwrap().to_string(),
                    t["expr"].as_str().unwrap().to_string(),
                )
            })
        })
        .collect();
    let w = Watch {
        p: &p,
        panels: std::cell::RefCell::new(panels),
    };
    let all_up = wait_for(Duration::from_secs(30), || {
        let r = p.query(&l.lab, "sum(up{job=\"lb\"})");
        (r.first().map(|v| v["value"][1] == "3") == Some(true)).then_some(())
    });
    assert!(
        all_up.is_some(),
        "targets: {:?}\n{}",
        p.get(&l.lab, "/api/v1/targets"),
        l.logs()
    );
    w.quiet(&l, "start");

    // A VRID collision: adverts on our VRID with another VIP, at a low priority, from a peer's
    // address (unicast instances drop adverts from non-peers before looking at them).
    let dsts = addrs[..2].join(",");
    let sent = l.vrrp_send_from_client(
        LABNODE,
        "foreign",
        &[
            &dsts,
            &VRID.to_string(),
            "1",
            "10.78.0.200",
            "20",
            "2",
            &format!("from={}", addrs[2]),
        ],
    );
    assert!(sent > 0);
    w.fires(&l, "LbVrrpVridCollision", "foreign adverts on our VRID");
    w.resolves(&l, "LbVrrpVridCollision");

    // n1, the master, cannot send adverts: its sends fail, n2 takes the VIP too (two
    // holders), n1 hears n2 while master (split brain).
    let table = format!("{}_mon", l.lab.prefix.replace('-', "_"));
    block_adverts(&l, &table, true);
    w.fires(&l, "LbVrrpSendErrors", "n1's adverts dropped on output");
    let two = w.fires(&l, "LbVipWithTwoHolders", "n1 and n2 both master");
    assert_eq!(two[0]["vip"], "api", "{two:?}");
    w.fires(&l, "LbVrrpSplitBrain", "n1 hears n2 while master");
    block_adverts(&l, &table, false);
    // Flapping: n2 takes the VIP and gives it back, again and again.
    for _ in 0..3 {
        assert!(
            wait_for(Duration::from_secs(10), || (l.holders(&[0, 1]) == vec![0])
                .then_some(()))
            .is_some()
        );
        block_adverts(&l, &table, true);
        assert!(
            wait_for(Duration::from_secs(10), || (l.holders(&[0, 1]).len() == 2)
                .then_some(()))
            .is_some()
        );
        block_adverts(&l, &table, false);
    }
    let flap = w.fires(&l, "LbVrrpFlapping", "n2 changed state 8 times");
    assert!(flap.iter().any(|a| a["node"] == "n2"), "{flap:?}");
    for a in [
        "LbVrrpSendErrors",
        "LbVipWithTwoHolders",
        "LbVrrpSplitBrain",
        "LbVrrpFlapping",
    ] {
        w.resolves(&l, a);
    }

    // No holder: every node's tracked gate fails (FAULT), while every lbd runs and is scraped.
    for n in l.nodes.clone() {
        l.lab.stop(&format!("gate-{n}"), libc::SIGKILL);
    }
    w.fires(&l, "LbVipWithoutHolder", "every node in FAULT");
    for i in 0..3 {
        start_gate(&mut l, i);
    }
    w.resolves(&l, "LbVipWithoutHolder");

    // A backend down that was up: n3's server stops.
    l.lab.stop("server-n3", libc::SIGKILL);
    let down = w.fires(&l, "LbBackendDown", "n3's server stopped");
    assert!(
        down.iter().all(|a| a["backend"] == addrs[2].as_str()),
        "{down:?}"
    );
    start_server(&mut l, 2);
    w.resolves(&l, "LbBackendDown");

    // No healthy backend on the holder: every server stops.
    for n in l.nodes.clone() {
        l.lab.stop(&format!("server-{n}"), libc::SIGKILL);
    }
    w.fires(&l, "LbVipNoHealthyBackend", "every server stopped");
    for i in 0..3 {
        start_server(&mut l, i);
    }
    w.resolves(&l, "LbVipNoHealthyBackend");
    w.resolves(&l, "LbBackendDown");

    // Every check slow at once (SYNs to every server dropped: the checks time out, nothing
    // refuses): the VIP fails open, and says so; it ends when the checks pass again.
    for i in 0..3 {
        drop_checks(&l, i, true);
    }
    w.fires(&l, "LbVipFailOpen", "every backend's check times out");
    for i in 0..3 {
        drop_checks(&l, i, false);
    }
    w.resolves(&l, "LbVipFailOpen");
    w.resolves(&l, "LbVipNoHealthyBackend");
    w.resolves(&l, "LbBackendDown");

    // Sync datagrams from a sender that is not a peer.
    l.lab.run(
        "client",
        "bash",
        &[
            "-c",
            &format!(
                "for i in 1 2 3 4 5; do echo junk > /dev/udp/{}/{}; done",
                addrs[0],
                lb_userspace::sync::config::DEFAULT_PORT
            ),
        ],
    );
    let sync = w.fires(&l, "LbSyncRefusing", "datagrams from the client");
    assert!(sync.iter().any(|a| a["reason"] == "not_a_peer"), "{sync:?}");
    w.resolves(&l, "LbSyncRefusing");

    // A config lbd refuses, then the good one again.
    let cfg = l.config_path(0);
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        good.replace("[[vrrp]]", "[[vrrp]]\nno_such_field = 1"),
    )
    .unwrap();
    let _ = lb_tests::lbctl_output(&l.socket(0), &["reload"]);
    let reload = w.fires(&l, "LbReloadFailing", "n1 refused its config");
    assert!(reload.iter().all(|a| a["node"] == "n1"), "{reload:?}");
    std::fs::write(&cfg, &good).unwrap();
    let out = lb_tests::lbctl_output(&l.socket(0), &["reload"]);
    assert!(out.status.success(), "{out:?}");
    w.resolves(&l, "LbReloadFailing");

    // SYN flood mode: connections through the VIP above 10 a second.
    let flood = std::thread::scope(|s| {
        let traffic = s.spawn(|| l.probe_for(6, 300));
        let seen = wait_for(Duration::from_secs(6), || {
            (!p.firing(&l.lab, "LbSynFloodMode").is_empty()).then_some(())
        });
        let _ = traffic.join();
        seen
    });
    assert!(
        flood.is_some(),
        "LbSynFloodMode never fired\n{}",
        w.context(&l)
    );
    w.resolves(&l, "LbSynFloodMode");

    // lbd down on n3: its target stays (as the mirror pod does) and fails.
    l.stop(2, libc::SIGKILL);
    let down = w.fires(&l, "LbDown", "n3's lbd killed");
    assert!(down.iter().all(|a| a["node"] == "n3"), "{down:?}");
    assert!(
        p.inactive(&l.lab, "LbNodeNotScraped"),
        "a failing target is LbDown's"
    );
    l.start(2);
    w.resolves(&l, "LbDown");

    // n3's target gone (its pod removed): the peers still expect it.
    write_targets(&l, &[0, 1]);
    let gone = w.fires(&l, "LbNodeNotScraped", "n3 not a target");
    assert!(
        gone.iter().all(|a| a["peer"] == addrs[2].as_str()),
        "{gone:?}"
    );
    write_targets(&l, &[0, 1, 2]);
    w.resolves(&l, "LbNodeNotScraped");

    // No target at all.
    write_targets(&l, &[]);
    w.fires(&l, "LbMetricsAbsent", "no targets");
    write_targets(&l, &[0, 1, 2]);
    w.resolves(&l, "LbMetricsAbsent");

    w.quiet(&l, "end");
    w.check_panels(&l);
    let missing = w.panels.borrow().clone();
    assert!(
        missing.is_empty(),
        "dashboard queries that never returned data: {missing:?}"
    );
}
