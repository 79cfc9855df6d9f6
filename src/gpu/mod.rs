//! The GPU platform both GPU backends stand on: finding the driver and
//! NVRTC ([`probe`], [`host_driver`], [`mapped`] for what was loaded), one
//! opened device with its compiled programs ([`device`], [`kernels`]) and
//! the options a backend opens it with ([`config`]),
//! typed device and pinned memory ([`mem`]), host bytes pinned where
//! they lie ([`in_place`]), reading an arena back and
//! hashing it ([`readback`]), and one error type ([`error`]) that keeps
//! every library's own code. It knows nothing of ranks, cases or reports.
//!
//! Nothing here panics when CUDA is missing: [`probe`] opens the libraries
//! cudarc would open and checks their symbols before cudarc is used.

pub mod bench;
pub mod cache_dir;
pub mod config;
pub mod device;
pub mod error;
pub mod host_driver;
pub mod in_place;
pub mod kernels;
pub mod mapped;
pub mod mem;
pub mod overlap;
pub mod probe;
pub mod readback;

pub use config::{DeviceConfig, RankCheck};
pub use device::{Device, LaunchTuning, Startup};
pub use error::{GpuError, GpuFault};
pub use kernels::{CompileOptions, KernelVariant, Target};
pub use probe::{probe, CudaProbe};
