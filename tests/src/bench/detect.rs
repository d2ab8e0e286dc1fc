//! `bench detect`: how long a failed backend keeps receiving new connections, lbd (defaults)
//! next to haproxy with OpenShift's check settings, in the same lab.
//!
//! The failure is the backend's `/readyz` turning 500 (its ready file removed), as a
//! kube-apiserver that is shutting down does. The stand-in keeps answering every other path
//! with its id, so the client sees exactly which connections still reached it: the detection
//! time is the start of the last new connection it answered minus the moment of the failure.
//!
//! This module also holds [`HttpsLab`], the lab of real HTTPS backends that
//! `tests/tests/lab_health.rs` uses.

use std::{
    path::PathBuf,
    process::Output,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{Value, json};

use super::{median, write_json};
use crate::{
    bin_dir,
    lab::{Lab, wait_for},
};

pub const VIP: &str = "10.79.0.100";
/// The HTTPS service (health-checked with `GET /readyz`).
pub const HTTPS_PORT: u16 = 6443;
/// A raw TCP service on the same backends (`labnode serve-id`: id line, then echo), for
/// long-lived connections.
pub const TCP_PORT: u16 = 8080;
/// haproxy's listener on the LB node's own address (as OpenShift's 9445).
pub const HAPROXY_PORT: u16 = 9445;

/// What a backend node runs on [`HTTPS_PORT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `standin https` with a ready file (plus `labnode serve-id` on [`TCP_PORT`]).
    Https,
    /// `standin hang`: accepts and never answers.
    Hang,
    /// `standin garbage`: writes junk and closes.
    Garbage,
}

/// A client, an LB node running lbd (static ownership of [`VIP`], `xdp_mode = "skb"`, HTTPS
/// health checks with default timers) and DSR backends `b1..bN`.
pub struct HttpsLab {
    pub lab: Lab,
    pub socket: String,
    pub cfg_path: PathBuf,
    pub pin_name: String,
    /// (node name, address, kind), in order.
    pub backends: Vec<(String, String, Kind)>,
    /// Lines added to the service's `[vips.health]` table (e.g. `slow_start_ms = 8000`).
    pub health_extra: String,
    /// Top-level lines (e.g. `syn_flood_rate = 0`).
    pub top_extra: String,
}

pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// One line of `standin stream`: when the connection started and who answered (or why not),
/// and from which local port (for an answer).
#[derive(Clone, Debug)]
pub struct Sample {
    pub at_ms: u128,
    pub result: Result<String, String>,
    pub port: Option<u16>,
}

pub fn parse_stream(text: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(|l| {
            let (at, rest) = l.split_once(' ')?;
            let at_ms = at.parse().ok()?;
            let (result, port) = match rest.strip_prefix("ERR ") {
                Some(e) => (Err(e.to_string()), None),
                None => match rest.trim().rsplit_once(" port ") {
                    Some((id, port)) => (Ok(id.to_string()), port.parse().ok()),
                    None => (Ok(rest.trim().to_string()), None),
                },
            };
            Some(Sample {
                at_ms,
                result,
                port,
            })
        })
        .collect()
}

impl HttpsLab {
    /// Build the lab and start lbd; waits until every `Https` backend is active.
    pub fn setup(backends: &[(&str, Kind)]) -> HttpsLab {
        Self::setup_with(backends, "")
    }

    /// As [`HttpsLab::setup`], with `health_extra` added to the service's health table.
    pub fn setup_with(backends: &[(&str, Kind)], health_extra: &str) -> HttpsLab {
        Self::setup_full(backends, "", health_extra)
    }

    /// As [`HttpsLab::setup_with`], with `top_extra` as the config's first lines.
    pub fn setup_full(backends: &[(&str, Kind)], top_extra: &str, health_extra: &str) -> HttpsLab {
        let mut lab = Lab::new("hc");
        lab.add_node("client", "10.79.0.1", "fd79::1");
        lab.add_node("lb", "10.79.0.2", "fd79::2");
        let standin = bin_dir().join("standin");
        let labnode = bin_dir().join("labnode");
        let mut list = Vec::new();
        for (i, (n, kind)) in backends.iter().enumerate() {
            let v4 = format!("10.79.0.{}", 11 + i);
            lab.add_node(n, &v4, &format!("fd79::{}", 11 + i));
            lab.make_dsr_backend(n, &[VIP]);
            let listen = format!("0.0.0.0:{HTTPS_PORT}");
            match kind {
                Kind::Https => {
                    let ready = lab.dir.join(format!("{n}.ready"));
                    std::fs::write(&ready, "").unwrap();
                    let ready = ready.display().to_string();
                    let slow = lab.dir.join(format!("{n}.slow")).display().to_string();
                    lab.spawn(
                        n,
                        &format!("https-{n}"),
                        &standin,
                        &[
                            "https",
                            "--listen",
                            &listen,
                            "--id",
                            n,
                            "--ready-file",
                            &ready,
                            "--slow-file",
                            &slow,
                        ],
                    );
                }
                Kind::Hang => {
                    lab.spawn(
                        n,
                        &format!("hang-{n}"),
                        &standin,
                        &["hang", "--listen", &listen],
                    );
                }
                Kind::Garbage => {
                    lab.spawn(
                        n,
                        &format!("garbage-{n}"),
                        &standin,
                        &["garbage", "--listen", &listen],
                    );
                }
            }
            lab.spawn(
                n,
                &format!("tcp-{n}"),
                &labnode,
                &["serve-id", &TCP_PORT.to_string(), n],
            );
            list.push((n.to_string(), v4, *kind));
        }
        // lbd holds the static VIP itself (`owned = true`): a /32 added here by hand would be
        // the node's own address, which lbd refuses as a VIP.
        let pin_name = lab.prefix.replace('-', "_");
        let socket = lab.dir.join("lbd.sock").display().to_string();
        let cfg_path = lab.dir.join("lbd.toml");
        lab.cleanup(PathBuf::from("/sys/fs/bpf").join(&pin_name));
        let mut l = HttpsLab {
            lab,
            socket,
            cfg_path,
            pin_name,
            backends: list,
            health_extra: health_extra.to_string(),
            top_extra: top_extra.to_string(),
        };
        let weights: Vec<(&str, u32)> = backends.iter().map(|(n, _)| (*n, 1)).collect();
        std::fs::write(&l.cfg_path, l.config(&weights)).unwrap();
        l.start_lbd("lbd");
        let healthy: Vec<String> = l
            .backends
            .iter()
            .filter(|b| b.2 == Kind::Https)
            .map(|b| b.0.clone())
            .collect();
        for n in &healthy {
            if l.wait_state(n, "active", Duration::from_secs(20)).is_none() {
                panic!(
                    "{n} never became active: {:?}\nlbd log:\n{}",
                    l.backends_json(),
                    l.lab.log("lbd")
                );
            }
        }
        l
    }

    /// The config with these backends (node name, weight); any weight is written as given.
    pub fn config(&self, weights: &[(&str, u32)]) -> String {
        let mut c = self.top_extra.clone();
        c += &format!(
            "interface = \"eth0\"\nname = \"{}\"\napi_socket = \"{}\"\nxdp_mode = \"skb\"\n\n\
             [[vips]]\nname = \"api\"\naddress = \"{VIP}\"\nports = [{HTTPS_PORT}, {TCP_PORT}]\nowned = true\n\
             [vips.health]\nkind = \"https\"\npath = \"/readyz\"\nport = {HTTPS_PORT}\n{}\n",
            self.pin_name, self.socket, self.health_extra
        );
        for (n, w) in weights {
            c += &format!(
                "[[vips.backends]]\naddress = \"{}\"\nweight = {w}\n",
                self.addr(n)
            );
        }
        c
    }

    /// Start lbd in the LB node (log under `tag`).
    pub fn start_lbd(&mut self, tag: &str) -> u32 {
        let lbd = bin_dir().join("lbd");
        let cfg = self.cfg_path.display().to_string();
        self.lab.spawn("lb", tag, &lbd, &["--config", &cfg])
    }

    pub fn addr(&self, node: &str) -> String {
        self.lab.node(node).v4.clone()
    }

    pub fn lbctl_raw(&self, args: &[&str]) -> Output {
        crate::lbctl_output(&self.socket, args)
    }

    pub fn lbctl(&self, args: &[&str]) -> Option<Value> {
        crate::lbctl_json(&self.socket, args)
    }

    pub fn backends_json(&self) -> Option<Vec<Value>> {
        self.lbctl(&["backends", "list"])?.as_array().cloned()
    }

    /// The rows of one backend (one per service port).
    pub fn rows(&self, node: &str) -> Option<Vec<Value>> {
        let addr = self.addr(node);
        let rows: Vec<Value> = self
            .backends_json()?
            .into_iter()
            .filter(|r| r["backend"] == addr.as_str())
            .collect();
        (!rows.is_empty()).then_some(rows)
    }

    /// Wait until every row of `node` is in `state`; how long it took.
    pub fn wait_state(&self, node: &str, state: &str, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        wait_for(timeout, || {
            let rows = self.rows(node)?;
            rows.iter().all(|r| r["state"] == state).then_some(())
        })?;
        Some(start.elapsed())
    }

    pub fn set_ready(&self, node: &str, ready: bool) {
        let p = self.lab.dir.join(format!("{node}.ready"));
        if ready {
            std::fs::write(&p, "").unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }

    /// Make `node`'s health answers wait `ms` (slow, not dead); `None`: answer at once.
    pub fn set_slow(&self, node: &str, ms: Option<u64>) {
        let p = self.lab.dir.join(format!("{node}.slow"));
        match ms {
            Some(ms) => std::fs::write(&p, ms.to_string()).unwrap(),
            None => {
                let _ = std::fs::remove_file(&p);
            }
        }
    }

    /// `standin get-many` from the client to VIP:HTTPS_PORT over TLS.
    pub fn get_many(&self, count: u64, concurrency: u64) -> Value {
        let target = format!("{VIP}:{HTTPS_PORT}");
        let out = self.lab.run(
            "client",
            bin_dir().join("standin"),
            &[
                "get-many",
                "--target",
                &target,
                "--tls",
                "--count",
                &count.to_string(),
                "--concurrency",
                &concurrency.to_string(),
            ],
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `labnode connect-many` from the client to VIP:TCP_PORT.
    pub fn connect_many(&self, count: u64) -> Value {
        let out = self.lab.run(
            "client",
            bin_dir().join("labnode"),
            &[
                "connect-many",
                VIP,
                &TCP_PORT.to_string(),
                &count.to_string(),
                "4",
                "3000",
            ],
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Start `standin stream` from the client to `target` (TLS), logged under `tag`.
    pub fn start_stream(&mut self, tag: &str, target: &str, concurrency: u32, pause_ms: u32) {
        let standin = bin_dir().join("standin");
        self.lab.spawn(
            "client",
            tag,
            standin,
            &[
                "stream",
                "--target",
                target,
                "--tls",
                "--concurrency",
                &concurrency.to_string(),
                "--pause-ms",
                &pause_ms.to_string(),
            ],
        );
    }

    pub fn samples(&self, tag: &str) -> Vec<Sample> {
        parse_stream(&self.lab.log(tag))
    }

    /// Start haproxy in the LB node as a TCP proxy on [`HAPROXY_PORT`] to every backend's
    /// HTTPS port, with the check settings of OpenShift's haproxy static pod.
    pub fn start_haproxy(&mut self) {
        self.start_haproxy_with("check check-ssl verify none inter 5s fall 3 rise 1")
    }

    /// As [`HttpsLab::start_haproxy`], with these `server` options.
    pub fn start_haproxy_with(&mut self, server_opts: &str) {
        let mut c = String::from(
            "global\n  maxconn 4096\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  \
             timeout client 30m\n  timeout server 30m\n  timeout check 10s\n\n",
        );
        c += &format!(
            "listen api\n  bind {}:{HAPROXY_PORT}\n  mode tcp\n  balance roundrobin\n  \
             option httpchk GET /readyz HTTP/1.0\n",
            self.addr("lb")
        );
        for (n, a, _) in &self.backends {
            c += &format!("  server {n} {a}:{HTTPS_PORT} {server_opts}\n");
        }
        let path = self.lab.dir.join("haproxy.cfg");
        std::fs::write(&path, c).unwrap();
        let p = path.display().to_string();
        self.lab
            .spawn("lb", "haproxy", "haproxy", &["-db", "-f", &p]);
    }
}

/// One trial: make `node` unready at a recorded time, wait `window`, make it ready again and
/// wait until it gets new connections. Returns when it failed and when it was restored (Unix ms).
fn trial(l: &HttpsLab, tag: &str, node: &str, window: Duration, jitter: Duration) -> (u128, u128) {
    // Traffic has reached `node` recently: it is in rotation before the failure.
    wait_for(Duration::from_secs(30), || {
        let since = now_ms().saturating_sub(1000);
        l.samples(tag)
            .iter()
            .any(|s| s.at_ms >= since && s.result.as_deref() == Ok(node))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{node} gets no connections before the trial"));
    // A random delay, so trials do not all fail at the same phase of the checker's cadence
    // (haproxy checks every 5 s: detection takes 10-15 s depending on that phase).
    std::thread::sleep(random_below(jitter));
    let failed_at = now_ms();
    l.set_ready(node, false);
    std::thread::sleep(window);
    let restored_at = now_ms();
    l.set_ready(node, true);
    wait_for(Duration::from_secs(30), || {
        l.samples(tag)
            .iter()
            .any(|s| s.at_ms > restored_at && s.result.as_deref() == Ok(node))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{node} never came back after the trial"));
    (failed_at, restored_at)
}

fn random_below(d: Duration) -> Duration {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    Duration::from_millis(r % (d.as_millis() as u64).max(1))
}

/// Detection time of one trial: start of the last connection `node` answered in
/// [failed_at, restored_at) minus `failed_at` (0 if none reached it after the failure).
pub fn detect_ms(samples: &[Sample], node: &str, failed_at: u128, restored_at: u128) -> f64 {
    samples
        .iter()
        .filter(|s| s.at_ms >= failed_at && s.at_ms < restored_at)
        .filter(|s| s.result.as_deref() == Ok(node))
        .map(|s| (s.at_ms - failed_at) as f64)
        .fold(0.0, f64::max)
}

fn run_trials(
    l: &mut HttpsLab,
    tag: &str,
    target: &str,
    trials: usize,
    window: Duration,
    jitter: Duration,
) -> (Vec<f64>, u64) {
    l.start_stream(tag, target, 3, 5);
    let names: Vec<String> = l.backends.iter().map(|b| b.0.clone()).collect();
    let mut times = Vec::new();
    for i in 0..trials {
        let node = &names[i % names.len()];
        let (failed_at, restored_at) = trial(l, tag, node, window, jitter);
        let d = detect_ms(&l.samples(tag), node, failed_at, restored_at);
        println!(
            "  trial {}: {node} unready -> last new connection after {d:.0} ms",
            i + 1
        );
        if d as u128 + 1500 > restored_at - failed_at {
            println!("    (close to the end of the {window:?} window: the value may be capped)");
        }
        times.push(d);
    }
    l.lab.stop(tag, libc::SIGTERM);
    let errors = l.samples(tag).iter().filter(|s| s.result.is_err()).count() as u64;
    (times, errors)
}

pub fn run() {
    const LBD_TRIALS: usize = 6;
    const HAPROXY_TRIALS: usize = 3;
    let started = Instant::now();
    println!(
        "failure = the backend's /readyz answers 500 (ready file removed); detection = start of \
         the last new connection it answered after that"
    );
    let mut l = HttpsLab::setup(&[
        ("b1", Kind::Https),
        ("b2", Kind::Https),
        ("b3", Kind::Https),
    ]);
    l.start_haproxy();

    println!("lbd (interval 200 ms, timeout 200 ms, fall 3, rise 2), {LBD_TRIALS} trials:");
    let vip_target = format!("{VIP}:{HTTPS_PORT}");
    let (lbd, lbd_errors) = run_trials(
        &mut l,
        "stream-lbd",
        &vip_target,
        LBD_TRIALS,
        Duration::from_millis(2500),
        Duration::from_millis(200),
    );

    println!(
        "haproxy (inter 5s fall 3 rise 1, GET /readyz HTTP/1.0, check-ssl verify none), \
         {HAPROXY_TRIALS} trials of ~25 s:"
    );
    let hp_target = format!("{}:{HAPROXY_PORT}", l.addr("lb"));
    let (hp, hp_errors) = run_trials(
        &mut l,
        "stream-haproxy",
        &hp_target,
        HAPROXY_TRIALS,
        Duration::from_secs(19),
        Duration::from_secs(5),
    );

    let (m, hm) = (median(lbd.clone()), median(hp.clone()));
    println!();
    println!(
        "{:<10} {:>7} {:>11} {:>9} {:>9}  failed requests",
        "checker", "trials", "median ms", "min ms", "max ms"
    );
    let fold = |v: &[f64], f: fn(f64, f64) -> f64, init: f64| v.iter().copied().fold(init, f);
    for (name, v, med, errs) in [
        ("lbd", &lbd, m, lbd_errors),
        ("haproxy", &hp, hm, hp_errors),
    ] {
        println!(
            "{:<10} {:>7} {:>11.0} {:>9.0} {:>9.0}  {}",
            name,
            v.len(),
            med,
            fold(v, f64::min, f64::MAX),
            fold(v, f64::max, 0.0),
            errs
        );
    }
    println!("ratio haproxy / lbd (medians): {:.1}x", hm / m.max(1.0));
    println!("total {:.0} s", started.elapsed().as_secs_f64());
    write_json(
        "detect",
        &json!({
            "detect_ms": lbd,
            "median_ms": m,
            "haproxy_detect_ms": hp,
            "haproxy_median_ms": hm,
            "failure": "ready file removed: /readyz answers 500, the backend keeps serving",
            "lbd_settings": "https GET /readyz, interval 200 ms, timeout 200 ms, fall 3, rise 2",
            "haproxy_settings": "option httpchk GET /readyz HTTP/1.0; check check-ssl verify none inter 5s fall 3 rise 1",
            "failed_requests": {"lbd": lbd_errors, "haproxy": hp_errors},
        }),
    );
}
