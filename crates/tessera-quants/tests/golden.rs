//! The golden files written by ggml itself (`quant-gaussian.gguf`, `quant-adversarial.gguf`):
//! every dequantized f32 and every quantized byte must be identical to ggml's.
//!
//! - `dq.<type>` = ggml's `to_float` of `q.<type>`: checked against `dequantize_row`;
//! - `q.<type>` = `ggml_quantize_chunk` of `input` without importance matrix (with it for the
//!   types that require one): checked against `quantize_row`;
//! - `qi.<type>` = the same with `imatrix`.
//!
//! The folder is `$TESSERA_GOLDEN_DIR`, else `../shared/golden` from the workspace root; when it
//! is missing the tests say `SKIPPED` and pass.

use std::path::PathBuf;

use tessera_gguf::{GgufFile, Value};
use tessera_quants::{
    can_quantize, dequantize_row, layout, quantize_row, requires_imatrix, type_name,
};

const FILES: [&str; 2] = ["quant-gaussian.gguf", "quant-adversarial.gguf"];

fn golden_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("TESSERA_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    };
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: golden dir not found (looked in {})",
            dir.display()
        );
        None
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One golden file, decoded: the input rows, the importance matrix, the type names.
struct Golden {
    file: GgufFile,
    name: &'static str,
    input: Vec<f32>,
    imatrix: Vec<f32>,
    n_per_row: usize,
    nrows: usize,
    types: Vec<String>,
}

impl Golden {
    fn open(dir: &std::path::Path, name: &'static str) -> Golden {
        let file = GgufFile::open(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ti = file.tensor("input").expect("tensor `input`");
        let (n_per_row, nrows) = (ti.ne[0], ti.n_rows());
        let input = f32s(file.tensor_data(ti));
        let imatrix = f32s(
            file.tensor_data_by_name("imatrix")
                .expect("tensor `imatrix`"),
        );
        assert_eq!(imatrix.len(), n_per_row, "{name}: imatrix length");
        let types = match file.get("golden.types") {
            Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
            other => panic!("{name}: golden.types is {other:?}"),
        };
        Golden {
            file,
            name,
            input,
            imatrix,
            n_per_row,
            nrows,
            types,
        }
    }

    /// The ggml type id of `<prefix>.<ty>` and its bytes.
    fn quantized(&self, prefix: &str, ty: &str) -> Option<(u32, &[u8])> {
        let t = self.file.tensor(&format!("{prefix}.{ty}"))?;
        Some((t.dtype.id(), self.file.tensor_data(t)))
    }

    /// (block size, bytes per block) of a type, with f16/bf16 as blocks of one.
    fn blocks(id: u32) -> (usize, usize) {
        layout(id).map_or((1, 2), |l| (l.block_size, l.type_size))
    }

    fn row_bytes(&self, id: u32) -> usize {
        let (bs, ts) = Self::blocks(id);
        self.n_per_row / bs * ts
    }
}

/// Runs `check` on every golden file; collects the failures and reports them all.
fn for_each_file(check: impl Fn(&Golden, &mut Vec<String>)) {
    let Some(dir) = golden_dir() else { return };
    let mut failures = Vec::new();
    for name in FILES {
        let g = Golden::open(&dir, name);
        check(&g, &mut failures);
    }
    assert!(
        failures.is_empty(),
        "{} mismatch(es):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn dequantize_matches_ggml_bit_for_bit() {
    for_each_file(|g, failures| {
        let mut checked = 0;
        for ty in &g.types {
            let Some((id, q)) = g.quantized("q", ty) else {
                failures.push(format!("{}: no q.{ty}", g.name));
                continue;
            };
            let Some(dq) = g.file.tensor_data_by_name(&format!("dq.{ty}")) else {
                // q8_1 (and q8_K) are activation formats: ggml has no to_float for them.
                continue;
            };
            let dq = f32s(dq);
            let rb = g.row_bytes(id);
            let (bs, _) = Golden::blocks(id);
            let n = g.n_per_row;
            let mut out = vec![0f32; n];
            'rows: for r in 0..g.nrows {
                if let Err(e) = dequantize_row(id, &q[r * rb..(r + 1) * rb], &mut out) {
                    failures.push(format!("{}: {ty} row {r}: {e}", g.name));
                    break;
                }
                for i in 0..n {
                    let want = dq[r * n + i];
                    if out[i].to_bits() != want.to_bits() {
                        failures.push(format!(
                            "{}: dq.{ty} row {r} block {} (element {i}): got {:e} ({:#010x}), ggml {:e} ({:#010x})",
                            g.name,
                            i / bs,
                            out[i],
                            out[i].to_bits(),
                            want,
                            want.to_bits()
                        ));
                        break 'rows;
                    }
                }
            }
            checked += 1;
        }
        assert!(checked >= 27, "{}: only {checked} dq tensors", g.name);
    });
}

/// Quantizes every row of `input` and compares with `<prefix>.<type>` block by block.
fn check_quantized(
    g: &Golden,
    prefix: &str,
    with_imatrix: bool,
    failures: &mut Vec<String>,
) -> usize {
    let mut checked = 0;
    for ty in &g.types {
        let Some((id, want)) = g.quantized(prefix, ty) else {
            continue;
        };
        let name = type_name(id).unwrap_or("?");
        if !can_quantize(id) {
            failures.push(format!(
                "{}: {prefix}.{ty}: no quantizer for {name}",
                g.name
            ));
            continue;
        }
        let imatrix = (with_imatrix || requires_imatrix(id)).then_some(&g.imatrix[..]);
        let (_, ts) = Golden::blocks(id);
        let rb = g.row_bytes(id);
        let n = g.n_per_row;
        let mut out = vec![0u8; rb];
        'rows: for r in 0..g.nrows {
            if let Err(e) = quantize_row(id, &g.input[r * n..(r + 1) * n], &mut out, imatrix) {
                failures.push(format!("{}: {prefix}.{ty} row {r}: {e}", g.name));
                break;
            }
            let want = &want[r * rb..(r + 1) * rb];
            for (b, (got, exp)) in out.chunks_exact(ts).zip(want.chunks_exact(ts)).enumerate() {
                if got != exp {
                    failures.push(format!(
                        "{}: {prefix}.{ty} row {r} block {b} differs:\n  got  {got:02x?}\n  ggml {exp:02x?}",
                        g.name
                    ));
                    break 'rows;
                }
            }
        }
        checked += 1;
    }
    checked
}

#[test]
fn reference_quantize_matches_ggml_bit_for_bit() {
    for_each_file(|g, failures| {
        let checked = check_quantized(g, "q", false, failures);
        assert!(checked >= 28, "{}: only {checked} q tensors", g.name);
    });
}

#[test]
fn imatrix_quantize_matches_ggml_bit_for_bit() {
    for_each_file(|g, failures| {
        let checked = check_quantized(g, "qi", true, failures);
        assert!(checked >= 20, "{}: only {checked} qi tensors", g.name);
    });
}
