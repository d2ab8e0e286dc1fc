//! The operator's view through a real lbd (the DSR lab: static VIPs web4/web6, three backends
//! each): lbctl's conventions (`-o` formats, filters, `version`, `--watch` output, exit codes)
//! and the metrics' conventions. Needs root; `cargo xtask test`.

use std::{
    io::Read,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use lb_tests::{
    bin_dir,
    dsr::{VIP4, setup},
    lbctl_output,
};
use lb_userspace::status::{BackendRow, VipRow};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

fn json<T: serde::de::DeserializeOwned>(socket: &str, args: &[&str]) -> T {
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

#[test]
fn lbctl_formats_filters_version_watch_and_exit_codes() {
    let l = setup(LABNODE);
    let socket = l.socket.as_str();

    // Filters: by VIP name and by address give that VIP's rows only.
    let all: Vec<BackendRow> = json(socket, &["backends", "list"]);
    assert_eq!(all.len(), 6);
    let by_name: Vec<BackendRow> = json(socket, &["backends", "list", "web4"]);
    let by_addr: Vec<BackendRow> = json(socket, &["backends", "list", VIP4]);
    assert_eq!(by_name.len(), 3, "{by_name:?}");
    assert!(by_name.iter().all(|r| r.vip_name == "web4"));
    assert_eq!(by_name, by_addr);
    let vips: Vec<VipRow> = json(socket, &["vips", "list", "web6"]);
    assert_eq!(vips.len(), 1);
    assert_eq!(vips[0].name, "web6");
    let none: Vec<BackendRow> = json(socket, &["backends", "list", "nosuchvip"]);
    assert!(none.is_empty());

    // YAML is the same document as JSON.
    let out = lbctl_output(socket, &["-o", "yaml", "backends", "list", "web4"]);
    assert!(out.status.success(), "{out:?}");
    let yaml: Vec<BackendRow> = serde_norway::from_slice(&out.stdout).unwrap();
    assert_eq!(yaml.len(), 3);
    assert_eq!(
        yaml.iter().map(|r| r.backend).collect::<Vec<_>>(),
        by_name.iter().map(|r| r.backend).collect::<Vec<_>>()
    );

    // Table and wide: wide has every column of table and more.
    let text = |args: &[&str]| {
        let out = lbctl_output(socket, args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = text(&["backends", "list", "web4"]);
    let wide = text(&["-o", "wide", "backends", "list", "web4"]);
    let header = |t: &str| -> Vec<String> {
        t.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(header(&table).iter().all(|h| header(&wide).contains(h)));
    assert!(header(&wide).contains(&"MAC".to_string()), "{wide}");
    assert!(!header(&table).contains(&"MAC".to_string()), "{table}");

    // Version: client and daemon, the same build here.
    let v: serde_json::Value = json(socket, &["version"]);
    assert_eq!(v["client"]["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["daemon"], v["client"], "{v}");

    // Exit codes: lbd refuses (1) versus nobody answers (3).
    let refused = lbctl_output(socket, &["backends", "drain", "web4", "10.77.0.99"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("lbd answered 4"),
        "{refused:?}"
    );
    let gone = l.lab.dir.join("no-lbd-here.sock");
    let unreachable = lbctl_output(gone.to_str().unwrap(), &["stats"]);
    assert_eq!(unreachable.status.code(), Some(3), "{unreachable:?}");
    let version = lbctl_output(gone.to_str().unwrap(), &["version"]);
    assert_eq!(version.status.code(), Some(3), "{version:?}");
    assert!(String::from_utf8_lossy(&version.stdout).contains("lbctl "));
    // A socket that accepts but never answers (a wedged lbd): not reachable either.
    let wedged = l.lab.dir.join("wedged.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&wedged).unwrap();
    let out = lbctl_output(
        wedged.to_str().unwrap(),
        &["--timeout", "300ms", "vips", "list"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // --watch in JSON: a stream of documents, no terminal codes, even on a pipe.
    for (format, sep) in [("json", None), ("yaml", Some("---\n"))] {
        let mut child = Command::new(bin_dir().join("lbctl"))
            .args([
                "--socket", socket, "-o", format, "--watch", "200ms", "stats",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            buf
        });
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Our own child, by its handle.
        child.kill().unwrap();
        child.wait().unwrap();
        let buf = reader.join().unwrap();
        assert!(
            !buf.contains(&0x1b),
            "terminal codes in -o {format} --watch"
        );
        let docs: Vec<lb_userspace::status::StatsRow> = match sep {
            None => serde_json::Deserializer::from_slice(&buf)
                .into_iter()
                .collect::<Result<_, _>>()
                .unwrap(),
            Some(sep) => String::from_utf8(buf.clone())
                .unwrap()
                .split(sep)
                .filter(|d| !d.trim().is_empty())
                .map(|d| serde_norway::from_str(d).unwrap())
                .collect(),
        };
        assert!(
            docs.len() >= 2,
            "{format}: {}",
            String::from_utf8_lossy(&buf)
        );
        assert!(docs.iter().all(|d| d.interface == "eth0"));
    }
}
