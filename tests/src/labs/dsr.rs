//! The DSR lab of the data-plane issue, shared by its test, the demo and the benchmarks.

use std::time::Duration;

use serde_json::Value;

use crate::{
    bin_dir,
    lab::{Lab, wait_for},
};

pub const VIP4: &str = "10.77.0.100";
pub const VIP6: &str = "fd77::100";
pub const PORT: &str = "8080";

/// A client, an LB node running lbd with static ownership of two VIPs (IPv4 and IPv6), and
/// three DSR backends (weights 1, 1, 2) running `labnode serve-id`.
pub struct DsrLab {
    pub lab: Lab,
    pub socket: String,
}

fn config(lab: &Lab, name: &str, socket: &str) -> String {
    let b = |n: &str, v6: bool| {
        if v6 {
            lab.node(n).v6.clone()
        } else {
            lab.node(n).v4.clone()
        }
    };
    let mut c = format!(
        "interface = \"eth0\"\nname = \"{name}\"\napi_socket = \"{socket}\"\nxdp_mode = \"skb\"\nmetrics_listen = \"127.0.0.1:9444\"\n"
    );
    for (vname, vip, v6) in [("web4", VIP4, false), ("web6", VIP6, true)] {
        c += &format!(
            "\n[[vips]]\nname = \"{vname}\"\naddress = \"{vip}\"\nports = [{PORT}]\nowned = true\n[vips.health]\nkind = \"tcp\"\ninterval_ms = 200\n"
        );
        for (n, w) in [("b1", 1), ("b2", 1), ("b3", 2)] {
            c += &format!(
                "[[vips.backends]]\naddress = \"{}\"\nweight = {w}\n",
                b(n, v6)
            );
        }
    }
    c
}

/// Build the lab and wait until lbd reports every backend active.
pub fn setup(labnode: &str) -> DsrLab {
    let mut lab = Lab::new("dsr");
    lab.add_node("client", "10.77.0.1", "fd77::1");
    lab.add_node("lb", "10.77.0.2", "fd77::2");
    for (i, n) in ["b1", "b2", "b3"].iter().enumerate() {
        lab.add_node(
            n,
            &format!("10.77.0.{}", 11 + i),
            &format!("fd77::{}", 11 + i),
        );
        lab.make_dsr_backend(n, &[VIP4, VIP6]);
        lab.spawn(n, &format!("server-{n}"), labnode, &["serve-id", PORT, n]);
    }
    // The LB node owns the VIPs (static ownership: no VRRP in this lab).
    // No address on lb: its VIPs are owned statically (`owned = true`), so lbd adds them to
    // eth0 and announces them itself.

    let name = lab.prefix.replace('-', "_");
    let socket = lab.dir.join("lbd.sock").display().to_string();
    let cfg_path = lab.dir.join("lbd.toml");
    std::fs::write(&cfg_path, config(&lab, &name, &socket)).unwrap();
    lab.cleanup(std::path::PathBuf::from("/sys/fs/bpf").join(&name));
    let lbd = bin_dir().join("lbd");
    lab.spawn("lb", "lbd", &lbd, &["--config", cfg_path.to_str().unwrap()]);
    let netns = lab.node("lb").netns.clone();
    let on_eth0 = wait_for(Duration::from_secs(20), || {
        let out = crate::lab::try_sh(&["ip", "-n", &netns, "addr", "show", "dev", "eth0"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (text.contains(&format!("{VIP4}/32")) && text.contains(&format!("{VIP6}/128")))
            .then_some(())
    });
    assert!(
        on_eth0.is_some(),
        "lbd did not add its static VIPs to eth0\n{}",
        lab.log("lbd")
    );
    let l = DsrLab { lab, socket };
    // Ready when every backend of both VIPs is active (MAC resolved, health check passed).
    let ready = wait_for(Duration::from_secs(20), || {
        let rows = l.backends()?;
        (rows.len() == 6 && rows.iter().all(|r| r["state"] == "active")).then_some(())
    });
    if ready.is_none() {
        panic!(
            "backends never became active: {:?}\nlbd log:\n{}",
            l.backends(),
            l.lab.log("lbd")
        );
    }
    l
}

impl DsrLab {
    pub fn lbctl(&self, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket, args)
    }

    pub fn backends(&self) -> Option<Vec<Value>> {
        self.lbctl(&["backends", "list"])?.as_array().cloned()
    }

    pub fn connect_many(&self, labnode: &str, vip: &str, count: u64) -> Value {
        let out = self.lab.run(
            "client",
            labnode,
            &["connect-many", vip, PORT, &count.to_string(), "8", "3000"],
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}
