//! The fused kernels on burn tensors: `Flex` directly, `Autodiff<Flex>` as custom operations whose
//! backward pass is the kernel's own (burn-autodiff's `Backward`), recorded only when a parent
//! tracks gradients.

use std::any::TypeId;
use std::sync::Arc;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, backend::Backend};
use burn_flex::{Flex, FlexTensor};

use super::KeyMask;
use super::matmul::View;
use crate::model::custom_op::cast;
use super::attention::{self as attn, Dims};
use super::elementwise as ew;

type AdTensor = FloatTensor<Autodiff<Flex>>;

pub fn is_flex<B: Backend>() -> bool {
    TypeId::of::<B>() == TypeId::of::<Flex>()
}

pub fn is_autodiff_flex<B: Backend>() -> bool {
    checkpointing::<B>().is_some()
}

/// Which autodiff checkpointing strategy `B = Autodiff<Flex, C>` uses.
#[derive(Clone, Copy)]
enum Strategy {
    None,
    Balanced,
}

fn checkpointing<B: Backend>() -> Option<Strategy> {
    if TypeId::of::<B>() == TypeId::of::<Autodiff<Flex, NoCheckpointing>>() {
        Some(Strategy::None)
    } else if TypeId::of::<B>() == TypeId::of::<Autodiff<Flex, BalancedCheckpointing>>() {
        Some(Strategy::Balanced)
    } else {
        None
    }
}

/// The primitive of `t` as type `P` (the backend's own primitive type when `B` is as checked).
fn primitive<B: Backend, P: 'static, const D: usize>(t: Tensor<B, D>) -> Option<P> {
    cast(t.into_primitive().tensor())
}

fn tensor<B: Backend, P: 'static, const D: usize>(p: P) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(cast(p).expect("primitive of backend B")))
}

/// `t` as a contiguous f32 tensor (a cheap clone when it already is one).
fn contiguous(t: &FlexTensor) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    Some(if t.as_slice::<f32>().is_some() { t.clone() } else { t.to_contiguous() })
}

fn f32s(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("contiguous f32")
}

fn from_vec(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// The Flex value behind a tensor of `Flex` or `Autodiff<Flex>`, for inputs that need no
/// gradient (tables): contiguous f32, or `None`.
fn constant<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<FlexTensor> {
    let t = t.clone();
    let flex = match is_flex::<B>() {
        true => primitive::<B, FlexTensor, D>(t)?,
        false => primitive::<B, AdTensor, D>(t)?.primitive,
    };
    contiguous(&flex)
}

/// Computes the gradients of the inputs from the output's gradient.
type GradFn = Arc<dyn Fn(&FlexTensor) -> Vec<Option<FlexTensor>> + Send + Sync>;

/// A fused op's forward result: its output and how to take its gradients.
struct Forward {
    output: FlexTensor,
    grad: GradFn,
}

/// Runs `forward` on the contiguous f32 values of `inputs` (all of one rank `D`) on backend
/// `B`, recording `Forward::grad` as the backward pass under autodiff; `None` if `B` is neither
/// Flex nor Flex under autodiff, or an input is not f32.
fn run<B: Backend, const N: usize, const D: usize, const E: usize>(
    inputs: [Tensor<B, D>; N],
    forward: impl FnOnce(&[FlexTensor; N]) -> Forward,
) -> Option<Tensor<B, E>> {
    if inputs.iter().any(|t| t.dtype() != DType::F32) {
        return None;
    }
    if is_flex::<B>() {
        let values = inputs.map(|t| primitive::<B, FlexTensor, D>(t).and_then(|t| contiguous(&t)));
        let values: [FlexTensor; N] = values.into_iter().collect::<Option<Vec<_>>>()?.try_into().ok()?;
        return Some(tensor::<B, _, E>(forward(&values).output));
    }
    let strategy = checkpointing::<B>()?;
    let inputs: Vec<AdTensor> = inputs.into_iter().map(primitive::<B, AdTensor, D>).collect::<Option<_>>()?;
    let inputs: [AdTensor; N] = inputs.try_into().ok()?;
    let values = inputs.iter().map(|t| contiguous(&t.primitive)).collect::<Option<Vec<_>>>()?;
    let values: [FlexTensor; N] = values.try_into().ok()?;
    let result = forward(&values);
    let out = match strategy {
        Strategy::None => record::<NoCheckpointing, N>(&inputs, result),
        Strategy::Balanced => record::<BalancedCheckpointing, N>(&inputs, result),
    };
    Some(tensor::<B, _, E>(out))
}

/// The gradient function of a recorded op.
#[derive(Clone)]
struct Saved(GradFn);

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fused op")
    }
}

#[derive(Debug)]
struct FusedBackward;

impl<const N: usize> Backward<Flex, N> for FusedBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let grad = contiguous(&grad).expect("f32 gradient");
        for (parent, g) in ops.parents.into_iter().zip((ops.state.0)(&grad)) {
            if let (Some(parent), Some(g)) = (parent, g) {
                grads.register::<Flex>(parent.id, g);
            }
        }
    }
}

fn record<C: CheckpointStrategy, const N: usize>(inputs: &[AdTensor; N], result: Forward) -> AdTensor {
    let nodes = inputs.clone().map(|t| t.node);
    match FusedBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(Saved(result.grad), result.output),
        OpsKind::UnTracked(prep) => prep.finish(result.output),
    }
}

pub fn attention<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: &KeyMask) -> Option<Tensor<B, 4>> {
    let [batch, queries, heads, head_dim] = q.dims();
    let [_, keys, kv_heads, _] = k.dims();
    let dims = Dims { batch, queries, keys, heads, kv_heads, head_dim };
    if mask.batch != batch || mask.keys != keys {
        return None;
    }
    let scale = 1.0 / (head_dim as f32).sqrt();
    if is_flex::<B>() && q.dtype() == DType::F32 && k.dtype() == DType::F32 && v.dtype() == DType::F32 {
        // Inference: keys and values are read where they lie (a KV cache's buffer), not copied.
        let (q, k, v) = (primitive::<B, FlexTensor, 4>(q)?, primitive::<B, FlexTensor, 4>(k)?, primitive::<B, FlexTensor, 4>(v)?);
        let q = contiguous(&q)?;
        let (out, _) = match (kv_rows(&k, dims), kv_rows(&v, dims)) {
            (Some((ks, stride)), Some((vs, v_stride))) if stride == v_stride => attn::forward_strided(dims, f32s(&q), ks, vs, stride, &mask.valid, scale),
            _ => attn::forward(dims, f32s(&q), f32s(&contiguous(&k)?), f32s(&contiguous(&v)?), &mask.valid, scale),
        };
        return Some(tensor::<B, _, 4>(from_vec(out, &[batch, queries, heads, head_dim])));
    }
    let mask = mask.clone();
    run::<B, 3, 4, 4>([q, k, v], move |[q, k, v]| {
        let (out, lse) = attn::forward(dims, f32s(q), f32s(k), f32s(v), &mask.valid, scale);
        let output = from_vec(out, &[batch, queries, heads, head_dim]);
        let (q, k, v, out) = (q.clone(), k.clone(), v.clone(), output.clone());
        let grad: GradFn = Arc::new(move |dout| {
            let (dq, dk, dv) = attn::backward(dims, f32s(&q), f32s(&k), f32s(&v), &mask.valid, scale, f32s(&out), &lse, f32s(dout));
            vec![
                Some(from_vec(dq, &[batch, queries, heads, head_dim])),
                Some(from_vec(dk, &[batch, keys, kv_heads, head_dim])),
                Some(from_vec(dv, &[batch, keys, kv_heads, head_dim])),
            ]
        });
        Forward { output, grad }
    })
}

#[allow(clippy::result_large_err)]
pub fn write_in_place<B: Backend>(buffer: Tensor<B, 4>, dim: usize, start: usize, value: Tensor<B, 4>) -> Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>)> {
    let (shape, new) = (buffer.dims(), value.dims());
    let fits = (0..4).all(|i| if i == dim { start + new[i] <= shape[i] } else { new[i] == shape[i] });
    if !is_flex::<B>() || buffer.dtype() != DType::F32 || value.dtype() != DType::F32 || !fits {
        return Err((buffer, value));
    }
    let (Some(mut dst), Some(src)) = (primitive::<B, FlexTensor, 4>(buffer.clone()), primitive::<B, FlexTensor, 4>(value.clone()).and_then(|v| contiguous(&v))) else {
        return Err((buffer, value));
    };
    let dense = dst.is_contiguous() && dst.layout().start_offset() == 0 && dst.storage::<f32>().len() == shape.iter().product::<usize>();
    drop(buffer); // `dst` is now the buffer's only holder, unless someone else holds it too
    let Some(values) = dense.then(|| dst.try_storage_mut::<f32>()).flatten() else {
        let buffer = tensor::<B, _, 4>(dst);
        return Err((buffer, value));
    };
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let (src, chunk) = (f32s(&src), new[dim] * inner);
    for o in 0..outer {
        let at = (o * shape[dim] + start) * inner;
        values[at..at + chunk].copy_from_slice(&src[o * chunk..(o + 1) * chunk]);
    }
    Ok(tensor::<B, _, 4>(dst))
}

/// A new `[rows.len(), capacity, K, d]` f32 buffer: output row `i` holds positions `from..S` of
/// batch row `row` of `sources[source]` at positions `at..` ([`super::RowSpec`]), zeros elsewhere.
/// `None` for another backend, dtype or layout (each source must be a `[b, S, K, d]` view whose
/// batch rows lie densely, as a KV cache's filled part does) or a row that does not fit.
pub fn gather_rows<B: Backend>(sources: &[Tensor<B, 4>], rows: &[super::RowSpec], capacity: usize) -> Option<Tensor<B, 4>> {
    let [_, _, kv_heads, head_dim] = sources.first()?.dims();
    if !is_flex::<B>() || sources.iter().any(|s| s.dtype() != DType::F32 || s.dims()[2..] != [kv_heads, head_dim]) {
        return None;
    }
    let flex: Vec<(FlexTensor, usize, usize)> = sources
        .iter()
        .map(|s| primitive::<B, FlexTensor, 4>(s.clone()).map(|t| (t, s.dims()[0], s.dims()[1])))
        .collect::<Option<_>>()?;
    let parts: Vec<(&[f32], usize, usize, usize)> = flex
        .iter()
        .map(|(t, batch, keys)| {
            let dims = Dims { batch: *batch, queries: *keys, keys: *keys, heads: kv_heads, kv_heads, head_dim };
            kv_rows(t, dims).map(|(values, stride)| (values, stride, *batch, *keys))
        })
        .collect::<Option<_>>()?;
    let width = kv_heads * head_dim;
    let fits = |r: &super::RowSpec| {
        parts.get(r.source).is_some_and(|&(values, stride, batch, keys)| {
            r.row < batch && r.from <= keys && r.at + keys - r.from <= capacity && r.row * stride + keys * width <= values.len()
        })
    };
    if !rows.iter().all(fits) {
        return None;
    }
    let mut out = vec![0.0f32; rows.len() * capacity * width];
    for (i, r) in rows.iter().enumerate() {
        let (values, stride, _, keys) = parts[r.source];
        let n = (keys - r.from) * width;
        let at = (i * capacity + r.at) * width;
        out[at..at + n].copy_from_slice(&values[r.row * stride + r.from * width..][..n]);
    }
    Some(tensor::<B, _, 4>(from_vec(out, &[rows.len(), capacity, kv_heads, head_dim])))
}

/// The values of a `[B, S, K, d]` f32 view whose positions, heads and features lie densely in
/// each batch row (a prefix of a KV cache's `[B, capacity, K, d]` buffer), from its first element,
/// and the distance between its batch rows; `None` for any other layout.
fn kv_rows(t: &FlexTensor, dims: Dims) -> Option<(&[f32], usize)> {
    let layout = t.layout();
    let strides = layout.strides();
    let row = (dims.kv_heads * dims.head_dim) as isize;
    if strides.len() != 4 || strides[3] != 1 || strides[2] != dims.head_dim as isize || strides[1] != row {
        return None;
    }
    let dense = dims.keys * row as usize;
    let stride = if dims.batch <= 1 { dense } else { usize::try_from(strides[0]).ok().filter(|&s| s >= dense)? };
    let values = t.storage::<f32>().get(layout.start_offset()..)?;
    Some((values, stride))
}

#[cfg(target_arch = "x86_64")]
pub fn bf16_products<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    use super::gemm_bf16::{self as g, Values};
    if !g::available() {
        return None;
    }
    fn mul(a: View<'_>, b: View<'_>) -> Vec<f32> {
        g::matmul(a.with(Values::F32), b.with(Values::F32))
    }
    // Layouts other than `weight_layout`'s are read as contiguous copies.
    let transposed = weight_layout(&x, &w).unwrap_or(false);
    products(x, w, transposed, mul)
}

pub fn f32_products<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    if is_flex::<B>() {
        return f32_matmul(x, w);
    }
    // Other layouts are left to burn's matmul rather than copied.
    let transposed = weight_layout(&x, &w)?;
    products(x, w, transposed, super::matmul::matmul)
}

/// Under autodiff, whether the product's operands can be read in place: `x` dense, and `w`
/// dense (`Some(false)`) or the transpose of a dense tensor (`Some(true)`: the tied head's
/// `embedding.weight`ᵀ).
fn weight_layout<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 2>) -> Option<bool> {
    let dense = |t: Tensor<B, 2>| primitive::<B, AdTensor, 2>(t).is_some_and(|t| t.primitive.as_slice::<f32>().is_some());
    if !dense(x.clone()) {
        return None;
    }
    if dense(w.clone()) {
        Some(false)
    } else {
        dense(w.clone().transpose()).then_some(true)
    }
}

/// `x · w` `[m, k] × [k, n]` as a fused op, every product (the output, `dx = dy · wᵀ` and
/// `dw = xᵀ · dy`) by `mul` on views of the contiguous f32 values. With `transposed`, `w` is
/// passed as its dense transpose `[n, k]` and read through a transposed view, and its gradient is
/// `dwᵀ = dyᵀ · x`.
fn products<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>, transposed: bool, mul: fn(View<'_>, View<'_>) -> Vec<f32>) -> Option<Tensor<B, 2>> {
    let ([m, k], [k2, n]) = (x.dims(), w.dims());
    if k != k2 {
        return None;
    }
    let w = if transposed { w.transpose() } else { w };
    // `w` as a `[k, n]` view: its values, or its transpose's read transposed.
    fn w_view(w: &FlexTensor, k: usize, n: usize, transposed: bool) -> View<'_> {
        match transposed {
            true => View::row_major(f32s(w), n, k).t(),
            false => View::row_major(f32s(w), k, n),
        }
    }
    run::<B, 2, 2, 2>([x, w], move |[x, w]| {
        let output = from_vec(mul(View::row_major(f32s(x), m, k), w_view(w, k, n, transposed)), &[m, n]);
        let (x, w) = (x.clone(), w.clone());
        let grad: GradFn = Arc::new(move |dy| {
            let dy = View::row_major(f32s(dy), m, n);
            let (x, w) = (View::row_major(f32s(&x), m, k), w_view(&w, k, n, transposed));
            let dw = match transposed {
                true => from_vec(mul(dy.t(), x), &[n, k]),
                false => from_vec(mul(x.t(), dy), &[k, n]),
            };
            vec![Some(from_vec(mul(dy, w.t()), &[m, k])), Some(dw)]
        });
        Forward { output, grad }
    })
}

/// A Flex tensor's 2-D layout: `(first element, rows, cols, row stride, col stride)`, or `None`
/// for negative strides or another rank.
fn strided(t: &FlexTensor) -> Option<(usize, usize, usize, usize, usize)> {
    let layout = t.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    if shape.len() != 2 || strides.iter().any(|s| *s < 0) {
        return None;
    }
    Some((layout.start_offset(), shape[0], shape[1], strides[0] as usize, strides[1] as usize))
}

pub fn f32_matmul<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    use super::matmul::matmul;
    if !is_flex::<B>() || x.dtype() != DType::F32 || w.dtype() != DType::F32 || x.dims()[1] != w.dims()[0] {
        return None;
    }
    let (x, w) = (primitive::<B, FlexTensor, 2>(x)?, primitive::<B, FlexTensor, 2>(w)?);
    fn view(t: &FlexTensor) -> Option<View<'_>> {
        let (start, rows, cols, row_stride, col_stride) = strided(t)?;
        Some(View { values: &t.storage::<f32>()[start..], rows, cols, row_stride, col_stride })
    }
    let (a, b) = (view(&x)?, view(&w)?);
    Some(tensor::<B, _, 2>(from_vec(matmul(a, b), &[a.rows, b.cols])))
}

#[cfg(target_arch = "x86_64")]
pub fn bf16_matmul<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    use super::gemm_bf16::{self as g, Operand, Values};
    use rayon::prelude::*;
    if !is_flex::<B>() || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 || x.dims()[1] != w.dims()[0] || !g::available() {
        return None;
    }
    let (x, w) = (primitive::<B, FlexTensor, 2>(x)?, primitive::<B, FlexTensor, 2>(w)?);
    fn view(t: &FlexTensor) -> Option<Operand<'_>> {
        let (start, rows, cols, row_stride, col_stride) = strided(t)?;
        Some(Operand { values: Values::Bf16(&t.storage::<half::bf16>()[start..]), rows, cols, row_stride, col_stride })
    }
    let (a, b) = (view(&x)?, view(&w)?);
    let out: Vec<half::bf16> = g::matmul(a, b).par_iter().map(|&v| half::bf16::from_f32(v)).collect();
    Some(tensor::<B, _, 2>(FlexTensor::from_data(TensorData::new(out, [a.rows, b.cols]))))
}

pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Option<Tensor<B, D>> {
    let shape = gate.dims();
    if up.dims() != shape {
        return None;
    }
    run::<B, 2, D, D>([gate, up], move |[gate, up]| {
        let output = from_vec(ew::swiglu(f32s(gate), f32s(up)), &shape);
        let (gate, up) = (gate.clone(), up.clone());
        let grad: GradFn = Arc::new(move |dout| {
            let (dg, du) = ew::swiglu_backward(f32s(&gate), f32s(&up), f32s(dout));
            vec![Some(from_vec(dg, &shape)), Some(from_vec(du, &shape))]
        });
        Forward { output, grad }
    })
}

pub fn rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Option<Tensor<B, 4>> {
    let shape = x.dims();
    let [batch, seq, heads, d] = shape;
    if cos.dims() != [batch, 1, seq, d] || sin.dims() != [batch, 1, seq, d] {
        return None;
    }
    let (cos, sin) = (constant(cos)?, constant(sin)?);
    run::<B, 1, 4, 4>([x], move |[x]| {
        let output = from_vec(ew::rope(f32s(x), f32s(&cos), f32s(&sin), heads, d, false), &shape);
        let grad: GradFn = Arc::new(move |dout| vec![Some(from_vec(ew::rope(f32s(dout), f32s(&cos), f32s(&sin), heads, d, true), &shape))]);
        Forward { output, grad }
    })
}

pub fn rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, eps: f64) -> Option<Tensor<B, D>> {
    let shape = x.dims();
    let width = weight.dims()[0];
    if shape[D - 1] != width {
        return None;
    }
    // Both inputs as rank-D tensors so one `run` takes them; the weight goes back to `[width]`.
    let mut wshape = [1; D];
    wshape[D - 1] = width;
    let weight = weight.reshape(wshape);
    run::<B, 2, D, D>([x, weight], move |[x, weight]| {
        let (out, inv) = ew::rms_norm(f32s(x), f32s(weight), eps as f32);
        let output = from_vec(out, &shape);
        let (x, weight) = (x.clone(), weight.clone());
        let grad: GradFn = Arc::new(move |dout| {
            let (dx, dw) = ew::rms_norm_backward(f32s(&x), f32s(&weight), &inv, f32s(dout));
            vec![Some(from_vec(dx, &shape)), Some(from_vec(dw, &wshape))]
        });
        Forward { output, grad }
    })
}

pub fn token_logprobs<B: Backend>(logits: Tensor<B, 3>, targets: &[u32]) -> Option<Tensor<B, 2>> {
    let [batch, seq, vocab] = logits.dims();
    if targets.len() != batch * seq || targets.iter().any(|&t| t as usize >= vocab) {
        return None;
    }
    let targets: Arc<Vec<u32>> = Arc::new(targets.to_vec());
    run::<B, 1, 3, 2>([logits], move |[logits]| {
        let (out, lse) = ew::token_logprobs(f32s(logits), vocab, &targets);
        let logits = logits.clone();
        let grad: GradFn = Arc::new(move |dout| {
            vec![Some(from_vec(ew::token_logprobs_backward(f32s(&logits), vocab, &targets, &lse, f32s(dout)), &[batch, seq, vocab]))]
        });
        Forward { output: from_vec(out, &[batch, seq]), grad }
    })
}

pub fn adamw<B: Backend>(
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    step: ew::AdamWStep,
) -> Option<(Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>)> {
    if !is_flex::<B>() {
        return None;
    }
    let n = param.dims()[0];
    let values = |t: Tensor<B, 1>| primitive::<B, FlexTensor, 1>(t).and_then(|t| contiguous(&t));
    let (p, g) = (values(param)?, values(grad)?);
    let (m, v) = match moments {
        Some((m, v)) => (values(m)?, values(v)?),
        None => {
            let zeros = from_vec(vec![0.0; n], &[n]);
            (zeros.clone(), zeros)
        }
    };
    let (p, m, v) = ew::adamw(f32s(&p), f32s(&g), f32s(&m), f32s(&v), step);
    let wrap = |x: Vec<f32>| tensor::<B, _, 1>(from_vec(x, &[n]));
    Some((wrap(p), wrap(m), wrap(v)))
}
