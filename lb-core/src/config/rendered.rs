//! Which of a directory of rendered configs is this node's (`lbctl render` writes every node's;
//! a MachineConfig ships them all to every node of a pool): the one whose VRRP source address is
//! an address of this host. Pure: the directory and the host's addresses are read by
//! lb-userspace's `config::node::node_config_path`.

use std::{net::IpAddr, path::PathBuf};

use serde::Deserialize;

use super::{LoadError, invalid};

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
}
