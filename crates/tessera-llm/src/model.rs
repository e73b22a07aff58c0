//! A GGUF language model: architecture and hyper-parameters from the metadata, weights as
//! zero-copy views into the memory-mapped file (or, after `Model::with_interleaved_rows`, the
//! matrices this CPU reads faster so as copies in the interleaved layout).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tessera::{DType, ExternalBytes, RowLayout};
use tessera_gguf::{GgufFile, TensorInfo, Value};

use crate::error::{LlmError, Result};
use crate::tokenizer::Tokenizer;

/// The architectures we build graphs for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// llama, SmolLM2, TinyLlama, Llama 3.x, Mistral.
    Llama,
    /// qwen2: llama with Q/K/V biases and neox rope.
    Qwen2,
    /// gpt2: learned positions, LayerNorm with bias, GELU, fused QKV.
    Gpt2,
}

impl Arch {
    pub const SUPPORTED: &'static [&'static str] = &["llama", "qwen2", "gpt2"];

    fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "gpt2" => Some(Arch::Gpt2),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Gpt2 => "gpt2",
        }
    }
}

/// Hyper-parameters read from `<arch>.*` keys.
#[derive(Clone, Debug)]
pub struct HParams {
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    /// ggml rope mode: 0 normal (llama), 2 neox (qwen2).
    pub rope_mode: i32,
    /// YaRN / llama3 scaling, when the metadata asks for it.
    pub rope_scaling: RopeScaling,
    pub n_ctx_orig: usize,
    pub norm_eps: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear,
    Yarn {
        ext_factor: f32,
        attn_factor: f32,
        beta_fast: f32,
        beta_slow: f32,
    },
}

/// The memory-mapped file, shared by every session that binds its weights.
/// A LoRA adapter and its scale, applied by the inference graphs.
#[derive(Clone)]
pub struct LoraBinding {
    pub adapter: Arc<crate::lora::Adapter>,
    pub scale: f32,
}

pub(crate) struct Mapped(pub(crate) Arc<GgufFile>);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

pub struct Model {
    pub file: Arc<GgufFile>,
    /// A LoRA adapter applied at inference (see [`Model::with_lora`]).
    pub lora: Option<LoraBinding>,
    pub arch: Arch,
    pub hp: HParams,
    pub tokenizer: Tokenizer,
    pub name: String,
    bytes: ExternalBytes,
    /// Weights copied into interleaved rows (see [`Model::with_interleaved_rows`]), by name.
    interleaved: HashMap<String, ExternalBytes>,
    /// Plain copies of the 1-D tensors (norms, biases) lying among the interleaved ones, so
    /// that the mapped pages of those can leave the resident set for good.
    small: HashMap<String, ExternalBytes>,
    /// Whether interleaved q4_0 and iq4_nl weights take ggml's repack arithmetic
    /// ([`Model::with_repacked_rows`]).
    repacked: bool,
    /// The q4_K weights that take ggml's repack arithmetic on their mapped rows
    /// ([`Model::with_repacked_rows`]), by name.
    repacked_plain: std::collections::HashSet<String>,
}

fn get_u(f: &GgufFile, key: &str) -> Result<usize> {
    f.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| LlmError::MissingKey(key.to_string()))
}

fn get_f(f: &GgufFile, key: &str) -> Option<f32> {
    f.get(key).and_then(Value::as_f64).map(|v| v as f32)
}

impl Model {
    /// Opens a GGUF model (memory-mapped: weights are never copied).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let file =
            GgufFile::open(path).map_err(|e| LlmError::File(format!("{}: {e}", path.display())))?;
        Model::from_file(Arc::new(file))
    }

    pub fn from_file(file: Arc<GgufFile>) -> Result<Model> {
        let f = &*file;
        let arch_name = f
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| LlmError::MissingKey("general.architecture".into()))?
            .to_string();
        let arch = Arch::from_name(&arch_name).ok_or_else(|| LlmError::UnsupportedArch {
            arch: arch_name.clone(),
            supported: Arch::SUPPORTED.join(", "),
        })?;
        let a = arch_name.as_str();
        let tokenizer = Tokenizer::from_gguf(f).map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        let n_embd = get_u(f, &format!("{a}.embedding_length"))?;
        let n_head = get_u(f, &format!("{a}.attention.head_count"))?;
        let n_head_kv = get_u(f, &format!("{a}.attention.head_count_kv")).unwrap_or(n_head);
        let head_dim = get_u(f, &format!("{a}.attention.key_length")).unwrap_or(n_embd / n_head);
        let n_rot = get_u(f, &format!("{a}.rope.dimension_count")).unwrap_or(head_dim);
        let n_vocab = match get_u(f, &format!("{a}.vocab_size")) {
            Ok(v) => v,
            Err(_) => tokenizer.n_vocab(),
        };
        let norm_eps = match arch {
            Arch::Gpt2 => get_f(f, &format!("{a}.attention.layer_norm_epsilon")).unwrap_or(1e-5),
            _ => get_f(f, &format!("{a}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        };
        let n_ctx_train = get_u(f, &format!("{a}.context_length")).unwrap_or(2048);
        let scaling_type = f
            .get(&format!("{a}.rope.scaling.type"))
            .and_then(Value::as_str)
            .unwrap_or("none");
        let scale_factor = get_f(f, &format!("{a}.rope.scaling.factor")).unwrap_or(0.0);
        let mut rope_freq_scale = if scale_factor > 0.0 {
            1.0 / scale_factor
        } else {
            1.0
        };
        let rope_scaling = match scaling_type {
            "none" => {
                rope_freq_scale = 1.0;
                RopeScaling::None
            }
            "linear" => RopeScaling::Linear,
            "yarn" => RopeScaling::Yarn {
                ext_factor: 1.0,
                attn_factor: get_f(f, &format!("{a}.rope.scaling.attn_factor")).unwrap_or(1.0),
                beta_fast: get_f(f, &format!("{a}.rope.scaling.yarn_beta_fast")).unwrap_or(32.0),
                beta_slow: get_f(f, &format!("{a}.rope.scaling.yarn_beta_slow")).unwrap_or(1.0),
            },
            other => {
                return Err(LlmError::Unsupported(format!(
                    "rope scaling type '{other}'"
                )))
            }
        };
        let hp = HParams {
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer: get_u(f, &format!("{a}.block_count"))?,
            n_head,
            n_head_kv,
            n_ff: get_u(f, &format!("{a}.feed_forward_length"))?,
            head_dim,
            n_rot,
            rope_freq_base: get_f(f, &format!("{a}.rope.freq_base")).unwrap_or(10000.0),
            rope_freq_scale,
            rope_mode: if arch == Arch::Qwen2 { 2 } else { 0 },
            rope_scaling,
            n_ctx_orig: get_u(f, &format!("{a}.rope.scaling.original_context_length"))
                .unwrap_or(n_ctx_train),
            norm_eps,
        };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(LlmError::Invalid(format!(
                "{n_head} heads cannot share {n_head_kv} KV heads"
            )));
        }
        let name = f
            .get("general.name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let bytes: ExternalBytes = Arc::new(Mapped(Arc::clone(&file)));
        let m = Model {
            file,
            lora: None,
            arch,
            hp,
            tokenizer,
            name,
            bytes,
            interleaved: HashMap::new(),
            small: HashMap::new(),
            repacked: false,
            repacked_plain: Default::default(),
        };
        m.check_tensors()?;
        Ok(m)
    }

    /// Applies `adapter` (checked against this model by [`Adapter::load`]) with `scale` to
    /// every graph built from now on: `y = W·x + scale·(alpha/r)·B·(A·x)` on each adapted
    /// weight, A and B mapped from the adapter file.
    ///
    /// [`Adapter::load`]: crate::lora::Adapter::load
    pub fn with_lora(mut self, adapter: Arc<crate::lora::Adapter>, scale: f32) -> Model {
        self.lora = Some(LoraBinding { adapter, scale });
        self
    }

    /// Copies the weights that this CPU's eight-row mat-vec kernels read faster with their
    /// rows interleaved (`tessera::layout`: q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs,
    /// q4_K, q5_K and q6_K on AVX-512 VNNI) into that layout, once; graphs built from now on
    /// read those copies in their matrix products.
    /// Embedding tables (read by `get_rows`) stay mapped, and so does everything on other
    /// CPUs: then this changes nothing. The copies are heap memory, as ggml's CPU "repack"
    /// buffers are; the mapped pages they came from leave the resident set
    /// (`GgufFile::release`), so a process holds the weights once. A model for training keeps
    /// its weights mapped (the backward of `mul_mat` reads them in other ways).
    pub fn with_interleaved_rows(self) -> Result<Model> {
        self.with_interleaved_rows_where(tessera_cpu::interleaved_kernel)
    }

    /// Has the weights that llama.cpp's CPU backend repacks on x86 when built for AVX2 (q4_0,
    /// iq4_nl, q4_K and mxfp4, `tessera_cpu::repacked_by_run`: not q2_K, which ggml repacks
    /// only when built with AVX-512; 2-D matrices of whole groups of eight rows read by
    /// `mul_mat`: not the embedding table, which `get_rows` reads, but the output matrix when
    /// it is that table, which llama.cpp loads a second time for the output's `mul_mat` and
    /// repacks) computed with the arithmetic of ggml's repack kernels
    /// (`tessera::RowLayout::Repacked8`): the results of llama.cpp's default (built for AVX2)
    /// on any CPU rather than of its `--no-repack`, which is what the plain rows give. The
    /// q4_0, iq4_nl and mxfp4 ones are copied into interleaved rows
    /// (`tessera::layout::interleave8`; a tied output matrix too, while the embedding lookups
    /// read the mapped table), as ggml copies them into its repack buffer; the q4_K ones stay
    /// mapped. Other weights are as before (interleaved q4_1 too, if chosen).
    pub fn with_repacked_rows(self) -> Result<Model> {
        let reorders = |t: DType| {
            tessera::layout::repack_numerics(t)
                && tessera::layout::reorders(RowLayout::Repacked8, t)
        };
        let mut m = self.with_copies_where(reorders)?;
        m.repacked = true;
        let repackable = |t: &TensorInfo| {
            tessera_cpu::repacked_by_run(t.dtype) && t.n_dims == 2 && t.ne[1].is_multiple_of(8)
        };
        // the output matrix when it is the embedding table (no output.weight)
        let tied = (!m.has_tensor("output.weight"))
            .then(|| m.file.tensor("token_embd.weight"))
            .flatten()
            .filter(|t| repackable(t))
            .cloned();
        m.repacked_plain = m
            .file
            .tensors
            .iter()
            .filter(|t| {
                repackable(t)
                    && !reorders(t.dtype)
                    && (!t.name.contains("_embd")
                        || tied.as_ref().is_some_and(|e| e.name == t.name))
            })
            .map(|t| t.name.clone())
            .collect();
        if let Some(t) = tied.filter(|t| reorders(t.dtype)) {
            // read as ggml's rows by `get_rows` (the mapped table) and through this copy by the
            // output's `mul_mat` (`weight_buffer_as` binds a leaf by its layout)
            let out = m.interleaved_copy(&t)?;
            m.interleaved.insert(t.name.clone(), Arc::new(out));
        }
        Ok(m)
    }

    /// Tensor `t`'s rows interleaved by eight (`tessera::layout::interleave8`), copied.
    fn interleaved_copy(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let (bytes, off) = self.tensor_bytes(t);
        let plain = &(*bytes).as_ref()[off..off + t.size];
        let mut out = vec![0u8; t.size];
        let row = t.dtype.row_size(t.ne[0]).ok_or_else(|| {
            LlmError::Invalid(format!("tensor {}: no row size for {}", t.name, t.dtype))
        })?;
        tessera::layout::interleave8(t.dtype, row, plain, &mut out)
            .map_err(|e| LlmError::Invalid(format!("tensor {}: {e}", t.name)))?;
        Ok(out)
    }

    /// [`Model::with_interleaved_rows`] for the weight types `pick` chooses (among those
    /// `tessera::layout` interleaves: q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K, q5_K
    /// and q6_K; e.g. all of them on any CPU, for tests).
    pub fn with_interleaved_rows_where(self, pick: impl Fn(DType) -> bool) -> Result<Model> {
        self.with_copies_where(|t| tessera::layout::interleave_head(t).is_some() && pick(t))
    }

    /// Copies of the matrices of the types `pick` chooses (2-D, whole groups of eight rows,
    /// not an embedding table) in `tessera::layout::interleave8`'s order, their mapped pages
    /// released.
    fn with_copies_where(mut self, pick: impl Fn(DType) -> bool) -> Result<Model> {
        for t in &self.file.tensors {
            let eligible = pick(t.dtype)
                && t.n_dims == 2
                && t.ne[1].is_multiple_of(8)
                && !t.name.contains("_embd");
            if !eligible {
                continue;
            }
            let out = self.interleaved_copy(t)?;
            self.interleaved.insert(t.name.clone(), Arc::new(out));
        }
        // The copied weights' mapped pages are not read again (unless a training graph reads
        // the plain weights): out of the resident set, so the weights do not count twice. A
        // read of a page maps the pages around it too (fault-around, large folios): the 1-D
        // tensors between the matrices (norms, biases, a few KiB each) are copied as they are
        // and their pages released as well, else reading them brought back a third of the
        // released pages (SmolLM2: 23 of 66 MB); and all of it once the copies are made.
        if !self.interleaved.is_empty() {
            for t in self.file.tensors.iter().filter(|t| t.n_dims == 1) {
                if self.small.contains_key(&t.name) {
                    // copied by an earlier call (`--repack`, then `--interleave`)
                    continue;
                }
                let (bytes, off) = self.tensor_bytes(t);
                let copy = (*bytes).as_ref()[off..off + t.size].to_vec();
                self.small.insert(t.name.clone(), Arc::new(copy));
            }
        }
        for t in
            self.file.tensors.iter().filter(|t| {
                self.interleaved.contains_key(&t.name) || self.small.contains_key(&t.name)
            })
        {
            let (_, off) = self.tensor_bytes(t);
            self.file
                .release(off, t.size)
                .map_err(|e| LlmError::Invalid(format!("tensor {}: {e}", t.name)))?;
        }
        Ok(self)
    }

    /// How a graph should lay out weight `name` read by `mul_mat` alone.
    pub fn layout_for_mul_mat(&self, name: &str) -> RowLayout {
        if self.repacked_plain.contains(name) {
            return RowLayout::Repacked8;
        }
        if let Some(t) = self.interleaved.get(name).and(self.file.tensor(name)) {
            if self.repacked && tessera::layout::repack_numerics(t.dtype) {
                RowLayout::Repacked8
            } else {
                RowLayout::Interleaved8
            }
        } else {
            RowLayout::Plain
        }
    }

    /// Bytes held in interleaved copies of weights ([`Model::with_interleaved_rows`]).
    pub fn interleaved_bytes(&self) -> usize {
        self.interleaved
            .values()
            .map(|b| (**b).as_ref().len())
            .sum()
    }

    /// The memory of weight leaf `name` laid out as `layout`: the interleaved copy, or (plain)
    /// as [`Model::weight_buffer`] gives it.
    pub fn weight_buffer_as(&self, name: &str, layout: RowLayout) -> Result<tessera::Buffer> {
        if !self
            .tensor(name)
            .is_ok_and(|t| tessera::layout::reorders(layout, t.dtype))
        {
            // ggml's rows (q4_K with the repack arithmetic too): the mapped bytes
            return self.weight_buffer(name);
        }
        let b = self
            .interleaved
            .get(name)
            .ok_or_else(|| LlmError::Invalid(format!("weight {name} has no interleaved copy")))?;
        let len = (**b).as_ref().len();
        tessera::Buffer::external(Arc::clone(b), 0, len).map_err(LlmError::from)
    }

    /// The memory of a weight leaf a graph uses: a tensor of the model file or of its LoRA
    /// adapter, mapped (no copy; a 1-D tensor copied by [`Model::with_interleaved_rows`]
    /// from that copy).
    pub fn weight_buffer(&self, name: &str) -> Result<tessera::Buffer> {
        if let Some(lb) = &self.lora {
            if let Some(b) = lb.adapter.buffer(name) {
                return Ok(b);
            }
        }
        if let Some(b) = self.small.get(name) {
            let len = (**b).as_ref().len();
            return tessera::Buffer::external(Arc::clone(b), 0, len).map_err(LlmError::from);
        }
        let t = self.tensor(name)?;
        let (bytes, off) = self.tensor_bytes(t);
        tessera::Buffer::external(bytes, off, t.size).map_err(LlmError::from)
    }

    /// The tensor `name`, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| LlmError::MissingTensor(name.to_string()))
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// Where a tensor's bytes are: the shared map and the absolute offset.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> (ExternalBytes, usize) {
        (Arc::clone(&self.bytes), self.file.data_offset + t.offset)
    }

    /// Checks that every tensor the graph needs exists with the shape it needs.
    fn check_tensors(&self) -> Result<()> {
        let hp = &self.hp;
        let want = |name: &str, ne: &[usize]| -> Result<()> {
            let t = self.tensor(name)?;
            if t.shape() != ne {
                return Err(LlmError::Invalid(format!(
                    "tensor {name} has shape {:?}, the model's hyper-parameters need {ne:?}",
                    t.shape()
                )));
            }
            Ok(())
        };
        let (e, q, kv) = (
            hp.n_embd,
            hp.n_head * hp.head_dim,
            hp.n_head_kv * hp.head_dim,
        );
        want("token_embd.weight", &[e, hp.n_vocab])?;
        for l in 0..hp.n_layer {
            let p = format!("blk.{l}");
            match self.arch {
                Arch::Llama | Arch::Qwen2 => {
                    want(&format!("{p}.attn_norm.weight"), &[e])?;
                    want(&format!("{p}.attn_q.weight"), &[e, q])?;
                    want(&format!("{p}.attn_k.weight"), &[e, kv])?;
                    want(&format!("{p}.attn_v.weight"), &[e, kv])?;
                    want(&format!("{p}.attn_output.weight"), &[q, e])?;
                    want(&format!("{p}.ffn_norm.weight"), &[e])?;
                    want(&format!("{p}.ffn_gate.weight"), &[e, hp.n_ff])?;
                    want(&format!("{p}.ffn_up.weight"), &[e, hp.n_ff])?;
                    want(&format!("{p}.ffn_down.weight"), &[hp.n_ff, e])?;
                }
                Arch::Gpt2 => {
                    want(&format!("{p}.attn_norm.weight"), &[e])?;
                    want(&format!("{p}.attn_norm.bias"), &[e])?;
                    want(&format!("{p}.attn_qkv.weight"), &[e, 3 * e])?;
                    want(&format!("{p}.attn_qkv.bias"), &[3 * e])?;
                    want(&format!("{p}.attn_output.weight"), &[e, e])?;
                    want(&format!("{p}.attn_output.bias"), &[e])?;
                    want(&format!("{p}.ffn_norm.weight"), &[e])?;
                    want(&format!("{p}.ffn_norm.bias"), &[e])?;
                    want(&format!("{p}.ffn_up.weight"), &[e, hp.n_ff])?;
                    want(&format!("{p}.ffn_up.bias"), &[hp.n_ff])?;
                    want(&format!("{p}.ffn_down.weight"), &[hp.n_ff, e])?;
                    want(&format!("{p}.ffn_down.bias"), &[e])?;
                }
            }
        }
        want("output_norm.weight", &[e])?;
        if self.has_tensor("output.weight") {
            want("output.weight", &[e, hp.n_vocab])?;
        }
        if self.arch == Arch::Gpt2 {
            want("position_embd.weight", &[e, hp.n_ctx_train])?;
        }
        Ok(())
    }

    /// Bytes of all weights (the mapped size that matters for memory and bandwidth).
    pub fn weight_bytes(&self) -> usize {
        self.file.tensors.iter().map(|t| t.size).sum()
    }

    /// Number of parameters.
    pub fn n_params(&self) -> usize {
        self.file.tensors.iter().map(|t| t.n_elements()).sum()
    }

    /// A short description of the quantization (the type of most weight bytes).
    pub fn main_type(&self) -> DType {
        let mut by: Vec<(DType, usize)> = Vec::new();
        for t in &self.file.tensors {
            match by.iter_mut().find(|(d, _)| *d == t.dtype) {
                Some(e) => e.1 += t.size,
                None => by.push((t.dtype, t.size)),
            }
        }
        by.into_iter()
            .max_by_key(|&(_, s)| s)
            .map_or(DType::F32, |(d, _)| d)
    }
}
