//! Shapes and strides with ggml's conventions: four dims `ne` (elements, dim 0 innermost) and
//! byte strides `nb`. Unused dims have `ne = 1`.

use crate::DType;

pub const MAX_DIMS: usize = 4;

/// Elements per dim, dim 0 innermost.
pub type Ne = [usize; MAX_DIMS];
/// Byte strides per dim.
pub type Nb = [usize; MAX_DIMS];

/// Pads a shape given as 1 to 4 dims with ones.
pub fn ne_from(dims: &[usize]) -> Ne {
    let mut ne = [1; MAX_DIMS];
    ne[..dims.len()].copy_from_slice(dims);
    ne
}

/// The strides of a contiguous tensor of `dtype` and shape `ne` (ggml's `ggml_new_tensor`).
pub fn contiguous_nb(dtype: DType, ne: &Ne) -> Nb {
    let mut nb = [0; MAX_DIMS];
    nb[0] = dtype.type_size();
    nb[1] = nb[0] * (ne[0] / dtype.block_size());
    for i in 2..MAX_DIMS {
        nb[i] = nb[i - 1] * ne[i - 1];
    }
    nb
}

pub fn nelements(ne: &Ne) -> usize {
    ne.iter().product()
}

/// Number of rows: all elements outside dim 0.
pub fn nrows(ne: &Ne) -> usize {
    ne[1] * ne[2] * ne[3]
}

/// Number of dims up to the last one that is not 1 (at least 1), like `ggml_n_dims`.
pub fn n_dims(ne: &Ne) -> usize {
    (1..MAX_DIMS)
        .rev()
        .find(|&i| ne[i] > 1)
        .map_or(1, |i| i + 1)
}

/// ggml's broadcasting rule: `b` can be repeated to `a`'s shape when every dim of `a` is a
/// multiple of `b`'s.
pub fn can_repeat(b: &Ne, a: &Ne) -> bool {
    (0..MAX_DIMS).all(|i| b[i] != 0 && a[i].is_multiple_of(b[i]))
        || nelements(b) == 0 && nelements(a) == 0
}

/// Bytes spanned by a tensor: from its first byte to one past its last (0 when empty).
pub fn nbytes(dtype: DType, ne: &Ne, nb: &Nb) -> usize {
    if nelements(ne) == 0 {
        return 0;
    }
    let blck = dtype.block_size();
    let mut bytes = ne[0] / blck * nb[0];
    if blck == 1 {
        bytes = dtype.type_size();
        for i in 0..MAX_DIMS {
            bytes += (ne[i] - 1) * nb[i];
        }
        return bytes;
    }
    for i in 1..MAX_DIMS {
        bytes += (ne[i] - 1) * nb[i];
    }
    bytes
}

/// True when the tensor's elements lie densely in memory in their logical order.
pub fn is_contiguous(dtype: DType, ne: &Ne, nb: &Nb) -> bool {
    let want = contiguous_nb(dtype, ne);
    (0..MAX_DIMS).all(|i| ne[i] == 1 || nb[i] == want[i])
}

/// True when each row (dim 0) is dense, whatever the other strides.
pub fn rows_contiguous(dtype: DType, ne: &Ne, nb: &Nb) -> bool {
    ne[0] <= dtype.block_size() || nb[0] == dtype.type_size()
}

/// Formats a shape as `[a, b, c, d]`.
pub fn fmt_ne(ne: &Ne) -> String {
    format!("[{}, {}, {}, {}]", ne[0], ne[1], ne[2], ne[3])
}

/// Unravels a flat logical index into 4-D coordinates.
#[inline]
pub fn unravel(mut i: usize, ne: &Ne) -> [usize; 4] {
    let i0 = i % ne[0];
    i /= ne[0];
    let i1 = i % ne[1];
    i /= ne[1];
    let i2 = i % ne[2];
    [i0, i1, i2, i / ne[2]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_sizes() {
        let ne = [4, 3, 2, 1];
        let nb = contiguous_nb(DType::F32, &ne);
        assert_eq!(nb, [4, 16, 48, 96]);
        assert_eq!(nbytes(DType::F32, &ne, &nb), 96);
        assert!(is_contiguous(DType::F32, &ne, &nb));
        let q = contiguous_nb(DType::Q4_0, &[64, 2, 1, 1]);
        assert_eq!(q, [18, 36, 72, 72]);
        assert_eq!(nbytes(DType::Q4_0, &[64, 2, 1, 1], &q), 72);
        // transposed view of a 4x3 f32 matrix
        let t_ne = [3, 4, 2, 1];
        let t_nb = [16, 4, 48, 96];
        assert!(!is_contiguous(DType::F32, &t_ne, &t_nb));
        assert_eq!(nbytes(DType::F32, &t_ne, &t_nb), 96);
    }

    #[test]
    fn broadcasting_rule() {
        assert!(can_repeat(&[16, 1, 3, 1], &[16, 5, 3, 2]));
        assert!(!can_repeat(&[16, 2, 3, 1], &[16, 5, 3, 2]));
        assert_eq!(n_dims(&[5, 1, 1, 1]), 1);
        assert_eq!(n_dims(&[5, 1, 2, 1]), 3);
        assert_eq!(unravel(23, &[4, 3, 2, 1]), [3, 2, 1, 0]);
    }
}
