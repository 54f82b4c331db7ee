//! `trainer plan --advise`: which of qwZ, hpZ and qgZ to turn on for a config on a cluster.
//!
//! The throughput model ([`super::throughput`]) predicts the step of all eight sets of
//! techniques (each resolved as `--throughput` resolves its variants), and `zero::rank_memory`
//! plus the activations gives each set's memory per rank, the plan's `memory.total`. For each
//! technique the advice shows its gain alone (ZeRO-3's step over the technique's), its gain
//! added last (the other two's step over all three's) and the memory it adds alone (hpZ's
//! secondary partition, qgZ's error-feedback buffers; qwZ's INT8 buffers are transient and
//! counted nowhere in the plan, so it adds only its padding).
//!
//! The recommendation ([`recommend`]) is greedy: from ZeRO-3, add the technique that shortens
//! the current set's step most, as long as it does so by at least [`GAIN_THRESHOLD`] and the
//! new set's memory fits the GPU's (`--gpu`). Interactions are what it is greedy for: at a fast
//! link qgZ alone may gain 3% and nothing once hpZ is on.

use serde::Serialize;
use zero::{ZeroConfig, ZeroPlan};

use super::throughput::{predict, variant_plan, Cluster, Workload};
use report::readable;

/// The least speed-up (step time before over after) a technique must bring to be turned on.
pub const GAIN_THRESHOLD: f64 = 1.02;

/// The techniques, as bits of a set: qwZ 1, hpZ 2, qgZ 4.
pub const TECHNIQUES: [&str; 3] = ["qwZ", "hpZ", "qgZ"];

/// The name of the set `mask` (`"ZeRO-3"` for none).
pub fn set_name(mask: usize) -> String {
    let names: Vec<&str> = (0..3)
        .filter(|t| mask & (1 << t) != 0)
        .map(|t| TECHNIQUES[t])
        .collect();
    match names.is_empty() {
        true => "ZeRO-3".into(),
        false => names.join(" + "),
    }
}

/// What the advice says of one technique.
#[derive(Debug, Serialize)]
pub struct TechniqueAdvice {
    pub name: &'static str,
    /// ZeRO-3's predicted step over the technique alone's.
    pub speedup_alone: f64,
    /// The predicted step of the other two techniques over that of all three.
    pub speedup_added_last: f64,
    /// Bytes a rank holds with the technique alone, less ZeRO-3's (negative: fewer).
    pub memory_alone: i64,
    /// Whether the recommendation turns it on.
    pub recommended: bool,
}

/// The `advice` section of the report.
#[derive(Debug, Serialize)]
pub struct Advice {
    pub threshold: f64,
    /// The GPU's memory, bytes.
    pub memory_capacity: u64,
    /// ZeRO-3's memory per rank (the plan's `memory.total` without any technique).
    pub zero3_memory: u64,
    pub techniques: Vec<TechniqueAdvice>,
    /// The recommended set, by name (`"ZeRO-3"` for none).
    pub recommended: String,
    /// ZeRO-3's step over the recommended set's.
    pub recommended_speedup: f64,
    /// The recommended set's memory per rank.
    pub recommended_memory: u64,
}

/// The set to turn on, as a mask (see [`TECHNIQUES`]), from each set's predicted step
/// (`step_s[mask]`) and memory per rank (`memory[mask]`): greedy from none, each time the
/// technique whose addition shortens the step most, while that gain is at least `threshold`
/// and the new set fits in `capacity`.
pub fn recommend(step_s: &[f64; 8], memory: &[u64; 8], capacity: u64, threshold: f64) -> usize {
    let mut set = 0;
    loop {
        let best = (0..3)
            .map(|t| set | (1 << t))
            .filter(|&next| next != set && memory[next] <= capacity)
            .map(|next| (next, step_s[set] / step_s[next]))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((next, gain)) if gain >= threshold => set = next,
            _ => return set,
        }
    }
}

/// The advice for `work` under the sets of `base` on `c`, with `memory` a plan's bytes per rank.
pub fn advise(
    work: &Workload,
    base: &ZeroConfig,
    steps: u64,
    c: &Cluster,
    memory: impl Fn(&ZeroPlan) -> u64,
) -> zero::Result<Advice> {
    let (mut step_s, mut bytes) = ([0.0; 8], [0u64; 8]);
    for mask in 0..8 {
        let on = |t: usize| mask & (1 << t) != 0;
        let plan = variant_plan(base, (on(0), on(1), on(2)), c.topology, steps)?
            .with_linears(work.model.linears(), work.model.layout());
        step_s[mask] = predict(work, &plan, c).step_s;
        bytes[mask] = memory(&plan);
    }
    let capacity = (c.gpu.memory_gib * (1u64 << 30) as f64) as u64;
    let set = recommend(&step_s, &bytes, capacity, GAIN_THRESHOLD);
    let techniques = (0..3)
        .map(|t| TechniqueAdvice {
            name: TECHNIQUES[t],
            speedup_alone: step_s[0] / step_s[1 << t],
            speedup_added_last: step_s[7 & !(1 << t)] / step_s[7],
            memory_alone: bytes[1 << t] as i64 - bytes[0] as i64,
            recommended: set & (1 << t) != 0,
        })
        .collect();
    Ok(Advice {
        threshold: GAIN_THRESHOLD,
        memory_capacity: capacity,
        zero3_memory: bytes[0],
        techniques,
        recommended: set_name(set),
        recommended_speedup: step_s[0] / step_s[set],
        recommended_memory: bytes[set],
    })
}

/// `+1.08 GiB`, `-64 B`.
fn signed_bytes(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "+" };
    format!("{sign}{}", readable::bytes(n.unsigned_abs()))
}

/// The advice as an aligned table and the recommendation line.
pub fn table(a: &Advice) -> String {
    let mut o = format!(
        "\nadvice: a technique goes on if it gains at least {:.0}% and the set fits {} a GPU\n",
        (a.threshold - 1.0) * 100.0,
        readable::bytes(a.memory_capacity)
    );
    o += &format!(
        "  {:<6}{:>8}{:>13}{:>16}  {}\n",
        "", "alone", "added last", "memory alone", "on"
    );
    for t in &a.techniques {
        o += &format!(
            "  {:<6}{:>7.2}x{:>12.2}x{:>16}  {}\n",
            t.name,
            t.speedup_alone,
            t.speedup_added_last,
            signed_bytes(t.memory_alone),
            if t.recommended { "yes" } else { "no" }
        );
    }
    o += &format!(
        "  recommended: {} ({:.2}x ZeRO-3's tokens/s, {} a rank",
        a.recommended,
        a.recommended_speedup,
        readable::bytes(a.recommended_memory)
    );
    o += &match a.zero3_memory > a.memory_capacity {
        true => format!(
            "; ZeRO-3 itself needs {}, over the GPU's {})\n",
            readable::bytes(a.zero3_memory),
            readable::bytes(a.memory_capacity)
        ),
        false => ")\n".into(),
    };
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of the eight sets (qwZ 1, hpZ 2, qgZ 4) from each technique's saving, as a slow
    /// link gives them: each removes part of the exposed communication.
    fn steps(base: f64, saves: [f64; 3]) -> [f64; 8] {
        std::array::from_fn(|m| {
            base - (0..3)
                .filter(|t| m & (1 << t) != 0)
                .map(|t| saves[t])
                .sum::<f64>()
        })
    }

    const ROOM: u64 = 100;

    #[test]
    fn a_slow_link_turns_on_every_technique_that_gains() {
        let s = steps(10.0, [2.0, 2.5, 4.0]);
        assert_eq!(recommend(&s, &[10; 8], ROOM, 1.02), 7);
        assert_eq!(set_name(7), "qwZ + hpZ + qgZ");
    }

    #[test]
    fn a_technique_under_the_threshold_stays_off() {
        // qwZ saves 1% of the step: off; hpZ and qgZ on.
        let s = steps(10.0, [0.1, 1.0, 2.0]);
        assert_eq!(recommend(&s, &[10; 8], ROOM, 1.02), 6);
        // A fast link: nothing gains 2%.
        let fast = steps(10.0, [0.05, 0.1, 0.15]);
        assert_eq!(recommend(&fast, &[10; 8], ROOM, 1.02), 0);
        assert_eq!(set_name(0), "ZeRO-3");
    }

    #[test]
    fn a_technique_that_does_not_fit_stays_off() {
        let s = steps(10.0, [2.0, 2.5, 4.0]);
        // hpZ's secondary partition takes the memory over the limit in every set with it.
        let memory: [u64; 8] = std::array::from_fn(|m| if m & 2 != 0 { ROOM + 1 } else { 50 });
        assert_eq!(recommend(&s, &memory, ROOM, 1.02), 5);
    }

    /// Interactions: hpZ alone gains most, and qgZ, which alone gains 5%, gains nothing once hpZ
    /// has hidden the communication: the greedy rule stops at hpZ.
    #[test]
    fn the_gain_counted_is_over_the_set_so_far() {
        let mut s = steps(10.0, [0.0, 3.0, 0.5]);
        s[6] = s[2];
        s[7] = s[3];
        assert_eq!(recommend(&s, &[10; 8], ROOM, 1.02), 2);
    }
}
