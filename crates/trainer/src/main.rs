//! `trainer`: trains GPT models with ZeRO-3 and ZeRO++ (see README.md and docs/).

mod tokenizer_cmd;

use job::{bench, eval, generate, stop, train};
use run::config;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use report::{plot, readable};

#[derive(Parser)]
#[command(
    name = "trainer",
    version,
    about = "GPT training with ZeRO-3 and ZeRO++"
)]
struct Cli {
    /// Run config (TOML); trains when no subcommand is given.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Override a config value: section.key=VALUE, VALUE in TOML syntax (quote strings).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE", global = true)]
    set: Vec<String>,
    /// Print the resolved config and exit.
    #[arg(long)]
    print_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Tokenise text files (.jsonl, .jsonl.zst, .jsonl.gz, .parquet) into a Megatron indexed
    /// dataset.
    PrepareData {
        /// Input files: .jsonl, .jsonl.zst or .jsonl.gz (one {"text": ...} per line) or .parquet
        /// (a string column "text").
        #[arg(long, num_args = 1.., required = true)]
        input: Vec<PathBuf>,
        /// Output prefix: writes PREFIX.bin and PREFIX.idx.
        #[arg(long)]
        output: PathBuf,
        /// Folder with the GPT-2 vocab.json and merges.txt, or a tokenizer.json (or a folder
        /// holding one).
        #[arg(long, default_value = "data/gpt2")]
        tokenizer: PathBuf,
        /// The end-of-document token (default: the tokenizer's own).
        #[arg(long, value_name = "TOKEN")]
        eod_token: Option<String>,
        /// The JSON field or Parquet column holding the text.
        #[arg(long, value_name = "NAME", default_value = data::TEXT_COLUMN)]
        text_column: String,
        /// Fraction of documents held out into PREFIX_valid.{bin,idx}.
        #[arg(long, default_value_t = 0.0)]
        valid_fraction: f64,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Train a byte-level BPE tokenizer (GPT-2's kind, <|endoftext|> ending documents) on
    /// text files and write it as a tokenizer.json (docs/corpus.md, "Tokenizers").
    Tokenizer {
        /// Input files, as for prepare-data.
        #[arg(long, num_args = 1.., required = true)]
        input: Vec<PathBuf>,
        /// Tokens in all: 256 bytes, the special tokens and the merges learnt.
        #[arg(long, value_name = "N")]
        vocab_size: usize,
        /// The tokenizer.json to write.
        #[arg(long)]
        output: PathBuf,
        /// More special tokens, after <|endoftext|> (repeat, or comma-separated).
        #[arg(long, value_name = "TOKEN", value_delimiter = ',')]
        special: Vec<String>,
        /// The JSON field or Parquet column holding the text.
        #[arg(long, value_name = "NAME", default_value = data::TEXT_COLUMN)]
        text_column: String,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Write a checkpoint's model as one safetensors file with its family's Hugging Face names
    /// (and config.json beside it), loadable by transformers' AutoModelForCausalLM.
    Export {
        /// A checkpoint folder (its newest step) or one `step_<N>` folder.
        #[arg(long)]
        checkpoint: PathBuf,
        /// Output file, e.g. hf/model.safetensors.
        #[arg(long)]
        output: PathBuf,
        /// The tokenizer to write beside it as tokenizer.json (a GPT-2 folder or a
        /// tokenizer.json); default: the run's `data.tokenizer`, from the config.toml of the
        /// run directory that holds the checkpoint folder.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
    /// The loss and perplexity of a checkpoint on held-out data, without training: by default
    /// the run's own validation data, as training evaluated it (docs/operations.md, "Evaluating
    /// and sampling a checkpoint").
    Eval {
        #[command(flatten)]
        from: FromCheckpoint,
        /// Datasets to evaluate, each on its own: .bin/.idx prefixes or text files (.jsonl,
        /// .jsonl.zst, .jsonl.gz, .parquet), tokenised with the run's tokenizer. Default: the
        /// run's validation data.
        #[arg(long, num_args = 1..)]
        data: Vec<PathBuf>,
        /// Sequences of each dataset (0 = all). Default: the run's log.eval_samples.
        #[arg(long, value_name = "N")]
        samples: Option<usize>,
    },
    /// Text from a checkpoint, with a KV cache, on the CPU or the GPU: greedy at temperature
    /// 0, else sampled from the top-k tokens (docs/operations.md, "Evaluating and sampling a
    /// checkpoint").
    Generate {
        #[command(flatten)]
        from: FromCheckpoint,
        /// The text to continue (default: a new document, the end-of-document token alone).
        #[arg(long, default_value = "")]
        prompt: String,
        #[arg(long, value_name = "N", default_value_t = 64)]
        max_new_tokens: usize,
        /// 0 = greedy.
        #[arg(long, value_name = "T", default_value_t = 0.8)]
        temperature: f64,
        /// Sample from the K likeliest tokens only (0 = all).
        #[arg(long, value_name = "K", default_value_t = 200)]
        top_k: usize,
        #[arg(long, value_name = "S", default_value_t = 1234)]
        seed: u64,
        /// Stop at the end-of-document token.
        #[arg(long)]
        stop_at_eod: bool,
    },
    /// Draw val_loss and loss against tokens, one colour per run; or, with --bench, tokens/s
    /// per GPU against the link bandwidth.
    ///
    /// Loss curves come from metrics.jsonl files, each run named by the ZeRO settings of its
    /// config.toml. --bench reads `trainer bench --json` lines and also prints the figure's
    /// numbers as a Markdown table (docs/bench.md, "trainer plot").
    Plot {
        /// metrics.jsonl files (or run folders holding one and their config.toml).
        metrics: Vec<PathBuf>,
        /// Instead: files of `trainer bench --json` lines, one JSON object a line.
        #[arg(long, num_args = 1.., value_name = "FILE.json")]
        bench: Vec<PathBuf>,
        #[arg(long)]
        output: PathBuf,
        /// The legend's name of a run, once per input in order (default: from the runs'
        /// config.toml, else the folder's name).
        #[arg(long = "label", value_name = "NAME")]
        label: Vec<String>,
        /// Average the training loss over the last N steps (default 20; 1 = as logged).
        #[arg(long, value_name = "N")]
        smooth: Option<u64>,
        /// Add a panel on the last FRACTION of the tokens (0.3 = the last 30%), its y range
        /// fitted to the validation losses there.
        #[arg(long, value_name = "FRACTION")]
        zoom: Option<f64>,
    },
    /// Time whole training steps of the config on synthetic tokens: tokens/s, TFLOP/s, MFU,
    /// peak GPU memory, time waiting on communication (docs/bench.md).
    Bench {
        /// Timed optimizer steps.
        #[arg(long, default_value_t = 10)]
        steps: u64,
        /// Untimed steps first (allocator, kernel loading, cuBLAS heuristics).
        #[arg(long, default_value_t = 2)]
        warmup: u64,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Also time rank 0's GPU work by kernel family (GEMM, attention, norm, ...) with CUDA
        /// events: a table of milliseconds per step, `profile` in --json (GPU runs).
        #[arg(long)]
        profile: bool,
        /// Instead: each quantisation kernel's GB/s beside a device-to-device copy (CUDA build).
        #[arg(long)]
        kernels: bool,
        /// Instead: the launched world's all-gather, reduce-scatter and all-to-all bandwidth, as
        /// nccl-tests reports it (dist.backend nccl or mpi, under the launcher).
        #[arg(long)]
        collectives: bool,
        /// Buffer sizes for --kernels and --collectives, in MiB.
        #[arg(long, value_delimiter = ',', default_value = "256,1024")]
        mib: Vec<usize>,
    },
    /// Memory and communication per rank for the config at a world size, without allocating
    /// the model (docs/plan.md).
    #[command(group(clap::ArgGroup::new("predict").multiple(true).args(["throughput", "sweep", "advise"])))]
    Plan {
        /// Ranks in all (default: dist.world_size).
        #[arg(long)]
        world_size: Option<usize>,
        /// Ranks per node (default: dist.gpus_per_node, else all on one node).
        #[arg(long)]
        gpus_per_node: Option<usize>,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Also predict step time, tokens/s and TFLOP/s per GPU for ZeRO-3, qwZ, hpZ, qgZ and
        /// ZeRO++ (docs/plan.md, "Throughput, predicted").
        #[arg(long)]
        throughput: bool,
        /// Predict tokens/s per GPU over a range of one cluster setting, as a table and a PNG:
        /// `inter-gbps=12.5,25,50,100` (implies the throughput model; docs/plan.md).
        #[arg(long, value_name = "VAR=V1,V2,...")]
        sweep: Option<String>,
        /// The PNG of --sweep.
        #[arg(long, requires = "sweep")]
        output: Option<PathBuf>,
        /// Which of qwZ, hpZ and qgZ to turn on for this cluster: each one's predicted gain and
        /// memory per rank, and a recommendation (implies the throughput model).
        #[arg(long)]
        advise: bool,
        /// The GPU: v100, a100, h100 or h200 (default h200).
        #[arg(long, requires = "predict")]
        gpu: Option<String>,
        /// The share of the GPU's dense peak the compute reaches (default 0.5).
        #[arg(long, requires = "predict", allow_negative_numbers = true)]
        mfu_fraction: Option<f64>,
        /// Gb/s a GPU sends inside its node, one direction (default: the GPU's NVLink).
        #[arg(long, requires = "predict", allow_negative_numbers = true)]
        intra_gbps: Option<f64>,
        /// Gb/s a node sends to the others, all its links together (default 100).
        #[arg(long, requires = "predict", allow_negative_numbers = true)]
        inter_gbps: Option<f64>,
        /// Microseconds a message (default 5).
        #[arg(long, requires = "predict", allow_negative_numbers = true)]
        latency_us: Option<f64>,
        /// The compute as measured: the --json of `trainer bench --profile` at W = 1, of this
        /// model (docs/plan.md, "Calibrated from a bench").
        #[arg(long, requires = "predict", value_name = "FILE")]
        calibrate: Option<PathBuf>,
        /// Every rank on one GPU, as the local backend runs a world on one device: compute and
        /// memory shared, the links a device copy (default: the GPU's memory bandwidth / 2).
        #[arg(long, requires = "predict")]
        shared_gpu: bool,
        /// Every communication job after the compute, the step their sum: the bound that the
        /// paper's published runs lie near (docs/plan.md, "Against the paper").
        #[arg(long, requires = "predict")]
        no_overlap: bool,
    },
}

/// What `eval` and `generate` read: a checkpoint, and how to run it.
#[derive(clap::Args)]
struct FromCheckpoint {
    /// A checkpoint folder (its newest step) or one `step_<N>` folder.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The tokenizer of the text read and written (default: the run's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// cpu or cuda (default: the run's train.device).
    #[arg(long, value_parser = parse_device)]
    device: Option<config::DeviceKind>,
    /// One JSON object instead of the table (eval) or the streamed text (generate).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    // An error is one line: candle attaches a backtrace to its errors whenever backtraces are
    // on (RUST_BACKTRACE), which would print under it. Panics keep theirs.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    match run(Cli::parse()) {
        Ok(train::Outcome::Finished) => ExitCode::SUCCESS,
        Ok(train::Outcome::Stopped) => ExitCode::from(stop::EXIT_STOPPED),
        Err(e) => {
            // One line: the whole cause chain.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<train::Outcome> {
    let overrides = config::Overrides::parse(&cli.set)?;
    match cli.command {
        None => {
            let path = cli
                .config
                .context("no --config given (see trainer --help)")?;
            let config = config::RunConfig::load(&path, &overrides)?;
            if cli.print_config {
                print!("{}", config.to_toml()?);
                return Ok(train::Outcome::Finished);
            }
            train::run(config)
        }
        Some(command) => run_command(command, cli.config.as_deref(), &overrides)
            .map(|()| train::Outcome::Finished),
    }
}

/// The subcommands other than training.
fn run_command(
    command: Command,
    config: Option<&Path>,
    overrides: &config::Overrides,
) -> Result<()> {
    match command {
        Command::PrepareData {
            input,
            output,
            tokenizer,
            eod_token,
            text_column,
            valid_fraction,
            quiet,
        } => {
            create_parent(&output)?;
            let opts = data::PrepareOptions {
                inputs: input,
                output: output.clone(),
                tokenizer,
                eod_token,
                text_column,
                valid_fraction,
                progress: !quiet,
            };
            let s = data::prepare(&opts)?;
            eprintln!(
                "wrote {}.{{bin,idx}}: {} documents, {} tokens; {} held out ({} tokens); \
                 {} of text in {:.1} s = {}/s",
                output.display(),
                s.documents,
                s.tokens,
                s.valid_documents,
                s.valid_tokens,
                readable::bytes(s.text_bytes),
                s.seconds,
                readable::bytes_f64(s.text_bytes as f64 / s.seconds)
            );
            Ok(())
        }
        Command::Tokenizer {
            input,
            vocab_size,
            output,
            special,
            text_column,
            quiet,
        } => {
            create_parent(&output)?;
            tokenizer_cmd::run(&data::TrainTokenizerOptions {
                inputs: input,
                output,
                vocab_size,
                special,
                text_column,
                progress: !quiet,
            })
        }
        Command::Plan {
            world_size,
            gpus_per_node,
            json,
            throughput,
            sweep,
            output,
            advise,
            gpu,
            mfu_fraction,
            intra_gbps,
            inter_gbps,
            latency_us,
            calibrate,
            shared_gpu,
            no_overlap,
        } => plan::run(&plan::PlanArgs {
            config,
            set: overrides,
            world_size,
            gpus_per_node,
            json,
            throughput: (throughput || sweep.is_some() || advise).then_some(plan::ThroughputArgs {
                gpu,
                mfu_fraction,
                intra_gbps,
                inter_gbps,
                latency_us,
                calibrate,
                shared_gpu,
                no_overlap,
            }),
            sweep: sweep
                .map(|s| plan::sweep::SweepArgs::parse(&s, output))
                .transpose()?,
            advise,
        }),
        Command::Bench {
            steps,
            warmup,
            json,
            profile,
            kernels,
            collectives,
            mib,
        } => bench::run(&bench::BenchArgs {
            config,
            set: overrides,
            steps,
            warmup,
            json,
            profile,
            kernels,
            kernel_mib: mib,
            collectives,
        }),
        Command::Export {
            checkpoint,
            output,
            tokenizer,
        } => {
            create_parent(&output)?;
            hf::export::export(&checkpoint, &output, tokenizer.as_deref())
        }
        Command::Eval {
            from,
            data,
            samples,
        } => eval::run(&eval::EvalArgs {
            checkpoint: &from.checkpoint,
            config,
            data,
            tokenizer: from.tokenizer.as_deref(),
            samples,
            device: from.device,
            json: from.json,
        }),
        Command::Generate {
            from,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            stop_at_eod,
        } => generate::run(&generate::GenerateArgs {
            checkpoint: &from.checkpoint,
            config,
            tokenizer: from.tokenizer.as_deref(),
            prompt,
            stop_at_eod,
            sampling: model::decode::Sampling {
                max_new_tokens,
                temperature,
                top_k: (top_k > 0).then_some(top_k),
                seed,
                stop: None,
            },
            device: from.device,
            json: from.json,
        }),
        Command::Plot {
            metrics,
            bench,
            output,
            label,
            smooth,
            zoom,
        } => {
            create_parent(&output)?;
            Ok(plot::run(&plot::PlotArgs {
                metrics,
                bench,
                output,
                labels: label,
                smooth,
                zoom,
            })?)
        }
    }
}

/// `--device cpu|cuda`.
fn parse_device(s: &str) -> std::result::Result<config::DeviceKind, String> {
    match s {
        "cpu" => Ok(config::DeviceKind::Cpu),
        "cuda" | "gpu" => Ok(config::DeviceKind::Cuda),
        _ => Err(format!("{s:?} is not a device: cpu or cuda")),
    }
}

/// Creates the folder that `output` goes in (and its parents), so that a command run on a fresh
/// clone can write `data/pile/pile_train` or `hf/model.safetensors`.
fn create_parent(output: &Path) -> Result<()> {
    match output.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the folder {}", dir.display())),
        _ => Ok(()),
    }
}
