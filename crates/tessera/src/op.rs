//! The typed op enum: every operation a graph node can hold, with its parameters as typed fields
//! (ggml packs them into `op_params` bytes; we do not). Each op family's shape rule, builder,
//! reference kernel (and later backward rule) live in `ops/<family>.rs`.

pub use crate::ops::attention::{AttnPrecision, FlashAttnParams};
pub use crate::ops::conv::{Conv2dParams, Im2colParams, Pool2dParams, PoolKind};
pub use crate::ops::glu::GluKind;
pub use crate::ops::misc::UpscaleMode;
pub use crate::ops::norm::NormBackKind;
pub use crate::ops::rope::RopeParams;
pub use crate::ops::sort::SortOrder;
pub use crate::ops::unary::{Deriv, UnaryOp};

/// Where `acc`/`set` write `b` inside `a`: strides and a byte offset, as ggml takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegionParams {
    pub nb1: usize,
    pub nb2: usize,
    pub nb3: usize,
    pub offset: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A tensor with storage of its own that no op computes (input, weight, constant).
    Leaf,

    // ----- views: no computation, they alias their source's memory (ops/view.rs)
    View,
    Reshape,
    Permute {
        axes: [usize; 4],
    },
    Transpose,

    // ----- copies (ops/view.rs)
    /// Contiguous copy of a (possibly strided) tensor, optionally to another type.
    Cont,
    /// `cpy(a, b)`: writes a (converted) into b's memory, honouring b's strides.
    Cpy,

    // ----- element-wise binary with src1 broadcast over src0 (ops/binary.rs)
    Add,
    Sub,
    Mul,
    Div,
    /// `a + b` where b has one element.
    Add1,
    /// `a` with `b` added into the region.
    Acc(RegionParams),
    /// `a` with the region replaced by `b`.
    Set(RegionParams),

    // ----- element-wise unary (ops/unary.rs)
    /// `a*s + b`.
    Scale {
        s: f32,
        b: f32,
    },
    Unary(UnaryOp),
    LeakyRelu {
        negative_slope: f32,
    },
    Clamp {
        min: f32,
        max: f32,
    },

    // ----- gated linear units (ops/glu.rs); one source (fused halves) or two (split)
    Glu {
        kind: GluKind,
        swapped: bool,
    },

    // ----- reductions and reshaping of data (ops/reduce.rs)
    Sum,
    SumRows,
    Mean,
    Argmax,
    CountEqual,
    Cumsum,
    Repeat,
    RepeatBack,
    Concat {
        dim: usize,
    },

    // ----- sorting (ops/sort.rs)
    Argsort {
        order: SortOrder,
    },
    TopK {
        k: usize,
    },

    // ----- normalisation (ops/norm.rs)
    Norm {
        eps: f32,
    },
    RmsNorm {
        eps: f32,
    },
    L2Norm {
        eps: f32,
    },
    GroupNorm {
        n_groups: usize,
        eps: f32,
    },

    // ----- softmax and masks (ops/softmax.rs); SoftMax has an optional mask source
    SoftMax {
        scale: f32,
        max_bias: f32,
    },
    DiagMaskInf {
        n_past: usize,
    },
    DiagMaskZero {
        n_past: usize,
    },

    // ----- rotary embeddings (ops/rope.rs): sources a, positions (i32), optional freq factors
    Rope(RopeParams),

    // ----- row gather / scatter (ops/rows.rs)
    GetRows,
    SetRows,

    // ----- matrix products (ops/matmul.rs)
    MulMat,
    OutProd,

    // ----- attention (ops/attention.rs): q, k, v, optional mask
    FlashAttnExt(FlashAttnParams),

    // ----- training (ops/loss.rs, ops/optim.rs)
    CrossEntropyLoss,
    OptStepAdamw,
    OptStepSgd,

    // ----- convolution and pooling (ops/conv.rs)
    Conv2d(Conv2dParams),
    Im2col(Im2colParams),
    Pool2d(Pool2dParams),

    // ----- misc (ops/misc.rs)
    Pad {
        p: [usize; 4],
    },
    Upscale {
        mode: UpscaleMode,
    },
    Arange {
        start: f32,
        stop: f32,
        step: f32,
    },
    TimestepEmbedding {
        dim: usize,
        max_period: i32,
    },
    /// A tensor of one value (no sources): the zeros autodiff starts from.
    Fill {
        value: f32,
    },

    // ----- backward ops (built by autodiff; each in its forward op's family file)
    /// `grad * f'(x)`: sources grad, x (ops/unary.rs).
    UnaryBack(Deriv),
    /// Gradient of a normalisation: sources grad, x (ops/norm.rs).
    NormBack(NormBackKind),
    /// Scatter-add of gradient rows into the gathered tensor's shape (the node's shape):
    /// sources grad, idx (ops/rows.rs).
    GetRowsBack,
    /// Gradient of conv_2d: sources grad, kernel, input; w.r.t. the kernel or the input
    /// (ops/conv.rs).
    Conv2dBack {
        p: Conv2dParams,
        wrt_kernel: bool,
    },
    /// Gradient of im2col w.r.t. its input: sources grad, kernel, input (ops/conv.rs).
    Im2colBack(Im2colParams),
    /// Gradient of pool_2d: sources grad, input (ops/conv.rs).
    Pool2dBack(Pool2dParams),
    /// Gradient of nearest-neighbour upscale: sources grad, input (ops/misc.rs).
    UpscaleBack {
        mode: UpscaleMode,
    },
}

impl Op {
    /// ggml's lower-case op name (unary ops by their own name).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf => "leaf",
            Op::View => "view",
            Op::Reshape => "reshape",
            Op::Permute { .. } => "permute",
            Op::Transpose => "transpose",
            Op::Cont => "cont",
            Op::Cpy => "cpy",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Div => "div",
            Op::Add1 => "add1",
            Op::Acc(_) => "acc",
            Op::Set(_) => "set",
            Op::Scale { .. } => "scale",
            Op::Unary(u) => u.name(),
            Op::LeakyRelu { .. } => "leaky_relu",
            Op::Clamp { .. } => "clamp",
            Op::Glu { kind, .. } => kind.name(),
            Op::Sum => "sum",
            Op::SumRows => "sum_rows",
            Op::Mean => "mean",
            Op::Argmax => "argmax",
            Op::CountEqual => "count_equal",
            Op::Cumsum => "cumsum",
            Op::Repeat => "repeat",
            Op::RepeatBack => "repeat_back",
            Op::Concat { .. } => "concat",
            Op::Argsort { .. } => "argsort",
            Op::TopK { .. } => "top_k",
            Op::Norm { .. } => "norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::L2Norm { .. } => "l2_norm",
            Op::GroupNorm { .. } => "group_norm",
            Op::SoftMax { .. } => "soft_max",
            Op::DiagMaskInf { .. } => "diag_mask_inf",
            Op::DiagMaskZero { .. } => "diag_mask_zero",
            Op::Rope(_) => "rope_ext",
            Op::GetRows => "get_rows",
            Op::SetRows => "set_rows",
            Op::MulMat => "mul_mat",
            Op::OutProd => "out_prod",
            Op::FlashAttnExt(_) => "flash_attn_ext",
            Op::CrossEntropyLoss => "cross_entropy_loss",
            Op::OptStepAdamw => "opt_step_adamw",
            Op::OptStepSgd => "opt_step_sgd",
            Op::Conv2d(_) => "conv_2d",
            Op::Im2col(_) => "im2col",
            Op::Pool2d(_) => "pool_2d",
            Op::Pad { .. } => "pad",
            Op::Upscale { .. } => "upscale",
            Op::Arange { .. } => "arange",
            Op::TimestepEmbedding { .. } => "timestep_embedding",
            Op::Fill { .. } => "fill",
            Op::UnaryBack(_) => "unary_back",
            Op::NormBack(_) => "norm_back",
            Op::GetRowsBack => "get_rows_back",
            Op::Conv2dBack { .. } => "conv_2d_back",
            Op::Im2colBack(_) => "im2col_back",
            Op::Pool2dBack(_) => "pool_2d_back",
            Op::UpscaleBack { .. } => "upscale_back",
        }
    }

    /// Ops that only reinterpret their source's memory: nothing to compute.
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose
        )
    }

    /// Element-wise ops whose output may take the memory of their first source when that source
    /// is dead afterwards and has the same type, shape and contiguous layout.
    pub fn can_inplace(&self) -> bool {
        matches!(
            self,
            Op::Add
                | Op::Sub
                | Op::Mul
                | Op::Div
                | Op::Add1
                | Op::Scale { .. }
                | Op::Unary(_)
                | Op::LeakyRelu { .. }
                | Op::Clamp { .. }
                | Op::DiagMaskInf { .. }
                | Op::DiagMaskZero { .. }
        )
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
