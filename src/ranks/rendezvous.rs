//! Getting NCCL's unique id from rank 0 to every rank, and making every rank
//! agree on the work first: a length mismatch in NCCL point-to-point calls
//! hangs rather than errors, so disagreement must be caught here.
//!
//! TCP: rank 0 listens; each peer connects and presents the job token, its
//! rank, its plan (a digest of the cases it is about to run plus a short
//! description) and itself as a [`Member`] (host, pid, device). Rank 0
//! answers nobody until all W-1 peers have presented matching plans, then
//! sends the id to all; on a mismatch it tells all of them and everyone
//! fails with the same message. Wrong tokens are turned away without
//! disturbing the job. A peer whose connection closes while rank 0 waits
//! (it died, or its launcher stopped it) fails the job at once, and so does
//! rank 0's: nobody waits for the deadline on a rank that is gone. A signal
//! (a launcher stopping the job) ends every wait within 0.2 s.
//!
//! Directory: rank 0 writes `<job>.id` atomically; peers read it, compare
//! plans and acknowledge with `<job>.ack.<rank>` (holding the member);
//! rank 0 waits for the acks.

use super::discover::RankEnv;
use super::{job, RankError};
use crate::experiment::Experiment;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

mod dir;
pub use dir::{join_dir, publish_dir};

const MAGIC: &[u8; 5] = b"FPRV2";
const OK: u8 = 0;
const BAD_TOKEN: u8 = 1;
const DISAGREE: u8 = 2;
const BAD_RANK: u8 = 3;
const PEER_LOST: u8 = 4;

/// How often a wait looks at signals and dead peers.
const POLL: Duration = Duration::from_millis(200);

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

fn same_token(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

fn write_frame(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(&(bytes.len() as u32).to_le_bytes())?;
    s.write_all(bytes)
}

fn read_frame(s: &mut TcpStream, max: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

struct Hello {
    rank: usize,
    token: Vec<u8>,
    plan: Plan,
    member: Option<Member>,
}

fn read_hello(s: &mut TcpStream) -> std::io::Result<Hello> {
    let mut magic = [0u8; 5];
    s.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a foldprint rendezvous client",
        ));
    }
    let mut rank = [0u8; 4];
    s.read_exact(&mut rank)?;
    let token = read_frame(s, 1024)?;
    let mut digest = [0u8; 32];
    s.read_exact(&mut digest)?;
    let summary = String::from_utf8_lossy(&read_frame(s, 4096)?).into_owned();
    let member = serde_json::from_slice(&read_frame(s, 4096)?).ok();
    Ok(Hello {
        rank: u32::from_le_bytes(rank) as usize,
        token,
        plan: Plan { digest, summary },
        member,
    })
}

fn reply(s: &mut TcpStream, status: u8, body: &[u8]) {
    let _ = s.write_all(&[status]).and_then(|_| write_frame(s, body));
}

/// Rank 0: accept W-1 peers on `listener`, check tokens and plans, then send
/// `payload` (the NCCL unique id) to all of them. Returns every member in
/// rank order, `me` first.
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
    let mut peers: Vec<Option<(TcpStream, Member)>> = (0..world).map(|_| None).collect();
    let mut joined = 0;
    let mut disagreement: Option<String> = None;
    // After a disagreement, keep accepting until every peer has heard it
    // (or the deadline passes), so all ranks fail with the same message.
    while joined < world - 1 {
        if let Err(e) = interrupted() {
            reply_all(&mut peers, PEER_LOST, &format!("rank 0 was {e}"));
            return Err(e);
        }
        if disagreement.is_none() {
            if let Some(gone) = lost_peer(&mut peers) {
                let msg = format!(
                    "{gone} closed its connection before all {world} ranks had joined: it failed or was stopped"
                );
                reply_all(&mut peers, PEER_LOST, &msg);
                return Err(err(role, msg));
            }
        }
        let Some(rest) = left(deadline) else {
            if disagreement.is_some() {
                break;
            }
            let missing: Vec<usize> = (1..world).filter(|&r| peers[r].is_none()).collect();
            let msg = format!("ranks {missing:?} did not join before the deadline");
            reply_all(&mut peers, PEER_LOST, &msg);
            return Err(err(
                role,
                format!(
                    "{joined} of {} peers joined before the deadline; missing ranks {missing:?}",
                    world - 1
                ),
            ));
        };
        let (mut s, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(err(role, format!("accept: {e}"))),
        };
        // A silent client must not stall the job: bound each handshake.
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(rest.min(Duration::from_secs(5))));
        let mut hello = match read_hello(&mut s) {
            Ok(h) => h,
            Err(_) => continue,
        };
        if !same_token(&hello.token, token) {
            reply(
                &mut s,
                BAD_TOKEN,
                format!("wrong job token from {from}").as_bytes(),
            );
            continue;
        }
        if hello.rank == 0 || hello.rank >= world || peers[hello.rank].is_some() {
            reply(
                &mut s,
                BAD_RANK,
                format!(
                    "rank {} is not a free peer rank of a world of {world}",
                    hello.rank
                )
                .as_bytes(),
            );
            continue;
        }
        let member = hello.member.take().unwrap_or_else(|| {
            Member::undescribed(
                hello.rank,
                from.ip().to_string(),
                "sent no description of itself",
            )
        });
        if hello.plan.digest != plan.digest {
            disagreement = Some(
                files_difference(hello.rank, &hello.plan.summary, &plan.summary).unwrap_or_else(
                    || {
                        format!(
                            "rank {} would run `{}` but rank 0 would run `{}` (plan {} vs {})",
                            hello.rank,
                            hello.plan.summary,
                            plan.summary,
                            &hex::encode(hello.plan.digest)[..16],
                            &hex::encode(plan.digest)[..16]
                        )
                    },
                ),
            );
        }
        // Non-blocking from here, so `lost_peer` can look without waiting.
        let _ = s.set_nonblocking(true);
        peers[hello.rank] = Some((s, member));
        joined += 1;
    }
    let mut members = vec![me.clone()];
    for (s, m) in peers.iter_mut().flatten() {
        let _ = s.set_nonblocking(false);
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        members.push(m.clone());
    }
    members.sort_by_key(|m| m.rank);
    match disagreement {
        Some(msg) => {
            reply_all(&mut peers, DISAGREE, &msg);
            Err(disagree(msg))
        }
        None => {
            for (s, _) in peers.iter_mut().flatten() {
                reply(s, OK, payload);
            }
            Ok(members)
        }
    }
}

/// Tell every joined peer the same thing.
fn reply_all(peers: &mut [Option<(TcpStream, Member)>], status: u8, msg: &str) {
    for (s, _) in peers.iter_mut().flatten() {
        reply(s, status, msg.as_bytes());
    }
}

/// The first joined peer whose connection has closed, by name.
fn lost_peer(peers: &mut [Option<(TcpStream, Member)>]) -> Option<String> {
    let mut byte = [0u8; 1];
    peers
        .iter_mut()
        .flatten()
        .find_map(|(s, m)| match s.peek(&mut byte) {
            Ok(0) => Some(m.who()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(m.who()),
            _ => None,
        })
}

/// A peer: connect to rank 0 (retrying until it listens), present the
/// token, plan and itself, and receive the payload.
pub fn join(
    addr: SocketAddr,
    me: &Member,
    token: &[u8],
    plan: &Plan,
    deadline: Instant,
) -> Result<Vec<u8>, RankError> {
    let rank = me.rank;
    let role = format!("rank {rank}");
    let mut s = loop {
        interrupted()?;
        let Some(rest) = left(deadline) else {
            return Err(err(
                &role,
                format!("rank 0 at {addr} did not answer before the deadline"),
            ));
        };
        match TcpStream::connect_timeout(&addr, rest.min(POLL)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let io = |e: std::io::Error| err(&role, format!("talking to rank 0 at {addr}: {e}"));
    let mut hello = Vec::new();
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    s.write_all(&hello).map_err(io)?;
    write_frame(&mut s, token).map_err(io)?;
    s.write_all(&plan.digest).map_err(io)?;
    write_frame(&mut s, plan.summary.as_bytes()).map_err(io)?;
    write_frame(&mut s, &me.to_json()).map_err(io)?;
    // Wait for the answer in short steps, so a signal or rank 0's end is
    // seen at once rather than at the deadline.
    let mut status = [0u8; 1];
    loop {
        interrupted()?;
        let Some(rest) = left(deadline) else {
            return Err(err(
                &role,
                format!(
                    "no answer from rank 0 at {addr} before the deadline; are all ranks started?"
                ),
            ));
        };
        s.set_read_timeout(Some(rest.min(POLL))).map_err(io)?;
        use std::io::ErrorKind as K;
        let closed = match s.read(&mut status) {
            Ok(1) => break,
            Ok(_) => true,
            Err(e) if matches!(e.kind(), K::ConnectionReset | K::ConnectionAborted) => true,
            Err(e) if matches!(e.kind(), K::WouldBlock | K::TimedOut | K::Interrupted) => false,
            Err(e) => return Err(io(e)),
        };
        if closed {
            return Err(err(
                &role,
                format!(
                    "rank 0 at {addr} closed the connection before answering: it failed or was stopped"
                ),
            ));
        }
    }
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let body = read_frame(&mut s, 1 << 16).map_err(io)?;
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

    fn member(rank: usize) -> Member {
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
    fn a_stranger_with_the_wrong_token_is_turned_away_and_the_job_times_out() {
        let (s, peers) = tcp_job(2, vec![plan("a"); 2], vec![b"right", b"wrong"], 1);
        assert!(s.unwrap_err().to_string().contains("missing ranks [1]"));
        assert!(peers[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("wrong job token"));
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
        let mut s = TcpStream::connect(addr).unwrap();
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        s.write_all(&hello).unwrap();
        write_frame(&mut s, token).unwrap();
        s.write_all(&p.digest).unwrap();
        write_frame(&mut s, p.summary.as_bytes()).unwrap();
        write_frame(&mut s, &member(rank).to_json()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
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
        // Rank 0 takes the connection and dies without answering.
        let (s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(s);
        let e = peer.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("closed the connection before answering"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
