//! A lab shaped like a small OpenShift cluster, for the demo: three control-plane nodes running
//! lbd and an API stand-in (HTTPS on 6443 serving /readyz), two workers running lbd and an
//! ingress-router stand-in (HTTP 80, HTTPS 443, /healthz on 1936), and a client.
//!
//! The API VIP and the ingress VIP are each owned by one node, chosen by VRRP (VRIDs derived
//! from the cluster name the way OpenShift does). Port 7000 of the API VIP is a long-lived echo
//! service (`labnode serve-id`) used to show that open connections survive a VIP move.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    bin_dir,
    lab::{Lab, wait_for},
};

pub const CLUSTER: &str = "demo";
pub const API_VIP: &str = "10.79.0.5";
pub const INGRESS_VIP: &str = "10.79.0.7";
pub const ECHO_PORT: &str = "7000";
pub const CONTROL_PLANE: [&str; 3] = ["cp1", "cp2", "cp3"];
pub const WORKERS: [&str; 2] = ["w1", "w2"];

pub struct Cluster {
    pub lab: Lab,
    pub opts: Options,
}

fn addr(i: usize) -> String {
    format!("10.79.0.{}", 11 + i)
}

/// Variations of the cluster for labs that need more than the demo (the chaos bench).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Connection-table entries of every lbd (default: lbd's default).
    pub conntrack_size: Option<u32>,
    /// Workers also run the echo service and the ingress VIP serves [`ECHO_PORT`], so
    /// long-lived connections can go through both VIPs.
    pub worker_echo: bool,
    /// Control-plane nodes run a second VRRP instance ("aux", [`AUX_VIP`]), so a reload can
    /// change one of two instances.
    pub aux_instance: bool,
    /// Priority of the aux instance per control-plane node (default 40 everywhere).
    pub aux_priority: Option<[u8; 3]>,
    /// One more host on the segment ([`HOSTILE`]) that runs nothing of ours.
    pub hostile: bool,
}

/// The aux instance's VIP (see [`Options::aux_instance`]).
pub const AUX_VIP: &str = "10.79.0.9";
/// The hostile host's node name and address.
pub const HOSTILE: &str = "hostile";
pub const HOSTILE_ADDR: &str = "10.79.0.66";

/// The address of a cluster node ("cp1".."cp3", "w1", "w2").
pub fn node_addr(node: &str) -> String {
    let i = CONTROL_PLANE
        .iter()
        .chain(WORKERS.iter())
        .position(|n| *n == node)
        .unwrap_or_else(|| panic!("no cluster node {node}"));
    addr(i)
}

/// The aux instance's VRID: next to the API one, never the ingress one.
pub fn aux_vrid() -> u8 {
    let (api, ingress) = lb_userspace::vrrp::vrids::openshift_vrids(CLUSTER);
    let mut v = api;
    loop {
        v = if v >= 254 { 1 } else { v + 1 };
        if v != ingress && v != api {
            return v;
        }
    }
}

impl Cluster {
    pub fn new() -> Cluster {
        Cluster::with(Options::default())
    }

    pub fn with(opts: Options) -> Cluster {
        let mut lab = Lab::new("cl");
        lab.add_node("client", "10.79.0.1", "fd79::1");
        let nodes: Vec<&str> = CONTROL_PLANE
            .iter()
            .chain(WORKERS.iter())
            .copied()
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            lab.add_node(n, &addr(i), &format!("fd79::{}", 11 + i));
        }
        if opts.hostile {
            lab.add_node(HOSTILE, HOSTILE_ADDR, "fd79::66");
        }
        let mut c = Cluster { lab, opts };
        for n in &nodes {
            std::fs::write(c.ready_file(n), "").unwrap();
            c.start_services(n);
        }
        for (i, n) in nodes.iter().enumerate() {
            std::fs::write(c.config_path(n), c.config(i, n)).unwrap();
            c.start(n);
        }
        c
    }

    /// Start what a node serves (everything but lbd): the apiserver stand-in and the echo
    /// service on control-plane nodes, the router stand-ins (and the echo service with
    /// [`Options::worker_echo`]) on workers. Tags: `apiserver-N`, `echo-N`, `router-*-N`.
    pub fn start_services(&mut self, n: &str) {
        let standin = bin_dir().join("standin");
        let labnode = bin_dir().join("labnode");
        let r = self.ready_file(n).display().to_string();
        if CONTROL_PLANE.contains(&n) {
            self.lab.spawn(
                n,
                &format!("apiserver-{n}"),
                &standin,
                &[
                    "https",
                    "--listen",
                    "0.0.0.0:6443",
                    "--id",
                    n,
                    "--ready-file",
                    &r,
                ],
            );
        } else {
            for (tag, kind, port) in [
                ("http", "http", "80"),
                ("https", "https", "443"),
                ("health", "http", "1936"),
            ] {
                let listen = format!("0.0.0.0:{port}");
                self.lab.spawn(
                    n,
                    &format!("router-{tag}-{n}"),
                    &standin,
                    &[kind, "--listen", &listen, "--id", n, "--ready-file", &r],
                );
            }
        }
        if CONTROL_PLANE.contains(&n) || self.opts.worker_echo {
            self.lab.spawn(
                n,
                &format!("echo-{n}"),
                &labnode,
                &["serve-id", ECHO_PORT, n],
            );
        }
    }

    /// Tags of the processes [`Cluster::start_services`] starts on `n`.
    pub fn service_tags(&self, n: &str) -> Vec<String> {
        let mut v = if CONTROL_PLANE.contains(&n) {
            vec![format!("apiserver-{n}")]
        } else {
            ["http", "https", "health"]
                .iter()
                .map(|t| format!("router-{t}-{n}"))
                .collect()
        };
        if CONTROL_PLANE.contains(&n) || self.opts.worker_echo {
            v.push(format!("echo-{n}"));
        }
        v
    }

    pub fn ready_file(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("{node}.ready"))
    }
    pub fn socket(&self, node: &str) -> String {
        self.lab
            .dir
            .join(format!("{node}.sock"))
            .display()
            .to_string()
    }
    pub fn config_path(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("{node}.toml"))
    }
    fn pin_name(&self, node: &str) -> String {
        format!("{}_{node}", self.lab.prefix.replace('-', "_"))
    }

    /// OpenShift's shape: control-plane nodes run the API instance (priority 40, +20 while the
    /// load balancer has an active backend, +5 while the local apiserver is ready), workers the
    /// ingress instance (priority 20, +50 while the local router is healthy).
    pub fn config(&self, i: usize, node: &str) -> String {
        let (api_vrid, ingress_vrid) = lb_userspace::vrrp::vrids::openshift_vrids(CLUSTER);
        let cp = CONTROL_PLANE.contains(&node);
        let mut c = format!(
            "interface = \"eth0\"\nname = \"{}\"\napi_socket = \"{}\"\nxdp_mode = \"skb\"\n",
            self.pin_name(node),
            self.socket(node)
        );
        if let Some(n) = self.opts.conntrack_size {
            c += &format!("conntrack_size = {n}\n");
        }
        let peers = |group: &[&str], offset: usize| -> String {
            group
                .iter()
                .enumerate()
                .filter(|(_, n)| **n != node)
                .map(|(j, _)| format!("\"{}\"", addr(offset + j)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if cp {
            c += &format!(
                "\n[[vips]]\nname = \"api\"\naddress = \"{API_VIP}\"\nports = [6443, {ECHO_PORT}]\nvrrp = \"api\"\n[vips.health]\nkind = \"https\"\npath = \"/readyz\"\nport = 6443\n"
            );
            for j in 0..3 {
                c += &format!("[[vips.backends]]\naddress = \"{}\"\n", addr(j));
            }
            c += &format!(
                "\n[[vrrp]]\nname = \"api\"\nvrid = {api_vrid}\npriority = 40\nvips = [\"{API_VIP}\"]\nunicast_src = \"{}\"\nunicast_peers = [{}]\n",
                addr(i),
                peers(&CONTROL_PLANE, 0)
            );
            c += "\n[[track]]\ninstance = \"api\"\nname = \"lb-ready\"\nweight = 20\n";
            c += "\n[[track]]\ninstance = \"api\"\nname = \"local-apiserver\"\nweight = 5\naddress = \"127.0.0.1:6443\"\n[track.health]\nkind = \"https\"\npath = \"/readyz\"\n";
            if self.opts.aux_instance {
                c += &self.aux_config(i, node, self.opts.aux_priority.map_or(40, |p| p[i]));
            }
        } else {
            c += &format!(
                "\n[[vips]]\nname = \"ingress\"\naddress = \"{INGRESS_VIP}\"\nports = [{}]\nvrrp = \"ingress\"\n[vips.health]\nkind = \"http\"\npath = \"/healthz\"\nport = 1936\n",
                if self.opts.worker_echo {
                    format!("80, 443, {ECHO_PORT}")
                } else {
                    "80, 443".to_string()
                }
            );
            for j in 3..5 {
                c += &format!("[[vips.backends]]\naddress = \"{}\"\n", addr(j));
            }
            c += &format!(
                "\n[[vrrp]]\nname = \"ingress\"\nvrid = {ingress_vrid}\npriority = 20\nvips = [\"{INGRESS_VIP}\"]\nunicast_src = \"{}\"\nunicast_peers = [{}]\n",
                addr(i),
                peers(&WORKERS, 3)
            );
            c += "\n[[track]]\ninstance = \"ingress\"\nname = \"local-router\"\nweight = 50\naddress = \"127.0.0.1:1936\"\n[track.health]\nkind = \"http\"\npath = \"/healthz\"\n";
        }
        c
    }

    /// The aux VIP and its VRRP instance on control-plane node `i` with `priority`.
    pub fn aux_config(&self, i: usize, node: &str, priority: u8) -> String {
        let mut c = format!(
            "\n[[vips]]\nname = \"aux\"\naddress = \"{AUX_VIP}\"\nports = [{ECHO_PORT}]\nvrrp = \"aux\"\n[vips.health]\nkind = \"https\"\npath = \"/readyz\"\nport = 6443\n"
        );
        for j in 0..3 {
            c += &format!("[[vips.backends]]\naddress = \"{}\"\n", addr(j));
        }
        let peers: Vec<String> = CONTROL_PLANE
            .iter()
            .filter(|n| **n != node)
            .map(|n| format!("\"{}\"", node_addr(n)))
            .collect();
        c += &format!(
            "\n[[vrrp]]\nname = \"aux\"\nvrid = {}\npriority = {priority}\nvips = [\"{AUX_VIP}\"]\nunicast_src = \"{}\"\nunicast_peers = [{}]\n",
            aux_vrid(),
            addr(i),
            peers.join(", ")
        );
        c
    }

    pub fn start(&mut self, node: &str) {
        let cfg = self.config_path(node).display().to_string();
        self.lab
            .cleanup(PathBuf::from("/sys/fs/bpf").join(self.pin_name(node)));
        self.lab.spawn(
            node,
            &format!("lbd-{node}"),
            bin_dir().join("lbd"),
            &["--config", &cfg],
        );
    }

    /// A node dies: lbd is killed and the node drops off the network.
    pub fn fail_node(&mut self, node: &str) {
        self.lab.stop(&format!("lbd-{node}"), libc::SIGKILL);
        let netns = self.lab.node(node).netns.clone();
        crate::lab::sh(&["ip", "-n", &netns, "link", "set", "eth0", "down"]);
    }

    pub fn lbctl(&self, node: &str, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket(node), args)
    }

    pub fn lbctl_text(&self, node: &str, args: &[&str]) -> String {
        String::from_utf8_lossy(&crate::lbctl_output(&self.socket(node), args).stdout).to_string()
    }

    /// The node whose lbd says it is master of its instance, among `nodes`.
    pub fn master(&self, nodes: &[&str]) -> Option<String> {
        let masters: Vec<String> = nodes
            .iter()
            .filter(|n| {
                self.lbctl(n, &["vrrp", "status"]).and_then(|v| {
                    v[0]["state"]
                        .as_str()
                        .map(|s| s.eq_ignore_ascii_case("master"))
                }) == Some(true)
            })
            .map(|n| n.to_string())
            .collect();
        (masters.len() == 1).then(|| masters[0].clone())
    }

    /// Wait until `nodes` agree on one master and it holds for a second.
    pub fn wait_master(&self, nodes: &[&str], timeout: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            let m = wait_for(timeout.saturating_sub(start.elapsed()), || {
                self.master(nodes)
            })?;
            std::thread::sleep(Duration::from_millis(1000));
            if self.master(nodes).as_deref() == Some(m.as_str()) {
                return Some(m);
            }
            if start.elapsed() > timeout {
                return None;
            }
        }
    }

    /// Run `standin get-many` from the client: JSON tally by backend id.
    pub fn get_many(&self, target: &str, tls: bool, count: u64) -> Value {
        let mut cmd = self.lab.cmd("client", bin_dir().join("standin"));
        cmd.args([
            "get-many",
            "--target",
            target,
            "--count",
            &count.to_string(),
            "--concurrency",
            "8",
            "--timeout-ms",
            "2000",
        ]);
        if tls {
            cmd.arg("--tls");
        }
        let out = cmd.output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// One short connection to the echo service on the API VIP: did it get an answer?
    pub fn probe(&self) -> bool {
        let out = self
            .lab
            .cmd("client", bin_dir().join("labnode"))
            .args(["connect-many", API_VIP, ECHO_PORT, "1", "1", "100"])
            .output();
        out.ok()
            .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
            .map(|v| v["ok"] == 1)
            .unwrap_or(false)
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}
