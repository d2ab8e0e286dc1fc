//! `lbctl render` and `lbctl vr-ids`: local commands, no lbd needed.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use lb_userspace::render::{self as r, ClusterSpec, to_toml};
use serde::Serialize;

use crate::{Ctx, output::table};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// The cluster description (TOML); see docs/rendering.md.
    #[arg(long)]
    cluster: PathBuf,
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Also write MachineConfigs (99-<pool>-lb.yaml) shipping every node's config and the
    /// static pod, whose image is this reference (by digest, e.g. from `cargo xtask image`).
    #[arg(long)]
    image: Option<String>,
}

#[derive(Serialize)]
struct VrIds {
    cluster: String,
    api_vrid: u8,
    ingress_vrid: u8,
}

pub fn vr_ids(ctx: &Ctx, cluster: String) -> Result<()> {
    let (api, ingress) = lb_userspace::vrrp::vrids::openshift_vrids(&cluster);
    let v = VrIds {
        cluster,
        api_vrid: api,
        ingress_vrid: ingress,
    };
    ctx.show(&v, |v| {
        println!(
            "cluster {}: api VRID {}, ingress VRID {}",
            v.cluster, v.api_vrid, v.ingress_vrid
        )
    })
}

#[derive(Serialize)]
struct NodeFile {
    node: String,
    path: PathBuf,
    vips: Vec<String>,
}

#[derive(Serialize)]
struct Rendered {
    cluster: String,
    api_vrid: u8,
    ingress_vrid: u8,
    nodes: Vec<NodeFile>,
    /// The install's bootstrap node (`[bootstrap]`): its config, and with `--image` the
    /// Ignition fragment to merge into its bootstrap.ign.
    #[serde(skip_serializing_if = "Option::is_none")]
    bootstrap: Option<NodeFile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bootstrap_ignition: Option<PathBuf>,
    /// The cluster key in the output directory (kept from an earlier render, or made).
    cluster_key: PathBuf,
    cluster_key_made: bool,
    machine_configs: Vec<PathBuf>,
}

/// The cluster key `render` ships (`cluster.key` in the output directory, mode 0600): kept
/// if it is there (rendering again must not change the key under running nodes; rotating is
/// a procedure, docs/config.md), made from the system's random source otherwise: 32 random
/// bytes, hex, 64 characters. Returns its text and whether it was made now.
fn cluster_key(out: &std::path::Path) -> Result<(PathBuf, String, bool)> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let path = out.join("cluster.key");
    if path.exists() {
        let ring = lb_userspace::sync::config::KeyRing::read("cluster_key", &path, &[])
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let text = String::from_utf8(ring.sign)
            .map_err(|_| anyhow!("{}: not text (render writes hex)", path.display()))?;
        return Ok((path, text + "\n", false));
    }
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| anyhow!("no random bytes from the system"))?;
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n";
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
    Ok((path, text, true))
}

/// A static pod manifest with its `image:` set to `image`.
fn with_image(manifest: &str, image: &str) -> String {
    manifest
        .lines()
        .map(|l| match l.split_once("image: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}image: {image}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

pub fn run(ctx: &Ctx, a: Args) -> Result<()> {
    let Args {
        cluster,
        out,
        image,
    } = a;
    let text = std::fs::read_to_string(&cluster)
        .map_err(|e| anyhow!("{0}: cannot read {0}: {e}", cluster.display()))?;
    let spec = ClusterSpec::parse(&text).map_err(|e| anyhow!("{}: {e}", cluster.display()))?;
    let rendered = spec
        .render()
        .map_err(|e| anyhow!("{}: {e}", cluster.display()))?;
    std::fs::create_dir_all(&out).map_err(|e| anyhow!("create {}: {e}", out.display()))?;
    let (api, ingress) = spec.vrids();
    let (key_path, key_text, key_made) = cluster_key(&out)?;
    let mut nodes = Vec::new();
    for n in &rendered {
        let path = out.join(format!("{}.toml", n.node));
        std::fs::write(&path, to_toml(&spec.name, n))
            .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        nodes.push(NodeFile {
            node: n.node.clone(),
            path,
            vips: n.config.vips.iter().map(|v| v.name.clone()).collect(),
        });
    }
    let boot = spec
        .render_bootstrap()
        .map_err(|e| anyhow!("{}: {e}", cluster.display()))?;
    let bootstrap = match &boot {
        Some(b) => {
            let path = out.join(format!("{}.toml", b.node));
            std::fs::write(&path, to_toml(&spec.name, b))
                .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
            Some(NodeFile {
                node: b.node.clone(),
                path,
                vips: b.config.vips.iter().map(|v| v.name.clone()).collect(),
            })
        }
        None => None,
    };
    let mut bootstrap_ignition = None;
    let mut machine_configs = Vec::new();
    if let Some(image) = image {
        if let Some(b) = &boot {
            // The bootstrap runs the control-plane static pod from its own kubelet's manifest
            // directory; no cluster key (no sync, no membership on the bootstrap).
            let files = [
                (
                    format!("{}/{}.toml", r::NODE_CONFIG_DIR, b.node),
                    to_toml(&spec.name, b),
                    0o600,
                ),
                (
                    r::STATIC_POD_PATH.into(),
                    with_image(
                        include_str!("../../../../deploy/lb-control-plane.yaml"),
                        &image,
                    ),
                    0o644,
                ),
            ];
            let path = out.join("bootstrap-lb.ign");
            std::fs::write(&path, r::ignition(&files))
                .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
            bootstrap_ignition = Some(path);
        }
        for pool in ["master", "worker"] {
            let members: Vec<_> = spec
                .nodes
                .iter()
                .zip(&rendered)
                .filter(|(n, _)| r::pool(n) == pool)
                .collect();
            if members.is_empty() {
                continue;
            }
            let pod = if pool == "master" {
                include_str!("../../../../deploy/lb-control-plane.yaml")
            } else {
                include_str!("../../../../deploy/lb-worker.yaml")
            };
            let pod = with_image(pod, &image);
            let mut files: Vec<(String, String, u32)> = members
                .iter()
                .map(|(n, rn)| {
                    (
                        format!("{}/{}.toml", r::NODE_CONFIG_DIR, n.name),
                        to_toml(&spec.name, rn),
                        0o600,
                    )
                })
                .collect();
            files.push((r::STATIC_POD_PATH.into(), pod, 0o644));
            files.push((r::GATE_PATH.into(), r::GATE_SCRIPT.into(), 0o755));
            // The cluster key: root-only on the node (lbd refuses a key others can read).
            files.push((
                spec.sync_settings().key_file.display().to_string(),
                key_text.clone(),
                0o600,
            ));
            let path = out.join(format!("99-{pool}-lb.yaml"));
            let units = [(r::GATE_UNIT.to_string(), r::GATE_UNIT_CONTENTS.to_string())];
            std::fs::write(&path, r::machine_config(pool, &files, &units))
                .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
            machine_configs.push(path);
        }
        // Config changes then reach lbd as a file change (it reloads), not a reboot.
        let path = out.join("99-lb-node-disruption.yaml");
        std::fs::write(&path, r::node_disruption_policy())
            .map_err(|e| anyhow!("write {}: {e}", path.display()))?;
        machine_configs.push(path);
    }
    let v = Rendered {
        cluster: spec.name.clone(),
        api_vrid: api,
        ingress_vrid: ingress,
        nodes,
        bootstrap,
        bootstrap_ignition,
        cluster_key: key_path,
        cluster_key_made: key_made,
        machine_configs,
    };
    ctx.show(&v, |v| {
        println!(
            "cluster {}: api VRID {}, ingress VRID {}",
            v.cluster, v.api_vrid, v.ingress_vrid
        );
        table(
            &["NODE", "VIPS", "CONFIG"],
            v.nodes
                .iter()
                .map(|n| {
                    vec![
                        n.node.clone(),
                        n.vips.join(","),
                        n.path.display().to_string(),
                    ]
                })
                .collect(),
        );
        if let Some(b) = &v.bootstrap {
            println!(
                "bootstrap {}: {} ({})",
                b.node,
                b.path.display(),
                b.vips.join(",")
            );
        }
        if let Some(p) = &v.bootstrap_ignition {
            println!("bootstrap ignition: {}", p.display());
        }
        println!(
            "cluster key: {} ({})",
            v.cluster_key.display(),
            if v.cluster_key_made {
                "made now"
            } else {
                "kept"
            }
        );
        for p in &v.machine_configs {
            println!("machine config: {}", p.display());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn yaml(text: &str) -> Value {
        serde_norway::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// An Ignition data URL's contents (RFC 3986 percent-decoding).
    fn data_url(source: &str) -> String {
        let enc = source.strip_prefix("data:,").expect("a data URL");
        let b = enc.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&enc[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    fn shipped(rel: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(rel);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// With `[bootstrap]`, render writes the bootstrap's config and an Ignition fragment
    /// holding it and the control-plane static pod; the masters' MachineConfig does not carry
    /// the bootstrap's config, and rendering again without `[bootstrap]` writes neither.
    #[test]
    fn a_bootstrap_gets_its_config_and_an_ignition_fragment() {
        let dir = std::env::temp_dir().join(format!("lbctl-render-boot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let base = shipped("deploy/examples/cluster.toml");
        let cluster =
            format!("{base}\n[bootstrap]\naddress = \"192.168.111.10\"\ninterface = \"ens3\"\n");
        std::fs::write(dir.join("cluster.toml"), cluster).unwrap();
        let ctx = Ctx {
            client: lb_userspace::api::Client::new(dir.join("none.sock")),
            out: crate::output::Output::Json,
        };
        let args = |out: &str| Args {
            cluster: dir.join("cluster.toml"),
            out: dir.join(out),
            image: Some(format!("quay.io/x/lb@sha256:{}", "2".repeat(64))),
        };
        run(&ctx, args("with")).unwrap();
        let ign: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("with/bootstrap-lb.ign")).unwrap(),
        )
        .unwrap();
        let files = ign["storage"]["files"].as_array().unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["/etc/lb/nodes/bootstrap.toml", r::STATIC_POD_PATH]);
        let cfg = lb_userspace::config::Config::parse(&data_url(
            files[0]["contents"]["source"].as_str().unwrap(),
        ))
        .unwrap();
        assert_eq!(cfg.interface, "ens3");
        assert_eq!(cfg.vrrp[0].priority, r::BOOTSTRAP_PRIORITY);
        let pod = yaml(&data_url(files[1]["contents"]["source"].as_str().unwrap()));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("quay.io/x/lb@sha256:{}", "2".repeat(64))
        );
        assert!(dir.join("with/bootstrap.toml").exists());
        let mc = std::fs::read_to_string(dir.join("with/99-master-lb.yaml")).unwrap();
        assert!(!mc.contains("bootstrap.toml"));
        // The masters name the bootstrap while the description does.
        assert!(mc.contains("192.168.111.10"));

        let cluster = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
        std::fs::write(
            dir.join("cluster.toml"),
            cluster.split("\n[bootstrap]").next().unwrap(),
        )
        .unwrap();
        run(&ctx, args("after")).unwrap();
        assert!(!dir.join("after/bootstrap-lb.ign").exists());
        assert!(!dir.join("after/bootstrap.toml").exists());
        let mc = std::fs::read_to_string(dir.join("after/99-master-lb.yaml")).unwrap();
        assert!(!mc.contains("192.168.111.10"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The metrics port cluster monitoring scrapes is one port everywhere it is named: the
    /// node configs and static pods `lbctl render` writes into the MachineConfigs, and the
    /// shipped Service, ServiceMonitor, namespace and alert rules.
    #[test]
    fn the_metrics_port_agrees_across_render_pods_service_and_monitor() {
        let dir = std::env::temp_dir().join(format!("lbctl-render-ports-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The shipped compact cluster plus a worker, so that both pools' pods are rendered.
        let cluster = shipped("deploy/examples/cluster.toml")
            + "\n[[nodes]]\nname = \"worker-0\"\naddress = \"192.168.111.30\"\nroles = [\"worker\"]\n";
        std::fs::write(dir.join("cluster.toml"), cluster).unwrap();
        let ctx = Ctx {
            client: lb_userspace::api::Client::new(dir.join("none.sock")),
            out: crate::output::Output::Json,
        };
        run(
            &ctx,
            Args {
                cluster: dir.join("cluster.toml"),
                out: dir.join("out"),
                image: Some(format!("quay.io/x/lb@sha256:{}", "1".repeat(64))),
            },
        )
        .unwrap();

        // Rendered: every node config's [metrics_tls] port, every pod's `metrics` port.
        let mut ports = Vec::new();
        let mut pods = Vec::new();
        for pool in ["master", "worker"] {
            let mc =
                yaml(&std::fs::read_to_string(dir.join(format!("out/99-{pool}-lb.yaml"))).unwrap());
            for f in mc["spec"]["config"]["storage"]["files"].as_array().unwrap() {
                let path = f["path"].as_str().unwrap();
                let text = data_url(f["contents"]["source"].as_str().unwrap());
                if path == r::STATIC_POD_PATH {
                    pods.push(yaml(&text));
                } else if path.starts_with(r::NODE_CONFIG_DIR) && path.ends_with(".toml") {
                    let cfg = lb_userspace::config::Config::parse(&text).unwrap();
                    let tls = cfg
                        .metrics_tls
                        .unwrap_or_else(|| panic!("{path}: no metrics_tls"));
                    ports.push((path.to_string(), tls.listen.port()));
                }
            }
        }
        assert_eq!(ports.len(), 4, "{ports:?}");
        assert_eq!(pods.len(), 2);
        let port = ports[0].1;
        assert_eq!(port, r::DEFAULT_METRICS_TLS_PORT);
        for (path, p) in &ports {
            assert_eq!(*p, port, "{path}");
        }
        for pod in &pods {
            let lbd = pod["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "lbd")
                .expect("an lbd container");
            let named: Vec<&Value> = lbd["ports"]
                .as_array()
                .expect("lbd declares its ports")
                .iter()
                .filter(|p| p["name"] == "metrics")
                .collect();
            assert_eq!(named.len(), 1, "{lbd}");
            assert_eq!(
                named[0]["containerPort"], port,
                "{}",
                pod["metadata"]["name"]
            );
            assert_eq!(pod["spec"]["hostNetwork"], true);
            assert_eq!(pod["metadata"]["labels"]["app"], "lb");
            assert_eq!(pod["metadata"]["namespace"], "openshift-lb");
        }

        // Shipped: the Service selects the pods and targets that port by name; the
        // ServiceMonitor scrapes the Service's port over HTTPS with job "lb".
        let docs: Vec<Value> = shipped("deploy/monitoring/service-monitor.yaml")
            .split("\n---\n")
            .map(yaml)
            .collect();
        let kind = |k: &str| {
            docs.iter()
                .find(|d| d["kind"] == k)
                .unwrap_or_else(|| panic!("no {k}"))
        };
        let svc = kind("Service");
        assert_eq!(svc["metadata"]["namespace"], "openshift-lb");
        assert_eq!(svc["spec"]["selector"]["app"], "lb");
        assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
        let sp = &svc["spec"]["ports"][0];
        assert_eq!(sp["name"], "metrics");
        assert_eq!(sp["port"], port);
        assert_eq!(sp["targetPort"], "metrics");
        let sm = kind("ServiceMonitor");
        assert_eq!(sm["metadata"]["namespace"], "openshift-lb");
        assert_eq!(sm["spec"]["selector"]["matchLabels"]["app"], "lb");
        assert_eq!(sm["spec"]["jobLabel"], "app");
        let ep = &sm["spec"]["endpoints"][0];
        assert_eq!(ep["port"], "metrics");
        assert_eq!(ep["scheme"], "https");
        assert_eq!(ep["path"], "/metrics");
        assert_eq!(ep["tlsConfig"]["insecureSkipVerify"], false);
        // Files the monitoring operator keeps current, never a copied bundle.
        for f in ["caFile", "certFile", "keyFile"] {
            assert!(
                ep["tlsConfig"][f]
                    .as_str()
                    .unwrap()
                    .starts_with("/etc/prometheus/"),
                "{f}"
            );
        }
        assert!(ep["tlsConfig"].get("ca").is_none());
        let role = kind("RoleBinding");
        assert_eq!(role["subjects"][0]["name"], "prometheus-k8s");

        // The namespace is one cluster monitoring reads; the alerts select job "lb" (the
        // pods' `app` label, by jobLabel).
        let ns = yaml(&shipped("deploy/namespace.yaml"));
        assert_eq!(ns["metadata"]["name"], "openshift-lb");
        assert_eq!(
            ns["metadata"]["labels"]["openshift.io/cluster-monitoring"],
            "true"
        );
        let rule = yaml(&shipped("deploy/monitoring/prometheus-rule.yaml"));
        assert_eq!(rule["metadata"]["namespace"], "openshift-lb");
        let exprs: String = rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .map(|r| r["expr"].as_str().unwrap().to_string())
            .collect();
        assert!(exprs.contains("up{job=\"lb\"}"));
        assert!(!exprs.contains("job=\"openshift-lb"), "{exprs}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
