//! Rank discovery from the environment the user's launcher sets:
//! foldprint's own variables, torchrun's, Slurm's or Open MPI's.
//!
//! A launcher started inside another's job inherits the outer one's
//! variables: mpirun or torchrun inside an sbatch script also sees
//! `SLURM_PROCID=0`, `foldprint launch` inside torchrun also sees `RANK`.
//! Believing one of them by a fixed order would let every rank of such a
//! job see "a world of 1" and pass. So every launcher whose rank *and*
//! world size are both set is read, and:
//! - if they agree on the rank and the world size, the first of them in the
//!   order above is used, and the others are named as agreeing;
//! - if they disagree, discovery refuses and names each launcher's
//!   variables, unless `FOLDPRINT_LAUNCHER` names the launcher to use
//!   (`foldprint launch` names itself for its ranks);
//! - a launcher with a rank but no world size (an sbatch script's
//!   `SLURM_PROCID` without `SLURM_NTASKS`) is ignored beside a complete
//!   one, and refused when it is the only one.
//!
//! Every value is checked here, naming its variable: a rank below the world
//! size, a world size of 1 ..= [`MAX_WORLD`], a port of 1 ..= 65535.

use super::RankError;
use crate::world_size::MAX_WORLD;
use serde::Serialize;

/// The variable that names the launcher to believe when several have set
/// their variables.
pub const LAUNCHER_VAR: &str = "FOLDPRINT_LAUNCHER";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    /// Which launcher's variables were used.
    pub source: &'static str,
    /// Where rank 0's rendezvous listens (host, port), when the launcher says.
    pub master: Option<(String, u16)>,
    /// The launcher's variables that were read, as they were set (and
    /// `FOLDPRINT_LAUNCHER`, when it chose the launcher).
    pub variables: Vec<(&'static str, String)>,
    /// The other launchers whose rank variables are set too, and how each
    /// was weighed.
    pub others: Vec<OtherLauncher>,
}

/// Another launcher's rank variables beside the ones used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherLauncher {
    pub source: &'static str,
    /// `agrees` (same rank and world size), `ignored` (`FOLDPRINT_LAUNCHER`
    /// chose another, which it disagrees with) or `incomplete` (a rank
    /// without a world size).
    pub verdict: &'static str,
    /// Its rank and world-size variables, as they were set.
    pub variables: Vec<(&'static str, String)>,
}

impl RankEnv {
    /// How the launcher was chosen, for reports: `None` when no other
    /// launcher's variables are set.
    pub fn launcher_note(&self) -> Option<String> {
        if self.others.is_empty() {
            return None;
        }
        let chosen = self.variables.iter().any(|(n, _)| *n == LAUNCHER_VAR);
        let mut parts: Vec<String> = Vec::new();
        if chosen {
            parts.push(format!("chosen by {LAUNCHER_VAR}"));
        }
        parts.extend(self.others.iter().map(|o| {
            let vars: Vec<String> = o
                .variables
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            format!("{} {} ({})", o.source, o.verdict, vars.join(", "))
        }));
        Some(parts.join("; "))
    }

    /// The other launchers as JSON, for reports: each one's name, verdict
    /// and variables.
    pub fn others_json(&self) -> serde_json::Value {
        self.others
            .iter()
            .map(|o| {
                serde_json::json!({
                    "launcher": o.source,
                    "verdict": o.verdict,
                    "variables": o.variables.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                })
            })
            .collect()
    }
}

struct Scheme {
    source: &'static str,
    rank: &'static str,
    world: &'static str,
    local: &'static str,
    addr: Option<&'static str>,
    port: Option<&'static str>,
}

const SCHEMES: [Scheme; 4] = [
    Scheme {
        source: "foldprint",
        rank: "FOLDPRINT_RANK",
        world: "FOLDPRINT_WORLD_SIZE",
        local: "FOLDPRINT_LOCAL_RANK",
        addr: Some("FOLDPRINT_MASTER_ADDR"),
        port: Some("FOLDPRINT_MASTER_PORT"),
    },
    Scheme {
        source: "torchrun",
        rank: "RANK",
        world: "WORLD_SIZE",
        local: "LOCAL_RANK",
        addr: Some("MASTER_ADDR"),
        port: Some("MASTER_PORT"),
    },
    Scheme {
        source: "slurm",
        rank: "SLURM_PROCID",
        world: "SLURM_NTASKS",
        local: "SLURM_LOCALID",
        addr: None,
        port: None,
    },
    Scheme {
        source: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local: "OMPI_COMM_WORLD_LOCAL_RANK",
        addr: None,
        port: None,
    },
];

/// Discover this process's rank from `get` (normally `std::env::var`).
/// `Ok(None)` when no launcher variables are set at all.
pub fn discover(get: impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>, RankError> {
    let present: Vec<&Scheme> = SCHEMES.iter().filter(|s| get(s.rank).is_some()).collect();
    let named = get(LAUNCHER_VAR).filter(|v| !v.trim().is_empty());
    if let Some(name) = named {
        let Some(s) = SCHEMES.iter().find(|s| s.source == name.trim()) else {
            let known: Vec<&str> = SCHEMES.iter().map(|s| s.source).collect();
            return Err(RankError::Env(format!(
                "{LAUNCHER_VAR}={name:?} names no launcher foldprint reads (one of {})",
                known.join(", ")
            )));
        };
        if get(s.rank).is_none() {
            return Err(RankError::Env(format!(
                "{LAUNCHER_VAR}={} but {} is not set: this process was not started by {}",
                s.source, s.rank, s.source
            )));
        }
        let mut e = read(s, &get)?;
        e.variables.push((LAUNCHER_VAR, name));
        // One that says the same rank and world (`launch --exec` sets
        // torchrun's variables beside ours) agrees; any other is ignored.
        e.others = present
            .iter()
            .filter(|o| o.source != s.source)
            .map(|o| {
                let same = read(o, &get).is_ok_and(|r| (r.rank, r.world) == (e.rank, e.world));
                o.other(if same { "agrees" } else { "ignored" }, &get)
            })
            .collect();
        return Ok(Some(e));
    }
    let (complete, partial): (Vec<&Scheme>, Vec<&Scheme>) =
        present.iter().partition(|s| get(s.world).is_some());
    if complete.is_empty() {
        // The first alone says which world size is missing.
        return present.first().map(|s| read(s, &get)).transpose();
    }
    let mut readings = complete
        .iter()
        .map(|s| read(s, &get))
        .collect::<Result<Vec<_>, _>>()?;
    let (rank, world) = (readings[0].rank, readings[0].world);
    if readings.iter().any(|r| (r.rank, r.world) != (rank, world)) {
        let each: Vec<String> = complete
            .iter()
            .zip(&readings)
            .map(|(s, r)| {
                format!(
                    "{} says rank {} of {} ({})",
                    s.source,
                    r.rank,
                    r.world,
                    s.rank_variables(&get)
                )
            })
            .collect();
        let sources: Vec<&str> = complete.iter().map(|s| s.source).collect();
        return Err(RankError::Env(format!(
            "launchers disagree: {}. A launcher started inside another's job (mpirun or \
             torchrun in an sbatch script) inherits the outer one's variables: set \
             {LAUNCHER_VAR} to the one that started this process ({})",
            each.join("; "),
            sources.join(" or ")
        )));
    }
    let mut e = readings.remove(0);
    e.others = complete[1..]
        .iter()
        .map(|s| s.other("agrees", &get))
        .chain(partial.iter().map(|s| s.other("incomplete", &get)))
        .collect();
    Ok(Some(e))
}

impl Scheme {
    /// `NAME=value, NAME=value` of its rank and world-size variables that are set.
    fn rank_variables(&self, get: &impl Fn(&str) -> Option<String>) -> String {
        let set: Vec<String> = [self.rank, self.world]
            .into_iter()
            .filter_map(|n| get(n).map(|v| format!("{n}={v}")))
            .collect();
        set.join(", ")
    }

    fn other(&self, verdict: &'static str, get: &impl Fn(&str) -> Option<String>) -> OtherLauncher {
        OtherLauncher {
            source: self.source,
            verdict,
            variables: [self.rank, self.world]
                .into_iter()
                .filter_map(|n| get(n).map(|v| (n, v)))
                .collect(),
        }
    }
}

/// `NAME="value" (launcher)`, for messages.
fn named(s: &Scheme, name: &str, v: &str) -> String {
    format!("{name}={v:?} ({} launcher)", s.source)
}

/// A whole number, or a message naming the variable.
fn whole(s: &Scheme, name: &str, v: &str) -> Result<usize, RankError> {
    v.trim().parse::<usize>().map_err(|_| {
        RankError::Env(format!(
            "{} is not a whole number from 0",
            named(s, name, v)
        ))
    })
}

/// Scheme `s`'s rank, world size, local rank and rank 0's address, each
/// checked (`s.rank` is set).
fn read(s: &Scheme, get: &impl Fn(&str) -> Option<String>) -> Result<RankEnv, RankError> {
    let rank_text = get(s.rank).unwrap_or_default();
    let rank = whole(s, s.rank, &rank_text)?;
    let Some(world_text) = get(s.world) else {
        return Err(RankError::Env(format!(
            "{} is set but {} is not ({} launcher): every rank needs the world size",
            s.rank, s.world, s.source
        )));
    };
    let world = whole(s, s.world, &world_text)?;
    if crate::world_size::WorldSize::new(world).is_err() {
        return Err(RankError::Env(format!(
            "{} is not a world size foldprint runs (1 ..= {MAX_WORLD})",
            named(s, s.world, &world_text)
        )));
    }
    if rank >= world {
        return Err(RankError::Env(format!(
            "{}={rank} is not below {}={world} ({} launcher)",
            s.rank, s.world, s.source
        )));
    }
    let local_rank = match get(s.local) {
        Some(l) => whole(s, s.local, &l)?,
        None => 0,
    };
    if local_rank >= world {
        return Err(RankError::Env(format!(
            "{}={local_rank} is not below {}={world} ({} launcher)",
            s.local, s.world, s.source
        )));
    }
    let port = match s.port.and_then(|n| get(n).map(|v| (n, v))) {
        Some((n, v)) => Some(port(n, &v)?),
        None => None,
    };
    let master = s.addr.and_then(get).zip(port);
    let variables = [Some(s.rank), Some(s.world), Some(s.local), s.addr, s.port]
        .into_iter()
        .flatten()
        .filter_map(|name| get(name).map(|v| (name, v)))
        .collect();
    Ok(RankEnv {
        rank,
        world,
        local_rank,
        source: s.source,
        master,
        variables,
        others: Vec::new(),
    })
}

/// A TCP port from variable `name`: 1 ..= 65535 (port 0 would listen
/// where no peer can find it).
pub fn port(name: &str, v: &str) -> Result<u16, RankError> {
    match v.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(RankError::Env(format!(
            "{name}={v:?} is not a port number (1 ..= 65535)"
        ))),
    }
}

/// `discover` over the process environment.
pub fn from_process_env() -> Result<Option<RankEnv>, RankError> {
    discover(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn each_launcher_is_recognized() {
        let t = discover(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (t.rank, t.world, t.local_rank, t.source),
            (3, 8, 1, "torchrun")
        );
        assert_eq!(t.master, Some(("node0".into(), 29500)));
        let names: Vec<&str> = t.variables.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT"
            ]
        );
        let s = discover(env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.rank, s.world, s.local_rank, s.source),
            (5, 16, 1, "slurm")
        );
        let o = discover(env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(o.source, "openmpi");
        assert_eq!(discover(env(&[])).unwrap(), None);
    }

    #[test]
    fn launchers_that_disagree_are_refused_by_name_unless_one_is_chosen() {
        // mpirun inside an sbatch script: Slurm's batch step says 0 of 1.
        let nested = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ];
        let e = discover(env(&nested)).unwrap_err().to_string();
        for part in [
            "slurm says rank 0 of 1 (SLURM_PROCID=0, SLURM_NTASKS=1)",
            "openmpi says rank 2 of 4 (OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=4)",
            "FOLDPRINT_LAUNCHER",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        // Named, the launcher is used and the other one is reported.
        let mut chosen = nested.to_vec();
        chosen.push(("FOLDPRINT_LAUNCHER", "openmpi"));
        let o = discover(env(&chosen)).unwrap().unwrap();
        assert_eq!((o.rank, o.world, o.source), (2, 4, "openmpi"));
        assert!(o
            .variables
            .contains(&("FOLDPRINT_LAUNCHER", "openmpi".to_string())));
        assert_eq!(
            o.launcher_note().unwrap(),
            "chosen by FOLDPRINT_LAUNCHER; slurm ignored (SLURM_PROCID=0, SLURM_NTASKS=1)"
        );
        // foldprint's own variables are one launcher among the others.
        let own = [
            ("FOLDPRINT_RANK", "1"),
            ("FOLDPRINT_WORLD_SIZE", "2"),
            ("RANK", "7"),
            ("WORLD_SIZE", "9"),
        ];
        let e = discover(env(&own)).unwrap_err().to_string();
        assert!(e.contains("foldprint says rank 1 of 2"), "{e}");
        assert!(e.contains("torchrun says rank 7 of 9"), "{e}");
        let mut own = own.to_vec();
        own.push(("FOLDPRINT_LAUNCHER", "foldprint"));
        let f = discover(env(&own)).unwrap().unwrap();
        assert_eq!((f.rank, f.world, f.source), (1, 2, "foldprint"));
        assert_eq!(
            f.launcher_note().unwrap(),
            "chosen by FOLDPRINT_LAUNCHER; torchrun ignored (RANK=7, WORLD_SIZE=9)"
        );
        // `launch --exec` sets torchrun's variables equal to its own: named
        // and agreeing, torchrun is said to agree, not to be ignored.
        let same = [
            ("FOLDPRINT_RANK", "1"),
            ("FOLDPRINT_WORLD_SIZE", "3"),
            ("RANK", "1"),
            ("WORLD_SIZE", "3"),
            ("FOLDPRINT_LAUNCHER", "foldprint"),
        ];
        let f = discover(env(&same)).unwrap().unwrap();
        assert_eq!((f.rank, f.world, f.source), (1, 3, "foldprint"));
        assert_eq!(
            f.launcher_note().unwrap(),
            "chosen by FOLDPRINT_LAUNCHER; torchrun agrees (RANK=1, WORLD_SIZE=3)"
        );
        // A name that is no launcher, or one whose variables are not set.
        let e = discover(env(&[("FOLDPRINT_LAUNCHER", "mpich")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FOLDPRINT_LAUNCHER=\"mpich\"") && e.contains("torchrun"),
            "{e}"
        );
        let e = discover(env(&[("FOLDPRINT_LAUNCHER", "slurm"), ("RANK", "0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_PROCID is not set"), "{e}");
    }

    #[test]
    fn launchers_that_agree_are_named_and_an_incomplete_one_is_ignored() {
        let both = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ];
        let s = discover(env(&both)).unwrap().unwrap();
        // The order holds where they agree: Slurm before Open MPI.
        assert_eq!((s.rank, s.world, s.source), (1, 2, "slurm"));
        assert_eq!(
            s.launcher_note().unwrap(),
            "openmpi agrees (OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2)"
        );
        // An sbatch script without --ntasks sets SLURM_PROCID alone.
        let o = discover(env(&[
            ("SLURM_PROCID", "0"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((o.rank, o.world, o.source), (3, 4, "openmpi"));
        assert_eq!(
            o.launcher_note().unwrap(),
            "slurm incomplete (SLURM_PROCID=0)"
        );
        // One launcher alone: nothing to say.
        let t = discover(env(&[("RANK", "0"), ("WORLD_SIZE", "1")]))
            .unwrap()
            .unwrap();
        assert_eq!((t.source, t.launcher_note()), ("torchrun", None));
        // Nor when it is named and alone (`foldprint launch`'s ranks).
        let f = discover(env(&[
            ("FOLDPRINT_RANK", "0"),
            ("FOLDPRINT_WORLD_SIZE", "1"),
            ("FOLDPRINT_LAUNCHER", "foldprint"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((f.source, f.launcher_note()), ("foldprint", None));
    }

    #[test]
    fn bad_values_are_named() {
        let e = discover(env(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
        let e = discover(env(&[("RANK", "2"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not below"), "{e}");
        let e = discover(env(&[("SLURM_PROCID", "0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_NTASKS"), "{e}");
        let e = discover(env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "a"),
            ("MASTER_PORT", "99999"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("MASTER_PORT"), "{e}");
    }

    #[test]
    fn every_value_is_checked_and_named() {
        let refused = |pairs: &[(&str, &str)], want: &str| {
            let e = discover(env(pairs)).unwrap_err();
            assert!(matches!(e, RankError::Env(_)), "{e}");
            let e = e.to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refused(
            &[("RANK", "0"), ("WORLD_SIZE", "18446744073709551615")],
            "WORLD_SIZE=\"18446744073709551615\" (torchrun launcher) is not a world size foldprint runs (1 ..= 65536)",
        );
        refused(
            &[("RANK", "0"), ("WORLD_SIZE", "1000000000000")],
            "WORLD_SIZE=\"1000000000000\"",
        );
        refused(&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=\"0\"");
        refused(&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK=\"-1\"");
        refused(
            &[("RANK", "5"), ("WORLD_SIZE", "2")],
            "RANK=5 is not below WORLD_SIZE=2",
        );
        refused(&[("RANK", "0")], "RANK is set but WORLD_SIZE is not");
        refused(
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2")],
            "LOCAL_RANK=2 is not below WORLD_SIZE=2",
        );
        for port in ["70000", "0", "-1", ""] {
            refused(
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", port)],
                &format!("MASTER_PORT={port:?} is not a port number (1 ..= 65535)"),
            );
        }
        // Negative control: the largest world and port are taken.
        let e = discover(env(&[
            ("RANK", "65535"),
            ("WORLD_SIZE", "65536"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "65535"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (e.rank, e.world, e.master),
            (65535, 65536, Some(("h".into(), 65535)))
        );
    }
}
