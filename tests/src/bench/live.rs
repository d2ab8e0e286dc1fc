//! The few system calls the throughput bench needs that aya 0.14 and std do not offer:
//! BPF_PROG_TEST_RUN in live-frames mode (aya's `TestRunOptions` has no flags, ctx_in or
//! batch_size), entering a network namespace on the current thread, and CPU pinning.
//! All of the bench's unsafe code is here.

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd, RawFd},
};

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// The `test` member of `union bpf_attr` (include/uapi/linux/bpf.h), up to `batch_size`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// `struct xdp_md` as user space passes it in ctx_in.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// Run the XDP program `prog_fd` `repeat` times on real frames built from `frame`, as if they had
/// arrived on `ifindex` (in the calling thread's network namespace): a verdict of XDP_TX sends
/// them out of that interface. Frames go in batches of `batch_size`.
pub fn xdp_live_frames(
    prog_fd: RawFd,
    frame: &[u8],
    ifindex: u32,
    repeat: u32,
    batch_size: u32,
) -> io::Result<()> {
    let ctx = XdpMd {
        data_end: frame.len() as u32,
        ingress_ifindex: ifindex,
        ..Default::default()
    };
    let mut attr = TestRunAttr {
        prog_fd: prog_fd as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: &ctx as *const XdpMd as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size,
        ..Default::default()
    };
    // SAFETY: attr, frame and ctx outlive the call; the kernel reads at most `size` bytes of attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Move the calling thread into the network namespace at `path` (e.g. /run/netns/NAME).
/// Returns the namespace it was in, for [`restore_netns`].
pub fn enter_netns(path: &str) -> io::Result<File> {
    let old = File::open("/proc/thread-self/ns/net")?;
    let new = File::open(path)?;
    set_netns(&new)?;
    Ok(old)
}

pub fn restore_netns(old: File) -> io::Result<()> {
    set_netns(&old)
}

fn set_netns(ns: &File) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Pin thread or process `pid` (0: the calling thread) to `cpu`.
pub fn pin_to_cpu(pid: i32, cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The interface index of `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: c is a valid NUL-terminated string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// Give thread `pid` a real-time priority (SCHED_FIFO), so that a kernel thread that only runs
/// while there is traffic (a NAPI thread) is not time-sliced with other work on its CPU.
pub fn realtime(pid: i32, priority: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: plain syscall with a valid parameter block.
    if unsafe { libc::sched_setscheduler(pid, libc::SCHED_FIFO, &p) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// BPF_MAP_LOOKUP_ELEM on map `fd`: the value bytes (`value_len` of them; for a per-CPU map
/// that is one rounded-up value per possible CPU), or None if the key is absent.
pub fn map_lookup(fd: RawFd, key: &[u8], value_len: usize) -> Option<Vec<u8>> {
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let mut value = vec![0u8; value_len];
    let mut attr = Attr {
        map_fd: fd as u32,
        _pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_mut_ptr() as u64,
        flags: 0,
    };
    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    // SAFETY: key and value are live buffers of the sizes the map was created with (the caller
    // passes the map's key size and its full value size).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_ELEM,
            &mut attr as *mut Attr,
            std::mem::size_of::<Attr>() as u32,
        )
    };
    (rc == 0).then_some(value)
}
