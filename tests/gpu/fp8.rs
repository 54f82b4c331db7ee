//! The FP8 linear layers on the GPU (issue 40). First fp8.cu's quantisers against
//! `quant::quantize_fp8_e4m3_tiles` bit for bit, codes and scales, each read in the layout
//! cuBLASLt takes, on a matrix with an all-zero tile (signed zeros), a block below torchao's
//! amax floor, a NaN and rows 2^22 apart in magnitude, with sides that are multiples of 16 but
//! not of 128. Then the layers (packed projections with a residual, forward, input and weight
//! gradients, a gradient written into its slot) against the CPU reference of `fp8_linear.rs` on
//! the same bf16 values: rows and columns of different magnitudes, so that a scale read from
//! the wrong block shows. Then the GEMMs at Llama 3.2 1B's shapes beside bf16 (printed:
//! `--nocapture`).
//!
//! Tolerance of the layers: the GPU computes the reference's products of the same codes and
//! scales, in another order of f32 sums, and rounds the output once to bf16 (2^-9 relative):
//! 1e-2 of max |reference|.

use crate::common::{assert_close, gpu, seconds_per_call, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::fp8_gpu::ScaleMode;
use model::layers::{
    fp8_gpu, fp8_linear_cols_backward, fp8_linear_cols_forward, matmul_cols_backward,
    matmul_cols_forward, whole_columns, COL_BLOCK, INPUT_TILE, ROW_BLOCK, WEIGHT_TILE,
};
use model::{Fp8Weight, LinearFormat, LinearWeight, SavedInput};
use quant::Tile;

pub(crate) fn host_u8(t: &Tensor) -> Vec<u8> {
    t.flatten_all()
        .and_then(|t| t.to_device(&Device::Cpu))
        .and_then(|t| t.to_vec1::<u8>())
        .expect("u8 codes")
}

pub(crate) fn host_u32(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .and_then(|t| t.to_device(&Device::Cpu))
        .and_then(|t| t.to_vec1::<u32>())
        .expect("u32 values")
}

pub(crate) fn host_f32(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .and_then(|t| t.to_device(&Device::Cpu))
        .and_then(|t| t.to_vec1::<f32>())
        .expect("f32 scales")
}

/// `v` (rows, cols) rounded to bf16: `(the rounded values, f32 on the CPU, bf16 on the GPU)`.
fn upload(v: Vec<f32>, rows: usize, cols: usize) -> (Vec<f32>, Tensor, Tensor) {
    let b = Tensor::from_vec(v, (rows, cols), &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::BF16))
        .expect("bf16 values");
    let f = b.to_dtype(DType::F32).expect("f32");
    let host = f.flatten_all().and_then(|t| t.to_vec1()).expect("values");
    (host, f, b.to_device(&gpu()).expect("to gpu"))
}

/// The quantisers' input: uniform values, row r scaled by 2^(r % 23 - 11); the first 128 x 128
/// tile zero (every other one -0.0); row 130 at 1e-13 (below the amax floor of 1e-12); a NaN
/// at (rows - 1, cols - 1).
fn hostile(rows: usize, cols: usize, seed: u64) -> (Vec<f32>, Tensor) {
    let mut v = uniform(rows * cols, seed, 1.0);
    for (i, x) in v.iter_mut().enumerate() {
        let (r, c) = (i / cols, i % cols);
        *x *= 2f32.powi((r % 23) as i32 - 11);
        if r < 128 && c < 128 {
            *x = if i % 2 == 0 { 0.0 } else { -0.0 };
        }
        if r == 130 {
            *x = if c % 2 == 0 { 1e-13 } else { -3e-14 };
        }
    }
    v[rows * cols - 1] = f32::NAN;
    let (host, _, g) = upload(v, rows, cols);
    (host, g)
}

fn reference(x: &[f32], rows: usize, cols: usize, tile: Tile) -> (Vec<u8>, Vec<f32>) {
    quant::quantize_fp8_e4m3_tiles(x, rows, cols, tile).expect("the CPU quantiser")
}

pub(crate) fn same_bits(what: &str, got: f32, want: f32) {
    assert_eq!(got.to_bits(), want.to_bits(), "{what}: {got} vs {want}");
}

/// `got (cols, rows)` is the transpose of `want (rows, cols)`, both row-major.
fn same_transposed(what: &str, got: &[u8], want: &[u8], rows: usize, cols: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(
                got[c * rows + r],
                want[r * cols + c],
                "{what} at ({r}, {c})"
            );
        }
    }
}

/// `q` is `x (rows, cols)` in 1 x 128 blocks: codes as x, scales [S blocks][R].
fn check_rows(what: &str, q: &fp8_gpu::Operand, x: &[f32], rows: usize, cols: usize) {
    let (codes, scales) = reference(x, rows, cols, ROW_BLOCK);
    assert_eq!(host_u8(&q.codes), codes, "{what} 1 x 128 codes");
    let (sb, got) = (cols.div_ceil(128), host_f32(&q.scales));
    for r in 0..rows {
        for b in 0..sb {
            same_bits(
                &format!("{what} 1 x 128 scale"),
                got[b * rows + r],
                scales[r * sb + b],
            );
        }
    }
}

/// `q` is `x (rows, cols)` in 128 x 1 blocks: codes of x^T, scales [R blocks][S].
fn check_cols_t(what: &str, q: &fp8_gpu::Operand, x: &[f32], rows: usize, cols: usize) {
    let (codes, scales) = reference(x, rows, cols, COL_BLOCK);
    let w = format!("{what} 128 x 1");
    same_transposed(&w, &host_u8(&q.codes), &codes, rows, cols);
    let got = host_f32(&q.scales);
    assert_eq!(got.len(), scales.len(), "{w} scales");
    for (a, b) in got.iter().zip(&scales) {
        same_bits(&w, *a, *b);
    }
}

/// `q` is `x (rows, cols)` in 128 x 128 tiles as a weight gradient's input: codes of x^T,
/// scales [S blocks][round_up(R blocks, 4)] (x^T's BLK128x128), the padding zeros.
pub(crate) fn check_cols_tiles(
    what: &str,
    q: &fp8_gpu::Operand,
    x: &[f32],
    rows: usize,
    cols: usize,
) {
    assert_eq!(q.mode, ScaleMode::Blk128x128, "{what}: input tiles' mode");
    let (codes, scales) = reference(x, rows, cols, INPUT_TILE);
    let w = format!("{what} 128 x 128 tiles of x^T");
    same_transposed(&w, &host_u8(&q.codes), &codes, rows, cols);
    let (rb, cb) = (rows.div_ceil(128), cols.div_ceil(128));
    let ld = rb.next_multiple_of(4);
    let got = host_f32(&q.scales);
    assert_eq!(got.len(), cb * ld, "{w} scales");
    for c in 0..cb {
        for r in 0..ld {
            match r < rb {
                true => same_bits(&w, got[c * ld + r], scales[r * cb + c]),
                false => assert_eq!(got[c * ld + r].to_bits(), 0, "{w}: padding"),
            }
        }
    }
}

/// `q` is `x (rows, cols)` with one scale a whole column: codes of x^T, scales [S].
pub(crate) fn check_cols_whole(
    what: &str,
    q: &fp8_gpu::Operand,
    x: &[f32],
    rows: usize,
    cols: usize,
) {
    assert_eq!(q.mode, ScaleMode::Outer, "{what}: whole columns' mode");
    let (codes, scales) = reference(x, rows, cols, whole_columns(rows));
    let w = format!("{what} whole columns");
    same_transposed(&w, &host_u8(&q.codes), &codes, rows, cols);
    let got = host_f32(&q.scales);
    assert_eq!(got.len(), cols, "{w} scales");
    for (a, b) in got.iter().zip(&scales) {
        same_bits(&w, *a, *b);
    }
}

#[test]
fn fp8_quantisers_equal_the_cpu_bit_for_bit_in_cublaslt_layouts() {
    for (rows, cols, seed) in [(272, 400, 1), (384, 256, 2), (144, 1040, 3)] {
        let (x, g) = hostile(rows, cols, seed);
        let what = |s: &str| format!("({rows}, {cols}) {s}");

        let q = fp8_gpu::quantize_rows(&g).expect("quantize_rows");
        check_rows(&what(""), &q, &x, rows, cols);
        let q = fp8_gpu::quantize_cols_t(&g).expect("quantize_cols_t");
        check_cols_t(&what(""), &q, &x, rows, cols);
        // A layer's input: x^T in 128 x 128 tiles, alone and beside the row blocks.
        let q = fp8_gpu::quantize_input_cols(&g).expect("quantize_input_cols");
        check_cols_tiles(&what(""), &q, &x, rows, cols);
        let (q, qt) = fp8_gpu::quantize_input(&g).expect("quantize_input");
        check_rows(&what("beside tiles"), &q, &x, rows, cols);
        check_cols_tiles(&what("beside rows"), &qt, &x, rows, cols);
        // Whole columns (down's weight gradient): the absmax pass, then both blockings, and
        // the columns alone from the absmax given.
        let absmax = host_u32(&fp8_gpu::column_absmax(&g).expect("column absmax"));
        for (c, &m) in absmax.iter().enumerate() {
            let want = (0..rows).fold(0u32, |a, r| a.max(x[r * cols + c].abs().to_bits()));
            assert_eq!(m, want, "{}", what(&format!("column {c}'s absmax")));
        }
        let (q, qt) = fp8_gpu::quantize_whole_both(&g, 0, cols).expect("quantize_whole_both");
        check_rows(&what("with whole columns"), &q, &x, rows, cols);
        check_cols_whole(&what(""), &qt, &x, rows, cols);
        let absmax = fp8_gpu::column_absmax(&g).expect("column absmax");
        let qt = fp8_gpu::quantize_cols_whole(&g, &absmax).expect("quantize_cols_whole");
        check_cols_whole(&what("given"), &qt, &x, rows, cols);

        // 128 x 128 tiles: codes both ways, scales in both BLK128x128 layouts.
        let w = fp8_gpu::quantize_weight(&g).expect("quantize_weight");
        let (codes, scales) = reference(&x, rows, cols, WEIGHT_TILE);
        assert_eq!(host_u8(&w.codes.codes), codes, "{}", what("tile codes"));
        same_transposed(
            &what("tile code^T"),
            &host_u8(&w.codes_t.codes),
            &codes,
            rows,
            cols,
        );
        let (ib, ob) = (rows.div_ceil(128), cols.div_ceil(128));
        let (ld_f, ld_b) = (ib.next_multiple_of(4), ob.next_multiple_of(4));
        let (fwd, bwd) = (host_f32(&w.codes_t.scales), host_f32(&w.codes.scales));
        assert_eq!(
            (fwd.len(), bwd.len()),
            (ob * ld_f, ib * ld_b),
            "{}",
            what("tile scales")
        );
        for i in 0..ib {
            for o in 0..ob {
                same_bits(
                    &what("tile scale (w)"),
                    bwd[i * ld_b + o],
                    scales[i * ob + o],
                );
                same_bits(
                    &what("tile scale (w^T)"),
                    fwd[o * ld_f + i],
                    scales[i * ob + o],
                );
            }
        }
        // The padding of each scale row is zeros, written by the kernel itself.
        for o in 0..ob {
            assert!(fwd[o * ld_f + ib..(o + 1) * ld_f]
                .iter()
                .all(|&v| v.to_bits() == 0));
        }
        for i in 0..ib {
            assert!(bwd[i * ld_b + ob..(i + 1) * ld_b]
                .iter()
                .all(|&v| v.to_bits() == 0));
        }
        // The cases the input was built for are there.
        assert!(
            scales[0] > 0.0 && scales[0] < 1e-14,
            "the zero tile's floor scale"
        );
        assert!(scales.last().is_some_and(|s| s.is_nan()), "the NaN tile");
    }
}

/// The backward's quantiser of dout reads a view of columns (one projection of a packed
/// gradient) in both orientations at once, and a matrix whose storage starts off 16 bytes is
/// copied before the kernel's vector loads: each equals the CPU quantiser of those values.
#[test]
fn fp8_quantiser_reads_column_views_and_unaligned_starts() {
    let (rows, cols) = (272, 400);
    let (x, g) = hostile(rows, cols, 4);
    for (col, width) in [(0, 400), (32, 336), (384, 16)] {
        let sub: Vec<f32> = (0..rows)
            .flat_map(|r| x[r * cols + col..r * cols + col + width].to_vec())
            .collect();
        let (q, qt) = fp8_gpu::quantize_both(&g, col, width).expect("quantize_both");
        let what = format!("columns {col}..{}", col + width);
        check_rows(&what, &q, &sub, rows, width);
        check_cols_t(&what, &qt, &sub, rows, width);
    }
    // One element in: a contiguous (rows - 16, cols) matrix starting 2 bytes off 16.
    let n = (rows - 16) * cols;
    let off = g
        .flatten_all()
        .and_then(|t| t.narrow(0, 1, n))
        .and_then(|t| t.reshape((rows - 16, cols)))
        .expect("an offset view");
    let q = fp8_gpu::quantize_rows(&off).expect("rows of an offset view");
    check_rows("offset view", &q, &x[1..1 + n], rows - 16, cols);
    let q = fp8_gpu::quantize_cols_t(&off).expect("columns of an offset view");
    check_cols_t("offset view", &q, &x[1..1 + n], rows - 16, cols);
    let q = fp8_gpu::quantize_input_cols(&off).expect("tiles of an offset view");
    check_cols_tiles("offset view", &q, &x[1..1 + n], rows - 16, cols);
    // The weights' quantiser reads such a start element by element (a weight inside a unit's
    // buffer starts anywhere).
    let w = fp8_gpu::quantize_weight(&off).expect("tiles of an offset view");
    let (codes, _) = reference(&x[1..1 + n], rows - 16, cols, WEIGHT_TILE);
    assert_eq!(host_u8(&w.codes.codes), codes, "offset view: tile codes");
    let t = host_u8(&w.codes_t.codes);
    same_transposed("offset view: tile code^T", &t, &codes, rows - 16, cols);
}

/// FP8 qwZ's gathered weight as the forward reads it (`fp8_transpose_tiles`): the CPU
/// quantiser's codes transposed and its tile scales in w^T's BLK128x128 layout (padding zero),
/// bit for bit: whole tiles, partial ones, rows not a multiple of 16 (byte stores), and codes
/// starting off 16 bytes (byte loads, as a weight inside a gathered unit can).
#[test]
fn fp8_gathered_weights_transpose_bit_for_bit() {
    for (rows, cols, shift) in [(256, 384, 0), (272, 400, 0), (200, 136, 0), (144, 168, 3)] {
        let what = format!("gathered ({rows}, {cols}) at +{shift}");
        let (x, _) = hostile(rows, cols, 9);
        let (codes, scales) = reference(&x, rows, cols, WEIGHT_TILE);
        let (ib, ob) = (rows.div_ceil(128), cols.div_ceil(128));
        let mut buf = vec![0u8; shift];
        buf.extend_from_slice(&codes);
        let g = Tensor::from_vec(buf, shift + rows * cols, &gpu())
            .and_then(|t| t.narrow(0, shift, rows * cols))
            .and_then(|t| t.reshape((rows, cols)))
            .expect("codes on the GPU");
        let s = Tensor::from_vec(scales.clone(), (ib, ob), &gpu()).expect("scales on the GPU");
        let q = Fp8Weight::new(g, s).expect("an FP8 weight");
        let op = fp8_gpu::gathered_transposed(&q).expect("transposed");
        same_transposed(&what, &host_u8(&op.codes), &codes, rows, cols);
        let (got, ld) = (host_f32(&op.scales), ib.next_multiple_of(4));
        assert_eq!(got.len(), ob * ld, "{what}: scales");
        for o in 0..ob {
            for i in 0..ld {
                let want = if i < ib { scales[i * ob + o] } else { 0.0 };
                same_bits(&format!("{what}: scale ({o}, {i})"), got[o * ld + i], want);
            }
        }
    }
}

/// A packed projection's weights quantised in one launch (`fp8_quantize_tiles` of up to four,
/// as the layers quantise q|k|v and gate|up) give the bytes of one launch a weight (the same
/// kernel over one weight, which the CPU test above holds to the reference), both orientations,
/// codes and scales with their padding, bit for bit: weights of different OUT with partial
/// tiles, a zero tile, a NaN. Prints both at Llama 3.2 1B's q|k|v (2048 x 2048, 512, 512).
#[test]
fn fp8_weight_tiles_in_one_launch_equal_one_by_one() {
    let same = |what: &str, a: &fp8_gpu::Operand, b: &fp8_gpu::Operand| {
        assert_eq!(host_u8(&a.codes), host_u8(&b.codes), "{what}: codes");
        let (x, y) = (host_f32(&a.scales), host_f32(&b.scales));
        assert_eq!(x.len(), y.len(), "{what}: scales");
        for (k, (p, q)) in x.iter().zip(&y).enumerate() {
            same_bits(&format!("{what}: scale {k}"), *p, *q);
        }
    };
    let ws: Vec<Tensor> = [(400, 21), (144, 22), (256, 23), (16, 24)]
        .into_iter()
        .map(|(out, seed)| hostile(272, out, seed).1)
        .collect();
    for count in [2, 3, 4] {
        let refs: Vec<&Tensor> = ws[..count].iter().collect();
        let batch = fp8_gpu::quantize_weights(&refs).expect("one launch");
        for (j, (w, got)) in refs.iter().zip(&batch).enumerate() {
            let want = fp8_gpu::quantize_weight(w).expect("one weight");
            let what = format!("weight {j} of {count}");
            same(&format!("{what}, w"), &got.codes, &want.codes);
            same(&format!("{what}, w^T"), &got.codes_t, &want.codes_t);
        }
    }
    // Quantised for both passes: six weights of one IN (two launches), one of another, and
    // one the quantisers do not take (OUT 24, no multiple of 16: left dense), each the bytes of
    // its own launch; w's scales without their padding.
    let mut mixed: Vec<Tensor> = [
        (400, 41),
        (144, 42),
        (256, 43),
        (16, 44),
        (128, 45),
        (32, 46),
    ]
    .into_iter()
    .map(|(out, seed)| hostile(272, out, seed).1)
    .collect();
    mixed.push(hostile(144, 160, 47).1);
    mixed.push(hostile(272, 24, 48).1);
    let both = fp8_gpu::quantize_for_both_passes(&mixed).expect("both passes");
    assert!(both[7].is_none(), "a weight of OUT 24 is no FP8 operand");
    for (j, (w, got)) in mixed.iter().zip(&both).take(7).enumerate() {
        let got = got.as_ref().expect("a weight the quantisers take");
        let want = fp8_gpu::quantize_weight(w).expect("one weight");
        let what = format!("weight {j}, both passes");
        let t = got.transposed().expect("w^T's codes");
        let t = fp8_gpu::Operand {
            codes: t.codes.clone(),
            scales: t.scales.clone(),
            mode: want.codes_t.mode,
        };
        same(&format!("{what}, w^T"), &t, &want.codes_t);
        assert_eq!(
            host_u8(got.codes()),
            host_u8(&want.codes.codes),
            "{what}: codes"
        );
        let (ob, padded) = (
            w.dim(1).unwrap().div_ceil(128),
            host_f32(&want.codes.scales),
        );
        let ld = ob.next_multiple_of(4);
        let unpadded = padded.chunks(ld).flat_map(|r| r[..ob].to_vec());
        let scales = host_f32(&got.scales().contiguous().expect("scales"));
        assert_eq!(scales.len(), padded.len() / ld * ob, "{what}: scales");
        for (k, (a, b)) in scales.iter().zip(unpadded).enumerate() {
            same_bits(&format!("{what}: scale {k}"), *a, b);
        }
    }
    let dev = gpu();
    let qkv: Vec<Tensor> = [(2048, 31), (512, 32), (512, 33)]
        .into_iter()
        .map(|(out, seed)| spread(2048, out, seed).1)
        .collect();
    let refs: Vec<&Tensor> = qkv.iter().collect();
    let one_by_one = seconds_per_call(&dev, &|| {
        for w in &refs {
            fp8_gpu::quantize_weight(w).expect("one weight");
        }
    });
    let together = seconds_per_call(&dev, &|| {
        fp8_gpu::quantize_weights(&refs).expect("one launch");
    });
    let bytes = 4.0 * (2048 * 3072) as f64;
    println!(
        "q|k|v weight tiles at Llama 3.2 1B's shapes, both orientations: three launches {:.1} us \
         ({:.0} GB/s), one {:.1} us ({:.0} GB/s)",
        one_by_one * 1e6,
        bytes / one_by_one / 1e9,
        together * 1e6,
        bytes / together / 1e9
    );
}

/// Uniform values, row r scaled by 2^(r % 5 - 2) and column c by 2^(c % 3).
pub(crate) fn spread(rows: usize, cols: usize, seed: u64) -> (Tensor, Tensor) {
    let v: Vec<f32> = uniform(rows * cols, seed, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, x)| x * 2f32.powi((i / cols % 5) as i32 - 2 + (i % cols % 3) as i32))
        .collect();
    let (_, cpu, g) = upload(v, rows, cols);
    (cpu, g)
}

#[test]
fn fp8_linear_layers_match_the_cpu_reference() {
    // Every side a multiple of 128 first, then of 16 only (tokens, IN and OUT 144).
    layers_check(256, 384, &[128, 256]);
    layers_check(272, 400, &[144, 256]);
}

/// `n` tokens of `inp` through packed weights of `outs` columns, with a residual, forward and
/// backward, the first weight's gradient written into a slot.
fn layers_check(n: usize, inp: usize, outs: &[usize]) {
    let what = |s: &str| format!("({n} x {inp} -> {outs:?}) {s}");
    let total: usize = outs.iter().sum();
    let (x_c, x_g) = spread(n, inp, 10);
    let (r_c, r_g) = spread(n, total, 11);
    let (d_c, d_g) = spread(n, total, 12);
    let (mut ws_c, mut ws_g) = (vec![], vec![]);
    for (i, &out) in outs.iter().enumerate() {
        let (c, g) = spread(inp, out, 20 + i as u64);
        ws_c.push(c);
        ws_g.push(g);
    }

    let y_c = fp8_linear_cols_forward(&x_c, &ws_c, Some(&r_c)).expect("CPU forward");
    let y_g = fp8_linear_cols_forward(&x_g, &ws_g, Some(&r_g)).expect("GPU forward");
    assert_eq!(y_g.dtype(), DType::BF16);
    assert_close(&what("forward"), &y_g, &y_c, 1e-2);
    // Without the residual, each weight's columns on their own.
    let y_c = fp8_linear_cols_forward(&x_c, &ws_c, None).expect("CPU forward");
    let y_g = fp8_linear_cols_forward(&x_g, &ws_g, None).expect("GPU forward");
    let mut off = 0;
    for (i, &out) in outs.iter().enumerate() {
        let part = |t: &Tensor| t.narrow(1, off, out).expect("columns");
        assert_close(
            &what(&format!("forward, weight {i}")),
            &part(&y_g),
            &part(&y_c),
            1e-2,
        );
        off += out;
    }

    let none = vec![None; outs.len()];
    let (dx_c, dws_c) = fp8_linear_cols_backward(&d_c, &x_c, &ws_c, &none).expect("CPU backward");
    let slot = Tensor::zeros((inp, outs[0]), DType::BF16, &gpu()).expect("slot");
    let mut into = none.clone();
    into[0] = Some(slot.clone());
    let (dx_g, dws_g) = fp8_linear_cols_backward(&d_g, &x_g, &ws_g, &into).expect("GPU backward");
    assert_close(&what("dx"), &dx_g, &dx_c, 1e-2);
    for (i, (g, c)) in dws_g.iter().zip(&dws_c).enumerate() {
        assert_close(&what(&format!("dw {i}")), g, c, 1e-2);
    }
    assert_close(&what("dw 0 in its slot"), &slot, &dws_c[0], 1e-2);
    gathered_weights_check(&what("gathered"), &x_g, &d_g, &ws_g);
}

/// FP8 qwZ's form of the weights (codes and tile scales as gathered, which are
/// `quant::quantize_fp8_e4m3_tiles` of each weight: `Fp8Weight::quantize` here) gives the same
/// bf16 outputs and gradients bit for bit as the bf16 weights quantised in the layer.
fn gathered_weights_check(what: &str, x: &Tensor, dout: &Tensor, ws: &[Tensor]) {
    let fp8 = LinearFormat::Fp8;
    let dense: Vec<LinearWeight> = ws.iter().cloned().map(LinearWeight::Dense).collect();
    let gathered: Vec<LinearWeight> = ws
        .iter()
        .map(|w| {
            let host = w.to_device(&Device::Cpu).expect("to host");
            let q = Fp8Weight::quantize(&host).expect("tiles");
            let on_gpu = |t: &Tensor| t.to_device(&gpu()).expect("to gpu");
            let q = Fp8Weight::new(on_gpu(q.codes()), on_gpu(q.scales())).expect("FP8 weight");
            LinearWeight::Fp8(q)
        })
        .collect();
    let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    let y = fp8.cols_forward(x, &dense, None, None).expect("forward");
    let y_q = fp8
        .cols_forward(x, &gathered, None, None)
        .expect("forward, gathered");
    assert_eq!(bits(&y_q), bits(&y), "{what}: forward");
    // Quantised once for both passes (a walk that keeps its weights from the forward for the
    // backward): the forward reads w^T's codes as they were made, the backward w's.
    let both: Vec<Fp8Weight> = fp8_gpu::quantize_for_both_passes(ws)
        .expect("both passes")
        .into_iter()
        .map(|w| w.expect("a weight the quantisers take"))
        .collect();
    assert!(both.iter().all(|w| w.transposed().is_some()));
    let once: Vec<LinearWeight> = both.iter().cloned().map(LinearWeight::Fp8).collect();
    let y_o = fp8
        .cols_forward(x, &once, None, None)
        .expect("forward, once");
    assert_eq!(bits(&y_o), bits(&y), "{what}: forward, quantised once");
    let none = vec![None; ws.len()];
    let xs = SavedInput::Dense(x.clone());
    let (dx, dws) = fp8
        .cols_backward(dout, &xs, &dense, &none)
        .expect("backward");
    let (dx_q, dws_q) = fp8
        .cols_backward(dout, &xs, &gathered, &none)
        .expect("backward, gathered");
    assert_eq!(bits(&dx_q), bits(&dx), "{what}: dx");
    for (a, b) in dws_q.iter().zip(&dws) {
        assert_eq!(bits(a), bits(b), "{what}: dw");
    }
    let backward: Vec<LinearWeight> = both
        .into_iter()
        .map(|w| LinearWeight::Fp8(w.without_transposed()))
        .collect();
    let (dx_o, dws_o) = fp8
        .cols_backward(dout, &xs, &backward, &none)
        .expect("backward, quantised once");
    assert_eq!(bits(&dx_o), bits(&dx), "{what}: dx, quantised once");
    for (a, b) in dws_o.iter().zip(&dws) {
        assert_eq!(bits(a), bits(b), "{what}: dw, quantised once");
    }
    // The forward that keeps x's column blocks (one read of x for both) gives the same output,
    // and the backward from what it kept the same gradients, bit for bit; the codes it keeps
    // are a byte an element.
    let (y_s, kept) = fp8
        .cols_forward_saving(x, &dense, None, None)
        .expect("forward, saving");
    assert_eq!(bits(&y_s), bits(&y), "{what}: forward, saving");
    let kept_again = fp8.saved_input(x).expect("saved input alone");
    for kept in [&kept, &kept_again] {
        let (dx_s, dws_s) = fp8
            .cols_backward(dout, kept, &dense, &none)
            .expect("backward, saved");
        assert_eq!(bits(&dx_s), bits(&dx), "{what}: dx, saved");
        for (a, b) in dws_s.iter().zip(&dws) {
            assert_eq!(bits(a), bits(b), "{what}: dw, saved");
        }
    }
    match &kept {
        SavedInput::Fp8(k) => assert_eq!(k.dims(), x.dims2().expect("x (N, IN)")),
        SavedInput::Dense(_) => panic!("{what}: FP8 kept x itself"),
    }
}

/// Llama 3.2 1B's projections at 8 sequences of 2048 tokens: each forward and backward in FP8
/// (quantisers included) beside bf16, and the FP8 GEMMs alone. Printed, not asserted (speed is
/// the benchmarks' to check): `gpu-tests fp8_gemms --nocapture`.
#[test]
fn fp8_gemms_at_llama_1b_shapes_beside_bf16() {
    let dev = gpu();
    let n = 8 * 2048;
    let shapes: [(&str, usize, &[usize]); 4] = [
        ("qkv", 2048, &[2048, 512, 512]),
        ("o", 2048, &[2048]),
        ("gate|up", 2048, &[8192, 8192]),
        ("down", 8192, &[2048]),
    ];
    println!(
        "{:<8} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8} {:>14}",
        "proj", "bf16 fwd", "fp8 fwd", "ratio", "bf16 bwd", "fp8 bwd", "ratio", "fp8 GEMM fwd"
    );
    for (name, inp, outs) in shapes {
        let x = crate::common::randn_bf16(&dev, &[n, inp], 1.0);
        let ws: Vec<Tensor> = outs
            .iter()
            .map(|&o| crate::common::randn_bf16(&dev, &[inp, o], 0.02))
            .collect();
        let total: usize = outs.iter().sum();
        let dout = crate::common::randn_bf16(&dev, &[n, total], 1.0);
        let none: Vec<Option<Tensor>> = vec![None; ws.len()];
        let flops = 2.0 * (n * inp * total) as f64;
        let tf = |s: f64, f: f64| f / s / 1e12;
        let bf16_f = seconds_per_call(&dev, &|| {
            matmul_cols_forward(&x, &ws, None).expect("bf16 forward");
        });
        let fp8_f = seconds_per_call(&dev, &|| {
            fp8_linear_cols_forward(&x, &ws, None).expect("fp8 forward");
        });
        let bf16_b = seconds_per_call(&dev, &|| {
            matmul_cols_backward(&dout, &x, &ws, &none).expect("bf16 backward");
        });
        let fp8_b = seconds_per_call(&dev, &|| {
            fp8_linear_cols_backward(&dout, &x, &ws, &none).expect("fp8 backward");
        });
        // The GEMMs alone, on operands quantised once.
        let xq = fp8_gpu::quantize_rows(&x).expect("x codes");
        let wqs: Vec<_> = ws
            .iter()
            .map(|w| fp8_gpu::quantize_weight(w).expect("w codes"))
            .collect();
        let cuda = match &dev {
            Device::Cuda(d) => d.clone(),
            _ => unreachable!("gpu() is CUDA"),
        };
        let y = Tensor::zeros((n, total), DType::BF16, &dev).expect("y");
        let py = kernels::place::address(&y).expect("y address");
        let gemm_f = seconds_per_call(&dev, &|| {
            let mut off = 0u64;
            for (w, &o) in wqs.iter().zip(outs) {
                fp8_gpu::gemm_tn(
                    &cuda,
                    &w.codes_t,
                    &xq,
                    (o, n, inp),
                    py + 2 * off,
                    total,
                    None,
                )
                .expect("fp8 GEMM");
                off += o as u64;
            }
        });
        println!(
            "{name:<8} {:>7.3} ms {:>7.3} ms {:>7.2}x {:>7.3} ms {:>7.3} ms {:>7.2}x {:>7.3} ms ({:.0} TFLOP/s; bf16 {:.0})",
            bf16_f * 1e3,
            fp8_f * 1e3,
            bf16_f / fp8_f,
            bf16_b * 1e3,
            fp8_b * 1e3,
            bf16_b / fp8_b,
            gemm_f * 1e3,
            tf(gemm_f, flops),
            tf(bf16_f, flops),
        );
        // The quantisers alone, in GB/s of bf16 read and codes written (scales left out): x's
        // row blocks (the forward), dout both ways in one read (the backward), the weights'
        // tiles both ways.
        let rows_s = seconds_per_call(&dev, &|| {
            fp8_gpu::quantize_rows(&x).expect("x codes");
        });
        let both_s = seconds_per_call(&dev, &|| {
            let mut off = 0;
            for &o in outs {
                fp8_gpu::quantize_both(&dout, off, o).expect("dout codes");
                off += o;
            }
        });
        let tiles_s = seconds_per_call(&dev, &|| {
            for w in &ws {
                fp8_gpu::quantize_weight(w).expect("w codes");
            }
        });
        let gbs = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
        println!(
            "{:<8} quantisers: x rows {:.0} GB/s ({:.3} ms), dout both {:.0} GB/s ({:.3} ms), w tiles {:.0} GB/s ({:.3} ms)",
            "",
            gbs(3 * n * inp, rows_s),
            rows_s * 1e3,
            gbs(4 * n * total, both_s),
            both_s * 1e3,
            gbs(4 * inp * total, tiles_s),
            tiles_s * 1e3,
        );
    }
}
