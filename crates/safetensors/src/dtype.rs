//! The `safetensors` crate's dtypes and ckpt's [`DType`]s, one to one where both exist.

use ckpt_tensor::{DType, Result};

use crate::SafetensorsError;

/// The `safetensors` crate's dtype for `dtype`.
///
/// # Errors
/// [`SafetensorsError::UnstorableDtype`] for dtypes safetensors cannot hold (complex128, complex32, quantized,
/// bits).
pub fn safetensors_dtype(dtype: DType) -> Result<safetensors::Dtype> {
    use safetensors::Dtype as S;
    Ok(match dtype {
        DType::Bool => S::BOOL,
        DType::U8 => S::U8,
        DType::U16 => S::U16,
        DType::U32 => S::U32,
        DType::U64 => S::U64,
        DType::I8 => S::I8,
        DType::I16 => S::I16,
        DType::I32 => S::I32,
        DType::I64 => S::I64,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::F32 => S::F32,
        DType::F64 => S::F64,
        DType::C64 => S::C64,
        DType::F8E4M3Fn => S::F8_E4M3,
        DType::F8E5M2 => S::F8_E5M2,
        DType::F8E4M3Fnuz => S::F8_E4M3FNUZ,
        DType::F8E5M2Fnuz => S::F8_E5M2FNUZ,
        DType::F8E8M0Fnu => S::F8_E8M0,
        DType::F4E2M1FnX2 => S::F4,
        DType::F6E2M3FnX4 => S::F6_E2M3,
        DType::F6E3M2FnX4 => S::F6_E3M2,
        other => {
            return Err(SafetensorsError::UnstorableDtype { dtype: other }.into());
        }
    })
}

/// The dtype for a `safetensors` crate dtype.
///
/// # Errors
/// [`SafetensorsError::NoTorchDtype`] for safetensors dtypes ckpt has no equivalent for (none of
/// safetensors 0.8's: `F4` is torch's `float4_e2m1fn_x2`, the `F6_*` ckpt's float6 dtypes).
pub fn torch_dtype(d: safetensors::Dtype) -> Result<DType> {
    use safetensors::Dtype as S;
    Ok(match d {
        S::BOOL => DType::Bool,
        S::U8 => DType::U8,
        S::U16 => DType::U16,
        S::U32 => DType::U32,
        S::U64 => DType::U64,
        S::I8 => DType::I8,
        S::I16 => DType::I16,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        S::C64 => DType::C64,
        S::F8_E4M3 => DType::F8E4M3Fn,
        S::F8_E5M2 => DType::F8E5M2,
        S::F8_E4M3FNUZ => DType::F8E4M3Fnuz,
        S::F8_E5M2FNUZ => DType::F8E5M2Fnuz,
        S::F8_E8M0 => DType::F8E8M0Fnu,
        S::F4 => DType::F4E2M1FnX2,
        S::F6_E2M3 => DType::F6E2M3FnX4,
        S::F6_E3M2 => DType::F6E3M2FnX4,
        other => {
            return Err(SafetensorsError::NoTorchDtype { dtype: other }.into());
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_safetensors_code_round_trips() {
        let mut n = 0;
        for d in DType::ALL {
            if let Some(c) = d.safetensors_code() {
                let st = safetensors_dtype(d).unwrap();
                assert_eq!(torch_dtype(st).unwrap(), d);
                assert_eq!(st.to_string(), c);
                n += 1;
            } else {
                assert!(matches!(safetensors_dtype(d), Err(e) if e.fault() == ckpt_tensor::Fault::Unsupported), "{d}");
            }
        }
        assert_eq!(n, 22);
        assert_eq!(torch_dtype(safetensors::Dtype::F4).unwrap(), DType::F4E2M1FnX2);
        // The bits per value safetensors counts are ckpt's bytes per packed element.
        for d in [DType::F4E2M1FnX2, DType::F6E2M3FnX4, DType::F6E3M2FnX4] {
            assert_eq!(safetensors_dtype(d).unwrap().bitsize() * d.packed_values(), 8 * d.size(), "{d}");
        }
    }
}
