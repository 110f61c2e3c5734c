//! The ggml tensor types (`enum ggml_type` in ggml.h, `GGMLQuantizationType` in gguf-py): codes, names, and
//! the block each type packs its values in.

use ckpt_tensor::DType;

/// Values per block of the K-quants and the IQ types with 256-value super-blocks.
const QK_K: usize = 256;

/// A ggml tensor type: a plain element type (F32, F16, ..., I64) or a quantization that packs `block_size`
/// values into `type_size` bytes.
///
/// The codes are ggml's (`ggml_type`), as GGUF tensor infos store them. Codes ggml retired (4, 5, 31 to 33,
/// 36 to 38) and codes beyond the newest known are not types: [`GgmlType::from_code`] gives `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types, missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// Every type, in code order: (type, code, name, values per block, bytes per block).
const TABLE: [(GgmlType, u32, &str, usize, usize); 34] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 2 + 16),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 2 + 32),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 4 + 4 + 32),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 2 + 4 * 13),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 2 + 64),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 1 + 16),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 4 + 32),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 2 + 16),
];

impl GgmlType {
    fn row(self) -> (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has its row: the table lists each once (the `table_lists_every_type` test).
        TABLE.iter().copied().find(|row| row.0 == self).unwrap_or((self, u32::MAX, "?", 1, 1))
    }

    /// The type of a ggml code, or `None` for a code that is no (longer a) type.
    pub fn from_code(code: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1 == code).map(|row| row.0)
    }

    /// The type of a name as ggml and gguf-py spell it (`"Q4_K"`, `"F16"`), in any case.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.2.eq_ignore_ascii_case(name)).map(|row| row.0)
    }

    /// Every type, in code order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    /// ggml's code of the type.
    pub fn code(self) -> u32 {
        self.row().1
    }

    /// The name as ggml and gguf-py spell it (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Values per block (1 for the plain types).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// The torch dtype of a plain type's elements (F32, F16, BF16, F64, I8 to I64); `None` for a quantization.
    pub fn plain_dtype(self) -> Option<DType> {
        match self {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            GgmlType::F64 => Some(DType::F64),
            GgmlType::I8 => Some(DType::I8),
            GgmlType::I16 => Some(DType::I16),
            GgmlType::I32 => Some(DType::I32),
            GgmlType::I64 => Some(DType::I64),
            _ => None,
        }
    }

    /// Whether the type keeps every value exactly as written (the plain types); a quantization loses precision.
    pub fn is_lossless(self) -> bool {
        self.plain_dtype().is_some()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn table_lists_every_type() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(GgmlType::from_code(row.1), Some(row.0));
            assert_eq!(GgmlType::from_name(row.2), Some(row.0));
            assert_eq!(row.0.code(), row.1);
            assert!(TABLE.iter().skip(i + 1).all(|other| other.0 != row.0 && other.1 != row.1));
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_code(retired), None);
        }
    }
}
