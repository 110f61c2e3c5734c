//! The dtype strings of RecIS data-file headers (`csrc/serialize/dtype_serialize.cc`).
//!
//! RecIS writes the safetensors codes `F64 F32 F16 BF16 I64 I32 I16 I8 U8` and, because of a bug, `bool`
//! (lower case) for `torch.bool`, which neither RecIS's own reader nor the safetensors library accepts. This
//! crate writes `BOOL` and reads both spellings.

use ckpt_tensor::DType;

use crate::error::{Error, Result};

/// The dtypes RecIS can write and read back, with their header strings as this crate writes them.
pub const WRITABLE: [(DType, &str); 10] = [
    (DType::F64, "F64"),
    (DType::F32, "F32"),
    (DType::F16, "F16"),
    (DType::BF16, "BF16"),
    (DType::I64, "I64"),
    (DType::I32, "I32"),
    (DType::I16, "I16"),
    (DType::I8, "I8"),
    (DType::U8, "U8"),
    (DType::Bool, "BOOL"),
];

/// The header string this crate writes for `dtype` (`BOOL` for bool, not RecIS's buggy `bool`).
///
/// # Errors
/// [`Error::UnsupportedDtype`] for dtypes RecIS cannot store (uint16/32/64, complex, float8, ...); `name` is
/// the tensor, for the message.
pub fn to_header(dtype: DType, name: &str) -> Result<&'static str> {
    WRITABLE
        .iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, s)| *s)
        .ok_or_else(|| Error::UnsupportedDtype { name: name.to_owned(), dtype })
}

/// The `torch_rank_weights_embs_table_multi_shard.json` name RecIS maps a header string to
/// (`SaveBundle::InitTypeMap`); strings outside the map (RecIS's own `bool`) give `""`, as `type_map_[…]`
/// does in C++.
pub fn torch_rank_name(header: &str) -> &'static str {
    match header {
        "F64" => "float64",
        "F32" => "float32",
        "F16" => "float16",
        "BF16" => "bfloat16",
        "I64" => "int64",
        "U64" => "uint64",
        "I32" => "int32",
        "U32" => "uint32",
        "I16" => "int16",
        "U16" => "uint16",
        "I8" => "int8",
        "U8" => "uint8",
        "BOOL" => "bool",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn strings() {
        for (d, s) in WRITABLE {
            assert_eq!(to_header(d, "t").unwrap(), s);
            assert_eq!(DType::from_safetensors_code(s), Some(d));
        }
        // The header parser (ckpt-safetensors) reads RecIS's lower-case `bool`.
        assert_eq!(DType::from_safetensors_code("bool"), Some(DType::Bool));
        assert_eq!(DType::from_safetensors_code("nonsense"), None);
        assert!(matches!(to_header(DType::U16, "t"), Err(Error::UnsupportedDtype { .. })));
        assert!(matches!(to_header(DType::C64, "t"), Err(Error::UnsupportedDtype { .. })));
        assert_eq!(torch_rank_name("bool"), "");
        assert_eq!(torch_rank_name("BOOL"), "bool");
        assert_eq!(torch_rank_name("BF16"), "bfloat16");
    }
}
