//! Running a job: the training loop ([`train`]) with its start-up checks ([`startup`]),
//! resume ([`resume`]), durable checkpoints and divergence ([`divergence`]), graceful stops
//! ([`stop`]) and hooks ([`hooks`]); the world it runs in ([`world`], [`launch`]); and the other
//! jobs a run config drives: `eval`, `generate` and `bench`. The `trainer` binary parses the
//! command line and calls these; this crate reads the run config ([`run`]), checkpoints
//! ([`checkpoint`]), the plan ([`plan`]) and Hugging Face files ([`hf`]), and none of them reads
//! it.

pub mod bench;
pub mod divergence;
pub mod eval;
pub mod generate;
pub mod hooks;
pub mod launch;
pub mod mfu;
pub mod out_of_memory;
pub mod resume;
pub mod schedule;
pub mod startup;
pub mod stop;
pub mod train;
pub mod world;
