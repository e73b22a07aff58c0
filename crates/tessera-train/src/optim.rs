//! Optimizers as graph ops: one graph per model that takes the accumulated gradients, averages
//! them over the micro-batches, clips their global norm, and applies `opt_step_adamw` or
//! `opt_step_sgd` (ggml's ops and parameter tensors) to every param, writing the new values and
//! AdamW's moments back into their persistent leaves.

use tessera::shape::Ne;
use tessera::{DType, Graph, Result, TensorId};

/// The optimizer and its fixed hyper-parameters (the learning rate comes from the schedule).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// AdamW with decoupled weight decay, bias-corrected moments (PyTorch's and ggml's AdamW).
    AdamW {
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
    },
    /// Plain SGD with decoupled weight decay: `p·(1 - lr·wd) - lr·g`.
    Sgd { weight_decay: f32 },
}

impl Optimizer {
    /// AdamW with PyTorch's defaults except weight decay (0 here, 0.01 there).
    pub fn adamw() -> Optimizer {
        Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::AdamW { .. } => "adamw",
            Optimizer::Sgd { .. } => "sgd",
        }
    }

    /// ggml's hyper-parameter tensor for step `t` (1-based) at learning rate `lr`.
    pub fn hyper(&self, lr: f32, t: u64) -> Vec<f32> {
        match *self {
            Optimizer::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let b1h = 1.0 / (1.0 - (beta1 as f64).powf(t as f64));
                let b2h = 1.0 / (1.0 - (beta2 as f64).powf(t as f64));
                vec![lr, beta1, beta2, eps, weight_decay, b1h as f32, b2h as f32]
            }
            Optimizer::Sgd { weight_decay } => vec![lr, weight_decay],
        }
    }
}

/// The optimizer graph: leaves for every param, its gradient accumulator and moments, and the
/// per-step inputs; planned once and run once per optimizer step.
pub struct OptGraph {
    pub graph: Graph,
    pub params: Vec<TensorId>,
    pub accs: Vec<TensorId>,
    /// AdamW's first and second moments (empty for SGD).
    pub m: Vec<TensorId>,
    pub v: Vec<TensorId>,
    /// ggml's hyper-parameter tensor (see [`Optimizer::hyper`]).
    pub hyper: TensorId,
    /// `1 / n_micro_batches`: the accumulators hold sums.
    pub inv_n: TensorId,
    /// The global L2 norm of the averaged gradient, before clipping.
    pub grad_norm: TensorId,
    /// Plan for these (new values first, write-backs last).
    pub outputs: Vec<TensorId>,
}

/// Builds the optimizer graph for params of these names and shapes.
pub fn build_opt_graph(
    shapes: &[(String, Ne)],
    opt: Optimizer,
    clip: Option<f32>,
) -> Result<OptGraph> {
    let mut g = Graph::new();
    let mut params = Vec::new();
    let mut accs = Vec::new();
    let mut ms = Vec::new();
    let mut vs = Vec::new();
    for (name, ne) in shapes {
        let p = g.new_tensor(DType::F32, ne)?;
        g.set_name(p, name.clone());
        g.set_param(p)?;
        let a = g.new_tensor(DType::F32, ne)?;
        g.set_name(a, format!("grad_acc.{name}"));
        params.push(p);
        accs.push(a);
        if let Optimizer::AdamW { .. } = opt {
            let m = g.new_tensor(DType::F32, ne)?;
            g.set_name(m, format!("opt.m.{name}"));
            let v = g.new_tensor(DType::F32, ne)?;
            g.set_name(v, format!("opt.v.{name}"));
            ms.push(m);
            vs.push(v);
        }
    }
    let hyper = g.new_f32(&[if ms.is_empty() { 2 } else { 7 }])?;
    g.set_name(hyper, "opt.hyper");
    g.set_input(hyper);
    let inv_n = g.new_f32(&[1])?;
    g.set_name(inv_n, "opt.inv_n");
    g.set_input(inv_n);

    // global norm of the averaged gradient
    let mut total: Option<TensorId> = None;
    for &a in &accs {
        let sq = g.sqr(a)?;
        let s = g.sum(sq)?;
        total = Some(match total {
            Some(t) => g.add(t, s)?,
            None => s,
        });
    }
    let total = total.ok_or_else(|| tessera::Error::Invalid("optimizer: no params".into()))?;
    let norm_sum = g.sqrt(total)?;
    let grad_norm = g.mul(norm_sum, inv_n)?;
    g.set_name(grad_norm, "opt.grad_norm");
    g.set_output(grad_norm);
    let scale = match clip {
        Some(max) => {
            // min(1, max/norm) = max / clamp(norm, max, ∞)
            let den = g.clamp(grad_norm, max, f32::MAX)?;
            let num = g.fill(&[1], max)?;
            let s = g.div(num, den)?;
            g.mul(s, inv_n)?
        }
        None => inv_n,
    };

    let mut news = Vec::new();
    let mut writes = Vec::new();
    for i in 0..params.len() {
        let gr = g.mul(accs[i], scale)?;
        match opt {
            Optimizer::AdamW { beta1, beta2, .. } => {
                let (m, v) = (ms[i], vs[i]);
                let p2 = g.opt_step_adamw(params[i], gr, m, v, hyper)?;
                let m1 = g.scale(m, beta1)?;
                let m2 = g.scale(gr, 1.0 - beta1)?;
                let m_new = g.add(m1, m2)?;
                let gsq = g.sqr(gr)?;
                let v1 = g.scale(v, beta2)?;
                let v2 = g.scale(gsq, 1.0 - beta2)?;
                let v_new = g.add(v1, v2)?;
                news.extend([p2, m_new, v_new]);
                writes.push((p2, params[i]));
                writes.push((m_new, m));
                writes.push((v_new, v));
            }
            Optimizer::Sgd { .. } => {
                let p2 = g.opt_step_sgd(params[i], gr, hyper)?;
                news.push(p2);
                writes.push((p2, params[i]));
            }
        }
    }
    let mut outputs = vec![grad_norm];
    outputs.extend(&news);
    for (src, dst) in writes {
        outputs.push(g.cpy(src, dst)?);
    }
    Ok(OptGraph {
        graph: g,
        params,
        accs,
        m: ms,
        v: vs,
        hyper,
        inv_n,
        grad_norm,
        outputs,
    })
}

/// Learning rate per optimizer step: linear warmup from 0 to `lr` over `warmup` steps, then a
/// cosine decay to `min_lr` at step `total` (constant after).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub lr: f32,
    pub min_lr: f32,
    pub warmup: u64,
    pub total: u64,
}

impl Schedule {
    pub fn constant(lr: f32) -> Schedule {
        Schedule {
            lr,
            min_lr: lr,
            warmup: 0,
            total: 0,
        }
    }

    /// The learning rate of step `t` (1-based).
    pub fn at(&self, t: u64) -> f32 {
        if self.warmup > 0 && t <= self.warmup {
            return self.lr * t as f32 / self.warmup as f32;
        }
        if self.total <= self.warmup || t >= self.total {
            return if self.total > self.warmup {
                self.min_lr
            } else {
                self.lr
            };
        }
        let progress = (t - self.warmup) as f64 / (self.total - self.warmup) as f64;
        let c = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        (self.min_lr as f64 + (self.lr - self.min_lr) as f64 * c) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays() {
        let s = Schedule {
            lr: 1.0,
            min_lr: 0.1,
            warmup: 10,
            total: 110,
        };
        assert_eq!(s.at(1), 0.1);
        assert_eq!(s.at(10), 1.0);
        assert!((s.at(60) - 0.55).abs() < 1e-6);
        assert!((s.at(110) - 0.1).abs() < 1e-7);
        assert!((s.at(500) - 0.1).abs() < 1e-7);
        assert!(s.at(30) > s.at(40));
        assert_eq!(Schedule::constant(0.3).at(7), 0.3);
    }

    #[test]
    fn adamw_hyper_has_bias_corrections() {
        let h = Optimizer::adamw().hyper(1e-3, 1);
        assert_eq!(h.len(), 7);
        assert!((h[5] - 10.0).abs() < 1e-4); // 1/(1-0.9)
        assert!((h[6] - 1000.0).abs() < 1e-1); // 1/(1-0.999)
        assert_eq!(
            Optimizer::Sgd { weight_decay: 0.1 }.hyper(0.5, 3),
            vec![0.5, 0.1]
        );
    }
}
