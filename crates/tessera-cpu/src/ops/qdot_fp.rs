//! Integer dot products for more weight types (see `qdot`); not written yet.

use tessera::DType;

use crate::simd::Isa;

/// Weight types with an integer kernel here.
pub fn supported(_t: DType) -> bool {
    false
}

/// Dot of `nb` blocks of weight type `t` with `nb` blocks of its activation format.
pub fn vec_dot(_isa: Isa, t: DType, _w: &[u8], _x: &[u8], _nb: usize) -> f32 {
    unreachable!("no integer kernel for {t} here")
}
