//! `decode(encode(v, p)).desugar() == v` over many generated shapes, all protocols and sharing policies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use ckpt_pickle::{EncodeOptions, Object, ObjectKind, Pickler, Sharing, Value, decode, encode, encode_with, opcode};

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
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// What the generator may produce.
#[derive(Clone, Copy)]
struct Gen {
    /// NEWOBJ_EX objects (protocol 4+ only).
    newobj_ex: bool,
    /// Only what torch's weights_only unpickler reads at protocol 2.
    weights_only: bool,
}

const INTS: &[i64] = &[
    0,
    1,
    255,
    256,
    65535,
    65536,
    -1,
    -128,
    -129,
    -256,
    i32::MAX as i64,
    i32::MIN as i64,
    1 << 31,
    -(1 << 31) - 1,
    1 << 40,
    i64::MAX,
    i64::MIN,
];

fn gen_str(r: &mut Rng) -> String {
    const CHARS: &[char] = &['a', 'Z', '0', '_', ' ', '\n', '\\', '\'', '"', '\0', 'é', 'ÿ', '€', '😀', '\u{ffff}'];
    let len = match r.below(10) {
        0 => 0,
        1 => 1,
        2 => 256 + r.below(300),
        3 => 70_000 * usize::from(r.chance(3)),
        _ => r.below(12),
    };
    (0..len).map(|_| CHARS[r.below(CHARS.len())]).collect()
}

fn gen_bytes(r: &mut Rng) -> Vec<u8> {
    let len = match r.below(8) {
        0 => 0,
        1 => 1,
        2 => 255 + r.below(3),
        3 => 65_536 * usize::from(r.chance(3)),
        _ => r.below(20),
    };
    (0..len).map(|_| r.next() as u8).collect()
}

fn gen_name(r: &mut Rng) -> String {
    const CHARS: &[u8] = b"abcxyz_.0";
    let len = 1 + r.below(10);
    (0..len).map(|_| char::from(CHARS[r.below(CHARS.len())])).collect()
}

/// A canonical big integer (does not fit i64, minimal two's complement).
fn gen_bigint(r: &mut Rng, max_len: usize) -> Vec<u8> {
    let len = 9 + r.below(max_len - 8);
    let mut b: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
    // Make the top byte significant so that the encoding is minimal and longer than 8 bytes.
    let negative = r.chance(50);
    let last = b.len() - 1;
    b[last] = if negative { 0x80 | (b[last] & 0x3f) } else { 0x40 | (b[last] & 0x3f) };
    b
}

fn gen_scalar(r: &mut Rng, g: Gen) -> Value {
    match r.below(if g.weights_only { 7 } else { 10 }) {
        0 => Value::None,
        1 => Value::Bool(r.chance(50)),
        2 => Value::Int(INTS[r.below(INTS.len())]),
        3 => Value::Int(r.next() as i64 >> r.below(64)),
        4 => Value::BigInt(gen_bigint(r, if g.weights_only { 255 } else { 300 })),
        5 => {
            let f = f64::from_bits(r.next());
            Value::Float(if f.is_nan() { 0.5 } else { f })
        }
        6 => Value::Str(gen_str(r)),
        7 => Value::Bytes(gen_bytes(r)),
        8 => Value::ByteArray(gen_bytes(r)),
        _ => Value::global(gen_name(r), gen_name(r)),
    }
}

fn gen_size(r: &mut Rng) -> usize {
    match r.below(40) {
        0 => [999, 1000, 1001, 2000, 2001][r.below(5)],
        1..=4 => 0,
        _ => r.below(5),
    }
}

fn gen_value(r: &mut Rng, depth: usize, g: Gen) -> Value {
    if depth == 0 || r.chance(40) {
        return gen_scalar(r, g);
    }
    let n = gen_size(r);
    let d = if n > 10 { 0 } else { depth - 1 };
    let kinds = if g.weights_only { 6 } else { 10 };
    match r.below(kinds) {
        0 => Value::List((0..n).map(|_| gen_value(r, d, g)).collect()),
        1 => Value::Tuple((0..n.min(7)).map(|_| gen_value(r, d, g)).collect()),
        2 => Value::Dict((0..n).map(|_| (gen_value(r, d, g), gen_value(r, d, g))).collect()),
        3 => Value::global(gen_name(r), gen_name(r)),
        4 | 5 => gen_object(r, d, g),
        6 => Value::Set((0..n).map(|_| gen_value(r, d, g)).collect()),
        7 => Value::FrozenSet((0..n).map(|_| gen_value(r, d, g)).collect()),
        8 => Value::PersistentId(Box::new(gen_value(r, d, g))),
        _ => gen_object(r, d, g),
    }
}

fn gen_object(r: &mut Rng, d: usize, g: Gen) -> Value {
    let callable = Value::global(gen_name(r), gen_name(r));
    let args = Value::Tuple((0..r.below(4)).map(|_| gen_value(r, d, g)).collect());
    let kind = match r.below(if g.weights_only { 2 } else { 5 }) {
        0 => ObjectKind::Reduce,
        1 => ObjectKind::NewObj,
        2 if g.newobj_ex => ObjectKind::NewObjEx { kwargs: Value::Dict(vec![(Value::str("k"), gen_value(r, d, g))]) },
        3 => ObjectKind::Inst,
        _ => ObjectKind::Obj,
    };
    let mut o = Object::new(kind, callable, args);
    if r.chance(50) {
        o.state = Some(gen_value(r, d, g));
    }
    if r.chance(20) {
        let n = gen_size(r);
        o.list_items = (0..n).map(|_| gen_value(r, 0, g)).collect();
    }
    if r.chance(20) {
        let n = gen_size(r);
        o.dict_items = (0..n).map(|_| (gen_value(r, 0, g), gen_value(r, 0, g))).collect();
    }
    Value::from(o)
}

/// Makes some subtrees shared (equal) so that structural sharing has something to find.
fn with_repeats(r: &mut Rng, v: Value) -> Value {
    if r.chance(30) { Value::List(vec![v.clone(), Value::Int(7), v]) } else { v }
}

#[test]
fn generated_values_round_trip() {
    let mut r = Rng(0x1234_5678_9abc_def1);
    let sharings = [Sharing::Distinct, Sharing::Identifiers, Sharing::Strings, Sharing::Structural];
    for i in 0..300 {
        for protocol in 2..=5u8 {
            let g = Gen { newobj_ex: protocol >= 4, weights_only: false };
            let v = gen_value(&mut r, 1 + i % 5, g);
            let v = with_repeats(&mut r, v);
            let sharing = sharings[r.below(4)];
            let out = encode_with(&v, &EncodeOptions::new(protocol).with_sharing(sharing)).unwrap();
            assert_eq!(out[..2], [0x80, protocol]);
            let back = decode(&out).unwrap_or_else(|e| panic!("case {i} p{protocol} {sharing:?}: {e}\n{v:?}"));
            // Structural sharing makes equal values one object, which decodes as a shared one.
            let back = back.unshare(1 << 20).unwrap_or_else(|| panic!("case {i}: a cycle"));
            assert!(back.clone().desugar() == v, "case {i} p{protocol} {sharing:?}:\n{v:?}\n{back:?}");
            if protocol == 5 {
                // Protocol 5 has an opcode for every variant: no desugaring needed.
                assert!(back == v, "case {i} p5 without desugar");
            }
            // Every pickle ends with exactly one STOP and scans cleanly.
            let ops = opcode::scan(&out).unwrap();
            assert_eq!(ops.last().unwrap().0, out.len() - 1);
        }
    }
}

#[test]
fn structural_sharing_is_smaller_and_equal() {
    let mut r = Rng(42);
    let inner = gen_value(&mut r, 4, Gen { newobj_ex: true, weights_only: false });
    let v = Value::Dict(vec![(Value::str("x"), inner.clone()), (Value::str("y"), inner)]);
    for p in 2..=5 {
        let plain = encode(&v, p).unwrap();
        let shared = encode_with(&v, &EncodeOptions::new(p).with_sharing(Sharing::Structural)).unwrap();
        assert!(shared.len() <= plain.len());
        assert_eq!(decode(&shared).unwrap().desugar().unshare(1 << 20), Some(v.clone()));
    }
}

#[test]
fn protocol_2_weights_only_subset() {
    let mut r = Rng(7);
    for i in 0..300 {
        let v = gen_value(&mut r, 1 + i % 5, Gen { newobj_ex: false, weights_only: true });
        let out = encode(&v, 2).unwrap();
        for (at, op) in opcode::scan(&out).unwrap() {
            assert!(
                opcode::WEIGHTS_ONLY_OPCODES.contains(&op),
                "case {i}: opcode {} at {at} is not read by weights_only",
                opcode::name(op).unwrap()
            );
        }
        assert_eq!(decode(&out).unwrap(), v);
    }
}

#[test]
fn floats_keep_their_bits() {
    for bits in [0u64, 1 << 63, 0x7ff8_0000_0000_0001, 0xfff0_0000_0000_0000, 1, 0x7fef_ffff_ffff_ffff] {
        let v = Value::Float(f64::from_bits(bits));
        for p in 2..=5 {
            let back = decode(&encode(&v, p).unwrap()).unwrap();
            assert_eq!(back.as_float().unwrap().to_bits(), bits);
        }
    }
}

#[test]
fn non_canonical_big_ints_are_normalised() {
    // BigInt bytes that fit i64 are written as ints; redundant sign bytes are dropped.
    let v = Value::BigInt(vec![5, 0, 0]);
    assert_eq!(decode(&encode(&v, 2).unwrap()).unwrap(), Value::Int(5));
    let v = Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]);
    assert_eq!(decode(&encode(&v, 2).unwrap()).unwrap(), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
}

#[test]
fn pickler_position_tracks_output() {
    for p in 2..=5 {
        let mut pk = Pickler::new(Vec::new(), p).unwrap();
        pk.empty_list().unwrap();
        pk.memoize().unwrap();
        pk.mark().unwrap();
        for i in 0..5000 {
            pk.str(&format!("item {i}")).unwrap();
            pk.memoize().unwrap();
        }
        pk.appends().unwrap();
        let before = pk.position();
        let out = pk.finish().unwrap();
        // STOP is the only byte after `before`, plus FRAME headers of committed frames at protocol 4+.
        if p < 4 {
            assert_eq!(before + 1, out.len() as u64);
        }
        let v = decode(&out).unwrap();
        assert_eq!(v.as_list().unwrap().len(), 5000);
    }
}

/// A `torch.save`-like `data.pkl` with 100k tensors decodes quickly (timed in release builds only).
#[test]
fn large_state_dict() {
    let n: i64 = if cfg!(debug_assertions) { 20_000 } else { 100_000 };
    let pid = |key: String| {
        Value::PersistentId(Box::new(Value::Tuple(vec![
            Value::str("storage"),
            Value::global("torch", "FloatStorage"),
            Value::Str(key),
            Value::str("cpu"),
            Value::Int(12),
        ])))
    };
    let ints = |v: &[i64]| Value::Tuple(v.iter().map(|&i| Value::Int(i)).collect());
    let hooks = Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])));
    let entries = (0..n)
        .map(|i| {
            let t = Object::reduce(
                Value::global("torch._utils", "_rebuild_tensor_v2"),
                Value::Tuple(vec![
                    pid(i.to_string()),
                    Value::Int(0),
                    ints(&[3, 4]),
                    ints(&[4, 1]),
                    Value::Bool(false),
                    hooks.clone(),
                ]),
            );
            (Value::Str(format!("layers.{i}.weight")), Value::from(t))
        })
        .collect();
    let sd = Value::from(
        Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items(entries),
    );
    let data = encode_with(&sd, &EncodeOptions::new(2).with_sharing(Sharing::Strings)).unwrap();
    let t = Instant::now();
    let back = decode(&data).unwrap();
    let elapsed = t.elapsed();
    assert!(back == sd);
    if !cfg!(debug_assertions) {
        assert!(elapsed.as_secs_f64() < 1.0, "decoding {} bytes took {elapsed:?}", data.len());
    }
}
