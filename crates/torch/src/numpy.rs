//! numpy values inside `torch.save` files: the scalars (`numpy.core.multiarray.scalar(dtype, bytes)`), arrays
//! (`numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')` then `__setstate__` with
//! `(1, shape, dtype, is_fortran, raw bytes)`) and dtypes (`numpy.dtype('f8', False, True)` then `__setstate__` with
//! `(3, '<', None, None, None, -1, -1, 0)`) that numpy's `__reduce__` pickles (numpy 2 under
//! `numpy._core.multiarray`).
//!
//! Reading turns those objects into [`Value::Numpy`] (the torch builder's rebuild rule for numpy's reduce
//! forms): scalars keep their value (`Bool`, `Int`, `BigInt`,
//! `Float`, `Complex`) and numpy dtype, arrays become tensors of the numpy dtype. Nothing is imported or run.
//! Writing pickles them back as numpy would, so `torch.load(weights_only=False)` gives equal numpy values.
//! numpy values of dtypes torch has no counterpart of (object arrays, structured dtypes, strings, datetimes,
//! big-endian data) stay the pickled objects they were, written back unchanged; asking for their data gives
//! [`crate::Error::UnsupportedNumpy`] naming the dtype ([`ckpt_tensor::value::numpy_unsupported`]).

use ckpt_tensor::value::NUMPY_MULTIARRAY;
use ckpt_tensor::value::numpy_dtype_code;
use ckpt_tensor::{Buffer, DType, Numpy, Object, Tensor, Value};

/// The torch dtype of a numpy type code (`f8`, `i4`, `b1`, `c16` ...) in little-endian or no byte order.
fn supported(code: &str, order: &str) -> Option<DType> {
    if !matches!(order, "<" | "|" | "=") {
        return None;
    }
    // numpy's `?` is bool; every other code is its kind and size.
    let code = if code == "?" { "b1" } else { code };
    DType::from_numpy_str(code).filter(|d| !matches!(d, DType::BF16))
}

fn multiarray(o: &Object, name: &str) -> Option<String> {
    let (module, n) = o.callable_name()?;
    (n == name && NUMPY_MULTIARRAY.contains(&module)).then(|| module.to_owned())
}

/// The modules of numpy's `_frombuffer(buffer, dtype, shape, order)`, what an array pickles as under
/// protocol 5 (numpy 2 and numpy 1), each with the `multiarray` module its arrays are written back under.
pub(crate) const NUMPY_NUMERIC: [(&str, &str); 2] =
    [("numpy._core.numeric", "numpy._core.multiarray"), ("numpy.core.numeric", "numpy.core.multiarray")];

/// The array of `numpy._core.numeric._frombuffer(buffer, dtype, shape, order)` (protocol 5's in-band form:
/// the buffer a `bytearray`, or `bytes` for a read-only array; `order` `'C'` or `'F'`).
fn frombuffer(o: &Object) -> Option<Numpy> {
    let (module, name) = o.callable_name()?;
    let (_, multiarray) = NUMPY_NUMERIC.iter().find(|(m, _)| *m == module).filter(|_| name == "_frombuffer")?;
    let Value::Tuple(args) = &o.args else { return None };
    let [Value::ByteArray(data) | Value::Bytes(data), dtype, Value::Tuple(shape), Value::Str(order)] = args.as_slice()
    else {
        return None;
    };
    if o.state.is_some() || !matches!(order.as_str(), "C" | "F") {
        return None;
    }
    array(dtype, shape, order == "F", data, multiarray)
}

/// The array of `dtype` and `shape` over the little-endian bytes `data` (Fortran or C order), `module` the
/// `multiarray` module it is written back under.
fn array(dtype: &Value, shape: &[Value], fortran: bool, data: &[u8], module: &str) -> Option<Numpy> {
    let (code, order) = numpy_dtype_code(dtype)?;
    let dtype = supported(code, order)?;
    let shape: Vec<usize> =
        shape.iter().map(|d| d.as_int().and_then(|d| usize::try_from(d).ok())).collect::<Option<_>>()?;
    let numel = ckpt_tensor::checked_numel(&shape)?;
    if numel.checked_mul(dtype.size())? != data.len() {
        return None;
    }
    let mut strides = vec![0; shape.len()];
    let mut step = 1usize;
    let order: Box<dyn Iterator<Item = usize>> =
        if fortran { Box::new(0..shape.len()) } else { Box::new((0..shape.len()).rev()) };
    for i in order {
        *strides.get_mut(i)? = step;
        step = step.checked_mul((*shape.get(i)?).max(1))?;
    }
    let tensor = Tensor::from_parts(dtype, &shape, &strides, 0, Buffer::from_vec(data.to_vec())).ok()?;
    Some(Numpy { value: Value::Tensor(tensor), dtype, module: module.to_owned() })
}

/// The numpy value `o` pickles, when it is a numpy scalar or array of a dtype torch has.
pub(crate) fn numpy_of(o: &Object) -> Option<Numpy> {
    if let Some(n) = frombuffer(o) {
        return Some(n);
    }
    if let Some(module) = multiarray(o, "scalar") {
        let Value::Tuple(args) = &o.args else { return None };
        let [dtype, Value::Bytes(data)] = args.as_slice() else { return None };
        let (code, order) = numpy_dtype_code(dtype)?;
        let dtype = supported(code, order)?;
        if data.len() != dtype.size() || o.state.is_some() {
            return None;
        }
        return Some(Numpy { value: scalar(dtype, data)?, dtype, module });
    }
    let module = multiarray(o, "_reconstruct")?;
    let Value::Tuple(args) = &o.args else { return None };
    if !matches!(args.first(), Some(Value::Global { module, name }) if module == "numpy" && name == "ndarray") {
        return None;
    }
    let Some(Value::Tuple(state)) = &o.state else { return None };
    let [Value::Int(1), Value::Tuple(shape), dtype, Value::Bool(fortran), Value::Bytes(data)] = state.as_slice() else {
        return None;
    };
    array(dtype, shape, *fortran, data, &module)
}

/// A numpy scalar's value from its little-endian bytes.
fn scalar(dtype: DType, b: &[u8]) -> Option<Value> {
    let n = |len: usize| -> Option<[u8; 8]> {
        let mut out = [0u8; 8];
        out.get_mut(..len)?.copy_from_slice(b.get(..len)?);
        Some(out)
    };
    let sext = |len: usize| -> Option<i64> {
        let raw = u64::from_le_bytes(n(len)?);
        let shift = 64 - 8 * len as u32;
        Some(((raw << shift) as i64) >> shift)
    };
    let f = |at: usize| -> Option<f64> { Some(f64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)) };
    let f32_at =
        |at: usize| -> Option<f64> { Some(f64::from(f32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))) };
    Some(match dtype {
        DType::Bool => Value::Bool(*b.first()? != 0),
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => Value::Int(sext(dtype.size())?),
        DType::U8 | DType::U16 | DType::U32 => Value::Int(u64::from_le_bytes(n(dtype.size())?) as i64),
        DType::U64 => {
            let v = u64::from_le_bytes(n(8)?);
            match i64::try_from(v) {
                Ok(i) => Value::Int(i),
                Err(_) => Value::BigInt(v.to_le_bytes().iter().copied().chain([0]).collect()),
            }
        }
        DType::F16 => Value::Float(f64::from(half::f16::from_le_bytes(b.get(..2)?.try_into().ok()?))),
        DType::F32 => Value::Float(f32_at(0)?),
        DType::F64 => Value::Float(f(0)?),
        DType::C64 => Value::Complex(f32_at(0)?, f32_at(4)?),
        DType::C128 => Value::Complex(f(0)?, f(8)?),
        _ => return None,
    })
}

/// The little-endian bytes of a scalar of `dtype` holding `v`.
fn scalar_bytes(dtype: DType, v: &Value) -> Option<Vec<u8>> {
    let int = |v: &Value| -> Option<i128> {
        match v {
            Value::Int(i) => Some(i128::from(*i)),
            Value::Bool(b) => Some(i128::from(*b)),
            Value::BigInt(b) => {
                // Little-endian two's complement, as pickle's long integers.
                if b.len() > 16 {
                    return None;
                }
                let neg = b.last().is_some_and(|x| x & 0x80 != 0);
                let mut out = [if neg { 0xff } else { 0 }; 16];
                out.get_mut(..b.len())?.copy_from_slice(b);
                Some(i128::from_le_bytes(out))
            }
            _ => None,
        }
    };
    let float = |v: &Value| v.as_f64();
    let size = dtype.size();
    Some(match dtype {
        DType::Bool => vec![u8::from(matches!(v, Value::Bool(true)))],
        DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
            int(v)?.to_le_bytes().get(..size)?.to_vec()
        }
        DType::F16 => half::f16::from_f64(float(v)?).to_le_bytes().to_vec(),
        DType::F32 => (float(v)? as f32).to_le_bytes().to_vec(),
        DType::F64 => float(v)?.to_le_bytes().to_vec(),
        DType::C64 | DType::C128 => {
            let (re, im) = match v {
                Value::Complex(re, im) => (*re, *im),
                other => (float(other)?, 0.0),
            };
            if dtype == DType::C64 {
                [(re as f32).to_le_bytes(), (im as f32).to_le_bytes()].concat()
            } else {
                [re.to_le_bytes(), im.to_le_bytes()].concat()
            }
        }
        _ => return None,
    })
}

/// The pickled `numpy.dtype` object of `dtype`, as numpy 2 pickles it.
fn dtype_object(dtype: DType) -> Option<Value> {
    let full = dtype.numpy_str()?;
    let (order, code) = full.split_at(1);
    Some(Value::Object(Box::new(Object {
        callable: Value::Global { module: "numpy".into(), name: "dtype".into() },
        args: Value::Tuple(vec![Value::Str(code.into()), Value::Bool(false), Value::Bool(true)]),
        newobj: false,
        state: Some(Value::Tuple(vec![
            Value::Int(3),
            Value::Str(order.into()),
            Value::None,
            Value::None,
            Value::None,
            Value::Int(-1),
            Value::Int(-1),
            Value::Int(0),
        ])),
        list_items: Vec::new(),
        dict_items: Vec::new(),
    })))
}

/// The pickled object of a numpy value, as numpy's `__reduce__` makes it; `None` when the value does not fit
/// its dtype (a scalar of another type, a dtype numpy lacks).
pub(crate) fn lower(n: &Numpy) -> Option<Object> {
    let dtype = dtype_object(n.dtype)?;
    let global = |name: &str| Value::Global { module: n.module.clone(), name: name.into() };
    let object = |callable, args, state| Object {
        callable,
        args,
        newobj: false,
        state,
        list_items: Vec::new(),
        dict_items: Vec::new(),
    };
    Some(match &n.value {
        Value::Tensor(t) => {
            if t.dtype() != n.dtype {
                return None;
            }
            // Column-major (and not also row-major) data is pickled in Fortran order, as numpy does: the bytes
            // of the tensor with its dimensions reversed, which is then row-major.
            let dims = t.dim();
            let mut reversed = t.clone();
            for i in 0..dims / 2 {
                reversed = reversed.transpose(i, dims - 1 - i).ok()?;
            }
            let fortran = dims > 1 && !t.is_contiguous() && reversed.is_contiguous();
            let data = if fortran { reversed.data() } else { t.data() }.ok()?.into_owned();
            let shape = t.shape().iter().map(|d| i64::try_from(*d).map(Value::Int)).collect::<Result<_, _>>().ok()?;
            object(
                global("_reconstruct"),
                Value::Tuple(vec![
                    Value::Global { module: "numpy".into(), name: "ndarray".into() },
                    Value::Tuple(vec![Value::Int(0)]),
                    Value::Bytes(b"b".to_vec()),
                ]),
                Some(Value::Tuple(vec![
                    Value::Int(1),
                    Value::Tuple(shape),
                    dtype,
                    Value::Bool(fortran),
                    Value::Bytes(data),
                ])),
            )
        }
        v => object(global("scalar"), Value::Tuple(vec![dtype, Value::Bytes(scalar_bytes(n.dtype, v)?)]), None),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// What the reader makes of one pickled object.
    fn lift(v: Value) -> Value {
        match v {
            Value::Object(o) => match numpy_of(&o) {
                Some(n) => Value::Numpy(Box::new(n)),
                None => Value::Object(o),
            },
            other => other,
        }
    }

    fn scalars() -> Vec<(DType, Value)> {
        vec![
            (DType::Bool, Value::Bool(true)),
            (DType::I8, Value::Int(-128)),
            (DType::I16, Value::Int(-2)),
            (DType::I32, Value::Int(i64::from(i32::MIN))),
            (DType::I64, Value::Int(i64::MIN)),
            (DType::U8, Value::Int(255)),
            (DType::U16, Value::Int(65535)),
            (DType::U32, Value::Int(i64::from(u32::MAX))),
            (DType::U64, Value::Int(7)),
            (DType::U64, Value::BigInt(u64::MAX.to_le_bytes().iter().copied().chain([0]).collect())),
            (DType::F16, Value::Float(-2.25)),
            (DType::F32, Value::Float(f64::from(0.1f32))),
            (DType::F64, Value::Float(f64::NEG_INFINITY)),
            (DType::C64, Value::Complex(1.5, -0.25)),
            (DType::C128, Value::Complex(f64::MAX, 1e-300)),
        ]
    }

    #[test]
    fn scalars_pickle_back_to_what_reads_as_them() {
        for module in NUMPY_MULTIARRAY {
            for (dtype, value) in scalars() {
                let n = Numpy { value: value.clone(), dtype, module: module.into() };
                let o = lower(&n).unwrap();
                assert_eq!(o.callable_name(), Some((module, "scalar")));
                let Value::Tuple(args) = &o.args else { panic!() };
                assert!(matches!(&args[1], Value::Bytes(b) if b.len() == dtype.size()), "{dtype}");
                let back = lift(Value::Object(Box::new(o)));
                assert_eq!(back, Value::Numpy(Box::new(n)), "{dtype}");
            }
        }
    }

    #[test]
    fn arrays_keep_dtype_shape_values_and_fortran_order() {
        let c = Tensor::from_slice(&[1i16, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        let f = c.transpose(0, 1).unwrap(); // 3x2 column-major
        for (t, fortran) in [(c.clone(), false), (f.clone(), true)] {
            let n = Numpy { value: Value::Tensor(t.clone()), dtype: DType::I16, module: NUMPY_MULTIARRAY[0].into() };
            let o = lower(&n).unwrap();
            let Some(Value::Tuple(state)) = &o.state else { panic!() };
            assert_eq!(state[3], Value::Bool(fortran));
            assert_eq!(numpy_dtype_code(&state[2]), Some(("i2", "<")));
            let Value::Numpy(back) = lift(Value::Object(Box::new(o))) else { panic!() };
            let bt = back.value.as_tensor().unwrap();
            assert_eq!(bt.shape(), t.shape());
            assert_eq!(bt.strides(), t.strides(), "fortran {fortran}");
            assert_eq!(bt.to_vec::<i16>().unwrap(), t.to_vec::<i16>().unwrap());
        }
        // A strided view that is neither order is pickled in C order.
        let big = Tensor::from_slice(&(0..24).map(|i| i as f32).collect::<Vec<_>>(), &[4, 6]).unwrap();
        let view = big.narrow(1, 1, 3).unwrap();
        let n = Numpy { value: Value::Tensor(view.clone()), dtype: DType::F32, module: NUMPY_MULTIARRAY[1].into() };
        let Value::Numpy(back) = lift(Value::Object(Box::new(lower(&n).unwrap()))) else { panic!() };
        assert_eq!(back.value.as_tensor().unwrap().to_vec::<f32>().unwrap(), view.to_vec::<f32>().unwrap());
        // A value that does not fit its dtype is refused, not written wrongly.
        let wrong = Numpy { value: Value::Str("x".into()), dtype: DType::F64, module: NUMPY_MULTIARRAY[0].into() };
        assert!(lower(&wrong).is_none());
        let other = Numpy { value: Value::Tensor(c), dtype: DType::F32, module: NUMPY_MULTIARRAY[0].into() };
        assert!(lower(&other).is_none());
    }

    #[test]
    fn unsupported_dtypes_stay_objects_and_are_named() {
        let dtype = |code: &str, order: &str| {
            let mut d = dtype_object(DType::F64).unwrap();
            if let Value::Object(o) = &mut d {
                o.args = Value::Tuple(vec![Value::Str(code.into()), Value::Bool(false), Value::Bool(true)]);
                if let Some(Value::Tuple(s)) = &mut o.state {
                    s[1] = Value::Str(order.into());
                }
            }
            d
        };
        let array = |d: Value, data: Value| Object {
            callable: Value::Global { module: NUMPY_MULTIARRAY[0].into(), name: "_reconstruct".into() },
            args: Value::Tuple(vec![
                Value::Global { module: "numpy".into(), name: "ndarray".into() },
                Value::Tuple(vec![Value::Int(0)]),
                Value::Bytes(b"b".to_vec()),
            ]),
            newobj: false,
            state: Some(Value::Tuple(vec![
                Value::Int(1),
                Value::Tuple(vec![Value::Int(1)]),
                d,
                Value::Bool(false),
                data,
            ])),
            list_items: vec![],
            dict_items: vec![],
        };
        for (code, order, data, named) in [
            ("O8", "|", Value::List(vec![Value::None]), "object dtype '|O8'"),
            ("V12", "|", Value::Bytes(vec![0; 12]), "structured dtype '|V12'"),
            ("U3", "<", Value::Bytes(vec![0; 12]), "string dtype '<U3'"),
            ("f8", ">", Value::Bytes(vec![0; 8]), "big-endian dtype '>f8'"),
        ] {
            let o = Value::Object(Box::new(array(dtype(code, order), data)));
            let lifted = lift(o.clone());
            assert_eq!(lifted, o, "{code}: left as the object it was");
            let why = ckpt_tensor::value::numpy_unsupported(&lifted).unwrap();
            assert!(why.contains(named), "{why}");
        }
        // The supported dtype in the same shape is read.
        let ok = array(dtype("f8", "<"), Value::Bytes(0.5f64.to_le_bytes().to_vec()));
        assert!(matches!(lift(Value::Object(Box::new(ok))), Value::Numpy(_)));
    }
}
