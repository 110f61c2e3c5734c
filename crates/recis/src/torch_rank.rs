//! `torch_rank_weights_embs_table_multi_shard.json`: an informational summary of every block for external
//! consumers. RecIS never reads it; this crate writes it as RecIS's serializer (INIT,
//! `SaveBundle::MergeTorchRankJson`) does and ignores it on read.
//!
//! Per on-disk key, sorted, `dump(4)`:
//! * dense blocks: `{dense: true, dimension: 0, dtype: <torch name>, is_hashmap: false, name, shape}`;
//! * table keys containing `.embedding`: `{dense: false, dimension: shape[-1], dtype: <torch name>,
//!   hashmap_key: <key with the first ".embedding" replaced by ".id">, hashmap_key_dtype: "int64",
//!   hashmap_value: key, is_hashmap: true, name, shape}`;
//! * other table keys (ids, optimizer and filter slots), raw: `{data_offsets, dense: false, dtype: <header
//!   string>, shape}`.

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use crate::dtype;
use crate::tensorkey::dump4;

/// The name of the file.
pub const TORCH_RANK_FILE: &str = "torch_rank_weights_embs_table_multi_shard.json";

/// One block as the per-writer temporary metadata records it (the header entry plus `dense`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEntry {
    /// On-disk key.
    pub key: String,
    /// Header dtype string.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Offsets within its data file's data region.
    pub data_offsets: (usize, usize),
    /// Whether the block is a dense tensor.
    pub dense: bool,
}

/// The file's text for `entries` (from every writer of every shard).
pub fn to_json(entries: &[RankEntry]) -> String {
    let mut out: BTreeMap<&str, BTreeMap<&str, Json>> = BTreeMap::new();
    for e in entries {
        let mut v: BTreeMap<&str, Json> = BTreeMap::new();
        v.insert("dense", Json::Bool(e.dense));
        v.insert("shape", json!(e.shape));
        if e.dense {
            v.insert("name", json!(e.key));
            v.insert("dtype", json!(dtype::torch_rank_name(&e.dtype)));
            v.insert("dimension", json!(0));
            v.insert("is_hashmap", json!(false));
        } else if e.key.contains(".embedding") {
            v.insert("name", json!(e.key));
            v.insert("dtype", json!(dtype::torch_rank_name(&e.dtype)));
            v.insert("dimension", json!(e.shape.last().copied().unwrap_or(0)));
            v.insert("hashmap_key", json!(e.key.replacen(".embedding", ".id", 1)));
            v.insert("hashmap_key_dtype", json!("int64"));
            v.insert("hashmap_value", json!(e.key));
            v.insert("is_hashmap", json!(true));
        } else {
            v.insert("data_offsets", json!([e.data_offsets.0, e.data_offsets.1]));
            v.insert("dtype", json!(e.dtype));
        }
        // RecIS keeps the first entry of a duplicated key.
        out.entry(e.key.as_str()).or_insert(v);
    }
    dump4(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries() {
        let e = |key: &str, dtype: &str, shape: Vec<usize>, dense| RankEntry {
            key: key.into(),
            dtype: dtype.into(),
            shape,
            data_offsets: (0, 8),
            dense,
        };
        let text = to_json(&[
            e("t.id/part_0_1", "I64", vec![1], false),
            e("b^ ", "F32", vec![], true),
            e("t.embedding/part_0_1", "F32", vec![1, 3], false),
        ]);
        assert!(text.starts_with("{\n    \"b^ \": {\n        \"dense\": true,\n        \"dimension\": 0,"));
        assert!(text.contains("\"hashmap_key\": \"t.id/part_0_1\""));
        assert!(text.contains("\"shape\": []"));
        assert!(text.contains("\"data_offsets\": [\n            0,\n            8\n        ]"));
    }
}
