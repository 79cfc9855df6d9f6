//! foldprint's cache directory, `$XDG_CACHE_HOME/foldprint` (else
//! `~/.cache/foldprint`). The kernel cache (`kernels/`) and the file-hash
//! memo (`file-sha256/`) both live in it; the location is here, below both,
//! so library provenance ([`super::mapped`]) needs nothing of the kernel
//! cache to find its memo.

use std::path::PathBuf;

/// Where foldprint caches for this process, if anywhere: an absolute
/// `XDG_CACHE_HOME` (the XDG rule ignores relative ones), else `$HOME/.cache`.
pub fn root() -> Option<PathBuf> {
    root_from(
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

fn root_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    let base = match xdg {
        Some(x) if x.is_absolute() => x,
        _ => home.filter(|h| h.is_absolute())?.join(".cache"),
    };
    Some(base.join("foldprint"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_follows_xdg_then_home() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(
            root_from(p("/x/cache"), p("/home/u")),
            p("/x/cache/foldprint")
        );
        assert_eq!(root_from(None, p("/home/u")), p("/home/u/.cache/foldprint"));
        // A relative XDG_CACHE_HOME is ignored, as the XDG rule says.
        assert_eq!(
            root_from(p("rel"), p("/home/u")),
            p("/home/u/.cache/foldprint")
        );
        assert_eq!(root_from(None, None), None);
        assert_eq!(root_from(None, p("")), None);
    }
}
