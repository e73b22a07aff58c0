//! Several sequences decoded together: one graph evaluates a batch that mixes tokens of
//! different sequences (continuous batching, as llama.cpp's server does).
//!
//! The sequences share one KV cache, interleaved: position `p` of sequence `s` lives in row
//! `p * n_seq + s`, so sequences of similar lengths attend over a compact prefix of the cache.
//! Each token's mask opens only its own sequence's rows up to its position; flash attention
//! skips masked rows, so a sequence's tokens are computed as if it were alone (same values,
//! same order of summation). In ggml precision every batch runs ggml's row-by-row attention
//! (`AttnPrecision::GgmlCpuRows`), never its tiled form, whose results would depend on the
//! batch's composition; a single `Context` runs a prompt of 64 tokens or more tiled, as
//! llama.cpp does, so there a long prompt's numbers can differ from the batch's in the last bits.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tessera_llm::batch::{BatchContext, SeqTokens};
//! use tessera_llm::{ContextParams, Model};
//! let model = Arc::new(Model::load("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap());
//! let params = ContextParams { n_ctx: 512, ..Default::default() }; // per sequence
//! let mut ctx = BatchContext::new(Arc::clone(&model), params, 2).unwrap();
//! let a = model.tokenizer.encode("Once upon a time", true, false);
//! let b = model.tokenizer.encode("The capital of France", true, false);
//! // both prompts in one step; one row of logits for each sequence
//! let logits = ctx
//!     .eval(&[SeqTokens { seq: 0, tokens: &a, logits: true }, SeqTokens { seq: 1, tokens: &b, logits: true }])
//!     .unwrap();
//! assert_eq!(logits.len(), 2 * model.hp.n_vocab);
//! ```

use std::sync::Arc;

use tessera::op::AttnPrecision;
use tessera::Backend;

use crate::context::{batch_backend_of, ContextParams, GraphCache};
use crate::error::{LlmError, Result};
use crate::graph::{build_batch, BatchShape};
use crate::model::Model;

/// Positions per sequence by which a batch's attended cache rows grow (see `eval`).
pub const BATCH_KV_PAD: usize = 32;

/// Graphs kept planned at once (each batch shape has one); the least recently used is dropped.
pub const GRAPH_LIMIT: usize = 48;

/// Tokens of one sequence in a batch, appended after what the cache holds for it.
#[derive(Clone, Copy, Debug)]
pub struct SeqTokens<'a> {
    pub seq: usize,
    pub tokens: &'a [u32],
    /// Compute the logits of this sequence's last token in the batch.
    pub logits: bool,
}

/// A KV cache for `n_seq` sequences of up to `params.n_ctx` positions each, and the graphs
/// that decode batches mixing them.
pub struct BatchContext {
    pub model: Arc<Model>,
    /// `n_ctx` is per sequence.
    pub params: ContextParams,
    n_seq: usize,
    backend: Box<dyn Backend>,
    graphs: GraphCache<BatchShape>,
    n_past: Vec<usize>,
    logits: Vec<f32>,
    scratch: Vec<f32>,
}

impl BatchContext {
    pub fn new(model: Arc<Model>, params: ContextParams, n_seq: usize) -> Result<BatchContext> {
        if params.n_ctx == 0 || params.n_batch == 0 || n_seq == 0 {
            return Err(LlmError::Invalid(
                "context, batch sizes and sequence count must be positive".into(),
            ));
        }
        if !matches!(params.kv_type, tessera::DType::F16 | tessera::DType::F32) {
            return Err(LlmError::Unsupported(format!(
                "KV cache type {} (f16 or f32)",
                params.kv_type
            )));
        }
        let rows = params
            .n_ctx
            .checked_mul(n_seq)
            .ok_or_else(|| LlmError::Invalid("KV cache size overflows".into()))?;
        Ok(BatchContext {
            backend: batch_backend_of(&params),
            graphs: GraphCache::new(&model, params.kv_type, rows, GRAPH_LIMIT)?,
            model,
            params,
            n_seq,
            n_past: vec![0; n_seq],
            logits: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// Sequences the cache holds.
    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    /// Positions per sequence.
    pub fn n_ctx(&self) -> usize {
        self.params.n_ctx
    }

    /// Tokens in the cache for `seq` (0 for a sequence that does not exist).
    pub fn n_past(&self, seq: usize) -> usize {
        self.n_past.get(seq).copied().unwrap_or(0)
    }

    /// Drops `seq`'s positions from `n` on (keeps its first `n`).
    pub fn truncate(&mut self, seq: usize, n: usize) {
        if let Some(p) = self.n_past.get_mut(seq) {
            *p = (*p).min(n);
        }
    }

    /// Forgets every sequence.
    pub fn reset(&mut self) {
        self.n_past.fill(0);
    }

    /// Graphs planned now (at most `GRAPH_LIMIT`).
    pub fn n_graphs(&self) -> usize {
        self.graphs.len()
    }

    /// Runs one batch. At most one entry per sequence, `n_batch` tokens in all. Returns one row
    /// of `n_vocab` logits for every entry that asked for them, in the entries' order.
    pub fn eval(&mut self, batch: &[SeqTokens]) -> Result<&[f32]> {
        let n_ctx = self.params.n_ctx;
        let n_seq = self.n_seq;
        let n_vocab = self.model.hp.n_vocab;
        let mut seen = vec![false; n_seq];
        let mut n_tokens = 0usize;
        let mut n_kv = 0usize;
        for e in batch {
            if e.seq >= n_seq {
                return Err(LlmError::Invalid(format!(
                    "sequence {} of a context of {n_seq} sequences",
                    e.seq
                )));
            }
            if std::mem::replace(&mut seen[e.seq], true) {
                return Err(LlmError::Invalid(format!(
                    "sequence {} appears twice in one batch",
                    e.seq
                )));
            }
            if e.tokens.is_empty() {
                return Err(LlmError::Invalid(format!(
                    "no tokens for sequence {}",
                    e.seq
                )));
            }
            let past = self.n_past[e.seq];
            if past + e.tokens.len() > n_ctx {
                return Err(LlmError::ContextFull {
                    n_ctx,
                    n_past: past,
                    n_new: e.tokens.len(),
                });
            }
            if let Some(&bad) = e.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(LlmError::Invalid(format!(
                    "token id {bad} is outside the vocabulary of {n_vocab}"
                )));
            }
            n_tokens += e.tokens.len();
            n_kv = n_kv.max((past + e.tokens.len() - 1) * n_seq + e.seq + 1);
        }
        if n_tokens == 0 {
            return Err(LlmError::Invalid("eval of no tokens".into()));
        }
        if n_tokens > self.params.n_batch {
            return Err(LlmError::Invalid(format!(
                "a batch of {n_tokens} tokens is larger than n_batch {}",
                self.params.n_batch
            )));
        }
        let n_rows = n_ctx * n_seq;
        // attended rows grow in steps of BATCH_KV_PAD positions of every sequence, so that a
        // graph serves many steps; every query still checks each attended row's mask entry, so
        // the step is smaller than a single context's KV_PAD (n_seq rows per position)
        let n_kv = n_kv.next_multiple_of(BATCH_KV_PAD * n_seq).min(n_rows);
        let mut ids = Vec::with_capacity(n_tokens);
        let mut pos = Vec::with_capacity(n_tokens);
        let mut rows = Vec::with_capacity(n_tokens);
        let mut out_ids = Vec::new();
        let mut mask = vec![f32::NEG_INFINITY; n_kv * n_tokens];
        for e in batch {
            let past = self.n_past[e.seq];
            for (i, &t) in e.tokens.iter().enumerate() {
                let p = past + i;
                let r = ids.len();
                ids.push(t as i32);
                pos.push(p as i32);
                rows.push((p * n_seq + e.seq) as i32);
                let m = &mut mask[r * n_kv..(r + 1) * n_kv];
                for q in 0..=p {
                    m[q * n_seq + e.seq] = 0.0;
                }
            }
            if e.logits {
                out_ids.push((ids.len() - 1) as i32);
            }
        }
        let n_out = out_ids.len();
        if out_ids.is_empty() {
            out_ids.push((n_tokens - 1) as i32);
        }
        let shape = BatchShape {
            n_tokens,
            n_kv,
            n_out: out_ids.len(),
        };
        let BatchContext {
            model,
            params,
            backend,
            graphs,
            ..
        } = self;
        // ggml's tiled attention (for 64 or more queries) would make a sequence's numbers depend
        // on what else shares its batch: keep every batch on the row-by-row algorithm
        let precision = match params.attn_precision {
            AttnPrecision::GgmlCpu => AttnPrecision::GgmlCpuRows,
            other => other,
        };
        let p = graphs.get(shape, model, |m| {
            build_batch(m, shape, n_rows, params.kv_type, precision)
        })?;
        p.session.set_i32(p.built.tokens, &ids)?;
        p.session.set_i32(p.built.pos, &pos)?;
        p.session.set_i32(p.built.rows, &rows)?;
        if let Some(o) = p.built.out_ids {
            p.session.set_i32(o, &out_ids)?;
        }
        p.session.set_f32(p.built.mask, &mask)?;
        p.session.compute(backend.as_ref())?;
        p.session.read_f32_into(p.built.logits, &mut self.scratch)?;
        for e in batch {
            self.n_past[e.seq] += e.tokens.len();
        }
        self.logits.clear();
        self.logits
            .extend_from_slice(&self.scratch[..n_out * n_vocab]);
        Ok(&self.logits)
    }
}
