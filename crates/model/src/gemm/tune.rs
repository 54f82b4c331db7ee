//! Which cuBLASLt algorithm a GEMM shape runs: the heuristic's first pick, or the fastest of its
//! first [`CANDIDATES`] picks timed on the shape's first call ([`Tuning::Timed`], set by
//! [`crate::tuning::set_gemm_tuning`]).
//!
//! cuBLASLt's heuristic ranks algorithms by a model of the GPU, not by running them; at some of
//! our shapes (a GEMM that reads C for the residual, an epilogue, a weight-gradient GEMM with a
//! long K) its first pick is not the fastest it offers. Timing each candidate on the real
//! operands costs a few milliseconds once per shape (the first step) and one host
//! synchronisation then; afterwards a call costs what it did. The choice is by time, so two
//! runs can pick differently where two algorithms are within noise of each other: results then
//! differ by the algorithms' rounding, as between two GPUs.

use candle_core::cuda_backend::cudarc::cublaslt::sys;
use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;

use super::{lt_error, matmul, Desc, Gemm, Layout, Lt, Plan, Pref, WORKSPACE_BYTES};
use crate::error::{ModelError, Result};
use crate::tuning::{record, tuning, Tuned, Tuning, CANDIDATES};

/// Timed runs of each candidate (after one untimed run).
const REPS: usize = 5;

/// cuBLASLt's first [`CANDIDATES`] heuristic picks that fit the workspace, best first; an error
/// when there is none (the shape is not supported).
pub(super) fn heuristic_algos(
    handle: sys::cublasLtHandle_t,
    desc: &Desc,
    [a, b, d]: [&Layout; 3],
    pref: &Pref,
) -> Result<Vec<sys::cublasLtMatmulAlgo_t>> {
    let want = match tuning() {
        Tuning::Heuristic => 1,
        Tuning::Timed => CANDIDATES,
    };
    // SAFETY: plain C structs, written by cuBLASLt below for the first `count` entries.
    let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { std::mem::zeroed() }; want];
    let mut count = 0i32;
    // SAFETY: every descriptor is alive; `results` holds `want` entries.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            desc.0,
            a.0,
            b.0,
            d.0,
            d.0,
            pref.0,
            want as i32,
            results.as_mut_ptr(),
            &mut count,
        )
    }
    .result()
    .map_err(lt_error)?;
    let algos: Vec<_> = results[..count.max(0) as usize]
        .iter()
        .filter(|r| {
            r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && r.workspaceSize <= WORKSPACE_BYTES
        })
        .map(|r| r.algo)
        .collect();
    if algos.is_empty() {
        return Err(lt_error("no algorithm for this GEMM shape"));
    }
    Ok(algos)
}

/// The algorithm `p` runs from now on: its heuristic pick, or under [`Tuning::Timed`] the
/// fastest candidate on `g`'s operands. `p`'s descriptor must hold `g`'s pointers. Timing runs
/// write a scratch D when `g` accumulates into D in place (C = D), so that the call that
/// follows still sees the D it was given.
pub(super) fn choose(lt: &Lt, p: &Plan, g: &Gemm) -> Result<sys::cublasLtMatmulAlgo_t> {
    if tuning() == Tuning::Heuristic || p.candidates.len() < 2 {
        return Ok(p.candidates[0]);
    }
    let elem = if g.d_type == candle_core::DType::F32 {
        4
    } else {
        2
    };
    let scratch = match g.c == Some(g.d) {
        // SAFETY: written by the timing runs, never read.
        true => Some(
            unsafe { lt.stream.alloc::<u8>(g.ldd * g.n * elem) }
                .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?,
        ),
        false => None,
    };
    let mut timed = *g;
    if let Some(s) = &scratch {
        use candle_core::cuda_backend::cudarc::driver::DevicePtr;
        let (ptr, _record) = s.device_ptr(&lt.stream);
        timed.d = ptr;
    }
    let event = || {
        lt.stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))
    };
    let mut spans = Vec::with_capacity(p.candidates.len());
    for algo in &p.candidates {
        // An algorithm the heuristic offered may still refuse these operands: skip it.
        if matmul(lt, p, algo, &timed).is_err() {
            spans.push(None);
            continue;
        }
        let start = event()?;
        for _ in 0..REPS {
            matmul(lt, p, algo, &timed)?;
        }
        spans.push(Some((start, event()?)));
    }
    let ms: Vec<Option<f64>> = spans
        .iter()
        .map(|s| match s {
            None => Ok(None),
            Some((a, b)) => {
                b.synchronize()
                    .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?;
                let ms = a
                    .elapsed_ms(b)
                    .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?;
                Ok(Some(ms as f64 / REPS as f64))
            }
        })
        .collect::<Result<_>>()?;
    drop(scratch);
    let (chosen, chosen_ms) = ms
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .ok_or_else(|| lt_error("no algorithm ran for this GEMM shape"))?;
    record(Tuned {
        shape: format!(
            "{}x{}x{} {}{} epilogue {}{}",
            g.m,
            g.n,
            g.k,
            if g.trans_a { 'T' } else { 'N' },
            if g.trans_b { 'T' } else { 'N' },
            g.epilogue.code(),
            if g.c.is_some() { " +C" } else { "" }
        ),
        heuristic_ms: ms[0].unwrap_or(f64::NAN),
        chosen_ms,
        chosen,
        candidates: ms.len(),
    });
    Ok(p.candidates[chosen])
}
