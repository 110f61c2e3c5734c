//! Little-endian two's complement integers (the LONG1/LONG4 payload form).

/// An integer in the form the [`Value`](crate::Value) model stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IntRepr {
    Small(i64),
    Big(Vec<u8>),
}

/// Drops redundant sign-extension bytes: the result is the shortest two's complement encoding (empty for 0).
pub(crate) fn minimize(b: &mut Vec<u8>) {
    while let [.., prev, last] = b.as_slice() {
        let redundant = (*last == 0x00 && prev & 0x80 == 0) || (*last == 0xff && prev & 0x80 != 0);
        if !redundant {
            break;
        }
        b.pop();
    }
    if b.as_slice() == [0] {
        b.clear();
    }
}

/// Interprets little-endian two's complement bytes (any length, any redundancy).
pub(crate) fn from_le_twos(bytes: &[u8]) -> IntRepr {
    let mut b = bytes.to_vec();
    minimize(&mut b);
    match to_i64(&b) {
        Some(v) => IntRepr::Small(v),
        None => IntRepr::Big(b),
    }
}

/// The value of minimal (or any) two's complement bytes of at most 8 bytes.
pub(crate) fn to_i64(b: &[u8]) -> Option<i64> {
    if b.len() > 8 {
        return None;
    }
    let negative = b.last().is_some_and(|&x| x & 0x80 != 0);
    let mut buf = if negative { [0xffu8; 8] } else { [0u8; 8] };
    for (dst, src) in buf.iter_mut().zip(b) {
        *dst = *src;
    }
    Some(i64::from_le_bytes(buf))
}

/// Minimal two's complement bytes of `v`, as CPython's `encode_long` produces them (empty for 0).
pub(crate) fn i64_to_le_min(v: i64) -> Vec<u8> {
    let mut b = v.to_le_bytes().to_vec();
    minimize(&mut b);
    b
}

/// Two's complement of a magnitude (little-endian unsigned bytes) with a sign, minimal.
pub(crate) fn from_sign_magnitude(negative: bool, magnitude_le: &[u8]) -> IntRepr {
    let mut b = Vec::with_capacity(magnitude_le.len().saturating_add(1));
    b.extend_from_slice(magnitude_le);
    b.push(0);
    if negative {
        let mut carry = true;
        for x in &mut b {
            let (r, c) = (!*x).overflowing_add(u8::from(carry));
            *x = r;
            carry = c;
        }
    }
    minimize(&mut b);
    match to_i64(&b) {
        Some(v) => IntRepr::Small(v),
        None => IntRepr::Big(b),
    }
}

/// Accumulates digits of `radix` into a little-endian magnitude of 32-bit limbs.
pub(crate) struct MagnitudeBuilder {
    limbs: Vec<u32>,
    radix: u32,
}

impl MagnitudeBuilder {
    pub(crate) fn new(radix: u32) -> Self {
        MagnitudeBuilder { limbs: Vec::new(), radix }
    }

    /// `self = self * radix + digit` (`digit < radix`).
    pub(crate) fn push_digit(&mut self, digit: u32) {
        let mut carry = u64::from(digit);
        for limb in &mut self.limbs {
            let v = u64::from(*limb) * u64::from(self.radix) + carry;
            *limb = v as u32; // low half; truncation intended
            carry = v >> 32;
        }
        if carry != 0 {
            self.limbs.push(carry as u32); // carry < 2^32 since radix <= 36
        }
    }

    /// The magnitude as little-endian bytes (possibly with trailing zero bytes).
    pub(crate) fn into_le_bytes(self) -> Vec<u8> {
        self.limbs.iter().flat_map(|l| l.to_le_bytes()).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn minimal_forms_match_cpython_encode_long() {
        // Values from CPython: pickle.encode_long(x).hex()
        assert_eq!(i64_to_le_min(0), Vec::<u8>::new());
        assert_eq!(i64_to_le_min(255), vec![0xff, 0x00]);
        assert_eq!(i64_to_le_min(-128), vec![0x80]);
        assert_eq!(i64_to_le_min(-129), vec![0x7f, 0xff]);
        assert_eq!(i64_to_le_min(1 << 31), vec![0, 0, 0, 0x80, 0]);
        assert_eq!(i64_to_le_min(i64::MIN), vec![0, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(i64_to_le_min(i64::MAX), vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    }

    #[test]
    fn le_twos_roundtrip() {
        for v in [0i64, 1, -1, 127, 128, -128, -129, 1 << 40, -(1 << 40), i64::MIN, i64::MAX] {
            assert_eq!(from_le_twos(&i64_to_le_min(v)), IntRepr::Small(v));
            let mut padded = v.to_le_bytes().to_vec();
            padded.extend_from_slice(&[if v < 0 { 0xff } else { 0 }; 3]);
            assert_eq!(from_le_twos(&padded), IntRepr::Small(v));
        }
        // 2**64
        assert_eq!(from_le_twos(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), IntRepr::Big(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
        // 2**63 needs 9 bytes
        assert_eq!(
            from_sign_magnitude(false, &[0, 0, 0, 0, 0, 0, 0, 0x80]),
            IntRepr::Big(vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0])
        );
        // -2**63 fits
        assert_eq!(from_sign_magnitude(true, &[0, 0, 0, 0, 0, 0, 0, 0x80]), IntRepr::Small(i64::MIN));
        assert_eq!(from_sign_magnitude(true, &[]), IntRepr::Small(0));
    }

    #[test]
    fn decimal_builder() {
        let mut m = MagnitudeBuilder::new(10);
        for d in "18446744073709551616".bytes() {
            m.push_digit(u32::from(d - b'0'));
        }
        assert_eq!(from_sign_magnitude(false, &m.into_le_bytes()), IntRepr::Big(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]));
    }
}
