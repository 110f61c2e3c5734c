//! The `index` file (`csrc/serialize/index_info.cc`): which data file holds each block.
//!
//! ```json
//! {"block_index":{"<on-disk key>":<file id>,…},"file_index":{"<data file name>":<file id>,…}}
//! ```
//!
//! Compact JSON with sorted keys (nlohmann's `std::map`), no trailing newline. File ids depend on the order
//! in which shard 0 merged the shards' indexes, so always resolve them through `file_index`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Error, IndexRule, Result};

/// The name of the index file.
pub const INDEX_FILE: &str = "index";

/// A parsed `index`: block key → file id, file name → file id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    /// On-disk block key (part name or `name^ `) → file id.
    pub block_index: BTreeMap<String, u64>,
    /// Data-file name → file id.
    pub file_index: BTreeMap<String, u64>,
}

impl Index {
    /// Parses `index` bytes (any JSON layout: RecIS's compact form, or the indented empty index RecIS's
    /// Python writes when there are no sparse parameters). `path` names the file in errors.
    ///
    /// # Errors
    /// [`Error::LegacyIndex`] for a v1 index (a list of paths), [`Error::Json`], [`Error::BadIndex`].
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let text = std::str::from_utf8(bytes).map_err(|e| Error::Json { path: path.into(), source: e.into() })?;
        // A v1 index is one data-file path per line: no JSON punctuation anywhere.
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty()).peekable();
        if lines.peek().is_some() && lines.all(|l| !l.contains(['{', '}', '[', ']', '"'])) {
            return Err(Error::LegacyIndex { path: path.into() });
        }
        let json: Json = serde_json::from_str(text).map_err(|e| Error::Json { path: path.into(), source: e.into() })?;
        let bad = |rule: IndexRule| Error::BadIndex { path: path.into(), rule };
        let obj = json.as_object().ok_or_else(|| bad(IndexRule::NotAnObject))?;
        let section = |section: &'static str| -> Result<BTreeMap<String, u64>> {
            let map =
                obj.get(section).and_then(Json::as_object).ok_or_else(|| bad(IndexRule::NoSection { section }))?;
            map.iter()
                .map(|(k, v)| {
                    v.as_u64()
                        .map(|id| (k.clone(), id))
                        .ok_or_else(|| bad(IndexRule::NotAFileId { section, key: k.clone(), value: v.to_string() }))
                })
                .collect()
        };
        let index = Index { block_index: section("block_index")?, file_index: section("file_index")? };
        index.file_names()?;
        Ok(index)
    }

    /// File id → data-file name.
    ///
    /// # Errors
    /// [`Error::DuplicateFileId`] if two files share an id.
    pub fn file_names(&self) -> Result<BTreeMap<u64, &str>> {
        let mut out: BTreeMap<u64, &str> = BTreeMap::new();
        for (name, &id) in &self.file_index {
            if let Some(first) = out.insert(id, name) {
                return Err(Error::DuplicateFileId { file_id: id, first: first.into(), second: name.clone() });
            }
        }
        Ok(out)
    }

    /// The compact JSON RecIS writes: sorted keys, `block_index` first, no whitespace, no newline.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\"block_index\":");
        write_map(&mut out, &self.block_index);
        out.push_str(",\"file_index\":");
        write_map(&mut out, &self.file_index);
        out.push('}');
        out
    }

    /// Appends `other`'s files and blocks, shifting its file ids by the number of files already here
    /// (`IndexInfo::MergeFrom`).
    ///
    /// # Errors
    /// [`Error::DuplicateBlock`] if a block key or file name is already present (RecIS would overwrite it
    /// and lose a block).
    pub fn merge_from(&mut self, other: &Index) -> Result<()> {
        let shift = self.file_index.len() as u64;
        for (name, id) in &other.file_index {
            if self.file_index.insert(name.clone(), id + shift).is_some() {
                return Err(Error::DuplicateBlock { key: name.clone(), detail: "data file named twice".into() });
            }
        }
        for (key, id) in &other.block_index {
            if self.block_index.insert(key.clone(), id + shift).is_some() {
                return Err(Error::DuplicateBlock { key: key.clone(), detail: "written by two shards".into() });
            }
        }
        Ok(())
    }
}

fn write_map(out: &mut String, map: &BTreeMap<String, u64>) {
    out.push('{');
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Json::from(k.as_str()).to_string());
        out.push(':');
        out.push_str(&v.to_string());
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const P: &str = "index";

    #[test]
    fn parse_and_write() {
        let text = r#"{"block_index":{"w^ ":1,"t.id/part_0_1":0},"file_index":{"model-000000-of-000002.safetensors":0,"model-000001-of-000002.safetensors":1}}"#;
        let idx = Index::parse(text.as_bytes(), Path::new(P)).unwrap();
        assert_eq!(idx.block_index["w^ "], 1);
        assert_eq!(
            idx.to_json(),
            r#"{"block_index":{"t.id/part_0_1":0,"w^ ":1},"file_index":{"model-000000-of-000002.safetensors":0,"model-000001-of-000002.safetensors":1}}"#
        );
        let empty = Index::parse(b"{\n    \"file_index\": {},\n    \"block_index\": {}\n}", Path::new(P)).unwrap();
        assert_eq!(empty, Index::default());
    }

    #[test]
    fn rejects() {
        let p = Path::new(P);
        assert!(matches!(
            Index::parse(b"/ckpt/model.0.safetensors\n/ckpt/model.1.safetensors\n", p),
            Err(Error::LegacyIndex { .. })
        ));
        assert!(matches!(Index::parse(b"{", p), Err(Error::Json { .. })));
        assert!(matches!(Index::parse(b"[]", p), Err(Error::BadIndex { .. })));
        assert!(matches!(Index::parse(br#"{"block_index":{}}"#, p), Err(Error::BadIndex { .. })));
        assert!(matches!(Index::parse(br#"{"block_index":{"a":-1},"file_index":{}}"#, p), Err(Error::BadIndex { .. })));
        assert!(matches!(
            Index::parse(br#"{"block_index":{},"file_index":{"a":0,"b":0}}"#, p),
            Err(Error::DuplicateFileId { file_id: 0, .. })
        ));
    }

    #[test]
    fn merge_shifts_ids() {
        let mut a = Index::default();
        a.file_index.insert("f0".into(), 0);
        a.file_index.insert("f1".into(), 1);
        a.block_index.insert("x".into(), 1);
        let mut b = Index::default();
        b.file_index.insert("f2".into(), 0);
        b.block_index.insert("y".into(), 0);
        a.merge_from(&b).unwrap();
        assert_eq!(a.file_index["f2"], 2);
        assert_eq!(a.block_index["y"], 2);
        assert!(matches!(a.merge_from(&b), Err(Error::DuplicateBlock { .. })));
    }
}
