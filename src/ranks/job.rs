//! Who this job is and where its ranks meet: the job id and token every
//! rank shares, and rank 0's rendezvous address, from the environment the
//! launcher set. Rank 0 listens on that address only ([`listen`]): an
//! address it cannot take is the job's setup to fix, never a reason to
//! listen on every interface.

use super::discover::{self, RankEnv};
use super::RankError;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

fn process_env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// Job token, job id and where the token came from, from the process
/// environment (see [`identity_from`]).
pub fn identity() -> (Vec<u8>, String, &'static str) {
    identity_from(process_env)
}

/// Job token and job id: our own variables first, then what Slurm or
/// torchrun give every rank alike.
pub fn identity_from(get: impl Fn(&str) -> Option<String>) -> (Vec<u8>, String, &'static str) {
    let job = get("FOLDPRINT_JOB_ID")
        .or_else(|| get("SLURM_JOB_ID"))
        .or_else(|| get("TORCHELASTIC_RUN_ID"))
        .unwrap_or_else(|| "foldprint".into());
    match get("FOLDPRINT_JOB_TOKEN") {
        Some(t) => (t.into_bytes(), job, "FOLDPRINT_JOB_TOKEN"),
        None => (
            job.clone().into_bytes(),
            job,
            "job id (set FOLDPRINT_JOB_TOKEN for a secret token)",
        ),
    }
}

/// Rank 0's rendezvous address from the process environment.
pub fn rendezvous_addr(e: &RankEnv) -> Result<(String, u16), RankError> {
    rendezvous_addr_from(e, process_env)
}

/// Rank 0's rendezvous address: foldprint's variables, else torchrun's
/// MASTER_ADDR with MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT).
pub fn rendezvous_addr_from(
    e: &RankEnv,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(String, u16), RankError> {
    rendezvous_point(e, get).map(|p| (p.host, p.port))
}

/// Where rank 0 listens, and the variables that said so (for messages).
struct Point {
    host: String,
    port: u16,
    host_var: &'static str,
    port_var: &'static str,
}

fn rendezvous_point(e: &RankEnv, get: impl Fn(&str) -> Option<String>) -> Result<Point, RankError> {
    let bad = |m: String| RankError::Env(m);
    let (host_var, port_var) = ("FOLDPRINT_MASTER_ADDR", "FOLDPRINT_MASTER_PORT");
    let p = match (get(host_var), get(port_var)) {
        (Some(host), Some(p)) => Point {
            host,
            port: discover::port(port_var, &p)?,
            host_var,
            port_var,
        },
        (Some(_), None) | (None, Some(_)) => {
            return Err(bad(format!(
                "{host_var} and {port_var} go together: only one of them is set"
            )))
        }
        (None, None) => match &e.master {
            Some((host, p)) => Point {
                host: host.clone(),
                port: p.checked_add(1).ok_or_else(|| {
                    bad(format!(
                        "MASTER_PORT is 65535, and the rendezvous listens one above it: set {port_var}"
                    ))
                })?,
                host_var: "MASTER_ADDR",
                port_var: "MASTER_PORT",
            },
            None => {
                return Err(bad(format!(
                    "{} gave no rendezvous address: set {host_var} and {port_var} (rank 0's host and a free port), or FOLDPRINT_RENDEZVOUS_DIR to a directory all ranks share",
                    e.source
                )))
            }
        },
    };
    check_host(&p)?;
    Ok(p)
}

/// A host name or address, not `host:port`, not empty, no spaces.
fn check_host(p: &Point) -> Result<(), RankError> {
    let h = p.host.as_str();
    let why = if h.is_empty() {
        "is empty"
    } else if h.chars().any(char::is_whitespace) {
        "holds white space"
    } else if h.contains(':') && h.parse::<std::net::Ipv6Addr>().is_err() {
        "is not a host name or address (give the port in its own variable)"
    } else {
        return Ok(());
    };
    Err(RankError::Env(format!(
        "{}={h:?} {why}: it names rank 0's host, where the rendezvous listens ({} gives the port)",
        p.host_var, p.port_var
    )))
}

/// Rank 0's rendezvous listener, on the address the launcher named and
/// nowhere else. An address that does not resolve or is not this host's
/// is bad input (exit 2), never a reason to listen on every interface; a
/// port another process holds is the infrastructure's (exit 4).
pub fn listen(e: &RankEnv, get: impl Fn(&str) -> Option<String>) -> Result<TcpListener, RankError> {
    let p = rendezvous_point(e, get)?;
    let (host, port) = (p.host.as_str(), p.port);
    let not_here = |detail: String| {
        let hint = if p.host_var == "MASTER_ADDR" {
            " (FOLDPRINT_MASTER_ADDR and FOLDPRINT_MASTER_PORT choose another)"
        } else {
            ""
        };
        RankError::Env(format!(
            "{}={host:?} {detail}: rank 0 listens there, so it must name this host ({}) or one of its addresses{hint}",
            p.host_var,
            crate::host::hostname()
        ))
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|x| not_here(format!("does not resolve ({x})")))?
        .collect();
    if addrs.is_empty() {
        return Err(not_here("resolves to no address".into()));
    }
    let mut failures = Vec::new();
    for a in &addrs {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(x) => failures.push((a, x)),
        }
    }
    use std::io::ErrorKind as K;
    let foreign = |k: K| matches!(k, K::AddrNotAvailable | K::PermissionDenied);
    match failures.iter().find(|(_, x)| !foreign(x.kind())) {
        None => {
            let each: Vec<String> = failures
                .iter()
                .map(|(a, x)| format!("{}: {x}", a.ip()))
                .collect();
            if failures
                .iter()
                .all(|(_, x)| x.kind() == K::AddrNotAvailable)
            {
                Err(not_here(format!(
                    "is not this host's ({})",
                    each.join("; ")
                )))
            } else {
                Err(RankError::Env(format!(
                    "cannot listen on {host}:{port} ({}, {}): {}",
                    p.host_var,
                    p.port_var,
                    each.join("; ")
                )))
            }
        }
        Some((a, x)) => Err(RankError::Rendezvous {
            role: "rank 0".into(),
            message: format!("cannot listen on {a} ({}, {}): {x}", p.host_var, p.port_var),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn rank(source: &'static str, master: Option<(&str, u16)>) -> RankEnv {
        RankEnv {
            rank: 1,
            world: 2,
            local_rank: 0,
            source,
            master: master.map(|(h, p)| (h.to_string(), p)),
            variables: Vec::new(),
            others: Vec::new(),
        }
    }

    #[test]
    fn the_token_is_our_secret_else_the_launchers_job_id() {
        let (t, job, src) = identity_from(env(&[
            ("FOLDPRINT_JOB_TOKEN", "s3cret"),
            ("SLURM_JOB_ID", "42"),
        ]));
        assert_eq!(
            (t, job.as_str(), src),
            (b"s3cret".to_vec(), "42", "FOLDPRINT_JOB_TOKEN")
        );
        let (t, job, src) = identity_from(env(&[("TORCHELASTIC_RUN_ID", "run7")]));
        assert_eq!((t, job.as_str()), (b"run7".to_vec(), "run7"));
        assert!(src.contains("FOLDPRINT_JOB_TOKEN"), "{src}");
        let (_, job, _) =
            identity_from(env(&[("FOLDPRINT_JOB_ID", "mine"), ("SLURM_JOB_ID", "42")]));
        assert_eq!(job, "mine");
    }

    #[test]
    fn the_rendezvous_is_ours_else_one_above_torchruns_store() {
        let torch = rank("torchrun", Some(("node0", 29500)));
        assert_eq!(
            rendezvous_addr_from(&torch, env(&[])).unwrap(),
            ("node0".to_string(), 29501)
        );
        assert_eq!(
            rendezvous_addr_from(
                &torch,
                env(&[
                    ("FOLDPRINT_MASTER_ADDR", "h"),
                    ("FOLDPRINT_MASTER_PORT", "9")
                ])
            )
            .unwrap(),
            ("h".to_string(), 9)
        );
        let top = rank("torchrun", Some(("node0", 65535)));
        assert!(rendezvous_addr_from(&top, env(&[]))
            .unwrap_err()
            .to_string()
            .contains("65535"));
        let bad = env(&[
            ("FOLDPRINT_MASTER_ADDR", "h"),
            ("FOLDPRINT_MASTER_PORT", "x"),
        ]);
        assert!(rendezvous_addr_from(&torch, bad)
            .unwrap_err()
            .to_string()
            .contains("FOLDPRINT_MASTER_PORT=\"x\" is not a port"));
        let e = rendezvous_addr_from(&rank("slurm", None), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("slurm") && e.contains("FOLDPRINT_RENDEZVOUS_DIR"),
            "{e}"
        );
    }
    #[test]
    fn rank_zero_listens_where_it_was_told_or_refuses_naming_the_address() {
        let torch = rank("torchrun", None);
        let ours = |host: &'static str, port: &'static str| {
            move |k: &str| match k {
                "FOLDPRINT_MASTER_ADDR" => Some(host.to_string()),
                "FOLDPRINT_MASTER_PORT" => Some(port.to_string()),
                _ => None,
            }
        };
        let refused = |host: &'static str, port: &'static str, want: &str| {
            let e = listen(&torch, ours(host, port)).unwrap_err();
            assert!(matches!(e, RankError::Env(_)), "{host}: {e}");
            let e = e.to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        // TEST-NET-1 is never this host's; `.invalid` never resolves.
        refused(
            "192.0.2.1",
            "29400",
            "FOLDPRINT_MASTER_ADDR=\"192.0.2.1\" is not this host's",
        );
        refused(
            "nowhere.invalid",
            "29400",
            "FOLDPRINT_MASTER_ADDR=\"nowhere.invalid\" does not resolve",
        );
        refused("127.0.0.1:29400", "29400", "is not a host name or address");
        refused("", "29400", "FOLDPRINT_MASTER_ADDR=\"\" is empty");
        refused(
            "127.0.0.1",
            "0",
            "FOLDPRINT_MASTER_PORT=\"0\" is not a port number",
        );
        let only_one = |k: &str| (k == "FOLDPRINT_MASTER_ADDR").then(|| "127.0.0.1".to_string());
        let e = rendezvous_addr_from(&torch, only_one)
            .unwrap_err()
            .to_string();
        assert!(e.contains("go together"), "{e}");
        // torchrun's MASTER_ADDR is checked the same way, and named.
        let e = listen(&rank("torchrun", Some(("192.0.2.1", 29400))), |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_ADDR=\"192.0.2.1\""), "{e}");
        // Negative controls: loopback listens, on that address only; a
        // port another process holds is the infrastructure's (exit 4).
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port: &'static str = Box::leak(
            taken
                .local_addr()
                .unwrap()
                .port()
                .to_string()
                .into_boxed_str(),
        );
        let e = listen(&torch, ours("127.0.0.1", port)).unwrap_err();
        assert!(matches!(e, RankError::Rendezvous { .. }), "{e}");
        drop(taken);
        let l = listen(&torch, ours("localhost", port)).unwrap();
        assert!(l.local_addr().unwrap().ip().is_loopback());
    }
}
