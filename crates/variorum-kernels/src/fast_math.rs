//! Element-wise math the CPU kernels share, written so loops over slices vectorise (no libm
//! call, no branch per element).

/// e^x for x ≤ 0 (Cephes' expf: x = n·ln 2 + r, |r| ≤ ½ ln 2, a degree-6 polynomial in r, 2ⁿ by
/// exponent bits); arguments below −87 are taken as −87 (e^−87 ≈ 1.6 · 10⁻³⁸, the smallest
/// normal power of two it can build).
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    let x = x.max(-87.0);
    // round to nearest without a libm call: adding 1.5 · 2²³ drops the fraction, and leaves n in
    // the low bits of the sum (no float → int conversion, whose saturation does not vectorise)
    const ROUND: f32 = 12_582_912.0;
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits());
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(n_int.wrapping_add(127) << 23)
}

/// Whether the CPU has every feature `wide_vectors!`'s AVX-512 copy is compiled for (a CPU
/// with AVX-512F alone, without VL or DQ, must not run it).
#[cfg(target_arch = "x86_64")]
pub fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && has_avx2()
}

/// Whether the CPU has every feature `wide_vectors!`'s AVX2 copy is compiled for.
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("avx")
}

/// Defines a function whose body is compiled three times — for AVX-512, for AVX2 and for the
/// baseline (SSE2, which is all a default x86-64 build may assume) — and picks the widest this CPU
/// has at run time. For loops over slices whose bodies are `#[inline]` arithmetic (the kernels'
/// exp, erf, reductions); the body sits in an `#[inline(always)]` function, so it is vectorised
/// inside each target-feature wrapper (a closure handed to such a wrapper is not reliably
/// inlined, and then runs on SSE2). Arguments are plain identifiers.
#[macro_export]
macro_rules! wide_vectors {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            $(#[$meta])*
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                $(#[$meta])*
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,avx")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                $(#[$meta])*
                #[target_feature(enable = "avx2,avx")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::fast_math::has_avx512() {
                    // SAFETY: the CPU has every feature the function is compiled for
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::fast_math::has_avx2() {
                    // SAFETY: as above
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// A vector of `n` floats written by `fill` before anything reads it: no zero fill first (a
/// zero-filled output was 5 % of a baby-GPT step, docs/cpu-speed.md).
///
/// # Safety
/// `fill` writes every one of the `n` elements it is handed.
pub unsafe fn written_by(n: usize, fill: impl FnOnce(&mut [std::mem::MaybeUninit<f32>])) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: the n elements are initialised, as the caller guarantees
    unsafe { v.set_len(n) };
    v
}

/// Lanes of the partial sums below: sixteen independent accumulators let the compiler keep one
/// AVX-512 register (or two AVX2 ones) of them, where a single running float would serialise.
const LANES: usize = 16;

/// Σ xᵢ, summed in `LANES` interleaved partial sums.
#[inline]
pub fn sum(x: &[f32]) -> f32 {
    sum_of(x, |v| v)
}

/// Σ f(xᵢ), summed as [`sum`] (for an `#[inline]` f, e.g. an exp, without a buffer of f(xᵢ)).
#[inline(always)]
pub fn sum_of(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// max xᵢ (−∞ for an empty slice).
#[inline]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.max(*v);
        }
    }
    acc.iter().fold(tail, |m, &v| m.max(v))
}

/// Σ aᵢ bᵢ over the shorter of the two.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_holds_its_accuracy() {
        for i in 0..=20_000 {
            let x = -87.0 * i as f32 / 20_000.0;
            let rel = (exp_neg(x) - x.exp()).abs() / x.exp();
            assert!(rel < 5e-7 || x.exp() < 1e-37, "e^{x}: relative error {rel}");
        }
    }

    #[test]
    fn reductions_match_their_definitions() {
        for n in [0usize, 1, 5, 16, 17, 100] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 104_729) % 19) as f32 * 0.5).collect();
            assert_eq!(sum(&a), a.iter().sum::<f32>(), "sum of {n}");
            assert_eq!(sum_of(&a, |v| v * v), a.iter().map(|v| v * v).sum::<f32>(), "sum of squares of {n}");
            assert_eq!(max(&a), a.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)), "max of {n}");
            let exact: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert_eq!(dot(&a, &b), exact, "dot of {n}");
        }
    }
}
