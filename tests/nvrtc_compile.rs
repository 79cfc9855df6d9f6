//! Every kernel foldprint compiles at run time, compiled here with a real
//! NVRTC and no GPU (NVRTC is host-only), for every target foldprint picks
//! or accepts for the GPU generations it runs on.
//!
//! Every test is `#[ignore]`d, so the plain `cargo test` (which has no
//! NVRTC) lists them as ignored instead of passing them. `.ci/run` runs them
//! explicitly, with the library from the `nvidia-cuda-nvrtc-cu12` wheel:
//!
//! ```text
//! FOLDPRINT_NVRTC_LIBRARY=DIR/libnvrtc.so.12 LD_LIBRARY_PATH=DIR \
//!     cargo test --release --locked --test nvrtc_compile -- --ignored
//! ```
//!
//! Asked to run without that library, every test fails; it never skips.

use foldprint::gpu::kernels::{
    self, build_image, fold16_trial_entries, fold_entries, nvrtc_compile, option_list,
    BuildRequest, Image, ResolvedTarget, FOLD16_TRIALS_PROGRAM, FOLD16_TRIALS_SRC, FOLD_PROGRAM,
    FOLD_SRC, GENERATOR_ENTRIES, GENERATOR_PROGRAM, GENERATOR_SRC, RANK_CHECK_ENTRIES,
    RANK_CHECK_PROGRAM, RANK_CHECK_SRC,
};
use foldprint::gpu::probe;
use rayon::prelude::*;
use std::path::PathBuf;

/// GPU generations foldprint is run on (T4 .. B200 and consumer Blackwell):
/// `auto` picks CUBIN for the device's own sm_XY, and `--target` accepts
/// `sm_XY` / `compute_XY` for any of them.
const ARCHS: [u32; 7] = [75, 80, 86, 89, 90, 100, 120];

/// Fold option sets (fmad, ftz) a run can ask for: the pinned defaults and
/// the `--ftz` control.
const FOLD_OPTIONS: [(bool, bool); 2] = [(false, false), (false, true)];

/// The library under test, or a loud failure saying how to give it.
fn expected_library() -> PathBuf {
    let Some(p) = std::env::var_os("FOLDPRINT_NVRTC_LIBRARY") else {
        panic!(
            "FOLDPRINT_NVRTC_LIBRARY is not set: this suite compiles every kernel with a real NVRTC \
             and must be given one (e.g. libnvrtc.so.12 from the nvidia-cuda-nvrtc-cu12 wheel, \
             its directory also on LD_LIBRARY_PATH); see .ci/run"
        )
    };
    let p = PathBuf::from(p);
    std::fs::canonicalize(&p)
        .unwrap_or_else(|e| panic!("FOLDPRINT_NVRTC_LIBRARY={}: {e}", p.display()))
}

/// NVRTC is loaded, and it is the given file (not some other NVRTC the
/// loader found first).
fn nvrtc() -> (i32, i32) {
    let want = expected_library();
    let lib = probe::probe().nvrtc_library;
    assert!(
        lib.usable(),
        "NVRTC did not load (tried {:?}; loader said {:?}; missing symbols {:?}); \
         is the directory of {} on LD_LIBRARY_PATH?",
        lib.names_tried,
        lib.error,
        lib.missing_symbols,
        want.display()
    );
    let got = lib
        .path
        .as_deref()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|e| panic!("mapped NVRTC {p}: {e}")));
    assert_eq!(
        got.as_deref(),
        Some(want.as_path()),
        "the loader mapped a different NVRTC than FOLDPRINT_NVRTC_LIBRARY"
    );
    probe::nvrtc_version().expect("nvrtcVersion")
}

fn target(kind: &'static str, arch: u32) -> ResolvedTarget {
    ResolvedTarget { kind, arch }
}

/// Every entry is in the image: `.entry NAME(` in PTX, the symbol name in a
/// CUBIN (an ELF file).
fn assert_entries(img: &Image, entries: &[&str]) {
    let bytes = img.hashed_bytes();
    assert!(img.bytes > 0 && img.sha256.len() == 64, "{}", img.program);
    if img.target.kind == "ptx" {
        let text = std::str::from_utf8(bytes).expect("PTX is text");
        assert!(
            text.contains(&format!(".target sm_{}", img.target.arch)),
            "{} PTX for compute_{} names another target",
            img.program,
            img.target.arch
        );
        for e in entries {
            assert!(
                text.contains(&format!(".entry {e}(")),
                "{e} missing from {} PTX",
                img.program
            );
        }
    } else {
        assert_eq!(&bytes[..4], b"\x7fELF", "{} CUBIN is not ELF", img.program);
        for e in entries {
            let sym = format!("{e}\0");
            assert!(
                bytes.windows(sym.len()).any(|w| w == sym.as_bytes()),
                "{e} missing from {} CUBIN for sm_{}",
                img.program,
                img.target.arch
            );
        }
    }
}

#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn the_given_nvrtc_is_the_one_loaded() {
    let (major, minor) = nvrtc();
    let archs = probe::nvrtc_supported_archs().expect("supported archs");
    println!("NVRTC {major}.{minor}, archs {archs:?}");
    for a in ARCHS {
        assert!(
            archs.contains(&(a as i32)),
            "NVRTC {major}.{minor} does not know sm_{a}"
        );
    }
}

/// The whole matrix: {CUBIN, PTX} x ARCHS x (fold with every option set,
/// generator, rank check and the 16-bit fold trials with the pinned
/// options). Every image holds all its kernels
/// (the fold: every mode x variant).
#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn every_kernel_compiles_for_every_target() {
    nvrtc();
    let fold = fold_entries();
    let mut jobs = Vec::new();
    for kind in ["cubin", "ptx"] {
        for arch in ARCHS {
            for (fmad, ftz) in FOLD_OPTIONS {
                jobs.push((FOLD_PROGRAM, fmad, ftz, target(kind, arch)));
            }
            jobs.push((GENERATOR_PROGRAM, false, false, target(kind, arch)));
            jobs.push((RANK_CHECK_PROGRAM, false, false, target(kind, arch)));
            jobs.push((FOLD16_TRIALS_PROGRAM, false, false, target(kind, arch)));
        }
    }
    let started = std::time::Instant::now();
    let done: Vec<String> = jobs
        .par_iter()
        .map(|&(program, fmad, ftz, t)| {
            let (src, entries): (&str, Vec<&str>) = match program {
                FOLD_PROGRAM => (&FOLD_SRC, fold.clone()),
                GENERATOR_PROGRAM => (&GENERATOR_SRC, GENERATOR_ENTRIES.to_vec()),
                FOLD16_TRIALS_PROGRAM => (&FOLD16_TRIALS_SRC, fold16_trial_entries()),
                _ => (&RANK_CHECK_SRC, RANK_CHECK_ENTRIES.to_vec()),
            };
            let opts = option_list(fmad, ftz, t);
            let img = nvrtc_compile(program, src, &opts, t)
                .unwrap_or_else(|e| panic!("{program} {}: {e}", opts.join(" ")));
            assert_eq!(img.options, opts);
            assert_entries(&img, &entries);
            format!("{program} {}", opts.join(" "))
        })
        .collect();
    assert_eq!(done.len(), ARCHS.len() * 2 * (FOLD_OPTIONS.len() + 3));
    println!(
        "{} images compiled in {:.1} s",
        done.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The pinned fold has explicit round-to-nearest adds and multiplies and no
/// contraction; `--ftz=true` is visible in its PTX; the generator's
/// unknown-distribution branch traps.
#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn pinned_code_says_what_the_contract_needs() {
    nvrtc();
    let t = target("ptx", 90);
    let ptx = |program, src: &str, ftz| {
        let img = nvrtc_compile(program, src, &option_list(false, ftz, t), t).expect("compile");
        String::from_utf8(img.hashed_bytes().to_vec()).expect("PTX is text")
    };
    let fold = ptx(FOLD_PROGRAM, &FOLD_SRC, false);
    assert!(fold.contains("add.rn.f32"), "no round-to-nearest add");
    assert!(fold.contains("mul.rn.f32"), "no round-to-nearest scale");
    assert!(!fold.contains("fma."), "the pinned fold contracts an add");
    assert!(
        !fold.contains(".ftz.f32"),
        "the pinned fold flushes subnormals"
    );
    let ftz = ptx(FOLD_PROGRAM, &FOLD_SRC, true);
    assert!(ftz.contains("add.rn.ftz.f32"), "--ftz=true left no trace");
    let generator = ptx(GENERATOR_PROGRAM, &GENERATOR_SRC, false);
    assert!(
        generator.contains("trap;"),
        "an unknown distribution code must trap"
    );
    // bf16 converts with integer code only. f16's hardware cvt (exact on
    // non-NaN inputs only) is allowed where its result is checked: in the
    // 16-bit fold entries, each of which also tests its result for NaN and
    // holds the exact integer path (the clz of the subnormal widening) for
    // that case; in the generator only in the conversion-check kernels,
    // never in the one that makes arenas.
    for (name, text) in [("fold", &fold), ("generator", &generator)] {
        for cvt in ["cvt.rn.bf16", "cvt.f32.bf16"] {
            assert!(!text.contains(cvt), "the {name} program uses {cvt}");
        }
    }
    assert_eq!(f16_cvt_rule(&fold), Ok(()));
    for (entry, body) in entries(&generator) {
        let hw = body.contains("cvt.f32.f16") || body.contains("cvt.rn.f16.f32");
        let check = entry == "fp_narrow_bits" || entry == "fp_widen_bits";
        assert_eq!(hw, check, "generator entry {entry}: hardware f16 cvt {hw}");
    }
    // Negative control: without the NaN check the rule fails.
    let unchecked = FOLD_SRC.replace("if (fast && fp_any_nan(acc))", "if (false)");
    assert_ne!(unchecked, *FOLD_SRC);
    let err = f16_cvt_rule(&ptx(FOLD_PROGRAM, &unchecked, false)).expect_err("unchecked cvt");
    assert!(err.starts_with("fp_fold_") && err.contains("16: "), "{err}");
    assert!(fold.contains(".entry fp_fold_fixed_fast16("));
    assert!(generator.contains(".entry fp_narrow_bits("));
}

/// Each `.entry` of a PTX text: its name and body (up to the next entry).
fn entries(ptx: &str) -> Vec<(String, &str)> {
    ptx.split(".entry ")
        .skip(1)
        .map(|body| (body.split('(').next().unwrap_or("").to_string(), body))
        .collect()
}

/// The fold's rule for f16 hardware conversions: 16-bit entries use them
/// and test for NaN and keep the exact path; float32 entries have none.
fn f16_cvt_rule(fold_ptx: &str) -> Result<(), String> {
    let all = entries(fold_ptx);
    if all.len() != fold_entries().len() {
        return Err(format!("{} entries in the PTX", all.len()));
    }
    for (entry, body) in all {
        let hw = body.contains("cvt.f32.f16") && body.contains("cvt.rn.f16.f32");
        let guarded = body.contains("setp.nan.f32") && body.contains("clz.b32");
        let ok = if entry.ends_with("16") {
            hw && guarded
        } else {
            !body.contains("cvt.f32.f16") && !body.contains("cvt.rn.f16.f32")
        };
        if !ok {
            return Err(format!(
                "{entry}: hardware cvt {hw}, NaN check and exact path {guarded}"
            ));
        }
    }
    Ok(())
}

/// The build policy with a real NVRTC: `--ftz=true` for a CUBIN either
/// changes the CUBIN, or comes back as PTX (auto target) with a note, or is
/// refused (explicit target).
#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn flag_check_keeps_its_promise() {
    nvrtc();
    let t = target("cubin", 90);
    let pinned = build_image(
        BuildRequest {
            program: FOLD_PROGRAM,
            fmad: false,
            ftz: false,
            target: t,
            explicit: false,
        },
        &FOLD_SRC,
    )
    .expect("pinned build");
    assert_eq!(pinned.target, t);
    assert!(pinned.note.is_none());
    for explicit in [false, true] {
        let req = BuildRequest {
            program: FOLD_PROGRAM,
            fmad: false,
            ftz: true,
            target: t,
            explicit,
        };
        match build_image(req, &FOLD_SRC) {
            Ok(img) if img.target == t => {
                assert_ne!(
                    img.sha256, pinned.sha256,
                    "a CUBIN claiming ftz is the pinned one"
                );
            }
            Ok(img) => {
                assert!(
                    !explicit,
                    "an explicit CUBIN target fell back to {:?}",
                    img.target
                );
                assert_eq!(img.target, target("ptx", 90));
                assert!(img.note.as_deref().unwrap_or("").contains("using PTX"));
                assert!(img.options.contains(&"--ftz=true".to_string()));
            }
            Err(e) => {
                assert!(explicit, "auto target refused: {e}");
                assert!(e.to_string().contains("choose a PTX target"), "{e}");
            }
        }
    }
}

/// Negative control: NVRTC really checks what it is given. A syntax error
/// fails with NVRTC's log naming the line.
#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn a_syntax_error_fails_to_compile() {
    nvrtc();
    let t = target("cubin", 90);
    let broken = format!(
        "{}\nextern \"C\" __global__ void fp_broken() {{ int x = ; }}\n",
        *FOLD_SRC
    );
    let e = nvrtc_compile(FOLD_PROGRAM, &broken, &option_list(false, false, t), t)
        .expect_err("a syntax error compiled");
    // NVRTC's own code, not a message to search, says what went wrong.
    match &e {
        foldprint::gpu::error::GpuError::Nvrtc(n) => assert_eq!(
            n.code,
            Some(cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_COMPILATION)
        ),
        other => panic!("not an NVRTC error: {other:?}"),
    }
    let e = e.to_string();
    assert!(e.contains("NVRTC could not compile"), "{e}");
    assert!(e.contains("error"), "no compiler log in: {e}");
    // NVRTC's log names the .cu file and a line past its end (the `#line`
    // directive maps the source back to fold.cu).
    let past_end = foldprint::gpu::kernels::source::FOLD_CU.lines().count() + 2;
    assert!(e.contains(&format!("fold.cu({past_end})")), "{e}");
    // The same call with the real source compiles (the control is the error).
    kernels::nvrtc_compile(FOLD_PROGRAM, &FOLD_SRC, &option_list(false, false, t), t)
        .expect("the real fold compiles");
}

/// The on-disk kernel cache with a real NVRTC, end to end up to the module
/// load (which needs a GPU): a cold build compiles and stores, a warm one
/// reads the same image back without NVRTC, a damaged entry is compiled
/// again and replaced, and `Off` neither reads nor writes.
#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn the_kernel_cache_serves_what_nvrtc_built() {
    use kernels::disk_cache::DiskCache;
    use kernels::{image_for, CacheChoice};
    nvrtc();
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = DiskCache::at(dir.path().join("kernels"));
    let at = || CacheChoice::At(cache.clone());
    let req = BuildRequest {
        program: FOLD_PROGRAM,
        fmad: false,
        ftz: false,
        target: target("cubin", 90),
        explicit: false,
    };
    let (cold, o1) = image_for(req, &FOLD_SRC, at()).expect("cold build");
    assert!(!o1.from_cache && o1.compile_ms > 0.0, "{o1:?}");
    assert!(o1.note.is_none(), "{o1:?}");
    let key = o1.key.clone().expect("a key");
    let entry = cache.entry_path(&key);
    assert!(entry.is_file(), "nothing stored at {}", entry.display());

    let (warm, o2) = image_for(req, &FOLD_SRC, at()).expect("warm build");
    assert!(o2.from_cache && o2.compile_ms == 0.0, "{o2:?}");
    assert_eq!(o2.key.as_deref(), Some(key.as_str()));
    assert_eq!(warm.data, cold.data);
    assert_eq!(warm.sha256, cold.sha256);
    assert_eq!(warm.target, cold.target);
    assert_eq!(warm.options, cold.options);
    println!(
        "fold sm_90: NVRTC {:.0} ms (cache inputs hashed, NVRTC library included: {:.0} ms), cache hit {:.1} ms",
        o1.compile_ms, o1.cache_ms, o2.cache_ms
    );

    // Another input, another entry.
    let ptx = BuildRequest {
        target: target("ptx", 90),
        ..req
    };
    let (_, o3) = image_for(ptx, &FOLD_SRC, at()).expect("ptx build");
    assert!(!o3.from_cache && o3.key.as_deref() != Some(key.as_str()));
    let (_, o4) = image_for(req, &format!("{}\n", *FOLD_SRC), at()).expect("other source");
    assert!(!o4.from_cache && o4.key.as_deref() != Some(key.as_str()));

    // A damaged entry is never loaded: compiled again, said so, replaced.
    let mut bytes = std::fs::read(&entry).expect("entry");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&entry, &bytes).expect("damage");
    let (again, o5) = image_for(req, &FOLD_SRC, at()).expect("rebuild");
    assert!(!o5.from_cache, "{o5:?}");
    assert!(
        o5.note.as_deref().unwrap_or("").contains("untrusted entry"),
        "{o5:?}"
    );
    assert_eq!(again.data, cold.data);
    let (_, o6) = image_for(req, &FOLD_SRC, at()).expect("after repair");
    assert!(o6.from_cache, "{o6:?}");

    // Off: compiled fresh, nothing read or written.
    let before = std::fs::read_dir(cache.dir()).expect("dir").count();
    std::fs::remove_file(&entry).expect("remove");
    let (_, o7) = image_for(req, &FOLD_SRC, CacheChoice::Off).expect("off");
    assert!(
        !o7.from_cache && o7.key.is_none() && o7.compile_ms > 0.0,
        "{o7:?}"
    );
    assert!(!entry.exists(), "--no-kernel-cache wrote an entry");
    assert_eq!(
        std::fs::read_dir(cache.dir()).expect("dir").count(),
        before - 1
    );
}

/// Registers per thread of each entry in a CUBIN built with ptxas' verbose
/// report.
fn registers(src: &str, arch: u32) -> Vec<(String, u32)> {
    let t = target("cubin", arch);
    let mut opts = option_list(false, false, t);
    opts.push("--ptxas-options=-v".into());
    let img = nvrtc_compile(FOLD_PROGRAM, src, &opts, t).expect("compile");
    let mut entry = None;
    let mut out = Vec::new();
    for line in img.log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().map(str::to_string);
        }
        if let Some(rest) = line.split("Used ").nth(1) {
            if let (Some(e), Some(n)) = (&entry, rest.split(' ').next()) {
                out.push((e.clone(), n.parse().expect("a register count")));
            }
        }
    }
    out
}

/// Every fold entry launches with 1024-thread blocks (`--block 1024`, the
/// per-W shape): at most 64 registers per thread on every architecture, so
/// a block fits the 64 Ki-register file.
#[test]
#[ignore = "needs NVRTC: .ci/run runs it with --ignored and FOLDPRINT_NVRTC_LIBRARY"]
fn every_fold_entry_fits_a_1024_thread_block() {
    nvrtc();
    for arch in ARCHS {
        let regs = registers(&FOLD_SRC, arch);
        assert_eq!(regs.len(), fold_entries().len(), "sm_{arch}: {regs:?}");
        for (entry, n) in &regs {
            assert!(*n <= 64, "sm_{arch} {entry}: {n} registers per thread");
        }
    }
    // The 16-bit trials launch with the bench's shapes, but may be chosen
    // as the production shape: the same bound.
    for arch in ARCHS {
        let regs = registers(&FOLD16_TRIALS_SRC, arch);
        assert_eq!(
            regs.len(),
            fold_entries().len() + fold16_trial_entries().len(),
            "sm_{arch}: {regs:?}"
        );
        for (entry, n) in &regs {
            assert!(*n <= 64, "sm_{arch} {entry}: {n} registers per thread");
        }
    }
    // Negative control: without the launch bound the order chain's batched
    // float4 loads take more than 64 registers.
    let unbounded = FOLD_SRC.replace("__launch_bounds__(1024)", "");
    assert_ne!(unbounded, *FOLD_SRC);
    let worst = registers(&unbounded, 90).into_iter().map(|(_, n)| n).max();
    assert!(worst > Some(64), "{worst:?}");
}
