//! The linear layers on the GPU (cuBLASLt GEMMs with their epilogues: bias, residual, GELU with
//! its input kept, GELU's backward with the bias gradient) against the CPU reference in f32 on
//! the same bf16 values. Tolerance: max|gpu - cpu| / max|cpu| below 1e-2 for bf16 outputs of
//! sums over up to 16K products in f32.

use crate::common::{randn_bf16, seconds_per_call};
use candle_core::{DType, Device, Tensor};
use model::layers::{
    matmul_backward, matmul_backward_into, matmul_backward_no_bias, matmul_forward,
    matmul_gelu_backward, matmul_gelu_forward, residual_matmul_forward,
};

fn rand(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

fn on_gpu(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16)
        .unwrap()
        .to_device(&Device::new_cuda(0).expect("a CUDA device"))
        .unwrap()
}

fn check(what: &str, gpu: &Tensor, cpu: &Tensor) {
    assert_eq!(gpu.dtype(), DType::BF16, "{what}: the GPU path keeps bf16");
    assert_eq!(gpu.dims(), cpu.dims(), "{what}: shape");
    let g = gpu
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let scale = cpu
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let err = (g - cpu)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let rel = err / scale.max(1e-30);
    assert!(
        rel < 1e-2,
        "{what}: max rel err {rel:.3e} (max |cpu| {scale:.3e})"
    );
}

fn compare(n: usize, inp: usize, out: usize) {
    let tag = |s: &str| format!("{s} (N, IN, OUT) = ({n}, {inp}, {out})");
    let x = rand(&[n, inp], 1, 1.0);
    let w = rand(&[inp, out], 2, 0.05);
    let b = rand(&[out], 3, 0.5);
    let r = rand(&[n, out], 4, 1.0);
    let dout = rand(&[n, out], 5, 1.0);
    let (gx, gw, gb, gr, gd) = (
        on_gpu(&x),
        on_gpu(&w),
        on_gpu(&b),
        on_gpu(&r),
        on_gpu(&dout),
    );

    check(
        &tag("x @ w + b"),
        &matmul_forward(&gx, &gw, &gb).unwrap(),
        &matmul_forward(&x, &w, &b).unwrap(),
    );
    check(
        &tag("r + x @ w + b"),
        &residual_matmul_forward(&gr, &gx, &gw, &gb).unwrap(),
        &residual_matmul_forward(&r, &x, &w, &b).unwrap(),
    );
    let (cdx, cdw, cdb) = matmul_backward(&dout, &x, &w).unwrap();
    let (dx, dw, db) = matmul_backward(&gd, &gx, &gw).unwrap();
    check(&tag("dx"), &dx, &cdx);
    check(&tag("dw"), &dw, &cdw);
    check(&tag("db"), &db, &cdb);
    let (dx2, dw2) = matmul_backward_no_bias(&gd, &gx, &gw).unwrap();
    check(&tag("dx (no bias)"), &dx2, &cdx);
    check(&tag("dw (no bias)"), &dw2, &cdw);

    // x (N, IN) -> h, g (N, OUT); then gelu(h) (N, OUT) @ w2 (OUT, IN) + b2.
    let (ch, cg) = matmul_gelu_forward(&x, &w, &b).unwrap();
    let (h, g) = matmul_gelu_forward(&gx, &gw, &gb).unwrap();
    check(&tag("h = x @ w + b"), &h, &ch);
    check(&tag("gelu(h)"), &g, &cg);
    let w2 = rand(&[out, inp], 6, 0.05);
    let dout2 = rand(&[n, inp], 7, 1.0);
    let (cdh, cdw2, cdb2, cdbh) = matmul_gelu_backward(&dout2, &cg, &w2, &ch).unwrap();
    let (dh, dw2, db2, dbh) = matmul_gelu_backward(&on_gpu(&dout2), &g, &on_gpu(&w2), &h).unwrap();
    check(&tag("dh"), &dh, &cdh);
    check(&tag("dw2"), &dw2, &cdw2);
    check(&tag("db2"), &db2, &cdb2);
    check(&tag("sum(dh)"), &dbh, &cdbh);
}

#[test]
fn linear_layers_match_the_cpu_reference() {
    compare(77, 64, 256);
    compare(300, 192, 64);
    compare(2048, 1024, 4096);
}

/// The weight gradient lands in the slot it is given (a view into a unit's flat gradient at an
/// offset), and is returned as that view.
#[test]
fn weight_gradient_goes_into_its_slot() {
    let (n, inp, out) = (257, 160, 224);
    let (x, w, dout) = (
        rand(&[n, inp], 25, 1.0),
        rand(&[inp, out], 26, 0.05),
        rand(&[n, out], 27, 1.0),
    );
    let flat = on_gpu(&Tensor::zeros(8 + inp * out + 8, DType::F32, &Device::Cpu).unwrap());
    let slot = flat
        .narrow(0, 8, inp * out)
        .unwrap()
        .reshape((inp, out))
        .unwrap();
    let (_, cdw, _) = matmul_backward_into(&dout, &x, &w, None, false).unwrap();
    let (_, dw, db) =
        matmul_backward_into(&on_gpu(&dout), &on_gpu(&x), &on_gpu(&w), Some(&slot), false).unwrap();
    assert!(db.is_none(), "no bias gradient was asked for");
    check("dw into its slot", &slot, &cdw);
    check("dw returned", &dw, &cdw);
    let edges = Tensor::cat(
        &[
            flat.narrow(0, 0, 8).unwrap(),
            flat.narrow(0, 8 + inp * out, 8).unwrap(),
        ],
        0,
    )
    .unwrap()
    .to_dtype(DType::F32)
    .unwrap()
    .to_vec1::<f32>()
    .unwrap();
    assert!(
        edges.iter().all(|&v| v == 0.0),
        "nothing outside the slot is written"
    );
}

#[test]
fn epilogue_variants_match_the_plain_ones() {
    let (n, c) = (300, 256);
    let x = on_gpu(&rand(&[n, c], 11, 1.0));
    let w = on_gpu(&rand(&[c, 4 * c], 12, 0.05));
    let b = on_gpu(&rand(&[4 * c], 13, 0.5));
    let (h, g) = model::layers::matmul_gelu_forward_unfused(&x, &w, &b).unwrap();
    let (h2, g2) = matmul_gelu_forward(&x, &w, &b).unwrap();
    let f32_ = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    check("h (GELU_AUX_BIAS)", &h2, &f32_(&h));
    check("g (GELU_AUX_BIAS)", &g2, &f32_(&g));
    let w2 = on_gpu(&rand(&[4 * c, c], 14, 0.05));
    let dout = on_gpu(&rand(&[n, c], 15, 1.0));
    let plain = matmul_gelu_backward(&dout, &g, &w2, &h).unwrap();
    let fused = model::layers::matmul_gelu_backward_epilogue(&dout, &g, &w2, &h).unwrap();
    check("dh (DGELU_BGRAD)", &fused.0, &f32_(&plain.0));
    check("sum(dh) (DGELU_BGRAD)", &fused.3, &f32_(&plain.3));
}

/// Times the MLP's GELU layers at gpt350m's shape (N = 16384, C = 1024) with and without
/// cuBLASLt's GELU epilogues (`--nocapture`); asserts nothing.
#[test]
fn gelu_epilogue_timing() {
    let (n, c) = (16384, 1024);
    let dev = Device::new_cuda(0).expect("a CUDA device");
    let r = |shape: &[usize], s: f32| randn_bf16(&dev, shape, s);
    let (x, w, b, w2, dout) = (
        r(&[n, c], 1.0),
        r(&[c, 4 * c], 0.02),
        r(&[4 * c], 0.02),
        r(&[4 * c, c], 0.02),
        r(&[n, c], 1.0),
    );
    let time = |f: &dyn Fn()| seconds_per_call(&dev, f) * 1e3;
    let (h, g) = matmul_gelu_forward(&x, &w, &b).unwrap();
    let fwd_epi = time(&|| {
        matmul_gelu_forward(&x, &w, &b).unwrap();
    });
    let fwd_plain = time(&|| {
        model::layers::matmul_gelu_forward_unfused(&x, &w, &b).unwrap();
    });
    let bwd_plain = time(&|| {
        matmul_gelu_backward(&dout, &g, &w2, &h).unwrap();
    });
    let bwd_epi = time(&|| {
        model::layers::matmul_gelu_backward_epilogue(&dout, &g, &w2, &h).unwrap();
    });
    println!(
        "gelu layers at N {n}, C {c}: forward GELU_AUX_BIAS {fwd_epi:.3} ms, GEMM + kernel \
         {fwd_plain:.3} ms; backward DGELU_BGRAD {bwd_epi:.3} ms, GEMMs + kernels {bwd_plain:.3} ms"
    );
}

/// Every GEMM of a gpt350m block at its training shape (N = 16 x 1024 rows, C = 1024), timed
/// alone and printed (`--nocapture`) as ms and TFLOP/s: where the step's GEMM time goes, layer
/// by layer and pass by pass. Asserts only finite outputs.
#[test]
fn gemm_timing_gpt350m_layers() {
    let (n, c) = (16384usize, 1024usize);
    let dev = Device::new_cuda(0).expect("a CUDA device");
    let r = |shape: &[usize], s: f32| randn_bf16(&dev, shape, s);
    let time = |f: &dyn Fn()| seconds_per_call(&dev, f);
    let mut total = 0.0;
    for (name, inp, out) in [
        ("qkv", c, 3 * c),
        ("attn proj", c, c),
        ("fc", c, 4 * c),
        ("fc proj", 4 * c, c),
    ] {
        let (x, w, b, dout, res) = (
            r(&[n, inp], 1.0),
            r(&[inp, out], 0.02),
            r(&[out], 0.02),
            r(&[n, out], 1.0),
            r(&[n, out], 1.0),
        );
        let flops = 2.0 * (n * inp * out) as f64;
        let fwd = match name {
            "fc" => time(&|| {
                matmul_gelu_forward(&x, &w, &b).unwrap();
            }),
            "qkv" => time(&|| {
                model::layers::matmul_forward(&x, &w, &b).unwrap();
            }),
            _ => time(&|| {
                model::layers::residual_matmul_forward(&res, &x, &w, &b).unwrap();
            }),
        };
        let bwd = time(&|| {
            model::layers::matmul_backward_no_bias(&dout, &x, &w).unwrap();
        });
        let (dx, dw) = model::layers::matmul_backward_no_bias(&dout, &x, &w).unwrap();
        for t in [&dx, &dw] {
            let m = t
                .to_dtype(DType::F32)
                .and_then(|t| t.abs())
                .and_then(|t| t.max_all())
                .and_then(|t| t.to_scalar::<f32>())
                .unwrap();
            assert!(m.is_finite(), "{name}: non-finite gradient");
        }
        total += fwd + bwd;
        println!(
            "gemm {name:>9} ({n} x {inp} -> {out}): forward {:.3} ms = {:.0} TFLOP/s, dx + dw \
             {:.3} ms = {:.0} TFLOP/s",
            fwd * 1e3,
            flops / fwd / 1e12,
            bwd * 1e3,
            2.0 * flops / bwd / 1e12
        );
    }
    println!(
        "gemm total a block {:.3} ms, x 24 layers = {:.1} ms a step",
        total * 1e3,
        total * 24e3
    );
}
