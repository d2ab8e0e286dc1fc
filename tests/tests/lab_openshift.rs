//! lb renders the election OpenShift renders: a node running OpenShift's keepalived config and a
//! node running lbd with `lbctl render`'s config, both rendered from one cluster description
//! (the migration profile: keepalived still runs), agree on who owns each VIP for every
//! combination of the tracked checks' states. Needs root; `cargo xtask test`.
//!
//! Two compact-cluster nodes (control-plane and worker): n1 runs keepalived, n2 lbd. Each
//! node's state is a set of files the checks read: keepalived's scripts are `test -e` of them;
//! lbd's tracked checks probe stand-in servers in n2 answering by the same files (router
//! `/healthz` and `/healthz/ready` on 1936, apiserver `/readyz` on 6443, which is also the API
//! VIP's backend check, from which lbd's own readiness follows). For each combination the lab
//! waits until both speakers' priorities say the checks were seen, then samples who holds each
//! VIP on eth0: exactly one node of the highest priority by OpenShift's rules (nobody when every
//! node is in FAULT; of tied nodes the one that held it first), no dual-master sample, no state
//! transition while steady.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lb_tests::{
    bin_dir,
    lab::{Lab, has_address, wait_for},
    openshift::{Checks, api_priority, ingress_priority, keepalived_conf, top},
};
use lb_userspace::render::{ClusterSpec, to_toml};

const STANDIN: &str = env!("CARGO_BIN_EXE_standin");
const API_VIP: &str = "10.79.0.100";
const INGRESS_VIP: &str = "10.79.0.101";
const N1: &str = "10.79.0.11";
const N2: &str = "10.79.0.12";

/// One node's service states (what the checks see).
#[derive(Clone, Copy, Debug, PartialEq)]
struct NodeState {
    /// n1: haproxy ready (keepalived's chk_ocp_lb). n2's load balancer readiness is lbd's own:
    /// an active backend, i.e. some apiserver ready.
    lb: bool,
    apiserver: bool,
    router_live: bool,
    router_ready: bool,
}

fn description() -> String {
    format!(
        "name = \"ostest\"\ninterface = \"eth0\"\napi_vip = \"{API_VIP}\"\ningress_vip = \"{INGRESS_VIP}\"\napi_ports = [6443]\nvrrp_version = 2\nxdp_mode = \"skb\"\n\
         [[nodes]]\nname = \"n1\"\naddress = \"{N1}\"\nroles = [\"control-plane\", \"worker\"]\n\
         [[nodes]]\nname = \"n2\"\naddress = \"{N2}\"\nroles = [\"control-plane\", \"worker\"]\n"
    )
}

fn set(path: &Path, on: bool) {
    if on {
        std::fs::write(path, "").unwrap();
    } else {
        let _ = std::fs::remove_file(path);
    }
}

struct Rig {
    lab: Lab,
    state: PathBuf,
    socket: String,
}

impl Rig {
    fn file(&self, node: &str, what: &str) -> PathBuf {
        self.state.join(format!("{node}.{what}"))
    }

    fn apply(&self, n1: NodeState, n2: NodeState) {
        for (n, s) in [("n1", n1), ("n2", n2)] {
            set(&self.file(n, "lb"), s.lb);
            set(&self.file(n, "apiserver"), s.apiserver);
            set(&self.file(n, "live"), s.router_live);
            set(&self.file(n, "ready"), s.router_ready);
        }
    }

    fn holders(&self, vip: &str) -> Vec<&'static str> {
        ["n1", "n2"]
            .into_iter()
            .filter(|n| has_address(&self.lab.node(n).netns, "eth0", vip))
            .collect()
    }

    fn lbd(&self) -> Option<serde_json::Value> {
        lb_tests::lbctl_json(&self.socket, &["vrrp", "status"])
    }

    /// lbd's (state, effective priority) of instance `name`.
    fn lbd_instance(&self, name: &str) -> Option<(String, u64)> {
        let v = self.lbd()?;
        let i = v.as_array()?.iter().find(|i| i["name"] == name)?.clone();
        Some((
            i["state"].as_str()?.to_string(),
            i["effective_priority"].as_u64()?,
        ))
    }

    fn lbd_transitions(&self) -> u64 {
        self.lbd()
            .and_then(|v| {
                v.as_array().map(|a| {
                    a.iter()
                        .filter_map(|i| i["counters"]["transitions"].as_u64())
                        .sum()
                })
            })
            .unwrap_or(0)
    }

    fn ka_log(&self) -> String {
        self.lab.log("ka-n1")
    }

    /// keepalived's view of instance `name`: FAULT, or its effective priority (its log says
    /// each change with -D).
    fn ka_instance(&self, name: &str, base: u8) -> Option<u8> {
        let log = self.ka_log();
        let tag = format!("({name})");
        let mut prio = Some(base);
        let mut fault = false;
        for l in log.lines().filter(|l| l.contains(&tag)) {
            if l.contains("Entering FAULT STATE") {
                fault = true;
            } else if l.contains("Entering BACKUP STATE") || l.contains("Entering MASTER STATE") {
                fault = false;
            }
            if let Some(rest) = l.split("effective priority from ").nth(1) {
                prio = rest
                    .split(" to ")
                    .nth(1)
                    .and_then(|p| p.trim().parse().ok())
                    .or(prio);
            }
        }
        (!fault).then_some(prio).flatten()
    }

    fn ka_transitions(&self) -> u64 {
        self.ka_log()
            .lines()
            .filter(|l| l.contains("Entering ") && l.contains(" STATE"))
            .count() as u64
    }

    fn logs(&self) -> String {
        format!(
            "---- keepalived ----\n{}\n---- lbd ----\n{}",
            self.ka_log(),
            self.lab.log("lbd-n2")
        )
    }
}

#[test]
fn keepalived_and_lbd_elect_the_same_owner_for_every_check_combination() {
    let spec = ClusterSpec::parse(&description()).unwrap();
    let rendered = spec.render().unwrap();
    let mut lab = Lab::new("os");
    lab.add_node("n1", N1, "fd79::11");
    lab.add_node("n2", N2, "fd79::12");
    let state = lab.dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let socket = lab.dir.join("n2.sock").display().to_string();
    let rig_paths = |n: &str, w: &str| state.join(format!("{n}.{w}")).display().to_string();

    // n1: OpenShift's keepalived, its scripts reading the state files.
    let test = |files: &[String]| {
        let e: Vec<String> = files.iter().map(|f| format!("-e {f}")).collect();
        format!("/usr/bin/timeout 1.9 /usr/bin/test {}", e.join(" -o "))
    };
    let checks = Checks {
        ocp_lb: test(&[rig_paths("n1", "lb")]),
        ocp_both: test(&[rig_paths("n1", "lb"), rig_paths("n1", "apiserver")]),
        mcs: "/bin/true".into(),
        ingress: test(&[rig_paths("n1", "live")]),
        ingress_ready: test(&[rig_paths("n1", "ready")]),
        default_ingress: test(&[rig_paths("n1", "ready")]),
    };
    let conf = keepalived_conf(&spec, &spec.nodes[0], &checks);
    println!("keepalived.conf:\n{conf}");
    let conf_path = lab.dir.join("ka-n1.conf");
    std::fs::write(&conf_path, &conf).unwrap();

    // n2: lbd with the rendered config; only what the lab needs differs (pins, socket).
    let mut cfg = rendered[1].config.clone();
    // The election alone: no cluster key (sync and membership) in this lab.
    cfg.sync = None;
    cfg.members = None;
    cfg.name = format!("{}_n2", lab.prefix.replace('-', "_"));
    cfg.api_socket = socket.clone().into();
    let cfg_path = lab.dir.join("n2.toml");
    std::fs::write(
        &cfg_path,
        to_toml(
            "ostest",
            &lb_userspace::render::Rendered {
                node: "n2".into(),
                config: cfg.clone(),
            },
        ),
    )
    .unwrap();

    // Stand-ins: each node's apiserver (the API VIP's backends, and n2's local /readyz) and
    // router (n2's tracked checks; n1's router is the ingress VIP's other backend).
    for n in ["n1", "n2"] {
        lab.spawn(
            n,
            &format!("apiserver-{n}"),
            STANDIN,
            &[
                "https",
                "--listen",
                "0.0.0.0:6443",
                "--id",
                n,
                "--ready-file",
                &rig_paths(n, "apiserver"),
            ],
        );
        lab.spawn(
            n,
            &format!("router-{n}"),
            STANDIN,
            &[
                "http",
                "--listen",
                "0.0.0.0:1936",
                "--id",
                n,
                "--path-file",
                &format!("/healthz={}", rig_paths(n, "live")),
                "--path-file",
                &format!("/healthz/ready={}", rig_paths(n, "ready")),
            ],
        );
    }
    let rig = Rig { lab, state, socket };
    let all = NodeState {
        lb: true,
        apiserver: true,
        router_live: true,
        router_ready: true,
    };
    rig.apply(all, all);
    let mut rig = rig;
    let pin = PathBuf::from("/sys/fs/bpf").join(&cfg.name);
    rig.lab.cleanup(pin);
    rig.lab.spawn(
        "n2",
        "lbd-n2",
        bin_dir().join("lbd"),
        &["--config", &cfg_path.display().to_string()],
    );
    let pid = rig.lab.dir.join("ka-n1.pid").display().to_string();
    let vrrp_pid = rig.lab.dir.join("ka-n1-vrrp.pid").display().to_string();
    rig.lab.spawn(
        "n1",
        "ka-n1",
        "keepalived",
        &[
            "-n",
            "-P",
            "-l",
            "-D",
            "-G",
            "-f",
            &conf_path.display().to_string(),
            "-p",
            &pid,
            "-r",
            &vrrp_pid,
        ],
    );
    assert!(
        wait_for(Duration::from_secs(20), || rig.lbd().map(|_| ())).is_some(),
        "lbd answers\n{}",
        rig.logs()
    );

    // Every combination of the ingress checks of both nodes (live, ready) x (live, ready), and
    // with them every combination of the API's (n1's haproxy, n1's apiserver, n2's apiserver).
    let mut dual_total = 0;
    // The last single holder of each VIP, across steps (a move is a change of it).
    let mut last_api: Vec<&str> = Vec::new();
    let mut last_ing: Vec<&str> = Vec::new();
    let mut moves_total = 0;
    for k in 0..16u32 {
        let bit = |b: u32| k & (1 << b) != 0;
        let n1 = NodeState {
            lb: bit(0) ^ bit(3),
            apiserver: bit(1) ^ bit(2),
            router_live: bit(0),
            router_ready: bit(1),
        };
        let n2 = NodeState {
            lb: false,
            apiserver: bit(2),
            router_live: bit(2),
            router_ready: bit(3),
        };
        rig.apply(n1, n2);
        // OpenShift's rules on what each speaker's checks see.
        let n2_lb = n1.apiserver || n2.apiserver;
        let api = [
            api_priority(n1.lb, n1.lb || n1.apiserver, false),
            api_priority(n2_lb, n2_lb || n2.apiserver, false),
        ];
        let ing = [
            ingress_priority(n1.router_live, n1.router_ready, n1.router_ready),
            ingress_priority(n2.router_live, n2.router_ready, n2.router_ready),
        ];
        let addr = |s: &str| s.parse::<IpAddr>().unwrap();
        let names = |v: Vec<IpAddr>| -> Vec<&'static str> {
            v.into_iter()
                .map(|a| if a == addr(N1) { "n1" } else { "n2" })
                .collect()
        };
        let want_api = names(top(&[(addr(N1), Some(api[0])), (addr(N2), Some(api[1]))]));
        let want_ing = names(top(&[(addr(N1), ing[0]), (addr(N2), ing[1])]));
        // Exactly one holder, one of the best (nobody when all are in FAULT).
        let fits = |h: &[&str], want: &[&str]| {
            if want.is_empty() {
                h.is_empty()
            } else {
                h.len() == 1 && want.contains(&h[0])
            }
        };
        let what = format!(
            "step {k}: n1 {n1:?} n2 {n2:?}: api priorities {api:?} -> {want_api:?}, ingress {ing:?} -> {want_ing:?}"
        );
        println!("{what}");

        // Both speakers have seen the checks (keepalived: rise 3 at up to 5 s intervals).
        let mut dual = 0;
        let mut moves = 0;
        let mut watch = |rig: &Rig, dual: &mut u32, moves: &mut u32| {
            for (vip, last) in [(API_VIP, &mut last_api), (INGRESS_VIP, &mut last_ing)] {
                let h = rig.holders(vip);
                if h.len() > 1 {
                    *dual += 1;
                }
                if h.len() == 1 && !last.is_empty() && h != *last {
                    *moves += 1;
                }
                if h.len() == 1 {
                    *last = h;
                }
            }
        };
        let start = Instant::now();
        let seen = loop {
            watch(&rig, &mut dual, &mut moves);
            let ka_api = rig.ka_instance("ostest_API_0", 40);
            let ka_ing = rig.ka_instance("ostest_INGRESS_0", 20);
            let lb_api = rig.lbd_instance("api");
            let lb_ing = rig.lbd_instance("ingress");
            let lbd_ok = |got: Option<(String, u64)>, want: Option<u8>| match (got, want) {
                (Some((s, _)), None) => s == "fault",
                (Some((s, p)), Some(w)) => s != "fault" && p == u64::from(w),
                _ => false,
            };
            if ka_api == Some(api[0])
                && ka_ing == ing[0]
                && lbd_ok(lb_api.clone(), Some(api[1]))
                && lbd_ok(lb_ing.clone(), ing[1])
                && fits(&rig.holders(API_VIP), &want_api)
                && fits(&rig.holders(INGRESS_VIP), &want_ing)
            {
                break true;
            }
            if start.elapsed() > Duration::from_secs(40) {
                println!(
                    "keepalived api {ka_api:?} ingress {ka_ing:?}; lbd api {lb_api:?} ingress {lb_ing:?}; holders api {:?} ingress {:?}",
                    rig.holders(API_VIP),
                    rig.holders(INGRESS_VIP)
                );
                break false;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(seen, "{what}: never converged\n{}", rig.logs());

        // Steady: the same holders, nobody changes state.
        let held = (rig.holders(API_VIP), rig.holders(INGRESS_VIP));
        let before = (rig.ka_transitions(), rig.lbd_transitions());
        let steady = Instant::now();
        let mut samples = 0;
        while steady.elapsed() < Duration::from_secs(3) {
            assert_eq!(rig.holders(API_VIP), held.0, "{what}\n{}", rig.logs());
            assert_eq!(rig.holders(INGRESS_VIP), held.1, "{what}\n{}", rig.logs());
            samples += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        let after = (rig.ka_transitions(), rig.lbd_transitions());
        assert_eq!(
            before,
            after,
            "{what}: transitions while steady\n{}",
            rig.logs()
        );
        assert!(samples > 5);
        // lbd's view agrees with keepalived's: it follows n1 as master where n1 holds a VIP.
        let status = rig.lbd().unwrap();
        for (inst, want, fault) in [
            ("api", &held.0, false),
            ("ingress", &held.1, ing[1].is_none()),
        ] {
            let s = status
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["name"] == inst)
                .unwrap();
            if fault {
                assert_eq!(s["state"], "fault", "{what}: {s}");
            } else if *want == vec!["n1"] {
                assert_eq!(s["state"], "backup", "{what}: {s}");
                assert_eq!(s["master"], N1, "{what}: {s}");
            }
            assert_eq!(s["collisions"]["peers"], serde_json::json!({}), "{s}");
        }
        println!("  converged; dual-master samples {dual}, VIP moves {moves}");
        assert!(
            dual <= 1,
            "{what}: {dual} dual-master samples\n{}",
            rig.logs()
        );
        dual_total += dual;
        moves_total += moves;
    }
    println!("16 combinations: dual-master samples {dual_total}, VIP moves {moves_total}");
}
