//! Client load for the chaos lab, run on threads inside the client's network namespace:
//!
//! - long-lived connections to the echo service (`labnode serve-id`): each reads the id of the
//!   backend that serves it, then sends a line every [`LONG_INTERVAL`] and expects it echoed
//!   within [`LONG_TIMEOUT`]. A connection that is reset or times out is recorded as lost (with
//!   its backend) and replaced by a new one, so every case starts with the full set;
//! - short connections at a fixed rate, round robin over the targets (the echo service: read
//!   the id line; HTTP: `GET /id`, read the id), each with [`SHORT_TIMEOUT`] for everything.
//!
//! Every outcome is stamped with milliseconds since the load started ([`Load::now_ms`]), so the
//! harness cuts the record into case windows afterwards.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub const LONG_INTERVAL: Duration = Duration::from_millis(100);
/// How long a long-lived connection may wait for its echo before it counts as lost: long
/// enough for TCP to retransmit through a sub-second failover several times.
pub const LONG_TIMEOUT: Duration = Duration::from_secs(8);
/// A new connection fails when it is not answered within this: long enough for one SYN
/// retransmission (at 1 s), as any real client allows, so an outage shows as a gap
/// ([`crate::chaos::CaseResult::max_gap_ms`]) and failures are what a client would see.
pub const SHORT_TIMEOUT: Duration = Duration::from_secs(3);
/// Short-connection slots later than this are skipped (and counted): a client that waits
/// that long has moved on.
const SHORT_LATE: Duration = Duration::from_secs(1);
/// Enough workers to keep the rate while connections wait for a retransmitted SYN.
const SHORT_WORKERS: usize = 160;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// `labnode serve-id`: the server writes its id line first.
    Echo,
    /// A stand-in's HTTP: `GET /id` answers the id.
    Http,
}

#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub proto: Proto,
}

/// One short connection: when it started and ended (ms), the target index, the outcome.
#[derive(Clone, Debug)]
pub struct Short {
    pub start: u64,
    pub end: u64,
    pub target: usize,
    pub result: Result<String, String>,
}

/// A long-lived connection lost: when (ms), which connection (its index in the load), when
/// it had been opened (ms, its backend's id read), its target index, its backend id, why.
#[derive(Clone, Debug)]
pub struct Lost {
    pub at: u64,
    pub conn: usize,
    pub opened: u64,
    pub target: usize,
    pub backend: String,
    pub error: String,
}

#[derive(Default)]
struct Record {
    shorts: Vec<Short>,
    lost: Vec<Lost>,
    skipped: Vec<u64>,
}

#[derive(Clone, Debug, Default)]
struct LongState {
    backend: Option<String>,
    last_ok: u64,
    up: bool,
    /// The generation (see `Load::renew_long`) this connection was opened in.
    generation: u64,
}

struct Shared {
    epoch: Instant,
    stop: AtomicBool,
    record: Mutex<Record>,
    long: Vec<Mutex<LongState>>,
    next_slot: AtomicU64,
    /// Bumped by `Load::renew_long`: long-lived connections of an older one close cleanly
    /// and reconnect.
    long_generation: AtomicU64,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

pub struct Load {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// Spawn `f` on a thread that first enters the network namespace at `netns_path`.
fn spawn_in(netns_path: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    let path = netns_path.to_string();
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .expect("spawn load thread")
}

fn read_id_line(s: &TcpStream) -> Result<String, String> {
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("read: {}", e.kind()))?;
    if line.is_empty() {
        return Err("read: closed".into());
    }
    Ok(line.trim().to_string())
}

/// One short connection to `t`: the id of the backend that answered.
fn short(t: &Target) -> Result<String, String> {
    let deadline = Instant::now() + SHORT_TIMEOUT;
    let mut s = TcpStream::connect_timeout(&t.addr, SHORT_TIMEOUT)
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).ok();
    s.set_write_timeout(Some(left)).ok();
    match t.proto {
        Proto::Echo => read_id_line(&s),
        Proto::Http => {
            s.write_all(b"GET /id HTTP/1.0\r\nHost: chaos\r\n\r\n")
                .map_err(|e| format!("write: {}", e.kind()))?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf)
                .map_err(|e| format!("read: {}", e.kind()))?;
            let text = String::from_utf8_lossy(&buf);
            if !text.starts_with("HTTP/1.") || !text.contains(" 200 ") {
                return Err(format!(
                    "http: {:?}",
                    text.lines().next().unwrap_or("(empty)")
                ));
            }
            Ok(text.lines().last().unwrap_or("").trim().to_string())
        }
    }
}

impl Load {
    /// Start `long_count` long-lived connections spread over `long` targets and short
    /// connections at `rate` per second over `short` targets, from the namespace `netns`.
    pub fn start(
        netns: &str,
        long: Vec<Target>,
        long_count: usize,
        short: Vec<Target>,
        rate: u32,
    ) -> Load {
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            record: Mutex::new(Record::default()),
            long: (0..long_count)
                .map(|_| Mutex::new(LongState::default()))
                .collect(),
            next_slot: AtomicU64::new(0),
            long_generation: AtomicU64::new(0),
        });
        let path = format!("/run/netns/{netns}");
        let mut threads = Vec::new();
        for i in 0..long_count {
            let sh = shared.clone();
            let ti = i % long.len();
            let t = long[ti].clone();
            threads.push(spawn_in(&path, move || long_lived(sh, i, ti, t)));
        }
        let period = Duration::from_secs(1) / rate.max(1);
        let short = Arc::new(short);
        for _ in 0..SHORT_WORKERS {
            let sh = shared.clone();
            let targets = short.clone();
            threads.push(spawn_in(&path, move || short_worker(sh, &targets, period)));
        }
        Load { shared, threads }
    }

    pub fn now_ms(&self) -> u64 {
        self.shared.now_ms()
    }

    /// The load's clock, for other recorders (ms since the load started).
    pub fn clock(&self) -> impl Fn() -> u64 + Send + 'static {
        let sh = self.shared.clone();
        move || sh.now_ms()
    }

    /// Short connections that ended in `[from, to)` ms.
    pub fn shorts(&self, from: u64, to: u64) -> Vec<Short> {
        let r = self.shared.record.lock().unwrap();
        r.shorts
            .iter()
            .filter(|s| s.end >= from && s.end < to)
            .cloned()
            .collect()
    }

    /// Long-lived connections lost in `[from, to)` ms.
    pub fn lost(&self, from: u64, to: u64) -> Vec<Lost> {
        let r = self.shared.record.lock().unwrap();
        r.lost
            .iter()
            .filter(|l| l.at >= from && l.at < to)
            .cloned()
            .collect()
    }

    /// Short-connection slots skipped for lateness in `[from, to)` ms.
    pub fn skipped(&self, from: u64, to: u64) -> usize {
        let r = self.shared.record.lock().unwrap();
        r.skipped.iter().filter(|t| **t >= from && **t < to).count()
    }

    /// Backend id of every long-lived connection that is up now (None: reconnecting).
    pub fn long_backends(&self) -> Vec<Option<String>> {
        self.shared
            .long
            .iter()
            .map(|m| {
                let g = m.lock().unwrap();
                g.up.then(|| g.backend.clone()).flatten()
            })
            .collect()
    }

    /// How many long-lived connections that are up each backend serves now.
    pub fn long_by_backend(&self) -> std::collections::BTreeMap<String, u64> {
        let mut m = std::collections::BTreeMap::new();
        for b in self.long_backends().into_iter().flatten() {
            *m.entry(b).or_default() += 1;
        }
        m
    }

    /// Every long-lived connection is up, of the current generation, and had an echo answered
    /// at or after `since` ms.
    pub fn long_all_fresh(&self, since: u64) -> bool {
        let generation = self.shared.long_generation.load(Ordering::SeqCst);
        self.shared.long.iter().all(|m| {
            let g = m.lock().unwrap();
            g.up && g.last_ok >= since && g.generation == generation
        })
    }

    /// Close every long-lived connection cleanly (not counted as lost) and open it again, so
    /// that a case starts with connections placed by the cluster as it is now. A connection
    /// opened while a backend was out sits, by the Maglev table of that time, on another
    /// backend than today's table names: only the owner's connection table keeps it there,
    /// so it breaks at the next VIP move. That is a real limit of per-node connection tables
    /// (docs/benchmarks.md), but it belongs to the case that changed the set, not the next.
    pub fn renew_long(&self) {
        self.shared.long_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// How many long-lived connections are up.
    pub fn long_up(&self) -> usize {
        self.shared
            .long
            .iter()
            .filter(|m| m.lock().unwrap().up)
            .count()
    }

    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn long_lived(sh: Arc<Shared>, i: usize, ti: usize, t: Target) {
    let mut n = 0u64;
    while !sh.stop.load(Ordering::SeqCst) {
        let mut backend = String::from("?");
        let mut opened = 0;
        let generation = sh.long_generation.load(Ordering::SeqCst);
        let outcome = (|| -> Result<(), String> {
            let s = TcpStream::connect_timeout(&t.addr, Duration::from_secs(3))
                .map_err(|e| format!("connect: {}", e.kind()))?;
            s.set_read_timeout(Some(LONG_TIMEOUT)).ok();
            s.set_write_timeout(Some(LONG_TIMEOUT)).ok();
            let _ = s.set_nodelay(true);
            let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
            let mut w = s;
            let mut line = String::new();
            r.read_line(&mut line)
                .map_err(|e| format!("id: {}", e.kind()))?;
            if line.is_empty() {
                return Err("closed before the id".into());
            }
            backend = line.trim().to_string();
            opened = sh.now_ms();
            {
                let mut g = sh.long[i].lock().unwrap();
                g.backend = Some(backend.clone());
                g.up = true;
                g.last_ok = sh.now_ms();
                g.generation = generation;
            }
            while !sh.stop.load(Ordering::SeqCst)
                && sh.long_generation.load(Ordering::SeqCst) == generation
            {
                let msg = format!("c{i} m{n}\n");
                n += 1;
                w.write_all(msg.as_bytes())
                    .map_err(|e| format!("write: {}", e.kind()))?;
                let mut back = String::new();
                r.read_line(&mut back)
                    .map_err(|e| format!("echo: {}", e.kind()))?;
                if back.is_empty() {
                    return Err("echo: closed".into());
                }
                if back != msg {
                    return Err(format!("echo mismatch: {back:?}"));
                }
                sh.long[i].lock().unwrap().last_ok = sh.now_ms();
                std::thread::sleep(LONG_INTERVAL);
            }
            Ok(())
        })();
        sh.long[i].lock().unwrap().up = false;
        match outcome {
            Ok(()) if sh.stop.load(Ordering::SeqCst) => return,
            // Renewed: reconnect at once.
            Ok(()) => {}
            Err(error) => {
                // A connection never established (connect failed) is not a lost one.
                if backend != "?" {
                    sh.record.lock().unwrap().lost.push(Lost {
                        at: sh.now_ms(),
                        conn: i,
                        opened,
                        target: ti,
                        backend,
                        error,
                    });
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn short_worker(sh: Arc<Shared>, targets: &[Target], period: Duration) {
    while !sh.stop.load(Ordering::SeqCst) {
        let slot = sh.next_slot.fetch_add(1, Ordering::SeqCst);
        let at = period * slot as u32;
        let now = sh.epoch.elapsed();
        if now < at {
            std::thread::sleep(at - now);
        } else if now - at > SHORT_LATE {
            sh.record.lock().unwrap().skipped.push(sh.now_ms());
            continue;
        }
        let ti = slot as usize % targets.len();
        let start = sh.now_ms();
        let result = short(&targets[ti]);
        let end = sh.now_ms();
        sh.record.lock().unwrap().shorts.push(Short {
            start,
            end,
            target: ti,
            result,
        });
    }
}
