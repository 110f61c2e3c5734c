//! Decoding pickles written by CPython 3.11 (protocols 0-5) and hand-assembled Python 2 style pickles.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_pickle::{Error, Limits, Object, ObjectKind, Value, decode, decode_with};

fn h(hex: &str) -> Vec<u8> {
    assert!(hex.len() % 2 == 0);
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

fn s(text: &str) -> Value {
    Value::Str(text.to_owned())
}

fn g(module: &str, name: &str) -> Value {
    Value::global(module, name)
}

// obj = {'a': [1, 2.5, 'x', b'y', None, True, (1, 2, 3, 4)], 'b': {1, 2}}
fn sample() -> Value {
    Value::Dict(vec![
        (
            s("a"),
            Value::List(vec![
                Value::Int(1i64),
                Value::Float(f64::from_bits(0x4004000000000000)),
                s("x"),
                Value::Bytes(h("79")),
                Value::None,
                Value::Bool(true),
                Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64)]),
            ]),
        ),
        (s("b"), Value::Set(vec![Value::Int(1i64), Value::Int(2i64)])),
    ])
}
const SAMPLE: [&str; 6] = [
    "286470300a56610a70310a286c70320a49310a6146322e350a6156780a70330a61635f636f646563730a656e636f64650a70340a2856790a70350a566c6174696e310a70360a7470370a5270380a614e614930310a612849310a49320a49330a49340a7470390a617356620a7031300a635f5f6275696c74696e5f5f0a7365740a7031310a28286c7031320a49310a6149320a61747031330a527031340a732e",
    "7d71002858010000006171015d7102284b014740040000000000005801000000787103635f636f646563730a656e636f64650a710428580100000079710558060000006c6174696e3171067471075271084e4930310a284b014b024b034b0474710965580100000062710a635f5f6275696c74696e5f5f0a7365740a710b285d710c284b014b026574710d52710e752e",
    "80027d71002858010000006171015d7102284b014740040000000000005801000000787103635f636f646563730a656e636f64650a7104580100000079710558060000006c6174696e3171068671075271084e88284b014b024b034b0474710965580100000062710a635f5f6275696c74696e5f5f0a7365740a710b5d710c284b014b026585710d52710e752e",
    "80037d71002858010000006171015d7102284b01474004000000000000580100000078710343017971044e88284b014b024b034b04747105655801000000627106636275696c74696e730a7365740a71075d7108284b014b026585710952710a752e",
    "80049539000000000000007d94288c0161945d94284b014740040000000000008c017894430179944e88284b014b024b034b047494658c0162948f94284b014b0290752e",
    "80059539000000000000007d94288c0161945d94284b014740040000000000008c017894430179944e88284b014b024b034b047494658c0162948f94284b014b0290752e",
];
fn scalars() -> Value {
    Value::List(vec![
        Value::Int(0i64),
        Value::Int(255i64),
        Value::Int(256i64),
        Value::Int(65535i64),
        Value::Int(65536i64),
        Value::Int(-1i64),
        Value::Int(2147483647i64),
        Value::Int(-2147483648i64),
        Value::Int(2147483648i64),
        Value::Int(9223372036854775807i64),
        Value::Int(i64::MIN),
        Value::BigInt(h("000000000000000001")),
        Value::BigInt(h("fbffffffffffffffbf")),
        Value::BigInt(h("00000040eaed7446d09c2c9f0c")),
        Value::Bool(true),
        Value::Bool(false),
        Value::Float(f64::from_bits(0x7e37e43c8800759c)),
        Value::Float(f64::from_bits(0x8000000000000000)),
        Value::Float(f64::from_bits(0x7ff0000000000000)),
        s("\u{e9}\u{20ac}\u{1f600}\n\\"),
        s(""),
    ])
}
const SCALARS: [&str; 6] = [
    "286c70300a49300a61493235350a61493235360a614936353533350a614936353533360a61492d310a6149323134373438333634370a61492d323134373438333634380a614c323134373438333634384c0a614c393232333337323033363835343737353830374c0a614c2d393232333337323033363835343737353830384c0a614c31383434363734343037333730393535313631364c0a614c2d313138303539313632303731373431313330333432394c0a614c313030303030303030303030303030303030303030303030303030303030304c0a614930310a614930300a614631652b3330300a61462d302e300a6146696e660a6156e95c75323061635c5530303031663630305c75303030615c75303035630a70310a61560a70320a612e",
    "5d7100284b004bff4d00014dffff4a000001004affffffff4affffff7f4a000000804c323134373438333634384c0a4c393232333337323033363835343737353830374c0a4c2d393232333337323033363835343737353830384c0a4c31383434363734343037333730393535313631364c0a4c2d313138303539313632303731373431313330333432394c0a4c313030303030303030303030303030303030303030303030303030303030304c0a4930310a4930300a477e37e43c8800759c478000000000000000477ff0000000000000580b000000c3a9e282acf09f98800a5c710158000000007102652e",
    "80025d7100284b004bff4d00014dffff4a000001004affffffff4affffff7f4a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a09fbffffffffffffffbf8a0d00000040eaed7446d09c2c9f0c8889477e37e43c8800759c478000000000000000477ff0000000000000580b000000c3a9e282acf09f98800a5c710158000000007102652e",
    "80035d7100284b004bff4d00014dffff4a000001004affffffff4affffff7f4a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a09fbffffffffffffffbf8a0d00000040eaed7446d09c2c9f0c8889477e37e43c8800759c478000000000000000477ff0000000000000580b000000c3a9e282acf09f98800a5c710158000000007102652e",
    "80049591000000000000005d94284b004bff4d00014dffff4a000001004affffffff4affffff7f4a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a09fbffffffffffffffbf8a0d00000040eaed7446d09c2c9f0c8889477e37e43c8800759c478000000000000000477ff00000000000008c0bc3a9e282acf09f98800a5c948c0094652e",
    "80059591000000000000005d94284b004bff4d00014dffff4a000001004affffffff4affffff7f4a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a09fbffffffffffffffbf8a0d00000040eaed7446d09c2c9f0c8889477e37e43c8800759c478000000000000000477ff00000000000008c0bc3a9e282acf09f98800a5c948c0094652e",
];

#[test]
fn cpython_sample_all_protocols() {
    for (p, hex) in SAMPLE.iter().enumerate() {
        let data = h(hex);
        let (v, used) = decode_with(&data, &Limits::default()).unwrap();
        assert_eq!(used, data.len(), "protocol {p}");
        assert_eq!(v.desugar(), sample(), "protocol {p}");
    }
}

#[test]
fn cpython_sample_raw_forms() {
    // Protocol 2: bytes and set are REDUCE forms until desugared, with the Python 2 module names.
    let v = decode(&h(SAMPLE[2])).unwrap();
    let Value::Dict(pairs) = &v else { panic!("{v:?}") };
    let Value::List(a) = &pairs[0].1 else { panic!() };
    let obj = a[3].as_object().unwrap();
    assert_eq!(obj.callable_name(), Some(("_codecs", "encode")));
    assert_eq!(obj.kind, ObjectKind::Reduce);
    assert_eq!(obj.args, Value::Tuple(vec![s("y"), s("latin1")]));
    let set = pairs[1].1.as_object().unwrap();
    assert_eq!(set.callable_name(), Some(("__builtin__", "set")));
    // Protocol 3 uses the Python 3 name and real bytes.
    let v = decode(&h(SAMPLE[3])).unwrap();
    let Value::Dict(pairs) = &v else { panic!() };
    assert_eq!(pairs[1].1.as_object().unwrap().callable_name(), Some(("builtins", "set")));
    let Value::List(a) = &pairs[0].1 else { panic!() };
    assert_eq!(a[3], Value::Bytes(b"y".to_vec()));
    // Protocol 4 needs no desugaring at all.
    assert_eq!(decode(&h(SAMPLE[4])).unwrap(), sample());
    assert_eq!(decode(&h(SAMPLE[5])).unwrap(), sample());
}

#[test]
fn cpython_scalars_all_protocols() {
    for (p, hex) in SCALARS.iter().enumerate() {
        assert_eq!(decode(&h(hex)).unwrap(), scalars(), "protocol {p}");
    }
}

/// `data` decoded with Python 2 strings as bytes (`encoding='bytes'`).
fn bytes_decode(data: &[u8]) -> Value {
    let options = ckpt_pickle::Options::default().with_py2_strings(ckpt_pickle::Py2Strings::Bytes);
    ckpt_pickle::decode_options(data, &options).unwrap().0
}

/// Python 2 style (protocol 0/1) pickles; each was checked to load with CPython's `pickle.loads`.
#[test]
fn protocol_0_and_1_text_forms() {
    // INST with PUT/GET text memo: {'k': Foo('v'), 'k2': <same object>}; Python 2 strs read as torch.load
    // reads them (UTF-8 text), or as bytes when asked.
    let foo = |v: Value| Value::from(Object::new(ObjectKind::Inst, g("mod", "Foo"), Value::Tuple(vec![v])));
    let shared = |v: Value| Value::Shared { id: 0, value: Box::new(v) };
    let data = b"(dp0\nS'k'\np1\n(S'v'\nimod\nFoo\np2\nsS'k2'\ng2\ns.";
    assert_eq!(decode(data).unwrap(), Value::Dict(vec![(s("k"), shared(foo(s("v")))), (s("k2"), Value::Ref(0))]));
    assert_eq!(
        bytes_decode(data),
        Value::Dict(vec![
            (Value::Bytes(b"k".to_vec()), shared(foo(Value::Bytes(b"v".to_vec())))),
            (Value::Bytes(b"k2".to_vec()), Value::Ref(0))
        ])
    );
    // OBJ
    assert_eq!(
        decode(b"(cmod\nFoo\nI5\no.").unwrap(),
        Value::from(Object::new(ObjectKind::Obj, g("mod", "Foo"), Value::Tuple(vec![Value::Int(5)])))
    );
    // PERSID
    assert_eq!(decode(b"Pkey-1\n.").unwrap(), Value::PersistentId(Box::new(s("key-1"))));
    // LIST, PUT, POP, GET, POP_MARK, DUP
    let l = Value::List(vec![Value::Int(1), Value::Int(2)]);
    assert_eq!(decode(b"(I1\nI2\nlp0\n0g0\n(I9\n12\x86.").unwrap(), Value::Tuple(vec![shared(l), Value::Ref(0)]));
    // STRING escapes and quotes (as text, or as bytes when asked)
    assert_eq!(decode(b"S'a\\nb\\x00'\n.").unwrap(), s("a\nb\x00"));
    assert_eq!(bytes_decode(b"S'a\\nb\\x00'\n."), Value::Bytes(b"a\nb\x00".to_vec()));
    assert_eq!(decode(b"S\"it's\"\n.").unwrap(), s("it's"));
    // UNICODE (raw-unicode-escape)
    assert_eq!(decode(b"V\\u20ac\xe9\n.").unwrap(), s("\u{20ac}\u{e9}"));
    // LONG with and without the L suffix
    assert_eq!(decode(b"L123456789012345678901234567890L\n.").unwrap(), Value::BigInt(h("d20a3f4eeee073c3f60fe98e01")));
    assert_eq!(decode(b"L-5\n.").unwrap(), Value::Int(-5));
    // FLOAT text
    assert_eq!(decode(b"F-1.25e-3\n.").unwrap(), Value::Float(-1.25e-3));
    assert_eq!(decode(b"Finf\n.").unwrap(), Value::Float(f64::INFINITY));
    assert!(decode(b"Fnan\n.").unwrap().as_float().unwrap().is_nan());
    // INT: booleans, C strtol octal, overflow to big int
    assert_eq!(
        decode(b"(I01\nI00\nI010\nI99999999999999999999\nI-3\nl.").unwrap(),
        Value::List(vec![
            Value::Bool(true),
            Value::Bool(false),
            Value::Int(8),
            Value::BigInt(h("ffff0f632d5ec76b05")),
            Value::Int(-3)
        ])
    );
    // BINSTRING / SHORT_BINSTRING
    assert_eq!(decode(b"(T\x03\x00\x00\x00abcU\x02hit.").unwrap(), Value::Tuple(vec![s("abc"), s("hi")]));
    assert_eq!(
        bytes_decode(b"(T\x03\x00\x00\x00abcU\x02hit."),
        Value::Tuple(vec![Value::Bytes(b"abc".to_vec()), Value::Bytes(b"hi".to_vec())])
    );
    // DICT, SETITEMS, EMPTY_SET/ADDITEMS
    assert_eq!(decode(b"(I1\nI2\nd.").unwrap(), Value::Dict(vec![(Value::Int(1), Value::Int(2))]));
    assert_eq!(
        decode(b"}(K\x01K\x02K\x03K\x04u.").unwrap(),
        Value::Dict(vec![(Value::Int(1), Value::Int(2)), (Value::Int(3), Value::Int(4))])
    );
    assert_eq!(decode(b"\x8f(K\x01K\x02\x90.").unwrap(), Value::Set(vec![Value::Int(1), Value::Int(2)]));
}

#[test]
fn protocol_4_newobj_ex_with_shared_args() {
    // CPython: pickle.dumps(K(1, b=2), 4) for a class with __getnewargs_ex__; the state dict refers to the
    // memoized args tuple and kwargs dict.
    let data = h(
        "8004952e000000000000008c036d6f64948c014b9493944b0185947d948c0162944b027392947d94288c01619468038c026b7794680475622e",
    );
    let args = Value::Tuple(vec![Value::Int(1)]);
    let kwargs = Value::Dict(vec![(s("b"), Value::Int(2))]);
    // The args tuple is immutable (copied); the kwargs dict is one object referred to twice.
    let expected = Value::from(
        Object::new(
            ObjectKind::NewObjEx { kwargs: Value::Shared { id: 0, value: Box::new(kwargs) } },
            g("mod", "K"),
            args.clone(),
        )
        .with_state(Value::Dict(vec![(s("a"), args), (s("kw"), Value::Ref(0))])),
    );
    assert_eq!(decode(&data).unwrap(), expected);
}

#[test]
fn protocol_5_bytearray8_and_protocol_4_bytearray_reduce() {
    assert_eq!(
        decode(&h("8005950d000000000000009602000000000000006162942e")).unwrap(),
        Value::ByteArray(b"ab".to_vec())
    );
    let v = decode(&h("8004952c000000000000005d94288c086275696c74696e73948c096279746561727261799493944302616294859452946803295294652e")).unwrap();
    assert_eq!(v.desugar(), Value::List(vec![Value::ByteArray(b"ab".to_vec()), Value::ByteArray(vec![])]));
}

#[test]
fn trailing_data_is_not_consumed() {
    let mut data = h(SAMPLE[4]);
    let n = data.len();
    data.extend_from_slice(b"\x80\x02N.garbage");
    let (v, used) = decode_with(&data, &Limits::default()).unwrap();
    assert_eq!(used, n);
    assert_eq!(v, sample());
    // Concatenated pickles (the legacy torch format) are read one after the other.
    let (v2, used2) = decode_with(&data[used..], &Limits::default()).unwrap();
    assert_eq!((v2, used2), (Value::None, 4));
}

#[test]
fn decode_error_is_not_a_panic_for_empty_input() {
    assert!(matches!(decode(b""), Err(Error::NoStop { offset: 0 })));
}
