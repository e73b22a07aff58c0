//! A GPT-2 to train from scratch: learned positions, pre-LayerNorm blocks with a fused QKV
//! projection and causal attention, a GELU (tanh) MLP, a final LayerNorm and the output tied to
//! the token embedding. Byte-level tokens (one per byte, plus `<|endoftext|>`), so any text
//! works. Param names and layouts are those of llama.cpp's gpt2 GGUF files (a weight of
//! PyTorch shape `(out, in)` is ggml `[in, out]`), so [`write_gguf`] makes a model that
//! `tessera run` and llama.cpp load.

use tessera::{DType, Graph, Result, TensorId};
use tessera_gguf::{GgufWriter, Value, ValueType};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpt2Config {
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_layer: usize,
}

/// 256 bytes and `<|endoftext|>`.
pub const BYTE_VOCAB: usize = 257;
/// The id of `<|endoftext|>`.
pub const EOT: u32 = 256;
pub const NORM_EPS: f32 = 1e-5;

impl Gpt2Config {
    pub fn n_ff(&self) -> usize {
        4 * self.n_embd
    }

    pub fn check(&self) -> std::result::Result<(), String> {
        if self.n_embd == 0 || self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(format!(
                "n_embd {} must be a positive multiple of n_head {}",
                self.n_embd, self.n_head
            ));
        }
        if self.n_layer == 0 || self.n_ctx == 0 || self.n_vocab == 0 {
            return Err("n_layer, n_ctx and n_vocab must be at least 1".into());
        }
        Ok(())
    }

    /// Every param: name and ggml shape, in the order they are created.
    pub fn params(&self) -> Vec<(String, Vec<usize>)> {
        let (e, f) = (self.n_embd, self.n_ff());
        let mut v = vec![
            ("token_embd.weight".to_string(), vec![e, self.n_vocab]),
            ("position_embd.weight".to_string(), vec![e, self.n_ctx]),
        ];
        for l in 0..self.n_layer {
            let p = format!("blk.{l}");
            for (n, s) in [
                ("attn_norm.weight", vec![e]),
                ("attn_norm.bias", vec![e]),
                ("attn_qkv.weight", vec![e, 3 * e]),
                ("attn_qkv.bias", vec![3 * e]),
                ("attn_output.weight", vec![e, e]),
                ("attn_output.bias", vec![e]),
                ("ffn_norm.weight", vec![e]),
                ("ffn_norm.bias", vec![e]),
                ("ffn_up.weight", vec![e, f]),
                ("ffn_up.bias", vec![f]),
                ("ffn_down.weight", vec![f, e]),
                ("ffn_down.bias", vec![e]),
            ] {
                v.push((format!("{p}.{n}"), s));
            }
        }
        v.push(("output_norm.weight".into(), vec![e]));
        v.push(("output_norm.bias".into(), vec![e]));
        v
    }

    pub fn n_params(&self) -> usize {
        self.params()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// GPT-2's initialisation: weights and embeddings normal(0, 0.02), the residual
    /// projections (attn_output, ffn_down) scaled by 1/sqrt(2·n_layer), biases 0, LayerNorm
    /// weights 1. Deterministic in `seed`.
    pub fn init(&self, seed: u64) -> Vec<(String, Vec<f32>)> {
        let mut rng = Normal::new(seed);
        let resid = 0.02 / (2.0 * self.n_layer as f64).sqrt();
        self.params()
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let v = if name.ends_with(".bias") {
                    vec![0.0; n]
                } else if name.contains("norm.weight") {
                    vec![1.0; n]
                } else {
                    let std = if name.ends_with("attn_output.weight")
                        || name.ends_with("ffn_down.weight")
                    {
                        resid
                    } else {
                        0.02
                    };
                    (0..n).map(|_| (rng.sample() * std) as f32).collect()
                };
                (name, v)
            })
            .collect()
    }

    /// Builds the model on `tokens` (i32 `[n_tokens, batch]`, `n_tokens <= n_ctx`) and returns
    /// the logits `[n_vocab, n_tokens·batch]`. Params are created as named leaves marked with
    /// `set_param`.
    pub fn build(&self, g: &mut Graph, tokens: TensorId, batch: usize) -> Result<TensorId> {
        let (e, h) = (self.n_embd, self.n_head);
        let hd = e / h;
        let t = g.ne(tokens)[0];
        if t > self.n_ctx {
            return Err(tessera::Error::Invalid(format!(
                "gpt2: {t} tokens per sample exceed the context {}",
                self.n_ctx
            )));
        }
        let mut w = std::collections::HashMap::new();
        for (name, shape) in self.params() {
            let id = g.new_tensor(DType::F32, &shape)?;
            g.set_name(id, name.clone());
            g.set_param(id)?;
            w.insert(name, id);
        }
        let wt = |n: &str| w[n];
        let n_tok = t * batch;
        let flat = g.reshape(tokens, &[n_tok])?;
        let tok = g.get_rows(wt("token_embd.weight"), flat)?; // [E, T·B]
        let tok3 = g.reshape(tok, &[e, t, batch])?;
        let pos_all = wt("position_embd.weight");
        let pos = g.view(pos_all, &[e, t], &[e * 4], 0)?;
        let x3 = g.add(tok3, pos)?;
        let mut x = g.reshape(x3, &[e, n_tok])?;
        let layer_norm =
            |g: &mut Graph, x: TensorId, wn: TensorId, bn: TensorId| -> Result<TensorId> {
                let n = g.norm(x, NORM_EPS)?;
                let m = g.mul(n, wn)?;
                g.add(m, bn)
            };
        let scale = 1.0 / (hd as f32).sqrt();
        for l in 0..self.n_layer {
            let p = |n: &str| format!("blk.{l}.{n}");
            let hn = layer_norm(g, x, wt(&p("attn_norm.weight")), wt(&p("attn_norm.bias")))?;
            let qkv0 = g.mul_mat(wt(&p("attn_qkv.weight")), hn)?;
            let qkv = g.add(qkv0, wt(&p("attn_qkv.bias")))?; // [3E, T·B]
            let nb = [hd * 4, 3 * e * 4, 3 * e * 4 * t];
            let head =
                |g: &mut Graph, which: usize| g.view(qkv, &[hd, h, t, batch], &nb, which * e * 4);
            let q = head(g, 0)?;
            let k = head(g, 1)?;
            let v = head(g, 2)?;
            let qp = g.permute(q, [0, 2, 1, 3])?;
            let qp = g.cont(qp)?; // [hd, T, H, B]
            let kp = g.permute(k, [0, 2, 1, 3])?;
            let kp = g.cont(kp)?;
            let vt = g.permute(v, [1, 2, 0, 3])?;
            let vt = g.cont(vt)?; // [T, hd, H, B]
            let kq = g.mul_mat(kp, qp)?; // [T_k, T_q, H, B]
            let kq = g.diag_mask_inf(kq, 0)?;
            let pr = g.soft_max_ext(kq, None, scale, 0.0)?;
            let o = g.mul_mat(vt, pr)?; // [hd, T_q, H, B]
            let o = g.permute(o, [0, 2, 1, 3])?;
            let o = g.cont(o)?; // [hd, H, T, B]
            let o = g.reshape(o, &[e, n_tok])?;
            let a0 = g.mul_mat(wt(&p("attn_output.weight")), o)?;
            let a = g.add(a0, wt(&p("attn_output.bias")))?;
            x = g.add(x, a)?;
            let hn = layer_norm(g, x, wt(&p("ffn_norm.weight")), wt(&p("ffn_norm.bias")))?;
            let u0 = g.mul_mat(wt(&p("ffn_up.weight")), hn)?;
            let u1 = g.add(u0, wt(&p("ffn_up.bias")))?;
            let u = g.gelu(u1)?;
            let d0 = g.mul_mat(wt(&p("ffn_down.weight")), u)?;
            let d = g.add(d0, wt(&p("ffn_down.bias")))?;
            x = g.add(x, d)?;
        }
        let f = layer_norm(g, x, wt("output_norm.weight"), wt("output_norm.bias"))?;
        g.mul_mat(wt("token_embd.weight"), f)
    }

    /// A GGUF writer with this model's gpt2 metadata and byte-level vocabulary (no tensors).
    pub fn gguf_metadata(&self, name: &str) -> GgufWriter {
        let mut w = GgufWriter::new();
        let s = |v: &str| Value::String(v.to_string());
        let u = |v: usize| Value::U32(v as u32);
        w.add_kv("general.architecture", s("gpt2"));
        w.add_kv("general.name", s(name));
        w.add_kv("general.file_type", Value::U32(0)); // all f32
        w.add_kv("gpt2.context_length", u(self.n_ctx));
        w.add_kv("gpt2.embedding_length", u(self.n_embd));
        w.add_kv("gpt2.feed_forward_length", u(self.n_ff()));
        w.add_kv("gpt2.block_count", u(self.n_layer));
        w.add_kv("gpt2.attention.head_count", u(self.n_head));
        w.add_kv("gpt2.attention.layer_norm_epsilon", Value::F32(NORM_EPS));
        w.add_kv("tokenizer.ggml.model", s("gpt2"));
        w.add_kv("tokenizer.ggml.pre", s("gpt-2"));
        let tokens = byte_tokens();
        let types: Vec<Value> = (0..tokens.len())
            .map(|i| Value::I32(if i as u32 == EOT { 3 } else { 1 }))
            .collect();
        w.add_kv(
            "tokenizer.ggml.tokens",
            Value::Array(
                ValueType::String,
                tokens.into_iter().map(Value::String).collect(),
            ),
        );
        w.add_kv(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        );
        w.add_kv(
            "tokenizer.ggml.merges",
            Value::Array(ValueType::String, Vec::new()),
        );
        w.add_kv("tokenizer.ggml.bos_token_id", Value::U32(EOT));
        w.add_kv("tokenizer.ggml.eos_token_id", Value::U32(EOT));
        w.add_kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
        w
    }
}

/// The byte-level vocabulary: token `b` (0..256) is byte `b` written with GPT-2's
/// byte-to-unicode table (so a BPE tokenizer without merges maps each byte to its own id),
/// then `<|endoftext|>`.
pub fn byte_tokens() -> Vec<String> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    let mut v: Vec<String> = (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).expect("valid code point").to_string()
        })
        .collect();
    v.push("<|endoftext|>".into());
    v
}

/// Text to byte tokens.
pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Byte tokens back to text (`<|endoftext|>` and invalid UTF-8 shown as they are).
pub fn decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().filter(|&&t| t < 256).map(|&t| t as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Normal samples (Box–Muller over xorshift64*), deterministic in the seed.
pub struct Normal {
    s: u64,
    spare: Option<f64>,
}

impl Normal {
    pub fn new(seed: u64) -> Normal {
        Normal {
            s: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            spare: None,
        }
    }

    fn uniform(&mut self) -> f64 {
        self.s ^= self.s >> 12;
        self.s ^= self.s << 25;
        self.s ^= self.s >> 27;
        let x = self.s.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn sample(&mut self) -> f64 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * th.sin());
        r * th.cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_are_gpt2s_table() {
        let t = byte_tokens();
        assert_eq!(t.len(), BYTE_VOCAB);
        assert_eq!(t[b'A' as usize], "A");
        assert_eq!(t[b' ' as usize], "Ġ"); // GPT-2 writes a space as U+0120
        assert_eq!(t[b'\n' as usize], "Ċ");
        assert_eq!(t[0], "Ā");
        let mut sorted = t.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), BYTE_VOCAB, "tokens are unique");
        assert_eq!(decode(&encode("héllo\n")), "héllo\n");
    }

    #[test]
    fn init_is_deterministic_with_the_right_statistics() {
        let c = Gpt2Config {
            n_vocab: 257,
            n_ctx: 16,
            n_embd: 32,
            n_head: 4,
            n_layer: 2,
        };
        let a = c.init(1);
        assert_eq!(a, c.init(1));
        assert_eq!(a.len(), 2 + 12 * 2 + 2);
        let emb = &a[0].1;
        let std = (emb.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / emb.len() as f64).sqrt();
        assert!((std - 0.02).abs() < 0.002, "{std}");
        assert!(a
            .iter()
            .find(|(n, _)| n == "blk.0.attn_norm.weight")
            .unwrap()
            .1
            .iter()
            .all(|&v| v == 1.0));
    }
}
