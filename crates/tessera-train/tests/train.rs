//! The training loop: learning, resuming exactly from a checkpoint, gradient accumulation,
//! clipping, SGD, and the trace when the loss stops being finite.

use tessera::{Graph, TensorId};
use tessera_gguf::GgufFile;
use tessera_train::gpt2::{encode, Gpt2Config};
use tessera_train::{
    Dataset, EpochStats, Optimizer, Progress, Schedule, TrainConfig, TrainError, Trainer,
};

fn tiny() -> Gpt2Config {
    Gpt2Config {
        n_vocab: 257,
        n_ctx: 16,
        n_embd: 32,
        n_head: 4,
        n_layer: 2,
    }
}

fn text_data(cfg: &Gpt2Config) -> Dataset {
    let text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer \
                the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
        .repeat(6);
    Dataset::next_token(&encode(&text), cfg.n_ctx, cfg.n_vocab).unwrap()
}

fn config(seed: u64) -> TrainConfig {
    TrainConfig {
        batch: 4,
        grad_accum: 1,
        optimizer: Optimizer::adamw(),
        schedule: Schedule {
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: 5,
            total: 60,
        },
        clip: Some(1.0),
        seed,
        val_frac: 0.1,
        threads: 2,
    }
}

fn trainer(cfg: &Gpt2Config, data: &Dataset, tc: TrainConfig) -> Trainer {
    let c = *cfg;
    let model = move |g: &mut Graph, inp: TensorId, b: usize| c.build(g, inp, b);
    let mut t = Trainer::new(&model, data, tc).unwrap();
    for (name, v) in cfg.init(3) {
        t.set_param(&name, &v).unwrap();
    }
    t
}

fn run(t: &mut Trainer, data: &Dataset, epochs: u64) -> (Vec<f32>, Vec<EpochStats>) {
    let mut losses = Vec::new();
    let st = t
        .fit(
            data,
            epochs,
            &mut |p: &Progress| {
                losses.push(p.loss);
                true
            },
            &mut |_, _| true,
        )
        .unwrap();
    (losses, st)
}

#[test]
fn gpt2_learns_a_text() {
    let cfg = tiny();
    let data = text_data(&cfg);
    let mut t = trainer(&cfg, &data, config(1));
    let (losses, stats) = run(&mut t, &data, 6);
    assert_eq!(stats.len(), 6);
    let first = stats[0].train_loss;
    let last = stats[5].train_loss;
    assert!(first > 4.0, "starts near ln(257) = 5.55: {first}");
    assert!(
        last < first * 0.6,
        "train loss per epoch {:?}",
        stats.iter().map(|s| s.train_loss).collect::<Vec<_>>()
    );
    let val = stats[5].val_loss.expect("validation");
    assert!(
        val < stats[0].val_loss.unwrap(),
        "validation loss falls: {stats:?}"
    );
    assert!(stats[5].train_acc > stats[0].train_acc);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert_eq!(t.pos.epoch, 6);
}

#[test]
fn resuming_a_checkpoint_reproduces_the_uninterrupted_run() {
    let cfg = tiny();
    let data = text_data(&cfg);
    // uninterrupted: 3 epochs
    let mut full = trainer(&cfg, &data, config(5));
    let (want, _) = run(&mut full, &data, 3);
    // interrupted after 7 micro-batches of epoch 0, saved, loaded into a fresh trainer
    let mut a = trainer(&cfg, &data, config(5));
    let mut seen = Vec::new();
    let mut n = 0;
    a.fit(
        &data,
        3,
        &mut |p: &Progress| {
            seen.push(p.loss);
            n += 1;
            n < 7
        },
        &mut |_, _| true,
    )
    .unwrap();
    assert_eq!(a.pos.batch, 7);
    let dir = std::env::temp_dir().join(format!("tessera-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ckpt.gguf");
    a.state_writer(true).unwrap().write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let mut b = trainer(&cfg, &data, config(999)); // the seed comes from the checkpoint
    b.load_state(&file, Some(&file)).unwrap();
    assert_eq!(b.pos, a.pos);
    let (rest, _) = run(&mut b, &data, 3);
    seen.extend(rest);
    assert_eq!(seen, want, "losses after resuming must be identical");
    assert_eq!(
        b.get_param("blk.1.ffn_up.weight").unwrap(),
        full.get_param("blk.1.ffn_up.weight").unwrap()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gradient_accumulation_equals_one_big_batch() {
    let cfg = tiny();
    let data = text_data(&cfg);
    let mut big = trainer(
        &cfg,
        &data,
        TrainConfig {
            batch: 4,
            clip: None,
            ..config(1)
        },
    );
    let mut small = trainer(
        &cfg,
        &data,
        TrainConfig {
            batch: 2,
            grad_accum: 2,
            clip: None,
            ..config(1)
        },
    );
    big.train_batch(&data, &[0, 1, 2, 3]).unwrap();
    small.train_batch(&data, &[0, 1]).unwrap();
    assert_eq!(small.pos.step, 0, "no step before the second micro-batch");
    small.train_batch(&data, &[2, 3]).unwrap();
    assert_eq!((big.pos.step, small.pos.step), (1, 1));
    for name in [
        "token_embd.weight",
        "blk.0.attn_qkv.weight",
        "output_norm.bias",
    ] {
        let (x, y) = (big.get_param(name).unwrap(), small.get_param(name).unwrap());
        let d = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            d < 1e-6,
            "{name}: accumulated and single-batch steps differ by {d}"
        );
    }
}

#[test]
fn sgd_and_clipping() {
    let cfg = tiny();
    let data = text_data(&cfg);
    // clipping to a tiny norm makes the first SGD step tiny
    let mut clipped = trainer(
        &cfg,
        &data,
        TrainConfig {
            optimizer: Optimizer::Sgd { weight_decay: 0.0 },
            schedule: Schedule::constant(0.5),
            clip: Some(1e-3),
            ..config(1)
        },
    );
    let mut free = trainer(
        &cfg,
        &data,
        TrainConfig {
            optimizer: Optimizer::Sgd { weight_decay: 0.0 },
            schedule: Schedule::constant(0.5),
            clip: None,
            ..config(1)
        },
    );
    let before = clipped.get_param("blk.0.ffn_up.weight").unwrap();
    clipped.train_batch(&data, &[0, 1, 2, 3]).unwrap();
    free.train_batch(&data, &[0, 1, 2, 3]).unwrap();
    let dist = |x: &[f32]| {
        x.iter()
            .zip(&before)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let (dc, df) = (
        dist(&clipped.get_param("blk.0.ffn_up.weight").unwrap()),
        dist(&free.get_param("blk.0.ffn_up.weight").unwrap()),
    );
    assert!(
        dc > 0.0 && dc <= 0.5 * 1e-3 * 1.0001,
        "clipped step moved {dc}"
    );
    assert!(df > 10.0 * dc, "unclipped step {df} vs clipped {dc}");
    // SGD keeps no moments: its checkpoint has only the params
    let w = free.state_writer(false).unwrap();
    assert!(w.to_bytes().unwrap().len() < 4096);
}

#[test]
fn a_nan_stops_training_with_the_node_that_made_it() {
    let cfg = tiny();
    let data = text_data(&cfg);
    let mut t = trainer(&cfg, &data, config(1));
    // a poisoned LayerNorm weight: the first node computing with it is named
    let mut w = vec![1.0f32; 32];
    w[3] = f32::NAN;
    t.set_param("blk.1.ffn_norm.weight", &w).unwrap();
    let err = t.train_batch(&data, &[0, 1, 2, 3]).unwrap_err();
    eprintln!("{err}");
    let TrainError::NonFinite { step, trace, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(*step, 1);
    assert!(trace.contains("first node with a NaN"), "{trace}");
    assert!(
        trace.contains("mul") && trace.contains("blk.1.ffn_norm.weight"),
        "{trace}"
    );
}

#[test]
fn bad_setups_are_named() {
    let data = text_data(&tiny());
    // a model whose logits do not fit the labels
    let wrong = |g: &mut Graph, inp: TensorId, b: usize| -> tessera::Result<TensorId> {
        let w = g.new_f32(&[8, 100])?;
        g.set_name(w, "w");
        g.set_param(w)?;
        let _ = (inp, b);
        Ok(w)
    };
    let e = Trainer::new(&wrong, &data, config(1))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("logits"), "{e}");
    // no param
    let none = |g: &mut Graph, _inp: TensorId, b: usize| -> tessera::Result<TensorId> {
        g.new_f32(&[257, 16 * b])
    };
    let e = Trainer::new(&none, &data, config(1))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no param"), "{e}");
}

#[test]
fn reset_zeroes_the_moments_and_the_accumulators() {
    let cfg = tiny();
    let data = text_data(&cfg);
    let mut t = trainer(
        &cfg,
        &data,
        TrainConfig {
            batch: 2,
            grad_accum: 2,
            ..config(1)
        },
    );
    t.train_batch(&data, &[0, 1]).unwrap();
    t.train_batch(&data, &[2, 3]).unwrap();
    t.train_batch(&data, &[4, 5]).unwrap(); // half of the next accumulation
    assert!(t
        .get_grad_acc("blk.0.ffn_up.weight")
        .unwrap()
        .iter()
        .any(|&g| g != 0.0));
    let moments = |t: &mut Trainer| -> Vec<f32> {
        let w = t.state_writer(false).unwrap();
        let path = std::env::temp_dir().join(format!("tessera-reset-{}.gguf", std::process::id()));
        w.write_file(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let d = f.tensor_data_by_name("opt.m.blk.0.ffn_up.weight").unwrap();
        let v = d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        std::fs::remove_file(&path).ok();
        v
    };
    // a checkpoint is refused mid-accumulation
    assert!(t.state_writer(false).is_err());
    t.reset().unwrap();
    assert_eq!(t.pos, tessera_train::Position::default());
    assert!(t
        .get_grad_acc("blk.0.ffn_up.weight")
        .unwrap()
        .iter()
        .all(|&g| g == 0.0));
    assert!(moments(&mut t).iter().all(|&m| m == 0.0));
}
