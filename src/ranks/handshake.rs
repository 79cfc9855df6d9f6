//! The wire of the TCP rendezvous: how each side proves it knows the job
//! token without sending it, and reads and writes that end by one deadline
//! and within a byte cap whatever the other side does.
//!
//! A connection (all integers little-endian, a frame is a u32 length and
//! that many bytes):
//!
//! 1. peer to rank 0: `FPRV3`, a fresh 32-byte nonce `Np`.
//! 2. rank 0 to peer: `FPRV3`, a fresh 32-byte nonce `N0`, proof `'0'`
//!    (over the nonces alone).
//! 3. the peer checks that proof before it says anything about the job,
//!    then sends its hello: rank (u32), plan digest (32 bytes), plan
//!    summary (frame), itself as JSON (frame), and proof `'P'` over those
//!    bytes.
//! 4. rank 0, once every rank has joined: status (u8), body (frame), and
//!    proof `'A'` over those bytes.
//!
//! Proof `R` over `msg` is HMAC-SHA256 keyed by the job token over
//! [`DOMAIN`], the byte `R`, `Np`, `N0` and `msg`. Both nonces are fresh on
//! every connection, so a recorded proof proves nothing on another one,
//! and the role byte keeps one side's proof from serving as the other's.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub(crate) const MAGIC: &[u8; 5] = b"FPRV3";
pub(crate) const NONCE: usize = 32;
pub(crate) const PROOF: usize = 32;
/// Rank 0's first words: magic, nonce, proof.
pub(crate) const GREETING: usize = MAGIC.len() + NONCE + PROOF;
/// What every proof starts with: the protocol and its version.
const DOMAIN: &[u8] = b"foldprint rendezvous 3\0";

/// How often a blocked read or write looks at the clock and at signals.
const SLICE: Duration = Duration::from_millis(100);

/// Whose proof, over what.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub(crate) enum Role {
    /// Rank 0's greeting: it knows the token.
    Rank0 = b'0',
    /// A peer's hello: it knows the token, and this is what it says.
    Peer = b'P',
    /// Rank 0's answer to that peer.
    Answer = b'A',
}

/// The two fresh nonces of one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nonces {
    pub peer: [u8; NONCE],
    pub rank0: [u8; NONCE],
}

/// A nonce from the operating system's random source.
pub(crate) fn fresh_nonce() -> Result<[u8; NONCE], String> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| format!("no random nonce from the system: {e}"))?;
    Ok(n)
}

fn mac(token: &[u8], role: Role, n: &Nonces, msg: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length: this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token)
        .unwrap_or_else(|_| unreachable!("HMAC keys may have any length"));
    m.update(DOMAIN);
    m.update(&[role as u8]);
    m.update(&n.peer);
    m.update(&n.rank0);
    m.update(msg);
    m
}

/// `role`'s proof over `msg` on the connection of `n`.
pub(crate) fn prove(token: &[u8], role: Role, n: &Nonces, msg: &[u8]) -> [u8; PROOF] {
    mac(token, role, n, msg).finalize().into_bytes().into()
}

/// Whether `proof` is `role`'s proof over `msg` (in constant time).
pub(crate) fn verify(token: &[u8], role: Role, n: &Nonces, msg: &[u8], proof: &[u8]) -> bool {
    mac(token, role, n, msg).verify_slice(proof).is_ok()
}

/// `bytes` as a frame, appended to `out`.
pub(crate) fn put_frame(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Why a read or write on the wire ended.
#[derive(Debug)]
pub(crate) enum Fault {
    /// Its deadline passed.
    Deadline,
    /// The other side closed the connection (or reset it).
    Closed,
    /// The other side would send more than the cap allows.
    TooLarge,
    /// A signal asked this process to stop.
    Stopped(i32),
    Io(std::io::Error),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Deadline => write!(f, "it did not finish in time"),
            Fault::Closed => write!(f, "the connection closed"),
            Fault::TooLarge => write!(f, "it sent more than the rendezvous allows"),
            Fault::Stopped(sig) => write!(f, "stopped by {}", crate::interrupt::signal_name(*sig)),
            Fault::Io(e) => write!(f, "{e}"),
        }
    }
}

/// One phase of a connection: every read and write ends by `deadline`, and
/// the reads together take at most `budget` bytes. The timeout of a single
/// read would restart with every byte a slow sender drips; this deadline
/// does not.
pub(crate) struct Wire<'a> {
    s: &'a TcpStream,
    deadline: Instant,
    budget: usize,
    /// Whether a pending signal ends the phase (the waiting thread of a
    /// rank; rank 0's handshake threads leave signals to the main thread).
    signals: bool,
}

impl<'a> Wire<'a> {
    pub fn new(s: &'a TcpStream, deadline: Instant, budget: usize, signals: bool) -> Wire<'a> {
        Wire {
            s,
            deadline,
            budget,
            signals,
        }
    }

    /// The next phase: a new deadline and byte cap.
    pub fn phase(&mut self, deadline: Instant, budget: usize) {
        self.deadline = deadline;
        self.budget = budget;
    }

    /// Time left, after a look at signals.
    fn slice(&self) -> Result<Duration, Fault> {
        if self.signals {
            if let Some(sig) = crate::interrupt::pending() {
                return Err(Fault::Stopped(sig));
            }
        }
        let rest = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(Fault::Deadline)?;
        Ok(rest.min(SLICE))
    }

    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Fault> {
        if buf.len() > self.budget {
            return Err(Fault::TooLarge);
        }
        self.budget -= buf.len();
        self.s.set_nonblocking(false).map_err(Fault::Io)?;
        let mut got = 0;
        while got < buf.len() {
            let slice = self.slice()?;
            self.s.set_read_timeout(Some(slice)).map_err(Fault::Io)?;
            let mut s = self.s;
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err(Fault::Closed),
                Ok(n) => got += n,
                Err(e) => transient(e)?,
            }
        }
        Ok(())
    }

    pub fn read_array<const N: usize>(&mut self) -> Result<[u8; N], Fault> {
        let mut a = [0u8; N];
        self.read_exact(&mut a)?;
        Ok(a)
    }

    /// A frame of at most `max` bytes; its length and bytes are also
    /// appended to `raw` (what a proof covers).
    pub fn read_frame(&mut self, max: usize, raw: &mut Vec<u8>) -> Result<Vec<u8>, Fault> {
        let len = self.read_array::<4>()?;
        let n = u32::from_le_bytes(len) as usize;
        if n > max {
            return Err(Fault::TooLarge);
        }
        let mut body = vec![0u8; n];
        self.read_exact(&mut body)?;
        raw.extend_from_slice(&len);
        raw.extend_from_slice(&body);
        Ok(body)
    }

    pub fn write_all(&mut self, mut bytes: &[u8]) -> Result<(), Fault> {
        self.s.set_nonblocking(false).map_err(Fault::Io)?;
        while !bytes.is_empty() {
            let slice = self.slice()?;
            self.s.set_write_timeout(Some(slice)).map_err(Fault::Io)?;
            let mut s = self.s;
            match s.write(bytes) {
                Ok(0) => return Err(Fault::Closed),
                Ok(n) => bytes = &bytes[n..],
                Err(e) => transient(e)?,
            }
        }
        Ok(())
    }
}

/// `Ok` for an error that only means "not yet"; else the fault it is.
fn transient(e: std::io::Error) -> Result<(), Fault> {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted => Ok(()),
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => Err(Fault::Closed),
        _ => Err(Fault::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn nonces(a: u8, b: u8) -> Nonces {
        Nonces {
            peer: [a; NONCE],
            rank0: [b; NONCE],
        }
    }

    #[test]
    fn a_proof_holds_for_its_token_role_nonces_and_message_only() {
        let n = nonces(1, 2);
        let p = prove(b"tok", Role::Peer, &n, b"hello");
        assert!(verify(b"tok", Role::Peer, &n, b"hello", &p));
        // Negative controls: change any one input and it fails.
        assert!(!verify(b"tok2", Role::Peer, &n, b"hello", &p));
        assert!(!verify(b"tok", Role::Rank0, &n, b"hello", &p));
        assert!(!verify(b"tok", Role::Answer, &n, b"hello", &p));
        assert!(!verify(b"tok", Role::Peer, &nonces(1, 3), b"hello", &p));
        assert!(!verify(b"tok", Role::Peer, &nonces(0, 2), b"hello", &p));
        assert!(!verify(b"tok", Role::Peer, &n, b"hellp", &p));
        let mut flipped = p;
        flipped[31] ^= 1;
        assert!(!verify(b"tok", Role::Peer, &n, b"hello", &flipped));
        assert!(!verify(b"tok", Role::Peer, &n, b"hello", &p[..31]));
        // Fresh nonces differ.
        assert_ne!(fresh_nonce().unwrap(), fresh_nonce().unwrap());
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    #[test]
    fn a_dripping_sender_meets_one_deadline_not_one_per_byte() {
        let (mut client, server) = pair();
        let drip = std::thread::spawn(move || {
            for _ in 0..30 {
                if client.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t = Instant::now();
        let mut w = Wire::new(&server, t + Duration::from_millis(400), 1 << 10, false);
        let mut buf = [0u8; 100];
        assert!(matches!(w.read_exact(&mut buf), Err(Fault::Deadline)));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        drop(server);
        drip.join().unwrap();
    }

    #[test]
    fn frames_past_the_cap_are_refused_before_they_are_read() {
        let far = Instant::now() + Duration::from_secs(10);
        let mut msg = Vec::new();
        put_frame(&mut msg, &[7u8; 100]);
        let (mut client, server) = pair();
        client.write_all(&msg).unwrap();
        client.write_all(&msg).unwrap();
        let mut w = Wire::new(&server, far, 1 << 10, false);
        let mut raw = Vec::new();
        assert_eq!(w.read_frame(100, &mut raw).unwrap(), vec![7u8; 100]);
        assert_eq!(raw, msg);
        assert!(matches!(w.read_frame(99, &mut raw), Err(Fault::TooLarge)));
        // The cap of the whole phase, too.
        let (mut client, server) = pair();
        client.write_all(&msg).unwrap();
        let mut w = Wire::new(&server, far, 50, false);
        assert!(matches!(w.read_frame(1000, &mut raw), Err(Fault::TooLarge)));
        // A sender that stops short and closes.
        let (mut client, server) = pair();
        client.write_all(&msg[..10]).unwrap();
        drop(client);
        let mut w = Wire::new(&server, far, 1 << 20, false);
        let mut rest = [0u8; 200];
        assert!(matches!(w.read_exact(&mut rest), Err(Fault::Closed)));
    }
}
