//! The training loop (ggml-opt's role): a model given as a graph-building function, a
//! [`Dataset`], an [`Optimizer`] and a [`Schedule`]; micro-batches with gradient accumulation,
//! gradient-norm clipping, validation, loss and accuracy per epoch, checkpoints that resume
//! exactly, and a per-node trace when the loss stops being finite.
//!
//! Three graphs are planned once: the training step (forward, backward, gradients added into
//! accumulators), the evaluation (forward only) and the optimizer step. The params' buffers
//! move between their sessions (a pointer move, no copy).

use std::collections::HashMap;
use std::time::Instant;

use tessera::shape::Ne;
use tessera::{Backend, Buffer, DType, Gradients, Graph, Op, Session, TensorId};
use tessera_cpu::CpuBackend;
use tessera_gguf::{GgufFile, GgufWriter, Value};

use crate::dataset::{shuffled, split, Dataset};
use crate::optim::{build_opt_graph, OptGraph, Optimizer, Schedule};
use crate::TrainError;

/// Builds the model on `input` (a leaf of the dataset's input type, `[ne_input, batch]`) and
/// returns logits with one row per label row: `[label_width, label_rows·batch]` elements.
/// Params are leaves marked with `set_param` and a unique name.
pub type ModelFn<'a> = dyn Fn(&mut Graph, TensorId, usize) -> tessera::Result<TensorId> + 'a;

/// Supplies the memory of leaves that are not params by name: frozen weights mapped from a
/// GGUF file (no copy), constants such as positions. `None` leaves get zeroed memory.
pub type LeafProvider = dyn Fn(&str, &tessera::Tensor) -> Option<Buffer>;

#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Samples per micro-batch.
    pub batch: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    pub optimizer: Optimizer,
    pub schedule: Schedule,
    /// Clip the global gradient norm to this value.
    pub clip: Option<f32>,
    /// Shuffling seed.
    pub seed: u64,
    /// Fraction of the samples held out for validation.
    pub val_frac: f32,
    pub threads: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            batch: 8,
            grad_accum: 1,
            optimizer: Optimizer::adamw(),
            schedule: Schedule::constant(1e-3),
            clip: Some(1.0),
            seed: 42,
            val_frac: 0.05,
            threads: tessera_cpu::default_threads(),
        }
    }
}

/// Loss and accuracy over one epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    pub epoch: u64,
    pub train_loss: f64,
    pub train_acc: f64,
    pub val_loss: Option<f64>,
    pub val_acc: Option<f64>,
    /// Label rows (tokens) trained on.
    pub rows: u64,
    pub seconds: f64,
}

/// Reported after every micro-batch.
#[derive(Clone, Debug)]
pub struct Progress {
    pub epoch: u64,
    pub batch: usize,
    pub batches: usize,
    /// Optimizer steps taken so far.
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: Option<f32>,
    pub rows_per_s: f64,
}

struct Forward {
    sess: Session,
    input: TensorId,
    labels: TensorId,
    loss: TensorId,
    correct: TensorId,
    params: Vec<TensorId>,
}

/// Where training stands: what an uninterrupted run would do next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// Optimizer steps taken.
    pub step: u64,
    pub epoch: u64,
    /// Next micro-batch of `epoch`.
    pub batch: usize,
}

pub struct Trainer {
    cfg: TrainConfig,
    backend: CpuBackend,
    input_type: DType,
    ne_input: usize,
    label_width: usize,
    label_rows: usize,
    names: Vec<String>,
    shapes: Vec<Ne>,
    train: Forward,
    grads: Gradients,
    debug_graph: Graph,
    leaves: Box<LeafProvider>,
    eval: Forward,
    opt: OptGraph,
    opt_sess: Session,
    micro: usize,
    pub pos: Position,
    last_grad_norm: Option<f32>,
    scratch_i: Vec<i32>,
    scratch_f: Vec<f32>,
    scratch_l: Vec<f32>,
}

fn build_forward(
    model: &ModelFn,
    input_type: DType,
    ne_input: usize,
    label_width: usize,
    label_rows: usize,
    batch: usize,
) -> Result<(Graph, TensorId, TensorId, TensorId, TensorId), TrainError> {
    let mut g = Graph::new();
    let input = g.new_tensor(input_type, &[ne_input, batch])?;
    g.set_name(input, "input");
    g.set_input(input);
    let labels = g.new_f32(&[label_width, label_rows * batch])?;
    g.set_name(labels, "labels");
    g.set_input(labels);
    let logits = model(&mut g, input, batch)?;
    let lt = g.tensor(logits).clone();
    if lt.nelements() != label_width * label_rows * batch || lt.ne[0] != label_width {
        return Err(TrainError::Model(format!(
            "the model's logits are {}, the labels [{label_width}, {}]",
            lt.describe(),
            label_rows * batch
        )));
    }
    let logits = if lt.ne[1] != label_rows * batch {
        let c = g.cont(logits)?;
        g.reshape(c, &[label_width, label_rows * batch])?
    } else {
        logits
    };
    let loss = g.cross_entropy_loss(logits, labels)?;
    g.set_name(loss, "loss");
    g.set_loss(loss)?;
    let am = g.argmax(logits)?;
    let al = g.argmax(labels)?;
    let correct = g.count_equal(am, al)?;
    g.set_name(correct, "correct");
    g.set_output(correct);
    Ok((g, input, labels, loss, correct))
}

fn params_of(g: &Graph) -> Vec<TensorId> {
    g.ids().filter(|&i| g.flags(i).param).collect()
}

impl Trainer {
    /// Plans the three graphs for `model` on samples shaped like `data`'s.
    pub fn new(model: &ModelFn, data: &Dataset, cfg: TrainConfig) -> Result<Trainer, TrainError> {
        Trainer::with_leaves(model, data, cfg, Box::new(|_, _| None))
    }

    /// Like [`new`](Trainer::new), with the memory of non-param leaves (frozen weights,
    /// constants) from `leaves`.
    pub fn with_leaves(
        model: &ModelFn,
        data: &Dataset,
        cfg: TrainConfig,
        leaves: Box<LeafProvider>,
    ) -> Result<Trainer, TrainError> {
        if cfg.batch == 0 || cfg.grad_accum == 0 {
            return Err(TrainError::Config(
                "batch and grad_accum must be at least 1".into(),
            ));
        }
        let input_type = match data.inputs {
            crate::dataset::Inputs::I32(_) => DType::I32,
            crate::dataset::Inputs::F32(_) => DType::F32,
        };
        let (ne_input, label_width, label_rows) =
            (data.ne_input, data.label_width(), data.label_rows);
        let (mut g, input, labels, loss, correct) = build_forward(
            model,
            input_type,
            ne_input,
            label_width,
            label_rows,
            cfg.batch,
        )?;
        let all = params_of(&g);
        if all.is_empty() {
            return Err(TrainError::Model(
                "the model has no param (set_param)".into(),
            ));
        }
        let grads = g.build_backward(true)?;
        // build_backward lists the params in the order the loss reaches them
        let params = grads.params.clone();
        if params.len() != all.len() {
            let unused: Vec<&str> = all
                .iter()
                .filter(|p| !params.contains(p))
                .map(|&p| g.name(p))
                .collect();
            return Err(TrainError::Model(format!(
                "params that do not affect the loss: {}",
                unused.join(", ")
            )));
        }
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        for &p in &params {
            let name = g.name(p).to_string();
            if name.is_empty() || names.contains(&name) {
                return Err(TrainError::Model(format!(
                    "param {p} needs a unique name, has '{name}'"
                )));
            }
            if g.dtype(p) != DType::F32 {
                return Err(TrainError::Model(format!(
                    "param '{name}' is {}; trained params are f32",
                    g.dtype(p)
                )));
            }
            names.push(name);
            shapes.push(g.ne(p));
        }
        let debug_graph = g.clone();
        let mut outs = vec![correct];
        outs.extend(grads.outputs());
        let sess = Session::with_buffers(g, &outs, &mut |_, t| {
            if t.flags.param {
                None
            } else {
                leaves(&t.name, t)
            }
        })?;
        let train = Forward {
            sess,
            input,
            labels,
            loss,
            correct,
            params: params.clone(),
        };

        let (eg, ei, el, eloss, ec) = build_forward(
            model,
            input_type,
            ne_input,
            label_width,
            label_rows,
            cfg.batch,
        )?;
        let eparams = names
            .iter()
            .map(|n| {
                eg.find(n).ok_or_else(|| {
                    TrainError::Model(format!("the model built no param '{n}' the second time"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let esess = Session::with_buffers(eg, &[eloss, ec], &mut |_, t| {
            if t.flags.param {
                None
            } else {
                leaves(&t.name, t)
            }
        })?;
        let eval = Forward {
            sess: esess,
            input: ei,
            labels: el,
            loss: eloss,
            correct: ec,
            params: eparams,
        };
        let named: Vec<(String, Ne)> = names.iter().cloned().zip(shapes.iter().copied()).collect();
        let opt = build_opt_graph(&named, cfg.optimizer, cfg.clip)?;
        let opt_sess = Session::new(opt.graph.clone(), &opt.outputs)?;
        let backend = CpuBackend::new(cfg.threads.max(1));
        let mut t = Trainer {
            cfg,
            backend,
            input_type,
            ne_input,
            label_width,
            label_rows,
            names,
            shapes,
            train,
            grads,
            debug_graph,
            leaves,
            eval,
            opt,
            opt_sess,
            micro: 0,
            pos: Position::default(),
            last_grad_norm: None,
            scratch_i: Vec::new(),
            scratch_f: Vec::new(),
            scratch_l: Vec::new(),
        };
        t.grads.reset(&mut t.train.sess)?;
        Ok(t)
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// Param names, in graph order.
    pub fn param_names(&self) -> &[String] {
        &self.names
    }

    pub fn param_shape(&self, i: usize) -> Ne {
        self.shapes[i]
    }

    pub fn n_params(&self) -> usize {
        self.shapes.iter().map(tessera::shape::nelements).sum()
    }

    fn index(&self, name: &str) -> Result<usize, TrainError> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| TrainError::Model(format!("no param named '{name}'")))
    }

    pub fn set_param(&mut self, name: &str, values: &[f32]) -> Result<(), TrainError> {
        let i = self.index(name)?;
        self.train.sess.set_f32(self.train.params[i], values)?;
        Ok(())
    }

    pub fn get_param(&self, name: &str) -> Result<Vec<f32>, TrainError> {
        let i = self.index(name)?;
        Ok(self.train.sess.get_f32(self.train.params[i])?)
    }

    /// This micro-batch's gradient accumulators (the sums since the last optimizer step).
    pub fn get_grad_acc(&self, name: &str) -> Result<Vec<f32>, TrainError> {
        let i = self.index(name)?;
        Ok(self.train.sess.get_f32(self.grads.accs[i])?)
    }

    fn fill_batch(&mut self, data: &Dataset, samples: &[usize]) {
        self.scratch_i.clear();
        self.scratch_f.clear();
        self.scratch_l.clear();
        for &s in samples {
            data.input_i32(s, &mut self.scratch_i);
            data.input_f32(s, &mut self.scratch_f);
            data.label(s, &mut self.scratch_l);
        }
    }

    fn set_batch(&mut self, eval: bool) -> Result<(), TrainError> {
        let f = if eval {
            &mut self.eval
        } else {
            &mut self.train
        };
        if self.input_type == DType::I32 {
            f.sess.set_i32(f.input, &self.scratch_i)?;
        } else {
            f.sess.set_f32(f.input, &self.scratch_f)?;
        }
        f.sess.set_f32(f.labels, &self.scratch_l)?;
        Ok(())
    }

    fn check_batch(&self, data: &Dataset) -> Result<(), TrainError> {
        if data.ne_input != self.ne_input
            || data.label_width() != self.label_width
            || data.label_rows != self.label_rows
        {
            return Err(TrainError::Data(format!(
                "samples of {} inputs and {}×{} labels; the trainer was planned for {} and {}×{}",
                data.ne_input,
                data.label_rows,
                data.label_width(),
                self.ne_input,
                self.label_rows,
                self.label_width
            )));
        }
        Ok(())
    }

    /// One micro-batch forward and backward (gradients added into the accumulators); runs the
    /// optimizer after every `grad_accum` micro-batches. Returns the batch's loss and correct
    /// predictions.
    pub fn train_batch(
        &mut self,
        data: &Dataset,
        samples: &[usize],
    ) -> Result<(f32, u64), TrainError> {
        self.check_batch(data)?;
        if samples.len() != self.cfg.batch {
            return Err(TrainError::Data(format!(
                "a batch holds {} samples, got {}",
                self.cfg.batch,
                samples.len()
            )));
        }
        self.fill_batch(data, samples);
        self.set_batch(false)?;
        self.train.sess.compute(&self.backend)?;
        let loss = self.train.sess.get_f32(self.train.loss)?[0];
        if !loss.is_finite() {
            return Err(self.nan_trace(loss));
        }
        let correct = self.train.sess.get_f32(self.train.correct)?[0] as u64;
        self.micro += 1;
        if self.micro == self.cfg.grad_accum {
            self.optimizer_step()?;
        }
        Ok((loss, correct))
    }

    fn move_params(&mut self, to_opt: bool) -> Result<(), TrainError> {
        for i in 0..self.names.len() {
            let pairs = [
                (self.train.params[i], self.opt.params[i]),
                (self.grads.accs[i], self.opt.accs[i]),
            ];
            for (a, b) in pairs {
                if to_opt {
                    let buf = self.train.sess.take_buffer(a)?;
                    self.opt_sess.put_buffer(b, buf)?;
                } else {
                    let buf = self.opt_sess.take_buffer(b)?;
                    self.train.sess.put_buffer(a, buf)?;
                }
            }
        }
        Ok(())
    }

    fn optimizer_step(&mut self) -> Result<(), TrainError> {
        let t = self.pos.step + 1;
        let lr = self.cfg.schedule.at(t);
        self.move_params(true)?;
        let res = (|| -> Result<f32, TrainError> {
            self.opt_sess
                .set_f32(self.opt.hyper, &self.cfg.optimizer.hyper(lr, t))?;
            self.opt_sess
                .set_f32(self.opt.inv_n, &[1.0 / self.micro as f32])?;
            self.opt_sess.compute(&self.backend)?;
            Ok(self.opt_sess.get_f32(self.opt.grad_norm)?[0])
        })();
        self.move_params(false)?;
        let norm = res?;
        self.last_grad_norm = Some(norm);
        self.pos.step = t;
        self.micro = 0;
        // ready for the next accumulation
        self.grads.reset(&mut self.train.sess)?;
        Ok(())
    }

    /// Loss and correct predictions of one batch without training.
    pub fn eval_batch(
        &mut self,
        data: &Dataset,
        samples: &[usize],
    ) -> Result<(f32, u64), TrainError> {
        self.check_batch(data)?;
        self.fill_batch(data, samples);
        self.set_batch(true)?;
        for i in 0..self.names.len() {
            let buf = self.train.sess.take_buffer(self.train.params[i])?;
            self.eval.sess.put_buffer(self.eval.params[i], buf)?;
        }
        let r = self.eval.sess.compute(&self.backend);
        for i in 0..self.names.len() {
            let buf = self.eval.sess.take_buffer(self.eval.params[i])?;
            self.train.sess.put_buffer(self.train.params[i], buf)?;
        }
        r?;
        let loss = self.eval.sess.get_f32(self.eval.loss)?[0];
        let correct = self.eval.sess.get_f32(self.eval.correct)?[0] as u64;
        Ok((loss, correct))
    }

    /// Mean loss and accuracy over `samples` (whole batches; a last partial batch is left out).
    pub fn evaluate(
        &mut self,
        data: &Dataset,
        samples: &[usize],
    ) -> Result<Option<(f64, f64)>, TrainError> {
        let b = self.cfg.batch;
        let n = samples.len() / b;
        if n == 0 {
            return Ok(None);
        }
        let (mut loss, mut correct) = (0.0, 0u64);
        for k in 0..n {
            let (l, c) = self.eval_batch(data, &samples[k * b..(k + 1) * b])?;
            loss += l as f64;
            correct += c;
        }
        let rows = (n * b * self.label_rows) as f64;
        Ok(Some((loss / n as f64, correct as f64 / rows)))
    }

    /// Trains until `epochs` epochs are done (counting from the current position), calling
    /// `on_progress` after every micro-batch and `on_epoch` after every epoch (return `false`
    /// from either to stop, e.g. to checkpoint and exit; the position then says where to resume).
    pub fn fit(
        &mut self,
        data: &Dataset,
        epochs: u64,
        on_progress: &mut dyn FnMut(&Progress) -> bool,
        on_epoch: &mut dyn FnMut(&EpochStats, &mut Trainer) -> bool,
    ) -> Result<Vec<EpochStats>, TrainError> {
        let (train_idx, val_idx) = split(data.len(), self.cfg.val_frac);
        let b = self.cfg.batch;
        let batches = train_idx.len() / b;
        if batches == 0 {
            return Err(TrainError::Data(format!(
                "{} training samples are fewer than one batch of {b}",
                train_idx.len()
            )));
        }
        let mut stats = Vec::new();
        while self.pos.epoch < epochs {
            let order = shuffled(&train_idx, self.cfg.seed, self.pos.epoch);
            let start = Instant::now();
            let (mut loss_sum, mut correct, mut nb) = (0.0f64, 0u64, 0usize);
            while self.pos.batch < batches {
                let k = self.pos.batch;
                let (l, c) = self.train_batch(data, &order[k * b..(k + 1) * b])?;
                self.pos.batch += 1;
                loss_sum += l as f64;
                correct += c;
                nb += 1;
                let p = Progress {
                    epoch: self.pos.epoch,
                    batch: self.pos.batch,
                    batches,
                    step: self.pos.step,
                    loss: l,
                    lr: self.cfg.schedule.at(self.pos.step.max(1)),
                    grad_norm: self.last_grad_norm,
                    rows_per_s: (nb * b * self.label_rows) as f64 / start.elapsed().as_secs_f64(),
                };
                if !on_progress(&p) && self.micro == 0 {
                    return Ok(stats);
                }
            }
            let rows = (nb * b * self.label_rows) as u64;
            let val = self.evaluate(data, &val_idx)?;
            let st = EpochStats {
                epoch: self.pos.epoch,
                train_loss: if nb > 0 {
                    loss_sum / nb as f64
                } else {
                    f64::NAN
                },
                train_acc: if rows > 0 {
                    correct as f64 / rows as f64
                } else {
                    f64::NAN
                },
                val_loss: val.map(|v| v.0),
                val_acc: val.map(|v| v.1),
                rows,
                seconds: start.elapsed().as_secs_f64(),
            };
            self.pos.epoch += 1;
            self.pos.batch = 0;
            stats.push(st.clone());
            if !on_epoch(&st, self) {
                break;
            }
        }
        Ok(stats)
    }

    /// A GGUF writer holding every param (under its own name), the optimizer's moments
    /// (`opt.m.<name>`, `opt.v.<name>`) and the position (`training.*`): with
    /// [`load_state`](Trainer::load_state) the run continues exactly. Only at optimizer-step
    /// boundaries (no half-accumulated gradient).
    pub fn state_writer(&mut self, with_params: bool) -> Result<GgufWriter, TrainError> {
        if self.micro != 0 {
            return Err(TrainError::Config(
                "a checkpoint is taken between optimizer steps (gradients are being accumulated)"
                    .into(),
            ));
        }
        let mut w = GgufWriter::new();
        w.add_kv("training.step", Value::U64(self.pos.step));
        w.add_kv("training.epoch", Value::U64(self.pos.epoch));
        w.add_kv("training.batch", Value::U64(self.pos.batch as u64));
        w.add_kv("training.seed", Value::U64(self.cfg.seed));
        w.add_kv(
            "training.optimizer",
            Value::String(self.cfg.optimizer.name().into()),
        );
        for i in 0..self.names.len() {
            let ne = self.shapes[i];
            let dims = &ne[..tessera::shape::n_dims(&ne)];
            if with_params {
                let v = self.train.sess.get_bytes(self.train.params[i])?;
                w.add_tensor(&self.names[i], DType::F32, dims, &v)?;
            }
            if !self.opt.m.is_empty() {
                let m = self.opt_sess.get_bytes(self.opt.m[i])?;
                let v = self.opt_sess.get_bytes(self.opt.v[i])?;
                w.add_tensor(&format!("opt.m.{}", self.names[i]), DType::F32, dims, &m)?;
                w.add_tensor(&format!("opt.v.{}", self.names[i]), DType::F32, dims, &v)?;
            }
        }
        Ok(w)
    }

    /// Restores params from `params` (a file with tensors named like the params) and the
    /// optimizer state and position from `state` (written by [`state_writer`]).
    pub fn load_state(
        &mut self,
        params: &GgufFile,
        state: Option<&GgufFile>,
    ) -> Result<(), TrainError> {
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        for (i, n) in self.names.iter().enumerate() {
            by_name.insert(n.as_str(), i);
        }
        for i in 0..self.names.len() {
            let t = params
                .tensor(&self.names[i])
                .ok_or_else(|| TrainError::Checkpoint(format!("'{}' is missing", self.names[i])))?;
            let want = self.shapes[i];
            if tessera::shape::ne_from(t.shape()) != want || t.dtype != DType::F32 {
                return Err(TrainError::Checkpoint(format!(
                    "'{}' is {} {:?}, the model's is f32 {:?}",
                    self.names[i],
                    t.dtype,
                    t.shape(),
                    &want[..tessera::shape::n_dims(&want)]
                )));
            }
            self.train
                .sess
                .set_bytes(self.train.params[i], params.tensor_data(t))?;
        }
        if let Some(st) = state {
            let get = |k: &str| -> Result<u64, TrainError> {
                st.get(k)
                    .and_then(|v| v.as_u64())
                    .ok_or_else(|| TrainError::Checkpoint(format!("key {k} is missing")))
            };
            let opt_name = st
                .get("training.optimizer")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            if opt_name != self.cfg.optimizer.name() {
                return Err(TrainError::Checkpoint(format!(
                    "the checkpoint was trained with {opt_name}, this run uses {}",
                    self.cfg.optimizer.name()
                )));
            }
            self.pos = Position {
                step: get("training.step")?,
                epoch: get("training.epoch")?,
                batch: get("training.batch")? as usize,
            };
            self.cfg.seed = get("training.seed")?;
            if !self.opt.m.is_empty() {
                for i in 0..self.names.len() {
                    for (key, id) in [("m", self.opt.m[i]), ("v", self.opt.v[i])] {
                        let name = format!("opt.{key}.{}", self.names[i]);
                        let t = st.tensor(&name).ok_or_else(|| {
                            TrainError::Checkpoint(format!("'{name}' is missing"))
                        })?;
                        self.opt_sess.set_bytes(id, st.tensor_data(t))?;
                    }
                }
            }
        }
        self.micro = 0;
        self.grads.reset(&mut self.train.sess)?;
        Ok(())
    }

    /// Zeroes the optimizer moments and the gradient accumulators (ggml's reset with the
    /// optimizer included) and goes back to step 0.
    pub fn reset(&mut self) -> Result<(), TrainError> {
        for i in 0..self.opt.m.len() {
            for id in [self.opt.m[i], self.opt.v[i]] {
                let n = self.opt_sess.nelements(id);
                self.opt_sess.set_f32(id, &vec![0.0; n])?;
            }
        }
        self.grads.reset(&mut self.train.sess)?;
        self.micro = 0;
        self.pos = Position::default();
        Ok(())
    }

    /// When the loss is not finite: the same batch is run again with every node kept, and the
    /// first node (in execution order) whose value holds a NaN or infinity is named, with
    /// statistics of it and its inputs.
    fn nan_trace(&mut self, loss: f32) -> TrainError {
        let step = self.pos.step + 1;
        let trace = (|| -> Result<String, TrainError> {
            let g = self.debug_graph.clone();
            let loss_id = self.train.loss;
            let nodes: Vec<TensorId> = g.nodes_for(&[loss_id]);
            let leaves = &self.leaves;
            let mut dbg = Session::with_buffers(g, &nodes, &mut |_, t| {
                if t.flags.param {
                    None
                } else {
                    leaves(&t.name, t)
                }
            })?;
            for i in 0..self.names.len() {
                let v = self.train.sess.get_bytes(self.train.params[i])?;
                dbg.set_bytes(self.train.params[i], &v)?;
            }
            if self.input_type == DType::I32 {
                dbg.set_i32(self.train.input, &self.scratch_i)?;
            } else {
                dbg.set_f32(self.train.input, &self.scratch_f)?;
            }
            dbg.set_f32(self.train.labels, &self.scratch_l)?;
            dbg.compute(&self.backend)?;
            let stats = |v: &[f32]| -> String {
                let bad = v.iter().filter(|x| !x.is_finite()).count();
                let fin: Vec<f32> = v.iter().copied().filter(|x| x.is_finite()).collect();
                let (mn, mx) = fin
                    .iter()
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                        (a.min(x), b.max(x))
                    });
                let mean = fin.iter().map(|&x| x as f64).sum::<f64>() / fin.len().max(1) as f64;
                format!(
                    "min {mn:.4e} max {mx:.4e} mean {mean:.4e}, {bad} non-finite of {}",
                    v.len()
                )
            };
            let gr = dbg.graph().clone();
            // a NaN is always wrong; an infinity is what masks are made of, so the first
            // infinity outside a mask is reported only when no node has a NaN
            let nan_pass = |v: &[f32], _: &Op| v.iter().any(|x| x.is_nan());
            let inf_pass = |v: &[f32], op: &Op| {
                !matches!(op, Op::DiagMaskInf { .. }) && v.iter().any(|x| x.is_infinite())
            };
            for pass in [&nan_pass as &dyn Fn(&[f32], &Op) -> bool, &inf_pass] {
                for &id in &nodes {
                    let t = gr.tensor(id);
                    if t.op == Op::Leaf || t.dtype != DType::F32 {
                        continue;
                    }
                    let v = dbg.get_f32(id)?;
                    if pass(&v, &t.op) {
                        let mut s = format!(
                            "first node with a {}: {id} '{}' = {}({}) {}: {}\n",
                            if v.iter().any(|x| x.is_nan()) {
                                "NaN"
                            } else {
                                "non-finite value"
                            },
                            t.name,
                            t.op,
                            t.src
                                .iter()
                                .map(|s| s.to_string())
                                .collect::<Vec<_>>()
                                .join(", "),
                            t.describe(),
                            stats(&v)
                        );
                        for &src in &t.src {
                            let st = gr.tensor(src);
                            if st.dtype == DType::F32 {
                                let sv = dbg.get_f32(src)?;
                                s += &format!(
                                    "  input {src} '{}' ({}) {}: {}\n",
                                    st.name,
                                    st.op,
                                    st.describe(),
                                    stats(&sv)
                                );
                            }
                        }
                        return Ok(s);
                    }
                }
            }
            Ok("no node was non-finite when the batch was run again".into())
        })();
        TrainError::NonFinite {
            step,
            loss,
            trace: trace.unwrap_or_else(|e| format!("(the trace failed: {e})")),
        }
    }

    /// Ops of the training step that run on the CPU backend's single-threaded reference
    /// fallback (no dedicated kernel for these types or layouts), with their node counts.
    pub fn fallback_ops(&self) -> Vec<(String, usize)> {
        let g = self.train.sess.graph();
        let mut counts: Vec<(String, usize)> = Vec::new();
        for id in g.nodes_for(&self.grads.outputs()) {
            let t = g.tensor(id);
            if t.op.is_view() || tessera_cpu::ops::fast_path(g, t) {
                continue;
            }
            let types: Vec<String> = t.src.iter().map(|&s| g.dtype(s).to_string()).collect();
            let key = format!("{}({})", t.op, types.join(","));
            match counts.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => counts.push((key, 1)),
            }
        }
        counts
    }

    /// Planned memory in bytes: (activations and gradients: the arenas of the training,
    /// evaluation and optimizer graphs; params, accumulators and moments: the owned leaves;
    /// mapped: leaves bound to external memory such as a GGUF file).
    pub fn memory(&self) -> (usize, usize, usize) {
        let mut arena = 0;
        let (mut owned, mut mapped) = (0, 0);
        for s in [&self.train.sess, &self.eval.sess, &self.opt_sess] {
            arena += s.plan().arena_size;
            for i in 0..s.plan().leaves.len() {
                let b = s.memory().leaf(i);
                if b.is_external() {
                    // the same mapping is bound in the training and evaluation sessions
                    if std::ptr::eq(s, &self.train.sess) {
                        mapped += b.len();
                    }
                } else {
                    owned += b.len();
                }
            }
        }
        (arena, owned, mapped)
    }

    /// Runs `backend` instead of the default CPU backend (tests compare backends).
    pub fn backend(&self) -> &dyn Backend {
        &self.backend
    }

    /// Replaces a param's buffer (used by tests).
    #[doc(hidden)]
    pub fn put_param_buffer(&mut self, name: &str, buf: Buffer) -> Result<(), TrainError> {
        let i = self.index(name)?;
        self.train.sess.put_buffer(self.train.params[i], buf)?;
        Ok(())
    }
}
