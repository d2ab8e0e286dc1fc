//! Socket load balancing, user-space side: attach the cgroup hooks of `lb-ebpf/src/sock.rs` to
//! the root of the cgroup v2 hierarchy and tell them which network namespace is this node's.
//!
//! The hooks use the XDP program's maps (the same object), so they see every table, flag and
//! health change the moment the data plane writes it. They are attached through BPF links that
//! only this process holds (never pinned): when `lbd` exits, however it exits, the kernel
//! detaches them and the node's own connections to a VIP go where they went without `lbd`.
//! `lbd teardown` has nothing of theirs to remove beyond the pin directory it removes anyway
//! (`LB_SOCK_REV`, `LB_SOCK_STATS`); the guardian never holds the links (BPF fds are
//! close-on-exec).

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::Array,
    programs::{CgroupAttachMode, CgroupSockAddr},
};
use lb_common::{SOCK_F_ENABLED, SockConfig, maps};

/// Where cgroup v2 is mounted, from `/proc/self/mountinfo` (any part of the hierarchy: which
/// one is the root is decided by `is_root`, since a mount's root path is shown relative to the
/// reader's cgroup namespace).
pub fn cgroup2_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            if fs.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let point = mount.split_whitespace().nth(4)?;
            Some(PathBuf::from(unescape(point)))
        })
        .collect()
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a cgroup v2 directory is the root of the hierarchy: every cgroup but the root has
/// `cgroup.type`, whatever cgroup namespace looks at it (the root of a container's namespace
/// has it too).
fn is_root(dir: &OwnedFd) -> bool {
    let name = CString::new("cgroup.type").expect("no NUL");
    // SAFETY: a plain syscall on an fd we hold.
    unsafe { libc::faccessat(dir.as_raw_fd(), name.as_ptr(), libc::F_OK, 0) != 0 }
}

/// A directory fd of the root of the host's cgroup v2 hierarchy: a mount of it if there is one
/// (a container may have the host's /sys/fs/cgroup as a hostPath), else a mount of our own
/// that is never attached to the file tree (`fsopen`/`fsmount`), so a host whose
/// /sys/fs/cgroup is v1 or hybrid gets no new mount point and nothing is left when we exit. In
/// a cgroup namespace of its own (a container) such a mount shows only the container's part of
/// the hierarchy: then it is made in the host's cgroup namespace, reached through PID 1 (a pod
/// with `hostPID`), or refused, never attached to a part of the hierarchy.
fn open_cgroup2_root() -> Result<OwnedFd> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("read mountinfo")?;
    for path in cgroup2_mounts(&info) {
        if let Ok(f) = std::fs::File::open(&path) {
            let fd = OwnedFd::from(f);
            if is_root(&fd) {
                return Ok(fd);
            }
        }
    }
    let own = detached_cgroup2_mount()?;
    if is_root(&own) {
        return Ok(own);
    }
    // Namespaces are per thread: join the host's on a thread of its own for the mount.
    let host = std::thread::spawn(|| -> Result<OwnedFd> {
        let ns = std::fs::File::open("/proc/1/ns/cgroup").context("open /proc/1/ns/cgroup")?;
        // SAFETY: a plain syscall on an fd we hold.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWCGROUP) } != 0 {
            bail!(
                "join its cgroup namespace: {}",
                std::io::Error::last_os_error()
            );
        }
        detached_cgroup2_mount()
    })
    .join()
    .map_err(|_| anyhow!("the cgroup mount thread panicked"))?;
    match host {
        Ok(fd) if is_root(&fd) => Ok(fd),
        other => bail!(
            "lbd runs in a cgroup namespace of its own, whose cgroup v2 root covers only its \
             container, and cannot reach the host's (PID 1: {}); give the pod the host's \
             /sys/fs/cgroup (cgroup v2) or hostPID (see docs/operations.md)",
            match other {
                Ok(_) => "also a namespace of its own".to_string(),
                Err(e) => format!("{e:#}"),
            }
        ),
    }
}

fn detached_cgroup2_mount() -> Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    let fstype = CString::new("cgroup2")?;
    let err = |what: &str| anyhow!("{what} cgroup2: {}", std::io::Error::last_os_error());
    // SAFETY: plain syscalls; every fd returned is owned right away.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(err("fsopen"));
    }
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc < 0 {
        return Err(err("fsconfig create"));
    }
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) };
    if mnt < 0 {
        return Err(err("fsmount"));
    }
    let mnt = unsafe { OwnedFd::from_raw_fd(mnt as i32) };
    // The mount fd is an O_PATH one; attaching wants the directory opened for real.
    let dot = CString::new(".")?;
    let dir = unsafe {
        libc::openat(
            mnt.as_raw_fd(),
            dot.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(err("open the root of"));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(dir) })
}

/// The cookie of this process's network namespace (what `bpf_get_netns_cookie` returns for
/// its sockets).
pub fn netns_cookie() -> Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let s = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))
        .context("a socket to read the netns cookie")?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: the buffer is a u64 and len says so.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            &mut cookie as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 || cookie == 0 {
        bail!("SO_NETNS_COOKIE: {}", std::io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Whether the hooks are attached (by this process).
pub fn attached(ebpf: &Ebpf) -> bool {
    maps::SOCK_PROGRAMS
        .iter()
        .any(|name| ebpf.program(name).and_then(|p| p.fd().ok()).is_some())
}

/// Load the hooks, point them at this namespace and attach them to the cgroup v2 root. On any
/// failure nothing stays attached.
pub fn attach(ebpf: &mut Ebpf) -> Result<()> {
    if attached(ebpf) {
        return Ok(());
    }
    let cookie = netns_cookie()?;
    let mut config: Array<_, SockConfig> = Array::try_from(
        ebpf.map_mut(maps::SOCK_CONFIG)
            .ok_or_else(|| anyhow!("map {} missing from the object", maps::SOCK_CONFIG))?,
    )?;
    config.set(
        0,
        SockConfig {
            netns_cookie: cookie,
            flags: SOCK_F_ENABLED,
            _pad: 0,
        },
        0,
    )?;
    let result = open_cgroup2_root().and_then(|root| {
        for name in maps::SOCK_PROGRAMS {
            let prog: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow!("program {name} missing"))?
                .try_into()?;
            prog.load()
                .with_context(|| format!("verify and load {name}"))?;
            // A BPF link on a cgroup is always one of many (the kernel refuses the multi flag
            // on links): other programs on the root (systemd's, another lab node's lbd) keep
            // running.
            prog.attach(&root, CgroupAttachMode::Single)
                .with_context(|| format!("attach {name} to the cgroup v2 root"))?;
        }
        Ok(())
    });
    if let Err(e) = result {
        detach(ebpf);
        return Err(e);
    }
    tracing::info!(netns_cookie = cookie, "socket load balancing attached");
    Ok(())
}

/// Detach and unload the hooks (their links close with them).
pub fn detach(ebpf: &mut Ebpf) {
    if let Some(map) = ebpf.map_mut(maps::SOCK_CONFIG)
        && let Ok(mut config) = Array::<_, SockConfig>::try_from(map)
    {
        let _ = config.set(0, SockConfig::default(), 0);
    }
    for name in maps::SOCK_PROGRAMS {
        if let Some(p) = ebpf.program_mut(name)
            && let Ok(p) = <&mut CgroupSockAddr>::try_from(p)
            && p.fd().is_ok()
        {
            let _ = p.unload();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_cgroup2_mount_points_only() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                      40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n";
        assert!(cgroup2_mounts(hybrid).is_empty());
        let both = format!(
            "{hybrid}50 31 0:40 /../.. /host/cgroup rw - cgroup2 cgroup2 rw\n\
             41 31 0:38 / /sys/fs/cgroup/un\\040ified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
        );
        assert_eq!(
            cgroup2_mounts(&both),
            vec![
                PathBuf::from("/host/cgroup"),
                PathBuf::from("/sys/fs/cgroup/un ified")
            ]
        );
    }

    #[test]
    fn unescape_leaves_other_backslashes() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("a\\9b"), "a\\9b");
        assert_eq!(unescape("end\\04"), "end\\04");
    }
}
