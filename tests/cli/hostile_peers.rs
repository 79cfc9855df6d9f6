//! The TCP rendezvous under attack from a local user: real `foldprint
//! world` ranks, and raw sockets from this test that drip, idle, squat on
//! rank 0's port, replay a recorded handshake or hold the token and claim
//! another rank. Each attack must end by its deadline with the promised
//! exit code, never leak the token, and where the attacker only connects,
//! the real job must still succeed.
//!
//! The client side of the protocol is written here again from its
//! description (src/ranks/handshake.rs), not taken from the library.

use crate::common::free_port;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &[u8] = b"FPRV3";
const DOMAIN: &[u8] = b"foldprint rendezvous 3\0";
/// Rank 0's greeting: magic, nonce, proof.
const GREETING: usize = 5 + 32 + 32;

/// A token no other test uses.
fn secret(tag: &str) -> String {
    format!("{tag}-{}-{:x}", std::process::id(), free_port())
}

/// Rank `r` of a world of `world`, as a launcher starts it.
fn rank(r: usize, world: usize, port: u16, timeout_s: u64, token: &str) -> Child {
    let mut c = Command::new(crate::common::bin_path());
    c.args(["world", "--json", "--init-timeout", &timeout_s.to_string()]);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "FOLDPRINT_RENDEZVOUS_DIR",
        "FOLDPRINT_JOB_ID",
    ] {
        c.env_remove(v);
    }
    c.env("FOLDPRINT_RANK", r.to_string())
        .env("FOLDPRINT_WORLD_SIZE", world.to_string())
        .env("FOLDPRINT_LOCAL_RANK", r.to_string())
        .env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
        .env("FOLDPRINT_MASTER_PORT", port.to_string())
        .env("FOLDPRINT_JOB_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

struct Ended {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// When it ended.
    at: Instant,
}

/// Wait for `child` at most `limit`; past it, kill it and fail the test
/// (a stall is what these tests look for).
fn ended(mut child: Child, limit: Duration, what: &str) -> Ended {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let at = Instant::now();
            let out = child.wait_with_output().unwrap();
            return Ended {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                at,
            };
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?} (stalled); stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until something listens on `port` (rank 0 has started).
fn listening(port: u16) {
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "rank 0 never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
}

/// Clients that keep a connection to `port` open and send one byte a
/// second (reconnecting when the other side hangs up), until `stop`: the
/// start of a hello of the protocol before this one, connected first (the
/// old rank 0 took connections in turn), and of this one.
fn drip(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let connect = move || TcpStream::connect(("127.0.0.1", port)).ok();
    let one = |start: &'static [u8], first: Option<TcpStream>, stop: Arc<AtomicBool>| {
        std::thread::spawn(move || {
            let mut next = first;
            while !stop.load(Ordering::SeqCst) {
                let Some(mut s) = next.take().or_else(connect) else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                // A plausible start, then zeros: never a whole message.
                for b in start.iter().chain(std::iter::repeat(&0u8)) {
                    if stop.load(Ordering::SeqCst) || s.write_all(&[*b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        })
    };
    let (old, new) = (connect(), connect());
    let both = [one(b"FPRV2", old, stop.clone()), one(b"FPRV3", new, stop)];
    std::thread::spawn(move || {
        for t in both {
            t.join().unwrap();
        }
    })
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn member_pids(out: &str) -> Vec<(u64, u64)> {
    json(out)["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["rank"].as_u64().unwrap(), m["pid"].as_u64().unwrap()))
        .collect()
}

#[test]
fn a_dripping_client_does_not_hold_rank_zero_past_its_deadline() {
    let port = free_port();
    let t0 = Instant::now();
    let zero = rank(0, 2, port, 5, &secret("drip"));
    listening(port);
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = drip(port, stop.clone());
    // The old rank 0 read each handshake with a timeout that restarted
    // with every byte, and never came back.
    let e = ended(zero, Duration::from_secs(25), "rank 0 under a drip");
    stop.store(true, Ordering::SeqCst);
    let took = e.at - t0;
    assert_eq!(e.code, Some(4), "{}", e.stderr);
    assert!(e.stderr.contains("missing ranks [1]"), "{}", e.stderr);
    assert!(took < Duration::from_secs(5 + 3), "{took:?}");
    dripper.join().unwrap();
}

#[test]
fn a_dripping_client_does_not_hold_rank_zero_past_a_signal() {
    let port = free_port();
    let zero = rank(0, 2, port, 60, &secret("drip-sig"));
    listening(port);
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = drip(port, stop.clone());
    // Past the first handshakes' 5 s: the drippers are at it again (and
    // the old rank 0 was stuck in one for good).
    std::thread::sleep(Duration::from_millis(6500));
    let t = Instant::now();
    sigterm(&zero);
    let e = ended(
        zero,
        Duration::from_secs(15),
        "rank 0 under a drip, signalled",
    );
    stop.store(true, Ordering::SeqCst);
    assert_eq!(e.code, Some(143), "{}", e.stderr);
    assert!(
        e.at - t < Duration::from_secs(1),
        "ended {:?} after SIGTERM",
        e.at - t
    );
    dripper.join().unwrap();
}

#[test]
fn idle_and_dripping_connections_do_not_delay_the_real_rank() {
    let port = free_port();
    let token = secret("idle");
    let zero = rank(0, 2, port, 20, &token);
    listening(port);
    // Connections that say nothing, held open, and one that drips: with
    // handshakes one after another at 5 s each, the old rank 0 ran out of
    // its 20 s before it reached the real rank 1.
    let idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = drip(port, stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let one = rank(1, 2, port, 20, &token);
    let one_pid = one.id() as u64;
    let z = ended(zero, Duration::from_secs(40), "rank 0");
    let o = ended(one, Duration::from_secs(40), "rank 1");
    stop.store(true, Ordering::SeqCst);
    drop(idle);
    assert_eq!(z.code, Some(0), "rank 0: {}", z.stderr);
    assert_eq!(o.code, Some(0), "rank 1: {}", o.stderr);
    assert_eq!(member_pids(&z.stdout)[1], (1, one_pid));
    assert!(
        z.at - t < Duration::from_secs(10),
        "the world met {:?} after rank 1 started",
        z.at - t
    );
    dripper.join().unwrap();
}

/// A process that holds `listener` (rank 0's port) and plays rank 0: each
/// connection's bytes are kept in `heard`; `act` answers it.
fn squatter(
    listener: TcpListener,
    heard: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    act: fn(&mut TcpStream, &[u8], &AtomicBool),
) -> std::thread::JoinHandle<()> {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut talks = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let Ok((mut s, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let (heard, stop) = (heard.clone(), stop.clone());
            talks.push(std::thread::spawn(move || {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                // Whatever the peer says first.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    got.extend_from_slice(&buf[..n]);
                }
                heard.lock().unwrap().extend_from_slice(&got);
                act(&mut s, &got, &stop);
                // And whatever it says after.
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                heard.lock().unwrap().extend_from_slice(&rest);
            }));
        }
        for t in talks {
            let _ = t.join();
        }
    })
}

/// Answer like rank 0, with a proof made without the token.
fn forged_greeting(s: &mut TcpStream, _: &[u8], _: &AtomicBool) {
    let mut g = MAGIC.to_vec();
    g.extend((0..64u8).map(|i| i.wrapping_mul(37)));
    let _ = s.write_all(&g);
}

/// Answer one byte a second, forever.
fn dripping_answer(s: &mut TcpStream, _: &[u8], stop: &AtomicBool) {
    for b in MAGIC.iter().chain(std::iter::repeat(&0u8)) {
        if stop.load(Ordering::SeqCst) || s.write_all(&[*b]).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_fake_rank_zero_learns_nothing_and_the_peer_fails_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let token = secret("squat");
    let heard = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let fake = squatter(listener, heard.clone(), stop.clone(), forged_greeting);
    let t = Instant::now();
    let one = ended(
        rank(1, 2, port, 20, &token),
        Duration::from_secs(30),
        "rank 1",
    );
    stop.store(true, Ordering::SeqCst);
    fake.join().unwrap();
    assert_eq!(one.code, Some(4), "{}", one.stderr);
    assert!(
        one.stderr.contains(&format!(
            "the process at 127.0.0.1:{port} does not know the job token: not this job's rank 0"
        )),
        "{}",
        one.stderr
    );
    assert!(one.at - t < Duration::from_secs(10), "{:?}", one.at - t);
    let heard = heard.lock().unwrap();
    assert!(!heard.is_empty(), "the peer said nothing: no control");
    // The old peer sent its token first thing.
    assert!(
        !heard.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token crossed the wire: {:?}",
        String::from_utf8_lossy(&heard)
    );
    // Nor anything of the job: just the opening, magic and nonce.
    assert_eq!(heard.len(), 5 + 32, "{:?}", String::from_utf8_lossy(&heard));
}

#[test]
fn a_fake_rank_zero_that_drips_does_not_stall_the_peer() {
    let token = secret("drip0");
    let start = |timeout: u64| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let fake = squatter(listener, heard.clone(), stop.clone(), dripping_answer);
        (rank(1, 2, port, timeout, &token), stop, fake, heard)
    };
    // One to its deadline, one to a signal, at the same time.
    let t0 = Instant::now();
    let (by_deadline, stop_a, fake_a, heard_a) = start(6);
    let (by_signal, stop_b, fake_b, _) = start(60);
    std::thread::sleep(Duration::from_millis(2500));
    let t = Instant::now();
    sigterm(&by_signal);
    let s = ended(by_signal, Duration::from_secs(15), "rank 1, signalled");
    let d = ended(
        by_deadline,
        Duration::from_secs(25),
        "rank 1 at its deadline",
    );
    for (stop, fake) in [(stop_a, fake_a), (stop_b, fake_b)] {
        stop.store(true, Ordering::SeqCst);
        fake.join().unwrap();
    }
    assert_eq!(s.code, Some(143), "{}", s.stderr);
    assert!(s.at - t < Duration::from_secs(1), "{:?}", s.at - t);
    assert_eq!(d.code, Some(4), "{}", d.stderr);
    assert!(
        d.stderr
            .contains("completed the handshake before the deadline"),
        "{}",
        d.stderr
    );
    assert!(d.at - t0 < Duration::from_secs(6 + 3), "{:?}", d.at - t0);
    let heard = heard_a.lock().unwrap();
    assert!(
        !heard.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token crossed the wire"
    );
}

/// A relay from `front` to rank 0 at `back` that keeps what went each way.
#[allow(clippy::type_complexity)]
fn recording_relay(front: TcpListener, back: u16) -> std::thread::JoinHandle<(Vec<u8>, Vec<u8>)> {
    std::thread::spawn(move || {
        let (peer, _) = front.accept().unwrap();
        let zero = TcpStream::connect(("127.0.0.1", back)).unwrap();
        let pipe = |mut from: TcpStream, mut to: TcpStream| {
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    kept.extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
                kept
            })
        };
        let up = pipe(peer.try_clone().unwrap(), zero.try_clone().unwrap());
        let down = pipe(zero, peer);
        (up.join().unwrap(), down.join().unwrap())
    })
}

#[test]
fn a_recorded_handshake_replayed_is_refused_both_ways() {
    let token = secret("replay");
    // Job A, through a relay that records it: a real rank 1 and rank 0.
    let port = free_port();
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_port = front.local_addr().unwrap().port();
    let zero = rank(0, 2, port, 20, &token);
    listening(port);
    let relay = recording_relay(front, port);
    let one = rank(1, 2, relay_port, 20, &token);
    let z = ended(zero, Duration::from_secs(30), "job A rank 0");
    let o = ended(one, Duration::from_secs(30), "job A rank 1");
    assert_eq!(
        (z.code, o.code),
        (Some(0), Some(0)),
        "{}{}",
        z.stderr,
        o.stderr
    );
    let (up, down) = relay.join().unwrap();
    assert!(!up.is_empty() && !down.is_empty());

    // The peer's side, replayed to a new rank 0 of the same job and token.
    let port = free_port();
    let zero = rank(0, 2, port, 20, &token);
    listening(port);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&up).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    let closed = s.read_to_end(&mut answer).is_ok();
    assert!(closed, "rank 0 kept the replayed connection open");
    // Rank 0 greeted (a fresh nonce) and hung up: no answer, and it still
    // waits for its rank 1.
    assert_eq!(answer.len(), GREETING, "{answer:?}");
    let mut zero = zero;
    assert!(
        zero.try_wait().unwrap().is_none(),
        "rank 0 ended on a replayed hello"
    );
    // The real rank 1 then joins, and it is the one rank 0 lists.
    let one = rank(1, 2, port, 20, &token);
    let one_pid = one.id() as u64;
    let z = ended(zero, Duration::from_secs(30), "job B rank 0");
    let o = ended(one, Duration::from_secs(30), "job B rank 1");
    assert_eq!(
        (z.code, o.code),
        (Some(0), Some(0)),
        "{}{}",
        z.stderr,
        o.stderr
    );
    assert_eq!(member_pids(&z.stdout)[1], (1, one_pid));

    // Rank 0's side, replayed by a squatter to a new rank 1.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let one = rank(1, 2, port, 20, &token);
    let (mut s, _) = listener.accept().unwrap();
    let mut opening = [0u8; 5 + 32];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_exact(&mut opening);
    let _ = s.write_all(&down);
    let o = ended(one, Duration::from_secs(30), "rank 1 fed a replay");
    assert_eq!(o.code, Some(4), "{}", o.stderr);
    assert!(
        o.stderr.contains("does not know the job token"),
        "{}",
        o.stderr
    );
}

fn proof(token: &str, role: u8, peer: &[u8], rank0: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token.as_bytes()).unwrap();
    for part in [DOMAIN, &[role], peer, rank0, msg] {
        m.update(part);
    }
    m.finalize().into_bytes().to_vec()
}

/// A client holding the job token that joins rank 0 at `port` as
/// `rank`, describing itself as `member`: the status and body rank 0
/// answers, after checking both of rank 0's proofs.
fn token_holder(port: u16, token: &str, rank: u32, member: serde_json::Value) -> (u8, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let nonce: Vec<u8> = (0..32u8).map(|i| i ^ 0x5a ^ rank as u8).collect();
    s.write_all(&[MAGIC, &nonce].concat()).unwrap();
    let mut g = [0u8; GREETING];
    s.read_exact(&mut g).expect("rank 0 greets");
    assert_eq!(&g[..5], MAGIC);
    let n0 = &g[5..37];
    assert_eq!(
        proof(token, b'0', &nonce, n0, &[]),
        &g[37..],
        "rank 0's proof"
    );
    // What `foldprint world` plans: every rank of this version alike.
    let version = env!("CARGO_PKG_VERSION");
    let digest = Sha256::digest(format!("foldprint world {version}\n"));
    let summary = format!("foldprint {version} world check");
    let json = member.to_string();
    let mut hello = rank.to_le_bytes().to_vec();
    hello.extend_from_slice(&digest);
    for part in [summary.as_bytes(), json.as_bytes()] {
        hello.extend_from_slice(&(part.len() as u32).to_le_bytes());
        hello.extend_from_slice(part);
    }
    let p = proof(token, b'P', &nonce, n0, &hello);
    s.write_all(&[hello, p].concat()).unwrap();
    let mut head = [0u8; 5];
    s.read_exact(&mut head).expect("rank 0 answers");
    let mut body = vec![0u8; u32::from_le_bytes(head[1..].try_into().unwrap()) as usize];
    s.read_exact(&mut body).unwrap();
    let mut a = [0u8; 32];
    s.read_exact(&mut a).unwrap();
    let msg = [head.as_slice(), &body].concat();
    assert_eq!(
        proof(token, b'A', &nonce, n0, &msg),
        a,
        "rank 0's answer proof"
    );
    (head[0], String::from_utf8_lossy(&body).into_owned())
}

fn described(rank: u64, host: &str) -> serde_json::Value {
    serde_json::json!({
        "rank": rank, "local_rank": rank, "host": host, "pid": 1,
        "device": null, "nccl_hostid": null, "problem": null, "inputs": [],
    })
}

#[test]
fn a_token_holder_cannot_join_as_another_rank_than_its_own() {
    let token = secret("spoof");
    let port = free_port();
    let zero = rank(0, 2, port, 20, &token);
    let zero_pid = zero.id() as u64;
    listening(port);
    // Joins as rank 1 but describes itself as rank 0 (the old rank 0
    // listed two "rank 0" rows), or as rank 2.
    for claimed in [0, 2] {
        let (status, body) = token_holder(port, &token, 1, described(claimed, "spoof"));
        assert_ne!(status, 0, "taken in: {body}");
        assert!(
            body.contains(&format!(
                "joined as rank 1 describes itself as rank {claimed}"
            )),
            "{body}"
        );
    }
    // The real rank 1 still joins, and only it is listed.
    let one = rank(1, 2, port, 20, &token);
    let one_pid = one.id() as u64;
    let z = ended(zero, Duration::from_secs(30), "rank 0");
    let o = ended(one, Duration::from_secs(30), "rank 1");
    assert_eq!(
        (z.code, o.code),
        (Some(0), Some(0)),
        "{}{}",
        z.stderr,
        o.stderr
    );
    assert_eq!(member_pids(&z.stdout), [(0, zero_pid), (1, one_pid)]);
    assert!(!z.stdout.contains("spoof"), "{}", z.stdout);

    // Negative control: the same client describing itself honestly is
    // taken in as rank 1 (so the refusal above is the spoof's).
    let port = free_port();
    let zero = rank(0, 2, port, 20, &token);
    listening(port);
    let (status, body) = token_holder(port, &token, 1, described(1, "honest-client"));
    assert_eq!((status, body.as_str()), (0, ""));
    let z = ended(zero, Duration::from_secs(30), "rank 0");
    assert_eq!(z.code, Some(0), "{}", z.stderr);
    assert!(z.stdout.contains("honest-client"), "{}", z.stdout);
}
