//! The directory rendezvous (`FOLDPRINT_RENDEZVOUS_DIR`): for clusters
//! whose ranks share a file system but cannot open a port to each other.
//!
//! Files are named after the job id, and one job id serves many jobs: every
//! step of a Slurm job shares `SLURM_JOB_ID`, and mpirun's jobs are all
//! `foldprint` unless `FOLDPRINT_JOB_ID` says otherwise. A job therefore
//! never trusts a file for its name alone:
//! - Rank 0 draws a fresh random *attempt* and writes `<job>.id` (the
//!   attempt, its plan and payload, state `waiting`), replacing whatever an
//!   earlier job left there.
//! - A peer acknowledges the `waiting` file it reads with `<job>.ack.<rank>`,
//!   which carries that file's attempt, whether the plans agree, and the
//!   peer as a [`Member`]. Rank 0 counts only acknowledgements of its own
//!   attempt, so an earlier job's are never taken for this one's.
//! - Rank 0 then writes its answer into `<job>.id` (state `done`, or
//!   `failed` with the message every rank reports). A peer believes only
//!   the answer to the attempt it acknowledged: a file left by a job that
//!   was killed says `waiting` forever, so a peer that read it waits (and
//!   acknowledges again when the real rank 0 replaces it), or fails at its
//!   deadline; it never succeeds on it.
//! - Each peer removes its own acknowledgement once it has the answer;
//!   rank 0 waits for that, then removes `<job>.id` and every
//!   `<job>.ack.*` left (a killed peer's, or an earlier job's). A peer
//!   removes nothing it did not write. Success or failure, the directory is
//!   left as it was found.
//!
//! Every file is written whole (`crate::atomic::write`), so a reader sees an
//! old file or a new one, never half of one. Two jobs *at once* with the
//! same job id in one directory cannot be told apart by their ranks: give
//! them different `FOLDPRINT_JOB_ID`s.

use super::{disagree, err, files_difference, interrupted, left, Member, Plan};
use crate::ranks::RankError;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What every file says it is, so another program's file (or an older
/// foldprint's) is never read as this rendezvous's.
const FORMAT: &str = "foldprint directory rendezvous 1";
/// How often a wait looks at the files, signals and the deadline.
const STEP: Duration = Duration::from_millis(10);
/// How long rank 0's file must stay absent before a peer that
/// acknowledged it takes rank 0 for gone.
const GONE: Duration = Duration::from_millis(500);
/// The largest file read back (a member lists its rank files' facts).
const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum State {
    Waiting,
    Done,
    Failed,
}

/// `<job>.id`: rank 0's attempt and, once it has one, its answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct IdFile {
    format: String,
    attempt: String,
    state: State,
    digest: String,
    payload: String,
    summary: String,
    /// Why the job failed (state `failed`), as every rank reports it.
    message: Option<String>,
    /// The failure is the ranks' disagreement about the work.
    disagree: bool,
}

/// `<job>.ack.<rank>`: a peer's answer to one attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ack {
    format: String,
    attempt: String,
    agrees: bool,
    /// The peer's plan, for the message when it does not agree.
    summary: String,
    member: Member,
}

/// The job's files in the rendezvous directory.
struct Files {
    dir: PathBuf,
    job: String,
    id: PathBuf,
}

impl Files {
    fn new(dir: &Path, job: &str, role: &str) -> Result<Files, RankError> {
        if !dir.is_dir() {
            return Err(RankError::Env(format!(
                "FOLDPRINT_RENDEZVOUS_DIR={} is not a directory ({role})",
                dir.display()
            )));
        }
        let plain = !job.is_empty()
            && !job.starts_with('.')
            && !job.contains(['/', '\0'])
            && job.len() <= 200;
        if !plain {
            return Err(RankError::Env(format!(
                "job id {job:?} cannot name a file in FOLDPRINT_RENDEZVOUS_DIR={}: set \
                 FOLDPRINT_JOB_ID to a plain name",
                dir.display()
            )));
        }
        Ok(Files {
            dir: dir.to_path_buf(),
            job: job.to_string(),
            id: dir.join(format!("{job}.id")),
        })
    }

    fn ack(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("{}.ack.{rank}", self.job))
    }

    fn read_id(&self) -> Found<IdFile> {
        read(&self.id).filter(|f: &IdFile| f.format == FORMAT)
    }

    fn read_ack(&self, rank: usize) -> Option<Ack> {
        read(&self.ack(rank))
            .file()
            .filter(|a: &Ack| a.format == FORMAT)
    }

    /// Whether rank `rank`'s acknowledgement of `attempt` is still there
    /// (an unreadable file counts as there: only its absence, or another
    /// attempt's file, says the peer took the answer).
    fn ack_pending(&self, rank: usize, attempt: &str) -> bool {
        match read::<Ack>(&self.ack(rank)) {
            Found::Absent => false,
            Found::File(a) => a.format == FORMAT && a.attempt == attempt,
            Found::Unreadable => true,
        }
    }

    /// Rank 0, at the end: its own `<job>.id` and every acknowledgement
    /// left under the job id. Best effort: a file that will not go is left.
    fn clean(&self, attempt: &str) {
        if self.read_id().file().is_some_and(|f| f.attempt == attempt) {
            let _ = std::fs::remove_file(&self.id);
        }
        let prefix = format!("{}.ack.", self.job);
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rank) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// What is at a path of this rendezvous.
enum Found<T> {
    Absent,
    /// Unreadable for now (a shared file system mid-rename), too large, or
    /// not one of ours.
    Unreadable,
    File(T),
}

impl<T> Found<T> {
    fn file(self) -> Option<T> {
        match self {
            Found::File(t) => Some(t),
            _ => None,
        }
    }

    fn filter(self, keep: impl FnOnce(&T) -> bool) -> Found<T> {
        match self {
            Found::File(t) if !keep(&t) => Found::Unreadable,
            other => other,
        }
    }
}

fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Found<T> {
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut bytes));
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Absent,
        Err(_) => Found::Unreadable,
        Ok(_) if bytes.len() as u64 > MAX_FILE => Found::Unreadable,
        Ok(_) => serde_json::from_slice(&bytes).map_or(Found::Unreadable, Found::File),
    }
}

fn write<T: Serialize>(path: &Path, what: &T, role: &str) -> Result<(), RankError> {
    let bytes = serde_json::to_vec(what).unwrap_or_default();
    crate::atomic::write(path, &bytes).map_err(|e| err(role, format!("{}: {e}", path.display())))
}

/// Rank 0, directory mode: publish the payload under a fresh attempt, wait
/// for every peer's acknowledgement of it, answer, and clean up.
pub fn publish_dir(
    dir: &Path,
    job: &str,
    world: usize,
    plan: &Plan,
    payload: &[u8],
    deadline: Instant,
    me: &Member,
) -> Result<Vec<Member>, RankError> {
    let role = "rank 0";
    let files = Files::new(dir, job, role)?;
    let attempt = crate::ranks::launch::token();
    let mut id = IdFile {
        format: FORMAT.into(),
        attempt: attempt.clone(),
        state: State::Waiting,
        digest: hex::encode(plan.digest),
        payload: hex::encode(payload),
        summary: plan.summary.clone(),
        message: None,
        disagree: false,
    };
    // Whatever an earlier job left under this name is replaced: its peers
    // are gone, and this job's own peers acknowledge the new attempt.
    write(&files.id, &id, role)?;
    let mut members = vec![me.clone()];
    let mut acked = vec![false; world];
    acked[0] = true;
    let outcome = loop {
        if let Err(e) = interrupted() {
            break Err(e);
        }
        let mut refused = None;
        for (r, done) in acked.iter_mut().enumerate().skip(1) {
            if *done {
                continue;
            }
            let Some(ack) = files.read_ack(r).filter(|a| a.attempt == attempt) else {
                continue;
            };
            if ack.member.rank != r {
                refused = Some(err(
                    role,
                    format!(
                        "{} describes rank {}, not rank {r}",
                        files.ack(r).display(),
                        ack.member.rank
                    ),
                ));
                break;
            }
            if !ack.agrees {
                refused = Some(disagree(
                    files_difference(r, &ack.summary, &plan.summary).unwrap_or_else(|| {
                        format!(
                            "rank {r} would run `{}` but rank 0 would run `{}`",
                            ack.summary, plan.summary
                        )
                    }),
                ));
                break;
            }
            *done = true;
            members.push(ack.member);
        }
        if let Some(e) = refused {
            break Err(e);
        }
        if acked.iter().all(|&a| a) {
            break Ok(());
        }
        if left(deadline).is_none() {
            let missing: Vec<usize> = (0..world).filter(|&r| !acked[r]).collect();
            break Err(err(
                role,
                format!(
                    "ranks {missing:?} did not acknowledge {} before the deadline",
                    files.id.display()
                ),
            ));
        }
        std::thread::sleep(STEP);
    };
    // The answer, for every peer that acknowledged this attempt.
    match &outcome {
        Ok(()) => id.state = State::Done,
        Err(e) => {
            id.state = State::Failed;
            id.disagree = matches!(e, RankError::Disagree(_) | RankError::FilesDiffer(_));
            id.message = Some(match e {
                RankError::Interrupted(_) => format!("rank 0 was {e}"),
                RankError::Disagree(m) | RankError::FilesDiffer(m) => m.clone(),
                RankError::Rendezvous { message, .. } => format!("rank 0: {message}"),
                other => other.to_string(),
            });
        }
    }
    let answered = write(&files.id, &id, role);
    // Each peer removes its acknowledgement once it has the answer: wait
    // for that (briefly after a failure, at once-ish after a signal), so
    // that no peer is left looking for a file that is gone.
    let mut outcome = outcome.and(answered);
    let mut until = match &outcome {
        Ok(()) => deadline.max(Instant::now() + Duration::from_secs(2)),
        Err(RankError::Interrupted(_)) => Instant::now() + Duration::from_millis(300),
        Err(_) => Instant::now() + Duration::from_secs(1),
    };
    let uncollected = loop {
        let waiting: Vec<usize> = (1..world)
            .filter(|&r| files.ack_pending(r, &attempt))
            .collect();
        if waiting.is_empty() || Instant::now() >= until {
            break waiting;
        }
        if outcome.is_ok() {
            if let Err(e) = interrupted() {
                outcome = Err(e);
                until = Instant::now();
            }
        }
        std::thread::sleep(STEP);
    };
    files.clean(&attempt);
    outcome?;
    if !uncollected.is_empty() {
        return Err(err(
            role,
            format!(
                "ranks {uncollected:?} acknowledged {} but did not take the answer before the \
                 deadline: they failed or were stopped",
                files.id.display()
            ),
        ));
    }
    members.sort_by_key(|m| m.rank);
    Ok(members)
}

/// A peer, directory mode: acknowledge rank 0's current attempt (again
/// whenever rank 0 starts a new one) and wait for its answer to it.
pub fn join_dir(
    dir: &Path,
    job: &str,
    me: &Member,
    plan: &Plan,
    deadline: Instant,
) -> Result<Vec<u8>, RankError> {
    let rank = me.rank;
    let role = format!("rank {rank}");
    let files = Files::new(dir, job, &role)?;
    let ack_path = files.ack(rank);
    // The attempt this rank acknowledged, with its payload.
    let mut acked: Option<(String, Vec<u8>)> = None;
    // Since when rank 0's file has been absent after this rank acknowledged
    // it (a moment's absence is a shared file system's, not rank 0's end).
    let mut absent_since: Option<Instant> = None;
    let outcome = loop {
        if let Err(e) = interrupted() {
            break Err(e);
        }
        let found = files.read_id();
        absent_since = match (&found, &acked) {
            (Found::Absent, Some(_)) => absent_since.or(Some(Instant::now())),
            _ => None,
        };
        if absent_since.is_some_and(|t| t.elapsed() > GONE) {
            break Err(err(
                &role,
                format!(
                    "{} went away before rank 0 answered: it failed or was stopped",
                    files.id.display()
                ),
            ));
        }
        match found {
            Found::Absent | Found::Unreadable => {}
            Found::File(f) => {
                let ours = acked.as_ref().is_some_and(|(a, _)| *a == f.attempt);
                match f.state {
                    State::Waiting if !ours => {
                        // A malformed payload is no attempt to answer.
                        if let Ok(payload) = hex::decode(&f.payload) {
                            let agrees = f.digest == hex::encode(plan.digest);
                            let ack = Ack {
                                format: FORMAT.into(),
                                attempt: f.attempt.clone(),
                                agrees,
                                summary: plan.summary.clone(),
                                member: me.clone(),
                            };
                            if let Err(e) = write(&ack_path, &ack, &role) {
                                break Err(e);
                            }
                            acked = Some((f.attempt, payload));
                        }
                    }
                    State::Done if ours => {
                        break Ok(acked.take().map(|(_, p)| p).unwrap_or_default());
                    }
                    State::Failed if ours => {
                        let msg = f.message.unwrap_or_else(|| "rank 0 failed".into());
                        break Err(if f.disagree {
                            disagree(msg)
                        } else {
                            err(&role, msg)
                        });
                    }
                    // Rank 0 has not answered yet, or this is an earlier
                    // job's answer, not ours.
                    _ => {}
                }
            }
        }
        if left(deadline).is_none() {
            break Err(err(
                &role,
                if acked.is_some() {
                    format!(
                        "rank 0 did not answer in {} before the deadline; are all ranks started?",
                        files.id.display()
                    )
                } else {
                    format!("{} did not appear before the deadline", files.id.display())
                },
            ));
        }
        std::thread::sleep(STEP);
    };
    // Removing its acknowledgement tells rank 0 this rank has its answer.
    let _ = std::fs::remove_file(&ack_path);
    outcome
}

#[cfg(test)]
mod tests {
    use super::super::tests::member;
    use super::*;

    fn plan(s: &str) -> Plan {
        Plan::new(&[s.to_string()], s)
    }

    fn names(d: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    /// What rank 0 and each peer got.
    type Outcome = (
        Result<Vec<Member>, RankError>,
        Vec<Result<Vec<u8>, RankError>>,
    );

    /// A job of `world` ranks in `d`, peer `r` presenting `plans(r)`.
    fn job(d: &Path, id: &str, world: usize, plans: impl Fn(usize) -> Plan, secs: u64) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let peers: Vec<_> = (1..world)
            .map(|r| {
                let (d, id, p) = (d.to_path_buf(), id.to_string(), plans(r));
                std::thread::spawn(move || join_dir(&d, &id, &member(r), &p, deadline))
            })
            .collect();
        let zero = publish_dir(d, id, world, &plans(0), &[1, 2, 3], deadline, &member(0));
        (zero, peers.into_iter().map(|h| h.join().unwrap()).collect())
    }

    #[test]
    fn a_job_agrees_leaves_nothing_behind_and_the_next_with_its_id_agrees_too() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for _ in 0..2 {
            let (zero, peers) = job(d, "job1", 3, |_| plan("a"), 10);
            assert_eq!(zero.unwrap(), (0..3).map(member).collect::<Vec<_>>());
            for p in peers {
                assert_eq!(p.unwrap(), vec![1, 2, 3]);
            }
            assert_eq!(names(d), Vec::<String>::new());
        }
    }

    #[test]
    fn a_disagreement_fails_every_rank_alike_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (zero, peers) = job(d, "job2", 3, |r| plan(if r == 1 { "b" } else { "a" }), 10);
        let e = zero.unwrap_err().to_string();
        assert!(e.contains("rank 1 would run `b`"), "{e}");
        for p in peers {
            let e = p.unwrap_err();
            assert!(matches!(e, RankError::Disagree(_)), "{e}");
            assert!(e.to_string().contains("rank 1 would run `b`"), "{e}");
        }
        assert_eq!(names(d), Vec::<String>::new());
    }

    /// What a job killed mid-rendezvous leaves: rank 0's waiting file and
    /// a peer's acknowledgement of it.
    fn killed_job(d: &Path, job: &str, p: &Plan) {
        let id = IdFile {
            format: FORMAT.into(),
            attempt: "killed".into(),
            state: State::Waiting,
            digest: hex::encode(p.digest),
            payload: hex::encode([9u8; 3]),
            summary: p.summary.clone(),
            message: None,
            disagree: false,
        };
        write(&d.join(format!("{job}.id")), &id, "test").unwrap();
        let ack = Ack {
            format: FORMAT.into(),
            attempt: "killed".into(),
            agrees: true,
            summary: p.summary.clone(),
            member: member(1),
        };
        write(&d.join(format!("{job}.ack.1")), &ack, "test").unwrap();
        write(&d.join(format!("{job}.ack.7")), &ack, "test").unwrap();
    }

    #[test]
    fn a_killed_jobs_files_neither_pass_a_peer_nor_stop_the_next_job() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        killed_job(d, "j", &plan("a"));
        // A peer alone with them waits for an answer that never comes.
        let t = Instant::now();
        let e = join_dir(
            d,
            "j",
            &member(1),
            &plan("a"),
            Instant::now() + Duration::from_millis(500),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("did not answer"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // The next job's peers start first and read them; the job still
        // agrees on its own payload, and cleans up after both jobs.
        killed_job(d, "j", &plan("a"));
        let deadline = Instant::now() + Duration::from_secs(10);
        let peers: Vec<_> = (1..3)
            .map(|r| {
                let d = d.to_path_buf();
                std::thread::spawn(move || join_dir(&d, "j", &member(r), &plan("a"), deadline))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let zero = publish_dir(d, "j", 3, &plan("a"), &[1, 2, 3], deadline, &member(0));
        assert_eq!(zero.unwrap().len(), 3);
        for p in peers {
            assert_eq!(p.join().unwrap().unwrap(), vec![1, 2, 3]);
        }
        assert_eq!(names(d), Vec::<String>::new());
    }

    #[test]
    fn rank_zero_alone_fails_at_the_deadline_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let t = Instant::now();
        let deadline = Instant::now() + Duration::from_millis(300);
        let e = publish_dir(d, "k", 2, &plan("a"), &[1], deadline, &member(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ranks [1] did not acknowledge"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(names(d), Vec::<String>::new());
        // Negative control: a job id that is no file name is refused.
        let e = publish_dir(d, "../x", 2, &plan("a"), &[], Instant::now(), &member(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("FOLDPRINT_JOB_ID"), "{e}");
    }
}
