//! The decoding kernel's two products for CPUs with AVX2 and FMA but no AVX-512 (the same
//! scheme as the AVX-512 kernels of `cpu_decode.rs`, with 8-lane registers: row groups of 4, so
//! that a tile's accumulators, weights and broadcast input fit the 16 vector registers).

// Register tiles index accumulators by row and column, as the arithmetic reads.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use std::arch::x86_64::*;

/// Rows of a group (accumulator rows of a tile).
const GROUP: usize = 4;

/// Runs `$body` with the const `$r` set to `rows` (1..=4).
macro_rules! with_rows {
    ($rows:expr, $r:ident => $body:expr) => {
        match $rows {
            1 => { const $r: usize = 1; $body }
            2 => { const $r: usize = 2; $body }
            3 => { const $r: usize = 3; $body }
            _ => { const $r: usize = 4; $body }
        }
    };
}

/// A lane mask for the first `width` (1..=8) of 8 lanes.
#[target_feature(enable = "avx2")]
unsafe fn lanes(width: usize) -> __m256i {
    _mm256_cmpgt_epi32(_mm256_set1_epi32(width as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

#[target_feature(enable = "avx2")]
unsafe fn sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_hadd_ps(s, s);
    _mm_cvtss_f32(_mm_hadd_ps(s, s))
}

/// Transposed layout: `y[r·ys + j] = x[r] · wt[j]` for `r < rows` and `j` in `cols`, `wt`
/// row-major `[n, k]`.
///
/// # Safety
/// AVX2 and FMA must be available; `x` holds `rows × k`, `wt` holds `cols.end × k` values and
/// `y` has room for `rows` rows of stride `ys`.
pub unsafe fn dot_rows(x: &[f32], rows: usize, k: usize, wt: &[f32], cols: std::ops::Range<usize>, y: *mut f32, ys: usize) {
    assert!(x.len() >= rows * k && wt.len() >= cols.end * k);
    for row in (0..rows).step_by(GROUP) {
        let (x, y) = (&x[row * k..], unsafe { y.add(row * ys) });
        with_rows!((rows - row).min(GROUP), R => {
            let mut j = cols.start;
            while j + 3 <= cols.end {
                unsafe { dot_tile::<R, 3>(x.as_ptr(), k, wt.as_ptr(), j, y, ys) };
                j += 3;
            }
            while j < cols.end {
                unsafe { dot_tile::<R, 1>(x.as_ptr(), k, wt.as_ptr(), j, y, ys) };
                j += 1;
            }
        })
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_tile<const R: usize, const C: usize>(x: *const f32, k: usize, wt: *const f32, j0: usize, y: *mut f32, ys: usize) {
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let full = k / 8 * 8;
        let mut i = 0;
        while i < full {
            let mut w = [_mm256_setzero_ps(); C];
            for c in 0..C {
                w[c] = _mm256_loadu_ps(wt.add((j0 + c) * k + i));
                _mm_prefetch::<_MM_HINT_T0>(wt.wrapping_add((j0 + C + c) * k + i) as *const i8);
            }
            for r in 0..R {
                let xv = _mm256_loadu_ps(x.add(r * k + i));
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
                }
            }
            i += 8;
        }
        if full < k {
            let mask = lanes(k - full);
            let mut w = [_mm256_setzero_ps(); C];
            for c in 0..C {
                w[c] = _mm256_maskload_ps(wt.add((j0 + c) * k + full), mask);
            }
            for r in 0..R {
                let xv = _mm256_maskload_ps(x.add(r * k + full), mask);
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                *y.add(r * ys + j0 + c) = sum(acc[r][c]);
            }
        }
    }
}

/// Row-major layout: `y[r·n + j] += Σ_{i ∈ inner} x[r·k + i] · w[i·n + j]` for `r < m`, `j < n`.
///
/// # Safety
/// AVX2 and FMA must be available; `x` holds `m × k` and `w` `k × n` values; `inner` lies within
/// `0..k`.
pub unsafe fn outer_rows(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, inner: std::ops::Range<usize>, y: &mut [f32]) {
    assert!(x.len() >= m * k && w.len() >= k * n && inner.end <= k && y.len() >= m * n);
    let mut i0 = inner.start;
    while i0 < inner.end {
        let block = i0..(i0 + BLOCK).min(inner.end);
        for row in (0..m).step_by(GROUP) {
            let (x, y) = (&x[row * k..], y[row * n..].as_mut_ptr());
            with_rows!((m - row).min(GROUP), R => {
                let mut j = 0;
                while j + 24 <= n {
                    unsafe { outer_tile::<R, 3>(x.as_ptr(), k, w.as_ptr(), n, block.clone(), j, 8, y) };
                    j += 24;
                }
                while j < n {
                    let width = (n - j).min(8);
                    unsafe { outer_tile::<R, 1>(x.as_ptr(), k, w.as_ptr(), n, block.clone(), j, width, y) };
                    j += width;
                }
            })
        }
        i0 = block.end;
    }
}

/// Weight rows per block of [`outer_rows`] (as for AVX-512).
const BLOCK: usize = 8;

/// An `R × 8C` output tile; the last 8 columns hold `last` (1..=8) valid ones.
#[target_feature(enable = "avx2,fma")]
unsafe fn outer_tile<const R: usize, const C: usize>(
    x: *const f32,
    k: usize,
    w: *const f32,
    n: usize,
    is: std::ops::Range<usize>,
    j0: usize,
    last: usize,
    y: *mut f32,
) {
    const AHEAD: usize = 2 * BLOCK;
    unsafe {
        // Masked loads only where a tile is ragged (they are slower than plain ones).
        let tail = lanes(last);
        let ragged = |c: usize| c + 1 == C && last < 8;
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for r in 0..R {
            for c in 0..C {
                let at = y.add(r * n + j0 + 8 * c);
                acc[r][c] = if ragged(c) { _mm256_maskload_ps(at, tail) } else { _mm256_loadu_ps(at) };
            }
        }
        for i in is {
            let row = w.add(i * n + j0);
            let mut wv = [_mm256_setzero_ps(); C];
            for c in 0..C {
                wv[c] = if ragged(c) { _mm256_maskload_ps(row.add(8 * c), tail) } else { _mm256_loadu_ps(row.add(8 * c)) };
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(AHEAD * n + 8 * c) as *const i8);
            }
            for r in 0..R {
                let xv = _mm256_set1_ps(*x.add(r * k + i));
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                let at = y.add(r * n + j0 + 8 * c);
                if ragged(c) {
                    _mm256_maskstore_ps(at, tail, acc[r][c]);
                } else {
                    _mm256_storeu_ps(at, acc[r][c]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Both products against a plain triple loop, on shapes with ragged edges.
    #[test]
    fn avx2_kernels_match_a_plain_product() {
        if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
            panic!("this test needs a CPU with AVX2 and FMA (the kernel it checks requires them)");
        }
        let (m, k, n) = (7, 37, 53);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 13 % 23) as f32 - 11.0) / 11.0).collect();
        let wt: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect(); // [n, k]
        let want: Vec<f32> = (0..m * n).map(|o| (0..k).map(|i| x[o / n * k + i] * w[i * n + o % n]).sum()).collect();
        let mut rows = vec![0.0f32; m * n];
        unsafe { super::outer_rows(&x, m, k, &w, n, 0..k, &mut rows) };
        let mut cols = vec![0.0f32; m * n];
        unsafe { super::dot_rows(&x, m, k, &wt, 0..n, cols.as_mut_ptr(), n) };
        for (got, name) in [(rows, "row-major"), (cols, "transposed")] {
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(err < 1e-4, "{name}: max |Δ| = {err:e}");
        }
    }
}
