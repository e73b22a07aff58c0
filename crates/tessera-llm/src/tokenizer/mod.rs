//! Tokenizers read from GGUF metadata (`tokenizer.ggml.*`), behaving like llama.cpp's
//! `llama_vocab` (`src/llama-vocab.cpp`, `src/unicode.cpp`).
//!
//! # Models
//!
//! * `gpt2`: byte-level BPE. The text is split by the pre-tokenizer named by
//!   `tokenizer.ggml.pre`, each word's UTF-8 bytes are mapped to GPT-2's byte alphabet, and the
//!   word is merged by the ranks of `tokenizer.ggml.merges` (see `bpe.rs`). Supported
//!   pre-tokenizers (llama.cpp's names, grouped by the expressions they select):
//!   - `default` (also when the key is missing): `[\p{P}\$\+<=>\^~\|]+`, GPT-2's, `\p{N}+`,
//!     `[0-9][0-9][0-9]`;
//!   - GPT-2's expression alone: `gpt-2`, `phi-2`, `mpt`, `olmo`, `jais`, `exaone4`,
//!     `trillion`, `granite-docling`, `gigachat`, `mellum`, `a.x-4.0`, `jina-es`, `jina-de`,
//!     `jina-v2-es`, `jina-v2-de`;
//!   - `\p{N}` then GPT-2's (every digit alone): `smollm`, `starcoder`, `refact`, `command-r`,
//!     `codeshell`, `exaone`, `minerva-7b`, `mellum2`;
//!   - llama3's (digits in groups of up to 3; whole-word tokens skip merging; BOS added by
//!     default): `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`,
//!     `midm-2.0`, `lfm2`, `jina-v5-nano`; the same expression without those options: `dbrx`,
//!     `smaug-bpe`;
//!   - qwen2's (llama3's with single digits): `qwen2`, `deepseek-r1-qwen`, `kormo`, `f2llmv2`,
//!     `stablelm2`, `hunyuan`, `solar-open`, `megrez`, `grok-2`; `qwen35` (letter runs take
//!     combining marks);
//!   - `falcon`: ``[\p{P}\$\+<=>\^~\|`]+``, GPT-2's, `[0-9][0-9][0-9]`.
//!
//!   The expressions are hand-written splitters equivalent to llama.cpp's (`pretokenize.rs`).
//! * `llama`: SentencePiece-style BPE by token scores (llama.cpp's `llm_tokenizer_spm`): spaces
//!   become `▁`, a space is prepended to the text (and after every special token) when
//!   `add_space_prefix` (default true), and characters no token covers fall back to the byte
//!   tokens `<0xXX>`.
//!
//! Special tokens (token types 3 control and 4 user-defined, and 2 unknown) are cut out of the
//! text first, longest first (llama.cpp's `tokenizer_st_partition`): user-defined ones always,
//! control and unknown ones only with `parse_special`. End-of-generation tokens are collected as
//! llama.cpp does: eos/eot/eom ids, the FIM pad/repo/file-separator tokens, and tokens with texts
//! such as `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, `</s>`.
//!
//! Unicode classes come from tables generated from Python's `unicodedata` (see
//! `dev/gen_unicode_tables.py`; [`UNICODE_VERSION`]).
//!
//! # Differences from llama.cpp
//!
//! * Unicode version: llama.cpp's tables are newer (15.1+) than Python 3.11's 14.0, so the few
//!   thousand code points assigned since 14.0 count as "other" here (they still split as
//!   symbols; only text with those characters can tokenize differently).
//! * Where llama.cpp's choice depends on hash-map iteration order (which token becomes the
//!   auto-detected eot/FIM token when several texts match) the lowest id wins, and special tokens
//!   of equal length are tried in id order (llama.cpp's sort is unstable).
//! * An SPM byte with no `<0xXX>` token (nor a one-byte token) becomes the unknown token (llama.cpp
//!   throws); a byte-level BPE piece character outside GPT-2's byte alphabet decodes as its own
//!   UTF-8 (llama.cpp writes an `[UNK_BYTE_…]` marker).
//! * [`Tokenizer::decode`] concatenates pieces and, like `llama_detokenize`, drops the leading
//!   space of the first piece when `add_space_prefix`; it does not apply llama.cpp's optional
//!   `clean_spaces` rewriting (" ," -> ",", ...).
//! * Tokenizer models `bert`, `t5`, `rwkv`, `plamo2`, `gemma4` and pre-tokenizers other than the
//!   above are rejected with [`TokenizerError::UnsupportedModel`] /
//!   [`TokenizerError::UnsupportedPreTokenizer`].

mod bpe;
mod pretokenize;
mod spm;
mod unicode;
mod unicode_data;

use std::collections::{HashMap, HashSet};

use tessera_gguf::{GgufFile, Value};

use bpe::Merges;
use pretokenize::PreTokenizer;
use unicode::ByteAlphabet;

/// Version of the Unicode Character Database behind the pre-tokenizers' character classes.
pub const UNICODE_VERSION: &str = unicode::UNICODE_VERSION;

/// Tokenizer models (`tokenizer.ggml.model`) that are supported.
pub const SUPPORTED_MODELS: &[&str] = &["gpt2", "llama"];

/// Why a tokenizer could not be read from GGUF metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(String),
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("unsupported tokenizer model `{model}` (supported: {supported})")]
    UnsupportedModel { model: String, supported: String },
    #[error(
        "unsupported pre-tokenizer `{pre}` for tokenizer model `gpt2` (supported: {supported})"
    )]
    UnsupportedPreTokenizer { pre: String, supported: String },
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
}

/// Token attributes (llama.cpp's `llama_token_attr` bits that matter here).
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;

    /// Attribute of a `tokenizer.ggml.token_type` value (llama.cpp's `llama_token_type`).
    pub fn of_type(t: i64) -> u16 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0, // undefined
        }
    }
}

#[derive(Clone, Debug)]
struct TokenData {
    text: String,
    score: f32,
    attr: u16,
}

enum Model {
    /// Byte-level BPE (`gpt2`).
    Bpe {
        pre: PreTokenizer,
        merges: Merges,
        alphabet: &'static ByteAlphabet,
    },
    /// SentencePiece-style (`llama`).
    Spm,
}

/// A piece of the input after special tokens have been cut out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    /// Byte range of the input.
    Text(usize, usize),
    Token(u32),
}

/// A tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata.
pub struct Tokenizer {
    model: Model,
    model_name: String,
    pre_name: Option<String>,
    tokens: Vec<TokenData>,
    token_to_id: HashMap<String, u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    special_tokens: Vec<u32>,
    eog: HashSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_name)
            .field("pre", &self.pre_name)
            .field("n_vocab", &self.tokens.len())
            .field(
                "n_merges",
                &match &self.model {
                    Model::Bpe { merges, .. } => merges.len(),
                    Model::Spm => 0,
                },
            )
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish()
    }
}

// Texts that llama.cpp recognises (llama-vocab.cpp, `llama_vocab::impl::load`).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// Typed access to GGUF metadata with errors naming the key.
struct Meta<'f>(&'f GgufFile);

impl<'f> Meta<'f> {
    fn wrong(key: &str, expected: &'static str, v: &Value) -> TokenizerError {
        TokenizerError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_description(),
        }
    }
    fn str(&self, key: &str) -> Result<Option<&'f str>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "string", v)),
        }
    }
    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "bool", v)),
        }
    }
    /// A token id: any non-negative integer. (-1, as some converters write for "none", reads
    /// as absent.)
    fn id(&self, key: &str) -> Result<Option<u64>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => match (v.as_u64(), v.as_i64()) {
                (Some(x), _) => Ok(Some(x)),
                (None, Some(x)) if x < 0 => Ok(None),
                _ => Err(Self::wrong(key, "integer", v)),
            },
        }
    }
    fn array(&self, key: &str) -> Result<Option<&'f [Value]>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "array", v)),
        }
    }
    fn strings(&self, key: &str) -> Result<Option<Vec<&'f str>>, TokenizerError> {
        let Some(arr) = self.array(key)? else {
            return Ok(None);
        };
        let v = self.0.get(key).expect("present");
        arr.iter()
            .map(|x| {
                x.as_str()
                    .ok_or_else(|| Self::wrong(key, "array of strings", v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by `f`'s `tokenizer.ggml.*` metadata: `model` (`gpt2` or
    /// `llama`), `pre`, `tokens`, `token_type`, `merges` (gpt2), `scores` (llama), the special
    /// token ids (`bos_token_id`, `eos_token_id`, `eot_token_id`, `eom_token_id`,
    /// `unknown_token_id`, `padding_token_id`, FIM ids) and `add_bos_token`, `add_eos_token`,
    /// `add_space_prefix`, with llama.cpp's defaults for what is missing.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let meta = Meta(f);
        let model_name = meta
            .str(KEY_MODEL)?
            .ok_or_else(|| TokenizerError::MissingKey(KEY_MODEL.into()))?;
        let pre_name = meta.str(KEY_PRE)?;
        let is_bpe = match model_name {
            "gpt2" => true,
            "llama" => false,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_string(),
                    supported: SUPPORTED_MODELS.join(", "),
                })
            }
        };
        let pre = if is_bpe {
            Some(PreTokenizer::by_name(pre_name).ok_or_else(|| {
                TokenizerError::UnsupportedPreTokenizer {
                    pre: pre_name.unwrap_or_default().to_string(),
                    supported: PreTokenizer::supported_names(),
                }
            })?)
        } else {
            None
        };

        // Vocabulary.
        let texts = meta
            .strings(KEY_TOKENS)?
            .ok_or_else(|| TokenizerError::MissingKey(KEY_TOKENS.into()))?;
        let n = texts.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::Invalid(format!(
                "{KEY_TOKENS} has {n} tokens"
            )));
        }
        let scores: Option<Vec<f32>> = match meta.array(KEY_SCORES)? {
            None => None,
            Some(arr) => {
                if arr.len() < n {
                    return Err(TokenizerError::Invalid(format!(
                        "{KEY_SCORES} has {} entries for {n} tokens",
                        arr.len()
                    )));
                }
                let v = f.get(KEY_SCORES).expect("present");
                Some(
                    arr[..n]
                        .iter()
                        .map(|x| {
                            x.as_f64()
                                .map(|s| s as f32)
                                .ok_or_else(|| Meta::wrong(KEY_SCORES, "array of numbers", v))
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
        };
        let types: Option<Vec<i64>> = match meta.array(KEY_TOKEN_TYPE)? {
            None => None,
            Some(arr) => {
                if arr.len() < n {
                    return Err(TokenizerError::Invalid(format!(
                        "{KEY_TOKEN_TYPE} has {} entries for {n} tokens",
                        arr.len()
                    )));
                }
                let v = f.get(KEY_TOKEN_TYPE).expect("present");
                Some(
                    arr[..n]
                        .iter()
                        .map(|x| {
                            x.as_i64()
                                .ok_or_else(|| Meta::wrong(KEY_TOKEN_TYPE, "array of integers", v))
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
        };
        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, &t) in texts.iter().enumerate() {
            // llama.cpp renames empty tokens so that each text is unique.
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.to_string()
            };
            if let Some(prev) = token_to_id.insert(text.clone(), i as u32) {
                return Err(TokenizerError::Invalid(format!(
                    "duplicate token in vocabulary: {text:?} has ids {prev} and {i}"
                )));
            }
            tokens.push(TokenData {
                text,
                score: scores.as_ref().map_or(0.0, |s| s[i]),
                attr: types.as_ref().map_or(attr::NORMAL, |t| attr::of_type(t[i])),
            });
        }

        let model = match pre {
            Some(pre) => {
                let rules = meta
                    .strings(KEY_MERGES)?
                    .ok_or_else(|| TokenizerError::MissingKey(KEY_MERGES.into()))?;
                Model::Bpe {
                    pre,
                    merges: Merges::new(rules.into_iter(), &token_to_id, n),
                    alphabet: ByteAlphabet::get(),
                }
            }
            None => Model::Spm,
        };

        // Special token ids: llama.cpp's per-model defaults (disabled when out of range), then
        // the metadata (ignored when out of range).
        let in_range = |id: Option<u64>| id.filter(|&x| (x as usize) < n).map(|x| x as u32);
        let (mut bos, mut eos, mut unk) = if is_bpe {
            (in_range(Some(11)), in_range(Some(11)), None)
        } else {
            (in_range(Some(1)), in_range(Some(2)), in_range(Some(0)))
        };
        let (mut eot, mut eom, mut pad) = (None, None, None);
        let (mut fim_pre, mut fim_suf, mut fim_mid) = (None, None, None);
        let (mut fim_pad, mut fim_rep, mut fim_sep) = (None, None, None);
        for (key, slot) in [
            ("tokenizer.ggml.bos_token_id", &mut bos),
            ("tokenizer.ggml.eos_token_id", &mut eos),
            ("tokenizer.ggml.eot_token_id", &mut eot),
            ("tokenizer.ggml.eom_token_id", &mut eom),
            ("tokenizer.ggml.unknown_token_id", &mut unk),
            ("tokenizer.ggml.padding_token_id", &mut pad),
            ("tokenizer.ggml.fim_pre_token_id", &mut fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", &mut fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", &mut fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", &mut fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", &mut fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", &mut fim_sep),
        ] {
            if let Some(id) = in_range(meta.id(key)?) {
                *slot = Some(id);
            }
        }
        // Deprecated names of the first three FIM ids.
        for (key, slot) in [
            ("tokenizer.ggml.prefix_token_id", &mut fim_pre),
            ("tokenizer.ggml.suffix_token_id", &mut fim_suf),
            ("tokenizer.ggml.middle_token_id", &mut fim_mid),
        ] {
            if let Some(id) = in_range(meta.id(key)?) {
                *slot = Some(id);
            }
        }

        let default_add_bos = match &model {
            Model::Bpe { pre, .. } => pre.add_bos,
            Model::Spm => true,
        };
        let add_bos = meta
            .bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(default_add_bos);
        let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let add_space_prefix = meta
            .bool("tokenizer.ggml.add_space_prefix")?
            .unwrap_or(!is_bpe);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::Invalid(
                "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"
                    .into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::Invalid(
                "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set"
                    .into(),
            ));
        }

        // Auto-detect eot, eom and FIM tokens by text (lowest id first); they become control.
        let find = |list: &[&str]| -> Option<u32> {
            list.iter()
                .filter_map(|t| token_to_id.get(*t).copied())
                .min()
        };
        for (slot, list) in [
            (&mut eot, EOT_TEXTS),
            (&mut eom, EOM_TEXTS),
            (&mut fim_pre, FIM_PRE_TEXTS),
            (&mut fim_suf, FIM_SUF_TEXTS),
            (&mut fim_mid, FIM_MID_TEXTS),
            (&mut fim_pad, FIM_PAD_TEXTS),
            (&mut fim_rep, FIM_REP_TEXTS),
            (&mut fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                if let Some(id) = find(list) {
                    *slot = Some(id);
                    tokens[id as usize].attr |= attr::CONTROL;
                }
            }
        }

        // End-of-generation tokens.
        let mut eog: HashSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for text in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*text) {
                eog.insert(id);
                tokens[id as usize].attr |= attr::CONTROL;
            }
        }
        // gpt-oss: always rendered.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(text) {
                tokens[id as usize].attr = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        let eog_with = |eog: &HashSet<u32>, text: &str| {
            token_to_id.get(text).copied().filter(|id| eog.contains(id))
        };
        // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        let has = |eog: &HashSet<u32>, t: &str| eog_with(eog, t).is_some();
        if let Some(end) = eog_with(&eog, "<|end|>") {
            let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
            if call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
                eog.remove(&end);
                tokens[end as usize].attr = attr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is a normal token.
        if let Some(s) = eog_with(&eog, "</s>") {
            if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
                eog.remove(&s);
                tokens[s as usize].attr = attr::NORMAL;
            }
        }

        // Special tokens, longest first (ties in id order).
        let mut special_tokens: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                tokens[id as usize].attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_tokens.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].text.len()));

        // Per-model strip attributes (llama.cpp sets these by model / pre-tokenizer name).
        let general_name = meta.str("general.name").ok().flatten().unwrap_or("");
        let general_name = general_name.to_lowercase();
        let pre_raw = pre_name.unwrap_or("");
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre_raw.contains(p))
        {
            if let Some(&id) = token_to_id.get("<mask>") {
                tokens[id as usize].attr |= attr::LSTRIP;
            }
        } else if general_name.contains("phi-3") || general_name.contains("phi3") {
            for &id in &special_tokens {
                tokens[id as usize].attr |= attr::RSTRIP;
            }
            if let Some(&id) = token_to_id.get("</s>") {
                tokens[id as usize].attr |= attr::RSTRIP;
            }
            for text in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = token_to_id.get(text) {
                    tokens[id as usize].attr &= !attr::RSTRIP;
                }
            }
        }

        Ok(Tokenizer {
            model,
            model_name: model_name.to_string(),
            pre_name: pre_name.map(str::to_string),
            tokens,
            token_to_id,
            special_tokens,
            eog,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
        })
    }

    /// Tokenizes `text` like `llama_tokenize(vocab, text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS where the model asks for them (`add_bos`, `add_eos`);
    /// `parse_special` lets control tokens written in the text (`<|im_start|>`, ...) be
    /// recognised (user-defined tokens always are).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let fragments = self.partition(text, parse_special);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[a..b]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::encode(
                                &escaped,
                                &self.token_to_id,
                                |id| self.tokens[id as usize].score,
                                |b| self.spm_byte_token(b),
                                &mut out,
                            );
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe {
                pre,
                merges,
                alphabet,
            } => {
                let mut word = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Text(a, b) => {
                            for w in pre.split(&text[a..b]) {
                                alphabet.encode(w, &mut word);
                                merges.encode_word(
                                    &word,
                                    &self.token_to_id,
                                    pre.ignore_merges,
                                    &mut out,
                                );
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// SPM's token for a byte no token covers: `<0xXX>`, else the byte as a one-character
    /// token, else the unknown token.
    fn spm_byte_token(&self, b: u8) -> Option<u32> {
        self.token_to_id
            .get(&format!("<0x{b:02X}>"))
            .copied()
            .or_else(|| {
                if b.is_ascii() {
                    self.token_to_id.get(&(b as char).to_string()).copied()
                } else {
                    None
                }
            })
            .or(self.unk)
    }

    /// Cuts the special tokens out of `text` (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let bytes = text.as_bytes();
        // C's isspace in the "C" locale, as llama.cpp strips with.
        let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r');
        for &id in &self.special_tokens {
            let tok = &self.tokens[id as usize];
            if !parse_special && tok.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = tok.text.as_str();
            let found = frags
                .iter()
                .any(|f| matches!(*f, Fragment::Text(a, b) if text[a..b].contains(needle)));
            if !found {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut a, b) = frag else {
                    next.push(frag);
                    continue;
                };
                loop {
                    let Some(rel) = text[a..b].find(needle) else {
                        if a < b {
                            next.push(Fragment::Text(a, b));
                        }
                        break;
                    };
                    let m = a + rel;
                    let mut left_end = m;
                    if tok.attr & attr::LSTRIP != 0 {
                        while left_end > a && is_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > a {
                        next.push(Fragment::Text(a, left_end));
                    }
                    next.push(Fragment::Token(id));
                    let mut r = m + needle.len();
                    if r >= b {
                        break;
                    }
                    if tok.attr & attr::RSTRIP != 0 {
                        while r < b && is_space(bytes[r]) {
                            r += 1;
                        }
                    }
                    a = r;
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes of one token's piece, with special tokens rendered as their text: byte-level
    /// BPE pieces map back to raw bytes, SPM pieces turn `▁` into spaces, byte tokens `<0xXX>`
    /// give their byte. Unused and undefined tokens (and ids out of range) give nothing.
    pub fn decode_token(&self, id: u32) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        if t.attr & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return t.text.as_bytes().to_vec();
        }
        if t.attr & attr::NORMAL != 0 {
            return match &self.model {
                Model::Spm => t.text.replace('\u{2581}', " ").into_bytes(),
                Model::Bpe { alphabet, .. } => {
                    let mut out = Vec::with_capacity(t.text.len());
                    for c in t.text.chars() {
                        match alphabet.byte_of(c) {
                            Some(b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                }
            };
        }
        if t.attr & attr::BYTE != 0 {
            let hex = t.text.get(3..5).unwrap_or("");
            return vec![u8::from_str_radix(hex, 16).unwrap_or(0)];
        }
        Vec::new()
    }

    /// The text of `ids` (lossy UTF-8 of the concatenated pieces, special tokens as their text),
    /// like `llama_detokenize(.., remove_special = false, unparse_special = true)`: with
    /// `add_space_prefix` the first piece loses one leading space. llama.cpp's `clean_spaces`
    /// rewriting is not applied.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let piece = self.decode_token(id);
            let piece = if remove_space && piece.first() == Some(&b' ') {
                &piece[1..]
            } else {
                &piece[..]
            };
            remove_space = false;
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from metadata or recognised by text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token.
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `id` ends generation (eos, eot, eom, FIM pad/repo/separator tokens, and the
    /// tokens llama.cpp recognises by text, such as `<|im_end|>` and `<|endoftext|>`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation tokens, sorted.
    pub fn eog_tokens(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// The vocabulary text of `id` (as stored: byte-level BPE texts are in GPT-2's byte
    /// alphabet, SPM texts use `▁`); empty for ids out of range.
    pub fn token_text(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map_or("", |t| t.text.as_str())
    }

    /// The id of the token whose vocabulary text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SPM prepends a space to the text.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// `tokenizer.ggml.model`.
    pub fn model(&self) -> &str {
        &self.model_name
    }

    /// `tokenizer.ggml.pre`, if present.
    pub fn pre(&self) -> Option<&str> {
        self.pre_name.as_deref()
    }

    /// Whether `id` is a special token (control, user-defined or unknown type).
    pub fn is_special(&self, id: u32) -> bool {
        self.tokens
            .get(id as usize)
            .is_some_and(|t| t.attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gguf::{GgufWriter, ValueType};

    fn strings(v: &[&str]) -> Value {
        Value::Array(
            ValueType::String,
            v.iter().map(|s| Value::String(s.to_string())).collect(),
        )
    }

    fn file(kvs: Vec<(&str, Value)>) -> GgufFile {
        let mut w = GgufWriter::new();
        for (k, v) in kvs {
            w.add_kv(k, v);
        }
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    /// A tiny byte-level vocabulary: the 256 byte characters, a few merges, two specials.
    fn tiny_bpe(pre: &str) -> GgufFile {
        let alphabet = ByteAlphabet::new();
        let mut toks: Vec<String> = (0..=255u8)
            .map(|b| alphabet.char_of(b).to_string())
            .collect();
        let mut types = vec![1i32; 256];
        for t in ["he", "ll", "hell", "hello", "Ġw", "Ġwor", "Ġworld"] {
            toks.push(t.into());
            types.push(1);
        }
        for t in ["<|im_start|>", "<|im_end|>"] {
            toks.push(t.into());
            types.push(3);
        }
        let tok_refs: Vec<&str> = toks.iter().map(String::as_str).collect();
        file(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String(pre.into())),
            ("tokenizer.ggml.tokens", strings(&tok_refs)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
            ),
            (
                "tokenizer.ggml.merges",
                strings(&[
                    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d",
                ]),
            ),
            ("tokenizer.ggml.eos_token_id", Value::U32(264)),
        ])
    }

    #[test]
    fn tiny_bpe_encodes_and_decodes() {
        let t = Tokenizer::from_gguf(&tiny_bpe("gpt-2")).unwrap();
        assert_eq!(t.n_vocab(), 265);
        let hello = t.token_id("hello").unwrap();
        let world = t.token_id("Ġworld").unwrap();
        assert_eq!(t.encode("hello world", false, false), [hello, world]);
        // "Ġworl" is not a token: the merge happens, then falls back to its one-byte tokens
        // where they exist ('Ġ' is two bytes and is dropped, as in llama.cpp)
        assert_eq!(
            t.decode(&t.encode("hello world", true, false)),
            "hello world"
        );
        // control tokens only with parse_special
        let im_end = t.token_id("<|im_end|>").unwrap();
        assert_eq!(t.encode("<|im_end|>", false, true), [im_end]);
        assert_ne!(t.encode("<|im_end|>", false, false), [im_end]);
        assert_eq!(t.decode(&[im_end]), "<|im_end|>");
        assert!(t.is_eog(im_end));
        assert_eq!(t.eos(), Some(264));
        // BPE default bos id (11) when the key is missing, as llama.cpp
        assert_eq!(t.bos(), Some(11));
        assert!(!t.add_bos());
        assert_eq!(t.decode_token(t.token_id("Ċ").unwrap()), b"\n");
    }

    #[test]
    fn errors_name_keys_and_supported_lists() {
        let e = Tokenizer::from_gguf(&file(vec![])).unwrap_err();
        assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");
        let e = Tokenizer::from_gguf(&file(vec![(
            "tokenizer.ggml.model",
            Value::String("rwkv".into()),
        )]))
        .unwrap_err();
        assert!(
            e.to_string().contains("rwkv") && e.to_string().contains("gpt2, llama"),
            "{e}"
        );
        let e = Tokenizer::from_gguf(&tiny_bpe("deepseek-coder")).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("deepseek-coder") && s.contains("llama-bpe") && s.contains("qwen2"),
            "{s}"
        );
        let e = Tokenizer::from_gguf(&file(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("gpt-2".into())),
            ("tokenizer.ggml.tokens", strings(&["a", "b"])),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("tokenizer.ggml.merges"), "{e}");
    }

    #[test]
    fn partition_strips_and_splits() {
        let mut t = Tokenizer::from_gguf(&tiny_bpe("gpt-2")).unwrap();
        let start = t.token_id("<|im_start|>").unwrap();
        let end = t.token_id("<|im_end|>").unwrap();
        let s = "a<|im_start|> b<|im_end|><|im_end|>c";
        assert_eq!(
            t.partition(s, true),
            [
                Fragment::Text(0, 1),
                Fragment::Token(start),
                Fragment::Text(13, 15),
                Fragment::Token(end),
                Fragment::Token(end),
                Fragment::Text(35, 36),
            ]
        );
        t.tokens[start as usize].attr |= attr::RSTRIP;
        t.tokens[end as usize].attr |= attr::LSTRIP;
        let s = "a <|im_start|>  b \n<|im_end|>";
        assert_eq!(
            t.partition(s, true),
            [
                Fragment::Text(0, 2),
                Fragment::Token(start),
                Fragment::Text(16, 17),
                Fragment::Token(end),
            ]
        );
        assert_eq!(t.partition(s, false), [Fragment::Text(0, s.len())]);
    }
}
