//! Hostile and malformed input: every error variant, every limit, memo bombs, deep nesting, truncation, fuzzing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_pickle::{
    EncodeOptions, Error, ErrorKind, Limits, Object, ObjectKind, Value, decode, decode_with, encode, encode_into,
};

fn s(text: &str) -> Value {
    Value::Str(text.to_owned())
}

fn err(data: &[u8]) -> Error {
    match decode(data) {
        Ok(v) => panic!("expected an error for {data:02x?}, got {v:?}"),
        Err(e) => e,
    }
}

fn err_with(data: &[u8], limits: &Limits) -> Error {
    match decode_with(data, limits) {
        Ok((v, _)) => panic!("expected an error for {data:02x?}, got {v:?}"),
        Err(e) => e,
    }
}

/// Deterministic xorshift64* generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Representative valid pickles (CPython 3.11 output, protocols 0-5, plus a torch-style data.pkl).
fn corpus() -> Vec<Vec<u8>> {
    let sample = Value::Dict(vec![
        (s("a"), Value::List(vec![Value::Int(1), Value::Float(2.5), s("x"), Value::Bytes(b"y".to_vec()), Value::None])),
        (s("b"), Value::Set(vec![Value::Int(1), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1])])),
        (
            s("o"),
            Value::from(
                Object::new_obj(Value::global("m", "C"), Value::Tuple(vec![]))
                    .with_state(Value::Dict(vec![(s("k"), Value::Tuple(vec![Value::Int(1), Value::Int(2)]))])),
            ),
        ),
        (s("p"), Value::PersistentId(Box::new(Value::Tuple(vec![s("storage"), Value::Int(3)])))),
    ]);
    let mut out: Vec<Vec<u8>> = (2..=5).map(|p| encode(&sample, p).unwrap()).collect();
    out.push(b"(dp0\nS'k'\np1\n(S'v'\nimod\nFoo\np2\nsS'k2'\ng2\ns.".to_vec());
    out.push(b"(I1\nI2\nlp0\n0g0\n(I9\n12\x86.".to_vec());
    out.push(b"(I01\nI00\nI010\nI99999999999999999999\nL-5\nF1.5\nV\\u20ac\nPpid\n(cmod\nFoo\nI5\nol.".to_vec());
    out
}

#[test]
fn error_unexpected_eof_and_huge_lengths_do_not_allocate() {
    // A BINUNICODE8 / BINBYTES8 / BYTEARRAY8 / FRAME claiming 2^60 bytes fails before allocating anything.
    for op in [0x8du8, 0x8e, 0x96, 0x95] {
        let mut data = vec![0x80, 4, op];
        data.extend_from_slice(&(1u64 << 60).to_le_bytes());
        data.extend_from_slice(b"abc.");
        match err(&data) {
            Error::UnexpectedEof { offset: 11, needed } => assert_eq!(needed, (1u64 << 60) - 4),
            e => panic!("{op:#x}: {e:?}"),
        }
    }
    // 32-bit lengths.
    for data in [&b"X\xff\xff\xff\xffab"[..], b"B\xff\xff\xff\xff.", b"T\xff\xff\xff\x7f.", b"\x8b\xff\xff\xff\x7f."] {
        assert!(matches!(err(data), Error::UnexpectedEof { offset: 5, .. }), "{data:02x?}");
    }
    // Truncated fixed-size arguments and lines.
    assert!(matches!(err(b"J\x01\x02"), Error::UnexpectedEof { offset: 1, needed: 2 }));
    assert!(matches!(err(b"G\x00"), Error::UnexpectedEof { offset: 1, needed: 7 }));
    assert!(matches!(err(b"I12"), Error::UnexpectedEof { offset: 3, needed: 1 }));
    assert!(matches!(err(b"cmod\nname"), Error::UnexpectedEof { .. }));
}

#[test]
fn error_unknown_opcode() {
    assert!(matches!(err(b"\x80\x02\xff."), Error::UnknownOpcode { offset: 2, opcode: 0xff }));
    assert!(matches!(err(b"N\x99"), Error::UnknownOpcode { offset: 1, opcode: 0x99 }));
}

#[test]
fn error_stack_underflow() {
    assert!(matches!(err(b"a."), Error::StackUnderflow { offset: 0, opcode: "APPEND" }));
    assert!(matches!(err(b"."), Error::StackUnderflow { offset: 0, opcode: "STOP" }));
    // Items below a MARK are out of reach.
    assert!(matches!(err(b"](Na"), Error::StackUnderflow { offset: 3, opcode: "APPEND" }));
    assert!(matches!(err(b"N(\x85"), Error::StackUnderflow { offset: 2, opcode: "TUPLE1" }));
    assert!(matches!(err(b"NR."), Error::StackUnderflow { opcode: "REDUCE", .. }));
    assert!(matches!(err(b"(o."), Error::StackUnderflow { opcode: "OBJ", .. }));
    assert!(matches!(err(b"(Ne."), Error::StackUnderflow { opcode: "APPENDS", .. }));
    assert!(matches!(err(b"2."), Error::StackUnderflow { opcode: "DUP", .. }));
    assert!(matches!(err(b"q\x00."), Error::StackUnderflow { opcode: "BINPUT", .. }));
    assert!(matches!(err(b"0."), Error::StackUnderflow { opcode: "POP", .. }));
}

#[test]
fn error_mark_not_found() {
    assert!(matches!(err(b"N1."), Error::MarkNotFound { offset: 1, opcode: "POP_MARK" }));
    assert!(matches!(err(b"]Ne."), Error::MarkNotFound { offset: 2, opcode: "APPENDS" }));
    assert!(matches!(err(b"Nt."), Error::MarkNotFound { opcode: "TUPLE", .. }));
    assert!(matches!(err(b"}NNu."), Error::MarkNotFound { opcode: "SETITEMS", .. }));
    assert!(matches!(err(b"imod\nC\n."), Error::MarkNotFound { opcode: "INST", .. }));
}

#[test]
fn error_memo_missing() {
    assert!(matches!(err(b"h\x05."), Error::MemoMissing { offset: 0, key: 5 }));
    assert!(matches!(err(b"j\x00\x01\x00\x00."), Error::MemoMissing { key: 256, .. }));
    assert!(matches!(err(b"g7\n."), Error::MemoMissing { key: 7, .. }));
}

#[test]
fn error_trailing_mark_and_no_stop() {
    assert!(matches!(err(b"(N."), Error::TrailingMark { offset: 2, marks: 1 }));
    assert!(matches!(err(b"N"), Error::NoStop { offset: 1 }));
    assert!(matches!(err(b""), Error::NoStop { offset: 0 }));
    // POP with a MARK on top of the stack pops the MARK (CPython's behaviour), so this is fine.
    assert_eq!(decode(b"(0N.").unwrap(), Value::None);
}

#[test]
fn recursive_structures_decode_as_shared_objects() {
    // A list appended to itself, a dict containing itself, an object whose state is itself: one object,
    // defined where it first appears and referred to from inside.
    let shared = |v: Value| Value::Shared { id: 0, value: Box::new(v) };
    assert_eq!(decode(b"]q\x00h\x00a.").unwrap(), shared(Value::List(vec![Value::Ref(0)])));
    assert_eq!(decode(b"}q\x00K\x01h\x00s.").unwrap(), shared(Value::Dict(vec![(Value::Int(1), Value::Ref(0))])));
    assert_eq!(
        decode(b"cmod\nC\n)\x81q\x00h\x00b.").unwrap(),
        shared(Value::from(Object::new_obj(Value::global("mod", "C"), Value::Tuple(vec![])).with_state(Value::Ref(0))))
    );
    // A cycle that is not reachable from the result is harmless.
    assert_eq!(decode(b"]q\x00h\x00a0N.").unwrap(), Value::None);
}

#[test]
fn error_invalid_utf8() {
    // UTF-8-encoded lone surrogate (what CPython writes with surrogatepass).
    assert!(matches!(err(b"X\x03\x00\x00\x00\xed\xa0\x80."), Error::InvalidUtf8 { offset: 5 }));
    assert!(matches!(err(b"\x8c\x02a\xff."), Error::InvalidUtf8 { offset: 3 }));
    assert!(matches!(err(b"V\\ud800\n."), Error::InvalidUtf8 { offset: 1 }));
    assert!(matches!(err(b"c\xff\nname\n."), Error::InvalidUtf8 { .. }));
}

#[test]
fn error_bad_text() {
    for data in [
        &b"Fabc\n."[..],
        b"F 1.5\n.",
        b"I\n.",
        b"Iabc\n.",
        b"L\n.",
        b"L12x\n.",
        b"S'abc\n.",
        b"S'\\x4'\n.",
        b"V\\u12\n.",
        b"gx\n.",
        b"g-1\n.",
        b"Np-1\n.",
        b"c\nname\n.",
        b"cmod\n\n.",
        b"P\xff\n.",
    ] {
        assert!(matches!(err(data), Error::BadText { .. }), "{data:?}");
    }
}

#[test]
fn error_unsupported() {
    assert!(matches!(err(b"\x82\x01."), Error::Unsupported { offset: 0, .. }));
    assert!(matches!(err(b"\x83\x01\x00."), Error::Unsupported { .. }));
    assert!(matches!(err(b"\x84\x01\x00\x00\x00."), Error::Unsupported { .. }));
    assert!(matches!(err(b"\x97."), Error::Unsupported { .. }));
    assert!(matches!(err(b"C\x01a\x98."), Error::Unsupported { offset: 3, .. }));
    assert!(matches!(err(b"\x80\x06N."), Error::Unsupported { offset: 0, .. }));
    assert_eq!(err(b"\x97.").kind(), ErrorKind::Unsupported);
}

#[test]
fn error_bad_operand() {
    assert!(matches!(err(b")Na."), Error::BadOperand { offset: 2, opcode: "APPEND", .. }));
    assert!(matches!(err(b"K\x01K\x02\x93."), Error::BadOperand { opcode: "STACK_GLOBAL", .. }));
    assert!(matches!(err(b"]Nb."), Error::BadOperand { opcode: "BUILD", .. }));
    assert!(matches!(err(b"](N\x90."), Error::BadOperand { opcode: "ADDITEMS", .. }));
    assert!(matches!(err(b")NNs."), Error::BadOperand { opcode: "SETITEM", .. }));
    assert!(matches!(err(b"N(NNu."), Error::BadOperand { opcode: "SETITEMS", .. }));
}

#[test]
fn error_malformed() {
    assert!(matches!(err(b"}(Nu."), Error::Malformed { offset: 3, .. }));
    assert!(matches!(err(b"(Nd."), Error::Malformed { .. }));
    assert!(matches!(err(b"\x8b\xff\xff\xff\xff."), Error::Malformed { offset: 0, .. }));
    assert!(matches!(err(b"T\xff\xff\xff\xff."), Error::Malformed { .. }));
    assert_eq!(err(b"(Nd.").kind(), ErrorKind::Malformed);
}

#[test]
fn limits_each_one() {
    let small = |f: fn(&mut Limits)| {
        let mut l = Limits::default();
        f(&mut l);
        l
    };
    let limit_what = |e: Error| match e {
        Error::Limit { what, .. } => what,
        e => panic!("{e:?}"),
    };
    // memo entries
    let l = small(|l| l.max_memo = 2);
    assert_eq!(limit_what(err_with(b"Nq\x00q\x01q\x02.", &l)), "memo entries");
    assert!(decode_with(b"Nq\x00q\x01q\x00.", &l).is_ok()); // overwriting a key is not a new entry
    // VM nodes
    let l = small(|l| l.max_nodes = 3);
    assert_eq!(limit_what(err_with(b"]]]].", &l)), "nodes");
    // payload bytes (VM)
    let l = small(|l| l.max_alloc_bytes = 4);
    assert_eq!(limit_what(err_with(b"\x8c\x05hello.", &l)), "payload bytes");
    // container length
    let l = small(|l| l.max_container_len = 3);
    assert_eq!(limit_what(err_with(b"](NNe(NNe.", &l)), "container length");
    assert_eq!(limit_what(err_with(b"NNNN.", &l)), "stack items");
    // decimal digits of INT/LONG text
    let mut long = b"L".to_vec();
    long.extend(std::iter::repeat_n(b'7', 5000));
    long.extend_from_slice(b"\n.");
    assert_eq!(limit_what(err(&long)), "integer text digits");
    // mark depth
    let l = small(|l| l.max_mark_depth = 3);
    assert!(matches!(err_with(b"((((", &l), Error::DepthExceeded { limit: 3, offset: 3 }));
    // materialised depth: refused at the APPEND that nests the value too deep
    let l = small(|l| l.max_depth = 3);
    assert!(decode_with(b"]]]aa.", &l).is_ok());
    assert!(matches!(err_with(b"]]]]aaa.", &l), Error::DepthExceeded { limit: 3, offset: 6 }));
    assert_eq!(err_with(b"]]]]aaa.", &l).kind(), ErrorKind::Limit);
}

#[test]
fn limit_defaults_are_documented_values() {
    let l = Limits::default();
    assert_eq!(l.max_depth, 1000);
    assert_eq!(l.max_mark_depth, 1000);
    assert_eq!(l.max_memo, 1 << 24);
    assert_eq!(l.max_container_len, 1 << 25);
    assert_eq!(l.max_nodes, 1 << 25);
    assert_eq!(l.max_alloc_bytes as u64, 4u64 << 30);
    assert_eq!(l.max_int_digits, 4300);
    assert_eq!(Limits::trusted().max_depth, 1000);
    assert_eq!(Limits::trusted().max_nodes, usize::MAX);
}

#[test]
fn memo_bomb_fails_fast() {
    // x0 = None; x(i+1) = [x(i), x(i)] for 40 levels: 2^41 values described in ~300 bytes.
    let mut data = b"\x80\x02Nq\x00".to_vec();
    for i in 0u8..40 {
        data.extend_from_slice(&[b']', b'(', b'h', i, b'h', i, b'e', b'q', i + 1]);
    }
    data.push(b'.');
    match err(&data) {
        Error::Limit { what: "materialised nodes", limit, .. } => assert_eq!(limit, 1 << 25),
        e => panic!("{e:?}"),
    }

    // A 1 MiB string referenced 5000 times: 5 GiB of copies from 1 MiB of input.
    let mut data = b"\x80\x02X\x00\x00\x10\x00".to_vec();
    data.extend(std::iter::repeat_n(b'z', 1 << 20));
    data.extend_from_slice(b"q\x00](");
    for _ in 0..5000 {
        data.extend_from_slice(b"h\x00");
    }
    data.extend_from_slice(b"e.");
    assert!(matches!(err(&data), Error::Limit { what: "materialised payload bytes", .. }));

    // Moderate sharing within the limits: each list is one object, defined once and referred to once more;
    // tuples (immutable) are copies.
    let mut data = b"\x80\x02Nq\x00".to_vec();
    for i in 0u8..10 {
        data.extend_from_slice(&[b']', b'(', b'h', i, b'h', i, b'e', b'q', i + 1]);
    }
    data.push(b'.');
    let v = decode(&data).unwrap();
    let mut depth = 0;
    let mut cur = &v;
    loop {
        let list = match cur {
            Value::Shared { value, .. } => &**value,
            other => other,
        };
        let Value::List(items) = list else { break };
        assert_eq!(items.len(), 2);
        match (&items[0], &items[1]) {
            (Value::Shared { id, .. }, Value::Ref(r)) => assert_eq!(id, r),
            (Value::None, Value::None) => {}
            other => panic!("{other:?}"),
        }
        cur = &items[0];
        depth += 1;
    }
    assert_eq!(depth, 10);
    let mut data = b"\x80\x02Nq\x00".to_vec();
    for i in 0u8..10 {
        data.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1]);
    }
    data.push(b'.');
    let v = decode(&data).unwrap();
    let mut cur = &v;
    let mut depth = 0;
    while let Value::Tuple(items) = cur {
        assert_eq!(items[0], items[1]);
        cur = &items[0];
        depth += 1;
    }
    assert_eq!(depth, 10);
}

#[test]
fn million_deep_nesting_fails_cleanly() {
    let n = 1_000_000;
    // ]]]]...aaaa. : lists nested a million deep.
    let mut data = vec![b']'; n];
    data.extend(std::iter::repeat_n(b'a', n - 1));
    data.push(b'.');
    assert!(matches!(err(&data), Error::DepthExceeded { limit: 1000, .. }));
    // N then a million TUPLE1: tuples nested a million deep.
    let mut data = vec![b'N'];
    data.extend(std::iter::repeat_n(0x85u8, n));
    data.push(b'.');
    assert!(matches!(err(&data), Error::DepthExceeded { limit: 1000, .. }));
    // (((( ... : a million open MARKs.
    let data = vec![b'('; n];
    assert!(matches!(err(&data), Error::DepthExceeded { limit: 1000, offset: 1000 }));
    // f(f(f(...f(None)...))) 20000 calls deep, written inside out: each level opens a MARK after the global
    // and closes it with TUPLE + REDUCE.
    let levels = 20_000;
    let mut inner = b"cm\nf\n(".repeat(levels);
    inner.push(b'N');
    inner.extend(b"tR".repeat(levels));
    inner.push(b'.');
    let l = Limits { max_mark_depth: usize::MAX, ..Limits::default() };
    assert!(matches!(err_with(&inner, &l), Error::DepthExceeded { limit: 1000, .. }));
}

#[test]
fn depth_at_the_limit_round_trips() {
    // 999 lists around an int: depth 1000 exactly (the default limit), in a 2 MiB test thread.
    let mut v = Value::Int(1);
    for _ in 0..999 {
        v = Value::List(vec![v]);
    }
    for p in 2..=5 {
        let data = encode(&v, p).unwrap();
        assert_eq!(decode(&data).unwrap(), v);
    }
    let deeper = Value::List(vec![v]);
    assert!(matches!(err(&encode(&deeper, 2).unwrap()), Error::DepthExceeded { limit: 1000, .. }));
    // 499 nested REDUCE objects (object + args tuple per level).
    let mut o = Value::Int(1);
    for _ in 0..499 {
        o = Object::reduce(Value::global("m", "f"), Value::Tuple(vec![o])).into();
    }
    let data = encode(&o, 4).unwrap();
    let back = decode(&data).unwrap();
    assert_eq!(back, o);
    assert_eq!(back.clone().desugar(), o);
}

#[test]
fn every_truncation_is_an_error() {
    for data in corpus() {
        assert!(decode(&data).is_ok());
        for n in 0..data.len() {
            assert!(decode(&data[..n]).is_err(), "prefix {n} of {data:02x?}");
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Opcode-heavy alphabet so that inputs get past the first byte.
    let alphabet: Vec<u8> = (0u8..=255).filter(|&b| ckpt_pickle::opcode::name(b).is_some()).collect();
    let mut ok = 0;
    for i in 0..20_000 {
        let len = rng.below(48);
        let data: Vec<u8> =
            (0..len).map(|_| if i % 2 == 0 { alphabet[rng.below(alphabet.len())] } else { rng.next() as u8 }).collect();
        if decode(&data).is_ok() {
            ok += 1;
        }
    }
    assert!(ok > 0);
    // Mutations of valid pickles.
    let corpus = corpus();
    for _ in 0..20_000 {
        let mut data = corpus[rng.below(corpus.len())].clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(data.len());
            match rng.below(3) {
                0 => data[at] = rng.next() as u8,
                1 => data[at] = alphabet[rng.below(alphabet.len())],
                _ => {
                    data.remove(at);
                }
            }
            if data.is_empty() {
                break;
            }
        }
        let _ = decode(&data);
        let _ = ckpt_pickle::opcode::scan(&data);
    }
}

#[test]
fn reference_semantics_of_the_memo() {
    // torch-save spec §5.10: {'x': inner, 'y': inner} with inner memoized while empty and filled afterwards.
    let data =
        b"\x80\x02}q\x00(X\x01\x00\x00\x00xq\x01}q\x02X\x01\x00\x00\x00aq\x03K\x01sX\x01\x00\x00\x00yq\x04h\x02u.";
    let inner = Value::Dict(vec![(s("a"), Value::Int(1))]);
    let shared = |v: Value| Value::Shared { id: 0, value: Box::new(v) };
    assert_eq!(decode(data).unwrap(), Value::Dict(vec![(s("x"), shared(inner)), (s("y"), Value::Ref(0))]));
    // Mutation after the alias was taken: [d, d] first, then d['a'] = 1.
    let data = b"\x80\x02]q\x00(}q\x01h\x01eh\x01X\x01\x00\x00\x00aK\x01s0.";
    let d = Value::Dict(vec![(s("a"), Value::Int(1))]);
    assert_eq!(decode(data).unwrap(), Value::List(vec![shared(d), Value::Ref(0)]));
    // BUILD on a memoized object is seen through every alias (DCP spec §3.2).
    let data = b"\x80\x02cm\nC\n)\x81q\x00]q\x01(h\x00h\x00eh\x00}X\x01\x00\x00\x00kK\x07sb0.";
    let o = Value::from(
        Object::new_obj(Value::global("m", "C"), Value::Tuple(vec![]))
            .with_state(Value::Dict(vec![(s("k"), Value::Int(7))])),
    );
    assert_eq!(decode(data).unwrap(), Value::List(vec![shared(o), Value::Ref(0)]));
}

#[test]
fn several_builds_merge_dict_states() {
    let data = b"cm\nC\n)\x81}X\x01\x00\x00\x00aK\x01sb}X\x01\x00\x00\x00bK\x02sb.";
    let o = decode(data).unwrap();
    assert_eq!(o.as_object().unwrap().state, Some(Value::Dict(vec![(s("a"), Value::Int(1)), (s("b"), Value::Int(2))])));
    let data = b"cm\nC\n)\x81}X\x01\x00\x00\x00aK\x01sbK\x05b.";
    assert_eq!(decode(data).unwrap().as_object().unwrap().state, Some(Value::Int(5)));
    // APPEND / SETITEM on an object are recorded, not executed.
    let data = b"cm\nC\n)RK\x01a(K\x02K\x03eX\x01\x00\x00\x00kNs.";
    let o = decode(data).unwrap();
    let o = o.as_object().unwrap();
    assert_eq!(o.kind, ObjectKind::Reduce);
    assert_eq!(o.list_items, vec![Value::Int(1), Value::Int(2), Value::Int(3)]);
    assert_eq!(o.dict_items, vec![(s("k"), Value::None)]);
}

#[test]
fn encoder_errors() {
    let v = Value::None;
    for p in [0, 1, 6] {
        assert!(matches!(encode(&v, p), Err(Error::Unencodable { protocol, .. }) if protocol == p));
    }
    let ex = Value::from(Object::new(
        ObjectKind::NewObjEx { kwargs: Value::Dict(vec![]) },
        Value::global("m", "C"),
        Value::Tuple(vec![]),
    ));
    assert!(matches!(encode(&ex, 2), Err(Error::Unencodable { protocol: 2, .. })));
    assert!(encode(&ex, 4).is_ok());
    let inst = Value::from(Object::new(ObjectKind::Inst, Value::None, Value::Tuple(vec![])));
    assert!(matches!(encode(&inst, 2), Err(Error::Unencodable { .. })));
    let obj = Value::from(Object::new(ObjectKind::Obj, Value::global("m", "C"), Value::None));
    assert!(matches!(encode(&obj, 2), Err(Error::Unencodable { .. })));
    assert!(matches!(encode(&Value::global("a\nb", "c"), 2), Err(Error::Unencodable { .. })));
    assert!(matches!(encode(&Value::global("mod", "é"), 2), Err(Error::Unencodable { .. })));
    assert!(encode(&Value::global("mod", "é"), 3).is_ok());
    assert!(encode(&Value::global("mod", "é"), 4).is_ok());
    assert_eq!(encode(&obj, 2).unwrap_err().kind(), ErrorKind::InvalidArgument);

    struct Failing;
    impl std::io::Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let r = encode_into(&Value::None, Failing, &EncodeOptions::new(2));
    match r {
        Err(e @ Error::Io(_)) => assert_eq!(e.kind(), ErrorKind::Io),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("writing to a failing writer succeeded"),
    }
}
