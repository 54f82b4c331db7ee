//! FP8's casts fused into the kernels that make their tensors (SwiGLU's output and gradient,
//! the norms' outputs, GELU's output and gradient), and the codes a block keeps for its backward (issue
//! 40), on the GPU: each against the unfused path (the bf16 tensor, then `quantize_both` or
//! the plain FP8 layer), bit for bit, on whole and partial tiles, and through the layers that
//! use them, forward and backward.

use crate::common::{assert_close, gpu, seconds_per_call};
use crate::fp8::{host_f32, host_u32, host_u8, same_bits, spread};
use candle_core::{DType, Tensor};
use model::layers::{
    add_rmsnorm_forward, fp8_gpu, gelu_backward_bias_grad, gelu_forward, layernorm_forward,
    rmsnorm_forward, swiglu_packed_backward, swiglu_packed_forward,
};
use model::{LinearFormat, LinearWeight, SavedInput};

/// Two operands hold the same codes and scales, bit for bit.
fn same_operand(what: &str, got: &fp8_gpu::Operand, want: &fp8_gpu::Operand) {
    assert_eq!(got.mode, want.mode, "{what}: scale mode");
    assert_eq!(host_u8(&got.codes), host_u8(&want.codes), "{what}: codes");
    let (g, w) = (host_f32(&got.scales), host_f32(&want.scales));
    assert_eq!(g.len(), w.len(), "{what}: scales");
    for (a, b) in g.iter().zip(&w) {
        same_bits(&format!("{what}: scale"), *a, *b);
    }
}

/// Two bias gradients (bf16 column sums of the same matrix, added in different orders) agree
/// within a bf16 rounding each: 1/64 of the value, and 1e-3 of the largest for sums that cancel.
fn close_bias_grads(what: &str, got: &Tensor, want: &Tensor) {
    let f32s = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    let (g, w) = (f32s(got), f32s(want));
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let tol = b.abs() / 64.0 + 1e-3 * scale;
        assert!(
            (a - b).abs() <= tol,
            "{what}: bias gradient [{i}] {a} against {b}"
        );
    }
}

/// SwiGLU straight into FP8 (`fp8_quantize_swiglu`, `fp8_quantize_swiglu_grad`): the codes and
/// scales that `quantize_both` makes of the bf16 act and dgu of swiglu.cu, bit for bit, on
/// whole and partial tiles; act's columns' absmax those of `column_absmax`, and act^T's codes
/// with whole columns' scales (down's weight gradient) those of `quantize_cols_whole`; and
/// through the layers the down projection's output bit for bit that of the bf16 act, and the
/// MLP's backward (`LinearFormat::swiglu_mlp_backward`) against the CPU reference.
#[test]
fn fp8_swiglu_quantisers_equal_the_unfused_path_bit_for_bit() {
    let fp8 = LinearFormat::Fp8;
    for (n, f, c) in [(256, 384, 128), (272, 384, 144), (272, 400, 144)] {
        let what = format!("SwiGLU ({n}, {f})");
        let (gu_c, gu) = spread(n, 2 * f, 31);
        let (dact_c, dact) = spread(n, f, 32);
        let act = swiglu_packed_forward(&gu).expect("swiglu forward");
        let (q, _) = fp8_gpu::quantize_both(&act, 0, f).expect("act both ways");
        let absmax_u = fp8_gpu::column_absmax(&act).expect("act's absmax");
        let (fq, absmax) = fp8_gpu::fused::quantize_swiglu(&gu, true)
            .expect("fused forward")
            .expect("a shape the kernel takes");
        same_operand(
            &format!("{what}: act rows"),
            &fq.expect("asked for rows"),
            &q,
        );
        assert_eq!(
            host_u32(&absmax),
            host_u32(&absmax_u),
            "{what}: act's absmax"
        );
        let act_t = fp8_gpu::quantize_cols_whole(&act, &absmax).expect("act^T, whole columns");
        let dgu = swiglu_packed_backward(&dact, &gu).expect("swiglu backward");
        // dgu (N, 2F) as one matrix: the kernel takes F a multiple of 128 (no block across the
        // halves) and leaves the rest to the unfused path.
        let fused = fp8_gpu::fused::quantize_swiglu_grad(&dact, &gu, Some(&absmax))
            .expect("fused backward");
        match f % 128 {
            0 => {
                let fused = fused.expect("a shape the kernel takes");
                let (rows, cols) = &fused.dgu;
                let (q, qt) = fp8_gpu::quantize_both(&dgu, 0, 2 * f).expect("dgu both ways");
                same_operand(&format!("{what}: dgu rows"), rows, &q);
                same_operand(&format!("{what}: dgu columns"), cols, &qt);
                let fused_act = fused.act_t.expect("asked for act^T");
                same_operand(&format!("{what}: act^T"), &fused_act, &act_t);
            }
            _ => assert!(fused.is_none(), "{what}: F not a multiple of 128 was taken"),
        }
        // Through the layers: down (F, C) with a residual, gate and up (C, F) from x (N, C).
        let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
        let (w_down_c, w_down) = spread(f, c, 33);
        let (_, res) = spread(n, c, 34);
        let (w_down_c, w_down) = (LinearWeight::Dense(w_down_c), LinearWeight::Dense(w_down));
        let (y, kept) = fp8
            .swiglu_down_forward(&gu, &w_down, Some(&res), true)
            .expect("fused down forward");
        let y_u = fp8
            .cols_forward(&act, std::slice::from_ref(&w_down), None, Some(&res))
            .expect("down forward");
        assert_eq!(
            bits(&y.expect("asked for the output")),
            bits(&y_u),
            "{what}: down output"
        );
        let (_, kept_again) = fp8
            .swiglu_down_forward(&gu, &w_down, None, false)
            .expect("act's columns alone");
        let (dout_c, dout) = spread(n, c, 35);
        let (x_c, x) = spread(n, c, 36);
        let (gate_up_c, gate_up) = spread(c, 2 * f, 37);
        let (gate_up_c, gate_up) = (
            [LinearWeight::Dense(gate_up_c)],
            [LinearWeight::Dense(gate_up)],
        );
        let x_kept = fp8.saved_input(&x).expect("x's column blocks");
        let slot = Tensor::zeros((f, c), DType::BF16, &gpu()).expect("slot");
        let mut outs = vec![];
        for (i, kept) in [&kept, &kept_again].into_iter().enumerate() {
            let into = (i == 0).then_some(&slot);
            let out = fp8
                .swiglu_mlp_backward(
                    &dout,
                    &gu,
                    (kept, &x_kept),
                    (&w_down, &gate_up),
                    (into, &[None]),
                )
                .expect("MLP backward");
            outs.push(out);
        }
        let (dn2, dw_down, dws) = &outs[0];
        assert_eq!(bits(&slot), bits(dw_down), "{what}: dw_down in its slot");
        let (dn2_again, dw_down_again, dws_again) = &outs[1];
        assert_eq!(bits(dn2), bits(dn2_again), "{what}: dn2, kept again");
        assert_eq!(
            bits(dw_down),
            bits(dw_down_again),
            "{what}: dw_down, kept again"
        );
        assert_eq!(
            bits(&dws[0]),
            bits(&dws_again[0]),
            "{what}: dw_gate_up, kept again"
        );
        // The CPU reference: the same recipe on the same values, in f32. The GPU rounds dact
        // and dgu to bf16 before their FP8 rounding and the CPU does not, so a code here and
        // there differs by one step (1/16 of its value at most) and the errors chain through
        // two GEMMs into dn2: 4e-2 of the largest (2.1e-2 measured on an H100).
        let (_, kept_c) = fp8
            .swiglu_down_forward(&gu_c, &w_down_c, None, false)
            .expect("CPU forward");
        let x_kept_c = fp8.saved_input(&x_c).expect("CPU x's blocks");
        let (dn2_c, dw_down_c, dws_c) = fp8
            .swiglu_mlp_backward(
                &dout_c,
                &gu_c,
                (&kept_c, &x_kept_c),
                (&w_down_c, &gate_up_c),
                (None, &[None]),
            )
            .expect("CPU MLP backward");
        assert_close(&format!("{what}: dn2"), dn2, &dn2_c, 4e-2);
        assert_close(&format!("{what}: dw_down"), dw_down, &dw_down_c, 4e-2);
        assert_close(&format!("{what}: dw_gate_up"), &dws[0], &dws_c[0], 4e-2);
        let _ = dact_c;
    }
}

/// RMSNorm straight into FP8 (`fp8_quantize_rmsnorm` after the norm's kernel without its
/// output): the codes and scales that `quantize_input` makes of the bf16 rows rmsnorm.cu writes,
/// bit for bit, on whole and partial tiles; and through the layers
/// (`LinearFormat::rmsnorm_cols_forward_saving`, with and without the residual add, with a
/// bias) the norm's h and statistics, the projections' output and the backward from what they
/// kept, bit for bit those of the norm then the FP8 layers. Prints both paths' time at Llama
/// 3.2 1B's norm (16,384 x 2048).
#[test]
fn fp8_rmsnorm_quantiser_equals_the_unfused_path_bit_for_bit() {
    let fp8 = LinearFormat::Fp8;
    let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    for (n, c, o) in [(256, 2048, 384), (272, 144, 416)] {
        let what = format!("RMSNorm ({n}, {c})");
        let (_, x) = spread(n, c, 51);
        let (_, delta) = spread(n, c, 52);
        let w = spread(1, c, 53).1.reshape(c).expect("norm weight (C)");
        let (h, normed, rms) = add_rmsnorm_forward(&x, &delta, &w, 1e-5).expect("norm");
        let (q, qt) = fp8_gpu::quantize_input(&normed).expect("n both ways");
        let (fq, fqt) = fp8_gpu::fused::quantize_rmsnorm(&h, &rms.rstd, &w)
            .expect("fused quantiser")
            .expect("a shape the kernel takes");
        same_operand(&format!("{what}: rows"), &fq, &q);
        same_operand(&format!("{what}: columns"), &fqt, &qt);
        // Through the layers: two projections (C, O / 2 + 16) and (C, O / 2 - 16), a bias.
        let ws: Vec<LinearWeight> = [(54, o / 2 + 16), (55, o / 2 - 16)]
            .into_iter()
            .map(|(seed, out)| LinearWeight::Dense(spread(c, out, seed).1))
            .collect();
        let b = spread(1, o, 56).1.reshape(o).expect("bias (O)");
        let (_, dout) = spread(n, o, 57);
        let none = [None, None];
        for delta in [None, Some(&delta)] {
            let what = format!("{what}, residual add {}", delta.is_some());
            let fused = fp8
                .rmsnorm_cols_forward_saving(&x, delta, &w, 1e-5, &ws, Some(&b))
                .expect("fused norm and projections");
            let (h_u, n_u, rms_u) = match delta {
                Some(d) => add_rmsnorm_forward(&x, d, &w, 1e-5).expect("norm"),
                None => {
                    let (n_u, rms_u) = rmsnorm_forward(&x, &w, 1e-5).expect("norm");
                    (x.clone(), n_u, rms_u)
                }
            };
            let (y_u, kept_u) = fp8
                .cols_forward_saving(&n_u, &ws, Some(&b), None)
                .expect("projections");
            assert_eq!(bits(&fused.h), bits(&h_u), "{what}: h");
            assert_eq!(
                host_f32(&fused.rms.rstd),
                host_f32(&rms_u.rstd),
                "{what}: rstd"
            );
            assert_eq!(bits(&fused.y), bits(&y_u), "{what}: output");
            let (dn, dws) = fp8
                .cols_backward(&dout, &fused.n, &ws, &none)
                .expect("backward from the fused codes");
            let (dn_u, dws_u) = fp8
                .cols_backward(&dout, &kept_u, &ws, &none)
                .expect("backward, unfused");
            assert_eq!(bits(&dn), bits(&dn_u), "{what}: dn");
            for (a, b) in dws.iter().zip(&dws_u) {
                assert_eq!(bits(a), bits(b), "{what}: dw");
            }
        }
    }
    // Llama 3.2 1B's second norm (the residual add in it) at 16,384 tokens: the norm writing n
    // then quantise_both of it, against the norm's statistics then the fused quantiser.
    let (n, c) = (16_384, 2048);
    let dev = gpu();
    let (_, x) = spread(n, c, 58);
    let (_, delta) = spread(n, c, 59);
    let w = spread(1, c, 60).1.reshape(c).expect("norm weight (C)");
    let unfused = seconds_per_call(&dev, &|| {
        let (_, normed, _) = add_rmsnorm_forward(&x, &delta, &w, 1e-5).expect("norm");
        fp8_gpu::quantize_input(&normed).expect("n both ways");
    });
    let (h, _, rms) = add_rmsnorm_forward(&x, &delta, &w, 1e-5).expect("norm");
    let quantiser = seconds_per_call(&dev, &|| {
        fp8_gpu::fused::quantize_rmsnorm(&h, &rms.rstd, &w)
            .expect("fused quantiser")
            .expect("a shape the kernel takes");
    });
    let ws = [LinearWeight::Dense(spread(c, 128, 61).1)];
    let through = seconds_per_call(&dev, &|| {
        LinearFormat::Fp8
            .rmsnorm_cols_forward_saving(&x, Some(&delta), &w, 1e-5, &ws, None)
            .expect("fused");
    });
    println!(
        "RMSNorm into FP8 at ({n}, {c}): norm then quantise_both {:.3} ms; fused quantiser \
         alone {:.3} ms ({:.2} TB/s of h read and codes written); norm's statistics, quantiser \
         and a (C, 128) projection {:.3} ms",
        unfused * 1e3,
        quantiser * 1e3,
        (4 * n * c) as f64 / quantiser / 1e12,
        through * 1e3
    );
}

/// LayerNorm straight into FP8 (`fp8_quantize_layernorm` after the norm's kernel without its
/// output): the codes and scales that `quantize_input` makes of the bf16 rows layernorm.cu
/// writes, bit for bit, on whole and partial tiles; and through GPT-2's layers
/// (`LinearFormat::layernorm_linear_forward`, `layernorm_gelu_forward`) the norm's statistics,
/// the layer's output (and GELU's), and the backward from what it kept, bit for bit those of
/// the norm then the FP8 layer.
#[test]
fn fp8_layernorm_quantiser_equals_the_unfused_path_bit_for_bit() {
    let fp8 = LinearFormat::Fp8;
    let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    for (n, c, o) in [(256, 1024, 384), (272, 144, 416)] {
        let what = format!("LayerNorm ({n}, {c})");
        let (_, x) = spread(n, c, 71);
        let w = spread(1, c, 72).1.reshape(c).expect("norm weight (C)");
        let b = spread(1, c, 73).1.reshape(c).expect("norm bias (C)");
        let (normed, ln) = layernorm_forward(&x, &w, &b).expect("norm");
        let (q, qt) = fp8_gpu::quantize_input(&normed).expect("n both ways");
        let (fq, fqt) = fp8_gpu::fused::quantize_layernorm(&x, &ln.mean, &ln.rstd, &w, &b)
            .expect("fused quantiser")
            .expect("a shape the kernel takes");
        same_operand(&format!("{what}: rows"), &fq, &q);
        same_operand(&format!("{what}: columns"), &fqt, &qt);
        let lw = LinearWeight::Dense(spread(c, o, 74).1);
        let bias = spread(1, o, 75).1.reshape(o).expect("bias (O)");
        let (_, dout) = spread(n, o, 76);
        let slot = [None];
        let ws = std::slice::from_ref(&lw);
        let check_backward = |what: &str, kept: &SavedInput, kept_u: &SavedInput| {
            let (dn, dw) = fp8.cols_backward(&dout, kept, ws, &slot).expect("backward");
            let (dn_u, dw_u) = fp8
                .cols_backward(&dout, kept_u, ws, &slot)
                .expect("unfused");
            assert_eq!(bits(&dn), bits(&dn_u), "{what}: dn");
            assert_eq!(bits(&dw[0]), bits(&dw_u[0]), "{what}: dw");
        };
        let (saved, y, kept) = fp8
            .layernorm_linear_forward(&x, (&w, &b), &lw, &bias)
            .expect("fused norm and layer");
        let (y_u, kept_u) = fp8.forward(&normed, &lw, &bias).expect("layer");
        assert_eq!(host_f32(&saved.mean), host_f32(&ln.mean), "{what}: mean");
        assert_eq!(host_f32(&saved.rstd), host_f32(&ln.rstd), "{what}: rstd");
        assert_eq!(bits(&y), bits(&y_u), "{what}: output");
        check_backward(&what, &kept, &kept_u);
        let (_, h, g, kept) = fp8
            .layernorm_gelu_forward(&x, (&w, &b), &lw, &bias)
            .expect("fused norm, layer and GELU");
        let (h_u, g_u, kept_u) = fp8.gelu_forward(&normed, &lw, &bias).expect("layer, GELU");
        assert_eq!(bits(&h), bits(&h_u), "{what}: h");
        assert_eq!(bits(&g), bits(&g_u), "{what}: gelu(h)");
        check_backward(&format!("{what}, GELU"), &kept, &kept_u);
    }
}

/// GELU straight into FP8 after an FP8 layer (`fp8_quantize_gelu`): the codes and scales of
/// `gelu(h)` are those `gelu_forward` then `quantize_input` make, bit for bit; and GPT-2's MLP
/// through the layers (`LinearFormat::layernorm_mlp_forward`, with and without c_proj's
/// output) gives the bits of the norm, c_fc and GELU, then c_proj, in bf16 between them: h,
/// the output, and the backward from what c_fc and c_proj kept.
#[test]
fn fp8_gelu_quantiser_equals_the_unfused_path_bit_for_bit() {
    let fp8 = LinearFormat::Fp8;
    let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    for (n, c) in [(256, 256), (272, 144)] {
        let f = 4 * c;
        let what = format!("GELU ({n}, {f})");
        let (_, h) = spread(n, f, 81);
        let bias = spread(1, f, 82).1.reshape(f).expect("bias (F)");
        let g = gelu_forward(&h).expect("unfused");
        let (q, qt) = fp8_gpu::quantize_input(&g).expect("g both ways");
        let (fq, fqt) = fp8_gpu::fused::quantize_gelu(&h, true)
            .expect("fused quantiser")
            .expect("a shape the kernel takes");
        same_operand(&format!("{what}: rows"), &fq.expect("asked for rows"), &q);
        same_operand(&format!("{what}: columns"), &fqt, &qt);
        // GPT-2's MLP: ln_2 (C), c_fc (C, F), c_proj (F, C), the residual x (N, C).
        let (_, x) = spread(n, c, 83);
        let ln = (
            &spread(1, c, 84).1.reshape(c).expect("ln weight"),
            &spread(1, c, 85).1.reshape(c).expect("ln bias"),
        );
        let fc = (LinearWeight::Dense(spread(c, f, 86).1), bias.clone());
        let proj_b = spread(1, c, 87).1.reshape(c).expect("c_proj bias");
        let proj = (LinearWeight::Dense(spread(f, c, 88).1), proj_b);
        let (_, dout) = spread(n, c, 89);
        let (_, dh) = spread(n, f, 90);
        for want_out in [true, false] {
            let what = format!("{what}, output {want_out}");
            let mlp = fp8
                .layernorm_mlp_forward(&x, ln, (&fc.0, &fc.1), (&proj.0, &proj.1), want_out)
                .expect("fused MLP");
            let (_, h_u, g_u, n_u) = fp8
                .layernorm_gelu_forward(&x, ln, &fc.0, &fc.1)
                .expect("norm, c_fc, GELU");
            assert_eq!(bits(&mlp.h), bits(&h_u), "{what}: h");
            let g_kept_u = match want_out {
                true => {
                    let (out_u, kept) = fp8
                        .residual_forward_saving(&x, &g_u, &proj.0, &proj.1)
                        .expect("c_proj");
                    let out = mlp.out.as_ref().expect("asked for the output");
                    assert_eq!(bits(out), bits(&out_u), "{what}: output");
                    kept
                }
                false => {
                    assert!(mlp.out.is_none(), "{what}: no output asked for");
                    fp8.saved_input(&g_u).expect("g's column blocks")
                }
            };
            let slot = [None];
            let (dg, dw) = fp8
                .cols_backward(&dout, &mlp.g, std::slice::from_ref(&proj.0), &slot)
                .expect("c_proj backward");
            let (dg_u, dw_u) = fp8
                .cols_backward(&dout, &g_kept_u, std::slice::from_ref(&proj.0), &slot)
                .expect("c_proj backward, unfused");
            assert_eq!(bits(&dg), bits(&dg_u), "{what}: dgelu");
            assert_eq!(bits(&dw[0]), bits(&dw_u[0]), "{what}: dw c_proj");
            let (dn, dw) = fp8
                .cols_backward(&dh, &mlp.n, std::slice::from_ref(&fc.0), &slot)
                .expect("c_fc backward");
            let (dn_u, dw_u) = fp8
                .cols_backward(&dh, &n_u, std::slice::from_ref(&fc.0), &slot)
                .expect("c_fc backward, unfused");
            assert_eq!(bits(&dn), bits(&dn_u), "{what}: dn");
            assert_eq!(bits(&dw[0]), bits(&dw_u[0]), "{what}: dw c_fc");
        }
    }
}

/// GELU's backward straight into FP8 (`fp8_quantize_gelu_grad`): the codes and scales that
/// `quantize_both` makes of the bf16 dh of `gelu_backward_bias_grad`, bit for bit, on whole and
/// partial tiles, and c_fc's bias gradient within a bf16 rounding of its (the column sums are
/// added in another order); and through GPT-2's MLP backward (`LinearFormat::mlp_backward_into`)
/// the input and weight gradients of the unfused path, bit for bit.
#[test]
fn fp8_gelu_grad_quantiser_equals_the_unfused_path_bit_for_bit() {
    let fp8 = LinearFormat::Fp8;
    let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    for (n, c) in [(256, 128), (272, 144)] {
        let f = 4 * c;
        let what = format!("GELU's gradient ({n}, {f})");
        let (_, dg) = spread(n, f, 91);
        let (_, h) = spread(n, f, 92);
        let (dh, db) = gelu_backward_bias_grad(&dg, &h).expect("unfused");
        let (q, qt) = fp8_gpu::quantize_both(&dh, 0, f).expect("dh both ways");
        let (fq, fqt, fdb) = fp8_gpu::fused::quantize_gelu_grad(&dg, &h)
            .expect("fused quantiser")
            .expect("a shape the kernel takes");
        same_operand(&format!("{what}: rows"), &fq, &q);
        same_operand(&format!("{what}: columns"), &fqt, &qt);
        close_bias_grads(&what, &fdb, &db);
        // GPT-2's MLP: ln_2 (C), c_fc (C, F), c_proj (F, C), the residual x (N, C).
        let (_, x) = spread(n, c, 93);
        let ln = (
            &spread(1, c, 94).1.reshape(c).expect("ln weight"),
            &spread(1, c, 95).1.reshape(c).expect("ln bias"),
        );
        let fc = (
            LinearWeight::Dense(spread(c, f, 96).1),
            spread(1, f, 97).1.reshape(f).expect("b"),
        );
        let proj_b = spread(1, c, 98).1.reshape(c).expect("c_proj bias");
        let proj = (LinearWeight::Dense(spread(f, c, 99).1), proj_b);
        let (_, dout) = spread(n, c, 100);
        let mlp = fp8
            .layernorm_mlp_forward(&x, ln, (&fc.0, &fc.1), (&proj.0, &proj.1), true)
            .expect("fused MLP");
        let (dn, [dw_proj, _, dw_fc, db_fc]) = fp8
            .mlp_backward_into(
                &dout,
                (&mlp.g, &mlp.h),
                &mlp.n,
                (&proj.0, &fc.0),
                (None, None),
            )
            .expect("MLP backward");
        let slot = [None];
        let (dg_u, dw_proj_u) = fp8
            .cols_backward(&dout, &mlp.g, std::slice::from_ref(&proj.0), &slot)
            .expect("c_proj backward");
        let (dh_u, db_fc_u) = gelu_backward_bias_grad(&dg_u, &mlp.h).expect("GELU backward");
        let (dn_u, dw_fc_u) = fp8
            .cols_backward(&dh_u, &mlp.n, std::slice::from_ref(&fc.0), &slot)
            .expect("c_fc backward");
        assert_eq!(bits(&dw_proj), bits(&dw_proj_u[0]), "{what}: dw c_proj");
        assert_eq!(bits(&dn), bits(&dn_u), "{what}: dn");
        assert_eq!(bits(&dw_fc), bits(&dw_fc_u[0]), "{what}: dw c_fc");
        close_bias_grads(&format!("{what}, through the MLP"), &db_fc, &db_fc_u);
    }
}

/// GPT-2's projections under FP8 keep their input as column blocks: the forward (with bias, a
/// residual, GELU after it) gives the bits of the plain FP8 forward, and the backward from what
/// it kept the bits of the backward from the input itself, the weight gradient written into
/// the slot it is given.
#[test]
fn fp8_gpt2_projections_from_kept_codes_equal_from_the_input() {
    let fp8 = LinearFormat::Fp8;
    let bits = |t: &Tensor| host_f32(&t.to_dtype(DType::F32).expect("f32"));
    let (n, c, o) = (272, 144, 400);
    let (_, x) = spread(n, c, 41);
    let (_, w) = spread(c, o, 42);
    let (_, b) = spread(1, o, 43);
    let b = b.reshape(o).expect("bias (OUT)");
    let (_, res) = spread(n, o, 44);
    let (_, dout) = spread(n, o, 45);
    let w = LinearWeight::Dense(w);
    let dense_x = SavedInput::Dense(x.clone());
    let (y, kept) = fp8.forward(&x, &w, &b).expect("forward");
    let plain = fp8
        .cols_forward(&x, std::slice::from_ref(&w), Some(&b), None)
        .expect("plain");
    assert_eq!(bits(&y), bits(&plain), "forward with bias");
    let (y_r, kept_r) = fp8
        .residual_forward_saving(&res, &x, &w, &b)
        .expect("residual");
    let y_rp = fp8
        .residual_forward(&res, &x, &w, &b)
        .expect("residual, plain");
    assert_eq!(bits(&y_r), bits(&y_rp), "forward with bias and residual");
    let (h, g, kept_g) = fp8.gelu_forward(&x, &w, &b).expect("gelu forward");
    assert_eq!(bits(&h), bits(&plain), "h = x @ w + b");
    let g_plain = model::layers::gelu_forward(&plain).expect("gelu");
    assert_eq!(bits(&g), bits(&g_plain), "gelu(h)");
    let slot = Tensor::zeros((c, o), DType::BF16, &gpu()).expect("a slot");
    for (what, k) in [("forward", &kept), ("residual", &kept_r), ("gelu", &kept_g)] {
        assert!(matches!(k, SavedInput::Fp8(_)), "{what}: kept x itself");
        let (dx, dw, db) = fp8
            .backward_into(&dout, k, &w, Some(&slot), true)
            .expect("backward from the kept codes");
        let (dx_d, dw_d, db_d) = fp8
            .backward_into(&dout, &dense_x, &w, None, true)
            .expect("backward from x");
        assert_eq!(bits(&dx), bits(&dx_d), "{what}: dx");
        assert_eq!(bits(&dw), bits(&dw_d), "{what}: dw");
        assert_eq!(bits(&slot), bits(&dw_d), "{what}: dw in its slot");
        // The kept codes' backward sums dout's columns in the quantiser's read (a tile's rows,
        // then the tiles), the other in bias_grad_partial's order: the same sums up to f32
        // rounding, each within a bf16 rounding of the other.
        close_bias_grads(&format!("{what}: db"), &db.expect("db"), &db_d.expect("db"));
    }
}
