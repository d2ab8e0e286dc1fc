//! OVN-Kubernetes' node networking in a lab node: the node's address moves from `eth0` to an
//! Open vSwitch bridge `br-ex` whose port is `eth0` (the uplink veth), with the flows
//! OVN-Kubernetes puts on br-ex in shared-gateway mode for host traffic (written here from
//! its gateway code's description, see [`FLOWS`]). Each node runs its own ovsdb-server and
//! ovs-vswitchd, in a run directory of the lab's (nothing of a host's own OVS is touched), on
//! the kernel's `openvswitch` module: the lab kernel lacks it, Debian's 6.1 of the kernel
//! matrix has it (xtask/src/vm.rs).

use std::time::Duration;

use crate::lab::{Lab, sh, try_sh, wait_for};

/// OVN-Kubernetes' conntrack zone for br-ex (`config.Default.ConntrackZone`).
pub const CT_ZONE: u32 = 64000;
/// The ct_mark of host traffic (OVN-Kubernetes' `ctMarkHost`).
pub const CT_MARK_HOST: u32 = 2;

/// The shared-gateway flows of br-ex that concern the host, `{mac}` the bridge's MAC (which
/// OVN-Kubernetes sets to the uplink's), `{phys}` the uplink port, IPv4 and IPv6 alike:
/// - table 0: host traffic leaving (in_port LOCAL) is committed to conntrack zone 64000 with
///   ct_mark 2 and sent out of the uplink; IP from the uplink goes through conntrack (with
///   NAT) into table 1; frames from the uplink to the bridge's MAC go to the host; everything
///   else (ARP, ND, multicast) takes the NORMAL path.
/// - table 1: established and related connections of the host go to it, so does whatever is
///   addressed to the bridge's MAC; the rest NORMAL.
///
/// (No OVN patch ports: the lab has no OVN, so no flows for pods' traffic.)
pub const FLOWS: &str = "\
table=0,priority=100,in_port=LOCAL,ip,actions=ct(commit,zone={zone},exec(set_field:{mark}->ct_mark)),output:{phys}
table=0,priority=100,in_port=LOCAL,ipv6,actions=ct(commit,zone={zone},exec(set_field:{mark}->ct_mark)),output:{phys}
table=0,priority=50,in_port={phys},ip,actions=ct(zone={zone},nat,table=1)
table=0,priority=50,in_port={phys},ipv6,actions=ct(zone={zone},nat,table=1)
table=0,priority=10,in_port={phys},dl_dst={mac},actions=output:LOCAL
table=0,priority=0,actions=NORMAL
table=1,priority=100,ip,ct_state=+trk+est,ct_mark={mark},actions=output:LOCAL
table=1,priority=100,ip,ct_state=+trk+rel,ct_mark={mark},actions=output:LOCAL
table=1,priority=100,ipv6,ct_state=+trk+est,ct_mark={mark},actions=output:LOCAL
table=1,priority=100,ipv6,ct_state=+trk+rel,ct_mark={mark},actions=output:LOCAL
table=1,priority=10,dl_dst={mac},actions=output:LOCAL
table=1,priority=0,actions=NORMAL
";

/// Whether this kernel has Open vSwitch's datapath and the userspace is installed (the lab
/// kernel has no `openvswitch` module: the br-ex lab runs in the kernel matrix's VM).
pub fn available() -> Result<(), String> {
    if try_sh(&["modprobe", "openvswitch"]).status.success()
        && try_sh(&["ovs-vswitchd", "--version"]).status.success()
    {
        Ok(())
    } else {
        Err(format!(
            "no Open vSwitch here (kernel {}: `modprobe openvswitch` or ovs-vswitchd failed)",
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
        ))
    }
}

/// A factor for the lab's waits: `LB_TIME_SCALE` (the kernel matrix's guest runs under
/// software emulation, where loading the data plane takes minutes), default 1.
pub fn time_scale() -> u32 {
    std::env::var("LB_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// `d` scaled by [`time_scale`].
pub fn scaled(d: Duration) -> Duration {
    d * time_scale()
}

/// The bond [`make_bond`] makes.
pub const BOND: &str = "bond0";

/// Node `node`'s uplink becomes a bond of two links to the switch, as on a node whose br-ex
/// port is a bond: [`BOND`] in active-backup mode (link monitoring every 100 ms) with eth0's
/// MAC, its members `eth0` and a second veth `eth1` (the switch-side peer `<node>b`, on the
/// switch's bridge). Active-backup because the lab's switch is a plain bridge with no link
/// aggregation: one member carries the node's frames, so the bridge learns its MAC on one
/// port; the modes that send from both (balance-xor, round robin) need the switch's ports
/// grouped (a static LAG), 802.3ad needs LACP. eth0 is the active member until its link goes
/// down. The node's addresses leave eth0; [`make_br_ex_on`] puts them on br-ex.
pub fn make_bond(lab: &Lab, node: &str) {
    let n = lab.node(node).clone();
    // max_bonds=0: no bond0 of the module's own in the namespace loading it.
    sh(&["modprobe", "bonding", "max_bonds=0"]);
    let switch = format!("{}-sw", lab.prefix);
    let peer = format!("{node}b");
    sh(&[
        "ip", "-n", &switch, "link", "add", &peer, "type", "veth", "peer", "name", "eth1", "netns",
        &n.netns,
    ]);
    sh(&[
        "ip", "-n", &switch, "link", "set", &peer, "master", "br0", "up",
    ]);
    let ip = |args: &[&str]| {
        let mut a = vec!["ip", "-n", &n.netns];
        a.extend_from_slice(args);
        sh(&a)
    };
    ip(&["addr", "flush", "dev", "eth0", "scope", "global"]);
    ip(&[
        "link",
        "add",
        BOND,
        "type",
        "bond",
        "mode",
        "active-backup",
        "miimon",
        "100",
    ]);
    ip(&["link", "set", BOND, "address", &n.mac]);
    for m in ["eth0", "eth1"] {
        ip(&["link", "set", m, "down"]);
        ip(&["link", "set", m, "master", BOND]);
        ip(&["link", "set", m, "up"]);
    }
    ip(&["link", "set", BOND, "up"]);
}

/// The bond's active member (`Currently Active Slave` of /proc/net/bonding in the node's
/// namespace), if any.
pub fn active_member(lab: &Lab, node: &str) -> Option<String> {
    let n = lab.node(node);
    let out = try_sh(&[
        "ip",
        "netns",
        "exec",
        &n.netns,
        "cat",
        &format!("/proc/net/bonding/{BOND}"),
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Currently Active Slave: "))
        .map(|s| s.trim().to_string())
}

/// [`make_br_ex_on`] with the uplink `eth0`.
pub fn make_br_ex(lab: &mut Lab, node: &str) {
    make_br_ex_on(lab, node, "eth0")
}

/// Node `node` of `lab` gets OVS and br-ex: ovsdb-server and ovs-vswitchd (log tags
/// `ovsdb-<node>`, `ovs-<node>`), br-ex with `uplink` (eth0, or the bond of [`make_bond`]) as
/// its port and the node's MAC (`Node::mac`, the uplink's), the node's addresses (`v4`/24,
/// `v6`/64) moved from the uplink to br-ex, and [`FLOWS`].
pub fn make_br_ex_on(lab: &mut Lab, node: &str, uplink: &str) {
    let n = lab.node(node).clone();
    let dir = lab.dir.join(format!("ovs-{node}"));
    std::fs::create_dir_all(&dir).unwrap();
    let d = |f: &str| dir.join(f).display().to_string();
    let db = format!("unix:{}", d("db.sock"));
    sh(&[
        "ovsdb-tool",
        "create",
        &d("conf.db"),
        "/usr/share/openvswitch/vswitch.ovsschema",
    ]);
    let rundir = format!("OVS_RUNDIR={}", dir.display());
    lab.spawn(
        node,
        &format!("ovsdb-{node}"),
        "env",
        &[
            &rundir,
            "ovsdb-server",
            &d("conf.db"),
            &format!("--remote=p{db}"),
            &format!("--unixctl={}", d("ovsdb.ctl")),
            &format!("--pidfile={}", d("ovsdb.pid")),
        ],
    );
    let dbarg = format!("--db={db}");
    let vsctl = |args: &[&str]| {
        let mut a = vec![
            "ip",
            "netns",
            "exec",
            n.netns.as_str(),
            "ovs-vsctl",
            "--timeout=120",
            dbarg.as_str(),
        ];
        a.extend_from_slice(args);
        sh(&a)
    };
    assert!(
        wait_for(scaled(Duration::from_secs(20)), || dir
            .join("db.sock")
            .exists()
            .then_some(()))
        .is_some(),
        "ovsdb-server of {node} did not start\n{}",
        lab.log(&format!("ovsdb-{node}"))
    );
    vsctl(&["--no-wait", "init"]);
    lab.spawn(
        node,
        &format!("ovs-{node}"),
        "env",
        &[
            &rundir,
            "ovs-vswitchd",
            &db,
            &format!("--unixctl={}", d("vswitchd.ctl")),
            &format!("--pidfile={}", d("vswitchd.pid")),
        ],
    );
    vsctl(&[
        "add-br",
        "br-ex",
        "--",
        "set",
        "bridge",
        "br-ex",
        &format!("other-config:hwaddr=\"{}\"", n.mac),
        "--",
        "add-port",
        "br-ex",
        uplink,
    ]);
    let ip = |args: &[&str]| {
        let mut a = vec!["ip", "-n", &n.netns];
        a.extend_from_slice(args);
        sh(&a)
    };
    ip(&["addr", "flush", "dev", uplink, "scope", "global"]);
    ip(&["addr", "add", &format!("{}/24", n.v4), "dev", "br-ex"]);
    ip(&[
        "addr",
        "add",
        &format!("{}/64", n.v6),
        "dev",
        "br-ex",
        "nodad",
    ]);
    ip(&["link", "set", "br-ex", "up"]);
    let flows = FLOWS
        .replace("{zone}", &CT_ZONE.to_string())
        .replace("{mark}", &format!("{CT_MARK_HOST:#x}"))
        .replace("{phys}", uplink)
        .replace("{mac}", &n.mac);
    let file = d("flows.txt");
    std::fs::write(&file, flows).unwrap();
    let mgmt = format!("unix:{}", d("br-ex.mgmt"));
    for args in [
        vec!["del-flows", mgmt.as_str()],
        vec!["add-flows", mgmt.as_str(), file.as_str()],
    ] {
        let mut a = vec!["ip", "netns", "exec", &n.netns, "ovs-ofctl"];
        a.extend(args);
        sh(&a);
    }
}

/// br-ex's flows with their packet counts (`ovs-ofctl dump-flows`), for failure messages and
/// to show which flows the traffic took.
pub fn dump_flows(lab: &Lab, node: &str) -> String {
    let n = lab.node(node);
    let mgmt = format!(
        "unix:{}",
        lab.dir.join(format!("ovs-{node}/br-ex.mgmt")).display()
    );
    let out = try_sh(&[
        "ip",
        "netns",
        "exec",
        &n.netns,
        "ovs-ofctl",
        "--no-names",
        "dump-flows",
        &mgmt,
    ]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Packets matched by the br-ex flow of `node` whose text contains `needle` (summed).
pub fn flow_packets(lab: &Lab, node: &str, needle: &str) -> u64 {
    dump_flows(lab, node)
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| {
            l.split(", ")
                .find_map(|f| f.trim().strip_prefix("n_packets="))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}
