//! The chaos lab with keepalived + haproxy in OpenShift's shape, for the comparison column:
//! the same nodes, addresses and client load as the lbd lab.
//!
//! - control-plane nodes: keepalived's API instance (VRRPv2, `advert_int 1`, unicast peers,
//!   PASS auth, priority 40), haproxy in TCP mode on every node (`balance roundrobin`,
//!   `option httpchk GET /readyz HTTP/1.0`, `check check-ssl verify none port 6443 inter 5s
//!   fall 3 rise 1`) listening on [`ECHO_PORT`] and proxying to the echo service of every
//!   control-plane node on [`KA_ECHO_PORT`]; the apiserver stand-in on 6443;
//! - workers: keepalived's ingress instance (priority 20) and the router stand-ins, which
//!   serve the ingress VIP themselves on the owner (no proxy, as on OpenShift), plus the echo
//!   service on [`ECHO_PORT`].
//!
//! The tracked scripts OpenShift adds to keepalived (haproxy and apiserver health) are left
//! out: they only shift priorities, and every node runs healthy services here.

use std::{path::PathBuf, time::Duration};

use crate::{
    bin_dir,
    cluster::{
        API_VIP, CLUSTER, CONTROL_PLANE, ECHO_PORT, HOSTILE, HOSTILE_ADDR, INGRESS_VIP, WORKERS,
        node_addr,
    },
    keepalived_haproxy::{Globals, Instance, Listen, global_defs, haproxy_cfg},
    lab::{Lab, try_sh, wait_for},
};

use super::{Case, Flavor, load::Target};

/// Where the echo service listens on control-plane nodes (haproxy has [`ECHO_PORT`]).
pub const KA_ECHO_PORT: &str = "7001";

pub struct KeepalivedFlavor {
    lab: Lab,
}

fn haproxy_config() -> String {
    haproxy_cfg(
        "30m",
        &[Listen {
            name: "echo",
            bind: format!("*:{ECHO_PORT}"),
            readyz_tls_port: Some(6443),
            servers: CONTROL_PLANE
                .iter()
                .map(|b| (b.to_string(), format!("{}:{KA_ECHO_PORT}", node_addr(b))))
                .collect(),
        }],
    )
}

/// OpenShift's keepalived instance for `node`: API on the control plane, ingress on workers.
fn keepalived_config(node: &str) -> String {
    let (api_vrid, ingress_vrid) = lb_userspace::vrrp::vrids::openshift_vrids(CLUSTER);
    let cp = CONTROL_PLANE.contains(&node);
    let (name, vrid, prio, vip, group): (&str, u8, u8, &str, &[&str]) = if cp {
        ("API", api_vrid, 40, API_VIP, &CONTROL_PLANE)
    } else {
        ("INGRESS", ingress_vrid, 20, INGRESS_VIP, &WORKERS)
    };
    global_defs(&Globals {
        router_id: Some(node),
        version: Some(2),
        ..Default::default()
    }) + &Instance::openshift_v4(
        &format!("{CLUSTER}_{name}"),
        vrid,
        prio,
        (
            node_addr(node),
            group
                .iter()
                .filter(|p| **p != node)
                .map(|p| node_addr(p))
                .collect(),
        ),
        &format!("{CLUSTER}_{}_vip", name.to_lowercase())[..8],
        vip,
    )
    .render()
}

impl KeepalivedFlavor {
    pub fn new() -> KeepalivedFlavor {
        let mut lab = Lab::new("ka");
        lab.add_node("client", "10.79.0.1", "fd79::1");
        for n in CONTROL_PLANE.iter().chain(WORKERS.iter()) {
            let a = node_addr(n);
            let last = a.rsplit('.').next().unwrap().to_string();
            lab.add_node(n, &a, &format!("fd79::{last}"));
        }
        lab.add_node(HOSTILE, HOSTILE_ADDR, "fd79::66");
        let mut f = KeepalivedFlavor { lab };
        for n in CONTROL_PLANE.iter().chain(WORKERS.iter()) {
            std::fs::write(f.ready_file(n), "").unwrap();
            std::fs::write(f.conf(n), keepalived_config(n)).unwrap();
            f.start_services(n);
            f.start_daemon(n);
        }
        f
    }

    fn ready_file(&self, n: &str) -> PathBuf {
        self.lab.dir.join(format!("{n}.ready"))
    }
    fn conf(&self, n: &str) -> PathBuf {
        self.lab.dir.join(format!("ka-{n}.conf"))
    }
    fn vrrp_pid(&self, n: &str) -> PathBuf {
        self.lab.dir.join(format!("ka-{n}-vrrp.pid"))
    }

    /// keepalived's VRRP child on `node`, if running (pid file, checked against its cmdline).
    fn child(&self, node: &str) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.vrrp_pid(node))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let conf = self.conf(node).display().to_string();
        String::from_utf8_lossy(&cmdline)
            .contains(&conf)
            .then_some(pid)
    }

    fn service_tags(n: &str) -> Vec<String> {
        if CONTROL_PLANE.contains(&n) {
            vec![
                format!("apiserver-{n}"),
                format!("echo-{n}"),
                format!("haproxy-{n}"),
            ]
        } else {
            ["http", "https", "health"]
                .iter()
                .map(|t| format!("router-{t}-{n}"))
                .chain([format!("echo-{n}")])
                .collect()
        }
    }
}

impl Default for KeepalivedFlavor {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KeepalivedFlavor {
    fn drop(&mut self) {
        // keepalived forks its VRRP child: kill it too so nothing outlives the lab.
        for n in CONTROL_PLANE.iter().chain(WORKERS.iter()) {
            self.stop_daemon(n, libc::SIGKILL);
        }
    }
}

impl Flavor for KeepalivedFlavor {
    fn name(&self) -> &'static str {
        "keepalived+haproxy"
    }
    fn lab(&self) -> &Lab {
        &self.lab
    }
    fn lab_mut(&mut self) -> &mut Lab {
        &mut self.lab
    }
    fn advert_ms(&self) -> f64 {
        1000.0
    }
    fn conntrack_size(&self) -> u32 {
        super::lbd::CONNTRACK_SIZE
    }
    fn targets(&self) -> (Vec<Target>, Vec<Target>) {
        super::standard_targets()
    }
    /// SIGKILL kills the VRRP child too (a crash); SIGTERM goes to the parent, which stops the
    /// child gracefully (it sends a priority-0 advert), as a pod's termination does.
    fn stop_daemon(&mut self, node: &str, signal: i32) {
        let child = self.child(node);
        // The child first: a child whose parent dies shuts down gracefully (priority 0, VIPs
        // removed), which a crash does not.
        if let Some(pid) = child
            && signal == libc::SIGKILL
        {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        self.lab.stop(&format!("ka-{node}"), signal);
        if child.is_some() {
            let _ = wait_for(Duration::from_secs(5), || {
                self.child(node).is_none().then_some(())
            });
        }
    }
    fn start_daemon(&mut self, node: &str) {
        let conf = self.conf(node).display().to_string();
        let pid = self
            .lab
            .dir
            .join(format!("ka-{node}.pid"))
            .display()
            .to_string();
        let vrrp_pid = self.vrrp_pid(node).display().to_string();
        // -n foreground, -P VRRP only, -l -D -G: log to the console (the lab log), no syslog.
        self.lab.spawn(
            node,
            &format!("ka-{node}"),
            "keepalived",
            &[
                "-n", "-P", "-l", "-D", "-G", "-f", &conf, "-p", &pid, "-r", &vrrp_pid,
            ],
        );
    }
    fn daemon_running(&mut self, node: &str) -> bool {
        let tag = format!("ka-{node}");
        self.lab.pid(&tag).is_some() && self.lab.wait(&tag, Duration::ZERO).is_none()
    }
    fn stop_services(&mut self, node: &str) {
        for t in Self::service_tags(node) {
            self.lab.stop(&t, libc::SIGKILL);
        }
    }
    fn start_services(&mut self, n: &str) {
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
            self.lab.spawn(
                n,
                &format!("echo-{n}"),
                &labnode,
                &["serve-id", KA_ECHO_PORT, n],
            );
            let hp = self.lab.dir.join(format!("haproxy-{n}.cfg"));
            std::fs::write(&hp, haproxy_config()).unwrap();
            let hp = hp.display().to_string();
            self.lab
                .spawn(n, &format!("haproxy-{n}"), "haproxy", &["-db", "-f", &hp]);
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
            self.lab.spawn(
                n,
                &format!("echo-{n}"),
                &labnode,
                &["serve-id", ECHO_PORT, n],
            );
        }
    }
    fn reboot_cleanup(&mut self, node: &str) {
        let ns = self.lab.node(node).netns.clone();
        for vip in [API_VIP, INGRESS_VIP] {
            let _ = try_sh(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "del",
                &format!("{vip}/32"),
                "dev",
                "eth0",
            ]);
        }
    }
    /// keepalived has no status to ask; its VRRP child must be running everywhere (the single
    /// holder per VIP is checked by the harness).
    fn settled(&self) -> Result<(), String> {
        for n in CONTROL_PLANE.iter().chain(WORKERS.iter()) {
            if self.child(n).is_none() {
                return Err(format!("{n}: keepalived's VRRP child is not running"));
            }
        }
        Ok(())
    }
    /// haproxy's `inter 5s fall 3`, and one more interval.
    fn drain_ms(&self) -> u64 {
        20_000
    }
    fn supports(&self, case: Case) -> bool {
        matches!(
            case,
            Case::NodeDies
                | Case::OwnerSigkill
                | Case::OwnerSigterm
                | Case::BackupSigkill
                | Case::LinkFlap
                | Case::ApiserverFlap
                | Case::SynFlood
                | Case::RollingUpgrade
                | Case::UpgradeOneNode
        )
    }
}
