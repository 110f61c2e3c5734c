//! torch's reduce forms of quantized, sparse and nested tensors read as composite tensors and written back
//! (the fixtures torch wrote are checked in `facade/tests/composite.rs`); a quantized tensor whose view
//! lies outside its storage is refused as damage.
#![allow(clippy::unwrap_used, clippy::panic)]

use ckpt_tensor::FormatError;
use ckpt_tensor::{Buffer, Composite, DType, Dict, DictKind, Fault, Layout, Object, Tensor, Value};

fn global(module: &str, name: &str) -> Value {
    Value::Global { module: module.into(), name: name.into() }
}

/// `_rebuild_qtensor` of a `quint8` storage of `stored` bytes viewed as `[2, 3]`.
fn qtensor(stored: usize) -> Value {
    let args = vec![
        Value::Storage { dtype: DType::QUInt8, data: Buffer::from_vec(vec![7; stored]) },
        Value::Int(0),
        Value::Tuple(vec![Value::Int(2), Value::Int(3)]),
        Value::Tuple(vec![Value::Int(3), Value::Int(1)]),
        Value::Tuple(vec![global("torch", "per_tensor_affine"), Value::Float(0.5), Value::Int(1)]),
        Value::Bool(false),
        Value::Dict(Dict::new(DictKind::OrderedDict)),
    ];
    Value::Object(Box::new(Object {
        callable: global("torch._utils", "_rebuild_qtensor"),
        args: Value::Tuple(args),
        newobj: false,
        state: None,
        list_items: Vec::new(),
        dict_items: Vec::new(),
    }))
}

#[test]
fn a_quantized_tensor_round_trips_as_a_composite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.pt");
    ckpt_torch::save(&Value::dict([("q", qtensor(6))]), &path, &ckpt_torch::WriteOptions::default()).unwrap();
    let v = ckpt_torch::load(&path).unwrap();
    let Some(Value::Composite(c)) = v.as_dict().and_then(|d| d.get("q")) else { panic!("{v:?}") };
    assert_eq!((c.layout, c.dtype, c.shape.as_slice()), (Layout::PerTensorAffine, DType::QUInt8, &[2, 3][..]));
    assert_eq!(c.component("int_repr").unwrap().to_vec::<u8>().unwrap(), [7; 6]);
    assert_eq!(c.to_dense().unwrap().to_vec::<f32>().unwrap(), [3.0; 6]);
    // Written back from the composite (torch's form again), it reads the same.
    let again = dir.path().join("again.pt");
    ckpt_torch::save(&v, &again, &ckpt_torch::WriteOptions::default()).unwrap();
    assert_eq!(ckpt_torch::load(&again).unwrap(), v);
}

#[test]
fn a_quantized_view_outside_its_storage_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.pt");
    ckpt_torch::save(&Value::dict([("q", qtensor(4))]), &path, &ckpt_torch::WriteOptions::default()).unwrap();
    let err = ckpt_torch::load(&path).unwrap_err();
    assert_eq!(err.fault(), Fault::Malformed, "{err}");
    assert!(err.to_string().contains("_rebuild_qtensor"), "{err}");
}

#[test]
fn sparse_and_nested_composites_are_written_in_torchs_form() {
    let t = |v: &[i64], s: &[usize]| Tensor::from_slice(v, s).unwrap();
    let coo = {
        let mut c = Composite::new(Layout::SparseCoo, DType::I64, vec![3], vec![t(&[0, 2], &[1, 2]), t(&[5, 6], &[2])])
            .unwrap();
        c.coalesced = Some(true);
        c
    };
    let nested = Composite::new(
        Layout::Nested,
        DType::I64,
        vec![2],
        vec![t(&[1, 2, 3], &[3]), t(&[1, 2], &[2, 1]), t(&[1, 1], &[2, 1]), t(&[0, 1], &[2])],
    )
    .unwrap();
    let sd = Value::dict([("coo", Value::Composite(Box::new(coo))), ("nested", Value::Composite(Box::new(nested)))]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.pt");
    ckpt_torch::save(&sd, &path, &ckpt_torch::WriteOptions::default()).unwrap();
    assert_eq!(ckpt_torch::load(&path).unwrap(), sd);
}
