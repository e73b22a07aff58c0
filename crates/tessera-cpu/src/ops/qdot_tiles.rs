//! One weight row against several activation columns at once for the k-quants (not written
//! yet): each result must equal `qdot::vec_dot` for that column bit for bit.

use tessera::DType;

use crate::simd::Isa;

/// Weight types with a one-row, four-column kernel here.
pub fn supported(_t: DType) -> bool {
    false
}

/// `qdot::vec_dot(isa, t, w, x[c], k)` for the four columns `x`.
pub fn vec_dot_1x4(isa: Isa, t: DType, w: &[u8], x: [&[u8]; 4], k: usize) -> [f32; 4] {
    x.map(|c| super::qdot::vec_dot(isa, t, w, c, k))
}
