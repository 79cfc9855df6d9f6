//! Getting NCCL's unique id from rank 0 to every rank, and making every rank
//! agree on the work first: a length mismatch in NCCL point-to-point calls
//! hangs rather than errors, so disagreement must be caught here.
//!
//! TCP: rank 0 listens and runs each connection's handshake on a thread of
//! its own, bounded by one deadline (5 s, never past the job's) and a byte
//! cap, so a slow, idle or hostile connection never delays a real rank.
//! Both sides prove they know the job token without sending it, over fresh
//! nonces of both ([`super::handshake`] has the wire): the peer checks rank
//! 0's proof before it says anything of the job, so a process squatting on
//! the port learns nothing and the peer fails at once; then it presents
//! its rank, its plan (a digest of the cases it is about to run plus a
//! short description) and itself as a [`Member`] (host, pid, device),
//! whose rank must be the one it joined as. Rank 0 answers nobody until
//! all W-1 peers have proven the token and presented matching plans, then
//! sends the id to all, each answer with its proof for that connection; on
//! a mismatch it tells all of them and everyone fails with the same
//! message. Connections without the token are turned away without
//! disturbing the job (they can only make it miss its deadline). A peer
//! whose connection closes while rank 0 waits (it died, or its launcher
//! stopped it) fails the job at once, and so does rank 0's: nobody waits
//! for the deadline on a rank that is gone. A signal (a launcher stopping
//! the job) ends every wait within 0.2 s, handshakes included.
//!
//! Directory ([`dir`]): rank 0 writes `<job>.id` with a fresh attempt;
//! peers compare plans and acknowledge that attempt with
//! `<job>.ack.<rank>` (holding the member); rank 0 answers in the same
//! file, and every file of the attempt is removed once it is answered.

use super::discover::RankEnv;
use super::handshake::{
    fresh_nonce, prove, put_frame, verify, Fault, Nonces, Role, Wire, GREETING, MAGIC, NONCE, PROOF,
};
use super::{job, RankError};
use crate::experiment::Experiment;
use sha2::{Digest, Sha256};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod dir;
pub use dir::{join_dir, publish_dir};

const OK: u8 = 0;
const DISAGREE: u8 = 2;
const BAD_RANK: u8 = 3;
const PEER_LOST: u8 = 4;

/// How often a wait looks at signals and dead peers.
const POLL: Duration = Duration::from_millis(200);
/// One handshake's time (never past the job's deadline): rank 0's greeting
/// on a peer, the peer's hello on rank 0.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Handshakes rank 0 runs at once; more connections wait to be accepted.
const MAX_HANDSHAKES: usize = 64;
/// Byte caps: a plan summary, a member's description, all of a hello, and
/// rank 0's answer.
const SUMMARY_MAX: usize = 16 << 10;
const MEMBER_MAX: usize = 64 << 10;
const HELLO_MAX: usize = 36 + 4 + SUMMARY_MAX + 4 + MEMBER_MAX + PROOF;
const ANSWER_MAX: usize = 64 << 10;

/// One rank as it presents itself in the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub rank: usize,
    pub local_rank: usize,
    pub host: String,
    pub pid: u32,
    /// The CUDA device this rank uses (or would), when it knows.
    pub device: Option<usize>,
    /// Its `NCCL_HOSTID`, when it sets one (emulated hosts).
    pub nccl_hostid: Option<String>,
    /// Why this rank cannot run here, if it cannot.
    pub problem: Option<String>,
    /// Its own rank file of each set of rank files the plan names, in
    /// plan order (`experiment::rank_file_sets`): rank 0 cannot read the
    /// others' files, so each rank presents what it hashed.
    #[serde(default)]
    pub inputs: Vec<Option<crate::addends::FileFacts>>,
}

impl Member {
    /// This process as rank `e.rank`, with nothing known of devices.
    pub fn this(e: &RankEnv) -> Member {
        Member {
            rank: e.rank,
            local_rank: e.local_rank,
            host: crate::host::hostname(),
            pid: std::process::id(),
            device: None,
            nccl_hostid: std::env::var("NCCL_HOSTID").ok().filter(|v| !v.is_empty()),
            problem: None,
            inputs: Vec::new(),
        }
    }

    fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Rank `rank`, which said nothing of itself: `why` says where.
    fn undescribed(rank: usize, host: String, why: &str) -> Member {
        Member {
            rank,
            local_rank: 0,
            host,
            pid: 0,
            device: None,
            nccl_hostid: None,
            problem: Some(why.into()),
            inputs: Vec::new(),
        }
    }

    /// `rank 3 (node7, pid 1234)`.
    pub fn who(&self) -> String {
        format!("rank {} ({}, pid {})", self.rank, self.host, self.pid)
    }
}

/// What the rendezvous gave this rank.
#[derive(Debug, Clone)]
pub struct Agreement {
    /// Rank 0's payload (NCCL's unique id).
    pub payload: Vec<u8>,
    /// How it travelled, for the report.
    pub how: String,
    /// Every rank in rank order on rank 0; this rank alone elsewhere.
    pub members: Vec<Member>,
}

fn interrupted() -> Result<(), RankError> {
    match crate::interrupt::pending() {
        Some(sig) => Err(RankError::Interrupted(sig)),
        None => Ok(()),
    }
}

/// What the ranks must agree on before any collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub digest: [u8; 32],
    /// Short human description, for messages.
    pub summary: String,
}

impl Plan {
    /// A plan over `lines` (one per case: its key and anything else that must match).
    pub fn new(lines: &[String], summary: impl Into<String>) -> Plan {
        let mut h = Sha256::new();
        for l in lines {
            h.update(l.as_bytes());
            h.update(b"\n");
        }
        Plan {
            digest: h.finalize().into(),
            summary: summary.into(),
        }
    }
}

/// What every NCCL rank must be about to run, bit for bit, as the lines of
/// a [`Plan`] and its summary: each experiment's name and file digest, then
/// each case's key and id. Ranks given different files, or the same files
/// in another order, disagree before any collective can hang.
pub fn experiment_plan(experiments: &[Experiment]) -> (Vec<String>, String) {
    let mut lines: Vec<String> = experiments
        .iter()
        .map(|e| format!("experiment\t{}\t{}", e.name, e.sha256))
        .collect();
    for c in experiments.iter().flat_map(|e| &e.cases) {
        lines.push(format!("{}\t{}", c.key(), c.id()));
        // What each rank knows of the rank files from its own: their
        // format and arenas must agree before a length can differ.
        if let Some(f) = c.files() {
            lines.push(format!("addends\t{}", f.layout()));
        }
    }
    let names: Vec<String> = experiments
        .iter()
        .map(|e| format!("{}@{}", e.name, e.sha256.short(12)))
        .collect();
    let cases: usize = experiments.iter().map(|e| e.cases.len()).sum();
    // Rank files as this rank sees them in its own file, short enough for
    // a message: a layout that differs between ranks shows here.
    // (Cut short: the summary travels in a frame of at most 4 KiB.)
    let files: Vec<String> = crate::experiment::rank_file_sets(experiments)
        .iter()
        .map(|f| {
            let mut layout = f.layout();
            if layout.len() > 1500 {
                let mut end = 1500;
                while !layout.is_char_boundary(end) {
                    end -= 1;
                }
                layout.truncate(end);
                layout.push('…');
            }
            format!("{RANK_FILES}{}: {layout}", f.template())
        })
        .collect();
    let mut files = files.concat();
    if files.len() > 3000 {
        let mut end = 3000;
        while !files.is_char_boundary(end) {
            end -= 1;
        }
        files.truncate(end);
        files.push('…');
    }
    (
        lines,
        format!("{cases} cases of {}{files}", names.join(", ")),
    )
}

/// How a plan summary lists a set of rank files (see [`experiment_plan`]).
const RANK_FILES: &str = "; rank files ";
/// How a disagreement about rank files starts, on every rank.
const FILES_DIFFER: &str = "rank files differ between ranks: ";

/// The error a disagreement `msg` is: the ranks' files, or the work.
fn disagree(msg: String) -> RankError {
    if msg.starts_with(FILES_DIFFER) {
        RankError::FilesDiffer(msg)
    } else {
        RankError::Disagree(msg)
    }
}

/// Where rank `rank`'s rank files (as its plan summary `theirs` lists
/// them) first differ from rank 0's (`ours`): the tensor and both layouts.
/// `None` when the summaries agree on the rank files.
fn files_difference(rank: usize, theirs: &str, ours: &str) -> Option<String> {
    let sets =
        |s: &str| -> Vec<String> { s.split(RANK_FILES).skip(1).map(str::to_string).collect() };
    let (a, b) = (sets(theirs), sets(ours));
    for (x, y) in a.iter().zip(&b) {
        if x == y {
            continue;
        }
        let (tx, ty) = (x.split_once(": "), y.split_once(": "));
        let (Some((template, lx)), Some((_, ly))) = (tx, ty) else {
            continue;
        };
        // `<format> name:type[len],name:type[len]...` (perhaps cut short).
        let tensors = |l: &str| -> Vec<String> {
            l.split_once(' ')
                .map(|(_, t)| t.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        };
        let (ta, tb) = (tensors(lx), tensors(ly));
        let first = ta.iter().zip(&tb).find(|(p, q)| p != q);
        let detail = match first {
            Some((p, q)) => format!(
                "{} holds {p} on rank {rank} but {q} on rank 0",
                template.replace("{rank}", "<rank>")
            ),
            None => format!(
                "{} holds {} tensors on rank {rank} but {} on rank 0",
                template.replace("{rank}", "<rank>"),
                ta.len(),
                tb.len()
            ),
        };
        return Some(format!(
            "{FILES_DIFFER}{detail} ({} and {})",
            template.replace("{rank}", &rank.to_string()),
            template.replace("{rank}", "0")
        ));
    }
    (a.len() != b.len() && !a.is_empty()).then(|| {
        format!(
            "{FILES_DIFFER}rank {rank} names {} sets of rank files, rank 0 {}",
            a.len(),
            b.len()
        )
    })
}

fn err(role: &str, message: impl Into<String>) -> RankError {
    RankError::Rendezvous {
        role: role.into(),
        message: message.into(),
    }
}

fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// The earlier of `deadline` and one handshake's time from now.
fn handshake_deadline(deadline: Instant) -> Instant {
    deadline.min(Instant::now() + HANDSHAKE)
}

/// A peer that proved the job token, as rank 0 holds it until it answers.
struct Joined {
    s: TcpStream,
    nonces: Nonces,
    rank: usize,
    plan: Plan,
    /// Its description as it sent it (JSON; parsed on rank 0's own thread).
    member: Vec<u8>,
    /// Who it is, once rank 0 has taken it in.
    who: Option<Member>,
}

/// How one connection's handshake on rank 0 ended.
enum Handshake {
    Proven(Box<Joined>, SocketAddr),
    Refused(SocketAddr, String),
}

/// Rank 0's side of one connection up to the peer's proven hello: at most
/// [`HELLO_MAX`] bytes in, all of it by `deadline`.
fn handshake(s: TcpStream, token: &[u8], deadline: Instant) -> Result<Joined, String> {
    let mut w = Wire::new(&s, deadline, MAGIC.len() + NONCE + HELLO_MAX, false);
    let fault = |what: &str, f: Fault| format!("{what}: {f}");
    let magic: [u8; 5] = w.read_array().map_err(|f| fault("no opening", f))?;
    if &magic != MAGIC {
        return Err(if magic.starts_with(b"FPRV") {
            format!(
                "a foldprint rank of another version (protocol {})",
                String::from_utf8_lossy(&magic)
            )
        } else {
            "not a foldprint rank".into()
        });
    }
    let peer = w.read_array().map_err(|f| fault("no nonce", f))?;
    let nonces = Nonces {
        peer,
        rank0: fresh_nonce()?,
    };
    let mut greeting = MAGIC.to_vec();
    greeting.extend_from_slice(&nonces.rank0);
    greeting.extend_from_slice(&prove(token, Role::Rank0, &nonces, &[]));
    w.write_all(&greeting).map_err(|f| fault("greeting", f))?;
    // The hello, every byte of it kept for the proof.
    let mut raw = Vec::new();
    let head: [u8; 36] = w.read_array().map_err(|f| fault("no hello", f))?;
    raw.extend_from_slice(&head);
    let summary = w
        .read_frame(SUMMARY_MAX, &mut raw)
        .map_err(|f| fault("plan summary", f))?;
    let member = w
        .read_frame(MEMBER_MAX, &mut raw)
        .map_err(|f| fault("description", f))?;
    let proof: [u8; PROOF] = w.read_array().map_err(|f| fault("no proof", f))?;
    if !verify(token, Role::Peer, &nonces, &raw, &proof) {
        return Err("no proof of the job token (or a replayed one)".into());
    }
    let mut rank = [0u8; 4];
    rank.copy_from_slice(&head[..4]);
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&head[4..]);
    Ok(Joined {
        s,
        nonces,
        rank: u32::from_le_bytes(rank) as usize,
        plan: Plan {
            digest,
            summary: String::from_utf8_lossy(&summary).into_owned(),
        },
        member,
        who: None,
    })
}

/// Answer a proven peer: `status` and `body`, with rank 0's proof over
/// them on this connection. A peer that does not take it within a second
/// loses it (an honest one reads at once).
fn answer(p: &Joined, token: &[u8], status: u8, body: &[u8]) {
    let mut msg = vec![status];
    put_frame(&mut msg, body);
    let proof = prove(token, Role::Answer, &p.nonces, &msg);
    msg.extend_from_slice(&proof);
    let _ = Wire::new(&p.s, Instant::now() + Duration::from_secs(1), 0, false).write_all(&msg);
}

/// Rank 0: accept W-1 peers on `listener`, each of which must prove the
/// job `token`, then check their plans and send `payload` (the NCCL unique
/// id) to all of them. Returns every member in rank order, `me` first.
pub fn serve(
    listener: &TcpListener,
    world: usize,
    token: &[u8],
    plan: &Plan,
    payload: &[u8],
    deadline: Instant,
    me: &Member,
) -> Result<Vec<Member>, RankError> {
    let role = "rank 0";
    listener
        .set_nonblocking(true)
        .map_err(|e| err(role, format!("listener: {e}")))?;
    let shared: Arc<[u8]> = token.into();
    let (tx, rx) = mpsc::channel::<Handshake>();
    let running = Arc::new(AtomicUsize::new(0));
    let mut peers: Vec<Option<Box<Joined>>> = (0..world).map(|_| None).collect();
    let mut joined = 0;
    let (mut refused, mut last_refusal) = (0usize, String::new());
    let mut disagreement: Option<String> = None;
    // After a disagreement, keep accepting until every peer has heard it
    // (or the deadline passes), so all ranks fail with the same message.
    while joined < world - 1 {
        if let Err(e) = interrupted() {
            reply_all(&peers, token, PEER_LOST, &format!("rank 0 was {e}"));
            return Err(e);
        }
        if disagreement.is_none() {
            if let Some(gone) = lost_peer(&peers) {
                let msg = format!(
                    "{gone} closed its connection before all {world} ranks had joined: it failed or was stopped"
                );
                reply_all(&peers, token, PEER_LOST, &msg);
                return Err(err(role, msg));
            }
        }
        if left(deadline).is_none() {
            if disagreement.is_some() {
                break;
            }
            let missing: Vec<usize> = (1..world).filter(|&r| peers[r].is_none()).collect();
            let msg = format!("ranks {missing:?} did not join before the deadline");
            reply_all(&peers, token, PEER_LOST, &msg);
            let also = match refused {
                0 => String::new(),
                n => format!("; {n} other connection(s) refused, the last {last_refusal}"),
            };
            return Err(err(
                role,
                format!(
                    "{joined} of {} peers joined before the deadline; missing ranks {missing:?}{also}",
                    world - 1
                ),
            ));
        }
        // Every waiting connection gets its own handshake thread, up to a
        // bound; past it, connections wait in the backlog.
        while running.load(Ordering::SeqCst) < MAX_HANDSHAKES {
            let (s, from) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // Out of descriptors, a connection reset before accept:
                // nothing the job can fix now, so keep serving.
                Err(e) => {
                    refused += 1;
                    last_refusal = format!("by accept: {e}");
                    break;
                }
            };
            let (tx, token, slots) = (tx.clone(), Arc::clone(&shared), Arc::clone(&running));
            let until = handshake_deadline(deadline);
            running.fetch_add(1, Ordering::SeqCst);
            let spawned = std::thread::Builder::new()
                .name("foldprint-handshake".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    let done = match handshake(s, &token, until) {
                        Ok(j) => Handshake::Proven(Box::new(j), from),
                        Err(why) => Handshake::Refused(from, why),
                    };
                    slots.fetch_sub(1, Ordering::SeqCst);
                    let _ = tx.send(done);
                });
            if let Err(e) = spawned {
                running.fetch_sub(1, Ordering::SeqCst);
                refused += 1;
                last_refusal = format!("from {from}: no thread for its handshake: {e}");
            }
        }
        let (mut j, from) = match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(Handshake::Proven(j, from)) => (j, from),
            Ok(Handshake::Refused(from, why)) => {
                refused += 1;
                last_refusal = format!("from {from}: {why}");
                continue;
            }
            Err(_) => continue,
        };
        if j.rank == 0 || j.rank >= world || peers[j.rank].is_some() {
            let msg = format!(
                "rank {} is not a free peer rank of a world of {world}",
                j.rank
            );
            answer(&j, token, BAD_RANK, msg.as_bytes());
            refused += 1;
            last_refusal = format!("from {from}: {msg}");
            continue;
        }
        // The rank a member names is the rank it proved, or it is refused.
        let member = match serde_json::from_slice::<Member>(&j.member) {
            Ok(m) if m.rank != j.rank => {
                let msg = format!(
                    "the peer that joined as rank {} describes itself as rank {}",
                    j.rank, m.rank
                );
                answer(&j, token, BAD_RANK, msg.as_bytes());
                refused += 1;
                last_refusal = format!("from {from}: {msg}");
                continue;
            }
            Ok(m) => m,
            Err(_) => Member::undescribed(
                j.rank,
                from.ip().to_string(),
                "sent no description of itself",
            ),
        };
        if j.plan.digest != plan.digest {
            disagreement = Some(
                files_difference(j.rank, &j.plan.summary, &plan.summary).unwrap_or_else(|| {
                    format!(
                        "rank {} would run `{}` but rank 0 would run `{}` (plan {} vs {})",
                        j.rank,
                        j.plan.summary,
                        plan.summary,
                        &hex::encode(j.plan.digest)[..16],
                        &hex::encode(plan.digest)[..16]
                    )
                }),
            );
        }
        // Non-blocking from here, so `lost_peer` can look without waiting.
        let _ = j.s.set_nonblocking(true);
        j.who = Some(member);
        let rank = j.rank;
        peers[rank] = Some(j);
        joined += 1;
    }
    let mut members = vec![me.clone()];
    members.extend(peers.iter().flatten().filter_map(|p| p.who.clone()));
    members.sort_by_key(|m| m.rank);
    match disagreement {
        Some(msg) => {
            reply_all(&peers, token, DISAGREE, &msg);
            Err(disagree(msg))
        }
        None => {
            for p in peers.iter().flatten() {
                answer(p, token, OK, payload);
            }
            Ok(members)
        }
    }
}

/// Tell every joined peer the same thing.
fn reply_all(peers: &[Option<Box<Joined>>], token: &[u8], status: u8, msg: &str) {
    for p in peers.iter().flatten() {
        answer(p, token, status, msg.as_bytes());
    }
}

/// The first joined peer whose connection has closed, by name.
fn lost_peer(peers: &[Option<Box<Joined>>]) -> Option<String> {
    let mut byte = [0u8; 1];
    peers.iter().flatten().find_map(|p| {
        let gone = match p.s.peek(&mut byte) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            _ => false,
        };
        gone.then(|| {
            p.who
                .as_ref()
                .map_or(format!("rank {}", p.rank), Member::who)
        })
    })
}

/// Why a peer's attempt got no greeting it could check from rank 0.
fn no_greeting(addr: SocketAddr, f: &Fault) -> String {
    match f {
        Fault::Deadline => {
            format!("the process at {addr} accepted the connection but did not greet in time")
        }
        Fault::Closed => format!("the process at {addr} closed the connection unanswered"),
        f => format!("talking to {addr}: {f}"),
    }
}

/// A peer: connect to rank 0 (retrying until it listens and greets),
/// check that it knows the job `token`, present the plan and itself, and
/// receive the payload.
pub fn join(
    addr: SocketAddr,
    me: &Member,
    token: &[u8],
    plan: &Plan,
    deadline: Instant,
) -> Result<Vec<u8>, RankError> {
    let rank = me.rank;
    let role = format!("rank {rank}");
    let stopped = |f: &Fault| match f {
        Fault::Stopped(sig) => Some(RankError::Interrupted(*sig)),
        _ => None,
    };
    // The hello, sent only to a rank 0 that proved the token.
    let mut hello = u32::try_from(rank)
        .map_err(|_| err(&role, format!("rank {rank} does not fit the rendezvous")))?
        .to_le_bytes()
        .to_vec();
    hello.extend_from_slice(&plan.digest);
    let mut summary = plan.summary.as_str();
    if summary.len() > SUMMARY_MAX {
        let mut end = SUMMARY_MAX;
        while !summary.is_char_boundary(end) {
            end -= 1;
        }
        summary = &summary[..end];
    }
    put_frame(&mut hello, summary.as_bytes());
    let json = me.to_json();
    if json.len() > MEMBER_MAX {
        return Err(err(
            &role,
            format!(
                "this rank's description is {} bytes, more than the rendezvous carries ({MEMBER_MAX})",
                json.len()
            ),
        ));
    }
    put_frame(&mut hello, &json);
    // Connect and take rank 0's greeting, again until the deadline: a
    // connection that rank 0 cannot take yet, or a process that never
    // greets, costs one handshake's time, not the job.
    let mut last: Option<String> = None;
    let (s, nonces) = loop {
        interrupted()?;
        let Some(rest) = left(deadline) else {
            return Err(err(
                &role,
                match last {
                    None => format!("rank 0 at {addr} did not answer before the deadline"),
                    Some(why) => format!(
                        "no rank 0 at {addr} completed the handshake before the deadline ({why})"
                    ),
                },
            ));
        };
        let s = match TcpStream::connect_timeout(&addr, rest.min(POLL)) {
            Ok(s) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let nonce = fresh_nonce().map_err(|m| err(&role, m))?;
        let mut w = Wire::new(&s, handshake_deadline(deadline), GREETING, true);
        let mut opening = MAGIC.to_vec();
        opening.extend_from_slice(&nonce);
        let greeting = w
            .write_all(&opening)
            .and_then(|_| w.read_array::<GREETING>());
        let greeting = match greeting {
            Ok(g) => g,
            Err(f) => {
                if let Some(e) = stopped(&f) {
                    return Err(e);
                }
                last = Some(no_greeting(addr, &f));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let (magic, rest) = greeting.split_at(MAGIC.len());
        let (rank0, proof) = rest.split_at(NONCE);
        let mut nonces = Nonces {
            peer: nonce,
            rank0: [0; NONCE],
        };
        nonces.rank0.copy_from_slice(rank0);
        if magic != MAGIC {
            return Err(err(
                &role,
                format!("the process at {addr} is not a foldprint rank 0 of this version"),
            ));
        }
        if !verify(token, Role::Rank0, &nonces, &[], proof) {
            return Err(err(
                &role,
                format!(
                    "the process at {addr} does not know the job token: not this job's rank 0 \
                     (another job or program holds the port, or the ranks were given different \
                     FOLDPRINT_JOB_TOKEN values)"
                ),
            ));
        }
        break (s, nonces);
    };
    let proof = prove(token, Role::Peer, &nonces, &hello);
    hello.extend_from_slice(&proof);
    let gone = || {
        err(
            &role,
            format!(
                "rank 0 at {addr} closed the connection before answering: it failed or was stopped"
            ),
        )
    };
    let fail = |f: Fault, waiting: bool| match f {
        Fault::Stopped(sig) => RankError::Interrupted(sig),
        Fault::Closed => gone(),
        Fault::Deadline if waiting => err(
            &role,
            format!("no answer from rank 0 at {addr} before the deadline; are all ranks started?"),
        ),
        f => err(&role, format!("rank 0's answer from {addr}: {f}")),
    };
    let mut w = Wire::new(&s, handshake_deadline(deadline), 0, true);
    w.write_all(&hello).map_err(|f| fail(f, false))?;
    // Rank 0 answers once every rank has joined: wait up to the job's
    // deadline for the first byte, then one handshake's time for the rest.
    w.phase(deadline, 1);
    let status: [u8; 1] = w.read_array().map_err(|f| fail(f, true))?;
    w.phase(handshake_deadline(deadline), 4 + ANSWER_MAX + PROOF);
    let mut msg = status.to_vec();
    let body = w
        .read_frame(ANSWER_MAX, &mut msg)
        .map_err(|f| fail(f, false))?;
    let proof: [u8; PROOF] = w.read_array().map_err(|f| fail(f, false))?;
    if !verify(token, Role::Answer, &nonces, &msg, &proof) {
        return Err(err(
            &role,
            format!(
                "the answer from rank 0 at {addr} does not carry its proof of the job token: it was altered on the way"
            ),
        ));
    }
    match status[0] {
        OK => Ok(body),
        DISAGREE => Err(disagree(String::from_utf8_lossy(&body).into_owned())),
        PEER_LOST => Err(err(&role, String::from_utf8_lossy(&body).into_owned())),
        _ => Err(err(
            &role,
            format!("rank 0 refused: {}", String::from_utf8_lossy(&body)),
        )),
    }
}

/// Rank 0's `payload` (NCCL's unique id) handed to every rank of the job
/// of `e`, once every rank has presented the same plan: through the
/// directory `FOLDPRINT_RENDEZVOUS_DIR` when set, else over TCP at rank 0's
/// address.
pub fn exchange(
    e: &RankEnv,
    me: &Member,
    plan: &Plan,
    payload: &[u8],
    deadline: Instant,
) -> Result<Agreement, RankError> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    exchange_with(e, get, me, plan, payload, deadline)
}

/// [`exchange`] with the environment given as a lookup.
pub fn exchange_with(
    e: &RankEnv,
    get: impl Fn(&str) -> Option<String>,
    me: &Member,
    plan: &Plan,
    payload: &[u8],
    deadline: Instant,
) -> Result<Agreement, RankError> {
    let (token, job, _) = job::identity_from(&get);
    let role = format!("rank {}", e.rank);
    if let Some(dir) = get("FOLDPRINT_RENDEZVOUS_DIR") {
        let dir = std::path::PathBuf::from(dir);
        let how = format!("directory {} (job {job})", dir.display());
        let (payload, members) = if e.rank == 0 {
            let members = publish_dir(&dir, &job, e.world, plan, payload, deadline, me)?;
            (payload.to_vec(), members)
        } else {
            (join_dir(&dir, &job, me, plan, deadline)?, vec![me.clone()])
        };
        return Ok(Agreement {
            payload,
            how,
            members,
        });
    }
    let (host, port) = job::rendezvous_addr_from(e, &get)?;
    let how = format!("tcp {host}:{port}");
    let got = if e.rank == 0 {
        let listener = job::listen(e, &get)?;
        let members = serve(&listener, e.world, &token, plan, payload, deadline, me)?;
        (payload.to_vec(), members)
    } else {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| err(&role, format!("cannot resolve {host}:{port}")))?;
        (join(addr, me, &token, plan, deadline)?, vec![me.clone()])
    };
    Ok(Agreement {
        payload: got.0,
        how,
        members: got.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(s: &str) -> Plan {
        Plan::new(&[s.to_string()], s)
    }

    fn experiment_plan_of(texts: &[&str]) -> Plan {
        let exps: Vec<Experiment> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let path = std::path::PathBuf::from(format!("e{i}.toml"));
                crate::experiment::parse(&path, t).unwrap()
            })
            .collect();
        let (lines, summary) = experiment_plan(&exps);
        Plan::new(&lines, summary)
    }

    #[test]
    fn a_rank_file_layout_that_differs_is_named_by_its_tensor() {
        let ours = "2 cases of g@abc; rank files g/rank{rank}.safetensors: safetensors b:f32[7],w:f32[3x100]";
        let theirs = ours.replace("w:f32[3x100]", "w:bf16[3x100]");
        let m = files_difference(2, &theirs, ours).unwrap();
        assert!(m.starts_with(FILES_DIFFER), "{m}");
        assert!(
            m.contains("g/rank<rank>.safetensors holds w:bf16[3x100] on rank 2 but w:f32[3x100] on rank 0 (g/rank2.safetensors and g/rank0.safetensors)"),
            "{m}"
        );
        assert!(matches!(disagree(m), RankError::FilesDiffer(_)));
        let fewer = ours.replace(",w:f32[3x100]", "");
        let m = files_difference(1, &fewer, ours).unwrap();
        assert!(
            m.contains("holds 1 tensors on rank 1 but 2 on rank 0"),
            "{m}"
        );
        // Negative control: the same files, another experiment, is no
        // rank-file difference (and stays a plain disagreement).
        assert_eq!(files_difference(1, ours, ours), None);
        let other = ours.replace("2 cases", "3 cases");
        assert_eq!(files_difference(1, &other, ours), None);
        assert!(matches!(disagree("x".into()), RankError::Disagree(_)));
    }

    #[test]
    fn experiment_plans_agree_exactly_when_the_experiments_do() {
        let a =
            "name = \"a\"\n[defaults]\nworld = 2\narenas = [8]\nseed = 1\n[[case]]\nid = \"x\"\n";
        let b =
            "name = \"b\"\n[defaults]\nworld = 2\narenas = [8]\nseed = 1\n[[case]]\nid = \"x\"\n";
        let a_seed = a.replace("seed = 1", "seed = 2");
        let same = experiment_plan_of(&[a, b]);
        assert_eq!(same, experiment_plan_of(&[a, b]));
        assert!(
            same.summary.starts_with("2 cases of a@"),
            "{}",
            same.summary
        );
        // Another case, another file text, another order: another plan.
        assert_ne!(
            same.digest,
            experiment_plan_of(&[a_seed.as_str(), b]).digest
        );
        assert_ne!(same.digest, experiment_plan_of(&[b, a]).digest);
        assert_ne!(same.digest, experiment_plan_of(&[a]).digest);
    }

    type Outcome = (
        Result<Vec<Member>, RankError>,
        Vec<Result<Vec<u8>, RankError>>,
    );

    /// A described member of `rank` (also for the directory rendezvous's tests).
    pub(super) fn member(rank: usize) -> Member {
        Member {
            rank,
            local_rank: rank,
            host: format!("host{rank}"),
            pid: 100 + rank as u32,
            device: Some(rank),
            nccl_hostid: None,
            problem: None,
            inputs: Vec::new(),
        }
    }

    fn tcp_job(world: usize, plans: Vec<Plan>, tokens: Vec<&'static [u8]>, secs: u64) -> Outcome {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(secs);
        let peers: Vec<_> = (1..world)
            .map(|r| {
                let p = plans[r].clone();
                let t = tokens[r];
                std::thread::spawn(move || join(addr, &member(r), t, &p, deadline))
            })
            .collect();
        let served = serve(
            &listener,
            world,
            tokens[0],
            &plans[0],
            &[7u8; 128],
            deadline,
            &member(0),
        );
        (
            served,
            peers.into_iter().map(|h| h.join().unwrap()).collect(),
        )
    }

    #[test]
    fn every_peer_gets_the_id_when_plans_and_tokens_match() {
        let (s, peers) = tcp_job(4, vec![plan("a"); 4], vec![b"tok"; 4], 10);
        // Rank 0 learns every member, in rank order.
        assert_eq!(s.unwrap(), (0..4).map(member).collect::<Vec<_>>());
        for p in peers {
            assert_eq!(p.unwrap(), vec![7u8; 128]);
        }
    }

    #[test]
    fn a_plan_mismatch_fails_every_rank_with_the_same_story() {
        let (s, peers) = tcp_job(
            3,
            vec![plan("a"), plan("a"), plan("b")],
            vec![b"tok"; 3],
            10,
        );
        let e = s.unwrap_err().to_string();
        assert!(e.contains("rank 2 would run `b`"), "{e}");
        for p in peers {
            assert!(p.unwrap_err().to_string().contains("rank 2 would run `b`"));
        }
    }

    #[test]
    fn a_peer_with_another_token_is_told_rank_zero_is_not_its_own_and_the_job_times_out() {
        let t = Instant::now();
        let (s, peers) = tcp_job(2, vec![plan("a"); 2], vec![b"right", b"wrong"], 2);
        let e = s.unwrap_err().to_string();
        assert!(e.contains("missing ranks [1]"), "{e}");
        assert!(e.contains("1 other connection(s) refused"), "{e}");
        let p = peers[0].as_ref().unwrap_err().to_string();
        assert!(p.contains("does not know the job token"), "{p}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// What a token holder says as a peer: the opening, then (after rank
    /// 0's greeting, unchecked) a hello with `json` as its description.
    fn present(addr: SocketAddr, rank: usize, token: &[u8], p: &Plan, json: &[u8]) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        let far = Instant::now() + Duration::from_secs(10);
        let mut w = Wire::new(&s, far, 1 << 20, false);
        let peer = fresh_nonce().unwrap();
        w.write_all(&[MAGIC.as_slice(), &peer].concat()).unwrap();
        let g: [u8; GREETING] = w.read_array().unwrap();
        let mut n = Nonces {
            peer,
            rank0: [0; NONCE],
        };
        n.rank0.copy_from_slice(&g[5..5 + NONCE]);
        let mut hello = (rank as u32).to_le_bytes().to_vec();
        hello.extend_from_slice(&p.digest);
        put_frame(&mut hello, p.summary.as_bytes());
        put_frame(&mut hello, json);
        let proof = prove(token, Role::Peer, &n, &hello);
        w.write_all(&[hello, proof.to_vec()].concat()).unwrap();
        s
    }

    #[test]
    fn a_member_naming_another_rank_than_it_joined_as_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let rank0 = std::thread::spawn(move || {
            serve(
                &listener,
                2,
                b"tok",
                &plan("a"),
                &[7; 16],
                deadline,
                &member(0),
            )
        });
        // Joins as rank 1 but describes itself as rank 0.
        let s = present(addr, 1, b"tok", &plan("a"), &member(0).to_json());
        let mut w = Wire::new(&s, deadline, 1 << 16, false);
        let answer: [u8; 5] = w.read_array().unwrap();
        assert_eq!(answer[0], BAD_RANK);
        let mut msg = vec![0u8; u32::from_le_bytes(answer[1..].try_into().unwrap()) as usize];
        w.read_exact(&mut msg).unwrap();
        let msg = String::from_utf8_lossy(&msg);
        assert!(
            msg.contains("joined as rank 1 describes itself as rank 0"),
            "{msg}"
        );
        // The slot stays free: the real rank 1 joins, and rank 0 lists
        // each rank once.
        let got = join(addr, &member(1), b"tok", &plan("a"), deadline).unwrap();
        assert_eq!(got, vec![7; 16]);
        assert_eq!(rank0.join().unwrap().unwrap(), vec![member(0), member(1)]);
    }

    /// A relay between a peer and rank 0 that flips the byte at `flip` (if
    /// any) of what rank 0 sends.
    fn relay(front: TcpListener, back: SocketAddr, flip: Option<usize>) {
        let (a, _) = front.accept().unwrap();
        let b = TcpStream::connect(back).unwrap();
        let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        let up = std::thread::spawn(move || {
            let _ = std::io::copy(&mut a2, &mut b2);
        });
        let (mut from, mut to) = (b, a);
        let (mut at, mut buf) = (0, [0u8; 256]);
        use std::io::{Read, Write};
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if let Some(i) = flip.filter(|i| (at..at + n).contains(i)) {
                buf[i - at] ^= 1;
            }
            at += n;
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        drop(to);
        let _ = up.join();
    }

    #[test]
    fn an_answer_altered_on_the_way_is_refused() {
        for flip in [None, Some(GREETING + 20)] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let front = TcpListener::bind("127.0.0.1:0").unwrap();
            let (back, addr) = (listener.local_addr().unwrap(), front.local_addr().unwrap());
            let deadline = Instant::now() + Duration::from_secs(20);
            let r = std::thread::spawn(move || relay(front, back, flip));
            let peer =
                std::thread::spawn(move || join(addr, &member(1), b"tok", &plan("a"), deadline));
            let served = serve(
                &listener,
                2,
                b"tok",
                &plan("a"),
                &[7; 64],
                deadline,
                &member(0),
            );
            assert!(served.is_ok(), "{served:?}");
            drop(listener);
            let got = peer.join().unwrap();
            r.join().unwrap();
            match flip {
                // Negative control: a relay that changes nothing is only a
                // longer wire.
                None => assert_eq!(got.unwrap(), vec![7; 64]),
                Some(_) => {
                    let e = got.unwrap_err().to_string();
                    assert!(e.contains("altered on the way"), "{e}");
                }
            }
        }
    }

    #[test]
    fn a_peer_without_rank_zero_hits_the_deadline() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let t = Instant::now();
        let e = join(
            addr,
            &member(1),
            b"t",
            &plan("a"),
            Instant::now() + Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(e.to_string().contains("deadline"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
    }

    fn rank_env(rank: usize, world: usize) -> RankEnv {
        RankEnv {
            rank,
            world,
            local_rank: 0,
            source: "foldprint",
            master: None,
            variables: Vec::new(),
            others: Vec::new(),
        }
    }

    /// Every rank of a W = 3 job through `exchange_with` and `vars`; rank
    /// 2 presents `plan2`.
    fn exchange_job(
        vars: Vec<(&'static str, String)>,
        plan2: &str,
    ) -> Vec<Result<Vec<u8>, RankError>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let vars = vars.clone();
                let p = plan(if r == 2 { plan2 } else { "a" });
                std::thread::spawn(move || {
                    let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
                    let payload = if r == 0 { vec![5u8; 128] } else { Vec::new() };
                    exchange_with(&rank_env(r, 3), get, &member(r), &p, &payload, deadline)
                        .map(|a| a.payload)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn exchange_hands_rank_zeros_payload_to_all_over_a_directory_and_tcp() {
        let dir = tempfile::tempdir().unwrap();
        let by_dir = vec![
            ("FOLDPRINT_RENDEZVOUS_DIR", dir.path().display().to_string()),
            ("FOLDPRINT_JOB_ID", "x1".to_string()),
        ];
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let by_tcp = vec![
            ("FOLDPRINT_MASTER_ADDR", "127.0.0.1".to_string()),
            ("FOLDPRINT_MASTER_PORT", port.to_string()),
        ];
        for vars in [by_dir.clone(), by_tcp] {
            for got in exchange_job(vars, "a") {
                assert_eq!(got.unwrap(), vec![5u8; 128]);
            }
        }
        // Negative control: one rank with another plan fails the job.
        let dir2 = tempfile::tempdir().unwrap();
        let vars = vec![
            (
                "FOLDPRINT_RENDEZVOUS_DIR",
                dir2.path().display().to_string(),
            ),
            ("FOLDPRINT_JOB_ID", "x2".to_string()),
        ];
        let out = exchange_job(vars, "b");
        assert!(out[2].is_err(), "{out:?}");
    }

    #[test]
    fn exchange_without_an_address_says_what_to_set() {
        let e = exchange_with(
            &rank_env(1, 3),
            |_| None,
            &member(1),
            &plan("a"),
            &[],
            Instant::now() + Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("FOLDPRINT_MASTER_ADDR"), "{e}");
    }

    /// A peer that presents itself and then goes away, as a rank killed
    /// mid-rendezvous does.
    fn vanishing_peer(addr: SocketAddr, rank: usize, token: &[u8], p: &Plan) {
        let s = present(addr, rank, token, p, &member(rank).to_json());
        std::thread::sleep(Duration::from_millis(100));
        drop(s);
    }

    #[test]
    fn a_peer_that_dies_after_joining_fails_every_rank_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Generous deadline: the test shows nobody waits for it.
        let deadline = Instant::now() + Duration::from_secs(60);
        let t = Instant::now();
        let waiting =
            std::thread::spawn(move || join(addr, &member(1), b"tok", &plan("a"), deadline));
        let gone = std::thread::spawn(move || vanishing_peer(addr, 2, b"tok", &plan("a")));
        // Rank 3 never comes: without the check, rank 0 would wait 60 s.
        let e = serve(
            &listener,
            4,
            b"tok",
            &plan("a"),
            &[7; 128],
            deadline,
            &member(0),
        )
        .unwrap_err()
        .to_string();
        gone.join().unwrap();
        assert!(
            e.contains("rank 2 (host2, pid 102) closed its connection"),
            "{e}"
        );
        let peer = waiting.join().unwrap().unwrap_err().to_string();
        assert!(
            peer.contains("rank 2 (host2, pid 102) closed its connection"),
            "{peer}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn a_peer_sees_rank_zero_go_away_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let t = Instant::now();
        let peer = std::thread::spawn(move || join(addr, &member(1), b"tok", &plan("a"), deadline));
        // Rank 0 greets, takes the hello and dies without answering.
        let (s, _) = listener.accept().unwrap();
        let mut w = Wire::new(&s, deadline, 1 << 20, false);
        let opening: [u8; 5 + NONCE] = w.read_array().unwrap();
        let mut n = Nonces {
            peer: [0; NONCE],
            rank0: [9; NONCE],
        };
        n.peer.copy_from_slice(&opening[5..]);
        let proof = prove(b"tok", Role::Rank0, &n, &[]);
        w.write_all(&[MAGIC.as_slice(), &n.rank0, &proof].concat())
            .unwrap();
        let _: [u8; 36] = w.read_array().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(s);
        let e = peer.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("closed the connection before answering"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
