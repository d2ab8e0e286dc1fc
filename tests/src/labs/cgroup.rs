//! A CPU cgroup of a lab's own for the processes that stand for other machines (the clients).
//!
//! lbd in podman pods runs in podman's cgroups (`libpod_parent/<pod>/<container>`): under the
//! CPU controller the pods count as one party at the top, beside every thread of the host's
//! root cgroup, each of which counts as much. A lab's load generators (clients running flat out
//! from the root cgroup) then starve all three nodes' lbds together: in the pod lab a new VIP
//! owner's table rebuild took seconds (milliseconds on an idle host), its data plane was
//! acknowledged after the 3 s a new master waits, and the announcement reached the local stack,
//! which reset other backends' connections. On a real cluster the clients are other machines.
//! Here they go into one cgroup of their own, so that together they count as one party too,
//! with the default weight. Nothing else is moved; the cgroup is removed on drop (its
//! processes, if any still run, go back to the root first).
//!
//! Cgroup v1 (`/sys/fs/cgroup/cpu`, this machine kind) and v2 (a unified hierarchy with the
//! `cpu` controller) are both handled; without either the helper does nothing and says so.

use std::path::PathBuf;

pub struct ClientCgroup {
    dir: Option<PathBuf>,
    /// Where processes go back to: the hierarchy's root.
    root: PathBuf,
}

impl ClientCgroup {
    pub fn new(tag: &str) -> ClientCgroup {
        let name = crate::unique(&format!("lb-{tag}-clients-"));
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let root = if v1.join("cpu.shares").exists() {
            v1
        } else if std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
        {
            v2
        } else {
            eprintln!("no cpu cgroup controller to use: the lab's clients share the root cgroup");
            return ClientCgroup {
                dir: None,
                root: v2,
            };
        };
        let dir = root.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => ClientCgroup {
                dir: Some(dir),
                root,
            },
            Err(e) => {
                eprintln!(
                    "cgroup {}: {e}; the lab's clients share the root cgroup",
                    dir.display()
                );
                ClientCgroup { dir: None, root }
            }
        }
    }

    /// Move process `pid` (all its threads) into the cgroup; its children follow.
    pub fn adopt(&self, pid: u32) {
        if let Some(dir) = &self.dir
            && let Err(e) = std::fs::write(dir.join("cgroup.procs"), pid.to_string())
        {
            eprintln!("cgroup {}: adopting {pid}: {e}", dir.display());
        }
    }
}

impl Drop for ClientCgroup {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else {
            return;
        };
        let left = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in left.split_whitespace() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&dir);
    }
}
