//! Scalar forms of ggml's vectorised f32 functions, operation for operation, for the kernels
//! (and reference computations) that must reproduce llama.cpp's results bit for bit.

/// One lane of ggml's AVX2 `ggml_v_expf`: a range reduction to `2^n · (1 + p(b))` with a
/// degree-5 polynomial (from ARM's optimized-routines, as ggml uses it on x86); `-inf` gives 0.
#[inline]
pub fn ggml_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e), /* 0x1.7f7d1cp-20 */
        (-n).mul_add(f32::from_bits(0x3f31_7200) /* 0x1.62e4p-1 */, x),
    );
    let e = z.to_bits().wrapping_shl(23);
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let c = n.abs() > 126.0;
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        ) // 0x1.555e66p-3, 0x1.fffdb6p-2
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b); // 0x1.ffffecp-1
    if !c {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}
