//! How the GPU's GEMMs choose their cuBLASLt algorithm, set once for the process by the trainer
//! (`train.gemm_tuning`), and what the timed choice measured. The choosing itself is in the
//! CUDA build's `gemm/tune.rs`; on the CPU this setting changes nothing.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// How many of the heuristic's picks [`Tuning::Timed`] times.
pub const CANDIDATES: usize = 8;

/// How a GEMM shape's algorithm is chosen, for the whole process ([`set_gemm_tuning`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Tuning {
    /// cuBLASLt's first heuristic pick (deterministic from run to run).
    #[default]
    Heuristic,
    /// The fastest of the heuristic's first [`CANDIDATES`] picks, timed on the first call.
    Timed,
}

static TUNING: AtomicU8 = AtomicU8::new(0);

/// Sets how GEMM shapes not yet seen choose their algorithm.
pub fn set_gemm_tuning(t: Tuning) {
    TUNING.store(t as u8, Ordering::Relaxed);
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn tuning() -> Tuning {
    match TUNING.load(Ordering::Relaxed) {
        0 => Tuning::Heuristic,
        _ => Tuning::Timed,
    }
}

/// One timed shape: what the heuristic's pick and the chosen algorithm took.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    /// `m x n x k` (column-major, cuBLAS terms), the transposes and the epilogue code.
    pub shape: String,
    /// Milliseconds a call of the heuristic's first pick.
    pub heuristic_ms: f64,
    /// Milliseconds a call of the chosen algorithm.
    pub chosen_ms: f64,
    /// Index of the chosen algorithm among the candidates (0: the heuristic's pick).
    pub chosen: usize,
    pub candidates: usize,
}

fn records() -> &'static Mutex<Vec<Tuned>> {
    static R: Mutex<Vec<Tuned>> = Mutex::new(Vec::new());
    &R
}

/// Every shape timed so far in this process, in the order first seen.
pub fn tuned_gemms() -> Vec<Tuned> {
    records().lock().unwrap_or_else(|e| e.into_inner()).clone()
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record(t: Tuned) {
    records().lock().unwrap_or_else(|e| e.into_inner()).push(t);
}
