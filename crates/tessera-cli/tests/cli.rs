//! End-to-end tests of the `tessera` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::DType;
use tessera_gguf::{GgufWriter, Value};

fn golden_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
        });
    if dir.join("ops.gguf").is_file() {
        return Some(dir);
    }
    if std::env::var_os("TESSERA_REQUIRE_GOLDEN").is_some() {
        panic!(
            "golden vectors required (TESSERA_REQUIRE_GOLDEN) but not found in {}",
            dir.display()
        );
    }
    eprintln!("SKIPPED: golden dir {} not found", dir.display());
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

#[test]
fn conformance_ops_passes_every_golden_case() {
    let Some(dir) = golden_dir() else { return };
    let path = dir.join("ops.gguf");
    let (code, out, err) = tessera(&["conformance", "ops", path.to_str().unwrap()]);
    let last = out.lines().last().unwrap_or("");
    let failures: Vec<&str> = out.lines().filter(|l| l.contains("FAIL")).collect();
    assert!(
        failures.is_empty(),
        "failing cases:\n{}\n{err}",
        failures.join("\n")
    );
    // 112 cases on two backends (reference and cpu), plus ggml's 32 grad* tensors compared on
    // both backends
    assert_eq!(last, "288 passed, 0 failed", "{out}\n{err}");
    for grad in [
        "mul_mat.grad1",
        "rms_norm.grad0",
        "soft_max.grad0",
        "cross_entropy_loss.grad0",
        "get_rows.grad0",
        "rope_ext.grad0",
    ] {
        assert_eq!(
            out.lines()
                .filter(|l| l.contains(grad) && l.contains("PASS"))
                .count(),
            2,
            "{grad} must be compared and pass on both backends:\n{out}"
        );
    }
    assert_eq!(code, 0);
    // one line per case and backend, each naming case, op, backend and nmse
    let c045 = out
        .lines()
        .find(|l| l.starts_with("c045"))
        .expect("c045 line");
    assert!(
        c045.contains("rms_norm") && c045.contains("reference") && c045.contains("nmse="),
        "{c045}"
    );
}

#[test]
fn conformance_reports_a_wrong_output_and_exits_1() {
    // A one-case golden file whose expected output is deliberately wrong.
    let mut w = GgufWriter::new();
    w.add_kv("c000.desc", Value::from("op=add shape=same"));
    let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    w.add_tensor("c000/in0", DType::F32, &[4], &f(&[1., 2., 3., 4.]))
        .unwrap();
    w.add_tensor("c000/in1", DType::F32, &[4], &f(&[1., 1., 1., 1.]))
        .unwrap();
    w.add_tensor("c000/out", DType::F32, &[4], &f(&[2., 3., 4., 6.]))
        .unwrap();
    let path = std::env::temp_dir().join(format!("tessera-bad-golden-{}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    let (code, out, _) = tessera(&["conformance", "ops", path.to_str().unwrap()]);
    std::fs::remove_file(&path).ok();
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("c000") && out.contains("FAIL"), "{out}");
    // one line per backend (reference, cpu)
    assert!(out.trim_end().ends_with("0 passed, 2 failed"), "{out}");
}

#[test]
fn unreadable_input_exits_2_with_a_message() {
    let (code, _, err) = tessera(&["conformance", "ops", "/nonexistent/ops.gguf"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/ops.gguf"), "{err}");
    let path = std::env::temp_dir().join(format!("tessera-not-gguf-{}.gguf", std::process::id()));
    std::fs::write(&path, b"this is not a gguf file at all").unwrap();
    let (code, _, err) = tessera(&["info", path.to_str().unwrap()]);
    std::fs::remove_file(&path).ok();
    assert_eq!(code, 2);
    assert!(err.to_lowercase().contains("magic"), "{err}");
}

#[test]
fn interleave_and_no_interleave_conflict() {
    // asking for both layouts (or for the repack arithmetic, which copies weights too, and
    // for every weight mapped) is a usage error before any model is looked for
    for flag in ["--interleave", "--repack"] {
        let (code, _, err) = tessera(&[
            "run",
            "-m",
            "/nonexistent/model.gguf",
            flag,
            "--no-interleave",
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(flag) && err.contains("--no-interleave"),
            "{err}"
        );
        assert!(!err.contains("/nonexistent/model.gguf"), "{err}");
    }
    // one of them alone gets as far as the model file
    let (code, _, err) = tessera(&["run", "-m", "/nonexistent/model.gguf", "--interleave"]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

#[test]
fn bench_ops_matrix_size_is_checked_and_printed() {
    // a zero-sized bandwidth matrix is a usage error naming the option
    let (code, _, err) = tessera(&["bench-ops", "--only", "bandwidth", "--matrix-mib", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--matrix-mib"), "{err}");
    // a small one runs, and the header names the size it used
    let (code, out, err) = tessera(&[
        "bench-ops",
        "--only",
        "bandwidth",
        "--matrix-mib",
        "16",
        "--types",
        "q8_0",
        "-t",
        "1",
        "-r",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("mat-vec of a 16 MiB matrix"), "{out}");
    assert!(out.contains("| 1 |") && out.contains("| q8_0 |"), "{out}");
}

#[test]
fn info_prints_metadata_and_tensors() {
    let Some(dir) = golden_dir() else { return };
    let path = dir.join("quant-gaussian.gguf");
    let (code, out, err) = tessera(&["info", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("kv.str") && out.contains("héllo, ggml ✓"),
        "{out}"
    );
    assert!(
        out.contains("kv.u64") && out.contains("18000000000000000000"),
        "{out}"
    );
    assert!(out.contains("q.q4_K") && out.contains("q4_K"), "{out}");
    assert!(out.contains("1024") && out.contains("imatrix"), "{out}");
}

/// `bench-ops` names what it cannot parse, and one quant cell runs alone (the form a script
/// alternating with another program uses).
#[test]
fn bench_ops_rejects_bad_filters_and_runs_one_quant_cell() {
    let (code, _, err) = tessera(&["bench-ops", "--only", "quant", "--types", "q9_9"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("'q9_9' is neither a quantized type nor f32/f16/bf16"),
        "{err}"
    );
    let (code, _, err) = tessera(&["bench-ops", "--only", "quant", "--types", "i32"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("'i32' is neither a quantized type nor f32/f16/bf16"),
        "{err}"
    );
    let (code, _, err) = tessera(&["bench-ops", "--only", "quant", "--shapes", "64x"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("'64x' is not K×M"), "{err}");
    // one cell of a quantized type, of one that needs an importance matrix to be written
    // (the bench gives it a uniform one) and of a float weight type
    for (t, k) in [("q8_0", 64), ("iq2_xxs", 256), ("bf16", 64)] {
        let shape = format!("{k}x8");
        let (code, out, err) = tessera(&[
            "bench-ops",
            "--only",
            "quant",
            "--types",
            t,
            "--shapes",
            &shape,
            "-t",
            "1",
            "-r",
            "1",
        ]);
        assert_eq!(code, 0, "{err}");
        let rows: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("| {t} ")))
            .collect();
        assert_eq!(rows.len(), 1, "{out}");
        assert!(
            rows[0].starts_with(&format!("| {t} | {k}×8 | 1 |")),
            "{out}"
        );
    }
}

/// `tessera run --repack` against llama.cpp end to end: the default model requantized to q4_0
/// and to iq4_nl by `tessera quantize`, then greedy decoding with ggml's plain-row arithmetic
/// (the default) and with its CPU repack arithmetic (`--repack`), each against llama.cpp's own
/// tokens for the same file, without and with its repack buffer.
/// FNV-1a over the file's little-endian 64-bit words (the last one zero-padded), then its
/// length: a fingerprint that says the file is the one llama.cpp was given.
fn fingerprint(path: &Path) -> u64 {
    let b = std::fs::read(path).unwrap();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in b.chunks(8) {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h ^ b.len() as u64).wrapping_mul(0x0000_0100_0000_01b3)
}

/// The 25 greedy tokens after "Once upon a time" (no BOS, as the model's metadata says) from
/// llama.cpp 0.3.36 (llama-cpp-python's vendor copy, built for AVX2 without AVX-512 and AMX:
/// what a native build gives on an x86 CPU without AVX-512; flash attention on, f16 KV cache,
/// 2 threads) on the q4_0 and iq4_nl files this test writes: with its default CPU_REPACK
/// buffer, and with `use_extra_bufts = false` (`--no-repack`). The two arithmetics part at
/// token 6 (q4_0) and 13 (iq4_nl); every logit of 33 steps was also bit-identical to tessera's
/// at 1 and 2 threads, with a 4- and a 45-token prompt (README, "Which of ggml's numerics").
struct Expected {
    ftype: &'static str,
    fingerprint: u64,
    repack: [u32; 25],
    no_repack: [u32; 25],
}

const EXPECTED: [Expected; 2] = [
    Expected {
        ftype: "q4_0",
        fingerprint: FP_Q4_0,
        repack: [
            28, 339, 436, 253, 3241, 282, 253, 9835, 259, 30, 339, 436, 1811, 4016, 28, 284, 339,
            436, 4016, 4016, 4016, 4016, 4016, 4016, 4016,
        ],
        no_repack: [
            28, 339, 436, 253, 3241, 93, 3343, 1007, 30, 339, 436, 253, 3241, 93, 3343, 1007, 975,
            339, 436, 253, 3241, 93, 3343, 1007, 975,
        ],
    },
    Expected {
        ftype: "iq4_nl",
        fingerprint: FP_IQ4_NL,
        repack: [
            28, 260, 3102, 282, 11702, 5463, 436, 32562, 411, 253, 11965, 4262, 30, 378, 3102,
            7567, 661, 761, 719, 31507, 351, 253, 1611, 338, 856,
        ],
        no_repack: [
            28, 260, 3102, 282, 11702, 5463, 436, 32562, 411, 253, 11965, 4262, 338, 761, 719,
            5631, 327, 800, 929, 30, 378, 3102, 7567, 661, 761,
        ],
    },
];

const FP_Q4_0: u64 = 0x233f_c7a8_149a_5d46;
const FP_IQ4_NL: u64 = 0xad8f_d9d9_2ae1_00e4;

/// A file for [`repack_gives_llama_cpps_default_logits`]: the default model requantized by
/// `tessera quantize` to `ftype` (`--pure` or not), its fingerprint, and llama.cpp's logits
/// hashes (the 4-token prompt and 8 greedy steps, the 45-token prompt) with `--no-repack`
/// and with its default CPU_REPACK buffer.
struct LogitCase {
    ftype: &'static str,
    pure: bool,
    fingerprint: u64,
    no_repack: (u64, u64),
    repack: (u64, u64),
}

/// - Q4_K `--pure`: its 30 ffn_down matrices q4_K (`q4_K_8x8`), the rest q5_0, whose rows are
///   not a multiple of 256; the two arithmetics give no equal logit (up to 0.56 apart), though
///   the same greedy tokens.
/// - mxfp4: every matrix mxfp4 (`mxfp4_8x8`), the embedding table too, which llama.cpp also
///   loads a second time for the tied output's `mul_mat` and repacks.
/// - Q4_0 `--pure`: every matrix q4_0 (`q4_0_8x8`), the tied output matrix as above.
/// - Q2_K `--pure`: its 30 ffn_down matrices q2_K, the rest q4_0 (rows not a multiple of 256;
///   `q4_0_8x8`, the tied output matrix too). llama.cpp built for AVX2 keeps q2_K plain (ggml
///   repacks it only when built with AVX-512), and so does `--repack`
///   (`tessera_cpu::repacked_by_run`): its logits are the AVX2 build's with the q4_0 matrices
///   alone repacked. (A build with AVX-512 gave other logits with and without its repack
///   buffer: its other arithmetic differs too.)
const LOGIT_CASES: [LogitCase; 4] = [
    LogitCase {
        ftype: "Q4_K",
        pure: true,
        fingerprint: 0x8fe5_8bbc_071b_a40a,
        no_repack: (0x24ab_7b9a_3909_48d7, 0x240b_b04a_bc13_69ae),
        repack: (0x79a4_de91_49e3_7525, 0x47f4_f9a0_6628_bd2b),
    },
    LogitCase {
        ftype: "mxfp4",
        pure: false,
        fingerprint: 0x2cef_21f5_ba91_80e5,
        no_repack: (0x3723_17be_d754_b50d, 0x236c_c6f5_2dc1_c1e3),
        repack: (0xc3f0_f99f_4b71_201b, 0x071a_f1a9_024d_9dcc),
    },
    LogitCase {
        ftype: "Q4_0",
        pure: true,
        fingerprint: 0xb127_de69_a83a_b90e,
        no_repack: (0xf071_390d_ff8a_620e, 0x63f6_74e5_83b5_8721),
        repack: (0xacbf_b679_fd88_49a7, 0xb8fd_811a_e1e3_00b8),
    },
    LogitCase {
        ftype: "Q2_K",
        pure: true,
        fingerprint: 0xdd7b_8617_e57b_535e,
        no_repack: (0x8327_559b_fd29_bc32, 0xd3ae_73fe_d21d_e04e),
        repack: (0x3c3f_de0e_094e_8a96, 0x0f2f_3684_ceeb_9d4c),
    },
];

/// `--repack` against llama.cpp end to end, logit by logit, on the files of [`LOGIT_CASES`]:
/// llama.cpp's 49152 logits after "Once upon a time" and each of 8 greedy steps, and after a
/// 45-token prompt (eleven whole fours of columns and one left over: both of ggml's q4_K
/// roundings), each pinned by an FNV-1a hash of their bits. The llama.cpp runs: 0.3.36 built
/// for AVX2 without AVX-512 and AMX (as in `EXPECTED`), flash attention on, f16 KV cache,
/// with its default CPU_REPACK buffer and with `use_extra_bufts = false`; one and two threads
/// gave the same bits. Tessera must give each run's every bit, with and without `--repack`'s
/// layout, at one and two threads; the no-repack bits with the plain rows and with every
/// matrix whose type has the layout (q4_0, iq4_nl, mxfp4, q4_K, q6_K here) interleaved
/// (`RowLayout::Interleaved8`, which only moves bytes).
#[test]
fn repack_gives_llama_cpps_default_logits() {
    let Some(model) = tessera_llm::fetch::model_for_tests() else {
        return;
    };
    let dir: PathBuf =
        std::env::temp_dir().join(format!("tessera-repack-logits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hash = |h: u64, logits: &[f32]| {
        logits.iter().fold(h, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let mut long = vec![6403u32, 1980, 253, 655];
    long.extend((4..45).map(|i| ((1000 + 37 * i) % 49152) as u32));
    for case in &LOGIT_CASES {
        let q = dir.join(format!("smollm2-{}.gguf", case.ftype));
        let mut args = vec![
            "quantize",
            model.to_str().unwrap(),
            q.to_str().unwrap(),
            case.ftype,
            "--allow-requantize",
        ];
        if case.pure {
            args.push("--pure");
        }
        let (code, _, err) = tessera(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            fingerprint(&q),
            case.fingerprint,
            "{}: not the file llama.cpp's logits were taken from",
            case.ftype
        );
        for (repack, interleave, (want_steps, want_long)) in [
            (false, false, case.no_repack),
            (false, true, case.no_repack),
            (true, false, case.repack),
        ] {
            let mut m = tessera_llm::Model::load(&q).unwrap();
            if repack {
                m = m.with_repacked_rows().unwrap();
            }
            if interleave {
                m = m.with_interleaved_rows_where(|_| true).unwrap();
                assert!(
                    m.interleaved_bytes() > 0,
                    "{}: interleaved copies",
                    case.ftype
                );
            }
            let m = std::sync::Arc::new(m);
            for threads in [1, 2] {
                let params = tessera_llm::ContextParams {
                    n_ctx: 512,
                    n_threads: threads,
                    ..Default::default()
                };
                let mut ctx =
                    tessera_llm::Context::new(std::sync::Arc::clone(&m), params.clone()).unwrap();
                let mut logits = ctx.eval(&[6403, 1980, 253, 655], false).unwrap().to_vec();
                let mut h = 0xcbf2_9ce4_8422_2325u64;
                for step in 0..=8 {
                    h = hash(h, &logits);
                    if step < 8 {
                        let best =
                            (0..logits.len())
                                .fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
                        logits = ctx.eval(&[best as u32], false).unwrap().to_vec();
                    }
                }
                assert_eq!(
                    h, want_steps,
                    "{}: repack {repack}, interleave {interleave}, {threads} threads: the \
                     logits of the 4-token prompt and 8 steps are not llama.cpp's",
                    case.ftype
                );
                let mut ctx = tessera_llm::Context::new(std::sync::Arc::clone(&m), params).unwrap();
                let logits = ctx.eval(&long, false).unwrap().to_vec();
                assert_eq!(
                    hash(0xcbf2_9ce4_8422_2325, &logits),
                    want_long,
                    "{}: repack {repack}, interleave {interleave}, {threads} threads: the \
                     logits of the 45-token prompt are not llama.cpp's",
                    case.ftype
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn repack_gives_llama_cpps_default_tokens_and_plain_rows_its_no_repack_ones() {
    let Some(model) = tessera_llm::fetch::model_for_tests() else {
        return;
    };
    let dir: PathBuf = std::env::temp_dir().join(format!("tessera-repack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in &EXPECTED {
        let q = dir.join(format!("smollm2-{}.gguf", e.ftype));
        let (code, _, err) = tessera(&[
            "quantize",
            model.to_str().unwrap(),
            q.to_str().unwrap(),
            e.ftype,
            "--allow-requantize",
        ]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            fingerprint(&q),
            e.fingerprint,
            "{}: not the file llama.cpp's tokens were taken from",
            e.ftype
        );
        for (flag, want) in [("--repack", &e.repack), ("--no-interleave", &e.no_repack)] {
            for threads in ["1", "2"] {
                let (code, _, err) = tessera(&[
                    "run",
                    "-m",
                    q.to_str().unwrap(),
                    flag,
                    "-t",
                    threads,
                    "--temp",
                    "0",
                    "-n",
                    "25",
                    "--ids",
                    "-p",
                    "Once upon a time",
                ]);
                assert_eq!(code, 0, "{err}");
                let got: Vec<u32> = err
                    .lines()
                    .last()
                    .unwrap()
                    .split_whitespace()
                    .map(|t| t.parse().unwrap())
                    .collect();
                assert_eq!(
                    got, want,
                    "{} {flag}, {threads} threads: not llama.cpp's tokens",
                    e.ftype
                );
            }
        }
        std::fs::remove_file(&q).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
