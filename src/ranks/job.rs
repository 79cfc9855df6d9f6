//! Who this job is and where its ranks meet: the job id and token every
//! rank shares, and rank 0's rendezvous address, from the environment the
//! launcher set.

use super::discover::RankEnv;

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
pub fn rendezvous_addr(e: &RankEnv) -> Result<(String, u16), String> {
    rendezvous_addr_from(e, process_env)
}

/// Rank 0's rendezvous address: foldprint's variables, else torchrun's
/// MASTER_ADDR with MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT).
pub fn rendezvous_addr_from(
    e: &RankEnv,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(String, u16), String> {
    if let (Some(h), Some(p)) = (get("FOLDPRINT_MASTER_ADDR"), get("FOLDPRINT_MASTER_PORT")) {
        let port = p
            .parse()
            .map_err(|_| format!("FOLDPRINT_MASTER_PORT={p:?} is not a port"))?;
        return Ok((h, port));
    }
    if let Some((h, p)) = &e.master {
        let port = p
            .checked_add(1)
            .ok_or("MASTER_PORT is 65535: set FOLDPRINT_MASTER_PORT")?;
        return Ok((h.clone(), port));
    }
    Err(format!(
        "{} gave no rendezvous address: set FOLDPRINT_MASTER_ADDR and FOLDPRINT_MASTER_PORT (rank 0's host and a free port), or FOLDPRINT_RENDEZVOUS_DIR to a directory all ranks share",
        e.source
    ))
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
            .contains("65535"));
        let bad = env(&[
            ("FOLDPRINT_MASTER_ADDR", "h"),
            ("FOLDPRINT_MASTER_PORT", "x"),
        ]);
        assert!(rendezvous_addr_from(&torch, bad)
            .unwrap_err()
            .contains("not a port"));
        let e = rendezvous_addr_from(&rank("slurm", None), env(&[])).unwrap_err();
        assert!(
            e.contains("slurm") && e.contains("FOLDPRINT_RENDEZVOUS_DIR"),
            "{e}"
        );
    }
}
