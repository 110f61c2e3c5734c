//! Parsers for the protocol-0 text arguments, following CPython's C unpickler (`_pickle.c`).

use crate::bigint::{IntRepr, MagnitudeBuilder, from_sign_magnitude};

/// Why a text argument was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextError {
    Bad(&'static str),
    TooManyDigits,
    /// A `\u`/`\U` escape named a surrogate; payload: byte index of the escape in the argument.
    Surrogate(usize),
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

fn trim_c_space(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_c_space(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|&b| !is_c_space(b)).map_or(start, |i| i + 1);
    s.get(start..end).unwrap_or(&[])
}

fn digit_value(b: u8) -> Option<u32> {
    char::from(b).to_digit(36)
}

/// C `strtol(s, &end, 0)` that must consume all of `s`: leading whitespace, sign, `0x` hex, leading-`0` octal,
/// else decimal. `None` when it would not consume everything or overflows `i64` (CPython then falls back to
/// [`parse_py_int`]).
pub(crate) fn strtol_full(s: &[u8]) -> Option<i64> {
    let mut s = s;
    while let [first, rest @ ..] = s {
        if is_c_space(*first) {
            s = rest;
        } else {
            break;
        }
    }
    let negative = match s.first() {
        Some(b'-') => {
            s = s.get(1..)?;
            true
        }
        Some(b'+') => {
            s = s.get(1..)?;
            false
        }
        _ => false,
    };
    let (radix, digits) = match s {
        [b'0', b'x' | b'X', rest @ ..] if rest.first().and_then(|&b| digit_value(b)).is_some_and(|d| d < 16) => {
            (16, rest)
        }
        [b'0', ..] => (8, s),
        _ => (10, s),
    };
    if digits.is_empty() {
        return None;
    }
    let mut acc: i64 = 0;
    for &b in digits {
        let d = digit_value(b).filter(|&d| d < radix)?;
        acc = acc.checked_mul(i64::from(radix))?;
        acc = if negative { acc.checked_sub(i64::from(d))? } else { acc.checked_add(i64::from(d))? };
    }
    Some(acc)
}

/// Python `int(s, base)` for `base` 10, or `base == 0` (literal syntax: `0x`/`0o`/`0b` prefixes, no leading
/// zeros on non-zero decimals). Surrounding whitespace and single underscores between digits are allowed.
/// Decimal inputs with more than `max_digits` digits fail (CPython's `int_max_str_digits`).
pub(crate) fn parse_py_int(s: &[u8], base: u32, max_digits: usize) -> Result<IntRepr, TextError> {
    const BAD: TextError = TextError::Bad("invalid integer literal");
    let mut s = trim_c_space(s);
    let negative = match s.first() {
        Some(b'-') => {
            s = s.get(1..).unwrap_or(&[]);
            true
        }
        Some(b'+') => {
            s = s.get(1..).unwrap_or(&[]);
            false
        }
        _ => false,
    };
    let (radix, mut body, prefixed) = if base == 0 {
        match s {
            [b'0', b'x' | b'X', rest @ ..] => (16, rest, true),
            [b'0', b'o' | b'O', rest @ ..] => (8, rest, true),
            [b'0', b'b' | b'B', rest @ ..] => (2, rest, true),
            _ => (10, s, false),
        }
    } else {
        (base, s, false)
    };
    // After a prefix, one underscore may precede the first digit.
    if prefixed {
        if let [b'_', rest @ ..] = body {
            body = rest;
        }
    }
    if body.is_empty() || body.first() == Some(&b'_') || body.last() == Some(&b'_') {
        return Err(BAD);
    }
    let mut builder = MagnitudeBuilder::new(radix);
    let mut ndigits = 0usize;
    let mut prev_underscore = false;
    let mut all_zero = true;
    for &b in body {
        if b == b'_' {
            if prev_underscore {
                return Err(BAD);
            }
            prev_underscore = true;
            continue;
        }
        prev_underscore = false;
        let d = digit_value(b).filter(|&d| d < radix).ok_or(BAD)?;
        ndigits += 1;
        if radix == 10 && ndigits > max_digits {
            return Err(TextError::TooManyDigits);
        }
        all_zero &= d == 0;
        builder.push_digit(d);
    }
    // Literal syntax forbids leading zeros on non-zero decimal numbers ("010").
    if base == 0 && radix == 10 && body.first() == Some(&b'0') && !all_zero {
        return Err(BAD);
    }
    Ok(from_sign_magnitude(negative, &builder.into_le_bytes()))
}

/// The argument of FLOAT: what `PyOS_string_to_double` accepts (no surrounding whitespace; `inf`, `nan`,
/// exponents).
pub(crate) fn parse_float(s: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(s).ok()?;
    if text.is_empty() || text.starts_with(|c: char| c.is_whitespace()) || text.ends_with(|c: char| c.is_whitespace()) {
        return None;
    }
    text.parse::<f64>().ok()
}

/// The argument of STRING: a quoted Python bytes literal body, decoded like `PyBytes_DecodeEscape`.
pub(crate) fn decode_string_literal(line: &[u8]) -> Result<Vec<u8>, TextError> {
    let body = match line {
        [q, body @ .., q2] if q == q2 && (*q == b'\'' || *q == b'"') => body,
        _ => return Err(TextError::Bad("STRING argument must be quoted")),
    };
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0usize;
    while let Some(&c) = body.get(i) {
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = body.get(i) else {
            return Err(TextError::Bad("trailing backslash in STRING"));
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b't' => out.push(b'\t'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'v' => out.push(0x0b),
            b'a' => out.push(0x07),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match body.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8); // CPython truncates octal escapes above \377
            }
            b'x' => {
                let hi = body.get(i).and_then(|&b| digit_value(b)).filter(|&d| d < 16);
                let lo = body.get(i + 1).and_then(|&b| digit_value(b)).filter(|&d| d < 16);
                match (hi, lo) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => return Err(TextError::Bad("invalid \\x escape in STRING")),
                }
            }
            _ => {
                // Unknown escapes are kept verbatim, backslash included.
                out.push(b'\\');
                i -= 1;
            }
        }
    }
    Ok(out)
}

/// The argument of UNICODE: `raw-unicode-escape` (latin-1 bytes, `\uXXXX` and `\UXXXXXXXX` escapes, the latter
/// only after an odd number of backslashes).
pub(crate) fn decode_raw_unicode_escape(s: &[u8]) -> Result<String, TextError> {
    let mut out = String::with_capacity(s.len());
    let mut i = 0usize;
    while let Some(&c) = s.get(i) {
        if c != b'\\' {
            out.push(char::from(c));
            i += 1;
            continue;
        }
        // A run of backslashes.
        let start = i;
        while s.get(i) == Some(&b'\\') {
            i += 1;
        }
        let run = i - start;
        let ndigits = match s.get(i) {
            Some(b'u') if run % 2 == 1 => 4,
            Some(b'U') if run % 2 == 1 => 8,
            _ => {
                out.extend(std::iter::repeat_n('\\', run));
                continue;
            }
        };
        out.extend(std::iter::repeat_n('\\', run - 1));
        let escape_at = i - 1;
        i += 1; // the 'u' / 'U'
        let mut cp: u32 = 0;
        for _ in 0..ndigits {
            let d = s
                .get(i)
                .and_then(|&b| digit_value(b))
                .filter(|&d| d < 16)
                .ok_or(TextError::Bad("truncated \\uXXXX escape in UNICODE"))?;
            cp = cp * 16 + d;
            i += 1;
        }
        if (0xd800..=0xdfff).contains(&cp) {
            return Err(TextError::Surrogate(escape_at));
        }
        let ch = char::from_u32(cp).ok_or(TextError::Bad("\\U escape out of Unicode range in UNICODE"))?;
        out.push(ch);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn strtol_like_c() {
        assert_eq!(strtol_full(b"42"), Some(42));
        assert_eq!(strtol_full(b"-7"), Some(-7));
        assert_eq!(strtol_full(b" 1"), Some(1));
        assert_eq!(strtol_full(b"010"), Some(8));
        assert_eq!(strtol_full(b"0x1f"), Some(31));
        assert_eq!(strtol_full(b"0"), Some(0));
        assert_eq!(strtol_full(b"0x"), None);
        assert_eq!(strtol_full(b"12a"), None);
        assert_eq!(strtol_full(b"9223372036854775808"), None);
        assert_eq!(strtol_full(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(strtol_full(b""), None);
    }

    #[test]
    fn py_int_like_python() {
        assert_eq!(parse_py_int(b"123", 0, 4300), Ok(IntRepr::Small(123)));
        assert_eq!(parse_py_int(b" -0x_1F ", 0, 4300), Ok(IntRepr::Small(-31)));
        assert_eq!(parse_py_int(b"0o17", 0, 4300), Ok(IntRepr::Small(15)));
        assert_eq!(parse_py_int(b"0b101", 0, 4300), Ok(IntRepr::Small(5)));
        assert_eq!(parse_py_int(b"1_000", 0, 4300), Ok(IntRepr::Small(1000)));
        assert_eq!(parse_py_int(b"000", 0, 4300), Ok(IntRepr::Small(0)));
        assert!(parse_py_int(b"010", 0, 4300).is_err());
        assert_eq!(parse_py_int(b"010", 10, 4300), Ok(IntRepr::Small(10)));
        assert!(parse_py_int(b"1__0", 0, 4300).is_err());
        assert!(parse_py_int(b"_1", 0, 4300).is_err());
        assert!(parse_py_int(b"", 0, 4300).is_err());
        assert_eq!(
            parse_py_int(b"-18446744073709551616", 0, 4300),
            Ok(IntRepr::Big(vec![0, 0, 0, 0, 0, 0, 0, 0, 0xff]))
        );
        assert_eq!(parse_py_int(&[b'1'; 5000], 0, 4300), Err(TextError::TooManyDigits));
    }

    #[test]
    fn string_escapes() {
        assert_eq!(decode_string_literal(b"'a\\nb'").unwrap(), b"a\nb");
        assert_eq!(decode_string_literal(b"\"it's\"").unwrap(), b"it's");
        assert_eq!(decode_string_literal(b"'\\x00\\xff\\101\\q'").unwrap(), b"\x00\xffA\\q");
        assert_eq!(decode_string_literal(b"'\\777'").unwrap(), vec![0xff]);
        assert!(decode_string_literal(b"'\\x4'").is_err());
        assert!(decode_string_literal(b"abc").is_err());
        assert!(decode_string_literal(b"'").is_err());
        assert!(decode_string_literal(b"'\\'").is_err());
    }

    #[test]
    fn raw_unicode_escape() {
        assert_eq!(decode_raw_unicode_escape(b"abc").unwrap(), "abc");
        assert_eq!(decode_raw_unicode_escape(b"\\u20ac\xe9").unwrap(), "\u{20ac}\u{e9}");
        assert_eq!(decode_raw_unicode_escape(b"\\U0001f600").unwrap(), "\u{1f600}");
        assert_eq!(decode_raw_unicode_escape(b"\\\\u0041").unwrap(), "\\\\u0041");
        assert_eq!(decode_raw_unicode_escape(b"\\\\\\u0041").unwrap(), "\\\\A");
        assert_eq!(decode_raw_unicode_escape(b"a\\b").unwrap(), "a\\b");
        assert!(decode_raw_unicode_escape(b"\\u12").is_err());
        assert_eq!(decode_raw_unicode_escape(b"x\\ud800"), Err(TextError::Surrogate(1)));
        assert!(decode_raw_unicode_escape(b"\\U00110000").is_err());
    }
}
