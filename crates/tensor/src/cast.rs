//! Casting floating-point tensors to another floating-point dtype bit for bit as torch's `Tensor.to(dtype)`
//! does on the CPU.
//!
//! torch converts every floating-point dtype through `float` (f32): float8, float16 and bfloat16 widen to f32
//! exactly, float64 narrows to f32 with round-to-nearest-even, and f32 then narrows to the target with
//! round-to-nearest-even (so float64 → float16/bfloat16 rounds twice, as torch does), with subnormals kept
//! and values beyond the target's range becoming infinities. NaN payloads follow torch's portable CPU kernels
//! (`ATEN_CPU_CAPABILITY=default`): to bfloat16 every NaN is `0x7FC0`; float32 → float16 keeps the sign and
//! the top of the payload, quieted (`sign | 0x7E00 | mantissa >> 13`); every other dtype → float16 keeps the
//! sign only (`sign | 0x7E00`); float64 → float32 keeps the sign and the top of the payload, quieted; widening keeps
//! the payload, quieted. (torch's AVX2/AVX-512 kernels write some NaNs differently — bfloat16 NaNs as
//! `0xFFFF` — so NaN bits from torch depend on the CPU; ckpt's do not.) The conformance suite checks every
//! 8- and 16-bit input and a large sample of float32 and float64 inputs against torch.
//!
//! ```
//! use ckpt_tensor::{DType, Tensor};
//! let t = Tensor::from_slice(&[1.0f32, 65520.0, 1e-8, f32::NAN], &[4]).unwrap();
//! let h = ckpt_tensor::cast_float(&t, DType::F16).unwrap();
//! let back: Vec<f32> = h.to_vec::<half::f16>().unwrap().into_iter().map(f32::from).collect();
//! assert_eq!(back[..3], [1.0, f32::INFINITY, 0.0]);
//! assert!(back[3].is_nan());
//! ```

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Whether `dtype` is a floating-point dtype [`cast_float`] converts from.
pub fn is_castable_float(dtype: DType) -> bool {
    // Every floating-point dtype but the packed float4 and float6 ones, which torch does not convert.
    dtype.is_floating_point() && dtype.packed_values() == 1
}

/// `t` converted to `to` (float16, bfloat16, float32 or float64) as torch's `t.to(to)` converts it (module
/// docs); a tensor already of dtype `to` is returned as it is. The result is contiguous; `requires_grad` is
/// kept.
///
/// # Errors
/// [`Error::CastPacked`] when `t` is packed float4 or float6 (torch converts neither), [`Error::CastSource`]
/// when `t` is not floating point, [`Error::CastTarget`] when `to` is not one of the four targets;
/// [`Error::AllocationFailed`] when the result cannot be allocated.
pub fn cast_float(t: &Tensor, to: DType) -> Result<Tensor> {
    let from = t.dtype();
    if from.packed_values() > 1 {
        return Err(Error::CastPacked { from });
    }
    if !matches!(to, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
        return Err(Error::CastTarget { to });
    }
    if !is_castable_float(from) {
        return Err(Error::CastSource { from });
    }
    if from == to {
        return Ok(t.clone());
    }
    let data = t.data()?;
    let n = t.numel();
    let mut out = Vec::new();
    out.try_reserve_exact(n * to.size()).map_err(|_| Error::AllocationFailed { bytes: n * to.size() })?;
    convert_into(from, to, &data, &mut out);
    Ok(Tensor::from_buffer(to, t.shape(), Buffer::from_vec(out))?.with_requires_grad(t.requires_grad()))
}

/// [`cast_float`], made when its bytes are read: the result's bytes are converted from the source's, any
/// range of them on its own ([`Buffer::deferred_ranged`]), so that a writer streaming a cast checkpoint
/// holds a piece of one tensor at a time instead of every cast tensor. The bits are [`cast_float`]'s. A
/// tensor with lazy conjugation or negation bits is cast at once.
///
/// ```
/// use ckpt_tensor::{DType, Tensor};
/// let t = Tensor::from_slice(&[1.0f32, 2.5, -3.0], &[3]).unwrap();
/// let lazy = ckpt_tensor::cast::cast_float_lazy(&t, DType::BF16).unwrap();
/// assert!(lazy.storage().is_deferred());
/// assert!(lazy.bitwise_eq(&ckpt_tensor::cast_float(&t, DType::BF16).unwrap()));
/// ```
///
/// # Errors
/// As [`cast_float`], for the dtypes.
pub fn cast_float_lazy(t: &Tensor, to: DType) -> Result<Tensor> {
    let from = t.dtype();
    if from == to || t.is_conj() || t.is_neg() || t.nbytes() == 0 {
        return cast_float(t, to);
    }
    if !matches!(to, DType::F16 | DType::BF16 | DType::F32 | DType::F64) || !is_castable_float(from) {
        return cast_float(t, to);
    }
    let src = t.to_contiguous()?;
    let (fs, ts) = (from.size(), to.size());
    let total = t.numel() * ts;
    let fill_at = move |offset: usize, out: &mut [u8]| -> Result<()> {
        // The source elements that cover the bytes asked for.
        let first = offset / ts;
        let last = (offset + out.len()).div_ceil(ts);
        let window = src.storage().slice_len((src.storage_offset() + first) * fs, (last - first) * fs)?;
        let bytes = window.bytes()?;
        let mut made = Vec::with_capacity((last - first) * ts);
        convert_into(from, to, &bytes, &mut made);
        let skip = offset - first * ts;
        let part =
            made.get(skip..skip + out.len()).ok_or(Error::ByteRangeOutOfRange { offset, len: out.len(), total })?;
        out.copy_from_slice(part);
        Ok(())
    };
    Ok(Tensor::from_buffer(to, t.shape(), Buffer::deferred_ranged(total, fill_at))?
        .with_requires_grad(t.requires_grad()))
}

/// Appends to `out` the elements of `data` (little-endian `from`) converted to `to`.
fn convert_into(from: DType, to: DType, data: &[u8], out: &mut Vec<u8>) {
    let es = from.size();
    for chunk in data.chunks_exact(es) {
        let mut raw = [0u8; 8];
        raw[..es].copy_from_slice(chunk);
        let bits = u64::from_le_bytes(raw);
        match to {
            DType::F64 => out.extend_from_slice(&f32_to_f64(to_f32(from, bits)).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&to_f32(from, bits).to_le_bytes()),
            DType::F16 => {
                let f = to_f32(from, bits);
                let h = if from != DType::F32 && f32::from_bits(f).is_nan() {
                    ((f >> 16) as u16 & 0x8000) | 0x7E00
                } else {
                    f32_to_f16(f)
                };
                out.extend_from_slice(&h.to_le_bytes());
            }
            _ => out.extend_from_slice(&f32_to_bf16(to_f32(from, bits)).to_le_bytes()),
        }
    }
}

/// The f32 bits of one element of `from` (its little-endian bits in `bits`).
fn to_f32(from: DType, bits: u64) -> u32 {
    match from {
        DType::F32 => bits as u32,
        DType::F64 => f64_to_f32(bits),
        DType::BF16 => (bits as u32 & 0xFFFF) << 16,
        DType::F16 => f16_to_f32(bits as u16),
        DType::F8E5M2 => f16_to_f32((bits as u16 & 0xFF) << 8),
        DType::F8E4M3Fn => mini_to_f32(bits as u8, 4, 3, 7, Mini::Fn),
        DType::F8E4M3Fnuz => mini_to_f32(bits as u8, 4, 3, 8, Mini::Fnuz),
        DType::F8E5M2Fnuz => mini_to_f32(bits as u8, 5, 2, 16, Mini::Fnuz),
        _ => {
            // float8_e8m0fnu: 2^(e - 127), 0xFF is NaN.
            let e = bits as u8;
            match e {
                0xFF => 0x7F80_0001,
                0 => 0x0040_0000, // 2^-127, a float32 subnormal
                e => u32::from(e) << 23,
            }
        }
    }
}

const QUIET_NAN: u32 = 0x7FC0_0000;

/// How a float8 format spends its top codes.
#[derive(Clone, Copy, PartialEq)]
enum Mini {
    /// No infinities; all-ones exponent and mantissa is NaN (`e4m3fn`).
    Fn,
    /// No infinities, no negative zero; `0x80` is NaN (`fnuz`).
    Fnuz,
}

fn mini_to_f32(b: u8, ebits: u32, mbits: u32, bias: i32, kind: Mini) -> u32 {
    let sign = u32::from(b >> 7) << 31;
    let e = u32::from(b >> mbits) & ((1 << ebits) - 1);
    let m = u32::from(b) & ((1 << mbits) - 1);
    match kind {
        Mini::Fnuz if b == 0x80 => return 0x7F80_0001,
        Mini::Fn if e == (1 << ebits) - 1 && m == (1 << mbits) - 1 => {
            return sign | 0x7F80_0000 | (m << (23 - mbits));
        }
        _ => {}
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // Subnormal: m * 2^(1 - bias - mbits), exact in f32.
        let v = m as f32 * 2f32.powi(1 - bias - mbits as i32);
        return sign | v.to_bits();
    }
    let exp = e as i32 - bias + 127;
    sign | ((exp as u32) << 23) | (m << (23 - mbits))
}

/// float16 → float32, exact; a NaN keeps its payload, quieted.
fn f16_to_f32(h: u16) -> u32 {
    let sign = u32::from(h & 0x8000) << 16;
    let e = u32::from(h >> 10) & 0x1F;
    let m = u32::from(h) & 0x3FF;
    if e == 0x1F {
        return sign | 0x7F80_0000 | (m << 13) | if m != 0 { 0x0040_0000 } else { 0 };
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        let v = m as f32 * 2f32.powi(-24);
        return sign | v.to_bits();
    }
    sign | ((e + 112) << 23) | (m << 13)
}

/// float32 → float64, exact; a NaN keeps its payload, quieted.
fn f32_to_f64(f: u32) -> f64 {
    let x = f32::from_bits(f);
    if x.is_nan() {
        let sign = u64::from(f >> 31) << 63;
        return f64::from_bits(sign | 0x7FF8_0000_0000_0000 | (u64::from(f & 0x007F_FFFF) << 29));
    }
    f64::from(x)
}

/// float64 → float32, round to nearest even; a NaN keeps its sign and the top of its payload, quieted.
fn f64_to_f32(bits: u64) -> u32 {
    let x = f64::from_bits(bits);
    if x.is_nan() {
        let sign = ((bits >> 63) as u32) << 31;
        return sign | QUIET_NAN | ((bits >> 29) as u32 & 0x003F_FFFF);
    }
    // `as` rounds to nearest even (IEEE), overflowing to infinity and keeping subnormals.
    (x as f32).to_bits()
}

/// float32 → bfloat16, round to nearest even; every NaN is `0x7FC0`.
fn f32_to_bf16(f: u32) -> u16 {
    if f32::from_bits(f).is_nan() {
        return 0x7FC0;
    }
    let bias = 0x7FFF + ((f >> 16) & 1);
    (f.wrapping_add(bias) >> 16) as u16
}

/// float32 → float16, round to nearest even, subnormals kept, overflow to infinity; a NaN keeps its sign
/// and the top of its payload, quieted.
fn f32_to_f16(f: u32) -> u16 {
    let sign = ((f >> 16) & 0x8000) as u16;
    let e = ((f >> 23) & 0xFF) as i32;
    let m = f & 0x007F_FFFF;
    if e == 0xFF {
        return if m == 0 { sign | 0x7C00 } else { sign | 0x7E00 | (m >> 13) as u16 };
    }
    // Unbiased exponent for float16.
    let he = e - 127 + 15;
    if he >= 0x1F {
        return sign | 0x7C00;
    }
    if he <= 0 {
        // Subnormal (or zero) in float16: shift the full mantissa (with its hidden bit) right.
        if he < -10 {
            return sign; // below half the smallest subnormal: rounds to zero
        }
        let full = m | 0x0080_0000;
        let shift = (14 - he) as u32; // 13 + (1 - he)
        let half = 1u32 << (shift - 1);
        let rest = full & ((1u32 << shift) - 1);
        let mut v = full >> shift;
        if rest > half || (rest == half && v & 1 == 1) {
            v += 1;
        }
        return sign | v as u16;
    }
    let rest = m & 0x1FFF;
    let mut v = ((he as u32) << 10) | (m >> 13);
    if rest > 0x1000 || (rest == 0x1000 && v & 1 == 1) {
        v += 1; // may carry into the exponent, up to infinity: still correct
    }
    sign | v as u16
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lazy_cast_makes_any_range_as_the_eager_cast() {
        let v: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.3) * 1.7e-3).collect();
        let t = Tensor::from_slice(&v, &[10, 100]).unwrap().narrow(0, 2, 5).unwrap();
        for to in [DType::BF16, DType::F16, DType::F64] {
            let eager = cast_float(&t, to).unwrap();
            let lazy = cast_float_lazy(&t, to).unwrap();
            assert!(lazy.storage().is_deferred());
            let want = eager.data().unwrap().into_owned();
            assert_eq!(&*lazy.storage().slice(3..17).unwrap().bytes().unwrap(), &want[3..17]);
            let mut streamed = Vec::new();
            lazy.data_pieces(7, |p| {
                streamed.extend_from_slice(p);
                Ok::<(), Error>(())
            })
            .unwrap();
            assert_eq!(streamed, want);
        }
    }

    #[test]
    fn f16_matches_the_half_crate_on_every_non_nan() {
        // half's from_f32 rounds to nearest even; compare over a sweep of f32 bit patterns.
        let mut x = 0u32;
        while x < u32::MAX - 4093 {
            let f = f32::from_bits(x);
            if !f.is_nan() {
                assert_eq!(f32_to_f16(x), half::f16::from_f32(f).to_bits(), "{x:#x}");
            }
            x += 4093;
        }
        for h in 0..=u16::MAX {
            let f = half::f16::from_bits(h);
            if !f.is_nan() {
                assert_eq!(f16_to_f32(h), f.to_f32().to_bits(), "{h:#x}");
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(0x3F80_8000), 0x3F80); // tie, even stays
        assert_eq!(f32_to_bf16(0x3F81_8000), 0x3F82); // tie, odd rounds up
        assert_eq!(f32_to_bf16(0x7F7F_FFFF), 0x7F80); // max float rounds to inf
        assert_eq!(f32_to_bf16(0xFFC1_2345), 0x7FC0);
    }

    #[test]
    fn refuses_non_floats() {
        let t = Tensor::from_slice(&[1i64], &[1]).unwrap();
        assert!(cast_float(&t, DType::F16).is_err());
        let f = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
        assert!(cast_float(&f, DType::I32).is_err());
        // Packed float4/float6: torch's .to() converts neither way; the error says so.
        for d in [DType::F4E2M1FnX2, DType::F6E2M3FnX4] {
            let p = Tensor::zeros(d, &[2]).unwrap();
            let e = cast_float(&p, DType::BF16).unwrap_err();
            assert!(matches!(e, Error::CastPacked { from } if from == d), "{e}");
            assert_eq!(e.fault(), crate::Fault::Unsupported);
            assert!(matches!(cast_float_lazy(&p, DType::F32), Err(Error::CastPacked { .. })));
        }
        assert!(matches!(cast_float(&f, DType::F4E2M1FnX2), Err(Error::CastTarget { .. })));
        assert_eq!(cast_float(&f, DType::F64).unwrap().to_vec::<f64>().unwrap(), [1.0]);
    }
}
