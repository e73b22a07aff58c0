//! Test support: tiny random-weight models with real vocabularies (used by the tests of this
//! crate and of the `tessera` binary). Not part of the stable API.

use tessera::DType;
use tessera_gguf::{GgufFile, GgufWriter, Value};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn tensor(&mut self, n: usize, scale: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| (self.next() * scale).to_le_bytes())
            .collect()
    }
}

/// A model of architecture `arch` with the vocabulary of `vocab`, 2 layers, random f32 weights.
pub fn tiny_model(arch: &str, vocab: &GgufFile) -> Vec<u8> {
    let (e, ff, nh, nkv, n_ctx, n_layer) = (
        64usize,
        128usize,
        4usize,
        if arch == "qwen2" { 2 } else { 4 },
        256usize,
        2usize,
    );
    let hd = e / nh;
    let n_vocab = vocab
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map_or(0, |a| a.len());
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::from(arch));
    w.add_kv("general.name", Value::from(format!("tiny-{arch}").as_str()));
    w.add_kv(&format!("{arch}.context_length"), Value::U32(n_ctx as u32));
    w.add_kv(&format!("{arch}.embedding_length"), Value::U32(e as u32));
    w.add_kv(
        &format!("{arch}.feed_forward_length"),
        Value::U32(ff as u32),
    );
    w.add_kv(&format!("{arch}.block_count"), Value::U32(n_layer as u32));
    w.add_kv(
        &format!("{arch}.attention.head_count"),
        Value::U32(nh as u32),
    );
    w.add_kv(
        &format!("{arch}.attention.head_count_kv"),
        Value::U32(nkv as u32),
    );
    if arch == "gpt2" {
        w.add_kv("gpt2.attention.layer_norm_epsilon", Value::F32(1e-5));
    } else {
        w.add_kv("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
        w.add_kv("qwen2.rope.freq_base", Value::F32(1_000_000.0));
    }
    for (k, v) in &vocab.metadata {
        if k.starts_with("tokenizer.") {
            w.add_kv(k, v.clone());
        }
    }
    let mut rng = Rng(0x1234_5678 + arch.len() as u64);
    let mut t = |w: &mut GgufWriter, name: &str, ne: &[usize], scale: f32| {
        let n: usize = ne.iter().product();
        w.add_tensor(name, DType::F32, ne, &rng.tensor(n, scale))
            .unwrap();
    };
    let ones = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (1.0f32 + 0.01 * (i % 7) as f32).to_le_bytes())
            .collect()
    };
    t(&mut w, "token_embd.weight", &[e, n_vocab], 0.5);
    if arch == "gpt2" {
        t(&mut w, "position_embd.weight", &[e, n_ctx], 0.1);
    }
    for l in 0..n_layer {
        let p = format!("blk.{l}");
        w.add_tensor(&format!("{p}.attn_norm.weight"), DType::F32, &[e], &ones(e))
            .unwrap();
        w.add_tensor(&format!("{p}.ffn_norm.weight"), DType::F32, &[e], &ones(e))
            .unwrap();
        if arch == "gpt2" {
            t(&mut w, &format!("{p}.attn_norm.bias"), &[e], 0.1);
            t(&mut w, &format!("{p}.attn_qkv.weight"), &[e, 3 * e], 0.2);
            t(&mut w, &format!("{p}.attn_qkv.bias"), &[3 * e], 0.1);
            t(&mut w, &format!("{p}.attn_output.weight"), &[e, e], 0.2);
            t(&mut w, &format!("{p}.attn_output.bias"), &[e], 0.1);
            t(&mut w, &format!("{p}.ffn_norm.bias"), &[e], 0.1);
            t(&mut w, &format!("{p}.ffn_up.weight"), &[e, ff], 0.2);
            t(&mut w, &format!("{p}.ffn_up.bias"), &[ff], 0.1);
            t(&mut w, &format!("{p}.ffn_down.weight"), &[ff, e], 0.2);
            t(&mut w, &format!("{p}.ffn_down.bias"), &[e], 0.1);
        } else {
            t(&mut w, &format!("{p}.attn_q.weight"), &[e, nh * hd], 0.2);
            t(&mut w, &format!("{p}.attn_q.bias"), &[nh * hd], 0.1);
            t(&mut w, &format!("{p}.attn_k.weight"), &[e, nkv * hd], 0.2);
            t(&mut w, &format!("{p}.attn_k.bias"), &[nkv * hd], 0.1);
            t(&mut w, &format!("{p}.attn_v.weight"), &[e, nkv * hd], 0.2);
            t(&mut w, &format!("{p}.attn_v.bias"), &[nkv * hd], 0.1);
            t(
                &mut w,
                &format!("{p}.attn_output.weight"),
                &[nh * hd, e],
                0.2,
            );
            t(&mut w, &format!("{p}.ffn_gate.weight"), &[e, ff], 0.2);
            t(&mut w, &format!("{p}.ffn_up.weight"), &[e, ff], 0.2);
            t(&mut w, &format!("{p}.ffn_down.weight"), &[ff, e], 0.2);
        }
    }
    w.add_tensor("output_norm.weight", DType::F32, &[e], &ones(e))
        .unwrap();
    if arch == "gpt2" {
        t(&mut w, "output_norm.bias", &[e], 0.1);
    }
    w.to_bytes().unwrap()
}

/// llama.cpp's greedy continuation of "Once upon a time" on the default model (SmolLM2-135M-
/// Instruct Q4_1): this workspace's llama-cpp-python 0.3.36 vendor copy built for an AVX2
/// machine, flash attention on, f16 KV cache; 48 ids, the same at 1 and 2 threads. Tessera
/// gives them on every instruction set: its AVX2 kernels, the portable path
/// (`TESSERA_ISA=scalar`) and aarch64's NEON kernels all compute ggml's AVX2 arithmetic for this
/// model's types (q4_1, q8_0 and the float ops).
pub const GREEDY_LLAMA_CPP_AVX2: [u32; 48] = [
    28, 260, 2240, 282, 1315, 27108, 436, 253, 15114, 39228, 28, 351, 25854, 41658, 284, 14055,
    9018, 30, 1249, 347, 260, 929, 3514, 411, 28, 260, 2240, 2585, 288, 5946, 624, 2798, 9615, 30,
    378, 2268, 29, 37314, 3422, 1439, 282, 260, 2240, 2585, 288, 42234, 28, 5170,
];
