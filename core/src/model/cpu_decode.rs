//! A decoding fast path for the Flex CPU backend on x86-64 with AVX-512.
//!
//! Decoding multiplies a handful of rows (one per sequence) by every weight matrix, so it is
//! bound by how fast the weights stream from memory. A GEMM library packs the weight before using
//! it once; here the weight is kept in Hugging Face's `[out, in]` layout (as a transposed view, so
//! burn's generic ops still see `[in, out]`) and every output is a dot product over one contiguous
//! weight row, read once for all rows. Measured on the paper's 100M model: about 2.3× the weight
//! throughput of gemm for 8 rows.
//!
//! The path applies only to the `Flex` backend (not under autodiff), contiguous f32 inputs of at
//! most [`MAX_ROWS`] rows, weights in that layout, and CPUs with AVX-512; otherwise the callers
//! fall back to burn's ops. Without the `flex` feature both entry points always decline.

use burn::tensor::{Tensor, backend::Backend};

/// Largest number of rows routed to the fast path.
pub const MAX_ROWS: usize = 16;

/// A linear weight from HF `[out, in]` data, laid out for [`matmul`] when the fast path can run
/// on `B`; `None` means "use the usual contiguous `[in, out]` layout".
pub fn linear_weight<B: Backend>(hf: &[f32], out_dim: usize, in_dim: usize, device: &B::Device) -> Option<Tensor<B, 2>> {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    if flex::available::<B>() {
        let data = burn::tensor::TensorData::new(hf.to_vec(), [out_dim, in_dim]);
        return Some(Tensor::<B, 2>::from_data(data, device).transpose());
    }
    let _ = (hf, out_dim, in_dim, device);
    None
}

/// `x · w` for `x` `[m, k]` and `w` `[k, n]` stored as a transposed view of a contiguous
/// `[n, k]` buffer; `None` when the fast path does not apply.
pub fn matmul<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    if x.dims()[0] <= MAX_ROWS && flex::available::<B>() {
        return flex::matmul(x, w);
    }
    let _ = (x, w);
    None
}

#[cfg(all(feature = "flex", target_arch = "x86_64"))]
mod flex {
    use std::any::{Any, TypeId};

    use burn::tensor::{Tensor, TensorData, TensorPrimitive, backend::Backend};
    use burn_flex::{Flex, FlexTensor};
    use rayon::prelude::*;

    /// Output columns per parallel task (each task streams its own contiguous weight rows).
    const COLUMNS_PER_TASK: usize = 128;

    pub fn available<B: Backend>() -> bool {
        TypeId::of::<B>() == TypeId::of::<Flex>() && std::arch::is_x86_feature_detected!("avx512f")
    }

    pub fn matmul<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
        let [m, k] = x.dims();
        let n = w.dims()[1];
        let (x, w) = (unwrap(x)?, unwrap(w)?);
        let xs = x.as_slice::<f32>()?;
        // `w` must be the transpose of a contiguous [n, k] buffer: strides [1, k], no offset.
        let layout = w.layout();
        if layout.strides() != [1, k as isize] || layout.start_offset() != 0 || w.dtype() != burn::tensor::DType::F32 {
            return None;
        }
        let wt = &w.storage::<f32>()[..n * k];
        let mut y = vec![0.0f32; m * n];
        let out = SharedOut(y.as_mut_ptr());
        (0..n.div_ceil(COLUMNS_PER_TASK)).into_par_iter().for_each(|task| {
            let out = out;
            let cols = task * COLUMNS_PER_TASK..((task + 1) * COLUMNS_PER_TASK).min(n);
            for row in (0..m).step_by(8) {
                let rows = (m - row).min(8);
                // SAFETY: AVX-512 was detected; slices cover `rows × k` and `n × k`; tasks write
                // disjoint columns of `y`, which outlives the loop.
                unsafe { kernels::rows(&xs[row * k..], rows, k, wt, cols.clone(), out.0.add(row * n), n) };
            }
        });
        Some(wrap(y, [m, n]))
    }

    /// The Flex tensor behind `t` (a cheap clone of its shared storage).
    fn unwrap<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<FlexTensor> {
        let primitive: Box<dyn Any> = Box::new(t.clone().into_primitive().tensor());
        primitive.downcast::<FlexTensor>().ok().map(|b| *b)
    }

    fn wrap<B: Backend, const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
        let primitive: Box<dyn Any> = Box::new(FlexTensor::from_data(TensorData::new(values, shape)));
        let primitive = primitive.downcast::<B::FloatTensorPrimitive>().expect("B is Flex");
        Tensor::from_primitive(TensorPrimitive::Float(*primitive))
    }

    /// The output pointer, shared by tasks that write disjoint columns.
    #[derive(Clone, Copy)]
    struct SharedOut(*mut f32);
    unsafe impl Send for SharedOut {}
    unsafe impl Sync for SharedOut {}

    mod kernels {
        use std::arch::x86_64::*;

        /// `y[r·ys + j] = x[r] · wt[j]` for `r < rows ≤ 8` and `j` in `cols`.
        ///
        /// # Safety
        /// AVX-512F must be available; `x` holds `rows × k`, `wt` holds `cols.end × k` values.
        pub unsafe fn rows(x: &[f32], rows: usize, k: usize, wt: &[f32], cols: std::ops::Range<usize>, y: *mut f32, ys: usize) {
            assert!(x.len() >= rows * k && wt.len() >= cols.end * k);
            macro_rules! run {
                ($r:literal) => {{
                    let mut j = cols.start;
                    while j + 3 <= cols.end {
                        unsafe { tile::<$r, 3>(x.as_ptr(), k, wt.as_ptr(), j, y, ys) };
                        j += 3;
                    }
                    while j < cols.end {
                        unsafe { tile::<$r, 1>(x.as_ptr(), k, wt.as_ptr(), j, y, ys) };
                        j += 1;
                    }
                }};
            }
            match rows {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                6 => run!(6),
                7 => run!(7),
                _ => run!(8),
            }
        }

        /// An `R × C` tile of dot products, `R·C` accumulators in registers.
        #[target_feature(enable = "avx512f")]
        unsafe fn tile<const R: usize, const C: usize>(x: *const f32, k: usize, wt: *const f32, j0: usize, y: *mut f32, ys: usize) {
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
    }
}
