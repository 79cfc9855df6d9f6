//! The audit matrix: a TOML file naming experiments, defaults and
//! `[[config]]` entries, parsed strictly (unknown keys rejected) into
//! validated [`Config`]s. Every error names the file, line and column, in
//! the same [`InputError`] as experiment files.

use super::pins::{self, Family, LibRequest};
use crate::backend::BackendChoice;
use crate::digest::NanPolicy;
use crate::experiment::InputError;
use crate::gpu::Target;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Default wall-clock limit of one configuration's child run.
pub const DEFAULT_TIMEOUT_S: u64 = 1800;
/// Most configurations one matrix may declare.
pub const MAX_CONFIGS: usize = 256;

/// Flags of `run` that the matrix sets itself (through its own keys) or
/// that would redirect the child's output; `args` may not repeat them.
const RESERVED_FLAGS: [&str; 11] = [
    "--json",
    "--out",
    "--dump",
    "--junit",
    "--backend",
    "--nan-policy",
    "--kernel",
    "--target",
    "--block",
    "--copy-streams",
    "--ftz",
];

/// Settings that may appear in `[defaults]` and in each `[[config]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    backend: Option<Spanned<String>>,
    nvrtc: Option<Spanned<String>>,
    nccl: Option<Spanned<String>>,
    target: Option<Spanned<String>>,
    kernel: Option<Spanned<String>>,
    block: Option<Spanned<i64>>,
    copy_streams: Option<Spanned<i64>>,
    ftz: Option<Spanned<bool>>,
    nan_policy: Option<Spanned<String>>,
    env: Option<Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    args: Option<Spanned<Vec<Spanned<String>>>>,
}

impl RawSettings {
    /// `over`'s values where set, else ours; `env` merges key by key.
    fn overlay(&self, over: &RawSettings) -> RawSettings {
        let env = match (&self.env, &over.env) {
            (Some(base), Some(top)) => {
                let mut merged = base.get_ref().clone();
                for (k, v) in top.get_ref() {
                    merged.insert(k.clone(), v.clone());
                }
                Some(Spanned::new(top.span(), merged))
            }
            (base, top) => top.clone().or_else(|| base.clone()),
        };
        RawSettings {
            backend: over.backend.clone().or_else(|| self.backend.clone()),
            nvrtc: over.nvrtc.clone().or_else(|| self.nvrtc.clone()),
            nccl: over.nccl.clone().or_else(|| self.nccl.clone()),
            target: over.target.clone().or_else(|| self.target.clone()),
            kernel: over.kernel.clone().or_else(|| self.kernel.clone()),
            block: over.block.clone().or_else(|| self.block.clone()),
            copy_streams: over
                .copy_streams
                .clone()
                .or_else(|| self.copy_streams.clone()),
            ftz: over.ftz.clone().or_else(|| self.ftz.clone()),
            nan_policy: over.nan_policy.clone().or_else(|| self.nan_policy.clone()),
            env,
            args: over.args.clone().or_else(|| self.args.clone()),
        }
    }
}

/// `[[config]]` as written (serde cannot combine `flatten` with
/// `deny_unknown_fields`, hence the field list repeated).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    name: Spanned<String>,
    control: Option<Spanned<bool>>,
    backend: Option<Spanned<String>>,
    nvrtc: Option<Spanned<String>>,
    nccl: Option<Spanned<String>>,
    target: Option<Spanned<String>>,
    kernel: Option<Spanned<String>>,
    block: Option<Spanned<i64>>,
    copy_streams: Option<Spanned<i64>>,
    ftz: Option<Spanned<bool>>,
    nan_policy: Option<Spanned<String>>,
    env: Option<Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    args: Option<Spanned<Vec<Spanned<String>>>>,
}

impl RawConfig {
    fn settings(&self) -> RawSettings {
        RawSettings {
            backend: self.backend.clone(),
            nvrtc: self.nvrtc.clone(),
            nccl: self.nccl.clone(),
            target: self.target.clone(),
            kernel: self.kernel.clone(),
            block: self.block.clone(),
            copy_streams: self.copy_streams.clone(),
            ftz: self.ftz.clone(),
            nan_policy: self.nan_policy.clone(),
            env: self.env.clone(),
            args: self.args.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatrix {
    name: Option<Spanned<String>>,
    description: Option<String>,
    experiments: Spanned<Vec<Spanned<String>>>,
    timeout_s: Option<Spanned<i64>>,
    oracle: Option<bool>,
    defaults: Option<RawSettings>,
    #[serde(default, rename = "config")]
    configs: Vec<RawConfig>,
}

/// One configuration, validated: what its child run is given.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub name: String,
    /// A negative control: expected to change digests, never the baseline.
    pub control: bool,
    pub backend: String,
    pub nvrtc: Option<LibRequest>,
    pub nccl: Option<LibRequest>,
    pub target: Option<String>,
    pub kernel: Option<String>,
    pub block: Option<u32>,
    pub copy_streams: Option<u32>,
    pub ftz: Option<bool>,
    pub nan_policy: NanPolicy,
    pub env: BTreeMap<String, String>,
    /// Extra `run` arguments, passed through verbatim.
    pub args: Vec<String>,
}

impl Config {
    /// The libraries this configuration asks for.
    pub fn requests(&self) -> Vec<&LibRequest> {
        self.nvrtc.iter().chain(self.nccl.iter()).collect()
    }

    /// `run` arguments after `run`, before the experiment paths.
    pub fn run_args(&self) -> Vec<String> {
        let mut a = vec![
            "run".to_string(),
            "--json".to_string(),
            "--backend".to_string(),
            self.backend.clone(),
            "--nan-policy".to_string(),
            self.nan_policy.name().to_string(),
            "--no-kernel-cache".to_string(),
        ];
        let mut push = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(flag.to_string());
                a.push(v);
            }
        };
        push("--kernel", self.kernel.clone());
        push("--target", self.target.clone());
        push("--block", self.block.map(|b| b.to_string()));
        push("--copy-streams", self.copy_streams.map(|c| c.to_string()));
        if self.ftz == Some(true) {
            a.push("--ftz".to_string());
        }
        a.extend(self.args.iter().cloned());
        a
    }

    /// A one-line summary of what differs from `run`'s defaults.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = &self.target {
            parts.push(format!("target={t}"));
        }
        if let Some(k) = &self.kernel {
            parts.push(format!("kernel={k}"));
        }
        if let Some(b) = self.block {
            parts.push(format!("block={b}"));
        }
        if let Some(c) = self.copy_streams {
            parts.push(format!("copy_streams={c}"));
        }
        if let Some(f) = self.ftz {
            parts.push(format!("ftz={f}"));
        }
        if self.nan_policy != NanPolicy::Canonical {
            parts.push(format!("nan_policy={}", self.nan_policy));
        }
        for (k, v) in &self.env {
            parts.push(format!("{k}={v}"));
        }
        if !self.args.is_empty() {
            parts.push(format!("args=[{}]", self.args.join(" ")));
        }
        if parts.is_empty() {
            "defaults".to_string()
        } else {
            parts.join(" ")
        }
    }
}

/// A parsed, validated audit matrix.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub description: String,
    pub path: PathBuf,
    /// SHA-256 of the file's bytes.
    pub sha256: String,
    /// Experiment paths as written (after `${VAR}` expansion).
    pub experiments_written: Vec<String>,
    /// The same, absolute (relative ones are taken from the matrix's directory).
    pub experiments: Vec<PathBuf>,
    pub timeout: std::time::Duration,
    /// Run every case on the CPU oracle (one more child), with the contract's
    /// negative controls.
    pub oracle: bool,
    pub configs: Vec<Config>,
}

impl Matrix {
    /// Index of the baseline: the first configuration that is not a control.
    pub fn baseline(&self) -> usize {
        self.configs.iter().position(|c| !c.control).unwrap_or(0)
    }
}

struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn line_col(&self, offset: usize) -> (usize, usize) {
        crate::experiment::line_col(self.text, offset)
    }

    fn at(&self, span: Range<usize>, message: impl Into<String>) -> InputError {
        InputError::at(self.path, self.text, span.start, message)
    }
}

/// Read and validate a matrix file.
pub fn load(path: &Path) -> Result<Matrix, InputError> {
    let text = crate::experiment::read_text(path)?;
    parse(path, &text, &|name| std::env::var(name).ok())
}

/// Parse matrix text; `path` locates relative paths and names errors,
/// `lookup` answers `${VAR}` in paths.
pub fn parse(
    path: &Path,
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Matrix, InputError> {
    let src = Source { path, text };
    let raw: RawMatrix = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        src.at(span, e.message().trim_end().to_string())
    })?;
    let base_dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let resolve = |written: &str| -> PathBuf {
        let p = Path::new(written);
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            base_dir.join(p)
        };
        // Real paths where they exist (no `dir/../x` in reports), else absolute.
        std::fs::canonicalize(&joined)
            .or_else(|_| std::path::absolute(&joined))
            .unwrap_or(joined)
    };
    let expand_at = |s: &Spanned<String>, what: &str| -> Result<String, InputError> {
        expand_vars(s.get_ref(), lookup).map_err(|m| src.at(s.span(), format!("{what}: {m}")))
    };

    let name = match &raw.name {
        Some(n) => {
            check_name(n.get_ref()).map_err(|m| src.at(n.span(), format!("field `name`: {m}")))?;
            n.get_ref().clone()
        }
        None => path
            .file_stem()
            .map_or("audit".into(), |s| s.to_string_lossy().into_owned()),
    };

    if raw.experiments.get_ref().is_empty() {
        return Err(src.at(
            raw.experiments.span(),
            "field `experiments`: name at least one experiment file or directory",
        ));
    }
    let mut experiments_written = Vec::new();
    let mut experiments = Vec::new();
    for e in raw.experiments.get_ref() {
        let written = expand_at(e, "field `experiments`")?;
        if written.trim().is_empty() {
            return Err(src.at(e.span(), "field `experiments`: empty path"));
        }
        experiments.push(resolve(&written));
        experiments_written.push(written);
    }

    let timeout_s = match &raw.timeout_s {
        None => DEFAULT_TIMEOUT_S,
        Some(t) => {
            let v = *t.get_ref();
            if !(1..=86_400).contains(&v) {
                return Err(src.at(
                    t.span(),
                    format!("field `timeout_s`: must be 1 ..= 86400 seconds, got {v}"),
                ));
            }
            v as u64
        }
    };

    if raw.configs.is_empty() {
        return Err(InputError::File {
            path: path.to_path_buf(),
            message: "declares no configurations (add [[config]] tables)".into(),
        });
    }
    if raw.configs.len() > MAX_CONFIGS {
        return Err(src.at(
            raw.configs[MAX_CONFIGS].name.span(),
            format!("more than {MAX_CONFIGS} configurations"),
        ));
    }
    let defaults = raw.defaults.clone().unwrap_or_default();
    let mut configs = Vec::new();
    let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
    for rc in &raw.configs {
        let cname = rc.name.get_ref().clone();
        check_name(&cname).map_err(|m| src.at(rc.name.span(), format!("field `name`: {m}")))?;
        if let Some(prev) = seen.get(&cname) {
            let (line, column) = src.line_col(prev.start);
            return Err(src.at(
                rc.name.span(),
                format!("duplicate configuration name `{cname}` (first used at {line}:{column})"),
            ));
        }
        seen.insert(cname.clone(), rc.name.span());
        let s = defaults.overlay(&rc.settings());
        let ctx = |field: &str| format!("config `{cname}`: field `{field}`");

        let backend = match &s.backend {
            None => {
                return Err(src.at(
                    rc.name.span(),
                    format!(
                        "config `{cname}`: no `backend` (set it here or in [defaults]: {})",
                        backend_names().join(", ")
                    ),
                ))
            }
            Some(b) => {
                let v = b.get_ref().trim();
                if <BackendChoice as clap::ValueEnum>::from_str(v, false).is_err() {
                    return Err(src.at(
                        b.span(),
                        format!(
                            "{}: unknown backend `{v}` (this foldprint knows {})",
                            ctx("backend"),
                            backend_names().join(", ")
                        ),
                    ));
                }
                v.to_string()
            }
        };

        let library = |field: &str,
                       value: &Option<Spanned<String>>,
                       family: Family|
         -> Result<Option<LibRequest>, InputError> {
            let Some(v) = value else { return Ok(None) };
            let written = expand_at(v, &ctx(field))?;
            if written.trim().is_empty() {
                // "" (or an empty `${VAR:-}`): no particular library.
                return Ok(None);
            }
            let given = resolve(&written);
            let file = pins::resolve(family, &given)
                .map_err(|m| src.at(v.span(), format!("{}: {m}", ctx(field))))?;
            Ok(Some(LibRequest {
                family,
                written,
                given,
                file,
            }))
        };
        let nvrtc = library("nvrtc", &s.nvrtc, Family::Nvrtc)?;
        let nccl = library("nccl", &s.nccl, Family::Nccl)?;

        let target = match &s.target {
            None => None,
            Some(t) => {
                let v = t.get_ref().trim();
                // Checked here with `run`'s own parser; passed on as written.
                v.parse::<Target>()
                    .map_err(|m| src.at(t.span(), format!("{}: {m}", ctx("target"))))?;
                Some(v.to_string())
            }
        };
        let kernel = match &s.kernel {
            None => None,
            Some(k) => {
                let v = k.get_ref().trim();
                // The words `--kernel` takes, from the one enum clap reads.
                if <crate::gpu::KernelVariant as clap::ValueEnum>::from_str(v, false).is_err() {
                    return Err(src.at(
                        k.span(),
                        format!("{}: `{v}`: expected fast or seed", ctx("kernel")),
                    ));
                }
                Some(v.to_string())
            }
        };
        let block = match &s.block {
            None => None,
            Some(b) => {
                let v = *b.get_ref();
                if !(32..=1024).contains(&v) {
                    return Err(src.at(
                        b.span(),
                        format!(
                            "{}: must be 32 ..= 1024 threads (the backend clamps to that range), got {v}",
                            ctx("block")
                        ),
                    ));
                }
                Some(v as u32)
            }
        };
        let copy_streams = match &s.copy_streams {
            None => None,
            Some(c) => {
                let v = *c.get_ref();
                if !(0..=64).contains(&v) {
                    return Err(src.at(
                        c.span(),
                        format!("{}: must be 0 ..= 64, got {v}", ctx("copy_streams")),
                    ));
                }
                Some(v as u32)
            }
        };
        let nan_policy = match &s.nan_policy {
            None => NanPolicy::Canonical,
            Some(p) => p
                .get_ref()
                .trim()
                .parse()
                .map_err(|m| src.at(p.span(), format!("{}: {m}", ctx("nan_policy"))))?,
        };
        let mut env = BTreeMap::new();
        if let Some(e) = &s.env {
            for (k, v) in e.get_ref() {
                check_env_name(k.get_ref())
                    .map_err(|m| src.at(k.span(), format!("{}: {m}", ctx("env"))))?;
                if v.get_ref().contains('\0') {
                    return Err(src.at(
                        v.span(),
                        format!(
                            "{}: value of `{}` holds a NUL byte",
                            ctx("env"),
                            k.get_ref()
                        ),
                    ));
                }
                env.insert(k.get_ref().clone(), v.get_ref().clone());
            }
        }
        let mut args = Vec::new();
        if let Some(a) = &s.args {
            for arg in a.get_ref() {
                let v = arg.get_ref();
                if let Some(flag) = RESERVED_FLAGS
                    .iter()
                    .find(|f| v == *f || v.starts_with(&format!("{f}=")))
                {
                    return Err(src.at(
                        arg.span(),
                        format!(
                            "{}: `{flag}` is set by the audit itself{}",
                            ctx("args"),
                            match *flag {
                                "--json" | "--out" | "--dump" | "--junit" => String::new(),
                                f => format!(
                                    " (use the matrix key `{}`)",
                                    f.trim_start_matches("--").replace('-', "_")
                                ),
                            }
                        ),
                    ));
                }
                if v.contains('\0') {
                    return Err(src.at(arg.span(), format!("{}: NUL byte", ctx("args"))));
                }
                args.push(v.clone());
            }
        }
        configs.push(Config {
            name: cname.clone(),
            control: rc.control.as_ref().is_some_and(|c| *c.get_ref()),
            backend,
            nvrtc,
            nccl,
            target,
            kernel,
            block,
            copy_streams,
            ftz: s.ftz.as_ref().map(|f| *f.get_ref()),
            nan_policy,
            env,
            args,
        });
    }
    if configs.iter().all(|c| c.control) {
        return Err(InputError::File {
            path: path.to_path_buf(),
            message: "every configuration is a control: the first one without `control = true` is the baseline".into(),
        });
    }
    Ok(Matrix {
        name,
        description: raw.description.unwrap_or_default(),
        path: path.to_path_buf(),
        sha256: hex::encode(Sha256::digest(text.as_bytes())),
        experiments_written,
        experiments,
        timeout: std::time::Duration::from_secs(timeout_s),
        oracle: raw.oracle.unwrap_or(true),
        configs,
    })
}

fn backend_names() -> Vec<String> {
    <BackendChoice as clap::ValueEnum>::value_variants()
        .iter()
        .filter_map(|v| clap::ValueEnum::to_possible_value(v).map(|p| p.get_name().to_string()))
        .collect()
}

/// Configuration and matrix names become directory names.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if name.starts_with('.')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "`{name}`: use letters, digits, '-', '_' or '.' (not first): it names a directory under --keep"
        ));
    }
    Ok(())
}

fn check_env_name(k: &str) -> Result<(), String> {
    let mut chars = k.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!(
            "`{k}` is not an environment variable name (letters, digits, '_'; not a digit first)"
        ))
    }
}

/// Expand `${NAME}` and `${NAME:-default}` (an empty value counts as unset,
/// as in the shell); any other `$` is literal.
pub fn expand_vars(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{s}`: `${{` without a closing `}}`"))?;
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        check_env_name(name).map_err(|m| format!("`{s}`: {m}"))?;
        match lookup(name).filter(|v| !v.is_empty()) {
            Some(v) => out.push_str(&v),
            None => match default {
                Some(d) => out.push_str(d),
                None => {
                    return Err(format!(
                        "`{s}`: environment variable `{name}` is not set (set it, or write ${{{name}:-/default/path}})"
                    ))
                }
            },
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn err(text: &str) -> String {
        parse(Path::new("m.toml"), text, &no_env)
            .expect_err("must be rejected")
            .to_string()
    }

    const OK: &str = r#"
experiments = ["e.toml"]
[defaults]
backend = "cpu"
env = { A = "1", B = "2" }
[[config]]
name = "base"
[[config]]
name = "b3"
env = { B = "3" }
block = 128
[[config]]
name = "ctl"
control = true
nan_policy = "preserve"
"#;

    #[test]
    fn defaults_overlay_and_env_merges() {
        let m = parse(Path::new("dir/m.toml"), OK, &no_env).unwrap();
        assert_eq!(m.configs.len(), 3);
        assert_eq!(m.baseline(), 0);
        let b3 = &m.configs[1];
        assert_eq!(b3.backend, "cpu");
        assert_eq!(b3.block, Some(128));
        assert_eq!(b3.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(b3.env.get("B").map(String::as_str), Some("3"));
        assert!(m.configs[2].control);
        assert_eq!(m.configs[2].nan_policy, NanPolicy::Preserve);
        assert!(m.experiments[0].is_absolute());
        assert!(m.experiments[0].ends_with("dir/e.toml"));
        let args = b3.run_args();
        assert!(args.windows(2).any(|w| w == ["--block", "128"]), "{args:?}");
        assert!(
            args.windows(2).any(|w| w == ["--backend", "cpu"]),
            "{args:?}"
        );
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = err(
            "experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"cpu\"\nblcok = 3\n",
        );
        assert!(e.starts_with("m.toml:5:1:"), "{e}");
        assert!(e.contains("blcok"), "{e}");
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"gpu\"\n");
        assert!(
            e.starts_with("m.toml:4:11:") && e.contains("unknown backend `gpu`"),
            "{e}"
        );
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"cpu\"\nblock = 4096\n");
        assert!(
            e.starts_with("m.toml:5:9:") && e.contains("32 ..= 1024"),
            "{e}"
        );
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"cpu\"\ntarget = \"sm90\"\n");
        assert!(e.contains("expected auto, sm_XY"), "{e}");
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"cpu\"\nenv = { \"1X\" = \"a\" }\n");
        assert!(e.starts_with("m.toml:5:") && e.contains("`1X`"), "{e}");
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"cpu\"\nargs = [\"--out=x\"]\n");
        assert!(e.contains("`--out` is set by the audit"), "{e}");
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\n");
        assert!(e.contains("no `backend`"), "{e}");
        let e = err("experiments = [\"e.toml\"]\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\n[[config]]\nname = \"a\"\n");
        assert!(
            e.starts_with("m.toml:7:8:")
                && e.contains("duplicate configuration name `a` (first used at 5:8)"),
            "{e}"
        );
        let e = err("experiments = [\"e.toml\"]\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\ncontrol = true\n");
        assert!(e.contains("every configuration is a control"), "{e}");
        let e = err("experiments = []\n[[config]]\nname = \"a\"\nbackend = \"cpu\"\n");
        assert!(e.contains("at least one experiment"), "{e}");
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a/b\"\nbackend = \"cpu\"\n");
        assert!(e.contains("letters, digits"), "{e}");
    }

    #[test]
    fn missing_library_is_an_input_error_at_its_line() {
        let e = err("experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"cuda\"\nnvrtc = \"/no/such/libnvrtc.so.99\"\n");
        assert!(e.starts_with("m.toml:5:9:"), "{e}");
        assert!(
            e.contains("/no/such/libnvrtc.so.99") && e.contains("does not exist"),
            "{e}"
        );
    }

    #[test]
    fn variables_expand_with_defaults() {
        let env = |n: &str| (n == "HOME_X").then(|| "/h".to_string());
        assert_eq!(expand_vars("${HOME_X}/lib", &env).unwrap(), "/h/lib");
        assert_eq!(expand_vars("${NOPE:-/d}/lib", &env).unwrap(), "/d/lib");
        assert_eq!(expand_vars("a$b", &env).unwrap(), "a$b");
        assert!(expand_vars("${NOPE}", &env)
            .unwrap_err()
            .contains("not set"));
        assert!(expand_vars("${HOME_X", &env)
            .unwrap_err()
            .contains("closing"));
        let empty = |_: &str| Some(String::new());
        assert_eq!(expand_vars("${E:-x}", &empty).unwrap(), "x");
    }
}
