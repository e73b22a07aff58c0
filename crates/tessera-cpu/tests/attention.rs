//! CPU flash_attn_ext against the reference: head sizes 1 to 128 (Dv may differ from D), n_kv
//! from 1 to 1100 (partial blocks), f32/f16/bf16 K and V (mixed), grouped-query heads, batches,
//! causal and random f16 masks with -inf entries (broadcast and padded), fully masked queries
//! (0), ALiBi, logit softcap, and permuted K/V views like a KV cache.
//!
//! Tolerance: 1e-6 of the output's max magnitude. Everything after reading K/V is f32 (Q is not
//! rounded to f16, the sum of probabilities is f64, P·V is summed per block of 32 kv rows);
//! measured ≤ 3.3e-7 (nmse ≤ 4e-14) for f32, f16 and bf16 K/V, far inside ggml's own bound for
//! f16 K/V (nmse 5e-4).

mod common;

use common::*;
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};

const TOL: f64 = 1e-6;

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

/// Like `common::check`, with the inputs' values given; returns the max error and the nmse
/// of the first CPU configuration with the best ISA.
fn check_values(
    g: Graph,
    inputs: &[(TensorId, Vec<f32>)],
    out: TensorId,
    tol: f64,
    what: &str,
) -> (f64, f64) {
    let mut s = Session::new(g, &[out]).expect("plan");
    for (i, v) in inputs {
        s.set_f32(*i, v).unwrap();
    }
    s.compute(&ReferenceBackend).expect("reference");
    let want = s.get_f64(out).unwrap();
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    let mut first: Vec<(tessera_cpu::Isa, Vec<f32>)> = Vec::new();
    let (mut worst, mut nmse) = (0f64, 0f64);
    for cpu in cpu_configs() {
        s.compute(&cpu).unwrap();
        let got = s.get_f32(out).unwrap();
        let (mut se, mut sw) = (0f64, 0f64);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let err = (g as f64 - w).abs() / scale;
            assert!(
                err <= tol,
                "{what}: cpu {:?}/{}t: element {i}: got {g}, reference {w} (error {err:e})",
                cpu.isa(),
                cpu.n_threads()
            );
            worst = worst.max(err);
            se += (g as f64 - w).powi(2);
            sw += w * w;
        }
        nmse = nmse.max(se / sw.max(1e-300));
        match first.iter().find(|(isa, _)| *isa == cpu.isa()) {
            Some((_, f)) => assert!(
                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: results differ between thread counts on {:?}",
                cpu.isa()
            ),
            None => first.push((cpu.isa(), got)),
        }
    }
    (worst, nmse)
}

fn rand_vec(rng: &mut Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

struct Case {
    d: usize,
    dv: usize,
    n_q: usize,
    n_kv: usize,
    h: usize,
    h_kv: usize,
    b: usize,
    kt: DType,
    vt: DType,
    /// mask rows (>= n_q), and its dims 2 and 3
    mask: Option<(usize, usize, usize)>,
    causal: bool,
    scale: f32,
    max_bias: f32,
    softcap: f32,
}

fn run_case(rng: &mut Rng, c: &Case) -> (f64, f64) {
    let mut g = Graph::new();
    let q = g.new_f32(&[c.d, c.n_q, c.h, c.b]).unwrap();
    let k = g.new_tensor(c.kt, &[c.d, c.n_kv, c.h_kv, c.b]).unwrap();
    let v = g.new_tensor(c.vt, &[c.dv, c.n_kv, c.h_kv, c.b]).unwrap();
    let m = c
        .mask
        .map(|(rows, m2, m3)| g.new_tensor(DType::F16, &[c.n_kv, rows, m2, m3]).unwrap());
    let o = g
        .flash_attn_ext(q, k, v, m, c.scale, c.max_bias, c.softcap)
        .unwrap();
    assert_fast(&g, o);
    let mut inputs = vec![
        (q, rand_vec(rng, c.d * c.n_q * c.h * c.b, -1.0, 1.0)),
        (k, rand_vec(rng, c.d * c.n_kv * c.h_kv * c.b, -1.0, 1.0)),
        (v, rand_vec(rng, c.dv * c.n_kv * c.h_kv * c.b, -1.0, 1.0)),
    ];
    if let (Some(m), Some((rows, m2, m3))) = (m, c.mask) {
        let mut mv = rand_vec(rng, c.n_kv * rows * m2 * m3, -1.0, 1.0);
        for (idx, x) in mv.iter_mut().enumerate() {
            let (ic, iq) = (idx % c.n_kv, (idx / c.n_kv) % rows);
            let future = ic + c.n_q > iq + c.n_kv; // causal: kv row after the query's position
            if (c.causal && future) || idx % 11 == 5 {
                *x = f32::NEG_INFINITY;
            }
        }
        inputs.push((m, mv));
    }
    let what = format!(
        "flash_attn_ext d={} dv={} n_q={} n_kv={} h={}/{} b={} k={} v={} mask={:?} causal={} scale={} max_bias={} softcap={}",
        c.d, c.dv, c.n_q, c.n_kv, c.h, c.h_kv, c.b, c.kt, c.vt, c.mask, c.causal, c.scale, c.max_bias, c.softcap
    );
    check_values(g, &inputs, o, TOL, &what)
}

fn base() -> Case {
    Case {
        d: 64,
        dv: 64,
        n_q: 1,
        n_kv: 1,
        h: 1,
        h_kv: 1,
        b: 1,
        kt: DType::F16,
        vt: DType::F16,
        mask: None,
        causal: false,
        scale: 0.125,
        max_bias: 0.0,
        softcap: 0.0,
    }
}

#[test]
fn shapes_types_and_grouped_heads() {
    let mut rng = Rng::new(71);
    let mut worst = (0f64, 0f64);
    for (d, dv, n_q, n_kv, h, h_kv, b) in [
        (1usize, 1usize, 1usize, 1usize, 1usize, 1usize, 1usize),
        (4, 4, 1, 1, 1, 1, 1),
        (3, 5, 17, 3, 3, 1, 2),
        (8, 8, 3, 17, 4, 2, 1),
        (64, 64, 1, 33, 8, 2, 1),
        (64, 64, 7, 100, 4, 4, 2),
        (128, 128, 2, 1000, 4, 1, 1),
        (80, 40, 5, 65, 6, 3, 1),
        (17, 31, 4, 1100, 2, 2, 1),
    ] {
        for (kt, vt) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F16),
            (DType::BF16, DType::BF16),
            (DType::F16, DType::F32),
        ] {
            let c = Case {
                d,
                dv,
                n_q,
                n_kv,
                h,
                h_kv,
                b,
                kt,
                vt,
                scale: 1.0 / (d as f32).sqrt(),
                ..base()
            };
            let e = run_case(&mut rng, &c);
            worst = (worst.0.max(e.0), worst.1.max(e.1));
        }
    }
    eprintln!("max error {:e}, max nmse {:e}", worst.0, worst.1);
}

#[test]
fn masks_alibi_and_softcap() {
    let mut rng = Rng::new(72);
    let mut worst = (0f64, 0f64);
    for (n_q, n_kv, h, h_kv, b, mask, causal, max_bias, softcap) in [
        (
            3usize,
            17usize,
            4usize,
            2usize,
            1usize,
            (3usize, 1usize, 1usize),
            false,
            0.0f32,
            0.0f32,
        ),
        (3, 17, 4, 2, 1, (8, 1, 1), true, 0.0, 0.0), // padded mask rows
        (17, 3, 3, 1, 2, (20, 3, 1), false, 8.0, 0.0),
        (5, 9, 2, 2, 1, (5, 1, 1), false, 0.0, 2.0),
        (8, 200, 8, 2, 2, (8, 1, 2), true, 8.0, 30.0),
        (32, 64, 4, 4, 1, (32, 4, 1), true, 0.0, 0.0),
        (1, 1000, 8, 1, 1, (1, 1, 1), false, 4.0, 50.0),
    ] {
        for (kt, vt) in [(DType::F16, DType::F16), (DType::F32, DType::F32)] {
            let c = Case {
                d: 64,
                dv: 64,
                n_q,
                n_kv,
                h,
                h_kv,
                b,
                kt,
                vt,
                mask: Some(mask),
                causal,
                scale: 0.125,
                max_bias,
                softcap,
            };
            let e = run_case(&mut rng, &c);
            worst = (worst.0.max(e.0), worst.1.max(e.1));
        }
    }
    eprintln!("max error {:e}, max nmse {:e}", worst.0, worst.1);
}

#[test]
fn large_scores_and_fully_masked_queries() {
    // large logits (scale 4 on D = 64 values in [-1, 1]) make the running max move a lot
    let mut rng = Rng::new(73);
    let c = Case {
        n_q: 4,
        n_kv: 300,
        h: 2,
        scale: 4.0,
        ..base()
    };
    run_case(&mut rng, &c);
    // query 1 has every kv row masked: its output is 0
    let mut g = Graph::new();
    let q = g.new_f32(&[8, 2]).unwrap();
    let k = g.new_tensor(DType::F16, &[8, 40]).unwrap();
    let v = g.new_tensor(DType::F16, &[8, 40]).unwrap();
    let m = g.new_tensor(DType::F16, &[40, 2]).unwrap();
    let o = g.flash_attn_ext(q, k, v, Some(m), 0.5, 0.0, 0.0).unwrap();
    let mut mv = vec![0.0f32; 80];
    for x in &mut mv[40..] {
        *x = f32::NEG_INFINITY;
    }
    let inputs = [
        (q, rand_vec(&mut rng, 16, -1.0, 1.0)),
        (k, rand_vec(&mut rng, 320, -1.0, 1.0)),
        (v, rand_vec(&mut rng, 320, -1.0, 1.0)),
        (m, mv),
    ];
    check_values(g, &inputs, o, TOL, "a fully masked query");
}

#[test]
fn permuted_kv_cache_views() {
    // the cache stores [D, H_kv, n_ctx]; attention reads the first n_kv positions permuted to
    // [D, n_kv, H_kv]
    let mut rng = Rng::new(74);
    for kt in [DType::F16, DType::F32] {
        let (d, n_q, h, h_kv, n_ctx, n_kv) = (64, 3, 4, 2, 50, 37);
        let mut g = Graph::new();
        let q0 = g.new_f32(&[d, h, n_q]).unwrap();
        let q = g.permute(q0, [0, 2, 1, 3]).unwrap(); // [d, n_q, h]
        let kc = g.new_tensor(kt, &[d, h_kv, n_ctx]).unwrap();
        let vc = g.new_tensor(kt, &[d, h_kv, n_ctx]).unwrap();
        let es = kt.type_size();
        let kview = g
            .view(kc, &[d, h_kv, n_kv], &[d * es, d * h_kv * es], 0)
            .unwrap();
        let vview = g
            .view(vc, &[d, h_kv, n_kv], &[d * es, d * h_kv * es], 0)
            .unwrap();
        let k = g.permute(kview, [0, 2, 1, 3]).unwrap();
        let v = g.permute(vview, [0, 2, 1, 3]).unwrap();
        let m = g.new_tensor(DType::F16, &[n_kv, n_q]).unwrap();
        let o = g.flash_attn_ext(q, k, v, Some(m), 0.125, 0.0, 0.0).unwrap();
        assert_fast(&g, o);
        let mut mv = vec![0.0f32; n_kv * n_q];
        for (i, x) in mv.iter_mut().enumerate() {
            if i % n_kv > n_kv - n_q + i / n_kv {
                *x = f32::NEG_INFINITY;
            }
        }
        let inputs = [
            (q0, rand_vec(&mut rng, d * h * n_q, -1.0, 1.0)),
            (kc, rand_vec(&mut rng, d * h_kv * n_ctx, -1.0, 1.0)),
            (vc, rand_vec(&mut rng, d * h_kv * n_ctx, -1.0, 1.0)),
            (m, mv),
        ];
        check_values(g, &inputs, o, TOL, &format!("permuted {kt} cache"));
    }
}

/// ggml precision with a batch of at least 64 queries runs ggml's tiled algorithm (what
/// llama.cpp runs for prompts): the CPU kernel (AVX2 tiles and the portable form, any thread
/// count) equals the reference's row-by-row form of it bit for bit — causal and random masks,
/// partial kv tiles, grouped-query heads, f16 and f32 K/V, ALiBi, soft-cap, head sizes that are
/// and are not multiples of 8 — and stays within 1e-5 of the exact (f64) attention.
#[test]
fn ggml_precision_tiled_is_bit_exact() {
    use tessera::op::AttnPrecision;
    let mut rng = Rng::new(75);
    #[allow(clippy::type_complexity)]
    let cases: [(
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        DType,
        bool,
        f32,
        f32,
    ); 6] = [
        // (d, dv, n_q, n_kv, h, h_kv, kv type, mask, max_bias, softcap)
        (64, 64, 64, 64, 1, 1, DType::F16, true, 0.0, 0.0),
        (64, 64, 130, 150, 3, 1, DType::F16, true, 0.0, 0.0),
        (32, 48, 70, 200, 2, 2, DType::F32, true, 0.0, 0.0),
        (64, 64, 64, 97, 4, 2, DType::F16, true, 8.0, 0.0),
        (16, 16, 80, 80, 2, 1, DType::F16, false, 0.0, 30.0),
        (20, 12, 66, 70, 2, 1, DType::F16, true, 0.0, 0.0),
    ];
    for (ci, &(d, dv, n_q, n_kv, h, h_kv, kt, with_mask, max_bias, softcap)) in
        cases.iter().enumerate()
    {
        let qv = rand_vec(&mut rng, d * n_q * h, -2.0, 2.0);
        let kv = rand_vec(&mut rng, d * n_kv * h_kv, -2.0, 2.0);
        let vv = rand_vec(&mut rng, dv * n_kv * h_kv, -1.0, 1.0);
        // causal (the queries are the last n_q positions), plus random holes and biases; query
        // 3 sees nothing at all; cases 1 and 3 see a window of 40 positions (masked runs
        // before visible entries, within a tile and over whole tiles)
        let mut mv = rand_vec(&mut rng, n_kv * n_q, -1.0, 1.0);
        for (i, x) in mv.iter_mut().enumerate() {
            let (ic, iq) = (i % n_kv, i / n_kv);
            let window = (ci == 1 || ci == 3) && ic + 40 < iq + n_kv - n_q;
            if ic + n_q > iq + n_kv || i % 13 == 7 || iq == 3 || window {
                *x = f32::NEG_INFINITY;
            }
        }
        let session = |prec: AttnPrecision| {
            let mut g = Graph::new();
            let q = g.new_f32(&[d, n_q, h]).unwrap();
            let k = g.new_tensor(kt, &[d, n_kv, h_kv]).unwrap();
            let v = g.new_tensor(kt, &[dv, n_kv, h_kv]).unwrap();
            let m = with_mask.then(|| g.new_tensor(DType::F16, &[n_kv, n_q]).unwrap());
            let o = g
                .flash_attn_ext(q, k, v, m, 0.125, max_bias, softcap)
                .unwrap();
            g.set_flash_attn_precision(o, prec).unwrap();
            assert_fast(&g, o);
            let mut s = Session::new(g, &[o]).unwrap();
            s.set_f32(q, &qv).unwrap();
            s.set_f32(k, &kv).unwrap();
            s.set_f32(v, &vv).unwrap();
            if let Some(m) = m {
                s.set_f32(m, &mv).unwrap();
            }
            (s, o)
        };
        let (mut s, o) = session(AttnPrecision::F32);
        s.compute(&ReferenceBackend).unwrap();
        let exact = s.get_f64(o).unwrap();
        let (mut s, o) = session(AttnPrecision::GgmlCpu);
        s.compute(&ReferenceBackend).unwrap();
        let want = s.get_f32(o).unwrap();
        let top = exact.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (i, (&w, &e)) in want.iter().zip(&exact).enumerate() {
            assert!(
                (w as f64 - e).abs() <= 1e-5 * top,
                "case {ci}: element {i}: tiled {w} vs exact {e}"
            );
        }
        if with_mask {
            assert!(want[3 * h * dv..4 * h * dv].iter().all(|&x| x == 0.0));
        }
        for cpu in cpu_configs() {
            s.compute(&cpu).unwrap();
            let got = s.get_f32(o).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "case {ci} on {:?}/{}t: element {i}: {a} vs reference {b}",
                    cpu.isa(),
                    cpu.n_threads()
                );
            }
        }
        // GgmlCpuRows keeps the row-by-row algorithm for the same batch (its reference sums
        // the f16 products in f64, so it is close rather than bit-equal): a different result
        // from the tiled one, within ggml's f16 error of the reference
        let (mut s, o) = session(AttnPrecision::GgmlCpuRows);
        s.compute(&ReferenceBackend).unwrap();
        let rows = s.get_f32(o).unwrap();
        for cpu in cpu_configs() {
            s.compute(&cpu).unwrap();
            let got = s.get_f32(o).unwrap();
            assert!(got.iter().zip(&want).any(|(a, b)| a != b), "case {ci}");
            for (i, (&a, &b)) in got.iter().zip(&rows).enumerate() {
                assert!(
                    ((a - b) as f64).abs() <= 2e-3 * top,
                    "case {ci}: row-by-row on {:?}/{}t: element {i}: {a} vs {b}",
                    cpu.isa(),
                    cpu.n_threads()
                );
            }
        }
    }
}

/// The ggml-precision rows kernel (a generation step: one query against a cache whose length
/// grows in steps of 256) with masks that are mostly runs of -inf — skipped 16 at a time —
/// and single visible rows at the edges of and inside such runs, given scores that dominate:
/// every CPU configuration gives the same bits, close to the reference's row-by-row form.
#[test]
fn ggml_precision_rows_skip_only_masked_runs() {
    use tessera::op::AttnPrecision;
    let mut rng = Rng::new(76);
    let (d, n_kv, h, h_kv) = (64usize, 256usize, 4usize, 2usize);
    let visible = |ic: usize| ic < 37 || [47, 48, 100, 143, 144, 160, 255].contains(&ic);
    let qv = rand_vec(&mut rng, d * h, -1.0, 1.0);
    let mut kv = rand_vec(&mut rng, d * n_kv * h_kv, -1.0, 1.0);
    // the isolated visible rows point along q, so that their probabilities dominate
    for hk in 0..h_kv {
        for ic in [47usize, 100, 143, 160, 255] {
            for i in 0..d {
                kv[(hk * n_kv + ic) * d + i] = 3.0 * qv[(2 * hk) * d + i];
            }
        }
    }
    let vv = rand_vec(&mut rng, d * n_kv * h_kv, -1.0, 1.0);
    let mv: Vec<f32> = (0..n_kv)
        .map(|ic| if visible(ic) { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    let mut g = Graph::new();
    let q = g.new_f32(&[d, 1, h]).unwrap();
    let k = g.new_tensor(DType::F16, &[d, n_kv, h_kv]).unwrap();
    let v = g.new_tensor(DType::F16, &[d, n_kv, h_kv]).unwrap();
    let m = g.new_tensor(DType::F16, &[n_kv, 1]).unwrap();
    let o = g.flash_attn_ext(q, k, v, Some(m), 0.125, 0.0, 0.0).unwrap();
    g.set_flash_attn_precision(o, AttnPrecision::GgmlCpu)
        .unwrap();
    assert_fast(&g, o);
    let mut s = Session::new(g, &[o]).unwrap();
    s.set_f32(q, &qv).unwrap();
    s.set_f32(k, &kv).unwrap();
    s.set_f32(v, &vv).unwrap();
    s.set_f32(m, &mv).unwrap();
    s.compute(&ReferenceBackend).unwrap();
    let want = s.get_f32(o).unwrap();
    let top = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut first: Option<Vec<f32>> = None;
    for cpu in cpu_configs() {
        s.compute(&cpu).unwrap();
        let got = s.get_f32(o).unwrap();
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 2e-3 * top,
                "{:?}/{}t: element {i}: {a} vs reference {b}",
                cpu.isa(),
                cpu.n_threads()
            );
        }
        match &first {
            None => first = Some(got),
            Some(f) => assert!(
                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{:?}/{}t differs from the first configuration",
                cpu.isa(),
                cpu.n_threads()
            ),
        }
    }
}
