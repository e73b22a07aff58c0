//! Tokenizer tests against llama.cpp.
//!
//! * llama.cpp's own tokenizer test vectors (`models/ggml-vocab-*.gguf` with `.gguf.inp` /
//!   `.gguf.out`, as `tests/test-tokenizer-0` runs them: `add_special = false`,
//!   `parse_special = false`), from the directory `TESSERA_VOCAB_DIR` (fill it with
//!   `dev/fetch-vocab.sh DIR`). Skipped when unset or empty, unless `TESSERA_REQUIRE_VOCAB` is set.
//! * The default model, SmolLM2-135M-Instruct (`TESSERA_MODEL_PATH`, default
//!   the cache `tessera run` fills). Skipped when absent, unless
//!   `TESSERA_REQUIRE_MODEL` is set.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tessera_gguf::GgufFile;
use tessera_llm::tokenizer::{Tokenizer, TokenizerError};

const DEFAULT_MODEL: &str = tessera_llm::fetch::DEFAULT_FILE;

/// Vocab files that must be present and pass when the vocab directory is given.
const REQUIRED_VOCABS: &[&str] = &["gpt-2", "llama-bpe", "qwen2", "llama-spm"];

fn vocab_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_VOCAB_DIR").map(PathBuf::from);
    let has_files = dir.as_deref().is_some_and(|d| {
        std::fs::read_dir(d).is_ok_and(|mut it| {
            it.any(|e| {
                e.is_ok_and(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with("ggml-vocab-") && name.ends_with(".gguf.inp")
                })
            })
        })
    });
    if has_files {
        return dir;
    }
    if std::env::var_os("TESSERA_REQUIRE_VOCAB").is_some() {
        panic!(
            "TESSERA_REQUIRE_VOCAB is set but no llama.cpp vocab test files were found in {} \
             (set TESSERA_VOCAB_DIR; dev/fetch-vocab.sh DIR fetches them)",
            dir.map_or("(TESSERA_VOCAB_DIR unset)".into(), |d| d
                .display()
                .to_string())
        );
    }
    println!("SKIPPED: llama.cpp vocab test files not found (set TESSERA_VOCAB_DIR)");
    None
}

fn model_path() -> Option<PathBuf> {
    let path = std::env::var_os("TESSERA_MODEL_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| tessera_llm::fetch::cache_dir().join(DEFAULT_MODEL));
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("TESSERA_REQUIRE_MODEL").is_some() {
        panic!("TESSERA_REQUIRE_MODEL is set but the model {path:?} does not exist");
    }
    println!("SKIPPED: model {path:?} not found (set TESSERA_MODEL_PATH)");
    None
}

/// The test cases of one vocab file: inputs separated by `\n__ggml_vocab_test__\n`, one line of
/// expected ids per input (as llama.cpp's `test-tokenizer-0` reads them).
fn read_cases(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(sep) {
            Some(i) => {
                inputs.push(raw[pos..pos + i].to_string());
                pos += i + sep.len();
            }
            None => {
                inputs.push(raw[pos..].to_string());
                break;
            }
        }
    }
    let expected: Vec<Vec<u32>> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{}: inputs and outputs differ in number",
        inp.display()
    );
    inputs.into_iter().zip(expected).collect()
}

#[test]
fn llama_cpp_vocab_test_vectors() {
    let Some(dir) = vocab_dir() else {
        return;
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            let stem = name
                .strip_prefix("ggml-vocab-")?
                .strip_suffix(".gguf.inp")?;
            Some(stem.to_string())
        })
        .collect();
    names.sort();

    let mut tested = Vec::new();
    let mut failures = Vec::new();
    for name in &names {
        let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
        let out = dir.join(format!("ggml-vocab-{name}.gguf.out"));
        if !gguf.is_file() || !out.is_file() {
            println!("{name:>16}: skipped (no .gguf or .gguf.out)");
            continue;
        }
        let f = GgufFile::open(&gguf).unwrap();
        let t0 = Instant::now();
        let tok = match Tokenizer::from_gguf(&f) {
            Ok(t) => t,
            Err(
                e @ (TokenizerError::UnsupportedModel { .. }
                | TokenizerError::UnsupportedPreTokenizer { .. }),
            ) => {
                let short = e.to_string();
                let short = short.split(" (supported").next().unwrap_or(&short);
                println!("{name:>16}: skipped ({short})");
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        let load = t0.elapsed();
        let cases = read_cases(&dir.join(format!("ggml-vocab-{name}.gguf.inp")), &out);
        let t0 = Instant::now();
        let mut ok = 0;
        for (text, want) in &cases {
            let got = tok.encode(text, false, false);
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!(
                    "{name}: {text:?}\n   want {want:?}\n    got {got:?}"
                ));
            }
        }
        println!(
            "{name:>16}: {ok}/{} identical (model {}, pre {:?}; load {:.0?}, encode {:.0?})",
            cases.len(),
            tok.model(),
            tok.pre().unwrap_or("-"),
            load,
            t0.elapsed()
        );
        tested.push(name.clone());
    }
    for f in failures.iter().take(30) {
        println!("MISMATCH {f}");
    }
    assert!(failures.is_empty(), "{} mismatching inputs", failures.len());
    for req in REQUIRED_VOCABS {
        assert!(
            tested.iter().any(|t| t == req),
            "vocab {req} was not tested (missing from {})",
            dir.display()
        );
    }
}

fn smollm() -> Option<Tokenizer> {
    let path = model_path()?;
    let f = GgufFile::open(&path).unwrap();
    Some(Tokenizer::from_gguf(&f).unwrap())
}

#[test]
fn smollm2_once_upon_a_time() {
    let Some(tok) = smollm() else {
        return;
    };
    assert_eq!(tok.model(), "gpt2");
    assert_eq!(tok.pre(), Some("smollm"));
    assert!(!tok.add_bos());
    assert_eq!(
        tok.encode("Once upon a time", true, false),
        [6403, 1980, 253, 655]
    );
    assert_eq!(tok.decode(&[6403, 1980, 253, 655]), "Once upon a time");
}

#[test]
fn smollm2_special_tokens_and_eog() {
    let Some(tok) = smollm() else {
        return;
    };
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let endoftext = tok.token_id("<|endoftext|>").unwrap();
    assert!(tok.is_eog(im_end));
    assert!(tok.is_eog(endoftext));
    assert!(!tok.is_eog(im_start));
    assert!(!tok.is_eog(6403));
    assert_eq!(tok.token_text(im_end), "<|im_end|>");

    let chat = "<|im_start|>user\nHi there<|im_end|>\n";
    let ids = tok.encode(chat, false, true);
    assert_eq!(ids[0], im_start);
    assert!(ids.contains(&im_end));
    assert_eq!(tok.decode(&ids), chat);
    // without parse_special the markers are plain text
    let plain = tok.encode(chat, false, false);
    assert!(!plain.contains(&im_start) && !plain.contains(&im_end));
    assert_eq!(tok.decode(&plain), chat);
}

#[test]
fn smollm2_round_trips() {
    let Some(tok) = smollm() else {
        return;
    };
    let texts = [
        "Hello, world!",
        "  leading and trailing spaces   ",
        "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
        "digits 0 12 345 6789 3.14159 1,000,000",
        "Ünïcödé: naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית, العربية",
        "emoji 🦙🚀👩‍👩‍👧‍👦 and flags 🇫🇷",
        "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
        "def f(a, b):\n\treturn a ** b  # comment\n",
        "it's, I'm, we'll, they've, you'd, she's, IT'S",
        "\u{3000}ideographic space, nbsp\u{a0}here, zero\u{200b}width",
        "\n",
        " ",
        "",
        "<|im_start|> not parsed",
        "combining: e\u{301} a\u{308}",
    ];
    for s in texts {
        let ids = tok.encode(s, false, false);
        assert_eq!(tok.decode(&ids), s, "ids {ids:?}");
        // decoding token by token gives the same bytes
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.decode_token(id)).collect();
        assert_eq!(bytes, s.as_bytes());
    }
}

#[test]
fn smollm2_encoding_is_fast() {
    let Some(tok) = smollm() else {
        return;
    };
    let para = "The quick brown fox jumps over the lazy dog. 1234567890 times!\n\
                fn add(a: i32, b: i32) -> i32 { a + b }  // üñíçødé 日本 🦙\n";
    let text = para.repeat(1000); // ~130 kB
    let t0 = Instant::now();
    let ids = tok.encode(&text, false, false);
    let dt = t0.elapsed();
    println!(
        "encoded {} bytes into {} tokens in {dt:.2?} ({:.1} MB/s)",
        text.len(),
        ids.len(),
        text.len() as f64 / dt.as_secs_f64() / 1e6
    );
    assert_eq!(tok.decode(&ids), text);
    // one long word without spaces must not be quadratic
    let word = "ab".repeat(20_000);
    let t0 = Instant::now();
    let ids = tok.encode(&word, false, false);
    println!(
        "40 kB single word: {} tokens in {:.2?}",
        ids.len(),
        t0.elapsed()
    );
    assert_eq!(tok.decode(&ids), word);
}
