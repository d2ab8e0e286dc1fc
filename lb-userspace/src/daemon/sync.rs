//! The connection sync beside the owner (see docs/architecture.md, "Connection sync"): scans
//! the pinned connection table for exceptions (entries another node could not rebuild from the
//! shared Maglev table) after each table change and every `interval_ms`, sends them to the
//! configured peers in authenticated datagrams, and installs the peers' into this node's table.
//!
//! The owner hands it the installed services as a [`View`] (after every apply and each tick)
//! and asks for a last flush when it stops; it reads and writes the connection table through
//! descriptors of its own, so a scan never holds up the owner. A reload hands it a new
//! `[sync]` ([`SyncHandle::prepare`], then [`SyncHandle::commit`]): every field applies
//! without a restart (peers, keys, port, listen address, interval, max_entries).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use lb_common::FlowKey;
use tokio::sync::{mpsc, oneshot, watch};

use crate::{
    dataplane::sync_view::ConntrackPins,
    sync::{
        config::{KeyRing, SyncConfig},
        replay::{Counter, Gate, Pass, Refusal, Window},
        status::{NotExceptionsRow, RefusedRow, SyncPeerRow, SyncRow},
        view::{Changes, Index, Refused, Skip, View, close_of, shared_state, with_close},
        wire::{self, Close, Record, WireError},
    },
};

/// Datagrams read off the socket and waiting for the task (about 5.6 MB at most): a scan (up to
/// about 0.45 s) or a send in progress leaves them here rather than in the kernel's receive
/// queue, whose overflow is dropped. A full send at `max_entries` is about 2,980 datagrams.
const RECEIVE_QUEUE: usize = 4096;
/// A send pauses [`PACE_PAUSE`] after each this many datagrams (to every peer), so a large
/// full send reaches a peer at most at about 16,000 datagrams a second, not in one burst.
const PACE_EVERY: usize = 16;
const PACE_PAUSE: Duration = Duration::from_millis(1);
/// A table change is scanned this long after it (changes come in bursts).
const SETTLE: Duration = Duration::from_millis(200);
/// Every this many periodic scans all exceptions are sent again, not only new ones: a peer
/// that restarted (or lost datagrams) gets the whole set back within this many intervals.
const FULL_EVERY: u64 = 5;
/// Full sends that repeat a retraction after it was first sent.
const RETRACT_REPEATS: u8 = 2;

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// This run's identity in the datagrams' headers (`wire::Sender::run`): random, never 0.
fn new_run() -> Result<u64> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    loop {
        ring::rand::SystemRandom::new()
            .fill(&mut b)
            .map_err(|_| anyhow::anyhow!("sync: no randomness for the run id"))?;
        let run = u64::from_be_bytes(b);
        if run != 0 {
            return Ok(run);
        }
    }
}

/// Counters for `lbctl stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct SyncStats {
    scans: AtomicU64,
    scan_ms: AtomicU64,
    last_scan_unix_ms: AtomicU64,
    exceptions: AtomicU64,
    /// Entries the last scan looked at (LRU hash and flow cache, one flow may be in both).
    scanned: AtomicU64,
    scanned_stale: AtomicU64,
    scanned_not_forwarded: AtomicU64,
    scanned_on_slot: AtomicU64,
    sent_entries: AtomicU64,
    sent_datagrams: AtomicU64,
    send_errors: AtomicU64,
    /// The kernel's drops on the socket (a full receive queue), as of the last scan.
    receive_drops: AtomicU64,
    received_datagrams: AtomicU64,
    received_entries: AtomicU64,
    installed: AtomicU64,
    already_present: AtomicU64,
    refused_peer: AtomicU64,
    refused_auth: AtomicU64,
    refused_malformed: AtomicU64,
    refused_replay: AtomicU64,
    refused_service: AtomicU64,
    refused_backend: AtomicU64,
    refused_earlier_run: AtomicU64,
    /// The last step back of this node's clock the numbering saw.
    clock_step: Mutex<Option<crate::sync::status::ClockStep>>,
    install_errors: AtomicU64,
    retractions_sent: AtomicU64,
    retracted: AtomicU64,
    flushes: AtomicU64,
    peers: Mutex<BTreeMap<IpAddr, SyncPeerRow>>,
}

impl SyncStats {
    pub fn snapshot(&self) -> SyncRow {
        let g = |a: &AtomicU64| a.load(Relaxed);
        SyncRow {
            peers: self.peers.lock().unwrap().values().cloned().collect(),
            scans: g(&self.scans),
            scan_ms: g(&self.scan_ms),
            last_scan_unix_ms: g(&self.last_scan_unix_ms),
            exceptions: g(&self.exceptions),
            scanned: g(&self.scanned),
            scanned_not_exceptions: NotExceptionsRow {
                stale: g(&self.scanned_stale),
                not_forwarded: g(&self.scanned_not_forwarded),
                on_slot: g(&self.scanned_on_slot),
            },
            sent_entries: g(&self.sent_entries),
            sent_datagrams: g(&self.sent_datagrams),
            send_errors: g(&self.send_errors),
            receive_drops: g(&self.receive_drops),
            received_datagrams: g(&self.received_datagrams),
            received_entries: g(&self.received_entries),
            installed: g(&self.installed),
            already_present: g(&self.already_present),
            install_errors: g(&self.install_errors),
            retractions_sent: g(&self.retractions_sent),
            retracted: g(&self.retracted),
            flushes: g(&self.flushes),
            refused: RefusedRow {
                not_a_peer: g(&self.refused_peer),
                auth: g(&self.refused_auth),
                malformed: g(&self.refused_malformed),
                replay: g(&self.refused_replay),
                no_service: g(&self.refused_service),
                no_backend: g(&self.refused_backend),
                earlier_run: g(&self.refused_earlier_run),
            },
            clock_stepped_back: *self.clock_step.lock().unwrap(),
        }
    }
}

/// The owner's handle on the sync task.
pub struct SyncHandle {
    keys: Keys,
    view: watch::Sender<Option<Arc<View>>>,
    flush: mpsc::Sender<oneshot::Sender<()>>,
    apply: mpsc::Sender<Update>,
    /// The `[sync]` the task runs (the last one committed), with the configured peers.
    cfg: SyncConfig,
    /// The learned peers last handed to the task.
    learned: Vec<IpAddr>,
    pub stats: Arc<SyncStats>,
}

/// What the task is handed.
enum Update {
    /// A reload's `[sync]`.
    Config(Prepared),
    /// The peers learned from membership announcements (on top of `peers`).
    Learned(Vec<IpAddr>),
}

/// A new `[sync]` with what could fail already done (keys read, a new socket bound): handing
/// it to the task cannot fail.
pub struct Prepared {
    cfg: SyncConfig,
    keys: Vec<wire::HmacKey>,
    /// A socket for a new port or listen address; `None`: the running one stays.
    sock: Option<tokio::net::UdpSocket>,
}

fn hmac_keys(ring: &KeyRing) -> Vec<wire::HmacKey> {
    ring.accepted().map(wire::key).collect()
}

/// The keys, shared by the handle and the task: the key signed with first, then the others
/// accepted (a rotation's overlap). A reload replaces them at once, not when the task next
/// looks at its updates (after a scan in progress): once a reload is applied, no datagram is
/// signed or checked with the keys it replaced, so a rotation's next step may follow it on
/// another node right away.
type Keys = Arc<std::sync::RwLock<Vec<wire::HmacKey>>>;

impl SyncHandle {
    /// Read the keys, bind the socket and start the task. A bad key file or a port in use
    /// refuses lbd's start, naming the field.
    pub fn spawn(cfg: &SyncConfig, pin_dir: PathBuf) -> Result<SyncHandle> {
        let keys: Keys = Arc::new(std::sync::RwLock::new(hmac_keys(&KeyRing::load(cfg)?)));
        let sock = bind(cfg).with_context(|| format!("sync.port: binding UDP {}", cfg.port))?;
        let (view_tx, view_rx) = watch::channel(None);
        let (flush_tx, flush_rx) = mpsc::channel(4);
        let (apply_tx, apply_rx) = mpsc::channel::<Update>(4);
        let stats = Arc::new(SyncStats::default());
        set_peer_rows(&stats, &cfg.peers);
        let run = new_run()?;
        let sock = Arc::new(sock);
        let (inbox_tx, inbox) = mpsc::channel(RECEIVE_QUEUE);
        let reader = spawn_reader(sock.clone(), inbox_tx.clone());
        let task = Task {
            cfg: cfg.clone(),
            configured: cfg.peers.clone(),
            learned: Vec::new(),
            keys: keys.clone(),
            sock,
            reader,
            inbox_tx,
            pin_dir,
            pins: None,
            view: view_rx,
            stats: stats.clone(),
            counter: Counter::default(),
            run,
            gate: Gate::new(run),
            windows: HashMap::new(),
            peer_runs: HashMap::new(),
            v1_peers: std::collections::HashSet::new(),
            sent: Arc::new(HashMap::new()),
            periodic: 0,
            full_due: false,
            retracted: HashMap::new(),
            changes: Changes::default(),
            hellos_left: 2,
        };
        tokio::spawn(task.run(inbox, flush_rx, apply_rx));
        Ok(SyncHandle {
            keys,
            view: view_tx,
            flush: flush_tx,
            apply: apply_tx,
            cfg: cfg.clone(),
            learned: Vec::new(),
            stats,
        })
    }

    /// The `[sync]` running.
    pub fn config(&self) -> &SyncConfig {
        &self.cfg
    }

    /// Check a reload's `[sync]` against this node: read its keys, bind its port if the port
    /// or listen address changes. An error names the field; nothing changes until
    /// [`SyncHandle::commit`].
    pub fn prepare(&self, cfg: &SyncConfig) -> Result<Prepared> {
        let keys = hmac_keys(&KeyRing::load(cfg)?);
        let sock = if cfg.port != self.cfg.port || cfg.listen != self.cfg.listen {
            Some(bind(cfg).with_context(|| format!("sync.port: binding UDP {}", cfg.port))?)
        } else {
            None
        };
        Ok(Prepared {
            cfg: cfg.clone(),
            keys,
            sock,
        })
    }

    /// Hand a prepared `[sync]` to the task: the keys apply at once, the rest before the
    /// task's next datagram or scan.
    pub async fn commit(&mut self, mut p: Prepared) {
        *self.keys.write().unwrap() = std::mem::take(&mut p.keys);
        self.cfg = p.cfg.clone();
        set_peer_rows(&self.stats, &self.peers());
        let _ = self.apply.send(Update::Config(p)).await;
    }

    /// The peers learned from membership announcements: sent to and heard from besides the
    /// configured ones.
    pub async fn learn(&mut self, learned: Vec<IpAddr>) {
        if learned == self.learned {
            return;
        }
        self.learned = learned.clone();
        set_peer_rows(&self.stats, &self.peers());
        let _ = self.apply.send(Update::Learned(learned)).await;
    }

    fn peers(&self) -> Vec<IpAddr> {
        crate::members::roster::merge(&self.cfg.peers, &self.learned, None)
    }

    /// The services as just applied; a change is scanned shortly after.
    pub fn view(&self, v: View) {
        self.view.send_if_modified(|cur| {
            if cur.as_deref() == Some(&v) {
                return false;
            }
            *cur = Some(Arc::new(v));
            true
        });
    }

    /// Scan and send every exception now (before this node stops forwarding), within `limit`.
    pub async fn flush(&self, limit: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.flush.send(tx).await.is_err() {
            return;
        }
        if tokio::time::timeout(limit, rx).await.is_err() {
            tracing::warn!(?limit, "sync: the last flush did not finish in time");
        }
    }
}

/// One row per configured peer: new peers get one, the counters of those that stay are kept.
fn set_peer_rows(stats: &SyncStats, peers: &[IpAddr]) {
    let mut p = stats.peers.lock().unwrap();
    p.retain(|a, _| peers.contains(a));
    for a in peers {
        p.entry(*a).or_insert_with(|| SyncPeerRow::new(*a));
    }
}

fn bind(cfg: &SyncConfig) -> Result<tokio::net::UdpSocket> {
    use socket2::{Protocol, Socket, Type};
    bind_with(cfg, |d| Socket::new(d, Type::DGRAM, Some(Protocol::UDP)))
}

/// The receive (and send) buffer asked for: a full send is up to `max_entries / 22` datagrams
/// per peer (paced, see [`PACE_EVERY`]), and a node may get several peers' at once.
const SOCKET_BUFFER: usize = 4 << 20;

/// Bind the sync socket, creating it with `new`: at `listen`, else at `[::]` (both families)
/// or, on a host without IPv6 (`ipv6.disable=1`: no AF_INET6 sockets at all), at `0.0.0.0`.
fn bind_with(
    cfg: &SyncConfig,
    new: impl Fn(socket2::Domain) -> std::io::Result<socket2::Socket>,
) -> Result<tokio::net::UdpSocket> {
    use socket2::Domain;
    let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), cfg.port);
    let addr = cfg.listen.map_or(any6, |a| SocketAddr::new(a, cfg.port));
    let (s, addr) = match new(Domain::for_address(addr)) {
        Err(e) if cfg.listen.is_none() && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            tracing::info!("sync: this host has no IPv6; listening on 0.0.0.0");
            let any4 = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), cfg.port);
            (new(Domain::IPV4)?, any4)
        }
        r => (r?, addr),
    };
    if addr.is_ipv6() && cfg.listen.is_none() {
        s.set_only_v6(false)?;
    }
    // A reload that moves the listen address on the same port binds the new socket while the
    // old one is still open.
    s.set_reuse_address(true)?;
    set_buffers(&s);
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(tokio::net::UdpSocket::from_std(s.into())?)
}

/// [`SOCKET_BUFFER`] for both directions, past `net.core.rmem_max`/`wmem_max` when lbd may
/// (CAP_NET_ADMIN: `SO_RCVBUFFORCE`); a smaller result is logged, never silently kept.
fn set_buffers(s: &socket2::Socket) {
    use std::os::fd::AsRawFd;
    let force = |opt: i32| {
        let v = SOCKET_BUFFER as libc::c_int;
        // SAFETY: a plain setsockopt with an int.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if force(libc::SO_RCVBUFFORCE) != 0 {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if force(libc::SO_SNDBUFFORCE) != 0 {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    // The kernel reports twice what it was asked for (its bookkeeping share included).
    match s.recv_buffer_size() {
        Ok(got) if got >= SOCKET_BUFFER => {}
        got => tracing::warn!(
            wanted = SOCKET_BUFFER,
            got = ?got,
            "sync: a smaller receive buffer than asked for (net.core.rmem_max, no CAP_NET_ADMIN): a large full send may be dropped; see `lbctl stats` sync drops"
        ),
    }
}

/// Before the `i`th datagram of a send (to every peer): a pause after each [`PACE_EVERY`].
async fn pace(i: usize) {
    if i > 0 && i.is_multiple_of(PACE_EVERY) {
        tokio::time::sleep(PACE_PAUSE).await;
    }
}

/// Read `sock` into `tx`, apart from the task (which may be scanning or sending): until the
/// task is gone. With the queue full it waits, and the kernel's receive queue fills.
fn spawn_reader(
    sock: Arc<tokio::net::UdpSocket>,
    tx: mpsc::Sender<(Vec<u8>, IpAddr)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; wire::MAX_DATAGRAM + 1];
        loop {
            match sock.recv_from(&mut buf).await {
                Ok((n, from)) => {
                    if tx
                        .send((buf[..n].to_vec(), from.ip().to_canonical()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "sync: receive"),
            }
        }
    })
}

/// Datagrams the kernel dropped on `sock` (a full receive queue): `SK_MEMINFO_DROPS` of
/// `SO_MEMINFO`.
fn socket_drops(sock: &tokio::net::UdpSocket) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const SK_MEMINFO_VARS: usize = 9;
    const SK_MEMINFO_DROPS: usize = 8;
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `info`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize > SK_MEMINFO_DROPS * 4).then(|| u64::from(info[SK_MEMINFO_DROPS]))
}

struct Task {
    /// What runs: the configured `[sync]` with the learned peers in `peers`.
    cfg: SyncConfig,
    /// The configured peers alone, and the learned ones.
    configured: Vec<IpAddr>,
    learned: Vec<IpAddr>,
    /// The key signed with first, then the others accepted (a rotation's overlap).
    keys: Keys,
    sock: Arc<tokio::net::UdpSocket>,
    /// Reads `sock` into the task's inbox (replaced with the socket).
    reader: tokio::task::JoinHandle<()>,
    inbox_tx: mpsc::Sender<(Vec<u8>, IpAddr)>,
    pin_dir: PathBuf,
    pins: Option<Arc<Mutex<ConntrackPins>>>,
    view: watch::Receiver<Option<Arc<View>>>,
    stats: Arc<SyncStats>,
    counter: Counter,
    /// This run's identity (see `wire`), and the replay windows of the peers' runs.
    run: u64,
    gate: Gate,
    /// Replay windows of version-1 datagrams (an lbd not upgraded yet), by source address.
    windows: HashMap<IpAddr, Window>,
    /// Each peer's run as last heard (echoed in what is sent to it).
    peer_runs: HashMap<IpAddr, u64>,
    /// Peers last heard speaking version 1: sent version 1 until they speak version 2.
    v1_peers: std::collections::HashSet<IpAddr>,
    /// What the last scan found (and sent), with each closed entry's close: a later scan
    /// sends only what changed.
    sent: Arc<HashMap<FlowKey, (IpAddr, Option<Close>)>>,
    periodic: u64,
    /// A peer said it just started (`F_HELLO`): the next scan sends everything.
    full_due: bool,
    /// Retractions repeated in the next full sends (a lost one would leave a peer's entry
    /// naming the old backend): the backend retracted and the full sends left.
    retracted: HashMap<FlowKey, (IpAddr, u8)>,
    /// When each service's table last changed (its entries on their slot are shared a while).
    changes: Changes,
    /// Scans left that flag their datagrams as a hello and send one even with nothing in it:
    /// the first two with the services in place (a peer may miss the first datagram).
    hellos_left: u8,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Task {
    async fn run(
        mut self,
        mut inbox: mpsc::Receiver<(Vec<u8>, IpAddr)>,
        mut flush: mpsc::Receiver<oneshot::Sender<()>>,
        mut apply: mpsc::Receiver<Update>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut settle: Option<tokio::time::Instant> = None;
        loop {
            let at =
                settle.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                Some((d, from)) = inbox.recv() => {
                    self.received(&d, from);
                    if self.full_due {
                        settle.get_or_insert(tokio::time::Instant::now() + SETTLE);
                    }
                }
                c = self.view.changed() => {
                    if c.is_err() {
                        return; // the owner is gone
                    }
                    settle.get_or_insert(tokio::time::Instant::now() + SETTLE);
                }
                _ = tokio::time::sleep_until(at), if settle.is_some() => {
                    settle = None;
                    let full = std::mem::take(&mut self.full_due);
                    self.scan(full).await;
                }
                _ = tick.tick() => {
                    self.periodic += 1;
                    let full = self.periodic % FULL_EVERY == 1 || std::mem::take(&mut self.full_due);
                    self.scan(full).await;
                }
                p = apply.recv() => match p {
                    Some(Update::Learned(l)) => self.learn(l),
                    Some(Update::Config(p)) => {
                        let interval = p.cfg.interval_ms != self.cfg.interval_ms;
                        self.apply(p);
                        if interval {
                            tick = tokio::time::interval(Duration::from_millis(self.cfg.interval_ms));
                            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        }
                    }
                    None => return,
                },
                f = flush.recv() => match f {
                    Some(done) => {
                        self.stats.flushes.fetch_add(1, Relaxed);
                        self.scan(true).await;
                        let _ = done.send(());
                    }
                    None => return,
                },
            }
        }
    }

    /// A reload's `[sync]`. A peer that joined gets everything at the next scan; the replay
    /// windows of peers that left are forgotten.
    fn apply(&mut self, p: Prepared) {
        if let Some(sock) = p.sock {
            self.reader.abort();
            self.sock = Arc::new(sock);
            self.reader = spawn_reader(self.sock.clone(), self.inbox_tx.clone());
        }
        self.configured = p.cfg.peers.clone();
        let mut cfg = p.cfg;
        cfg.peers = crate::members::roster::merge(&self.configured, &self.learned, None);
        self.set_peers(cfg);
        tracing::info!(
            peers = self.cfg.peers.len(),
            port = self.cfg.port,
            "sync: new config applied"
        );
    }

    /// Learned peers changed: the same as a config with them.
    fn learn(&mut self, learned: Vec<IpAddr>) {
        self.learned = learned;
        let mut cfg = self.cfg.clone();
        cfg.peers = crate::members::roster::merge(&self.configured, &self.learned, None);
        self.set_peers(cfg);
    }

    /// Run `cfg` (its peers the configured and learned ones).
    fn set_peers(&mut self, cfg: SyncConfig) {
        let joined = cfg.peers.iter().any(|a| !self.cfg.peers.contains(a));
        self.windows.retain(|a, _| cfg.peers.contains(a));
        self.peer_runs.retain(|a, _| cfg.peers.contains(a));
        self.v1_peers.retain(|a| cfg.peers.contains(a));
        self.cfg = cfg;
        self.full_due |= joined;
    }

    fn pins(&mut self) -> Result<Arc<Mutex<ConntrackPins>>> {
        if let Some(p) = &self.pins {
            return Ok(p.clone());
        }
        let p = Arc::new(Mutex::new(ConntrackPins::open(&self.pin_dir)?));
        self.pins = Some(p.clone());
        Ok(p)
    }

    /// Find the exceptions and send them (all of them, or only what changed since the last
    /// scan). A full scan with nothing to send still sends one empty datagram, so peers see
    /// this node alive (`last_received_unix_ms`).
    async fn scan(&mut self, full: bool) {
        let Some(view) = self.view.borrow().clone() else {
            return;
        };
        let mut view = (*view).clone();
        self.changes.mark(&mut view, Instant::now());
        let pins = match self.pins() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "sync: opening the connection table");
                return;
            }
        };
        let limit = self.cfg.max_entries as usize;
        let t = Instant::now();
        let was_sent = self.sent.clone();
        let found = tokio::task::spawn_blocking(move || {
            let now = crate::sync::view::coarse_ns();
            let ix = Index::new(&view);
            let pins = pins.lock().unwrap();
            let mut scanned = [0u64; 4];
            let mut on_slot_now = HashSet::new();
            // Entries on their slot shared because the table may differ from a peer's
            // (`share_all`): kept apart, and sent only in the room the exceptions leave.
            let mut shared: HashMap<FlowKey, (IpAddr, Option<Close>)> = HashMap::new();
            pins.scan(limit, |k, v| {
                let r = ix.classify(k, v);
                let on_slot = match r {
                    Err(Skip::OnSlot) => true,
                    Ok(_) => ix.on_its_slot(k, v),
                    Err(_) => false,
                };
                scanned[match r {
                    Ok(_) if on_slot => 3,
                    Ok(_) => 0,
                    Err(Skip::Stale) => 1,
                    Err(Skip::NotForwarded) => 2,
                    Err(Skip::OnSlot) => 3,
                }] += 1;
                // Sent as an exception to another backend, now on its slot: a new connection
                // on the 5-tuple. (On its slot with the backend sent, the table changed: the
                // peers' entry does no harm.)
                if on_slot
                    && let Some(sent) = was_sent.get(k)
                    && ix.backend_addr(v) != Some(sent.0)
                {
                    on_slot_now.insert(*k);
                }
                if let Ok(b) = r
                    && on_slot
                {
                    // The flow cache is walked first: its entry decides.
                    if shared.len() < limit {
                        shared.entry(*k).or_insert((b, close_of(v, now)));
                    }
                    return false;
                }
                r.is_ok()
            })
            .map(|entries| {
                let complete = entries.len() < limit;
                let mut found = entries
                    .into_iter()
                    .filter_map(|(k, v)| ix.exception(&k, &v).map(|b| (k, (b, close_of(&v, now)))))
                    .collect::<HashMap<FlowKey, (IpAddr, Option<Close>)>>();
                // Only from a complete scan: one cut short at `limit` may not have seen the
                // exception that still stands in the other table. A moved flow shared on its
                // slot is retracted too (a peer that forwards the service keeps what it holds).
                let moved: Vec<FlowKey> = if complete {
                    on_slot_now
                        .into_iter()
                        .filter(|k| !found.contains_key(k))
                        .collect()
                } else {
                    Vec::new()
                };
                for (k, b) in shared {
                    if found.len() >= limit {
                        break;
                    }
                    found.entry(k).or_insert(b);
                }
                (scanned, found, moved)
            })
        })
        .await;
        let (found, moved) = match found {
            Ok(Ok((scanned, f, moved))) => {
                self.stats.scanned.store(scanned.iter().sum(), Relaxed);
                self.stats.scanned_stale.store(scanned[1], Relaxed);
                self.stats.scanned_not_forwarded.store(scanned[2], Relaxed);
                self.stats.scanned_on_slot.store(scanned[3], Relaxed);
                (f, moved)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "sync: scanning the connection table");
                self.pins = None; // replaced by a restart's new pins? reopen next time
                return;
            }
            Err(_) => return,
        };
        let s = self.stats.clone();
        s.scans.fetch_add(1, Relaxed);
        s.scan_ms.store(t.elapsed().as_millis() as u64, Relaxed);
        s.last_scan_unix_ms.store(unix_us() / 1000, Relaxed);
        if let Some(d) = socket_drops(&self.sock) {
            s.receive_drops.store(d, Relaxed);
        }
        s.exceptions.store(found.len() as u64, Relaxed);
        let send: Vec<Record> = found
            .iter()
            .filter(|(k, (b, c))| {
                full || self.sent.get(k).map(|(b, c)| shared_state(*b, *c))
                    != Some(shared_state(*b, *c))
            })
            .map(|(k, (b, c))| Record {
                key: *k,
                backend: *b,
                close: *c,
            })
            .collect();
        // Connections this node sent as exceptions that now sit on their slot: the client
        // reused the 5-tuple for a new connection, placed afresh here. The peers still hold
        // the old backend for it, and would send the new connection there after a VIP move.
        let mut retract: Vec<Record> = moved
            .iter()
            .filter_map(|k| {
                self.sent.get(k).map(|(b, _)| Record {
                    key: *k,
                    backend: *b,
                    close: None,
                })
            })
            .collect();
        // A full send repeats the retractions of the last ones (a lost datagram is repaired
        // by the next), unless the flow is an exception again.
        self.retracted.retain(|k, _| !found.contains_key(k));
        if full {
            let fresh: HashSet<FlowKey> = retract.iter().map(|r| r.key).collect();
            self.retracted.retain(|k, (b, left)| {
                if !fresh.contains(k) {
                    retract.push(Record {
                        key: *k,
                        backend: *b,
                        close: None,
                    });
                }
                *left = left.saturating_sub(1);
                *left > 0
            });
        }
        for r in &retract {
            self.retracted
                .entry(r.key)
                .or_insert((r.backend, RETRACT_REPEATS));
        }
        self.sent = Arc::new(found);
        // Hello in the first two scans with the services in place, whatever they find: a
        // restarted backup with no exception of its own says it too, so its peers send it
        // theirs now rather than at their next full send.
        let hello = if self.hellos_left > 0 {
            self.hellos_left -= 1;
            wire::F_HELLO
        } else {
            0
        };
        if !retract.is_empty() {
            self.send(hello | wire::F_RETRACT, &retract).await;
        }
        if send.is_empty() && !full && hello == 0 {
            return;
        }
        self.send(hello, &send).await;
    }

    /// Send `records` to every peer in datagrams of at most [`wire::MAX_RECORDS`] (one empty
    /// datagram when there are none).
    async fn send(&mut self, flags: u8, records: &[Record]) {
        let s = self.stats.clone();
        let mut chunks: Vec<&[Record]> = records.chunks(wire::MAX_RECORDS).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for (i, chunk) in chunks.into_iter().enumerate() {
            pace(i).await;
            let (epoch, seq) = self.counter.next(unix_us());
            if let Some((by_us, at_us)) = self.counter.stepped_back.take() {
                tracing::warn!(
                    by_ms = by_us / 1000,
                    epoch,
                    "sync: this node's clock stepped back; datagrams are numbered from the clock again in a new epoch"
                );
                *s.clock_step.lock().unwrap() = Some(crate::sync::status::ClockStep {
                    by_ms: by_us / 1000,
                    at_unix_ms: at_us / 1000,
                    epoch,
                });
            }
            for peer in self.cfg.peers.clone() {
                // Sealed for each peer: the echo of its run is its own.
                let sender = (!self.v1_peers.contains(&peer)).then(|| wire::Sender {
                    run: self.run,
                    epoch,
                    echo: self.peer_runs.get(&peer).copied().unwrap_or(0),
                });
                let key = self.keys.read().unwrap()[0].clone();
                let d = wire::seal(&key, sender, seq, flags, chunk);
                let to = match (peer, self.sock.local_addr().map(|a| a.is_ipv6())) {
                    (IpAddr::V4(v4), Ok(true)) => IpAddr::V6(v4.to_ipv6_mapped()),
                    _ => peer,
                };
                match self
                    .sock
                    .send_to(&d, SocketAddr::new(to, self.cfg.port))
                    .await
                {
                    Ok(_) if flags & wire::F_RETRACT != 0 => {
                        s.sent_datagrams.fetch_add(1, Relaxed);
                        s.retractions_sent.fetch_add(chunk.len() as u64, Relaxed);
                        if let Some(p) = s.peers.lock().unwrap().get_mut(&peer) {
                            p.sent_datagrams += 1;
                        }
                    }
                    Ok(_) => {
                        s.sent_datagrams.fetch_add(1, Relaxed);
                        s.sent_entries.fetch_add(chunk.len() as u64, Relaxed);
                        if let Some(p) = s.peers.lock().unwrap().get_mut(&peer) {
                            p.sent_datagrams += 1;
                            p.sent_entries += chunk.len() as u64;
                        }
                    }
                    Err(e) => {
                        s.send_errors.fetch_add(1, Relaxed);
                        tracing::debug!(%peer, error = %e, "sync: send");
                    }
                }
            }
        }
    }

    /// A datagram: from a configured peer, authentic, not replayed; then each record goes to
    /// this node's pair of the same service and backend address, if this node has it in the
    /// set, and only where this node has no entry of its own.
    fn received(&mut self, buf: &[u8], from: IpAddr) {
        let s = self.stats.clone();
        if !self.cfg.peers.contains(&from) {
            s.refused_peer.fetch_add(1, Relaxed);
            return;
        }
        // Each accepted key in turn (the signing one first): during a rotation a peer may sign
        // with either.
        let opened = self
            .keys
            .read()
            .unwrap()
            .iter()
            .map(|k| wire::open(k, buf))
            .find(|r| !matches!(r, Err(WireError::Auth)))
            .unwrap_or(Err(WireError::Auth));
        let wire::Opened {
            sender,
            seq,
            flags,
            mut records,
        } = match opened {
            Ok(x) => x,
            Err(WireError::Auth) => {
                s.refused_auth.fetch_add(1, Relaxed);
                return;
            }
            Err(_) => {
                s.refused_malformed.fetch_add(1, Relaxed);
                return;
            }
        };
        let now = unix_us();
        // The window of the sender's run and epoch (version 2), or of the source address (an
        // lbd not upgraded yet).
        let checked = match &sender {
            Some(snd) => self.gate.check(snd, seq, now),
            None => self
                .windows
                .entry(from)
                .or_default()
                .check(seq, now)
                .map(|()| Pass::All),
        };
        let pass = match checked {
            Ok(p) => p,
            Err(r) => {
                s.refused_replay.fetch_add(1, Relaxed);
                if r == Refusal::Stale {
                    tracing::debug!(%from, "sync: a datagram far from this node's clock");
                }
                return;
            }
        };
        match sender {
            Some(snd) => {
                // A peer heard in a new run (it restarted, or this node did) has none of this
                // node's exceptions, and dropped those sent before it was heard (they echoed
                // no run of its): the next scan sends everything, echoing its run.
                if self.peer_runs.insert(from, snd.run) != Some(snd.run) {
                    self.full_due = true;
                }
                self.v1_peers.remove(&from);
            }
            None => {
                self.v1_peers.insert(from);
            }
        }
        if pass == Pass::Header {
            // Sent before the peer heard this run of lbd: its records may be a capture from
            // before this node started. The peer echoes this run from its next datagram on.
            s.refused_earlier_run
                .fetch_add(records.len() as u64, Relaxed);
            records.clear();
        }
        s.received_datagrams.fetch_add(1, Relaxed);
        if flags & wire::F_HELLO != 0 {
            // A peer that (re)started has none of this node's exceptions.
            self.full_due = true;
        }
        s.received_entries.fetch_add(records.len() as u64, Relaxed);
        let mut installed = 0;
        let view = self.view.borrow().clone();
        let retraction = flags & wire::F_RETRACT != 0;
        if !records.is_empty()
            && let Some(view) = view
            && let Ok(pins) = self.pins()
        {
            let ix = Index::new(&view);
            let mut pins = pins.lock().unwrap();
            let coarse = crate::sync::view::coarse_ns();
            for r in &records {
                if retraction {
                    // The entry goes only if it names the backend retracted (this node's own
                    // decision for the flow, or another peer's, stays).
                    if let Ok(v) = ix.resolve(r) {
                        match pins.remove_if(&r.key, v) {
                            Ok(true) => {
                                s.retracted.fetch_add(1, Relaxed);
                            }
                            Ok(false) => {}
                            Err(e) => {
                                s.install_errors.fetch_add(1, Relaxed);
                                tracing::debug!(error = %format!("{e:#}"), "sync: retract");
                            }
                        }
                    }
                    continue;
                }
                // Where this node forwards the service its own entry stands (only a close the
                // peer saw on the same pair is taken); elsewhere the sender's is the current
                // one and corrects what is held.
                let forwarded = ix.forwarded(&r.key);
                match ix.resolve(r).map(|v| with_close(v, r.close, coarse)) {
                    Ok(v) => match if forwarded {
                        pins.insert_absent(&r.key, v)
                            .and_then(|new| Ok(new || pins.close_same(&r.key, v)?))
                    } else {
                        pins.correct(&r.key, v)
                    } {
                        Ok(true) => installed += 1,
                        Ok(false) => {
                            s.already_present.fetch_add(1, Relaxed);
                        }
                        Err(e) => {
                            s.install_errors.fetch_add(1, Relaxed);
                            tracing::debug!(error = %format!("{e:#}"), "sync: install");
                        }
                    },
                    Err(Refused::NoService) => {
                        s.refused_service.fetch_add(1, Relaxed);
                    }
                    Err(Refused::NoBackend) => {
                        s.refused_backend.fetch_add(1, Relaxed);
                    }
                }
            }
        }
        s.installed.fetch_add(installed, Relaxed);
        if let Some(p) = s.peers.lock().unwrap().get_mut(&from) {
            p.received_datagrams += 1;
            p.received_entries += records.len() as u64;
            p.installed += installed;
            p.last_received_unix_ms = now / 1000;
            p.lag_ms = now.saturating_sub(seq) / 1000;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(port: u16) -> SyncConfig {
        SyncConfig {
            peers: vec!["192.0.2.1".parse().unwrap()],
            key_file: "/nonexistent".into(),
            accept_key_files: Vec::new(),
            port,
            listen: None,
            interval_ms: 2000,
            max_entries: 65536,
        }
    }

    /// On a host booted with `ipv6.disable=1` no AF_INET6 socket can be made: the sync
    /// listens on 0.0.0.0 instead of refusing lbd's start.
    #[tokio::test]
    async fn without_ipv6_the_socket_listens_on_ipv4() {
        use socket2::{Domain, Protocol, Socket, Type};
        let no_ipv6 = |d: Domain| {
            if d == Domain::IPV6 {
                return Err(std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
            }
            Socket::new(d, Type::DGRAM, Some(Protocol::UDP))
        };
        let s = bind_with(&cfg(0), no_ipv6).expect("bound without IPv6");
        let local = s.local_addr().unwrap();
        assert!(local.ip().is_unspecified() && local.is_ipv4(), "{local}");
        // With IPv6, both families on one socket, as before.
        let s = bind_with(&cfg(0), |d| {
            Socket::new(d, Type::DGRAM, Some(Protocol::UDP))
        })
        .unwrap();
        assert!(s.local_addr().unwrap().is_ipv6());
        // A chosen address stays an error of its own family.
        let mut c = cfg(0);
        c.listen = Some("::1".parse().unwrap());
        assert!(bind_with(&c, no_ipv6).is_err());
    }

    /// Full sends at the default `max_entries` from two peers at once (2,980 datagrams of the
    /// largest size each, paced as `Task::send` paces them: a restarted node's hello answered by
    /// both) arrive while the task is busy for half a second (a scan): the reader keeps the
    /// socket drained into the task's queue, so the kernel drops none. Read by nobody for that
    /// time, the same bursts overflow the socket's receive queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_send_during_a_scan_loses_no_datagram() {
        const BURST: usize = 65_536_usize.div_ceil(wire::MAX_RECORDS);
        async fn one(to: SocketAddr) {
            let tx = bind(&cfg(0)).unwrap();
            let d = vec![0u8; wire::MAX_DATAGRAM];
            for i in 0..BURST {
                pace(i).await;
                tx.send_to(&d, to).await.unwrap();
            }
        }
        async fn burst(to: SocketAddr) {
            tokio::join!(one(to), one(to));
        }
        let local = |s: &tokio::net::UdpSocket| {
            SocketAddr::new("::1".parse().unwrap(), s.local_addr().unwrap().port())
        };
        // Read apart: the task's queue takes the burst while the task scans.
        let rx = Arc::new(bind(&cfg(0)).unwrap());
        let (tx, mut inbox) = mpsc::channel(RECEIVE_QUEUE);
        let reader = spawn_reader(rx.clone(), tx);
        let scan = tokio::time::sleep(Duration::from_millis(500));
        burst(local(&rx)).await;
        scan.await;
        let mut got = 0;
        while got < 2 * BURST {
            let (d, _) = inbox.recv().await.unwrap();
            assert_eq!(d.len(), wire::MAX_DATAGRAM);
            got += 1;
        }
        assert_eq!(socket_drops(&rx), Some(0));
        reader.abort();
        // Not read while the burst comes: the kernel drops what its queue cannot hold.
        let idle = bind(&cfg(0)).unwrap();
        burst(local(&idle)).await;
        assert!(
            socket_drops(&idle).unwrap() > 0,
            "the bursts fit the kernel's queue alone"
        );
    }

    /// The kernel's per-socket drop count is readable (the `receive_drops` counter).
    #[tokio::test]
    async fn socket_drops_are_readable() {
        let s = bind(&cfg(0)).unwrap();
        assert_eq!(socket_drops(&s), Some(0));
    }
}
