//! Model graphs: one graph per batch shape (tokens in the batch, KV length bucket, which
//! logits are wanted), planned once and reused for every step of that shape.
//!
//! The KV cache is one f16 (or f32) leaf per layer and kind, `[kv_dim, n_ctx]` (one row per
//! position), written with `set_rows` at the batch's positions and read through strided views of
//! its first `n_kv` rows; sessions hand the cache buffers to each other when the shape changes.

use tessera::op::{AttnPrecision, RopeParams};
use tessera::{DType, Graph, TensorId};

use crate::error::Result;
use crate::model::{Arch, Model, RopeScaling};

/// The shape a graph is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Tokens in the batch.
    pub n_tokens: usize,
    /// Cache rows attended over (a multiple of `KV_PAD`, at most `n_ctx`).
    pub n_kv: usize,
    /// Logits for every token (perplexity) or for the last one only (generation).
    pub all_logits: bool,
}

/// The cache length attended over grows in steps of this many positions.
pub const KV_PAD: usize = 256;

/// The shape of a multi-sequence graph (`crate::batch`): several sequences share one interleaved
/// cache, so the cache rows written are an input of their own, and the logits are those of
/// chosen batch rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchShape {
    /// Tokens in the batch, all sequences together.
    pub n_tokens: usize,
    /// Cache rows attended over (a multiple of `KV_PAD`, at most the cache's rows).
    pub n_kv: usize,
    /// Batch rows whose logits are computed (at least 1).
    pub n_out: usize,
}

/// Which rows of the last hidden state go through the output layer.
#[derive(Clone, Copy)]
enum Outputs {
    All,
    Last,
    /// `n` rows picked by an i32 input (`BuiltGraph::out_ids`).
    Rows(usize),
}

pub struct BuiltGraph {
    pub graph: Graph,
    pub tokens: TensorId,
    pub pos: TensorId,
    /// The cache row each token's K and V go to: `pos` itself for one sequence, an input of its
    /// own for a multi-sequence graph.
    pub rows: TensorId,
    /// The batch rows whose logits are computed (multi-sequence graphs only).
    pub out_ids: Option<TensorId>,
    pub mask: TensorId,
    pub logits: TensorId,
    /// (k, v) cache leaves per layer.
    pub cache: Vec<(TensorId, TensorId)>,
    /// Weight leaves and the GGUF tensor each binds to.
    pub weights: Vec<(TensorId, String)>,
}

struct Builder<'a> {
    g: Graph,
    m: &'a Model,
    weights: Vec<(TensorId, String)>,
}

impl Builder<'_> {
    fn w(&mut self, name: &str) -> Result<TensorId> {
        let t = self.m.tensor(name)?;
        let id = self.g.new_tensor(t.dtype, t.shape())?;
        self.g.set_name(id, name);
        self.weights.push((id, name.to_string()));
        Ok(id)
    }

    fn w_opt(&mut self, name: &str) -> Result<Option<TensorId>> {
        if self.m.has_tensor(name) {
            Ok(Some(self.w(name)?))
        } else {
            Ok(None)
        }
    }

    fn linear(&mut self, w: &str, x: TensorId, bias: Option<&str>) -> Result<TensorId> {
        let wt = self.w(w)?;
        // read by this mul_mat alone: the model's interleaved copy where it has one
        self.g.set_layout(wt, self.m.layout_for_mul_mat(w))?;
        let mut y = self.g.mul_mat(wt, x)?;
        if let Some(lb) = &self.m.lora {
            if let Some((an, bn, r)) = lb.adapter.pairs.get(w) {
                let s = lb.scale * lb.adapter.alpha / *r as f32;
                let mut leaf = |g: &mut Graph, name: &str| -> Result<TensorId> {
                    let t = lb
                        .adapter
                        .file
                        .tensor(name)
                        .ok_or_else(|| crate::LlmError::MissingTensor(name.into()))?;
                    let id = g.new_tensor(t.dtype, t.shape())?;
                    g.set_name(id, name);
                    self.weights.push((id, name.to_string()));
                    Ok(id)
                };
                let a = leaf(&mut self.g, an)?;
                let b = leaf(&mut self.g, bn)?;
                let ax = self.g.mul_mat(a, x)?;
                let bax = self.g.mul_mat(b, ax)?;
                let d = self.g.scale(bax, s)?;
                y = self.g.add(y, d)?;
            }
        }
        if let Some(b) = bias {
            if let Some(bt) = self.w_opt(b)? {
                y = self.g.add(y, bt)?;
            }
        }
        Ok(y)
    }

    fn rms_norm(&mut self, x: TensorId, w: &str) -> Result<TensorId> {
        let y = self.g.rms_norm(x, self.m.hp.norm_eps)?;
        let wt = self.w(w)?;
        Ok(self.g.mul(y, wt)?)
    }

    fn layer_norm(&mut self, x: TensorId, w: &str, b: &str) -> Result<TensorId> {
        let y = self.g.norm(x, self.m.hp.norm_eps)?;
        let wt = self.w(w)?;
        let y = self.g.mul(y, wt)?;
        let bt = self.w(b)?;
        Ok(self.g.add(y, bt)?)
    }
}

/// The rope parameters of `model` (its base, scaling and YaRN settings).
pub(crate) fn rope_params(model: &Model) -> RopeParams {
    let hp = &model.hp;
    let mut p = RopeParams::new(hp.n_rot, hp.rope_mode);
    p.freq_base = hp.rope_freq_base;
    p.freq_scale = hp.rope_freq_scale;
    p.n_ctx_orig = hp.n_ctx_orig;
    p.beta_fast = 32.0;
    p.beta_slow = 1.0;
    if let RopeScaling::Yarn {
        ext_factor,
        attn_factor,
        beta_fast,
        beta_slow,
    } = hp.rope_scaling
    {
        p.ext_factor = ext_factor;
        p.attn_factor = attn_factor;
        p.beta_fast = beta_fast;
        p.beta_slow = beta_slow;
    }
    p
}

/// Builds the graph of `model` for `shape`, with a KV cache of `n_ctx` rows of `kv_type`.
pub fn build(
    model: &Model,
    shape: Shape,
    n_ctx: usize,
    kv_type: DType,
    attn: AttnPrecision,
) -> Result<BuiltGraph> {
    let out = if shape.all_logits {
        Outputs::All
    } else {
        Outputs::Last
    };
    build_inner(
        model,
        (shape.n_tokens, shape.n_kv, n_ctx),
        out,
        false,
        kv_type,
        attn,
    )
}

/// Builds the multi-sequence graph of `model` for `shape`, with a cache of `n_rows` rows.
pub fn build_batch(
    model: &Model,
    shape: BatchShape,
    n_rows: usize,
    kv_type: DType,
    attn: AttnPrecision,
) -> Result<BuiltGraph> {
    build_inner(
        model,
        (shape.n_tokens, shape.n_kv, n_rows),
        Outputs::Rows(shape.n_out.max(1)),
        true,
        kv_type,
        attn,
    )
}

/// `dims`: tokens in the batch, cache rows attended over, cache rows in all.
fn build_inner(
    model: &Model,
    dims: (usize, usize, usize),
    outputs: Outputs,
    separate_rows: bool,
    kv_type: DType,
    attn: AttnPrecision,
) -> Result<BuiltGraph> {
    let hp = &model.hp;
    let (t, n_kv, n_ctx) = dims;
    let (hd, nh, nkv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
    let kv_dim = hd * nkv;
    let mut b = Builder {
        g: Graph::new(),
        m: model,
        weights: Vec::new(),
    };
    let tokens = b.g.new_tensor(DType::I32, &[t])?;
    b.g.set_name(tokens, "tokens");
    b.g.set_input(tokens);
    let pos = b.g.new_tensor(DType::I32, &[t])?;
    b.g.set_name(pos, "pos");
    b.g.set_input(pos);
    let rows = if separate_rows {
        let r = b.g.new_tensor(DType::I32, &[t])?;
        b.g.set_name(r, "rows");
        b.g.set_input(r);
        r
    } else {
        pos
    };
    let out_ids = match outputs {
        Outputs::Rows(n) => {
            let o = b.g.new_tensor(DType::I32, &[n])?;
            b.g.set_name(o, "out_ids");
            b.g.set_input(o);
            Some(o)
        }
        _ => None,
    };
    let mask = b.g.new_tensor(DType::F16, &[n_kv, t])?;
    b.g.set_name(mask, "mask");
    b.g.set_input(mask);

    let rope = rope_params(model);
    let freq_factors = b.w_opt("rope_freqs.weight")?;

    let embd = b.w("token_embd.weight")?;
    let mut x = b.g.get_rows(embd, tokens)?;
    if model.arch == Arch::Gpt2 {
        let pe = b.w("position_embd.weight")?;
        let p = b.g.get_rows(pe, pos)?;
        x = b.g.add(x, p)?;
    }
    let kq_scale = 1.0 / (hd as f32).sqrt();
    let mut cache = Vec::with_capacity(hp.n_layer);
    for l in 0..hp.n_layer {
        let p = format!("blk.{l}");
        let kc = b.g.new_tensor(kv_type, &[kv_dim, n_ctx])?;
        b.g.set_name(kc, format!("cache_k.{l}"));
        let vc = b.g.new_tensor(kv_type, &[kv_dim, n_ctx])?;
        b.g.set_name(vc, format!("cache_v.{l}"));
        cache.push((kc, vc));

        let (q, k, v) = match model.arch {
            Arch::Llama | Arch::Qwen2 => {
                let h = b.rms_norm(x, &format!("{p}.attn_norm.weight"))?;
                let q = b.linear(
                    &format!("{p}.attn_q.weight"),
                    h,
                    Some(&format!("{p}.attn_q.bias")),
                )?;
                let k = b.linear(
                    &format!("{p}.attn_k.weight"),
                    h,
                    Some(&format!("{p}.attn_k.bias")),
                )?;
                let v = b.linear(
                    &format!("{p}.attn_v.weight"),
                    h,
                    Some(&format!("{p}.attn_v.bias")),
                )?;
                let q = b.g.reshape(q, &[hd, nh, t])?;
                let k = b.g.reshape(k, &[hd, nkv, t])?;
                let q = b.g.rope_ext(q, pos, freq_factors, rope)?;
                let k = b.g.rope_ext(k, pos, freq_factors, rope)?;
                (q, k, v)
            }
            Arch::Gpt2 => {
                let e = hp.n_embd;
                let h = b.layer_norm(
                    x,
                    &format!("{p}.attn_norm.weight"),
                    &format!("{p}.attn_norm.bias"),
                )?;
                let qkv = b.linear(
                    &format!("{p}.attn_qkv.weight"),
                    h,
                    Some(&format!("{p}.attn_qkv.bias")),
                )?;
                let row = b.g.tensor(qkv).nb[1];
                let part = |g: &mut Graph, i: usize| -> Result<TensorId> {
                    let v = g.view(qkv, &[e, t], &[row], i * e * 4)?;
                    Ok(g.cont(v)?)
                };
                let q = part(&mut b.g, 0)?;
                let k = part(&mut b.g, 1)?;
                let v = part(&mut b.g, 2)?;
                let q = b.g.reshape(q, &[hd, nh, t])?;
                let k = b.g.reshape(k, &[hd, nkv, t])?;
                (q, k, v)
            }
        };
        // write this batch's K and V rows at their positions, then attend over the first n_kv
        let k2 = b.g.reshape(k, &[kv_dim, t])?;
        let kw = b.g.set_rows(kc, k2, rows)?;
        let vw = b.g.set_rows(vc, v, rows)?;
        let es = kv_type.type_size();
        let kview = b.g.view(kw, &[hd, n_kv, nkv], &[kv_dim * es, hd * es], 0)?;
        let vview = b.g.view(vw, &[hd, n_kv, nkv], &[kv_dim * es, hd * es], 0)?;
        let qp = b.g.permute(q, [0, 2, 1, 3])?; // [hd, t, nh]
        let fa =
            b.g.flash_attn_ext(qp, kview, vview, Some(mask), kq_scale, 0.0, 0.0)?; // [hd, nh, t]
        b.g.set_flash_attn_precision(fa, attn)?;
        let attn = b.g.reshape(fa, &[hd * nh, t])?;
        let o = b.linear(
            &format!("{p}.attn_output.weight"),
            attn,
            Some(&format!("{p}.attn_output.bias")),
        )?;
        let ffn_in = b.g.add(o, x)?;
        let y = match model.arch {
            Arch::Llama | Arch::Qwen2 => {
                let h = b.rms_norm(ffn_in, &format!("{p}.ffn_norm.weight"))?;
                let gate = b.linear(&format!("{p}.ffn_gate.weight"), h, None)?;
                let up = b.linear(&format!("{p}.ffn_up.weight"), h, None)?;
                let act = b.g.swiglu_split(gate, up)?;
                b.linear(&format!("{p}.ffn_down.weight"), act, None)?
            }
            Arch::Gpt2 => {
                let h = b.layer_norm(
                    ffn_in,
                    &format!("{p}.ffn_norm.weight"),
                    &format!("{p}.ffn_norm.bias"),
                )?;
                let up = b.linear(
                    &format!("{p}.ffn_up.weight"),
                    h,
                    Some(&format!("{p}.ffn_up.bias")),
                )?;
                let act = b.g.gelu(up)?;
                b.linear(
                    &format!("{p}.ffn_down.weight"),
                    act,
                    Some(&format!("{p}.ffn_down.bias")),
                )?
            }
        };
        x = b.g.add(y, ffn_in)?;
    }
    // only the last token's logits when generating
    match (outputs, out_ids) {
        (Outputs::Last, _) if t > 1 => {
            let last = b.g.view(
                x,
                &[hp.n_embd, 1],
                &[b.g.tensor(x).nb[1]],
                (t - 1) * b.g.tensor(x).nb[1],
            )?;
            x = b.g.cont(last)?;
        }
        (Outputs::Rows(_), Some(ids)) => x = b.g.get_rows(x, ids)?,
        _ => {}
    }
    let h = match model.arch {
        Arch::Gpt2 => b.layer_norm(x, "output_norm.weight", "output_norm.bias")?,
        _ => b.rms_norm(x, "output_norm.weight")?,
    };
    let out_w = if model.has_tensor("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let logits = b.linear(out_w, h, None)?;
    b.g.set_name(logits, "logits");
    b.g.set_output(logits);
    Ok(BuiltGraph {
        graph: b.g,
        tokens,
        pos,
        rows,
        out_ids,
        mask,
        logits,
        cache,
        weights: b.weights,
    })
}
