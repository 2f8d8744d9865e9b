//! A matrix product with bf16 operands and f32 accumulation on CPUs with AVX512-BF16
//! (`VDPBF16PS`, `_mm512_dpbf16_ps`: each f32 lane adds the two products of a pair of bf16
//! values): the products of bf16-mixed training (forward and both backward products of every
//! projection) and of bf16 prefill, at any number of rows. The decoding kernel
//! (`cpu_decode_bf16.rs`) covers a few rows against a weight it never copies; this one packs
//! both operands, which pays off once the weight is reused over many rows.
//!
//! `C [m, n] = A [m, k] · B [k, n]`, each operand any 2-D strided view of f32 (rounded to bf16,
//! to nearest even, while packing) or bf16 values, so transposes cost nothing extra: the
//! backward products `dA = dC · Bᵀ` and `dB = Aᵀ · dC` pack the same buffers with their strides
//! swapped. Products of two bf16 values are exact in f32; sums are f32.
//!
//! Packing puts the values of the inner dimension in adjacent pairs (`k` rounded up to even,
//! the odd one paired with zero): `A` in panels of [`MR`] rows, `[k/2][MR]` pairs each, `B` in
//! panels of [`NR`] columns, `[k/2][NR]` pairs. A register tile of `MR × NR` f32 accumulators
//! (24 of the 32 zmm registers) runs over the whole inner dimension: per pair step, two loads
//! of `B`, [`MR`] broadcasts of `A`, `2·MR` dot products; each output is written once. Tasks
//! own disjoint blocks of rows and columns (rayon), so results do not depend on the number of
//! threads.

// Register tiles index accumulators by row and column, as the arithmetic reads.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use rayon::prelude::*;

/// Rows of a register tile (of `A`, of `C`).
pub const MR: usize = 12;
/// Columns of a register tile: two vectors of 16 f32.
pub const NR: usize = 32;
/// Row panels per task (96 rows: a block of packed `A` that stays in L2 while the task
/// walks the column panels).
const ROW_PANELS_PER_TASK: usize = 8;
/// Column panels per task.
const COL_PANELS_PER_TASK: usize = 8;

/// Whether this CPU multiplies bf16 natively (the decoding kernel's test: AVX-512 F and BW with
/// BF16, and `KILN_SIMD` not capping it).
pub fn available() -> bool {
    crate::model::cpu_decode::bf16_available::<burn_flex::Flex>()
}

/// Values of an operand.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// Rounded to bf16 (to nearest even) when packed.
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
}

/// A 2-D strided view of f32 or bf16 values.
pub type Operand<'a> = super::matmul::Strided<Values<'a>>;

impl Values<'_> {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::Bf16(v) => v.len(),
        }
    }
}

/// `a · b` as row-major f32 `[a.rows, b.cols]`. Only call when [`available`].
///
/// # Panics
/// If the inner dimensions differ or a view reaches past its values.
pub fn matmul(a: Operand<'_>, b: Operand<'_>) -> Vec<f32> {
    assert!(available(), "gemm_bf16::matmul without AVX512-BF16");
    assert_eq!(a.cols, b.rows, "inner dimensions");
    assert!(a.fits(a.values.len()) && b.fits(b.values.len()), "operand views reach past their values");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    if m == 0 || n == 0 {
        return Vec::new();
    }
    // Every value of `c` is written below, through the raw pointer, before its length is set:
    // no zeroing pass over a buffer about to be overwritten.
    let mut c: Vec<f32> = super::simd::unwritten(m * n);
    let kp = k.div_ceil(2);
    // This thread's packing buffers, taken (a product that runs on this thread while this one
    // waits in rayon finds none and makes its own).
    let [mut a_buffer, mut b_buffer] = PACKED.take();
    let pa = pack(a, MR, kp, &mut a_buffer);
    let pb = pack(b.t(), NR, kp, &mut b_buffer);
    let (row_panels, col_panels) = (m.div_ceil(MR), n.div_ceil(NR));
    let tasks: Vec<(usize, usize)> = (0..row_panels.div_ceil(ROW_PANELS_PER_TASK))
        .flat_map(|r| (0..col_panels.div_ceil(COL_PANELS_PER_TASK)).map(move |c| (r, c)))
        .collect();
    let out = SharedOut(c.as_mut_ptr());
    tasks.into_par_iter().for_each(|(rt, ct)| {
        #[allow(clippy::redundant_locals)]
        let out = out;
        let rps = rt * ROW_PANELS_PER_TASK..((rt + 1) * ROW_PANELS_PER_TASK).min(row_panels);
        for cp in ct * COL_PANELS_PER_TASK..((ct + 1) * COL_PANELS_PER_TASK).min(col_panels) {
            let b_panel = &pb[cp * kp * NR..(cp + 1) * kp * NR];
            for rp in rps.clone() {
                let a_panel = &pa[rp * kp * MR..(rp + 1) * kp * MR];
                let mut tile = [0.0f32; MR * NR];
                // SAFETY: `available` checked the instruction sets; the panels hold `kp` steps.
                unsafe { kernel(a_panel, b_panel, kp, &mut tile) };
                let (rows, cols) = ((m - rp * MR).min(MR), (n - cp * NR).min(NR));
                for r in 0..rows {
                    let row = rp * MR + r;
                    // SAFETY: tasks write disjoint rectangles of `c`'s allocation (`m · n`
                    // values), which outlives the loop; written, never read, before `set_len`.
                    unsafe { std::ptr::copy_nonoverlapping(tile.as_ptr().add(r * NR), out.0.add(row * n + cp * NR), cols) };
                }
            }
        }
    });
    // SAFETY: the tasks wrote every row `< m` and column `< n` (the panels cover both).
    unsafe { c.set_len(m * n) };
    let keep = |b: Vec<u32>| if b.len() <= KEEP_PACKED { b } else { Vec::new() };
    PACKED.set([keep(a_buffer), keep(b_buffer)]);
    c
}

thread_local! {
    /// The packing buffers of this thread's last product, kept for the next (the same shapes
    /// come back every step): packing then writes into memory already there, instead of into
    /// fresh pages zeroed first.
    static PACKED: std::cell::Cell<[Vec<u32>; 2]> = const { std::cell::Cell::new([Vec::new(), Vec::new()]) };
}

/// Packing buffers above this many values (64 MiB) are freed rather than kept.
const KEEP_PACKED: usize = 16 << 20;

/// The output pointer, shared by tasks that write disjoint blocks.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

/// The view `[outer, k]` in panels of `width` outer indices: `[panel][kp][width]` pairs of
/// bf16 bits (low half: even `k`, high half: the odd one, zero past an odd `k`), written into
/// the front of `buffer` (grown if short); that front. The last panel's lanes past the view's
/// rows keep whatever the buffer held: a lane of `A` feeds only its own row of the tile, and a
/// lane of `B` only its own column, and `matmul` stores neither.
fn pack<'b>(v: Operand<'_>, width: usize, kp: usize, buffer: &'b mut Vec<u32>) -> &'b [u32] {
    let panels = v.rows.div_ceil(width);
    let len = panels * kp * width;
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    let out = &mut buffer[..len];
    out.par_chunks_mut(kp * width).enumerate().for_each(|(panel, dst)| match v.values {
        // SAFETY: `available` (checked by `matmul`) includes AVX-512 F and BW; `matmul` checked
        // that the view fits its values.
        Values::F32(x) if v.col_stride == 1 || v.row_stride == 1 => unsafe { pack_f32(&v, x, panel * width, width, dst) },
        Values::F32(x) => pack_panel(&v, panel * width, width, dst, |i| round(x[i])),
        Values::Bf16(x) => pack_panel(&v, panel * width, width, dst, |i| x[i].to_bits()),
    });
    out
}

/// [`pack_panel`] of f32 values adjacent along `k` (rows rounded 32 values at a time into a
/// row of pairs, then spread over the panel) or along the panel's rows (16 rows of two `k` at a
/// time, stored as they are).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_f32(v: &Operand<'_>, x: &[f32], first: usize, width: usize, dst: &mut [u32]) {
    let rows = (v.rows - first).min(width);
    let (k, rs, cs) = (v.cols, v.row_stride, v.col_stride);
    let x = x.as_ptr();
    if cs == 1 {
        let mut row = vec![0u32; k.div_ceil(2)];
        for r in 0..rows {
            let base = (first + r) * rs;
            let mut c = 0;
            while c + 32 <= k {
                // SAFETY: the row holds `k` values from `base`; `row` holds `k / 2` pairs.
                unsafe {
                    let lo = _mm512_cvtepi32_epi16(round16(_mm512_loadu_ps(x.add(base + c))));
                    let hi = _mm512_cvtepi32_epi16(round16(_mm512_loadu_ps(x.add(base + c + 16))));
                    _mm512_storeu_si512(row.as_mut_ptr().add(c / 2) as *mut _, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
                }
                c += 32;
            }
            // SAFETY: as above, one value at a time.
            let at = |i: usize| round(unsafe { x.add(base + i).read() }) as u32;
            for p in c / 2..k / 2 {
                row[p] = at(2 * p) | at(2 * p + 1) << 16;
            }
            if k % 2 == 1 {
                row[k / 2] = at(k - 1);
            }
            for (p, pair) in row.iter().enumerate() {
                dst[p * width + r] = *pair;
            }
        }
    } else {
        for p in 0..k.div_ceil(2) {
            let base = first * rs + 2 * p * cs;
            let odd = 2 * p + 1 < k;
            for r in (0..rows).step_by(16) {
                let lanes: __mmask16 = if rows - r >= 16 { !0 } else { (1 << (rows - r)) - 1 };
                // SAFETY: the masked lanes are rows of the panel, which the view holds; the odd
                // `k` is read only where it exists.
                unsafe {
                    let even = round16(_mm512_maskz_loadu_ps(lanes, x.add(base + r)));
                    let pairs = match odd {
                        true => _mm512_or_si512(even, _mm512_slli_epi32(round16(_mm512_maskz_loadu_ps(lanes, x.add(base + cs + r))), 16)),
                        false => even,
                    };
                    _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(p * width + r) as *mut _, lanes, pairs);
                }
            }
        }
    }
}

/// [`round`] of 16 values: bf16 bits in the low half of each 32-bit lane.
#[target_feature(enable = "avx512f,avx512bw")]
fn round16(v: __m512) -> __m512i {
    let b = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    let nearest = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
    let nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    let quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    _mm512_mask_blend_epi32(nan, nearest, quiet)
}

/// One panel, read along whichever of its axes is adjacent in memory.
fn pack_panel(v: &Operand<'_>, first: usize, width: usize, dst: &mut [u32], bits: impl Fn(usize) -> u16) {
    let rows = (v.rows - first).min(width);
    let (k, rs, cs) = (v.cols, v.row_stride, v.col_stride);
    let pair = |at: usize| bits(at) as u32 | (bits(at + cs) as u32) << 16;
    if cs <= rs {
        for r in 0..rows {
            let base = (first + r) * rs;
            for p in 0..k / 2 {
                dst[p * width + r] = pair(base + 2 * p * cs);
            }
        }
    } else {
        for p in 0..k / 2 {
            let base = first * rs + 2 * p * cs;
            for (r, d) in dst[p * width..p * width + rows].iter_mut().enumerate() {
                *d = pair(base + r * rs);
            }
        }
    }
    if k % 2 == 1 {
        for r in 0..rows {
            dst[(k / 2) * width + r] = bits((first + r) * rs + (k - 1) * cs) as u32;
        }
    }
}

/// f32 to bf16 bits, rounded to nearest even (NaN stays NaN).
#[inline(always)]
fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// One `MR × NR` tile over `kp` pair steps.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn kernel(a: &[u32], b: &[u32], kp: usize, tile: &mut [f32; MR * NR]) {
    debug_assert!(a.len() >= kp * MR && b.len() >= kp * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (a, b) = (a.as_ptr(), b.as_ptr());
    for p in 0..kp {
        // SAFETY: the caller's panels hold `kp` steps of `MR` and `NR` pairs.
        unsafe {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR) as *const _));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16) as *const _));
            for r in 0..MR {
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(a.add(p * MR + r).read() as i32));
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
            }
        }
    }
    for r in 0..MR {
        // SAFETY: `tile` holds `MR × NR` values.
        unsafe {
            _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), acc[r][0]);
            _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), acc[r][1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(x: f32) -> f32 {
        half::bf16::from_f32(x).to_f32()
    }

    /// `a · b` with the operands rounded to bf16, in f64.
    fn reference(a: &Operand<'_>, b: &Operand<'_>) -> Vec<f64> {
        let get = |o: &Operand<'_>, i: usize, j: usize| match o.values {
            Values::F32(v) => bf16(v[i * o.row_stride + j * o.col_stride]) as f64,
            Values::Bf16(v) => v[i * o.row_stride + j * o.col_stride].to_f64(),
        };
        let mut c = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                c[i * b.cols + j] = (0..a.cols).map(|l| get(a, i, l) * get(b, l, j)).sum();
            }
        }
        c
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32 - 0.5).collect()
    }

    /// Every shape edge (rows, columns and inner sizes around the tile sizes, odd `k`), both
    /// layouts of both operands, f32 and bf16 values: against the product of the rounded
    /// operands in f64 (only the order of f32 sums differs).
    #[test]
    fn products_match_the_rounded_operands() {
        if !available() {
            assert!(!is_x86_feature_detected!("avx512bf16") || std::env::var("KILN_SIMD").is_ok());
            eprintln!("gemm_bf16: this CPU has no AVX512-BF16; the kernel is not run here");
            return;
        }
        // Twice, the second time largest first: the thread's packing buffers then hold an
        // earlier product's values past every edge.
        let shapes = [(1, 1, 1), (12, 32, 2), (13, 33, 3), (37, 70, 45), (97, 70, 65), (200, 300, 129), (5, 260, 700)];
        for &(m, n, k) in shapes.iter().chain(shapes.iter().rev()) {
            let (av, bv) = (values(m * k, 1), values(k * n, 2));
            let ab: Vec<half::bf16> = av.iter().map(|&x| half::bf16::from_f32(x)).collect();
            for (a, b) in [
                (Operand::row_major(Values::F32(&av), m, k), Operand::row_major(Values::F32(&bv), k, n)),
                (Operand::row_major(Values::F32(&av), k, m).t(), Operand::row_major(Values::F32(&bv), n, k).t()),
                (Operand::row_major(Values::Bf16(&ab), m, k), Operand::row_major(Values::F32(&bv), n, k).t()),
            ] {
                let (got, want) = (matmul(a, b), reference(&a, &b));
                assert_eq!(got.len(), m * n);
                for (g, w) in got.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * w.abs(), "{m}x{n}x{k}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        for x in [1.0f32, -3.5, 1.00390625, 1.01171875, f32::MAX, f32::MIN_POSITIVE, 0.0, -0.0, f32::INFINITY] {
            assert_eq!(round(x), half::bf16::from_f32(x).to_bits(), "{x}");
        }
        assert!(half::bf16::from_bits(round(f32::NAN)).is_nan());
    }
}
