//! The Maglev tables' memory: `LB_TABLES` mapped into user space.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Result, bail};
use aya::maps::MapData;
use lb_common::maps;

/// A `BPF_F_MMAPABLE` array's values mapped into this process (shared with the kernel: what
/// a program writes is seen here at once, and what is written here by the program).
pub struct Mapping {
    ptr: *mut u8,
    bytes: usize,
}

// The memory is the kernel's map, alive while mapped; readers and writers keep their own
// discipline (the Maglev tables are written only through &mut Dataplane, flow cache lines are
// read with their check words).
unsafe impl Send for Mapping {}

impl Mapping {
    /// Map the first `len` bytes (rounded up to pages) of `map`'s values; `name` is for the
    /// error.
    pub fn new(map: &MapData, name: &str, len: usize, writable: bool) -> Result<Mapping> {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let bytes = len.div_ceil(page).max(1) * page;
        let fd = map.fd().as_fd().as_raw_fd();
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), bytes, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            bail!("mmap of {name}: {}", std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            bytes,
        })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

/// The memory-mapped `LB_TABLES` array, seen as a dense run of u32 slots (elements are
/// `[u32; 2]`, exactly 8 bytes, so the kernel adds no padding between them).
pub struct TableMemory {
    mem: Mapping,
    len: usize,
}

impl TableMemory {
    pub fn map(map: &MapData, slots: u32) -> Result<Self> {
        let mem = Mapping::new(map, maps::TABLES, slots as usize * 4, true)?;
        Ok(TableMemory {
            mem,
            len: slots as usize,
        })
    }

    fn ptr(&self) -> *mut u32 {
        self.mem.ptr().cast()
    }

    pub fn slice(&self, start: usize, len: usize) -> &[u32] {
        assert!(start + len <= self.len);
        unsafe { std::slice::from_raw_parts(self.ptr().add(start), len) }
    }

    pub fn write(&mut self, start: usize, data: &[u32]) {
        assert!(start + data.len() <= self.len);
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(start), data.len()) };
        // The flip of `active_table` that follows is a syscall (a full barrier), but make the
        // ordering explicit: every slot is visible before the table can become live.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}
