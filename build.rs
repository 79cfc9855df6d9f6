//! Records the git commit the binary was built from (reports carry it as
//! `foldprint.git`). A FOLDPRINT_GIT_REV set by the packaging (Nix,
//! containers) wins; outside a git checkout it stays `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FOLDPRINT_GIT_REV");
    if std::env::var_os("FOLDPRINT_GIT_REV").is_some() {
        return;
    }
    let Some(rev) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    // Rebuild when HEAD moves: HEAD itself, the branch it names, packed
    // refs (only paths that exist: a missing one would rerun every build).
    let mut watch = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        watch.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(name)) = (
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
        git(&["rev-parse", "--symbolic-full-name", "HEAD"]),
    ) {
        if name.starts_with("refs/") {
            watch.push(format!("{common}/{name}"));
        }
        watch.push(format!("{common}/packed-refs"));
    }
    for path in watch {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=FOLDPRINT_GIT_REV={rev}");
}
