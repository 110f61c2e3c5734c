//! The value module of the tensor model, through its public API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_tensor::*;

fn s(x: &str) -> Value {
    Value::Str(x.into())
}

#[test]
fn python_items_keep_the_first_position_and_the_last_value() {
    let items = vec![
        (s("a"), Value::Int(1)),
        (Value::Int(1), Value::Int(2)),
        (s("b"), Value::Int(3)),
        (s("a"), Value::Int(4)),
        (Value::Bool(true), Value::Int(5)),
        (Value::Float(1.0), Value::Int(6)),
        (s("a"), Value::Int(7)),
        (Value::Bytes(b"a".to_vec()), Value::Int(8)),
        (Value::Float(f64::NAN), Value::Int(9)),
        (Value::Float(f64::NAN), Value::Int(10)),
        (Value::Tuple(vec![Value::Int(0), s("x")]), Value::Int(11)),
        (Value::Tuple(vec![Value::Float(0.0), s("x")]), Value::Int(12)),
    ];
    let d = Dict::from_python_items(DictKind::OrderedDict, items);
    assert_eq!(d.kind, DictKind::OrderedDict);
    let want = vec![
        (s("a"), Value::Int(7)),
        (Value::Int(1), Value::Int(6)),
        (s("b"), Value::Int(3)),
        (Value::Bytes(b"a".to_vec()), Value::Int(8)),
        (Value::Float(f64::NAN), Value::Int(9)),
        (Value::Float(f64::NAN), Value::Int(10)),
        (Value::Tuple(vec![Value::Int(0), s("x")]), Value::Int(12)),
    ];
    // NaN != NaN: compare renderings.
    assert_eq!(format!("{:?}", d.items), format!("{want:?}"));
    let plain: Vec<(Value, Value)> = (0..100).map(|i| (s(&i.to_string()), Value::Int(i))).collect();
    assert_eq!(Dict::from_python_items(DictKind::Dict, plain.clone()).items, plain);
    assert!(Dict::from_python_items(DictKind::Dict, []).items.is_empty());
}
