//! A CUDA allocation failure, explained in one line: what the run was doing, the device's free
//! and total memory and what this process held at its peak, what `trainer plan` estimated for
//! the config, and which settings lower it. candle reports it as
//! `DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")`, with no size and (under
//! `RUST_BACKTRACE`) a backtrace of `<unknown>` frames; neither helps a user choose a smaller
//! micro-batch.

use anyhow::anyhow;

use report::readable::bytes;
use run::Run;

/// The text cudarc gives an allocation failure.
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";

/// Whether `e` is (or was caused by) a CUDA allocation failure.
pub fn is_oom(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.to_string().contains(OOM))
}

/// `e` as the one line of an allocation failure, if it is one (else `e` unchanged). `run` is
/// the config that failed, `topology` its world, `device` the rank's device.
pub fn explain(
    e: anyhow::Error,
    run: &Run,
    topology: comm::Topology,
    device: &candle_core::Device,
) -> anyhow::Error {
    if !is_oom(&e) {
        return e;
    }
    // What the run was doing: the contexts above candle's error, e.g. "step 1: the forward and
    // backward of micro-batch 1".
    let text = format!("{e:#}");
    let first_line = text.lines().next().unwrap_or_default();
    let doing = first_line
        .split("DriverError(")
        .next()
        .unwrap_or_default()
        .trim_end_matches([' ', ':'])
        .trim();
    let doing = match doing.is_empty() {
        true => "the run".to_string(),
        false => doing.to_string(),
    };
    let config = &run.config;
    let device_now = match (
        run::device_memory::device_free_bytes(device),
        run::device_memory::device_total_bytes(device),
    ) {
        (Some(free), Some(total)) => format!("{} free of {}", bytes(free), bytes(total)),
        _ => "its free memory unknown".to_string(),
    };
    let held = run::device_memory::peak_bytes(device)
        .map(|p| format!(", this process held {} at its peak", bytes(p)))
        .unwrap_or_default();
    let estimate = match plan::rank_memory(run, topology) {
        Ok(m) => format!(
            "trainer plan estimates {} a rank ({} sharded states, {} working set, {} \
             activations of a micro-batch)",
            bytes(m.total),
            bytes(m.states.sharded_bytes()),
            bytes(m.states.working_bytes()),
            bytes(m.activations)
        ),
        Err(_) => "trainer plan has no estimate for it".to_string(),
    };
    let t = &config.train;
    let mut lower = vec![format!(
        "a smaller train.micro_batch ({} now)",
        t.micro_batch
    )];
    if config.model.recompute != model::Recompute::Full {
        lower.push("model.recompute = true".to_string());
    }
    lower.push(format!(
        "more ranks to shard over (dist.world_size, {} now)",
        topology.world()
    ));
    if config.zero.hpz_partition_size > 1 {
        lower.push("a smaller zero.hpz_partition_size".to_string());
    }
    anyhow!(
        "out of GPU memory in {doing}: the GPU has {device_now}{held}; {estimate}; lower it \
         with {}",
        lower.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use run::config::{Overrides, RunConfig};

    fn run(dir: &std::path::Path, recompute: bool) -> Run {
        let path = dir.join("run.toml");
        let text = format!(
            "[model]\npreset = \"tiny\"\nrecompute = {recompute}\n[train]\nmicro_batch = 4\n\
             global_batch = 8\n[dist]\nworld_size = 2\ngpus_per_node = 2\n\
             [data]\ntrain = [\"x.jsonl\"]\nvalid_fraction = 0.1\n"
        );
        std::fs::write(&path, text).unwrap();
        let config = RunConfig::load(&path, &Overrides::default()).unwrap();
        Run::resolve(config, None).unwrap()
    }

    /// candle's error under the run's contexts becomes one line saying what was being done,
    /// the plan's estimate and the settings that lower it; any other error passes unchanged.
    #[test]
    fn an_allocation_failure_is_one_line_naming_what_lowers_it() {
        let dir = tempfile::tempdir().unwrap();
        let topology = comm::Topology::new(2, 2).unwrap();
        let cpu = candle_core::Device::Cpu;
        let candle = anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")");
        let e = candle.context("step 3, the forward and backward of micro-batch 1");
        assert!(is_oom(&e));
        let line = format!("{:#}", explain(e, &run(dir.path(), false), topology, &cpu));
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.starts_with(
                "out of GPU memory in step 3, the forward and backward of micro-batch 1: "
            ),
            "{line}"
        );
        for part in [
            "trainer plan estimates ",
            "a smaller train.micro_batch (4 now)",
            "model.recompute = true",
            "dist.world_size, 2 now",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
        assert!(!line.contains("DriverError"), "{line}");

        // Recomputation already on is not offered again.
        let e = anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")");
        let line = format!("{:#}", explain(e, &run(dir.path(), true), topology, &cpu));
        assert!(line.starts_with("out of GPU memory in the run: "), "{line}");
        assert!(!line.contains("model.recompute"), "{line}");

        let other = anyhow!("no such file").context("reading x.jsonl");
        assert!(!is_oom(&other));
        let same = format!(
            "{:#}",
            explain(other, &run(dir.path(), false), topology, &cpu)
        );
        assert_eq!(same, "reading x.jsonl: no such file");
    }
}
