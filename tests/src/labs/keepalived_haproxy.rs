//! keepalived.conf and haproxy.cfg as OpenShift shapes them: the one writer of both for every
//! lab, bench and chaos case that runs them beside lbd or compares lbd with them. What differs
//! between those (names, addresses, priorities, tracked scripts, OpenShift's own template in
//! `openshift`) is in the values each passes; the text of the files is written only here.

/// keepalived's `global_defs`.
#[derive(Clone, Debug, Default)]
pub struct Globals<'a> {
    pub router_id: Option<&'a str>,
    /// `vrrp_version`; keepalived's default (2) when `None`.
    pub version: Option<u8>,
    /// Tracked scripts run (`enable_script_security`, `script_user root`).
    pub scripts: bool,
    /// `max_auto_priority -1`, as OpenShift sets it.
    pub max_auto_priority: bool,
}

/// `global_defs { ... }` and a blank line.
pub fn global_defs(g: &Globals) -> String {
    let mut c = String::from("global_defs {\n");
    if let Some(id) = g.router_id {
        c += &format!("    router_id {id}\n");
    }
    if let Some(v) = g.version {
        c += &format!("    vrrp_version {v}\n");
    }
    if g.scripts {
        c += "    enable_script_security\n    script_user root\n";
    }
    if g.max_auto_priority {
        c += "    max_auto_priority -1\n";
    }
    c += "    vrrp_garp_master_refresh 60\n}\n\n";
    c
}

/// A `vrrp_script` block and a blank line; `weight: None` leaves keepalived's 0 (the instance
/// goes to FAULT while the script fails).
pub fn vrrp_script(
    name: &str,
    cmd: &str,
    interval: u32,
    weight: Option<i32>,
    rise: u32,
    fall: u32,
) -> String {
    let mut c = format!("vrrp_script {name} {{\n    script \"{cmd}\"\n    interval {interval}\n");
    if let Some(w) = weight {
        c += &format!("    weight {w}\n");
    }
    c += &format!("    rise {rise}\n    fall {fall}\n}}\n\n");
    c
}

/// One `vrrp_instance` (always `state BACKUP`: the election decides).
#[derive(Clone, Debug)]
pub struct Instance<'a> {
    pub name: &'a str,
    pub interface: &'a str,
    pub vrid: u8,
    pub priority: u8,
    /// `advert_int`, in seconds as keepalived reads it (`1`, `0.1`).
    pub advert: String,
    pub preempt: bool,
    /// `unicast_src_ip` and the `unicast_peer` addresses; multicast when `None`.
    pub unicast: Option<(String, Vec<String>)>,
    /// PASS authentication's password.
    pub auth_pass: Option<String>,
    /// The VIP with its prefix length (`10.0.0.100/32`).
    pub vip: String,
    /// The address's label (`eth0:vip`; the kernel wants an IPv4 label to start with the
    /// interface's name; IPv6 addresses have none).
    pub label: Option<String>,
    pub track_scripts: Vec<&'a str>,
}

impl<'a> Instance<'a> {
    /// OpenShift's instance on `eth0` for an IPv4 VIP: `advert_int 1`, preempting, unicast from
    /// `src` to `peers`, PASS authentication, the VIP as `/32` labelled `eth0:vip`.
    pub fn openshift_v4(
        name: &'a str,
        vrid: u8,
        priority: u8,
        (src, peers): (String, Vec<String>),
        auth_pass: &str,
        vip: &str,
    ) -> Instance<'a> {
        Instance {
            name,
            interface: "eth0",
            vrid,
            priority,
            advert: "1".into(),
            preempt: true,
            unicast: Some((src, peers)),
            auth_pass: Some(auth_pass.into()),
            vip: format!("{vip}/32"),
            label: Some("eth0:vip".into()),
            track_scripts: Vec::new(),
        }
    }

    /// The block, ending in a newline.
    pub fn render(&self) -> String {
        let mut c = format!(
            "vrrp_instance {} {{\n    state BACKUP\n    interface {}\n    virtual_router_id {}\n    priority {}\n    advert_int {}\n",
            self.name, self.interface, self.vrid, self.priority, self.advert
        );
        if !self.preempt {
            c += "    nopreempt\n";
        }
        if let Some((src, peers)) = &self.unicast {
            c += &format!("    unicast_src_ip {src}\n    unicast_peer {{\n");
            for p in peers {
                c += &format!("        {p}\n");
            }
            c += "    }\n";
        }
        if let Some(p) = &self.auth_pass {
            c += &format!(
                "    authentication {{\n        auth_type PASS\n        auth_pass {p}\n    }}\n"
            );
        }
        let label = match &self.label {
            Some(l) => format!(" label {l}"),
            None => String::new(),
        };
        c += &format!(
            "    virtual_ipaddress {{\n        {}{label}\n    }}\n",
            self.vip
        );
        if !self.track_scripts.is_empty() {
            c += "    track_script {\n";
            for t in &self.track_scripts {
                c += &format!("        {t}\n");
            }
            c += "    }\n";
        }
        c += "}\n";
        c
    }
}

/// An haproxy `listen` section in TCP mode, `balance roundrobin`.
#[derive(Clone, Debug)]
pub struct Listen<'a> {
    pub name: &'a str,
    /// What follows `bind` (`*:8080`, `:::9445 v4v6`).
    pub bind: String,
    /// Checks as OpenShift's haproxy makes them in front of the apiservers: `GET /readyz` over
    /// TLS to this port. `None`: a plain TCP connect to the server's own port.
    pub readyz_tls_port: Option<u16>,
    /// (server name, `address:port`).
    pub servers: Vec<(String, String)>,
}

/// haproxy.cfg: TCP mode, client and server timeouts `timeout` (`30m`, `30s`), OpenShift's
/// check timing (`inter 5s fall 3 rise 1`).
pub fn haproxy_cfg(timeout: &str, listens: &[Listen]) -> String {
    let mut c = format!(
        "global\n  maxconn 4096\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  \
         timeout client {timeout}\n  timeout server {timeout}\n  timeout check 10s\n\n"
    );
    for l in listens {
        c += &format!(
            "listen {}\n  bind {}\n  mode tcp\n  balance roundrobin\n",
            l.name, l.bind
        );
        if l.readyz_tls_port.is_some() {
            c += "  option httpchk GET /readyz HTTP/1.0\n";
        }
        for (name, addr) in &l.servers {
            let tls = match l.readyz_tls_port {
                Some(p) => format!(" check-ssl verify none port {p}"),
                None => String::new(),
            };
            c += &format!("  server {name} {addr} check{tls} inter 5s fall 3 rise 1\n");
        }
        c += "\n";
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_holds_what_it_was_given() {
        let i = Instance {
            name: "ostest_API",
            interface: "eth0",
            vrid: 51,
            priority: 40,
            advert: "1".into(),
            preempt: false,
            unicast: Some(("10.0.0.1".into(), vec!["10.0.0.2".into()])),
            auth_pass: Some("ostest_a".into()),
            vip: "10.0.0.100/32".into(),
            label: Some("eth0:vip".into()),
            track_scripts: vec!["chk_ready"],
        }
        .render();
        for line in [
            "vrrp_instance ostest_API {",
            "    virtual_router_id 51",
            "    nopreempt",
            "    unicast_src_ip 10.0.0.1",
            "        10.0.0.2",
            "        auth_pass ostest_a",
            "        10.0.0.100/32 label eth0:vip",
            "        chk_ready",
        ] {
            assert!(i.lines().any(|l| l == line), "{line:?} missing in\n{i}");
        }
        assert_eq!(i.matches('{').count(), i.matches('}').count(), "{i}");
    }

    #[test]
    fn haproxy_checks_readyz_over_tls_only_when_asked() {
        let l = |p| Listen {
            name: "api",
            bind: "*:6443".into(),
            readyz_tls_port: p,
            servers: vec![("s0".into(), "10.0.0.1:6443".into())],
        };
        let tls = haproxy_cfg("30m", &[l(Some(6443))]);
        assert!(tls.contains("option httpchk GET /readyz"), "{tls}");
        assert!(
            tls.contains("check check-ssl verify none port 6443 inter 5s"),
            "{tls}"
        );
        let tcp = haproxy_cfg("30s", &[l(None)]);
        assert!(!tcp.contains("httpchk") && tcp.contains("10.0.0.1:6443 check inter 5s"));
    }
}
