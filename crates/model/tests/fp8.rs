//! FP8 linear layers (layers/fp8_linear.rs, `LinearFormat::Fp8`): the product of exactly
//! representable operands is the dense product bit for bit; each operand is scaled along the
//! dimension its GEMM contracts (a row, a column or a weight tile), which a matrix whose rows
//! or columns differ by 10^8 in magnitude tells apart; and every family's model trains in FP8
//! close to its dense self, recomputation bitwise.

use candle_core::{DType, Device, Tensor};
use model::layers::{
    fp8_linear_backward, fp8_linear_forward, fp8_round, matmul_backward, residual_matmul_forward,
    COL_BLOCK, ROW_BLOCK, WEIGHT_TILE,
};
use model::{
    BackwardParams, Fp8Weight, LinearFormat, LinearWeight, Model, ModelLayout, Pass, Recompute,
    SavedInput, Sizes, UnitParams,
};

mod common;
use common::*;

/// An `r x c` matrix of k 2^q, k in -7..=7, with ±7 at every even i + j: every block of two
/// elements or more, of any of the three shapes, then holds ±7 2^q, so its scale is 2^q / 64
/// and each element's code k x 64 is exact: FP8 rounding leaves the matrix unchanged.
fn representable(r: usize, c: usize, q: i32, rng: &mut Rng) -> Tensor {
    let v: Vec<f32> = (0..r * c)
        .map(|k| {
            let (i, j) = (k / c, k % c);
            let sign = if rng.unif() < 0.5 { -1.0 } else { 1.0 };
            let m = match (i + j) % 2 {
                0 => 7.0,
                _ => (rng.unif() * 7.0).floor() as f32,
            };
            sign * m * 2f32.powi(q)
        })
        .collect();
    Tensor::from_vec(v, (r, c), &Device::Cpu).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().unwrap()
}

#[test]
fn representable_operands_multiply_as_the_dense_product() {
    let mut rng = Rng(3);
    // 130 x 260 crosses the 128 boundaries of every block shape.
    let (n, k, m) = (130, 260, 140);
    let x = representable(n, k, -3, &mut rng);
    let w = representable(k, m, -9, &mut rng);
    let b = representable(1, m, -4, &mut rng).reshape(m).unwrap();
    let r = representable(n, m, 1, &mut rng);
    let dout = representable(n, m, -6, &mut rng);
    for tile in [ROW_BLOCK, COL_BLOCK, WEIGHT_TILE] {
        let (a, b) = (bits(&fp8_round(&x, tile).unwrap()), bits(&x));
        if let Some(k) = (0..a.len()).find(|&k| a[k] != b[k]) {
            panic!(
                "{tile:?} [{k}]: {} vs {}",
                f32::from_bits(a[k]),
                f32::from_bits(b[k])
            );
        }
    }
    let y = fp8_linear_forward(&x, &w, Some(&b), Some(&r)).unwrap();
    assert_eq!(
        bits(&y),
        bits(&residual_matmul_forward(&r, &x, &w, &b).unwrap())
    );
    let (dx, dw, db) = fp8_linear_backward(&dout, &x, &w, true).unwrap();
    let (ddx, ddw, ddb) = matmul_backward(&dout, &x, &w).unwrap();
    assert_eq!(bits(&dx), bits(&ddx));
    assert_eq!(bits(&dw), bits(&ddw));
    assert_eq!(bits(&db.unwrap()), bits(&ddb));
}

/// A rank-one `x (N, K)` whose row `i` is `row_mag[i]` times a fixed pattern.
fn scaled_rows(row_mag: &[f32], k: usize) -> Tensor {
    let v: Vec<f32> = row_mag
        .iter()
        .flat_map(|&a| (0..k).map(move |j| a * (1.0 + (j % 5) as f32 / 7.0)))
        .collect();
    Tensor::from_vec(v, (row_mag.len(), k), &Device::Cpu).unwrap()
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let d: f32 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let n: f32 = want.iter().map(|b| b * b).sum();
    (d / n).sqrt()
}

#[test]
fn each_operand_is_scaled_along_what_its_gemm_contracts() {
    // Rows of 1e4 and 1e-4 magnitude. Row-wise blocks (the forward's x, the input gradient's
    // dout) keep the small rows to FP8's precision; one scale down a column would flush them to
    // zero (1e-4 x 448 / 1e4 is below e4m3's smallest subnormal).
    let mags = [1e4f32, 1e-4, 1e4, 1e-4];
    let x = scaled_rows(&mags, 16);
    let w = Tensor::from_vec(
        (0..16 * 8)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 8.0)
            .collect::<Vec<_>>(),
        (16, 8),
        &Device::Cpu,
    )
    .unwrap();
    let y = fp8_linear_forward(&x, &w, None, None).unwrap();
    let want = x.matmul(&w).unwrap();
    for (i, (g, e)) in rows(&y).iter().zip(rows(&want)).enumerate() {
        assert!(rel_err(g, &e) < 0.07, "forward row {i}: {g:?} vs {e:?}");
    }
    let dout = scaled_rows(&mags, 8);
    let (dx, _, _) = fp8_linear_backward(&dout, &x, &w, false).unwrap();
    let want = dout.matmul(&w.t().unwrap()).unwrap();
    for (i, (g, e)) in rows(&dx).iter().zip(rows(&want)).enumerate() {
        assert!(rel_err(g, &e) < 0.07, "input gradient row {i}");
    }
    // The weight gradient contracts over positions. dout takes one scale down 128 positions
    // of a column, so its columns of 1e4 and 1e-4 both keep their precision (a scale a row
    // would flush the small column).
    let xt = scaled_rows(&[1.0, 2.0, 1.0, 0.5], 6)
        .t()
        .unwrap()
        .contiguous()
        .unwrap(); // (6, 4)
    let dt = scaled_rows(&[1e4, 1e-4, 1e4], 6)
        .t()
        .unwrap()
        .contiguous()
        .unwrap(); // (6, 3): columns differ
    let wg = Tensor::zeros((4, 3), DType::F32, &Device::Cpu).unwrap();
    let (_, dw, _) = fp8_linear_backward(&dt, &xt, &wg, false).unwrap();
    let want = xt.t().unwrap().matmul(&dt).unwrap();
    let (got, want) = (rows(&dw.t().unwrap()), rows(&want.t().unwrap()));
    for (j, (g, e)) in got.iter().zip(want).enumerate() {
        assert!(
            rel_err(g, &e) < 0.07,
            "weight gradient column {j}: {g:?} vs {e:?}"
        );
    }
    // x takes one scale a 128 x 128 tile (INPUT_TILE: positions by channels), so channels 1e8
    // apart in one tile lose the small one, as a weight's tiles do; 128 x 1 blocks keep it.
    let xt = scaled_rows(&mags, 6).t().unwrap().contiguous().unwrap(); // (6, 4): channels differ
    let dt = scaled_rows(&[1.0, 1.0, 1.0], 6)
        .t()
        .unwrap()
        .contiguous()
        .unwrap();
    let (_, dw, _) = fp8_linear_backward(&dt, &xt, &wg, false).unwrap();
    assert!(
        rows(&dw)[1].iter().all(|&v| v == 0.0),
        "x's small channel flushed"
    );
    assert!(
        rel_err(
            &rows(&dw)[0],
            &rows(&xt.t().unwrap().matmul(&dt).unwrap())[0]
        ) < 0.07
    );
    let kept = rows(&fp8_round(&xt, COL_BLOCK).unwrap().t().unwrap());
    assert!((kept[1][0] - rows(&xt.t().unwrap())[1][0]).abs() < 1e-4 / 16.0);
    // A weight takes one scale a 128 x 128 tile: with 1e4 at (0, 0) and 1e-4 elsewhere, the
    // small entries of its tile go to zero while the tile of (128, 128) keeps its own; a scale
    // a row would keep row 1.
    let big = 129;
    let v: Vec<f32> = (0..big * big)
        .map(|k| if k == 0 { 1e4 } else { 1e-4 })
        .collect();
    let wt = Tensor::from_vec(v, (big, big), &Device::Cpu).unwrap();
    let r = rows(&fp8_round(&wt, WEIGHT_TILE).unwrap());
    assert_eq!(r[1][1], 0.0);
    assert!((r[128][128] - 1e-4).abs() < 1e-4 / 16.0);
    assert!((rows(&fp8_round(&wt, ROW_BLOCK).unwrap())[1][1] - 1e-4).abs() < 1e-4 / 16.0);
}

fn sizes() -> Sizes {
    Sizes {
        n_layer: 2,
        n_embd: 16,
        n_head: 4,
        seq_len: 8,
        vocab_size: 37,
        n_kv_head: Some(2),
        head_dim: None,
        ffn_hidden: Some(24),
        tie_embeddings: None,
    }
}

#[test]
fn every_family_trains_in_fp8_close_to_dense_and_recomputes_bitwise() {
    // Each recomputation mode gives FP8's gradients to the bit (`Recompute`).
    for (name, cfg) in model::every_family(&sizes()) {
        let mut rng = Rng(11);
        // The model's own initialisation: FP8's error relative to a gradient depends on how
        // much of it cancels, which uniform positive weights make far larger than a model has.
        let params: Vec<Tensor> = ModelLayout::new(&cfg)
            .units
            .iter()
            .map(|u| {
                let mut buf = vec![0f32; u.numel];
                model::init_unit_range(&cfg, u, 7, 0, &mut buf);
                Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
            })
            .collect();
        let tokens = rng.tokens((3, 8), cfg.vocab_size);
        let targets = rng.tokens((3, 8), cfg.vocab_size);
        let dense = Model::new(cfg.clone()).unwrap();
        let fp8 = Model::new(cfg.clone())
            .unwrap()
            .with_linears(LinearFormat::Fp8);
        assert_eq!(fp8.linears(), LinearFormat::Fp8);
        let (l0, g0) = dense
            .loss_and_grads(&params, &tokens, &targets, Recompute::Off)
            .unwrap();
        let (l1, g1) = fp8
            .loss_and_grads(&params, &tokens, &targets, Recompute::Off)
            .unwrap();
        let (l2, g2) = fp8
            .loss_and_grads(&params, &tokens, &targets, Recompute::Full)
            .unwrap();
        assert!(
            (l1 - l0).abs() < 1e-3 * l0,
            "{name}: loss {l1} vs dense {l0}"
        );
        assert_ne!(l1, l0, "{name}: FP8 computed nothing of its own");
        assert_eq!(l2, l1, "{name}: recomputation");
        // The attention half alone (Llama-family blocks; GPT-2's refuse it in one line).
        let half = fp8.loss_and_grads(&params, &tokens, &targets, Recompute::Attention);
        let g3 = match (cfg.family().mlp_kept_width(&cfg), half) {
            (Some(_), Ok((l3, g3))) => {
                assert_eq!(l3, l1, "{name}: the attention half's recomputation");
                g3
            }
            (None, Err(e)) => {
                assert!(e.to_string().contains("attention"), "{name}: {e}");
                g2.clone()
            }
            (width, r) => panic!("{name}: width {width:?} but {:?}", r.map(|r| r.0)),
        };
        for (u, ((a, b), (c, d))) in g0.iter().zip(&g1).zip(g2.iter().zip(&g3)).enumerate() {
            let (a, b) = (f32s(a), f32s(b));
            assert_eq!(f32s(c), b, "{name}, unit {u}: recomputation");
            assert_eq!(
                f32s(d),
                b,
                "{name}, unit {u}: the attention half's recomputation"
            );
            let d: f32 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
            let n: f32 = a.iter().map(|x| x * x).sum();
            assert!(
                d.sqrt() <= 0.1 * n.sqrt() + 1e-9,
                "{name}, unit {u}: gradient"
            );
        }
    }
}

/// A walk that keeps each unit's parameters from its forward for its backward (W = 1), its
/// blocks' FP8 weights quantised once for both passes, computes what a walk that gathers
/// them again computes: the loss and every gradient bit for bit, in every family and every
/// recomputation mode; it gathers each unit once, in forward order.
#[test]
fn a_walk_keeping_the_forwards_weights_equals_one_gathering_them_again() {
    for (name, cfg) in model::every_family(&sizes()) {
        let params: Vec<Tensor> = ModelLayout::new(&cfg)
            .units
            .iter()
            .map(|u| {
                let mut buf = vec![0f32; u.numel];
                model::init_unit_range(&cfg, u, 9, 0, &mut buf);
                Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
            })
            .collect();
        let mut rng = Rng(13);
        let tokens = rng.tokens((2, 8), cfg.vocab_size);
        let targets = rng.tokens((2, 8), cfg.vocab_size);
        for linears in [LinearFormat::Dense, LinearFormat::Fp8] {
            let again = Model::new(cfg.clone()).unwrap().with_linears(linears);
            let kept = again.clone().with_backward_params(BackwardParams::Kept);
            let n = kept.units().len();
            assert_eq!(kept.gather_order(Pass::Train), (0..n).collect::<Vec<_>>());
            assert!(again.gather_order(Pass::Train).len() > n);
            for mode in [Recompute::Off, Recompute::Full, Recompute::Attention] {
                let Ok((l0, g0)) = again.loss_and_grads(&params, &tokens, &targets, mode) else {
                    continue; // GPT-2 refuses the attention half
                };
                let (l1, g1) = kept
                    .loss_and_grads(&params, &tokens, &targets, mode)
                    .unwrap();
                assert_eq!(l1, l0, "{name}, {linears:?}, {mode}: loss");
                for (u, (a, b)) in g0.iter().zip(&g1).enumerate() {
                    assert_eq!(bits(b), bits(a), "{name}, {linears:?}, {mode}: unit {u}");
                }
            }
        }
    }
}

/// The form FP8 qwZ hands a block (`UnitParams` with each linear weight's codes and tile
/// scales, zeros in the flat buffer where the weights lie) computes exactly what the block
/// computes quantising its dense weights itself: forward, input gradient and every parameter
/// gradient, bit for bit, in every family; at a width of 144 each weight has two tiles a side.
#[test]
fn a_block_reading_gathered_fp8_weights_equals_one_quantising_its_own() {
    let wide = Sizes {
        n_embd: 144,
        n_head: 4,
        n_kv_head: Some(2),
        ffn_hidden: Some(272),
        ..sizes()
    };
    for sizes in [sizes(), wide] {
        for (name, cfg) in model::every_family(&sizes) {
            let model = Model::new(cfg.clone())
                .unwrap()
                .with_linears(LinearFormat::Fp8);
            let u = 1;
            let unit = &model.units()[u];
            let mut buf = vec![0f32; unit.numel];
            model::init_unit_range(&cfg, unit, 3, 0, &mut buf);
            let flat = Tensor::from_vec(buf.clone(), unit.numel, &Device::Cpu).unwrap();
            let mut hollow = buf;
            let mut fp8 = Vec::new();
            for p in unit.linear_weights() {
                fp8.push((
                    p.offset,
                    Fp8Weight::quantize(&p.view(&flat).unwrap()).unwrap(),
                ));
                hollow[p.offset..p.offset + p.numel].fill(0.0);
            }
            assert!(fp8.len() >= 4, "{name}: its linear weights");
            let hollow = Tensor::from_vec(hollow, unit.numel, &Device::Cpu).unwrap();
            let dense = UnitParams::dense(flat);
            let gathered = UnitParams::with_fp8(hollow, fp8);

            let mut rng = Rng(5);
            let x = Tensor::from_vec(
                rng.vec(3 * 8 * cfg.n_embd, 1.0)
                    .iter()
                    .map(|&v| v as f32)
                    .collect::<Vec<_>>(),
                (3, 8, cfg.n_embd),
                &Device::Cpu,
            )
            .unwrap();
            let dout = x.affine(0.5, 0.1).unwrap();
            let (y0, s0) = model.forward(u, &dense, &x, Recompute::Off).unwrap();
            let (y1, s1) = model.forward(u, &gathered, &x, Recompute::Off).unwrap();
            assert_eq!(bits(&y1), bits(&y0), "{name}, C={}: forward", cfg.n_embd);
            let (dx0, g0) = model.backward(u, Some(&dense), &s0, &dout).unwrap();
            let (dx1, g1) = model.backward(u, Some(&gathered), &s1, &dout).unwrap();
            let (dx0, dx1) = (dx0.unwrap(), dx1.unwrap());
            assert_eq!(bits(&dx1), bits(&dx0), "{name}, C={}: dx", cfg.n_embd);
            assert_eq!(bits(&g1), bits(&g0), "{name}, C={}: gradients", cfg.n_embd);
        }
    }
}

/// An `r x c` f32 matrix of `rng`'s uniform values times `scale`.
fn uniform_matrix(rng: &mut Rng, r: usize, c: usize, scale: f64) -> Tensor {
    let v: Vec<f32> = rng.vec(r * c, scale).iter().map(|&v| v as f32).collect();
    Tensor::from_vec(v, (r, c), &Device::Cpu).unwrap()
}

/// A packed projection's backward from the column blocks its forward kept of `x` (in the same
/// read as its row blocks), or that `saved_input` makes alone, equals the one from `x` bit for
/// bit; a dense layer refuses such a kept input in one line.
#[test]
fn a_projection_backward_from_its_kept_input_equals_one_from_x() {
    let mut rng = Rng(11);
    let mut randn = |r: usize, c: usize, scale: f64| uniform_matrix(&mut rng, r, c, scale);
    let x = randn(40, 130, 1.0);
    let ws = [randn(130, 60, 0.1), randn(130, 70, 0.1)];
    let dout = randn(40, 130, 1.0);
    let ws: Vec<LinearWeight> = ws.into_iter().map(LinearWeight::Dense).collect();
    let fp8 = LinearFormat::Fp8;
    let none = [None, None];
    let y = fp8.cols_forward(&x, &ws, None, None).unwrap();
    let (dx, dws) = fp8
        .cols_backward(&dout, &SavedInput::Dense(x.clone()), &ws, &none)
        .unwrap();
    let (y_kept, kept) = fp8.cols_forward_saving(&x, &ws, None, None).unwrap();
    assert_eq!(bits(&y_kept), bits(&y), "forward");
    for kept in [kept, fp8.saved_input(&x).unwrap()] {
        assert!(matches!(&kept, SavedInput::Fp8(k) if k.dims() == (40, 130)));
        let (dx_k, dws_k) = fp8.cols_backward(&dout, &kept, &ws, &none).unwrap();
        assert_eq!(bits(&dx_k), bits(&dx), "dx");
        for (a, b) in dws_k.iter().zip(&dws) {
            assert_eq!(bits(a), bits(b), "dw");
        }
        let err = LinearFormat::Dense
            .cols_backward(&dout, &kept, &ws, &none)
            .unwrap_err();
        assert!(err.to_string().contains("FP8-saved input"), "{err}");
    }
    // The dense format keeps x itself.
    let (_, dense_kept) = LinearFormat::Dense
        .cols_forward_saving(&x, &ws, None, None)
        .unwrap();
    assert!(matches!(dense_kept, SavedInput::Dense(t) if bits(&t) == bits(&x)));
}

/// A Llama MLP's backward in FP8 (`swiglu_mlp_backward`): down's weight gradient scales act
/// and dout a whole column (all the tokens) at a time, the other GEMMs in 128-element blocks.
/// Tokens 0..128 of act are about 10 and those after 1e-6; dout is zero on the first 128 and
/// about 1 after. With one scale a column, the small half of act is below e4m3's range and
/// down's weight gradient is exactly zero (with 128 x 1 blocks it is act[128..]^T dout[128..],
/// about 1e-5); gate|up's weight gradient, in blocks, keeps that half. The backward equals the
/// composition of the layers in that recipe, bit for bit.
#[test]
fn a_llama_mlp_scales_downs_weight_gradient_a_whole_column_at_a_time() {
    let (n, c, f) = (256, 32, 48);
    let mut rng = Rng(12);
    let mut randn = |r: usize, c: usize, scale: f64| uniform_matrix(&mut rng, r, c, scale);
    // gate about 10 (silu(gate) about gate), up 1 on the first 128 tokens and 1e-7 after.
    let gate = (randn(n, f, 0.1).abs().unwrap() + 10.0).unwrap();
    let up_big = randn(128, f, 1.0);
    let up_small = (randn(n - 128, f, 1.0) * 1e-7).unwrap();
    let up = Tensor::cat(&[&up_big, &up_small], 0).unwrap();
    let gu = Tensor::cat(&[&gate, &up], 1).unwrap();
    let dout = Tensor::cat(
        &[
            &Tensor::zeros((128, c), DType::F32, &Device::Cpu).unwrap(),
            &randn(n - 128, c, 1.0),
        ],
        0,
    )
    .unwrap();
    let (w_down, gate_up) = (
        LinearWeight::Dense(randn(f, c, 0.1)),
        [LinearWeight::Dense(randn(c, 2 * f, 0.1))],
    );
    let x = randn(n, c, 1.0);
    let fp8 = LinearFormat::Fp8;
    let n2 = fp8.saved_input(&x).unwrap();
    let (_, act) = fp8.swiglu_down_forward(&gu, &w_down, None, false).unwrap();
    let (dn2, dw_down, dws) = fp8
        .swiglu_mlp_backward(
            &dout,
            &gu,
            (&act, &n2),
            (&w_down, &gate_up),
            (None, &[None]),
        )
        .unwrap();
    assert!(
        f32s(&dw_down).iter().all(|&v| v == 0.0),
        "down's weight gradient, act scaled a whole column at a time"
    );
    // The same layers with act kept in 128 x 1 blocks see the small half.
    let act_dense = model::layers::swiglu_packed_forward(&gu).unwrap();
    let blocks = fp8.saved_input(&act_dense).unwrap();
    let down = std::slice::from_ref(&w_down);
    let (dact, dw_blocks) = fp8.cols_backward(&dout, &blocks, down, &[None]).unwrap();
    let largest = f32s(&dw_blocks[0]).iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        largest > 1e-7 && largest < 1e-3,
        "128 x 1 blocks keep act's small half: {largest}"
    );
    // dn2 and gate|up's gradient as the layers compose them (dact does not depend on how act
    // was kept).
    let dgu = model::layers::swiglu_packed_backward(&dact, &gu).unwrap();
    let (dn2_u, dws_u) = fp8.cols_backward(&dgu, &n2, &gate_up, &[None]).unwrap();
    assert_eq!(bits(&dn2), bits(&dn2_u), "dn2");
    assert_eq!(bits(&dws[0]), bits(&dws_u[0]), "dw_gate_up");
    // And the dense format's MLP backward is that of its layers too.
    let dense = LinearFormat::Dense;
    let (_, act_d) = dense
        .swiglu_down_forward(&gu, &w_down, None, false)
        .unwrap();
    let n2_d = dense.saved_input(&x).unwrap();
    let (_, dw_down_d, _) = dense
        .swiglu_mlp_backward(
            &dout,
            &gu,
            (&act_d, &n2_d),
            (&w_down, &gate_up),
            (None, &[None]),
        )
        .unwrap();
    let want = act_dense.t().unwrap().matmul(&dout).unwrap();
    assert_eq!(bits(&dw_down_d), bits(&want), "dense dw_down");
}

/// A dense block refuses a weight gathered in FP8 in one line (a plan that sent FP8 weights to
/// dense layers), and a weight's codes and scales must agree in shape.
#[test]
fn fp8_weights_are_refused_where_they_do_not_fit() {
    let (name, cfg) = model::every_family(&sizes()).remove(0);
    let model = Model::new(cfg.clone()).unwrap();
    let unit = &model.units()[1];
    let flat = Tensor::zeros(unit.numel, DType::F32, &Device::Cpu).unwrap();
    let fp8 = unit
        .linear_weights()
        .map(|p| {
            (
                p.offset,
                Fp8Weight::quantize(&p.view(&flat).unwrap()).unwrap(),
            )
        })
        .collect();
    let x = Tensor::zeros((1, 8, cfg.n_embd), DType::F32, &Device::Cpu).unwrap();
    let err = model
        .forward(1, &UnitParams::with_fp8(flat, fp8), &x, Recompute::Off)
        .unwrap_err()
        .to_string();
    assert!(err.contains("FP8-gathered weight"), "{name}: {err}");

    let codes = Tensor::zeros((130, 16), DType::U8, &Device::Cpu).unwrap();
    let one = Tensor::zeros((1, 1), DType::F32, &Device::Cpu).unwrap();
    assert!(Fp8Weight::new(codes.clone(), one).is_err());
    let two = Tensor::zeros((2, 1), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(Fp8Weight::new(codes, two).unwrap().dims(), (130, 16));
}
