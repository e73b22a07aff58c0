//! CPU get_rows and set_rows against the reference: f32/f16/bf16/i32 and quantized sources,
//! transposed and permuted sources, batched indices, duplicates, f32/f16/bf16 destinations
//! (whole tensors, views into a bigger cache, permuted), i32 and i64 indices broadcast over
//! dims 2 and 3, and out-of-range indices (an error that names the index and the row count and
//! leaves the destination untouched).
//!
//! Tolerance: 0 — both ops only convert (exactly, or with the reference's own rounding to
//! f16/bf16) and dequantize with the reference's dequantizer.

mod common;

use common::*;
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};

enum Val {
    F(Vec<f32>),
    I(Vec<i32>),
    L(Vec<i64>),
}

fn set(s: &mut Session, inputs: &[(TensorId, Val)]) {
    for (i, v) in inputs {
        match v {
            Val::F(v) => s.set_f32(*i, v).unwrap(),
            Val::I(v) => s.set_i32(*i, v).unwrap(),
            Val::L(v) => {
                let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                s.set_bytes(*i, &b).unwrap()
            }
        }
    }
}

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

/// Runs `out` on the reference and every CPU configuration with the given inputs (set again
/// before every run) and requires identical values.
fn check_exact(g: Graph, inputs: &[(TensorId, Val)], out: TensorId, what: &str) {
    let mut s = Session::new(g, &[out]).expect("plan");
    set(&mut s, inputs);
    s.compute(&ReferenceBackend).expect("reference");
    let want = s.get_bytes(out).unwrap();
    for cpu in cpu_configs() {
        set(&mut s, inputs);
        s.compute(&cpu).unwrap();
        let got = s.get_bytes(out).unwrap();
        if got != want {
            let (gv, wv) = (s.get_f64(out).unwrap(), {
                // the reference values again, for the message
                let mut r = Session::new(s.graph().clone(), &[out]).unwrap();
                set(&mut r, inputs);
                r.compute(&ReferenceBackend).unwrap();
                r.get_f64(out).unwrap()
            });
            let k = gv
                .iter()
                .zip(&wv)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            panic!(
                "{what}: cpu {:?}/{}t differs from the reference at element {k:?}: {:?} vs {:?}",
                cpu.isa(),
                cpu.n_threads(),
                k.map(|k| gv[k]),
                k.map(|k| wv[k])
            );
        }
    }
}

fn rand_vec(rng: &mut Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

fn rand_idx(rng: &mut Rng, n: usize, below: usize) -> Vec<i32> {
    (0..n).map(|_| rng.below(below) as i32).collect()
}

#[test]
fn get_rows_from_float_and_int_sources() {
    let mut rng = Rng::new(61);
    for dt in [DType::F32, DType::F16, DType::BF16, DType::I32] {
        for (ne, n) in [
            ([1usize, 1, 1, 1], 1usize),
            ([3, 4, 1, 1], 5),
            ([17, 9, 2, 1], 20),
            ([1000, 6, 1, 2], 7),
            ([1031, 3, 2, 2], 4),
        ] {
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &ne).unwrap();
            let i = g.new_tensor(DType::I32, &[n, ne[2], ne[3]]).unwrap();
            let y = g.get_rows(a, i).unwrap();
            assert_fast(&g, y);
            let len = ne.iter().product();
            let av = if dt == DType::I32 {
                Val::I((0..len).map(|_| rng.next_u64() as i32).collect())
            } else {
                Val::F(rand_vec(&mut rng, len, -100.0, 100.0))
            };
            let iv = Val::I(rand_idx(&mut rng, n * ne[2] * ne[3], ne[1]));
            check_exact(
                g,
                &[(a, av), (i, iv)],
                y,
                &format!("get_rows {dt} {ne:?} n={n}"),
            );
        }
    }
}

#[test]
fn get_rows_from_strided_sources() {
    let mut rng = Rng::new(62);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        // rows of the transpose of a [5, 40] matrix are its columns (stride 5 elements)
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[5, 40]).unwrap();
        let t = g.transpose(a).unwrap();
        let i = g.new_tensor(DType::I32, &[9]).unwrap();
        let y = g.get_rows(t, i).unwrap();
        assert_fast(&g, y);
        let inputs = [
            (a, Val::F(rand_vec(&mut rng, 200, -1.0, 1.0))),
            (i, Val::I(rand_idx(&mut rng, 9, 5))),
        ];
        check_exact(g, &inputs, y, &format!("get_rows {dt} transposed"));
        // a permuted 3-d source with dense rows: [16, 3, 4] -> [16, 4, 3]
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[16, 3, 4]).unwrap();
        let p = g.permute(a, [0, 2, 1, 3]).unwrap();
        let i = g.new_tensor(DType::I32, &[6, 3]).unwrap();
        let y = g.get_rows(p, i).unwrap();
        assert_fast(&g, y);
        let inputs = [
            (a, Val::F(rand_vec(&mut rng, 192, -1.0, 1.0))),
            (i, Val::I(rand_idx(&mut rng, 18, 4))),
        ];
        check_exact(g, &inputs, y, &format!("get_rows {dt} permuted"));
    }
}

#[test]
fn get_rows_from_quantized_sources() {
    let mut rng = Rng::new(63);
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q2K,
        DType::Q4K,
        DType::Q6K,
        DType::IQ4NL,
    ] {
        if !tessera_quants::can_quantize(dt.id()) {
            continue;
        }
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[512, 7, 2]).unwrap();
        let i = g.new_tensor(DType::I32, &[5, 2]).unwrap();
        let y = g.get_rows(a, i).unwrap();
        assert_fast(&g, y);
        let inputs = [
            (a, Val::F(rand_vec(&mut rng, 512 * 14, -2.0, 2.0))),
            (i, Val::I(rand_idx(&mut rng, 10, 7))),
        ];
        check_exact(g, &inputs, y, &format!("get_rows {dt}"));
    }
}

#[test]
fn get_rows_out_of_range_is_an_error() {
    for bad in [4, -1, i32::MAX] {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 4]).unwrap();
        let i = g.new_tensor(DType::I32, &[3]).unwrap();
        let y = g.get_rows(a, i).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_f32(a, &[0.0; 12]).unwrap();
        s.set_i32(i, &[0, bad, 1]).unwrap();
        for cpu in cpu_configs() {
            let e = s.compute(&cpu).unwrap_err().to_string();
            assert!(
                e.starts_with("get_rows")
                    && e.contains(&format!("index {bad} "))
                    && e.contains("4 rows"),
                "{e}"
            );
        }
    }
}

#[test]
fn set_rows_types_and_index_types() {
    let mut rng = Rng::new(64);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for bt in [DType::F32, DType::F16] {
            for it in [DType::I32, DType::I64] {
                for (ane, n, ine12) in [
                    ([3usize, 4, 1, 1], 2usize, [1usize, 1]),
                    ([17, 9, 2, 1], 5, [2, 1]),
                    ([1000, 8, 1, 1], 3, [1, 1]),
                    ([33, 6, 4, 2], 6, [2, 1]), // indices broadcast over dims 2 and 3
                    ([8, 3, 2, 3], 2, [1, 3]),
                ] {
                    let mut g = Graph::new();
                    let a = g.new_tensor(dt, &ane).unwrap();
                    let b = g.new_tensor(bt, &[ane[0], n, ane[2], ane[3]]).unwrap();
                    let i = g.new_tensor(it, &[n, ine12[0], ine12[1]]).unwrap();
                    let w = g.set_rows(a, b, i).unwrap();
                    assert_fast(&g, w);
                    let nidx = n * ine12[0] * ine12[1];
                    // with duplicates: the last write must win, whatever the thread count
                    let idx = rand_idx(&mut rng, nidx, ane[1].min(3));
                    let iv = if it == DType::I64 {
                        Val::L(idx.iter().map(|&v| v as i64).collect())
                    } else {
                        Val::I(idx)
                    };
                    let inputs = [
                        (
                            a,
                            Val::F(rand_vec(&mut rng, ane.iter().product(), -9.0, 9.0)),
                        ),
                        (
                            b,
                            Val::F(rand_vec(&mut rng, ane[0] * n * ane[2] * ane[3], -9.0, 9.0)),
                        ),
                        (i, iv),
                    ];
                    check_exact(
                        g,
                        &inputs,
                        w,
                        &format!("set_rows {dt} <- {bt} by {it} {ane:?} n={n}"),
                    );
                }
            }
        }
    }
}

#[test]
fn set_rows_into_views_of_a_cache() {
    let mut rng = Rng::new(65);
    // rows 3..11 of a [64, 16] f16 cache
    let mut g = Graph::new();
    let cache = g.new_tensor(DType::F16, &[64, 16]).unwrap();
    let a = g.view(cache, &[64, 8], &[128], 3 * 128).unwrap();
    let b = g.new_f32(&[64, 4]).unwrap();
    let i = g.new_tensor(DType::I64, &[4]).unwrap();
    let w = g.set_rows(a, b, i).unwrap();
    assert_fast(&g, w);
    let inputs = [
        (cache, Val::F(rand_vec(&mut rng, 1024, -1.0, 1.0))),
        (b, Val::F(rand_vec(&mut rng, 256, -1.0, 1.0))),
        (i, Val::L(vec![7, 0, 5, 2])),
    ];
    check_exact(g, &inputs, w, "set_rows into a cache view");
    // a permuted destination [d, heads, rows] -> [d, rows, heads]
    let mut g = Graph::new();
    let cache = g.new_f32(&[16, 3, 10]).unwrap();
    let a = g.permute(cache, [0, 2, 1, 3]).unwrap();
    let b = g.new_f32(&[16, 2, 3]).unwrap();
    let i = g.new_tensor(DType::I32, &[2, 3]).unwrap();
    let w = g.set_rows(a, b, i).unwrap();
    assert_fast(&g, w);
    let inputs = [
        (cache, Val::F(rand_vec(&mut rng, 480, -1.0, 1.0))),
        (b, Val::F(rand_vec(&mut rng, 96, -1.0, 1.0))),
        (i, Val::I(rand_idx(&mut rng, 6, 3))),
    ];
    check_exact(g, &inputs, w, "set_rows into a permuted cache");
}

#[test]
fn set_rows_out_of_range_leaves_the_destination_untouched() {
    for (bad, it) in [(7i64, DType::I32), (-1, DType::I64), (1 << 40, DType::I64)] {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 4]).unwrap();
        let b = g.new_f32(&[3, 3]).unwrap();
        let i = g.new_tensor(it, &[3]).unwrap();
        let w = g.set_rows(a, b, i).unwrap();
        let mut s = Session::new(g, &[w]).unwrap();
        let av: Vec<f32> = (0..12).map(|v| v as f32).collect();
        for cpu in cpu_configs() {
            s.set_f32(a, &av).unwrap();
            s.set_f32(b, &[-1.0; 9]).unwrap();
            let iv = [0, 2, bad];
            if it == DType::I64 {
                let bytes: Vec<u8> = iv.iter().flat_map(|v| v.to_le_bytes()).collect();
                s.set_bytes(i, &bytes).unwrap();
            } else {
                s.set_i32(i, &iv.map(|v| v as i32)).unwrap();
            }
            let e = s.compute(&cpu).unwrap_err().to_string();
            assert!(
                e.starts_with("set_rows")
                    && e.contains(&format!("index {bad} "))
                    && e.contains("4 rows"),
                "{e}"
            );
            assert_eq!(s.get_f32(a).unwrap(), av, "the destination was written");
        }
    }
}

#[test]
fn get_rows_after_set_rows_in_one_graph() {
    // write rows into an f16 cache, then read some back (the planner orders the two)
    let mut rng = Rng::new(66);
    let mut g = Graph::new();
    let cache = g.new_tensor(DType::F16, &[40, 12]).unwrap();
    let b = g.new_f32(&[40, 3]).unwrap();
    let i = g.new_tensor(DType::I32, &[3]).unwrap();
    let w = g.set_rows(cache, b, i).unwrap();
    let j = g.new_tensor(DType::I32, &[5]).unwrap();
    let y = g.get_rows(w, j).unwrap();
    let inputs = [
        (cache, Val::F(rand_vec(&mut rng, 480, -1.0, 1.0))),
        (b, Val::F(rand_vec(&mut rng, 120, -1.0, 1.0))),
        (i, Val::I(vec![4, 9, 1])),
        (j, Val::I(vec![9, 0, 4, 4, 11])),
    ];
    check_exact(g, &inputs, y, "set_rows -> get_rows");
}
