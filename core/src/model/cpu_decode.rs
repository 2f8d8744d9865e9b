//! A decoding kernel for the Flex CPU backend on x86-64 with AVX-512 or AVX2, used only through
//! [`super::proj::project`] and [`super::proj::project_all`].
//!
//! Decoding multiplies a handful of rows (one per sequence) by every weight matrix, so it is
//! bound by how fast the weights stream from memory. A GEMM library packs the weight before using
//! it once; this kernel reads every weight element once for all rows, straight from where it
//! lies, in either layout of a `[k, n]` weight `w`:
//! - **row-major `[k, n]`** (every [`super::proj::Proj`]): the weight is split into up to four
//!   contiguous blocks of rows (parallel tasks), each streamed once, 8 rows at a time, while
//!   output tiles accumulate in registers (outer products, no reductions); the partial products
//!   are summed;
//! - **transposed view of a row-major `[n, k]`** (the tied LM head, a view of the `[vocab,
//!   hidden]` embedding): every output is a dot product over one contiguous weight row.
//!
//! Measured on the paper's 100M model's weights (8 rows, an AMD EPYC with AVX-512): about 2.5×
//! the weight throughput of gemm for row-major weights, 2× for transposed ones.
//!
//! The kernel applies to f32 tensors of the `Flex` backend itself (a model under `Autodiff<Flex>`
//! takes it after `.valid()`), at most [`MAX_ROWS`] contiguous input rows, and CPUs with AVX-512
//! or with AVX2 and FMA (`cpu_decode_avx2.rs`; chosen at run time, `KILN_SIMD` caps it as for the
//! fused kernels); otherwise [`matmul`] declines and the caller uses burn's ops. Without the
//! `flex` feature it always declines.
//!
//! **bf16 weights** (a bf16 checkpoint) on CPUs with AVX512-BF16 take a kernel of their own
//! (`cpu_decode_bf16.rs`: the weight streams as bf16, half the bytes, products of bf16 pairs
//! accumulated in f32 by `VDPBF16PS`; bf16 or f32 input rows, output in their dtype), in both
//! layouts, under the same conditions ([`bf16_available`]; `KILN_SIMD=avx512` caps it off).
//! Without the feature [`matmul`] declines bf16 weights, as before: burn multiplies them
//! (converting both operands to f32).

use burn::tensor::{Tensor, backend::Backend};

/// Largest number of rows routed to the kernel: beyond it gemm's packing pays for itself.
///
/// Measured on an Intel Xeon of the Sapphire Rapids class (2 cores, the 100M config, prompt 64,
/// `kiln bench --batch B --prompt-len 64`, release, decode tok/s): batch 32 — kernel 554 vs
/// gemm 337; batch 64 — kernel 640 vs gemm 446; batch 128 — kernel 679 vs gemm 896. So 64.
pub const MAX_ROWS: usize = 64;

/// Whether the kernel runs on backend `B` on this CPU (the only backend check of the model).
pub fn available<B: Backend>() -> bool {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    return flex::available::<B>();
    #[cfg(not(all(feature = "flex", target_arch = "x86_64")))]
    false
}

/// Whether bf16 weights are multiplied by the bf16 kernel (`cpu_decode_bf16.rs`: AVX512-BF16,
/// not capped by `KILN_SIMD`) on backend `B` on this CPU; otherwise [`matmul`] declines bf16
/// weights and the caller casts them (the path every CPU without the feature keeps).
pub fn bf16_available<B: Backend>() -> bool {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    return flex::available::<B>() && bf16::available();
    #[cfg(not(all(feature = "flex", target_arch = "x86_64")))]
    false
}

/// `x · w` for `x` `[m, k]` and `w` `[k, n]` in either layout of the module docs: `x` and `w`
/// f32, or `w` bf16 and `x` bf16 or f32 (rounded to bf16; products accumulated in f32, the
/// output in `x`'s dtype) where [`bf16_available`]; `None` when the kernel does not apply (see
/// the module docs).
pub fn matmul<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    if x.dims()[0] <= MAX_ROWS && flex::available::<B>() {
        return flex::matmul(x, w);
    }
    let _ = (x, w);
    None
}

/// [`matmul`] of one `x` by several weights in one parallel loop (a layer's q, k and v, or gate
/// and up): the same values as one call per weight, with one wake-up of the threads instead of
/// one per weight. `None` unless every weight is f32 and row-major `[k, nᵢ]` and the kernel
/// applies; the caller then multiplies them one by one.
pub fn matmul_many<B: Backend>(x: &Tensor<B, 2>, ws: &[&Tensor<B, 2>]) -> Option<Vec<Tensor<B, 2>>> {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    if x.dims()[0] <= MAX_ROWS && flex::available::<B>() {
        return flex::matmul_many(x, ws);
    }
    let _ = (x, ws);
    None
}

/// Runs `$body` with the const `$r` set to `rows` (1..=8): the AVX-512 tiles' row counts, for
/// the f32 kernels below and the bf16 ones (`cpu_decode_bf16.rs`); the AVX2 file has its own
/// (1..=4).
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
macro_rules! with_rows {
    ($rows:expr, $r:ident => $body:expr) => {
        match $rows {
            1 => { const $r: usize = 1; $body }
            2 => { const $r: usize = 2; $body }
            3 => { const $r: usize = 3; $body }
            4 => { const $r: usize = 4; $body }
            5 => { const $r: usize = 5; $body }
            6 => { const $r: usize = 6; $body }
            7 => { const $r: usize = 7; $body }
            _ => { const $r: usize = 8; $body }
        }
    };
}

#[cfg(all(feature = "flex", target_arch = "x86_64"))]
#[path = "cpu_decode_avx2.rs"]
mod avx2;

#[cfg(all(feature = "flex", target_arch = "x86_64"))]
#[path = "cpu_decode_bf16.rs"]
mod bf16;

#[cfg(all(feature = "flex", target_arch = "x86_64"))]
mod flex {
    use std::any::{Any, TypeId};

    use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, backend::Backend};
    use burn_flex::{Flex, FlexTensor};
    use rayon::prelude::*;

    /// Output columns per parallel task of [`by_columns`].
    const COLUMNS_PER_TASK: usize = 128;
    /// Most blocks of weight rows [`by_rows`] splits the inner dimension into (its parallel
    /// tasks), each of at least [`ROWS_PER_PART`] rows.
    const PARTS: usize = 4;
    const ROWS_PER_PART: usize = 64;

    use super::avx2;

    pub fn available<B: Backend>() -> bool {
        TypeId::of::<B>() == TypeId::of::<Flex>() && isa().is_some()
    }

    /// Which kernels run on this CPU (the fused kernels' level, `KILN_SIMD` included).
    #[derive(Clone, Copy)]
    enum Isa {
        Avx512,
        Avx2,
    }

    fn isa() -> Option<Isa> {
        use crate::model::fused::simd::{Level, level};
        match level() {
            Level::Avx512 => Some(Isa::Avx512),
            Level::Avx2 => Some(Isa::Avx2),
            Level::Plain => None,
        }
    }

    /// How the `[k, n]` weight lies in memory.
    #[derive(Clone, Copy)]
    enum Layout {
        /// Strides `[n, 1]`.
        RowMajor,
        /// Strides `[1, k]`: the transpose of a row-major `[n, k]`.
        Transposed,
    }

    pub fn matmul<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
        let [m, k] = x.dims();
        let n = w.dims()[1];
        let (x, w) = (unwrap(x)?, unwrap(w)?);
        let layout = w.layout();
        if layout.start_offset() != 0 || !matches!(w.dtype(), DType::F32 | DType::BF16) {
            return None;
        }
        let kind = match layout.strides() {
            [s, 1] if *s == n as isize => Layout::RowMajor,
            [1, s] if *s == k as isize => Layout::Transposed,
            _ => return None,
        };
        if w.dtype() == DType::BF16 {
            if !super::bf16::available() {
                return None;
            }
            let ws = &w.storage::<half::bf16>()[..n * k];
            let transposed = matches!(kind, Layout::Transposed);
            return match x.dtype() {
                DType::F32 => Some(wrap(super::bf16::matmul(super::bf16::Input::F32(x.as_slice()?), m, k, ws, n, transposed), [m, n])),
                DType::BF16 => {
                    let y = super::bf16::matmul(super::bf16::Input::Bf16(x.as_slice()?), m, k, ws, n, transposed);
                    Some(wrap(y.into_iter().map(half::bf16::from_f32).collect::<Vec<_>>(), [m, n]))
                }
                _ => None,
            };
        }
        let xs = x.as_slice::<f32>()?;
        let ws = &w.storage::<f32>()[..n * k];
        let y = match kind {
            Layout::Transposed => by_columns(xs, m, k, ws, n),
            Layout::RowMajor => by_rows(xs, m, k, ws, n),
        };
        Some(wrap(y, [m, n]))
    }

    /// Transposed weights: tasks own disjoint output columns and stream their weight rows.
    fn by_columns(xs: &[f32], m: usize, k: usize, wt: &[f32], n: usize) -> Vec<f32> {
        let isa = isa().expect("checked by available");
        let mut y = vec![0.0f32; m * n];
        let out = SharedOut(y.as_mut_ptr());
        (0..n.div_ceil(COLUMNS_PER_TASK)).into_par_iter().for_each(|task| {
            // Captures the whole (Send) wrapper, not its raw pointer field.
            #[allow(clippy::redundant_locals)]
            let out = out;
            let cols = task * COLUMNS_PER_TASK..((task + 1) * COLUMNS_PER_TASK).min(n);
            for row in (0..m).step_by(8) {
                let rows = (m - row).min(8);
                // SAFETY: the instruction set was detected; `xs` holds `m × k` and `wt` `n × k`
                // values; tasks write disjoint columns of `y`, which outlives the loop.
                unsafe {
                    match isa {
                        Isa::Avx512 => kernels::dot_rows(&xs[row * k..], rows, k, wt, cols.clone(), out.0.add(row * n), n),
                        Isa::Avx2 => avx2::dot_rows(&xs[row * k..], rows, k, wt, cols.clone(), out.0.add(row * n), n),
                    }
                };
            }
        });
        y
    }

    pub fn matmul_many<B: Backend>(x: &Tensor<B, 2>, ws: &[&Tensor<B, 2>]) -> Option<Vec<Tensor<B, 2>>> {
        let [m, k] = x.dims();
        let x = unwrap(x)?;
        let mut weights = Vec::with_capacity(ws.len());
        for w in ws {
            let [wk, n] = w.dims();
            let w = unwrap(*w)?;
            let layout = w.layout();
            if wk != k || layout.start_offset() != 0 || w.dtype() != DType::F32 || layout.strides() != [n as isize, 1] {
                return None;
            }
            weights.push((w, n));
        }
        let xs = x.as_slice::<f32>()?;
        let slices: Vec<(&[f32], usize)> = weights.iter().map(|(w, n)| (&w.storage::<f32>()[..n * k], *n)).collect();
        Some(by_rows_many(xs, m, k, &slices).into_iter().zip(&slices).map(|(y, (_, n))| wrap(y, [m, *n])).collect())
    }

    /// [`by_rows`] for several weights `[k, nᵢ]`, all their parts one parallel loop; each
    /// result's parts summed in order (the same values as one weight at a time).
    fn by_rows_many(xs: &[f32], m: usize, k: usize, ws: &[(&[f32], usize)]) -> Vec<Vec<f32>> {
        let isa = isa().expect("checked by available");
        let parts = (k / ROWS_PER_PART).clamp(1, PARTS);
        let per_part = k.div_ceil(parts);
        let mut partials: Vec<Vec<f32>> = ws.iter().map(|(_, n)| vec![0.0f32; parts * m * n]).collect();
        let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(ws.len() * parts);
        for (i, buffer) in partials.iter_mut().enumerate() {
            let n = ws[i].1;
            tasks.extend(buffer.chunks_mut(m * n).enumerate().map(|(part, y)| (i, part, y)));
        }
        tasks.into_par_iter().for_each(|(i, part, y)| {
            let (w, n) = ws[i];
            let inner = part * per_part..((part + 1) * per_part).min(k);
            // SAFETY: the instruction set was detected; `xs` holds `m × k` and `w` `k × n`
            // values, `y` `m × n`.
            unsafe {
                match isa {
                    Isa::Avx512 => kernels::outer_rows(xs, m, k, w, n, inner, y),
                    Isa::Avx2 => avx2::outer_rows(xs, m, k, w, n, inner, y),
                }
            };
        });
        partials.into_iter().zip(ws).map(|(mut p, (_, n))| {
            let (y, rest) = p.split_at_mut(m * n);
            for part in rest.chunks_exact(m * n) {
                y.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
            p.truncate(m * n);
            p
        }).collect()
    }

    /// Row-major weights: the inner dimension is split into up to [`PARTS`] contiguous blocks
    /// of weight rows; each task streams its block once into its own partial product, and the
    /// parts are summed. The split depends on the shape only, so results do not depend on the
    /// number of threads.
    fn by_rows(xs: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
        by_rows_many(xs, m, k, &[(w, n)]).pop().expect("one product per weight")
    }

    /// The Flex tensor behind `t` (a cheap clone of its shared storage).
    fn unwrap<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<FlexTensor> {
        let primitive: Box<dyn Any> = Box::new(t.clone().into_primitive().tensor());
        primitive.downcast::<FlexTensor>().ok().map(|b| *b)
    }

    fn wrap<B: Backend, E: burn::tensor::Element, const D: usize>(values: Vec<E>, shape: [usize; D]) -> Tensor<B, D> {
        let primitive: Box<dyn Any> = Box::new(FlexTensor::from_data(TensorData::new(values, shape)));
        let primitive = primitive.downcast::<B::FloatTensorPrimitive>().expect("B is Flex");
        Tensor::from_primitive(TensorPrimitive::Float(*primitive))
    }

    /// The output pointer, shared by tasks that write disjoint columns.
    #[derive(Clone, Copy)]
    struct SharedOut(*mut f32);
    unsafe impl Send for SharedOut {}
    unsafe impl Sync for SharedOut {}

    // Register tiles index accumulators by row and column, as the arithmetic reads.
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    mod kernels {
        use std::arch::x86_64::*;

        /// Transposed layout: `y[r·ys + j] = x[r] · wt[j]` for `r < rows ≤ 8` and `j` in `cols`,
        /// `wt` row-major `[n, k]`.
        ///
        /// # Safety
        /// AVX-512F must be available; `x` holds `rows × k`, `wt` holds `cols.end × k` values and
        /// `y` has room for `rows` rows of stride `ys`.
        pub unsafe fn dot_rows(x: &[f32], rows: usize, k: usize, wt: &[f32], cols: std::ops::Range<usize>, y: *mut f32, ys: usize) {
            assert!(x.len() >= rows * k && wt.len() >= cols.end * k);
            with_rows!(rows, R => {
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

        /// An `R × C` tile of dot products, `R·C` accumulators in registers.
        #[target_feature(enable = "avx512f")]
        unsafe fn dot_tile<const R: usize, const C: usize>(x: *const f32, k: usize, wt: *const f32, j0: usize, y: *mut f32, ys: usize) {
            unsafe {
                let mut acc = [[_mm512_setzero_ps(); C]; R];
                let full = k / 16 * 16;
                let mut i = 0;
                while i < full {
                    let mut w = [_mm512_setzero_ps(); C];
                    for c in 0..C {
                        w[c] = _mm512_loadu_ps(wt.add((j0 + c) * k + i));
                        // The next tile's weights, one tile ahead of use.
                        _mm_prefetch::<_MM_HINT_T0>(wt.wrapping_add((j0 + C + c) * k + i) as *const i8);
                    }
                    for r in 0..R {
                        let xv = _mm512_loadu_ps(x.add(r * k + i));
                        for c in 0..C {
                            acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
                        }
                    }
                    i += 16;
                }
                if full < k {
                    let mask = ((1u32 << (k - full)) - 1) as __mmask16;
                    let mut w = [_mm512_setzero_ps(); C];
                    for c in 0..C {
                        w[c] = _mm512_maskz_loadu_ps(mask, wt.add((j0 + c) * k + full));
                    }
                    for r in 0..R {
                        let xv = _mm512_maskz_loadu_ps(mask, x.add(r * k + full));
                        for c in 0..C {
                            acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
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

        /// Row-major layout: `y[r·n + j] = Σ_{i ∈ inner} x[r·k + i] · w[i·n + j]` for `r < m` and
        /// `j < n`, `w` row-major `[k, n]`, `y` zero on entry. The weight is read once, in blocks
        /// of [`BLOCK`] consecutive rows, by every row group of 8 while it is in cache.
        ///
        /// # Safety
        /// AVX-512F must be available; `x` holds `m × k` and `w` `k × n` values; `inner` lies
        /// within `0..k`.
        pub unsafe fn outer_rows(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, inner: std::ops::Range<usize>, y: &mut [f32]) {
            assert!(x.len() >= m * k && w.len() >= k * n && inner.end <= k && y.len() >= m * n);
            let mut i0 = inner.start;
            while i0 < inner.end {
                let block = i0..(i0 + BLOCK).min(inner.end);
                for row in (0..m).step_by(8) {
                    let (x, y) = (&x[row * k..], y[row * n..].as_mut_ptr());
                    with_rows!((m - row).min(8), R => {
                        let mut j = 0;
                        while j + 48 <= n {
                            unsafe { outer_tile::<R, 3>(x.as_ptr(), k, w.as_ptr(), n, block.clone(), j, 0xFFFF, y) };
                            j += 48;
                        }
                        while j < n {
                            let width = (n - j).min(16);
                            let mask = if width == 16 { 0xFFFF } else { ((1u32 << width) - 1) as __mmask16 };
                            unsafe { outer_tile::<R, 1>(x.as_ptr(), k, w.as_ptr(), n, block.clone(), j, mask, y) };
                            j += width;
                        }
                    })
                }
                i0 = block.end;
            }
        }

        /// Weight rows per block of [`outer_rows`] (8 and 16 rows ahead prefetched: measured
        /// best among 4–64 and 8–64).
        const BLOCK: usize = 8;

        /// An `R × 16C` output tile, `R·C` accumulators in registers; the last 16 columns are
        /// masked by `last`.
        #[target_feature(enable = "avx512f")]
        unsafe fn outer_tile<const R: usize, const C: usize>(
            x: *const f32,
            k: usize,
            w: *const f32,
            n: usize,
            is: std::ops::Range<usize>,
            j0: usize,
            last: __mmask16,
            y: *mut f32,
        ) {
            /// Weight rows fetched ahead of use.
            const AHEAD: usize = 2 * BLOCK;
            unsafe {
                let mut acc = [[_mm512_setzero_ps(); C]; R];
                for r in 0..R {
                    for c in 0..C {
                        let mask = if c + 1 == C { last } else { 0xFFFF };
                        acc[r][c] = _mm512_maskz_loadu_ps(mask, y.add(r * n + j0 + 16 * c));
                    }
                }
                for i in is {
                    let row = w.add(i * n + j0);
                    let mut wv = [_mm512_setzero_ps(); C];
                    for c in 0..C {
                        let mask = if c + 1 == C { last } else { 0xFFFF };
                        wv[c] = _mm512_maskz_loadu_ps(mask, row.add(16 * c));
                        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(AHEAD * n + 16 * c) as *const i8);
                    }
                    for r in 0..R {
                        let xv = _mm512_set1_ps(*x.add(r * k + i));
                        for c in 0..C {
                            acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
                        }
                    }
                }
                for r in 0..R {
                    for c in 0..C {
                        let mask = if c + 1 == C { last } else { 0xFFFF };
                        _mm512_mask_storeu_ps(y.add(r * n + j0 + 16 * c), mask, acc[r][c]);
                    }
                }
            }
        }
    }
}
