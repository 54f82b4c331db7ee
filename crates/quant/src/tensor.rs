//! The quantisers on candle tensors, on whichever device the tensors live: CPU tensors go
//! through the reference code of this crate, CUDA tensors (feature `cuda`) through the kernels
//! of `cuda.rs`, which give the same bits. The engine calls these; it never needs to know where
//! its shards are.
//!
//! Tensors are 1-D and contiguous. Codes and packed nibbles are `DType::U8` (INT8 codes hold the
//! i8 bit patterns; INT4 bytes hold two codes, element 2i in the low nibble); scales are F32.
//!
//! Errors are those of the slice functions, plus `NotVector` / `DType` / `Device` for unfit
//! tensors and, on the GPU, `GpuBlock` for a block size that is not a multiple of 32. Neither
//! path looks for inf / NaN (on the GPU that would need a host synchronisation): a block
//! holding one gets a NaN scale and dequantises to NaN, so the non-finite value survives to
//! the engine's gradient-norm check, which skips the step.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! let x = Tensor::new(&[1.0f32, -0.5, 0.25, 0.0], &Device::Cpu).unwrap();
//! let (q, s) = quant::tensor::quantize_int8(&x, 2).unwrap();
//! assert_eq!(q.to_vec1::<u8>().unwrap(), vec![127, (-64i8) as u8, 127, 0]);
//! let y = quant::tensor::dequantize_int8(&q, &s, 2, DType::F32).unwrap();
//! assert_eq!(y.to_vec1::<f32>().unwrap()[0], 1.0);
//! ```

use candle_core::{DType, Device, Tensor};
use kernels::place::Place;

use crate::int4::check_int4_block;
use crate::QuantError;

type Result<T> = std::result::Result<T, QuantError>;

/// Checks that `t` is a 1-D contiguous tensor of `dtype`.
fn vector(what: &'static str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.rank() != 1 || !t.is_contiguous() {
        return Err(QuantError::NotVector {
            what,
            shape: t.dims().to_vec(),
        });
    }
    if t.dtype() != dtype {
        return Err(QuantError::DType {
            what,
            got: t.dtype(),
            expected: dtype,
        });
    }
    Ok(())
}

/// Checks that `t` lives on `dev`.
fn same_device(what: &'static str, t: &Tensor, dev: &Device) -> Result<()> {
    if t.device().same_device(dev) {
        Ok(())
    } else {
        Err(QuantError::Device {
            what,
            got: t.device().location(),
            expected: dev.location(),
        })
    }
}

/// A device this build has no kernels for.
fn unsupported(what: &'static str, dev: &Device) -> QuantError {
    QuantError::Device {
        what,
        got: dev.location(),
        expected: candle_core::DeviceLocation::Cpu,
    }
}

/// The GPU path's extra rule on the block size (after the slice functions' own checks).
#[cfg(feature = "cuda")]
fn gpu_block(block: usize) -> Result<()> {
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    if !block.is_multiple_of(32) {
        return Err(QuantError::GpuBlock { block });
    }
    Ok(())
}

fn u8_tensor(v: Vec<u8>, dev: &Device) -> Result<Tensor> {
    let n = v.len();
    Ok(Tensor::from_vec(v, n, dev)?)
}

fn f32_tensor(v: Vec<f32>, dev: &Device) -> Result<Tensor> {
    let n = v.len();
    Ok(Tensor::from_vec(v, n, dev)?)
}

/// [`crate::quantize_int8`] on a tensor: x [L] F32 -> (codes [L] U8 holding i8 bits,
/// scales [ceil(L / block)] F32).
pub fn quantize_int8(x: &Tensor, block: usize) -> Result<(Tensor, Tensor)> {
    vector("x", x, DType::F32)?;
    match x.device() {
        Device::Cpu => {
            let (q, s) = crate::quantize_int8(&x.to_vec1::<f32>()?, block)?;
            let q = q.into_iter().map(|c| c as u8).collect();
            Ok((u8_tensor(q, &Device::Cpu)?, f32_tensor(s, &Device::Cpu)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            gpu_block(block)?;
            crate::cuda::quantize_int8(dev, x, block)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("x", d)),
    }
}

/// [`crate::dequantize_int8`] on tensors: codes [L] U8, scales [ceil(L / block)] F32 ->
/// [L] of `dtype` (F32, or BF16: the f32 value rounded to nearest even).
pub fn dequantize_int8(
    codes: &Tensor,
    scales: &Tensor,
    block: usize,
    dtype: DType,
) -> Result<Tensor> {
    vector("codes", codes, DType::U8)?;
    vector("scales", scales, DType::F32)?;
    same_device("scales", scales, codes.device())?;
    if dtype != DType::F32 && dtype != DType::BF16 {
        return Err(QuantError::DType {
            what: "dequantised output",
            got: dtype,
            expected: DType::F32,
        });
    }
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    let nb = codes.elem_count().div_ceil(block);
    if scales.elem_count() != nb {
        return Err(QuantError::BadLength {
            what: "scale count",
            got: scales.elem_count(),
            expected: nb,
        });
    }
    match codes.device() {
        Device::Cpu => {
            let q: Vec<i8> = codes
                .to_vec1::<u8>()?
                .into_iter()
                .map(|b| b as i8)
                .collect();
            let y = crate::dequantize_int8(&q, &scales.to_vec1::<f32>()?, block);
            Ok(f32_tensor(y, &Device::Cpu)?.to_dtype(dtype)?)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            gpu_block(block)?;
            crate::cuda::dequantize_int8(dev, codes, scales, block, dtype)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("codes", d)),
    }
}

/// [`quantize_int8`] of `x` [L] written into a slot of preallocated buffers: the codes into
/// `codes[at..at + L]` (U8) and the scales into `scales[at / block..]` (F32), its kernel on
/// `place` (a gather's job fills its rank's slot, then gathers the rest in place). `at` must be
/// a multiple of `block` (and, on the GPU, of 16).
pub fn quantize_int8_into(
    x: &Tensor,
    block: usize,
    codes: &Tensor,
    scales: &Tensor,
    at: usize,
    place: &Place,
) -> Result<()> {
    vector("x", x, DType::F32)?;
    vector("codes", codes, DType::U8)?;
    vector("scales", scales, DType::F32)?;
    same_device("codes", codes, x.device())?;
    same_device("scales", scales, x.device())?;
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    let n = x.elem_count();
    if !at.is_multiple_of(block) || at + n > codes.elem_count() {
        return Err(QuantError::BadLength {
            what: "codes slot (a whole number of blocks, in range)",
            got: at,
            expected: at.next_multiple_of(block),
        });
    }
    if at / block + n.div_ceil(block) > scales.elem_count() {
        return Err(QuantError::BadLength {
            what: "scales slot",
            got: scales.elem_count(),
            expected: at / block + n.div_ceil(block),
        });
    }
    match x.device() {
        Device::Cpu => {
            let _ = place;
            let (q, s) = quantize_int8(x, block)?;
            codes.slice_set(&q, 0, at)?;
            scales.slice_set(&s, 0, at / block)?;
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            gpu_block(block)?;
            if !at.is_multiple_of(16) {
                return Err(QuantError::BadLength {
                    what: "codes slot (16-byte aligned on the GPU)",
                    got: at,
                    expected: at.next_multiple_of(16),
                });
            }
            crate::cuda::quantize_int8_at(dev, place, x, block, codes, scales, at)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("x", d)),
    }
}

/// [`dequantize_int8`] written into `out` (F32 or BF16, as long as the codes), its kernel on
/// `place`; returns `out` (written in place on the CPU too).
pub fn dequantize_int8_into(
    codes: &Tensor,
    scales: &Tensor,
    block: usize,
    out: &Tensor,
    place: &Place,
) -> Result<Tensor> {
    let dtype = out.dtype();
    if dtype != DType::F32 && dtype != DType::BF16 {
        return Err(QuantError::DType {
            what: "dequantised output",
            got: dtype,
            expected: DType::F32,
        });
    }
    output(
        "dequantised output",
        out,
        dtype,
        codes.elem_count(),
        codes.device(),
    )?;
    match codes.device() {
        Device::Cpu => {
            let _ = place;
            let y = dequantize_int8(codes, scales, block, dtype)?;
            out.slice_set(&y, 0, 0)?;
            Ok(out.clone())
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            vector("codes", codes, DType::U8)?;
            vector("scales", scales, DType::F32)?;
            same_device("scales", scales, codes.device())?;
            gpu_block(block)?;
            if scales.elem_count() != codes.elem_count().div_ceil(block) {
                return Err(QuantError::BadLength {
                    what: "scale count",
                    got: scales.elem_count(),
                    expected: codes.elem_count().div_ceil(block),
                });
            }
            crate::cuda::dequantize_int8_at(dev, place, codes, scales, block, out)?;
            Ok(out.clone())
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("codes", d)),
    }
}

/// [`crate::quantize_int4_swizzled`] on a tensor: x [W * S] F32 -> (packed [W * S / 2] U8,
/// scales [W * S / block] F32), W = nodes * ranks_per_node, S a multiple of `block`.
pub fn quantize_int4_swizzled(
    x: &Tensor,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    quantize_int4_swizzled_on(x, nodes, ranks_per_node, block, &Place::Own)
}

/// [`quantize_int4_swizzled`] with its kernel and outputs on `place` (a job's).
pub fn quantize_int4_swizzled_on(
    x: &Tensor,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
    place: &Place,
) -> Result<(Tensor, Tensor)> {
    vector("x", x, DType::F32)?;
    match x.device() {
        Device::Cpu => {
            let _ = place;
            let (p, s) =
                crate::quantize_int4_swizzled(&x.to_vec1::<f32>()?, nodes, ranks_per_node, block)?;
            Ok((u8_tensor(p, &Device::Cpu)?, f32_tensor(s, &Device::Cpu)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            crate::fused::check_swizzle(x.elem_count(), nodes, ranks_per_node, block)?;
            gpu_block(block)?;
            crate::cuda::quantize_int4_swizzled(dev, place, x, nodes, ranks_per_node, block)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("x", d)),
    }
}

/// Checks the concatenated pieces; returns (P = packed bytes a piece, scales a piece).
fn check_pieces(
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
) -> Result<(usize, usize)> {
    vector("packed", packed, DType::U8)?;
    vector("scales", scales, DType::F32)?;
    same_device("scales", scales, packed.device())?;
    check_int4_block(block)?;
    if pieces == 0 {
        return Err(QuantError::BadLength {
            what: "piece count",
            got: 0,
            expected: 1,
        });
    }
    let (np, ns) = (packed.elem_count(), scales.elem_count());
    if !np.is_multiple_of(pieces) {
        return Err(QuantError::BadLength {
            what: "packed length (a multiple of the piece count)",
            got: np,
            expected: np.next_multiple_of(pieces),
        });
    }
    let p = np / pieces;
    let nb = (2 * p).div_ceil(block);
    if ns != pieces * nb {
        return Err(QuantError::BadLength {
            what: "scale count (pieces x blocks a piece)",
            got: ns,
            expected: pieces * nb,
        });
    }
    Ok((p, nb))
}

/// The pieces of the CPU tensors, as host vectors.
fn host_pieces(
    packed: &Tensor,
    scales: &Tensor,
    p: usize,
    nb: usize,
) -> Result<(Vec<u8>, Vec<f32>, usize, usize)> {
    Ok((packed.to_vec1::<u8>()?, scales.to_vec1::<f32>()?, p, nb))
}

fn split<'a>(
    packed: &'a [u8],
    scales: &'a [f32],
    pieces: usize,
    p: usize,
    nb: usize,
) -> Vec<(&'a [u8], &'a [f32])> {
    (0..pieces)
        .map(|j| (&packed[j * p..(j + 1) * p], &scales[j * nb..(j + 1) * nb]))
        .collect()
}

/// [`crate::dequantize_sum_requantize_int4`] on tensors: `packed` [pieces * P] U8 and `scales`
/// [pieces * ceil(2P / block)] F32 are `pieces` equal pieces concatenated (as an all-to-all
/// receives them); returns the INT4 of their f32 sum (packed [P], scales [ceil(2P / block)]).
pub fn dequantize_sum_requantize_int4(
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    dequantize_sum_requantize_int4_on(packed, scales, pieces, block, &Place::Own)
}

/// [`dequantize_sum_requantize_int4`] with its kernels and outputs on `place` (a job's).
pub fn dequantize_sum_requantize_int4_on(
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
    place: &Place,
) -> Result<(Tensor, Tensor)> {
    let (p, nb) = check_pieces(packed, scales, pieces, block)?;
    match packed.device() {
        Device::Cpu => {
            let _ = place;
            let (hp, hs, p, nb) = host_pieces(packed, scales, p, nb)?;
            let (q, s) =
                crate::dequantize_sum_requantize_int4(&split(&hp, &hs, pieces, p, nb), block)?;
            Ok((u8_tensor(q, &Device::Cpu)?, f32_tensor(s, &Device::Cpu)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            gpu_block(block)?;
            crate::cuda::dequantize_sum_requantize_int4(dev, place, packed, scales, pieces, block)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("packed", d)),
    }
}

/// [`crate::dequantize_sum_int4`] on tensors (pieces concatenated as in
/// [`dequantize_sum_requantize_int4`]): the f32 sum [2P] of the pieces, in piece order, one
/// fused multiply-add a piece after the first (as [`crate::dequantize_sum_int4`]).
pub fn dequantize_sum_int4(
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
) -> Result<Tensor> {
    let (p, nb) = check_pieces(packed, scales, pieces, block)?;
    match packed.device() {
        Device::Cpu => {
            let (hp, hs, p, nb) = host_pieces(packed, scales, p, nb)?;
            let y = crate::dequantize_sum_int4(&split(&hp, &hs, pieces, p, nb), block)?;
            f32_tensor(y, &Device::Cpu)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            gpu_block(block)?;
            crate::cuda::dequantize_sum_int4(dev, packed, scales, pieces, block)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("packed", d)),
    }
}

/// [`dequantize_sum_int4`] written into `out` (F32 [2P] on the pieces' device), its kernel on
/// `place`; returns the sum (`out` itself: written in place on the CPU too).
pub fn dequantize_sum_int4_into(
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
    out: &Tensor,
    place: &Place,
) -> Result<Tensor> {
    let (p, _) = check_pieces(packed, scales, pieces, block)?;
    output("sum", out, DType::F32, 2 * p, packed.device())?;
    match packed.device() {
        Device::Cpu => {
            let _ = place;
            let sum = dequantize_sum_int4(packed, scales, pieces, block)?;
            out.slice_set(&sum, 0, 0)?;
            Ok(out.clone())
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            gpu_block(block)?;
            crate::cuda::dequantize_sum_int4_at(dev, place, packed, scales, pieces, block, out)?;
            Ok(out.clone())
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported("packed", d)),
    }
}

/// Checks that `out` is a 1-D contiguous `dtype` tensor of `len` elements on `dev`.
fn output(what: &'static str, out: &Tensor, dtype: DType, len: usize, dev: &Device) -> Result<()> {
    vector(what, out, dtype)?;
    same_device(what, out, dev)?;
    if out.elem_count() != len {
        return Err(QuantError::BadLength {
            what,
            got: out.elem_count(),
            expected: len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01 * (1 + i % 7) as f32)
            .collect()
    }

    #[test]
    fn cpu_tensors_equal_the_slice_functions() {
        let x = xs(2 * 4 * 64);
        let t = Tensor::new(x.as_slice(), &Device::Cpu).unwrap();

        let (q, s) = quantize_int8(&t, 96).unwrap();
        let (rq, rs) = crate::quantize_int8(&x, 96).unwrap();
        let rq8: Vec<u8> = rq.iter().map(|&c| c as u8).collect();
        assert_eq!(q.to_vec1::<u8>().unwrap(), rq8);
        assert_eq!(s.to_vec1::<f32>().unwrap(), rs);
        let y = dequantize_int8(&q, &s, 96, DType::F32).unwrap();
        assert_eq!(
            y.to_vec1::<f32>().unwrap(),
            crate::dequantize_int8(&rq, &rs, 96)
        );
        let yb = dequantize_int8(&q, &s, 96, DType::BF16).unwrap();
        assert_eq!(yb.dtype(), DType::BF16);

        let (p, s4) = quantize_int4_swizzled(&t, 2, 4, 32).unwrap();
        let (rp, rs4) = crate::quantize_int4_swizzled(&x, 2, 4, 32).unwrap();
        assert_eq!(p.to_vec1::<u8>().unwrap(), rp);
        assert_eq!(s4.to_vec1::<f32>().unwrap(), rs4);

        // The swizzled buffer read as 4 pieces of 128 elements each.
        let pieces = split(&rp, &rs4, 4, 64, 4);
        let (q2, s2) = dequantize_sum_requantize_int4(&p, &s4, 4, 32).unwrap();
        let (rq2, rs2) = crate::dequantize_sum_requantize_int4(&pieces, 32).unwrap();
        assert_eq!(q2.to_vec1::<u8>().unwrap(), rq2);
        assert_eq!(s2.to_vec1::<f32>().unwrap(), rs2);
        let sum = dequantize_sum_int4(&p, &s4, 4, 32).unwrap();
        assert_eq!(
            sum.to_vec1::<f32>().unwrap(),
            crate::dequantize_sum_int4(&pieces, 32).unwrap()
        );
    }

    #[test]
    fn unfit_tensors_are_refused() {
        let t = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(
            quantize_int8(&t, 4),
            Err(QuantError::NotVector { .. })
        ));
        let u = Tensor::zeros(8, DType::U8, &Device::Cpu).unwrap();
        assert!(matches!(
            quantize_int8(&u, 4),
            Err(QuantError::DType { .. })
        ));
        let s = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(
            dequantize_int8(&u, &s, 4, DType::F32),
            Err(QuantError::BadLength { got: 3, .. })
        ));
        assert!(matches!(
            dequantize_sum_int4(&u, &s, 3, 4),
            Err(QuantError::BadLength { .. })
        ));
        assert!(matches!(
            dequantize_sum_int4(&u, &s, 0, 4),
            Err(QuantError::BadLength { got: 0, .. })
        ));
        // Not refused: a non-finite block gets a NaN scale and dequantises to NaN.
        let nan = Tensor::new(&[1.0f32, f32::NAN, -4.0, 4.0], &Device::Cpu).unwrap();
        let (q, s) = quantize_int8(&nan, 2).unwrap();
        let y = dequantize_int8(&q, &s, 2, DType::F32).unwrap();
        let y = y.to_vec1::<f32>().unwrap();
        assert!(y[0].is_nan() && y[1].is_nan(), "{y:?}");
        assert_eq!(&y[2..], &[-4.0, 4.0]);
    }
}
