//! The Maglev tables' memory: `LB_TABLES` mapped into user space.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Result, bail};
use aya::maps::MapData;
use lb_common::maps;

/// The memory-mapped `LB_TABLES` array, seen as a dense run of u32 slots (elements are
/// `[u32; 2]`, exactly 8 bytes, so the kernel adds no padding between them).
pub struct TableMemory {
    ptr: *mut u32,
    len: usize,
    bytes: usize,
}

// The mapping is only touched through &mut Dataplane.
unsafe impl Send for TableMemory {}

impl TableMemory {
    pub fn map(map: &MapData, slots: u32) -> Result<Self> {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let bytes = (slots as usize * 4).div_ceil(page) * page;
        let fd = map.fd().as_fd().as_raw_fd();
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "mmap of {}: {}",
                maps::TABLES,
                std::io::Error::last_os_error()
            );
        }
        Ok(TableMemory {
            ptr: ptr.cast(),
            len: slots as usize,
            bytes,
        })
    }

    pub fn slice(&self, start: usize, len: usize) -> &[u32] {
        assert!(start + len <= self.len);
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }

    pub fn write(&mut self, start: usize, data: &[u32]) {
        assert!(start + data.len() <= self.len);
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(start), data.len()) };
        // The flip of `active_table` that follows is a syscall (a full barrier), but make the
        // ordering explicit: every slot is visible before the table can become live.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for TableMemory {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}
