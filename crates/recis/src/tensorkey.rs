//! `tensorkey.json`: part name → internal block name, for every table block of every shard.
//!
//! ```json
//! {
//!     "tbl.embedding/part_1_2": "tbl@embedding^32768@65536@65536",
//!     …
//! }
//! ```
//!
//! Written by nlohmann's `dump(4)`: 4-space indent, `": "`, sorted keys, no trailing newline. The loader
//! depends on it: a table block's slice range is known only from its internal name.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value as Json;

use crate::error::{Error, Result, TensorKeyRule};

/// The name of the file.
pub const TENSORKEY_FILE: &str = "tensorkey.json";

/// Part name → internal block name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorKey {
    /// The map, sorted by part name.
    pub map: BTreeMap<String, String>,
}

impl TensorKey {
    /// Parses `tensorkey.json`; `path` names the file in errors.
    ///
    /// # Errors
    /// [`Error::Json`], [`Error::BadTensorKey`].
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let json: Json =
            serde_json::from_slice(bytes).map_err(|e| Error::Json { path: path.into(), source: e.into() })?;
        let bad = |rule: TensorKeyRule| Error::BadTensorKey { path: path.into(), rule };
        let obj = json.as_object().ok_or_else(|| bad(TensorKeyRule::NotAnObject))?;
        let map = obj
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_owned()))
                    .ok_or_else(|| bad(TensorKeyRule::NotAString { key: k.clone(), value: v.to_string() }))
            })
            .collect::<Result<_>>()?;
        Ok(TensorKey { map })
    }

    /// The internal block name of on-disk key `key` (the key itself when it is not a part name).
    pub fn resolve<'a>(&'a self, key: &'a str) -> &'a str {
        self.map.get(key).map_or(key, String::as_str)
    }

    /// The text RecIS writes (`dump(4)`).
    pub fn to_json(&self) -> String {
        dump4(&self.map)
    }

    /// Adds `other`'s entries (`merge_patch`).
    ///
    /// # Errors
    /// [`Error::DuplicateBlock`] if a part name, or an internal block name, is already present: two shards
    /// wrote the same table slice, and RecIS would keep only one of them.
    pub fn merge_from(&mut self, other: &TensorKey) -> Result<()> {
        let mut internal: std::collections::HashSet<&str> = self.map.values().map(String::as_str).collect();
        let mut added = Vec::new();
        for (k, v) in &other.map {
            if self.map.contains_key(k) {
                return Err(Error::DuplicateBlock { key: k.clone(), detail: "part name in two shards".into() });
            }
            if !internal.insert(v) {
                return Err(Error::DuplicateBlock {
                    key: v.clone(),
                    detail: "two shards wrote the same table slice; RecIS would drop one".into(),
                });
            }
            added.push((k.clone(), v.clone()));
        }
        self.map.extend(added);
        Ok(())
    }
}

/// nlohmann's `dump(4)` of a value whose objects are sorted: serde_json's pretty printer with a 4-space
/// indent gives the same bytes (`{}` / `[]` when empty, one item per line otherwise).
pub(crate) fn dump4<T: Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    // Serializing maps of strings and JSON values to a vector cannot fail.
    let _ = value.serialize(&mut ser);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn dump_and_parse() {
        let mut tk = TensorKey::default();
        assert_eq!(tk.to_json(), "{}");
        tk.map.insert("t.id/part_0_1".into(), "t@id^00000@65536@65536".into());
        tk.map.insert("t.embedding/part_0_1".into(), "t@embedding^00000@65536@65536".into());
        let text = tk.to_json();
        assert_eq!(
            text,
            "{\n    \"t.embedding/part_0_1\": \"t@embedding^00000@65536@65536\",\n    \"t.id/part_0_1\": \"t@id^00000@65536@65536\"\n}"
        );
        assert_eq!(TensorKey::parse(text.as_bytes(), Path::new("tk")).unwrap(), tk);
        assert_eq!(tk.resolve("t.id/part_0_1"), "t@id^00000@65536@65536");
        assert_eq!(tk.resolve("w^ "), "w^ ");
        assert!(matches!(TensorKey::parse(b"{\"a\": 1}", Path::new("tk")), Err(Error::BadTensorKey { .. })));
        assert!(matches!(TensorKey::parse(b"{", Path::new("tk")), Err(Error::Json { .. })));
    }

    #[test]
    fn merge_rejects_collisions() {
        let mut a = TensorKey::default();
        a.map.insert("t.id/part_0_2".into(), "t@id^00000@65536@65536".into());
        let mut b = TensorKey::default();
        b.map.insert("t.id/part_1_2".into(), "t@id^00000@65536@65536".into());
        assert!(matches!(a.merge_from(&b), Err(Error::DuplicateBlock { .. })));
        let mut c = TensorKey::default();
        c.map.insert("t.id/part_1_2".into(), "t@id^32768@65536@65536".into());
        a.merge_from(&c).unwrap();
        assert_eq!(a.map.len(), 2);
    }
}
