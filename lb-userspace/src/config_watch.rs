//! lbd notices its config file changing and reloads it, so a rendered config that the
//! machine-config-operator writes (a scale-up, a peer list change) applies without anyone
//! running `lbctl reload` and without a reboot; and a node whose address is in none of the
//! rendered configs waits, up and not ready, saying why, instead of crash-looping.
//!
//! inotify directly (libc, which lbd links already, and tokio's `AsyncFd`), not the `notify`
//! crate: lbd runs on Linux only and needs one directory watched; `notify`'s portability layer,
//! its own thread and its extra dependencies buy nothing here.
//!
//! The directory is watched, not the file: the MCO (and editors, and `kubectl cp`) replace a
//! file by renaming a new one over it, which a watch on the file itself never sees. A burst of
//! events is coalesced ([`SETTLE`]) and the reload is asked for only when the file's bytes
//! differ from the last ones seen, so rewriting identical contents (every MCO sync) does
//! nothing.

use std::{
    ffi::{OsStr, OsString},
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::io::unix::AsyncFd;

/// Quiet time after the last event before the file is read: a writer's create, write and
/// rename arrive as one change.
pub const SETTLE: Duration = Duration::from_millis(200);

/// Events that can change what the file holds. `IN_MODIFY`: each write of a slow writer in
/// place restarts the quiet time, so the file is not read halfway (a TOML cut at a table
/// boundary parses, and drops what the rest held).
const MASK: u32 = libc::IN_CLOSE_WRITE
    | libc::IN_MODIFY
    | libc::IN_MOVED_TO
    | libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_ATTRIB;

/// An inotify watch on one directory.
pub struct DirWatch {
    fd: AsyncFd<OwnedFd>,
    dir: PathBuf,
}

impl DirWatch {
    pub fn new(dir: &Path) -> io::Result<DirWatch> {
        // SAFETY: plain syscalls; the fd is owned by OwnedFd from here on.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), MASK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the OwnedFd is moved in and only closed when the AsyncFd drops it.
        Ok(DirWatch {
            fd: unsafe { AsyncFd::register(fd) }?,
            dir: dir.to_owned(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The names of the next batch of events (an overflow reads as a change of everything:
    /// `None` in the list).
    pub async fn next(&self) -> io::Result<Vec<Option<OsString>>> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut buf = [0u8; 4096];
            let n = unsafe {
                libc::read(
                    self.fd.get_ref().as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    guard.clear_ready();
                    continue;
                }
                return Err(e);
            }
            return Ok(parse_events(&buf[..n as usize]));
        }
    }

    /// Wait for an event about `name` (or an overflow), then for [`SETTLE`] of quiet.
    pub async fn changed(&self, name: &OsStr) -> io::Result<()> {
        loop {
            let names = self.next().await?;
            if names.iter().any(|n| n.as_deref().is_none_or(|n| n == name)) {
                break;
            }
        }
        loop {
            match tokio::time::timeout(SETTLE, self.next()).await {
                Err(_) => return Ok(()),
                Ok(r) => {
                    r?;
                }
            }
        }
    }
}

/// The file names in a buffer of `struct inotify_event`s; `None` for a queue overflow. Pure.
pub fn parse_events(buf: &[u8]) -> Vec<Option<OsString>> {
    use std::os::unix::ffi::OsStrExt;
    const HDR: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    let mut at = 0;
    while at + HDR <= buf.len() {
        // wd (i32), mask (u32), cookie (u32), len (u32), then `len` bytes of NUL-padded name.
        let word = |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap());
        let mask = word(4);
        let len = word(12) as usize;
        let end = (at + HDR + len).min(buf.len());
        let name = &buf[at + HDR..end];
        let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
        if mask & libc::IN_Q_OVERFLOW != 0 {
            out.push(None);
        } else if !name.is_empty() {
            out.push(Some(OsStr::from_bytes(name).to_owned()));
        }
        at = end;
    }
    out
}

/// Whether a reload is due: the file's bytes now (`None`: unreadable, e.g. between a delete and
/// a rename) differ from the last ones a reload was asked for. Pure.
pub fn reload_due(last: &Option<Vec<u8>>, now: &Option<Vec<u8>>) -> bool {
    now.is_some() && now != last
}

/// Watch `file` and call `on_change` (e.g. send the owner a reload message) each time its
/// contents change. Runs until `on_change` returns false; a watch that cannot be set up is
/// logged and the task ends (lbd runs on, reloading on SIGHUP and `lbctl reload` only).
pub async fn watch_file(file: PathBuf, mut on_change: impl FnMut() -> bool) {
    let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let watch = match DirWatch::new(dir) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config file; reload with SIGHUP or `lbctl reload`");
            return;
        }
    };
    tracing::info!(file = %file.display(), "watching the config file; a change reloads it");
    let mut last = std::fs::read(&file).ok();
    loop {
        if let Err(e) = watch.changed(name).await {
            tracing::warn!(error = %e, "config file watch failed; reload with SIGHUP or `lbctl reload`");
            return;
        }
        let now = std::fs::read(&file).ok();
        if reload_due(&last, &now) {
            tracing::info!(file = %file.display(), "config file changed; reloading");
            last = now;
            if !on_change() {
                return;
            }
        }
    }
}

/// Until this host's config appears in `dir` (a directory of rendered configs, see
/// [`crate::config::node::node_config_path`]): stay up, not ready, and say why, in the log and on
/// the API socket (`lbctl` shows it; `/healthz` is fine so kubelet does not restart us,
/// `/readyz` is not). Looks again on every change in `dir` and every [`RETRY`] (the host's
/// addresses may change too). Returns the config's path.
pub async fn wait_for_node_config(dir: PathBuf, why: String) -> PathBuf {
    let waiting = std::sync::Arc::new(Waiting {
        why: std::sync::Mutex::new(why.clone()),
    });
    tracing::error!(dir = %dir.display(), why = %why, "this node has no config in the directory; waiting for one (not ready)");
    let socket = api_socket_of(&dir);
    let server = tokio::spawn(crate::api::serve_unix(socket.clone(), waiting.clone()));
    let watch = DirWatch::new(&dir)
        .map_err(|e| tracing::warn!(error = %e, "cannot watch {}; looking every {RETRY:?}", dir.display()))
        .ok();
    let mut last = why;
    let path = loop {
        match &watch {
            Some(w) => {
                let _ = tokio::time::timeout(RETRY, w.next()).await;
                tokio::time::sleep(SETTLE).await;
            }
            None => tokio::time::sleep(RETRY).await,
        }
        match crate::config::node::node_config_path(&dir) {
            Ok(p) => break p,
            Err(e) => {
                let now = e.to_string();
                if now != last {
                    tracing::error!(dir = %dir.display(), why = %now, "still no config for this node (not ready)");
                    *waiting.why.lock().unwrap_or_else(|p| p.into_inner()) = now.clone();
                    last = now;
                }
            }
        }
    };
    server.abort();
    let _ = server.await;
    let _ = std::fs::remove_file(&socket);
    tracing::info!(config = %path.display(), "this node's config appeared; starting");
    path
}

/// How often a waiting node looks again without a change in the directory.
pub const RETRY: Duration = Duration::from_secs(10);

/// The API socket the rendered configs in `dir` name (they all name the same one), or lbd's
/// default.
fn api_socket_of(dir: &Path) -> PathBuf {
    #[derive(serde::Deserialize)]
    struct Socket {
        api_socket: Option<PathBuf>,
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("toml"))
        .collect();
    files.sort();
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|t| toml::from_str::<Socket>(&t).ok())
        .find_map(|s| s.api_socket)
        .unwrap_or_else(|| "/run/lbd/lbd.sock".into())
}

/// The API of a node waiting for its config: alive, not ready, every request answered with why.
struct Waiting {
    why: std::sync::Mutex<String>,
}

impl crate::api::Handler for Waiting {
    async fn handle(self: &std::sync::Arc<Self>, req: crate::api::Request) -> crate::api::Response {
        use crate::api::{Request, Response};
        let why = format!(
            "not ready: no config for this node: {}",
            self.why.lock().unwrap_or_else(|p| p.into_inner())
        );
        match req {
            Request::Healthz => Response::text(200, "ok (waiting for this node's config)\n".into()),
            Request::Readyz => Response::text(503, format!("{why}\n")),
            _ => Response::error(503, why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(mask: u32, name: &str) -> Vec<u8> {
        let mut padded = name.as_bytes().to_vec();
        if !padded.is_empty() {
            padded.resize(name.len().div_ceil(16) * 16 + 16, 0);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&1i32.to_ne_bytes());
        b.extend_from_slice(&mask.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&(padded.len() as u32).to_ne_bytes());
        b.extend_from_slice(&padded);
        b
    }

    #[test]
    fn events_parse_to_names_and_overflow() {
        let mut buf = event(libc::IN_MOVED_TO, "master-0.toml");
        buf.extend(event(libc::IN_Q_OVERFLOW, ""));
        buf.extend(event(libc::IN_CLOSE_WRITE, "x"));
        let got = parse_events(&buf);
        assert_eq!(got, [Some("master-0.toml".into()), None, Some("x".into())]);
        // A truncated tail is ignored, never read past.
        assert_eq!(parse_events(&buf[..10]), Vec::<Option<OsString>>::new());
    }

    #[test]
    fn only_new_contents_reload() {
        let a = Some(b"a".to_vec());
        assert!(!reload_due(&a, &a.clone()));
        assert!(reload_due(&a, &Some(b"b".to_vec())));
        // Between a delete and the rename of the new file: wait for the file.
        assert!(!reload_due(&a, &None));
    }

    /// A file replaced by rename (as the MCO writes it), rewritten in place, rewritten with
    /// the same bytes, and another file of the directory changed: one call per new content.
    #[tokio::test]
    async fn a_rename_over_the_file_and_a_rewrite_each_reload_once() {
        let dir = std::env::temp_dir().join(format!("lb-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        std::fs::write(&file, "a").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(watch_file(file.clone(), move || tx.send(()).is_ok()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<()>| {
            let r = rx.try_recv().is_ok();
            while rx.try_recv().is_ok() {}
            r
        };
        let wait = || tokio::time::sleep(SETTLE * 3);
        std::fs::write(dir.join("tmp"), "b").unwrap();
        std::fs::rename(dir.join("tmp"), &file).unwrap();
        wait().await;
        assert!(next(&mut rx), "rename over the file");
        std::fs::write(&file, "c").unwrap();
        wait().await;
        assert!(next(&mut rx), "rewrite in place");
        std::fs::write(&file, "c").unwrap();
        wait().await;
        assert!(!next(&mut rx), "same bytes");
        std::fs::write(dir.join("other.toml"), "x").unwrap();
        wait().await;
        assert!(!next(&mut rx), "another file");
        task.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A writer that rewrites the file in place slowly (chunks 20 ms apart, well within
    /// [`SETTLE`]) after another change started the quiet time: the file is read whole.
    #[tokio::test]
    async fn a_slow_writer_in_place_is_read_whole() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("lb-watch-slow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        std::fs::write(&file, "old").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let f = file.clone();
        let task = tokio::spawn(watch_file(file.clone(), move || {
            tx.send(std::fs::read_to_string(&f).unwrap_or_default())
                .is_ok()
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let chunks: Vec<String> = (0..30).map(|i| format!("[[table{i}]]\n")).collect();
        let writer = {
            let (file, chunks) = (file.clone(), chunks.clone());
            std::thread::spawn(move || {
                // An attribute change first (as `install -m` or a chmod would): the watch wakes.
                std::fs::set_permissions(
                    &file,
                    <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644),
                )
                .unwrap();
                let mut w = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&file)
                    .unwrap();
                for c in &chunks {
                    w.write_all(c.as_bytes()).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        tokio::task::spawn_blocking(move || writer.join().unwrap())
            .await
            .unwrap();
        tokio::time::sleep(SETTLE * 3).await;
        let whole = chunks.concat();
        let mut seen = Vec::new();
        while let Ok(text) = rx.try_recv() {
            seen.push(text);
        }
        task.abort();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            seen,
            vec![whole],
            "reloads asked for, with what the file held then"
        );
    }
}
