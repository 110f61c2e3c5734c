//! Dequantization of ggml blocks to f32, bit for bit as gguf-py's `gguf.quants.dequantize`.
//!
//! Every product and sum is one f32 operation in the order gguf-py's numpy code does it (no fused
//! multiply-add), so the values are the same to the bit. Scales stored as f16 widen exactly; a NaN's payload
//! is kept as `half` keeps it.

use half::f16;

use crate::{GgmlType, GgufError};

/// Values per super-block of the K-quants and the ternary types.
const QK_K: usize = 256;

/// The values of a 4-bit E2M1 code, doubled (ggml's `kvalues_mxfp4`).
const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Whether ckpt dequantizes the type (the plain float types included). The integer types and F64 are not
/// dequantized by gguf-py; ckpt reads them as their own dtype, and [`dequantize`] converts them as `as` does.
pub fn can_dequantize(ggml_type: GgmlType) -> bool {
    matches!(
        ggml_type,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::F64
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0
            | GgmlType::MXFP4
            | GgmlType::NVFP4
    )
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    let lo = bytes.get(at).copied().unwrap_or(0);
    let hi = bytes.get(at + 1).copied().unwrap_or(0);
    f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// Dequantizes `blocks`, whole blocks of `ggml_type`, into `out` (as many values as the blocks hold).
///
/// # Errors
/// [`GgufError::BlockLength`] when `blocks` and `out` are not the same whole number of blocks;
/// [`GgufError::NotDequantized`] for a type ckpt does not dequantize yet (the IQ types, Q8_1, Q8_K, Q1_0).
pub fn dequantize(ggml_type: GgmlType, blocks: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    let (block_size, type_size) = (ggml_type.block_size(), ggml_type.type_size());
    if !can_dequantize(ggml_type) {
        return Err(GgufError::NotDequantized { ggml_type });
    }
    let n_blocks = blocks.len() / type_size;
    if blocks.len() % type_size != 0 || n_blocks.checked_mul(block_size) != Some(out.len()) {
        return Err(GgufError::BlockLength {
            ggml_type,
            bytes: blocks.len(),
            values: out.len(),
            block_size,
            type_size,
        });
    }
    let pairs = blocks.chunks_exact(type_size).zip(out.chunks_exact_mut(block_size));
    match ggml_type {
        GgmlType::F32 => pairs.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => pairs.for_each(|(b, o)| o[0] = f16_at(b, 0)),
        GgmlType::BF16 => {
            pairs.for_each(|(b, o)| o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
        }
        GgmlType::F64 => pairs.for_each(|(b, o)| {
            o[0] = f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32;
        }),
        GgmlType::I8 => pairs.for_each(|(b, o)| o[0] = f32::from(b[0] as i8)),
        GgmlType::I16 => pairs.for_each(|(b, o)| o[0] = f32::from(i16::from_le_bytes([b[0], b[1]]))),
        GgmlType::I32 => pairs.for_each(|(b, o)| o[0] = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32),
        GgmlType::I64 => pairs.for_each(|(b, o)| {
            o[0] = i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32;
        }),
        GgmlType::Q4_0 => pairs.for_each(|(b, o)| q4_0(b, o)),
        GgmlType::Q4_1 => pairs.for_each(|(b, o)| q4_1(b, o)),
        GgmlType::Q5_0 => pairs.for_each(|(b, o)| q5_0(b, o)),
        GgmlType::Q5_1 => pairs.for_each(|(b, o)| q5_1(b, o)),
        GgmlType::Q8_0 => pairs.for_each(|(b, o)| q8_0(b, o)),
        GgmlType::Q2_K => pairs.for_each(|(b, o)| q2_k(b, o)),
        GgmlType::Q3_K => pairs.for_each(|(b, o)| q3_k(b, o)),
        GgmlType::Q4_K => pairs.for_each(|(b, o)| q4_k(b, o)),
        GgmlType::Q5_K => pairs.for_each(|(b, o)| q5_k(b, o)),
        GgmlType::Q6_K => pairs.for_each(|(b, o)| q6_k(b, o)),
        GgmlType::TQ1_0 => pairs.for_each(|(b, o)| tq1_0(b, o)),
        GgmlType::TQ2_0 => pairs.for_each(|(b, o)| tq2_0(b, o)),
        GgmlType::MXFP4 => pairs.for_each(|(b, o)| mxfp4(b, o)),
        GgmlType::NVFP4 => pairs.for_each(|(b, o)| nvfp4(b, o)),
        _ => return Err(GgufError::NotDequantized { ggml_type }),
    }
    Ok(())
}

// Each block function takes one block (`type_size` bytes) and its `block_size` values: the lengths are the
// table's (crate::ggml_type), so the constant indices below are in range.

/// Q4_0: f16 d, 16 bytes of nibbles (value j low, value j + 16 high); x = d * (q - 8).
fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        o[j] = d * f32::from((q & 0x0F) as i8 - 8);
        o[j + 16] = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// Q4_1: f16 d, f16 m, nibbles as Q4_0; x = d * q + m.
fn q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        o[j] = d * f32::from(q & 0x0F) + m;
        o[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The fifth bits of Q5_0 and Q5_1: a little-endian u32, bit j for value j.
fn high_bits(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Q5_0: f16 d, 32 fifth bits, nibbles as Q4_0; x = d * (q - 16).
fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = high_bits(b, 2);
    for j in 0..16 {
        let q = b[6 + j];
        let lo = (q & 0x0F) | (((qh >> j) & 1) as u8) << 4;
        let hi = (q >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        o[j] = d * f32::from(lo as i8 - 16);
        o[j + 16] = d * f32::from(hi as i8 - 16);
    }
}

/// Q5_1: f16 d, f16 m, 32 fifth bits, nibbles; x = d * q + m.
fn q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = high_bits(b, 4);
    for j in 0..16 {
        let q = b[8 + j];
        let lo = (q & 0x0F) | (((qh >> j) & 1) as u8) << 4;
        let hi = (q >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        o[j] = d * f32::from(lo) + m;
        o[j + 16] = d * f32::from(hi) + m;
    }
}

/// Q8_0: f16 d, 32 signed bytes; x = q * d.
fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        o[j] = f32::from(b[2 + j] as i8) * d;
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit values, f16 d, f16 dmin.
/// Value p = 128 h + 32 s + l is bits 2s of byte 32 h + l; x = (d * scale) * q - dmin * min of group p / 16.
fn q2_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for p in 0..QK_K {
        let (h, s, l) = (p / 128, (p % 128) / 32, p % 32);
        let q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
        let sc = b[p / 16];
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        o[p] = dl * f32::from(q) - ml;
    }
}

/// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, f16 d.
fn q3_k(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 108);
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let mut dl = [0f32; 16];
    for (i, dl) in dl.iter_mut().enumerate() {
        let low = if i < 8 { scales[i] & 0x0F } else { scales[i - 8] >> 4 };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        *dl = d * f32::from((low | (high << 4)) as i8 - 32);
    }
    for p in 0..QK_K {
        let (h, s, l) = (p / 128, (p % 128) / 32, p % 32);
        let ql = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
        // The high bit subtracts 4 where it is clear.
        let qh = ((hmask[l] >> (p / 32)) & 1) ^ 1;
        o[p] = dl[p / 16] * f32::from(ql - ((qh << 2) as i8));
    }
}

/// The 8 6-bit scales and 8 6-bit mins of Q4_K and Q5_K, packed in 12 bytes.
fn scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[4 + j] & 0x3F;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Q4_K: f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles. Sub-block j = 2 c + n of 32
/// values takes nibble n of bytes 32 c..32 c + 32; x = (d * scale) * q - dmin * min.
fn q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scales_mins(&b[4..16]);
    for j in 0..8 {
        let (dj, mj) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
        for l in 0..32 {
            let q = (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
            o[32 * j + l] = dj * f32::from(q) - mj;
        }
    }
}

/// Q5_K: Q4_K's layout with 32 bytes of fifth bits (bit j of byte l for value 32 j + l) before the nibbles.
fn q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scales_mins(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for j in 0..8 {
        let (dj, mj) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
        for l in 0..32 {
            let q = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) | (((qh[l] >> j) & 1) << 4);
            o[32 * j + l] = dj * f32::from(q) - mj;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed scales, f16 d;
/// x = (d * scale) * (q - 32).
fn q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for p in 0..QK_K {
        let h = p / 128;
        let lo = (ql[64 * h + p % 64] >> (4 * ((p % 128) / 64))) & 0x0F;
        let hi = (qh[32 * h + p % 32] >> (2 * ((p % 128) / 32))) & 3;
        let q = (lo | (hi << 4)) as i8 - 32;
        o[p] = (d * f32::from(scales[p / 16] as i8)) * f32::from(q);
    }
}

/// TQ1_0: 48 bytes of five base-3 digits each, 4 bytes of four, f16 d. Digit k of byte v is
/// ((v * 3^k mod 256) * 3) >> 8; x = d * (digit - 1).
fn tq1_0(b: &[u8], o: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let d = f16_at(b, 52);
    let digit = |v: u8, k: usize| ((u16::from(v.wrapping_mul(POW3[k])) * 3) >> 8) as i8 - 1;
    for k in 0..5 {
        for l in 0..32 {
            o[32 * k + l] = d * f32::from(digit(b[l], k));
        }
        for l in 0..16 {
            o[160 + 16 * k + l] = d * f32::from(digit(b[32 + l], k));
        }
    }
    for k in 0..4 {
        for l in 0..4 {
            o[240 + 4 * k + l] = d * f32::from(digit(b[48 + l], k));
        }
    }
}

/// TQ2_0: 64 bytes of 2-bit values (value 128 h + 32 s + l in bits 2s of byte 32 h + l), f16 d; x = d * (q - 1).
fn tq2_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 64);
    for (p, o) in o.iter_mut().enumerate().take(QK_K) {
        let (h, s, l) = (p / 128, (p % 128) / 32, p % 32);
        let q = ((b[32 * h + l] >> (2 * s)) & 3) as i8 - 1;
        *o = d * f32::from(q);
    }
}

/// MXFP4: an E8M0 scale byte (halved, as ggml's `ggml_e8m0_to_fp32_half`), 16 bytes of E2M1 codes (value j low
/// nibble, j + 16 high); x = scale * doubled E2M1 value.
fn mxfp4(b: &[u8], o: &mut [f32]) {
    let e = b[0];
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    let d = f32::from_bits(bits);
    for j in 0..16 {
        let q = b[1 + j];
        o[j] = d * f32::from(E2M1_DOUBLED[usize::from(q & 0x0F)]);
        o[j + 16] = d * f32::from(E2M1_DOUBLED[usize::from(q >> 4)]);
    }
}

/// The unsigned E4M3 scale of NVFP4, halved (gguf-py's `ue4m3_to_fp32`); 0 and 0x7F are zero.
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0x0F);
    let man = f32::from(x & 0x07);
    let raw = if exp == 0 { man * (1.0 / 512.0) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    raw * 0.5
}

/// NVFP4: four UE4M3 scale bytes, then four sub-blocks of 16 E2M1 codes in 8 bytes (low nibbles first, then
/// high nibbles); x = scale of the sub-block * doubled E2M1 value.
fn nvfp4(b: &[u8], o: &mut [f32]) {
    for s in 0..4 {
        let d = ue4m3_half(b[s]);
        for i in 0..8 {
            let q = b[4 + 8 * s + i];
            o[16 * s + i] = d * f32::from(E2M1_DOUBLED[usize::from(q & 0x0F)]);
            o[16 * s + 8 + i] = d * f32::from(E2M1_DOUBLED[usize::from(q >> 4)]);
        }
    }
}
