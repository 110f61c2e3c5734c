//! GGUF metadata: the key-value pairs of the header (`gguf_type` in ggml's gguf.h, `GGUFValueType` in gguf-py).

use crate::GgufError;
use crate::cursor::Cursor;

/// Arrays nested deeper than this are refused ([`GgufError::NestingTooDeep`]): each level costs the parser a
/// stack frame, and no writer nests more than two.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// The type of a metadata value, with GGUF's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type of a GGUF code (0 to 12).
    pub fn from_code(code: u32) -> Option<ValueType> {
        Some(match code {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The GGUF code.
    pub fn code(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The name gguf-py gives the type (`UINT8`, `FLOAT32`, `STRING`, `ARRAY`).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "UINT8",
            ValueType::I8 => "INT8",
            ValueType::U16 => "UINT16",
            ValueType::I16 => "INT16",
            ValueType::U32 => "UINT32",
            ValueType::I32 => "INT32",
            ValueType::F32 => "FLOAT32",
            ValueType::Bool => "BOOL",
            ValueType::String => "STRING",
            ValueType::Array => "ARRAY",
            ValueType::U64 => "UINT64",
            ValueType::I64 => "INT64",
            ValueType::F64 => "FLOAT64",
        }
    }

    /// The fewest bytes a value of the type takes in a file (an empty string or array still has its header).
    pub(crate) fn min_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    /// A bool (one byte; any byte but 0 is true, as in ggml).
    Bool(bool),
    String(String),
    /// An array: its element type (as stored, also when empty) and its elements.
    Array(ValueType, Vec<MetadataValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetadataValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(..) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// Reads one value of type `value_type` at the cursor; `depth` counts the arrays around it.
    pub(crate) fn read(
        cursor: &mut Cursor<'_>,
        key: &str,
        value_type: ValueType,
        depth: usize,
    ) -> Result<MetadataValue, GgufError> {
        Ok(match value_type {
            ValueType::U8 => MetadataValue::U8(u8::from_le_bytes(cursor.array("a UINT8 value")?)),
            ValueType::I8 => MetadataValue::I8(i8::from_le_bytes(cursor.array("an INT8 value")?)),
            ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(cursor.array("a UINT16 value")?)),
            ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(cursor.array("an INT16 value")?)),
            ValueType::U32 => MetadataValue::U32(cursor.u32("a UINT32 value")?),
            ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(cursor.array("an INT32 value")?)),
            ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(cursor.array("a FLOAT32 value")?)),
            ValueType::Bool => MetadataValue::Bool(u8::from_le_bytes(cursor.array("a BOOL value")?) != 0),
            ValueType::String => MetadataValue::String(cursor.string(&format!("the value of {key:?}"))?),
            ValueType::U64 => MetadataValue::U64(cursor.u64("a UINT64 value")?),
            ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(cursor.array("an INT64 value")?)),
            ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(cursor.array("a FLOAT64 value")?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep { key: key.to_owned(), limit: MAX_ARRAY_DEPTH });
                }
                let code = cursor.u32("an array's element type")?;
                let element_type = ValueType::from_code(code)
                    .ok_or_else(|| GgufError::UnknownValueType { key: key.to_owned(), code })?;
                let count = cursor.u64("an array's length")?;
                let count = cursor.check_count(&format!("array {key:?}"), count, element_type.min_size())?;
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(MetadataValue::read(cursor, key, element_type, depth + 1)?);
                }
                MetadataValue::Array(element_type, items)
            }
        })
    }
}

impl MetadataValue {
    /// Appends the value's bytes (without its type code) as GGUF lays them out.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        match self {
            MetadataValue::U8(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I8(v) => out.extend(v.to_le_bytes()),
            MetadataValue::U16(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I16(v) => out.extend(v.to_le_bytes()),
            MetadataValue::U32(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I32(v) => out.extend(v.to_le_bytes()),
            MetadataValue::F32(v) => out.extend(v.to_le_bytes()),
            MetadataValue::Bool(v) => out.push(u8::from(*v)),
            MetadataValue::String(v) => write_string(out, v),
            MetadataValue::U64(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I64(v) => out.extend(v.to_le_bytes()),
            MetadataValue::F64(v) => out.extend(v.to_le_bytes()),
            MetadataValue::Array(element_type, items) => {
                out.extend(element_type.code().to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.write(out);
                }
            }
        }
    }
}

/// Appends a GGUF string: its u64 length, then its UTF-8 bytes.
pub(crate) fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl std::fmt::Display for MetadataValue {
    /// Scalars as they are, strings quoted, arrays in full (see [`crate::summarize`] for a short form).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetadataValue::U8(v) => write!(f, "{v}"),
            MetadataValue::I8(v) => write!(f, "{v}"),
            MetadataValue::U16(v) => write!(f, "{v}"),
            MetadataValue::I16(v) => write!(f, "{v}"),
            MetadataValue::U32(v) => write!(f, "{v}"),
            MetadataValue::I32(v) => write!(f, "{v}"),
            MetadataValue::F32(v) => write!(f, "{v:?}"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(v) => write!(f, "{v:?}"),
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v:?}"),
            MetadataValue::Array(_, items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// A value in at most about `width` characters: an array longer than that shows its type, its length and its
/// first elements (`[STRING; 32000] ["<unk>", "<s>", ...]`).
pub fn summarize(value: &MetadataValue, width: usize) -> String {
    let full = value.to_string();
    let MetadataValue::Array(element_type, items) = value else {
        return full;
    };
    if full.chars().count() <= width {
        return full;
    }
    let mut head = String::new();
    for item in items {
        let next = if head.is_empty() { item.to_string() } else { format!(", {item}") };
        if head.chars().count() + next.chars().count() > width {
            break;
        }
        head.push_str(&next);
    }
    format!("[{element_type}; {}] [{head}, ...]", items.len())
}
