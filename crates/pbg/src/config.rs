//! `config.json` and the `config/json` attribute: PBG's `ConfigSchema` as `json.dumps(config.to_dict(),
//! indent=4)` prints it. Parsed leniently (PBG's defaults for absent keys), kept as text so it is written
//! back byte for byte, and printed the way Python prints JSON when built or changed in Rust.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};

/// One entity type of the config (`EntitySchema`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityConfig {
    /// The type's name (a key of `entities`).
    pub name: String,
    /// Number of partitions (1 = unpartitioned).
    pub num_partitions: u32,
    /// Whether the type is featurized (its embeddings are per feature).
    pub featurized: bool,
    /// Per-type dimension (PBG master only), else the global one applies.
    pub dimension: Option<u64>,
}

/// One relation type of the config (`RelationSchema`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationConfig {
    /// Relation name.
    pub name: String,
    /// Entity type on the left.
    pub lhs: String,
    /// Entity type on the right.
    pub rhs: String,
    /// Operator (`none`, `diagonal`, `translation`, `linear`, `affine`, `complex_diagonal`).
    pub operator: String,
}

/// A PBG config: its text and the parsed JSON.
///
/// ```
/// use ckpt_pbg::Config;
/// let text = r#"{"entities": {"user": {"num_partitions": 2}}, "relations": [{"name": "follows",
///   "lhs": "user", "rhs": "user", "operator": "linear"}], "dimension": 4,
///   "entity_path": "data", "edge_paths": ["data/edges"], "checkpoint_path": "ckpt"}"#;
/// let c = Config::parse(text).unwrap();
/// assert_eq!(c.entities()[0].num_partitions, 2);
/// assert_eq!(c.relations()[0].operator, "linear");
/// assert!(c.global_emb()); // PBG's default
/// assert_eq!(c.entity_dimension("user"), 4);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    text: String,
    json: Map<String, Json>,
    entities: Vec<EntityConfig>,
    relations: Vec<RelationConfig>,
}

fn bad(reason: impl Into<String>) -> Error {
    Error::BadConfig { path: Path::new("config").to_path_buf(), reason: reason.into() }
}

fn as_u64(v: &Json, what: &str) -> Result<u64> {
    v.as_u64().ok_or_else(|| bad(format!("{what} is {v}, expected a non-negative integer")))
}

impl Config {
    /// Parses config text, checking what the checkpoint layout depends on: `entities` (a mapping of types
    /// with integer `num_partitions` ≥ 1), `relations` (a list with `name`, `lhs`, `rhs` naming declared
    /// types), and a positive integer `dimension`.
    ///
    /// # Errors
    /// [`Error::BadConfig`] naming the first problem.
    pub fn parse(text: &str) -> Result<Config> {
        let json: Json = serde_json::from_str(text)
            .map_err(|source| Error::ConfigJson { path: Path::new("config").to_path_buf(), source })?;
        let Json::Object(json) = json else { return Err(bad("not a JSON object")) };
        let ents = json.get("entities").and_then(Json::as_object).ok_or_else(|| bad("no \"entities\" mapping"))?;
        let mut entities = Vec::with_capacity(ents.len());
        for (name, e) in ents {
            crate::names::check_entity_name(name).map_err(|e| bad(e.to_string()))?;
            let e = e.as_object().ok_or_else(|| bad(format!("entity {name:?} is not a mapping")))?;
            let num_partitions = match e.get("num_partitions") {
                None => 1,
                Some(v) => as_u64(v, &format!("entities.{name}.num_partitions"))?,
            };
            let num_partitions = u32::try_from(num_partitions)
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| bad(format!("entities.{name}.num_partitions = {num_partitions}")))?;
            let dimension = match e.get("dimension") {
                None | Some(Json::Null) => None,
                Some(v) => Some(as_u64(v, &format!("entities.{name}.dimension"))?),
            };
            let featurized = e.get("featurized").and_then(Json::as_bool).unwrap_or(false);
            entities.push(EntityConfig { name: name.clone(), num_partitions, featurized, dimension });
        }
        let rels = json.get("relations").and_then(Json::as_array).ok_or_else(|| bad("no \"relations\" list"))?;
        let mut relations = Vec::with_capacity(rels.len());
        for (i, r) in rels.iter().enumerate() {
            let r = r.as_object().ok_or_else(|| bad(format!("relations[{i}] is not a mapping")))?;
            let s = |k: &str| -> Result<String> {
                r.get(k)
                    .and_then(Json::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("relations[{i}].{k} is missing or not a string")))
            };
            let rel = RelationConfig {
                name: s("name")?,
                lhs: s("lhs")?,
                rhs: s("rhs")?,
                operator: r.get("operator").and_then(Json::as_str).unwrap_or("none").to_owned(),
            };
            for side in [&rel.lhs, &rel.rhs] {
                if !entities.iter().any(|e| &e.name == side) {
                    return Err(bad(format!("relations[{i}] uses undeclared entity type {side:?}")));
                }
            }
            relations.push(rel);
        }
        let dim = json.get("dimension").ok_or_else(|| bad("no \"dimension\""))?;
        if as_u64(dim, "dimension")? == 0 {
            return Err(bad("dimension is 0"));
        }
        Ok(Config { text: text.to_owned(), json, entities, relations })
    }

    /// Reads and parses a config file.
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if it does not exist, [`Error::Io`], [`Error::BadConfig`] naming the file.
    pub fn read(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::CouldNotLoad { path: path.to_path_buf() },
            _ => Error::io(path, e),
        })?;
        Config::parse(&text).map_err(|e| match e {
            Error::BadConfig { reason, .. } => Error::BadConfig { path: path.to_path_buf(), reason },
            Error::ConfigJson { source, .. } => Error::ConfigJson { path: path.to_path_buf(), source },
            e => e,
        })
    }

    /// Builds a config from JSON, printed as PBG prints it (`json.dumps(..., indent=4)`).
    ///
    /// # Errors
    /// As [`Config::parse`].
    pub fn from_json(json: &Json) -> Result<Config> {
        Config::parse(&python_json_dumps(json, 4))
    }

    /// The text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The parsed JSON object.
    pub fn json(&self) -> &Map<String, Json> {
        &self.json
    }

    /// The entity types, in the config's order.
    pub fn entities(&self) -> &[EntityConfig] {
        &self.entities
    }

    /// The entity type called `name`.
    pub fn entity(&self, name: &str) -> Option<&EntityConfig> {
        self.entities.iter().find(|e| e.name == name)
    }

    /// The relation types, in order (relation `i` owns `relations/i/operator/...` in the model).
    pub fn relations(&self) -> &[RelationConfig] {
        &self.relations
    }

    /// The global embedding dimension.
    pub fn dimension(&self) -> u64 {
        self.json.get("dimension").and_then(Json::as_u64).unwrap_or(0)
    }

    /// The dimension of entity type `name` (its own, else the global one).
    pub fn entity_dimension(&self, name: &str) -> u64 {
        self.entity(name).and_then(|e| e.dimension).unwrap_or_else(|| self.dimension())
    }

    fn bool_or(&self, key: &str, default: bool) -> bool {
        self.json.get(key).and_then(Json::as_bool).unwrap_or(default)
    }

    fn str_of(&self, key: &str) -> Option<&str> {
        self.json.get(key).and_then(Json::as_str)
    }

    /// `global_emb` (default true).
    pub fn global_emb(&self) -> bool {
        self.bool_or("global_emb", true)
    }

    /// `dynamic_relations` (default false).
    pub fn dynamic_relations(&self) -> bool {
        self.bool_or("dynamic_relations", false)
    }

    /// `entity_path`.
    pub fn entity_path(&self) -> Option<&str> {
        self.str_of("entity_path")
    }

    /// `checkpoint_path`.
    pub fn checkpoint_path(&self) -> Option<&str> {
        self.str_of("checkpoint_path")
    }

    /// `edge_paths`.
    pub fn edge_paths(&self) -> Vec<String> {
        self.json
            .get("edge_paths")
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(Json::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// `num_epochs` (default 1).
    pub fn num_epochs(&self) -> u64 {
        self.json.get("num_epochs").and_then(Json::as_u64).unwrap_or(1)
    }

    /// `num_edge_chunks` (`None`: computed by the trainer from the edge counts).
    pub fn num_edge_chunks(&self) -> Option<u64> {
        self.json.get("num_edge_chunks").and_then(Json::as_u64)
    }

    /// `checkpoint_preservation_interval`.
    pub fn checkpoint_preservation_interval(&self) -> Option<u64> {
        self.json.get("checkpoint_preservation_interval").and_then(Json::as_u64)
    }

    /// `lr` (default 0.01).
    pub fn lr(&self) -> f64 {
        self.json.get("lr").and_then(Json::as_f64).unwrap_or(0.01)
    }
}

/// A config found on disk, and the directory the relative paths it names (`checkpoint_path`, `entity_path`)
/// are resolved against: the one rule for every tool that starts from a config or a checkpoint directory.
///
/// PBG resolves those paths against the working directory of the training run. A path that exists from the
/// working directory (or is absolute) is taken as PBG takes it; otherwise it is resolved against where
/// training presumably ran: the config file's directory, or, for a checkpoint's own `config.json`, the
/// checkpoint directory's parent.
///
/// ```
/// # let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/pbg");
/// let located = ckpt_pbg::ConfigFile::locate(&fixture.join("ckpt")).unwrap();   // a checkpoint directory
/// assert_eq!(located.checkpoint_dir(), fixture.join("ckpt"));
/// assert_eq!(located.entity_path(), Some(fixture.join("data")));                 // "data", beside it
/// ```
#[derive(Debug, Clone)]
pub struct ConfigFile {
    config: Config,
    file: PathBuf,
    base: PathBuf,
    checkpoint: Option<PathBuf>,
}

impl ConfigFile {
    /// Reads the config of `path`: a config file, or a checkpoint directory (its `config.json`).
    ///
    /// # Errors
    /// As [`Config::read`].
    pub fn locate(path: &Path) -> Result<ConfigFile> {
        let (file, checkpoint) = if path.is_dir() {
            (path.join(crate::names::CONFIG_FILE), Some(path.to_path_buf()))
        } else {
            (path.to_path_buf(), None)
        };
        let config = Config::read(&file)?;
        let parent = |p: &Path| p.parent().unwrap_or(Path::new(".")).to_path_buf();
        // A checkpoint's own config.json names paths relative to where training ran: its parent directory.
        let base = match &checkpoint {
            Some(dir) => parent(dir),
            None => parent(&file),
        };
        Ok(ConfigFile { config, file, base, checkpoint })
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The file it was read from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// `rel` as PBG resolves it (absolute, or existing from the working directory), else against the
    /// directory training ran in.
    pub fn resolve(&self, rel: &str) -> PathBuf {
        let p = PathBuf::from(rel);
        if p.is_absolute() || p.exists() { p } else { self.base.join(p) }
    }

    /// The checkpoint directory: the one located, or the config's `checkpoint_path` (default `.`) resolved.
    pub fn checkpoint_dir(&self) -> PathBuf {
        match &self.checkpoint {
            Some(dir) => dir.clone(),
            None => self.resolve(self.config.checkpoint_path().unwrap_or(".")),
        }
    }

    /// The config's `entity_path` resolved, when it has one.
    pub fn entity_path(&self) -> Option<PathBuf> {
        self.config.entity_path().map(|rel| self.resolve(rel))
    }
}

/// `json.dumps(value, indent=indent)` with Python's defaults: `ensure_ascii`, `", "`/`": "` separators
/// (with newlines when indenting), floats as `repr()`, empty containers as `[]`/`{}`.
///
/// ```
/// use serde_json::json;
/// let text = ckpt_pbg::config::python_json_dumps(&json!({"a": [1, 2.0, 1e-5], "é": {}}), 4);
/// assert_eq!(text, "{\n    \"a\": [\n        1,\n        2.0,\n        1e-05\n    ],\n    \"\\u00e9\": {}\n}");
/// ```
pub fn python_json_dumps(value: &Json, indent: usize) -> String {
    let mut out = String::new();
    dump(value, indent, 0, &mut out);
    out
}

fn dump(v: &Json, indent: usize, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', indent * level));
    };
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (None, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (None, None, Some(f)) => out.push_str(&ckpt_tensor::flatten::float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Json::String(s) => dump_str(s, out),
        Json::Array(a) if a.is_empty() => out.push_str("[]"),
        Json::Object(o) if o.is_empty() => out.push_str("{}"),
        Json::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, level + 1);
                dump(x, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Json::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, level + 1);
                dump_str(k, out);
                out.push_str(": ");
                dump(x, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

fn dump_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_bad_configs() {
        assert!(Config::parse("[]").is_err());
        assert!(Config::parse(r#"{"entities": {}, "relations": []}"#).is_err());
        let bad_rel = r#"{"entities": {"a": {"num_partitions": 1}}, "relations": [{"name": "r", "lhs": "a", "rhs": "b"}], "dimension": 2}"#;
        assert!(matches!(Config::parse(bad_rel), Err(Error::BadConfig { .. })));
        let zero = r#"{"entities": {"a": {"num_partitions": 0}}, "relations": [], "dimension": 2}"#;
        assert!(Config::parse(zero).is_err());
    }

    #[test]
    fn python_json() {
        let v = json!({"x": "a\u{1F600}\u{7f}\"", "n": null, "f": [0.001, 1e16, -0.0, 100.0]});
        assert_eq!(
            python_json_dumps(&v, 4),
            "{\n    \"x\": \"a\\ud83d\\ude00\\u007f\\\"\",\n    \"n\": null,\n    \"f\": [\n        0.001,\n        1e+16,\n        -0.0,\n        100.0\n    ]\n}"
        );
    }
}
