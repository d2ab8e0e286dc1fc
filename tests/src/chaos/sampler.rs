//! Who holds each VIP, sampled every [`PERIOD`] through rtnetlink in every node's namespace (one
//! netlink socket per namespace, opened inside it; no process per sample). A node holds a VIP
//! when the address is on one of its interfaces that is up with carrier (not on `lo`, where
//! every DSR backend has it unannounced).

use std::{
    net::Ipv4Addr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub const PERIOD: Duration = Duration::from_millis(20);

/// One sample: when (ms on the load's clock), and per VIP the indexes of the nodes holding it.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: u64,
    pub holders: Vec<Vec<usize>>,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<JoinHandle<()>>,
}

/// A NETLINK_ROUTE socket living in a namespace.
struct Rtnl(i32);

impl Drop for Rtnl {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 0x1;
const IFF_LOOPBACK: u32 = 0x8;
const IFF_LOWER_UP: u32 = 0x1_0000;

impl Rtnl {
    /// Open a socket inside the namespace at `path` (the socket stays bound to it).
    fn open_in(path: &str) -> Rtnl {
        let path = path.to_string();
        let fd = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}");
            let fd = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            assert!(fd >= 0, "netlink socket");
            let tv = libc::timeval {
                tv_sec: 1,
                tv_usec: 0,
            };
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as u32,
                )
            };
            fd
        })
        .join()
        .unwrap();
        Rtnl(fd)
    }

    /// Dump `kind` (RTM_GETLINK or RTM_GETADDR for IPv4) and call `f(type, body)` per message.
    fn dump(&self, kind: u16, mut f: impl FnMut(u16, &[u8])) -> bool {
        let body_len = if kind == RTM_GETLINK { 16 } else { 8 };
        let mut req = vec![0u8; 16 + body_len];
        req[0..4].copy_from_slice(&((16 + body_len) as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&kind.to_ne_bytes());
        req[6..8].copy_from_slice(&(1u16 | 0x300).to_ne_bytes());
        req[16] = libc::AF_INET as u8;
        let n = unsafe { libc::send(self.0, req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return false;
        }
        let mut buf = vec![0u8; 65536];
        loop {
            let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                return false;
            }
            let mut off = 0usize;
            let n = n as usize;
            while off + 16 <= n {
                let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
                let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
                if len < 16 || off + len > n {
                    return false;
                }
                match ty {
                    NLMSG_DONE => return true,
                    NLMSG_ERROR => return false,
                    _ => f(ty, &buf[off + 16..off + len]),
                }
                off += (len + 3) & !3;
            }
        }
    }

    /// IPv4 addresses on interfaces that are up with carrier and not loopback.
    fn live_addrs(&self) -> Option<Vec<Ipv4Addr>> {
        let mut up = Vec::new();
        let ok = self.dump(RTM_GETLINK, |ty, b| {
            if ty == RTM_NEWLINK && b.len() >= 16 {
                let index = i32::from_ne_bytes(b[4..8].try_into().unwrap());
                let flags = u32::from_ne_bytes(b[8..12].try_into().unwrap());
                if flags & IFF_UP != 0 && flags & IFF_LOWER_UP != 0 && flags & IFF_LOOPBACK == 0 {
                    up.push(index as u32);
                }
            }
        });
        if !ok {
            return None;
        }
        let mut addrs = Vec::new();
        let ok = self.dump(RTM_GETADDR, |ty, b| {
            if ty != RTM_NEWADDR || b.len() < 8 {
                return;
            }
            let index = u32::from_ne_bytes(b[4..8].try_into().unwrap());
            if !up.contains(&index) {
                return;
            }
            let mut off = 8;
            while off + 4 <= b.len() {
                let len = u16::from_ne_bytes(b[off..off + 2].try_into().unwrap()) as usize;
                let ty = u16::from_ne_bytes(b[off + 2..off + 4].try_into().unwrap());
                if len < 4 || off + len > b.len() {
                    break;
                }
                if ty == IFA_LOCAL && len == 8 {
                    let a: [u8; 4] = b[off + 4..off + 8].try_into().unwrap();
                    addrs.push(Ipv4Addr::from(a));
                }
                off += (len + 3) & !3;
            }
        });
        ok.then_some(addrs)
    }
}

impl Sampler {
    /// Sample `vips` on the namespaces `netns` (node i = `netns[i]`), stamping with `clock`.
    pub fn start(
        netns: &[String],
        vips: &[Ipv4Addr],
        clock: impl Fn() -> u64 + Send + 'static,
    ) -> Sampler {
        let socks: Vec<Rtnl> = netns
            .iter()
            .map(|n| Rtnl::open_in(&format!("/run/netns/{n}")))
            .collect();
        let vips = vips.to_vec();
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (st, sa) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                let at = clock();
                let mut holders = vec![Vec::new(); vips.len()];
                for (i, s) in socks.iter().enumerate() {
                    let Some(addrs) = s.live_addrs() else {
                        continue;
                    };
                    for (v, vip) in vips.iter().enumerate() {
                        if addrs.contains(vip) {
                            holders[v].push(i);
                        }
                    }
                }
                sa.lock().unwrap().push(Sample { at, holders });
                std::thread::sleep(PERIOD.saturating_sub(t0.elapsed()));
            }
        });
        Sampler {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// Samples taken in `[from, to)` ms.
    pub fn samples(&self, from: u64, to: u64) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .cloned()
            .collect()
    }

    /// The latest sample.
    pub fn last(&self) -> Option<Sample> {
        self.samples.lock().unwrap().last().cloned()
    }
}

/// Milliseconds in `samples` during which some VIP had two or more holders (each sample counts
/// until the next one).
pub fn dual_ms(samples: &[Sample]) -> f64 {
    samples
        .windows(2)
        .filter(|w| w[0].holders.iter().any(|h| h.len() >= 2))
        .map(|w| (w[1].at - w[0].at) as f64)
        .fold(0.0, |a, b| a + b)
}

/// When the last stretch of dual holding in `samples` ended (ms), if there was one.
pub fn dual_end(samples: &[Sample]) -> Option<u64> {
    samples
        .windows(2)
        .filter(|w| w[0].holders.iter().any(|h| h.len() >= 2))
        .map(|w| w[1].at)
        .max()
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
