//! The decoding kernel for **bf16 weights** on CPUs with AVX512-BF16 (`VDPBF16PS`,
//! `_mm512_dpbf16_ps`: each f32 lane adds the products of one pair of bf16 values, adjacent in
//! memory, to its accumulator). The weight streams as bf16, half the bytes of f32, and is never
//! converted; the input rows are rounded to bf16 once (a bf16 input is taken as it is) and every
//! product is accumulated in f32 (a product of two bf16 values is exact in f32).
//!
//! The pairs must be adjacent along the inner dimension `k`:
//! - **transposed view of a row-major `[n, k]`** (the tied LM head): every weight row is already
//!   a run of pairs along `k`; each output is one dot product (as in the f32 kernel);
//! - **row-major `[k, n]`** (every projection): two consecutive weight rows `i`, `i + 1` are
//!   loaded and interleaved on the fly (`vpunpck{l,h}wd`: one shuffle per 32 weights), so no
//!   packed copy of the weight is made or cached. The interleave works within 128-bit lanes, so
//!   accumulator lanes hold the columns of a 32-column chunk in a fixed permuted order
//!   ([`column_of`]); tiles accumulate in that order in a scratch buffer, put in column order
//!   once at the end. An odd `k` pairs its last row with zeros.
//!
//! The split into tasks is the f32 kernel's (column blocks of the transposed layout; at most
//! four blocks of weight rows, even-sized, for the row-major one), so results do not depend on
//! the number of threads. The intrinsics are stable since Rust 1.89 (`avx512bf16` target
//! feature), no inline assembly.

// Register tiles index accumulators by row and column, as the arithmetic reads.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use rayon::prelude::*;

/// Output columns per parallel task of [`by_columns`].
const COLUMNS_PER_TASK: usize = 128;
/// Most blocks of weight rows [`by_rows`] splits `k` into, each of at least [`ROWS_PER_PART`].
const PARTS: usize = 4;
const ROWS_PER_PART: usize = 64;
/// Weight rows (an even number) per block of [`by_rows`]: the bytes of the f32 kernel's 8.
const BLOCK: usize = 16;
/// Output columns of one chunk of the row-major kernel (32 bf16 weights per 512-bit load).
const CHUNK: usize = 32;

/// Whether this CPU has AVX-512 (F, BW) with BF16 and `KILN_SIMD` allows it: `KILN_SIMD=avx512`
/// (or `avx2`, `plain`) keeps bf16 weights on the path without this kernel; other values (unset,
/// empty, `avx512bf16`) leave it on. Read once per process.
pub fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        use crate::model::fused::simd::{Level, level};
        let capped = matches!(std::env::var("KILN_SIMD").as_deref(), Ok("avx512" | "avx2" | "plain"));
        !capped
            && level() == Level::Avx512
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("avx512bw")
    })
}

/// The input rows `x` `[m, k]` as bf16 bits, each row padded with a zero to an even length.
pub enum Input<'a> {
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
}

fn padded(x: Input<'_>, m: usize, k: usize) -> (Vec<u16>, usize) {
    let kp = k + k % 2;
    let mut out = vec![0u16; m * kp];
    for (r, row) in out.chunks_exact_mut(kp).enumerate() {
        match &x {
            Input::F32(x) => row.iter_mut().zip(&x[r * k..(r + 1) * k]).for_each(|(o, v)| *o = half::bf16::from_f32(*v).to_bits()),
            Input::Bf16(x) => row.iter_mut().zip(&x[r * k..(r + 1) * k]).for_each(|(o, v)| *o = v.to_bits()),
        }
    }
    (out, kp)
}

/// `x · w` in f32, `x` `[m, k]`, `w` bf16 `[k, n]` row-major (`transposed == false`, `w` holds
/// `k × n` values) or the transpose of a row-major `[n, k]` (`transposed`, `w` holds `n × k`).
/// Only call when [`available`].
pub fn matmul(x: Input<'_>, m: usize, k: usize, w: &[half::bf16], n: usize, transposed: bool) -> Vec<f32> {
    assert!(available() && w.len() >= n * k);
    let (xs, kp) = padded(x, m, k);
    let w: &[u16] = bytemuck::cast_slice(&w[..n * k]);
    match transposed {
        true => by_columns(&xs, m, k, kp, w, n),
        false => by_rows(&xs, m, k, kp, w, n),
    }
}

/// The output pointer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

/// Transposed weights: tasks own disjoint output columns and stream their weight rows.
fn by_columns(xs: &[u16], m: usize, k: usize, kp: usize, wt: &[u16], n: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    let out = SharedOut(y.as_mut_ptr());
    (0..n.div_ceil(COLUMNS_PER_TASK)).into_par_iter().for_each(|task| {
        #[allow(clippy::redundant_locals)]
        let out = out;
        let cols = task * COLUMNS_PER_TASK..((task + 1) * COLUMNS_PER_TASK).min(n);
        for row in (0..m).step_by(8) {
            let rows = (m - row).min(8);
            // SAFETY: `available` checked the instruction sets; `xs` holds `m × kp` and `wt`
            // `n × k` values; tasks write disjoint columns of `y`, which outlives the loop.
            unsafe { dot_rows(&xs[row * kp..], rows, k, kp, wt, cols.clone(), out.0.add(row * n), n) };
        }
    });
    y
}

/// Row-major weights: up to [`PARTS`] even-sized blocks of weight rows, each streamed once into
/// its own partial product (in the chunk order of [`column_of`]); the parts are summed and put
/// in column order.
fn by_rows(xs: &[u16], m: usize, k: usize, kp: usize, w: &[u16], n: usize) -> Vec<f32> {
    let np = n.div_ceil(CHUNK) * CHUNK;
    let parts = (k / ROWS_PER_PART).clamp(1, PARTS);
    let per_part = k.div_ceil(parts).next_multiple_of(2);
    let mut partials = vec![0.0f32; parts * m * np];
    partials.par_chunks_mut(m * np).enumerate().for_each(|(part, y)| {
        let inner = (part * per_part).min(k)..((part + 1) * per_part).min(k);
        // SAFETY: `available` checked the instruction sets; `xs` holds `m × kp` and `w` `k × n`
        // values, `y` `m × np`; `inner` starts at an even row.
        unsafe { outer_rows(xs, m, k, kp, w, n, np, inner, y) };
    });
    let (sum, rest) = partials.split_at_mut(m * np);
    for part in rest.chunks_exact(m * np) {
        sum.iter_mut().zip(part).for_each(|(a, b)| *a += b);
    }
    let mut y = vec![0.0f32; m * n];
    for (out, acc) in y.chunks_exact_mut(n).zip(sum.chunks_exact(np)) {
        for (j, o) in out.iter_mut().enumerate() {
            *o = acc[j / CHUNK * CHUNK + column_of(j % CHUNK)];
        }
    }
    y
}

/// Where column `c` (`< 32`) of a chunk lies in its accumulators: `vpunpcklwd` of two rows of
/// 32 bf16 pairs columns `8L..8L + 4` of each 128-bit lane `L` into f32 lanes `4L..4L + 4` (the
/// first accumulator), `vpunpckhwd` columns `8L + 4..8L + 8` (the second, offset 16).
fn column_of(c: usize) -> usize {
    let (lane, q) = (c / 8, c % 8);
    if q < 4 { 4 * lane + q } else { 16 + 4 * lane + q - 4 }
}

/// The mask of the first `width` (`≤ 32`) 16-bit lanes.
fn mask32(width: usize) -> __mmask32 {
    if width >= 32 { u32::MAX } else { (1u32 << width) - 1 }
}

/// Transposed layout: `y[r·ys + j] = x[r] · wt[j]` for `r < rows ≤ 8`, `j` in `cols`.
///
/// # Safety
/// AVX-512F/BW/BF16 must be available; `x` holds `rows × kp` values, `wt` `cols.end × k`, and
/// `y` has room for `rows` rows of stride `ys`.
unsafe fn dot_rows(x: &[u16], rows: usize, k: usize, kp: usize, wt: &[u16], cols: std::ops::Range<usize>, y: *mut f32, ys: usize) {
    assert!(x.len() >= rows * kp && wt.len() >= cols.end * k);
    with_rows!(rows, R => {
        let mut j = cols.start;
        while j + 3 <= cols.end {
            unsafe { dot_tile::<R, 3>(x.as_ptr(), k, kp, wt.as_ptr(), j, y, ys) };
            j += 3;
        }
        while j < cols.end {
            unsafe { dot_tile::<R, 1>(x.as_ptr(), k, kp, wt.as_ptr(), j, y, ys) };
            j += 1;
        }
    })
}

/// An `R × C` tile of dot products over pairs along `k`, `R·C` accumulators in registers.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn dot_tile<const R: usize, const C: usize>(x: *const u16, k: usize, kp: usize, wt: *const u16, j0: usize, y: *mut f32, ys: usize) {
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let full = k / 32 * 32;
        let mut i = 0;
        while i < full {
            let mut w = [_mm512_setzero_si512(); C];
            for c in 0..C {
                w[c] = _mm512_loadu_si512(wt.add((j0 + c) * k + i) as *const _);
                _mm_prefetch::<_MM_HINT_T0>(wt.wrapping_add((j0 + C + c) * k + i) as *const i8);
            }
            for r in 0..R {
                let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(x.add(r * kp + i) as *const _));
                for c in 0..C {
                    acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, std::mem::transmute::<__m512i, __m512bh>(w[c]));
                }
            }
            i += 32;
        }
        if full < k {
            let mask = mask32(k - full);
            let mut w = [_mm512_setzero_si512(); C];
            for c in 0..C {
                w[c] = _mm512_maskz_loadu_epi16(mask, wt.add((j0 + c) * k + full) as *const i16);
            }
            for r in 0..R {
                let xv: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(mask, x.add(r * kp + full) as *const i16));
                for c in 0..C {
                    acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, std::mem::transmute::<__m512i, __m512bh>(w[c]));
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                *y.add(r * ys + j0 + c) = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
    }
}

/// Row-major layout: adds `Σ_{i ∈ inner} x[r·kp + i] · w[i·n + j]` to `y` (`m × np`, chunk order
/// of [`column_of`]) for `r < m`, `j < n`. The weight is read once, in blocks of [`BLOCK`] rows,
/// by every row group of 8 while the block is in cache.
///
/// # Safety
/// AVX-512F/BW/BF16 must be available; `x` holds `m × kp` and `w` `k × n` values, `y` `m × np`;
/// `inner` lies within `0..k` and starts at an even row.
unsafe fn outer_rows(x: &[u16], m: usize, k: usize, kp: usize, w: &[u16], n: usize, np: usize, inner: std::ops::Range<usize>, y: &mut [f32]) {
    assert!(x.len() >= m * kp && w.len() >= k * n && inner.end <= k && inner.start % 2 == 0 && y.len() >= m * np);
    let mut i0 = inner.start;
    while i0 < inner.end {
        let block = i0..(i0 + BLOCK).min(inner.end);
        for row in (0..m).step_by(8) {
            let (x, y) = (&x[row * kp..], y[row * np..].as_mut_ptr());
            let rows = (m - row).min(8);
            with_rows!(rows, R => {
                let mut j = 0;
                // Two chunks per tile while the accumulators (4 per row) fit the 32 registers.
                if R <= 4 {
                    while j + 2 * CHUNK <= n {
                        unsafe { outer_tile::<R, 2>(x.as_ptr(), kp, w.as_ptr(), k, n, np, block.clone(), j, u32::MAX, y) };
                        j += 2 * CHUNK;
                    }
                }
                while j < n {
                    let width = (n - j).min(CHUNK);
                    unsafe { outer_tile::<R, 1>(x.as_ptr(), kp, w.as_ptr(), k, n, np, block.clone(), j, mask32(width), y) };
                    j += width;
                }
            })
        }
        i0 = block.end;
    }
}

/// An `R × 32C` output tile over the weight rows `is` (taken in pairs; a last unpaired row `k - 1`
/// is paired with zeros), `2·R·C` accumulators in registers; the last chunk's columns are
/// masked by `last`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn outer_tile<const R: usize, const C: usize>(
    x: *const u16,
    kp: usize,
    w: *const u16,
    k: usize,
    n: usize,
    np: usize,
    is: std::ops::Range<usize>,
    j0: usize,
    last: __mmask32,
    y: *mut f32,
) {
    /// Weight rows fetched ahead of use.
    const AHEAD: usize = 2 * BLOCK;
    unsafe {
        // `pairs[c][h]`: chunk `c`'s weights interleaved in pairs; `accs[r][c][h]` its sums.
        let mut pairs = [[_mm512_setzero_ps(); 2]; C];
        let mut accs = [pairs; R];
        for r in 0..R {
            for c in 0..C {
                for h in 0..2 {
                    accs[r][c][h] = _mm512_loadu_ps(y.add(r * np + j0 + CHUNK * c + 16 * h));
                }
            }
        }
        let mut i = is.start;
        while i < is.end {
            let paired = i + 1 < k;
            let (a, b) = (w.add(i * n + j0), w.wrapping_add((i + 1) * n + j0));
            for c in 0..C {
                let mask = if c + 1 == C { last } else { u32::MAX };
                let lo = _mm512_maskz_loadu_epi16(mask, a.add(CHUNK * c) as *const i16);
                let hi = if paired { _mm512_maskz_loadu_epi16(mask, b.add(CHUNK * c) as *const i16) } else { _mm512_setzero_si512() };
                _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(AHEAD * n + CHUNK * c) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD * n + CHUNK * c) as *const i8);
                pairs[c] = [
                    _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo, hi)),
                    _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo, hi)),
                ];
            }
            for r in 0..R {
                // The pair x[r, i], x[r, i + 1] (a zero pads an odd k) in every lane.
                let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32((x.add(r * kp + i) as *const i32).read_unaligned()));
                for c in 0..C {
                    for h in 0..2 {
                        let wv: __m512bh = std::mem::transmute(pairs[c][h]);
                        accs[r][c][h] = _mm512_dpbf16_ps(accs[r][c][h], xv, wv);
                    }
                }
            }
            i += 2;
        }
        for r in 0..R {
            for c in 0..C {
                for h in 0..2 {
                    _mm512_storeu_ps(y.add(r * np + j0 + CHUNK * c + 16 * h), accs[r][c][h]);
                }
            }
        }
    }
}
