//! The pickle machine and its builders: the value builder (what every format reads through) against the
//! graph builder (the reference: every object an arena node) on tens of thousands of mutated pickles; shared
//! objects and cycles decoded from CPython's bytes and encoded back to them; Python 2 strings under every
//! `Py2Strings` choice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_pickle::{Error, GraphBuilder, Limits, Object, Options, Py2Strings, Value, decode, decode_with, encode};

fn s(text: &str) -> Value {
    Value::Str(text.to_owned())
}

fn h(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

/// `data` through the graph builder: its value and end, or its error.
fn graph(data: &[u8], limits: &Limits) -> Result<(Value, usize), Error> {
    let mut g = GraphBuilder::default();
    let (root, end) = ckpt_pickle::run(data, &Options::from(*limits), &mut g)?;
    Ok((g.graph().to_value(root, limits.max_depth)?, end))
}

/// Both builders on `data`: the same value (Debug, so NaNs compare) and end, or the same error message.
/// Whether it decoded.
fn agree(data: &[u8], limits: &Limits) -> bool {
    match (decode_with(data, limits), graph(data, limits)) {
        (Ok((a, x)), Ok((b, y))) => {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{data:02x?}");
            assert_eq!(x, y, "{data:02x?}");
            true
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "{data:02x?}");
            false
        }
        (a, b) => panic!("{data:02x?}: value builder {a:?}, graph builder {b:?}"),
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

/// CPython's pickles of shared objects and cycles (`pickle.dumps(obj, 2)`, CPython 3.11), with the value
/// each decodes to.
fn shared_and_cyclic() -> Vec<(&'static str, &'static str, Value)> {
    let shared = |id, v| Value::Shared { id, value: Box::new(v) };
    vec![
        // l = []; l.append(l)
        ("self_list", "80025d71006800612e", shared(0, Value::List(vec![Value::Ref(0)]))),
        // d = {}; d['me'] = d
        ("self_dict", "80027d710058020000006d6571016800732e", shared(0, Value::Dict(vec![(s("me"), Value::Ref(0))]))),
        // t = ([],); t[0].append(t): the tuple is made before its list holds it, then fetched from the memo
        (
            "recursive_tuple",
            "80025d71006800857101613068012e",
            shared(0, Value::Tuple(vec![Value::List(vec![Value::Ref(0)])])),
        ),
        // x = [1]; {'a': x, 'b': x}
        (
            "shared_list",
            "80027d71002858010000006171015d71024b016158010000006271036802752e",
            Value::Dict(vec![(s("a"), shared(0, Value::List(vec![Value::Int(1)]))), (s("b"), Value::Ref(0))]),
        ),
        // parent = {'children': [child]}, child = {'parent': parent}; {'root': parent, 'child': child}
        (
            "parent_link",
            "80027d7100285804000000726f6f7471017d710258080000006368696c6472656e71035d71047d71055806000000706172656e747106680273617358050000006368696c6471076805752e",
            Value::Dict(vec![
                (
                    s("root"),
                    shared(
                        0,
                        Value::Dict(vec![(
                            s("children"),
                            Value::List(vec![shared(1, Value::Dict(vec![(s("parent"), Value::Ref(0))]))]),
                        )]),
                    ),
                ),
                (s("child"), Value::Ref(1)),
            ]),
        ),
    ]
}

#[test]
fn cpython_shared_objects_and_cycles_decode_and_encode_to_the_same_bytes() {
    for (name, hex, want) in shared_and_cyclic() {
        let bytes = h(hex);
        assert_eq!(decode(&bytes).unwrap(), want, "{name}");
        assert!(agree(&bytes, &Limits::default()), "{name}");
        assert_eq!(encode(&want, 2).unwrap(), bytes, "{name}: not CPython's bytes");
        for protocol in 3..=5 {
            assert_eq!(decode(&encode(&want, protocol).unwrap()).unwrap(), want, "{name}, protocol {protocol}");
        }
    }
}

/// The pickles the mutations start from: CPython's shared and cyclic pickles, values with objects, sets and
/// big integers at every protocol, and protocol 0 text forms.
fn corpus() -> Vec<Vec<u8>> {
    let object = Value::from(
        Object::new_obj(Value::global("m", "C"), Value::Tuple(vec![]))
            .with_state(Value::Dict(vec![(s("k"), Value::Tuple(vec![Value::Int(1), Value::Int(2)]))])),
    );
    let sample = Value::Dict(vec![
        (s("a"), Value::List(vec![Value::Int(1), Value::Float(2.5), s("x"), Value::Bytes(b"y".to_vec()), Value::None])),
        (s("b"), Value::Set(vec![Value::Int(1), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1])])),
        (s("o"), object),
        (s("p"), Value::PersistentId(Box::new(Value::Tuple(vec![s("storage"), Value::Int(3)])))),
    ]);
    let mut out: Vec<Vec<u8>> = shared_and_cyclic().into_iter().map(|(_, hex, _)| h(hex)).collect();
    for (_, _, v) in shared_and_cyclic() {
        out.extend((3..=5).map(|p| encode(&v, p).unwrap()));
    }
    out.extend((2..=5).map(|p| encode(&sample, p).unwrap()));
    out.push(b"(dp0\nS'k'\np1\n(S'v'\nimod\nFoo\np2\nsS'k2'\ng2\ns.".to_vec());
    out.push(b"(I1\nI2\nlp0\n0g0\n(I9\n12\x86.".to_vec());
    out.push(b"(lp0\ng0\na(dp1\nS'up'\np2\ng0\nsa.".to_vec());
    out
}

/// 40 000 mutations (bytes replaced, flipped, dropped, duplicated; memo indices and opcodes among the
/// replacements): the value builder and the graph builder give the same value or the same error.
#[test]
fn the_value_and_graph_builders_agree_on_mutated_pickles() {
    let corpus = corpus();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let limits = Limits::default();
    let small = Limits { max_nodes: 4096, max_depth: 64, ..Limits::default() };
    let (mut decoded, mut failed) = (0, 0);
    for i in 0..40_000 {
        let mut data = corpus[rng.below(corpus.len())].clone();
        for _ in 0..=rng.below(3) {
            if data.is_empty() {
                break;
            }
            let at = rng.below(data.len());
            match rng.below(5) {
                0 => data[at] = rng.next() as u8,
                1 => data[at] ^= 1 << rng.below(8),
                2 => {
                    data.remove(at);
                }
                3 => {
                    // A memo fetch or an opcode that mutates what it reaches.
                    let op = [b'h', b'q', b'a', b'e', b's', b'u', b'b', b'0', b'2', b'(', b'.'][rng.below(11)];
                    data.insert(at, op);
                }
                _ => {
                    let end = (at + 1 + rng.below(8)).min(data.len());
                    let piece = data[at..end].to_vec();
                    let to = rng.below(data.len());
                    data.splice(to..to, piece);
                }
            }
        }
        let ok = agree(&data, if i % 8 == 0 { &small } else { &limits });
        if ok {
            decoded += 1;
        } else {
            failed += 1;
        }
    }
    assert!(decoded > 1_500 && failed > 10_000, "{decoded} decoded, {failed} failed");
}

/// Generated graphs of lists and dicts with random back and cross references: decoded, re-encoded at every
/// protocol and decoded again to the same value, by both builders.
#[test]
fn generated_object_graphs_round_trip_through_the_encoder() {
    let mut rng = Rng(42);
    for _ in 0..2_000 {
        // Objects 0..n, each a list or dict holding ints and references to any object (cycles included).
        let n = 1 + rng.below(8);
        let kinds: Vec<bool> = (0..n).map(|_| rng.below(2) == 0).collect();
        let refs: Vec<Vec<usize>> = (0..n).map(|_| (0..rng.below(4)).map(|_| rng.below(n)).collect()).collect();
        // Protocol 2, opcode by opcode: every object made and memoized first (memo i), the list of them all
        // the root; then each filled through the memo (like CPython's memo for cycles).
        let mut bytes = vec![0x80, 2, b'('];
        for (i, &is_list) in kinds.iter().enumerate() {
            bytes.extend([if is_list { b']' } else { b'}' }, b'q', i as u8]);
        }
        bytes.push(b'l');
        for (i, targets) in refs.iter().enumerate() {
            bytes.extend([b'h', i as u8, b'(']);
            for (k, &t) in targets.iter().enumerate() {
                if !kinds[i] {
                    bytes.extend([b'K', k as u8]);
                }
                bytes.extend([b'h', t as u8]);
            }
            bytes.extend([if kinds[i] { b'e' } else { b'u' }, b'0']);
        }
        bytes.push(b'.');
        let value = decode(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:02x?}"));
        assert!(agree(&bytes, &Limits::default()));
        for protocol in 2..=5 {
            let again = encode(&value, protocol).unwrap();
            assert_eq!(decode(&again).unwrap(), value, "protocol {protocol}: {bytes:02x?}");
            assert!(agree(&again, &Limits::default()));
        }
    }
}

/// Python 2 `str`s (SHORT_BINSTRING, BINSTRING, STRING): text by default (UTF-8, as `torch.load`), or
/// Latin-1, ASCII or bytes as `encoding=` asks; a string that is not valid in the encoding is an error that
/// names it.
#[test]
fn python_2_strings_decode_as_asked() {
    // ['caf\xc3\xa9', '\xff\xfe', "quoted"] as Python 2 pickled them (protocol 2, then protocol 0).
    let binary = b"\x80\x02]q\x00(U\x05caf\xc3\xa9q\x01T\x02\x00\x00\x00\xff\xfeq\x02e.";
    let text = b"(lp0\nS'caf\\xc3\\xa9'\np1\naS'\\xff\\xfe'\np2\na.";
    let run = |data: &[u8], py2: Py2Strings| {
        ckpt_pickle::decode_options(data, &Options::default().with_py2_strings(py2)).map(|(v, _)| v)
    };
    for data in [&binary[..], &text[..]] {
        let utf8 = run(data, Py2Strings::Utf8).unwrap_err();
        assert!(matches!(utf8, Error::Py2String { .. }), "{utf8}");
        assert!(utf8.to_string().contains("utf-8") || utf8.to_string().contains("UTF-8"), "{utf8}");
        assert!(matches!(run(data, Py2Strings::Ascii).unwrap_err(), Error::Py2String { .. }));
        assert_eq!(run(data, Py2Strings::Latin1).unwrap(), Value::List(vec![s("cafÃ©"), s("ÿþ")]));
        assert_eq!(
            run(data, Py2Strings::Bytes).unwrap(),
            Value::List(vec![Value::Bytes(b"caf\xc3\xa9".to_vec()), Value::Bytes(b"\xff\xfe".to_vec())])
        );
    }
    // Valid UTF-8 reads as text by default, as torch.load reads it.
    assert_eq!(decode(b"\x80\x02U\x05caf\xc3\xa9.").unwrap(), s("café"));
}
