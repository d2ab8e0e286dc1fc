//! The config as read on this node, the config module's only I/O: the file, checked against
//! this host's addresses ([`ConfigFile::load`]), and which file this node runs: the file given, or,
//! in a directory of rendered configs (`lbctl render`; a MachineConfig ships every node's to
//! every node of a pool), the one whose VRRP source address is an address of this host. The
//! look-up reads the directory and the host's addresses; the choice itself ([`pick_node_config`],
//! `lb_core::config::rendered`) is pure.

use std::{net::IpAddr, path::PathBuf};

pub use lb_core::config::rendered::pick_node_config;

use super::{Config, LoadError};

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

#[cfg(test)]
mod tests {
    use super::*;

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
