//! End-to-end tests of `tessera conformance quant` and `tessera quantize`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::DType;
use tessera_gguf::{GgufFile, GgufWriter, Value};
use tessera_quants::dequantize_row;

const GOLDEN: [&str; 2] = ["quant-gaussian.gguf", "quant-adversarial.gguf"];

fn golden_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
        });
    if GOLDEN.iter().all(|g| dir.join(g).is_file()) {
        return Some(dir);
    }
    if std::env::var_os("TESSERA_REQUIRE_GOLDEN").is_some() {
        panic!(
            "golden vectors required (TESSERA_REQUIRE_GOLDEN) but {} not found in {}",
            GOLDEN.join(", "),
            dir.display()
        );
    }
    eprintln!("SKIPPED: golden quant files not found in {}", dir.display());
    None
}

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

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tessera-quant-{}-{name}", std::process::id()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn conformance_quant_passes_both_golden_files() {
    let Some(dir) = golden_dir() else { return };
    for g in GOLDEN {
        let path = dir.join(g);
        let f = GgufFile::open(&path).unwrap();
        let checked = f
            .tensors
            .iter()
            .filter(|t| ["q.", "qi.", "dq."].iter().any(|p| t.name.starts_with(p)))
            .count();
        let (code, out, err) = tessera(&["conformance", "quant", s(&path)]);
        let lines: Vec<&str> = out.lines().collect();
        let failures: Vec<&&str> = lines[..lines.len().saturating_sub(1)]
            .iter()
            .filter(|l| !l.ends_with("identical"))
            .collect();
        assert!(failures.is_empty(), "{g}: {failures:#?}\n{err}");
        assert_eq!(
            lines.last().copied(),
            Some(format!("{checked} passed, 0 failed").as_str()),
            "{g}:\n{out}\n{err}"
        );
        assert_eq!(lines.len(), checked + 1, "{g}: one line per tensor");
        assert_eq!(code, 0, "{g}: {err}");
        // every kind of check is there
        for name in ["q.q4_K ", "qi.q4_K ", "dq.q4_K ", "q.iq2_xxs ", "q.q8_1 "] {
            assert!(
                lines.iter().any(|l| l.starts_with(name)),
                "{g}: no line for {name}"
            );
        }
    }
}

#[test]
fn conformance_quant_names_a_corrupted_tensor_and_exits_1() {
    let Some(dir) = golden_dir() else { return };
    let path = dir.join(GOLDEN[0]);
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor("q.q4_K").unwrap();
    let row_bytes = DType::Q4K.row_size(t.ne[0]).unwrap();
    // row 1, block 1, a byte in the quants (not the scales)
    let flipped = row_bytes + 144 + 40;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[f.data_offset + t.offset + flipped] ^= 0x5a;
    let bad = temp("bad-golden.gguf");
    std::fs::write(&bad, &bytes).unwrap();

    let (code, out, err) = tessera(&["conformance", "quant", s(&bad)]);
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(code, 1, "{out}\n{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("q.q4_K "))
        .expect("a line for q.q4_K");
    assert!(
        line.contains(&format!(
            "first difference in row 1 block 1 (byte offset {flipped})"
        )),
        "{line}"
    );
    // the golden dq.q4_K no longer matches the decoded (corrupted) bytes either
    let dq = out.lines().find(|l| l.starts_with("dq.q4_K ")).unwrap();
    assert!(dq.contains("first difference in row 1 element"), "{dq}");
    assert!(out.lines().last().unwrap().ends_with(" 2 failed"), "{out}");
    // and nothing else moved
    assert!(out.lines().filter(|l| l.ends_with("identical")).count() > 50);
}

#[test]
fn conformance_quant_on_a_non_golden_file_exits_2() {
    let p = temp("not-gguf.bin");
    std::fs::write(&p, b"definitely not a GGUF file").unwrap();
    let (code, _, err) = tessera(&["conformance", "quant", s(&p)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read"), "{err}");

    // a GGUF file without `input`
    let mut w = GgufWriter::new();
    w.add_tensor("x", DType::F32, &[4], &[0u8; 16]).unwrap();
    w.write_file(&p).unwrap();
    let (code, _, err) = tessera(&["conformance", "quant", s(&p)]);
    std::fs::remove_file(&p).unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("input"), "{err}");
}

// --- quantize ---------------------------------------------------------------------------------

const N_LAYER: usize = 8;
const N_EMBD: usize = 256;
const N_KV: usize = 128;
/// Not a multiple of 256: ffn_down (rows of N_FF) must fall back from the k-quants.
const N_FF: usize = 288;
const N_VOCAB: usize = 64;

struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32) / (1u64 << 24) as f32
    }

    fn gaussian(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() - 2.0
    }
}

struct FakeTensor {
    name: String,
    ne: Vec<usize>,
    /// The values the stored bytes encode (after f16/bf16 rounding).
    values: Vec<f32>,
}

/// A llama-shaped model: token_embd, output, output_norm, and per layer the attention and
/// feed-forward weights (attn_q in f16, attn_output in bf16, the rest f32) and two norms.
fn write_fake_llama(path: &Path) -> Vec<FakeTensor> {
    let mut rng = Rng(42);
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::from("llama"));
    w.add_kv("general.name", Value::from("fake-llama"));
    w.add_kv("general.file_type", Value::U32(0));
    w.add_kv("llama.block_count", Value::U32(N_LAYER as u32));
    w.add_kv("llama.embedding_length", Value::U32(N_EMBD as u32));
    w.add_kv("llama.feed_forward_length", Value::U32(N_FF as u32));
    w.add_kv("llama.attention.head_count", Value::U32(4));
    w.add_kv("llama.attention.head_count_kv", Value::U32(2));
    w.add_kv(
        "tokenizer.ggml.tokens",
        Value::Array(
            tessera_gguf::ValueType::String,
            vec![Value::from("a"), Value::from("b")],
        ),
    );
    let mut specs: Vec<(String, Vec<usize>, DType)> = vec![
        (
            "token_embd.weight".into(),
            vec![N_EMBD, N_VOCAB],
            DType::F32,
        ),
        ("output_norm.weight".into(), vec![N_EMBD], DType::F32),
        ("output.weight".into(), vec![N_EMBD, N_VOCAB], DType::F32),
    ];
    for l in 0..N_LAYER {
        let b = |n: &str| format!("blk.{l}.{n}");
        specs.extend([
            (b("attn_norm.weight"), vec![N_EMBD], DType::F32),
            (b("attn_q.weight"), vec![N_EMBD, N_EMBD], DType::F16),
            (b("attn_k.weight"), vec![N_EMBD, N_KV], DType::F32),
            (b("attn_v.weight"), vec![N_EMBD, N_KV], DType::F32),
            (b("attn_output.weight"), vec![N_EMBD, N_EMBD], DType::BF16),
            (b("ffn_norm.weight"), vec![N_EMBD], DType::F32),
            (b("ffn_gate.weight"), vec![N_EMBD, N_FF], DType::F32),
            (b("ffn_up.weight"), vec![N_EMBD, N_FF], DType::F32),
            (b("ffn_down.weight"), vec![N_FF, N_EMBD], DType::F32),
        ]);
    }
    let mut out = Vec::new();
    for (name, ne, dtype) in specs {
        let n: usize = ne.iter().product();
        let raw: Vec<f32> = if ne.len() == 1 {
            (0..n).map(|_| 1.0 + 0.1 * rng.gaussian()).collect()
        } else {
            (0..n).map(|_| 0.05 * rng.gaussian()).collect()
        };
        let (bytes, values): (Vec<u8>, Vec<f32>) = match dtype {
            DType::F32 => (raw.iter().flat_map(|x| x.to_le_bytes()).collect(), raw),
            DType::F16 => {
                let h: Vec<half::f16> = raw.iter().map(|&x| half::f16::from_f32(x)).collect();
                (
                    h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    h.iter().map(|x| x.to_f32()).collect(),
                )
            }
            DType::BF16 => {
                let h: Vec<half::bf16> = raw.iter().map(|&x| half::bf16::from_f32(x)).collect();
                (
                    h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    h.iter().map(|x| x.to_f32()).collect(),
                )
            }
            _ => unreachable!(),
        };
        w.add_tensor(&name, dtype, &ne, &bytes).unwrap();
        out.push(FakeTensor { name, ne, values });
    }
    w.write_file(path).unwrap();
    out
}

/// llama.cpp's `use_more_bits` for 8 layers: the first and last eighth, and every third layer.
fn more_bits(layer: usize) -> bool {
    [0, 3, 6, 7].contains(&layer)
}

fn expected_type(name: &str, ftype: &str) -> DType {
    if name.ends_with("_norm.weight") {
        return DType::F32;
    }
    if ftype == "q8_0" {
        return DType::Q8_0;
    }
    assert_eq!(ftype, "Q4_K_M");
    let layer: Option<usize> = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok());
    match (name, layer) {
        ("output.weight", _) => DType::Q6K,
        // untied embeddings keep the base type
        ("token_embd.weight", _) => DType::Q4K,
        (n, Some(l)) if n.ends_with("attn_v.weight") && more_bits(l) => DType::Q6K,
        // ffn_down rows are 288 long: q6_K falls back to q8_0, q4_K to q5_0
        (n, Some(l)) if n.ends_with("ffn_down.weight") && more_bits(l) => DType::Q8_0,
        (n, Some(_)) if n.ends_with("ffn_down.weight") => DType::Q5_0,
        _ => DType::Q4K,
    }
}

fn rel_rmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn check_output(out: &Path, fake: &[FakeTensor], ftype: &str, ftype_id: u32) {
    let f = GgufFile::open(out).unwrap();
    // metadata copied, file type and quantization version set
    let input_meta = [
        ("general.architecture", Value::from("llama")),
        ("general.name", Value::from("fake-llama")),
        ("llama.block_count", Value::U32(N_LAYER as u32)),
        ("llama.attention.head_count_kv", Value::U32(2)),
    ];
    for (k, v) in input_meta {
        assert_eq!(f.get(k), Some(&v), "{k}");
    }
    assert_eq!(
        f.get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(|a| a.len()),
        Some(2)
    );
    assert_eq!(f.get("general.file_type"), Some(&Value::U32(ftype_id)));
    assert_eq!(f.get("general.quantization_version"), Some(&Value::U32(2)));
    assert_eq!(f.tensors.len(), fake.len());

    for t in fake {
        let q = f
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!(q.shape(), &t.ne[..], "{}", t.name);
        let want = expected_type(&t.name, ftype);
        assert_eq!(q.dtype, want, "{}: {} instead of {want}", t.name, q.dtype);
        let data = f.tensor_data(q);
        let decoded: Vec<f32> = if q.dtype == DType::F32 {
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect()
        } else {
            let n = t.ne[0];
            let row = q.dtype.row_size(n).unwrap();
            let mut v = vec![0f32; t.values.len()];
            for (r, chunk) in v.chunks_mut(n).enumerate() {
                dequantize_row(q.dtype.id(), &data[r * row..(r + 1) * row], chunk).unwrap();
            }
            v
        };
        if t.ne.len() == 1 {
            assert_eq!(decoded, t.values, "{}: 1-D tensors are copied", t.name);
            continue;
        }
        let bound = match q.dtype {
            DType::Q8_0 => 0.01,
            DType::Q6K => 0.02,
            DType::Q5_0 | DType::Q4K => 0.08,
            _ => unreachable!(),
        };
        let e = rel_rmse(&decoded, &t.values);
        assert!(e < bound, "{} ({}): relative rmse {e}", t.name, q.dtype);
    }
}

#[test]
fn quantize_a_fake_llama_to_q8_0_and_q4_k_m() {
    let input = temp("fake-f32.gguf");
    let fake = write_fake_llama(&input);
    for (ftype, id) in [("q8_0", 7), ("Q4_K_M", 15)] {
        let out = temp(&format!("fake-{ftype}.gguf"));
        let (code, stdout, err) = tessera(&["quantize", s(&input), s(&out), ftype, "-t", "2"]);
        assert_eq!(code, 0, "{stdout}\n{err}");
        check_output(&out, &fake, ftype, id);
        if ftype == "Q4_K_M" {
            // the fallback is named in the output
            let line = stdout
                .lines()
                .find(|l| l.contains("blk.1.ffn_down.weight"))
                .unwrap();
            assert!(line.contains("falling back to q5_0"), "{line}\n{stdout}");
        }
        assert!(stdout.contains("quant size"), "{stdout}");

        // quantizing the quantized file again is refused without --allow-requantize
        let again = temp(&format!("fake-{ftype}-again.gguf"));
        // (a type whose choice differs: tensors already in their chosen type are just copied)
        let other = if ftype == "q8_0" { "Q4_K_M" } else { "q8_0" };
        let (code, _, err) = tessera(&["quantize", s(&out), s(&again), other]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("already quantized") && err.contains("--allow-requantize"),
            "{err}"
        );
        assert!(err.contains(".weight"), "the error names the tensor: {err}");
        assert!(!again.exists());
        if ftype == "Q4_K_M" {
            // output.weight comes first in llama.cpp's order
            assert!(
                err.contains("output.weight is already quantized (q6_K)"),
                "{err}"
            );
            // already in the chosen types: nothing to requantize, so no flag needed
            let (code, stdout, err) = tessera(&["quantize", s(&out), s(&again), "Q4_K_M"]);
            assert_eq!(code, 0, "{stdout}\n{err}");
            assert!(!stdout.contains(" -> "), "{stdout}");
            std::fs::remove_file(&again).unwrap();
        }
        if ftype == "q8_0" {
            assert!(err.contains("(q8_0)"), "the error names the type: {err}");
            let (code, stdout, err) = tessera(&[
                "quantize",
                s(&out),
                s(&again),
                "Q4_K_M",
                "--allow-requantize",
            ]);
            assert_eq!(code, 0, "{stdout}\n{err}");
            let f = GgufFile::open(&again).unwrap();
            assert_eq!(f.tensor("output.weight").unwrap().dtype, DType::Q6K);
            assert_eq!(f.tensor("blk.2.attn_q.weight").unwrap().dtype, DType::Q4K);
            std::fs::remove_file(&again).unwrap();
        }
        std::fs::remove_file(&out).unwrap();
    }

    // --pure: every quantizable tensor gets q4_K (or its fallback), no mixing
    let out = temp("fake-pure.gguf");
    let (code, stdout, err) = tessera(&["quantize", s(&input), s(&out), "Q4_K_M", "--pure"]);
    assert_eq!(code, 0, "{stdout}\n{err}");
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.tensor("output.weight").unwrap().dtype, DType::Q4K);
    assert_eq!(f.tensor("blk.0.attn_v.weight").unwrap().dtype, DType::Q4K);
    assert_eq!(
        f.tensor("blk.0.ffn_down.weight").unwrap().dtype,
        DType::Q5_0
    );
    assert_eq!(
        f.tensor("blk.0.attn_norm.weight").unwrap().dtype,
        DType::F32
    );
    std::fs::remove_file(&out).unwrap();
    std::fs::remove_file(&input).unwrap();
}

#[test]
fn quantize_reports_bad_input() {
    let input = temp("bad-input-f32.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::from("llama"));
    w.add_tensor("blk.0.attn_q.weight", DType::F32, &[32, 2], &[0u8; 256])
        .unwrap();
    w.write_file(&input).unwrap();
    let out = temp("bad-input-out.gguf");

    let (code, _, err) = tessera(&["quantize", s(&input), s(&out), "q9_9"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("unknown quantization type 'q9_9'")
            && err.contains("Q4_K_M")
            && err.contains("Q8_0"),
        "the error lists the accepted names: {err}"
    );

    let missing = temp("does-not-exist.gguf");
    let (code, _, err) = tessera(&["quantize", s(&missing), s(&out), "q8_0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read"), "{err}");

    let (code, _, err) = tessera(&["quantize", s(&input), s(&input), "q8_0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("same file"), "{err}");

    // a row length that fits no block (32 columns, q4_K wants 256): falls back to q5_0
    let (code, stdout, err) = tessera(&["quantize", s(&input), s(&out), "q4_K", "--pure"]);
    assert_eq!(code, 0, "{stdout}\n{err}");
    assert!(stdout.contains("falling back to q5_0"), "{stdout}");
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.tensor("blk.0.attn_q.weight").unwrap().dtype, DType::Q5_0);
    std::fs::remove_file(&out).unwrap();
    std::fs::remove_file(&input).unwrap();
}
