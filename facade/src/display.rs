//! Printing tensor values numpy-style, for every dtype (float8 and float4 decoded by their bit layouts: an
//! FP4 element as its pair of values, a float6 one as its three bytes).

use ckpt_tensor::tensor::contiguous_strides;
use ckpt_tensor::{DType, Tensor};

/// Decodes a minifloat with `e` exponent bits and `m` mantissa bits.
///
/// `fn_` formats (e4m3fn) have no infinities and NaN = all ones; `fnuz` formats have no negative zero, and
/// 0x80 is NaN.
fn minifloat(bits: u8, e: u32, m: u32, bias: i32, kind: MiniKind) -> f64 {
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> m) & ((1 << e) - 1) as u8);
    let man = f64::from(bits & ((1 << m) - 1) as u8);
    let max_exp = (1 << e) - 1;
    match kind {
        MiniKind::Fnuz if bits == 0x80 => return f64::NAN,
        MiniKind::Fn if bits & 0x7F == 0x7F => return f64::NAN,
        MiniKind::Ieee if exp == max_exp => return if man == 0.0 { sign * f64::INFINITY } else { f64::NAN },
        _ => {}
    }
    let scale = f64::from(1u32 << m);
    if exp == 0 {
        sign * (man / scale) * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + man / scale) * 2f64.powi(exp - bias)
    }
}

#[derive(Clone, Copy)]
enum MiniKind {
    Ieee,
    Fn,
    Fnuz,
}

fn le<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    for (d, s) in a.iter_mut().zip(b) {
        *d = *s;
    }
    a
}

fn float_text(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf".into() } else { "-inf".into() }
    } else if f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.0}.")
    } else {
        format!("{f:.4}")
    }
}

/// One element of a real dtype as `f64` (integers, bool, float16/bfloat16, every float8 layout), from its
/// little-endian bytes; `None` for complex, quantized, packed and opaque dtypes. Integers beyond 2^53 round
/// to the nearest `f64`.
///
/// ```
/// use ckpt::display::element_f64;
/// use ckpt::tensor::DType;
/// assert_eq!(element_f64(DType::BF16, &[0x80, 0x3f]), Some(1.0));
/// assert_eq!(element_f64(DType::F8E4M3Fn, &[0x38]), Some(1.0));
/// assert_eq!(element_f64(DType::C64, &[0; 8]), None);
/// ```
pub fn element_f64(dtype: DType, b: &[u8]) -> Option<f64> {
    let byte = b.first().copied().unwrap_or(0);
    Some(match dtype {
        DType::Bool => f64::from(u8::from(byte != 0)),
        DType::U8 => f64::from(byte),
        DType::I8 => f64::from(i8::from_le_bytes(le(b))),
        DType::U16 => f64::from(u16::from_le_bytes(le(b))),
        DType::I16 => f64::from(i16::from_le_bytes(le(b))),
        DType::U32 => f64::from(u32::from_le_bytes(le(b))),
        DType::I32 => f64::from(i32::from_le_bytes(le(b))),
        #[allow(clippy::cast_precision_loss)]
        DType::U64 => u64::from_le_bytes(le(b)) as f64,
        #[allow(clippy::cast_precision_loss)]
        DType::I64 => i64::from_le_bytes(le(b)) as f64,
        DType::F16 => f64::from(half::f16::from_le_bytes(le(b)).to_f32()),
        DType::BF16 => f64::from(half::bf16::from_le_bytes(le(b)).to_f32()),
        DType::F32 => f64::from(f32::from_le_bytes(le(b))),
        DType::F64 => f64::from_le_bytes(le(b)),
        DType::F8E4M3Fn => minifloat(byte, 4, 3, 7, MiniKind::Fn),
        DType::F8E5M2 => minifloat(byte, 5, 2, 15, MiniKind::Ieee),
        DType::F8E4M3Fnuz => minifloat(byte, 4, 3, 8, MiniKind::Fnuz),
        DType::F8E5M2Fnuz => minifloat(byte, 5, 2, 16, MiniKind::Fnuz),
        DType::F8E8M0Fnu => {
            if byte == 0xFF {
                f64::NAN
            } else {
                2f64.powi(i32::from(byte) - 127)
            }
        }
        _ => return None,
    })
}

/// One element's text.
fn element(dtype: DType, b: &[u8]) -> String {
    match dtype {
        DType::Bool => if b.first().copied().unwrap_or(0) != 0 { "True" } else { "False" }.into(),
        DType::U8 | DType::QUInt8 | DType::QUInt4x2 | DType::QUInt2x4 => b.first().copied().unwrap_or(0).to_string(),
        DType::I8 | DType::QInt8 => i8::from_le_bytes(le(b)).to_string(),
        DType::U16 => u16::from_le_bytes(le(b)).to_string(),
        DType::I16 => i16::from_le_bytes(le(b)).to_string(),
        DType::U32 => u32::from_le_bytes(le(b)).to_string(),
        DType::I32 | DType::QInt32 => i32::from_le_bytes(le(b)).to_string(),
        DType::U64 => u64::from_le_bytes(le(b)).to_string(),
        DType::I64 => i64::from_le_bytes(le(b)).to_string(),
        DType::F16 => float_text(f64::from(half::f16::from_le_bytes(le(b)).to_f32())),
        DType::BF16 => float_text(f64::from(half::bf16::from_le_bytes(le(b)).to_f32())),
        DType::F32 => float_text(f64::from(f32::from_le_bytes(le(b)))),
        DType::F64 => float_text(f64::from_le_bytes(le(b))),
        DType::C32 => {
            let re = half::f16::from_le_bytes(le(b)).to_f32();
            let im = half::f16::from_le_bytes(le(b.get(2..).unwrap_or_default())).to_f32();
            format!("{}{:+}j", float_text(f64::from(re)), im)
        }
        DType::C64 => {
            let re = f32::from_le_bytes(le(b));
            let im = f32::from_le_bytes(le(b.get(4..).unwrap_or_default()));
            format!("{}{:+}j", float_text(f64::from(re)), im)
        }
        DType::C128 => {
            let re = f64::from_le_bytes(le(b));
            let im = f64::from_le_bytes(le(b.get(8..).unwrap_or_default()));
            format!("{}{:+}j", float_text(re), im)
        }
        DType::F8E4M3Fn => float_text(minifloat(b.first().copied().unwrap_or(0), 4, 3, 7, MiniKind::Fn)),
        DType::F8E5M2 => float_text(minifloat(b.first().copied().unwrap_or(0), 5, 2, 15, MiniKind::Ieee)),
        DType::F8E4M3Fnuz => float_text(minifloat(b.first().copied().unwrap_or(0), 4, 3, 8, MiniKind::Fnuz)),
        DType::F8E5M2Fnuz => float_text(minifloat(b.first().copied().unwrap_or(0), 5, 2, 16, MiniKind::Fnuz)),
        DType::F8E8M0Fnu => {
            let v = b.first().copied().unwrap_or(0);
            float_text(if v == 0xFF { f64::NAN } else { 2f64.powi(i32::from(v) - 127) })
        }
        DType::F4E2M1FnX2 => {
            // Two FP4 values, the low nibble first (as torch and safetensors pack them).
            let v = b.first().copied().unwrap_or(0);
            format!("({}, {})", float_text(fp4(v & 0x0F)), float_text(fp4(v >> 4)))
        }
        DType::F6E2M3FnX4 | DType::F6E3M2FnX4 => {
            // Four float6 values in three bytes: the bytes, as safetensors holds them.
            let hex: String = b.iter().take(3).map(|x| format!("{x:02x}")).collect();
            format!("0x{hex}")
        }
        _ => format!("0x{:02x}", b.first().copied().unwrap_or(0)),
    }
}

/// The value of an FP4 (e2m1, OCP MX) code, its low 4 bits: sign, 2 exponent bits (bias 1), 1 mantissa
/// bit; no infinities or NaN.
fn fp4(code: u8) -> f64 {
    const MAGNITUDES: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let magnitude = MAGNITUDES.get(usize::from(code & 0x07)).copied().unwrap_or(0.0);
    if code & 0x08 != 0 { -magnitude } else { magnitude }
}

/// Formats a tensor's values numpy-style: nested brackets, at most `edgeitems` values at each end of a
/// dimension (`...` between), all values when `edgeitems` is 0.
///
/// ```
/// use ckpt::display::format_tensor;
/// use ckpt::tensor::Tensor;
/// let t = Tensor::from_slice(&[1.0f32, 2.5, 3.0, 4.0], &[2, 2]).unwrap();
/// assert_eq!(format_tensor(&t, 3), "[[1., 2.5000],\n [3., 4.]]");
/// ```
pub fn format_tensor(t: &Tensor, edgeitems: usize) -> String {
    let data = match t.data() {
        Ok(d) => d,
        Err(e) => return format!("<{e}>"),
    };
    let es = t.dtype().size();
    let mut out = String::new();
    if t.dim() == 0 {
        return element(t.dtype(), data.get(..es).unwrap_or_default());
    }
    let strides = contiguous_strides(t.shape());
    fmt_dim(&mut out, t, &data, &strides, 0, 0, edgeitems);
    out
}

fn fmt_dim(out: &mut String, t: &Tensor, data: &[u8], strides: &[usize], dim: usize, base: usize, edge: usize) {
    let n = t.shape()[dim];
    let es = t.dtype().size();
    out.push('[');
    let show = |i: usize| edge == 0 || n <= 2 * edge || i < edge || i >= n - edge;
    let mut skipped = false;
    let mut first = true;
    for i in 0..n {
        if !show(i) {
            if !skipped {
                out.push_str(if dim + 1 == t.dim() { ", ..." } else { ",\n..." });
                skipped = true;
            }
            continue;
        }
        if !first {
            out.push(',');
            if dim + 1 == t.dim() {
                out.push(' ');
            } else {
                out.push('\n');
                out.push_str(&" ".repeat(dim + 1));
            }
        }
        first = false;
        let off = base + i * strides[dim];
        if dim + 1 == t.dim() {
            out.push_str(&element(t.dtype(), data.get(off * es..off * es + es).unwrap_or_default()));
        } else {
            fmt_dim(out, t, data, strides, dim + 1, off, edge);
        }
    }
    out.push(']');
}

/// Formats a quantized, sparse or nested tensor: a line with its dtype, layout and shape (and a per-channel
/// axis), then each component by name, numpy-style ([`format_tensor`]).
///
/// ```
/// use ckpt::display::format_composite;
/// use ckpt::tensor::{Composite, DType, Layout, Tensor};
/// let parts = vec![Tensor::from_slice(&[5u8, 9], &[2])?, Tensor::from_slice(&[0.5f64], &[])?, Tensor::from_slice(&[1i64], &[])?];
/// let q = Composite::new(Layout::PerTensorAffine, DType::QUInt8, vec![2], parts)?;
/// assert_eq!(format_composite(&q, 3), "quint8 per_tensor_affine tensor of shape [2]\nint_repr: [5, 9]\nscale: 0.5000\nzero_point: 1");
/// # Ok::<(), ckpt::tensor::Error>(())
/// ```
pub fn format_composite(c: &ckpt_tensor::Composite, edgeitems: usize) -> String {
    let mut out = format!("{} {} tensor of shape {:?}", c.dtype.torch_name(), c.layout, c.shape);
    if let Some(axis) = c.axis {
        out.push_str(&format!(" (axis {axis})"));
    }
    for (name, t) in c.named_components() {
        let text = format_tensor(t, edgeitems).replace('\n', &format!("\n{}", " ".repeat(name.len() + 2)));
        out.push_str(&format!("\n{name}: {text}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn packed_floats() {
        // FP4 codes as ml_dtypes.float4_e2m1fn decodes them: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
        let codes: Vec<f64> = (0..16).map(fp4).collect();
        assert_eq!(codes[..8], [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
        assert!(codes[8] == 0.0 && codes[8].is_sign_negative() && codes[15] == -6.0);
        assert_eq!(element(DType::F4E2M1FnX2, &[0xF2]), "(1., -6.)");
        assert_eq!(element(DType::F6E2M3FnX4, &[0x3F, 0xC1, 0x5A]), "0x3fc15a");
        assert_eq!(element_f64(DType::F4E2M1FnX2, &[0x22]), None, "packed: compared bitwise");
    }

    #[test]
    fn minifloats() {
        assert_eq!(minifloat(0x38, 4, 3, 7, MiniKind::Fn), 1.0);
        assert_eq!(minifloat(0x7E, 4, 3, 7, MiniKind::Fn), 448.0);
        assert!(minifloat(0x7F, 4, 3, 7, MiniKind::Fn).is_nan());
        assert_eq!(minifloat(0x3C, 5, 2, 15, MiniKind::Ieee), 1.0);
        assert_eq!(minifloat(0x7C, 5, 2, 15, MiniKind::Ieee), f64::INFINITY);
        assert!(minifloat(0x80, 4, 3, 8, MiniKind::Fnuz).is_nan());
        assert_eq!(minifloat(0x40, 4, 3, 8, MiniKind::Fnuz), 1.0);
    }

    #[test]
    fn summarises() {
        let t = Tensor::from_slice(&(0..10i64).collect::<Vec<_>>(), &[10]).unwrap();
        assert_eq!(format_tensor(&t, 2), "[0, 1, ..., 8, 9]");
        assert_eq!(format_tensor(&t, 0), "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]");
        let s = Tensor::from_slice(&[7i32], &[]).unwrap();
        assert_eq!(format_tensor(&s, 3), "7");
    }
}
