//! The entity path (`config.entity_path`, PBG's `FileEntityStorage` and `FileRelationTypeStorage`):
//! `entity_count_<type>_<part>.txt`, `entity_names_<type>_<part>.json`, `dynamic_rel_count.txt` and
//! `dynamic_rel_names.json`. Embedding files must have exactly as many rows as the count files say.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::names::check_entity_name;

/// The files describing the entities of a graph.
#[derive(Debug, Clone)]
pub struct EntityStorage {
    path: PathBuf,
}

fn read_text(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::CouldNotLoad { path: path.to_path_buf() },
        _ => Error::io(path, e),
    })
}

/// Parses a count the way PBG does (`int(text.strip())`, which also allows `+` and `_` between digits).
fn parse_count(path: &Path, text: &str) -> Result<u64> {
    let t = text.trim();
    let digits = t.strip_prefix('+').unwrap_or(t);
    let ok = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__");
    let value = ok.then(|| digits.replace('_', "").parse::<u64>().ok()).flatten();
    value.ok_or_else(|| Error::BadEntityFile {
        path: path.to_path_buf(),
        reason: format!("holds {t:?}, expected a non-negative integer count"),
    })
}

fn parse_names(path: &Path, text: &str) -> Result<Vec<String>> {
    let bad = |reason: String| Error::BadEntityFile { path: path.to_path_buf(), reason };
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|source| Error::EntityFileJson { path: path.to_path_buf(), source })?;
    let list = json.as_array().ok_or_else(|| bad("not a JSON list of names".into()))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| v.as_str().map(str::to_owned).ok_or_else(|| bad(format!("item {i} is {v}, not a string"))))
        .collect()
}

impl EntityStorage {
    /// The entity path at `path` (a `file://` prefix is stripped, as PBG does).
    pub fn new(path: impl AsRef<Path>) -> Self {
        let p = path.as_ref();
        let p = p.to_str().and_then(|s| s.strip_prefix("file://")).map_or_else(|| p.to_path_buf(), PathBuf::from);
        EntityStorage { path: p }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `entity_count_<entity>_<partition>.txt`.
    pub fn count_file(&self, entity: &str, partition: u32) -> PathBuf {
        self.path.join(format!("entity_count_{entity}_{partition}.txt"))
    }

    /// `entity_names_<entity>_<partition>.json`.
    pub fn names_file(&self, entity: &str, partition: u32) -> PathBuf {
        self.path.join(format!("entity_names_{entity}_{partition}.json"))
    }

    /// `dynamic_rel_names.json`.
    pub fn relation_names_file(&self) -> PathBuf {
        self.path.join("dynamic_rel_names.json")
    }

    /// `dynamic_rel_count.txt`.
    pub fn relation_count_file(&self) -> PathBuf {
        self.path.join("dynamic_rel_count.txt")
    }

    /// Whether the count file of a partition exists.
    pub fn has_count(&self, entity: &str, partition: u32) -> bool {
        self.count_file(entity, partition).is_file()
    }

    /// The number of entities in a partition.
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if the count file is missing, [`Error::BadEntityFile`] if it holds no count.
    pub fn load_count(&self, entity: &str, partition: u32) -> Result<u64> {
        let path = self.count_file(entity, partition);
        parse_count(&path, &read_text(&path)?)
    }

    /// Writes a count file (`f"{count}\n"`).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Io`].
    pub fn save_count(&self, entity: &str, partition: u32, count: u64) -> Result<()> {
        check_entity_name(entity)?;
        let path = self.count_file(entity, partition);
        fs::write(&path, format!("{count}\n")).map_err(|e| Error::io(&path, e))
    }

    /// The entity names of a partition, ordered by offset.
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if the names file is missing, [`Error::BadEntityFile`] if it is not a JSON
    /// list of strings.
    pub fn load_names(&self, entity: &str, partition: u32) -> Result<Vec<String>> {
        let path = self.names_file(entity, partition);
        parse_names(&path, &read_text(&path)?)
    }

    /// Writes a names file as PBG does (`json.dump(names, tf, indent=4)`).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Io`].
    pub fn save_names(&self, entity: &str, partition: u32, names: &[String]) -> Result<()> {
        check_entity_name(entity)?;
        let path = self.names_file(entity, partition);
        let json = serde_json::Value::Array(names.iter().cloned().map(serde_json::Value::String).collect());
        fs::write(&path, crate::config::python_json_dumps(&json, 4)).map_err(|e| Error::io(&path, e))
    }

    /// The relation-type names (`dynamic_rel_names.json`), or `None` when the file does not exist (PBG's
    /// importer writes it only for dynamic relations).
    ///
    /// # Errors
    /// [`Error::BadEntityFile`] if the file is not a JSON list of strings, [`Error::Io`].
    pub fn load_relation_names(&self) -> Result<Option<Vec<String>>> {
        let path = self.relation_names_file();
        match read_text(&path) {
            Ok(t) => parse_names(&path, &t).map(Some),
            Err(Error::CouldNotLoad { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The number of dynamic relation types (`dynamic_rel_count.txt`).
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`], [`Error::BadEntityFile`].
    pub fn load_relation_count(&self) -> Result<u64> {
        let path = self.relation_count_file();
        parse_count(&path, &read_text(&path)?)
    }

    /// Every `(entity, partition)` that has a count file, sorted.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be listed.
    pub fn partitions(&self) -> Result<Vec<(String, u32)>> {
        let mut out = Vec::new();
        let dir = fs::read_dir(&self.path).map_err(|e| Error::io(&self.path, e))?;
        for entry in dir {
            let entry = entry.map_err(|e| Error::io(&self.path, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(stem) = name.strip_prefix("entity_count_").and_then(|s| s.strip_suffix(".txt")) else {
                continue;
            };
            let Some((entity, part_text)) = stem.rsplit_once('_') else { continue };
            let Ok(part) = part_text.parse::<u32>() else { continue };
            if part.to_string() == part_text && !entity.is_empty() {
                out.push((entity.to_owned(), part));
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn counts_and_names() {
        let dir = tempfile::tempdir().unwrap();
        let s = EntityStorage::new(dir.path());
        s.save_count("a_b", 1, 3).unwrap();
        s.save_names("a_b", 1, &["x".into(), "ü".into(), "z".into()]).unwrap();
        assert_eq!(s.load_count("a_b", 1).unwrap(), 3);
        assert_eq!(s.load_names("a_b", 1).unwrap(), vec!["x", "ü", "z"]);
        assert_eq!(
            fs::read_to_string(s.names_file("a_b", 1)).unwrap(),
            "[\n    \"x\",\n    \"\\u00fc\",\n    \"z\"\n]"
        );
        assert_eq!(s.partitions().unwrap(), vec![("a_b".to_string(), 1)]);
        assert!(matches!(s.load_count("a_b", 0), Err(Error::CouldNotLoad { .. })));
        fs::write(s.count_file("c", 0), " 1_000\n").unwrap();
        assert_eq!(s.load_count("c", 0).unwrap(), 1000);
        fs::write(s.count_file("c", 0), "-1\n").unwrap();
        assert!(matches!(s.load_count("c", 0), Err(Error::BadEntityFile { .. })));
        assert_eq!(s.load_relation_names().unwrap(), None);
    }
}
