//! Whole-map reads in batches (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6 and later): one syscall for
//! thousands of entries of a hash map, instead of two per entry (the next key, then its value)
//! as a key walk costs. The connection table's walks (the sync's scan, `lbctl flows`, the
//! entry count) read up to hundreds of thousands of entries this way.
//!
//! aya has no batch operations, so this is the raw `bpf(2)` call; a kernel that refuses it
//! (`EINVAL`, `ENOTSUPP`) makes [`for_each`] say so and the caller walk keys instead.

use std::os::fd::{AsRawFd, BorrowedFd};

use anyhow::{Result, bail};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// The kernel's internal "not supported" (not in libc).
const ENOTSUPP: i32 = 524;
/// Entries asked for per call (grown if one hash bucket holds more: `ENOSPC`).
const CHUNK: usize = 4096;

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of the hash map `fd` (keys `K`, values `V`: the map's own sizes, plain data),
/// until `f` returns false. `Ok(false)`: this kernel has no batch lookup for the map and
/// nothing was read. Entries written or removed meanwhile may or may not be seen (as in a key
/// walk); none is seen twice.
pub fn for_each<K: Copy, V: Copy>(
    fd: BorrowedFd,
    mut f: impl FnMut(&K, &V) -> bool,
) -> Result<bool> {
    let (ks, vs) = (size_of::<K>(), size_of::<V>());
    let mut chunk = CHUNK;
    let mut keys = vec![0u8; chunk * ks];
    let mut values = vec![0u8; chunk * vs];
    // The position token (a bucket number for hash maps; 8 bytes is room for any).
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &token_in as *const u64 as u64
            },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: the attribute points at buffers of `count` keys and values of the map's
        // sizes and at the tokens, all alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>() as u32,
            )
        };
        let err = (r < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        match err {
            None | Some(libc::ENOENT) => {}
            Some(libc::ENOSPC) if chunk < (1 << 20) => {
                // A bucket holds more entries than asked for: ask for more.
                chunk *= 4;
                keys.resize(chunk * ks, 0);
                values.resize(chunk * vs, 0);
                continue;
            }
            Some(e) if first && (e == libc::EINVAL || e == ENOTSUPP || e == libc::EOPNOTSUPP) => {
                return Ok(false);
            }
            Some(e) => bail!("batch lookup: {}", std::io::Error::from_raw_os_error(e)),
        }
        for i in 0..attr.count as usize {
            // SAFETY: the kernel wrote `count` whole keys and values; read unaligned copies.
            let (k, v) = unsafe {
                (
                    keys.as_ptr().add(i * ks).cast::<K>().read_unaligned(),
                    values.as_ptr().add(i * vs).cast::<V>().read_unaligned(),
                )
            };
            if !f(&k, &v) {
                return Ok(true);
            }
        }
        if err == Some(libc::ENOENT) {
            return Ok(true);
        }
        token_in = token_out;
        first = false;
    }
}
