//! What lb needs of the kernel (docs/kernels.md): the features each part uses with the release
//! that brought each to mainline, what lbd does on a kernel that lacks an optional one, and the
//! error for a kernel that refuses the data plane, which names the kernel and the reason.
//!
//! A release number is only a hint: distribution kernels (RHEL 9's 5.14, for one) carry
//! features of later releases. So lbd never refuses a kernel by its number; it loads, and when
//! the kernel refuses, says which kernel and why, with the features that kernel's number
//! suggests it lacks. Pure, but for reading the running release.

use std::fmt;

/// A kernel release as `uname -r` prints it (`6.1.0-56-amd64`), with its version numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub text: String,
    pub version: (u32, u32),
}

impl Release {
    /// `6.1.0-56-amd64` -> (6, 1); `None` without a `major.minor` start.
    pub fn parse(text: &str) -> Option<Release> {
        let text = text.trim();
        let mut nums = text
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>());
        let major = nums.next()?.ok()?;
        let minor = nums.next()?.ok()?;
        Some(Release {
            text: text.to_string(),
            version: (major, minor),
        })
    }

    /// The running kernel's release.
    pub fn current() -> Option<Release> {
        Release::parse(&std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// One kernel feature lb uses.
#[derive(Debug)]
pub struct Feature {
    pub name: &'static str,
    /// The mainline release that brought it.
    pub since: (u32, u32),
    /// What in lb uses it.
    pub used_by: &'static str,
    /// What lbd does without it; `None`: the data plane cannot run without it.
    pub without: Option<&'static str>,
}

/// Every feature lb's data plane and daemon use, oldest first (docs/kernels.md's table).
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "LRU hash maps",
        since: (4, 10),
        used_by: "the connection table",
        without: None,
    },
    Feature {
        name: "bpf-to-bpf calls with tail calls",
        since: (5, 10),
        used_by: "lb_xdp (subprograms, and its tail call to lb_xdp_noted)",
        without: None,
    },
    Feature {
        name: "mmapable arrays (BPF_F_MMAPABLE)",
        since: (5, 5),
        used_by: "the Maglev tables and the flow cache",
        without: None,
    },
    Feature {
        name: "batch map lookups (BPF_MAP_LOOKUP_BATCH)",
        since: (5, 6),
        used_by: "whole-map reads (connection table scans, sync)",
        without: Some("whole-map reads go key by key"),
    },
    Feature {
        name: "bpf_get_netns_cookie in cgroup socket hooks",
        since: (5, 7),
        used_by: "socket load balancing",
        without: Some("socket load balancing is off"),
    },
    Feature {
        name: "ring buffer maps",
        since: (5, 8),
        used_by: "lbctl trace (the object holds its ring buffer)",
        without: None,
    },
    Feature {
        name: "cgroup getpeername hooks",
        since: (5, 8),
        used_by: "socket load balancing",
        without: Some("socket load balancing is off"),
    },
    Feature {
        name: "bpf_link for XDP",
        since: (5, 9),
        used_by: "the pinned XDP link (forwarding survives an lbd restart)",
        without: None,
    },
    Feature {
        name: "bpf_ktime_get_coarse_ns",
        since: (5, 11),
        used_by: "lb_xdp (flow cache ages, flood mode)",
        without: None,
    },
    Feature {
        name: "bpf_check_mtu",
        since: (5, 12),
        used_by: "lb_xdp (a GRO merge in generic mode is wrapped whole, not answered as too big)",
        without: None,
    },
    Feature {
        name: "SO_NETNS_COOKIE",
        since: (5, 14),
        used_by: "socket load balancing (the hooks act in lbd's network namespace only)",
        without: Some("socket load balancing is off"),
    },
];

/// The oldest mainline release with every feature the data plane cannot run without.
pub fn oldest_supported() -> (u32, u32) {
    FEATURES
        .iter()
        .filter(|f| f.without.is_none())
        .map(|f| f.since)
        .max()
        .unwrap_or((0, 0))
}

/// The features `release`'s number suggests it lacks (a distribution kernel may have them).
pub fn lacking(release: &Release) -> Vec<&'static Feature> {
    FEATURES
        .iter()
        .filter(|f| release.version < f.since)
        .collect()
}

/// The verifier's reason in its log: the last line that says something (the log ends with its
/// statistics, after the reason).
pub fn verifier_reason(log: &str) -> Option<&str> {
    log.lines().map(str::trim).rfind(|l| {
        !l.is_empty()
            && !l.starts_with("processed ")
            && !l.starts_with("verification time")
            && !l.starts_with("stack depth")
            && !l.starts_with("max_states_per_insn")
    })
}

/// The error for a kernel that refused `program`: the kernel, the program, the verifier's
/// reason, and what the release number suggests the kernel lacks.
pub fn refused(release: Option<&Release>, program: &str, error: &str) -> String {
    let kernel = release.map_or_else(|| "of unknown release".to_string(), |r| r.to_string());
    // aya's message: "the BPF_PROG_LOAD syscall returned <errno>. Verifier output: <log>".
    let (head, log) = match error.split_once("Verifier output:") {
        Some((h, l)) => (h.trim().trim_end_matches('.'), l),
        None => (error.trim(), ""),
    };
    let mut out = format!("kernel {kernel} refused the data plane program {program}: ");
    match verifier_reason(log) {
        Some(reason) => out += &format!("{reason} ({head})"),
        None => out += head,
    }
    let (major, minor) = oldest_supported();
    if let Some(r) = release {
        let needed: Vec<String> = lacking(r)
            .into_iter()
            .filter(|f| f.without.is_none())
            .map(|f| format!("{} ({}.{})", f.name, f.since.0, f.since.1))
            .collect();
        if !needed.is_empty() {
            out += &format!(
                "; lb needs Linux {major}.{minor} or a kernel with its features, and by its number this one lacks: {}",
                needed.join(", ")
            );
        }
    }
    out
}

/// One line per optional feature `release`'s number suggests it lacks: what lbd does without.
pub fn without_optional(release: &Release) -> Vec<String> {
    lacking(release)
        .into_iter()
        .filter_map(|f| {
            f.without.map(|w| {
                format!(
                    "kernel {release} may lack {} (Linux {}.{}): {w}",
                    f.name, f.since.0, f.since.1
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_as_uname_prints_them() {
        let r = Release::parse("6.1.0-56-amd64\n").unwrap();
        assert_eq!((r.text.as_str(), r.version), ("6.1.0-56-amd64", (6, 1)));
        assert_eq!(
            Release::parse("5.14.0-427.13.1.el9_4.x86_64")
                .unwrap()
                .version,
            (5, 14)
        );
        assert_eq!(Release::parse("6.18.44-fc-v657").unwrap().version, (6, 18));
        assert!(Release::parse("linux").is_none());
    }

    #[test]
    fn the_oldest_supported_release_is_the_newest_required_feature() {
        assert_eq!(oldest_supported(), (5, 12));
        // RHEL 9's number has every feature; Debian 11's lacks required ones.
        assert!(lacking(&Release::parse("5.14.0-427.el9.x86_64").unwrap()).is_empty());
        let old = lacking(&Release::parse("5.10.0-30-amd64").unwrap());
        assert!(old.iter().any(|f| f.name == "bpf_ktime_get_coarse_ns"));
    }

    #[test]
    fn a_refusal_names_the_kernel_and_the_verifiers_reason_not_the_whole_log() {
        let r = Release::parse("6.1.0-56-amd64").unwrap();
        let error = "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: 0: R1=ctx() R10=fp0\n; let x = 1\n1: (b7) r0 = 0\ncombined stack size of 2 calls is 544. Too large\nverification time 1234 usec\nstack depth 240+272\nprocessed 1204 insns (limit 1000000) max_states_per_insn 4 total_states 90 peak_states 90 mark_read 22\n";
        let m = refused(Some(&r), "lb_xdp", error);
        assert_eq!(
            m,
            "kernel 6.1.0-56-amd64 refused the data plane program lb_xdp: combined stack size of 2 calls is 544. Too large (the BPF_PROG_LOAD syscall returned Permission denied (os error 13))"
        );
        // An old kernel: what it lacks by its number, too.
        let old = Release::parse("5.10.0-30-amd64").unwrap();
        let m = refused(
            Some(&old),
            "lb_xdp",
            "the BPF_PROG_LOAD syscall returned Invalid argument (os error 22). Verifier output: 12: (85) call unknown#160\ninvalid func unknown#160\n",
        );
        assert!(m.starts_with("kernel 5.10.0-30-amd64 refused the data plane program lb_xdp: invalid func unknown#160"), "{m}");
        assert!(m.contains("bpf_ktime_get_coarse_ns (5.11)"), "{m}");
        assert!(!m.contains("R10=fp0"), "{m}");
    }

    #[test]
    fn optional_features_say_what_lbd_does_without_them() {
        let r = Release::parse("5.12.0-1-amd64").unwrap();
        let lines = without_optional(&r);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("SO_NETNS_COOKIE")
                && lines[0].contains("socket load balancing is off")
        );
        assert!(without_optional(&Release::parse("6.1.0-56-amd64").unwrap()).is_empty());
    }
}
