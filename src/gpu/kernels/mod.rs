//! The device code and how it is built: the CUDA sources with the
//! constants they share with Rust (`source.rs`, `generate.cu`, `fold.cu`),
//! target choice and pinned options (`target.rs`), the NVRTC calls
//! (`nvrtc.rs`), the build policy that checks flags reach the code
//! (`compile.rs`), compiled images on disk (`disk_cache.rs`), loaded
//! modules and the per-process cache (`module.rs`), and the pairwise
//! tree's postfix programs (`tree.rs`).
//!
//! Two programs: the generator (integer-only mirror of `crate::data`,
//! always built with the pinned options) and the fold (built with the
//! caller's [`CompileOptions`], so a test can show that `ftz` is visible).
//! Everything up to the loaded module is host work: NVRTC needs no GPU.

pub mod compile;
pub mod disk_cache;
pub mod module;
pub mod nvrtc;
pub mod source;
pub mod target;
pub mod tree;

pub use compile::{build_image, BuildRequest};
pub use module::{
    compile_count, image_for, images, load_into_context, open_with_programs, CacheChoice,
    FoldKernels, LoadedProgram, ModuleOrigin, OpenTimes, ProgramSpec,
};
pub use nvrtc::{nvrtc_compile, Image};
pub use source::{
    dtype_code, fold16_trial_entries, fold_entries, fold_entry, fold_entry16, Fold16Trial,
    FoldMode, KernelVariant, CHUNK_SHA_ENTRY, DTYPE_CUH, FOLD16_TRIALS, FOLD16_TRIALS_PROGRAM,
    FOLD16_TRIALS_SRC, FOLD_PROGRAM, FOLD_SRC, GENERATE16_ENTRY, GENERATE_ENTRY, GENERATOR_ENTRIES,
    GENERATOR_PROGRAM, GENERATOR_SRC, NAN_CHUNKS_ENTRY, NARROW_BITS_ENTRY, RANK_CHECK_ENTRIES,
    RANK_CHECK_PROGRAM, RANK_CHECK_SRC, RANK_DIFF16_ENTRY, RANK_DIFF_ENTRY, WIDEN_BITS_ENTRY,
};
pub use target::{option_list, resolve_target, CompileOptions, ResolvedTarget, Target};
pub use tree::{fold_program, program_depth, tree_program, TREE_ADD, TREE_STACK};
