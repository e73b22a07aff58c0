//! Tessera's GPT-2 against PyTorch (fixture written by dev/torch_reference.py, in float64):
//! from identical initial weights, the logits, the loss and every parameter's gradient agree
//! within 1e-5 relative, and the losses of 10 AdamW steps within 1e-4.

use serde_json::Value as Json;
use tessera::{DType, Graph, Session};
use tessera_cpu::CpuBackend;
use tessera_train::gpt2::Gpt2Config;
use tessera_train::{Dataset, Optimizer, Schedule, TrainConfig, Trainer};

struct Fixture {
    meta: Json,
    bin: Vec<f32>,
}

impl Fixture {
    fn load() -> Fixture {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
        let meta: Json = serde_json::from_str(
            &std::fs::read_to_string(format!("{dir}/gpt2_tiny.json")).unwrap(),
        )
        .unwrap();
        let raw = std::fs::read(format!("{dir}/gpt2_tiny.bin")).unwrap();
        let bin = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Fixture { meta, bin }
    }
    fn array(&self, key: &str) -> &[f32] {
        let a = &self.meta["arrays"][key];
        let (o, n) = (
            a["offset"].as_u64().unwrap() as usize,
            a["len"].as_u64().unwrap() as usize,
        );
        &self.bin[o..o + n]
    }
    fn config(&self) -> Gpt2Config {
        let c = &self.meta["config"];
        let u = |k: &str| c[k].as_u64().unwrap() as usize;
        Gpt2Config {
            n_vocab: u("n_vocab"),
            n_ctx: u("n_ctx"),
            n_embd: u("n_embd"),
            n_head: u("n_head"),
            n_layer: u("n_layer"),
        }
    }
    fn tokens(&self) -> Vec<u32> {
        self.meta["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    }
}

/// The initial weights of dev/torch_reference.py's `init_value`, computed the same way.
fn init(cfg: &Gpt2Config) -> Vec<(String, Vec<f32>)> {
    let l = cfg.n_layer as f64;
    cfg.params()
        .into_iter()
        .enumerate()
        .map(|(j, (name, ne))| {
            let n: usize = ne.iter().product();
            let (j, name2) = (j as i64, name.clone());
            let v = (0..n as i64)
                .map(|i| {
                    let x = if name2.ends_with(".bias") {
                        ((i * 31 + j * 17) % 21 - 10) as f64 / 1000.0
                    } else if name2.contains("norm.weight") {
                        1.0 + ((i * 13 + j) % 11 - 5) as f64 / 100.0
                    } else {
                        let std = if name2.ends_with("attn_output.weight")
                            || name2.ends_with("ffn_down.weight")
                        {
                            0.02 / (2.0 * l).sqrt()
                        } else {
                            0.02
                        };
                        ((i * 7919 + j * 104729 + 12345) % 2001 - 1000) as f64 / 1000.0
                            * std
                            * 3f64.sqrt()
                    };
                    x as f32
                })
                .collect();
            (name, v)
        })
        .collect()
}

fn max_rel(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
    got.iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max)
        / scale
}

#[test]
fn logits_loss_and_every_gradient_match_pytorch() {
    let fx = Fixture::load();
    let cfg = fx.config();
    let toks = fx.tokens();
    let (b, t) = (
        fx.meta["config"]["batch"].as_u64().unwrap() as usize,
        cfg.n_ctx,
    );
    let mut g = Graph::new();
    let input = g.new_tensor(DType::I32, &[t, b]).unwrap();
    let logits = cfg.build(&mut g, input, b).unwrap();
    let labels = g.new_f32(&[cfg.n_vocab, t * b]).unwrap();
    let loss = g.cross_entropy_loss(logits, labels).unwrap();
    g.set_loss(loss).unwrap();
    g.set_output(logits);
    let grads = g.build_backward(false).unwrap();
    let mut outs = grads.outputs();
    outs.push(logits);
    let names: Vec<String> = grads
        .params
        .iter()
        .map(|&p| g.name(p).to_string())
        .collect();
    let mut s = Session::new(g, &outs).unwrap();
    for (name, v) in init(&cfg) {
        let id = s.graph().find(&name).unwrap();
        s.set_f32(id, &v).unwrap();
    }
    let inp: Vec<i32> = (0..b)
        .flat_map(|k| toks[k * t..(k + 1) * t].iter().map(|&x| x as i32))
        .collect();
    s.set_i32(input, &inp).unwrap();
    let mut lab = vec![0.0f32; cfg.n_vocab * t * b];
    for k in 0..b {
        for i in 0..t {
            lab[(k * t + i) * cfg.n_vocab + toks[k * t + i + 1] as usize] = 1.0;
        }
    }
    s.set_f32(labels, &lab).unwrap();
    grads.reset(&mut s).unwrap();
    for threads in [1, 2] {
        s.compute(&CpuBackend::new(threads)).unwrap();
        let got_loss = s.get_f32(loss).unwrap()[0] as f64;
        let want_loss = fx.meta["loss"].as_f64().unwrap();
        assert!(
            ((got_loss - want_loss) / want_loss).abs() < 1e-5,
            "loss {got_loss} vs PyTorch {want_loss}"
        );
        let lg = s.get_f32(logits).unwrap();
        let e = max_rel(&lg, fx.array("logits"));
        assert!(
            e < 1e-5,
            "logits differ from PyTorch by {e:.2e} (relative to their max)"
        );
        let mut worst = (0.0, String::new());
        for (i, name) in names.iter().enumerate() {
            let gv = s.get_f32(grads.grads[i]).unwrap();
            let want = fx.array(&format!("grad.{name}"));
            assert_eq!(gv.len(), want.len(), "{name}");
            let e = max_rel(&gv, want);
            if e > worst.0 {
                worst = (e, name.clone());
            }
            assert!(e < 1e-5, "gradient of {name} differs from PyTorch's by {e:.2e} (relative to its max), {threads} threads");
        }
        eprintln!(
            "{threads} threads: loss {got_loss} (PyTorch {want_loss}); worst gradient {} at {:.2e}",
            worst.1, worst.0
        );
    }
}

#[test]
fn ten_adamw_steps_match_pytorch() {
    let fx = Fixture::load();
    let cfg = fx.config();
    let a = &fx.meta["adamw"];
    let f = |k: &str| a[k].as_f64().unwrap() as f32;
    let data = Dataset::next_token(&fx.tokens(), cfg.n_ctx, cfg.n_vocab).unwrap();
    assert_eq!(data.len(), 2);
    let tc = TrainConfig {
        batch: 2,
        grad_accum: 1,
        optimizer: Optimizer::AdamW {
            beta1: f("beta1"),
            beta2: f("beta2"),
            eps: f("eps"),
            weight_decay: f("weight_decay"),
        },
        schedule: Schedule::constant(f("lr")),
        clip: None,
        seed: 1,
        val_frac: 0.0,
        threads: 2,
    };
    let model = |g: &mut Graph, inp, b| cfg.build(g, inp, b);
    let mut tr = Trainer::new(&model, &data, tc).unwrap();
    for (name, v) in init(&cfg) {
        tr.set_param(&name, &v).unwrap();
    }
    let want: Vec<f64> = a["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (k, w) in want.iter().enumerate() {
        let (l, _) = tr.train_batch(&data, &[0, 1]).unwrap();
        let rel = ((l as f64 - w) / w).abs();
        assert!(
            rel < 1e-4,
            "AdamW step {}: loss {l} vs PyTorch {w} ({rel:.2e})",
            k + 1
        );
    }
    assert_eq!(tr.pos.step, 10);
}
