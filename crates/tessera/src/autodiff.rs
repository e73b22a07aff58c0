//! Automatic differentiation over a graph, with ggml's semantics: params and the loss are
//! flags on tensors; [`Graph::build_backward`] adds the gradient nodes to the same graph by
//! walking the forward nodes in reverse and asking each op's family file for its backward rule
//! (`ops/<family>.rs`, functions named `backward_*`).
//!
//! - Gradients are built only where needed: a node gets a gradient only if it depends on a
//!   param, so frozen weights (and everything computed from frozen weights alone) never get a
//!   gradient graph.
//! - Gradients are f32 and have the shape of the tensor they belong to, whatever its type (f16,
//!   bf16 and quantized weights included).
//! - Ops without a gradient (argmax, count_equal, argsort, top_k, step, sgn, set_rows,
//!   optimizer steps, …) and inputs that are data rather than values (indices, positions) are
//!   refused with [`Error::NotDifferentiable`] naming the op and the input, when a gradient must
//!   flow through them.
//! - Accumulate mode: every param gets a persistent accumulator leaf; each run adds its
//!   gradient into it (micro-batches), and [`Gradients::reset`] sets the loss gradient to 1 and
//!   the accumulators to 0.

use std::collections::HashMap;

use crate::backend::Session;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::TensorId;
use crate::DType;

/// What a backward rule is asked: the node, the gradient of its output, and which of its
/// sources need a gradient.
pub(crate) struct Bw {
    pub node: TensorId,
    pub grad: TensorId,
    pub need: Vec<bool>,
}

impl Bw {
    /// Source `i` needs a gradient.
    pub fn wants(&self, i: usize) -> bool {
        self.need.get(i).copied().unwrap_or(false)
    }
}

/// The result of a backward rule: one gradient per source (`None` where not needed).
pub(crate) type Grads = Vec<Option<TensorId>>;

/// The gradient nodes [`Graph::build_backward`] added.
#[derive(Clone, Debug)]
pub struct Gradients {
    /// The loss tensor.
    pub loss: TensorId,
    /// The gradient of the loss w.r.t. itself: an f32 input leaf that [`reset`](Self::reset)
    /// sets to 1 (0 would switch the backward pass off).
    pub loss_grad: TensorId,
    /// The params, in graph order.
    pub params: Vec<TensorId>,
    /// `grads[i]`: the gradient of the loss w.r.t. `params[i]` from this run.
    pub grads: Vec<TensorId>,
    /// Accumulate mode: `accs[i]` is a persistent f32 leaf holding the sum of `params[i]`'s
    /// gradients over the runs since the last reset; `acc_writes[i]` the node that adds this
    /// run's gradient into it (compute it, i.e. list it among the outputs).
    pub accs: Vec<TensorId>,
    pub acc_writes: Vec<TensorId>,
}

impl Gradients {
    /// The tensors to plan for: the loss and every gradient, or in accumulate mode the loss and
    /// the writes into the accumulators (this run's gradients are then intermediate values
    /// whose memory the planner reuses; read the accumulators).
    pub fn outputs(&self) -> Vec<TensorId> {
        let mut v = vec![self.loss];
        if self.accs.is_empty() {
            v.extend(&self.grads);
        } else {
            v.extend(&self.acc_writes);
        }
        v
    }

    /// The gradient to read or feed to an optimizer for param `i`: the accumulator in
    /// accumulate mode, this run's gradient otherwise.
    pub fn grad_of(&self, i: usize) -> TensorId {
        if self.accs.is_empty() {
            self.grads[i]
        } else {
            self.accs[i]
        }
    }

    /// Sets the loss gradient to 1 and zeroes every accumulator (ggml's `graph_reset`).
    /// Optimizer moments belong to the optimizer, which has its own reset.
    pub fn reset(&self, s: &mut Session) -> Result<()> {
        s.set_f32(self.loss_grad, &[1.0])?;
        for &a in &self.accs {
            let n = s.nelements(a);
            s.set_f32(a, &vec![0.0; n])?;
        }
        Ok(())
    }
}

impl Graph {
    /// Builds the backward pass of the scalar loss (the tensor flagged with
    /// [`set_loss`](Graph::set_loss)) w.r.t. every param ([`set_param`](Graph::set_param)) it
    /// depends on. With `accumulate`, gradients are added into persistent accumulators.
    pub fn build_backward(&mut self, accumulate: bool) -> Result<Gradients> {
        let losses: Vec<TensorId> = self.ids().filter(|&i| self.flags(i).loss).collect();
        let loss = match losses.as_slice() {
            [] => return Err(Error::Invalid(
                "build_backward: the graph has no loss (mark the scalar to minimise with set_loss)"
                    .into(),
            )),
            [l] => *l,
            _ => {
                return Err(Error::Invalid(format!(
                "build_backward: the graph has {} tensors marked as loss ({:?}); sum them into one",
                losses.len(),
                losses
            )))
            }
        };
        let t = self.tensor(loss);
        if t.nelements() != 1 || t.dtype != DType::F32 {
            return Err(Error::Invalid(format!(
                "build_backward: the loss {} '{}' must be an f32 scalar, it is {}",
                loss,
                t.name,
                t.describe()
            )));
        }
        let order = self.topo_order(&[loss]);
        let params: Vec<TensorId> = order
            .iter()
            .copied()
            .filter(|&i| self.flags(i).param)
            .collect();
        if params.is_empty() {
            let any = self.ids().any(|i| self.flags(i).param);
            return Err(Error::Invalid(if any {
                format!(
                    "build_backward: no param affects the loss {} '{}' (the params are not among its inputs)",
                    loss,
                    self.name(loss)
                )
            } else {
                "build_backward: the graph has no param (mark the tensors to train with set_param)"
                    .into()
            }));
        }
        let loss_grad = self.new_f32(&[1])?;
        self.set_name(loss_grad, "loss_grad");
        self.set_input(loss_grad);
        let found = self.backprop(&[(loss, loss_grad)], &params)?;
        let mut grads = Vec::with_capacity(params.len());
        for (&p, g) in params.iter().zip(found) {
            // a param the loss reaches only through indices (argmax, …) has a zero gradient
            let g = match g {
                Some(g) => self.contig(g)?,
                None => {
                    let ne = self.ne(p);
                    self.fill(&ne, 0.0)?
                }
            };
            let name = format!("grad.{}", self.name(p));
            self.set_name(g, name);
            if !accumulate {
                self.set_output(g);
            }
            grads.push(g);
        }
        let (mut accs, mut acc_writes) = (Vec::new(), Vec::new());
        if accumulate {
            for (&p, &g) in params.iter().zip(&grads) {
                let ne = self.ne(p);
                let acc = self.new_tensor(DType::F32, &ne)?;
                let name = format!("grad_acc.{}", self.name(p));
                self.set_name(acc, name);
                let sum = self.add(acc, g)?;
                let w = self.cpy(sum, acc)?;
                accs.push(acc);
                acc_writes.push(w);
            }
        }
        Ok(Gradients {
            loss,
            loss_grad,
            params,
            grads,
            accs,
            acc_writes,
        })
    }

    /// Reverse-mode differentiation: given seeds `(y, dy)` (the gradient `dy` of some scalar
    /// w.r.t. `y`, of `y`'s shape), adds nodes computing the gradient w.r.t. each of `targets`
    /// (`None` for a target no seed depends on). Used by `build_backward`, by backward rules that
    /// differentiate a decomposition of their op, and by gradient checks.
    pub fn backprop(
        &mut self,
        seeds: &[(TensorId, TensorId)],
        targets: &[TensorId],
    ) -> Result<Vec<Option<TensorId>>> {
        let outs: Vec<TensorId> = seeds.iter().map(|s| s.0).collect();
        let order = self.topo_order(&outs);
        let mut needs = vec![false; self.len()];
        for &t in targets {
            needs[t.index()] = true;
        }
        for &id in &order {
            let t = self.tensor(id);
            if t.src.iter().any(|s| needs[s.index()]) && differentiable_type(t.dtype) {
                needs[id.index()] = true;
            }
        }
        let mut grads: HashMap<TensorId, TensorId> = HashMap::new();
        for &(y, dy) in seeds {
            if self.ne(y) != self.ne(dy) {
                return Err(Error::Invalid(format!(
                    "backprop: seed gradient {} has shape {}, its tensor {} has {}",
                    dy,
                    crate::shape::fmt_ne(&self.ne(dy)),
                    y,
                    crate::shape::fmt_ne(&self.ne(y))
                )));
            }
            self.add_grad(&mut grads, y, dy)?;
        }
        for &id in order.iter().rev() {
            if !needs[id.index()] || self.tensor(id).op == Op::Leaf {
                continue;
            }
            let Some(&g) = grads.get(&id) else { continue };
            let need: Vec<bool> = self
                .tensor(id)
                .src
                .iter()
                .map(|s| needs[s.index()])
                .collect();
            if !need.iter().any(|&n| n) {
                continue;
            }
            let bw = Bw {
                node: id,
                grad: g,
                need: need.clone(),
            };
            let contrib = self.backward_rule(&bw)?;
            let src = self.tensor(id).src.clone();
            for (i, &s) in src.iter().enumerate() {
                if !need[i] {
                    continue;
                }
                match contrib.get(i).copied().flatten() {
                    Some(c) => self.add_grad(&mut grads, s, c)?,
                    None => {
                        return Err(self.not_diff(id, i, "no gradient rule for this input"));
                    }
                }
            }
        }
        Ok(targets.iter().map(|t| grads.get(t).copied()).collect())
    }

    fn add_grad(
        &mut self,
        grads: &mut HashMap<TensorId, TensorId>,
        t: TensorId,
        g: TensorId,
    ) -> Result<()> {
        if self.ne(g) != self.ne(t) {
            // a broken rule, not a user error: say which
            return Err(Error::Invalid(format!(
                "internal error in autodiff: gradient {} of shape {} for tensor {} of shape {} (made by {})",
                g,
                crate::shape::fmt_ne(&self.ne(g)),
                t,
                crate::shape::fmt_ne(&self.ne(t)),
                self.tensor(g).op
            )));
        }
        let g = if self.dtype(g) != DType::F32 {
            self.cast(g, DType::F32)?
        } else {
            g
        };
        let sum = match grads.get(&t) {
            Some(&prev) => self.add(prev, g)?,
            None => g,
        };
        grads.insert(t, sum);
        Ok(())
    }

    pub(crate) fn not_diff(&self, id: TensorId, input: usize, why: &str) -> Error {
        Error::NotDifferentiable {
            op: self.tensor(id).op.name(),
            node: format!("{} '{}'", id, self.name(id)),
            input,
            why: why.into(),
        }
    }

    /// Dispatches to the op family's backward rule.
    fn backward_rule(&mut self, bw: &Bw) -> Result<Grads> {
        let op = self.tensor(bw.node).op.clone();
        match op {
            Op::Leaf => Ok(vec![]),
            Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose | Op::Cont | Op::Cpy => {
                self.backward_view(bw)
            }
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Add1 | Op::Acc(_) | Op::Set(_) => {
                self.backward_binary(bw)
            }
            Op::Scale { .. } | Op::Unary(_) | Op::LeakyRelu { .. } | Op::Clamp { .. } => {
                self.backward_unary(bw)
            }
            Op::Glu { .. } => self.backward_glu(bw),
            Op::Sum
            | Op::SumRows
            | Op::Mean
            | Op::Cumsum
            | Op::Repeat
            | Op::RepeatBack
            | Op::Concat { .. } => self.backward_reduce(bw),
            Op::Norm { .. } | Op::RmsNorm { .. } | Op::L2Norm { .. } | Op::GroupNorm { .. } => {
                self.backward_norm(bw)
            }
            Op::SoftMax { .. } | Op::DiagMaskInf { .. } | Op::DiagMaskZero { .. } => {
                self.backward_softmax(bw)
            }
            Op::Rope(_) => self.backward_rope(bw),
            Op::GetRows => self.backward_rows(bw),
            Op::MulMat | Op::OutProd => self.backward_matmul(bw),
            Op::FlashAttnExt(_) => self.backward_attention(bw),
            Op::CrossEntropyLoss => self.backward_loss(bw),
            Op::Conv2d(_) | Op::Im2col(_) | Op::Pool2d(_) => self.backward_conv(bw),
            Op::Pad { .. } | Op::Upscale { .. } => self.backward_misc(bw),
            Op::Argmax
            | Op::CountEqual
            | Op::Argsort { .. }
            | Op::TopK { .. }
            | Op::SetRows
            | Op::OptStepAdamw
            | Op::OptStepSgd
            | Op::Arange { .. }
            | Op::TimestepEmbedding { .. }
            | Op::Fill { .. } => {
                let i = bw.need.iter().position(|&n| n).unwrap_or(0);
                Err(self.not_diff(bw.node, i, "this op has no gradient"))
            }
            Op::UnaryBack(_)
            | Op::NormBack(_)
            | Op::GetRowsBack
            | Op::Conv2dBack { .. }
            | Op::Im2colBack(_)
            | Op::Pool2dBack(_)
            | Op::UpscaleBack { .. } => {
                let i = bw.need.iter().position(|&n| n).unwrap_or(0);
                Err(self.not_diff(
                    bw.node,
                    i,
                    "second derivatives (gradients of backward ops) are not supported",
                ))
            }
        }
    }

    // ----- helpers for the rules

    /// `g` summed down to `target`'s shape (over the dims `target` was broadcast along).
    pub(crate) fn reduce_to(&mut self, g: TensorId, target: TensorId) -> Result<TensorId> {
        if self.ne(g) == self.ne(target) {
            Ok(g)
        } else {
            self.repeat_back(g, target)
        }
    }

    /// `g` [K, M, B2, B3] summed down to `target`'s batch dims [.., .., A2, A3] the way
    /// mul_mat broadcasts: batch `i2` of `g` belongs to batch `i2 / (B2/A2)` of the target
    /// (consecutive batches share a source, unlike `repeat`'s `i2 % A2`).
    pub(crate) fn reduce_batches_to(&mut self, g: TensorId, target: TensorId) -> Result<TensorId> {
        let (gne, tne) = (self.ne(g), self.ne(target));
        if gne == tne {
            return Ok(g);
        }
        let (r2, r3) = (gne[2] / tne[2], gne[3] / tne[3]);
        let km = gne[0] * gne[1];
        let mut x = self.contig(g)?;
        if r2 > 1 {
            let y = self.reshape(x, &[km, r2, tne[2], gne[3]])?;
            x = self.repeat_back_to(y, &[km, 1, tne[2], gne[3]])?;
        }
        if r3 > 1 {
            let y = self.reshape(x, &[km * tne[2], r3, tne[3]])?;
            x = self.repeat_back_to(y, &[km * tne[2], 1, tne[3]])?;
        }
        self.reshape(x, &[gne[0], gne[1], tne[2], tne[3]])
    }

    /// `x` itself when contiguous, else a contiguous copy.
    pub(crate) fn contig(&mut self, x: TensorId) -> Result<TensorId> {
        if self.tensor(x).is_contiguous() {
            Ok(x)
        } else {
            self.cont(x)
        }
    }

    /// `x` if it is f32, else an f32 copy.
    pub(crate) fn cast_f32(&mut self, x: TensorId) -> Result<TensorId> {
        if self.dtype(x) == DType::F32 {
            Ok(x)
        } else {
            self.cast(x, DType::F32)
        }
    }

    /// Contiguous f32 copy of `x` transposed (dims 0 and 1 swapped).
    pub(crate) fn transposed(&mut self, x: TensorId) -> Result<TensorId> {
        let t = self.transpose(x)?;
        self.cast(t, DType::F32)
    }
}

/// Only float tensors carry gradients (indices, counts and argmax results do not).
fn differentiable_type(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F16 | DType::BF16) || t.is_quantized()
}
