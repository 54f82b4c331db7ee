//! Launchers of the quantisers' CUDA kernels (docs/design.md section 6): the CUDA C is
//! `crates/kernels/cuda/quant.cu` ([`kernels::QUANT`]), compiled at run time with NVRTC by
//! [`kernels::loader`] (`Flavour::Exact`), one module per block size (the block is a
//! compile-time constant, `BLOCK`, so each thread keeps its share of a block in registers and the
//! loops unroll). The constants below that the source shares go to it as defines.
//!
//! Launch shape (256 threads a CTA). The quantisers and INT8 dequantisers use
//! `__launch_bounds__(256, 8)` (at most 32 registers, 2048 threads a SM); the fused INT4
//! kernels `(256, 4)` (64 registers: 32 f32 sums a thread plus loads in flight). Per-block
//! kernels give a quantisation block to a group of TPB threads (a power of two; 256 / TPB
//! blocks a CTA): `quantize_int8` and `quantize_int4_swizzled` read the block as float4 units,
//! unit `u * TPB + t` to thread t (each load instruction of a warp covers 512 contiguous
//! bytes), two or more units a thread, every load issued before any use. The fused kernels
//! give each thread 32 consecutive elements (one 16-byte load a piece, the loads of 4 pieces
//! issued together; block 512: 16 threads, half a warp), sum them in registers and store 16
//! bytes of codes, or the 32 f32 sums through a per-warp shared-memory transpose so that each
//! warp store covers 512 contiguous bytes. The block's absmax is reduced with warp shuffles
//! and, for groups wider than a warp, shared memory. The INT8 dequantisers are elementwise:
//! units of 4 codes (f32) or 8 codes (bf16) a thread, 256 units apart, loads first; one
//! 16-byte store a unit, consecutive lanes at consecutive addresses.
//!
//! Exactness: the arithmetic is that of `block/`, written with explicit IEEE intrinsics
//! (`__fdiv_rn`, `__fmul_rn`, `__fadd_rn`, `__fmaf_rn`, `__frcp_rn`), compiled with
//! `--fmad=false` and no fast-math and no flush-to-zero, so every code, scale and dequantised
//! value equals the CPU reference bitwise. A code is block/mod.rs `code_mul`, the exact product
//! v * fl(1/s) rounded to an integer (ties to even) by one fma with 1.5 * 2^23 (see `MAGIC`);
//! a block whose 1/s overflows (subnormal scale) takes `code_div`, the exact division, for
//! every value. INT8 codes are turned into floats exactly through the mantissa of 2^23; the
//! fused INT4 kernels decode a nibble as the subnormal (code + 8) 2^(4K - 149) (one mask) and
//! sum in a per-block scale domain (block/domain.rs `int4_sum_block`, fused.rs), with the same
//! operations as the CPU reference.
//! bf16 output is the f32 value rounded to nearest even (the `half` crate's rule).
//!
//! Non-finite input: no host synchronisation is made to look for it. A block holding an inf or
//! NaN gets a NaN scale (bits 0x7fc00000) and codes 0, as in the CPU reference, so it
//! dequantises to NaN; the engine's gradient-norm check then skips the step. The absmax is an
//! integer max of |v|'s bits (or a NaN-propagating float max), never `fmaxf`, which would drop
//! the NaN. (A dequantised NaN's payload may differ from the CPU's: `__fmul_rn` gives the
//! canonical NaN.)
//!
//! Requirements on the GPU path: block % 32 == 0 (checked by `tensor.rs`); inputs 16-byte
//! aligned (`input` copies a view that is not). Block sizes whose float4 count has a
//! small power-of-two part (e.g. 32 * odd above 1024) give many units a thread (spills).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, LaunchConfig,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorageSlice, WrapErr};
use candle_core::{DType, Storage, Tensor};
use kernels::launch::{self, Kernel, Module};
use kernels::place::Place;

use crate::QuantError;

type Result<T> = std::result::Result<T, QuantError>;

/// Threads a CTA, every kernel (`NT` in the source).
const NT: usize = 256;
/// Units (4 or 8 codes) a thread of the INT8 dequantisers (`DEQ_UNROLL` in the source).
const DEQ_UNROLL: usize = 4;
/// 8-code units a thread of `dequantize_int8_bf16` (`BF16_UNROLL` in the source).
const BF16_UNROLL: usize = 4;
/// Most pieces of `dequantize_sum_requantize_int4_full` (`FULL_PIECES` in the source: one load
/// group holds them all).
const FULL_PIECES: usize = 4;
/// Most pieces of `dequantize_sum_requantize_int4_full8` (`FULL8_PIECES` in the source).
const FULL8_PIECES: usize = 8;

/// `tpb_of` of the source: threads per quantisation block of `units` float4 units.
fn tpb_of(units: usize) -> usize {
    let p = units & units.wrapping_neg();
    let p = if p == units { units / 2 } else { p };
    p.clamp(1, NT)
}

/// `fused_tpb` of the source: threads per block of `units` 32-element units (fused kernels).
fn fused_tpb(units: usize) -> usize {
    (units & units.wrapping_neg()).clamp(1, NT)
}

/// The defines of the module for `block`: the block and the constants this file shares with
/// the source.
fn defines(block: usize) -> [kernels::Define; 6] {
    [
        ("BLOCK", block as i64),
        ("NT", NT as i64),
        ("DEQ_UNROLL", DEQ_UNROLL as i64),
        ("BF16_UNROLL", BF16_UNROLL as i64),
        ("FULL_PIECES", FULL_PIECES as i64),
        ("FULL8_PIECES", FULL8_PIECES as i64),
    ]
}

/// `ctas` CTAs of NT threads.
fn grid(ctas: usize) -> LaunchConfig {
    launch::grid(ctas, NT)
}

/// Grid of the per-block kernels: `nb` quantisation blocks, NT / tpb of them a CTA.
fn block_grid(nb: usize, tpb: usize) -> LaunchConfig {
    grid(nb.div_ceil(NT / tpb))
}

fn i64_of(n: usize) -> i64 {
    n as i64
}

/// Where a launch goes: `dev`'s modules, queued on `stream` (the device's own, or a second
/// stream of its context: [`Place`]).
#[derive(Clone)]
pub struct Launch<'a> {
    pub dev: &'a CudaDevice,
    pub stream: Arc<CudaStream>,
}

impl<'a> Launch<'a> {
    /// On `dev`'s own stream.
    pub fn own(dev: &'a CudaDevice) -> Self {
        Launch {
            dev,
            stream: dev.cuda_stream(),
        }
    }

    /// Where `place` puts work on `dev`.
    pub fn on(dev: &'a CudaDevice, place: &Place) -> Self {
        Launch {
            dev,
            stream: place.stream(dev),
        }
    }

    /// The kernel `name` of the module for `block` (`kernels::QUANT`, exact flavour), queued on
    /// this launch's stream.
    fn func(&self, name: &str, block: usize) -> Result<Kernel> {
        let defines = defines(block);
        let module = Module::new(&kernels::QUANT, &defines, kernels::Flavour::Exact);
        Ok(Kernel::load(self.dev, module, name)?.on(self.stream.clone()))
    }

    /// A fresh buffer of `n` elements (at least one) on this launch's stream; contents
    /// undefined: the kernels write every element.
    fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller launches a kernel that writes all n elements before any read.
        Ok(unsafe { self.stream.alloc::<T>(n.max(1)) }.w()?)
    }

    /// The address of `v` (a slice or view of this context).
    fn addr<T, V: DevicePtr<T>>(&self, v: &V) -> u64 {
        launch::addr(v, &self.stream)
    }
}

/// `quantize_int8` on `x` [n] (address 16-byte aligned) into `codes` [n] and `scales`
/// [ceil(n / block)] (block % 32 == 0), by address.
fn launch_quantize_int8(
    l: &Launch<'_>,
    x: u64,
    codes: u64,
    scales: u64,
    n: usize,
    block: usize,
) -> Result<()> {
    let nb = n.div_ceil(block);
    if nb == 0 {
        return Ok(());
    }
    let f = l.func("quantize_int8", block)?;
    let (n64, nb64) = (i64_of(n), i64_of(nb));
    let cfg = block_grid(nb, tpb_of(block / 4));
    // SAFETY: (const float*, u8*, float*, i64, i64) as in the source; the caller vouches for
    // the addresses and lengths.
    unsafe { f.launch(cfg, &[&x, &codes, &scales, &n64, &nb64]) }?;
    Ok(())
}

/// `dequantize_int8_f32` (`bf16` false) or `dequantize_int8_bf16` on `codes` [n] (16-byte
/// aligned) and `scales` into `out` [n], by address.
fn launch_dequantize_int8(
    l: &Launch<'_>,
    codes: u64,
    scales: u64,
    out: u64,
    n: usize,
    block: usize,
    bf16: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (name, per_unit, unroll) = match bf16 {
        true => ("dequantize_int8_bf16", 8, BF16_UNROLL),
        false => ("dequantize_int8_f32", 4, DEQ_UNROLL),
    };
    let f = l.func(name, block)?;
    let n64 = i64_of(n);
    // One unit past the full ones, for the tail.
    let units = n / per_unit + 1;
    let cfg = grid(units.div_ceil(NT * unroll));
    // SAFETY: (const u8*, const float*, float* or u16*, i64) as in the source.
    unsafe { f.launch(cfg, &[&codes, &scales, &out, &n64]) }?;
    Ok(())
}

/// `quantize_int4_swizzled` on `x` [n = W * S] (16-byte aligned, S % block == 0) into `packed`
/// [n / 2] and `scales` [n / block], by address.
#[allow(clippy::too_many_arguments)]
fn launch_quantize_int4_swizzled(
    l: &Launch<'_>,
    x: u64,
    packed: u64,
    scales: u64,
    n: usize,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<()> {
    let nb = n / block;
    if nb == 0 {
        return Ok(());
    }
    let bps = nb / (nodes * ranks_per_node);
    let f = l.func("quantize_int4_swizzled", block)?;
    let [n, nb64, bps, nodes, rpn] = [n, nb, bps, nodes, ranks_per_node].map(i64_of);
    let cfg = block_grid(nb, tpb_of(block / 4));
    // SAFETY: (const float*, u8*, float*, i64 x 5) as in the source.
    unsafe { f.launch(cfg, &[&x, &packed, &scales, &n, &nb64, &bps, &nodes, &rpn]) }?;
    Ok(())
}

/// Output of the fused INT4 kernels, by address.
#[derive(Clone, Copy)]
enum RawOut {
    /// The f32 sum [2P].
    Sum(u64),
    /// The INT4 of the sum: packed [P], scales [ceil(2P / block)].
    Requantized(u64, u64),
}

/// The fused INT4 kernel `out` names on `pieces` pieces concatenated: `packed` [pieces * p]
/// (16-byte aligned), `scales` [pieces * nb], nb = ceil(2p / block), by address.
fn launch_fused(
    l: &Launch<'_>,
    packed: u64,
    scales: u64,
    pieces: usize,
    p: usize,
    block: usize,
    out: RawOut,
) -> Result<()> {
    if pieces == 0 {
        return Ok(());
    }
    let nb = (2 * p).div_ceil(block);
    if nb == 0 {
        return Ok(());
    }
    let pieces32 = i32::try_from(pieces).map_err(|_| QuantError::BadLength {
        what: "piece count",
        got: pieces,
        expected: i32::MAX as usize,
    })?;
    let (p64, nb64) = (i64_of(p), i64_of(nb));
    let tpb = fused_tpb(block / 32);
    let (qout, qscales) = match out {
        RawOut::Sum(o) => {
            let f = l.func("dequantize_sum_int4", block)?;
            let args: [&dyn launch::Arg; 6] = [&packed, &scales, &o, &pieces32, &p64, &nb64];
            // SAFETY: (const u8*, const float*, float*, int, i64, i64) as in the source.
            unsafe { f.launch(block_grid(nb, tpb), &args) }?;
            return Ok(());
        }
        RawOut::Requantized(q, s) => (q, s),
    };
    // Rounds of full blocks for a persistent fast kernel, then the rest, from block b0, for the
    // general one (F_BPC blocks a CTA).
    let fast = fast_requantizer(block, pieces, p);
    if let Some(FastRequantizer { name, rounds, .. }) = fast {
        let f = l.func(name, block)?;
        let sms = l
            .stream
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .w()?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(NT as u32, 0, None)
            .w()?;
        let resident = sms.max(1) as usize * per_sm.max(1) as usize;
        // In range: p < 2^32, so nb <= 2^33 / 32 and rounds < nb.
        let (p32, nb32, rounds32) = (p as u32, nb as u32, rounds as u32);
        let args: [&dyn launch::Arg; 8] = [
            &packed, &scales, &qout, &qscales, &pieces32, &p32, &nb32, &rounds32,
        ];
        // SAFETY: (const u8*, const float*, u8*, float*, int, u32, u32, u32) as in the source.
        unsafe { f.launch(grid(rounds.min(resident)), &args) }?;
    }
    let b0 = fast.map_or(0, |q| q.rounds * (NT / q.tpb));
    if b0 < nb {
        let f = l.func("dequantize_sum_requantize_int4", block)?;
        let b064 = i64_of(b0);
        let args: [&dyn launch::Arg; 8] = [
            &packed, &scales, &qout, &qscales, &pieces32, &p64, &nb64, &b064,
        ];
        // SAFETY: (const u8*, const float*, u8*, float*, int, i64, i64, i64) as in the source.
        unsafe { f.launch(block_grid(nb - b0, tpb), &args) }?;
    }
    Ok(())
}

// ---- the launchers on cudarc buffers, on the device's own stream (the benchmark) ----

/// Launches `quantize_int8` on `x` (16-byte aligned) into preallocated `codes` [n] and
/// `scales` [ceil(n / block)] (block % 32 == 0), on `dev`'s stream.
pub fn quantize_int8_into(
    dev: &CudaDevice,
    x: &CudaView<'_, f32>,
    codes: &mut CudaSlice<u8>,
    scales: &mut CudaSlice<f32>,
    block: usize,
) -> Result<()> {
    let l = Launch::own(dev);
    let (xa, ca, sa) = (l.addr(x), l.addr(codes), l.addr(scales));
    launch_quantize_int8(&l, xa, ca, sa, x.len(), block)
}

/// Launches `dequantize_int8_f32` (`out` f32) or `dequantize_int8_bf16` (`out` bf16 bits as
/// u16) on `codes` [n] (16-byte aligned) and `scales` [ceil(n / block)] into a preallocated
/// `out` [n], on `dev`'s stream.
pub fn dequantize_int8_into<T: DeviceRepr>(
    dev: &CudaDevice,
    codes: &CudaView<'_, u8>,
    scales: &CudaView<'_, f32>,
    out: &mut CudaSlice<T>,
    block: usize,
) -> Result<()> {
    let l = Launch::own(dev);
    let (ca, sa, oa) = (l.addr(codes), l.addr(scales), l.addr(out));
    let bf16 = std::mem::size_of::<T>() == 2;
    launch_dequantize_int8(&l, ca, sa, oa, codes.len(), block, bf16)
}

/// Launches `quantize_int4_swizzled` on `x` [W * S] (16-byte aligned, S % block == 0) into
/// preallocated `packed` [W * S / 2] and `scales` [W * S / block], on `dev`'s stream.
pub fn quantize_int4_swizzled_into(
    dev: &CudaDevice,
    x: &CudaView<'_, f32>,
    packed: &mut CudaSlice<u8>,
    scales: &mut CudaSlice<f32>,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<()> {
    let l = Launch::own(dev);
    let (xa, pa, sa) = (l.addr(x), l.addr(packed), l.addr(scales));
    launch_quantize_int4_swizzled(&l, xa, pa, sa, x.len(), nodes, ranks_per_node, block)
}

/// Output buffers of the fused INT4 kernels.
pub enum Out<'a> {
    /// The f32 sum [2P] (`dequantize_sum_int4`).
    Sum(&'a mut CudaSlice<f32>),
    /// The INT4 of the sum: packed [P], scales [ceil(2P / block)]
    /// (`dequantize_sum_requantize_int4`).
    Requantized(&'a mut CudaSlice<u8>, &'a mut CudaSlice<f32>),
}

/// Launches the fused INT4 kernel that `out` names on `pieces` pieces concatenated:
/// packed [pieces * P] (16-byte aligned), scales [pieces * nb], nb = ceil(2P / block), into
/// preallocated outputs, on `dev`'s stream.
pub fn dequantize_sum_int4_into(
    dev: &CudaDevice,
    packed: &CudaView<'_, u8>,
    scales: &CudaView<'_, f32>,
    pieces: usize,
    block: usize,
    out: Out<'_>,
) -> Result<()> {
    let l = Launch::own(dev);
    let out = match out {
        Out::Sum(o) => RawOut::Sum(l.addr(o)),
        Out::Requantized(q, s) => RawOut::Requantized(l.addr(q), l.addr(s)),
    };
    let p = if pieces == 0 {
        0
    } else {
        packed.len() / pieces
    };
    launch_fused(&l, l.addr(packed), l.addr(scales), pieces, p, block, out)
}

// ---- the tensor API's GPU half (arguments checked by tensor.rs) ----

/// The address of the 1-D contiguous CUDA tensor `t`; one that is not 16-byte aligned (a
/// narrowed tensor) is first copied on `l`'s stream to a fresh buffer, kept alive in `keep` until
/// the caller's launches are queued, so that the kernels' vector loads are aligned.
fn input<T: CudaDType + DeviceRepr>(
    l: &Launch<'_>,
    t: &Tensor,
    keep: &mut Vec<CudaSlice<T>>,
) -> Result<u64> {
    let a = kernels::place::address(t)?;
    if a.is_multiple_of(16) {
        return Ok(a);
    }
    let (st, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        unreachable!("the tensor API checked the device")
    };
    let (o, n) = (layout.start_offset(), t.elem_count());
    let v = cs.as_cuda_slice::<T>()?.slice(o..o + n);
    let mut c = l.alloc::<T>(n)?;
    l.stream.memcpy_dtod(&v, &mut c).w()?;
    let a = l.addr(&c);
    keep.push(c);
    Ok(a)
}

/// The address of `out`, a contiguous CUDA tensor the caller allocated, plus `at` elements.
fn output(out: &Tensor, at: usize) -> Result<u64> {
    Ok(kernels::place::address(out)? + (at * out.dtype().size_in_bytes()) as u64)
}

/// GPU `quant::tensor::quantize_int8` (arguments already checked).
pub(crate) fn quantize_int8(
    dev: &CudaDevice,
    x: &Tensor,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    let l = Launch::own(dev);
    let n = x.elem_count();
    let nb = n.div_ceil(block);
    let codes = l.alloc::<u8>(n)?;
    let scales = l.alloc::<f32>(nb)?;
    let mut keep = Vec::new();
    let xa = input::<f32>(&l, x, &mut keep)?;
    launch_quantize_int8(&l, xa, l.addr(&codes), l.addr(&scales), n, block)?;
    Ok((
        launch::from_slice(CudaStorageSlice::U8(codes), dev, n),
        launch::from_slice(CudaStorageSlice::F32(scales), dev, nb),
    ))
}

/// GPU `quant::tensor::quantize_int8_into`: codes into `codes[at..]`, scales into
/// `scales[at / block..]` (checked: `at % block == 0`, in range, `codes` 16-byte aligned there).
pub(crate) fn quantize_int8_at(
    dev: &CudaDevice,
    place: &Place,
    x: &Tensor,
    block: usize,
    codes: &Tensor,
    scales: &Tensor,
    at: usize,
) -> Result<()> {
    let l = Launch::on(dev, place);
    let mut keep = Vec::new();
    let xa = input::<f32>(&l, x, &mut keep)?;
    let (ca, sa) = (output(codes, at)?, output(scales, at / block)?);
    launch_quantize_int8(&l, xa, ca, sa, x.elem_count(), block)
}

/// GPU `quant::tensor::dequantize_int8` (arguments already checked; dtype F32 or BF16).
pub(crate) fn dequantize_int8(
    dev: &CudaDevice,
    codes: &Tensor,
    scales: &Tensor,
    block: usize,
    dtype: DType,
) -> Result<Tensor> {
    let l = Launch::own(dev);
    let n = codes.elem_count();
    let out = match dtype {
        DType::BF16 => launch::from_slice(CudaStorageSlice::BF16(l.alloc(n)?), dev, n),
        _ => launch::from_slice(CudaStorageSlice::F32(l.alloc(n)?), dev, n),
    };
    dequantize_int8_at(dev, &Place::Own, codes, scales, block, &out)?;
    Ok(out)
}

/// GPU `quant::tensor::dequantize_int8_into`: into `out` (F32 or BF16, checked).
pub(crate) fn dequantize_int8_at(
    dev: &CudaDevice,
    place: &Place,
    codes: &Tensor,
    scales: &Tensor,
    block: usize,
    out: &Tensor,
) -> Result<()> {
    let l = Launch::on(dev, place);
    let (mut k8, mut k32) = (Vec::new(), Vec::new());
    let ca = input::<u8>(&l, codes, &mut k8)?;
    let sa = input::<f32>(&l, scales, &mut k32)?;
    let bf16 = out.dtype() == DType::BF16;
    launch_dequantize_int8(&l, ca, sa, output(out, 0)?, codes.elem_count(), block, bf16)
}

/// GPU `quant::tensor::quantize_int4_swizzled_on` (arguments already checked: x.len() = W * S,
/// S % block == 0): fresh outputs from `place`'s stream.
pub(crate) fn quantize_int4_swizzled(
    dev: &CudaDevice,
    place: &Place,
    x: &Tensor,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    let l = Launch::on(dev, place);
    let n = x.elem_count();
    let nb = n / block;
    let packed = l.alloc::<u8>(n / 2)?;
    let scales = l.alloc::<f32>(nb)?;
    let mut keep = Vec::new();
    let xa = input::<f32>(&l, x, &mut keep)?;
    let (pa, sa) = (l.addr(&packed), l.addr(&scales));
    launch_quantize_int4_swizzled(&l, xa, pa, sa, n, nodes, ranks_per_node, block)?;
    Ok((
        launch::from_slice(CudaStorageSlice::U8(packed), dev, n / 2),
        launch::from_slice(CudaStorageSlice::F32(scales), dev, nb),
    ))
}

/// A persistent requantiser and the part of the blocks it takes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct FastRequantizer {
    name: &'static str,
    /// Threads a block (`Q_TPB` or `F_TPB` of the source).
    tpb: usize,
    /// Rounds of NT / tpb full blocks, from block 0 (at least 1).
    rounds: usize,
}

/// The persistent requantiser for `pieces` pieces of `p` bytes at `block`, or None where none
/// applies: pieces not 16-byte multiples, of 2^32 bytes and more, fewer full blocks than a
/// round, more than 8 pieces, or blocks of an odd number of units (whose threads would hold too
/// many loads).
fn fast_requantizer(block: usize, pieces: usize, p: usize) -> Option<FastRequantizer> {
    let units = block / 32;
    let tpb = fused_tpb(units);
    // Q_TPB of the source: two units a thread where one was.
    let qtpb = if units / tpb == 1 && tpb >= 2 {
        tpb / 2
    } else {
        tpb
    };
    let (name, tpb) = match pieces {
        1..=FULL_PIECES if units / qtpb <= 2 => ("dequantize_sum_requantize_int4_full", qtpb),
        _ if pieces > FULL_PIECES && pieces <= FULL8_PIECES && units / tpb == 1 => {
            ("dequantize_sum_requantize_int4_full8", tpb)
        }
        _ => return None,
    };
    if !p.is_multiple_of(16) || p > u32::MAX as usize {
        return None;
    }
    let rounds = 2 * p / block / (NT / tpb);
    (rounds > 0).then_some(FastRequantizer { name, tpb, rounds })
}

/// GPU fused INT4 piece sums (arguments already checked: packed [pieces * P],
/// scales [pieces * nb], nb = ceil(2P / block)): the INT4 of the sum (packed [P], scales [nb]),
/// fresh from `place`'s stream.
pub(crate) fn dequantize_sum_requantize_int4(
    dev: &CudaDevice,
    place: &Place,
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    let l = Launch::on(dev, place);
    let p = packed.elem_count() / pieces;
    let nb = (2 * p).div_ceil(block);
    let (mut k8, mut k32) = (Vec::new(), Vec::new());
    let pa = input::<u8>(&l, packed, &mut k8)?;
    let sa = input::<f32>(&l, scales, &mut k32)?;
    let q = l.alloc::<u8>(p)?;
    let s = l.alloc::<f32>(nb)?;
    let out = RawOut::Requantized(l.addr(&q), l.addr(&s));
    launch_fused(&l, pa, sa, pieces, p, block, out)?;
    Ok((
        launch::from_slice(CudaStorageSlice::U8(q), dev, p),
        launch::from_slice(CudaStorageSlice::F32(s), dev, nb),
    ))
}

/// GPU fused INT4 piece sum into `out` (f32 [2P], checked).
pub(crate) fn dequantize_sum_int4_at(
    dev: &CudaDevice,
    place: &Place,
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
    out: &Tensor,
) -> Result<()> {
    let l = Launch::on(dev, place);
    let p = packed.elem_count() / pieces;
    let (mut k8, mut k32) = (Vec::new(), Vec::new());
    let pa = input::<u8>(&l, packed, &mut k8)?;
    let sa = input::<f32>(&l, scales, &mut k32)?;
    launch_fused(&l, pa, sa, pieces, p, block, RawOut::Sum(output(out, 0)?))
}

/// GPU fused INT4 piece sum, a fresh f32 [2P] on the device's stream.
pub(crate) fn dequantize_sum_int4(
    dev: &CudaDevice,
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
) -> Result<Tensor> {
    let n = 2 * (packed.elem_count() / pieces);
    let out = launch::from_slice(CudaStorageSlice::F32(Launch::own(dev).alloc(n)?), dev, n);
    dequantize_sum_int4_at(dev, &Place::Own, packed, scales, pieces, block, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
