//! Rank discovery from the environment the user's launcher sets. First
//! match wins: foldprint's own variables, torchrun, Slurm, Open MPI.

use super::RankError;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    /// Which launcher's variables were used.
    pub source: &'static str,
    /// Where rank 0's rendezvous listens (host, port), when the launcher says.
    pub master: Option<(String, u16)>,
    /// The launcher's variables that were read, as they were set.
    pub variables: Vec<(&'static str, String)>,
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
    for s in &SCHEMES {
        let Some(rank) = get(s.rank) else { continue };
        let num = |name: &str, v: &str| -> Result<usize, RankError> {
            v.trim().parse::<usize>().map_err(|_| {
                RankError::Env(format!(
                    "{name}={v:?} ({} launcher) is not a non-negative integer",
                    s.source
                ))
            })
        };
        let rank = num(s.rank, &rank)?;
        let world = match get(s.world) {
            Some(w) => num(s.world, &w)?,
            None => {
                return Err(RankError::Env(format!(
                    "{} is set but {} is not ({} launcher)",
                    s.rank, s.world, s.source
                )))
            }
        };
        if world == 0 || rank >= world {
            return Err(RankError::Env(format!(
                "{}={rank} is not below {}={world}",
                s.rank, s.world
            )));
        }
        let local_rank = match get(s.local) {
            Some(l) => num(s.local, &l)?,
            None => 0,
        };
        let master = match (s.addr.and_then(&get), s.port.and_then(&get)) {
            (Some(a), Some(p)) => {
                let port = p.trim().parse::<u16>().map_err(|_| {
                    RankError::Env(format!(
                        "{}={p:?} is not a port number",
                        s.port.unwrap_or("port")
                    ))
                })?;
                Some((a, port))
            }
            _ => None,
        };
        let variables = [Some(s.rank), Some(s.world), Some(s.local), s.addr, s.port]
            .into_iter()
            .flatten()
            .filter_map(|name| get(name).map(|v| (name, v)))
            .collect();
        return Ok(Some(RankEnv {
            rank,
            world,
            local_rank,
            source: s.source,
            master,
            variables,
        }));
    }
    Ok(None)
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
    fn own_variables_win_over_launchers() {
        let f = discover(env(&[
            ("FOLDPRINT_RANK", "1"),
            ("FOLDPRINT_WORLD_SIZE", "2"),
            ("RANK", "7"),
            ("WORLD_SIZE", "9"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((f.rank, f.world, f.source), (1, 2, "foldprint"));
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
}
