//! Rules fuzzing established (`fuzz/`, target `pickle`), held by both builders: the tree that [`decode_with`]
//! makes and the arena graph of [`GraphBuilder`] (the reference it is checked against).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_pickle::{GraphBuilder, Limits, Options, Value, decode_with};

/// Both builders on `data`: the same value and end offset.
fn both(data: &[u8]) -> (Value, usize) {
    let limits = Limits::default();
    let fast = decode_with(data, &limits).unwrap();
    let mut g = GraphBuilder::default();
    let (root, end) = ckpt_pickle::run(data, &Options::from(limits), &mut g).unwrap();
    let full = g.graph().to_value(root, limits.max_depth).unwrap();
    assert_eq!(format!("{:?}", fast.0), format!("{full:?}"));
    assert_eq!(fast.1, end);
    fast
}

/// A dict with a repeated key keeps every pair in the pickle value, in both paths (the stream is
/// reproduced as written; Python's rule, the first position with the last value, is applied where the
/// pickle becomes a checkpoint value: `ckpt_tensor::Dict::from_python_items`, in both torch read paths).
#[test]
fn fuzz_repeated_dict_keys_are_kept_as_written_in_both_paths() {
    // {} MARK 'a' 1 'b' 2 'a' 3 SETITEMS, protocol 2
    let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bK\x02X\x01\x00\x00\x00aK\x03u.";
    let (v, end) = both(data);
    assert_eq!(end, data.len());
    assert_eq!(
        v,
        Value::Dict(vec![
            (Value::str("a"), Value::Int(1)),
            (Value::str("b"), Value::Int(2)),
            (Value::str("a"), Value::Int(3)),
        ])
    );
}

/// A list of 40 000 items and a dict of 40 000 keys (the size of the fuzzer's input that showed quadratic
/// leaf look-ups downstream) decode to the same value in both paths, at every protocol.
#[test]
fn fuzz_wide_containers_decode_the_same_in_both_paths() {
    let n = 40_000i64;
    let list = Value::List((0..n).map(Value::Int).collect());
    let dict = Value::Dict((0..n).map(|i| (Value::str(i.to_string()), Value::Int(i))).collect());
    for v in [list, dict] {
        for protocol in 2..=5 {
            let bytes = ckpt_pickle::encode(&v, protocol).unwrap();
            assert_eq!(both(&bytes).0, v);
        }
    }
}

/// Nested lists that refer back to lists several levels up (fuzz/artifacts/pickle/crash-3a20037b...): lists
/// on a cycle that only their parent holds are placed in their parent, by the value builder (which never
/// shelved them: the pickle does not fetch them from its memo) and the graph builder (which shelves every
/// object) alike; only the lists the pickle refers to from two places are shared.
#[test]
fn fuzz_lists_on_a_cycle_held_once_are_placed_alike_by_both_builders() {
    let data = b"\x80\x02}q\x00X\x04\x00\x00\x00bombq\x01]q\x02(]q\x03(]q\x04(]q\x05(]q\x06(]q\x07(]q\x08(]q\x09(]q\x0a(]q\x0b(]q\x0c(]q\x0d(Vq\x0e((]q\x12q\x17(]q\x18(]q\x19ib2]q\x1dh\x0beh\x0a\x65h\x09eh\x08eh\x07eh\x06eh\x05eh\x04eeh\x06eh\x05eh\x04eh\x03es.";
    let (v, end) = both(data);
    assert_eq!(end, data.len());
    // Shared: lists 3 to 9 (fetched from the memo); lists 10 to 13 in place.
    let text = format!("{v:?}");
    assert_eq!(text.matches("Shared {").count(), 7, "{text}");
    assert_eq!(text.matches("Ref(").count(), 10, "{text}");
}

/// A tuple holding an object, fetched twice (DUP, then the tuple as a dict's key and value;
/// fuzz/artifacts/pickle/crash-66780545...): the tuple is copied to both places, and the object inside is
/// one object at both, shared, by both builders (the value builder had copied it with the tuple).
#[test]
fn fuzz_an_object_inside_a_copied_tuple_stays_one_object() {
    let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00wq\x01ctorch._utils\x0a_rebuild_tensor_v2\x0aq\x02((X\x07\x00\x00\x00storameq\x03ctorch\x0aFloatStorage\x0aq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x06tq\x07QK\x00K\x02K\x03\x86q\x08K\x03K\x01\x86q\x09\x89ccollections\x0aOrdeaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaredDict\x0aq\x0a)Rq\x0btq\x0cRq\x0dX\x01\x00\x00\x00bq\x0eh\x02((\x8c\x0bcollections\x94K\x03tq\x10QK\x00K\x03\x85q\x11K\x01\x85q\x12\x89h\x0a)Rq\x13tq\x142q\x15X\x01\x00\x00\x00nq\x16K\x07u.";
    let (v, end) = both(data);
    assert_eq!(end, data.len());
    let text = format!("{v:?}");
    assert_eq!(text.matches("Shared {").count(), 1, "{text}");
    assert_eq!(text.matches("Ref(0)").count(), 1, "{text}");
}

/// The same with a dict inside a tuple: `t = ({},)` in `{"a": t, "b": t}` decodes to one shared dict.
#[test]
fn a_dict_inside_a_tuple_fetched_twice_is_one_object() {
    // PROTO 2, {} MARK 'a' ( {} ) q0 'b' h0 u .
    let data = b"\x80\x02}(X\x01\x00\x00\x00a}\x85q\x00X\x01\x00\x00\x00bh\x00u.";
    let (v, _) = both(data);
    let inner = || Value::Shared { id: 0, value: Box::new(Value::Dict(vec![])) };
    assert_eq!(
        v,
        Value::Dict(vec![
            (Value::str("a"), Value::Tuple(vec![inner()])),
            (Value::str("b"), Value::Tuple(vec![Value::Ref(0)])),
        ])
    );
}

/// A shared object that desugars to bytes (`builtins.bytes()`, fetched twice from the memo;
/// fuzz/artifacts/pickle/crash-321bf490...): after `desugar` it is bytes at both places, not a shared
/// definition CPython's pickler could not write (the empty bytes is a singleton it never memoizes), so the
/// value re-encodes and decodes to itself at every protocol.
#[test]
fn fuzz_a_shared_object_that_desugars_to_bytes_round_trips() {
    let data = b"\x80\x04\x95E\x06\x00\x00\x00\x00\x00\x00\x8c%torch.distributed.checkpoint.metadata\x94\x8c\x08Metadata\x94\x93\x94)\x81\x94}\x94(\x8c\x13state_dict_metadata\x94}\x94(\x8c\x03row\x94h\x00\x8c\x15TensorStorageMetadata\x94\x93\x94)\x81\x94}\x94(\x8c\x0aproperties\x94h\x00\x8c\x10TensorProperties\x94\x93\x94)\x81\x94(\x8c\x05torch\x94\x8c\x07float32\x94\x93\x94\x8c\x13torch.serialization\x94\x8c\x0b_get_layout\x94\x93\x94\x8c\x0dtorch.strided\x94\x85\x94R\x94\x89h\x00\x8c\x14_MEM\x02FORMAT_ENCODING\x94\x93\x94K\x00\x85\x94R\x94\x89t\x94b\x8c\x04size\x94\x8c\x05torch\x94\x8c\x04Size\x94\x93\x94K\x05K\x04\x86\x94\x85\x94R\x94\x8c\x06chunks\x94]\x94(h\x00\x8c\x14ChunkStorageMetadata\x94\x93\x94)\x81\x94}\x94(\x8c\x07offsets\x94h!K\x00K\x00\x86\x94\x85\x94R\x94\x8c\x05sizes\x94h!K\x03K\x04\x86\x94\x85\x94R\x94ubh()\x81\x94}\x94(h+h!K\x03K\x00\x86\x94\x85\x94R\x94h/h!K\x02K\x04\x86\x94\x85\x94R\x94ubeub\x8c\x03col\x94h\x09)\x81\x94}\x94(h\x0ch\x0e)\x81\x94(h\x12h\x18\x89h\x1c\x89t\x94bh\x1eh!K\x03K\x06\x86\x94\x85\x94R\x94h%]\x94(h()\x81\x94}\x94(h+h!K\x00K\x00\x86\x94\x85\x94R\x94h/h!K\x03K\x03\x86\x94\x85\x94RQubh()\x81\x94}\x94(h+h!K\x00K\x03\x86\x94\x85\x94R\x94h/h!K\x03K\x03\x86\x94\x85\x94R\x94ubeub\x8c\x06rep_dt\x94h\x09)\x81\x94}\x94(h\x0ch\x0e)\x81\x94(h\x12h\x18\x89h\x1c\x89t\x94bh\x1eh!K\x02K\x02\x86\x94\x85\x94R\x94h%]\x94h()\x81\x94}\x94(h+h!K\x00K\x00\x86\x94\x85\x94R\x94h/h!K\x02K\x02\x86\x94\x85\x94R\x94ubaub\x8c\x05plain\x94h\x09)\x81\x94}\x94(h\x0ch\x0e)\x81\x94(h\x12h\x18\x89h\x1c\x89t\x94bh\x1eh!K\x03\x85\x94\x85\x94R\x94h%]\x94h()\x81\x94}\x94(h+h!K\x00\x85\x94\x85\x94R\x94h/h!K\x03\x85\x94\x85\x94R\x94ubaub\x8c\x08obj.rank\x94h\x00\x8c\x14BytesStorageMetadata\x94\x93\x94)\x81\x94u\x8c\x0cplanner_data\x94}\x94(\x8c\x03row\x94h\x07\x85\x94\x8c\x03col\x94h;\x85\x94hT\x8c\x06rep_dt\x94\x85\x94he\x8c\x05plain\x94\x85\x94hv\x8c\x03obj\x94\x8c\x04rank\x94\x86\x94u\x8c\x0cstorage_data\x94}\x94(h\x00\x8c\x0dMetadataIndex\x94\x93\x94)\x81\x94}\x94(\x8c\x03fqn\x94\x8c\x03row\x94\x8c\x05index\x94K\x00\x8c\x06offset\x94h!C\x00K\x00\x86\x94\x85\x94R\x94ub\x8c'torch.distributed.checkpoint.filesystem\x94\x8c\x0c_StorageInfo\x94\x93\x94)\x81\x94}\x94(\x8c\x0drelative_path\x94\x8c\x0c__0_0.distcp\x94h\x90K\x00\x8c\x06length\x94M\x9c\x04ubh\x8a)\x81\x94}\x94(h\x8d\x8c\x03col\x94h\x8fK\x00h\x90h!K\x00K\x00\x86\x94\x85\x94R\x94ubh\x96)\x81\x94}\x94(h\x99h\x9ah\x90M\x9c\x04h\x9bM\x9c\x04ubh\x8a)\x81\x94}\x94(h\x8d\x8c\x08obj.rank\x94h\x8fNubh\x96)\x81\x94}\x94(h\x99\x8c\x0c__1_0.distcp\x94h\x90K\x00h\x9bM`\x03ubh\x8a)\x81\x94}\x94(h\x8d\x8c\x03row\x94h\x8fK\x01h\x90h!K\x03K\x00\x86\x94\x85\x94R\x94ubh\x96)\x81\x94}\x94(h\x99h\xa9h\x90M`\x03h\x9bM\x9c\x04ubh\x8a)\x81\x94}\x94(h\x8d\x8c\x03col\x94h\x8fK\x01h\x90h!K\x00K\x03\x86\x94\x85\x94R\x94ubh\x96)\x81\x94}\x94(h\x99h\xa9h\x90M\xfc\x07h\x9bM\x9c\x04ubh\x8a)\x81\x94}\x94(h\x8d\x8c\x06rep_dt\x94h\x8fK\x00h\x90h!K\x00K\x00\x86\x94\x85\x94R\x94ubh\x96)\x81\x94}\x94(h\x99h\xa9h\x90M\x98\x0ch\x9bM\x9c\x04ubh\x8a)\x81\x94}\x94(h\x8d\x8c\x05plain\x94h\x8fK\x00h\x90h!K\x00\x85\x94\x85\x94R\x94ubh\x96)\x81\x94}\x94(h\x99h\xa9h\x90M4\x11h\x9bM\x9c\x04ubu\x8c\x0cstorage_meta\x94h\x00\x8c\x0bStorageMeta\x94\x93\x94)\x81\x94}\x94(\x8c\x0dcheckpoint_id\x94\x8c\x07pathlib\x94\x8c\x09PosixPath\x94\x93\x94\x8c\x04d241\x94\x85\x94R\x94\x8c\x07save_id\x94\x8c$1da98adb-4619-47f8-b0fb-267cc7319dc7\x94\x8c\x07load_id\x94Nubub.";
    let (v, _) = both(data);
    let v = v.desugar();
    assert!(!format!("{v:?}").contains("value: Bytes"), "{v:?}");
    for protocol in 2..=5 {
        let bytes = ckpt_pickle::encode(&v, protocol).unwrap();
        let back = ckpt_pickle::decode(&bytes).unwrap().desugar();
        assert_eq!(format!("{back:?}"), format!("{v:?}"), "protocol {protocol}");
    }
}

/// `bytearray(b)` where `b` is a shared object that desugars to bytes (`_codecs.encode('xyz\0þ', 'latin1')`,
/// memoized and fetched again; fuzz/artifacts/pickle/crash-e9d7a751...): `b` becomes bytes only when the
/// shared leaves are unshared, after `bytearray(b)` was looked at, so `desugar` repeats its rewrite until
/// nothing more is unshared. The result is a bytearray and bytes, and it re-encodes to itself at every
/// protocol.
#[test]
fn fuzz_a_bytearray_of_shared_bytes_desugars_whole() {
    let mut p = ckpt_pickle::Pickler::new(Vec::new(), 2).unwrap();
    p.empty_dict().unwrap();
    p.mark().unwrap();
    p.str("ba").unwrap();
    p.global("__builtin__", "bytearray").unwrap();
    p.global("_codecs", "encode").unwrap();
    p.str("xyz\0þ").unwrap();
    p.str("latin1").unwrap();
    p.tuple(2).unwrap();
    p.reduce().unwrap();
    let shared = p.memoize().unwrap();
    p.tuple(1).unwrap();
    p.reduce().unwrap();
    p.str("b").unwrap();
    p.get(shared).unwrap();
    p.setitems().unwrap();
    p.stop().unwrap();
    let data = p.finish().unwrap();
    let (v, _) = both(&data);
    let v = v.desugar();
    let bytes = b"xyz\0\xfe".to_vec();
    assert_eq!(
        v,
        Value::Dict(vec![
            (Value::Str("ba".into()), Value::ByteArray(bytes.clone())),
            (Value::Str("b".into()), Value::Bytes(bytes)),
        ]),
    );
    for protocol in 2..=5 {
        let encoded = ckpt_pickle::encode(&v, protocol).unwrap();
        let back = ckpt_pickle::decode(&encoded).unwrap().desugar();
        assert_eq!(format!("{back:?}"), format!("{v:?}"), "protocol {protocol}");
    }
}

/// A persistent id's object the pickle shares (`d = {}; r = persistent_load(d); d[r] = r`, fetched by DUP;
/// fuzz/artifacts/pickle/crash-8fc55395..., minimized): CPython's pickler would load it again at each place,
/// two objects where the pickle had one, so the encoder memoizes a shared one after loading it. The sharing
/// (a cycle through the dict) survives re-encoding at every protocol.
#[test]
fn fuzz_a_shared_persistent_id_stays_one_object_when_encoded_again() {
    let data = b"}q\x00(h\x00Q2u.";
    let (v, _) = both(data);
    let pid = Value::PersistentId(Box::new(Value::Ref(0)));
    let expected = Value::Shared {
        id: 0,
        value: Box::new(Value::Dict(vec![(Value::Shared { id: 1, value: Box::new(pid) }, Value::Ref(1))])),
    };
    assert_eq!(v, expected);
    for protocol in 2..=5 {
        let encoded = ckpt_pickle::encode(&v, protocol).unwrap();
        let back = ckpt_pickle::decode(&encoded).unwrap();
        assert_eq!(back, expected, "protocol {protocol}");
    }
}

/// A persistent id whose id holds the object it loads (`l = []; r = persistent_load(l); l.append(r)`)
/// decodes, but no pickle that loads `r` once can write it: the encoder says so instead of writing a second
/// load (or looping).
#[test]
fn a_persistent_id_inside_its_own_id_is_unencodable() {
    let mut p = ckpt_pickle::Pickler::new(Vec::new(), 2).unwrap();
    p.empty_list().unwrap();
    let l = p.memoize().unwrap();
    p.binpersid().unwrap();
    let r = p.memoize().unwrap();
    p.get(l).unwrap();
    p.get(r).unwrap();
    p.append().unwrap();
    p.tuple(2).unwrap();
    p.stop().unwrap();
    let data = p.finish().unwrap();
    let (v, _) = both(&data);
    let Value::Tuple(items) = &v else { panic!("{v:?}") };
    assert!(matches!(&items[0], Value::Shared { value, .. } if matches!(**value, Value::PersistentId(_))), "{v:?}");
    for protocol in 2..=5 {
        let e = ckpt_pickle::encode(&v, protocol).unwrap_err();
        assert!(e.to_string().contains("persistent id whose id holds"), "{e}");
    }
}

/// The limits count a reference to a shared object at the object's size when it is referenced
/// (fuzz/artifacts/pickle/crash-47d40c83...). A list `l` referenced 1,000 times by `m`, itself referenced
/// 1,000 times by `n`, counts about a million nodes while `l` is empty; grown to 100 items afterwards it is
/// the same value as one written whole first, which counts 100 million and is refused. The encoder (like
/// CPython's pickler) writes `l` whole before referring to it, so its pickle of the value decodes to the same
/// value only without the counting limits: what the fuzz target checks. The value itself holds `l` and `m`
/// once each (shared), so neither order copies anything.
#[test]
fn fuzz_a_reference_counts_the_size_of_its_object_when_it_is_referenced() {
    let mut p = ckpt_pickle::Pickler::new(Vec::new(), 2).unwrap();
    p.mark().unwrap();
    p.empty_list().unwrap();
    let l = p.memoize().unwrap();
    p.empty_list().unwrap();
    let m = p.memoize().unwrap();
    p.mark().unwrap();
    for _ in 0..1000 {
        p.get(l).unwrap();
    }
    p.appends().unwrap();
    p.empty_list().unwrap();
    p.mark().unwrap();
    for _ in 0..1000 {
        p.get(m).unwrap();
    }
    p.appends().unwrap();
    // l grows after a million references were counted at its empty size.
    p.get(l).unwrap();
    p.mark().unwrap();
    for i in 0..100 {
        p.int(i).unwrap();
    }
    p.appends().unwrap();
    p.tuple(4).unwrap();
    p.stop().unwrap();
    let data = p.finish().unwrap();
    let (v, _) = both(&data);
    let Value::Tuple(items) = &v else { panic!("{v:?}") };
    assert!(matches!(&items[0], Value::Shared { value, .. } if matches!(&**value, Value::List(l) if l.len() == 100)));
    let encoded = ckpt_pickle::encode(&v, 2).unwrap();
    let e = ckpt_pickle::decode(&encoded).unwrap_err();
    assert!(e.to_string().contains("materialised nodes"), "{e}");
    let uncounted = Limits { max_nodes: usize::MAX, max_alloc_bytes: usize::MAX, ..Limits::default() };
    let (back, _) = decode_with(&encoded, &uncounted).unwrap();
    assert_eq!(back, v);
}
