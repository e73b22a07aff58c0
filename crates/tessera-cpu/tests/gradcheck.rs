//! Gradient checks: for every differentiable op, the analytic gradient that `build_backward`
//! builds (run on the reference backend and on the CPU backend at 1 and 2 threads) against
//! central finite differences of the reference forward pass, over random values, random
//! shapes, broadcasting, views and permuted inputs. The loss is `Σ out·r` with a fixed random
//! `r`, so every output element matters with its own weight.

mod common;

use common::Rng;
use tessera::op::{GluKind, PoolKind, RopeParams, UpscaleMode};
use tessera::{DType, Error, Graph, ReferenceBackend, Result, Session, TensorId};
use tessera_cpu::CpuBackend;

#[derive(Clone)]
enum Init {
    /// uniform in [lo, hi), nudged away from the kinks listed (non-smooth functions)
    Rand(f32, f32, &'static [f32]),
    /// i32 indices below n
    Idx(usize),
    /// rows that sum to 1 (labels)
    Probs,
    /// multiples of 1/16 in [-2, 2]: exact in f16, for ops that round to f16 and are linear
    F16Exact,
}

#[derive(Clone)]
struct In {
    ne: Vec<usize>,
    dt: DType,
    init: Init,
    param: bool,
}

fn p(ne: &[usize]) -> In {
    In {
        ne: ne.to_vec(),
        dt: DType::F32,
        init: Init::Rand(-1.0, 1.0, &[]),
        param: true,
    }
}
fn c(ne: &[usize]) -> In {
    In {
        param: false,
        ..p(ne)
    }
}
fn with(mut i: In, init: Init) -> In {
    i.init = init;
    i
}
fn typed(mut i: In, dt: DType) -> In {
    i.dt = dt;
    i
}
fn idx(ne: &[usize], n: usize) -> In {
    In {
        ne: ne.to_vec(),
        dt: DType::I32,
        init: Init::Idx(n),
        param: false,
    }
}

fn values(rng: &mut Rng, i: &In) -> Vec<f32> {
    let n: usize = i.ne.iter().product();
    match &i.init {
        Init::Rand(lo, hi, kinks) => (0..n)
            .map(|_| {
                let mut x = rng.uniform(*lo, *hi);
                for &k in *kinks {
                    if (x - k).abs() < 0.05 {
                        x = k + if x >= k { 0.05 } else { -0.05 };
                    }
                }
                x
            })
            .collect(),
        Init::Idx(m) => (0..n).map(|_| rng.below(*m) as f32).collect(),
        Init::Probs => {
            let row = i.ne[0];
            let raw: Vec<f32> = (0..n).map(|_| rng.uniform(0.05, 1.0)).collect();
            raw.chunks(row)
                .flat_map(|r| {
                    let s: f32 = r.iter().sum();
                    r.iter().map(move |v| v / s).collect::<Vec<_>>()
                })
                .collect()
        }
        Init::F16Exact => (0..n)
            .map(|_| (rng.below(65) as f32 - 32.0) / 16.0)
            .collect(),
    }
}

fn set(s: &mut Session, id: TensorId, i: &In, v: &[f32]) {
    if i.dt == DType::I32 {
        let iv: Vec<i32> = v.iter().map(|&x| x as i32).collect();
        s.set_i32(id, &iv).unwrap();
    } else {
        s.set_f32(id, v).unwrap();
    }
}

struct Built {
    g: Graph,
    ids: Vec<TensorId>,
    out: TensorId,
    r: TensorId,
    grads: tessera::Gradients,
}

fn build(ins: &[In], f: &dyn Fn(&mut Graph, &[TensorId]) -> Result<TensorId>) -> Result<Built> {
    let mut g = Graph::new();
    let mut ids = Vec::new();
    for (k, i) in ins.iter().enumerate() {
        let id = g.new_tensor(i.dt, &i.ne)?;
        g.set_name(id, format!("in{k}"));
        if i.param {
            g.set_param(id)?;
        }
        ids.push(id);
    }
    let out = f(&mut g, &ids)?;
    let ne = g.ne(out);
    let o32 = g.cast(out, DType::F32)?;
    let r = g.new_f32(&ne)?;
    let prod = g.mul(o32, r)?;
    let loss = g.sum(prod)?;
    g.set_loss(loss)?;
    let grads = g.build_backward(false)?;
    Ok(Built {
        g,
        ids,
        out,
        r,
        grads,
    })
}

/// Checks the gradients of every param input of `f` against finite differences with step `h`;
/// `tol` bounds `|fd - analytic| / (|analytic| + 0.05·max|analytic| + 1e-3)`.
fn gradcheck(
    what: &str,
    ins: &[In],
    h: f32,
    tol: f64,
    f: &dyn Fn(&mut Graph, &[TensorId]) -> Result<TensorId>,
) {
    let b = build(ins, f).unwrap_or_else(|e| panic!("{what}: building failed: {e}"));
    let mut rng = Rng::new(
        what.bytes()
            .fold(7u64, |a, x| a.wrapping_mul(31).wrapping_add(x as u64)),
    );
    let vals: Vec<Vec<f32>> = ins.iter().map(|i| values(&mut rng, i)).collect();
    let rn = b.g.tensor(b.r).nelements();
    let rv: Vec<f32> = (0..rn).map(|_| rng.uniform(-1.0, 1.0)).collect();

    // analytic gradients on every backend
    let backends: Vec<(String, Box<dyn tessera::Backend>)> = vec![
        ("reference".into(), Box::new(ReferenceBackend)),
        ("cpu-1".into(), Box::new(CpuBackend::new(1))),
        ("cpu-2".into(), Box::new(CpuBackend::new(2))),
    ];
    let mut analytic: Vec<Vec<Vec<f64>>> = Vec::new();
    for (name, be) in &backends {
        let mut s = Session::new(b.g.clone(), &b.grads.outputs()).unwrap();
        for (k, i) in ins.iter().enumerate() {
            set(&mut s, b.ids[k], i, &vals[k]);
        }
        s.set_f32(b.r, &rv).unwrap();
        b.grads.reset(&mut s).unwrap();
        s.compute(be.as_ref())
            .unwrap_or_else(|e| panic!("{what}: backward on {name} failed: {e}"));
        analytic.push(
            b.grads
                .grads
                .iter()
                .map(|&gid| s.get_f64(gid).unwrap())
                .collect(),
        );
    }

    // the loss in f64 from the forward pass on the reference backend
    let mut fwd = Session::new(b.g.clone(), &[b.out]).unwrap();
    for (k, i) in ins.iter().enumerate() {
        set(&mut fwd, b.ids[k], i, &vals[k]);
    }
    let loss = |fwd: &mut Session, k: usize, v: &[f32]| -> f64 {
        set(fwd, b.ids[k], &ins[k], v);
        fwd.compute(&ReferenceBackend).unwrap();
        let o = fwd.get_f64(b.out).unwrap();
        o.iter().zip(&rv).map(|(a, r)| a * *r as f64).sum()
    };

    for (pi, &pid) in b.grads.params.iter().enumerate() {
        let k = b.ids.iter().position(|&x| x == pid).unwrap();
        let an = &analytic[0][pi];
        let gmax = an.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        // every backend agrees with the reference backend
        for (bi, (name, _)) in backends.iter().enumerate().skip(1) {
            for (j, (x, y)) in analytic[bi][pi].iter().zip(an).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-4 * (gmax + 1e-3),
                    "{what}: d/d in{k}[{j}] on {name} = {x}, reference backend {y}"
                );
            }
        }
        let n = an.len();
        let picks: Vec<usize> = if n <= 24 {
            (0..n).collect()
        } else {
            (0..24).map(|_| rng.below(n)).collect()
        };
        let mut v = vals[k].clone();
        for j in picks {
            let x0 = v[j];
            let (xp, xm) = (x0 + h, x0 - h);
            v[j] = xp;
            let lp = loss(&mut fwd, k, &v);
            v[j] = xm;
            let lm = loss(&mut fwd, k, &v);
            v[j] = x0;
            let fd = (lp - lm) / (xp as f64 - xm as f64);
            let err = (fd - an[j]).abs() / (an[j].abs() + 0.05 * gmax + 1e-3);
            assert!(
                err <= tol,
                "{what}: d/d in{k}[{j}]: analytic {} vs finite difference {fd} (rel err {err:.2e})",
                an[j]
            );
        }
        set(&mut fwd, b.ids[k], &ins[k], &vals[k]);
    }
}

const H: f32 = 2e-3;
const TOL: f64 = 1e-2;

fn check(what: &str, ins: &[In], f: &dyn Fn(&mut Graph, &[TensorId]) -> Result<TensorId>) {
    gradcheck(what, ins, H, TOL, f)
}

fn random_shape(rng: &mut Rng) -> [usize; 4] {
    [
        1 + rng.below(6),
        1 + rng.below(4),
        1 + rng.below(3),
        1 + rng.below(2),
    ]
}

#[test]
fn binary_ops_with_broadcasting() {
    let mut rng = Rng::new(1);
    for round in 0..3 {
        let a = random_shape(&mut rng);
        // b: each dim 1 or a's (broadcast), or the same shape
        let bshape: Vec<usize> = if round == 0 {
            a.to_vec()
        } else {
            a.iter()
                .map(|&d| if rng.below(2) == 0 { 1 } else { d })
                .collect()
        };
        let what = |op: &str| format!("{op} a{a:?} b{bshape:?}");
        check(&what("add"), &[p(&a), p(&bshape)], &|g, x| {
            g.add(x[0], x[1])
        });
        check(&what("sub"), &[p(&a), p(&bshape)], &|g, x| {
            g.sub(x[0], x[1])
        });
        check(&what("mul"), &[p(&a), p(&bshape)], &|g, x| {
            g.mul(x[0], x[1])
        });
        let pos = with(p(&bshape), Init::Rand(0.5, 2.0, &[]));
        check(&what("div"), &[p(&a), pos], &|g, x| g.div(x[0], x[1]));
    }
    check("add1", &[p(&[4, 3]), p(&[1])], &|g, x| g.add1(x[0], x[1]));
    // acc / set into a region: b [2, 2] at row 1, column 1 of a [4, 3]
    check("acc", &[p(&[4, 3]), p(&[2, 2])], &|g, x| {
        g.acc(x[0], x[1], 16, 32, 32, 20)
    });
    check("set", &[p(&[4, 3]), p(&[2, 2])], &|g, x| {
        g.set(x[0], x[1], 16, 32, 32, 20)
    });
}

#[test]
fn unary_ops() {
    use tessera::op::UnaryOp as U;
    let mut rng = Rng::new(2);
    for u in U::ALL {
        if matches!(u, U::Step | U::Sgn) {
            continue; // not differentiable: see non_differentiable_ops_are_refused
        }
        let ne = random_shape(&mut rng);
        let init = match u {
            U::Log | U::Sqrt => Init::Rand(0.3, 2.0, &[]),
            U::Hardswish | U::Hardsigmoid => Init::Rand(-4.0, 4.0, &[-3.0, 3.0]),
            U::Abs | U::Relu | U::Elu => Init::Rand(-1.0, 1.0, &[0.0]),
            _ => Init::Rand(-2.0, 2.0, &[]),
        };
        check(
            &format!("{} {ne:?}", u.name()),
            &[with(p(&ne), init)],
            &|g, x| g.unary(x[0], u),
        );
    }
    check("scale", &[p(&[5, 3])], &|g, x| g.scale(x[0], -1.5));
    check("scale_bias", &[p(&[5, 3])], &|g, x| {
        g.scale_bias(x[0], 0.7, 2.0)
    });
    let kinked = with(p(&[6, 4]), Init::Rand(-1.0, 1.0, &[0.0]));
    check("leaky_relu", &[kinked], &|g, x| g.leaky_relu(x[0], 0.1));
    let kinked = with(p(&[6, 4]), Init::Rand(-1.0, 1.0, &[-0.5, 0.5]));
    check("clamp", &[kinked], &|g, x| g.clamp(x[0], -0.5, 0.5));
    // a unary op on a permuted (non-contiguous) input
    check("tanh of a permuted input", &[p(&[3, 4, 2])], &|g, x| {
        let t = g.permute(x[0], [1, 0, 2, 3])?;
        g.tanh(t)
    });
}

#[test]
fn glu_forms() {
    for kind in GluKind::ALL {
        for swapped in [false, true] {
            let init = with(p(&[8, 3, 2]), Init::Rand(-1.0, 1.0, &[0.0]));
            check(
                &format!("{} fused swapped={swapped}", kind.name()),
                &[init],
                &|g, x| g.glu(x[0], kind, swapped),
            );
        }
        let a = with(p(&[5, 3]), Init::Rand(-1.0, 1.0, &[0.0]));
        check(
            &format!("{} split", kind.name()),
            &[a, p(&[5, 3])],
            &|g, x| g.glu_split(x[0], x[1], kind),
        );
    }
}

#[test]
fn reductions_and_tilings() {
    check("sum", &[p(&[4, 3, 2])], &|g, x| g.sum(x[0]));
    check("sum_rows", &[p(&[4, 3, 2])], &|g, x| g.sum_rows(x[0]));
    check("mean", &[p(&[5, 3])], &|g, x| g.mean(x[0]));
    check("cumsum", &[p(&[6, 3])], &|g, x| g.cumsum(x[0]));
    check("repeat", &[p(&[3, 1, 2])], &|g, x| {
        g.repeat_to(x[0], &[6, 2, 2, 2])
    });
    check("repeat_back", &[p(&[6, 2, 2])], &|g, x| {
        let t = g.new_f32(&[3, 1, 2])?;
        g.repeat_back(x[0], t)
    });
    for dim in 0..4 {
        let mut bne = [3, 2, 2, 2];
        bne[dim] = 1;
        check(
            &format!("concat dim {dim}"),
            &[p(&[3, 2, 2, 2]), p(&bne)],
            &|g, x| g.concat(x[0], x[1], dim),
        );
    }
}

#[test]
fn views_and_copies() {
    check("view (strided, offset)", &[p(&[6, 4])], &|g, x| {
        let v = g.view(x[0], &[3, 2], &[48], 8)?;
        g.sqr(v)
    });
    check("reshape", &[p(&[6, 4])], &|g, x| {
        let r = g.reshape(x[0], &[3, 8])?;
        g.sqr(r)
    });
    check("permute + cont", &[p(&[2, 3, 4, 2])], &|g, x| {
        let t = g.permute(x[0], [2, 0, 3, 1])?;
        let c = g.cont(t)?;
        g.sqr(c)
    });
    check("transpose + mul", &[p(&[3, 4]), p(&[4, 3])], &|g, x| {
        let t = g.transpose(x[0])?;
        g.mul(t, x[1])
    });
    check("cpy into a strided view", &[p(&[3, 2])], &|g, x| {
        let dst = g.new_f32(&[2, 3])?;
        let v = g.transpose(dst)?;
        let w = g.cpy(x[0], v)?;
        g.sqr(w)
    });
}

#[test]
fn normalisations() {
    check("norm", &[p(&[7, 3])], &|g, x| g.norm(x[0], 1e-5));
    check("rms_norm", &[p(&[7, 3])], &|g, x| g.rms_norm(x[0], 1e-6));
    check("l2_norm", &[p(&[7, 3])], &|g, x| g.l2_norm(x[0], 1e-12));
    check("group_norm", &[p(&[3, 2, 6, 2])], &|g, x| {
        g.group_norm(x[0], 3, 1e-5)
    });
    check("rms_norm of a transposed input", &[p(&[3, 7])], &|g, x| {
        let t = g.transpose(x[0])?;
        let c = g.cont(t)?;
        g.rms_norm(c, 1e-6)
    });
}

#[test]
fn softmax_and_masks() {
    check("soft_max", &[p(&[6, 3, 2])], &|g, x| g.soft_max(x[0]));
    // scale and an f32 mask broadcast over dim 2; the mask gets its gradient too
    check(
        "soft_max_ext scale+mask",
        &[p(&[6, 3, 2]), p(&[6, 3])],
        &|g, x| g.soft_max_ext(x[0], Some(x[1]), 0.7, 0.0),
    );
    check(
        "soft_max_ext ALiBi (f16 mask)",
        &[p(&[6, 3, 4]), typed(c(&[6, 3]), DType::F16)],
        &|g, x| g.soft_max_ext(x[0], Some(x[1]), 0.5, 8.0),
    );
    check("diag_mask_inf + soft_max", &[p(&[5, 5, 2])], &|g, x| {
        let m = g.diag_mask_inf(x[0], 0)?;
        g.soft_max(m)
    });
    check("diag_mask_zero", &[p(&[5, 4])], &|g, x| {
        g.diag_mask_zero(x[0], 1)
    });
}

#[test]
fn rope_variants() {
    let pos = idx(&[5], 50);
    check("rope normal", &[p(&[8, 2, 5]), pos.clone()], &|g, x| {
        g.rope_ext(x[0], x[1], None, RopeParams::new(8, 0))
    });
    check(
        "rope neox, partial dims",
        &[p(&[8, 2, 5]), pos.clone()],
        &|g, x| g.rope_ext(x[0], x[1], None, RopeParams::new(4, 2)),
    );
    check(
        "rope YaRN + freq factors",
        &[p(&[8, 2, 5]), pos, with(c(&[4]), Init::Rand(1.0, 3.0, &[]))],
        &|g, x| {
            let mut rp = RopeParams::new(8, 2);
            rp.n_ctx_orig = 32;
            rp.freq_scale = 0.25;
            rp.ext_factor = 1.0;
            rp.attn_factor = 1.3;
            rp.beta_fast = 32.0;
            rp.beta_slow = 1.0;
            g.rope_ext(x[0], x[1], Some(x[2]), rp)
        },
    );
}

#[test]
fn get_rows_any_count() {
    // more rows gathered than the source has, so indices repeat and gradients add up
    check("get_rows", &[p(&[4, 5]), idx(&[9], 5)], &|g, x| {
        g.get_rows(x[0], x[1])
    });
    check(
        "get_rows batched",
        &[p(&[3, 4, 2]), idx(&[6, 2], 4)],
        &|g, x| g.get_rows(x[0], x[1]),
    );
}

#[test]
fn matrix_products() {
    check("mul_mat", &[p(&[5, 3]), p(&[5, 4])], &|g, x| {
        g.mul_mat(x[0], x[1])
    });
    check(
        "mul_mat broadcast over batches",
        &[p(&[5, 3, 1, 2]), p(&[5, 4, 3, 2])],
        &|g, x| g.mul_mat(x[0], x[1]),
    );
    check(
        "mul_mat broadcast, grouped batches",
        &[p(&[5, 3, 2, 2]), p(&[5, 4, 4, 6])],
        &|g, x| g.mul_mat(x[0], x[1]),
    );
    check(
        "mul_mat of a transposed b",
        &[p(&[4, 3]), p(&[6, 4])],
        &|g, x| {
            let t = g.transpose(x[1])?;
            let b = g.cont(t)?;
            g.mul_mat(x[0], b)
        },
    );
    check("out_prod", &[p(&[3, 5]), p(&[4, 5])], &|g, x| {
        g.out_prod(x[0], x[1])
    });
    // f16 and bf16 weights: the activation gradient (exact up to the operand rounding the
    // forward op does, which the finite difference sees: looser bound)
    for dt in [DType::F16, DType::BF16] {
        // the forward op rounds b to the weight's type: a step far above that rounding
        gradcheck(
            &format!("mul_mat {dt} a"),
            &[typed(c(&[8, 3]), dt), p(&[8, 4])],
            0.25,
            2e-2,
            &|g, x| g.mul_mat(x[0], x[1]),
        );
    }
}

/// With a quantized weight the activation gradient goes through `out_prod` (no f32 copy of
/// the weight): it must equal the gradient with the dequantized weight in f32.
#[test]
fn mul_mat_quantized_weight_activation_gradient() {
    let mut rng = Rng::new(9);
    let (k, m, n) = (64, 5, 3);
    let w: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let x: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let r: Vec<f32> = (0..m * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    // returns (the gradient w.r.t. x, the weight's values as the graph saw them)
    let run = |dt: DType, wv: &[f32]| -> (Vec<f64>, Vec<f32>) {
        let mut g = Graph::new();
        let wt = g.new_tensor(dt, &[k, m]).unwrap();
        let xt = g.new_f32(&[k, n]).unwrap();
        g.set_param(xt).unwrap();
        let y = g.mul_mat(wt, xt).unwrap();
        let rt = g.new_f32(&[m, n]).unwrap();
        let pr = g.mul(y, rt).unwrap();
        let l = g.sum(pr).unwrap();
        g.set_loss(l).unwrap();
        let gr = g.build_backward(false).unwrap();
        if dt.is_quantized() {
            for i in 0..g.len() as u32 {
                let t = g.tensor(TensorId(i));
                assert!(
                    !(t.src.first() == Some(&wt)
                        && matches!(t.op, tessera::Op::Cont | tessera::Op::Transpose)),
                    "{dt}: no copy or transpose of the weight may be built"
                );
            }
        }
        let mut s = Session::new(g, &gr.outputs()).unwrap();
        s.set_f32(wt, wv).unwrap();
        s.set_f32(xt, &x).unwrap();
        s.set_f32(rt, &r).unwrap();
        gr.reset(&mut s).unwrap();
        s.compute(&CpuBackend::new(2)).unwrap();
        (s.get_f64(gr.grads[0]).unwrap(), s.get_f32(wt).unwrap())
    };
    for dt in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let (gq, deq) = run(dt, &w);
        let (gf, _) = run(DType::F32, &deq);
        for (a, b) in gq.iter().zip(&gf) {
            assert!(
                (a - b).abs() < 1e-5,
                "{dt} weight: {a} vs its dequantized f32 weight {b}"
            );
        }
    }
}

#[test]
fn attention() {
    // q [D, n_q, H], k/v [D, n_kv, H_kv] with grouped-query heads, f16 mask
    let q = p(&[8, 3, 4, 1]);
    let k = p(&[8, 5, 2, 1]);
    let v = p(&[8, 5, 2, 1]);
    let mask = typed(with(c(&[5, 3]), Init::Rand(-1.0, 0.0, &[])), DType::F16);
    check(
        "flash_attn_ext",
        &[q.clone(), k.clone(), v.clone(), mask.clone()],
        &|g, x| g.flash_attn_ext(x[0], x[1], x[2], Some(x[3]), 0.35, 0.0, 0.0),
    );
    check(
        "flash_attn_ext softcap + ALiBi",
        &[q, k, v, mask],
        &|g, x| g.flash_attn_ext(x[0], x[1], x[2], Some(x[3]), 0.35, 4.0, 2.0),
    );
}

#[test]
fn cross_entropy() {
    check(
        "cross_entropy_loss",
        &[p(&[7, 4]), with(p(&[7, 4]), Init::Probs)],
        &|g, x| g.cross_entropy_loss(x[0], x[1]),
    );
}

#[test]
fn convolution_pooling_padding_upscaling() {
    // conv_2d rounds its operands to f16 like ggml and is linear in each: f16-exact values
    // and a step that keeps them exact make the finite difference exact
    let k = with(p(&[3, 2, 2, 3]), Init::F16Exact);
    let x = with(p(&[5, 4, 2, 2]), Init::F16Exact);
    gradcheck("conv_2d", &[k, x], 1.0 / 16.0, 1e-3, &|g, x| {
        g.conv_2d(x[0], x[1], 2, 1, 1, 0, 1, 2)
    });
    check("im2col", &[c(&[3, 2, 2, 3]), p(&[5, 4, 2, 2])], &|g, x| {
        g.im2col(x[0], x[1], 1, 2, 1, 1, 1, 1, true, DType::F32)
    });
    check("pool_2d avg", &[p(&[6, 5, 2])], &|g, x| {
        g.pool_2d(x[0], PoolKind::Avg, 2, 2, 2, 1, 1, 0)
    });
    check("pool_2d max", &[p(&[6, 5, 2])], &|g, x| {
        g.pool_2d(x[0], PoolKind::Max, 2, 2, 2, 2, 0, 0)
    });
    check("pad", &[p(&[3, 2, 2])], &|g, x| g.pad(x[0], 2, 1, 0, 1));
    check("upscale nearest", &[p(&[3, 2, 2])], &|g, x| {
        g.upscale(x[0], 2)
    });
    check("upscale bilinear", &[p(&[3, 2, 2])], &|g, x| {
        g.upscale_ext(x[0], 7, 5, 2, 1, UpscaleMode::Bilinear)
    });
}

#[test]
fn non_differentiable_ops_are_refused() {
    let mut g = Graph::new();
    let a = g.new_f32(&[4, 3]).unwrap();
    g.set_param(a).unwrap();
    let s = g.unary(a, tessera::op::UnaryOp::Step).unwrap();
    let l = g.sum(s).unwrap();
    g.set_loss(l).unwrap();
    let err = g.build_backward(false).unwrap_err();
    assert!(
        matches!(err, Error::NotDifferentiable { op: "step", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("step"), "{err}");

    // argmax feeds an index: the gradient cannot pass through it
    let mut g = Graph::new();
    let a = g.new_f32(&[4, 3]).unwrap();
    let b = g.new_f32(&[2, 4]).unwrap();
    g.set_param(a).unwrap();
    g.set_param(b).unwrap();
    let am = g.argmax(a).unwrap();
    let rows = g.get_rows(b, am).unwrap(); // depends on a only through the indices
    let l = g.sum(rows).unwrap();
    g.set_loss(l).unwrap();
    let gr = g.build_backward(false).unwrap();
    // b gets a gradient; a, reachable only through argmax's integer output, gets zeros
    let mut sess = Session::new(g, &gr.outputs()).unwrap();
    sess.set_f32(
        a,
        &[0.0, 5.0, 1.0, 2.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0],
    )
    .unwrap();
    gr.reset(&mut sess).unwrap();
    sess.compute(&CpuBackend::new(1)).unwrap();
    let ia = gr.params.iter().position(|&x| x == a).unwrap();
    let ib = gr.params.iter().position(|&x| x == b).unwrap();
    assert_eq!(sess.get_f32(gr.grads[ia]).unwrap(), vec![0.0; 12]);
    // rows 1, 0, 3 of b gathered once each
    assert_eq!(
        sess.get_f32(gr.grads[ib]).unwrap(),
        vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    );
}

#[test]
fn bad_graphs_are_named() {
    // no loss
    let mut g = Graph::new();
    let a = g.new_f32(&[3]).unwrap();
    g.set_param(a).unwrap();
    let _ = g.sum(a).unwrap();
    let e = g.build_backward(false).unwrap_err().to_string();
    assert!(e.contains("no loss"), "{e}");
    // no param
    let mut g = Graph::new();
    let a = g.new_f32(&[3]).unwrap();
    let l = g.sum(a).unwrap();
    g.set_loss(l).unwrap();
    let e = g.build_backward(false).unwrap_err().to_string();
    assert!(e.contains("no param"), "{e}");
    // a loss that is not a scalar: refused with its shape
    let mut g = Graph::new();
    let a = g.new_f32(&[3, 2]).unwrap();
    let e = g.set_loss(a).unwrap_err().to_string();
    assert!(e.contains("[3, 2"), "{e}");
}

#[test]
fn frozen_weights_get_no_gradient_graph() {
    let build = |train_w: bool| {
        let mut g = Graph::new();
        let w = g.new_f32(&[8, 6]).unwrap();
        let x = g.new_f32(&[8, 4]).unwrap();
        g.set_param(x).unwrap();
        if train_w {
            g.set_param(w).unwrap();
        }
        let y = g.mul_mat(w, x).unwrap();
        let l = g.sum(y).unwrap();
        g.set_loss(l).unwrap();
        let before = g.len();
        let gr = g.build_backward(false).unwrap();
        (g.len() - before, gr.params.len())
    };
    let (frozen_nodes, frozen_params) = build(false);
    let (full_nodes, full_params) = build(true);
    assert_eq!((frozen_params, full_params), (1, 2));
    assert!(
        frozen_nodes < full_nodes,
        "a frozen weight must not get gradient nodes ({frozen_nodes} vs {full_nodes})"
    );
}

#[test]
fn accumulate_mode_sums_micro_batches_and_reset_clears() {
    let mut g = Graph::new();
    let w = g.new_f32(&[3]).unwrap();
    let x = g.new_f32(&[3]).unwrap();
    g.set_param(w).unwrap();
    let y = g.mul(w, x).unwrap();
    let l = g.sum(y).unwrap();
    g.set_loss(l).unwrap();
    let gr = g.build_backward(true).unwrap();
    let mut s = Session::new(g, &gr.outputs()).unwrap();
    s.set_f32(w, &[1.0, 2.0, 3.0]).unwrap();
    gr.reset(&mut s).unwrap();
    let be = CpuBackend::new(2);
    s.set_f32(x, &[1.0, 10.0, 100.0]).unwrap();
    s.compute(&be).unwrap();
    s.set_f32(x, &[2.0, 20.0, 200.0]).unwrap();
    s.compute(&be).unwrap();
    assert_eq!(s.get_f32(gr.accs[0]).unwrap(), vec![3.0, 30.0, 300.0]);
    gr.reset(&mut s).unwrap();
    assert_eq!(s.get_f32(gr.accs[0]).unwrap(), vec![0.0; 3]);
    s.compute(&be).unwrap();
    assert_eq!(s.get_f32(gr.accs[0]).unwrap(), vec![2.0, 20.0, 200.0]);
}
