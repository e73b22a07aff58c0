//! `tessera finetune` on the default model (SmolLM2-135M-Instruct Q4_1): LoRA adapters trained
//! on one Shakespeare play lower the training loss and the held-out perplexity of that play;
//! the adapter has llama.cpp's format; `export-lora` merges it; bad targets and mismatched
//! adapters are named.

use std::path::PathBuf;
use std::process::Command;

use tessera_gguf::{GgufFile, GgufWriter, Value};

fn tessera(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ppl(err: &str) -> f64 {
    let l = err
        .lines()
        .chain(std::iter::empty())
        .find(|l| l.contains("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("{err}"));
    l.split("PPL = ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn lora_on_a_quantized_model_learns_a_play() {
    let Some(model) = tessera_llm::fetch::model_for_tests() else {
        return;
    };
    let plays = match tessera_llm::fetch::training_text() {
        Ok(p) => p,
        Err(e) if std::env::var_os("TESSERA_REQUIRE_MODEL").is_none() => {
            eprintln!("SKIPPED: the training text could not be fetched: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let play = std::fs::read_to_string(plays.join("tragedies/macbeth.md")).unwrap();
    let dir = std::env::temp_dir().join(format!("tessera-finetune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = |s: &str, a: usize, b: usize| -> String {
        let (mut a, mut b) = (a, b.min(s.len()));
        while !s.is_char_boundary(a) {
            a += 1;
        }
        while !s.is_char_boundary(b) {
            b -= 1;
        }
        s[a..b].to_string()
    };
    let train = dir.join("train.txt");
    let held = dir.join("heldout.txt");
    std::fs::write(&train, cut(&play, 20_000, 30_000)).unwrap();
    std::fs::write(&held, cut(&play, 60_000, 64_000)).unwrap();
    let adapter = dir.join("adapter.gguf");
    let (m, tr, ho, ad) = (
        model.to_str().unwrap(),
        train.to_str().unwrap(),
        held.to_str().unwrap(),
        adapter.to_str().unwrap(),
    );

    let (code, _, err) = tessera(&[
        "finetune",
        "-m",
        m,
        "--data",
        tr,
        "-o",
        ad,
        "--max-steps",
        "10",
        "-b",
        "2",
        "-c",
        "64",
        "--lr",
        "3e-3",
        "--lora-rank",
        "8",
        "--targets",
        "q,v,o,up,down",
        "-t",
        "2",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("mapped weights (no copy)"), "{err}");
    assert!(
        !err.contains("reference fallback"),
        "every op of the step has a fast kernel: {err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("training loss"))
        .unwrap_or_else(|| panic!("{err}"));
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches(',').parse().ok())
        .collect();
    let (first, last) = (nums[0], nums[nums.len() - 1]);
    assert!(last < first, "training loss must fall: {line}");

    // --resume continues from the adapter and its optimizer state (to a copy, so that the
    // checks below see the 10-step adapter)
    let resumed = dir.join("resumed.gguf");
    std::fs::copy(&adapter, &resumed).unwrap();
    std::fs::copy(
        dir.join("adapter.gguf.train.gguf"),
        dir.join("resumed.gguf.train.gguf"),
    )
    .unwrap();
    let (code, _, err) = tessera(&[
        "finetune",
        "-m",
        m,
        "--data",
        tr,
        "-o",
        resumed.to_str().unwrap(),
        "--max-steps",
        "11",
        "-b",
        "2",
        "-c",
        "64",
        "--lr",
        "3e-3",
        "--lora-rank",
        "8",
        "--targets",
        "q,v,o,up,down",
        "-t",
        "2",
        "--quiet",
        "--resume",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("resuming at step 10") && err.contains("11 steps in"),
        "{err}"
    );

    // llama.cpp's adapter format, checked against the base model
    let f = GgufFile::open(&adapter).unwrap();
    assert_eq!(
        f.get("general.type").and_then(Value::as_str),
        Some("adapter")
    );
    assert_eq!(f.get("adapter.type").and_then(Value::as_str), Some("lora"));
    assert_eq!(
        f.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    assert_eq!(
        f.get("adapter.lora.alpha").and_then(Value::as_f64),
        Some(16.0)
    );
    let a = f.tensor("blk.3.attn_q.weight.lora_a").unwrap();
    let b = f.tensor("blk.3.attn_q.weight.lora_b").unwrap();
    assert_eq!(
        (a.shape(), b.shape()),
        (&[576usize, 8][..], &[8usize, 576][..])
    );
    assert!(
        f.tensor("blk.0.attn_k.weight.lora_a").is_none(),
        "k was not targeted"
    );
    assert_eq!(f.tensors.len(), 30 * 5 * 2);

    // held-out perplexity of the same play falls
    let (c1, o1, e1) = tessera(&["perplexity", "-m", m, "-f", ho, "-c", "64", "-t", "2"]);
    let (c2, o2, e2) = tessera(&[
        "perplexity",
        "-m",
        m,
        "--lora",
        ad,
        "-f",
        ho,
        "-c",
        "64",
        "-t",
        "2",
    ]);
    assert_eq!((c1, c2), (0, 0), "{e1}\n{e2}");
    let (base, tuned) = (ppl(&o1), ppl(&o2));
    eprintln!("held-out perplexity: base {base}, with the adapter {tuned}");
    assert!(
        tuned < base * 0.97,
        "held-out perplexity {tuned} vs base {base}"
    );

    // merged into the base weights (adapted weights in f16, like llama.cpp's export-lora):
    // the adapter's perplexity
    let merged = dir.join("merged.gguf");
    let (code, _, err) = tessera(&[
        "export-lora",
        "-m",
        m,
        "--lora",
        ad,
        "-o",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (c3, o3, e3) = tessera(&[
        "perplexity",
        "-m",
        merged.to_str().unwrap(),
        "-f",
        ho,
        "-c",
        "64",
        "-t",
        "2",
    ]);
    assert_eq!(c3, 0, "{e3}");
    let m_ppl = ppl(&o3);
    assert!(
        (m_ppl - tuned).abs() < 0.02 * tuned,
        "merged {m_ppl}, adapter {tuned}, base {base}"
    );

    // a target the model lacks, listed against what it has
    let (code, _, err) = tessera(&[
        "finetune",
        "-m",
        m,
        "--data",
        tr,
        "-o",
        ad,
        "--targets",
        "q,qkv",
        "--quiet",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("'qkv'") && err.contains("q, k, v, o, gate, up, down"),
        "{err}"
    );
    // an adapter that does not fit the base model: the first mismatch is named
    let bad = dir.join("bad.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("llama".into()));
    w.add_kv("general.type", Value::String("adapter".into()));
    w.add_kv("adapter.type", Value::String("lora".into()));
    w.add_kv("adapter.lora.alpha", Value::F32(8.0));
    w.add_tensor(
        "blk.0.attn_q.weight.lora_a",
        tessera::DType::F32,
        &[500, 4],
        &vec![0u8; 500 * 4 * 4],
    )
    .unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight.lora_b",
        tessera::DType::F32,
        &[4, 576],
        &vec![0u8; 4 * 576 * 4],
    )
    .unwrap();
    w.write_file(&bad).unwrap();
    let (code, _, err) = tessera(&[
        "run",
        "-m",
        m,
        "--lora",
        bad.to_str().unwrap(),
        "-p",
        "x",
        "-n",
        "1",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("[500, 4]"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
    let _ = PathBuf::new();
}

/// Full fine-tuning of an f32 model, and training only the token embedding of a model with
/// Qwen2.5's vocabulary (151936 rows): both run, lower the loss, and write a model that loads.
#[test]
fn full_and_embedding_only_fine_tuning_with_a_large_vocabulary() {
    let dir = match std::env::var_os("TESSERA_VOCAB_DIR") {
        Some(d) if PathBuf::from(&d).join("ggml-vocab-qwen2.gguf").is_file() => PathBuf::from(d),
        _ if std::env::var_os("TESSERA_REQUIRE_VOCAB").is_some() => panic!(
            "TESSERA_REQUIRE_VOCAB is set but TESSERA_VOCAB_DIR has no ggml-vocab-qwen2.gguf"
        ),
        _ => {
            eprintln!("SKIPPED: needs TESSERA_VOCAB_DIR (llama.cpp's vocab files)");
            return;
        }
    };
    let vocab = GgufFile::open(dir.join("ggml-vocab-qwen2.gguf")).unwrap();
    let tmp = std::env::temp_dir().join(format!("tessera-full-ft-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let model = tmp.join("tiny-qwen2.gguf");
    std::fs::write(&model, tessera_llm::testing::tiny_model("qwen2", &vocab)).unwrap();
    let text = tmp.join("text.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. 0123456789! ".repeat(30),
    )
    .unwrap();
    let (m, t) = (model.to_str().unwrap(), text.to_str().unwrap());
    // the same model with f16 weights, for full fine-tuning from f16
    let m16 = tmp.join("tiny-qwen2-f16.gguf");
    let (code, _, err) = tessera(&["quantize", m, m16.to_str().unwrap(), "F16"]);
    assert_eq!(code, 0, "{err}");
    let m16 = m16.to_str().unwrap().to_string();
    for (mode, out) in [
        ("--full", "full.gguf"),
        ("--full", "full-from-f16.gguf"),
        ("--train-embeddings", "embd.gguf"),
    ] {
        let m = if out == "full-from-f16.gguf" {
            m16.as_str()
        } else {
            m
        };
        let out = tmp.join(out);
        let (code, _, err) = tessera(&[
            "finetune",
            "-m",
            m,
            "--data",
            t,
            mode,
            "-o",
            out.to_str().unwrap(),
            "--max-steps",
            "6",
            "-b",
            "2",
            "-c",
            "32",
            "--lr",
            "1e-2",
            "--val",
            "0",
            "-t",
            "2",
            "--quiet",
        ]);
        assert_eq!(code, 0, "{mode}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains("training loss"))
            .unwrap_or_else(|| panic!("{err}"));
        let nums: Vec<f64> = line
            .split_whitespace()
            .filter_map(|w| w.trim_end_matches(',').parse().ok())
            .collect();
        assert!(nums[nums.len() - 1] < nums[0], "{mode}: {line}");
        if mode == "--train-embeddings" {
            // only the 151936×64 embedding is trained
            assert!(err.contains("9.72 M trained params"), "{err}");
        }
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(
            f.tensor("token_embd.weight").unwrap().shape(),
            &[64, 151936][..]
        );
        let (code, stdout, err) = tessera(&[
            "run",
            "-m",
            out.to_str().unwrap(),
            "-p",
            "The quick",
            "-n",
            "4",
            "--temp",
            "0",
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(stdout.starts_with("The quick"), "{stdout}");
    }
    // a quantized model cannot be fully fine-tuned: LoRA is the way
    if let Some(q) = tessera_llm::fetch::model_for_tests() {
        let (code, _, err) = tessera(&[
            "finetune",
            "-m",
            q.to_str().unwrap(),
            "--data",
            t,
            "--full",
            "-o",
            "/tmp/x.gguf",
            "--quiet",
        ]);
        assert_ne!(code, 0);
        assert!(err.contains("--full") && err.contains("LoRA"), "{err}");
    }
    std::fs::remove_dir_all(&tmp).ok();
}
