//! Helpers for op tests: run a small graph on the reference backend, random data, comparisons.

use crate::{Graph, ReferenceBackend, Session, TensorId};

/// Runs `g` on the reference backend with f32 `inputs` and returns `out` as f32.
pub fn run1(g: Graph, inputs: &[(TensorId, Vec<f32>)], out: TensorId) -> Vec<f32> {
    let mut s = Session::new(g, &[out]).expect("plan");
    for (id, v) in inputs {
        s.set_f32(*id, v).expect("set input");
    }
    s.compute(&ReferenceBackend).expect("compute");
    s.get_f32(out).expect("read output")
}

/// A small deterministic generator (xorshift64*), so tests need no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Asserts `got` and `want` agree within `tol` absolute + relative.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "element {i}: got {g}, want {w}");
    }
}
