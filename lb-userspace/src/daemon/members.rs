//! The membership announcements beside the owner (see `crate::members`): sends this node's
//! signed announcement to every node it knows every `announce_ms` (and at once to a node that
//! just started), reads the others', and hands the owner the learned members whenever they
//! change, which it turns into VRRP and sync peers. At start the owner waits for
//! [`MembersHandle::joined`] before it starts its VRRP instances.

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use anyhow::{Context, Result};
use tokio::sync::{mpsc, oneshot, watch};

use super::owner::Msg;
use crate::{
    config::Config,
    members::{
        config::MembersConfig,
        roster::{Heard, Roster},
        wire::{self, Announcement, F_HELLO, F_LEAVING, F_SYNC, Instance},
    },
    sync::{
        config::KeyRing,
        replay::{Counter, Window},
    },
};

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// This node's VRRP instances as announced: the unicast ones (a multicast instance needs no
/// peer list).
pub fn own_instances(cfg: &Config) -> Vec<Instance> {
    cfg.vrrp
        .iter()
        .filter(|r| !r.unicast_peers.is_empty())
        .filter_map(|r| r.unicast_src.map(|addr| Instance { vrid: r.vrid, addr }))
        .collect()
}

/// The rendered peers (VRRP and sync): announced to always, and waited for at start.
pub fn floor(cfg: &Config) -> Vec<IpAddr> {
    let mut v: BTreeSet<IpAddr> = cfg
        .vrrp
        .iter()
        .flat_map(|r| r.unicast_peers.iter().copied())
        .collect();
    if let Some(s) = &cfg.sync {
        v.extend(s.peers.iter().copied());
    }
    v.into_iter().collect()
}

pub struct MembersHandle {
    joined: watch::Receiver<bool>,
    leave: mpsc::Sender<oneshot::Sender<()>>,
}

impl MembersHandle {
    /// Read the keys, bind the port and start announcing. Errors name the field.
    pub fn spawn(
        cfg: &Config,
        m: &MembersConfig,
        owner: mpsc::UnboundedSender<Msg>,
    ) -> Result<MembersHandle> {
        let ring = KeyRing::read("members", &m.key_file, &m.accept_key_files)?;
        let sock = bind(m).with_context(|| format!("members.port: binding UDP {}", m.port))?;
        let (joined_tx, joined) = watch::channel(false);
        let (leave, leave_rx) = mpsc::channel(1);
        let floor = floor(cfg);
        if floor.is_empty() {
            let _ = joined_tx.send(true);
        }
        let task = Task {
            cfg: m.clone(),
            keys: ring.accepted().map(wire::key).collect(),
            sock,
            instances: own_instances(cfg),
            sync: cfg.sync.is_some(),
            floor,
            roster: Roster::default(),
            windows: HashMap::new(),
            counter: Counter::default(),
            answered: BTreeSet::new(),
            joined: joined_tx,
            owner,
        };
        tokio::spawn(task.run(leave_rx));
        Ok(MembersHandle { joined, leave })
    }

    /// Until every floor peer has answered, or `limit`.
    pub async fn joined(&self, limit: Duration) {
        let mut j = self.joined.clone();
        if tokio::time::timeout(limit, j.wait_for(|j| *j))
            .await
            .is_err()
        {
            tracing::warn!(
                ?limit,
                "members: not every rendered peer answered; starting VRRP anyway"
            );
        }
    }

    /// Tell every node this one is stopping (after its VRRP instances resigned).
    pub async fn leave(&self, limit: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.leave.send(tx).await.is_ok() {
            let _ = tokio::time::timeout(limit, rx).await;
        }
    }
}

fn bind(m: &MembersConfig) -> Result<tokio::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let addr = match m.listen {
        Some(a) => SocketAddr::new(a, m.port),
        None => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), m.port),
    };
    // A host booted without IPv6 has no AF_INET6 sockets: 0.0.0.0 then, as the sync does.
    let (s, addr) = match Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)) {
        Err(e) if m.listen.is_none() && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => (
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?,
            SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), m.port),
        ),
        r => (r?, addr),
    };
    if addr.is_ipv6() && m.listen.is_none() {
        s.set_only_v6(false)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(tokio::net::UdpSocket::from_std(s.into())?)
}

struct Task {
    cfg: MembersConfig,
    keys: Vec<ring::hmac::Key>,
    sock: tokio::net::UdpSocket,
    instances: Vec<Instance>,
    sync: bool,
    floor: Vec<IpAddr>,
    roster: Roster,
    /// Replay windows by sender (kept after a member leaves: an old announcement of it
    /// replayed within the freshness bound is still refused).
    windows: HashMap<IpAddr, Window>,
    counter: Counter,
    /// Floor peers heard from since start.
    answered: BTreeSet<IpAddr>,
    joined: watch::Sender<bool>,
    owner: mpsc::UnboundedSender<Msg>,
}

impl Task {
    async fn run(mut self, mut leave: mpsc::Receiver<oneshot::Sender<()>>) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.announce_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = vec![0u8; wire::MAX_DATAGRAM + 1];
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if self.roster.expire(unix_us(), self.cfg.expire_ms * 1000) {
                        self.tell_owner();
                    }
                    let to = self.known();
                    let flags = if *self.joined.borrow() { 0 } else { F_HELLO };
                    self.announce(flags, &to).await;
                }
                r = self.sock.recv_from(&mut buf) => match r {
                    Ok((n, from)) => {
                        let from = from.ip().to_canonical();
                        if let Some(reply) = self.received(&buf[..n], from) {
                            self.announce(reply, &[from]).await;
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "members: receive"),
                },
                l = leave.recv() => {
                    let to = self.known();
                    self.announce(F_LEAVING, &to).await;
                    if let Some(done) = l {
                        let _ = done.send(());
                    }
                    return;
                }
            }
        }
    }

    /// The floor and the learned members.
    fn known(&self) -> Vec<IpAddr> {
        let mut v = self.floor.clone();
        for a in self.roster.addresses() {
            if !v.contains(&a) {
                v.push(a);
            }
        }
        v
    }

    fn tell_owner(&self) {
        let _ = self.owner.send(Msg::Members(Box::new(self.roster.clone())));
    }

    async fn announce(&mut self, flags: u8, to: &[IpAddr]) {
        let a = Announcement {
            stamp: self.counter.next_stamp(unix_us()),
            flags: flags | if self.sync { F_SYNC } else { 0 },
            instances: if flags & F_LEAVING != 0 {
                Vec::new()
            } else {
                self.instances.clone()
            },
        };
        let d = wire::seal(&self.keys[0], &a);
        let v6 = self.sock.local_addr().map(|a| a.is_ipv6()).unwrap_or(false);
        for peer in to {
            let dst = match peer {
                IpAddr::V4(v4) if v6 => IpAddr::V6(v4.to_ipv6_mapped()),
                p => *p,
            };
            if let Err(e) = self
                .sock
                .send_to(&d, SocketAddr::new(dst, self.cfg.port))
                .await
            {
                tracing::debug!(%peer, error = %e, "members: send");
            }
        }
    }

    /// An announcement: authentic and fresh, then into the roster. Returns the flags of an
    /// answer to send at once: to a node that just started (it waits for its peers), and to
    /// a member not known before (so it learns this node in the same round trip).
    fn received(&mut self, d: &[u8], from: IpAddr) -> Option<u8> {
        let a = match wire::open(&self.keys, d) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(%from, error = ?e, "members: announcement refused");
                return None;
            }
        };
        if self
            .windows
            .entry(from)
            .or_default()
            .check(a.stamp, unix_us())
            .is_err()
        {
            tracing::debug!(%from, "members: announcement replayed or stale");
            return None;
        }
        let heard = self.roster.heard(from, &a, unix_us());
        if matches!(heard, Heard::Changed | Heard::Left) {
            tracing::info!(%from, change = ?heard, members = self.roster.len(), "members: membership changed");
            self.tell_owner();
        }
        if a.flags & F_LEAVING == 0
            && self.floor.contains(&from)
            && self.answered.insert(from)
            && self.answered.len() == self.floor.len()
        {
            let _ = self.joined.send(true);
        }
        let answer = a.flags & F_HELLO != 0 || heard == Heard::Changed;
        answer.then_some(0)
    }
}
