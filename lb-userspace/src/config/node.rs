//! The config as read on this node, the config module's only I/O: the file, checked against
//! this host's addresses ([`ConfigFile::load`]), and which file this node runs: the file given, or,
//! in a directory of rendered configs (`lbctl render`; a MachineConfig ships every node's to
//! every node of a pool), the one whose VRRP source address is an address of this host. The look-up reads the directory and the
//! host's addresses; the choice itself ([`pick_node_config`]) is pure.

use std::{net::IpAddr, path::PathBuf};

use serde::Deserialize;

use super::{Config, LoadError, invalid};

/// A config as read on this node: [`Config::parse`] and [`Config::check_host`] (pure) with the
/// file and the host's addresses read.
pub trait ConfigFile: Sized {
    /// Read, parse and validate `path`, then check its VIPs against this host's addresses
    /// ([`Config::check_host`]). [`Config::parse`] alone never touches the system.
    fn load(path: &std::path::Path) -> Result<Self, LoadError>;

    /// A config file's text as [`ConfigFile::load`] takes it: parsed, validated and checked
    /// against this host (for a caller that has read the file already, once).
    fn from_file_text(text: &str) -> Result<Self, LoadError>;
}

impl ConfigFile for Config {
    fn load(path: &std::path::Path) -> Result<Config, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|error| LoadError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::from_file_text(&text)
    }

    fn from_file_text(text: &str) -> Result<Config, LoadError> {
        let cfg = Self::parse(text)?;
        // Without the host's addresses (no /proc?), the parse-time checks are all there is.
        if let Ok(host) = crate::net::iface::host_addresses() {
            cfg.check_host(&host)?;
        }
        Ok(cfg)
    }
}

/// The config this node runs when `path` is a directory of rendered configs (a MachineConfig
/// ships every node's to every node of a pool): the one whose VRRP source address is an
/// address of this host. Exactly one must match. A file path is returned as is.
///
/// Matching on the address, not the hostname, works whatever the node's hostname looks like
/// (short, FQDN) and whether or not the container shares the node's UTS namespace. Only the
/// matching file is parsed and validated (by the caller, as any config): another node's file,
/// even a broken one, never stops this node. "An address of this host" is read from the
/// interfaces, not tried with bind(2), which `ip_nonlocal_bind=1` lets succeed for any
/// address.
pub fn node_config_path(path: &std::path::Path) -> Result<PathBuf, LoadError> {
    if !path.is_dir() {
        return Ok(path.to_owned());
    }
    let read_err = |error| LoadError::Read {
        path: path.to_owned(),
        error,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("toml"))
        .collect();
    files.sort();
    let texts: Vec<(PathBuf, String)> = files
        .iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap_or_default()))
        .collect();
    let host: Vec<IpAddr> = crate::net::iface::host_addresses()
        .map_err(read_err)?
        .into_iter()
        .map(|(_, a)| a.addr)
        .collect();
    pick_node_config(path, &texts, &host)
}

/// Just enough of a rendered config to tell whose it is (unknown fields ignored).
#[derive(Deserialize)]
struct Identity {
    #[serde(default)]
    vrrp: Vec<IdentityVrrp>,
}

#[derive(Deserialize)]
struct IdentityVrrp {
    #[serde(default)]
    unicast_src: Option<IpAddr>,
}

/// The file of `files` (path, text) whose `[[vrrp]]` `unicast_src` is one of `host`'s addresses.
/// Pure. Files are only skimmed for `unicast_src`; one that cannot even be skimmed is skipped
/// (it is another node's problem unless none matches, and then the error names it).
pub fn pick_node_config(
    dir: &std::path::Path,
    files: &[(PathBuf, String)],
    host: &[IpAddr],
) -> Result<PathBuf, LoadError> {
    let mut mine = Vec::new();
    let mut unreadable = Vec::new();
    for (f, text) in files {
        match toml::from_str::<Identity>(text) {
            Ok(id) => {
                if id
                    .vrrp
                    .iter()
                    .filter_map(|r| r.unicast_src)
                    .any(|a| host.contains(&a))
                {
                    mine.push(f.clone());
                }
            }
            Err(_) => unreadable.push(f.display().to_string()),
        }
    }
    match mine.len() {
        1 => Ok(mine.remove(0)),
        0 => Err(LoadError::from(invalid(
            dir.display().to_string(),
            format!(
                "none of the {} configs has a unicast_src that is an address of this host{}",
                files.len(),
                if unreadable.is_empty() {
                    String::new()
                } else {
                    format!(" (not TOML: {})", unreadable.join(", "))
                }
            ),
        ))),
        _ => Err(LoadError::from(invalid(
            dir.display().to_string(),
            format!("several configs match this host: {mine:?}"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_nodes_file_is_picked_and_others_may_be_broken() {
        let dir = std::path::Path::new("/etc/lb/nodes");
        let node = |src: &str| {
            format!(
                "interface = \"eth0\"\n[[vrrp]]\nname = \"api\"\nvrid = 5\nunicast_src = \"{src}\"\nvips = [\"10.0.0.5\"]\n"
            )
        };
        let files = vec![
            (PathBuf::from("a.toml"), node("10.0.0.11")),
            // Another node's file with a validation error and one that is not TOML at all.
            (
                PathBuf::from("b.toml"),
                node("10.0.0.12") + "table_size = 4\n[[vips]]\nname = \"\"\n",
            ),
            (PathBuf::from("c.toml"), "this is [not toml".into()),
        ];
        let host = ["10.0.0.11".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        assert_eq!(
            pick_node_config(dir, &files, &host).unwrap(),
            PathBuf::from("a.toml")
        );
        // Ours is the broken one: picked anyway, so that the caller's validation says why.
        let host_b = ["10.0.0.12".parse().unwrap()];
        assert_eq!(
            pick_node_config(dir, &files, &host_b).unwrap(),
            PathBuf::from("b.toml")
        );
        // None matches: the error says which files could not be read.
        let e = pick_node_config(dir, &files, &["10.9.9.9".parse().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("none of the 3") && e.contains("c.toml"), "{e}");
        let both = vec![files[0].clone(), files[0].clone()];
        assert!(
            pick_node_config(dir, &both, &host)
                .unwrap_err()
                .to_string()
                .contains("several")
        );
    }

    /// A cluster of two control-plane nodes and two workers (`lbctl render`'s input).
    const SPLIT: &str = r#"
name = "ostest"
interface = "br-ex"
api_vip = "192.168.111.5"
ingress_vip = "192.168.111.4"
[[nodes]]
name = "master-0"
address = "192.168.111.20"
roles = ["control-plane"]
[[nodes]]
name = "master-1"
address = "192.168.111.21"
roles = ["control-plane"]
[[nodes]]
name = "worker-0"
address = "192.168.111.30"
roles = ["worker"]
[[nodes]]
name = "worker-1"
address = "192.168.111.31"
roles = ["worker"]
"#;

    #[test]
    fn a_directory_of_rendered_configs_resolves_to_this_hosts() {
        // 127.0.0.1 is local on every host; 192.0.2.x (TEST-NET-1) is not assigned here.
        let text = SPLIT
            .replace("192.168.111.20", "127.0.0.1")
            .replace("192.168.111.", "192.0.2.")
            // A loopback address is no sync peer.
            + "\n[sync]\nenabled = false\n";
        let out = crate::render::ClusterSpec::parse(&text)
            .unwrap()
            .render()
            .unwrap();
        let dir = std::env::temp_dir().join(format!("lb-render-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for r in &out {
            std::fs::write(
                dir.join(format!("{}.toml", r.node)),
                crate::render::to_toml("t", r),
            )
            .unwrap();
        }
        let got = node_config_path(&dir);
        let none = {
            std::fs::remove_file(dir.join("master-0.toml")).unwrap();
            node_config_path(&dir).unwrap_err().to_string()
        };
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got.unwrap(), dir.join("master-0.toml"));
        assert!(none.contains("none of the 3 configs"), "{none}");
        let file = std::path::Path::new("/etc/lb/lbd.toml");
        assert_eq!(node_config_path(file).unwrap(), file);
    }
}
