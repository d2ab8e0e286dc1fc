//! Network-namespace labs: nodes on one bridge, each in its own namespace, cleaned up on drop.
//!
//! Every address used here lives inside namespaces the lab created; nothing leaves the machine.
//! Processes run in a node's network namespace through `nsenter --net` (not `ip netns exec`,
//! which remounts /sys and hides bpffs from lbd).

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

/// Run a command, panic with its output if it fails.
pub fn sh(args: &[&str]) -> Output {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"));
    succeeded(out, format_args!("{args:?}"))
}

/// `out` if its command succeeded; else a panic naming the command (`what`), with its output.
fn succeeded(out: Output, what: std::fmt::Arguments) -> Output {
    if !out.status.success() {
        panic!(
            "{what} failed: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Run a command, returning its output whatever the status.
pub fn try_sh(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"))
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub netns: String,
    pub v4: String,
    pub v6: String,
    pub mac: String,
}

pub struct Lab {
    pub prefix: String,
    switch: String,
    pub nodes: HashMap<String, Node>,
    children: Vec<(String, Child)>,
    pub dir: PathBuf,
    cleanup_paths: Vec<PathBuf>,
}

impl Lab {
    /// A bridge in a namespace of its own; nodes attach with [`Lab::add_node`].
    pub fn new(prefix: &str) -> Lab {
        let prefix = crate::unique(prefix);
        let switch = format!("{prefix}-sw");
        sh(&["ip", "netns", "add", &switch]);
        let lab = Lab {
            dir: std::env::temp_dir().join(&prefix),
            prefix,
            switch,
            nodes: HashMap::new(),
            children: Vec::new(),
            cleanup_paths: Vec::new(),
        };
        std::fs::create_dir_all(&lab.dir).unwrap();
        lab.ip(
            &lab.switch,
            &[
                "link",
                "add",
                "br0",
                "type",
                "bridge",
                "mcast_snooping",
                "0",
            ],
        );
        lab.ip(&lab.switch, &["link", "set", "br0", "up"]);
        lab.ip(&lab.switch, &["link", "set", "lo", "up"]);
        lab
    }

    fn ip(&self, netns: &str, args: &[&str]) -> Output {
        let mut a = vec!["ip", "-n", netns];
        a.extend_from_slice(args);
        sh(&a)
    }

    /// Delete a node's `eth0` (and its switch-side peer): a NIC unplugged, a bridge removed.
    pub fn delete_link(&self, name: &str) {
        self.ip(&self.switch, &["link", "del", name]);
    }

    /// Create a node's `eth0` again after [`Lab::delete_link`]: a new device (new index) with
    /// the same name, MAC and addresses, as a rebuilt bridge such as br-ex comes back.
    pub fn create_link(&self, name: &str) {
        let n = self.nodes[name].clone();
        self.plug(name, &n.netns);
        self.ip(&n.netns, &["link", "set", "eth0", "address", &n.mac]);
        self.ip(
            &n.netns,
            &["addr", "add", &format!("{}/24", n.v4), "dev", "eth0"],
        );
        self.ip(
            &n.netns,
            &[
                "addr",
                "add",
                &format!("{}/64", n.v6),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        self.ip(&n.netns, &["link", "set", "eth0", "up"]);
    }

    /// The veth pair of a node: `eth0` in its namespace, the peer (named after the node) on
    /// the bridge.
    fn plug(&self, name: &str, netns: &str) {
        self.ip(
            &self.switch,
            &[
                "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", netns,
            ],
        );
        self.ip(&self.switch, &["link", "set", name, "master", "br0", "up"]);
    }

    /// A node with `eth0` on the bridge, addresses `v4/24` and `v6/64`.
    pub fn add_node(&mut self, name: &str, v4: &str, v6: &str) -> Node {
        let netns = format!("{}-{name}", self.prefix);
        sh(&["ip", "netns", "add", &netns]);
        // The switch-side end is named after the node.
        self.plug(name, &netns);
        for (k, v) in [
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv6.conf.all.accept_ra", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
        ] {
            self.sysctl(&netns, k, v);
        }
        self.ip(&netns, &["link", "set", "lo", "up"]);
        self.ip(&netns, &["addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
        self.ip(
            &netns,
            &["addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"],
        );
        self.ip(&netns, &["link", "set", "eth0", "up"]);
        let mac = self.mac_of(&netns, "eth0");
        let node = Node {
            name: name.into(),
            netns,
            v4: v4.into(),
            v6: v6.into(),
            mac,
        };
        self.nodes.insert(name.into(), node.clone());
        node
    }

    /// A node in a namespace of its own, off the bridge (a router's far side, a host on
    /// another subnet); connect it with [`Lab::link`]. `v4` names its main address.
    pub fn add_detached_node(&mut self, name: &str, v4: &str) -> Node {
        let netns = format!("{}-{name}", self.prefix);
        sh(&["ip", "netns", "add", &netns]);
        self.ip(&netns, &["link", "set", "lo", "up"]);
        let node = Node {
            name: name.into(),
            netns,
            v4: v4.into(),
            v6: String::new(),
            mac: String::new(),
        };
        self.nodes.insert(name.into(), node.clone());
        node
    }

    /// A point-to-point link: a veth pair with `a_if` (address `a_addr`, CIDR) in node `a` and
    /// `b_if` (`b_addr`) in node `b`, both up.
    pub fn link(&self, a: &str, a_if: &str, a_addr: &str, b: &str, b_if: &str, b_addr: &str) {
        let (na, nb) = (self.nodes[a].netns.clone(), self.nodes[b].netns.clone());
        sh(&[
            "ip", "link", "add", "name", a_if, "netns", &na, "type", "veth", "peer", "name", b_if,
            "netns", &nb,
        ]);
        for (ns, dev, addr) in [(&na, a_if, a_addr), (&nb, b_if, b_addr)] {
            self.ip(ns, &["addr", "add", addr, "dev", dev]);
            self.ip(ns, &["link", "set", dev, "up"]);
        }
    }

    fn mac_of(&self, netns: &str, dev: &str) -> String {
        let out = self.ip(netns, &["-j", "link", "show", dev]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0]["address"].as_str().unwrap().to_string()
    }

    pub fn sysctl(&self, netns: &str, key: &str, value: &str) {
        sh(&[
            "nsenter",
            &format!("--net=/run/netns/{netns}"),
            "sysctl",
            "-qw",
            &format!("{key}={value}"),
        ]);
    }

    /// Make `node` a DSR backend for `vips`: each VIP is a local address (on lo for IPv4, a
    /// nodad /128 on lo for IPv6) that the node never announces or answers ARP/ND for.
    pub fn make_dsr_backend(&self, node: &str, vips: &[&str]) {
        let n = &self.nodes[node];
        for (k, v) in [
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            ("net.ipv4.conf.eth0.arp_ignore", "1"),
            ("net.ipv4.conf.eth0.arp_announce", "2"),
        ] {
            self.sysctl(&n.netns, k, v);
        }
        for vip in vips {
            if vip.contains(':') {
                self.ip(
                    &n.netns,
                    &["addr", "add", &format!("{vip}/128"), "dev", "lo", "nodad"],
                );
            } else {
                self.ip(
                    &n.netns,
                    &["addr", "add", &format!("{vip}/32"), "dev", "lo"],
                );
            }
        }
    }

    /// Add `addr` to a node's eth0 (what a VIP owner has). An IPv6 VIP is added deprecated
    /// (preferred_lft 0) so the node never picks it as the source of its own connections: a
    /// backend holding the same VIP would answer itself.
    pub fn add_address(&self, node: &str, addr: &str) {
        let n = &self.nodes[node];
        let cidr = if addr.contains(':') {
            format!("{addr}/128")
        } else {
            format!("{addr}/32")
        };
        let mut args = vec!["addr", "add", cidr.as_str(), "dev", "eth0"];
        if addr.contains(':') {
            args.extend(["nodad", "preferred_lft", "0"]);
        }
        self.ip(&n.netns, &args);
    }

    /// A command that runs in `node`'s network namespace.
    pub fn cmd(&self, node: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.nodes[node].netns))
            .arg("--")
            .arg(program);
        c
    }

    /// Run to completion in `node`, panic on failure.
    pub fn run(&self, node: &str, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
        let out = self.cmd(node, program).args(args).output().unwrap();
        succeeded(out, format_args!("{args:?} in {node}"))
    }

    /// Start a long-running process in `node`; its output goes to `<lab dir>/<tag>.log`.
    /// Killed (SIGKILL) when the lab is dropped unless stopped before.
    pub fn spawn(
        &mut self,
        node: &str,
        tag: &str,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
    ) -> u32 {
        let log = std::fs::File::create(self.dir.join(format!("{tag}.log"))).unwrap();
        let child = self
            .cmd(node, program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.push((tag.into(), child));
        pid
    }

    pub fn log(&self, tag: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{tag}.log"))).unwrap_or_default()
    }

    /// Send `signal` to the process started as `tag` and wait for it to exit.
    pub fn stop(&mut self, tag: &str, signal: i32) {
        if let Some(i) = self.children.iter().position(|(t, _)| t == tag) {
            let (_, mut child) = self.children.remove(i);
            // nsenter execs the program, so the child's pid is the program's.
            unsafe { libc::kill(child.id() as i32, signal) };
            let _ = child.wait();
        }
    }

    /// Wait up to `timeout` for the process started as `tag` to exit on its own; its status.
    pub fn wait(&mut self, tag: &str, timeout: Duration) -> Option<std::process::ExitStatus> {
        let i = self.children.iter().position(|(t, _)| t == tag)?;
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.children[i].1.try_wait() {
                self.children.remove(i);
                return Some(status);
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid of the process started as `tag`, if it is still tracked.
    pub fn pid(&self, tag: &str) -> Option<u32> {
        self.children
            .iter()
            .find(|(t, _)| t == tag)
            .map(|(_, c)| c.id())
    }

    /// Remove this path when the lab is dropped (pin directories, sockets).
    pub fn cleanup(&mut self, path: PathBuf) {
        self.cleanup_paths.push(path);
    }

    /// Packet counters of a node's eth0: (rx_packets, tx_packets).
    pub fn counters(&self, node: &str) -> (u64, u64) {
        let out = self.ip(
            &self.nodes[node].netns,
            &["-s", "-j", "link", "show", "eth0"],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let s = &v[0]["stats64"];
        (
            s["rx"]["packets"].as_u64().unwrap(),
            s["tx"]["packets"].as_u64().unwrap(),
        )
    }

    pub fn node(&self, name: &str) -> &Node {
        &self.nodes[name]
    }

    /// Run `f` on a thread that has entered `node`'s network namespace (sockets it opens live
    /// there), and return its result.
    pub fn in_netns<T: Send + 'static>(
        &self,
        node: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let path = format!("/run/netns/{}", self.nodes[node].netns);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for n in self.nodes.values() {
            let _ = try_sh(&["ip", "netns", "del", &n.netns]);
        }
        let _ = try_sh(&["ip", "netns", "del", &self.switch]);
        for p in &self.cleanup_paths {
            let _ = std::fs::remove_dir_all(p);
            let _ = std::fs::remove_file(p);
        }
        if std::env::var_os("LB_KEEP_LAB_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Poll `f` until it returns Some or `timeout` passes.
/// Whether `addr` is configured on `dev` in the namespace `netns`.
pub fn has_address(netns: &str, dev: &str, addr: &str) -> bool {
    let out = try_sh(&["ip", "-n", netns, "-j", "addr", "show", "dev", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v[0]["addr_info"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["local"] == addr))
}

pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kernel threads named napi/... : (pid, name).
fn napi_threads() -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        comm.starts_with("napi/")
            .then(|| (pid, comm.trim().to_string()))
    })
    .collect()
}

/// Turn threaded NAPI on or off for `dev` in namespace `netns` (the device needs NAPI instances:
/// a veth has them with an XDP program attached or with GRO on).
pub fn set_threaded_napi(netns: &str, dev: &str, on: bool) -> bool {
    // `ip netns exec` (unlike nsenter) mounts the namespace's own /sys.
    try_sh(&[
        "ip",
        "netns",
        "exec",
        netns,
        "sh",
        "-c",
        &format!("echo {} > /sys/class/net/{dev}/threaded", on as u8),
    ])
    .status
    .success()
}

/// Threaded NAPI for `dev` in `netns`, so that its receive path runs in a kernel thread of its
/// own (which can be pinned, and whose CPU time is that path's); the thread's pid if found.
pub fn threaded_napi(netns: &str, dev: &str) -> Option<i32> {
    let before = napi_threads();
    if !set_threaded_napi(netns, dev, true) {
        eprintln!("threaded NAPI on {dev} ({netns}) not available");
        return None;
    }
    // Thread names are napi/<dev>-<napi id> (not unique across namespaces): take the new one.
    wait_for(Duration::from_secs(2), || {
        let new: Vec<i32> = napi_threads()
            .into_iter()
            .filter(|(pid, comm)| {
                comm.starts_with(&format!("napi/{dev}-")) && !before.iter().any(|b| b.0 == *pid)
            })
            .map(|(pid, _)| pid)
            .collect();
        (new.len() == 1).then(|| new[0])
    })
}

/// Time thread `pid` has spent on a CPU so far, in seconds (/proc/PID/schedstat, in ns).
pub fn thread_cpu_seconds(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0) as f64
        / 1e9
}
