//! The LLM commands: run, chat, tokenize, perplexity, bench.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera::DType;
use tessera_llm::chat::{self, Message};
use tessera_llm::{Context, ContextParams, LlmError, Model, Sampler, SamplerParams};

pub type CmdResult = Result<(), String>;

/// Options shared by the commands that load a model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model (default: SmolLM2-135M-Instruct Q4_1, fetched once with pip).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Threads (default: all cores). `bench` takes a comma-separated list.
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Context size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Largest batch of prompt tokens per step.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Type of the KV cache: f16 (llama.cpp's default) or f32.
    #[arg(long = "cache-type", default_value = "f16")]
    pub cache_type: String,
    /// Attention arithmetic: `ggml` (ggml's CPU algorithm, f16 rounding: matches llama.cpp token
    /// for token) or `f32` (more precise).
    #[arg(long = "attn-precision", default_value = "ggml")]
    pub attn_precision: String,
    /// A LoRA adapter (llama.cpp's format, e.g. from `tessera finetune`) to apply.
    #[arg(long = "lora")]
    pub lora: Option<PathBuf>,
    /// Scale of the LoRA adapter.
    #[arg(long = "lora-scale", default_value_t = 1.0)]
    pub lora_scale: f32,
    /// Keep every weight mapped from the file in ggml's layout. By default, on AMD CPUs with
    /// AVX-512 VNNI, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K and q5_K weights are
    /// copied once into rows interleaved by eight, which their mat-vec streams faster there
    /// (see the README).
    #[arg(long = "no-interleave", conflicts_with = "interleave")]
    pub no_interleave: bool,
    /// Interleave q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K, q5_K and q6_K weights by
    /// eight rows on any CPU with AVX-512 VNNI, not only on AMD's, and q6_K's there too (on an
    /// Intel Ice Lake core it made matrices in cache faster but decoding no faster; see the
    /// README).
    #[arg(long = "interleave")]
    pub interleave: bool,
    /// Compute q4_0, iq4_nl, q4_K and mxfp4 weights with the arithmetic of ggml's CPU repack
    /// buffer, which llama.cpp uses by default on x86: results then equal llama.cpp's default
    /// (built for AVX2), bit for bit, where without it they equal llama.cpp with --no-repack
    /// (ggml's plain rows). Copies the q4_0, iq4_nl and mxfp4 weights once into interleaved
    /// rows (q4_K stays mapped), on any CPU.
    #[arg(long = "repack", conflicts_with = "no_interleave")]
    pub repack: bool,
}

#[derive(clap::Args, Clone, Debug)]
pub struct SampleArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Random seed (default: from the clock).
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
}

impl SampleArgs {
    fn params(&self) -> Result<SamplerParams, String> {
        let p = SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: 64,
            seed: self.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            }),
        };
        p.validate()?;
        Ok(p)
    }
}

fn err(e: LlmError) -> String {
    e.to_string()
}

pub fn load(args: &ModelArgs) -> Result<(Arc<Model>, ContextParams), String> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => tessera_llm::fetch::default_model()?,
    };
    let mut model = Model::load(&path).map_err(err)?;
    if let Some(lp) = &args.lora {
        let adapter = tessera_llm::lora::Adapter::load(lp, &model).map_err(err)?;
        model = model.with_lora(Arc::new(adapter), args.lora_scale);
    }
    // (weights that take the repack arithmetic are not interleaved a second time)
    let repacked = |t: DType| args.repack && tessera::layout::repack_numerics(t);
    if args.repack {
        model = model.with_repacked_rows().map_err(err)?;
    }
    if args.interleave {
        model = model
            .with_interleaved_rows_where(|t| !repacked(t) && tessera_cpu::interleaved_kernel(t))
            .map_err(err)?;
    } else if !args.no_interleave {
        model = model
            .with_interleaved_rows_where(|t| !repacked(t) && tessera_cpu::interleave_by_default(t))
            .map_err(err)?;
    }
    let model = Arc::new(model);
    let kv_type = match args.cache_type.as_str() {
        "f16" => DType::F16,
        "f32" => DType::F32,
        t => return Err(format!("--cache-type {t}: f16 or f32")),
    };
    let attn_precision = match args.attn_precision.as_str() {
        "ggml" => tessera::op::AttnPrecision::GgmlCpu,
        "f32" => tessera::op::AttnPrecision::F32,
        t => return Err(format!("--attn-precision {t}: ggml or f32")),
    };
    let params = ContextParams {
        attn_precision,
        n_ctx: args.ctx,
        n_batch: args.batch,
        n_threads: args
            .threads
            .first()
            .copied()
            .unwrap_or_else(tessera_cpu::default_threads)
            .max(1),
        kv_type,
        reference: false,
    };
    Ok((model, params))
}

/// Writes token bytes to stdout as they come, holding back an incomplete UTF-8 sequence.
struct Streamer {
    pending: Vec<u8>,
}

impl Streamer {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let out = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        out
    }
}

/// Generates up to `n` tokens after `prompt`, streaming text through `emit`. Returns the ids.
fn generate(
    ctx: &mut Context,
    sampler: &mut Sampler,
    prompt: &[u32],
    n: usize,
    mut emit: impl FnMut(&str),
) -> Result<Vec<u32>, String> {
    let model = Arc::clone(&ctx.model);
    if prompt.len() + ctx.n_past() > ctx.params.n_ctx {
        return Err(err(LlmError::PromptTooLong {
            n_prompt: prompt.len() + ctx.n_past(),
            n_ctx: ctx.params.n_ctx,
        }));
    }
    for &t in prompt {
        sampler.accept(t);
    }
    let mut logits = ctx.eval(prompt, false).map_err(err)?.to_vec();
    let mut out = Vec::new();
    let mut streamer = Streamer {
        pending: Vec::new(),
    };
    for _ in 0..n {
        let tok = sampler.sample(&logits);
        if model.tokenizer.is_eog(tok) {
            break;
        }
        out.push(tok);
        sampler.accept(tok);
        emit(&streamer.push(&model.tokenizer.decode_token(tok)));
        if ctx.n_past() >= ctx.params.n_ctx {
            break;
        }
        logits = ctx.eval(&[tok], false).map_err(err)?.to_vec();
    }
    emit(&String::from_utf8_lossy(&streamer.pending));
    Ok(out)
}

pub fn run(
    margs: &ModelArgs,
    sargs: &SampleArgs,
    prompt: &str,
    n: usize,
    use_chat: bool,
    ids: bool,
) -> CmdResult {
    let (model, params) = load(margs)?;
    let mut ctx = Context::new(Arc::clone(&model), params).map_err(err)?;
    let mut sampler = Sampler::new(sargs.params()?);
    let text = if use_chat {
        chat::apply(&model, &[Message::new("user", prompt)], true).map_err(err)?
    } else {
        prompt.to_string()
    };
    let toks = model.tokenizer.encode(&text, true, use_chat);
    if toks.is_empty() {
        return Err("the prompt is empty (no tokens)".into());
    }
    if toks.len() > ctx.params.n_ctx {
        return Err(err(LlmError::PromptTooLong {
            n_prompt: toks.len(),
            n_ctx: ctx.params.n_ctx,
        }));
    }
    let t0 = Instant::now();
    let stdout = std::io::stdout();
    if !use_chat {
        print!("{prompt}");
    }
    let generated = generate(&mut ctx, &mut sampler, &toks, n, |s| {
        let mut o = stdout.lock();
        let _ = o.write_all(s.as_bytes());
        let _ = o.flush();
    })?;
    println!();
    let dt = t0.elapsed().as_secs_f64();
    let inter = model.interleaved_bytes();
    eprintln!(
        "tessera: {} prompt tokens, {} generated in {:.2} s ({:.1} tokens/s overall), {} threads{}",
        toks.len(),
        generated.len(),
        dt,
        generated.len() as f64 / dt,
        ctx.n_threads(),
        if inter > 0 {
            format!(
                ", {:.1} MB of weights with interleaved rows (--no-interleave: all mapped)",
                inter as f64 / 1e6
            )
        } else {
            String::new()
        }
    );
    eprint!("{}", tessera_cpu::exec::profile::report());
    if ids {
        eprintln!(
            "{}",
            generated
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}

pub fn chat_loop(margs: &ModelArgs, sargs: &SampleArgs, n: usize) -> CmdResult {
    let (model, params) = load(margs)?;
    let mut ctx = Context::new(Arc::clone(&model), params).map_err(err)?;
    let mut sampler = Sampler::new(sargs.params()?);
    let mut history: Vec<Message> = Vec::new();
    let mut rendered_len = 0usize; // characters of the conversation already in the cache
    let stdin = std::io::stdin();
    eprintln!(
        "tessera chat — {} ({}). Type a message; an empty line or Ctrl-D ends.",
        model.name,
        model.arch.name()
    );
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
            || line.trim().is_empty()
        {
            return Ok(());
        }
        history.push(Message::new("user", line.trim_end()));
        let full = chat::apply(&model, &history, true).map_err(err)?;
        // feed only what the cache does not hold yet
        let new_text = full.get(rendered_len..).unwrap_or(&full).to_string();
        let toks = model.tokenizer.encode(&new_text, rendered_len == 0, true);
        let mut reply = String::new();
        let stdout = std::io::stdout();
        generate(&mut ctx, &mut sampler, &toks, n, |s| {
            reply.push_str(s);
            let mut o = stdout.lock();
            let _ = o.write_all(s.as_bytes());
            let _ = o.flush();
        })?;
        println!();
        history.push(Message::new("assistant", &reply));
        // the reply's end-of-turn token was sampled but not evaluated: re-render and resync
        let with_reply = chat::apply(&model, &history, false).map_err(err)?;
        let fed: usize = toks.len();
        let _ = fed;
        let cached = model.tokenizer.encode(&with_reply, true, true);
        ctx.reset();
        ctx.eval(&cached, false).map_err(err)?;
        rendered_len = with_reply.len();
    }
}

pub fn tokenize(margs: &ModelArgs, text: &str) -> CmdResult {
    let path = match &margs.model {
        Some(p) => p.clone(),
        None => tessera_llm::fetch::default_model()?,
    };
    let model = Model::load(&path).map_err(err)?;
    let ids = model.tokenizer.encode(text, true, false);
    println!(
        "{}",
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
    );
    Ok(())
}

/// Perplexity as llama.cpp computes it: chunks of `n_ctx` tokens, each evaluated from an empty
/// cache; the second half of each chunk is scored.
pub fn perplexity(margs: &ModelArgs, file: &PathBuf) -> CmdResult {
    let (model, params) = load(margs)?;
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let n_ctx = params.n_ctx;
    let tokens = model.tokenizer.encode(&text, true, false);
    let n_chunk = tokens.len() / n_ctx;
    if n_chunk == 0 || n_ctx < 4 {
        return Err(format!(
            "{} tokens: need at least 2 × {n_ctx} (one chunk of -c {n_ctx} tokens) to compute perplexity",
            tokens.len()
        ));
    }
    let mut ctx = Context::new(Arc::clone(&model), params).map_err(err)?;
    let n_vocab = model.hp.n_vocab;
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring the second half of each",
        tokens.len()
    );
    let t0 = Instant::now();
    for c in 0..n_chunk {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if model.tokenizer.add_bos() {
            if let Some(b) = model.tokenizer.bos() {
                chunk[0] = b;
            }
        }
        ctx.reset();
        let logits = ctx.eval(&chunk, true).map_err(err)?;
        for j in first..n_ctx - 1 {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let sum: f64 = row.iter().map(|&x| ((x as f64) - max).exp()).sum();
            let lp = (row[chunk[j + 1] as usize] as f64 - max) - sum.ln();
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        }
        print!("[{}]{:.4},", c + 1, (nll / count as f64).exp());
        let _ = std::io::stdout().flush();
        if c == 0 {
            eprintln!("perplexity: {:.2} s per chunk", t0.elapsed().as_secs_f64());
        }
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let unc = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    println!();
    println!("Final estimate: PPL = {ppl:.4} +/- {unc:.5}");
    Ok(())
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

/// llama-bench's pp (prompt processing) and tg (generation) tests.
pub fn bench(
    margs: &ModelArgs,
    n_prompt: usize,
    n_gen: usize,
    threads: &[usize],
    reps: usize,
    json: bool,
) -> CmdResult {
    let (model, mut params) = load(margs)?;
    params.n_ctx = params.n_ctx.max(n_prompt + n_gen + 1);
    let mut rows = Vec::new();
    let desc = format!("{} {}", model.arch.name(), model.main_type());
    for &th in threads {
        params.n_threads = th;
        let mut ctx = Context::new(Arc::clone(&model), params.clone()).map_err(err)?;
        let n_vocab = model.hp.n_vocab as u32;
        let tok = |i: usize| ((i * 7919 + 13) as u32) % n_vocab;
        for (test, n_p, n_g) in [("pp", n_prompt, 0usize), ("tg", 0usize, n_gen)] {
            if n_p + n_g == 0 {
                continue;
            }
            let mut samples = Vec::new();
            for r in 0..=reps {
                ctx.reset();
                let t = Instant::now();
                if n_p > 0 {
                    let prompt: Vec<u32> = (0..n_p).map(tok).collect();
                    ctx.eval(&prompt, false).map_err(err)?;
                }
                for i in 0..n_g {
                    ctx.eval(&[tok(i)], false).map_err(err)?;
                }
                let dt = t.elapsed().as_secs_f64();
                if r > 0 {
                    samples.push((n_p + n_g) as f64 / dt); // the first run warms up
                }
            }
            let (avg, sd) = mean_sd(&samples);
            rows.push((th, test, n_p, n_g, avg, sd, samples));
        }
    }
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(th, _, n_p, n_g, avg, sd, s)| {
                serde_json::json!({
                    "model_filename": margs.model.as_ref().map(|p| p.display().to_string()),
                    "model_type": desc,
                    "model_size": model.weight_bytes(),
                    "model_n_params": model.n_params(),
                    "n_threads": th,
                    "n_prompt": n_p,
                    "n_gen": n_g,
                    "avg_ts": avg,
                    "stddev_ts": sd,
                    "samples_ts": s,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        println!("| model | size | params | threads | test | t/s |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for (th, test, n_p, n_g, avg, sd, _) in &rows {
            println!(
                "| {desc} | {:.2} MiB | {:.2} M | {th} | {test}{} | {avg:.2} ± {sd:.2} |",
                model.weight_bytes() as f64 / (1 << 20) as f64,
                model.n_params() as f64 / 1e6,
                if *test == "pp" { n_p } else { n_g }
            );
        }
    }
    eprint!("{}", tessera_cpu::exec::profile::report());
    Ok(())
}
