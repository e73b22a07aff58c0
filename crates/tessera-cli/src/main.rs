//! The `tessera` command-line tool.

mod alloc_count;
mod bench;
mod conformance;

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
    },
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
}

fn open(path: &PathBuf) -> Result<GgufFile, ExitCode> {
    GgufFile::open(path).map_err(|e| {
        eprintln!("tessera: cannot read {}: {e}", path.display());
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
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
        } => {
            bench::run(&bench::Opts {
                threads,
                reps: reps.max(1),
                numpy: !no_numpy,
            });
            ExitCode::SUCCESS
        }
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
