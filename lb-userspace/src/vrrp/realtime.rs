//! Real-time scheduling for a VRRP instance's thread. Each instance runs on its own OS thread
//! (see `instance.rs`); that thread asks for `SCHED_RR`, as keepalived's VRRP process does
//! (`vrrp_rt_priority`), so an advert goes out and a received one is read on time even when
//! every core is busy with normal-priority work: a master late by more than the backups' skew
//! is taken for dead (a false failover), and a backup that reads an advert late takes over
//! from a live master. The thread sleeps between adverts, so it costs no CPU time of its own;
//! the kernel's real-time throttling (`sched_rt_runtime_us`, 95 % by default) still bounds it
//! if it ever spun.

use std::io;

pub use lb_core::config::{DEFAULT_RT_PRIORITY, MAX_RT_PRIORITY};

/// What the calling thread runs under after [`set_current_thread`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sched {
    /// `SCHED_RR` at this priority.
    RoundRobin(u8),
    /// Normal scheduling, as asked (`vrrp_rt_priority = 0`).
    Normal,
}

/// Put the calling thread (not the process) under `SCHED_RR` at `priority`; 0 leaves it as it
/// is. Threads and processes it starts later get normal scheduling (`SCHED_RESET_ON_FORK`),
/// so nothing else inherits the priority by accident. Fails without `CAP_SYS_NICE` (or an
/// `RLIMIT_RTPRIO` that allows it); the thread then keeps its normal scheduling.
pub fn set_current_thread(priority: u8) -> io::Result<Sched> {
    if priority == 0 {
        return Ok(Sched::Normal);
    }
    if priority > MAX_RT_PRIORITY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("real-time priority must be 1..={MAX_RT_PRIORITY}, got {priority}"),
        ));
    }
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let rc =
        unsafe { libc::sched_setscheduler(0, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Sched::RoundRobin(priority))
}

/// The calling thread's policy without the reset-on-fork flag (`libc::SCHED_*`).
pub fn current_policy() -> io::Result<i32> {
    // SAFETY: pid 0 is the calling thread; no pointers.
    let p = unsafe { libc::sched_getscheduler(0) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p & !libc::SCHED_RESET_ON_FORK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_keeps_normal_scheduling() {
        std::thread::spawn(|| {
            let before = current_policy().unwrap();
            assert_eq!(set_current_thread(0).unwrap(), Sched::Normal);
            assert_eq!(current_policy().unwrap(), before);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn out_of_range_is_refused_without_a_change() {
        std::thread::spawn(|| {
            let e = set_current_thread(MAX_RT_PRIORITY + 1).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert_eq!(current_policy().unwrap(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    /// What the call reports is what the thread runs under, whether or not this test may raise
    /// it (root, or CAP_SYS_NICE); only that thread changes, and threads it starts do not
    /// inherit the priority.
    #[test]
    fn only_the_calling_thread_runs_round_robin() {
        std::thread::spawn(|| {
            match set_current_thread(DEFAULT_RT_PRIORITY) {
                Ok(s) => {
                    assert_eq!(s, Sched::RoundRobin(DEFAULT_RT_PRIORITY));
                    assert_eq!(current_policy().unwrap(), libc::SCHED_RR);
                    // SAFETY: reads this thread's parameters into a local.
                    let mut p = libc::sched_param { sched_priority: 0 };
                    assert_eq!(unsafe { libc::sched_getparam(0, &mut p) }, 0);
                    assert_eq!(p.sched_priority, i32::from(DEFAULT_RT_PRIORITY));
                    let child = std::thread::spawn(|| current_policy().unwrap());
                    assert_eq!(child.join().unwrap(), libc::SCHED_OTHER);
                }
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
                    assert_eq!(current_policy().unwrap(), libc::SCHED_OTHER);
                }
            }
        })
        .join()
        .unwrap();
        // The test's own thread was never touched.
        assert_eq!(current_policy().unwrap(), libc::SCHED_OTHER);
    }
}
