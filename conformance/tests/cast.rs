//! `--dtype`'s float conversions against torch: `ckpt_tensor::cast_float` gives torch's `Tensor.to()` bytes bit
//! for bit, on every bit pattern of the 8- and 16-bit float dtypes and on a large sample of float32 and
//! float64 inputs (edge values, rounding ties, double-rounding cases, subnormals, overflow, NaN payloads,
//! and pseudo-random bit patterns).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_conformance::run_python;
use ckpt_tensor::{Buffer, DType, Tensor, cast_float};

const TARGETS: [DType; 4] = [DType::BF16, DType::F16, DType::F32, DType::F64];

/// A deterministic 64-bit generator (splitmix64).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn f32_inputs() -> Vec<u32> {
    let mut v: Vec<u32> = Vec::new();
    // Every exponent with mantissas around the float16 and bfloat16 rounding points (ties, just below and
    // above), both signs; subnormals; NaN payloads; infinities.
    for sign in [0u32, 0x8000_0000] {
        for e in 0..=255u32 {
            for m in [
                0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x1_8000, 0x40_0000,
                0x7F_FFFF, 0x7F_E000, 0x7F_F000,
            ] {
                v.push(sign | (e << 23) | m);
            }
        }
    }
    let mut r = Mix(1);
    v.extend((0..1 << 18).map(|_| r.next() as u32));
    v
}

fn f64_inputs() -> Vec<u64> {
    let mut v: Vec<u64> = Vec::new();
    for sign in [0u64, 1 << 63] {
        for e in (0..=2047u64).step_by(3).chain([
            0,
            1,
            2046,
            2047,
            1023 - 126,
            1023 - 127,
            1023 - 149,
            1023 - 150,
            1023 + 127,
            1023 + 128,
            1023 - 14,
            1023 - 24,
            1023 - 25,
            1023 + 15,
            1023 + 16,
        ]) {
            for m in [
                0u64,
                1,
                1 << 28,
                (1 << 28) + 1,
                1 << 29,
                1 << 41,
                (1 << 41) + 1,
                1 << 42,
                (1 << 51) + 1,
                (1 << 52) - 1,
                0x8_0000_0000_0001,
                0x4_0000_0000_0000,
            ] {
                v.push(sign | (e << 52) | m);
            }
        }
    }
    // Double rounding: 1 + 2^-11 + 2^-40 rounds to 1 + 2^-11 in float32, then ties to 1.0 in float16.
    v.extend(
        [
            1.0f64 + 2f64.powi(-11) + 2f64.powi(-40),
            1.0 + 2f64.powi(-8) + 2f64.powi(-40),
            65520.0 - 2f64.powi(-30),
            65519.99,
        ]
        .map(f64::to_bits),
    );
    let mut r = Mix(2);
    v.extend((0..1 << 18).map(|_| r.next()));
    // Values in float32's range with random mantissas.
    v.extend((0..1 << 16).map(|_| {
        let x = r.next();
        (x & 0x800F_FFFF_FFFF_FFFF) | (((x >> 52) % 300 + 1023 - 150) << 52)
    }));
    v
}

fn bytes_of<const N: usize>(items: impl IntoIterator<Item = [u8; N]>) -> Vec<u8> {
    items.into_iter().flatten().collect()
}

#[test]
fn cast_float_is_torch_to_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let sources: Vec<(DType, Vec<u8>)> = vec![
        (DType::F16, bytes_of((0..=u16::MAX).map(u16::to_le_bytes))),
        (DType::BF16, bytes_of((0..=u16::MAX).map(u16::to_le_bytes))),
        (DType::F8E4M3Fn, (0..=255u8).collect()),
        (DType::F8E5M2, (0..=255u8).collect()),
        (DType::F8E4M3Fnuz, (0..=255u8).collect()),
        (DType::F8E5M2Fnuz, (0..=255u8).collect()),
        (DType::F8E8M0Fnu, (0..=255u8).collect()),
        (DType::F32, bytes_of(f32_inputs().into_iter().map(u32::to_le_bytes))),
        (DType::F64, bytes_of(f64_inputs().into_iter().map(u64::to_le_bytes))),
    ];
    let spec = serde_json::json!({
        "inputs": sources.iter().map(|(d, _)| serde_json::json!({"file": d.torch_name(), "dtype": d.torch_name()})).collect::<Vec<_>>(),
        "targets": TARGETS.map(|d| d.torch_name()),
    });
    std::fs::write(dir.path().join("spec.json"), spec.to_string()).unwrap();
    for (d, bytes) in &sources {
        std::fs::write(dir.path().join(d.torch_name()), bytes).unwrap();
    }
    run_python("cast/torch_to.py", &[dir.path()]);
    let mut compared = 0usize;
    for (from, bytes) in &sources {
        let n = bytes.len() / from.size();
        let t = Tensor::from_buffer(*from, &[n], Buffer::copy_from(bytes).unwrap()).unwrap();
        for to in TARGETS {
            let ours = cast_float(&t, to).unwrap();
            let ours = ours.data().unwrap();
            let theirs = std::fs::read(dir.path().join(format!("{}.{}", from.torch_name(), to.torch_name()))).unwrap();
            assert_eq!(ours.len(), theirs.len(), "{from} -> {to}");
            let es = to.size();
            let bad: Vec<String> = ours
                .chunks(es)
                .zip(theirs.chunks(es))
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .take(8)
                .map(|(i, (a, b))| {
                    let src = &bytes[i * from.size()..(i + 1) * from.size()];
                    format!("input {src:02x?}: ckpt {a:02x?}, torch {b:02x?}")
                })
                .collect();
            assert!(bad.is_empty(), "{from} -> {to}: {}", bad.join("; "));
            compared += n;
        }
    }
    assert!(compared > 2_000_000, "{compared}");
}
