//! Errors of the LLM runtime: each names what was wrong and with what.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LlmError {
    #[error("cannot read the model: {0}")]
    File(String),
    #[error("the model's metadata lacks '{0}'")]
    MissingKey(String),
    #[error("the model has no tensor '{0}'")]
    MissingTensor(String),
    #[error("unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArch { arch: String, supported: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("the prompt is {n_prompt} tokens, longer than the context of {n_ctx} tokens")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("the context of {n_ctx} tokens is full ({n_past} used, {n_new} more asked)")]
    ContextFull {
        n_ctx: usize,
        n_past: usize,
        n_new: usize,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Graph(#[from] tessera::Error),
}

pub type Result<T, E = LlmError> = std::result::Result<T, E>;
