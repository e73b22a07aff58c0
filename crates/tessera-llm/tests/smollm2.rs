//! End-to-end checks on the default model, SmolLM2-135M-Instruct Q4_1, against llama.cpp.
//!
//! The model is found through `TESSERA_MODEL_PATH`, else in the cache `tessera run` fills
//! (`$TESSERA_CACHE`, `$XDG_CACHE_HOME/tessera` or `~/.cache/tessera`). Without it these tests
//! print `SKIPPED` and pass, unless `TESSERA_REQUIRE_MODEL` is set (as `.ci/run` does).

use std::path::PathBuf;
use std::sync::Arc;

use tessera::DType;
use tessera_gguf::{GgufFile, GgufWriter, Value};
use tessera_llm::{Context, ContextParams, LlmError, Model, Sampler, SamplerParams};

fn model_path() -> Option<PathBuf> {
    tessera_llm::fetch::model_for_tests()
}

// llama.cpp (this workspace's llama-cpp-python 0.3.36 vendor copy, built with -march=native on
// this project's AVX2 machines, flash attention on, f16 KV cache), greedy from the raw prompt
// "Once upon a time": 48 generated ids, the same at 1 and 2 threads.
use tessera_llm::testing::GREEDY_LLAMA_CPP_AVX2 as LLAMA_CPP_AVX2;

/// The ids the issue quotes from llama.cpp on an AVX-512 machine. ggml's own arithmetic differs
/// between its AVX2 and AVX-512 builds (e.g. the f16 dot products of flash attention sum in
/// 16-lane groups), and at step 31 the two builds' top logits are 0.014 apart, so they diverge
/// there; up to it they agree, and so do we.
const LLAMA_CPP_ISSUE: [u32; 31] = [
    28, 260, 2240, 282, 1315, 27108, 436, 253, 15114, 39228, 28, 351, 25854, 41658, 284, 14055,
    9018, 30, 1249, 347, 260, 929, 3514, 411, 28, 260, 2240, 2585, 288, 5946, 624,
];

fn greedy(model: &Arc<Model>, threads: usize, n: usize) -> Vec<u32> {
    let params = ContextParams {
        n_ctx: 512,
        n_threads: threads,
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::clone(model), params).unwrap();
    let mut s = Sampler::new(SamplerParams {
        temp: 0.0,
        ..Default::default()
    });
    let prompt = model.tokenizer.encode("Once upon a time", true, false);
    assert_eq!(
        prompt,
        [6403, 1980, 253, 655],
        "no BOS: the model's metadata says add_bos = false"
    );
    let mut logits = ctx.eval(&prompt, false).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = s.sample(&logits);
        out.push(t);
        logits = ctx.eval(&[t], false).unwrap().to_vec();
    }
    out
}

#[test]
fn greedy_continuation_matches_llama_cpp_token_for_token() {
    let Some(path) = model_path() else { return };
    let model = Arc::new(Model::load(&path).unwrap());
    // on every ISA (the portable path and NEON compute ggml's AVX2 arithmetic for this model;
    // .ci/run runs this test again with TESSERA_ISA=scalar)
    let isa = tessera_cpu::simd::isa().name();
    for threads in [1, 2] {
        let got = greedy(&model, threads, 48);
        assert_eq!(&got[..31], &LLAMA_CPP_ISSUE, "{threads} threads, {isa}");
        assert_eq!(got, LLAMA_CPP_AVX2, "{threads} threads, {isa}");
        let text = model.tokenizer.decode(&got);
        assert!(
            text.starts_with(", the city of New Haven was a thriving metropolis"),
            "{text}"
        );
    }
}

/// The model's q4_1 weights copied into rows interleaved by eight (what `tessera run` does on
/// AVX-512 VNNI; forced here on any CPU) give the same logits bit for bit, from a batched prompt
/// (a plain copy per node) and token by token (the eight-row group loop), on one and two
/// threads: the layout changes where bytes lie, not one result.
#[test]
fn interleaved_weights_give_the_same_logits() {
    let Some(path) = model_path() else { return };
    let plain = Arc::new(Model::load(&path).unwrap());
    let inter = Arc::new(
        Model::load(&path)
            .unwrap()
            .with_interleaved_rows_where(|_| true)
            .unwrap(),
    );
    // every q4_1 matrix of the 30 layers, none of the q8_0 embedding table
    assert_eq!(
        inter.interleaved_bytes(),
        30 * (3 * 552_960 + 2 * 207_360 + 2 * 69_120)
    );
    let toks = plain
        .tokenizer
        .encode("The quick brown fox jumps over", true, false);
    for threads in [1, 2] {
        let run = |m: &Arc<Model>| {
            let mut ctx = Context::new(
                Arc::clone(m),
                ContextParams {
                    n_ctx: 64,
                    n_threads: threads,
                    ..Default::default()
                },
            )
            .unwrap();
            let mut v = ctx.eval(&toks, true).unwrap().to_vec();
            v.extend_from_slice(ctx.eval(&[28], false).unwrap());
            v
        };
        let (a, b) = (run(&plain), run(&inter));
        assert_eq!(a.len(), b.len());
        let differ = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{threads} threads: {differ} of {} logits differ",
            a.len()
        );
    }
}

#[test]
fn batched_prompt_and_token_by_token_agree() {
    let Some(path) = model_path() else { return };
    let model = Arc::new(Model::load(&path).unwrap());
    let toks = model.tokenizer.encode(
        "The quick brown fox jumps over the lazy dog. It was",
        true,
        false,
    );
    let mut a = Context::new(
        Arc::clone(&model),
        ContextParams {
            n_ctx: 256,
            n_threads: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let all = a.eval(&toks, true).unwrap().to_vec();
    let n_vocab = model.hp.n_vocab;
    assert_eq!(all.len(), toks.len() * n_vocab);
    let mut b = Context::new(
        Arc::clone(&model),
        ContextParams {
            n_ctx: 256,
            n_threads: 2,
            n_batch: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let mut last = Vec::new();
    for &t in &toks {
        last = b.eval(&[t], false).unwrap().to_vec();
    }
    let row = &all[(toks.len() - 1) * n_vocab..];
    let argmax = |v: &[f32]| {
        (0..v.len())
            .max_by(|&i, &j| v[i].partial_cmp(&v[j]).unwrap())
            .unwrap()
    };
    assert_eq!(argmax(row), argmax(&last));
    let max_diff = row
        .iter()
        .zip(&last)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "batched vs one by one: {max_diff}");
}

#[test]
fn bad_input_is_reported_with_names_and_lengths() {
    let Some(path) = model_path() else { return };
    let model = Arc::new(Model::load(&path).unwrap());
    // a prompt longer than the context
    let mut ctx = Context::new(
        Arc::clone(&model),
        ContextParams {
            n_ctx: 8,
            n_threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let e = ctx.eval(&[1; 9], false).unwrap_err();
    assert!(
        matches!(
            e,
            LlmError::ContextFull {
                n_ctx: 8,
                n_new: 9,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains('8') && e.to_string().contains('9'),
        "{e}"
    );
    // token ids outside the vocabulary
    let e = ctx.eval(&[u32::MAX], false).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");

    // the same file with another architecture, or without a tensor
    let file = GgufFile::open(&path).unwrap();
    let rewrite = |arch: &str, drop: Option<&str>| -> PathBuf {
        let mut w = GgufWriter::new();
        for (k, v) in &file.metadata {
            let v = if k == "general.architecture" {
                Value::from(arch)
            } else {
                v.clone()
            };
            let k = k.replacen("llama.", &format!("{arch}."), 1);
            w.add_kv(&k, v);
        }
        for t in &file.tensors {
            if Some(t.name.as_str()) != drop {
                w.add_tensor(&t.name, t.dtype, t.shape(), file.tensor_data(t))
                    .unwrap();
            }
        }
        let p = std::env::temp_dir().join(format!(
            "tessera-{arch}-{}-{}.gguf",
            drop.unwrap_or("all").replace('.', "_"),
            std::process::id()
        ));
        w.write_file(&p).unwrap();
        p
    };
    let p = rewrite("mamba", None);
    let e = Model::load(&p)
        .err()
        .expect("unsupported architecture")
        .to_string();
    std::fs::remove_file(&p).ok();
    assert!(
        e.contains("mamba") && e.contains("llama") && e.contains("qwen2") && e.contains("gpt2"),
        "{e}"
    );
    let p = rewrite("llama", Some("blk.7.ffn_up.weight"));
    let e = Model::load(&p).err().expect("missing tensor").to_string();
    std::fs::remove_file(&p).ok();
    assert!(e.contains("blk.7.ffn_up.weight"), "{e}");
}

#[test]
fn f32_kv_cache_and_f32_attention_also_run() {
    let Some(path) = model_path() else { return };
    let model = Arc::new(Model::load(&path).unwrap());
    let params = ContextParams {
        n_ctx: 64,
        n_threads: 2,
        kv_type: DType::F32,
        attn_precision: tessera::op::AttnPrecision::F32,
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), params).unwrap();
    let logits = ctx.eval(&[6403, 1980, 253, 655], false).unwrap();
    let argmax = (0..logits.len())
        .max_by(|&i, &j| logits[i].partial_cmp(&logits[j]).unwrap())
        .unwrap();
    assert_eq!(argmax, 28, "',' after 'Once upon a time'");
}
