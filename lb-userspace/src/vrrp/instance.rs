//! One VRRP instance as a task on its own OS thread: owns its socket and timer, feeds packets,
//! timer expiries, link changes and priority updates to the pure [`Machine`], and carries out
//! its actions (adverts, VIPs, announcements). Ownership changes go to the daemon through a
//! `watch::Receiver<bool>`; the daemon flips the data plane's owned flag.
//!
//! The thread runs a single-threaded tokio runtime of its own (timer, socket readiness and a
//! netlink connection for its VIPs), under real-time scheduling when allowed
//! ([`super::realtime`]): adverts go out and are read on time whatever the daemon's other
//! tasks and the node's other processes do.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::admission::Policy;
use super::announce::Announcer;
use super::codec::{self, Advert, DecodeError, Version};
use super::collision::{Collisions, Mismatch};
use super::config::InstanceConfig;
use super::hold::{self, Hold};
use super::io::{Incoming, VrrpSocket};
use super::limiter::WarnLimiter;
use super::realtime::{self, Sched};
use super::split_brain::DualMaster;
use super::state::{self, Action, Event, Machine, Params, State};
use crate::config::Validate;
use crate::net::iface::interface_info;

pub use super::hold::{FORWARDING_ACK_WAIT, GARP_BURST, GARP_SPACING};
/// Test-only: a file holding a delay in ms that every VIP removal of an instance waits before
/// it is sent (a stalled kernel answer; `tests/tests/lab_core.rs`). See
/// [`crate::net::injected_delay`].
pub const REMOVE_DELAY_FILE_ENV: &str = "LB_TEST_VRRP_REMOVE_DELAY_FILE";
/// How often link state is polled (a link going down means fault).
const LINK_POLL: Duration = Duration::from_millis(250);

/// The last state change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRecord {
    pub at_unix_ms: u64,
    pub from: State,
    pub to: State,
    pub reason: String,
}

/// The start of the last dual-master episode (another router kept claiming our VIPs while we
/// were master; see [`super::split_brain`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitBrainRecord {
    pub at_unix_ms: u64,
    pub peer: IpAddr,
    pub peer_priority: u8,
    /// Always false: an episode is one where we stayed master (a step-down ends it at once).
    pub stepped_down: bool,
    /// Whether the peer's adverts vote (`ok`) or why they are dropped (e.g. `wrong_version`
    /// during a migration, `not_a_peer`).
    pub their_adverts: Cow<'static, str>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub adverts_sent: u64,
    pub adverts_received: u64,
    pub send_errors: u64,
    /// Dropped packets per [`DecodeError::reason`].
    pub drops: BTreeMap<Cow<'static, str>, u64>,
    pub split_brain: u64,
    pub transitions: u64,
    pub became_master: u64,
    pub announcements: u64,
    pub vip_errors: u64,
    /// The VRRP socket was bound again to a recreated interface.
    pub rebinds: u64,
    /// The interface's MAC changed (bond failover, a cloned MAC): announced again at once.
    pub mac_changes: u64,
    /// A link poll that saw the interface down (or failed) was not confirmed by netlink: the
    /// instance stayed where it was.
    pub unconfirmed_link_down: u64,
}

/// The last advert that could not be sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendErrorRecord {
    pub at_unix_ms: u64,
    pub dst: IpAddr,
    pub error: String,
}

/// `lbctl vrrp status` for one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub name: String,
    pub interface: String,
    pub vrid: u8,
    pub version: u8,
    pub state: State,
    pub base_priority: u8,
    pub effective_priority: u8,
    /// Our advert source address (the election tie-breaker).
    pub primary_addr: IpAddr,
    pub master: Option<IpAddr>,
    pub advert_interval_ms: u64,
    /// The interval the current master advertises.
    pub master_advert_interval_ms: u64,
    pub vips: Vec<IpAddr>,
    pub unicast_peers: Vec<IpAddr>,
    pub owned: bool,
    pub last_transition: Option<TransitionRecord>,
    pub last_split_brain: Option<SplitBrainRecord>,
    /// A master whose adverts fail is master only in its own eyes: shown, counted and warned.
    pub last_send_error: Option<SendErrorRecord>,
    pub counters: Counters,
    pub collisions: Collisions,
}

/// What the daemon tells a running instance. The queue is unbounded so that the daemon never
/// waits on an instance whose thread is held up (a VIP change the kernel is slow to answer):
/// only reloads put commands on it. The tracked weight, which follows every health change, goes
/// on a `watch` instead (the latest value is all that counts).
enum Command {
    /// A reload changed only fields that apply in place (see
    /// [`InstanceConfig::restart_needed`]).
    Reconfigure(Box<InstanceConfig>),
    /// Leave (see [`Instance::shutdown`]); the thread then ends.
    Shutdown,
}

/// The daemon's handle on a running instance.
pub struct Instance {
    commands: mpsc::UnboundedSender<Command>,
    weight: watch::Sender<super::track::Tracking>,
    /// Closed when the instance's thread ends (see [`Leaving`]).
    gone: watch::Receiver<()>,
    status: Arc<Mutex<InstanceStatus>>,
    owned: watch::Receiver<bool>,
    /// The data plane's confirmation that it forwards (see [`Instance::forwarding_ack`]).
    forwarding: Option<watch::Sender<bool>>,
    forwarding_acked: Arc<std::sync::atomic::AtomicBool>,
    peer_failures: Option<mpsc::UnboundedReceiver<IpAddr>>,
    thread: std::thread::JoinHandle<()>,
}

impl Instance {
    /// Validate `cfg`, open the socket and start the instance on its own thread, which first
    /// waits for every instance in `after` to have left (an earlier incarnation whose VIP
    /// removal is still under way: its late removal must not land after this one's add), then
    /// removes stale VIPs of an earlier run, then runs. `default_interface` is used when the
    /// config names none; `netlink` is the daemon's rtnetlink handle (e.g.
    /// `Netlink::handle().clone()`), used by the instance only if it cannot open its own
    /// connection. `rt_priority` is the thread's `SCHED_RR` priority (0: normal scheduling;
    /// see [`realtime`]); a node that does not allow it logs a warning and the instance runs
    /// at normal priority. Nothing here waits on netlink.
    pub async fn spawn(
        cfg: InstanceConfig,
        default_interface: &str,
        netlink: rtnetlink::Handle,
        rt_priority: u8,
        after: Vec<Leaving>,
    ) -> Result<Instance> {
        cfg.validate()
            .map_err(|e| anyhow!("vrrp instance {:?}: {e}", cfg.name))?;
        let ifname = cfg
            .interface
            .clone()
            .unwrap_or_else(|| default_interface.to_string());
        let v6 = cfg.vips.first().is_some_and(IpAddr::is_ipv6);
        let info = interface_info(&ifname).with_context(|| format!("interface {ifname:?}"))?;
        let src = match cfg.unicast_src {
            Some(s) => s,
            None => info.primary_addr(v6, &cfg.vips).ok_or_else(|| {
                anyhow!(
                    "interface {ifname:?} has no {} address to send adverts from",
                    if v6 { "IPv6 link-local" } else { "IPv4" }
                )
            })?,
        };
        let announcer = match Announcer::new(&ifname) {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(instance = %cfg.name, error = %e, "no GARP/NA announcements on {ifname}");
                None
            }
        };
        let machine = Machine::new(params(&cfg, src));
        let status = Arc::new(Mutex::new(InstanceStatus {
            name: cfg.name.clone(),
            interface: ifname.clone(),
            vrid: cfg.vrid,
            version: cfg.version,
            state: State::Initialize,
            base_priority: cfg.priority,
            effective_priority: cfg.priority,
            primary_addr: src,
            master: None,
            advert_interval_ms: u64::from(cfg.interval_ms()),
            master_advert_interval_ms: u64::from(cfg.interval_ms()),
            vips: cfg.vips.clone(),
            unicast_peers: cfg.unicast_peers.clone(),
            owned: false,
            last_transition: None,
            last_split_brain: None,
            last_send_error: None,
            counters: Counters {
                drops: DecodeError::ALL
                    .iter()
                    .map(|e| (e.reason().into(), 0))
                    .collect(),
                ..Counters::default()
            },
            collisions: Collisions::default(),
        }));
        let (commands, rx) = mpsc::unbounded_channel();
        let (weight, weight_rx) = watch::channel(super::track::Tracking::default());
        let (alive, gone) = watch::channel(());
        let (owned_tx, owned) = watch::channel(false);
        let (forwarding_tx, forwarding_rx) = watch::channel(false);
        let forwarding_acked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (peer_failed, peer_failures) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let name = cfg.name.clone();
        let interval_ms = cfg.interval_ms();
        let multicast = cfg.unicast_peers.is_empty();
        let (runner_status, runner_acked) = (status.clone(), forwarding_acked.clone());
        let thread = std::thread::Builder::new()
            .name(thread_name(&cfg.name))
            .spawn(move || {
                // Dropped when the thread ends, however it ends: `Leaving` waits for that.
                let _alive = alive;
                let sched = realtime::set_current_thread(rt_priority);
                // Everything the instance waits on is driven by this thread: its own timers,
                // its socket's readiness and its own netlink connection.
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ =
                            ready_tx.send(Err(anyhow!(e).context("start the instance's runtime")));
                        return;
                    }
                };
                let opened = {
                    let _in_rt = rt.enter();
                    VrrpSocket::open(&ifname, src, multicast).map(|socket| {
                        let netlink = own_netlink(&rt).unwrap_or(netlink);
                        (socket, netlink)
                    })
                };
                let (socket, netlink) = match opened {
                    Ok(o) => o,
                    Err(e) => {
                        let _ = ready_tx.send(Err(
                            anyhow!(e).context(format!("open VRRP socket on {ifname}"))
                        ));
                        return;
                    }
                };
                let hold = Hold::new(schedule(&cfg));
                let runner = Runner {
                    policy: policy(&cfg),
                    cfg,
                    ifname,
                    link_up: info.up,
                    ifindex: info.index,
                    weight: 0,
                    track_fault: false,
                    warn: WarnLimiter::default(),
                    dual: DualMaster::default(),
                    socket,
                    announcer,
                    netlink,
                    machine,
                    epoch: Instant::now(),
                    timer: None,
                    hold,
                    dead_master: None,
                    status: runner_status,
                    owned: owned_tx,
                    forwarding: forwarding_rx,
                    forwarding_acked: runner_acked,
                    peer_failed,
                };
                let _ = ready_tx.send(Ok(sched));
                rt.block_on(runner.run(after, rx, weight_rx));
            })
            .context("start the instance's thread")?;
        let sched = ready_rx
            .await
            .map_err(|_| anyhow!("the instance's thread ended while starting"))??;
        match sched {
            Ok(Sched::RoundRobin(p)) => {
                tracing::info!(instance = %name, rt_priority = p, "VRRP thread runs under real-time scheduling (SCHED_RR)");
            }
            Ok(Sched::Normal) => {
                tracing::info!(instance = %name, "VRRP thread runs under normal scheduling (vrrp_rt_priority = 0)");
            }
            Err(e) => {
                tracing::warn!(instance = %name, rt_priority, error = %e, "VRRP thread cannot run under real-time scheduling (needs CAP_SYS_NICE); at normal priority a busy node may see false failovers");
            }
        }
        raise_priority_for(interval_ms);
        Ok(Instance {
            forwarding: Some(forwarding_tx),
            forwarding_acked,
            commands,
            weight,
            gone,
            status,
            owned,
            peer_failures: Some(peer_failures),
            thread,
        })
    }

    /// A snapshot for `lbctl vrrp status` and metrics.
    pub fn status(&self) -> InstanceStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Ownership of the VIPs: `true` while master. The daemon watches this to flip the data
    /// plane's owned flag.
    pub fn ownership(&self) -> watch::Receiver<bool> {
        self.owned.clone()
    }

    /// For the owner of the data plane: send `true` once it forwards the instance's VIPs. With
    /// it taken, a new master adds its VIPs and announces them (GARP/NA) only after that (or
    /// after at most [`FORWARDING_ACK_WAIT`]): clients that follow the announcement before
    /// the data plane forwards would reach the local stack and be reset.
    pub fn forwarding_ack(&mut self) -> Option<watch::Sender<bool>> {
        self.forwarding_acked
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.forwarding.take()
    }

    /// Set what the tracked checks add up to ([`super::track::tracking`]): the effective
    /// priority becomes base + weight, clamped to 1..=254 (255 stays 255); `fault` puts the
    /// instance in FAULT until it clears.
    pub fn set_track_weight(&self, weight: super::track::Tracking) {
        self.weight.send_replace(weight);
    }

    /// The addresses of masters that died: we took over because our master-down timer expired
    /// (not because one resigned). The daemon takes their backends out at once (fate sharing).
    /// Can be taken once.
    pub fn take_peer_failures(&mut self) -> Option<mpsc::UnboundedReceiver<IpAddr>> {
        self.peer_failures.take()
    }

    /// Apply a reload that changed only in-place fields: no resignation, the VIPs stay.
    pub fn reconfigure(&self, cfg: InstanceConfig) {
        let _ = self.commands.send(Command::Reconfigure(Box::new(cfg)));
    }

    /// Whether the instance is still running (its thread ends only on shutdown or a panic).
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Graceful stop: a master sends a priority-0 advert (a backup takes over after its skew
    /// only) and removes its VIPs. Returns when done (its thread has ended).
    pub async fn shutdown(self) {
        let _ = self.shutdown_within(Duration::MAX).await;
    }

    /// [`Instance::shutdown`], waited for at most `deadline`. An instance that has not left by
    /// then (its VIP removal waits on a slow kernel) goes on leaving on its own thread, and is
    /// returned as [`Leaving`]: whatever takes its VIPs next must wait for it.
    pub async fn shutdown_within(self, deadline: Duration) -> Option<Leaving> {
        let _ = self.commands.send(Command::Shutdown);
        let status = self.status();
        let leaving = Leaving {
            name: status.name,
            interface: status.interface,
            vips: status.vips,
            gone: self.gone.clone(),
        };
        if tokio::time::timeout(deadline, leaving.clone().wait())
            .await
            .is_err()
        {
            return Some(leaving);
        }
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        None
    }
}

/// An instance told to stop that has not finished leaving: its thread still runs, removing
/// its VIPs. Its successor waits for it (see [`Instance::spawn`]).
#[derive(Clone, Debug)]
pub struct Leaving {
    pub name: String,
    pub interface: String,
    pub vips: Vec<IpAddr>,
    gone: watch::Receiver<()>,
}

impl Leaving {
    /// Whether its thread has ended.
    pub fn is_gone(&self) -> bool {
        self.gone.has_changed().is_err()
    }

    /// Whether it holds (or held) one of `vips`.
    pub fn shares(&self, vips: &[IpAddr]) -> bool {
        self.vips.iter().any(|v| vips.contains(v))
    }

    /// Until its thread has ended.
    pub async fn wait(mut self) {
        while self.gone.changed().await.is_ok() {}
    }
}

fn params(cfg: &InstanceConfig, src: IpAddr) -> Params {
    Params {
        base_priority: cfg.priority,
        advert_interval: Duration::from_millis(u64::from(cfg.interval_ms())),
        preempt: cfg.preempt,
        preempt_delay: Duration::from_millis(cfg.preempt_delay_ms),
        primary_addr: src,
    }
}

fn policy(cfg: &InstanceConfig) -> Policy {
    let mut p = Policy::new(
        cfg.codec_version(),
        cfg.vrid,
        (cfg.interval_ms() / 10) as u16,
        cfg.auth(),
        &cfg.vips,
        &cfg.unicast_peers,
    );
    p.check_unicast_src = cfg.check_unicast_src;
    p.accept_v2 = cfg.v2_compat;
    p.peer_hops = cfg
        .unicast_peer_ttl
        .iter()
        .map(|b| (b.address, b.min_ttl..=b.max_ttl))
        .collect();
    p
}

struct Runner {
    cfg: InstanceConfig,
    ifname: String,
    policy: Policy,
    link_up: bool,
    /// The interface index the socket is bound to.
    ifindex: u32,
    /// The sum of tracked weights last set.
    weight: i32,
    /// A weight-0 tracked check fails (FAULT).
    track_fault: bool,
    warn: WarnLimiter,
    dual: DualMaster,
    socket: VrrpSocket,
    announcer: Option<Announcer>,
    netlink: rtnetlink::Handle,
    machine: Machine,
    /// The state machine's time zero.
    epoch: Instant,
    timer: Option<Instant>,
    /// What to do with the VIPs around mastership: wait for forwarding, hold, announce.
    hold: Hold,
    /// The master whose silence made this node master, until `TakeOwnership` reports it.
    dead_master: Option<IpAddr>,
    status: Arc<Mutex<InstanceStatus>>,
    owned: watch::Sender<bool>,
    /// The data plane forwards our VIPs (set by the daemon, see `Instance::forwarding_ack`).
    forwarding: watch::Receiver<bool>,
    forwarding_acked: Arc<std::sync::atomic::AtomicBool>,
    peer_failed: mpsc::UnboundedSender<IpAddr>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The instance thread's name: `vrrp-` and the instance's name, cut to Linux's 15 bytes (at a
/// character boundary), so `top -H` and `ps -T` show which thread is which instance's.
fn thread_name(instance: &str) -> String {
    let mut name = String::from("vrrp-");
    for c in instance.chars() {
        if name.len() + c.len_utf8() > 15 {
            break;
        }
        name.push(c);
    }
    name
}

/// A netlink connection driven by the instance's own runtime, so adding and removing its VIPs
/// on a step up or down does not wait for the daemon's threads. `None` (logged): the caller
/// uses the daemon's connection.
fn own_netlink(rt: &tokio::runtime::Runtime) -> Option<rtnetlink::Handle> {
    match rtnetlink::new_connection() {
        Ok((conn, handle, _)) => {
            rt.spawn(conn);
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no netlink connection of the VRRP thread's own; using the daemon's");
            None
        }
    }
}

/// At most this many queued packets are read when a timer expires, before it fires.
const QUEUED_BEFORE_TIMER: usize = 16;

/// Below this advert interval lbd's threads run at `FAST_NICE`: with every core busy, a
/// backup's master-down interval (3 adverts and the skew, about 70 ms at 20 ms adverts) is
/// within the time a normal-priority thread may wait for a CPU.
const FAST_INTERVAL_MS: u32 = 100;
const FAST_NICE: i32 = -20;

/// Raise every thread of this process (tokio's workers among them; threads started later
/// inherit it) to `FAST_NICE`, once, for an instance advertising faster than
/// `FAST_INTERVAL_MS`. A failure (no CAP_SYS_NICE) is a warning: the instance still runs.
fn raise_priority_for(interval_ms: u32) {
    static DONE: std::sync::Once = std::sync::Once::new();
    if interval_ms >= FAST_INTERVAL_MS {
        return;
    }
    DONE.call_once(|| {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // SAFETY: plain syscalls on this process's own threads.
            let rc = unsafe {
                *libc::__errno_location() = 0;
                let now = libc::getpriority(libc::PRIO_PROCESS, tid);
                if *libc::__errno_location() == 0 && now <= FAST_NICE {
                    continue;
                }
                libc::setpriority(libc::PRIO_PROCESS, tid, FAST_NICE)
            };
            if rc != 0 {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "adverts faster than {FAST_INTERVAL_MS} ms: could not raise lbd's scheduling priority; a busy node may see false failovers"
                );
                return;
            }
        }
        tracing::info!(
            nice = FAST_NICE,
            "adverts faster than {FAST_INTERVAL_MS} ms: lbd's threads run at a raised priority"
        );
    });
}

/// Sleep until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Runner {
    fn now(&self) -> state::Time {
        Instant::now().saturating_duration_since(self.epoch)
    }

    async fn run(
        mut self,
        after: Vec<Leaving>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut weights: watch::Receiver<super::track::Tracking>,
    ) {
        if !after.is_empty() {
            let names: Vec<&str> = after.iter().map(|l| l.name.as_str()).collect();
            tracing::warn!(instance = %self.cfg.name, waiting_for = ?names, "the previous incarnation is still removing its VIPs; this one starts once it has left");
            for l in after {
                l.wait().await;
            }
            tracing::info!(instance = %self.cfg.name, "the previous incarnation has left; starting");
            // What arrived meanwhile is stale.
            while self.socket.try_recv().is_some() {}
        }
        // Only this instance's VIPs: another instance's may be up on the same interface.
        match crate::net::addr::remove_stale(&self.netlink, &self.ifname, &self.cfg.vips).await {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(instance = %self.cfg.name, ?removed, "removed stale VIPs left by an earlier run")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(instance = %self.cfg.name, error = format!("{e:#}"), "removing stale VIPs of an earlier run failed");
                self.with_status(|s| s.counters.vip_errors += 1);
            }
        }
        if !self.link_up {
            self.step(Event::InterfaceDown).await;
        }
        self.step(Event::Startup).await;
        let mut link_poll = tokio::time::interval(LINK_POLL);
        // Link notifications make the poll immediate (a MAC change, a link going down); the
        // interval stays as the fallback.
        let mut link_events = match crate::net::link_changes() {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(instance = %self.cfg.name, error = format!("{e:#}"), "no link notifications; polling the interface only");
                None
            }
        };
        link_poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = sleep_until(self.timer) => {
                    // Adverts that arrived while this task waited for a CPU are heard before the
                    // timer that expired meanwhile (`select!` picks among ready branches at
                    // random): on a busy node a backup would otherwise take over from a
                    // master whose advert is already queued. Bounded, so a flood of adverts
                    // cannot hold the timer off.
                    for _ in 0..QUEUED_BEFORE_TIMER {
                        match self.socket.try_recv() {
                            Some(Ok(incoming)) => self.on_packet(incoming).await,
                            Some(Err(_)) | None => break,
                        }
                    }
                    if self.timer.is_some_and(|t| t <= Instant::now()) {
                        self.step(Event::TimerFired).await;
                    }
                }
                // The next announcement, or the end of the wait for the data plane.
                () = sleep_until(self.hold.next_wake().map(Instant::from_std)) => {
                    self.hold_input(hold::Input::Tick).await
                }
                r = self.forwarding.changed(), if self.hold.awaiting_forwarding() => match r {
                    Ok(()) => {
                        let forwarding = *self.forwarding.borrow_and_update();
                        self.hold_input(hold::Input::Forwarding(forwarding)).await;
                    }
                    // The daemon's watcher is gone (lbd stopping, or a reload replacing this
                    // instance).
                    Err(_) => self.hold_input(hold::Input::ForwardingGone).await,
                },
                r = self.socket.recv() => match r {
                    Ok(incoming) => {
                        self.on_packet(incoming).await;
                        // What else is queued is read now, not one packet per turn of this
                        // loop (each turn sets up every branch's timer again): under an advert
                        // flood that setup was most of the instance's CPU. Bounded, so the
                        // timers are looked at between batches.
                        for _ in 0..QUEUED_BEFORE_TIMER {
                            match self.socket.try_recv() {
                                Some(Ok(incoming)) => self.on_packet(incoming).await,
                                Some(Err(_)) | None => break,
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(instance = %self.cfg.name, error = %e, "VRRP receive failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = link_poll.tick() => self.poll_link().await,
                () = crate::net::next_link_change(&mut link_events) => self.poll_link().await,
                Ok(()) = weights.changed() => {
                    let t = *weights.borrow_and_update();
                    self.weight = t.weight;
                    let p = state::effective_priority(self.cfg.priority, t.weight);
                    self.step(Event::PriorityChanged(p)).await;
                    if t.fault != self.track_fault {
                        self.track_fault = t.fault;
                        self.step(Event::TrackFault(t.fault)).await;
                    }
                }
                cmd = commands.recv() => match cmd {
                    Some(Command::Reconfigure(cfg)) => self.reconfigure(*cfg).await,
                    // Or the handle was dropped without shutdown(): still leave cleanly.
                    Some(Command::Shutdown) | None => {
                        self.step(Event::Shutdown).await;
                        return;
                    }
                },
            }
        }
    }

    /// Follow the interface: down or gone means fault, but only once netlink confirms it (one
    /// failed or odd getifaddrs poll is not a link down); back (possibly as a new device with a
    /// new index, e.g. a rebuilt bridge) means the socket and announcer are bound again to it
    /// before the instance starts again. A new MAC is announced at once.
    async fn poll_link(&mut self) {
        self.hold_input(hold::Input::LinkPoll).await;
        let polled = interface_info(&self.ifname);
        let seen = match &polled {
            Ok(i) => Polled::Up(i.up),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Polled::Gone,
            Err(_) => Polled::Failed,
        };
        let confirmed = if seen == Polled::Up(true) || seen == Polled::Gone {
            None
        } else {
            match crate::net::addr::link_state(&self.netlink, &self.ifname).await {
                Ok(state) => Some(state.unwrap_or(false)),
                Err(e) => {
                    tracing::debug!(instance = %self.cfg.name, error = format!("{e:#}"), "link state not confirmed");
                    None
                }
            }
        };
        let up = link_verdict(seen, confirmed, self.link_up);
        if up && seen != Polled::Up(true) {
            self.with_status(|s| s.counters.unconfirmed_link_down += 1);
        }
        let info = polled.ok();
        if let Some(info) = info.as_ref().filter(|i| i.index != self.ifindex) {
            if self.link_up {
                // Replaced between two polls: leave as if it had gone down first.
                self.link_up = false;
                self.step(Event::InterfaceDown).await;
            }
            match VrrpSocket::open(
                &self.ifname,
                self.socket.src(),
                self.cfg.unicast_peers.is_empty(),
            ) {
                Ok(socket) => {
                    tracing::info!(instance = %self.cfg.name, interface = %self.ifname, old = self.ifindex, new = info.index, "interface recreated; VRRP socket bound to the new device");
                    self.socket = socket;
                    self.ifindex = info.index;
                    self.announcer = Announcer::new(&self.ifname).ok();
                    self.with_status(|s| s.counters.rebinds += 1);
                }
                Err(e) => {
                    // Stay in fault and try again at the next poll.
                    tracing::warn!(instance = %self.cfg.name, error = %e, "cannot bind the VRRP socket to the recreated interface yet");
                    return;
                }
            }
        }
        if let Some(info) = info.as_ref() {
            self.follow_addresses(info).await;
        }
        if up != self.link_up {
            self.link_up = up;
            let ev = if up {
                Event::InterfaceUp
            } else {
                Event::InterfaceDown
            };
            self.step(ev).await;
        }
    }

    /// The interface's MAC or (IPv6) link-local address changed under us (bond failover, a
    /// cloned MAC): announce with the new MAC at once, or clients keep the old one and lose
    /// the VIP; send adverts from the new link-local address.
    async fn follow_addresses(&mut self, info: &crate::net::iface::InterfaceInfo) {
        if let (Some(mac), Some(a)) = (info.mac, self.announcer.as_ref())
            && mac != a.mac()
        {
            tracing::info!(instance = %self.cfg.name, interface = %self.ifname, old = ?a.mac(), new = ?mac, "interface MAC changed; announcing the new one");
            self.announcer = Announcer::new(&self.ifname).ok();
            self.with_status(|s| s.counters.mac_changes += 1);
            self.hold_input(hold::Input::MacChanged).await;
        }
        let v6 = self.cfg.vips.first().is_some_and(IpAddr::is_ipv6);
        if self.cfg.unicast_src.is_none()
            && v6
            && let Some(src) = info.primary_addr(true, &self.cfg.vips)
            && src != self.socket.src()
        {
            match VrrpSocket::open(&self.ifname, src, self.cfg.unicast_peers.is_empty()) {
                Ok(socket) => {
                    tracing::info!(instance = %self.cfg.name, old = %self.socket.src(), new = %src, "link-local address changed; adverts now sent from the new one");
                    self.socket = socket;
                    let p = params(&self.cfg, src);
                    let effective = state::effective_priority(self.cfg.priority, self.weight);
                    let out = self.machine.reconfigure(self.now(), p, effective);
                    self.with_status(|s| s.primary_addr = src);
                    self.carry_out(out).await;
                }
                Err(e) => {
                    tracing::warn!(instance = %self.cfg.name, error = %e, "cannot send from the new link-local address yet");
                }
            }
        }
    }

    async fn on_packet(&mut self, incoming: Incoming) {
        let (src, dst, hops, advert) = match incoming {
            Incoming::Advert {
                src,
                dst,
                hops,
                advert,
            } => (src, dst, hops, advert),
            Incoming::Dropped { reason, src } => return self.count_drop(src, reason),
        };
        // Our own address: our looped-back adverts, or a host forging us. Only a priority-0
        // advert in our name matters (a resignation we never sent): the state machine answers
        // it at once, so the backups hear us before their skew runs out.
        let own = src == self.socket.src();
        if own && (advert.priority != 0 || self.machine.state() != State::Master) {
            return;
        }
        if !self.policy.hops_ok(src, dst, hops) {
            return self.count_drop(Some(src), DecodeError::BadTtl);
        }
        let j = self.policy.judge(src, dst, &advert);
        if let Some(differs) = j.collision {
            self.record_collision(src, &advert, differs);
        }
        if self.policy.split_brain_evidence(&j) && self.machine.state() == State::Master {
            let interval = Duration::from_millis(u64::from(advert.interval_cs) * 10);
            if self.dual.observe(self.now(), src, interval) {
                let their = j.verdict.err().map_or("ok", DecodeError::reason);
                self.record_split_brain(src, advert.priority, their);
            }
        }
        if let Err(reason) = j.verdict {
            return self.count_drop(Some(src), reason);
        }
        if own {
            if let Some(suppressed) = self.warn.allow(self.now(), Some(src), "forged_resignation") {
                tracing::warn!(instance = %self.cfg.name, suppressed, "a priority-0 advert in our name that we did not send (a forged resignation): advertising at once");
            }
            let ev = Event::AdvertReceived {
                from: src,
                priority: 0,
                interval: Duration::from_millis(u64::from(advert.interval_cs) * 10),
            };
            return self.step(ev).await;
        }
        self.with_status(|s| s.counters.adverts_received += 1);
        let ev = Event::AdvertReceived {
            from: src,
            priority: advert.priority,
            interval: Duration::from_millis(u64::from(advert.interval_cs) * 10),
        };
        self.step(ev).await;
    }

    fn record_split_brain(&mut self, peer: IpAddr, peer_priority: u8, their: &'static str) {
        if let Some(suppressed) = self.warn.allow(self.now(), Some(peer), "split_brain") {
            tracing::warn!(
                instance = %self.cfg.name,
                %peer,
                peer_priority,
                their_adverts = their,
                suppressed,
                "two masters at once (split brain): another router keeps claiming our VIPs"
            );
        }
        self.with_status(|s| {
            s.counters.split_brain += 1;
            s.last_split_brain = Some(SplitBrainRecord {
                at_unix_ms: unix_ms(),
                peer,
                peer_priority,
                stepped_down: false,
                their_adverts: their.into(),
            });
        });
    }

    fn record_collision(&mut self, src: IpAddr, advert: &Advert, differs: Mismatch) {
        let vrid = self.cfg.vrid;
        self.with_status(|s| s.collisions.observe(src, advert, differs, unix_ms()));
        if let Some(suppressed) = self.warn.allow(self.now(), Some(src), "collision") {
            tracing::warn!(
                instance = %self.cfg.name,
                vrid,
                peer = %src,
                differs = differs.describe(),
                their_vips = ?advert.addrs,
                suppressed,
                "VRID collision: another router uses our VRID with different VIPs or auth; its adverts are dropped"
            );
        }
    }

    /// Count every drop; log at most one WARN per peer and reason per interval (another VRID on
    /// the link is normal and only counted).
    fn count_drop(&mut self, src: Option<IpAddr>, reason: DecodeError) {
        self.with_status(|s| *s.counters.drops.entry(reason.reason().into()).or_insert(0) += 1);
        if matches!(reason, DecodeError::OtherVrid) {
            return;
        }
        if let Some(suppressed) = self.warn.allow(self.now(), src, reason.reason()) {
            tracing::warn!(instance = %self.cfg.name, peer = ?src, reason = reason.reason(), suppressed, "VRRP packet dropped");
        }
    }

    /// Apply a reload's in-place changes: new priority, interval, peers, preemption, auth.
    async fn reconfigure(&mut self, cfg: InstanceConfig) {
        tracing::info!(instance = %cfg.name, "VRRP settings changed; applied in place");
        let p = params(&cfg, self.socket.src());
        let effective = state::effective_priority(cfg.priority, self.weight);
        self.policy = policy(&cfg);
        self.hold_input(hold::Input::Reconfigured(schedule(&cfg)))
            .await;
        self.cfg = cfg;
        let out = self.machine.reconfigure(self.now(), p, effective);
        self.with_status(|s| {
            s.base_priority = self.cfg.priority;
            // A version change between 2 and 3 with `v2_compat` is applied in place.
            s.version = self.cfg.version;
            s.advert_interval_ms = u64::from(self.cfg.interval_ms());
            s.unicast_peers.clone_from(&self.cfg.unicast_peers);
        });
        self.carry_out(out).await;
    }

    fn with_status<T>(&self, f: impl FnOnce(&mut InstanceStatus) -> T) -> T {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Feed one event to the machine and carry out its output.
    async fn step(&mut self, event: Event) {
        let was_master = self.machine.master_addr();
        let out = self.machine.handle(self.now(), event);
        if let Some(t) = out.transition
            && t.to == State::Master
            && t.reason == state::REASON_MASTER_DOWN
            && let Some(dead) = was_master.filter(|m| *m != self.socket.src())
        {
            // Reported with the mastership, before it (see `take_ownership`).
            self.dead_master = Some(dead);
        }
        self.carry_out(out).await;
        if let Some(dead) = self.dead_master.take() {
            let _ = self.peer_failed.send(dead);
        }
    }

    async fn carry_out(&mut self, out: state::Output) {
        if let Some(t) = out.transition {
            tracing::info!(
                instance = %self.cfg.name,
                vrid = self.cfg.vrid,
                from = t.from.as_str(),
                to = t.to.as_str(),
                reason = t.reason,
                "VRRP state change"
            );
            self.with_status(|s| {
                s.counters.transitions += 1;
                if t.to == State::Master {
                    s.counters.became_master += 1;
                }
                s.last_transition = Some(TransitionRecord {
                    at_unix_ms: unix_ms(),
                    from: t.from,
                    to: t.to,
                    reason: t.reason.to_string(),
                });
            });
        }
        if let Some(c) = out.split_brain {
            // One conflicting advert is an ordinary election (e.g. a preemption); only one
            // that persists is an episode (see `record_split_brain`).
            tracing::debug!(instance = %self.cfg.name, peer = %c.peer, peer_priority = c.peer_priority, stepped_down = c.stepped_down, "conflicting master advert");
            // We stay master, but the other master announced the VIPs too and clients may
            // have taken its MAC: announce ours again (a fresh burst), or they keep sending to
            // a node that no longer forwards until their caches expire.
            if !c.stepped_down {
                self.hold_input(hold::Input::ConflictKept).await;
            }
        }
        if self.machine.state() != State::Master {
            self.dual.reset();
        }
        for action in out.actions {
            match action {
                Action::SendAdvert { priority } => self.send_advert(priority).await,
                Action::TakeOwnership => self.take_ownership().await,
                Action::ReleaseOwnership => self.release_ownership().await,
                Action::SetTimer(at) => self.timer = Some(self.epoch + at),
                Action::CancelTimer => self.timer = None,
            }
        }
        let m = &self.machine;
        let snapshot = (
            m.state(),
            m.effective_priority(),
            m.master_addr(),
            m.master_interval().as_millis() as u64,
        );
        self.with_status(|s| {
            (
                s.state,
                s.effective_priority,
                s.master,
                s.master_advert_interval_ms,
            ) = snapshot;
        });
    }

    async fn send_advert(&mut self, priority: u8) {
        let advert = Advert {
            version: self.policy.version,
            vrid: self.cfg.vrid,
            priority,
            interval_cs: self.policy.interval_cs,
            addrs: self.cfg.vips.clone(),
            auth: if self.policy.version == Version::V2 {
                self.policy.auth
            } else {
                codec::Auth::None
            },
        };
        self.send_one(&advert).await;
        if self.cfg.v2_compat {
            // Migration: the VRRPv2 speakers of this instance hear us too.
            let v2 = Advert {
                version: Version::V2,
                auth: self.policy.auth,
                ..advert
            };
            self.send_one(&v2).await;
        }
    }

    async fn send_one(&mut self, advert: &Advert) {
        let src = self.socket.src();
        let dsts: Vec<IpAddr> = if self.cfg.unicast_peers.is_empty() {
            vec![if src.is_ipv6() {
                codec::MCAST_V6.into()
            } else {
                codec::MCAST_V4.into()
            }]
        } else {
            self.cfg.unicast_peers.clone()
        };
        for dst in dsts {
            // The v3 checksum covers the destination, so each peer gets its own encoding.
            let result = match codec::encode(advert, src, dst) {
                Ok(bytes) => self
                    .socket
                    .send(&bytes, dst)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => self.with_status(|s| s.counters.adverts_sent += 1),
                Err(e) => {
                    if let Some(suppressed) = self.warn.allow(self.now(), Some(dst), "send_error") {
                        tracing::warn!(instance = %self.cfg.name, %dst, error = %e, suppressed, state = self.machine.state().as_str(), "VRRP advert not sent: peers may not hear this node");
                    }
                    self.with_status(|s| {
                        s.counters.send_errors += 1;
                        s.last_send_error = Some(SendErrorRecord {
                            at_unix_ms: unix_ms(),
                            dst,
                            error: e,
                        });
                    });
                }
            }
        }
    }

    async fn take_ownership(&mut self) {
        // The wait for the data plane runs in the instance's loop (see `run`), not here: a
        // master that stopped advertising while its daemon is slow would be taken over by the
        // backups.
        let input = hold::Input::Mastership {
            dead_master: self.dead_master.take(),
            acks: self
                .forwarding_acked
                .load(std::sync::atomic::Ordering::SeqCst),
            forwarding: *self.forwarding.borrow(),
        };
        self.hold_input(input).await;
    }

    async fn release_ownership(&mut self) {
        self.hold_input(hold::Input::Released).await;
    }

    /// Feed the hold/announce machine and carry out its effects in order (the result of one
    /// that does I/O goes back to the machine before the next).
    async fn hold_input(&mut self, input: hold::Input) {
        let now = || Instant::now().into_std();
        let mut todo: std::collections::VecDeque<hold::Effect> =
            self.hold.handle(now(), input).into();
        while let Some(effect) = todo.pop_front() {
            let result = match effect {
                hold::Effect::ReportDeadMaster(peer) => {
                    let _ = self.peer_failed.send(peer);
                    None
                }
                hold::Effect::Own(owned) => {
                    let _ = self.owned.send(owned);
                    None
                }
                hold::Effect::AddVips => Some(hold::Input::VipsAdded {
                    ok: self.add_vips().await,
                }),
                hold::Effect::RemoveVips => Some(hold::Input::VipsRemoved {
                    ok: self.remove_vips().await,
                }),
                hold::Effect::Held(owned) => {
                    self.with_status(|s| s.owned = owned);
                    None
                }
                hold::Effect::Announce => {
                    self.announce();
                    None
                }
                hold::Effect::ForwardingConfirmed { waited } => {
                    tracing::info!(instance = %self.cfg.name, ?waited, "the data plane forwards; holding and announcing the VIPs");
                    None
                }
                hold::Effect::ForwardingLate => {
                    tracing::warn!(instance = %self.cfg.name, wait = ?FORWARDING_ACK_WAIT, "data plane slow to forward; announcing anyway");
                    None
                }
                hold::Effect::AddRecovered => {
                    tracing::info!(instance = %self.cfg.name, "VIPs added after a failure");
                    None
                }
            };
            if let Some(result) = result {
                for e in self.hold.handle(now(), result).into_iter().rev() {
                    todo.push_front(e);
                }
            }
        }
    }

    /// Add our VIPs to the interface (adding one that is there is a success); whether all
    /// are there (on failure the hold machine retries at every link poll while master).
    async fn add_vips(&mut self) -> bool {
        let mut ok = true;
        for vip in self.cfg.vips.clone() {
            if let Err(e) = crate::net::addr::add_vip(&self.netlink, &self.ifname, vip).await {
                tracing::error!(instance = %self.cfg.name, error = format!("{e:#}"), "adding VIP failed; retrying");
                self.with_status(|s| s.counters.vip_errors += 1);
                ok = false;
            }
        }
        ok
    }

    /// Remove our VIPs from the interface; whether all are gone (on failure, e.g. a netlink
    /// dump interrupted with EBUSY, the hold machine retries at every link poll until done, so
    /// a backup never keeps a VIP).
    async fn remove_vips(&mut self) -> bool {
        if let Some(delay) = crate::net::injected_delay(REMOVE_DELAY_FILE_ENV) {
            tokio::time::sleep(delay).await;
        }
        let mut ok = true;
        for vip in self.cfg.vips.clone() {
            if let Err(e) = crate::net::addr::remove_vip(&self.netlink, &self.ifname, vip).await {
                tracing::error!(instance = %self.cfg.name, error = format!("{e:#}"), "removing VIP failed; retrying");
                self.with_status(|s| s.counters.vip_errors += 1);
                ok = false;
            }
        }
        ok
    }

    /// Send one round of announcements (the hold machine schedules them).
    fn announce(&mut self) {
        if let Some(a) = &self.announcer {
            match a.announce(&self.cfg.vips) {
                Ok(()) => self.with_status(|s| s.counters.announcements += 1),
                Err(e) => {
                    tracing::debug!(instance = %self.cfg.name, error = %e, "announcement failed")
                }
            }
        }
    }
}

/// The announcement settings of `cfg` for the hold machine.
fn schedule(cfg: &InstanceConfig) -> hold::Schedule {
    hold::Schedule {
        delay_s: cfg.garp_master_delay_s,
        refresh_s: cfg.garp_refresh_s,
    }
}

/// What one getifaddrs poll said about the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Polled {
    /// Present; up and running or not.
    Up(bool),
    /// No such interface.
    Gone,
    /// getifaddrs failed.
    Failed,
}

/// Whether the link counts as up (pure): a poll that saw it up, or an interface that is gone,
/// is believed at once; a poll that saw it down or failed needs netlink's confirmation
/// (`confirmed`: what netlink said, `None` when it could not be asked), else the link keeps
/// its `previous` state. One transient error never moves the VIP.
fn link_verdict(polled: Polled, confirmed: Option<bool>, previous: bool) -> bool {
    match polled {
        Polled::Up(true) => true,
        Polled::Gone => false,
        Polled::Up(false) | Polled::Failed => confirmed.unwrap_or(previous),
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    #[test]
    fn thread_names_fit_linux_and_name_the_instance() {
        assert_eq!(thread_name("api"), "vrrp-api");
        assert_eq!(thread_name("ingress-v6-long-name"), "vrrp-ingress-v6");
        // Cut at a character boundary, never inside one.
        let n = thread_name("abcdefghié");
        assert!(n.len() <= 15, "{n}");
        assert_eq!(n, "vrrp-abcdefghi");
        // A name std accepts (no NUL) for every instance name validation lets through.
        std::thread::Builder::new()
            .name(thread_name("ingress-v6-long-name"))
            .spawn(|| ())
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_link_is_down_only_when_netlink_confirms_it() {
        // One failed poll, netlink says up (or cannot be asked): stays up.
        assert!(link_verdict(Polled::Failed, Some(true), true));
        assert!(link_verdict(Polled::Failed, None, true));
        assert!(link_verdict(Polled::Up(false), None, true));
        assert!(link_verdict(Polled::Up(false), Some(true), true));
        // Confirmed down.
        assert!(!link_verdict(Polled::Up(false), Some(false), true));
        assert!(!link_verdict(Polled::Failed, Some(false), true));
        // Gone is gone; up is up.
        assert!(!link_verdict(Polled::Gone, None, true));
        assert!(link_verdict(Polled::Up(true), None, false));
        // A down link stays down until a poll sees it up.
        assert!(!link_verdict(Polled::Failed, None, false));
    }
}
