//! GGUF language models on Tessera: tokenizers, model graphs with a KV cache, sampling.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tessera_llm::{Context, ContextParams, Model, Sampler, SamplerParams};
//! let model = Arc::new(Model::load("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap());
//! let mut ctx = Context::new(Arc::clone(&model), ContextParams::default()).unwrap();
//! let mut sampler = Sampler::new(SamplerParams { temp: 0.0, ..Default::default() });
//! let prompt = model.tokenizer.encode("Once upon a time", true, false);
//! let mut logits = ctx.eval(&prompt, false).unwrap().to_vec();
//! for _ in 0..16 {
//!     let tok = sampler.sample(&logits);
//!     print!("{}", String::from_utf8_lossy(&model.tokenizer.decode_token(tok)));
//!     logits = ctx.eval(&[tok], false).unwrap().to_vec();
//! }
//! ```

pub mod batch;
pub mod chat;
pub mod context;
pub mod error;
pub mod fetch;
pub mod graph;
pub mod lora;
pub mod model;
pub mod sampling;
#[doc(hidden)]
pub mod testing;
pub mod tokenizer;

pub use context::{Context, ContextParams};
pub use error::{LlmError, Result};
pub use model::{Arch, HParams, Model};
pub use sampling::{Sampler, SamplerParams};
