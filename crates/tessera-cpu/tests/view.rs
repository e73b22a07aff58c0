//! CPU cont / cpy kernels against the reference: contiguous copies of transposed and permuted
//! views, conversions between f32, f16, bf16 and i32, copies between different shapes, long
//! rows split across threads, and the KV-cache case — a copy into a strided view of a bigger
//! cache that must write exactly its slots and leave every other element untouched.
//!
//! Tolerance: 0. Copies and conversions are exact or round once to nearest even, exactly as the
//! reference does (it converts through f32 too), so results agree bit for bit.

mod common;

use common::*;
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};

fn assert_fast(g: &Graph, id: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(id)),
        "{} must run on a dedicated kernel",
        g.tensor(id).op
    );
}

const TYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::I32];

#[test]
fn cont_and_cast_of_views_every_type_pair() {
    let mut rng = Rng::new(51);
    for from in TYPES {
        for to in TYPES {
            for (dims, layout) in [
                (&[1usize][..], 0),
                (&[17, 3][..], 0),
                (&[17, 3][..], 1),
                (&[5, 7, 3][..], 2),
                (&[33, 2, 2, 3][..], 1),
            ] {
                let mut g = Graph::new();
                let x = g.new_tensor(from, dims).unwrap();
                // floats are scaled so that an i32 destination sees values beyond [-1, 1]
                let src = if from == DType::I32 {
                    x
                } else {
                    g.scale(x, 50.0).unwrap()
                };
                let v = match layout {
                    0 => src,
                    1 => g.transpose(src).unwrap(),
                    _ => g.permute(src, [1, 2, 0, 3]).unwrap(),
                };
                let y = g.cast(v, to).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[x],
                    y,
                    &mut rng,
                    0.0,
                    &format!("cont {from} -> {to} {dims:?} layout {layout}"),
                );
            }
        }
    }
}

#[test]
fn long_contiguous_conversions_are_split() {
    let mut rng = Rng::new(52);
    for (from, to) in [
        (DType::F32, DType::F16),
        (DType::F16, DType::F32),
        (DType::F32, DType::BF16),
        (DType::F32, DType::F32),
        (DType::F16, DType::F16),
    ] {
        for n in [100_003usize, 31, 4096] {
            let mut g = Graph::new();
            let x = g.new_tensor(from, &[n]).unwrap();
            let y = g.cast(x, to).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[x],
                y,
                &mut rng,
                0.0,
                &format!("cont {from} -> {to} [{n}]"),
            );
        }
    }
}

#[test]
fn cpy_between_shapes_and_layouts() {
    let mut rng = Rng::new(53);
    for (from, to) in [
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::F16, DType::F32),
        (DType::F16, DType::F16),
        (DType::BF16, DType::F32),
        (DType::F32, DType::I32),
    ] {
        // [6, 4] into a contiguous [8, 3]
        let mut g = Graph::new();
        let x = g.new_tensor(from, &[6, 4]).unwrap();
        let d = g.new_tensor(to, &[8, 3]).unwrap();
        let y = g.cpy(x, d).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[x, d],
            y,
            &mut rng,
            0.0,
            &format!("cpy {from}[6, 4] -> {to}[8, 3]"),
        );
        // a transposed source into a transposed destination of another shape
        let mut g = Graph::new();
        let xt = g.new_tensor(from, &[5, 12]).unwrap();
        let x = g.transpose(xt).unwrap(); // [12, 5]
        let dt = g.new_tensor(to, &[6, 10]).unwrap();
        let d = g.transpose(dt).unwrap(); // [10, 6]
        let y = g.cpy(x, d).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[xt, dt],
            y,
            &mut rng,
            0.0,
            &format!("cpy transposed {from} -> transposed {to}"),
        );
    }
}

/// Copies `x` ([hd, n_tok, n_head] f32) into positions `pos..pos + n_tok` of a cache
/// ([hd, n_ctx, n_head] of `ct`) through a strided view; compares the whole cache after the
/// copy with the reference's, every other slot holding its initial (distinct) value.
#[allow(clippy::too_many_arguments)]
fn kv_case(
    ct: DType,
    hd: usize,
    n_ctx: usize,
    n_head: usize,
    pos: usize,
    n_tok: usize,
    x_transposed: bool,
    rng: &mut Rng,
) {
    let mut g = Graph::new();
    let cache = g.new_tensor(ct, &[hd, n_ctx, n_head]).unwrap();
    let ts = ct.type_size();
    let slot = g
        .view(
            cache,
            &[hd, n_tok, n_head],
            &[hd * ts, hd * n_ctx * ts],
            pos * hd * ts,
        )
        .unwrap();
    let (xin, x) = if x_transposed {
        // x built as [n_tok, hd, n_head] and permuted to [hd, n_tok, n_head]
        let t = g.new_f32(&[n_tok, hd, n_head]).unwrap();
        (t, g.transpose(t).unwrap())
    } else {
        let t = g.new_f32(&[hd, n_tok, n_head]).unwrap();
        (t, t)
    };
    let w = g.cpy(x, slot).unwrap();
    assert_fast(&g, w);
    let mut s = Session::new(g, &[w, cache]).unwrap();
    let init: Vec<f32> = (0..hd * n_ctx * n_head)
        .map(|i| -1000.0 - i as f32)
        .collect();
    let xv: Vec<f32> = (0..hd * n_tok * n_head)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    s.set_f32(xin, &xv).unwrap();
    let run = |s: &mut Session, b: &dyn tessera::Backend| {
        s.set_f32(cache, &init).unwrap();
        s.compute(b).unwrap();
        s.get_f32(cache).unwrap()
    };
    let want = run(&mut s, &ReferenceBackend);
    // the untouched slots hold their initial values in the reference too
    let written = (0..want.len())
        .filter(|&i| want[i] != half_round(ct, init[i]))
        .count();
    assert!(written <= hd * n_tok * n_head);
    for cpu in cpu_configs() {
        let got = run(&mut s, &cpu);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits(),
                "kv cpy {ct} hd={hd} n_ctx={n_ctx} pos={pos} n_tok={n_tok}: {:?}/{} threads: cache element {i}: got {g}, want {w}",
                cpu.isa(),
                cpu.n_threads()
            );
        }
    }
}

fn half_round(ct: DType, v: f32) -> f32 {
    match ct {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

#[test]
fn kv_cache_copies_write_only_their_slots() {
    let mut rng = Rng::new(54);
    for ct in [DType::F16, DType::F32, DType::BF16] {
        for (hd, n_ctx, n_head, pos, n_tok) in [
            (4, 5, 1, 1, 2),
            (64, 32, 4, 7, 1),
            (64, 32, 4, 0, 32),
            (17, 40, 3, 21, 9),
        ] {
            for xt in [false, true] {
                kv_case(ct, hd, n_ctx, n_head, pos, n_tok, xt, &mut rng);
            }
        }
    }
}

#[test]
fn quantized_destinations_fall_back() {
    let mut g = Graph::new();
    let x = g.new_f32(&[64, 2]).unwrap();
    let d = g.new_tensor(DType::Q8_0, &[64, 2]).unwrap();
    let y = g.cpy(x, d).unwrap();
    assert!(!tessera_cpu::ops::fast_path(&g, g.tensor(y)));
    let c = g.cast(x, DType::Q4_0).unwrap();
    assert!(!tessera_cpu::ops::fast_path(&g, g.tensor(c)));
    let mut rng = Rng::new(55);
    check(
        g,
        &[x, d],
        y,
        &mut rng,
        0.0,
        "cpy f32 -> q8_0 on the fallback",
    );
}
