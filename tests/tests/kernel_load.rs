//! Every program of the object loads and attaches on the running kernel: the forwarding
//! program and its traced copy (driver mode), the pass program (what a native-mode veth's peer
//! needs), the cgroup socket hooks, and the backends' decap program (generic mode).
//! `cargo xtask test` runs this on the lab kernel and again in a VM on each kernel of the
//! matrix (xtask/src/vm.rs, docs/kernels.md). It prints, per program, the instructions the
//! kernel's verifier processed (`LBVM-INSNS` lines, which the matrix collects).
use std::path::Path;

use lb_tests::{TestDataplane, lab::Lab, unique};
use lb_userspace::{config::XdpMode, dataplane::decap::Decap};

/// The program attached to `dev` in `netns` (`ip -j link`): (mode, program id).
fn xdp_on(netns: &str, dev: &str) -> Option<(String, u32)> {
    let out = lb_tests::lab::sh(&["ip", "-n", netns, "-j", "-d", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let xdp = &v[0]["xdp"];
    let mode = match xdp["mode"].as_u64()? {
        1 => "driver",
        2 => "generic",
        _ => "other",
    };
    Some((mode.to_string(), xdp["prog"]["id"].as_u64()? as u32))
}

/// What the verifier processed for the loaded program with this id (Linux 5.16 and later
/// report it; 0 where it does not).
fn verified_insns(id: u32) -> u32 {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .and_then(|p| p.verified_instruction_count())
        .unwrap_or(0)
}

#[test]
fn every_program_of_the_object_loads_and_attaches_on_this_kernel() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    println!("kernel {}", release.trim());
    let mut lab = Lab::new("kl");
    lab.add_node("n1", "10.91.0.1", "fd91::1");
    lab.add_node("n2", "10.91.0.2", "fd91::2");
    lab.link("n1", "up1", "10.92.0.1/24", "n2", "up2", "10.92.0.2/24");
    let (ns1, ns2) = (lab.node("n1").netns.clone(), lab.node("n2").netns.clone());
    lab.in_netns("n1", move || {
        let mut t = TestDataplane::new(251);
        // Loaded when first needed (lbd: at its start, with the trace maps).
        t.dp.arm_noted()
            .unwrap_or_else(|e| panic!("load lb_xdp_noted: {e:#}"));
        t.dp.attach("eth0", XdpMode::Driver)
            .unwrap_or_else(|e| panic!("attach lb_xdp in driver mode: {e:#}"));
        t.dp.attach_pass("up1")
            .unwrap_or_else(|e| panic!("attach lb_pass: {e:#}"));
        t.dp.attach_sock()
            .unwrap_or_else(|e| panic!("load and attach the cgroup socket hooks: {e:#}"));
        let (mode, id) = xdp_on(&ns1, "eth0").expect("an XDP program on eth0");
        assert_eq!(mode, "driver");
        println!("LBVM-INSNS lb_xdp {}", verified_insns(id));
        let (mode, pass) = xdp_on(&ns1, "up1").expect("lb_pass on up1");
        assert_eq!(mode, "driver");
        assert_ne!(id, pass);
        t.dp.detach_sock();
    });
    lab.in_netns("n2", move || {
        let mut d = Decap::load(&unique("kld"), Path::new("/sys/fs/bpf"))
            .unwrap_or_else(|e| panic!("load lb_decap: {e:#}"));
        d.attach("up2", XdpMode::Skb)
            .unwrap_or_else(|e| panic!("attach lb_decap in generic mode: {e:#}"));
        let (mode, id) = xdp_on(&ns2, "up2").expect("lb_decap on up2");
        assert_eq!(mode, "generic");
        println!("LBVM-INSNS lb_decap {}", verified_insns(id));
    });
}

/// On a kernel older than the oldest lb supports, lbd stops at start with one error that names
/// the kernel, the refused program and the verifier's reason, then what the kernel lacks by its
/// number; never the verifier's dump (that goes to the debug log). The kernel matrix runs it,
/// alone, on each such kernel (xtask/src/vm.rs); on a supported kernel there is nothing to see.
#[test]
#[ignore = "needs a kernel older than lb's oldest supported (5.12): the kernel matrix runs it on Debian 11's 5.10"]
fn on_a_kernel_older_than_the_oldest_supported_lbd_stops_naming_the_kernel_and_the_reason() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();
    let parsed = lb_userspace::dataplane::kernel::Release::parse(release).expect("a release");
    let (major, minor) = lb_userspace::dataplane::kernel::oldest_supported();
    assert!(
        parsed.version < (major, minor),
        "kernel {release} is not older than {major}.{minor}: this test is for the matrix's old kernel"
    );
    let mut lab = Lab::new("ko");
    lab.add_node("n1", "10.93.0.1", "fd93::1");
    let name = lab.prefix.replace('-', "_");
    let socket = lab.dir.join("lbd.sock").display().to_string();
    let cfg = lab.dir.join("lbd.toml");
    std::fs::write(
        &cfg,
        format!(
            "interface = \"eth0\"\nname = \"{name}\"\napi_socket = \"{socket}\"\n\n\
             [[vips]]\nname = \"api\"\naddress = \"10.93.0.100\"\nports = [6443]\nowned = true\n\
             [[vips.backends]]\naddress = \"10.93.0.1\"\n"
        ),
    )
    .unwrap();
    lab.cleanup(Path::new("/sys/fs/bpf").join(&name));
    let out = lab
        .cmd("n1", "timeout")
        .arg("900")
        .arg(lb_tests::bin_dir().join("lbd"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("lbd exited {:?}; its stderr:\n{stderr}", out.status.code());
    // It stops (not the timeout's 124, not running on without its data plane)...
    assert!(
        !out.status.success() && out.status.code() != Some(124),
        "lbd did not stop with an error on {release}"
    );
    // ...with one error naming the kernel, the program and the verifier's reason, then what
    // the kernel lacks by its number.
    let line = stderr
        .lines()
        .find(|l| l.contains("refused the data plane program"))
        .unwrap_or_else(|| panic!("no refusal naming the program in lbd's error:\n{stderr}"));
    assert!(
        line.contains(&format!(
            "kernel {release} refused the data plane program lb_xdp: "
        )),
        "{line}"
    );
    assert!(
        line.contains(&format!("lb needs Linux {major}.{minor}")) && line.contains("bpf_check_mtu"),
        "{line}"
    );
    // Not the verifier's dump: no instruction or register-state lines.
    let dump = stderr
        .lines()
        .filter(|l| {
            l.contains("R1=")
                || l.trim_start().starts_with("0: (")
                || l.trim_start().starts_with("; ")
        })
        .count();
    assert!(
        dump == 0 && stderr.lines().count() < 20,
        "a verifier dump in lbd's error:\n{stderr}"
    );
}
