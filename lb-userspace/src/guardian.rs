//! The VIP guardian: a small child process that gives the VRRP VIPs back the moment `lbd` dies
//! without stopping (SIGKILL, the OOM killer, an abort).
//!
//! Without it the dead master's addresses stay on its interface until a new `lbd` starts and
//! removes them, so once a backup takes over two nodes hold the VIP and both answer ARP/ND for it
//! (measured: about 2 s in `cargo xtask bench chaos` case 2, where lbd is restarted after 2 s;
//! for as long as lbd stays down otherwise). keepalived has the same gap when its VRRP process is
//! killed. The guardian runs what a restarted `lbd` would run first (each instance removes its
//! own VIPs from its interface, and only those) as soon as its pipe from `lbd` closes without a
//! goodbye. It leaves alone what is meant to outlive `lbd`: the pinned XDP program keeps
//! forwarding for clients whose caches still name this node, and the unannounced copy of each
//! VIP on `lo` (the DSR backend role) stays, so this node keeps serving as a backend.
//!
//! Protocol on the guardian's pipe, one JSON document per line: [`Message`]. Outside a
//! container `lbd` spawns it as `/proc/self/exe guardian` (the same binary, even if replaced on
//! disk). As a container's PID 1 the roles turn round ([`init`]): a child dies with the init.

use std::{
    io::{BufRead, Write},
    net::IpAddr,
    process::{Child, ChildStdin, Command, Stdio},
    sync::Mutex,
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::Config;

/// VIPs to give back, per interface, and BGP announcements to withdraw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    pub interfaces: Vec<(String, Vec<IpAddr>)>,
    /// The BGP VIPs whose announcement routes (`proto 76`) to withdraw: a node whose lbd died
    /// must not keep drawing traffic it may not serve.
    #[serde(default)]
    pub bgp_routes: Vec<IpAddr>,
}

impl Watch {
    /// The VRRP instances' VIPs of `cfg` by interface (static and BGP VIPs are not VRRP's to
    /// give back: no other node takes them over).
    pub fn of(cfg: &Config) -> Watch {
        let mut interfaces: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for r in &cfg.vrrp {
            let ifname = r.interface.clone().unwrap_or_else(|| cfg.interface.clone());
            match interfaces.iter_mut().find(|(i, _)| *i == ifname) {
                Some((_, vips)) => vips.extend(r.vips.iter().copied()),
                None => interfaces.push((ifname, r.vips.clone())),
            }
        }
        let bgp_routes = if cfg.bgp.is_empty() {
            Vec::new()
        } else {
            crate::bgp::bgp_addresses(&cfg.bgp_vips())
        };
        Watch {
            interfaces,
            bgp_routes,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    /// From now on, these are the VIPs to give back.
    Watch(Watch),
    /// `lbd` is stopping cleanly and has given its VIPs back itself: exit without doing anything.
    Bye,
}

/// What the guardian does when its input ends: the VIPs to remove, if any. Pure, for tests.
pub fn on_eof(messages: impl IntoIterator<Item = Message>) -> Option<Watch> {
    let mut last = None;
    for m in messages {
        match m {
            Message::Watch(w) => last = Some(w),
            Message::Bye => return None,
        }
    }
    last.filter(|w| !w.interfaces.is_empty() || !w.bgp_routes.is_empty())
}

/// `lbd`'s end: the pipe to the guardian.
pub struct Guardian {
    link: Mutex<Option<Link>>,
    /// The last watch sent, for a guardian child started again.
    last: Mutex<Option<Watch>>,
}

enum Link {
    /// The guardian is our child (`lbd guardian`).
    Child(Child, ChildStdin),
    /// The guardian is our parent, the container's init ([`init`]): the pipe it gave us.
    Parent(std::fs::File),
}

/// The environment variable through which [`init`] gives the daemon its end of the pipe.
const FD_ENV: &str = "LB_GUARDIAN_FD";
/// The environment variable through which a guardian child gets its first watch (a
/// [`Message::Watch`] in JSON) with its exec: a watch written to the pipe after the spawn
/// would be lost if lbd died in between, and the new guardian would give nothing back.
const WATCH_ENV: &str = "LB_GUARDIAN_WATCH";

impl Guardian {
    /// Connect to the guardian and tell it `initial`: the pipe from a guardian parent
    /// ([`init`]) if there is one, else start one as a child (`/proc/self/exe guardian`,
    /// sharing lbd's stderr for its logs) that knows `initial` from its first instruction.
    pub fn spawn(initial: &Watch) -> Result<Guardian> {
        if let Some(fd) = std::env::var(FD_ENV)
            .ok()
            .and_then(|v| v.parse::<i32>().ok())
        {
            // Not for our children (a restarted guardian child must not write there).
            unsafe { std::env::remove_var(FD_ENV) };
            // Nor for any process lbd starts: one that kept it open would hide lbd's death.
            if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
                anyhow::bail!("guardian pipe fd {fd}: {}", std::io::Error::last_os_error());
            }
            let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let g = Guardian {
                link: Mutex::new(Some(Link::Parent(file))),
                last: Mutex::new(None),
            };
            g.watch(initial);
            return Ok(g);
        }
        Ok(Guardian {
            link: Mutex::new(Some(Self::child(initial)?)),
            last: Mutex::new(Some(initial.clone())),
        })
    }

    fn child(initial: &Watch) -> Result<Link> {
        let seed = serde_json::to_string(&Message::Watch(initial.clone())).expect("serialize");
        let mut child = Command::new("/proc/self/exe")
            .arg("guardian")
            .env(WATCH_ENV, seed)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("start the VIP guardian")?;
        let stdin = child.stdin.take().context("guardian stdin")?;
        Ok(Link::Child(child, stdin))
    }

    fn send(link: &mut Link, m: &Message) -> std::io::Result<()> {
        let line = serde_json::to_string(m).expect("serialize") + "\n";
        match link {
            Link::Child(_, stdin) => stdin.write_all(line.as_bytes()),
            Link::Parent(f) => f.write_all(line.as_bytes()),
        }
    }

    /// Tell the guardian which VIPs to give back if lbd dies. A guardian child that died is
    /// started again (and logged): without it a crash would leave the VIPs up.
    pub fn watch(&self, w: &Watch) {
        *self.last.lock().unwrap() = Some(w.clone());
        let m = Message::Watch(w.clone());
        let mut guard = self.link.lock().unwrap();
        if let Some(link) = guard.as_mut()
            && Self::send(link, &m).is_ok()
        {
            return;
        }
        if let Some(Link::Child(mut c, _)) = guard.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        tracing::warn!("the VIP guardian is gone; starting it again");
        match Self::child(w) {
            Ok(link) => *guard = Some(link),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "no VIP guardian: a crash would leave the VIPs up")
            }
        }
    }

    /// Called every second: a guardian child that died (killed, OOM) is started again now,
    /// not at the next reload, and told the last watch.
    pub fn check(&self) {
        let dead = match self.link.lock().unwrap().as_mut() {
            Some(Link::Child(c, _)) => !matches!(c.try_wait(), Ok(None)),
            _ => false,
        };
        if dead {
            tracing::warn!("the VIP guardian died");
            let last = self.last.lock().unwrap().clone().unwrap_or_default();
            // The send fails on the closed pipe: `watch` starts a new child.
            self.watch(&last);
        }
    }

    /// lbd stops cleanly (its VIPs already given back): the guardian does nothing.
    pub fn bye(&self) {
        if let Some(mut link) = self.link.lock().unwrap().take() {
            let _ = Self::send(&mut link, &Message::Bye);
            if let Link::Child(mut c, stdin) = link {
                drop(stdin);
                let _ = c.wait();
            }
        }
    }
}

/// Read messages until the end of input (unreadable lines are logged and skipped).
fn read_messages(r: impl BufRead) -> Vec<Message> {
    r.lines()
        .map_while(|l| l.ok())
        .filter_map(|l| match serde_json::from_str(&l) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "guardian: unreadable message ignored");
                None
            }
        })
        .collect()
}

/// The guardian process (`lbd guardian`): read messages until the pipe closes, then give the
/// last watched VIPs back unless lbd said goodbye.
pub fn serve() -> Result<()> {
    // lbd's death is seen as the end of stdin; a signal for the whole process group (Ctrl-C in
    // a terminal) must not kill the guardian before lbd has stopped and said goodbye.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // The first watch came with our exec (see `WATCH_ENV`); the pipe brings the later ones.
    let seed = std::env::var(WATCH_ENV)
        .ok()
        .and_then(|s| serde_json::from_str::<Message>(&s).ok());
    let messages = seed
        .into_iter()
        .chain(read_messages(std::io::stdin().lock()));
    match on_eof(messages) {
        Some(w) => give_back(&w),
        None => Ok(()),
    }
}

/// Remove the watched VIPs (what a restarted lbd's instances would remove first).
fn give_back(w: &Watch) -> Result<()> {
    tracing::warn!(vips = ?w.interfaces, routes = ?w.bgp_routes, "lbd died without stopping; the guardian gives its VRRP VIPs back and withdraws its BGP routes");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection().context("open rtnetlink")?;
        tokio::spawn(conn);
        let mut result = Ok(());
        for a in &w.bgp_routes {
            match crate::bgp::routes::remove(&handle, *a).await {
                Ok(()) => tracing::info!(prefix = %a, "guardian: BGP announcement withdrawn"),
                Err(e) => {
                    tracing::error!(prefix = %a, error = %format!("{e:#}"), "guardian: withdrawing failed");
                    result = Err(e);
                }
            }
        }
        for (ifname, vips) in &w.interfaces {
            match crate::net::addr::remove_stale(&handle, ifname, vips).await {
                Ok(removed) => {
                    tracing::info!(interface = %ifname, ?removed, "guardian: VIPs given back")
                }
                Err(e) => {
                    tracing::error!(interface = %ifname, error = %format!("{e:#}"), "guardian: removing VIPs failed");
                    result = Err(e);
                }
            }
        }
        result
    })
}

/// Reap every child until `pid` is among the dead; its wait status.
fn reap_until(pid: i32) -> i32 {
    loop {
        let mut status = 0;
        let got = unsafe { libc::waitpid(-1, &mut status, 0) };
        if got == pid {
            return status;
        }
        if got < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 0;
        }
    }
}

static INIT_CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward_signal(sig: i32) {
    let pid = INIT_CHILD.load(std::sync::atomic::Ordering::SeqCst);
    if pid > 0 {
        unsafe { libc::kill(pid, sig) };
    }
}

/// `lbd run` as the container's PID 1. When a container's init dies the kernel kills every
/// other process in it, so a guardian child would die with lbd; here the guardian is the init
/// instead: it runs the daemon as its child (the same binary and arguments), passes on the
/// signals kubelet sends, reaps orphans, gives the VIPs back if the daemon dies without
/// stopping, and exits with the daemon's status, so the container restarts as before.
pub fn init() -> std::process::ExitCode {
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), 0) } != 0 {
        eprintln!(
            "lbd: pipe for the guardian: {}",
            std::io::Error::last_os_error()
        );
        return std::process::ExitCode::FAILURE;
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    unsafe { libc::fcntl(read_fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let child = Command::new("/proc/self/exe")
        .args(std::env::args_os().skip(1))
        .env(FD_ENV, write_fd.to_string())
        .spawn();
    unsafe { libc::close(write_fd) };
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lbd: start the daemon: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let pid = child.id() as i32;
    INIT_CHILD.store(pid, std::sync::atomic::Ordering::SeqCst);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        unsafe { libc::signal(sig, forward_signal as *const () as libc::sighandler_t) };
    }
    let pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(read_fd) };
    // The messages are read beside the reaping: PID 1 inherits every orphan of the container
    // (vtysh, health-check helpers) and must reap them while the daemon runs, not only after.
    let reader = std::thread::spawn(move || read_messages(std::io::BufReader::new(pipe)));
    let status = reap_until(pid);
    // The daemon is dead: its end of the pipe is closed, so the reader ends.
    let messages = reader.join().unwrap_or_default();
    if let Some(w) = on_eof(messages)
        && let Err(e) = give_back(&w)
    {
        eprintln!("lbd guardian: {e:#}");
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    std::process::ExitCode::from(code as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(vips: &[&str]) -> Watch {
        Watch {
            interfaces: vec![(
                "eth0".into(),
                vips.iter().map(|v| v.parse().unwrap()).collect(),
            )],
            bgp_routes: Vec::new(),
        }
    }

    #[test]
    fn the_last_watch_is_given_back_unless_lbd_said_goodbye() {
        assert_eq!(on_eof([]), None);
        assert_eq!(
            on_eof([
                Message::Watch(w(&["10.0.0.1"])),
                Message::Watch(w(&["10.0.0.2"]))
            ]),
            Some(w(&["10.0.0.2"]))
        );
        assert_eq!(
            on_eof([Message::Watch(w(&["10.0.0.1"])), Message::Bye]),
            None
        );
        // A reload that removed every VRRP instance: nothing to give back.
        assert_eq!(on_eof([Message::Watch(Watch::default())]), None);
        // BGP announcements alone are withdrawn too.
        let routes = Watch {
            bgp_routes: vec!["10.0.0.9".parse().unwrap()],
            ..Watch::default()
        };
        assert_eq!(
            on_eof([Message::Watch(routes.clone())]),
            Some(routes.clone())
        );
        // An older lbd's watch (no `bgp_routes`) still reads.
        let old: Message =
            serde_json::from_str(r#"{"watch":{"interfaces":[["eth0",["10.0.0.1"]]]}}"#).unwrap();
        assert_eq!(old, Message::Watch(w(&["10.0.0.1"])));
    }

    #[test]
    fn messages_are_one_json_line_each() {
        let m = Message::Watch(w(&["10.0.0.1", "fd00::1"]));
        let s = serde_json::to_string(&m).unwrap();
        assert!(!s.contains('\n'));
        assert_eq!(serde_json::from_str::<Message>(&s).unwrap(), m);
        assert_eq!(serde_json::to_string(&Message::Bye).unwrap(), "\"bye\"");
    }

    #[test]
    fn the_watch_groups_vrrp_vips_by_interface() {
        let cfg: Config = toml::from_str(
            r#"
interface = "eth0"
[[vrrp]]
name = "api"
vrid = 51
priority = 100
vips = ["10.0.0.100"]
[[vrrp]]
name = "ingress"
vrid = 52
priority = 100
vips = ["10.0.0.101"]
[[vrrp]]
name = "other"
vrid = 53
priority = 100
interface = "eth1"
vips = ["10.1.0.100"]
"#,
        )
        .unwrap();
        let got = Watch::of(&cfg);
        assert_eq!(
            got.interfaces,
            vec![
                (
                    "eth0".to_string(),
                    vec!["10.0.0.100".parse().unwrap(), "10.0.0.101".parse().unwrap()]
                ),
                ("eth1".to_string(), vec!["10.1.0.100".parse().unwrap()]),
            ]
        );
    }
}
