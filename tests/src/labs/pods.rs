//! lbd as the static pods of deploy/, run by podman on lab nodes.
//!
//! The manifests are the ones `cargo xtask image` wrote next to the image (deploy/*.yaml with
//! the image named by digest). The lab changes only what many nodes on one host cannot share:
//! the pod's name, and the hostPath directories for /etc/lb and /run/lbd (one per node). Host
//! networking, privilege, the bpffs and /run mounts, probes and the image stay as shipped. The
//! container's `ports` list (the metrics port the Service targets by name) is left out: podman
//! 4.3 refuses port declarations with host networking ("PortMappings can only be used with
//! Bridge or slirp4netns networking"), which Kubernetes accepts; nothing in these labs uses it.
//!
//! Every podman command that creates or starts a container runs inside the node's network
//! namespace through `nsenter --net` (host networking means "the namespace podman runs in");
//! `ip netns exec` cannot be used: it remounts /sys, and podman then finds no cgroup fs.
//! Podman on this machine kind needs tests/podman/containers.conf (runc, ulimits).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use crate::lab::{Lab, wait_for};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    Worker,
}

impl Role {
    fn manifest(self) -> &'static str {
        match self {
            Role::ControlPlane => "lb-control-plane.yaml",
            Role::Worker => "lb-worker.yaml",
        }
    }
}

struct Played {
    node: String,
    netns: String,
    yaml: PathBuf,
}

/// The pods this test started; all removed on drop (with the images it built).
pub struct Pods {
    image_dir: PathBuf,
    prefix: String,
    dir: PathBuf,
    played: Vec<Played>,
    built: Vec<String>,
}

fn workspace() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap().to_path_buf()
}

fn containers_conf() -> PathBuf {
    std::env::var_os("CONTAINERS_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("tests/podman/containers.conf"))
}

/// `podman` with this machine kind's settings.
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", containers_conf());
    c
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl Pods {
    /// The image of the binaries under test: LB_IMAGE_DIR (set by `cargo xtask test`), or
    /// target/image/debug, built with `cargo xtask image --debug` when missing or older than
    /// the lbd binary under test (a test must never run yesterday's lbd).
    pub fn new(tag: &str) -> Pods {
        let image_dir = std::env::var_os("LB_IMAGE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target/image/debug"));
        let stamp = image_dir.join("image.txt");
        let stale = match (modified(&stamp), modified(&crate::bin_dir().join("lbd"))) {
            (Some(image), Some(bin)) => image < bin,
            (None, _) => true,
            _ => false,
        };
        let exists = std::fs::read_to_string(&stamp)
            .ok()
            .map(|r| {
                podman()
                    .args(["image", "exists", r.trim()])
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false)
            })
            .unwrap_or(false);
        if stale || !exists {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = Command::new(cargo)
                .current_dir(workspace())
                .args(["xtask", "image", "--debug"])
                .status()
                .expect("run cargo xtask image --debug");
            assert!(st.success(), "cargo xtask image --debug failed");
        }
        let prefix = crate::unique(tag);
        let dir = std::env::temp_dir().join(format!("{prefix}-pods"));
        std::fs::create_dir_all(&dir).unwrap();
        Pods {
            image_dir,
            prefix,
            dir,
            played: Vec::new(),
            built: Vec::new(),
        }
    }

    /// The image reference (by digest) the manifests name.
    pub fn image(&self) -> String {
        std::fs::read_to_string(self.image_dir.join("image.txt"))
            .expect("image.txt")
            .trim()
            .to_string()
    }

    pub fn pod(&self, node: &str) -> String {
        format!("{}-{node}", self.prefix)
    }

    /// The lbd container (podman names it `<pod>-<container>`).
    pub fn container(&self, node: &str) -> String {
        format!("{}-lbd", self.pod(node))
    }

    /// The shipped manifest for `role`, adapted to `node` of the lab (see the module docs).
    pub fn manifest(&self, node: &str, role: Role, etc: &Path, run: &Path) -> String {
        let path = self.image_dir.join("deploy").join(role.manifest());
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let image = self.image();
        assert!(
            text.contains(&format!("image: {image}")),
            "{} does not name the image under test by digest ({image})",
            path.display()
        );
        let mut named = false;
        let (mut etc_done, mut run_done) = (false, false);
        let mut in_ports = false;
        let out: Vec<String> = text
            .lines()
            .filter(|l| {
                // The container's `ports:` list and its items (see the module docs).
                if l.trim_end() == "    ports:" {
                    in_ports = true;
                    return false;
                }
                in_ports = in_ports && l.starts_with("    - ");
                !in_ports
            })
            .map(|l| {
                if !named && l.starts_with("  name: ") {
                    named = true;
                    return format!("  name: {}", self.pod(node));
                }
                if l.contains("hostPath:") && l.contains("path: /etc/lb,") {
                    etc_done = true;
                    return l.replace("path: /etc/lb,", &format!("path: {},", etc.display()));
                }
                if l.contains("hostPath:") && l.contains("path: /run/lbd,") {
                    run_done = true;
                    return l.replace("path: /run/lbd,", &format!("path: {},", run.display()));
                }
                l.to_string()
            })
            .collect();
        assert!(
            named && etc_done && run_done,
            "{}: expected metadata.name and hostPath {{path: /etc/lb, ...}} / {{path: /run/lbd, ...}} lines; update tests/src/labs/pods.rs with the manifest",
            path.display()
        );
        out.join("\n") + "\n"
    }

    /// `podman kube play` the node's manifest inside the node's network namespace.
    pub fn play(&mut self, lab: &Lab, node: &str, role: Role, etc: &Path, run: &Path) {
        let yaml = self.dir.join(format!("{node}.yaml"));
        std::fs::write(&yaml, self.manifest(node, role, etc, run)).unwrap();
        let netns = lab.node(node).netns.clone();
        let out = self
            .in_node(&netns)
            .args(["kube", "play"])
            .arg(&yaml)
            .output()
            .expect("run podman kube play");
        self.played.push(Played {
            node: node.into(),
            netns,
            yaml,
        });
        assert!(
            out.status.success(),
            "podman kube play for {node} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The node's manifest as last written (what the kubelet would read).
    pub fn manifest_path(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.yaml"))
    }

    /// Replace the node's pod as the kubelet does when its manifest changes: the manifest
    /// rewritten with `image`, the old pod stopped (SIGTERM, its grace period) and the new one
    /// started. The outcome of `podman kube play --replace`, which may fail (an image that
    /// does not start).
    pub fn replace(
        &mut self,
        lab: &Lab,
        node: &str,
        role: Role,
        etc: &Path,
        run: &Path,
        image: &str,
    ) -> Output {
        let text = self.manifest(node, role, etc, run).replace(
            &format!("image: {}", self.image()),
            &format!("image: {image}"),
        );
        let yaml = self.manifest_path(node);
        std::fs::write(&yaml, text).unwrap();
        let netns = lab.node(node).netns.clone();
        self.in_node(&netns)
            .args(["kube", "play", "--replace"])
            .arg(&yaml)
            .output()
            .expect("run podman kube play --replace")
    }

    /// An image that does not start: the image under test with an lbd that is no program (as a
    /// bad build or a corrupt layer would ship). Built locally from the image under test (no
    /// registry), removed on drop.
    pub fn broken_image(&mut self) -> String {
        let ctx = self.dir.join("broken-image");
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::write(ctx.join("lbd"), "not a program\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(ctx.join("lbd"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            ctx.join("Containerfile"),
            format!("FROM {}\nCOPY lbd /usr/local/bin/lbd\n", self.image()),
        )
        .unwrap();
        let tag = format!("localhost/{}-broken:test", self.prefix.to_lowercase());
        let out = podman()
            .args(["build", "--pull=never", "-t", &tag, "-f"])
            .arg(ctx.join("Containerfile"))
            .arg(&ctx)
            .output()
            .expect("run podman build");
        assert!(
            out.status.success(),
            "podman build of the broken image failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.built.push(tag.clone());
        tag
    }

    /// podman, run in `netns` (so host networking means the node's network).
    fn in_node(&self, netns: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{netns}"))
            .arg("--")
            .arg("podman")
            .env("CONTAINERS_CONF", containers_conf());
        c
    }

    fn netns(&self, node: &str) -> &str {
        &self
            .played
            .iter()
            .find(|p| p.node == node)
            .unwrap_or_else(|| panic!("no pod played on {node}"))
            .netns
    }

    /// `podman exec` in the node's lbd container (e.g. `lbctl` inside the pod).
    pub fn exec(&self, node: &str, args: &[&str]) -> Output {
        podman()
            .args(["exec", &self.container(node)])
            .args(args)
            .output()
            .expect("podman exec")
    }

    pub fn inspect(&self, node: &str, format: &str) -> Option<String> {
        let out = podman()
            .args([
                "container",
                "inspect",
                "--format",
                format,
                &self.container(node),
            ])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The host pid of lbd in the node's pod (0 or None when not running).
    pub fn pid(&self, node: &str) -> Option<u32> {
        self.inspect(node, "{{.State.Pid}}")
            .and_then(|p| p.parse().ok())
            .filter(|p| *p != 0)
    }

    /// Exit code of lbd's last run (after a stop).
    pub fn exit_code(&self, node: &str) -> Option<i32> {
        self.inspect(node, "{{.State.ExitCode}}")
            .and_then(|p| p.parse().ok())
    }

    pub fn restart_count(&self, node: &str) -> u64 {
        self.inspect(node, "{{.RestartCount}}")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// Signal lbd (the container's main process) directly, as a crash or the OOM killer would.
    pub fn kill(&self, node: &str, signal: i32) {
        let pid = self.pid(node).expect("lbd running in the pod");
        unsafe { libc::kill(pid as i32, signal) };
    }

    /// Wait until lbd runs again with another pid than `old` (the restart policy at work).
    pub fn wait_restarted(&self, node: &str, old: u32, timeout: Duration) -> Option<u32> {
        wait_for(timeout, || self.pid(node).filter(|p| *p != old))
    }

    /// Stop the pod as kubelet does on a pod restart: SIGTERM to lbd, SIGKILL after `grace`.
    ///
    /// Returns once podman's own cleanup of the run has ended too. `podman pod stop` returns
    /// when the container has exited, but conmon then runs `podman container cleanup`, and a
    /// `kube play` pod has the exit policy `stop`: that cleanup stops the whole pod once its
    /// last container has exited. Run late (a loaded host), it took a `pod start` issued
    /// meanwhile for a pod to stop, and stopped it again: the new container got SIGTERM in its
    /// first milliseconds (podman's events: `container start`, then `pod stop`, then `container
    /// died` with 143). Kubelet has no such policy; the wait keeps podman's race out of the test.
    pub fn stop(&self, node: &str, grace: Duration) -> Output {
        let id = self.inspect(node, "{{.Id}}");
        let out = self
            .in_node(self.netns(node))
            .args([
                "pod",
                "stop",
                "-t",
                &grace.as_secs().to_string(),
                &self.pod(node),
            ])
            .output()
            .expect("podman pod stop");
        if let Some(id) = id.filter(|i| !i.is_empty()) {
            let gone = wait_for(Duration::from_secs(30), || {
                (!processes_naming(&id)).then_some(())
            });
            assert!(
                gone.is_some(),
                "podman's conmon or cleanup of container {id} still runs 30 s after the stop"
            );
        }
        out
    }

    /// Start the stopped pod again (in the node's network namespace).
    pub fn start(&self, node: &str) -> Output {
        self.in_node(self.netns(node))
            .args(["pod", "start", &self.pod(node)])
            .output()
            .expect("podman pod start")
    }

    /// Run the manifest's `probe` (e.g. "livenessProbe") in the node's container, as kubelet
    /// runs an exec probe: the command itself, no shell. (podman's own healthcheck would wrap
    /// it in `/bin/sh -c`, which an image without a shell cannot run.)
    pub fn probe(&self, node: &str, probe: &str) -> Output {
        let yaml = &self
            .played
            .iter()
            .find(|p| p.node == node)
            .expect("played")
            .yaml;
        let text = std::fs::read_to_string(yaml).unwrap();
        let mut lines = text.lines().skip_while(|l| l.trim() != format!("{probe}:"));
        lines
            .next()
            .unwrap_or_else(|| panic!("no {probe} in the manifest"));
        let line = lines
            .next()
            .filter(|l| l.contains("exec: {command: ["))
            .unwrap_or_else(|| panic!("{probe}: expected `exec: {{command: [...]}}` next"));
        let list = &line[line.find('[').unwrap()..=line.rfind(']').unwrap()];
        let argv: Vec<String> = serde_json::from_str(list).expect("the command as a JSON list");
        podman()
            .args(["exec", &self.container(node)])
            .args(&argv)
            .output()
            .expect("podman exec")
    }

    /// lbd's log (all runs of the container).
    pub fn logs(&self, node: &str) -> String {
        let out = podman()
            .args(["logs", &self.container(node)])
            .output()
            .expect("podman logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The network namespace of a process, as `net:[inode]`.
    pub fn netns_of_pid(pid: u32) -> String {
        std::fs::read_link(format!("/proc/{pid}/ns/net"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// The network namespace of a lab node, as `net:[inode]`.
    pub fn netns_of_node(lab: &Lab, node: &str) -> String {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(format!("/run/netns/{}", lab.node(node).netns))
            .map(|m| m.ino())
            .unwrap_or(0);
        format!("net:[{ino}]")
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for p in &self.played {
            let _ = podman()
                .args(["kube", "play", "--down"])
                .arg(&p.yaml)
                .output();
            let _ = podman()
                .args(["pod", "rm", "-f", &self.pod(&p.node)])
                .output();
        }
        for image in &self.built {
            let _ = podman().args(["rmi", "-f", image]).output();
        }
        if std::env::var_os("LB_KEEP_LAB_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether a process on this host has `word` in its command line (conmon and `podman container
/// cleanup` name the container by its full id).
fn processes_naming(word: &str) -> bool {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.bytes().all(|b| b.is_ascii_digit()) && name != me
        })
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    c.split(|b| *b == 0)
                        .any(|arg| String::from_utf8_lossy(arg).contains(word))
                })
                .unwrap_or(false)
        })
}
