//! One lbd per config: a second lbd on the same API socket or the same pinned maps would
//! attach over the first one's program, take its socket and run a second VRRP speaker with
//! the same identity. Each lbd holds two `flock`s for its lifetime (released by the kernel
//! when the process exits, however it exits): a lock file next to the API socket, and the pin
//! directory itself. A second lbd that finds either held refuses to start, naming the holder.

use std::{
    io::{Read, Seek, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::{config::Config, dataplane::LoadOptions};

pub struct InstanceLock {
    _files: Vec<std::fs::File>,
}

/// Where the socket's lock lives: next to it (`/run/lbd/lbd.sock` -> `/run/lbd/lbd.lock`).
pub fn lock_path(cfg: &Config) -> PathBuf {
    cfg.api_socket.with_extension("lock")
}

/// Take an exclusive `flock` on `file` without waiting; false when another process holds it.
fn try_flock(file: &std::fs::File) -> Result<bool> {
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e).context("flock")
}

impl InstanceLock {
    /// Lock the API socket's lock file (before anything else is touched), and the pin
    /// directory when it exists already (else see [`InstanceLock::with_pins`]).
    pub fn acquire(cfg: &Config, opts: &LoadOptions) -> Result<InstanceLock> {
        let path = lock_path(cfg);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        if !try_flock(&file)? {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            bail!(
                "another lbd (pid {}) runs with this API socket ({}; lock {}); refusing to start",
                holder.trim(),
                cfg.api_socket.display(),
                path.display()
            );
        }
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        let lock = InstanceLock { _files: vec![file] };
        if opts.pin_dir().is_dir() {
            return lock.with_pins(opts);
        }
        Ok(lock)
    }

    /// Lock the pin directory too (once it exists: the data plane creates it). Locking it
    /// twice from this process is fine (the same holder).
    pub fn with_pins(mut self, opts: &LoadOptions) -> Result<InstanceLock> {
        let dir = opts.pin_dir();
        if self._files.len() > 1 {
            return Ok(self);
        }
        let file = open_dir(&dir)?;
        if !try_flock(&file)? {
            bail!(
                "another lbd uses the pinned maps at {} (name {:?}); refusing to start",
                dir.display(),
                opts.name
            );
        }
        self._files.push(file);
        Ok(self)
    }
}

fn open_dir(dir: &Path) -> Result<std::fs::File> {
    std::fs::File::open(dir).with_context(|| format!("open {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> (Config, LoadOptions) {
        let mut c: Config = toml::from_str("interface = \"eth0\"\n").unwrap();
        c.api_socket = dir.join("lbd.sock");
        let opts = LoadOptions {
            name: "lbtest".into(),
            bpffs_root: dir.join("pins"),
            table_size: c.table_size,
            conntrack_size: c.conntrack_size,
            hash_seed: c.hash_seed,
            syn_flood_rate: c.syn_flood_rate,
        };
        (c, opts)
    }

    #[test]
    fn a_second_holder_of_the_socket_or_the_pins_is_refused() {
        let dir = std::env::temp_dir().join(format!("lb-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("pins/lbtest")).unwrap();
        let (c, opts) = cfg(&dir);
        let first = InstanceLock::acquire(&c, &opts).unwrap();
        assert_eq!(first._files.len(), 2, "socket and pins locked");
        // flock locks belong to the open file: a second open is a second holder.
        let e = InstanceLock::acquire(&c, &opts).err().unwrap().to_string();
        assert!(e.contains("another lbd"), "{e}");
        assert!(
            e.contains(&std::process::id().to_string()),
            "names the holder: {e}"
        );
        // Another socket, the same pins.
        let mut other = c.clone();
        other.api_socket = dir.join("other.sock");
        let e = InstanceLock::acquire(&other, &opts)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("pinned maps"), "{e}");
        drop(first);
        assert!(
            InstanceLock::acquire(&c, &opts).is_ok(),
            "free once the holder is gone"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
