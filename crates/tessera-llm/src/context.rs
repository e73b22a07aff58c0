//! An inference context: a KV cache, the graphs planned for each batch shape, and `eval`.

use std::collections::HashMap;
use std::sync::Arc;

use tessera::op::AttnPrecision;
use tessera::{Backend, Buffer, DType, ReferenceBackend, Session, TensorId};
use tessera_cpu::CpuBackend;

use crate::error::{LlmError, Result};
use crate::graph::{build, BuiltGraph, Shape, KV_PAD};
use crate::model::Model;

/// Prompts are processed in batches of at most this many tokens.
pub const DEFAULT_BATCH: usize = 512;

pub(crate) struct Planned {
    pub(crate) built: BuiltGraph,
    pub(crate) session: Session,
}

/// Options of a context.
#[derive(Clone, Debug)]
pub struct ContextParams {
    /// Positions the KV cache holds.
    pub n_ctx: usize,
    /// Largest batch of prompt tokens per graph execution.
    pub n_batch: usize,
    /// Threads of the CPU backend.
    pub n_threads: usize,
    /// Type of the KV cache: f16 (llama.cpp's default) or f32.
    pub kv_type: DType,
    /// Run on the f64 reference backend instead of the CPU backend (slow; for checking).
    pub reference: bool,
    /// Attention arithmetic: ggml's CPU algorithm (the default, so outputs match llama.cpp's
    /// token for token) or full f32 precision.
    pub attn_precision: AttnPrecision,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            n_batch: DEFAULT_BATCH,
            n_threads: tessera_cpu::default_threads(),
            kv_type: DType::F16,
            reference: false,
            attn_precision: AttnPrecision::GgmlCpu,
        }
    }
}

pub struct Context {
    pub model: Arc<Model>,
    pub params: ContextParams,
    backend: Box<dyn Backend>,
    graphs: GraphCache<Shape>,
    n_past: usize,
    logits: Vec<f32>,
}

impl Context {
    pub fn new(model: Arc<Model>, params: ContextParams) -> Result<Context> {
        if params.n_ctx == 0 || params.n_batch == 0 {
            return Err(LlmError::Invalid(
                "context and batch sizes must be positive".into(),
            ));
        }
        if !matches!(params.kv_type, DType::F16 | DType::F32) {
            return Err(LlmError::Unsupported(format!(
                "KV cache type {} (f16 or f32)",
                params.kv_type
            )));
        }
        Ok(Context {
            backend: backend_of(&params),
            graphs: GraphCache::new(&model, params.kv_type, params.n_ctx, usize::MAX)?,
            model,
            params,
            n_past: 0,
            logits: Vec::new(),
        })
    }

    /// Tokens already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets the cache contents (positions start at 0 again).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Drops cache positions from `n` on (keeps the first `n`).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    pub fn n_threads(&self) -> usize {
        self.params.n_threads
    }

    /// Runs `tokens` (appended after the cache's contents) through the model. Returns the logits
    /// of the last token, or of every token when `all_logits` (row `i` = `n_vocab` values).
    pub fn eval(&mut self, tokens: &[u32], all_logits: bool) -> Result<&[f32]> {
        let n_ctx = self.params.n_ctx;
        if tokens.is_empty() {
            return Err(LlmError::Invalid("eval of no tokens".into()));
        }
        if self.n_past + tokens.len() > n_ctx {
            return Err(LlmError::ContextFull {
                n_ctx,
                n_past: self.n_past,
                n_new: tokens.len(),
            });
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(LlmError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {n_vocab}"
            )));
        }
        let mut out = Vec::new();
        let n_batch = self.params.n_batch;
        let n_chunks = tokens.len().div_ceil(n_batch);
        for (ci, chunk) in tokens.chunks(n_batch).enumerate() {
            let t = chunk.len();
            let n_past = self.n_past;
            let end = n_past + t;
            let n_kv = end.next_multiple_of(KV_PAD).min(n_ctx);
            let shape = Shape {
                n_tokens: t,
                n_kv,
                all_logits,
            };
            let Context {
                model,
                params,
                backend,
                graphs,
                logits,
                ..
            } = self;
            let p = graphs.get(shape, model, |m| {
                build(m, shape, n_ctx, params.kv_type, params.attn_precision)
            })?;
            let ids: Vec<i32> = chunk.iter().map(|&x| x as i32).collect();
            let pos: Vec<i32> = (n_past..end).map(|x| x as i32).collect();
            p.session.set_i32(p.built.tokens, &ids)?;
            p.session.set_i32(p.built.pos, &pos)?;
            let mut mask = vec![f32::NEG_INFINITY; n_kv * t];
            for i in 0..t {
                mask[i * n_kv..i * n_kv + n_past + i + 1].fill(0.0);
            }
            p.session.set_f32(p.built.mask, &mask)?;
            p.session.compute(backend.as_ref())?;
            p.session.read_f32_into(p.built.logits, logits)?;
            if all_logits || ci + 1 == n_chunks {
                out.extend_from_slice(logits);
            }
            self.n_past = end;
        }
        self.logits = out;
        Ok(&self.logits)
    }
}

/// The backend `params` ask for.
pub(crate) fn backend_of(params: &ContextParams) -> Box<dyn Backend> {
    if params.reference {
        Box::new(ReferenceBackend)
    } else {
        Box::new(CpuBackend::new(params.n_threads))
    }
}

/// The backend for batches of unrelated sequences: as `backend_of`, with every column's
/// numbers independent of its batch (`CpuBackend::batch_invariant`).
pub(crate) fn batch_backend_of(params: &ContextParams) -> Box<dyn Backend> {
    if params.reference {
        Box::new(ReferenceBackend)
    } else {
        Box::new(CpuBackend::new(params.n_threads).batch_invariant(true))
    }
}

/// The planned graphs of a context, one per shape `K`, and the KV cache buffers, which move to
/// whichever session runs. At most `limit` graphs are kept: the least recently used goes first.
pub(crate) struct GraphCache<K> {
    graphs: HashMap<K, (Planned, u64)>,
    /// The cache buffers when no session holds them, per layer (k, v).
    free_cache: Option<Vec<(Buffer, Buffer)>>,
    /// The shape whose session holds the cache buffers.
    cache_home: Option<K>,
    limit: usize,
    tick: u64,
}

impl<K: Copy + Eq + std::hash::Hash> GraphCache<K> {
    /// A zeroed cache of `n_rows` rows of `kv_type` per layer and kind.
    pub(crate) fn new(
        model: &Model,
        kv_type: DType,
        n_rows: usize,
        limit: usize,
    ) -> Result<GraphCache<K>> {
        let hp = &model.hp;
        let bytes = kv_type
            .row_size(hp.head_dim * hp.n_head_kv)
            .and_then(|r| r.checked_mul(n_rows))
            .ok_or_else(|| LlmError::Invalid("KV cache size overflows".into()))?;
        let cache = (0..hp.n_layer)
            .map(|_| (Buffer::zeroed(bytes), Buffer::zeroed(bytes)))
            .collect();
        Ok(GraphCache {
            graphs: HashMap::new(),
            free_cache: Some(cache),
            cache_home: None,
            limit: limit.max(1),
            tick: 0,
        })
    }

    /// Graphs planned now.
    pub(crate) fn len(&self) -> usize {
        self.graphs.len()
    }

    /// Takes the cache buffers back from the session that holds them.
    fn take_cache(&mut self) -> Result<Vec<(Buffer, Buffer)>> {
        if let Some(c) = self.free_cache.take() {
            return Ok(c);
        }
        let home = self
            .cache_home
            .take()
            .expect("the cache is either free or in a session");
        let (p, _) = self.graphs.get_mut(&home).expect("home session exists");
        let mut c = Vec::with_capacity(p.built.cache.len());
        for &(k, v) in &p.built.cache {
            c.push((p.session.take_buffer(k)?, p.session.take_buffer(v)?));
        }
        Ok(c)
    }

    /// The planned graph of `shape` (built by `build` on first use), holding the cache buffers.
    pub(crate) fn get(
        &mut self,
        shape: K,
        model: &Model,
        build: impl FnOnce(&Model) -> Result<BuiltGraph>,
    ) -> Result<&mut Planned> {
        self.tick += 1;
        if !self.graphs.contains_key(&shape) {
            if self.graphs.len() >= self.limit {
                let oldest = self
                    .graphs
                    .iter()
                    .min_by_key(|(_, (_, t))| *t)
                    .map(|(k, _)| *k)
                    .expect("the map is not empty");
                if self.cache_home == Some(oldest) {
                    let c = self.take_cache()?;
                    self.free_cache = Some(c);
                }
                self.graphs.remove(&oldest);
            }
            let planned = plan(model, build(model)?)?;
            self.graphs.insert(shape, (planned, self.tick));
        }
        // move the cache buffers into this session
        if self.cache_home != Some(shape) {
            let cache = self.take_cache()?;
            let (p, _) = self.graphs.get_mut(&shape).expect("just planned");
            for (&(k, v), (kb, vb)) in p.built.cache.iter().zip(cache) {
                p.session.put_buffer(k, kb)?;
                p.session.put_buffer(v, vb)?;
            }
            self.cache_home = Some(shape);
        }
        let (p, t) = self.graphs.get_mut(&shape).expect("just planned");
        *t = self.tick;
        Ok(p)
    }
}

/// Plans `built`: weights are bound to the mapped file and the cache comes from elsewhere, so
/// nothing is allocated for either.
fn plan(model: &Model, built: BuiltGraph) -> Result<Planned> {
    let mut weights: HashMap<TensorId, &str> = built
        .weights
        .iter()
        .map(|(id, n)| (*id, n.as_str()))
        .collect();
    let cache: Vec<TensorId> = built.cache.iter().flat_map(|&(k, v)| [k, v]).collect();
    let mut err = None;
    let session = Session::with_buffers(built.graph.clone(), &[built.logits], &mut |id, t| {
        if let Some(name) = weights.remove(&id) {
            let r = model
                .weight_buffer_as(name, t.layout)
                .map_err(|e| e.to_string());
            match r {
                Ok(b) => return Some(b),
                Err(e) => err = Some(e),
            }
        }
        cache.contains(&id).then(|| Buffer::zeroed(0))
    })?;
    if let Some(e) = err {
        return Err(LlmError::Invalid(e));
    }
    Ok(Planned { built, session })
}
