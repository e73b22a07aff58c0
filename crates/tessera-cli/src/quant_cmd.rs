//! `tessera conformance quant FILE.gguf` and `tessera quantize IN.gguf OUT.gguf TYPE`.
//!
//! # conformance quant
//!
//! A golden quant file (`shared/golden/quant-*.gguf`, see its README) holds an `input` matrix,
//! an `imatrix`, and what ggml made of them: `q.<type>` (quantized without importance matrix,
//! except for iq2_xxs, iq2_xs and iq1_s which ggml only quantizes with one), `qi.<type>` (with
//! the importance matrix) and `dq.<type>` (`q.<type>` decoded by ggml's `to_float`). Every one
//! of them is rebuilt with `tessera_quants` and compared bit for bit.
//!
//! # quantize
//!
//! What llama.cpp's `llama-quantize` does (`src/llama-quant.cpp`, `tools/quantize/quantize.cpp`,
//! MIT licence, © the llama.cpp authors), rewritten from that source:
//!
//! - TYPE is one of llama-quantize's names (case-insensitive: `Q4_0`, `Q8_0`, `Q4_K_M`, `Q5_K_M`,
//!   `Q6_K`, `IQ4_XS`, `F16`, ...; `Q3_K`, `Q4_K`, `Q5_K` are its aliases of the `_M` mixes) or
//!   its ftype number, or one of the ggml type names it has no name for (`mxfp4`, `nvfp4`),
//!   which are applied to every quantizable tensor as with `--pure`.
//! - Which tensors are quantized: `tensor_allows_quantization` (two or more dimensions in ggml's
//!   sense, a name ending in `weight`, no norms, no MoE router, and llama.cpp's list of small
//!   tensors it leaves alone). Everything else, 1-D norms and biases included, is copied
//!   unchanged (they are f32 in files written by llama.cpp's converter).
//! - The per-tensor type: `llama_tensor_get_type` with its mixing rules
//!   (`llama_tensor_get_type_impl`) for every ftype, for the architectures it distinguishes
//!   (llama-like models, falcon, the 70B llama, MoE expert counts, GQA ratios): e.g. for
//!   Q4_K_M, `output.weight` (or `token_embd.weight` when the embeddings are tied) becomes q6_K,
//!   `attn_v` and `ffn_down` become q6_K in the first and last eighth of the layers and in every
//!   third layer between. Tensors are visited in llama.cpp's order (non-layer tensors first,
//!   then layer by layer, names sorted), which the layer counters rely on, and written in it.
//!   `--pure` skips the mixing (not the fallback).
//! - A row length that is not a multiple of the type's block size falls back as
//!   `tensor_type_fallback` does (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, 256-blocks ->
//!   iq4_nl or q4_0, else f16), and the output line says so.
//! - Quantized inputs are refused unless `--allow-requantize`; f16, bf16 and quantized inputs
//!   are dequantized to f32 first. Tensors whose chosen type is their type are copied.
//! - Metadata is copied (without `split.*`), with `general.quantization_version` = 2 and
//!   `general.file_type` = llama.cpp's `llama_ftype` value; with `--imatrix`, the
//!   `quantize.imatrix.*` keys llama-quantize adds.
//! - `--imatrix FILE` reads llama-imatrix's GGUF format (`<name>.in_sum2` / `<name>.counts`) or
//!   its legacy `.dat` format, normalised as llama-quantize does.
//!
//! Not ported: `--tensor-type`, `--output-tensor-type`, `--token-embedding-type`,
//! `--include/exclude-weights`, `--prune-layers`, `--keep-split`, `--override-kv`, `--dry-run`,
//! and ggml's `ggml_validate_row_data` check of the quantized bytes. The output is built in
//! memory before it is written (the input is memory-mapped).

// The type choice keeps llama.cpp's if-chains branch for branch (some branches pick the same
// type), which is what makes it reviewable against the original.
#![allow(clippy::if_same_then_else)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use tessera::DType;
use tessera_gguf::{GgufFile, GgufWriter, TensorInfo, Value};
use tessera_quants::{dequantize_row, quantize_row, requires_imatrix};

// ---------------------------------------------------------------------------------------------
// conformance quant
// ---------------------------------------------------------------------------------------------

/// The verdict on one `q.`, `qi.` or `dq.` tensor.
pub struct QuantCheck {
    pub name: String,
    pub type_name: String,
    /// `None`: identical; `Some(why)`: the first difference, or why it could not be checked.
    pub failure: Option<String>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Checks every `q.<type>`, `qi.<type>` and `dq.<type>` tensor of a golden quant file. `Err`
/// when the file is not one (no usable `input` or `imatrix`).
pub fn check_golden(f: &GgufFile) -> Result<Vec<QuantCheck>, String> {
    let input_t = f.tensor("input").ok_or("no tensor `input`")?;
    if input_t.dtype != DType::F32 || input_t.n_dims > 2 {
        return Err(format!(
            "`input` is {} {:?}, expected a 2-D f32 matrix",
            input_t.dtype,
            input_t.shape()
        ));
    }
    let n = input_t.ne[0];
    let nrows = input_t.n_rows();
    let input = f32s(f.tensor_data(input_t));
    let imatrix_t = f.tensor("imatrix").ok_or("no tensor `imatrix`")?;
    if imatrix_t.dtype != DType::F32 || imatrix_t.n_elements() != n {
        return Err(format!(
            "`imatrix` is {} {:?}, expected {n} f32 weights",
            imatrix_t.dtype,
            imatrix_t.shape()
        ));
    }
    let imatrix = f32s(f.tensor_data(imatrix_t));

    let mut checks = Vec::new();
    for t in &f.tensors {
        let (kind, tname) = if let Some(s) = t.name.strip_prefix("q.") {
            ("q", s)
        } else if let Some(s) = t.name.strip_prefix("qi.") {
            ("qi", s)
        } else if let Some(s) = t.name.strip_prefix("dq.") {
            ("dq", s)
        } else {
            continue;
        };
        let failure = match DType::from_name(tname) {
            None => Some(format!("unknown type name '{tname}'")),
            Some(dtype) if kind == "dq" => check_dequant(f, t, dtype).err(),
            Some(dtype) => {
                let im = (kind == "qi" || requires_imatrix(dtype.id())).then_some(&imatrix[..]);
                check_quant(f, t, dtype, &input, n, nrows, im).err()
            }
        };
        checks.push(QuantCheck {
            name: t.name.clone(),
            type_name: tname.to_string(),
            failure,
        });
    }
    Ok(checks)
}

fn check_quant(
    f: &GgufFile,
    t: &TensorInfo,
    dtype: DType,
    input: &[f32],
    n: usize,
    nrows: usize,
    imatrix: Option<&[f32]>,
) -> Result<(), String> {
    if t.dtype != dtype {
        return Err(format!("stored as {}, named {dtype}", t.dtype));
    }
    if t.ne[0] != n || t.n_rows() != nrows {
        return Err(format!("shape {:?}, `input` is [{n}, {nrows}]", t.shape()));
    }
    let row_bytes = dtype
        .row_size(n)
        .ok_or_else(|| format!("{n} columns are not whole {dtype} blocks"))?;
    let want = f.tensor_data(t);
    let mut ours = vec![0u8; row_bytes];
    for r in 0..nrows {
        quantize_row(dtype.id(), &input[r * n..(r + 1) * n], &mut ours, imatrix)
            .map_err(|e| format!("row {r}: {e}"))?;
        let expected = &want[r * row_bytes..(r + 1) * row_bytes];
        if let Some(i) = ours.iter().zip(expected).position(|(a, b)| a != b) {
            return Err(format!(
                "first difference in row {r} block {} (byte offset {})",
                i / dtype.type_size(),
                r * row_bytes + i
            ));
        }
    }
    Ok(())
}

fn check_dequant(f: &GgufFile, t: &TensorInfo, dtype: DType) -> Result<(), String> {
    let qname = format!("q.{}", dtype.name());
    let q = f
        .tensor(&qname)
        .ok_or_else(|| format!("no tensor {qname} to dequantize"))?;
    if t.dtype != DType::F32 {
        return Err(format!("stored as {}, expected f32", t.dtype));
    }
    if q.dtype != dtype || q.ne != t.ne {
        return Err(format!(
            "{qname} is {} {:?}, this tensor is {:?}",
            q.dtype,
            q.shape(),
            t.shape()
        ));
    }
    let n = t.ne[0];
    let row_bytes = dtype
        .row_size(n)
        .ok_or_else(|| format!("{n} columns are not whole {dtype} blocks"))?;
    let qdata = f.tensor_data(q);
    let want = f32s(f.tensor_data(t));
    let mut ours = vec![0f32; n];
    for r in 0..t.n_rows() {
        dequantize_row(
            dtype.id(),
            &qdata[r * row_bytes..(r + 1) * row_bytes],
            &mut ours,
        )
        .map_err(|e| format!("row {r}: {e}"))?;
        let expected = &want[r * n..(r + 1) * n];
        if let Some(i) = ours
            .iter()
            .zip(expected)
            .position(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!(
                "first difference in row {r} element {i}: ours {:e} (0x{:08x}), ggml {:e} (0x{:08x})",
                ours[i],
                ours[i].to_bits(),
                expected[i],
                expected[i].to_bits()
            ));
        }
    }
    Ok(())
}

/// One line per tensor, then `N passed, M failed`; returns the text and M.
pub fn report(checks: &[QuantCheck]) -> (String, usize) {
    let mut s = String::new();
    let mut failed = 0;
    for c in checks {
        let verdict = c.failure.as_deref().unwrap_or("identical");
        let _ = writeln!(s, "{:<12} {:<8} {verdict}", c.name, c.type_name);
        failed += usize::from(c.failure.is_some());
    }
    let _ = writeln!(s, "{} passed, {} failed", checks.len() - failed, failed);
    (s, failed)
}

/// `tessera conformance quant`: exit 0 when everything is identical, 1 on any difference, 2
/// when the file is not a golden quant file.
pub fn conformance_main(f: &GgufFile, path: &Path) -> ExitCode {
    match check_golden(f) {
        Ok(checks) => {
            let (text, failed) = report(&checks);
            print!("{text}");
            if failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(msg) => {
            eprintln!("tessera: {}: {msg}", path.display());
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// quantize: llama.cpp's file types and names
// ---------------------------------------------------------------------------------------------

/// llama.cpp's `enum llama_ftype` (include/llama.h), the value of `general.file_type`.
#[allow(dead_code)]
mod ft {
    pub const ALL_F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q8_0: u32 = 7;
    pub const Q5_0: u32 = 8;
    pub const Q5_1: u32 = 9;
    pub const Q2_K: u32 = 10;
    pub const Q3_K_S: u32 = 11;
    pub const Q3_K_M: u32 = 12;
    pub const Q3_K_L: u32 = 13;
    pub const Q4_K_S: u32 = 14;
    pub const Q4_K_M: u32 = 15;
    pub const Q5_K_S: u32 = 16;
    pub const Q5_K_M: u32 = 17;
    pub const Q6_K: u32 = 18;
    pub const IQ2_XXS: u32 = 19;
    pub const IQ2_XS: u32 = 20;
    pub const Q2_K_S: u32 = 21;
    pub const IQ3_XS: u32 = 22;
    pub const IQ3_XXS: u32 = 23;
    pub const IQ1_S: u32 = 24;
    pub const IQ4_NL: u32 = 25;
    pub const IQ3_S: u32 = 26;
    pub const IQ3_M: u32 = 27;
    pub const IQ2_S: u32 = 28;
    pub const IQ2_M: u32 = 29;
    pub const IQ4_XS: u32 = 30;
    pub const IQ1_M: u32 = 31;
    pub const BF16: u32 = 32;
    pub const TQ1_0: u32 = 36;
    pub const TQ2_0: u32 = 37;
    pub const MXFP4_MOE: u32 = 38;
    pub const NVFP4: u32 = 39;
    pub const Q1_0: u32 = 40;
    pub const Q2_0: u32 = 41;
}

/// llama-quantize's `QUANT_OPTIONS` (name, ftype) with `llama_ftype_get_default_type`.
#[rustfmt::skip]
const PRESETS: &[(&str, u32, DType)] = &[
    ("Q1_0", ft::Q1_0, DType::Q1_0),
    ("Q2_0", ft::Q2_0, DType::Q2_0),
    ("Q4_0", ft::Q4_0, DType::Q4_0),
    ("Q4_1", ft::Q4_1, DType::Q4_1),
    ("MXFP4_MOE", ft::MXFP4_MOE, DType::MXFP4),
    ("Q5_0", ft::Q5_0, DType::Q5_0),
    ("Q5_1", ft::Q5_1, DType::Q5_1),
    ("IQ2_XXS", ft::IQ2_XXS, DType::IQ2XXS),
    ("IQ2_XS", ft::IQ2_XS, DType::IQ2XS),
    ("IQ2_S", ft::IQ2_S, DType::IQ2XS),
    ("IQ2_M", ft::IQ2_M, DType::IQ2S),
    ("IQ1_S", ft::IQ1_S, DType::IQ1S),
    ("IQ1_M", ft::IQ1_M, DType::IQ1M),
    ("TQ1_0", ft::TQ1_0, DType::TQ1_0),
    ("TQ2_0", ft::TQ2_0, DType::TQ2_0),
    ("Q2_K", ft::Q2_K, DType::Q2K),
    ("Q2_K_S", ft::Q2_K_S, DType::Q2K),
    ("IQ3_XXS", ft::IQ3_XXS, DType::IQ3XXS),
    ("IQ3_S", ft::IQ3_S, DType::IQ3S),
    ("IQ3_M", ft::IQ3_M, DType::IQ3S),
    ("Q3_K", ft::Q3_K_M, DType::Q3K),
    ("IQ3_XS", ft::IQ3_XS, DType::IQ3S),
    ("Q3_K_S", ft::Q3_K_S, DType::Q3K),
    ("Q3_K_M", ft::Q3_K_M, DType::Q3K),
    ("Q3_K_L", ft::Q3_K_L, DType::Q3K),
    ("IQ4_NL", ft::IQ4_NL, DType::IQ4NL),
    ("IQ4_XS", ft::IQ4_XS, DType::IQ4XS),
    ("Q4_K", ft::Q4_K_M, DType::Q4K),
    ("Q4_K_S", ft::Q4_K_S, DType::Q4K),
    ("Q4_K_M", ft::Q4_K_M, DType::Q4K),
    ("Q5_K", ft::Q5_K_M, DType::Q5K),
    ("Q5_K_S", ft::Q5_K_S, DType::Q5K),
    ("Q5_K_M", ft::Q5_K_M, DType::Q5K),
    ("Q6_K", ft::Q6_K, DType::Q6K),
    ("Q8_0", ft::Q8_0, DType::Q8_0),
    ("F16", ft::F16, DType::F16),
    ("BF16", ft::BF16, DType::BF16),
    ("F32", ft::ALL_F32, DType::F32),
];

/// ggml types llama-quantize has no name for: every quantizable tensor gets the type.
const PURE_ONLY: &[(&str, u32, DType)] = &[
    ("mxfp4", ft::MXFP4_MOE, DType::MXFP4),
    ("nvfp4", ft::NVFP4, DType::NVFP4),
];

/// What TYPE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The canonical name (`Q4_K_M`, `mxfp4`).
    pub name: &'static str,
    /// llama.cpp's ftype, written as `general.file_type`.
    pub ftype: u32,
    /// `llama_ftype_get_default_type`.
    pub default_type: DType,
    /// Whether the mixing rules are off whatever `--pure` says.
    pub pure_only: bool,
}

/// Parses TYPE as llama-quantize does (a name, case-insensitive, or an ftype number), plus the
/// ggml-only names; the error lists the accepted names.
pub fn parse_target(s: &str) -> Result<Target, String> {
    let found = PRESETS
        .iter()
        .find(|p| p.0.eq_ignore_ascii_case(s))
        .map(|p| (p, false))
        .or_else(|| {
            PURE_ONLY
                .iter()
                .find(|p| p.0.eq_ignore_ascii_case(s))
                .map(|p| (p, true))
        })
        .or_else(|| {
            let n: u32 = s.parse().ok()?;
            PRESETS.iter().find(|p| p.1 == n).map(|p| (p, false))
        });
    match found {
        Some((&(name, ftype, default_type), pure_only)) => Ok(Target {
            name,
            ftype,
            default_type,
            pure_only,
        }),
        None => {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
            let pure: Vec<&str> = PURE_ONLY.iter().map(|p| p.0).collect();
            Err(format!(
                "unknown quantization type '{s}'; accepted (case-insensitive): {}; and the ggml types {} (always pure)",
                names.join(", "),
                pure.join(", ")
            ))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// quantize: llama.cpp's per-tensor type choice
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        Output
    } else if is_token_embd(name) {
        TokenEmbd
    } else if name.contains("attn_qkv.weight") {
        AttnQkv
    } else if name.contains("attn_kv_b.weight") {
        AttnKvB
    } else if name.contains("attn_v.weight") {
        AttnV
    } else if name.contains("attn_k.weight") {
        AttnK
    } else if name.contains("attn_q.weight") {
        AttnQ
    } else if name.contains("attn_output.weight") {
        AttnOutput
    } else if name.contains("ffn_up") {
        FfnUp
    } else if name.contains("ffn_gate") {
        FfnGate
    } else if name.contains("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

fn category_is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// ggml's `ggml_n_dims`: trailing dimensions of 1 do not count.
fn ggml_n_dims(ne: &[usize; 4]) -> usize {
    (1..4).rev().find(|&i| ne[i] > 1).map_or(1, |i| i + 1)
}

/// `tensor_allows_quantization`.
fn allows_quantization(name: &str, n_dims: usize, arch: &str, quantize_output: bool) -> bool {
    if n_dims < 2 || !name.ends_with("weight") {
        return false;
    }
    if name.contains("_norm.weight") || (!quantize_output && name == "output.weight") {
        return false;
    }
    const NEVER: &[&str] = &[
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    if NEVER.iter().any(|s| name.contains(s)) {
        return false;
    }
    if name == "position_embd.weight" || name == "token_types.weight" {
        return false;
    }
    const GLM5_NEXT: &[&str] = &[
        "hc_",
        "indexer.attn_q_b",
        "indexer.attn_k",
        "indexer.proj",
        "indexer_compressor_gate",
        "indexer_compressor_ape",
        "ssm_f_a.weight",
        "ssm_f_b.weight",
        "ssm_g_a.weight",
        "ssm_g_b.weight",
        "ssm_beta.weight",
        "attn_kv_a_mqa.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
    ];
    !(arch == "glm5-next" && GLM5_NEXT.iter().any(|s| name.contains(s)))
}

/// The hyperparameters llama.cpp's choice looks at.
#[derive(Clone, Debug)]
struct ModelInfo {
    arch: String,
    n_layer: usize,
    n_head: u64,
    n_head_kv: u64,
    n_expert: u64,
}

impl ModelInfo {
    fn from_gguf(f: &GgufFile) -> ModelInfo {
        let arch = f
            .get("general.architecture")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // Per-layer arrays (some architectures) count by their first layer, like n_gqa(0).
        let num = |key: &str| -> Option<u64> {
            match f.get(&format!("{arch}.{key}"))? {
                Value::Array(_, items) => items.first().and_then(Value::as_u64),
                v => v.as_u64(),
            }
        };
        let n_layer = num("block_count").map(|n| n as usize).unwrap_or_else(|| {
            f.tensors
                .iter()
                .filter_map(|t| layer_of(&t.name))
                .max()
                .map_or(0, |l| l + 1)
        });
        let n_head = num("attention.head_count").unwrap_or(0);
        ModelInfo {
            n_layer,
            n_head,
            n_head_kv: num("attention.head_count_kv").unwrap_or(n_head),
            n_expert: num("expert_count").unwrap_or(0),
            arch,
        }
    }

    fn n_gqa(&self) -> u64 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }

    /// llama.cpp's `LLM_TYPE_70B` (a llama with 80 layers and grouped-query attention).
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }
}

/// `N` of a tensor named `blk.N.…`.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// llama.cpp's `weight_name_comparer`: tensors outside layers first, then by layer, then name.
fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let la = layer_of(a).map_or(-1, |l| l as i64);
    let lb = layer_of(b).map_or(-1, |l| l as i64);
    la.cmp(&lb).then_with(|| a.cmp(b))
}

/// `quantize_state_impl`: the counters the mixing rules keep while visiting the tensors.
struct State {
    model: ModelInfo,
    ftype: u32,
    has_imatrix: bool,
    has_tied_embeddings: bool,
    n_attention_wv: usize,
    i_attention_wv: usize,
    n_ffn_down: usize,
    i_ffn_down: usize,
    n_ffn_gate: usize,
    i_ffn_gate: usize,
    n_ffn_up: usize,
    i_ffn_up: usize,
    n_fallback: usize,
}

fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

impl State {
    /// `layer_info`: the counter, or with experts (not consecutive in the file) the layer
    /// parsed from the name.
    fn layer_info(
        &self,
        i_layer: usize,
        n_layer: usize,
        name: &str,
    ) -> Result<(usize, usize), String> {
        if self.model.n_expert > 1 {
            let i = layer_of(name)
                .ok_or_else(|| format!("failed to determine the layer of tensor {name}"))?;
            if i >= n_layer {
                return Err(format!(
                    "bad layer {i} for tensor {name}: must be in [0, {n_layer})"
                ));
            }
            return Ok((i, n_layer));
        }
        Ok((i_layer, n_layer))
    }

    /// `llama_tensor_get_type_impl`.
    fn mixed_type(
        &mut self,
        mut new_type: DType,
        name: &str,
        ne: &[usize; 4],
        cat: Category,
    ) -> Result<DType, String> {
        use DType as T;
        let ftype = self.ftype;
        let arch = self.model.arch.as_str();
        let n_expert = self.model.n_expert;
        let n_gqa = self.model.n_gqa();
        let is = |list: &[u32]| list.contains(&ftype);

        if arch == "glm5-next"
            && (name.contains("attn_q_a")
                || name.contains("attn_q_b")
                || name.contains("nextn.eh_proj"))
            && !matches!(new_type, T::F32 | T::BF16 | T::F16)
        {
            return Ok(T::Q8_0);
        }

        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            let nx = ne[0];
            let qk_k = new_type.block_size();
            if ftype == ft::MXFP4_MOE {
                new_type = T::Q8_0;
            } else if self.model.is_falcon() || !nx.is_multiple_of(qk_k) {
                new_type = T::Q8_0;
            } else if is(&[
                ft::IQ2_XXS,
                ft::IQ2_XS,
                ft::IQ3_XXS,
                ft::IQ1_S,
                ft::IQ2_S,
                ft::IQ2_M,
                ft::IQ1_M,
            ]) {
                new_type = T::Q5K;
            } else if new_type != T::Q8_0 {
                new_type = T::Q6K;
            }
        } else if ftype == ft::MXFP4_MOE {
            let is_bailing_expert = arch == "bailingmoe3"
                && matches!(cat, Category::FfnUp | Category::FfnGate | Category::FfnDown);
            new_type = if ne[2] > 1 && (arch != "bailingmoe3" || is_bailing_expert) {
                T::MXFP4
            } else {
                T::Q8_0
            };
        } else if cat == Category::TokenEmbd {
            if is(&[ft::IQ2_XXS, ft::IQ2_XS, ft::IQ1_S, ft::IQ1_M]) {
                new_type = T::Q2K;
            } else if is(&[ft::IQ2_S, ft::IQ2_M, ft::IQ3_XXS]) {
                new_type = T::IQ3S;
            } else if is(&[ft::TQ1_0, ft::TQ2_0, ft::Q2_0]) {
                new_type = T::Q4K;
            }
        } else if is(&[
            ft::IQ2_XXS,
            ft::IQ2_XS,
            ft::IQ1_S,
            ft::IQ2_S,
            ft::IQ2_M,
            ft::IQ1_M,
        ]) {
            let iq2_sm = is(&[ft::IQ2_S, ft::IQ2_M]);
            if category_is_attn_v(cat) {
                new_type = if n_gqa >= 4 || n_expert >= 4 {
                    T::Q4K
                } else if iq2_sm {
                    T::IQ3S
                } else {
                    T::Q2K
                };
                self.i_attention_wv += 1;
            } else if n_expert == 8 && cat == Category::AttnK {
                new_type = T::Q4K;
            } else if cat == Category::FfnDown {
                if self.i_ffn_down < self.n_ffn_down / 8 {
                    new_type = if iq2_sm { T::IQ3S } else { T::Q2K };
                }
                self.i_ffn_down += 1;
            } else if cat == Category::AttnOutput {
                if n_expert == 8 {
                    new_type = T::Q5K;
                } else if is(&[ft::IQ1_S, ft::IQ1_M]) {
                    new_type = T::IQ2XXS;
                } else if iq2_sm {
                    new_type = T::IQ3S;
                }
            }
        } else if category_is_attn_v(cat) {
            if ftype == ft::Q2_K {
                new_type = if n_gqa >= 4 { T::Q4K } else { T::Q3K };
            } else if ftype == ft::Q2_K_S && n_gqa >= 4 {
                new_type = T::Q4K;
            } else if ftype == ft::IQ3_XXS {
                new_type = if n_gqa >= 4 {
                    T::Q4K
                } else if !self.has_imatrix {
                    T::IQ3S
                } else {
                    T::IQ3XXS
                };
            } else if is(&[ft::IQ3_XS, ft::IQ3_S]) && n_gqa >= 4 {
                new_type = T::Q4K;
            } else if ftype == ft::IQ3_M {
                new_type = T::Q4K;
            } else if ftype == ft::Q3_K_M {
                new_type = if self.i_attention_wv < 2 {
                    T::Q5K
                } else {
                    T::Q4K
                };
            } else if ftype == ft::Q3_K_L {
                new_type = T::Q5K;
            } else if is(&[ft::IQ4_NL, ft::IQ4_XS]) && n_gqa >= 4 {
                new_type = T::Q5K;
            } else if is(&[ft::Q4_K_M, ft::Q5_K_M])
                && use_more_bits(self.i_attention_wv, self.n_attention_wv)
            {
                new_type = T::Q6K;
            } else if ftype == ft::Q4_K_S && self.i_attention_wv < 4 {
                new_type = T::Q5K;
            }
            if self.model.is_70b() && matches!(new_type, T::Q3K | T::Q4K) {
                new_type = T::Q5K;
            }
            if n_expert == 8 {
                new_type = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if n_expert == 8 {
                new_type = T::Q8_0;
            } else if ftype == ft::IQ3_XS {
                new_type = T::IQ3XXS;
            } else if ftype == ft::IQ3_XXS {
                new_type = T::IQ2S;
            }
        } else if cat == Category::AttnQ {
            if ftype == ft::IQ3_XS {
                new_type = T::IQ3XXS;
            } else if ftype == ft::IQ3_XXS {
                new_type = T::IQ2S;
            }
        } else if cat == Category::FfnDown {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_down, self.n_ffn_down, name)?;
            let falcon = self.model.is_falcon();
            if ftype == ft::Q2_K {
                new_type = T::Q3K;
            } else if ftype == ft::Q2_K_S {
                if i_layer < n_layer / 8 {
                    new_type = T::Q4K;
                }
            } else if ftype == ft::IQ3_XXS && !self.has_imatrix {
                new_type = if i_layer < n_layer / 8 {
                    T::Q4K
                } else {
                    T::Q3K
                };
            } else if ftype == ft::Q3_K_M {
                new_type = if i_layer < n_layer / 16 {
                    T::Q5K
                } else if !falcon || use_more_bits(i_layer, n_layer) {
                    T::Q4K
                } else {
                    T::Q3K
                };
            } else if ftype == ft::IQ3_M
                && (i_layer < n_layer / 8 || (n_expert == 8 && use_more_bits(i_layer, n_layer)))
            {
                new_type = T::Q4K;
            } else if ftype == ft::Q3_K_L {
                new_type = if falcon { T::Q4K } else { T::Q5K };
            } else if ftype == ft::Q4_K_M {
                if falcon {
                    new_type = if i_layer < n_layer / 16 {
                        T::Q6K
                    } else if use_more_bits(i_layer, n_layer) {
                        T::Q5K
                    } else {
                        T::Q4K
                    };
                } else if use_more_bits(i_layer, n_layer) {
                    new_type = T::Q6K;
                }
            } else if i_layer < n_layer / 8 && is(&[ft::IQ4_NL, ft::IQ4_XS]) && !self.has_imatrix {
                new_type = T::Q5K;
            } else if ftype == ft::Q5_K_M && use_more_bits(i_layer, n_layer) {
                new_type = T::Q6K;
            } else if ftype == ft::Q4_K_S && !falcon && i_layer < n_layer / 8 {
                new_type = T::Q5K;
            } else if is(&[ft::Q4_0, ft::Q5_0]) && self.has_imatrix && i_layer < n_layer / 8 {
                new_type = if ftype == ft::Q4_0 { T::Q4_1 } else { T::Q5_1 };
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !self.model.is_falcon() {
                if n_expert == 8 {
                    if is(&[
                        ft::Q2_K,
                        ft::IQ3_XS,
                        ft::IQ3_XXS,
                        ft::Q3_K_S,
                        ft::Q3_K_M,
                        ft::IQ4_NL,
                        ft::Q4_K_S,
                        ft::Q4_K_M,
                        ft::IQ3_S,
                        ft::IQ3_M,
                        ft::IQ4_XS,
                    ]) {
                        new_type = T::Q5K;
                    }
                } else if ftype == ft::Q2_K {
                    new_type = T::Q3K;
                } else if ftype == ft::IQ3_XXS {
                    new_type = T::IQ3S;
                } else if ftype == ft::Q3_K_M {
                    new_type = T::Q4K;
                } else if ftype == ft::Q3_K_L {
                    new_type = T::Q5K;
                } else if ftype == ft::IQ3_M {
                    new_type = T::Q4K;
                }
            } else if ftype == ft::Q3_K_L {
                new_type = T::Q4K;
            }
        } else if cat == Category::AttnQkv {
            if is(&[ft::Q3_K_M, ft::Q3_K_L, ft::IQ3_M]) {
                new_type = T::Q4K;
            } else if ftype == ft::Q4_K_M {
                new_type = T::Q5K;
            } else if ftype == ft::Q5_K_M {
                new_type = T::Q6K;
            }
        } else if cat == Category::FfnGate {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_gate, self.n_ffn_gate, name)?;
            if ftype == ft::IQ3_XS && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = T::IQ3XXS;
            }
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_up, self.n_ffn_up, name)?;
            if ftype == ft::IQ3_XS && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = T::IQ3XXS;
            }
            self.i_ffn_up += 1;
        }
        Ok(new_type)
    }

    /// `tensor_type_fallback`: a type whose block fits the row length, and the note saying so.
    fn fallback(&mut self, ncols: usize, target: DType) -> Result<(DType, Option<String>), String> {
        use DType as T;
        let qk = target.block_size();
        if ncols.is_multiple_of(qk) {
            return Ok((target, None));
        }
        self.n_fallback += 1;
        let mut ret = match target {
            T::IQ1S | T::IQ1M | T::IQ2XXS | T::IQ2XS | T::IQ2S | T::IQ3XXS | T::IQ3S | T::IQ4XS => {
                T::IQ4NL
            }
            T::Q2_0 | T::Q2K | T::Q3K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
            T::Q4K => T::Q5_0,
            T::Q5K => T::Q5_1,
            T::Q6K => T::Q8_0,
            _ if qk <= 32 => target,
            _ => {
                return Err(format!(
                    "no tensor type fallback is defined for type {target}"
                ))
            }
        };
        if !ncols.is_multiple_of(ret.block_size()) {
            ret = T::F16;
        }
        Ok((
            ret,
            Some(format!(
                "{ncols} columns are not a multiple of {target}'s block size {qk}: falling back to {ret}"
            )),
        ))
    }
}

/// `tensor_requires_imatrix`, plus the types ggml cannot quantize at all without one.
fn tensor_requires_imatrix(name: &str, dst: DType, ftype: u32) -> bool {
    if requires_imatrix(dst.id()) {
        return true;
    }
    if is_token_embd(name) || name == "output.weight" {
        return false;
    }
    match dst {
        DType::IQ3XXS | DType::IQ2XXS | DType::IQ2XS | DType::IQ2S | DType::IQ1M | DType::IQ1S => {
            true
        }
        DType::Q2K => ftype == ft::Q2_K_S,
        _ => false,
    }
}

/// One tensor's plan.
#[derive(Clone, Debug)]
pub struct Plan {
    pub name: String,
    pub from: DType,
    pub to: DType,
    /// Why the type differs from the one asked for by the rules (a shape fallback).
    pub note: Option<String>,
}

/// The per-tensor types llama-quantize would choose, in llama.cpp's tensor order.
fn plan(
    f: &GgufFile,
    target: &Target,
    pure: bool,
    has_imatrix: bool,
    quantize_output: bool,
) -> Result<(Vec<Plan>, usize), String> {
    let model = ModelInfo::from_gguf(f);
    let mut order: Vec<&TensorInfo> = f.tensors.iter().collect();
    order.sort_by(|a, b| llama_order(&a.name, &b.name));
    let cats: Vec<Category> = order.iter().map(|t| category(&t.name)).collect();
    let mut st = State {
        ftype: target.ftype,
        has_imatrix,
        has_tied_embeddings: !cats.contains(&Category::Output),
        n_attention_wv: cats.iter().filter(|&&c| category_is_attn_v(c)).count(),
        i_attention_wv: 0,
        n_ffn_down: model.n_layer,
        i_ffn_down: 0,
        n_ffn_gate: model.n_layer,
        i_ffn_gate: 0,
        n_ffn_up: model.n_layer,
        i_ffn_up: 0,
        n_fallback: 0,
        model,
    };
    let pure = pure || target.pure_only;
    let mut plans = Vec::with_capacity(order.len());
    for (t, &cat) in order.iter().zip(&cats) {
        let n_dims = ggml_n_dims(&t.ne);
        let mut to = t.dtype;
        let mut note = None;
        if allows_quantization(&t.name, n_dims, &st.model.arch, quantize_output) {
            to = target.default_type;
            if target.default_type.is_quantized() {
                if !pure {
                    to = st.mixed_type(to, &t.name, &t.ne, cat)?;
                }
                (to, note) = st.fallback(t.ne[0], to)?;
            }
        }
        plans.push(Plan {
            name: t.name.clone(),
            from: t.dtype,
            to,
            note,
        });
    }
    Ok((plans, st.n_fallback))
}

// ---------------------------------------------------------------------------------------------
// quantize: importance matrices
// ---------------------------------------------------------------------------------------------

/// An importance matrix as llama-quantize hands it to the quantizer: per tensor name, the mean
/// of x² per column (per expert, concatenated).
pub struct Imatrix {
    pub entries: HashMap<String, Vec<f32>>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
}

/// Reads llama-imatrix's GGUF format (`<name>.in_sum2`, `<name>.counts`) or the legacy `.dat`.
pub fn load_imatrix(path: &Path) -> Result<Imatrix, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read imatrix {}: {e}", path.display()))?;
    let im = if bytes.starts_with(b"GGUF") {
        let f =
            GgufFile::from_bytes(bytes).map_err(|e| format!("imatrix {}: {e}", path.display()))?;
        imatrix_from_gguf(&f)?
    } else {
        imatrix_from_legacy(&bytes)?
    };
    for (name, v) in &im.entries {
        if let Some(x) = v.iter().find(|x| !x.is_finite()) {
            return Err(format!(
                "imatrix entry {name} contains the non-finite value {x}"
            ));
        }
    }
    Ok(im)
}

fn imatrix_from_gguf(f: &GgufFile) -> Result<Imatrix, String> {
    if f.tensors.is_empty() {
        return Err("the imatrix file holds no tensors".into());
    }
    let datasets = f
        .get("imatrix.datasets")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        });
    let chunk_count = f.get("imatrix.chunk_count").and_then(Value::as_u64);
    if datasets.is_none() || chunk_count.is_none() || f.get("imatrix.chunk_size").is_none() {
        return Err(
            "missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)"
                .into(),
        );
    }
    let mut entries = HashMap::new();
    for t in &f.tensors {
        let Some(name) = t.name.strip_suffix(".in_sum2") else {
            continue;
        };
        let counts = f
            .tensor(&format!("{name}.counts"))
            .ok_or_else(|| format!("mismatched sums and counts for {name}"))?;
        if t.dtype != DType::F32 || counts.dtype != DType::F32 {
            return Err(format!("sums and counts for {name} must be f32"));
        }
        let sums = f32s(f.tensor_data(t));
        let counts = f32s(f.tensor_data(counts));
        if counts.is_empty() || !sums.len().is_multiple_of(counts.len()) {
            return Err(format!(
                "imatrix entry {name}: {} sums for {} counts",
                sums.len(),
                counts.len()
            ));
        }
        let ne0 = sums.len() / counts.len();
        let mut e = vec![1f32; sums.len()];
        for (j, &c) in counts.iter().enumerate() {
            let c = c.round() as i64 as f32;
            if c > 0.0 {
                for i in 0..ne0 {
                    e[j * ne0 + i] = sums[j * ne0 + i] / c;
                }
            }
        }
        entries.insert(name.to_string(), e);
    }
    if let Some(t) = f.tensors.iter().find(|t| {
        t.name
            .strip_suffix(".counts")
            .is_some_and(|n| !entries.contains_key(n))
    }) {
        return Err(format!("mismatched sums and counts for {}", t.name));
    }
    Ok(Imatrix {
        entries,
        datasets: datasets.unwrap_or_default(),
        chunk_count: chunk_count.unwrap_or(0) as u32,
    })
}

fn imatrix_from_legacy(b: &[u8]) -> Result<Imatrix, String> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = b.get(pos..pos.checked_add(n)?)?;
        pos += n;
        Some(s)
    };
    fn i32_of(s: Option<&[u8]>) -> Option<i32> {
        s.map(|s| i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    let bad = |what: &str| format!("not a GGUF or legacy imatrix file ({what})");
    let n_entries = i32_of(take(4)).ok_or_else(|| bad("too short"))?;
    if n_entries < 1 {
        return Err(bad("no entries"));
    }
    let mut entries = HashMap::new();
    for i in 0..n_entries {
        let len = i32_of(take(4)).ok_or_else(|| bad("truncated"))?;
        let name = usize::try_from(len)
            .ok()
            .and_then(&mut take)
            .ok_or_else(|| bad(&format!("entry {} name", i + 1)))?;
        let name = String::from_utf8_lossy(name).into_owned();
        let ncall = i32_of(take(4)).ok_or_else(|| bad("truncated"))?;
        let nval = i32_of(take(4)).ok_or_else(|| bad("truncated"))?;
        if nval < 1 {
            return Err(bad(&format!("entry {name} has {nval} values")));
        }
        let data = (nval as usize)
            .checked_mul(4)
            .and_then(&mut take)
            .ok_or_else(|| bad(&format!("entry {name} data")))?;
        let mut v = f32s(data);
        // The file holds (sum / count) * ncall; llama-quantize divides by ncall.
        if ncall > 0 {
            for x in &mut v {
                *x /= ncall as f32;
            }
        }
        entries.insert(name, v);
    }
    let chunk_count = i32_of(take(4)).unwrap_or(0).max(0) as u32;
    let mut datasets = Vec::new();
    if let Some(len) = i32_of(take(4)).filter(|&l| l > 0) {
        if let Some(s) = take(len as usize) {
            datasets.push(String::from_utf8_lossy(s).into_owned());
        }
    }
    Ok(Imatrix {
        entries,
        datasets,
        chunk_count,
    })
}

// ---------------------------------------------------------------------------------------------
// quantize: the command
// ---------------------------------------------------------------------------------------------

/// `tessera quantize`'s arguments.
#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// The input GGUF model (f32, f16 or bf16 weights; quantized ones with --allow-requantize).
    pub input: PathBuf,
    /// The output GGUF file.
    pub output: PathBuf,
    /// A llama-quantize type (Q4_0, Q8_0, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, F16, ..., or its number;
    /// Q3_K/Q4_K/Q5_K mean the _M mixes) or mxfp4/nvfp4. Case-insensitive.
    #[arg(value_name = "TYPE")]
    pub type_name: String,
    /// Quantize every quantizable tensor to TYPE's base type: no k-quant mixing.
    #[arg(long)]
    pub pure: bool,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Allow requantizing tensors that are already quantized (loses quality).
    #[arg(long)]
    pub allow_requantize: bool,
    /// An importance matrix from llama-imatrix (GGUF or legacy .dat).
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Leave output.weight as it is.
    #[arg(long)]
    pub leave_output_tensor: bool,
}

fn mib(n: usize) -> f64 {
    n as f64 / (1024.0 * 1024.0)
}

/// Converts one row's worth of any float or quantized type to f32.
fn row_to_f32(t: DType, src: &[u8], dst: &mut [f32]) -> Result<(), String> {
    match t {
        DType::F32 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            Ok(())
        }
        _ if t == DType::F16 || t == DType::BF16 || t.is_quantized() => {
            dequantize_row(t.id(), src, dst).map_err(|e| e.to_string())
        }
        _ => Err(format!("cannot dequantize/convert tensor type {t}")),
    }
}

fn row_from_f32(
    t: DType,
    src: &[f32],
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) -> Result<(), String> {
    if t == DType::F32 {
        for (d, x) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&x.to_le_bytes());
        }
        return Ok(());
    }
    quantize_row(t.id(), src, dst, imatrix).map_err(|e| e.to_string())
}

/// Converts a tensor of dimensions `ne` row by row on `threads` threads. `imatrix` holds
/// `ne[0]` weights per expert (a 3-D tensor's `ne[1]` rows each), as llama.cpp passes it.
fn convert(
    src: &[u8],
    from: DType,
    to: DType,
    ne: &[usize; 4],
    imatrix: Option<&[f32]>,
    threads: usize,
) -> Result<Vec<u8>, String> {
    let (ne0, nrows, nrows_per_expert) = (ne[0], ne[1] * ne[2] * ne[3], ne[1]);
    let src_row = from
        .row_size(ne0)
        .ok_or_else(|| format!("{ne0} columns are not whole {from} blocks"))?;
    let dst_row = to
        .row_size(ne0)
        .ok_or_else(|| format!("{ne0} columns are not whole {to} blocks"))?;
    let mut out = vec![0u8; nrows * dst_row];
    if nrows == 0 {
        return Ok(out);
    }
    let per = nrows.div_ceil(threads.max(1));
    std::thread::scope(|s| {
        let workers: Vec<_> = out
            .chunks_mut(per * dst_row)
            .enumerate()
            .map(|(c, chunk)| {
                s.spawn(move || -> Result<(), String> {
                    let mut row = vec![0f32; ne0];
                    for (j, dst) in chunk.chunks_mut(dst_row).enumerate() {
                        let r = c * per + j;
                        row_to_f32(from, &src[r * src_row..(r + 1) * src_row], &mut row)?;
                        let im = imatrix.map(|m| &m[(r / nrows_per_expert) * ne0..][..ne0]);
                        row_from_f32(to, &row, dst, im).map_err(|e| format!("row {r}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("quantize worker panicked"))
    })?;
    Ok(out)
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
struct Progress {
    on: bool,
    total: usize,
    done: usize,
}

impl Progress {
    fn clear(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }

    fn draw(&self, what: &str) {
        if !self.on {
            return;
        }
        let frac = if self.total == 0 {
            1.0
        } else {
            self.done as f64 / self.total as f64
        };
        let width = 30;
        let filled = ((frac * width as f64) as usize).min(width);
        eprint!(
            "\r\x1b[K[{}{}] {:3.0}% {what}",
            "=".repeat(filled),
            " ".repeat(width - filled),
            frac * 100.0
        );
        let _ = std::io::stderr().flush();
    }
}

/// Why `quantize` failed: the input could not be read (exit 2) or anything else (exit 1).
pub enum QuantizeError {
    Unreadable(String),
    Failed(String),
}

impl From<String> for QuantizeError {
    fn from(s: String) -> Self {
        QuantizeError::Failed(s)
    }
}

/// `tessera quantize`.
pub fn quantize_main(args: &QuantizeArgs) -> ExitCode {
    match quantize(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(QuantizeError::Unreadable(e)) => {
            eprintln!("tessera: {e}");
            ExitCode::from(2)
        }
        Err(QuantizeError::Failed(e)) => {
            eprintln!("tessera: quantize: {e}");
            ExitCode::from(1)
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

pub fn quantize(args: &QuantizeArgs) -> Result<(), QuantizeError> {
    let start = Instant::now();
    let target = parse_target(&args.type_name)?;
    if same_file(&args.input, &args.output) {
        return Err(format!(
            "input and output are the same file: {}",
            args.input.display()
        )
        .into());
    }
    let f = GgufFile::open(&args.input).map_err(|e| {
        QuantizeError::Unreadable(format!("cannot read {}: {e}", args.input.display()))
    })?;
    let imatrix = match &args.imatrix {
        Some(p) => Some(load_imatrix(p)?),
        None => None,
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);

    let (plans, n_fallback) = plan(
        &f,
        &target,
        args.pure,
        imatrix.is_some(),
        !args.leave_output_tensor,
    )?;

    println!(
        "quantizing {} to {} as {} (ftype {}){} using {threads} thread(s)",
        args.input.display(),
        args.output.display(),
        target.name,
        target.ftype,
        if args.pure || target.pure_only {
            ", pure"
        } else {
            ""
        },
    );
    // Everything that would stop the conversion half-way is checked first.
    let mut im_for: HashMap<&str, Option<&[f32]>> = HashMap::new();
    for p in &plans {
        if p.from == p.to {
            continue;
        }
        let t = f.tensor(&p.name).expect("planned tensor exists");
        if p.from.is_quantized() && !args.allow_requantize {
            return Err(format!(
                "tensor {} is already quantized ({}); requantizing it to {} loses quality: pass --allow-requantize to do it anyway",
                p.name, p.from, p.to
            )
            .into());
        }
        if !matches!(p.from, DType::F32 | DType::F16 | DType::BF16) && !p.from.is_quantized() {
            return Err(format!(
                "tensor {} has type {}, which cannot be converted to {}",
                p.name, p.from, p.to
            )
            .into());
        }
        if p.to != DType::F32 && !tessera_quants::can_quantize(p.to.id()) {
            return Err(format!("tessera cannot quantize to {} (tensor {})", p.to, p.name).into());
        }
        let mut im = None;
        if let Some(imx) = &imatrix {
            match imx.entries.get(&p.name) {
                None => println!("note: the importance matrix has no entry for {}", p.name),
                Some(v) if v.len() == t.ne[0] * t.ne[2] => im = Some(&v[..]),
                Some(v) if is_token_embd(&p.name) => println!(
                    "note: ignoring the importance matrix of {} ({} values for {} columns)",
                    p.name,
                    v.len(),
                    t.ne[0] * t.ne[2]
                ),
                Some(v) => {
                    return Err(format!(
                        "imatrix size {} is different from tensor size {} for {}",
                        v.len(),
                        t.ne[0] * t.ne[2],
                        p.name
                    )
                    .into())
                }
            }
        }
        if im.is_none() && tensor_requires_imatrix(&p.name, p.to, target.ftype) {
            return Err(format!(
                "tensor {} would be quantized to {}, which needs an importance matrix: pass --imatrix FILE",
                p.name, p.to
            )
            .into());
        }
        im_for.insert(&p.name, im);
    }

    let mut w = GgufWriter::new();
    // gguf_set_val_* removes a key and appends it: these two end up last, as in llama.cpp.
    const DROPPED: &[&str] = &[
        "split.no",
        "split.count",
        "split.tensors.count",
        "general.quantization_version",
        "general.file_type",
    ];
    for (k, v) in &f.metadata {
        if !DROPPED.contains(&k.as_str()) {
            w.add_kv(k, v.clone());
        }
    }
    w.add_kv("general.quantization_version", Value::U32(2));
    w.add_kv("general.file_type", Value::U32(target.ftype));
    if let (Some(imx), Some(path)) = (&imatrix, &args.imatrix) {
        w.add_kv(
            "quantize.imatrix.file",
            Value::from(path.to_string_lossy().as_ref()),
        );
        if let Some(d) = imx.datasets.first() {
            w.add_kv("quantize.imatrix.dataset", Value::from(d.as_str()));
        }
        w.add_kv(
            "quantize.imatrix.entries_count",
            Value::U32(imx.entries.len() as u32),
        );
        if imx.chunk_count > 0 {
            w.add_kv("quantize.imatrix.chunks_count", Value::U32(imx.chunk_count));
        }
    }

    // the tensors are declared now and their data streamed to the file one at a time, so the
    // converter holds one converted tensor in memory, not the whole output
    for p in &plans {
        let t = f.tensor(&p.name).expect("planned tensor exists");
        w.declare_tensor(&p.name, p.to, t.shape())
            .map_err(|e| e.to_string())?;
    }
    let mut out = w
        .stream_to_file(&args.output)
        .map_err(|e| format!("cannot write {}: {e}", args.output.display()))?;
    let mut progress = Progress {
        on: std::io::stderr().is_terminal(),
        total: plans
            .iter()
            .map(|p| f.tensor(&p.name).map_or(0, |t| t.size))
            .sum(),
        done: 0,
    };
    let (mut size_in, mut size_out, mut n_elements) = (0usize, 0usize, 0usize);
    let n = plans.len();
    for (i, p) in plans.iter().enumerate() {
        let t = f.tensor(&p.name).expect("planned tensor exists");
        progress.draw(&p.name);
        let src = f.tensor_data(t);
        let data: std::borrow::Cow<[u8]> = if p.from == p.to {
            src.into()
        } else {
            convert(
                src,
                p.from,
                p.to,
                &t.ne,
                im_for.get(p.name.as_str()).copied().flatten(),
                threads,
            )
            .map_err(|e| format!("{}: {e}", p.name))?
            .into()
        };
        out.write_tensor(&p.name, &data)
            .map_err(|e| format!("cannot write {}: {e}", args.output.display()))?;
        progress.done += t.size;
        progress.clear();
        let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
        let what = if p.from == p.to {
            format!("{:<7} {:>9.3} MiB (copied)", p.from.name(), mib(t.size))
        } else {
            format!(
                "{:<7} -> {:<7} {:>9.3} MiB -> {:>9.3} MiB",
                p.from.name(),
                p.to.name(),
                mib(t.size),
                mib(data.len())
            )
        };
        println!(
            "[{:>4}/{:>4}] {:<36} [{}] {what}{}",
            i + 1,
            n,
            p.name,
            dims.join(", "),
            p.note
                .as_deref()
                .map(|s| format!("  ({s})"))
                .unwrap_or_default()
        );
        size_in += t.size;
        size_out += data.len();
        n_elements += t.n_elements();
    }
    progress.draw("writing");
    let written = out.finish();
    progress.clear();
    written.map_err(|e| format!("cannot write {}: {e}", args.output.display()))?;

    let bpw = |b: usize| b as f64 * 8.0 / n_elements.max(1) as f64;
    println!(
        "model size = {:.2} MiB ({:.2} BPW), quant size = {:.2} MiB ({:.2} BPW)",
        mib(size_in),
        bpw(size_in),
        mib(size_out),
        bpw(size_out)
    );
    if n_fallback > 0 {
        println!("warning: {n_fallback} of {n} tensor(s) required fallback quantization");
    }
    println!(
        "wrote {} in {:.2} s",
        args.output.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_30_layers() {
        // n/8 = 3, 7n/8 = 26: layers 0-2, 26-29, and 5, 8, 11, ... (i - 3) % 3 == 2.
        let picked: Vec<usize> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
        assert_eq!(
            picked,
            vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
        );
    }

    #[test]
    fn llama_order_puts_layers_after_globals_numerically() {
        let mut v = vec![
            "blk.10.attn_q.weight",
            "output.weight",
            "blk.2.ffn_down.weight",
            "blk.2.attn_k.weight",
            "token_embd.weight",
        ];
        v.sort_by(|a, b| llama_order(a, b));
        assert_eq!(
            v,
            vec![
                "output.weight",
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.ffn_down.weight",
                "blk.10.attn_q.weight",
            ]
        );
    }

    #[test]
    fn targets_parse_like_llama_quantize() {
        assert_eq!(parse_target("q4_k_m").unwrap().ftype, ft::Q4_K_M);
        assert_eq!(parse_target("Q4_K").unwrap().name, "Q4_K");
        assert_eq!(parse_target("q4_K").unwrap().ftype, ft::Q4_K_M);
        assert_eq!(parse_target("15").unwrap().ftype, ft::Q4_K_M);
        assert_eq!(parse_target("q8_0").unwrap().default_type, DType::Q8_0);
        assert!(parse_target("mxfp4").unwrap().pure_only);
        let e = parse_target("q9_0").unwrap_err();
        assert!(
            e.contains("q9_0") && e.contains("Q4_K_M") && e.contains("mxfp4"),
            "{e}"
        );
    }

    #[test]
    fn fallback_follows_llama_cpp() {
        let mut st = State {
            model: ModelInfo {
                arch: "llama".into(),
                n_layer: 1,
                n_head: 1,
                n_head_kv: 1,
                n_expert: 0,
            },
            ftype: ft::Q4_K_M,
            has_imatrix: false,
            has_tied_embeddings: true,
            n_attention_wv: 0,
            i_attention_wv: 0,
            n_ffn_down: 1,
            i_ffn_down: 0,
            n_ffn_gate: 1,
            i_ffn_gate: 0,
            n_ffn_up: 1,
            i_ffn_up: 0,
            n_fallback: 0,
        };
        assert_eq!(st.fallback(512, DType::Q4K).unwrap().0, DType::Q4K);
        assert_eq!(st.fallback(96, DType::Q4K).unwrap().0, DType::Q5_0);
        assert_eq!(st.fallback(96, DType::Q6K).unwrap().0, DType::Q8_0);
        assert_eq!(st.fallback(100, DType::Q4K).unwrap().0, DType::F16);
        assert_eq!(st.fallback(100, DType::Q8_0).unwrap().0, DType::F16);
        assert!(st.fallback(96, DType::Q1_0).is_err());
        assert_eq!(st.n_fallback, 5);
    }
}
