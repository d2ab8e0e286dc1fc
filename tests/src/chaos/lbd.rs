//! The chaos lab with lbd on every node: the demo's cluster ([`Cluster`]) with the echo service
//! behind both VIPs, a second VRRP instance on the control plane (for the reload case), a
//! small connection table (for the flood case), a hostile host, and the connection sync on
//! (`[sync]` rendered by `lbctl render`).

use lb_userspace::config::Config;

use crate::{
    cluster::{self, CONTROL_PLANE, Cluster, Options, WORKERS},
    lab::{Lab, try_sh},
};

use super::{Case, Flavor, load::Target};

/// Connection-table entries of the chaos cluster's lbds: small, so a flood of 10x is quick.
pub const CONNTRACK_SIZE: u32 = 4096;
/// lbd's default advert interval (VRRPv3).
pub const ADVERT_MS: f64 = 100.0;

pub struct LbdFlavor {
    pub cluster: Cluster,
    /// Every node's config as booted, so a case can put it back.
    base: std::collections::HashMap<String, Config>,
}

impl LbdFlavor {
    pub fn new() -> LbdFlavor {
        let cluster = Cluster::with(Options {
            conntrack_size: Some(CONNTRACK_SIZE),
            worker_echo: true,
            aux_instance: true,
            hostile: true,
            // As a cluster that keeps connections across every VIP move runs
            // (`LB_CHAOS_SYNC=0`: without, for comparison).
            sync: std::env::var("LB_CHAOS_SYNC").map_or(true, |v| v != "0"),
            ..Default::default()
        });
        let base = cluster
            .nodes()
            .iter()
            .map(|n| (n.to_string(), cluster.config_of(n)))
            .collect();
        LbdFlavor { cluster, base }
    }
}

impl LbdFlavor {
    /// Every VRRP instance name of the cluster.
    fn instances(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .base
            .values()
            .flat_map(|c| c.vrrp.iter().map(|i| i.name.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

impl Default for LbdFlavor {
    fn default() -> Self {
        Self::new()
    }
}

impl Flavor for LbdFlavor {
    fn name(&self) -> &'static str {
        "lbd"
    }
    fn lab(&self) -> &Lab {
        &self.cluster.lab
    }
    fn lab_mut(&mut self) -> &mut Lab {
        &mut self.cluster.lab
    }
    fn advert_ms(&self) -> f64 {
        ADVERT_MS
    }
    fn conntrack_size(&self) -> u32 {
        CONNTRACK_SIZE
    }
    fn targets(&self) -> (Vec<Target>, Vec<Target>) {
        super::standard_targets()
    }
    fn stop_daemon(&mut self, node: &str, signal: i32) {
        self.cluster.lab.stop(&format!("lbd-{node}"), signal);
    }
    fn start_daemon(&mut self, node: &str) {
        self.cluster.start(node);
    }
    fn daemon_running(&mut self, node: &str) -> bool {
        let tag = format!("lbd-{node}");
        self.cluster.lab.pid(&tag).is_some()
            && self
                .cluster
                .lab
                .wait(&tag, std::time::Duration::ZERO)
                .is_none()
    }
    fn stop_services(&mut self, node: &str) {
        for t in self.cluster.service_tags(node) {
            self.cluster.lab.stop(&t, libc::SIGKILL);
        }
    }
    fn start_services(&mut self, node: &str) {
        self.cluster.start_services(node);
    }
    fn reboot_cleanup(&mut self, node: &str) {
        let ns = self.cluster.lab.node(node).netns.clone();
        for vip in [cluster::API_VIP, cluster::INGRESS_VIP, cluster::AUX_VIP] {
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
        let _ = try_sh(&["ip", "-n", &ns, "link", "set", "eth0", "xdpgeneric", "off"]);
        let _ = try_sh(&["ip", "-n", &ns, "link", "set", "eth0", "xdp", "off"]);
        let pins = std::path::PathBuf::from("/sys/fs/bpf").join(self.cluster.pin_name(node));
        let _ = std::fs::remove_dir_all(pins);
    }
    fn settled(&self) -> Result<(), String> {
        let mut masters: std::collections::BTreeMap<String, usize> = Default::default();
        for n in CONTROL_PLANE.iter().chain(WORKERS.iter()) {
            let status = self
                .cluster
                .lbctl(n, &["vrrp", "status"])
                .ok_or_else(|| format!("{n}: lbctl vrrp status failed"))?;
            for i in status.as_array().into_iter().flatten() {
                let state = i["state"].as_str().unwrap_or("?").to_ascii_lowercase();
                match state.as_str() {
                    "master" => *masters.entry(i["name"].to_string()).or_default() += 1,
                    "backup" => {}
                    // As on OpenShift, every node is in the ingress election and a node
                    // without a router is in FAULT there (chk_ingress, weight 0).
                    "fault" if i["name"] == "ingress" && !self.cluster.routers().contains(n) => {}
                    _ => return Err(format!("{n}: instance {} is {state}", i["name"])),
                }
            }
            let rows = self
                .cluster
                .lbctl(n, &["backends", "list"])
                .and_then(|v| v.as_array().cloned())
                .ok_or_else(|| format!("{n}: lbctl backends list failed"))?;
            if let Some(r) = rows.iter().find(|r| r["state"] != "active") {
                return Err(format!(
                    "{n}: backend {} of {} is {} ({})",
                    r["backend"], r["vip_name"], r["state"], r["reason"]
                ));
            }
        }
        for inst in self.instances() {
            let m = masters.get(&format!("{inst:?}")).copied().unwrap_or(0);
            if m != 1 {
                return Err(format!("instance {inst}: {m} masters"));
            }
        }
        Ok(())
    }
    fn supports(&self, _case: Case) -> bool {
        true
    }
    fn reload(&mut self, node: &str, config: &str) -> Result<(), String> {
        self.cluster.write_config_text(node, config);
        let out = crate::lbctl_output(&self.cluster.socket(node), &["reload"]);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
    fn base_config(&self, node: &str) -> String {
        toml::to_string(&self.base[node]).unwrap()
    }
    /// The aux instance's priority lowered on `node` (the API instance untouched).
    fn changed_config(&self, node: &str) -> String {
        toml::to_string(&cluster::with_aux_priority(&self.base[node], 30)).unwrap()
    }
}
