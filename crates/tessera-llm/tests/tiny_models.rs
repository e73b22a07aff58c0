//! Tiny random-weight GPT-2 and Qwen2 models (built here, with the real vocabularies of llama.cpp's
//! vocab test files) run through Tessera and compared with the logits llama.cpp computed for the
//! very same files (the expected values below; to regenerate them, run this test with
//! `TESSERA_WRITE_TINY=DIR`, then llama.cpp on `DIR/tiny-*.gguf` with the token ids below and print
//! the last token's logits at the listed ids).
//!
//! Needs `TESSERA_VOCAB_DIR` (see tests/tokenizer.rs); skipped without it unless
//! `TESSERA_REQUIRE_VOCAB` is set.

use std::path::PathBuf;
use std::sync::Arc;

use tessera_gguf::GgufFile;
use tessera_llm::{Context, ContextParams, Model};

fn vocab_dir() -> Option<PathBuf> {
    match std::env::var_os("TESSERA_VOCAB_DIR").map(PathBuf::from) {
        Some(d) if d.join("ggml-vocab-gpt-2.gguf").is_file() => Some(d),
        _ if std::env::var_os("TESSERA_REQUIRE_VOCAB").is_some() => {
            panic!("TESSERA_REQUIRE_VOCAB is set but TESSERA_VOCAB_DIR has no vocab files")
        }
        _ => {
            eprintln!("SKIPPED: tiny-model tests need TESSERA_VOCAB_DIR (llama.cpp's vocab files)");
            None
        }
    }
}

use tessera_llm::testing::tiny_model as make;

const TOKENS: [u32; 6] = [464, 2068, 7586, 21831, 18045, 625];

/// Logits of the last of `TOKENS` at ids 0..8, from llama.cpp (llama-cpp-python 0.3.36's vendor
/// copy, AVX2 build) on the same files. GPT-2 agrees to about 1e-3 (ggml computes GELU through an
/// f16 table), Qwen2 to 1e-6.
const EXPECTED: [(&str, &str, [f32; 8]); 2] = [
    (
        "gpt2",
        "ggml-vocab-gpt-2.gguf",
        [
            -4.098646, 4.230120, 0.179316, 3.545259, -3.387631, -1.673679, -4.740952, -1.659818,
        ],
    ),
    (
        "qwen2",
        "ggml-vocab-qwen2.gguf",
        [
            3.034748, -4.331977, 0.231182, -0.056510, -0.887254, 2.884437, -1.586843, -4.195411,
        ],
    ),
];

#[test]
fn tiny_gpt2_and_qwen2_match_llama_cpp() {
    let Some(dir) = vocab_dir() else { return };
    for (arch, vocab_file, expected) in EXPECTED {
        let vocab = GgufFile::open(dir.join(vocab_file)).unwrap();
        let bytes = make(arch, &vocab);
        if let Some(out) = std::env::var_os("TESSERA_WRITE_TINY") {
            std::fs::write(PathBuf::from(out).join(format!("tiny-{arch}.gguf")), &bytes).unwrap();
        }
        let model =
            Arc::new(Model::from_file(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap());
        let mut ctx = Context::new(
            Arc::clone(&model),
            ContextParams {
                n_ctx: 64,
                n_threads: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let logits = ctx.eval(&TOKENS, false).unwrap();
        eprintln!("{arch}: {:?}", &logits[..8]);
        for (i, (&got, &want)) in logits.iter().zip(&expected).enumerate() {
            assert!(
                (got - want).abs() <= 2e-3 * (1.0 + want.abs()),
                "{arch} logit {i}: {got} vs llama.cpp {want}"
            );
        }
    }
}
