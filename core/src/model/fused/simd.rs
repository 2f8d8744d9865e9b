//! Runtime CPU-feature dispatch for the fused kernels, and the element functions they share.
//!
//! A kernel body is written once as plain Rust over slices (loops the compiler vectorises); the
//! [`simd_fn!`] macro compiles it three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA)
//! and the build's baseline, and picks one at run time from what the CPU reports ([`level`]).
//! `KILN_SIMD=avx512|avx2|plain` caps the level (to compare the paths or to rule one out).

use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// The instruction-set level the kernels run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The build's baseline (SSE2 on x86-64).
    Plain,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 (F, BW, DQ, VL) with AVX2 and FMA.
    Avx512,
}

/// The level detected on this CPU, capped by `KILN_SIMD` if set (read once per process).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let detected = detect();
        let cap = match std::env::var("KILN_SIMD").as_deref() {
            Ok("plain") => Level::Plain,
            Ok("avx2") => Level::Avx2,
            _ => Level::Avx512,
        };
        detected.min(cap)
    })
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") && has!("avx2") && has!("fma") {
            return Level::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return Level::Avx2;
        }
    }
    Level::Plain
}

/// Defines `fn name(args) -> ret { body }` compiled for each [`Level`] and dispatched at run time.
/// The body must be safe code; the per-level copies only differ in the instructions used.
#[allow(unused_macros)] // the kernels using it need the `flex` feature
macro_rules! simd_fn {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v4($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v3($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                match $crate::model::fused::simd::level() {
                    // SAFETY: the level was detected on this CPU.
                    $crate::model::fused::simd::Level::Avx512 => return unsafe { v4($($arg),*) },
                    $crate::model::fused::simd::Level::Avx2 => return unsafe { v3($($arg),*) },
                    $crate::model::fused::simd::Level::Plain => {}
                }
            }
            body($($arg),*)
        }
    };
}
#[allow(unused_imports)]
pub(crate) use simd_fn;

/// An empty vector with room for `len` values, for a kernel that writes every one of them before
/// `set_len` (no zeroing pass). In debug builds, and with `KILN_POISON_UNWRITTEN=1`, the room is
/// first filled with NaN, so a value a kernel leaves unwritten shows as NaN rather than as
/// whatever the allocator's reused memory held.
pub fn unwritten(len: usize) -> Vec<f32> {
    static POISON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let poison = cfg!(debug_assertions) || *POISON.get_or_init(|| std::env::var_os("KILN_POISON_UNWRITTEN").is_some_and(|v| v == "1"));
    if !poison {
        return Vec::with_capacity(len);
    }
    let mut v = vec![f32::NAN; len];
    v.clear();
    v
}

/// `N` new vectors of `len` values each, written by `fill` (a kernel's outputs), rather than zeroed
/// vectors the kernel then overwrites: the zeroing was a pass over every output, 5–7% of a tiny
/// model's training step (`memset`; the allocator hands back memory it keeps, so nothing else
/// zeroes it).
///
/// # Safety
/// `fill` writes every value of every output.
pub unsafe fn written<const N: usize>(len: usize, fill: impl FnOnce([&mut [MaybeUninit<f32>]; N])) -> [Vec<f32>; N] {
    let mut out: [Vec<f32>; N] = std::array::from_fn(|_| unwritten(len));
    fill(out.each_mut().map(|v| &mut v.spare_capacity_mut()[..len]));
    for v in &mut out {
        // SAFETY: `fill` wrote all `len` values (the caller's promise).
        unsafe { v.set_len(len) };
    }
    out
}

/// `e^x` for `-87 ≤ x ≤ 88` (clamped outside), branch-free so loops over it vectorise (Cephes' `expf`: range reduction
/// by `ln 2`, degree-6 polynomial, relative error below 2e-7). Large negative `x` gives a tiny
/// positive number rather than 0; callers that need exact zeros (masked scores) set them.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n built from `n`'s bits rather than `n as i32`: Rust's saturating float-to-int cast does not
    // vectorise (each lane was converted alone, most of a softmax's time). `n` is an integer in
    // -126..=127 (`x` is clamped), so `n + 1.5·2^23` is exact and its bits are `0x4B40_0000 + n`.
    let n_bits = (n + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000);
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// `1 / (1 + e^-x)` via [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Sum of `a[i]·b[i]` in 16 independent lanes (vectorises, unlike a single running sum).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// The largest element (`-inf` for an empty slice), in 16 independent lanes so it vectorises
/// (a single running `max` is a sequential chain the compiler may not reorder).
#[inline(always)]
pub fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = xs.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    rest.iter().chain(&acc).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// Replaces every `x` by `e^(x - shift)` (`-inf` by exactly 0) and returns their sum, summed in
/// 16 independent lanes so the loop vectorises.
#[inline(always)]
pub fn exp_shifted_sum(xs: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = xs.chunks_exact_mut(16);
    for c in &mut chunks {
        for i in 0..16 {
            c[i] = if c[i] == f32::NEG_INFINITY { 0.0 } else { exp(c[i] - shift) };
            acc[i] += c[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for x in chunks.into_remainder() {
        *x = if *x == f32::NEG_INFINITY { 0.0 } else { exp(*x - shift) };
        sum += *x;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        let mut worst = 0.0f32;
        for i in -86_000..=87_000 {
            let x = i as f32 * 1e-3;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2e-7, "max relative error {worst:e}");
        assert!(exp(-1e30) < 1e-37 && exp(-1e30) >= 0.0);
        // The ends of the clamped range: 2^-126 and 2^127 come out as normal numbers.
        assert!((exp(-87.0) / (-87.0f32).exp() - 1.0).abs() < 2e-7 && (exp(88.0) / 88.0f32.exp() - 1.0).abs() < 2e-7);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn max_and_exp_sum_cover_every_element() {
        let mut xs: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        xs[5] = f32::NEG_INFINITY;
        let m = xs.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        assert_eq!(max(&xs), m);
        let want: f32 = xs.iter().map(|&x| if x == f32::NEG_INFINITY { 0.0 } else { (x - m).exp() }).sum();
        let got = exp_shifted_sum(&mut xs, m);
        assert!((got - want).abs() < 1e-5 && xs[5] == 0.0, "{got} vs {want}");
    }

    #[test]
    fn dot_sums_every_element() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b = vec![2.0f32; 37];
        assert_eq!(dot(&a, &b), 2.0 * (0..37).sum::<i32>() as f32);
    }
}
