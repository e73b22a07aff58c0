//! `tessera finetune`: LoRA (or full, or embedding-only) fine-tuning of a GGUF model directly on
//! its weights — quantized ones stay quantized and memory-mapped — and `tessera export-lora`,
//! which merges an adapter into its base model.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tessera::{Graph, TensorId};
use tessera_gguf::{GgufFile, Value};
use tessera_llm::chat::{self, Message};
use tessera_llm::lora::{self, LoraConfig, Trainable};
use tessera_llm::Model;
use tessera_train::dataset::NO_LABEL;
use tessera_train::{Dataset, EpochStats, Optimizer, Progress, Schedule, TrainConfig, Trainer};

#[derive(Args, Debug, Clone)]
pub struct FinetuneArgs {
    /// The base model (default: SmolLM2-135M-Instruct Q4_1).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Training data: plain text, or JSONL chat records {"messages": [...]} (loss on the
    /// assistant's tokens only) when the file ends in .jsonl.
    #[arg(long)]
    pub data: PathBuf,
    #[arg(long = "lora-rank", default_value_t = 8)]
    pub rank: usize,
    #[arg(long = "lora-alpha", default_value_t = 16.0)]
    pub alpha: f32,
    /// Weights to adapt, comma separated: q,k,v,o,gate,up,down.
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    pub targets: Vec<String>,
    /// Train every weight (f32/f16/bf16 models) instead of LoRA adapters.
    #[arg(long)]
    pub full: bool,
    /// Train only the token embedding.
    #[arg(long = "train-embeddings", conflicts_with = "full")]
    pub embeddings_only: bool,
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    #[arg(long)]
    pub max_steps: Option<u64>,
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    #[arg(short = 'c', long = "ctx", default_value_t = 128)]
    pub ctx: usize,
    #[arg(short = 'b', long = "batch", default_value_t = 4)]
    pub batch: usize,
    #[arg(long = "grad-accum", default_value_t = 1)]
    pub grad_accum: usize,
    #[arg(long, default_value_t = 0.1)]
    pub val: f32,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output: the adapter (LoRA) or the model (full / embeddings); the optimizer state goes
    /// beside it as OUT.train.gguf.
    #[arg(short = 'o', long = "output", default_value = "adapter.gguf")]
    pub output: PathBuf,
    #[arg(long)]
    pub resume: bool,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ExportLoraArgs {
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    #[arg(long)]
    pub lora: PathBuf,
    /// Scale of the adapter.
    #[arg(long = "lora-scale", default_value_t = 1.0)]
    pub scale: f32,
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Quantize merged weights back to their own type (default: f16, like llama.cpp's
    /// export-lora).
    #[arg(long = "keep-type")]
    pub keep_type: bool,
}

fn model_path(p: &Option<PathBuf>) -> Result<PathBuf, String> {
    match p {
        Some(p) => Ok(p.clone()),
        None => tessera_llm::fetch::default_model(),
    }
}

/// Plain text: the model's tokens, every one a target.
fn text_tokens(model: &Model, text: &str) -> (Vec<u32>, Vec<u32>) {
    let toks = model.tokenizer.encode(text, true, false);
    (toks.clone(), toks)
}

/// JSONL chats rendered with the model's template; targets only inside assistant replies.
fn chat_tokens(model: &Model, text: &str) -> Result<(Vec<u32>, Vec<u32>), String> {
    let (mut toks, mut targets) = (Vec::new(), Vec::new());
    for (ln, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", ln + 1))?;
        let msgs = v["messages"]
            .as_array()
            .ok_or(format!("line {}: no \"messages\" array", ln + 1))?;
        let mut messages = Vec::new();
        for m in msgs {
            let role = m["role"]
                .as_str()
                .ok_or(format!("line {}: a message without a role", ln + 1))?;
            let content = m["content"]
                .as_str()
                .ok_or(format!("line {}: a message without content", ln + 1))?;
            messages.push(Message::new(role, content));
        }
        let full = chat::apply(model, &messages, false).map_err(|e| e.to_string())?;
        // byte ranges of the assistant replies, from renders of growing prefixes
        let mut ranges = Vec::new();
        for i in 0..messages.len() {
            if messages[i].role != "assistant" {
                continue;
            }
            let before = chat::apply(model, &messages[..i], true).map_err(|e| e.to_string())?;
            let upto = chat::apply(model, &messages[..=i], false).map_err(|e| e.to_string())?;
            if full.starts_with(&before) && full.starts_with(&upto) {
                ranges.push((before.len(), upto.len()));
            }
        }
        let ids = model.tokenizer.encode(&full, true, true);
        let mut pos = 0usize;
        for &id in &ids {
            let len = model.tokenizer.decode_token(id).len();
            let inside = ranges.iter().any(|&(a, b)| pos >= a && pos < b);
            toks.push(id);
            targets.push(if inside { id } else { NO_LABEL });
            pos += len;
        }
    }
    if targets.iter().all(|&t| t == NO_LABEL) {
        return Err("the chat data has no assistant replies to learn".into());
    }
    Ok((toks, targets))
}

fn state_path(out: &Path) -> PathBuf {
    Dataset::state_path(out)
}

fn save(t: &mut Trainer, model: &Model, what: &Trainable, out: &Path) -> Result<(), String> {
    let names = t.param_names().to_vec();
    match what {
        Trainable::Lora { cfg, .. } => {
            let mut tensors = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let ne = t.param_shape(i);
                tensors.push((
                    n.clone(),
                    ne[..tessera::shape::n_dims(&ne)].to_vec(),
                    t.get_param(n).map_err(|e| e.to_string())?,
                ));
            }
            lora::write_adapter(out, model, cfg.alpha, &tensors).map_err(|e| e.to_string())?;
        }
        _ => {
            // the whole model with the trained weights in f32
            let mut w =
                tessera_gguf::GgufWriter::from_gguf(&model.file).map_err(|e| e.to_string())?;
            for (i, n) in names.iter().enumerate() {
                let ne = t.param_shape(i);
                let v = t.get_param(n).map_err(|e| e.to_string())?;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                w.replace_tensor(
                    n,
                    tessera::DType::F32,
                    &ne[..tessera::shape::n_dims(&ne)],
                    &bytes,
                )
                .map_err(|e| e.to_string())?;
            }
            w.write_file(out)
                .map_err(|e| format!("{}: {e}", out.display()))?;
        }
    }
    let mut sw = t.state_writer(false).map_err(|e| e.to_string())?;
    sw.add_kv("training.finetune.ctx", Value::U64(t.config().batch as u64));
    sw.write_file(state_path(out)).map_err(|e| e.to_string())
}

pub fn finetune(a: &FinetuneArgs) -> Result<(), String> {
    let path = model_path(&a.model)?;
    let model = Arc::new(Model::load(&path).map_err(|e| e.to_string())?);
    let text =
        std::fs::read_to_string(&a.data).map_err(|e| format!("{}: {e}", a.data.display()))?;
    let (toks, targets) = if a.data.extension().is_some_and(|e| e == "jsonl") {
        chat_tokens(&model, &text)?
    } else {
        text_tokens(&model, &text)
    };
    let n_vocab = model.hp.n_vocab;
    let data =
        Dataset::next_token_targets(&toks, &targets, a.ctx, n_vocab).map_err(|e| e.to_string())?;
    let what = if a.full {
        Trainable::Full
    } else if a.embeddings_only {
        Trainable::TokenEmbedding
    } else {
        let weights = lora::target_weights(&model, &a.targets).map_err(|e| e.to_string())?;
        Trainable::Lora {
            cfg: LoraConfig {
                rank: a.rank,
                alpha: a.alpha,
                targets: a.targets.clone(),
            },
            weights,
        }
    };
    if a.full {
        if let Some(t) = model.file.tensors.iter().find(|t| t.dtype.is_quantized()) {
            return Err(format!(
                "--full trains every weight in f32 and needs an f32/f16/bf16 model; {} is {} (use LoRA, the default)",
                t.name, t.dtype
            ));
        }
    }
    let n_train = data.len() - tessera_train::dataset::split(data.len(), a.val).1.len();
    let batches = n_train / a.batch.max(1);
    let total = a
        .max_steps
        .unwrap_or((batches / a.grad_accum.max(1)).max(1) as u64 * a.epochs);
    let tc = TrainConfig {
        batch: a.batch,
        grad_accum: a.grad_accum,
        optimizer: Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        schedule: Schedule {
            lr: a.lr,
            min_lr: a.lr * 0.1,
            warmup: (total / 10).min(20),
            total,
        },
        clip: Some(1.0),
        seed: a.seed,
        val_frac: a.val,
        threads: a.threads.unwrap_or_else(tessera_cpu::default_threads),
    };
    let (m2, w2) = (Arc::clone(&model), what.clone());
    let build = move |g: &mut Graph, inp: TensorId, b: usize| -> tessera::Result<TensorId> {
        lora::build_train_forward(&m2, g, inp, b, &w2).map_err(|e| match e {
            tessera_llm::LlmError::Graph(g) => g,
            other => tessera::Error::Invalid(other.to_string()),
        })
    };
    let m3 = Arc::clone(&model);
    let mut t = Trainer::with_leaves(
        &build,
        &data,
        tc.clone(),
        Box::new(move |name, tt| lora::leaf_buffer(&m3, name, tt)),
    )
    .map_err(|e| e.to_string())?;
    if a.resume {
        let st = GgufFile::open(state_path(&a.output)).map_err(|e| format!("--resume: {e}"))?;
        let params = GgufFile::open(&a.output).map_err(|e| format!("--resume: {e}"))?;
        t.load_state(&params, Some(&st))
            .map_err(|e| e.to_string())?;
    } else {
        for (i, name) in t.param_names().to_vec().iter().enumerate() {
            let v = match &what {
                Trainable::Lora { .. } => lora::init_lora(name, t.param_shape(i), a.seed),
                _ => lora::weight_f32(&model, name).map_err(|e| e.to_string())?,
            };
            t.set_param(name, &v).map_err(|e| e.to_string())?;
        }
    }
    let n_trained: usize = t.n_params();
    eprintln!(
        "tessera finetune: {} ({} {}, {:.0} MB mapped); {}: {:.2} M trained params; {} tokens → {} samples of {} ({} held out); batch {}×{}, {} threads, {} steps{}",
        path.display(),
        model.arch.name(),
        model.main_type(),
        model.weight_bytes() as f64 / 1e6,
        match &what {
            Trainable::Lora { cfg, weights } => format!("LoRA rank {} alpha {} on {} weights", cfg.rank, cfg.alpha, weights.len()),
            Trainable::Full => "full fine-tuning".into(),
            Trainable::TokenEmbedding => "token embedding only".into(),
        },
        n_trained as f64 / 1e6,
        toks.len(),
        data.len(),
        a.ctx,
        data.len() - n_train,
        a.batch,
        a.grad_accum,
        tc.threads,
        total,
        if a.resume { format!("; resuming at step {}", t.pos.step) } else { String::new() }
    );
    let (arena, owned, mapped) = t.memory();
    eprintln!(
        "tessera finetune: memory: {:.0} MB mapped weights (no copy), {:.0} MB owned (trained params, gradients, moments, the batch's tokens and one-hot labels in the training and evaluation graphs), {:.0} MB activations",
        mapped as f64 / 1e6,
        owned as f64 / 1e6,
        arena as f64 / 1e6
    );
    let slow = t.fallback_ops();
    if !slow.is_empty() {
        let list: Vec<String> = slow.iter().map(|(k, n)| format!("{k}×{n}")).collect();
        eprintln!(
            "tessera finetune: on the reference fallback (no fast kernel yet): {}",
            list.join(", ")
        );
    }
    let bar = if a.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(batches as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "epoch {prefix} {bar:30} {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
        )
        .map_err(|e| e.to_string())?,
    );
    bar.set_prefix(format!("{}", t.pos.epoch + 1));
    let start = Instant::now();
    let mut rows = 0u64;
    let mut losses: Vec<f32> = Vec::new();
    let max_steps = a.max_steps;
    let mut save_err = None;
    let out = a.output.clone();
    let (m4, w4) = (Arc::clone(&model), what.clone());
    t.fit(
        &data,
        a.epochs,
        &mut |p: &Progress| {
            rows += (a.batch * a.ctx) as u64;
            losses.push(p.loss);
            bar.set_position(p.batch as u64);
            bar.set_message(format!(
                "loss {:.3}  lr {:.2e}  {:.0} tok/s",
                p.loss, p.lr, p.rows_per_s
            ));
            max_steps.is_none_or(|m| p.step < m)
        },
        &mut |e: &EpochStats, tr: &mut Trainer| {
            let line = format!(
                "epoch {}: train loss {:.4}, validation loss {} , {:.0} tok/s",
                e.epoch + 1,
                e.train_loss,
                e.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
                e.rows as f64 / e.seconds
            );
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            if let Err(err) = save(tr, &m4, &w4, &out) {
                save_err = Some(err);
                return false;
            }
            true
        },
    )
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    if let Some(e) = save_err {
        return Err(e);
    }
    save(&mut t, &model, &what, &a.output)?;
    let secs = start.elapsed().as_secs_f64();
    if losses.len() >= 4 {
        let k = (losses.len() / 4).max(1);
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        eprintln!(
            "tessera finetune: training loss {:.4} over the first {k} batches, {:.4} over the last {k}",
            mean(&losses[..k]),
            mean(&losses[losses.len() - k..])
        );
    }
    eprintln!(
        "tessera finetune: {} steps in {:.1} s ({:.0} tokens/s); wrote {}",
        t.pos.step,
        secs,
        rows as f64 / secs,
        a.output.display()
    );
    if tessera_cpu::exec::profile::enabled() {
        eprint!("{}", tessera_cpu::exec::profile::report());
    }
    Ok(())
}

pub fn export_lora(a: &ExportLoraArgs) -> Result<(), String> {
    let model = Model::load(&a.model).map_err(|e| e.to_string())?;
    let adapter = lora::Adapter::load(&a.lora, &model).map_err(|e| e.to_string())?;
    lora::merge(&model, &adapter, a.scale, a.keep_type, &a.output).map_err(|e| e.to_string())?;
    eprintln!(
        "tessera export-lora: merged {} adapted weights into {}",
        adapter.pairs.len(),
        a.output.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chat records: only the assistant's reply (and its end-of-turn) is a target; the system
    /// and user turns and the template around them are context only.
    #[test]
    fn chat_records_target_the_assistant_tokens_only() {
        let Some(path) = tessera_llm::fetch::model_for_tests() else {
            return;
        };
        let model = Model::load(&path).unwrap();
        let jsonl = concat!(
            r#"{"messages":[{"role":"system","content":"Speak like a sailor."},"#,
            r#"{"role":"user","content":"Who goes there?"},"#,
            r#"{"role":"assistant","content":"Ahoy, a friend of the crown!"}]}"#,
            "\n\n",
            r#"{"messages":[{"role":"user","content":"And the weather?"},"#,
            r#"{"role":"assistant","content":"Fair winds, matey."}]}"#,
            "\n"
        );
        let (toks, targets) = chat_tokens(&model, jsonl).unwrap();
        assert_eq!(toks.len(), targets.len());
        let picked: Vec<u32> = targets.iter().copied().filter(|&t| t != NO_LABEL).collect();
        let text: String = picked
            .iter()
            .map(|&t| String::from_utf8_lossy(&model.tokenizer.decode_token(t)).into_owned())
            .collect();
        assert!(
            text.contains("Ahoy, a friend of the crown!") && text.contains("Fair winds, matey."),
            "{text}"
        );
        assert!(
            !text.contains("Who goes there")
                && !text.contains("sailor")
                && !text.contains("weather"),
            "{text}"
        );
        // the targets are the very tokens at those positions
        for (t, g) in toks.iter().zip(&targets) {
            assert!(*g == NO_LABEL || g == t);
        }
        // bad records are named by line
        let e = chat_tokens(&model, "{\"messages\": 3}\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = chat_tokens(
            &model,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n",
        )
        .unwrap_err();
        assert!(e.contains("no assistant"), "{e}");
    }
}
