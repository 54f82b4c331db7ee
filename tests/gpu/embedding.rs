//! Token + position embedding kernels against the CPU reference: the GPU runs in bf16, the CPU
//! in f32 on the same bf16-rounded values.
//!
//! Tolerance 4e-3 of max|cpu|: the forward adds in f32 and rounds once (error <= 2^-9 of the
//! element, ~2e-3), the backward sums in f32 and rounds once, the reference sums in f32 too
//! (order differences are ~2^-24 of the sum), so only one bf16 rounding separates them.

use crate::common::{assert_close, f32_bits, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::{embedding_backward, embedding_backward_onto, embedding_forward, TokenIndex};

/// The same bf16-rounded values as (CPU f32, GPU bf16).
fn pair(dims: &[usize], seed: u64, scale: f32, gpu: &Device) -> (Tensor, Tensor) {
    let n = dims.iter().product();
    let t = Tensor::from_vec(uniform(n, seed, scale), dims, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    (t.to_dtype(DType::F32).unwrap(), t.to_device(gpu).unwrap())
}

/// Token ids of (B, T): many repeats (a third of them one frequent id, others from a small
/// set), the rest spread over [0, V), including 0 and V - 1.
fn tokens(b: usize, t: usize, v: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..b * t)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match (i, s % 6) {
                (0, _) => 0,
                (1, _) => v as u32 - 1,
                (_, 0 | 1) => (v / 3) as u32,
                (_, 2) => ((s >> 20) % 5 * 7 % v as u64) as u32,
                _ => ((s >> 20) % v as u64) as u32,
            }
        })
        .collect()
}

fn check(b: usize, t: usize, c: usize, v: usize, max_t: usize) {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let (wte_c, wte_g) = pair(&[v, c], 1, 1.0, &gpu);
    let (wpe_c, wpe_g) = pair(&[max_t, c], 2, 0.5, &gpu);
    let tok = tokens(b, t, v, 3);
    let tok_c = Tensor::from_vec(tok, (b, t), &Device::Cpu).unwrap();
    let tok_g = tok_c.to_device(&gpu).unwrap();
    let shape = format!("(B, T, C, V) = ({b}, {t}, {c}, {v})");

    let out_g = embedding_forward(&tok_g, &wte_g, &wpe_g).unwrap();
    assert_eq!(out_g.dtype(), DType::BF16);
    let out_c = embedding_forward(&tok_c, &wte_c, &wpe_c).unwrap();
    assert_close(&format!("forward {shape}"), &out_g, &out_c, 4e-3);

    let (dout_c, dout_g) = pair(&[b, t, c], 4, 1.0, &gpu);
    let (tok_g, tok_c) = (
        TokenIndex::new(&tok_g, v).unwrap(),
        TokenIndex::new(&tok_c, v).unwrap(),
    );
    let (dwte_g, dwpe_g) = embedding_backward(&dout_g, &tok_g, v, max_t).unwrap();
    assert_eq!(dwte_g.dtype(), DType::BF16);
    let (dwte_c, dwpe_c) = embedding_backward(&dout_c, &tok_c, v, max_t).unwrap();
    assert_close(&format!("dwte {shape}"), &dwte_g, &dwte_c, 4e-3);
    assert_close(&format!("dwpe {shape}"), &dwpe_g, &dwpe_c, 4e-3);

    // Deterministic: a second run gives the same bits.
    let (dwte_2, dwpe_2) = embedding_backward(&dout_g, &tok_g, v, max_t).unwrap();
    assert!(
        f32_bits(&dwte_g) == f32_bits(&dwte_2),
        "dwte differs between runs {shape}"
    );
    assert!(
        f32_bits(&dwpe_g) == f32_bits(&dwpe_2),
        "dwpe differs between runs {shape}"
    );

    // Onto a tied head's gradient: the kernel adds the token rows into it in place, the same
    // values as adding the two gradients (compared as values: a -0.0 in a row no token
    // touches stays -0.0 in place, where the addition gives +0.0).
    let (_, head_g) = pair(&[v, c], 5, 1.0, &gpu);
    let added = (&head_g + &dwte_g).unwrap();
    let onto = head_g.copy().unwrap();
    let (summed, dwpe_o) = embedding_backward_onto(&dout_g, &tok_g, v, max_t, Some(onto)).unwrap();
    assert!(
        f32_bits(&dwpe_o) == f32_bits(&dwpe_g),
        "dwpe with onto {shape}"
    );
    let as_f32 = |t: &Tensor| -> Vec<f32> {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (got, want) = (as_f32(&summed), as_f32(&added));
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            a == b || (a.is_nan() && b.is_nan()),
            "dwte onto the head's {shape}: {i}: {a} vs {b}"
        );
    }
}

#[test]
fn embedding_small_with_repeated_tokens_and_spare_positions() {
    // T = 17 < max_t = 23: rows 17..23 of dwpe must be zero. C = 64: 8 vectors a row.
    check(3, 17, 64, 101, 23);
}

#[test]
fn embedding_gpt350m_shape() {
    check(16, 1024, 1024, 50304, 1024);
}

#[test]
fn embedding_forward_out_of_range_token_gives_nan() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let (_, wte) = pair(&[11, 16], 1, 1.0, &gpu);
    let (_, wpe) = pair(&[4, 16], 2, 1.0, &gpu);
    let tok = Tensor::new(&[[1u32, 11, 3]], &gpu).unwrap();
    let out = embedding_forward(&tok, &wte, &wpe)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec3::<f32>()
        .unwrap();
    assert!(
        out[0][1].iter().all(|x| x.is_nan()),
        "token 11 of V = 11: NaN row"
    );
    assert!(out[0][0].iter().chain(&out[0][2]).all(|x| x.is_finite()));
}

/// The index is made where the tokens are embedded: an id outside the vocabulary is refused
/// there.
#[test]
fn token_index_refuses_ids_outside_the_vocabulary() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let bad = Tensor::new(&[[1u32, 7, 8]], &gpu).unwrap();
    let err = TokenIndex::new(&bad, 8).unwrap_err().to_string();
    assert!(err.contains("token id 8 >= vocab size 8"), "{err}");
    assert!(TokenIndex::new(&bad, 9).is_ok());
}
