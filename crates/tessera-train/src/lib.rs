//! Training on Tessera graphs, in the role of ggml-opt: optimizers as graph ops
//! ([`optim`]), datasets ([`dataset`]), the training loop with gradient accumulation,
//! clipping, validation and exact checkpoints ([`trainer`]), and a GPT-2 model with byte-level
//! tokens that trains from scratch and is written as a GGUF that `tessera run` and llama.cpp
//! load ([`gpt2`]).

pub mod dataset;
pub mod gpt2;
pub mod optim;
pub mod trainer;

pub use dataset::{Dataset, Inputs, Labels};
pub use optim::{Optimizer, Schedule};
pub use trainer::{EpochStats, Position, Progress, TrainConfig, Trainer};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Graph(#[from] tessera::Error),
    #[error(transparent)]
    Gguf(#[from] tessera_gguf::GgufError),
    #[error("model: {0}")]
    Model(String),
    #[error("data: {0}")]
    Data(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The loss stopped being finite: training stops at this step with a trace of the first
    /// node that produced a NaN or infinity.
    #[error("the loss is {loss} at step {step}; {trace}")]
    NonFinite { step: u64, loss: f32, trace: String },
    #[error("{0}")]
    Io(String),
}
