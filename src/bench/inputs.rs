//! What reading addends from rank files costs: one case of W rank files
//! (float32 npy, or bf16/f16 safetensors, written here from the
//! generator's values and read once so they sit in the page cache) next to
//! the same case from the generator, on one backend. Both must give the
//! same digests.

use super::{median, BenchError};
use crate::addends::{AddendFiles, Scope};
use crate::backend::{Backend, RunOptions};
use crate::data::{Distribution, Lane};
use crate::experiment::Case;
use std::time::Instant;

/// The two cases side by side.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InputsBench {
    pub backend: &'static str,
    pub world: usize,
    pub n: usize,
    pub dtype: crate::dtype::Dtype,
    /// Bytes of addends in all (W x n x the dtype's width).
    pub bytes: u64,
    pub rounds: u32,
    /// The one pass over the W rank files alone (nothing else running),
    /// from the opening: until every byte is in, and until every digest
    /// is known (medians).
    pub files_read_ms: f64,
    pub files_hash_ms: f64,
    /// The order-sensitivity measure (once per case): from the files'
    /// kept bytes, and from the generator.
    pub files_sensitivity_ms: f64,
    pub generator_sensitivity_ms: f64,
    /// Medians over the rounds after the first: the whole round, and its
    /// first step (the files' upload; the generator's values made).
    pub files_round_ms: f64,
    pub files_upload_ms: f64,
    pub generator_round_ms: f64,
    pub generator_generate_ms: f64,
    /// What one case costs, end to end (median of [`CASE_REPS`]): for the
    /// files from their opening through one round and the sensitivity to
    /// every digest known (the hashing runs behind the round); for the
    /// generator one round and the sensitivity. The sensitivity is
    /// measured beside the round, as a run does. And their ratio.
    pub files_case_ms: f64,
    /// Of `files_case_ms`, until the round and the sensitivity ended (the
    /// rest is waiting for the last digest).
    pub files_case_round_ms: f64,
    /// The round inside that case (medians): its upload (on CUDA, waiting
    /// for the bytes as the pass reads them, through each file's end
    /// check), its digests, and the whole round.
    pub files_cold_upload_ms: f64,
    pub files_cold_digest_ms: f64,
    pub files_cold_round_ms: f64,
    pub generator_case_ms: f64,
    pub ratio: f64,
    /// Both gave the same arena digest (the files hold the generator's
    /// values).
    pub same_digests: bool,
    /// And the same order-sensitivity measure.
    pub same_sensitivity: bool,
}

/// Repetitions of each end-to-end case and of the pass alone.
pub const CASE_REPS: usize = 5;

/// The experiment files of the two cases, for whole `foldprint run`s
/// (the binary times them: a run is a fresh process).
pub const FILES_EXPERIMENT: &str = "files.toml";
pub const GENERATOR_EXPERIMENT: &str = "generator.toml";

/// Time both cases on `backend`; the rank files go to `dir`, with
/// [`FILES_EXPERIMENT`] and [`GENERATOR_EXPERIMENT`] declaring the two cases.
pub fn compare(
    backend: &mut dyn Backend,
    world: usize,
    n: usize,
    dtype: crate::dtype::Dtype,
    rounds: u32,
    dir: &std::path::Path,
) -> Result<InputsBench, BenchError> {
    let (seed, distribution) = (1, Distribution::MixedMagnitude);
    let template = if dtype.is_f32() {
        "rank{rank}.npy"
    } else {
        "rank{rank}.safetensors"
    };
    let experiment =
        |name: &str, inputs: &str| format!("name = \"{name}\"\n[[case]]\nid = \"c\"\n{inputs}\n");
    std::fs::write(
        dir.join(FILES_EXPERIMENT),
        experiment(
            "bench-files",
            &format!("addends = \"{template}\"\nworld = {world}"),
        ),
    )
    .map_err(BenchError::Io)?;
    std::fs::write(
        dir.join(GENERATOR_EXPERIMENT),
        experiment(
            "bench-generator",
            &format!(
                "world = {world}\narenas = [{n}]\nseed = {seed}\ndistribution = \"{distribution}\"\ndtype = \"{dtype}\""
            ),
        ),
    )
    .map_err(BenchError::Io)?;
    for r in 0..world {
        let lane = Lane::new(distribution, seed, r as u32, 0);
        let path = dir.join(template.replace("{rank}", &r.to_string()));
        if dtype.is_f32() {
            write_npy(&path, &lane, n)
        } else {
            write_safetensors(&path, &lane, n, dtype)
        }
        .map_err(BenchError::Io)?;
    }
    let generated = Case::builder(world, [n])
        .experiment("bench")
        .id("generator")
        .seed(seed)
        .distribution(distribution)
        .dtype(Some(dtype))
        .rounds(rounds)
        .build()?;
    // A first pass reads the files into the page cache; the timed ones
    // find them there.
    let open = || {
        AddendFiles::open(
            template,
            dir,
            None,
            Some(generated.world_size()),
            Scope::AllRanks,
        )
    };
    open()?.hashed()?;
    let (mut read, mut hash) = (Vec::new(), Vec::new());
    for _ in 0..CASE_REPS {
        let t = Instant::now();
        let files = open()?.reading()?;
        for r in 0..files.world() {
            files.is_held(r);
        }
        read.push(t.elapsed().as_secs_f64() * 1e3);
        files.identity();
        hash.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let with_files = |files| {
        generated
            .to_builder()
            .id("files")
            .files(std::sync::Arc::new(files))
            .build()
    };
    let from_files = with_files(open()?.hashed()?)?;
    let opts = RunOptions::default();
    // Warm-up: buffers allocated, kernels loaded.
    backend.run_case(&generated.clone().single_round(), &opts)?;
    let g = backend.run_case(&generated, &opts)?;
    let f = backend.run_case(&from_files, &opts)?;
    let steady = |r: &crate::backend::CaseRun, pick: fn(&crate::backend::RoundTimings) -> f64| {
        median(
            r.rounds[1.min(r.rounds.len() - 1)..]
                .iter()
                .map(pick)
                .collect(),
        )
    };
    let files_round_ms = steady(&f, |t| t.total_ms);
    let generator_round_ms = steady(&g, |t| t.total_ms);
    let timed = |c: &Case| -> Result<(f64, crate::sensitivity::Sensitivity), BenchError> {
        let t = Instant::now();
        let s = crate::sensitivity::measure(c).map_err(BenchError::Addends)?;
        Ok((t.elapsed().as_secs_f64() * 1e3, s))
    };
    let (files_sensitivity_ms, fs) = timed(&from_files)?;
    let (generator_sensitivity_ms, gs) = timed(&generated)?;
    // End to end, one case at a time, each from its start: the files'
    // opening, pass, round, sensitivity and digests; the generator's
    // round and sensitivity. The sensitivity runs beside the round, as
    // in a run.
    let measured = |backend: &mut dyn Backend, case: &Case, opts: &RunOptions| {
        let (run, s) = crate::backend::run_case_measured(backend, case, opts)?;
        s.map_err(BenchError::Addends)?;
        Ok::<_, BenchError>(run.rounds.first().cloned().unwrap_or_default())
    };
    let (mut files_case, mut generator_case) = (Vec::new(), Vec::new());
    let (mut files_case_round, mut cold) = (Vec::new(), Vec::new());
    for _ in 0..CASE_REPS {
        let t = Instant::now();
        let case = with_files(open()?.reading()?)?.single_round();
        cold.push(measured(backend, &case, &opts)?);
        files_case_round.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(files) = case.files() {
            // Every digest known (a failed pass is refused here).
            files.hashed()?;
        }
        files_case.push(t.elapsed().as_secs_f64() * 1e3);
        drop(case);
        let t = Instant::now();
        let case = generated.clone().single_round();
        measured(backend, &case, &opts)?;
        generator_case.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let files_case_ms = median(files_case);
    let generator_case_ms = median(generator_case);
    let backend_name = backend.name();

    Ok(InputsBench {
        backend: backend_name,
        world,
        n,
        dtype,
        bytes: generated.world() as u64 * n as u64 * dtype.bytes() as u64,
        rounds,
        files_read_ms: median(read),
        files_hash_ms: median(hash),
        files_sensitivity_ms,
        generator_sensitivity_ms,
        files_round_ms,
        files_upload_ms: steady(&f, |t| t.generate_ms),
        generator_round_ms,
        generator_generate_ms: steady(&g, |t| t.generate_ms),
        files_case_ms,
        files_case_round_ms: median(files_case_round),
        files_cold_upload_ms: median(cold.iter().map(|t| t.generate_ms).collect()),
        files_cold_digest_ms: median(cold.iter().map(|t| t.digest_ms).collect()),
        files_cold_round_ms: median(cold.iter().map(|t| t.total_ms).collect()),
        generator_case_ms,
        ratio: files_case_ms / generator_case_ms,
        same_digests: f.arenas[0].digest() == g.arenas[0].digest(),
        same_sensitivity: fs == gs,
    })
}

/// A float32 npy file of a lane's first `n` values.
fn write_npy(path: &std::path::Path, lane: &Lane, n: usize) -> std::io::Result<()> {
    use rayon::prelude::*;
    use std::io::Write;
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut values = vec![0f32; n];
    values
        .par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(k, c)| lane.fill((k << 16) as u64, c));
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(dict.len() as u16).to_le_bytes())?;
    f.write_all(dict.as_bytes())?;
    f.write_all(&bytes)?;
    f.flush()
}

/// A safetensors file of one 16-bit tensor `array`: a lane's first `n`
/// values rounded once to `dtype`, as the generator makes them in a case
/// of that dtype.
fn write_safetensors(
    path: &std::path::Path,
    lane: &Lane,
    n: usize,
    dtype: crate::dtype::Dtype,
) -> std::io::Result<()> {
    use rayon::prelude::*;
    use std::io::Write;
    let name = match dtype {
        crate::dtype::Dtype::Bf16 => "BF16",
        crate::dtype::Dtype::F16 => "F16",
        crate::dtype::Dtype::F32 => "F32",
    };
    let width = dtype.bytes();
    let mut header = format!(
        "{{\"array\":{{\"dtype\":\"{name}\",\"shape\":[{n}],\"data_offsets\":[0,{}]}}}}",
        n * width
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = vec![0u8; n * width];
    bytes
        .par_chunks_mut(width << 16)
        .enumerate()
        .for_each(|(k, out)| {
            let mut v = vec![0f32; out.len() / width];
            lane.fill((k << 16) as u64, &mut v);
            for (o, x) in out.chunks_exact_mut(width).zip(&v) {
                // The 16-bit pattern of the value rounded once.
                o.copy_from_slice(&(dtype.narrow(*x) as u16).to_le_bytes());
            }
        });
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(&(header.len() as u64).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    f.write_all(&bytes)?;
    f.flush()
}
