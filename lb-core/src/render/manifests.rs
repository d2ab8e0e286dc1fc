//! The Kubernetes objects `lbctl render` writes, as typed values serialized to YAML: a
//! MachineConfig per pool (Ignition files) and the MCO's NodeDisruptionPolicy. Typed, so a
//! path or a file's contents can never break the document's structure.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{GATE_PATH, GATE_UNIT, NODE_CONFIG_DIR, STATIC_POD_PATH};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Object<S> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    spec: S,
}

#[derive(Serialize)]
struct Metadata {
    name: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct MachineConfigSpec {
    config: Ignition,
}

#[derive(Serialize)]
struct Ignition {
    ignition: IgnitionVersion,
    storage: Storage,
    #[serde(skip_serializing_if = "Option::is_none")]
    systemd: Option<Systemd>,
}

#[derive(Serialize)]
struct Systemd {
    units: Vec<Unit>,
}

#[derive(Serialize)]
struct Unit {
    name: String,
    contents: String,
}

#[derive(Serialize)]
struct IgnitionVersion {
    version: &'static str,
}

#[derive(Serialize)]
struct Storage {
    files: Vec<File>,
}

#[derive(Serialize)]
struct File {
    path: String,
    /// Decimal in the document (Ignition's JSON has no octal).
    mode: u32,
    overwrite: bool,
    contents: Contents,
}

#[derive(Serialize)]
struct Contents {
    /// An RFC 2397 data URL.
    source: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MachineConfigurationSpec {
    node_disruption_policy: NodeDisruptionPolicy,
}

#[derive(Serialize)]
struct NodeDisruptionPolicy {
    files: Vec<FilePolicy>,
    units: Vec<UnitPolicy>,
}

#[derive(Serialize)]
struct FilePolicy {
    path: &'static str,
    actions: Vec<Action>,
}

#[derive(Serialize)]
struct UnitPolicy {
    name: &'static str,
    actions: Vec<Action>,
}

#[derive(Serialize)]
struct Action {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart: Option<Restart>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Restart {
    service_name: &'static str,
}

fn action(kind: &'static str) -> Action {
    Action {
        kind,
        restart: None,
    }
}

fn document(header: &str, object: &impl Serialize) -> String {
    let body = serde_norway::to_string(object).expect("plain structs serialize");
    format!("# {header}\n{body}")
}

/// A MachineConfig for `pool` that writes `files` (path, contents, mode) and systemd `units`
/// (name, contents; not enabled: the MCO starts them as NodeDisruptionPolicy actions). The MCO
/// rolls it out node by node, and owns the files afterwards: nobody edits them by hand (a node
/// whose MCO-managed files differ from its rendered config is marked degraded).
pub fn machine_config(
    pool: &str,
    files: &[(String, String, u32)],
    units: &[(String, String)],
) -> String {
    let object = Object {
        api_version: "machineconfiguration.openshift.io/v1",
        kind: "MachineConfig",
        metadata: Metadata {
            name: format!("99-{pool}-lb"),
            labels: BTreeMap::from([(
                "machineconfiguration.openshift.io/role".to_string(),
                pool.to_string(),
            )]),
        },
        spec: MachineConfigSpec {
            config: ignition_of(files, units),
        },
    };
    document(
        &format!("Rendered by `lbctl render`: lb's files for the {pool} pool (docs/deploy.md)."),
        &object,
    )
}

/// An Ignition config (spec 3.2.0) writing `files` (path, contents, mode).
fn ignition_of(files: &[(String, String, u32)], units: &[(String, String)]) -> Ignition {
    Ignition {
        systemd: (!units.is_empty()).then(|| Systemd {
            units: units
                .iter()
                .map(|(name, contents)| Unit {
                    name: name.clone(),
                    contents: contents.clone(),
                })
                .collect(),
        }),
        ignition: IgnitionVersion { version: "3.2.0" },
        storage: Storage {
            files: files
                .iter()
                .map(|(path, contents, mode)| File {
                    path: path.clone(),
                    mode: *mode,
                    overwrite: true,
                    contents: Contents {
                        source: format!("data:,{}", percent_encode(contents)),
                    },
                })
                .collect(),
        },
    }
}

/// A standalone Ignition config (JSON) writing `files`: what the installer's bootstrap node
/// gets, merged into its `bootstrap.ign` (it is no member of a machine-config pool).
pub fn ignition(files: &[(String, String, u32)]) -> String {
    serde_json::to_string_pretty(&ignition_of(files, &[])).expect("plain structs serialize") + "\n"
}

/// The machine-config-operator's NodeDisruptionPolicy for lb's files, none of which needs a
/// drain or a reboot: a node config under [`NODE_CONFIG_DIR`] (action `None`: lbd notices its
/// config file change and reloads it, peer lists in place); the static pod (`Restart` of
/// [`GATE_UNIT`]: the kubelet replaces the changed pod, and the gate's unit succeeds only once the
/// new lbd is ready, so a failing image fails the node's update and stops the pool's rollout
/// there); the gate's script (`None`) and unit (`DaemonReload`). Apply it with `oc apply
/// --server-side` so that it merges into `MachineConfiguration/cluster` (the lists are keyed by
/// path and name) instead of replacing other policies.
pub fn node_disruption_policy() -> String {
    let object = Object {
        api_version: "operator.openshift.io/v1",
        kind: "MachineConfiguration",
        metadata: Metadata {
            name: "cluster".into(),
            labels: BTreeMap::new(),
        },
        spec: MachineConfigurationSpec {
            node_disruption_policy: NodeDisruptionPolicy {
                files: vec![
                    FilePolicy {
                        path: NODE_CONFIG_DIR,
                        actions: vec![action("None")],
                    },
                    FilePolicy {
                        path: STATIC_POD_PATH,
                        actions: vec![Action {
                            kind: "Restart",
                            restart: Some(Restart {
                                service_name: GATE_UNIT,
                            }),
                        }],
                    },
                    FilePolicy {
                        path: GATE_PATH,
                        actions: vec![action("None")],
                    },
                ],
                units: vec![UnitPolicy {
                    name: GATE_UNIT,
                    actions: vec![action("DaemonReload")],
                }],
            },
        },
    };
    document(
        "Rendered by `lbctl render`: the MCO applies changes of lb's files without a reboot (docs/deploy.md).",
        &object,
    )
}

/// RFC 3986 percent-encoding of everything but unreserved characters (an Ignition data URL).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(y: &str) -> serde_json::Value {
        serde_norway::from_str(y).unwrap_or_else(|e| panic!("{e}\n{y}"))
    }

    #[test]
    fn a_machine_config_carries_each_file_as_a_data_url() {
        // Contents and paths that would break a hand-written document (quotes, colons, a
        // newline, YAML indicators) stay data.
        let tricky = "a = \"x: y\"\n- [b]: {c}\n#d\n";
        let y = machine_config(
            "master",
            &[
                ("/etc/lb/nodes/master-0.toml".into(), tricky.into(), 0o600),
                ("/etc/x: y #z".into(), String::new(), 0o644),
            ],
            &[("x.service".into(), "[Service]\nExecStart=/x\n".into())],
        );
        assert!(y.starts_with("# Rendered by `lbctl render`"), "{y}");
        let v = parse(&y);
        assert_eq!(v["apiVersion"], "machineconfiguration.openshift.io/v1");
        assert_eq!(v["kind"], "MachineConfig");
        assert_eq!(v["metadata"]["name"], "99-master-lb");
        assert_eq!(
            v["metadata"]["labels"]["machineconfiguration.openshift.io/role"],
            "master"
        );
        assert_eq!(v["spec"]["config"]["ignition"]["version"], "3.2.0");
        let files = v["spec"]["config"]["storage"]["files"].as_array().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0]["path"], "/etc/lb/nodes/master-0.toml");
        assert_eq!(files[0]["mode"], 384);
        assert_eq!(files[0]["overwrite"], true);
        assert_eq!(
            files[0]["contents"]["source"],
            "data:,a%20%3D%20%22x%3A%20y%22%0A-%20%5Bb%5D%3A%20%7Bc%7D%0A%23d%0A"
        );
        assert_eq!(files[1]["path"], "/etc/x: y #z");
        assert_eq!(files[1]["contents"]["source"], "data:,");
        let units = v["spec"]["config"]["systemd"]["units"].as_array().unwrap();
        assert_eq!(units[0]["name"], "x.service");
        assert_eq!(units[0]["contents"], "[Service]\nExecStart=/x\n");
        assert!(
            units[0].get("enabled").is_none(),
            "started by the MCO, not at boot"
        );
    }

    #[test]
    fn an_ignition_config_carries_the_same_files_as_a_machine_config() {
        let files = [(
            "/etc/lb/nodes/bootstrap.toml".to_string(),
            "a = 1\n".to_string(),
            0o600,
        )];
        let ign: serde_json::Value = serde_json::from_str(&ignition(&files)).unwrap();
        let mc = parse(&machine_config("master", &files, &[]));
        assert_eq!(ign, mc["spec"]["config"]);
        assert!(ign.get("systemd").is_none());
        assert_eq!(ign["ignition"]["version"], "3.2.0");
        assert_eq!(
            ign["storage"]["files"][0]["contents"]["source"],
            "data:,a%20%3D%201%0A"
        );
    }

    #[test]
    fn the_node_disruption_policy_covers_every_file_a_machine_config_writes() {
        let v = parse(&node_disruption_policy());
        assert_eq!(v["kind"], "MachineConfiguration");
        assert_eq!(v["apiVersion"], "operator.openshift.io/v1");
        assert_eq!(v["metadata"]["name"], "cluster");
        assert!(v["metadata"].get("labels").is_none());
        let files = v["spec"]["nodeDisruptionPolicy"]["files"]
            .as_array()
            .unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(paths, [NODE_CONFIG_DIR, STATIC_POD_PATH, GATE_PATH]);
        assert_eq!(files[0]["actions"], serde_json::json!([{"type": "None"}]));
        // A changed static pod restarts the gate: the update fails while the new lbd is not
        // ready, and the pool's rollout stops at this node.
        assert_eq!(
            files[1]["actions"],
            serde_json::json!([{"type": "Restart", "restart": {"serviceName": GATE_UNIT}}])
        );
        assert_eq!(files[2]["actions"], serde_json::json!([{"type": "None"}]));
        let units = v["spec"]["nodeDisruptionPolicy"]["units"]
            .as_array()
            .unwrap();
        assert_eq!(
            units,
            &[serde_json::json!({"name": GATE_UNIT, "actions": [{"type": "DaemonReload"}]})]
        );
    }
}
