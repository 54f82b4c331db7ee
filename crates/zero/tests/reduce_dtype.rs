//! `zero.reduce_dtype = "bf16"` against the default fp32 reduce-scatter, at W = 4 as 2 nodes x
//! 2, for GPT-2 and Llama (tied and untied head): the same gradient norms within bf16's rounding
//! (a reduction scaled wrong, or summed over a wrong set of ranks, is off by a factor), the
//! same loss curve within a tolerance far below what a scaling error or a lost rank moves, and
//! the byte counters equal to the plan's volume (the reduce-scatter at 2 bytes an element).

use comm::{Communicator, Topology};
use model::{ModelConfig, ModelLayout};
use zero::{volume, Engine, EngineOptions, ReduceDtype, ZeroConfig, ZeroPlan};

const STEPS: usize = 20;
/// Micro-batches a rank a step: the second adds its bf16-reduced slice into the f32 shard.
const MICRO: usize = 2;

fn models() -> [(&'static str, ModelConfig); 3] {
    [
        ("gpt2", ModelConfig::gpt2(2, 16, 2, 8, 37)),
        (
            "llama tied",
            ModelConfig::llama(2, 16, 4, 2, 24, 8, 37, true),
        ),
        (
            "llama untied",
            ModelConfig::llama(2, 16, 4, 2, 24, 8, 37, false),
        ),
    ]
}

fn topology() -> Topology {
    Topology::new(4, 2).unwrap()
}

fn zero(dtype: ReduceDtype) -> ZeroConfig {
    ZeroConfig {
        reduce_dtype: dtype,
        ..Default::default()
    }
}

fn sequence(s: usize) -> Vec<u32> {
    (0..8u32)
        .map(|i| (i * 7 + s as u32 * 13 + 1) % 37)
        .collect()
}

struct Curve {
    losses: Vec<f64>,
    norms: Vec<f64>,
    bytes: Vec<comm::ByteCounters>,
}

/// `STEPS` steps of a global batch of 8 sequences (`MICRO` a rank) at 2 nodes x 2.
fn train(cfg: &ModelConfig, z: ZeroConfig) -> Curve {
    let out = comm::run_local(topology(), |c| -> zero::Result<_> {
        let rank = c.rank();
        let options = EngineOptions {
            zero: z.clone(),
            total_steps: STEPS as u64,
            seed: 5,
            ..Default::default()
        };
        let mut e = Engine::new(cfg.clone(), options, Box::new(c))?;
        let (mut losses, mut norms, mut bytes) = (vec![], vec![], vec![]);
        for _ in 0..STEPS {
            let before = e.comm().counters();
            let mut loss = 0.0;
            for m in 0..MICRO {
                let s = sequence(rank * MICRO + m);
                loss += e.forward_backward(&s, &s, 1.0 / MICRO as f32)?;
            }
            losses.push(e.mean_over_world(loss / MICRO as f64)?);
            norms.push(e.step(1e-2)?.grad_norm);
            bytes.push(e.comm().counters() - before);
        }
        Ok(Curve {
            losses,
            norms,
            bytes,
        })
    })
    .unwrap();
    let bytes = out.iter().flat_map(|o| o.bytes.clone()).collect();
    let first = out.into_iter().next().unwrap();
    Curve { bytes, ..first }
}

fn relative(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

#[test]
fn a_bf16_reduction_trains_on_the_fp32_curve() {
    for (name, cfg) in models() {
        let fp32 = train(&cfg, zero(ReduceDtype::Fp32));
        let bf16 = train(&cfg, zero(ReduceDtype::Bf16));
        assert!(
            fp32.losses[STEPS - 1] < fp32.losses[0] - 0.5,
            "{name}: the model learns: {:?}",
            fp32.losses
        );
        assert_ne!(
            fp32.norms, bf16.norms,
            "{name}: bf16 rounds nothing: no test"
        );
        // Step 1 reduces the same gradients: bf16 (8 bits of mantissa) rounds each rank's
        // contribution and each partial sum by at most 2^-9 relative, so the norm moves well
        // under 1%; a missing 1/W, or one rank's gradient lost, moves it by tens of percent.
        let first = relative(bf16.norms[0], fp32.norms[0]);
        assert!(first < 5e-3, "{name}: step-1 gradient norm off by {first}");
        // Later steps: the weights drift apart by the rounding, slowly.
        let worst_norm = (0..STEPS)
            .map(|s| relative(bf16.norms[s], fp32.norms[s]))
            .fold(0.0, f64::max);
        assert!(
            worst_norm < 0.05,
            "{name}: gradient norms off by {worst_norm}"
        );
        let worst_loss = (0..STEPS)
            .map(|s| relative(bf16.losses[s], fp32.losses[s]))
            .fold(0.0, f64::max);
        assert!(
            worst_loss < 5e-3,
            "{name}: losses off by {worst_loss}: {:?} vs {:?}",
            bf16.losses,
            fp32.losses
        );
    }
}

#[test]
fn the_counters_equal_the_volume_of_a_bf16_reduction() {
    let (_, cfg) = &models()[1];
    let numels: Vec<usize> = ModelLayout::new(cfg)
        .units
        .iter()
        .map(|u| u.numel)
        .collect();
    let mut inter = vec![];
    for dtype in [ReduceDtype::Fp32, ReduceDtype::Bf16] {
        let plan = ZeroPlan::resolve(&zero(dtype), topology(), STEPS as u64).unwrap();
        let order = model::Model::new(cfg.clone())
            .unwrap()
            .gather_order(model::Pass::Train);
        let expected = volume::logical_step_bytes(&plan, &numels, &order, 4, MICRO, 1);
        let out = train(cfg, zero(dtype));
        for b in &out.bytes {
            assert_eq!(*b, expected, "{dtype:?}");
        }
        inter.push(expected.inter);
    }
    // f32 parameters: gathers 4 + 4 bytes an element, the reduction 4 -> 2.
    let allreduce = 2 * 4 * 2;
    assert_eq!(
        (inter[0] - allreduce) * 10,
        (inter[1] - allreduce) * 12,
        "{inter:?}"
    );
}
