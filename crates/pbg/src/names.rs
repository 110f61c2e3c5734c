//! The names of the files in a checkpoint directory (`FileCheckpointStorage`'s f-strings) and their parser.

use std::fmt;

use crate::error::{Error, Result};

/// `checkpoint_version.txt`: the committed version.
pub const VERSION_FILE: &str = "checkpoint_version.txt";
/// `config.json`: the latest run's config.
pub const CONFIG_FILE: &str = "config.json";
/// `training_stats.json`: JSON lines appended once per iteration.
pub const STATS_FILE: &str = "training_stats.json";

/// A file or directory of a checkpoint directory, recognised by its name.
///
/// ```
/// use ckpt_pbg::FileName;
/// let f = FileName::parse("embeddings_user_id_3.v12.h5").unwrap();
/// assert_eq!(f, FileName::Embeddings { entity: "user_id".into(), partition: 3, version: 12 });
/// assert_eq!(f.to_string(), "embeddings_user_id_3.v12.h5");
/// assert_eq!(FileName::parse("model.v0.h5"), Some(FileName::Model { version: 0 }));
/// assert_eq!(FileName::parse("epoch_2"), Some(FileName::Snapshot { epoch: 2 }));
/// assert_eq!(FileName::parse("embeddings_x.v1.h5"), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileName {
    /// `embeddings_{entity}_{partition}.v{version}.h5`.
    Embeddings {
        /// Entity type (may contain `_`; the partition is parsed from the right).
        entity: String,
        /// Partition index.
        partition: u32,
        /// Version.
        version: u64,
    },
    /// `model.v{version}.h5`.
    Model {
        /// Version.
        version: u64,
    },
    /// `checkpoint_version.txt`.
    Version,
    /// `config.json`.
    Config,
    /// `training_stats.json`.
    Stats,
    /// `epoch_{epoch}` (a snapshot directory).
    Snapshot {
        /// Epoch number.
        epoch: u64,
    },
}

/// Parses a decimal number the way Python's f-strings print it: digits only, no sign, no leading zeros
/// (except `0` itself).
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

impl FileName {
    /// Recognises a file name; `None` for names that are not part of the format.
    pub fn parse(name: &str) -> Option<FileName> {
        match name {
            VERSION_FILE => return Some(FileName::Version),
            CONFIG_FILE => return Some(FileName::Config),
            STATS_FILE => return Some(FileName::Stats),
            _ => {}
        }
        if let Some(epoch) = name.strip_prefix("epoch_") {
            return parse_decimal(epoch).map(|epoch| FileName::Snapshot { epoch });
        }
        let stem = name.strip_suffix(".h5")?;
        let (stem, version) = stem.rsplit_once(".v")?;
        let version = parse_decimal(version)?;
        if stem == "model" {
            return Some(FileName::Model { version });
        }
        let rest = stem.strip_prefix("embeddings_")?;
        let (entity, partition) = rest.rsplit_once('_')?;
        let partition = u32::try_from(parse_decimal(partition)?).ok()?;
        if entity.is_empty() || entity.contains('/') {
            return None;
        }
        Some(FileName::Embeddings { entity: entity.to_owned(), partition, version })
    }

    /// The version of a versioned file (embeddings or model).
    pub fn version(&self) -> Option<u64> {
        match self {
            FileName::Embeddings { version, .. } | FileName::Model { version } => Some(*version),
            _ => None,
        }
    }
}

impl fmt::Display for FileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileName::Embeddings { entity, partition, version } => {
                write!(f, "embeddings_{entity}_{partition}.v{version}.h5")
            }
            FileName::Model { version } => write!(f, "model.v{version}.h5"),
            FileName::Version => f.write_str(VERSION_FILE),
            FileName::Config => f.write_str(CONFIG_FILE),
            FileName::Stats => f.write_str(STATS_FILE),
            FileName::Snapshot { epoch } => write!(f, "epoch_{epoch}"),
        }
    }
}

/// Checks that an entity type name can be used in file names (`embeddings_{entity}_...`): not empty, no `/`
/// and no NUL. (PBG itself accepts `.` but then cannot map the type's global embedding; that is allowed here
/// too.)
///
/// # Errors
/// [`Error::InvalidName`].
pub fn check_entity_name(entity: &str) -> Result<()> {
    let reason = if entity.is_empty() {
        "it is empty"
    } else if entity.contains('/') {
        "it contains '/'"
    } else if entity.contains('\0') {
        "it contains NUL"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName { what: "entity type", name: entity.to_owned(), reason })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_from_the_right() {
        let f = FileName::parse("embeddings_a_b_10.v7.h5").unwrap();
        assert_eq!(f, FileName::Embeddings { entity: "a_b".into(), partition: 10, version: 7 });
        assert_eq!(FileName::parse("embeddings__0.v1.h5"), None);
        assert_eq!(FileName::parse("embeddings_a_01.v1.h5"), None);
        assert_eq!(FileName::parse("embeddings_a_1.v01.h5"), None);
        assert_eq!(FileName::parse("embeddings_a_1.v1.h5.tmp"), None);
        assert_eq!(FileName::parse("model.v.h5"), None);
        assert_eq!(FileName::parse("model.v-1.h5"), None);
        assert_eq!(FileName::parse("epoch_"), None);
        assert_eq!(FileName::parse("checkpoint_version.txt"), Some(FileName::Version));
        for n in ["embeddings_e.x_0.v3.h5", "model.v18446744073709551615.h5", "epoch_10", "config.json"] {
            assert_eq!(FileName::parse(n).unwrap().to_string(), n);
        }
    }

    #[test]
    fn entity_names() {
        assert!(check_entity_name("user_id").is_ok());
        assert!(check_entity_name("a.b").is_ok());
        assert!(matches!(check_entity_name("a/b"), Err(Error::InvalidName { .. })));
        assert!(check_entity_name("").is_err());
    }
}
