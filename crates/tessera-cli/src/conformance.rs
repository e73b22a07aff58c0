//! `tessera conformance ops FILE.gguf`: rebuilds every case of a golden ops file written by ggml
//! (see `shared/golden/README.md`) from its `desc` and inputs, runs it on every backend and
//! compares the output with ggml's by normalised mean squared error.

use std::collections::HashMap;
use std::fmt::Write as _;

use tessera::op::{GluKind, PoolKind, RopeParams, SortOrder, UpscaleMode};
use tessera::ops::unary::UnaryOp;
use tessera::{Backend, DType, Graph, ReferenceBackend, Session, TensorId};
use tessera_gguf::GgufFile;

/// One case's description: `op=NAME key=value ...`.
pub struct Desc {
    pub op: String,
    kv: HashMap<String, String>,
}

impl Desc {
    pub fn parse(s: &str) -> Result<Desc, String> {
        let mut op = None;
        let mut kv = HashMap::new();
        for tok in s.split_whitespace() {
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| format!("token '{tok}' has no '='"))?;
            if k == "op" {
                op = Some(v.to_string());
            } else {
                kv.insert(k.to_string(), v.to_string());
            }
        }
        Ok(Desc {
            op: op.ok_or("no op= token")?,
            kv,
        })
    }

    fn get(&self, k: &str) -> Result<&str, String> {
        self.kv
            .get(k)
            .map(|s| s.as_str())
            .ok_or_else(|| format!("desc lacks '{k}'"))
    }

    fn f32(&self, k: &str) -> Result<f32, String> {
        self.get(k)?.parse().map_err(|e| format!("{k}: {e}"))
    }

    fn usize(&self, k: &str) -> Result<usize, String> {
        self.get(k)?.parse().map_err(|e| format!("{k}: {e}"))
    }

    fn list(&self, k: &str) -> Result<Vec<usize>, String> {
        self.get(k)?
            .split(',')
            .map(|x| x.parse().map_err(|e| format!("{k}: {e}")))
            .collect()
    }
}

fn e<T>(r: tessera::Result<T>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// Builds the graph node of one case from its inputs.
pub fn build_case(g: &mut Graph, d: &Desc, ins: &[TensorId]) -> Result<TensorId, String> {
    let need = |n: usize| -> Result<(), String> {
        if ins.len() < n {
            Err(format!(
                "{} needs {n} inputs, the file has {}",
                d.op,
                ins.len()
            ))
        } else {
            Ok(())
        }
    };
    let op = d.op.as_str();
    if let Some(u) = UnaryOp::from_name(op) {
        need(1)?;
        return e(g.unary(ins[0], u));
    }
    let out = match op {
        "add" | "sub" | "mul" | "div" => {
            need(2)?;
            match op {
                "add" => g.add(ins[0], ins[1]),
                "sub" => g.sub(ins[0], ins[1]),
                "mul" => g.mul(ins[0], ins[1]),
                _ => g.div(ins[0], ins[1]),
            }
        }
        "scale" => g.scale(ins[0], d.f32("s")?),
        "scale_bias" => g.scale_bias(ins[0], d.f32("s")?, d.f32("b")?),
        "leaky_relu" => g.leaky_relu(ins[0], d.f32("negative_slope")?),
        "clamp" => g.clamp(ins[0], d.f32("min")?, d.f32("max")?),
        "swiglu" | "geglu" | "reglu" => {
            let kind = match op {
                "swiglu" => GluKind::Swiglu,
                "geglu" => GluKind::Geglu,
                _ => GluKind::Reglu,
            };
            match d.get("form")? {
                "fused" => g.glu(ins[0], kind, false),
                "split" => {
                    need(2)?;
                    g.glu_split(ins[0], ins[1], kind)
                }
                f => return Err(format!("unknown glu form {f}")),
            }
        }
        "sum" => g.sum(ins[0]),
        "sum_rows" => g.sum_rows(ins[0]),
        "mean" => g.mean(ins[0]),
        "argmax" => g.argmax(ins[0]),
        "cumsum" => g.cumsum(ins[0]),
        "repeat" => g.repeat_to(ins[0], &d.list("ne")?),
        "concat" => {
            need(2)?;
            g.concat(ins[0], ins[1], d.usize("dim")?)
        }
        "cont" => match d.get("src")? {
            "permute" => {
                let a = d.list("axes")?;
                if a.len() != 4 {
                    return Err("permute needs 4 axes".into());
                }
                let p = e(g.permute(ins[0], [a[0], a[1], a[2], a[3]]))?;
                g.cont(p)
            }
            "transpose" => {
                let t = e(g.transpose(ins[0]))?;
                g.cont(t)
            }
            s => return Err(format!("unknown cont source {s}")),
        },
        "rms_norm" => g.rms_norm(ins[0], d.f32("eps")?),
        "norm" => g.norm(ins[0], d.f32("eps")?),
        "l2_norm" => g.l2_norm(ins[0], d.f32("eps")?),
        "group_norm" => g.group_norm(ins[0], d.usize("n_groups")?, d.f32("eps")?),
        "soft_max" => g.soft_max(ins[0]),
        "soft_max_ext" => {
            let mask = ins.get(1).copied();
            g.soft_max_ext(ins[0], mask, d.f32("scale")?, d.f32("max_bias")?)
        }
        "diag_mask_inf" => g.diag_mask_inf(ins[0], d.usize("n_past")?),
        "rope_ext" => {
            need(2)?;
            let p = RopeParams {
                n_dims: d.usize("n_dims")?,
                mode: d.usize("mode")? as i32,
                n_ctx_orig: d.usize("n_ctx_orig")?,
                freq_base: d.f32("freq_base")?,
                freq_scale: d.f32("freq_scale")?,
                ext_factor: d.f32("ext_factor")?,
                attn_factor: d.f32("attn_factor")?,
                beta_fast: d.f32("beta_fast")?,
                beta_slow: d.f32("beta_slow")?,
                inverse: false,
            };
            g.rope_ext(ins[0], ins[1], ins.get(2).copied(), p)
        }
        "get_rows" => {
            need(2)?;
            g.get_rows(ins[0], ins[1])
        }
        "cpy" => {
            let to = d.get("to")?;
            let dt = DType::from_name(to).ok_or_else(|| format!("unknown type {to}"))?;
            let ne = g.ne(ins[0]);
            let dst = e(g.new_tensor(dt, &ne))?;
            g.cpy(ins[0], dst)
        }
        "mul_mat" => {
            need(2)?;
            let b = match d.kv.get("b").map(|s| s.as_str()) {
                None => ins[1],
                Some("cont(transpose(in1))") => {
                    let t = e(g.transpose(ins[1]))?;
                    e(g.cont(t))?
                }
                Some(s) => return Err(format!("unknown b form {s}")),
            };
            g.mul_mat(ins[0], b)
        }
        "out_prod" => {
            need(2)?;
            g.out_prod(ins[0], ins[1])
        }
        "flash_attn_ext" => {
            need(3)?;
            let fa = e(g.flash_attn_ext(
                ins[0],
                ins[1],
                ins[2],
                ins.get(3).copied(),
                d.f32("scale")?,
                d.f32("max_bias")?,
                d.f32("logit_softcap")?,
            ))?;
            // the golden output was computed by ggml's CPU backend: reproduce its arithmetic
            e(g.set_flash_attn_precision(fa, tessera::op::AttnPrecision::GgmlCpu))?;
            Ok(fa)
        }
        "cross_entropy_loss" => {
            need(2)?;
            g.cross_entropy_loss(ins[0], ins[1])
        }
        "count_equal" => {
            need(2)?;
            let a = e(g.argmax(ins[0]))?;
            let b = e(g.argmax(ins[1]))?;
            g.count_equal(a, b)
        }
        "opt_step_adamw" => {
            need(5)?;
            e(g.set_param(ins[0]))?;
            g.opt_step_adamw(ins[0], ins[1], ins[2], ins[3], ins[4])
        }
        "opt_step_sgd" => {
            need(3)?;
            e(g.set_param(ins[0]))?;
            g.opt_step_sgd(ins[0], ins[1], ins[2])
        }
        "conv_2d" => {
            need(2)?;
            g.conv_2d(
                ins[0],
                ins[1],
                d.usize("s0")?,
                d.usize("s1")?,
                d.usize("p0")?,
                d.usize("p1")?,
                d.usize("d0")?,
                d.usize("d1")?,
            )
        }
        "pool_2d" => {
            let kind = match d.get("kind")? {
                "max" => PoolKind::Max,
                "avg" => PoolKind::Avg,
                k => return Err(format!("unknown pool kind {k}")),
            };
            g.pool_2d(
                ins[0],
                kind,
                d.usize("k0")?,
                d.usize("k1")?,
                d.usize("s0")?,
                d.usize("s1")?,
                d.usize("p0")?,
                d.usize("p1")?,
            )
        }
        "pad" => g.pad(
            ins[0],
            d.usize("p0")?,
            d.usize("p1")?,
            d.usize("p2")?,
            d.usize("p3")?,
        ),
        "argsort" => {
            let order = match d.get("order")? {
                "asc" => SortOrder::Asc,
                "desc" => SortOrder::Desc,
                o => return Err(format!("unknown order {o}")),
            };
            g.argsort(ins[0], order)
        }
        "upscale" => {
            if d.get("mode")? != "nearest" {
                return Err("only mode=nearest is described".into());
            }
            let _ = UpscaleMode::Nearest;
            g.upscale(ins[0], d.usize("scale_factor")?)
        }
        "arange" => g.arange(d.f32("start")?, d.f32("stop")?, d.f32("step")?),
        "timestep_embedding" => {
            g.timestep_embedding(ins[0], d.usize("dim")?, d.usize("max_period")? as i32)
        }
        other => return Err(format!("unknown op '{other}'")),
    };
    e(out)
}

/// Normalised mean squared error `Σ(out-ref)² / Σref²`; NaNs at the same places count as equal,
/// a NaN anywhere else makes the error infinite.
pub fn nmse(out: &[f64], reference: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_nan() || r.is_nan() {
            if o.is_nan() != r.is_nan() {
                return f64::INFINITY;
            }
            continue;
        }
        if o.is_infinite() || r.is_infinite() {
            if o != r {
                return f64::INFINITY;
            }
            continue;
        }
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        num / den
    }
}

/// The bound a case must meet (the golden README's).
fn bound(op: &str, in0: DType, out: DType) -> f64 {
    if out.is_int() {
        return 0.0;
    }
    match op {
        // ggml's CPU computes gelu-family activations through an f16 table of the input (the
        // golden README's known looser cases): the exact formula lands near 1e-7, geglu above.
        "gelu" | "gelu_quick" | "geglu" => 5e-7,
        "mul_mat" if in0.is_quantized() => 5e-4,
        "flash_attn_ext" => 5e-4,
        _ => 1e-7,
    }
}

/// The result of one case on one backend.
pub struct CaseResult {
    pub case: String,
    pub op: String,
    pub backend: String,
    pub nmse: Option<f64>,
    pub pass: bool,
    pub note: String,
}

/// All backends a conformance run compares.
pub fn backends() -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(ReferenceBackend),
        Box::new(tessera_cpu::CpuBackend::default()),
    ]
}

/// Runs every case of `file` on every backend.
pub fn run_ops(file: &GgufFile) -> Result<(Vec<CaseResult>, usize), String> {
    let mut cases: Vec<(String, String)> = Vec::new();
    for (k, v) in &file.metadata {
        if let Some(case) = k.strip_suffix(".desc") {
            let desc = v.as_str().ok_or_else(|| format!("{k} is not a string"))?;
            cases.push((case.to_string(), desc.to_string()));
        }
    }
    if cases.is_empty() {
        return Err("no '<case>.desc' keys: not a golden ops file".into());
    }
    let mut results = Vec::new();
    for (case, desc) in &cases {
        let has_grads = (0..8).any(|k| file.tensor(&format!("{case}/grad{k}")).is_some());
        for b in backends() {
            results.push(run_case(file, case, desc, b.as_ref()));
            if has_grads {
                results.extend(run_grad_case(file, case, desc, b.as_ref()));
            }
        }
    }
    Ok((results, 0))
}

/// The bound for a gradient: ggml builds its backward graph in f32 from its own kernels, we in
/// f64 per node, so gradients agree to about single precision, like forward ops.
fn grad_bound(op: &str) -> f64 {
    match op {
        "gelu" | "gelu_quick" | "geglu" | "swiglu" => 5e-6,
        "flash_attn_ext" => 5e-4,
        _ => 1e-6,
    }
}

/// Compares our gradients with ggml's `grad<k>` tensors: the inputs with a golden gradient
/// become params, the loss is `sum(out)` (or `out` when it is a scalar loss), and
/// `build_backward` makes the gradients.
fn run_grad_case(
    file: &GgufFile,
    case: &str,
    desc: &str,
    backend: &dyn Backend,
) -> Vec<CaseResult> {
    let op = desc
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_start_matches("op=")
        .to_string();
    let mk = |k: &str, res: Result<(f64, f64), String>| {
        let mut r = CaseResult {
            case: case.to_string(),
            op: format!("{op}.{k}"),
            backend: backend.name().to_string(),
            nmse: None,
            pass: false,
            note: String::new(),
        };
        match res {
            Ok((err, bound)) => {
                r.nmse = Some(err);
                r.pass = err <= bound;
                if !r.pass {
                    r.note = format!("bound {bound:e}");
                }
            }
            Err(m) => r.note = m,
        }
        r
    };
    match grad_case_inner(file, case, desc, backend) {
        Ok(v) => v.into_iter().map(|(k, res)| mk(&k, Ok(res))).collect(),
        Err(m) => vec![mk("grad", Err(m))],
    }
}

#[allow(clippy::type_complexity)]
fn grad_case_inner(
    file: &GgufFile,
    case: &str,
    desc: &str,
    backend: &dyn Backend,
) -> Result<Vec<(String, (f64, f64))>, String> {
    let d = Desc::parse(desc)?;
    let mut g = Graph::new();
    let mut ins = Vec::new();
    let mut datas = Vec::new();
    let mut want = Vec::new();
    for k in 0.. {
        let Some(t) = file.tensor(&format!("{case}/in{k}")) else {
            break;
        };
        let id = e(g.new_tensor(t.dtype, t.shape()))?;
        g.set_name(id, format!("in{k}"));
        if let Some(gt) = file.tensor(&format!("{case}/grad{k}")) {
            e(g.set_param(id))?;
            want.push((k, id, gt));
        }
        ins.push(id);
        datas.push(file.tensor_data(t));
    }
    let out = build_case(&mut g, &d, &ins)?;
    let loss = if g.tensor(out).nelements() == 1 && g.dtype(out) == DType::F32 {
        out
    } else {
        let o = e(g.cast(out, DType::F32))?;
        e(g.sum(o))?
    };
    e(g.set_loss(loss))?;
    let grads = e(g.build_backward(false))?;
    let mut s = e(Session::new(g, &grads.outputs()))?;
    for (&id, data) in ins.iter().zip(datas) {
        e(s.set_bytes(id, data))?;
    }
    e(grads.reset(&mut s))?;
    e(s.compute(backend))?;
    let mut res = Vec::new();
    for (k, id, gt) in want {
        let i = grads
            .params
            .iter()
            .position(|&p| p == id)
            .ok_or_else(|| format!("in{k} got no gradient"))?;
        let got = e(s.get_f64(grads.grads[i]))?;
        let w = e(tessera::decode(gt.dtype, gt.shape(), file.tensor_data(gt)))?;
        // A gradient that is zero in exact arithmetic (softmax of a sum: Σ softmax = 1) is
        // rounding noise on both sides; nmse of noise is meaningless, so compare absolutely.
        let wmax = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let err = if wmax < 1e-5 {
            let diff = got
                .iter()
                .zip(&w)
                .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            if diff <= 1e-5 {
                0.0
            } else {
                diff
            }
        } else {
            nmse(&got, &w)
        };
        res.push((format!("grad{k}"), (err, grad_bound(&d.op))));
    }
    Ok(res)
}

fn run_case(file: &GgufFile, case: &str, desc: &str, backend: &dyn Backend) -> CaseResult {
    let mut r = CaseResult {
        case: case.to_string(),
        op: desc
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_start_matches("op=")
            .to_string(),
        backend: backend.name().to_string(),
        nmse: None,
        pass: false,
        note: String::new(),
    };
    match run_case_inner(file, case, desc, backend) {
        Ok((err, bound)) => {
            r.nmse = Some(err);
            r.pass = err <= bound;
            if !r.pass {
                r.note = format!("bound {bound:e}");
            }
        }
        Err(msg) => r.note = msg,
    }
    r
}

fn run_case_inner(
    file: &GgufFile,
    case: &str,
    desc: &str,
    backend: &dyn Backend,
) -> Result<(f64, f64), String> {
    let d = Desc::parse(desc)?;
    let mut g = Graph::new();
    let mut ins = Vec::new();
    let mut datas = Vec::new();
    for k in 0.. {
        let Some(t) = file.tensor(&format!("{case}/in{k}")) else {
            break;
        };
        let id = e(g.new_tensor(t.dtype, t.shape()))?;
        g.set_name(id, format!("in{k}"));
        ins.push(id);
        datas.push(file.tensor_data(t));
    }
    let out = build_case(&mut g, &d, &ins)?;
    let want_t = file
        .tensor(&format!("{case}/out"))
        .ok_or_else(|| format!("{case}/out missing"))?;
    let got_ne = g.ne(out);
    let want_ne = tessera::shape::ne_from(want_t.shape());
    if got_ne != want_ne {
        return Err(format!("shape {:?}, ggml's is {:?}", got_ne, want_ne));
    }
    let in0_type = ins.first().map(|&i| g.dtype(i)).unwrap_or(DType::F32);
    let out_type = g.dtype(out);
    let mut s = e(Session::new(g, &[out]))?;
    for (&id, data) in ins.iter().zip(datas) {
        e(s.set_bytes(id, data))?;
    }
    e(s.compute(backend))?;
    let got = e(s.get_f64(out))?;
    let want = e(tessera::decode(
        want_t.dtype,
        want_t.shape(),
        file.tensor_data(want_t),
    ))?;
    Ok((nmse(&got, &want), bound(&d.op, in0_type, out_type)))
}

/// Prints the report and returns the number of failures.
pub fn report(results: &[CaseResult], grads: usize) -> (String, usize) {
    let mut s = String::new();
    let mut failed = 0;
    for r in results {
        let nm = r.nmse.map_or("-".to_string(), |v| format!("{v:.3e}"));
        let verdict = if r.pass { "PASS" } else { "FAIL" };
        let _ = write!(
            s,
            "{:<6} {:<20} {:<10} nmse={:<10} {}",
            r.case, r.op, r.backend, nm, verdict
        );
        if !r.note.is_empty() {
            let _ = write!(s, "  ({})", r.note);
        }
        s.push('\n');
        failed += usize::from(!r.pass);
    }
    let _ = grads;
    let _ = writeln!(s, "{} passed, {} failed", results.len() - failed, failed);
    (s, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_parsing() {
        let d = Desc::parse("op=rope_ext n_dims=64 mode=2 freq_base=10000").unwrap();
        assert_eq!(d.op, "rope_ext");
        assert_eq!(d.usize("n_dims").unwrap(), 64);
        assert_eq!(d.f32("freq_base").unwrap(), 10000.0);
        assert!(d.usize("missing").unwrap_err().contains("missing"));
        assert!(Desc::parse("n=1").is_err());
        assert_eq!(
            Desc::parse("op=repeat ne=8,4,3,2")
                .unwrap()
                .list("ne")
                .unwrap(),
            vec![8, 4, 3, 2]
        );
    }

    #[test]
    fn nmse_handles_nan_inf_and_zero() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((nmse(&[1.0, 2.0], &[1.0, 2.5]) - 0.25 / 7.25).abs() < 1e-15);
        assert_eq!(nmse(&[f64::NAN, 1.0], &[f64::NAN, 1.0]), 0.0);
        assert_eq!(nmse(&[f64::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(nmse(&[f64::NEG_INFINITY], &[f64::NEG_INFINITY]), 0.0);
        assert_eq!(nmse(&[0.0], &[0.0]), 0.0);
        assert_eq!(nmse(&[1e-9], &[0.0]), f64::INFINITY);
    }
}
