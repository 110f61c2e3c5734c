//! Quantization of f32 values to ggml blocks, bit for bit as gguf-py's `gguf.quants.quantize`.
//!
//! Every step is the f32 operation gguf-py's numpy code does, in its order: the scale divided (not multiplied
//! by a reciprocal), its reciprocal taken once, the values multiplied by it, rounded as numpy rounds there
//! (`np.trunc(x + 8.5)` for Q4_0, `np_roundf`, half away from zero, for Q8_0), and the scales stored as f16
//! rounded to nearest even.

use half::f16;

use crate::{GgmlType, GgufError};

/// Whether ckpt quantizes to the type (what gguf-py quantizes and a conversion offers; TQ1_0/TQ2_0, ternary,
/// are left out).
pub fn can_quantize(ggml_type: GgmlType) -> bool {
    matches!(
        ggml_type,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::MXFP4
    )
}

/// Quantizes `values` (whole blocks of `ggml_type`) into `out` (their bytes).
///
/// # Errors
/// [`GgufError::BlockLength`] when `values` and `out` are not the same whole number of blocks;
/// [`GgufError::NotQuantized`] for a type ckpt does not quantize.
pub fn quantize(ggml_type: GgmlType, values: &[f32], out: &mut [u8]) -> Result<(), GgufError> {
    let (block_size, type_size) = (ggml_type.block_size(), ggml_type.type_size());
    if !can_quantize(ggml_type) {
        return Err(GgufError::NotQuantized { ggml_type });
    }
    let n_blocks = values.len() / block_size;
    if values.len() % block_size != 0 || n_blocks.checked_mul(type_size) != Some(out.len()) {
        return Err(GgufError::BlockLength {
            ggml_type,
            bytes: out.len(),
            values: values.len(),
            block_size,
            type_size,
        });
    }
    let pairs = values.chunks_exact(block_size).zip(out.chunks_exact_mut(type_size));
    match ggml_type {
        GgmlType::F32 => pairs.for_each(|(x, o)| o.copy_from_slice(&x[0].to_le_bytes())),
        GgmlType::F16 => pairs.for_each(|(x, o)| o.copy_from_slice(&f16::from_f32(x[0]).to_le_bytes())),
        GgmlType::BF16 => pairs.for_each(|(x, o)| o.copy_from_slice(&bf16_bits(x[0]).to_le_bytes())),
        GgmlType::Q8_0 => pairs.for_each(|(x, o)| q8_0(x, o)),
        GgmlType::Q4_0 => pairs.for_each(|(x, o)| q4_0(x, o)),
        GgmlType::Q4_1 => pairs.for_each(|(x, o)| q4_1(x, o)),
        GgmlType::Q5_0 => pairs.for_each(|(x, o)| q5_0(x, o)),
        GgmlType::Q5_1 => pairs.for_each(|(x, o)| q5_1(x, o)),
        GgmlType::MXFP4 => pairs.for_each(|(x, o)| mxfp4(x, o)),
        _ => return Err(GgufError::NotQuantized { ggml_type }),
    }
    Ok(())
}

/// ggml's `ggml_compute_fp32_to_bf16` (gguf-py's `BF16.quantize_blocks`): a NaN made quiet, the rest rounded
/// to nearest even.
fn bf16_bits(x: f32) -> u16 {
    let mut n = x.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        n = (n & 0xffff_0000) | (64 << 16);
    }
    ((u64::from(n) + 0x7fff + u64::from((n >> 16) & 1)) >> 16) as u16
}

fn put_f16(o: &mut [u8], at: usize, v: f32) {
    o[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The reciprocal of a scale, 0 for a zero scale (`np.where(d == 0, 0, 1 / d)`).
fn inverse(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// The value of largest magnitude, signed (the first of equals: `argmax` of `abs`).
fn signed_max(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((x[0], x[0]), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// numpy's `np.trunc(v).astype(np.uint8).clip(0, hi)` for the non-negative `v` the quantizers make.
fn trunc_clip(v: f32, hi: u8) -> u8 {
    (v.trunc() as u8).min(hi)
}

/// Q8_0: d = max |x| / 127, q = round half away from zero (x / d).
fn q8_0(x: &[f32], o: &mut [u8]) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    let id = inverse(d);
    put_f16(o, 0, d);
    for (j, v) in x.iter().enumerate() {
        o[2 + j] = ((v * id).round() as i8) as u8;
    }
}

/// Q4_0: d = (signed max) / -8, q = trunc(x / d + 8.5) clipped to 15, value j low nibble and j + 16 high.
fn q4_0(x: &[f32], o: &mut [u8]) {
    let d = signed_max(x) / -8.0;
    let id = inverse(d);
    put_f16(o, 0, d);
    let q = |v: f32| trunc_clip(v * id + 8.5, 15);
    for j in 0..16 {
        o[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Q4_1: d = (max - min) / 15, q = trunc((x - min) / d + 0.5) clipped to 15.
fn q4_1(x: &[f32], o: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_f16(o, 0, d);
    put_f16(o, 2, min);
    let q = |v: f32| trunc_clip((v - min) * id + 0.5, 15);
    for j in 0..16 {
        o[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// The nibbles and fifth bits of 32 5-bit values: (low nibbles packed as Q4_0, bit j of a u32 for value j).
fn pack5(q: &[u8; 32]) -> ([u8; 16], u32) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | (q[j + 16] << 4);
    }
    for (j, v) in q.iter().enumerate() {
        qh |= u32::from((v >> 4) & 1) << j;
    }
    (qs, qh)
}

/// Q5_0: d = (signed max) / -16, q = trunc(x / d + 16.5) clipped to 31.
fn q5_0(x: &[f32], o: &mut [u8]) {
    let d = signed_max(x) / -16.0;
    let id = inverse(d);
    let mut q = [0u8; 32];
    for (q, v) in q.iter_mut().zip(x) {
        *q = trunc_clip(v * id + 16.5, 31);
    }
    let (qs, qh) = pack5(&q);
    put_f16(o, 0, d);
    o[2..6].copy_from_slice(&qh.to_le_bytes());
    o[6..22].copy_from_slice(&qs);
}

/// Q5_1: d = (max - min) / 31, q = trunc((x - min) / d + 0.5) clipped to 31.
fn q5_1(x: &[f32], o: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let mut q = [0u8; 32];
    for (q, v) in q.iter_mut().zip(x) {
        *q = trunc_clip((v - min) * id + 0.5, 31);
    }
    let (qs, qh) = pack5(&q);
    put_f16(o, 0, d);
    put_f16(o, 2, min);
    o[4..8].copy_from_slice(&qh.to_le_bytes());
    o[8..24].copy_from_slice(&qs);
}

/// The values of a 4-bit E2M1 code, doubled (ggml's `kvalues_mxfp4`).
const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4: the shared exponent e = floor(log2(max |x|)) - 2 + 127 (0 for an all-zero block), the scale its
/// halved E8M0 value, each value the code whose doubled E2M1 value times the scale is nearest (the first of
/// equals), value j low nibble and j + 16 high.
fn mxfp4(x: &[f32], o: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    let d = f32::from_bits(bits);
    let code = |v: f32| {
        let mut best = 0u8;
        let mut best_err = f32::INFINITY;
        for (k, kv) in E2M1_DOUBLED.iter().enumerate() {
            let err = (d * f32::from(*kv) - v).abs();
            if err < best_err {
                best_err = err;
                best = k as u8;
            }
        }
        best
    };
    o[0] = e;
    for j in 0..16 {
        o[1 + j] = code(x[j]) | (code(x[j + 16]) << 4);
    }
}
