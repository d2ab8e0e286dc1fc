//! Distribution kernels of the matrix that the host's own apt suites do not carry: Debian's
//! other suites, from the archive the host's apt already uses, fetched with apt itself (a
//! private sources list, lists and cache under `target/vm/apt`, so the host's apt state is not
//! touched) and unpacked where the VM runner finds them: the vmlinuz in `target/vm/kernels/`
//! (not /boot, where the host's boot loader would offer it), the modules in
//! `/lib/modules/<release>` with their `depmod` indexes (virtme-ng builds the guest's initramfs
//! from there). Nothing is installed through dpkg: a kernel of another suite depends on that
//! suite's kmod and initramfs-tools, which the host keeps its own of.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

/// Suites whose current `linux-image-amd64` joins the matrix, with how their releases begin:
/// Debian 13 (trixie, the 6.12 LTS series), the stable release; Debian 11 (bullseye, 5.10),
/// older than lb supports, where the matrix checks that lbd refuses it by name. Debian 12's
/// kernel comes from the host's apt (`linux-image-amd64` in `DEBIAN_PACKAGES`).
pub const SUITES: &[(&str, &str)] = &[("trixie", "6.12."), ("bullseye", "5.10.")];

/// The keyring the host's Debian archive is signed with (it holds the keys of 11, 12 and 13).
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// Where the vmlinuz files of these kernels go (under `target/vm`).
pub fn kernel_dir(work: &Path) -> PathBuf {
    work.join("kernels")
}

/// Fetch and unpack each suite's kernel, unless a kernel of that suite is there already.
pub fn install(work: &Path) {
    for (suite, series) in SUITES {
        if let Some(release) = present(work, series) {
            eprintln!("{suite}'s kernel present: {release}");
            continue;
        }
        // A suite the archive no longer serves (an old release leaves the main archive) leaves
        // its kernel out of the matrix, loudly: `target/vm/matrix.json` lists the kernels that
        // ran.
        match fetch(suite, work) {
            Ok(release) => eprintln!("{suite}'s kernel unpacked: {release}"),
            Err(e) => eprintln!("WARNING: Debian {suite}'s kernel left out of the matrix: {e:#}"),
        }
    }
}

/// The release of a series' kernel already unpacked (its vmlinuz and its module indexes).
fn present(work: &Path, series: &str) -> Option<String> {
    std::fs::read_dir(kernel_dir(work)).ok()?.find_map(|e| {
        let name = e.ok()?.file_name().to_string_lossy().to_string();
        let release = name.strip_prefix("vmlinuz-")?;
        (release.starts_with(series)
            && Path::new("/lib/modules")
                .join(release)
                .join("modules.dep")
                .exists())
        .then(|| release.to_string())
    })
}

/// The archive URI the host's apt uses for its own release (`codename`), from deb822 `.sources`
/// texts and one-line `sources.list` texts.
pub fn archive_of(codename: &str, deb822: &[String], one_line: &[String]) -> Option<String> {
    let from_deb822 = deb822.iter().flat_map(|t| t.split("\n\n")).find_map(|p| {
        let field = |name: &str| {
            p.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let debs = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let suite = field("Suites").is_some_and(|s| s.split_whitespace().any(|s| s == codename));
        (debs && suite)
            .then(|| field("URIs"))??
            .split_whitespace()
            .next()
            .map(String::from)
    });
    from_deb822.or_else(|| {
        one_line.iter().flat_map(|t| t.lines()).find_map(|l| {
            let mut words = l.split_whitespace().filter(|w| !w.starts_with('['));
            (words.next()? == "deb").then_some(())?;
            // Options in brackets may span words: skip to the URI.
            let rest: Vec<&str> = words.skip_while(|w| w.ends_with(']')).collect();
            let (uri, suite) = (rest.first()?, rest.get(1)?);
            (*suite == codename).then(|| uri.to_string())
        })
    })
}

/// The host's archive, read from its apt sources.
fn host_archive() -> Result<String> {
    let os = std::fs::read_to_string("/etc/os-release").context("read /etc/os-release")?;
    let codename = os
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .context("no VERSION_CODENAME in /etc/os-release")?
        .trim_matches('"');
    let read_dir = |ext: &str| -> Vec<String> {
        std::fs::read_dir("/etc/apt/sources.list.d")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == ext))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect()
    };
    let mut one_line = read_dir("list");
    one_line.extend(std::fs::read_to_string("/etc/apt/sources.list").ok());
    archive_of(codename, &read_dir("sources"), &one_line)
        .with_context(|| format!("no apt source of Debian {codename} on this host"))
}

/// The package `linux-image-amd64` depends on, from `apt-cache depends`'s output.
pub fn image_of(depends: &str) -> Option<String> {
    depends.lines().find_map(|l| {
        let dep = l.trim().strip_prefix("Depends:")?.trim();
        dep.starts_with("linux-image-").then(|| dep.to_string())
    })
}

fn fetch(suite: &str, work: &Path) -> Result<String> {
    let dir = work.join(format!("apt-{suite}"));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["lists/partial", "parts", "debs"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    // An empty dpkg status: the host's installed linux-image-amd64 (its own release's) must
    // not stand in for this suite's.
    std::fs::write(dir.join("status"), "")?;
    let sources = dir.join("sources.list");
    std::fs::write(
        &sources,
        format!(
            "deb [signed-by={KEYRING}] {} {suite} main\n",
            host_archive()?
        ),
    )?;
    // apt with this suite alone: the host's sources, lists, caches and status untouched.
    let apt = |program: &str| {
        let mut c = Command::new(program);
        for (k, v) in [
            ("Dir::Etc::SourceList", sources.clone()),
            ("Dir::Etc::SourceParts", dir.join("parts")),
            ("Dir::State::Lists", dir.join("lists")),
            ("Dir::State::status", dir.join("status")),
            // Downloads land in this root-owned directory: no drop to the `_apt` user.
            ("APT::Sandbox::User", PathBuf::from("root")),
            ("Dir::Cache::pkgcache", PathBuf::new()),
            ("Dir::Cache::srcpkgcache", PathBuf::new()),
        ] {
            c.arg("-o").arg(format!("{k}={}", v.display()));
        }
        c
    };
    crate::run(apt("apt-get").args(["-q", "update"]))?;
    let out = apt("apt-cache")
        .args(["depends", "linux-image-amd64"])
        .output()
        .context("run apt-cache")?;
    let package = image_of(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("linux-image-amd64 of {suite} depends on no linux-image"))?;
    let release = package
        .strip_prefix("linux-image-")
        .unwrap_or(&package)
        .to_string();
    crate::run(
        apt("apt-get")
            .args(["-q", "download", &package])
            .current_dir(dir.join("debs")),
    )?;
    let deb = std::fs::read_dir(dir.join("debs"))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| format!("apt-get download {package} left no .deb"))?;
    let tree = dir.join("tree");
    crate::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let vmlinuz = tree.join(format!("boot/vmlinuz-{release}"));
    let modules: PathBuf = ["usr/lib/modules", "lib/modules"]
        .iter()
        .map(|m| tree.join(m).join(&release))
        .find(|p| p.exists())
        .with_context(|| format!("{package} holds no modules for {release}"))?;
    if !vmlinuz.exists() {
        bail!("{package} holds no {}", vmlinuz.display());
    }
    // Modules first, the vmlinuz last: `present` looks for both, the matrix for the vmlinuz.
    let target = Path::new("/lib/modules").join(&release);
    let _ = std::fs::remove_dir_all(&target);
    crate::run(Command::new("cp").arg("-a").arg(&modules).arg(&target))?;
    crate::run(Command::new("depmod").arg(&release))?;
    std::fs::create_dir_all(kernel_dir(work))?;
    std::fs::copy(
        &vmlinuz,
        kernel_dir(work).join(format!("vmlinuz-{release}")),
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_what_the_meta_package_depends_on() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.12.117+deb13-amd64\n";
        assert_eq!(
            image_of(out).as_deref(),
            Some("linux-image-6.12.117+deb13-amd64")
        );
        assert_eq!(image_of("linux-image-amd64\n  Depends: kmod\n"), None);
    }

    #[test]
    fn the_archive_is_the_hosts_own_for_its_release() {
        let deb822 = vec![
            "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\
             Components: main\n\n\
             Types: deb deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
             Components: main\n"
                .to_string(),
        ];
        assert_eq!(
            archive_of("bookworm", &deb822, &[]).as_deref(),
            Some("http://mirror.example/debian")
        );
        let one_line = vec![
            "# deb http://old.example/debian bookworm main\n\
             deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/d bookworm main\n"
                .to_string(),
        ];
        assert_eq!(
            archive_of("bookworm", &[], &one_line).as_deref(),
            Some("http://mirror.example/d")
        );
        assert_eq!(archive_of("trixie", &deb822, &one_line), None);
    }
}
