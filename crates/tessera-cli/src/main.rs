//! The `tessera` command-line tool.

mod alloc_count;
mod bench;
mod conformance;
mod finetune_cmd;
mod llm_cmd;
mod quant_cmd;
mod serve_cmd;
mod train_cmd;

#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_gguf::GgufFile;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "ggml rebuilt in Rust: tensors, GGUF, conformance"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text with a GGUF model (streams the continuation).
    Run {
        #[command(flatten)]
        model: llm_cmd::ModelArgs,
        #[command(flatten)]
        sample: llm_cmd::SampleArgs,
        /// The prompt.
        #[arg(short = 'p', long = "prompt", default_value = "Once upon a time")]
        prompt: String,
        /// Tokens to generate at most.
        #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
        n: usize,
        /// Wrap the prompt in the model's chat template as a user message.
        #[arg(long)]
        chat: bool,
        /// Print the generated token ids on stderr when done.
        #[arg(long)]
        ids: bool,
    },
    /// Chat interactively with the model's chat template and the conversation's history.
    Chat {
        #[command(flatten)]
        model: llm_cmd::ModelArgs,
        #[command(flatten)]
        sample: llm_cmd::SampleArgs,
        /// Tokens per reply at most.
        #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
        n: usize,
    },
    /// Print the token ids of a text.
    Tokenize {
        #[command(flatten)]
        model: llm_cmd::ModelArgs,
        #[arg(short = 'p', long = "prompt")]
        prompt: String,
    },
    /// Perplexity of a text, computed as llama.cpp does.
    Perplexity {
        #[command(flatten)]
        model: llm_cmd::ModelArgs,
        /// The text file.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Prompt processing and generation speed, like llama-bench.
    Bench {
        #[command(flatten)]
        model: llm_cmd::ModelArgs,
        #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
        n_prompt: usize,
        #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
        n_gen: usize,
        #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
        reps: usize,
        /// llama-bench's JSON fields instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Train a GPT-2 with byte-level tokens from scratch (default: on Shakespeare's plays).
    Train(train_cmd::TrainArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, streamed or not).
    Serve(serve_cmd::ServeArgs),
    /// Fine-tune a GGUF model with LoRA adapters on its (quantized, mapped) weights.
    Finetune(finetune_cmd::FinetuneArgs),
    /// Merge a LoRA adapter into its base model.
    ExportLora(finetune_cmd::ExportLoraArgs),
    /// Print a GGUF file's metadata (every key and value) and its tensor table.
    Info {
        /// The GGUF file.
        file: PathBuf,
    },
    /// Micro-benchmarks of the CPU backend with their baselines (numpy, memory copy).
    BenchOps {
        /// Thread counts to measure, comma separated.
        #[arg(short = 't', long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Timed repetitions per measurement (the median is reported).
        #[arg(short = 'r', long, default_value_t = 5)]
        reps: usize,
        /// Skip the numpy baseline.
        #[arg(long)]
        no_numpy: bool,
        /// Run only these sections, comma separated: matmul, quant, bandwidth, pool, add, layer
        /// (all when absent).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// The quant section's weight types, comma separated (q4_0, q8_0, q4_K, ..., or a float
        /// type f32/f16/bf16; its seven when absent); also the bandwidth section's (when
        /// absent the same seven: q4_0, q4_1, q8_0, q4_K, q5_K, q6_K, iq4_xs).
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// The quant section's shapes K×M, comma separated (e.g. 576x1536; its three when
        /// absent).
        #[arg(long, value_delimiter = ',')]
        shapes: Vec<String>,
        /// The quant section with the weights' rows interleaved by eight (`tessera::layout`)
        /// where the type has that layout and this CPU its kernels, as `tessera run
        /// --interleave` lays out a model's weights (and `tessera run` does by default on AMD).
        #[arg(long)]
        interleave: bool,
        /// The quant section's q4_0, iq4_nl, q4_K, mxfp4 and q2_K weights with the arithmetic
        /// of ggml's CPU repack buffer (`tessera::RowLayout::Repacked8`), as `tessera run
        /// --repack` computes them (q2_K: as ggml built with AVX-512 does, which `tessera run
        /// --repack` does not take; other types as without it, or as --interleave says).
        #[arg(long)]
        repack: bool,
        /// The bandwidth section's matrix and read buffer, in MiB (default: 256, or four times
        /// the L3 this CPU reports where that is larger, so that both stream from memory; at
        /// most a quarter of the available memory).
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=65536))]
        matrix_mib: Option<u64>,
    },
    /// Quantize a GGUF model like llama.cpp's llama-quantize (types, mixes, metadata).
    Quantize(quant_cmd::QuantizeArgs),
    /// Check Tessera against golden vectors written by ggml.
    Conformance {
        #[command(subcommand)]
        what: ConformanceCmd,
    },
}

#[derive(Subcommand)]
enum ConformanceCmd {
    /// Rebuild every case of a golden ops file and compare every backend's output with ggml's.
    Ops {
        /// A golden ops file, such as shared/golden/ops.gguf.
        file: PathBuf,
    },
    /// Re-quantize and dequantize a golden quant file's input and compare bit for bit with ggml.
    Quant {
        /// A golden quant file, such as shared/golden/quant-gaussian.gguf.
        file: PathBuf,
    },
}

fn open(path: &PathBuf) -> Result<GgufFile, ExitCode> {
    GgufFile::open(path).map_err(|e| {
        eprintln!("tessera: cannot read {}: {e}", path.display());
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let llm = |r: llm_cmd::CmdResult| match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera: {e}");
            ExitCode::from(1)
        }
    };
    match cli.cmd {
        Cmd::Run {
            model,
            sample,
            prompt,
            n,
            chat,
            ids,
        } => llm(llm_cmd::run(&model, &sample, &prompt, n, chat, ids)),
        Cmd::Chat { model, sample, n } => llm(llm_cmd::chat_loop(&model, &sample, n)),
        Cmd::Tokenize { model, prompt } => llm(llm_cmd::tokenize(&model, &prompt)),
        Cmd::Perplexity { model, file } => llm(llm_cmd::perplexity(&model, &file)),
        Cmd::Bench {
            model,
            n_prompt,
            n_gen,
            reps,
            json,
        } => {
            // like llama-bench: -t takes a list; the default is all cores
            let threads = if model.threads.is_empty() {
                vec![tessera_cpu::default_threads()]
            } else {
                model.threads.clone()
            };
            llm(llm_cmd::bench(
                &model, n_prompt, n_gen, &threads, reps, json,
            ))
        }
        Cmd::Train(args) => llm(train_cmd::train(&args)),
        Cmd::Finetune(args) => llm(finetune_cmd::finetune(&args)),
        Cmd::ExportLora(args) => llm(finetune_cmd::export_lora(&args)),
        Cmd::Serve(args) => llm(serve_cmd::serve(&args)),
        Cmd::Info { file } => match open(&file) {
            Ok(f) => {
                print!("{}", tessera_gguf::dump(&f));
                ExitCode::SUCCESS
            }
            Err(c) => c,
        },
        Cmd::BenchOps {
            threads,
            reps,
            no_numpy,
            only,
            types,
            shapes,
            interleave,
            repack,
            matrix_mib,
        } => {
            if let Some(bad) = only.iter().find(|s| !bench::SECTIONS.contains(&s.as_str())) {
                eprintln!(
                    "error: bench-ops has no section '{bad}' (sections: {})",
                    bench::SECTIONS.join(", ")
                );
                return ExitCode::FAILURE;
            }
            let mut qtypes = Vec::new();
            for name in &types {
                match tessera::DType::from_name(name).filter(|t| {
                    t.is_quantized()
                        || matches!(
                            t,
                            tessera::DType::F16 | tessera::DType::BF16 | tessera::DType::F32
                        )
                }) {
                    Some(t) => qtypes.push(t),
                    None => {
                        eprintln!(
                            "error: bench-ops --types: '{name}' is neither a quantized type nor f32/f16/bf16"
                        );
                        return ExitCode::FAILURE;
                    }
                }
            }
            let mut qshapes = Vec::new();
            for spec in &shapes {
                let km = spec
                    .split_once(['x', '×'])
                    .and_then(|(k, m)| Some((k.parse::<usize>().ok()?, m.parse::<usize>().ok()?)))
                    .filter(|&(k, m)| k > 0 && m > 0);
                match km {
                    Some(km) => qshapes.push(km),
                    None => {
                        eprintln!("error: bench-ops --shapes: '{spec}' is not K×M (e.g. 576x1536)");
                        return ExitCode::FAILURE;
                    }
                }
            }
            bench::run(&bench::Opts {
                threads,
                reps: reps.max(1),
                numpy: !no_numpy,
                only,
                types: qtypes,
                shapes: qshapes,
                interleave,
                repack,
                matrix_mib: matrix_mib.map(|m| m as usize),
            });
            ExitCode::SUCCESS
        }
        Cmd::Quantize(args) => quant_cmd::quantize_main(&args),
        Cmd::Conformance {
            what: ConformanceCmd::Quant { file },
        } => match open(&file) {
            Ok(f) => quant_cmd::conformance_main(&f, &file),
            Err(c) => c,
        },
        Cmd::Conformance {
            what: ConformanceCmd::Ops { file },
        } => {
            let f = match open(&file) {
                Ok(f) => f,
                Err(c) => return c,
            };
            match conformance::run_ops(&f) {
                Ok((results, grads)) => {
                    let (text, failed) = conformance::report(&results, grads);
                    print!("{text}");
                    if failed > 0 {
                        ExitCode::from(1)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(msg) => {
                    eprintln!("tessera: {}: {msg}", file.display());
                    ExitCode::from(2)
                }
            }
        }
    }
}
