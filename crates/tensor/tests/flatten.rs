//! The flatten module of the tensor model, through its public API.

#![allow(clippy::unwrap_used)]

use ckpt_tensor::Tensor;
use ckpt_tensor::flatten::*;
use ckpt_tensor::*;

fn t() -> Value {
    Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap())
}

#[test]
fn leaf_index_finds_what_a_search_of_leaves_finds() {
    let mut d = Dict::new(DictKind::OrderedDict);
    d.insert(Value::Int(0), t());
    d.insert(Value::Int(1), Value::dict::<&str>([]));
    d.insert("0", Value::Int(5)); // same name as the int key 0: the first wins
    let v = Value::dict([
        ("a", Value::Dict(d)),
        ("a.0", Value::Int(6)),
        ("l", Value::List(vec![t(), Value::Int(3), Value::Tuple(vec![])])),
        ("n", Value::List(vec![Value::List(vec![t()]), Value::None])),
    ]);
    let index = LeafIndex::new(&v).unwrap();
    let all = leaves(&v).unwrap();
    let names = leaf_names(&v).unwrap();
    assert_eq!(names.len(), all.len());
    for ((name, value), leaf) in names.iter().zip(&all) {
        assert_eq!(name, &leaf.key);
        assert!(std::ptr::eq(*value, leaf.value), "{name}");
    }
    for leaf in &all {
        let first = all.iter().find(|l| l.key == leaf.key).unwrap();
        assert!(std::ptr::eq(index.get(&v, &leaf.key).unwrap(), first.value), "{}", leaf.key);
    }
    assert_eq!(index.len(), 7);
    assert_eq!(index.get(&v, "a"), None);
    assert_eq!(index.get(&v, "x"), None);
    assert_eq!(index.get(&Value::None, "l.0"), None, "another value: no panic");
    let scalar = Value::Int(1);
    assert_eq!(LeafIndex::new(&scalar).unwrap().get(&scalar, ""), Some(&scalar));
    let mut bad = Dict::new(DictKind::Dict);
    bad.insert(Value::List(vec![]), Value::Int(1));
    let bad = Value::Dict(bad);
    assert!(LeafIndex::new(&bad).is_err() && leaf_names(&bad).is_err() && leaves(&bad).is_err());
}

#[test]
fn rules() {
    let mut d = Dict::new(DictKind::OrderedDict);
    d.insert(Value::Int(0), t());
    d.insert(Value::Int(1), Value::dict::<&str>([]));
    let sd = Value::dict([
        ("a", Value::Dict(d)),
        ("l", Value::List(vec![t(), Value::Int(3)])),
        ("tup", Value::Tuple(vec![t(), t()])),
        ("nested", Value::List(vec![Value::List(vec![t()]), Value::Int(1)])),
        ("plain", Value::List(vec![Value::List(vec![Value::Int(1)])])),
        ("emptydictlist", Value::List(vec![Value::dict::<&str>([])])),
    ]);
    let flat = flatten(&sd).unwrap();
    let keys: Vec<&str> = flat.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["a.0", "l.0", "l.1", "tup", "nested.0.0", "nested.1", "plain"]);
    assert_eq!(flat[1].path, vec![PathItem::Key("l".into()), PathItem::Index(0)]);
}

#[test]
fn duplicates_rejected() {
    let sd = Value::dict([("a.b", t()), ("a", Value::dict([("b", t())]))]);
    assert!(flatten(&sd).is_err());
    assert!(flatten(&t()).is_err());
}

#[test]
fn unflatten_round_trip() {
    let sd = Value::dict([
        ("m", Value::dict([("w", t()), ("b", t())])),
        ("l", Value::List(vec![t(), Value::Int(3)])),
        ("x", Value::Int(7)),
    ]);
    let leaves: Vec<(Vec<PathItem>, Value)> =
        flatten(&sd).unwrap().into_iter().map(|e| (e.path, e.value.clone())).collect();
    assert_eq!(unflatten(leaves).unwrap(), sd);
    let padded = unflatten([(vec![PathItem::Key("l".into()), PathItem::Index(2)], Value::Int(1))]).unwrap();
    assert_eq!(padded, Value::dict([("l", Value::List(vec![Value::None, Value::None, Value::Int(1)]))]));
    assert!(unflatten([(vec![PathItem::Key("l".into()), PathItem::Index(usize::MAX)], Value::None)]).is_err());
    assert!(unflatten([(vec![PathItem::Index(0)], Value::None)]).is_err());
}

#[test]
fn leaves_descend_everything() {
    let sd = Value::dict([
        ("tup", Value::Tuple(vec![t(), Value::Int(1)])),
        ("e", Value::List(vec![])),
        ("l", Value::List(vec![Value::Int(1)])),
    ]);
    let keys: Vec<String> = leaves(&sd).unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["tup.0", "tup.1", "e", "l.0"]);
    assert_eq!(leaves(&t()).unwrap()[0].key, "");
}

#[test]
fn float_reprs() {
    assert_eq!(float_repr(1.0), "1.0");
    assert_eq!(float_repr(0.001), "0.001");
    assert_eq!(float_repr(1e-5), "1e-05");
    assert_eq!(float_repr(1e16), "1e+16");
    assert_eq!(float_repr(123456.5), "123456.5");
    assert_eq!(float_repr(-2.5e-10), "-2.5e-10");
}
