//! The one way tests, labs and benches run `lbctl` (the workspace's binary, see
//! [`crate::bin_dir`]): its output, or its JSON answer. Labs wrap these with their node's socket.

use crate::bin_dir;

/// `lbctl` without arguments, to add them (and, for a daemon's commands, `--socket`).
pub fn command() -> std::process::Command {
    std::process::Command::new(bin_dir().join("lbctl"))
}

/// Run `lbctl --socket SOCKET ARGS...` (the workspace's binary) and return its output. Under
/// `LB_TIME_SCALE` (software emulation) lbctl waits that many times its default 5 s for lbd.
pub fn lbctl_output(socket: &str, args: &[&str]) -> std::process::Output {
    let mut c = command();
    c.arg("--socket").arg(socket);
    let scale = crate::brex::time_scale();
    if scale > 1 {
        c.arg("--timeout").arg(format!("{}s", 5 * scale));
    }
    c.args(args).output().expect("run lbctl")
}

/// `lbctl -o json ARGS...` against `socket`: the parsed answer, or None if lbctl failed.
pub fn lbctl_json(socket: &str, args: &[&str]) -> Option<serde_json::Value> {
    let mut a = vec!["-o", "json"];
    a.extend_from_slice(args);
    let out = lbctl_output(socket, &a);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// `lbctl -o json ARGS...` against `socket` as one of lbd's typed rows; panics, with lbctl's
/// output, when lbctl fails or answers something else.
pub fn lbctl_typed<T: serde::de::DeserializeOwned>(socket: &str, args: &[&str]) -> T {
    let mut a = vec!["-o", "json"];
    a.extend_from_slice(args);
    let out = lbctl_output(socket, &a);
    assert!(out.status.success(), "lbctl {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "lbctl {args:?}: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
