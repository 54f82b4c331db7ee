//! The one loader: compiles a [`Source`] with NVRTC once per (file, defines, flavour) for the
//! process, and loads the module once per device through candle's module cache.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::CudaFunction;
use candle_core::cuda_backend::cudarc::nvrtc::{
    compile_ptx_with_opts, CompileError, CompileOptions,
};
use candle_core::cuda_backend::CudaDevice;

use crate::{Define, Flavour, KernelError, Result, Source};

/// NVRTC options of a flavour.
pub fn options(flavour: Flavour) -> CompileOptions {
    match flavour {
        // compute_80: Ampere and later (the driver JIT-compiles the PTX for the device), so that
        // `max.NaN` and `cvt.rn.bf16x2` exist.
        Flavour::Exact => CompileOptions {
            arch: Some("compute_80"),
            ftz: Some(false),
            prec_sqrt: Some(true),
            prec_div: Some(true),
            fmad: Some(false),
            options: vec!["--std=c++17".into()],
            ..Default::default()
        },
        Flavour::Fast => CompileOptions {
            arch: Some("compute_90"),
            fmad: Some(true),
            options: vec!["--std=c++17".into()],
            ..Default::default()
        },
    }
}

/// PTX of `src` with `defines`, compiled at first use and kept for the process.
pub fn ptx(src: &Source, defines: &[Define], flavour: Flavour) -> Result<&'static str> {
    static CACHE: OnceLock<Mutex<HashMap<String, &'static str>>> = OnceLock::new();
    let key = src.module_name(defines, flavour);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(p);
    }
    // Compiled outside the lock: two threads may both compile a module the first time; the
    // results are the same and one is kept.
    let ptx = compile_ptx_with_opts(src.nvrtc_text(defines), options(flavour)).map_err(|e| {
        KernelError::Compile {
            file: src.file,
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => other.to_string(),
            },
        }
    })?;
    let ptx: &'static str = Box::leak(ptx.to_src().into_boxed_str());
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(*map.entry(key).or_insert(ptx))
}

/// Kernel `name` of `src` (compiled with `defines`), loaded on `dev`; launch it with
/// `dev.cuda_stream().launch_builder(&func)`, which queues on `dev`'s stream. (cudarc's
/// `CudaFunction`: candle's `CudaFunc` wrapper cannot be named outside candle 0.11.1.)
pub fn function(
    dev: &CudaDevice,
    src: &Source,
    defines: &[Define],
    flavour: Flavour,
    name: &str,
) -> Result<CudaFunction> {
    let ptx = ptx(src, defines, flavour)?;
    dev.get_or_load_custom_func(name, &src.module_name(defines, flavour), ptx)
        .map(|f| f.into_cuda_function())
        .map_err(|e| KernelError::Load {
            file: src.file,
            function: name.to_string(),
            source: Box::new(e),
        })
}
