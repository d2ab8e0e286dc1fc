//! A lab shaped like a small OpenShift cluster, for the demo: three control-plane nodes running
//! lbd and an API stand-in (HTTPS on 6443 serving /readyz), two workers running lbd and an
//! ingress-router stand-in (HTTP 80, HTTPS 443, /healthz on 1936), and a client. The compact
//! shape has three nodes with both roles instead.
//!
//! Every node's lbd.toml is rendered by `lbctl render` from one cluster description
//! ([`Cluster::description`]), as an operator would; lbd runs as a process or in the static pod
//! of deploy/ under podman ([`Runner`]).
//!
//! The API VIP and the ingress VIP are each owned by one node, chosen by VRRP (VRIDs derived
//! from the cluster name the way OpenShift does). Port 7000 of the API VIP is a long-lived echo
//! service (`labnode serve-id`) used to show that open connections survive a VIP move.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::Value;

use lb_userspace::config::{Config, ConfigFile};

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

/// The lab's nodes and roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Three control-plane nodes (API VIP) and two workers (ingress VIP).
    Demo,
    /// OpenShift's compact cluster: three nodes with both roles, each running one lbd that
    /// serves the API and the ingress VIPs (one XDP attach, one socket), and both stand-ins.
    Compact,
}

/// How each node's lbd runs.
pub enum Runner {
    /// lbd as a process of the test in the node's namespace.
    Process,
    /// lbd in a static pod run by podman from the manifests in deploy/ (see [`crate::pods`]).
    Pod(crate::pods::Pods),
}

pub struct Cluster {
    /// Declared before the lab so pods go down before the lab's namespaces.
    pub runner: Runner,
    pub lab: Lab,
    /// With lbd in pods: the clients' CPU cgroup (see `cgroup`); removed after the lab.
    clients: Option<super::cgroup::ClientCgroup>,
    pub shape: Shape,
    pub opts: Options,
}

fn addr(i: usize) -> String {
    format!("10.79.0.{}", 11 + i)
}

/// Variations of the demo cluster for labs that need more (the chaos bench), applied on top
/// of the rendered configs.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Connection-table entries of every lbd (default: lbd's default).
    pub conntrack_size: Option<u32>,
    /// Routers also run the echo service and the ingress VIP serves [`ECHO_PORT`], so
    /// long-lived connections can go through both VIPs.
    pub worker_echo: bool,
    /// Control-plane nodes run a second VRRP instance ("aux", [`AUX_VIP`]), so a reload can
    /// change one of two instances.
    pub aux_instance: bool,
    /// One more host on the segment ([`HOSTILE`]) that runs nothing of ours.
    pub hostile: bool,
    /// The connection sync on: the description gets `[sync]` with a cluster key in the lab's
    /// directory ([`Cluster::sync_key`]), `lbctl render` the peers.
    pub sync: bool,
    /// A UserManaged install's first phase: one more node, [`BOOTSTRAP`], in the
    /// description's `[bootstrap]`; the API VIP also serves the machine-config server's port
    /// ([`MCS_PORT`], a stand-in on the bootstrap and the control-plane nodes). Only the
    /// bootstrap's services and lbd start; the test starts the control-plane nodes
    /// ([`Cluster::start_services`], [`Cluster::start`]) as the install brings them up.
    pub bootstrap: bool,
}

/// The bootstrap node of [`Options::bootstrap`] and its address.
pub const BOOTSTRAP: &str = "bootstrap";
pub const BOOTSTRAP_ADDR: &str = "10.79.0.10";
/// The machine-config server's port (served through the API VIP during an install).
pub const MCS_PORT: &str = "22623";

/// The aux instance's VIP and name (see [`Options::aux_instance`]).
pub const AUX_VIP: &str = "10.79.0.9";
pub const AUX: &str = "aux";
/// The hostile host's node name and address.
pub const HOSTILE: &str = "hostile";
pub const HOSTILE_ADDR: &str = "10.79.0.66";

/// The address of a demo-cluster node ("cp1".."cp3", "w1", "w2").
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

/// The aux VIP and its VRRP instance for control-plane node `node` with `priority`.
fn aux_entries(
    node: &str,
    priority: u8,
) -> (
    lb_userspace::config::VipConfig,
    lb_userspace::vrrp::InstanceConfig,
) {
    #[derive(serde::Deserialize)]
    struct Aux {
        vips: Vec<lb_userspace::config::VipConfig>,
        vrrp: Vec<lb_userspace::vrrp::InstanceConfig>,
    }
    let mut t = format!(
        "[[vips]]\nname = \"{AUX}\"\naddress = \"{AUX_VIP}\"\nports = [{ECHO_PORT}]\nvrrp = \"{AUX}\"\n[vips.health]\nkind = \"https\"\npath = \"/readyz\"\nport = 6443\n"
    );
    for n in CONTROL_PLANE {
        t += &format!("[[vips.backends]]\naddress = \"{}\"\n", node_addr(n));
    }
    let peers: Vec<String> = CONTROL_PLANE
        .iter()
        .filter(|n| **n != node)
        .map(|n| format!("\"{}\"", node_addr(n)))
        .collect();
    t += &format!(
        "[[vrrp]]\nname = \"{AUX}\"\nvrid = {}\npriority = {priority}\nvips = [\"{AUX_VIP}\"]\nunicast_src = \"{}\"\nunicast_peers = [{}]\n",
        aux_vrid(),
        node_addr(node),
        peers.join(", ")
    );
    let mut a: Aux = toml::from_str(&t).expect("aux entries");
    (a.vips.remove(0), a.vrrp.remove(0))
}

/// `cfg` with the aux instance's priority set to `priority` (the other instances untouched).
pub fn with_aux_priority(cfg: &Config, priority: u8) -> Config {
    let mut c = cfg.clone();
    for i in c.vrrp.iter_mut().filter(|i| i.name == AUX) {
        i.priority = priority;
    }
    c
}

impl Cluster {
    /// The demo's cluster, lbd as processes.
    pub fn new() -> Cluster {
        Cluster::boot(Shape::Demo, Runner::Process)
    }

    /// The demo's cluster with `opts`, lbd as processes.
    pub fn with(opts: Options) -> Cluster {
        Cluster::boot_with(Shape::Demo, Runner::Process, opts)
    }

    /// Nodes of the cluster with the control-plane role.
    pub fn control_plane(&self) -> Vec<&'static str> {
        CONTROL_PLANE.to_vec()
    }

    /// Nodes that run routers (the ingress VIP's backends and VRRP group).
    pub fn routers(&self) -> Vec<&'static str> {
        match self.shape {
            Shape::Demo => WORKERS.to_vec(),
            Shape::Compact => CONTROL_PLANE.to_vec(),
        }
    }

    pub fn nodes(&self) -> Vec<&'static str> {
        match self.shape {
            Shape::Demo => CONTROL_PLANE
                .iter()
                .chain(WORKERS.iter())
                .copied()
                .collect(),
            Shape::Compact => CONTROL_PLANE.to_vec(),
        }
    }

    /// Build the lab, start the stand-ins, render every node's config from one cluster
    /// description with `lbctl render`, and start lbd on every node.
    pub fn boot(shape: Shape, runner: Runner) -> Cluster {
        Cluster::boot_with(shape, runner, Options::default())
    }

    pub fn boot_with(shape: Shape, runner: Runner, opts: Options) -> Cluster {
        let mut lab = Lab::new("cl");
        lab.add_node("client", "10.79.0.1", "fd79::1");
        let clients =
            matches!(runner, Runner::Pod(..)).then(|| super::cgroup::ClientCgroup::new("cl"));
        let mut c = Cluster {
            lab,
            clients,
            shape,
            runner,
            opts,
        };
        let nodes = c.nodes();
        for (i, n) in nodes.iter().enumerate() {
            c.lab.add_node(n, &addr(i), &format!("fd79::{}", 11 + i));
        }
        if c.opts.hostile {
            c.lab.add_node(HOSTILE, HOSTILE_ADDR, "fd79::66");
        }
        if c.opts.bootstrap {
            c.lab.add_node(BOOTSTRAP, BOOTSTRAP_ADDR, "fd79::10");
        }
        let mut first = nodes.clone();
        if c.opts.bootstrap {
            first = vec![BOOTSTRAP];
        }
        for n in nodes.iter().chain(c.opts.bootstrap.then_some(&BOOTSTRAP)) {
            std::fs::write(c.ready_file(n), "").unwrap();
        }
        for n in &first {
            c.start_services(n);
        }
        if c.opts.sync {
            use std::os::unix::fs::PermissionsExt;
            let key = c.sync_key();
            std::fs::write(
                &key,
                format!("{}\n", crate::unique("lab-cluster-key-").repeat(4)),
            )
            .unwrap();
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        for (n, cfg) in c.render() {
            c.write_config(&n, &cfg);
            if first.contains(&n.as_str()) {
                c.start(&n);
            }
        }
        c
    }

    /// Start what a node serves (everything but lbd): the apiserver stand-in and the echo
    /// service on control-plane nodes, the router stand-ins (and the echo service with
    /// [`Options::worker_echo`]) on routers.
    pub fn start_services(&mut self, n: &str) {
        let standin = bin_dir().join("standin");
        let labnode = bin_dir().join("labnode");
        let r = self.ready_file(n).display().to_string();
        let api = CONTROL_PLANE.contains(&n) || n == BOOTSTRAP;
        if self.opts.bootstrap && api {
            let listen = format!("0.0.0.0:{MCS_PORT}");
            self.lab.spawn(
                n,
                &format!("mcs-{n}"),
                &standin,
                &["http", "--listen", &listen, "--id", n, "--ready-file", &r],
            );
        }
        if api {
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
        }
        if self.routers().contains(&n) {
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
        if api || self.opts.worker_echo {
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
        let mut v = Vec::new();
        let api = CONTROL_PLANE.contains(&n) || n == BOOTSTRAP;
        if self.opts.bootstrap && api {
            v.push(format!("mcs-{n}"));
        }
        if api {
            v.push(format!("apiserver-{n}"));
        }
        if self.routers().contains(&n) {
            v.extend(
                ["http", "https", "health"]
                    .iter()
                    .map(|t| format!("router-{t}-{n}")),
            );
        }
        if api || self.opts.worker_echo {
            v.push(format!("echo-{n}"));
        }
        v
    }

    /// The cluster description this lab is, in `lbctl render`'s format.
    pub fn description(&self) -> String {
        let mcs = if self.opts.bootstrap {
            format!(", {MCS_PORT}")
        } else {
            String::new()
        };
        let mut d = format!(
            "name = \"{CLUSTER}\"\ninterface = \"eth0\"\napi_vip = \"{API_VIP}\"\ningress_vip = \"{INGRESS_VIP}\"\napi_ports = [6443, {ECHO_PORT}{mcs}]\nxdp_mode = \"skb\"\n"
        );
        if self.opts.bootstrap {
            d +=
                &format!("\n[bootstrap]\nname = \"{BOOTSTRAP}\"\naddress = \"{BOOTSTRAP_ADDR}\"\n");
        }
        let routers = self.routers();
        for (i, n) in self.nodes().iter().enumerate() {
            let mut roles = Vec::new();
            if CONTROL_PLANE.contains(n) {
                roles.push("\"control-plane\"");
            }
            if routers.contains(n) {
                roles.push("\"worker\"");
            }
            d += &format!(
                "\n[[nodes]]\nname = \"{n}\"\naddress = \"{}\"\nroles = [{}]\n",
                addr(i),
                roles.join(", ")
            );
        }
        if self.opts.sync {
            d += &format!("\n[sync]\nkey_file = \"{}\"\n", self.sync_key().display());
        }
        d
    }

    /// The cluster key file of [`Options::sync`] (processes read it from the host).
    pub fn sync_key(&self) -> PathBuf {
        self.lab.dir.join("sync.key")
    }

    /// Every node's config, rendered by `lbctl render` from [`Cluster::description`]; only
    /// what the lab needs differs from it: each node's own pin directory (the nodes share one
    /// bpffs) and, for processes, an API socket of its own.
    fn render(&self) -> Vec<(String, Config)> {
        self.render_description(&self.description())
    }

    /// Every node's config rendered from `description` (and the bootstrap's, when it has
    /// `[bootstrap]`), adapted to the lab as [`Cluster::render`] says.
    pub fn render_description(&self, description: &str) -> Vec<(String, Config)> {
        let desc = self.lab.dir.join("cluster.toml");
        std::fs::write(&desc, description).unwrap();
        let out = self.lab.dir.join("rendered");
        let o = crate::lbctl::command()
            .args(["render", "--cluster"])
            .arg(&desc)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run lbctl render");
        assert!(
            o.status.success(),
            "lbctl render failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let boot = out.join(format!("{BOOTSTRAP}.toml"));
        let bootstrap = description.contains("\n[bootstrap]\n") && boot.exists();
        self.nodes()
            .iter()
            .chain(bootstrap.then_some(&BOOTSTRAP))
            .map(|n| {
                let path = out.join(format!("{n}.toml"));
                let mut cfg =
                    Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                cfg.name = self.pin_name(n);
                self.apply_options(n, &mut cfg);
                if !self.opts.sync {
                    self.place_cluster_key(n, &out.join("cluster.key"), &mut cfg);
                }
                if matches!(self.runner, Runner::Process) {
                    cfg.api_socket = self.socket(n).into();
                }
                (n.to_string(), cfg)
            })
            .collect()
    }

    /// The cluster key `lbctl render` made (sync and membership are on by default): where the
    /// node reads it. A pod reads the rendered path under its /etc/lb; a process the file in
    /// the render's output directory.
    fn place_cluster_key(&self, node: &str, key: &std::path::Path, cfg: &mut Config) {
        match self.runner {
            Runner::Process => {
                if let Some(s) = cfg.sync.as_mut() {
                    s.key_file = key.to_owned();
                }
                if let Some(m) = cfg.members.as_mut() {
                    m.key_file = key.to_owned();
                }
            }
            Runner::Pod(_) => {
                use std::os::unix::fs::PermissionsExt;
                let dir = self.config_dir(node);
                std::fs::create_dir_all(&dir).unwrap();
                let to = dir.join("cluster.key");
                std::fs::copy(key, &to).unwrap();
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
    }

    /// [`Options`] on a rendered config.
    fn apply_options(&self, node: &str, cfg: &mut Config) {
        if let Some(n) = self.opts.conntrack_size {
            cfg.conntrack_size = n;
            // What the peers may install must fit half the smaller table (lbd refuses more:
            // `sync.max_entries`), as render sizes it for the default one.
            if let Some(s) = cfg.sync.as_mut() {
                let peers = s.peers.len().max(1) as u32;
                s.max_entries = s.max_entries.min(n / 2 / peers);
            }
        }
        if self.opts.worker_echo {
            let port: u16 = ECHO_PORT.parse().unwrap();
            for v in cfg.vips.iter_mut() {
                if v.address.to_string() == INGRESS_VIP && !v.ports.contains(&port) {
                    v.ports.push(port);
                }
            }
        }
        if self.opts.aux_instance && CONTROL_PLANE.contains(&node) {
            let (vip, inst) = aux_entries(node, 40);
            cfg.vips.push(vip);
            cfg.vrrp.push(inst);
        }
    }

    /// The config `node` runs with now (its lbd.toml).
    pub fn config_of(&self, node: &str) -> Config {
        Config::load(&self.own_config_file(node)).expect("the node's config")
    }

    /// The file holding `node`'s own config on `node`.
    fn own_config_file(&self, node: &str) -> PathBuf {
        match self.runner {
            Runner::Process => self.config_path(node),
            Runner::Pod(_) => self.config_path(node).join(format!("{node}.toml")),
        }
    }

    /// Where `node`'s config goes: its lbd.toml for processes; for pods, every node's
    /// `/etc/lb/nodes/<node>.toml`, as one MachineConfig ships every node's config.
    fn config_files(&self, node: &str) -> Vec<PathBuf> {
        match self.runner {
            Runner::Process => vec![self.config_path(node)],
            Runner::Pod(_) => self
                .nodes()
                .iter()
                .map(|m| self.config_path(m).join(format!("{node}.toml")))
                .collect(),
        }
    }

    /// Write `text` as `node`'s config (for reload tests, even a broken one).
    pub fn write_config_text(&self, node: &str, text: &str) {
        for path in self.config_files(node) {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    pub fn write_config(&self, node: &str, cfg: &Config) {
        self.write_config_text(node, &toml::to_string(cfg).unwrap());
    }

    pub fn ready_file(&self, node: &str) -> PathBuf {
        self.lab.dir.join(format!("{node}.ready"))
    }
    /// The node's API socket as seen from the host.
    pub fn socket(&self, node: &str) -> String {
        match &self.runner {
            Runner::Process => self.lab.dir.join(format!("{node}.sock")),
            Runner::Pod(_) => self.run_dir(node).join("lbd.sock"),
        }
        .display()
        .to_string()
    }
    /// The node's /etc/lb (the pod's config hostPath).
    pub fn config_dir(&self, node: &str) -> PathBuf {
        self.lab.dir.join(node).join("etc")
    }
    /// The node's /run/lbd (the pod's run hostPath).
    pub fn run_dir(&self, node: &str) -> PathBuf {
        self.lab.dir.join(node).join("run")
    }
    /// Processes read lbd.toml; pods read the manifest's directory `/etc/lb/nodes`, which
    /// holds every node's config as a MachineConfig would ship them: lbd picks its own.
    fn config_path(&self, node: &str) -> PathBuf {
        match self.runner {
            Runner::Process => self.config_dir(node).join("lbd.toml"),
            Runner::Pod(_) => self.config_dir(node).join("nodes"),
        }
    }
    pub fn pin_name(&self, node: &str) -> String {
        format!("{}_{node}", self.lab.prefix.replace('-', "_"))
    }

    pub fn start(&mut self, node: &str) {
        let cfg = self.config_path(node).display().to_string();
        let (etc, run) = (self.config_dir(node), self.run_dir(node));
        self.lab
            .cleanup(PathBuf::from("/sys/fs/bpf").join(self.pin_name(node)));
        match &mut self.runner {
            Runner::Process => {
                self.lab.spawn(
                    node,
                    &format!("lbd-{node}"),
                    bin_dir().join("lbd"),
                    &["--config", &cfg],
                );
            }
            Runner::Pod(pods) => {
                std::fs::create_dir_all(&run).unwrap();
                let role = if CONTROL_PLANE.contains(&node) {
                    crate::pods::Role::ControlPlane
                } else {
                    crate::pods::Role::Worker
                };
                pods.play(&self.lab, node, role, &etc, &run);
            }
        }
    }

    /// A node dies: lbd is killed and the node drops off the network.
    pub fn fail_node(&mut self, node: &str) {
        match &mut self.runner {
            Runner::Process => self.lab.stop(&format!("lbd-{node}"), libc::SIGKILL),
            Runner::Pod(pods) => pods.kill(node, libc::SIGKILL),
        }
        let netns = self.lab.node(node).netns.clone();
        crate::lab::sh(&["ip", "-n", &netns, "link", "set", "eth0", "down"]);
    }

    pub fn lbctl(&self, node: &str, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket(node), args)
    }

    pub fn lbctl_text(&self, node: &str, args: &[&str]) -> String {
        String::from_utf8_lossy(&crate::lbctl_output(&self.socket(node), args).stdout).to_string()
    }

    /// The node whose lbd says it is master of VRRP instance `instance`, among `nodes`.
    pub fn master(&self, instance: &str, nodes: &[&str]) -> Option<String> {
        let masters: Vec<String> = nodes
            .iter()
            .filter(|n| {
                self.lbctl(n, &["vrrp", "status"]).and_then(|v| {
                    v.as_array()?.iter().find(|i| i["name"] == instance)?["state"]
                        .as_str()
                        .map(|s| s.eq_ignore_ascii_case("master"))
                }) == Some(true)
            })
            .map(|n| n.to_string())
            .collect();
        (masters.len() == 1).then(|| masters[0].clone())
    }

    /// Wait until `nodes` agree on one master of `instance` and it holds for a second.
    pub fn wait_master(&self, instance: &str, nodes: &[&str], timeout: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            let m = wait_for(timeout.saturating_sub(start.elapsed()), || {
                self.master(instance, nodes)
            })?;
            std::thread::sleep(Duration::from_millis(1000));
            if self.master(instance, nodes).as_deref() == Some(m.as_str()) {
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

    /// Start `labnode args...` on the client, its output piped (a load the test reads when it
    /// ends).
    pub fn client_labnode(&self, args: &[&str]) -> std::process::Child {
        let child = self
            .lab
            .cmd("client", bin_dir().join("labnode"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start labnode");
        if let Some(cg) = &self.clients {
            cg.adopt(child.id());
        }
        child
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
