//! The NCCL bench: fixed-order reduction next to ncclAllReduce over a
//! sweep of sizes, as nccl-tests' `all_reduce_perf` sweeps them (`-b`,
//! `-e`, `-f`, `-d`), through [`NcclBackend::bench`].

use crate::backend::nccl::{NcclBackend, NcclConfig};
use crate::backend::BackendError;
use crate::dtype::Dtype;
use crate::ranks::world::{self, World};
use std::time::Duration;

pub use crate::backend::nccl::bench::{NcclBenchRow, NcclScatterRow};
use crate::fold::Collective;

/// Timed repetitions per size by default; each row is their median.
pub const ITERS: usize = 20;

/// The sizes of a sweep: `min_bytes`, then times `factor` while at most
/// `max_bytes`, each a whole number of `dtype` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub dtype: Dtype,
    pub iters: usize,
    /// The all-reduce (fixed-order next to ncclAllReduce), or the
    /// reduce-scatter (next to ncclReduceScatter and the fixed-order
    /// all-reduce of the same size).
    pub collective: Collective,
}

/// Largest buffer a sweep may ask for per rank: 2^31 elements is the
/// longest arena a case holds, and 8 GiB is beyond any useful sweep.
const MAX_BYTES: u64 = 8 << 30;

impl Sweep {
    /// Checked: every size a positive whole number of elements, the
    /// smallest at most the largest, a factor of 2 or more.
    pub fn new(
        min_bytes: u64,
        max_bytes: u64,
        factor: u64,
        dtype: Dtype,
        iters: usize,
    ) -> Result<Sweep, String> {
        let width = dtype.bytes() as u64;
        for (flag, b) in [("-b/--minbytes", min_bytes), ("-e/--maxbytes", max_bytes)] {
            if b == 0 || !b.is_multiple_of(width) {
                return Err(format!(
                    "{flag} {b}: a size is a positive whole number of {dtype} elements \
                     ({width} bytes each)"
                ));
            }
            if b > MAX_BYTES {
                return Err(format!(
                    "{flag} {b}: at most {} per rank",
                    show_bytes(MAX_BYTES)
                ));
            }
        }
        if min_bytes > max_bytes {
            return Err(format!(
                "-b/--minbytes {} is larger than -e/--maxbytes {}: the sweep goes from -b up to -e",
                show_bytes(min_bytes),
                show_bytes(max_bytes)
            ));
        }
        if factor < 2 {
            return Err(format!(
                "-f/--stepfactor {factor}: the sweep multiplies the size by it, so it must be 2 or more"
            ));
        }
        if iters == 0 {
            return Err("-n/--iters 0: at least one timed repetition per size".into());
        }
        Ok(Sweep {
            min_bytes,
            max_bytes,
            factor,
            dtype,
            iters,
            collective: Collective::AllReduce,
        })
    }

    /// The same sweep of another collective.
    pub fn with_collective(self, collective: Collective) -> Sweep {
        Sweep { collective, ..self }
    }

    /// Element counts, smallest first. A size past `min_bytes` that is not
    /// a whole number of elements cannot happen: each is `min_bytes` times
    /// a power of the factor.
    pub fn counts(&self) -> Vec<usize> {
        let width = self.dtype.bytes() as u64;
        let mut out = Vec::new();
        let mut b = self.min_bytes;
        while b <= self.max_bytes {
            out.push((b / width) as usize);
            match b.checked_mul(self.factor) {
                Some(next) => b = next,
                None => break,
            }
        }
        out
    }
}

/// A byte count as `-b`/`-e` take it: a number with an optional suffix K,
/// M or G (powers of 1024, as nccl-tests reads them; a trailing `B` or
/// `iB` is allowed).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match body.char_indices().last() {
        Some((i, 'K')) => (&body[..i], 10),
        Some((i, 'M')) => (&body[..i], 20),
        Some((i, 'G')) => (&body[..i], 30),
        _ => (body, 0),
    };
    let bad = || {
        format!("`{s}` is not a size in bytes: write a whole number with an optional K, M or G (1024^k), e.g. 1K, 256M, 1G")
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let v: u64 = digits.parse().map_err(|_| bad())?;
    v.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// `1073741824` as `1G`, `1536` as `1536`: the shortest exact form.
pub fn show_bytes(b: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

/// One process's share of the NCCL bench.
pub struct NcclBench {
    pub world: usize,
    /// Only the reporting rank prints; the others stay silent.
    pub reporting: bool,
    /// Set when hosts are emulated on one machine: then the rows are not a
    /// bandwidth result.
    pub emulated_hosts: Option<serde_json::Value>,
    pub rows: Vec<NcclBenchRow>,
    /// A reduce-scatter sweep's rows (`rows` is then empty).
    pub scatter_rows: Vec<NcclScatterRow>,
    /// Held until the caller drops this, after printing, so the
    /// communicators' destroy (which may wait on peers) comes after the
    /// table, as it always has.
    _backend: NcclBackend,
}

impl NcclBench {
    /// Why these rows are not a bandwidth result, if they are not: hosts
    /// emulated on one machine (every byte over loopback sockets), or a
    /// world of one rank (nothing moves).
    pub fn not_bandwidth(&self) -> Option<String> {
        if let Some(e) = &self.emulated_hosts {
            return Some(format!(
                "emulated hosts ({}): NCCL moved every byte over its socket transport on loopback",
                e["layout"].as_str().unwrap_or("?")
            ));
        }
        if self.world == 1 {
            return Some("a world of one rank: neither reduction moves any data".into());
        }
        None
    }
}

/// Run the sweep on `gpus` GPUs (under a launcher, the launcher decides).
pub fn run(gpus: usize, sweep: &Sweep) -> Result<NcclBench, BackendError> {
    let mut world = World::new(
        world::discover(gpus)?,
        crate::ranks::rendezvous::Plan::new(
            &[format!(
                "bench {}..{} x{} {} n{}{}",
                sweep.min_bytes,
                sweep.max_bytes,
                sweep.factor,
                sweep.dtype,
                sweep.iters,
                if sweep.collective.is_all_reduce() {
                    String::new()
                } else {
                    format!(" {}", sweep.collective)
                }
            )],
            "nccl bench",
        ),
        Duration::from_secs(world::DEFAULT_INIT_TIMEOUT_S),
    )
    // A bandwidth benchmark on emulated hosts would measure loopback.
    .with_emulated_hosts(false);
    let mut be = NcclBackend::new(
        NcclConfig {
            cuda: Default::default(),
            timeout: Duration::from_secs(crate::backend::DEFAULT_TIMEOUT_S),
        },
        &mut world,
    )?;
    let (rows, scatter_rows) = if sweep.collective.is_all_reduce() {
        (
            be.bench(&sweep.counts(), sweep.iters, sweep.dtype)?,
            Vec::new(),
        )
    } else {
        let rows = be.bench_scatter(&sweep.counts(), sweep.iters, sweep.dtype)?;
        (Vec::new(), rows)
    };
    let reporting = world.reports();
    Ok(NcclBench {
        world: world.size(),
        reporting,
        emulated_hosts: if reporting {
            crate::backend::nccl::facts::emulated_hosts()
        } else {
            None
        },
        rows,
        scatter_rows,
        _backend: be,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_nccl_tests_reads_them() {
        for (s, want) in [
            ("1K", 1024),
            ("1k", 1024),
            ("256M", 256 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("4096", 4096),
            ("8B", 8),
        ] {
            assert_eq!(parse_bytes(s), Ok(want), "{s}");
        }
        for s in [
            "",
            "K",
            "1.5M",
            "-1K",
            "1T",
            "1 K",
            "0x10",
            "99999999999999999999G",
        ] {
            assert!(parse_bytes(s).is_err(), "{s}");
        }
        assert_eq!(show_bytes(1 << 30), "1G");
        assert_eq!(show_bytes(3 << 10), "3K");
        assert_eq!(show_bytes(1536), "1536");
    }

    #[test]
    fn a_sweep_doubles_from_b_to_e_in_whole_elements() {
        let s = Sweep::new(1 << 10, 1 << 20, 2, Dtype::Bf16, 5).unwrap();
        let counts = s.counts();
        assert_eq!(counts.len(), 11);
        assert_eq!(counts[0], 512);
        assert_eq!(*counts.last().unwrap(), 1 << 19);
        let s = Sweep::new(4, 100, 3, Dtype::F32, 1).unwrap();
        assert_eq!(s.counts(), [1, 3, 9]);
        assert_eq!(Sweep::new(8, 8, 2, Dtype::F32, 1).unwrap().counts(), [2]);
    }

    #[test]
    fn a_sweep_refuses_what_it_cannot_run() {
        let bad = |b, e, f, d, n| Sweep::new(b, e, f, d, n).unwrap_err();
        assert!(bad(2 << 10, 1 << 10, 2, Dtype::F32, 1).contains("larger than -e"));
        assert!(bad(1 << 10, 1 << 20, 1, Dtype::F32, 1).contains("-f/--stepfactor 1"));
        assert!(bad(6, 1 << 20, 2, Dtype::F32, 1).contains("whole number of f32"));
        assert!(bad(0, 1 << 20, 2, Dtype::F16, 1).contains("-b/--minbytes 0"));
        assert!(bad(2, 1 << 40, 2, Dtype::Bf16, 1).contains("at most 8G"));
        assert!(bad(2, 4, 2, Dtype::Bf16, 0).contains("-n/--iters 0"));
        // A 16-bit size need only be even.
        assert!(Sweep::new(2, 6, 3, Dtype::Bf16, 1).is_ok());
    }
}
