//! CPU kernels, one file per op family (the same names as the core's `ops/`). Each family file
//! has `handles(graph, node)` (does a dedicated kernel cover these types and this layout?),
//! `work_size` and `compute`. Nodes no family handles run the reference kernel on one thread
//! (`fallback`): correct, slow, and reported by [`fast_path`].

pub mod attention;
pub mod binary;
pub mod conv;
pub mod fallback;
pub mod ggml_math;
pub mod glu;
pub mod loss;
pub mod matmul;
pub mod matmul_bf16;
pub mod matmul_quant;
pub mod misc;
pub mod norm;
pub mod optim;
pub mod out_prod_quant;
pub mod qdot;
pub mod qdot_fp;
pub mod qdot_iq13;
pub mod qdot_iq2;
#[cfg(target_arch = "aarch64")]
pub mod qdot_neon;
pub mod qdot_tiles;
pub mod qgemm_0;
pub mod qgemm_k;
#[cfg(target_arch = "x86_64")]
pub mod qgemv_0;
#[cfg(target_arch = "x86_64")]
pub mod qgemv_avx2;
pub mod qgemv_repack;
pub mod qgemv_repack_k;
pub mod qgemv_repack_q2k;
pub mod reduce;
pub mod rope;
pub mod rows;
pub mod softmax;
pub mod sort;
pub mod unary;
pub mod view;

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;

/// The family of dedicated kernels for an op, if one exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Nothing,
    Binary,
    Unary,
    Glu,
    Norm,
    SoftMax,
    Rope,
    Rows,
    View,
    Attention,
    Reduce,
    MatMul,
    Sort,
    Loss,
    Optim,
    Conv,
    Misc,
}

fn family(op: &Op) -> Family {
    match op {
        Op::Leaf | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => Family::Nothing,
        Op::Cont | Op::Cpy => Family::View,
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Add1 | Op::Acc(_) | Op::Set(_) => {
            Family::Binary
        }
        Op::Scale { .. } | Op::Unary(_) | Op::LeakyRelu { .. } | Op::Clamp { .. } => Family::Unary,
        Op::Glu { .. } => Family::Glu,
        Op::Sum
        | Op::SumRows
        | Op::Mean
        | Op::Argmax
        | Op::CountEqual
        | Op::Cumsum
        | Op::Repeat
        | Op::RepeatBack
        | Op::Concat { .. } => Family::Reduce,
        Op::Norm { .. } | Op::RmsNorm { .. } | Op::L2Norm { .. } | Op::GroupNorm { .. } => {
            Family::Norm
        }
        Op::SoftMax { .. } | Op::DiagMaskInf { .. } | Op::DiagMaskZero { .. } => Family::SoftMax,
        Op::Rope(_) => Family::Rope,
        Op::GetRows | Op::SetRows => Family::Rows,
        Op::MulMat | Op::OutProd => Family::MatMul,
        Op::FlashAttnExt(_) => Family::Attention,
        Op::Argsort { .. } | Op::TopK { .. } => Family::Sort,
        Op::CrossEntropyLoss => Family::Loss,
        Op::OptStepAdamw | Op::OptStepSgd => Family::Optim,
        Op::Conv2d(_) | Op::Im2col(_) | Op::Pool2d(_) => Family::Conv,
        Op::Pad { .. }
        | Op::Upscale { .. }
        | Op::Arange { .. }
        | Op::TimestepEmbedding { .. }
        | Op::Fill { .. }
        | Op::UpscaleBack { .. } => Family::Misc,
        Op::UnaryBack(_) => Family::Unary,
        Op::NormBack(_) => Family::Norm,
        Op::GetRowsBack => Family::Rows,
        Op::Conv2dBack { .. } | Op::Im2colBack(_) | Op::Pool2dBack(_) => Family::Conv,
    }
}

/// Can this backend run `op` on these types? (Everything the reference can: what has no
/// dedicated kernel runs the reference kernel.)
pub fn supports(op: &Op, src: &[DType], dst: DType) -> bool {
    fallback::supports(op, src, dst)
}

/// Whether node `t` runs on a dedicated kernel (true) or on the single-threaded fallback.
pub fn fast_path(graph: &Graph, t: &Tensor) -> bool {
    let s = |i: usize| graph.tensor(t.src[i]);
    match family(&t.op) {
        Family::Nothing => true,
        Family::Binary => binary::handles(graph, t),
        Family::Unary => unary::handles(graph, t),
        Family::Glu => glu::handles(graph, t),
        Family::Norm => norm::handles(graph, t),
        Family::SoftMax => softmax::handles(graph, t),
        Family::Rope => rope::handles(graph, t),
        Family::Rows => rows::handles(graph, t),
        Family::View => view::handles(graph, t),
        Family::Attention => attention::handles(graph, t),
        Family::Reduce => reduce::handles(graph, t),
        Family::MatMul => match t.op {
            Op::MulMat => matmul::handles(t, s(0), s(1)) || matmul_quant::handles(t, s(0), s(1)),
            _ => matmul::handles_out_prod(graph, t) || out_prod_quant::handles(graph, t),
        },
        Family::Sort => sort::handles(graph, t),
        Family::Loss => loss::handles(graph, t),
        Family::Optim => optim::handles(graph, t),
        Family::Conv => conv::handles(graph, t),
        Family::Misc => misc::handles(graph, t),
    }
}

/// Bytes of scratch a node needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    if !fast_path(graph, t) {
        return 0;
    }
    let s = |i: usize| graph.tensor(t.src[i]);
    match family(&t.op) {
        Family::Binary => binary::work_size(graph, t, nth),
        Family::Unary => unary::work_size(graph, t, nth),
        Family::Glu => glu::work_size(graph, t, nth),
        Family::Norm => norm::work_size(graph, t, nth),
        Family::SoftMax => softmax::work_size(graph, t, nth),
        Family::Rope => rope::work_size(graph, t, nth),
        Family::Rows => rows::work_size(graph, t, nth),
        Family::View => view::work_size(graph, t, nth),
        Family::Attention => attention::work_size(graph, t, nth),
        Family::Reduce => reduce::work_size(graph, t, nth),
        Family::MatMul => match t.op {
            Op::MulMat if s(0).dtype.is_quantized() => matmul_quant::work_size(s(0), s(1), nth),
            Op::MulMat => matmul::work_size(s(0), s(1), nth),
            _ if s(0).dtype.is_quantized() => out_prod_quant::work_size(nth),
            _ => 0,
        },
        Family::Sort => sort::work_size(graph, t, nth),
        Family::Loss => loss::work_size(graph, t, nth),
        Family::Optim => optim::work_size(graph, t, nth),
        Family::Conv => conv::work_size(graph, t, nth),
        Family::Misc => misc::work_size(graph, t, nth),
        Family::Nothing => 0,
    }
}

/// Internal barriers a node's kernel passes on every thread (see [`NodeCtx::barrier`]).
pub fn barriers(ctx: &NodeCtx) -> usize {
    if !fast_path(ctx.graph, ctx.t) {
        return 0;
    }
    let s0 = ctx.s(0);
    match &ctx.t.op {
        Op::MulMat if s0.dtype.is_quantized() => 1,
        Op::MulMat if s0.dtype != DType::F32 => 1, // b converted to the weights' type first
        Op::Sum | Op::CountEqual | Op::Conv2d(_) | Op::CrossEntropyLoss => 1,
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Add1 | Op::Acc(_) | Op::Set(_) => {
            binary::barriers(ctx)
        }
        _ => 0,
    }
}

/// Computes this thread's share of one node.
pub fn compute(ctx: &NodeCtx) -> Result<()> {
    if !fast_path(ctx.graph, ctx.t) {
        if let Some(a) = ctx.t.src.first().map(|&s| ctx.graph.tensor(s)) {
            if a.layout == tessera::RowLayout::Repacked8 {
                // the fallback's arithmetic is not ggml's repack arithmetic: say so, rather
                // than give other bits than the layout promises
                return Err(ctx.err(format!(
                    "weights {} with ggml's repack arithmetic (RowLayout::Repacked8) take only \
                     a contiguous f32 result of an f32 second operand",
                    a.describe()
                )));
            }
        }
        return fallback::compute(ctx);
    }
    match family(&ctx.t.op) {
        Family::Nothing => Ok(()),
        Family::Binary => binary::compute(ctx),
        Family::Unary => unary::compute(ctx),
        Family::Glu => glu::compute(ctx),
        Family::Norm => norm::compute(ctx),
        Family::SoftMax => softmax::compute(ctx),
        Family::Rope => rope::compute(ctx),
        Family::Rows => rows::compute(ctx),
        Family::View => view::compute(ctx),
        Family::Attention => attention::compute(ctx),
        Family::Reduce => reduce::compute(ctx),
        Family::MatMul => match ctx.t.op {
            Op::MulMat if ctx.s(0).dtype.is_quantized() => matmul_quant::compute(ctx),
            Op::MulMat => matmul::compute(ctx),
            _ if ctx.s(0).dtype.is_quantized() => out_prod_quant::compute(ctx),
            _ => matmul::compute_out_prod(ctx),
        },
        Family::Sort => sort::compute(ctx),
        Family::Loss => loss::compute(ctx),
        Family::Optim => optim::compute(ctx),
        Family::Conv => conv::compute(ctx),
        Family::Misc => misc::compute(ctx),
    }
}
