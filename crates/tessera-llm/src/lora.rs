//! LoRA on GGUF models: a training graph for the llama family (llama, SmolLM2, TinyLlama,
//! Qwen2) whose frozen weights stay in their GGUF type and memory-mapped, with low-rank f32
//! adapters `y = W·x + (alpha/r)·B·(A·x)` beside the targeted projections; the adapter file in
//! llama.cpp's format; and merging an adapter into the base weights.
//!
//! llama.cpp's adapter format: `general.type = adapter`, `adapter.type = lora`,
//! `adapter.lora.alpha`, the base model's `general.architecture`, and per adapted weight
//! `<weight name>.lora_a` (ggml `[in, r]`) and `<weight name>.lora_b` (`[r, out]`), so that
//! `delta = lora_b · lora_a` scaled by `alpha / r` (times the user's scale).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tessera::{Buffer, DType, Graph, TensorId};
use tessera_gguf::{GgufFile, GgufWriter, Value};

use crate::model::{Arch, Model};
use crate::{LlmError, Result};

/// The short target names of `--targets` and the weight each adapts.
pub const TARGETS: [(&str, &str); 7] = [
    ("q", "attn_q"),
    ("k", "attn_k"),
    ("v", "attn_v"),
    ("o", "attn_output"),
    ("gate", "ffn_gate"),
    ("up", "ffn_up"),
    ("down", "ffn_down"),
];

/// The name of the constant positions leaf of a training graph.
pub const POS_LEAF: &str = "train.positions";

#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f32,
    /// Short target names (see [`TARGETS`]).
    pub targets: Vec<String>,
}

impl LoraConfig {
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }
}

/// The weights `targets` adapt in `model`, in layer order; an unknown target or one the model
/// lacks is an error listing what the model can adapt.
pub fn target_weights(model: &Model, targets: &[String]) -> Result<Vec<String>> {
    if !matches!(model.arch, Arch::Llama | Arch::Qwen2) {
        return Err(LlmError::Unsupported(format!(
            "LoRA fine-tuning of {} models (supported: llama, qwen2)",
            model.arch.name()
        )));
    }
    let available: Vec<&str> = TARGETS
        .iter()
        .filter(|(_, w)| model.has_tensor(&format!("blk.0.{w}.weight")))
        .map(|(s, _)| *s)
        .collect();
    let mut out = Vec::new();
    for t in targets {
        let Some((_, w)) = TARGETS.iter().find(|(s, _)| s == t) else {
            return Err(LlmError::Invalid(format!(
                "unknown LoRA target '{t}'; this model's targetable tensors: {}",
                available.join(", ")
            )));
        };
        if !available.contains(&t.as_str()) {
            return Err(LlmError::Invalid(format!(
                "the model has no '{w}' weights for target '{t}'; its targetable tensors: {}",
                available.join(", ")
            )));
        }
        for l in 0..model.hp.n_layer {
            out.push(format!("blk.{l}.{w}.weight"));
        }
    }
    Ok(out)
}

/// What the training graph trains.
#[derive(Clone, Debug)]
pub enum Trainable {
    /// LoRA adapters on these weights (names from [`target_weights`]).
    Lora {
        cfg: LoraConfig,
        weights: Vec<String>,
    },
    /// Every weight, as f32 params (f32/f16/bf16 models).
    Full,
    /// Only the token embedding (as an f32 param), everything else frozen.
    TokenEmbedding,
}

struct TrainBuilder<'a> {
    m: &'a Model,
    what: &'a Trainable,
    adapted: HashMap<String, ()>,
    made: HashMap<String, TensorId>,
}

impl TrainBuilder<'_> {
    fn weight(&mut self, g: &mut Graph, name: &str) -> Result<TensorId> {
        if let Some(&id) = self.made.get(name) {
            return Ok(id);
        }
        let t = self.m.tensor(name)?;
        let train_it = match self.what {
            Trainable::Full => true,
            Trainable::TokenEmbedding => name == "token_embd.weight",
            Trainable::Lora { .. } => false,
        };
        let id = if train_it {
            let id = g.new_tensor(DType::F32, t.shape())?;
            g.set_param(id)?;
            id
        } else {
            g.new_tensor(t.dtype, t.shape())?
        };
        g.set_name(id, name);
        self.made.insert(name.to_string(), id);
        Ok(id)
    }

    fn linear(
        &mut self,
        g: &mut Graph,
        w: &str,
        x: TensorId,
        bias: Option<&str>,
    ) -> Result<TensorId> {
        let wt = self.weight(g, w)?;
        let mut y = g.mul_mat(wt, x)?;
        if let (true, Trainable::Lora { cfg, .. }) = (self.adapted.contains_key(w), self.what) {
            let shape = self.m.tensor(w)?.shape().to_vec();
            let (n_in, n_out) = (shape[0], shape[1]);
            let a = g.new_f32(&[n_in, cfg.rank])?;
            g.set_name(a, format!("{w}.lora_a"));
            g.set_param(a)?;
            let b = g.new_f32(&[cfg.rank, n_out])?;
            g.set_name(b, format!("{w}.lora_b"));
            g.set_param(b)?;
            let ax = g.mul_mat(a, x)?;
            let bax = g.mul_mat(b, ax)?;
            let d = g.scale(bax, cfg.scale())?;
            y = g.add(y, d)?;
        }
        if let Some(b) = bias {
            if self.m.has_tensor(b) {
                let bt = self.weight(g, b)?;
                y = g.add(y, bt)?;
            }
        }
        Ok(y)
    }

    fn rms_norm(&mut self, g: &mut Graph, x: TensorId, w: &str) -> Result<TensorId> {
        let y = g.rms_norm(x, self.m.hp.norm_eps)?;
        let wt = self.weight(g, w)?;
        Ok(g.mul(y, wt)?)
    }
}

/// Builds the training forward pass of a llama-family `model` on `tokens` (i32 `[T, batch]`):
/// causal attention over each sample, logits `[n_vocab, T·batch]`. Frozen weights are leaves
/// named as in the GGUF file (bind them with [`leaf_buffer`]); trained tensors are f32 params.
pub fn build_train_forward(
    model: &Model,
    g: &mut Graph,
    tokens: TensorId,
    batch: usize,
    what: &Trainable,
) -> Result<TensorId> {
    if !matches!(model.arch, Arch::Llama | Arch::Qwen2) {
        return Err(LlmError::Unsupported(format!(
            "fine-tuning {} models (supported: llama, qwen2)",
            model.arch.name()
        )));
    }
    let hp = &model.hp;
    let t = g.ne(tokens)[0];
    let (hd, nh, nkv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
    let mut b = TrainBuilder {
        m: model,
        what,
        adapted: match what {
            Trainable::Lora { weights, .. } => weights.iter().map(|w| (w.clone(), ())).collect(),
            _ => HashMap::new(),
        },
        made: HashMap::new(),
    };
    let pos = g.new_tensor(DType::I32, &[t])?;
    g.set_name(pos, POS_LEAF);
    let rope = crate::graph::rope_params(model);
    let freq_factors = if model.has_tensor("rope_freqs.weight") {
        Some(b.weight(g, "rope_freqs.weight")?)
    } else {
        None
    };
    let n = t * batch;
    let flat = g.reshape(tokens, &[n])?;
    let embd = b.weight(g, "token_embd.weight")?;
    let mut x = g.get_rows(embd, flat)?; // [E, T·B]
    let scale = 1.0 / (hd as f32).sqrt();
    for l in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        let h = b.rms_norm(g, x, &p("attn_norm.weight"))?;
        let q = b.linear(g, &p("attn_q.weight"), h, Some(&p("attn_q.bias")))?;
        let k = b.linear(g, &p("attn_k.weight"), h, Some(&p("attn_k.bias")))?;
        let v = b.linear(g, &p("attn_v.weight"), h, Some(&p("attn_v.bias")))?;
        let q = g.reshape(q, &[hd, nh, t, batch])?;
        let k = g.reshape(k, &[hd, nkv, t, batch])?;
        let q = g.rope_ext(q, pos, freq_factors, rope)?;
        let k = g.rope_ext(k, pos, freq_factors, rope)?;
        let qp = g.permute(q, [0, 2, 1, 3])?;
        let qp = g.cont(qp)?; // [hd, T, nh, B]
        let kp = g.permute(k, [0, 2, 1, 3])?;
        let kp = g.cont(kp)?; // [hd, T, nkv, B]
        let v4 = g.reshape(v, &[hd, nkv, t, batch])?;
        let vt = g.permute(v4, [1, 2, 0, 3])?;
        let vt = g.cont(vt)?; // [T, hd, nkv, B]
        let kq = g.mul_mat(kp, qp)?; // [T_k, T_q, nh, B]
        let kq = g.diag_mask_inf(kq, 0)?;
        let pr = g.soft_max_ext(kq, None, scale, 0.0)?;
        let o = g.mul_mat(vt, pr)?; // [hd, T_q, nh, B]
        let o = g.permute(o, [0, 2, 1, 3])?;
        let o = g.cont(o)?;
        let o = g.reshape(o, &[hd * nh, n])?;
        let o = b.linear(g, &p("attn_output.weight"), o, Some(&p("attn_output.bias")))?;
        let ffn_in = g.add(o, x)?;
        let h = b.rms_norm(g, ffn_in, &p("ffn_norm.weight"))?;
        let gate = b.linear(g, &p("ffn_gate.weight"), h, None)?;
        let up = b.linear(g, &p("ffn_up.weight"), h, None)?;
        let act = g.swiglu_split(gate, up)?;
        let y = b.linear(g, &p("ffn_down.weight"), act, None)?;
        x = g.add(y, ffn_in)?;
    }
    let h = b.rms_norm(g, x, "output_norm.weight")?;
    let out_w = if model.has_tensor("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    b.linear(g, out_w, h, None)
}

/// The memory of a training graph's non-param leaf: frozen weights mapped from the model
/// file (no copy), the positions constant. Trained full weights start from the file's values
/// through [`initial_values`].
pub fn leaf_buffer(model: &Model, name: &str, t: &tessera::Tensor) -> Option<Buffer> {
    if name == POS_LEAF {
        let bytes: Vec<u8> = (0..t.ne[0] as i32).flat_map(|p| p.to_le_bytes()).collect();
        let mut buf = Buffer::zeroed(bytes.len());
        buf.bytes_mut()?.copy_from_slice(&bytes);
        return Some(buf);
    }
    let info = model.file.tensor(name)?;
    if info.dtype != t.dtype {
        return None; // a trained copy (f32 param) of a weight stored in another type
    }
    let (bytes, off) = model.tensor_bytes(info);
    Buffer::external(bytes, off, info.size).ok()
}

/// A weight's values as f32 (dequantized), for params that start from the model's weights.
pub fn weight_f32(model: &Model, name: &str) -> Result<Vec<f32>> {
    let info = model.tensor(name)?;
    let n = info.n_elements();
    let data = model.file.tensor_data(info);
    let mut out = vec![0.0f32; n];
    match info.dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        q => {
            tessera_quants::dequantize_row(q.id(), data, &mut out)
                .map_err(|e| LlmError::Invalid(format!("{name}: {e}")))?;
        }
    }
    Ok(out)
}

/// LoRA's initialisation: `A` uniform in ±1/sqrt(in) (deterministic in `seed`), `B` zero, so
/// the adapted model starts as the base model.
pub fn init_lora(name: &str, ne: [usize; 4], seed: u64) -> Vec<f32> {
    let n = ne.iter().product::<usize>();
    if name.ends_with(".lora_b") {
        return vec![0.0; n];
    }
    let bound = 1.0 / (ne[0] as f32).sqrt();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
        | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * bound
        })
        .collect()
}

/// A LoRA adapter loaded for inference, checked against its base model.
pub struct Adapter {
    pub file: Arc<GgufFile>,
    pub alpha: f32,
    /// Adapted weight → (lora_a, lora_b) tensor names, and the rank.
    pub pairs: HashMap<String, (String, String, usize)>,
    bytes: tessera::ExternalBytes,
}

impl Adapter {
    /// Opens an adapter and checks it against `model`: the architecture, and every
    /// `<weight>.lora_a`/`.lora_b` pair against the base weight's shape. The first mismatch is
    /// named in the error.
    pub fn load(path: impl AsRef<Path>, model: &Model) -> Result<Adapter> {
        let path = path.as_ref();
        let file =
            GgufFile::open(path).map_err(|e| LlmError::File(format!("{}: {e}", path.display())))?;
        let s = |k: &str| {
            file.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        if s("general.type") != "adapter" || s("adapter.type") != "lora" {
            return Err(LlmError::Invalid(format!(
                "{} is not a LoRA adapter (general.type = '{}', adapter.type = '{}')",
                path.display(),
                s("general.type"),
                s("adapter.type")
            )));
        }
        if s("general.architecture") != model.arch.name() {
            return Err(LlmError::Invalid(format!(
                "the adapter is for a '{}' model, the base model is '{}'",
                s("general.architecture"),
                model.arch.name()
            )));
        }
        let alpha = file
            .get("adapter.lora.alpha")
            .and_then(Value::as_f64)
            .unwrap_or(0.0) as f32;
        let mut pairs = HashMap::new();
        for t in &file.tensors {
            let Some(w) = t.name.strip_suffix(".lora_a") else {
                continue;
            };
            let bname = format!("{w}.lora_b");
            let bt = file.tensor(&bname).ok_or_else(|| {
                LlmError::Invalid(format!("the adapter has {} but no {bname}", t.name))
            })?;
            let base = model.file.tensor(w).ok_or_else(|| {
                LlmError::Invalid(format!(
                    "the adapter adapts '{w}', which the base model does not have"
                ))
            })?;
            let (a, b, wsh) = (t.shape(), bt.shape(), base.shape());
            if a.len() != 2 || b.len() != 2 || a[0] != wsh[0] || b[1] != wsh[1] || a[1] != b[0] {
                return Err(LlmError::Invalid(format!(
                    "adapter tensors {} {:?} and {bname} {:?} do not fit the base weight {w} {:?} (want [{}, r] and [r, {}])",
                    t.name, a, b, wsh, wsh[0], wsh[1]
                )));
            }
            if t.dtype != DType::F32 && t.dtype != DType::F16 || bt.dtype != t.dtype {
                return Err(LlmError::Unsupported(format!(
                    "adapter tensors of type {} (f32 or f16 expected)",
                    t.dtype
                )));
            }
            pairs.insert(w.to_string(), (t.name.clone(), bname, a[1]));
        }
        if pairs.is_empty() {
            return Err(LlmError::Invalid(format!(
                "{} holds no .lora_a/.lora_b pairs",
                path.display()
            )));
        }
        let file = Arc::new(file);
        let bytes: tessera::ExternalBytes = Arc::new(crate::model::Mapped(Arc::clone(&file)));
        Ok(Adapter {
            file,
            alpha,
            pairs,
            bytes,
        })
    }

    /// The buffer of adapter tensor `name` (mapped, no copy).
    pub fn buffer(&self, name: &str) -> Option<Buffer> {
        let t = self.file.tensor(name)?;
        Buffer::external(self.bytes.clone(), self.file.data_offset + t.offset, t.size).ok()
    }
}

/// Writes an adapter in llama.cpp's format. `tensors` are (name, ggml dims, f32 values).
pub fn write_adapter(
    path: &Path,
    model: &Model,
    alpha: f32,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<()> {
    let mut w = GgufWriter::new();
    w.add_kv(
        "general.architecture",
        Value::String(model.arch.name().into()),
    );
    w.add_kv("general.type", Value::String("adapter".into()));
    w.add_kv(
        "general.name",
        Value::String(format!("{} LoRA (tessera finetune)", model.name)),
    );
    w.add_kv("adapter.type", Value::String("lora".into()));
    w.add_kv("adapter.lora.alpha", Value::F32(alpha));
    for (name, dims, v) in tensors {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.add_tensor(name, DType::F32, dims, &bytes)
            .map_err(|e| LlmError::Invalid(e.to_string()))?;
    }
    w.write_file(path)
        .map_err(|e| LlmError::File(format!("{}: {e}", path.display())))
}

/// Merges `adapter` (times `scale`) into the base weights and writes a full model: every
/// adapted weight becomes `W + scale·(alpha/r)·B·A`, written in f16 like llama.cpp's
/// export-lora (f32 weights stay f32), or with `keep_type` quantized back to its own type
/// (smaller, but 4-bit rounding can undo much of a small adapter); everything else is copied.
pub fn merge(
    model: &Model,
    adapter: &Adapter,
    scale: f32,
    keep_type: bool,
    out: &Path,
) -> Result<()> {
    let mut w = GgufWriter::from_gguf(&model.file).map_err(|e| LlmError::Invalid(e.to_string()))?;
    let read = |name: &str| -> Result<Vec<f32>> {
        let t = adapter
            .file
            .tensor(name)
            .ok_or_else(|| LlmError::MissingTensor(name.into()))?;
        let d = adapter.file.tensor_data(t);
        Ok(match t.dtype {
            DType::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            _ => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    };
    for t in &model.file.tensors {
        let Some((an, bn, r)) = adapter.pairs.get(&t.name) else {
            continue; // copied by from_gguf
        };
        let (n_in, n_out) = (t.shape()[0], t.shape()[1]);
        let mut wv = weight_f32(model, &t.name)?;
        let (a, b) = (read(an)?, read(bn)?);
        let s = scale * adapter.alpha / *r as f32;
        // W[o][i] += s·Σj B[o][j]·A[j][i]   (A: r rows of n_in, B: n_out rows of r)
        for o in 0..n_out {
            let row = &mut wv[o * n_in..(o + 1) * n_in];
            for j in 0..*r {
                let c = s * b[o * r + j];
                if c != 0.0 {
                    for (x, av) in row.iter_mut().zip(&a[j * n_in..(j + 1) * n_in]) {
                        *x += c * av;
                    }
                }
            }
        }
        let (dtype, bytes) = if keep_type
            && t.dtype.is_quantized()
            && tessera_quants::can_quantize(t.dtype.id())
            && !tessera_quants::requires_imatrix(t.dtype.id())
        {
            let row_bytes = t.size / n_out;
            let mut bytes = vec![0u8; t.size];
            for o in 0..n_out {
                tessera_quants::quantize_row(
                    t.dtype.id(),
                    &wv[o * n_in..(o + 1) * n_in],
                    &mut bytes[o * row_bytes..(o + 1) * row_bytes],
                    None,
                )
                .map_err(|e| LlmError::Invalid(format!("{}: {e}", t.name)))?;
            }
            (t.dtype, bytes)
        } else if t.dtype == DType::F32 {
            (
                DType::F32,
                wv.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        } else {
            (
                DType::F16,
                wv.iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
                    .collect(),
            )
        };
        w.replace_tensor(&t.name, dtype, t.shape(), &bytes)
            .map_err(|e| LlmError::Invalid(e.to_string()))?;
    }
    w.write_file(out)
        .map_err(|e| LlmError::File(format!("{}: {e}", out.display())))
}
