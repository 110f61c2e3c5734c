//! The encoder reproduces CPython 3.11's `pickle.dumps` byte for byte (protocols 2-5), and the low-level
//! `Pickler` reproduces a `torch.save` `data.pkl`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_pickle::{EncodeOptions, Object, Pickler, Sharing, Value, decode, encode_with};

fn h(hex: &str) -> Vec<u8> {
    assert!(hex.len() % 2 == 0);
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

fn s(text: &str) -> Value {
    Value::Str(text.to_owned())
}

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

enum Expect {
    /// The exact bytes.
    Hex(&'static str),
    /// Length and FNV-1a 64 of the bytes (for large outputs).
    Digest(usize, u64),
}

/// Encodes `value` and compares with CPython's output; also checks that CPython's bytes decode to `value`.
fn check(name: &str, protocol: u8, sharing: Sharing, value: Value, expect: Expect) {
    let out = encode_with(&value, &EncodeOptions::new(protocol).with_sharing(sharing)).unwrap();
    match expect {
        Expect::Hex(hex) => {
            let want = h(hex);
            if out != want {
                let at = out.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(out.len().min(want.len()));
                panic!(
                    "{name} p{protocol}: output differs from CPython at byte {at}\n ours: {out:02x?}\n want: {want:02x?}"
                );
            }
            assert_eq!(decode(&want).unwrap().desugar(), value, "{name} p{protocol}: decoding CPython's bytes");
        }
        Expect::Digest(len, digest) => {
            assert_eq!(
                (out.len(), fnv1a64(&out)),
                (len, digest),
                "{name} p{protocol}: length/digest differ from CPython"
            );
        }
    }
    assert_eq!(decode(&out).unwrap().desugar(), value, "{name} p{protocol}: round trip");
}

#[test]
#[rustfmt::skip]
#[allow(clippy::too_many_lines, clippy::unreadable_literal)]
fn matches_cpython_pickle_dumps() {
    // Generated with CPython 3.11.7 pickle.dumps; see the comment of each case for the Python object.
    // str_keys, protocol 2
    check("str_keys", 2, Sharing::Distinct, Value::Dict(vec![(s("alpha"), Value::Int(1i64)), (s("beta"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)])), (s("gamma"), Value::Dict(vec![(s("delta"), Value::None)])), (s("\u{e9}\u{20ac}\u{1f600}"), s("text"))]), Expect::Hex("80027d7100285805000000616c70686171014b0158040000006265746171025d7103284b014b0265580500000067616d6d6171047d7105580500000064656c746171064e735809000000c3a9e282acf09f988071075804000000746578747108752e"));
    // str_keys, protocol 3
    check("str_keys", 3, Sharing::Distinct, Value::Dict(vec![(s("alpha"), Value::Int(1i64)), (s("beta"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)])), (s("gamma"), Value::Dict(vec![(s("delta"), Value::None)])), (s("\u{e9}\u{20ac}\u{1f600}"), s("text"))]), Expect::Hex("80037d7100285805000000616c70686171014b0158040000006265746171025d7103284b014b0265580500000067616d6d6171047d7105580500000064656c746171064e735809000000c3a9e282acf09f988071075804000000746578747108752e"));
    // str_keys, protocol 4
    check("str_keys", 4, Sharing::Distinct, Value::Dict(vec![(s("alpha"), Value::Int(1i64)), (s("beta"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)])), (s("gamma"), Value::Dict(vec![(s("delta"), Value::None)])), (s("\u{e9}\u{20ac}\u{1f600}"), s("text"))]), Expect::Hex("80049545000000000000007d94288c05616c706861944b018c0462657461945d94284b014b02658c0567616d6d61947d948c0564656c7461944e738c09c3a9e282acf09f9880948c047465787494752e"));
    // str_keys, protocol 5
    check("str_keys", 5, Sharing::Distinct, Value::Dict(vec![(s("alpha"), Value::Int(1i64)), (s("beta"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)])), (s("gamma"), Value::Dict(vec![(s("delta"), Value::None)])), (s("\u{e9}\u{20ac}\u{1f600}"), s("text"))]), Expect::Hex("80059545000000000000007d94288c05616c706861944b018c0462657461945d94284b014b02658c0567616d6d61947d948c0564656c7461944e738c09c3a9e282acf09f9880948c047465787494752e"));
    // ints, protocol 2
    check("ints", 2, Sharing::Distinct, Value::List(vec![Value::Int(0i64), Value::Int(1i64), Value::Int(255i64), Value::Int(256i64), Value::Int(65535i64), Value::Int(65536i64), Value::Int(-1i64), Value::Int(-255i64), Value::Int(-256i64), Value::Int(2147483647i64), Value::Int(-2147483648i64), Value::Int(2147483648i64), Value::Int(-2147483649i64), Value::Int(9223372036854775807i64), Value::Int(i64::MIN), Value::BigInt(h("000000000000008000")), Value::BigInt(h("000000000000000001")), Value::BigInt(h("0000000000000000ff")), Value::BigInt(h("fbffffffffffffffbf")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000008000")), Value::BigInt(h("f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001"))]), Expect::Hex("80025d7100284b004b014bff4d00014dffff4a000001004affffffff4a01ffffff4a00ffffff4affffff7f4a000000808a0500000080008a05ffffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000000000000080008a090000000000000000018a090000000000000000ff8a09fbffffffffffffffbf8b00010000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000080008b00010000f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff8b0001000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001652e"));
    // ints, protocol 3
    check("ints", 3, Sharing::Distinct, Value::List(vec![Value::Int(0i64), Value::Int(1i64), Value::Int(255i64), Value::Int(256i64), Value::Int(65535i64), Value::Int(65536i64), Value::Int(-1i64), Value::Int(-255i64), Value::Int(-256i64), Value::Int(2147483647i64), Value::Int(-2147483648i64), Value::Int(2147483648i64), Value::Int(-2147483649i64), Value::Int(9223372036854775807i64), Value::Int(i64::MIN), Value::BigInt(h("000000000000008000")), Value::BigInt(h("000000000000000001")), Value::BigInt(h("0000000000000000ff")), Value::BigInt(h("fbffffffffffffffbf")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000008000")), Value::BigInt(h("f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001"))]), Expect::Hex("80035d7100284b004b014bff4d00014dffff4a000001004affffffff4a01ffffff4a00ffffff4affffff7f4a000000808a0500000080008a05ffffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000000000000080008a090000000000000000018a090000000000000000ff8a09fbffffffffffffffbf8b00010000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000080008b00010000f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff8b0001000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001652e"));
    // ints, protocol 4
    check("ints", 4, Sharing::Distinct, Value::List(vec![Value::Int(0i64), Value::Int(1i64), Value::Int(255i64), Value::Int(256i64), Value::Int(65535i64), Value::Int(65536i64), Value::Int(-1i64), Value::Int(-255i64), Value::Int(-256i64), Value::Int(2147483647i64), Value::Int(-2147483648i64), Value::Int(2147483648i64), Value::Int(-2147483649i64), Value::Int(9223372036854775807i64), Value::Int(i64::MIN), Value::BigInt(h("000000000000008000")), Value::BigInt(h("000000000000000001")), Value::BigInt(h("0000000000000000ff")), Value::BigInt(h("fbffffffffffffffbf")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000008000")), Value::BigInt(h("f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001"))]), Expect::Hex("8004958c030000000000005d94284b004b014bff4d00014dffff4a000001004affffffff4a01ffffff4a00ffffff4affffff7f4a000000808a0500000080008a05ffffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000000000000080008a090000000000000000018a090000000000000000ff8a09fbffffffffffffffbf8b00010000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000080008b00010000f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff8b0001000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001652e"));
    // ints, protocol 5
    check("ints", 5, Sharing::Distinct, Value::List(vec![Value::Int(0i64), Value::Int(1i64), Value::Int(255i64), Value::Int(256i64), Value::Int(65535i64), Value::Int(65536i64), Value::Int(-1i64), Value::Int(-255i64), Value::Int(-256i64), Value::Int(2147483647i64), Value::Int(-2147483648i64), Value::Int(2147483648i64), Value::Int(-2147483649i64), Value::Int(9223372036854775807i64), Value::Int(i64::MIN), Value::BigInt(h("000000000000008000")), Value::BigInt(h("000000000000000001")), Value::BigInt(h("0000000000000000ff")), Value::BigInt(h("fbffffffffffffffbf")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000008000")), Value::BigInt(h("f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff")), Value::BigInt(h("00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001"))]), Expect::Hex("8005958c030000000000005d94284b004b014bff4d00014dffff4a000001004affffffff4a01ffffff4a00ffffff4affffff7f4a000000808a0500000080008a05ffffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000000000000080008a090000000000000000018a090000000000000000ff8a09fbffffffffffffffbf8b00010000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000080008b00010000f9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7fff8b0001000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001652e"));
    // floats, protocol 2
    check("floats", 2, Sharing::Distinct, Value::List(vec![Value::Float(f64::from_bits(0x0000000000000000)), Value::Float(f64::from_bits(0x8000000000000000)), Value::Float(f64::from_bits(0x3ff8000000000000)), Value::Float(f64::from_bits(0xc002000000000000)), Value::Float(f64::from_bits(0x7e37e43c8800759c)), Value::Float(f64::from_bits(0x0000000000000001)), Value::Float(f64::from_bits(0x7ff0000000000000)), Value::Float(f64::from_bits(0xfff0000000000000))]), Expect::Hex("80025d710028470000000000000000478000000000000000473ff800000000000047c002000000000000477e37e43c8800759c470000000000000001477ff000000000000047fff0000000000000652e"));
    // floats, protocol 3
    check("floats", 3, Sharing::Distinct, Value::List(vec![Value::Float(f64::from_bits(0x0000000000000000)), Value::Float(f64::from_bits(0x8000000000000000)), Value::Float(f64::from_bits(0x3ff8000000000000)), Value::Float(f64::from_bits(0xc002000000000000)), Value::Float(f64::from_bits(0x7e37e43c8800759c)), Value::Float(f64::from_bits(0x0000000000000001)), Value::Float(f64::from_bits(0x7ff0000000000000)), Value::Float(f64::from_bits(0xfff0000000000000))]), Expect::Hex("80035d710028470000000000000000478000000000000000473ff800000000000047c002000000000000477e37e43c8800759c470000000000000001477ff000000000000047fff0000000000000652e"));
    // floats, protocol 4
    check("floats", 4, Sharing::Distinct, Value::List(vec![Value::Float(f64::from_bits(0x0000000000000000)), Value::Float(f64::from_bits(0x8000000000000000)), Value::Float(f64::from_bits(0x3ff8000000000000)), Value::Float(f64::from_bits(0xc002000000000000)), Value::Float(f64::from_bits(0x7e37e43c8800759c)), Value::Float(f64::from_bits(0x0000000000000001)), Value::Float(f64::from_bits(0x7ff0000000000000)), Value::Float(f64::from_bits(0xfff0000000000000))]), Expect::Hex("8004954d000000000000005d9428470000000000000000478000000000000000473ff800000000000047c002000000000000477e37e43c8800759c470000000000000001477ff000000000000047fff0000000000000652e"));
    // floats, protocol 5
    check("floats", 5, Sharing::Distinct, Value::List(vec![Value::Float(f64::from_bits(0x0000000000000000)), Value::Float(f64::from_bits(0x8000000000000000)), Value::Float(f64::from_bits(0x3ff8000000000000)), Value::Float(f64::from_bits(0xc002000000000000)), Value::Float(f64::from_bits(0x7e37e43c8800759c)), Value::Float(f64::from_bits(0x0000000000000001)), Value::Float(f64::from_bits(0x7ff0000000000000)), Value::Float(f64::from_bits(0xfff0000000000000))]), Expect::Hex("8005954d000000000000005d9428470000000000000000478000000000000000473ff800000000000047c002000000000000477e37e43c8800759c470000000000000001477ff000000000000047fff0000000000000652e"));
    // empties, protocol 2
    check("empties", 2, Sharing::Distinct, Value::List(vec![Value::List(vec![]), Value::Dict(vec![]), Value::Tuple(vec![]), Value::Set(vec![]), Value::FrozenSet(vec![]), Value::Bytes(h("")), Value::ByteArray(h("")), s("")]), Expect::Hex("80025d7100285d71017d710229635f5f6275696c74696e5f5f0a7365740a71035d7104857105527106635f5f6275696c74696e5f5f0a66726f7a656e7365740a71075d710885710952710a635f5f6275696c74696e5f5f0a62797465730a710b2952710c635f5f6275696c74696e5f5f0a6279746561727261790a710d2952710e5800000000710f652e"));
    // empties, protocol 3
    check("empties", 3, Sharing::Distinct, Value::List(vec![Value::List(vec![]), Value::Dict(vec![]), Value::Tuple(vec![]), Value::Set(vec![]), Value::FrozenSet(vec![]), Value::Bytes(h("")), Value::ByteArray(h("")), s("")]), Expect::Hex("80035d7100285d71017d710229636275696c74696e730a7365740a71035d7104857105527106636275696c74696e730a66726f7a656e7365740a71075d710885710952710a4300710b636275696c74696e730a6279746561727261790a710c2952710d5800000000710e652e"));
    // empties, protocol 4
    check("empties", 4, Sharing::Distinct, Value::List(vec![Value::List(vec![]), Value::Dict(vec![]), Value::Tuple(vec![]), Value::Set(vec![]), Value::FrozenSet(vec![]), Value::Bytes(h("")), Value::ByteArray(h("")), s("")]), Expect::Hex("80049531000000000000005d94285d947d94298f942891944300948c086275696c74696e73948c096279746561727261799493942952948c0094652e"));
    // empties, protocol 5
    check("empties", 5, Sharing::Distinct, Value::List(vec![Value::List(vec![]), Value::Dict(vec![]), Value::Tuple(vec![]), Value::Set(vec![]), Value::FrozenSet(vec![]), Value::Bytes(h("")), Value::ByteArray(h("")), s("")]), Expect::Hex("8005951f000000000000005d94285d947d94298f94289194430094960000000000000000948c0094652e"));
    // tuples, protocol 2
    check("tuples", 2, Sharing::Distinct, Value::List(vec![Value::Tuple(vec![]), Value::Tuple(vec![Value::Int(1i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80025d710028294b018571014b014b028671024b014b024b03877103284b014b024b034b04747104284b014b024b034b044b05747105652e"));
    // tuples, protocol 3
    check("tuples", 3, Sharing::Distinct, Value::List(vec![Value::Tuple(vec![]), Value::Tuple(vec![Value::Int(1i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80035d710028294b018571014b014b028671024b014b024b03877103284b014b024b034b04747104284b014b024b034b044b05747105652e"));
    // tuples, protocol 4
    check("tuples", 4, Sharing::Distinct, Value::List(vec![Value::Tuple(vec![]), Value::Tuple(vec![Value::Int(1i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80049530000000000000005d9428294b0185944b014b0286944b014b024b038794284b014b024b034b047494284b014b024b034b044b057494652e"));
    // tuples, protocol 5
    check("tuples", 5, Sharing::Distinct, Value::List(vec![Value::Tuple(vec![]), Value::Tuple(vec![Value::Int(1i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64)]), Value::Tuple(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64), Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80059530000000000000005d9428294b0185944b014b0286944b014b024b038794284b014b024b034b047494284b014b024b034b044b057494652e"));
    // bytes, protocol 2
    check("bytes", 2, Sharing::Distinct, Value::List(vec![Value::Bytes(h("")), Value::Bytes(h("61")), Value::Bytes(h("6162")), Value::Bytes(h("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")), Value::Bytes(h("fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe"))]), Expect::Hex("80025d710028635f5f6275696c74696e5f5f0a62797465730a710129527102635f636f646563730a656e636f64650a7103580100000061710458060000006c6174696e3171058671065271076803580200000061627108680586710952710a68035880010000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7fc280c281c282c283c284c285c286c287c288c289c28ac28bc28cc28dc28ec28fc290c291c292c293c294c295c296c297c298c299c29ac29bc29cc29dc29ec29fc2a0c2a1c2a2c2a3c2a4c2a5c2a6c2a7c2a8c2a9c2aac2abc2acc2adc2aec2afc2b0c2b1c2b2c2b3c2b4c2b5c2b6c2b7c2b8c2b9c2bac2bbc2bcc2bdc2bec2bfc380c381c382c383c384c385c386c387c388c389c38ac38bc38cc38dc38ec38fc390c391c392c393c394c395c396c397c398c399c39ac39bc39cc39dc39ec39fc3a0c3a1c3a2c3a3c3a4c3a5c3a6c3a7c3a8c3a9c3aac3abc3acc3adc3aec3afc3b0c3b1c3b2c3b3c3b4c3b5c3b6c3b7c3b8c3b9c3bac3bbc3bcc3bdc3bec3bf710b680586710c52710d68035858020000c3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3bec3be710e680586710f527110652e"));
    // bytes, protocol 3
    check("bytes", 3, Sharing::Distinct, Value::List(vec![Value::Bytes(h("")), Value::Bytes(h("61")), Value::Bytes(h("6162")), Value::Bytes(h("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")), Value::Bytes(h("fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe"))]), Expect::Hex("80035d7100284300710143016171024302616271034200010000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff7104422c010000fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe7105652e"));
    // bytes, protocol 4
    check("bytes", 4, Sharing::Distinct, Value::List(vec![Value::Bytes(h("")), Value::Bytes(h("61")), Value::Bytes(h("6162")), Value::Bytes(h("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")), Value::Bytes(h("fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe"))]), Expect::Hex("80049549020000000000005d94284300944301619443026162944200010000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff94422c010000fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe94652e"));
    // bytes, protocol 5
    check("bytes", 5, Sharing::Distinct, Value::List(vec![Value::Bytes(h("")), Value::Bytes(h("61")), Value::Bytes(h("6162")), Value::Bytes(h("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")), Value::Bytes(h("fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe"))]), Expect::Hex("80059549020000000000005d94284300944301619443026162944200010000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff94422c010000fefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefe94652e"));
    // bytearrays, protocol 2
    check("bytearrays", 2, Sharing::Distinct, Value::List(vec![Value::ByteArray(h("7879")), Value::ByteArray(h("")), Value::ByteArray(h("7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a"))]), Expect::Hex("80025d710028635f5f6275696c74696e5f5f0a6279746561727261790a7101635f636f646563730a656e636f64650a710258020000007879710358060000006c6174696e31710486710552710685710752710868012952710968016802582c0100007a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a710a680486710b52710c85710d52710e652e"));
    // bytearrays, protocol 3
    check("bytearrays", 3, Sharing::Distinct, Value::List(vec![Value::ByteArray(h("7879")), Value::ByteArray(h("")), Value::ByteArray(h("7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a"))]), Expect::Hex("80035d710028636275696c74696e730a6279746561727261790a71014302787971028571035271046801295271056801422c0100007a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7106857107527108652e"));
    // bytearrays, protocol 4
    check("bytearrays", 4, Sharing::Distinct, Value::List(vec![Value::ByteArray(h("7879")), Value::ByteArray(h("")), Value::ByteArray(h("7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a"))]), Expect::Hex("80049564010000000000005d94288c086275696c74696e73948c0962797465617272617994939443027879948594529468032952946803422c0100007a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a9485945294652e"));
    // bytearrays, protocol 5
    check("bytearrays", 5, Sharing::Distinct, Value::List(vec![Value::ByteArray(h("7879")), Value::ByteArray(h("")), Value::ByteArray(h("7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a"))]), Expect::Hex("80059551010000000000005d942896020000000000000078799496000000000000000094962c010000000000007a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a94652e"));
    // sets, protocol 2
    check("sets", 2, Sharing::Distinct, Value::List(vec![Value::Set(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::FrozenSet(vec![Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80025d710028635f5f6275696c74696e5f5f0a7365740a71015d7102284b014b024b0365857103527104635f5f6275696c74696e5f5f0a66726f7a656e7365740a71055d7106284b044b0565857107527108652e"));
    // sets, protocol 3
    check("sets", 3, Sharing::Distinct, Value::List(vec![Value::Set(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::FrozenSet(vec![Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80035d710028636275696c74696e730a7365740a71015d7102284b014b024b0365857103527104636275696c74696e730a66726f7a656e7365740a71055d7106284b044b0565857107527108652e"));
    // sets, protocol 4
    check("sets", 4, Sharing::Distinct, Value::List(vec![Value::Set(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::FrozenSet(vec![Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80049516000000000000005d94288f94284b014b024b0390284b044b059194652e"));
    // sets, protocol 5
    check("sets", 5, Sharing::Distinct, Value::List(vec![Value::Set(vec![Value::Int(1i64), Value::Int(2i64), Value::Int(3i64)]), Value::FrozenSet(vec![Value::Int(4i64), Value::Int(5i64)])]), Expect::Hex("80059516000000000000005d94288f94284b014b024b0390284b044b059194652e"));
    // complex, protocol 2
    check("complex", 2, Sharing::Distinct, Value::List(vec![Value::from(Object::reduce(Value::global("__builtin__", "complex"), Value::Tuple(vec![Value::Float(f64::from_bits(0x3ff0000000000000)), Value::Float(f64::from_bits(0x4000000000000000))])))]), Expect::Hex("80025d7100635f5f6275696c74696e5f5f0a636f6d706c65780a7101473ff0000000000000474000000000000000867102527103612e"));
    // complex, protocol 3
    check("complex", 3, Sharing::Distinct, Value::List(vec![Value::from(Object::reduce(Value::global("builtins", "complex"), Value::Tuple(vec![Value::Float(f64::from_bits(0x3ff0000000000000)), Value::Float(f64::from_bits(0x4000000000000000))])))]), Expect::Hex("80035d7100636275696c74696e730a636f6d706c65780a7101473ff0000000000000474000000000000000867102527103612e"));
    // complex, protocol 4
    check("complex", 4, Sharing::Distinct, Value::List(vec![Value::from(Object::reduce(Value::global("builtins", "complex"), Value::Tuple(vec![Value::Float(f64::from_bits(0x3ff0000000000000)), Value::Float(f64::from_bits(0x4000000000000000))])))]), Expect::Hex("80049531000000000000005d948c086275696c74696e73948c07636f6d706c6578949394473ff000000000000047400000000000000086945294612e"));
    // complex, protocol 5
    check("complex", 5, Sharing::Distinct, Value::List(vec![Value::from(Object::reduce(Value::global("builtins", "complex"), Value::Tuple(vec![Value::Float(f64::from_bits(0x3ff0000000000000)), Value::Float(f64::from_bits(0x4000000000000000))])))]), Expect::Hex("80059531000000000000005d948c086275696c74696e73948c07636f6d706c6578949394473ff000000000000047400000000000000086945294612e"));
    // ordereddict, protocol 2
    check("ordereddict", 2, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items(vec![(s("one"), Value::Int(1i64)), (s("two"), Value::List(vec![Value::Int(2i64)]))])), Expect::Hex("800263636f6c6c656374696f6e730a4f726465726564446963740a7100295271012858030000006f6e6571024b01580300000074776f71035d71044b0261752e"));
    // ordereddict, protocol 3
    check("ordereddict", 3, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items(vec![(s("one"), Value::Int(1i64)), (s("two"), Value::List(vec![Value::Int(2i64)]))])), Expect::Hex("800363636f6c6c656374696f6e730a4f726465726564446963740a7100295271012858030000006f6e6571024b01580300000074776f71035d71044b0261752e"));
    // ordereddict, protocol 4
    check("ordereddict", 4, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items(vec![(s("one"), Value::Int(1i64)), (s("two"), Value::List(vec![Value::Int(2i64)]))])), Expect::Hex("80049537000000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394295294288c036f6e65944b018c0374776f945d944b0261752e"));
    // ordereddict, protocol 5
    check("ordereddict", 5, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items(vec![(s("one"), Value::Int(1i64)), (s("two"), Value::List(vec![Value::Int(2i64)]))])), Expect::Hex("80059537000000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394295294288c036f6e65944b018c0374776f945d944b0261752e"));
    // ordereddict_1001, protocol 2
    check("ordereddict_1001", 2, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items((0..1001).map(|i| (s(&format!("k{i}")), Value::Int(i))).collect())), Expect::Digest(15927, 0x3efb30f096542b10));
    // ordereddict_1001, protocol 3
    check("ordereddict_1001", 3, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items((0..1001).map(|i| (s(&format!("k{i}")), Value::Int(i))).collect())), Expect::Digest(15927, 0xd7453cdb47b87aed));
    // ordereddict_1001, protocol 4
    check("ordereddict_1001", 4, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items((0..1001).map(|i| (s(&format!("k{i}")), Value::Int(i))).collect())), Expect::Digest(9693, 0x16b542338a57225a));
    // ordereddict_1001, protocol 5
    check("ordereddict_1001", 5, Sharing::Distinct, Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])).with_dict_items((0..1001).map(|i| (s(&format!("k{i}")), Value::Int(i))).collect())), Expect::Digest(9693, 0x85c20893607ddf57));
    // point, protocol 2
    check("point", 2, Sharing::Distinct, Value::from(Object::new_obj(Value::global("__main__", "Point"), Value::Tuple(vec![])).with_state(Value::Dict(vec![(s("xx"), Value::Int(1i64)), (s("yy"), Value::List(vec![Value::Float(f64::from_bits(0x4004000000000000))]))]))), Expect::Hex("8002635f5f6d61696e5f5f0a506f696e740a7100298171017d7102285802000000787871034b015802000000797971045d71054740040000000000006175622e"));
    // point, protocol 3
    check("point", 3, Sharing::Distinct, Value::from(Object::new_obj(Value::global("__main__", "Point"), Value::Tuple(vec![])).with_state(Value::Dict(vec![(s("xx"), Value::Int(1i64)), (s("yy"), Value::List(vec![Value::Float(f64::from_bits(0x4004000000000000))]))]))), Expect::Hex("8003635f5f6d61696e5f5f0a506f696e740a7100298171017d7102285802000000787871034b015802000000797971045d71054740040000000000006175622e"));
    // point, protocol 4
    check("point", 4, Sharing::Distinct, Value::from(Object::new_obj(Value::global("__main__", "Point"), Value::Tuple(vec![])).with_state(Value::Dict(vec![(s("xx"), Value::Int(1i64)), (s("yy"), Value::List(vec![Value::Float(f64::from_bits(0x4004000000000000))]))]))), Expect::Hex("80049536000000000000008c085f5f6d61696e5f5f948c05506f696e749493942981947d94288c027878944b018c027979945d944740040000000000006175622e"));
    // point, protocol 5
    check("point", 5, Sharing::Distinct, Value::from(Object::new_obj(Value::global("__main__", "Point"), Value::Tuple(vec![])).with_state(Value::Dict(vec![(s("xx"), Value::Int(1i64)), (s("yy"), Value::List(vec![Value::Float(f64::from_bits(0x4004000000000000))]))]))), Expect::Hex("80059536000000000000008c085f5f6d61696e5f5f948c05506f696e749493942981947d94288c027878944b018c027979945d944740040000000000006175622e"));
    // shared, protocol 2
    check("shared", 2, Sharing::Distinct, Value::Dict(vec![(s("x"), Value::Shared { id: 0, value: Box::new(Value::Dict(vec![(s("k"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)]))])) }), (s("y"), Value::Ref(0))]), Expect::Hex("80027d71002858010000007871017d710258010000006b71035d7104284b014b02657358010000007971056802752e"));
    // shared, protocol 3
    check("shared", 3, Sharing::Distinct, Value::Dict(vec![(s("x"), Value::Shared { id: 0, value: Box::new(Value::Dict(vec![(s("k"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)]))])) }), (s("y"), Value::Ref(0))]), Expect::Hex("80037d71002858010000007871017d710258010000006b71035d7104284b014b02657358010000007971056802752e"));
    // shared, protocol 4
    check("shared", 4, Sharing::Distinct, Value::Dict(vec![(s("x"), Value::Shared { id: 0, value: Box::new(Value::Dict(vec![(s("k"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)]))])) }), (s("y"), Value::Ref(0))]), Expect::Hex("8004951e000000000000007d94288c0178947d948c016b945d94284b014b0265738c0179946802752e"));
    // shared, protocol 5
    check("shared", 5, Sharing::Distinct, Value::Dict(vec![(s("x"), Value::Shared { id: 0, value: Box::new(Value::Dict(vec![(s("k"), Value::List(vec![Value::Int(1i64), Value::Int(2i64)]))])) }), (s("y"), Value::Ref(0))]), Expect::Hex("8005951e000000000000007d94288c0178947d948c016b945d94284b014b0265738c0179946802752e"));
    // list_1001, protocol 2
    check("list_1001", 2, Sharing::Distinct, Value::List([1001, 2000, 1000].iter().map(|&n| Value::List((0..n).map(Value::Int).collect())).collect()), Expect::Digest(11262, 0x147d887bf5b89b55));
    // list_1001, protocol 3
    check("list_1001", 3, Sharing::Distinct, Value::List([1001, 2000, 1000].iter().map(|&n| Value::List((0..n).map(Value::Int).collect())).collect()), Expect::Digest(11262, 0x023df2b1f9e24cc6));
    // list_1001, protocol 4
    check("list_1001", 4, Sharing::Distinct, Value::List([1001, 2000, 1000].iter().map(|&n| Value::List((0..n).map(Value::Int).collect())).collect()), Expect::Digest(11267, 0x32bb3be041105787));
    // list_1001, protocol 5
    check("list_1001", 5, Sharing::Distinct, Value::List([1001, 2000, 1000].iter().map(|&n| Value::List((0..n).map(Value::Int).collect())).collect()), Expect::Digest(11267, 0xae004e85ad947f82));
    // dict_1000, protocol 2
    check("dict_1000", 2, Sharing::Distinct, Value::Dict((0..1000).map(|i| (Value::Int(i), Value::Int(i))).collect()), Expect::Digest(5498, 0xa767f4a1bc24b273));
    // dict_1000, protocol 3
    check("dict_1000", 3, Sharing::Distinct, Value::Dict((0..1000).map(|i| (Value::Int(i), Value::Int(i))).collect()), Expect::Digest(5498, 0x229ba9bc53df9c74));
    // dict_1000, protocol 4
    check("dict_1000", 4, Sharing::Distinct, Value::Dict((0..1000).map(|i| (Value::Int(i), Value::Int(i))).collect()), Expect::Digest(5506, 0xdf0600007b8964b9));
    // dict_1000, protocol 5
    check("dict_1000", 5, Sharing::Distinct, Value::Dict((0..1000).map(|i| (Value::Int(i), Value::Int(i))).collect()), Expect::Digest(5506, 0x0d688b3bf4f043ae));
    // dict_2001, protocol 2
    check("dict_2001", 2, Sharing::Distinct, Value::Dict((0..2001).map(|i| (Value::Int(i), Value::None)).collect()), Expect::Digest(7760, 0x20128f0c85d462ee));
    // dict_2001, protocol 3
    check("dict_2001", 3, Sharing::Distinct, Value::Dict((0..2001).map(|i| (Value::Int(i), Value::None)).collect()), Expect::Digest(7760, 0xa22e7fbaa24689cd));
    // dict_2001, protocol 4
    check("dict_2001", 4, Sharing::Distinct, Value::Dict((0..2001).map(|i| (Value::Int(i), Value::None)).collect()), Expect::Digest(7768, 0xa23941cfdd57fcc9));
    // dict_2001, protocol 5
    check("dict_2001", 5, Sharing::Distinct, Value::Dict((0..2001).map(|i| (Value::Int(i), Value::None)).collect()), Expect::Digest(7768, 0x0771de9e88790fce));
    // set_1000, protocol 2
    check("set_1000", 2, Sharing::Distinct, Value::Set((0..1000).map(Value::Int).collect()), Expect::Digest(2777, 0xf9e73fbd9ec0f812));
    // set_1000, protocol 4
    check("set_1000", 4, Sharing::Distinct, Value::Set((0..1000).map(Value::Int).collect()), Expect::Digest(2762, 0x5b481156df14c904));
    // set_2500, protocol 2
    check("set_2500", 2, Sharing::Distinct, Value::Set((0..2500).map(Value::Int).collect()), Expect::Digest(7281, 0x603339a4608b5056));
    // set_2500, protocol 4
    check("set_2500", 4, Sharing::Distinct, Value::Set((0..2500).map(Value::Int).collect()), Expect::Digest(7264, 0x5858fc21fe002a60));
    // big_str, protocol 2
    check("big_str", 2, Sharing::Distinct, Value::List(vec![s(&"a".repeat(70000)), s("tail")]), Expect::Digest(70026, 0x83ead3dee5e6c2db));
    // big_str, protocol 3
    check("big_str", 3, Sharing::Distinct, Value::List(vec![s(&"a".repeat(70000)), s("tail")]), Expect::Digest(70026, 0x041ba15690b30700));
    // big_str, protocol 4
    check("big_str", 4, Sharing::Distinct, Value::List(vec![s(&"a".repeat(70000)), s("tail")]), Expect::Digest(70029, 0x0000315a67f1804e));
    // big_str, protocol 5
    check("big_str", 5, Sharing::Distinct, Value::List(vec![s(&"a".repeat(70000)), s("tail")]), Expect::Digest(70029, 0x132fee4cc5bbebfb));
    // big_bytes, protocol 2
    check("big_bytes", 2, Sharing::Distinct, Value::List(vec![Value::Bytes(vec![b'q'; 65536]), Value::Bytes(vec![b'r'; 65535]), s("end")]), Expect::Digest(131150, 0xc18d23a3060ecaa1));
    // big_bytes, protocol 3
    check("big_bytes", 3, Sharing::Distinct, Value::List(vec![Value::Bytes(vec![b'q'; 65536]), Value::Bytes(vec![b'r'; 65535]), s("end")]), Expect::Digest(131103, 0x5adc91db74f63755));
    // big_bytes, protocol 4
    check("big_bytes", 4, Sharing::Distinct, Value::List(vec![Value::Bytes(vec![b'q'; 65536]), Value::Bytes(vec![b'r'; 65535]), s("end")]), Expect::Digest(131114, 0x0213d3a567d6492f));
    // big_bytes, protocol 5
    check("big_bytes", 5, Sharing::Distinct, Value::List(vec![Value::Bytes(vec![b'q'; 65536]), Value::Bytes(vec![b'r'; 65535]), s("end")]), Expect::Digest(131114, 0xc378d0d90f4026d8));
    // many_frames, protocol 2
    check("many_frames", 2, Sharing::Distinct, Value::List((0..20000).map(|i| s(&format!("s{i:05}"))).collect()), Expect::Digest(319281, 0x240e7c7d76b85f38));
    // many_frames, protocol 3
    check("many_frames", 3, Sharing::Distinct, Value::List((0..20000).map(|i| s(&format!("s{i:05}"))).collect()), Expect::Digest(319281, 0xb4a40095130e6535));
    // many_frames, protocol 4
    check("many_frames", 4, Sharing::Distinct, Value::List((0..20000).map(|i| s(&format!("s{i:05}"))).collect()), Expect::Digest(180072, 0x256c702decbf9dd9));
    // many_frames, protocol 5
    check("many_frames", 5, Sharing::Distinct, Value::List((0..20000).map(|i| s(&format!("s{i:05}"))).collect()), Expect::Digest(180072, 0xd5bb40a9e624391e));
}

/// The Python object behind `TORCH_DATA_PKL`: what `torch.save({'w': t1, 'v': t2, 'bias': t3})` pickles, where
/// `t2` is a view into `t1`'s storage and `t3` is a 0-d tensor.
fn torch_like_value() -> Value {
    let rebuild = Value::global("torch._utils", "_rebuild_tensor_v2");
    let pid = |key: &str, numel: i64| {
        Value::PersistentId(Box::new(Value::Tuple(vec![
            s("storage"),
            Value::global("torch", "FloatStorage"),
            s(key),
            s("cpu"),
            Value::Int(numel),
        ])))
    };
    let ints = |v: &[i64]| Value::Tuple(v.iter().map(|&i| Value::Int(i)).collect());
    let hooks = || Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![])));
    let tensor = |key: &str, numel: i64, offset: i64, size: &[i64], stride: &[i64]| {
        Value::from(Object::reduce(
            rebuild.clone(),
            Value::Tuple(vec![
                pid(key, numel),
                Value::Int(offset),
                ints(size),
                ints(stride),
                Value::Bool(false),
                hooks(),
            ]),
        ))
    };
    Value::Dict(vec![
        (s("w"), tensor("0", 6, 0, &[2, 3], &[3, 1])),
        (s("v"), tensor("0", 6, 2, &[2], &[1])),
        (s("bias"), tensor("1", 4, 0, &[], &[])),
    ])
}

/// Written by CPython's C pickler with a `persistent_id` returning torch's storage tuple (torch-save spec §7).
const TORCH_DATA_PKL: &str = "80027d710028580100000077710163746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71022828580700000073746f72616765710363746f7263680a466c6f617453746f726167650a71045801000000307105580300000063707571064b06747107514b004b024b038671084b034b018671098963636f6c6c656374696f6e730a4f726465726564446963740a710a2952710b74710c52710d580100000076710e6802282868036804680568064b0674710f514b024b028571104b0185711189680a2952711274711352711458040000006269617371156802282868036804580100000031711668064b04747117514b00292989680a2952711874711952711a752e";

#[test]
fn torch_data_pkl_via_encode_with_string_sharing() {
    let out = encode_with(&torch_like_value(), &EncodeOptions::new(2).with_sharing(Sharing::Strings)).unwrap();
    assert_eq!(out, h(TORCH_DATA_PKL));
    assert_eq!(decode(&out).unwrap(), torch_like_value());
}

#[test]
fn torch_data_pkl_via_low_level_pickler() {
    // The call sequence a torch writer issues, mirroring CPython's save() of the dict.
    let mut p = Pickler::new(Vec::new(), 2).unwrap();
    p.empty_dict().unwrap();
    p.memoize().unwrap();
    p.mark().unwrap();
    // (name, storage key, numel, offset, size, stride)
    type Spec = (&'static str, &'static str, i64, i64, &'static [i64], &'static [i64]);
    let tensors: [Spec; 3] =
        [("w", "0", 6, 0, &[2, 3], &[3, 1]), ("v", "0", 6, 2, &[2], &[1]), ("bias", "1", 4, 0, &[], &[])];
    let mut keys = std::collections::HashMap::new();
    for (name, key, numel, offset, size, stride) in tensors {
        p.str(name).unwrap();
        p.memoize().unwrap();
        p.global_memo("torch._utils", "_rebuild_tensor_v2").unwrap();
        p.begin_tuple(6).unwrap();
        // persistent id: ('storage', FloatStorage, key, 'cpu', numel)
        p.begin_tuple(5).unwrap();
        p.shared_str("storage").unwrap();
        p.global_memo("torch", "FloatStorage").unwrap();
        match keys.get(key) {
            Some(&id) => p.get(id).unwrap(),
            None => {
                p.str(key).unwrap();
                keys.insert(key, p.memoize().unwrap());
            }
        }
        p.shared_str("cpu").unwrap();
        p.int(numel).unwrap();
        p.tuple(5).unwrap();
        p.memoize().unwrap();
        p.binpersid().unwrap();
        p.int(offset).unwrap();
        for dims in [size, stride] {
            p.begin_tuple(dims.len()).unwrap();
            for &d in dims {
                p.int(d).unwrap();
            }
            p.tuple(dims.len()).unwrap();
            if !dims.is_empty() {
                p.memoize().unwrap();
            }
        }
        p.bool(false).unwrap();
        p.global_memo("collections", "OrderedDict").unwrap();
        p.empty_tuple().unwrap();
        p.reduce().unwrap();
        p.memoize().unwrap();
        p.tuple(6).unwrap();
        p.memoize().unwrap();
        p.reduce().unwrap();
        p.memoize().unwrap();
    }
    p.setitems().unwrap();
    assert_eq!(p.position(), u64::try_from(TORCH_DATA_PKL.len() / 2 - 1).unwrap());
    let out = p.finish().unwrap();
    assert_eq!(out, h(TORCH_DATA_PKL));
}

#[test]
fn protocol_2_uses_only_weights_only_opcodes() {
    let out = encode_with(&torch_like_value(), &EncodeOptions::new(2)).unwrap();
    for (_, op) in ckpt_pickle::opcode::scan(&out).unwrap() {
        assert!(ckpt_pickle::opcode::WEIGHTS_ONLY_OPCODES.contains(&op), "opcode {op:#04x}");
    }
}

#[test]
fn small_frames_have_no_frame_header() {
    // CPython omits the FRAME opcode for frames under 4 bytes.
    let cases: [(Value, &str); 4] = [
        (Value::None, "80044e2e"),
        (Value::Int(1), "80044b012e"),
        (Value::Int(300), "80049504000000000000004d2c012e"),
        (s("ab"), "80049506000000000000008c026162942e"),
    ];
    for (v, hex) in cases {
        assert_eq!(encode_with(&v, &EncodeOptions::new(4)).unwrap(), h(hex), "{v:?}");
    }
    // A 64 KiB+ payload is written outside any frame; the 2 bytes after it (MEMOIZE STOP) get no header.
    let big = Value::Bytes(b"abcdefghijklmnopqrstuvwxyz".repeat(2600));
    let out = encode_with(&big, &EncodeOptions::new(4)).unwrap();
    assert_eq!(out.len(), 67609);
    assert_eq!(out[..7], h("800442100801 00".replace(' ', "").as_str())[..7]);
    assert_eq!(out[out.len() - 2..], [0x94, b'.']);
}
