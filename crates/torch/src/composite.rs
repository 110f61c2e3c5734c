//! torch's reduce forms of quantized, sparse and nested tensors, and the [`Composite`] each makes:
//!
//! - `torch._utils._rebuild_qtensor(storage, offset, size, stride, qparams, requires_grad, hooks)`, `qparams`
//!   `(torch.per_tensor_affine, scale, zero_point)` or `(torch.per_channel_affine, scales, zero_points, axis)`;
//! - `torch._utils._rebuild_sparse_tensor(layout, (indices, values, size, is_coalesced))` (COO) or
//!   `(layout, (compressed_indices, plain_indices, values, size))` (CSR, CSC, BSR, BSC), `layout` as
//!   `torch.serialization._get_layout('torch.sparse_csr')`;
//! - `torch._utils._rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)`.
//!
//! [`raise`] reads them (any other form stays an opaque tensor), [`lower`] writes them as torch 2.13 does.

use ckpt_tensor::composite::{int_repr_dtype, quantized_dtype};
use ckpt_tensor::{Composite, DictKind, Layout, Object, OpaqueTensorKind, Tensor, Value};

use crate::error::Error;

fn global(module: &str, name: &str) -> Value {
    Value::Global { module: module.into(), name: name.into() }
}

fn call(callable: Value, args: Vec<Value>) -> Object {
    Object {
        callable,
        args: Value::Tuple(args),
        newobj: false,
        state: None,
        list_items: Vec::new(),
        dict_items: Vec::new(),
    }
}

fn dims(v: &Value) -> Option<Vec<usize>> {
    match v {
        Value::Tuple(items) | Value::List(items) => {
            items.iter().map(|d| int(d).and_then(|d| usize::try_from(d).ok())).collect()
        }
        Value::Size(d) => d.iter().map(|&d| usize::try_from(d).ok()).collect(),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn boolean(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Int(i) => Some(*i != 0),
        _ => None,
    }
}

fn tensor(v: &Value) -> Option<Tensor> {
    v.as_tensor().cloned()
}

fn ints(d: &[usize]) -> Option<Vec<Value>> {
    d.iter().map(|&d| i64::try_from(d).ok().map(Value::Int)).collect()
}

fn bad(function: &str, source: ckpt_tensor::Error) -> Error {
    Error::BadView { function: function.to_owned(), source: Box::new(source) }
}

/// The composite tensor a rebuild call of `kind` makes from `args` (its arguments, with the objects they
/// share resolved), or `None` for a form this module does not read (it stays opaque).
///
/// # Errors
/// A view of the quantized storage outside it, or components that do not fit the layout.
pub(crate) fn raise(kind: OpaqueTensorKind, args: &[Value]) -> Result<Option<Composite>, Error> {
    match kind {
        OpaqueTensorKind::Quantized => quantized(args),
        OpaqueTensorKind::Sparse => sparse(args),
        OpaqueTensorKind::Nested => nested(args),
        _ => Ok(None),
    }
}

fn quantized(args: &[Value]) -> Result<Option<Composite>, Error> {
    let function = "_rebuild_qtensor";
    let [Value::Storage { dtype, data }, offset, size, stride, qparams, requires_grad, ..] = args else {
        return Ok(None);
    };
    let (Some(int_dtype), Some(offset), Some(size), Some(stride)) =
        (int_repr_dtype(*dtype), int(offset).and_then(|o| usize::try_from(o).ok()), dims(size), dims(stride))
    else {
        return Ok(None);
    };
    let int_repr = Tensor::from_parts(int_dtype, &size, &stride, offset, data.clone()).map_err(|e| bad(function, e))?;
    let Some(q) = qparams.as_sequence() else { return Ok(None) };
    let (layout, scale, zero_point, axis) = match q {
        [Value::Global { module, name }, scale, zp] if module == "torch" && name == "per_tensor_affine" => {
            let (Some(scale), Some(zp)) = (scale.as_f64(), int(zp)) else { return Ok(None) };
            let scale = Tensor::from_slice(&[scale], &[]).map_err(|e| bad(function, e))?;
            let zp = Tensor::from_slice(&[zp], &[]).map_err(|e| bad(function, e))?;
            (Layout::PerTensorAffine, scale, zp, None)
        }
        [Value::Global { module, name }, scales, zps, axis] if module == "torch" && name == "per_channel_affine" => {
            let (Some(s), Some(z), Some(axis)) =
                (tensor(scales), tensor(zps), int(axis).and_then(|a| usize::try_from(a).ok()))
            else {
                return Ok(None);
            };
            (Layout::PerChannelAffine, s, z, Some(axis))
        }
        _ => return Ok(None),
    };
    let mut c = Composite::new(layout, *dtype, size, vec![int_repr, scale, zero_point]).map_err(Error::Core)?;
    c.axis = axis;
    c.requires_grad = boolean(requires_grad).unwrap_or(false);
    Ok(Some(c))
}

fn sparse(args: &[Value]) -> Result<Option<Composite>, Error> {
    let [Value::Object(layout), parts] = args else { return Ok(None) };
    let name = match (layout.callable_name(), layout.args.as_sequence()) {
        (Some(("torch.serialization", "_get_layout")), Some([Value::Str(l)])) => l.as_str(),
        _ => return Ok(None),
    };
    let Some(layout) = name.strip_prefix("torch.").and_then(Layout::from_name) else { return Ok(None) };
    let Some(parts) = parts.as_sequence() else { return Ok(None) };
    let (components, size, coalesced) = match (layout, parts) {
        (Layout::SparseCoo, [indices, values, size, coalesced]) => {
            (vec![tensor(indices), tensor(values)], size, boolean(coalesced))
        }
        (Layout::SparseCsr | Layout::SparseCsc | Layout::SparseBsr | Layout::SparseBsc, [c, p, values, size]) => {
            (vec![tensor(c), tensor(p), tensor(values)], size, None)
        }
        _ => return Ok(None),
    };
    let (Some(components), Some(size)) = (components.into_iter().collect::<Option<Vec<_>>>(), dims(size)) else {
        return Ok(None);
    };
    let Some(dtype) = components.last().map(Tensor::dtype) else { return Ok(None) };
    let mut c = Composite::new(layout, dtype, size, components).map_err(Error::Core)?;
    c.coalesced = coalesced;
    Ok(Some(c))
}

fn nested(args: &[Value]) -> Result<Option<Composite>, Error> {
    let [buffer, sizes, strides, offsets] = args else { return Ok(None) };
    let (Some(buffer), Some(sizes), Some(strides), Some(offsets)) =
        (tensor(buffer), tensor(sizes), tensor(strides), tensor(offsets))
    else {
        return Ok(None);
    };
    let n = offsets.numel();
    let c = Composite::new(Layout::Nested, buffer.dtype(), vec![n], vec![buffer, sizes, strides, offsets])
        .map_err(Error::Core)?;
    Ok(Some(c))
}

/// The object torch 2.13 pickles for `c` (what `torch.load` rebuilds it from).
///
/// # Errors
/// A component whose data cannot be read, or a quantized tensor of another int dtype.
pub(crate) fn lower(c: &Composite) -> Result<Object, Error> {
    let part = |i: usize| {
        c.components
            .get(i)
            .cloned()
            .ok_or_else(|| Error::Unwritable(format!("a {} tensor without its components", c.layout)))
    };
    let utils = |name: &str| global("torch._utils", name);
    Ok(match c.layout {
        Layout::PerTensorAffine | Layout::PerChannelAffine => {
            let int = part(0)?.to_contiguous().map_err(Error::Core)?;
            if quantized_dtype(int.dtype()) != Some(c.dtype) {
                return Err(Error::Unwritable(format!(
                    "a {} tensor whose int representation is {}",
                    c.dtype,
                    int.dtype()
                )));
            }
            let data = int.data().map_err(Error::Core)?.into_owned();
            let size = ints(int.shape()).ok_or_else(|| Error::Unwritable("a shape beyond i64".into()))?;
            let stride = ints(int.strides()).ok_or_else(|| Error::Unwritable("strides beyond i64".into()))?;
            let qparams = if c.layout == Layout::PerTensorAffine {
                let scale = part(1)?.to_contiguous().and_then(|t| t.to_vec::<f64>()).map_err(Error::Core)?;
                let zp = part(2)?.to_contiguous().and_then(|t| t.to_vec::<i64>()).map_err(Error::Core)?;
                let (Some(&scale), Some(&zp)) = (scale.first(), zp.first()) else {
                    return Err(Error::Unwritable("a quantized tensor without its scale or zero point".into()));
                };
                vec![global("torch", "per_tensor_affine"), Value::Float(scale), Value::Int(zp)]
            } else {
                let axis = c
                    .axis
                    .and_then(|a| i64::try_from(a).ok())
                    .ok_or_else(|| Error::Unwritable("a per-channel quantized tensor without its axis".into()))?;
                vec![
                    global("torch", "per_channel_affine"),
                    Value::Tensor(part(1)?),
                    Value::Tensor(part(2)?),
                    Value::Int(axis),
                ]
            };
            call(
                utils("_rebuild_qtensor"),
                vec![
                    Value::Storage { dtype: c.dtype, data: ckpt_tensor::Buffer::from_vec(data) },
                    Value::Int(0),
                    Value::Tuple(size),
                    Value::Tuple(stride),
                    Value::Tuple(qparams),
                    Value::Bool(c.requires_grad),
                    Value::Dict(ckpt_tensor::Dict::new(DictKind::OrderedDict)),
                ],
            )
        }
        Layout::Nested => {
            call(utils("_rebuild_nested_tensor"), (0..4).map(|i| part(i).map(Value::Tensor)).collect::<Result<_, _>>()?)
        }
        sparse => {
            let layout = call(
                global("torch.serialization", "_get_layout"),
                vec![Value::Str(format!("torch.{}", sparse.name()))],
            );
            let size = c.shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect();
            let mut parts: Vec<Value> =
                (0..sparse.components().len()).map(|i| part(i).map(Value::Tensor)).collect::<Result<_, _>>()?;
            parts.push(Value::Size(size));
            if sparse == Layout::SparseCoo {
                parts.push(Value::Bool(c.coalesced.unwrap_or(false)));
            }
            call(utils("_rebuild_sparse_tensor"), vec![Value::Object(Box::new(layout)), Value::Tuple(parts)])
        }
    })
}
