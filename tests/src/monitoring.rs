//! Monitoring tools for the tests: the shipped PrometheusRule's rules extracted for Prometheus
//! and promtool (never copied), their time scaling for the lab, the lab's certificates
//! (a kubelet-serving CA and a client CA, as on an OpenShift node), and a real Prometheus
//! (Debian's package) run in a lab namespace and queried through its HTTP API.

use std::{path::Path, time::Duration};

use serde_json::Value;

use crate::lab::{Lab, sh, try_sh};

/// The shipped files (read at run time: the tests check what is in the tree).
pub fn shipped(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The rule groups of deploy/monitoring/prometheus-rule.yaml (its `spec`), as a Prometheus
/// rules file. `scale`: every duration of the rules (`for:` and range selectors `[5m]`) is
/// divided by it, so the lab sees in seconds what the cluster sees in minutes (1: unchanged).
/// `annotations`: keep them (promtool's unit tests compare annotations too, so they drop them).
pub fn rules_file(scale: u32, annotations: bool) -> String {
    let rule: Value = serde_norway::from_str(&shipped("deploy/monitoring/prometheus-rule.yaml"))
        .expect("prometheus-rule.yaml parses");
    assert_eq!(rule["kind"], "PrometheusRule");
    let mut spec = rule["spec"].clone();
    for g in spec["groups"].as_array_mut().expect("groups") {
        for r in g["rules"].as_array_mut().expect("rules") {
            let r = r.as_object_mut().unwrap();
            if !annotations {
                r.remove("annotations");
            }
            if let Some(f) = r.get("for").and_then(Value::as_str) {
                let f = scale_duration(f, scale);
                r.insert("for".into(), Value::String(f));
            }
            let expr = r["expr"].as_str().unwrap().to_string();
            r.insert("expr".into(), Value::String(scale_ranges(&expr, scale)));
        }
    }
    serde_norway::to_string(&spec).unwrap()
}

/// A Prometheus duration ("30s", "5m", "1h") divided by `scale`, in milliseconds.
pub fn scale_duration(d: &str, scale: u32) -> String {
    let (num, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).expect("a unit"));
    let n: u64 = num.parse().expect("a number");
    let ms = match unit {
        "ms" => n,
        "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        _ => panic!("duration {d}: unit {unit}"),
    };
    format!("{}ms", ms / u64::from(scale))
}

/// Every range selector `[<duration>]` of a PromQL expression scaled as [`scale_duration`].
pub fn scale_ranges(expr: &str, scale: u32) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').expect("a closing ]");
        let inside = &rest[open + 1..close];
        out += &rest[..=open];
        // A range (`[5m]`), not a regex character class inside a string (`\\[?`).
        if !inside.is_empty() && inside.chars().all(|c| c.is_ascii_alphanumeric()) {
            out += &scale_duration(inside, scale);
        } else {
            out += inside;
        }
        out.push(']');
        rest = &rest[close + 1..];
    }
    out + rest
}

/// A PEM block.
pub fn pem(label: &str, der: &[u8]) -> String {
    let b64 = data_encoding::BASE64.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// A CA that signs leaf certificates.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Ca {
            pem: pem("CERTIFICATE", cert.der()),
            issuer: rcgen::Issuer::new(p, key),
        }
    }

    /// A leaf certificate and key (PEM) for `cn` and the names or addresses `sans`.
    pub fn leaf(&self, cn: &str, sans: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (
            pem("CERTIFICATE", cert.der()),
            pem("PRIVATE KEY", &key.serialize_der()),
        )
    }
}

/// A Prometheus server (Debian's `prometheus`) in a lab node, listening on that node's
/// loopback; stopped with the lab.
pub struct Prometheus {
    pub node: String,
    pub tag: String,
}

pub const PROMETHEUS_PORT: u16 = 9090;

impl Prometheus {
    /// Start it in `node` with `config` (prometheus.yml text) written into `dir`.
    pub fn start(lab: &mut Lab, node: &str, dir: &Path, config: &str) -> Prometheus {
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let out = try_sh(&[
            "promtool",
            "check",
            "config",
            &dir.join("prometheus.yml").display().to_string(),
        ]);
        assert!(out.status.success(), "promtool check config: {out:?}");
        let tag = "prometheus".to_string();
        let cfg = dir.join("prometheus.yml").display().to_string();
        let data = dir.join("prometheus-data").display().to_string();
        lab.spawn(
            node,
            &tag,
            "prometheus",
            &[
                &format!("--config.file={cfg}"),
                &format!("--storage.tsdb.path={data}"),
                &format!("--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"),
                "--log.level=warn",
            ],
        );
        let p = Prometheus {
            node: node.into(),
            tag,
        };
        let up = crate::lab::wait_for(Duration::from_secs(30), || {
            p.get(lab, "/-/ready")
                .filter(|s| s.contains("Ready"))
                .map(|_| ())
        });
        assert!(up.is_some(), "prometheus not ready: {}", lab.log(&p.tag));
        p
    }

    /// GET `path` on its HTTP API (from inside its node).
    pub fn get(&self, lab: &Lab, path: &str) -> Option<String> {
        let out = lab
            .cmd(&self.node, "curl")
            .args(["-s", "-f", "-m", "10"])
            .arg(format!("http://127.0.0.1:{PROMETHEUS_PORT}{path}"))
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// An instant query's result vector.
    pub fn query(&self, lab: &Lab, q: &str) -> Vec<Value> {
        let out = lab
            .cmd(&self.node, "curl")
            .args(["-s", "-m", "10"])
            .arg(format!("http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query"))
            .arg("--data-urlencode")
            .arg(format!("query={q}"))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(v["status"], "success", "query {q}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The alerts (pending or firing) from `/api/v1/alerts`: (name, state, labels).
    pub fn alerts(&self, lab: &Lab) -> Vec<(String, String, Value)> {
        let body = self.get(lab, "/api/v1/alerts").unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }

    /// The firing alerts named `name`, with their labels.
    pub fn firing(&self, lab: &Lab, name: &str) -> Vec<Value> {
        self.alerts(lab)
            .into_iter()
            .filter(|(n, s, _)| n == name && s == "firing")
            .map(|(_, _, l)| l)
            .collect()
    }

    /// Whether `name` is neither pending nor firing.
    pub fn inactive(&self, lab: &Lab, name: &str) -> bool {
        !self.alerts(lab).iter().any(|(n, _, _)| n == name)
    }
}

/// `promtool test rules` on the shipped unit tests (deploy/monitoring/rule-tests.yaml) against
/// the rules extracted from the shipped PrometheusRule, in `dir`. Returns promtool's output.
pub fn promtool_test_rules(dir: &Path) -> std::process::Output {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("lb-rules.yaml"), rules_file(1, false)).unwrap();
    std::fs::write(dir.join("lb-rules-full.yaml"), rules_file(1, true)).unwrap();
    std::fs::write(
        dir.join("rule-tests.yaml"),
        shipped("deploy/monitoring/rule-tests.yaml"),
    )
    .unwrap();
    let check = sh(&[
        "promtool",
        "check",
        "rules",
        &dir.join("lb-rules-full.yaml").display().to_string(),
    ]);
    assert!(check.status.success(), "{check:?}");
    try_sh(&[
        "promtool",
        "test",
        "rules",
        &dir.join("rule-tests.yaml").display().to_string(),
    ])
}
