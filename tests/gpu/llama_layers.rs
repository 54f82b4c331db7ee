//! The Llama family's kernels (bf16 on the GPU) against the CPU reference in f32 on the same
//! bf16-rounded values: RMSNorm with its residual add (forward, backward with and without the
//! residual gradient, dw written into a slot), the rotation of the packed q and k heads,
//! SwiGLU on the packed gate/up projection, grouped-query attention through cuDNN, and the
//! packed projections' GEMMs. Then each kernel's time at the Llama 3.2 1B shape beside a device
//! copy of the same bytes (printed: `--nocapture`), the figures docs/kernels.md quotes.

use crate::common::{assert_close, gpu, seconds_per_call, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::{
    add_rmsnorm_forward, gqa_cudnn_support, gqa_packed_backward, gqa_packed_forward,
    matmul_cols_backward, matmul_cols_forward, rmsnorm_backward, rmsnorm_backward_into,
    rmsnorm_forward, rope_qk_backward, rope_qk_forward, rope_tables, swiglu_packed_backward,
    swiglu_packed_forward,
};

/// `offset + scale * u`, u uniform in [-1, 1), rounded to bf16, as `(f32 on the CPU, bf16 on
/// the GPU)` of shape `dims`.
fn pair(dims: &[usize], seed: u64, offset: f32, scale: f32) -> (Tensor, Tensor) {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = uniform(n, seed, scale)
        .into_iter()
        .map(|u| offset + u)
        .collect();
    let b = Tensor::from_vec(v, dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::BF16))
        .expect("bf16 values");
    (
        b.to_dtype(DType::F32).expect("f32"),
        b.to_device(&gpu()).expect("to gpu"),
    )
}

fn rmsnorm_check(n: usize, c: usize, seed: u64) {
    let what = |s: &str| format!("rmsnorm ({n}, {c}) {s}");
    let eps = 1e-5;
    let (x_c, x_g) = pair(&[n, c], seed, 0.2, 2.0);
    let (d_c, d_g) = pair(&[n, c], seed + 1, 0.0, 1.0);
    let (w_c, w_g) = pair(&[c], seed + 2, 1.0, 0.3);
    let (dy_c, dy_g) = pair(&[n, c], seed + 3, 0.0, 1.0);
    let (dr_c, dr_g) = pair(&[n, c], seed + 4, 0.0, 0.5);

    // Forward: bf16 outputs (two roundings of values about max size), rstd f32.
    let (y_c, s_c) = rmsnorm_forward(&x_c, &w_c, eps).unwrap();
    let (y_g, s_g) = rmsnorm_forward(&x_g, &w_g, eps).unwrap();
    assert_eq!(s_g.rstd.dims(), &[n], "{}", what("rstd shape"));
    assert_close(&what("y"), &y_g, &y_c, 1e-2);
    assert_close(&what("rstd"), &s_g.rstd, &s_c.rstd, 1e-4);
    // With the residual add: h rounded once, then the norm of h.
    let (h_c, y2_c, s2_c) = add_rmsnorm_forward(&x_c, &d_c, &w_c, eps).unwrap();
    let (h_g, y2_g, s2_g) = add_rmsnorm_forward(&x_g, &d_g, &w_g, eps).unwrap();
    assert_close(&what("h"), &h_g, &h_c, 1e-2);
    assert_close(&what("y after the add"), &y2_g, &y2_c, 2e-2);
    assert_close(&what("rstd after the add"), &s2_g.rstd, &s2_c.rstd, 1e-3);

    // Backward on the GPU's own statistics; dw f32 sums over N rows rounded once.
    for with_res in [false, true] {
        let (r_c, r_g) = if with_res {
            (Some(&dr_c), Some(&dr_g))
        } else {
            (None, None)
        };
        let (dx_c, dw_c) = rmsnorm_backward(&dy_c, &s_c, &x_c, &w_c, r_c).unwrap();
        let (dx_g, dw_g) = rmsnorm_backward(&dy_g, &s_g, &x_g, &w_g, r_g).unwrap();
        assert_eq!(dx_g.dtype(), DType::BF16, "{}", what("dx took the kernel"));
        assert_close(
            &what(&format!("dx (residual {with_res})")),
            &dx_g,
            &dx_c,
            1e-2,
        );
        assert_close(
            &what(&format!("dw (residual {with_res})")),
            &dw_g,
            &dw_c,
            1e-2,
        );
    }
    // dw into a slot of a larger buffer (a unit's flat gradient): written there, returned.
    let flat = Tensor::zeros(c + 64, DType::BF16, &gpu()).unwrap();
    let slot = flat.narrow(0, 64, c).unwrap();
    let (_, dw_g) = rmsnorm_backward_into(&dy_g, &s_g, &x_g, &w_g, None, Some(&slot)).unwrap();
    let (_, dw_c) = rmsnorm_backward(&dy_c, &s_c, &x_c, &w_c, None).unwrap();
    assert_close(
        &what("dw in its slot"),
        &flat.narrow(0, 64, c).unwrap(),
        &dw_c,
        1e-2,
    );
    assert_close(&what("dw returned as the slot"), &dw_g, &dw_c, 1e-2);
    let head = flat.narrow(0, 0, 64).unwrap().to_dtype(DType::F32).unwrap();
    assert_eq!(
        head.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0,
        "{}",
        what("nothing written before the slot")
    );
}

#[test]
fn rmsnorm_narrow_rows_and_odd_counts() {
    rmsnorm_check(77, 64, 1);
    rmsnorm_check(300, 2048, 2);
}

#[test]
fn rmsnorm_llama_shapes() {
    rmsnorm_check(16384, 2048, 3); // Llama 3.2 1B, 8 sequences of 2048
    rmsnorm_check(37, 8192, 4); // Llama 3 70B's width: one warp a backward CTA
}

/// A packed `qkv (B, T, (NH + 2 KV) hs)`: rotation forward and backward, q and k turned, v not.
fn rope_check(b: usize, t: usize, nh: usize, kv: usize, hs: usize) {
    let what = format!("rope ({b}, {t}, {nh}/{kv} x {hs})");
    let w = (nh + 2 * kv) * hs;
    let (x_c, x_g) = pair(&[b, t, w], 21, 0.0, 1.0);
    let theta = 500_000.0;
    // Llama 3.2's scaling: the GPU's tables are the host's, cached per scaling.
    let scaling = model::LLAMA3_2_SCALING;
    let tab_c = rope_tables(t, hs, theta, &scaling, DType::F32, &Device::Cpu).unwrap();
    let tab_g = rope_tables(t, hs, theta, &scaling, DType::BF16, &gpu()).unwrap();
    let y_c = rope_qk_forward(x_c.clone(), &tab_c, nh, kv).unwrap();
    let y_g = rope_qk_forward(x_g.copy().unwrap(), &tab_g, nh, kv).unwrap();
    // The GPU's tables are bf16 (as Hugging Face casts them): 2^-8 relative on each term.
    assert_close(&format!("{what} forward"), &y_g, &y_c, 1e-2);
    let v = |x: &Tensor| x.narrow(2, (nh + kv) * hs, kv * hs).unwrap();
    assert_eq!(
        crate::common::f32_bits(&v(&y_g)),
        crate::common::f32_bits(&v(&x_g)),
        "{what}: v untouched"
    );
    // Backward on its own input (not the forward's output: the two sides' forwards differ by
    // their roundings, which the backward would add to its own).
    let (dy_c, dy_g) = pair(&[b, t, w], 22, 0.0, 1.0);
    let dx_c = rope_qk_backward(dy_c, &tab_c, nh, kv).unwrap();
    let dx_g = rope_qk_backward(dy_g, &tab_g, nh, kv).unwrap();
    assert_close(&format!("{what} backward"), &dx_g, &dx_c, 1e-2);
    let back_g = rope_qk_backward(y_g, &tab_g, nh, kv).unwrap();
    // Backward is the inverse of forward (the rotation is orthogonal).
    assert_close(
        &format!("{what} backward(forward(x)) = x"),
        &back_g,
        &x_c,
        2e-2,
    );
}

#[test]
fn rope_turns_packed_q_and_k() {
    rope_check(2, 37, 4, 2, 16);
    rope_check(2, 2048, 32, 8, 64); // Llama 3.2 1B
    rope_check(1, 64, 24, 8, 128);
}

fn swiglu_check(n: usize, f: usize) {
    let what = format!("swiglu ({n}, {f})");
    let (gu_c, gu_g) = pair(&[n, 2 * f], 31, 0.0, 4.0);
    let (da_c, da_g) = pair(&[n, f], 32, 0.0, 1.0);
    let act_c = swiglu_packed_forward(&gu_c).unwrap();
    let act_g = swiglu_packed_forward(&gu_g).unwrap();
    assert_close(&format!("{what} act"), &act_g, &act_c, 1e-2);
    let dgu_c = swiglu_packed_backward(&da_c, &gu_c).unwrap();
    let dgu_g = swiglu_packed_backward(&da_g, &gu_g).unwrap();
    assert_eq!(dgu_g.dims(), &[n, 2 * f]);
    assert_close(&format!("{what} dgate|dup"), &dgu_g, &dgu_c, 1e-2);
}

#[test]
fn swiglu_packed_gate_and_up() {
    swiglu_check(37, 96);
    swiglu_check(16384, 8192); // Llama 3.2 1B
}

/// Grouped-query attention through cuDNN (checked to be cuDNN's fused path, not the reference
/// on the GPU) against the CPU reference.
fn gqa_check(b: usize, t: usize, nh: usize, kv: usize, hs: usize) {
    let what = format!("gqa ({b}, {t}, {nh}/{kv} x {hs})");
    let w = (nh + 2 * kv) * hs;
    let (qkv_c, qkv_g) = pair(&[b, t, w], 41, 0.0, 2.0);
    let (dy_c, dy_g) = pair(&[b, t, nh * hs], 42, 0.0, 1.0);
    for backward in [false, true] {
        assert_eq!(
            gqa_cudnn_support(&qkv_g, nh, kv, backward).unwrap(),
            Ok(()),
            "{what}: cuDNN takes it (backward {backward})"
        );
    }
    let (y_c, s_c) = gqa_packed_forward(&qkv_c, nh, kv).unwrap();
    let (y_g, s_g) = gqa_packed_forward(&qkv_g, nh, kv).unwrap();
    assert_close(&format!("{what} y"), &y_g, &y_c, 2e-2);
    assert_close(&format!("{what} lse"), &s_g.lse, &s_c.lse, 1e-3);
    let d_c = gqa_packed_backward(&dy_c, &s_c).unwrap();
    let d_g = gqa_packed_backward(&dy_g, &s_g).unwrap();
    assert_eq!(d_g.dims(), &[b, t, w], "{what}: dqkv shape");
    for (name, from, heads) in [("dq", 0, nh), ("dk", nh, kv), ("dv", nh + kv, kv)] {
        let part = |x: &Tensor| x.narrow(2, from * hs, heads * hs).unwrap();
        assert_close(&format!("{what} {name}"), &part(&d_g), &part(&d_c), 3e-2);
    }
}

#[test]
fn gqa_through_cudnn_small() {
    gqa_check(2, 128, 4, 2, 32);
    gqa_check(1, 64, 8, 1, 64); // multi-query
    gqa_check(2, 64, 4, 4, 64); // multi-head through the same graphs
}

#[test]
fn gqa_through_cudnn_llama_1b() {
    gqa_check(1, 2048, 32, 8, 64);
}

/// The packed projections: forward into column blocks (with and without the residual as C),
/// backward with dx summed over the blocks and dw into slots.
#[test]
fn packed_projections_match_the_reference() {
    let (n, inp, outs) = (300, 256, [256usize, 64, 64]);
    let (x_c, x_g) = pair(&[n, inp], 51, 0.0, 1.0);
    let ws: Vec<(Tensor, Tensor)> = outs
        .iter()
        .enumerate()
        .map(|(i, &o)| pair(&[inp, o], 52 + i as u64, 0.0, 0.1))
        .collect();
    let (w_c, w_g): (Vec<Tensor>, Vec<Tensor>) = ws.into_iter().unzip();
    let tot: usize = outs.iter().sum();
    let (r_c, r_g) = pair(&[n, tot], 56, 0.0, 1.0);
    let y_c = matmul_cols_forward(&x_c, &w_c, None).unwrap();
    let y_g = matmul_cols_forward(&x_g, &w_g, None).unwrap();
    assert_close("cols forward", &y_g, &y_c, 1e-2);
    let y_c = matmul_cols_forward(&x_c, &w_c, Some(&r_c)).unwrap();
    let y_g = matmul_cols_forward(&x_g, &w_g, Some(&r_g)).unwrap();
    assert_close("cols forward + residual", &y_g, &y_c, 1e-2);

    let (d_c, d_g) = pair(&[n, tot], 57, 0.0, 1.0);
    let flat = Tensor::zeros(inp * tot + 8, DType::BF16, &gpu()).unwrap();
    let mut off = 8;
    let slots: Vec<Option<Tensor>> = outs
        .iter()
        .map(|&o| {
            let s = flat
                .narrow(0, off, inp * o)
                .unwrap()
                .reshape((inp, o))
                .unwrap();
            off += inp * o;
            Some(s)
        })
        .collect();
    let (dx_c, dw_c) = matmul_cols_backward(&d_c, &x_c, &w_c, &[]).unwrap();
    let (dx_g, dw_g) = matmul_cols_backward(&d_g, &x_g, &w_g, &slots).unwrap();
    assert_close("cols dx", &dx_g, &dx_c, 1e-2);
    for (i, (g, c)) in dw_g.iter().zip(&dw_c).enumerate() {
        assert_close(&format!("cols dw {i}"), g, c, 1e-2);
        let slot = slots[i].as_ref().unwrap();
        assert_close(&format!("cols dw {i} in its slot"), slot, c, 1e-2);
    }
}

/// Each new kernel at the Llama 3.2 1B shape (8 sequences of 2048), timed beside a device copy
/// of the bytes it must move: what bounds them (memory) and how close they get. Prints only.
#[test]
fn llama_kernels_against_the_copy() {
    let dev = gpu();
    let (n, c, f, nh, kv, hs) = (16384, 2048, 8192, 32, 8, 64);
    let time = |f: &dyn Fn()| seconds_per_call(&dev, f);
    let randn = |dims: &[usize]| crate::common::randn_bf16(&dev, dims, 1.0);
    // The copy: GB/s of read + write.
    let src = randn(&[n, f]);
    let copy_s = time(&|| {
        let _ = src.copy().unwrap();
    });
    let copy_gbs = 2.0 * (n * f * 2) as f64 / copy_s / 1e9;
    println!(
        "device copy: {copy_gbs:.0} GB/s (read + write, {} MB)",
        n * f * 2 >> 20
    );
    let report = |name: &str, bytes: usize, s: f64| {
        let gbs = bytes as f64 / s / 1e9;
        println!(
            "{name}: {:.1} us, {gbs:.0} GB/s = {:.0}% of the copy",
            s * 1e6,
            100.0 * gbs / copy_gbs
        );
    };
    let x = randn(&[n, c]);
    let d = randn(&[n, c]);
    let w = randn(&[c]).affine(0.1, 1.0).unwrap();
    report(
        "rmsnorm forward",
        n * c * 2 * 2,
        time(&|| {
            let _ = rmsnorm_forward(&x, &w, 1e-5).unwrap();
        }),
    );
    report(
        "rmsnorm forward with the residual add",
        n * c * 2 * 4,
        time(&|| {
            let _ = add_rmsnorm_forward(&x, &d, &w, 1e-5).unwrap();
        }),
    );
    let (_, saved) = rmsnorm_forward(&x, &w, 1e-5).unwrap();
    report(
        "rmsnorm backward with dresidual",
        n * c * 2 * 4,
        time(&|| {
            let _ = rmsnorm_backward(&d, &saved, &x, &w, Some(&d)).unwrap();
        }),
    );
    let qkv = randn(&[8, 2048, (nh + 2 * kv) * hs]);
    let tab = rope_tables(
        2048,
        hs,
        500_000.0,
        &model::LLAMA3_2_SCALING,
        DType::BF16,
        &dev,
    )
    .unwrap();
    report(
        "rope on q and k, in place",
        n * (nh + kv) * hs * 2 * 2,
        time(&|| {
            let _ = rope_qk_forward(qkv.clone(), &tab, nh, kv).unwrap();
        }),
    );
    let gu = randn(&[n, 2 * f]);
    let dact = randn(&[n, f]);
    report(
        "swiglu forward",
        n * f * 2 * 3,
        time(&|| {
            let _ = swiglu_packed_forward(&gu).unwrap();
        }),
    );
    report(
        "swiglu backward",
        n * f * 2 * 5,
        time(&|| {
            let _ = swiglu_packed_backward(&dact, &gu).unwrap();
        }),
    );
    // Attention: TFLOP/s of the causal half (4 * B * NH * T^2 * hs / 2 forward, 2.5x that back).
    let qkv = randn(&[8, 2048, (nh + 2 * kv) * hs])
        .affine(0.5, 0.0)
        .unwrap();
    let flops = 4.0 * 8.0 * nh as f64 * 2048.0 * 2048.0 * hs as f64 / 2.0;
    let fwd = time(&|| {
        let _ = gqa_packed_forward(&qkv, nh, kv).unwrap();
    });
    let (y, s) = gqa_packed_forward(&qkv, nh, kv).unwrap();
    let bwd = time(&|| {
        let _ = gqa_packed_backward(&y, &s).unwrap();
    });
    println!(
        "gqa through cuDNN (8, 2048, 32/8 x 64): forward {:.2} ms ({:.0} TFLOP/s), backward {:.2} \
         ms ({:.0} TFLOP/s)",
        fwd * 1e3,
        flops / fwd / 1e12,
        bwd * 1e3,
        2.5 * flops / bwd / 1e12
    );
}
