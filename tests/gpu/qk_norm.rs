//! Qwen3's q/k norm (`qk_norm.cu`: bf16, in place on the packed projection, one kernel a
//! direction) against the CPU reference in f32 on the same bf16-rounded values: the output, the
//! saved heads and statistics, dqkv, dwq and dwk, with v and dv untouched and dw the same bits
//! run to run. Each check runs under an enforced kernel plan, so a kernel that declined (and
//! left the work to the reference on the GPU) fails it. Then both directions at Qwen3 1.7B's
//! shape beside a device copy and beside the path they replace (printed: `--nocapture`). And the
//! norm with the rotary embedding fused into it against the two kernels one after the other, bit
//! for bit both ways.
//!
//! Tolerances, as qk_norm.cu's header argues them: y within 1e-2 of max |y| (two bf16
//! roundings), dqkv, dwq, dwk within 1e-2 (one rounding, 2^-8), rstd within 2e-5 (f32 sums in
//! another order), the saved heads bit for bit.

use crate::common::{assert_close, f32_bits, gpu, seconds_per_call};
use candle_core::{DType, Device, Tensor};
use model::layers::{
    qk_norm_backward, qk_norm_forward, qk_norm_rope_backward, qk_norm_rope_forward,
    rmsnorm_backward, rmsnorm_forward, rope_qk_backward, rope_qk_forward, rope_tables, RopeScaling,
};
use model::KernelPlan;

/// `offset + scale * u`, u uniform in [-1, 1), rounded to bf16, as `(f32 on the CPU, bf16 on
/// the GPU)` of shape `dims`.
fn pair(dims: &[usize], seed: u64, offset: f32, scale: f32) -> (Tensor, Tensor) {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = crate::common::uniform(n, seed, scale)
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

/// The kernel plan of a Qwen3 shape in bf16 on the GPU: while its guard lives, a layer whose
/// kernel declines a CUDA tensor is an error.
fn plan() -> KernelPlan {
    let cfg = model::preset("qwen3-1.7b").expect("the qwen3-1.7b preset");
    KernelPlan::resolve(&cfg, DType::BF16, &gpu())
        .expect("a plan")
        .expect("a GPU plan")
}

fn qk_norm_check(b: usize, t: usize, nh: usize, kv: usize, hs: usize, seed: u64) {
    let what = |s: &str| format!("qk_norm ({b}, {t}, {nh}/{kv} x {hs}) {s}");
    let _enforced = plan().enforce();
    let eps = 1e-6;
    let w = (nh + 2 * kv) * hs;
    let v = |x: &Tensor| x.narrow(2, (nh + kv) * hs, kv * hs).unwrap();
    // Heads of different sizes (an offset, a spread of 4), weights about 1.
    let (x_c, x_g) = pair(&[b, t, w], seed, 0.1, 4.0);
    let (wq_c, wq_g) = pair(&[hs], seed + 1, 1.0, 0.3);
    let (wk_c, wk_g) = pair(&[hs], seed + 2, 1.0, 0.3);
    let (dy_c, dy_g) = pair(&[b, t, w], seed + 3, 0.0, 1.0);

    // Forward: in place on a copy of the input, so that the input stays to compare with.
    let (y_c, s_c) = qk_norm_forward(x_c.clone(), &wq_c, &wk_c, nh, kv, eps).unwrap();
    let (y_g, s_g) = qk_norm_forward(x_g.copy().unwrap(), &wq_g, &wk_g, nh, kv, eps).unwrap();
    assert_eq!(y_g.dtype(), DType::BF16, "{}", what("y dtype"));
    assert_close(&what("y"), &y_g, &y_c, 1e-2);
    assert_eq!(
        f32_bits(&v(&y_g)),
        f32_bits(&v(&x_g)),
        "{}",
        what("v untouched")
    );
    let (q_c, k_c, qr_c, kr_c) = s_c.rows().unwrap();
    let (q_g, k_g, qr_g, kr_g) = s_g.rows().unwrap();
    assert_eq!(f32_bits(&q_g), f32_bits(&q_c), "{}", what("saved q"));
    assert_eq!(f32_bits(&k_g), f32_bits(&k_c), "{}", what("saved k"));
    assert_eq!(qr_g.rstd.dtype(), DType::F32, "{}", what("rstd dtype"));
    assert_close(&what("rstd of q"), &qr_g.rstd, &qr_c.rstd, 2e-5);
    assert_close(&what("rstd of k"), &kr_g.rstd, &kr_c.rstd, 2e-5);

    // Backward, each side from its own forward's saved values, in place on a copy of dy.
    let (dx_c, dwq_c, dwk_c) = qk_norm_backward(dy_c, &s_c, &wq_c, &wk_c).unwrap();
    let (dx_g, dwq_g, dwk_g) = qk_norm_backward(dy_g.copy().unwrap(), &s_g, &wq_g, &wk_g).unwrap();
    assert_eq!(dx_g.dtype(), DType::BF16, "{}", what("dqkv dtype"));
    assert_close(&what("dqkv"), &dx_g, &dx_c, 1e-2);
    assert_eq!(
        f32_bits(&v(&dx_g)),
        f32_bits(&v(&dy_g)),
        "{}",
        what("dv untouched")
    );
    assert_eq!(dwq_g.dims(), &[hs], "{}", what("dwq shape"));
    assert_close(&what("dwq"), &dwq_g, &dwq_c, 1e-2);
    assert_close(&what("dwk"), &dwk_g, &dwk_c, 1e-2);
    // Deterministic: the same bits again.
    let (_, dwq2, dwk2) = qk_norm_backward(dy_g.copy().unwrap(), &s_g, &wq_g, &wk_g).unwrap();
    assert_eq!(f32_bits(&dwq2), f32_bits(&dwq_g), "{}", what("dwq again"));
    assert_eq!(f32_bits(&dwk2), f32_bits(&dwk_g), "{}", what("dwk again"));
}

#[test]
fn qk_norm_small_shapes() {
    qk_norm_check(2, 37, 4, 2, 16, 1); // two lanes a head
    qk_norm_check(1, 19, 3, 1, 80, 2); // 10 vectors a head: 6 idle lanes of 16
    qk_norm_check(3, 17, 6, 2, 64, 3);
    qk_norm_check(2, 33, 5, 5, 256, 4); // a warp a head, q and k heads alike in number
}

#[test]
fn qk_norm_qwen3_1_7b() {
    qk_norm_check(8, 2048, 16, 8, 128, 5); // Qwen3 1.7B, 8 sequences of 2048
}

/// The q/k norm with the rotation fused into its kernels (`qk_norm_rope_forward`, `_backward`)
/// against `qk_norm_forward` then `rope_qk_forward` (and `rope_qk_backward` then
/// `qk_norm_backward`), bit for bit: the output, the saved heads, dqkv, dwq and dwk. Heads of
/// 16 (a pair of lanes), 80 (idle lanes), 64, 256 and 128 channels; each runs enforced, so a
/// fused launch that declined would fall to the two kernels and the check would still hold,
/// which is why the Qwen3 shape also times both (printed).
fn qk_norm_rope_check(b: usize, t: usize, nh: usize, kv: usize, hs: usize, seed: u64) {
    let what = |s: &str| format!("qk_norm + rope ({b}, {t}, {nh}/{kv} x {hs}) {s}");
    let _enforced = plan().enforce();
    let eps = 1e-6;
    let w = (nh + 2 * kv) * hs;
    let (_, x) = pair(&[b, t, w], seed, 0.1, 4.0);
    let (_, wq) = pair(&[hs], seed + 1, 1.0, 0.3);
    let (_, wk) = pair(&[hs], seed + 2, 1.0, 0.3);
    let (_, dy) = pair(&[b, t, w], seed + 3, 0.0, 1.0);
    let rope = rope_tables(t, hs, 1e6, &RopeScaling::Default, DType::BF16, &gpu()).unwrap();
    let (y, s) = qk_norm_rope_forward(x.copy().unwrap(), &wq, &wk, &rope, nh, kv, eps).unwrap();
    let (y2, s2) = qk_norm_forward(x.copy().unwrap(), &wq, &wk, nh, kv, eps).unwrap();
    let y2 = rope_qk_forward(y2, &rope, nh, kv).unwrap();
    assert_eq!(f32_bits(&y), f32_bits(&y2), "{}", what("y"));
    let (q, k, qr, kr) = s.rows().unwrap();
    let (q2, k2, qr2, kr2) = s2.rows().unwrap();
    assert_eq!(f32_bits(&q), f32_bits(&q2), "{}", what("saved q"));
    assert_eq!(f32_bits(&k), f32_bits(&k2), "{}", what("saved k"));
    assert_eq!(
        f32_bits(&qr.rstd),
        f32_bits(&qr2.rstd),
        "{}",
        what("rstd of q")
    );
    assert_eq!(
        f32_bits(&kr.rstd),
        f32_bits(&kr2.rstd),
        "{}",
        what("rstd of k")
    );
    let (dx, dwq, dwk) = qk_norm_rope_backward(dy.copy().unwrap(), &s, &wq, &wk, &rope).unwrap();
    let d2 = rope_qk_backward(dy.copy().unwrap(), &rope, nh, kv).unwrap();
    let (dx2, dwq2, dwk2) = qk_norm_backward(d2, &s2, &wq, &wk).unwrap();
    assert_eq!(f32_bits(&dx), f32_bits(&dx2), "{}", what("dqkv"));
    assert_eq!(f32_bits(&dwq), f32_bits(&dwq2), "{}", what("dwq"));
    assert_eq!(f32_bits(&dwk), f32_bits(&dwk2), "{}", what("dwk"));
}

#[test]
fn qk_norm_with_rope_fused_equals_the_two_kernels() {
    qk_norm_rope_check(2, 37, 4, 2, 16, 11);
    qk_norm_rope_check(1, 19, 3, 1, 80, 12);
    qk_norm_rope_check(3, 17, 6, 2, 64, 13);
    qk_norm_rope_check(2, 33, 5, 5, 256, 14);
    qk_norm_rope_check(8, 2048, 16, 8, 128, 15); // Qwen3 1.7B, 8 sequences of 2048
                                                 // Timed at that shape (printed): the fused pair beside the two kernels.
    let (nh, kv, hs, t) = (16, 8, 128, 2048);
    let (_, x) = pair(&[8, t, (nh + 2 * kv) * hs], 16, 0.1, 4.0);
    let (_, wq) = pair(&[hs], 17, 1.0, 0.3);
    let (_, wk) = pair(&[hs], 18, 1.0, 0.3);
    let rope = rope_tables(t, hs, 1e6, &RopeScaling::Default, DType::BF16, &gpu()).unwrap();
    let buf = x.copy().unwrap();
    let dev = gpu();
    let fused = seconds_per_call(&dev, &|| {
        qk_norm_rope_forward(buf.clone(), &wq, &wk, &rope, nh, kv, 1e-6).unwrap();
    });
    let two = seconds_per_call(&dev, &|| {
        let (y, _) = qk_norm_forward(buf.clone(), &wq, &wk, nh, kv, 1e-6).unwrap();
        rope_qk_forward(y, &rope, nh, kv).unwrap();
    });
    println!(
        "qk_norm + rope forward at (8 x 2048, 16/8 x 128): fused {:.1} us, two kernels {:.1} us",
        fused * 1e6,
        two * 1e6
    );
}

/// The forward the kernel replaces: q's and k's rows copied out, RMSNorm's kernel on them, the
/// packed buffer concatenated back.
fn rows_path(qkv: &Tensor, w: &[&Tensor; 2], nh: usize, kv: usize, hs: usize) -> Tensor {
    let (b, t, _) = qkv.dims3().unwrap();
    let part = |off: usize, heads: usize| {
        qkv.narrow(2, off * hs, heads * hs)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((b * t * heads, hs))
            .unwrap()
    };
    let (q, _) = rmsnorm_forward(&part(0, nh), w[0], 1e-6).unwrap();
    let (k, _) = rmsnorm_forward(&part(nh, kv), w[1], 1e-6).unwrap();
    let v = qkv.narrow(2, (nh + kv) * hs, kv * hs).unwrap();
    Tensor::cat(
        &[
            &q.reshape((b, t, nh * hs)).unwrap(),
            &k.reshape((b, t, kv * hs)).unwrap(),
            &v,
        ],
        2,
    )
    .unwrap()
}

/// Both directions at Qwen3 1.7B's shape (N = 16384, 16 + 8 heads of 128), timed beside a
/// device copy and beside the rows path they replace. Prints only: the figures qk_norm.cu's
/// header quotes.
#[test]
fn qk_norm_against_the_copy() {
    let dev = gpu();
    let (b, t, nh, kv, hs) = (8, 2048, 16, 8, 128);
    let n = b * t;
    let heads = nh + kv;
    let time = |f: &dyn Fn()| seconds_per_call(&dev, f);
    let randn = |dims: &[usize]| crate::common::randn_bf16(&dev, dims, 1.0);
    // The copy of the q and k heads' bytes: GB/s of read + write.
    let src = randn(&[n, heads * hs]);
    let copy_s = time(&|| {
        let _ = src.copy().unwrap();
    });
    let copy_gbs = 2.0 * (n * heads * hs * 2) as f64 / copy_s / 1e9;
    println!(
        "device copy: {copy_gbs:.0} GB/s (read + write, {} MB)",
        n * heads * hs * 2 >> 20
    );
    // Each direction: 6 N HQK hs bytes of heads, 4 N HQK of rstd.
    let bytes = 6 * n * heads * hs + 4 * n * heads;
    let report = |name: &str, s: f64| {
        let gbs = bytes as f64 / s / 1e9;
        println!(
            "{name}: {:.1} us, {gbs:.0} GB/s = {:.0}% of the copy",
            s * 1e6,
            100.0 * gbs / copy_gbs
        );
    };
    let qkv = randn(&[b, t, (nh + 2 * kv) * hs]);
    let wq = randn(&[hs]).affine(0.1, 1.0).unwrap();
    let wk = randn(&[hs]).affine(0.1, 1.0).unwrap();
    let (_, saved) = qk_norm_forward(qkv.copy().unwrap(), &wq, &wk, nh, kv, 1e-6).unwrap();
    let dy = randn(&[b, t, (nh + 2 * kv) * hs]);
    {
        let _enforced = plan().enforce();
        // In place: each call normalises the buffer again (the values stay about 1).
        report(
            "qk_norm forward, in place",
            time(&|| {
                let _ = qk_norm_forward(qkv.clone(), &wq, &wk, nh, kv, 1e-6).unwrap();
            }),
        );
        report(
            "qk_norm backward, in place, with dwq and dwk",
            time(&|| {
                let _ = qk_norm_backward(dy.clone(), &saved, &wq, &wk).unwrap();
            }),
        );
    }
    // The path they replace, for the record.
    let before_fwd = time(&|| {
        let _ = rows_path(&qkv, &[&wq, &wk], nh, kv, hs);
    });
    let (q, k, q_rms, k_rms) = saved.rows().unwrap();
    let before_bwd = time(&|| {
        let rows = |off: usize, heads: usize| {
            dy.narrow(2, off * hs, heads * hs)
                .unwrap()
                .contiguous()
                .unwrap()
                .reshape((n * heads, hs))
                .unwrap()
        };
        let (dq, _) = rmsnorm_backward(&rows(0, nh), &q_rms, &q, &wq, None).unwrap();
        let (dk, _) = rmsnorm_backward(&rows(nh, kv), &k_rms, &k, &wk, None).unwrap();
        let dv = dy.narrow(2, (nh + kv) * hs, kv * hs).unwrap();
        let _ = Tensor::cat(
            &[
                &dq.reshape((b, t, nh * hs)).unwrap(),
                &dk.reshape((b, t, kv * hs)).unwrap(),
                &dv,
            ],
            2,
        )
        .unwrap();
    });
    println!(
        "before (rows copied out, rmsnorm.cu, concatenated back): forward {:.1} us, backward \
         {:.1} us",
        before_fwd * 1e6,
        before_bwd * 1e6
    );
}
