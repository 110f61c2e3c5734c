//! Checking a checkpoint directory: partial (uncommitted) versions, missing or unreadable partitions,
//! embedding counts against the entity path, leaked old versions, broken snapshot links.

use std::collections::BTreeSet;
use std::path::PathBuf;

use rayon::prelude::*;

use crate::config::Config;
use crate::entity_path::EntityStorage;
use crate::error::{Error, Result};
use crate::names::FileName;
use crate::storage::FileCheckpointStorage;

/// What [`FileCheckpointStorage::verify`] found.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The committed version.
    pub version: u64,
    /// Files of versions newer than the committed one: an iteration in progress, or the leftovers of one
    /// that crashed before its commit (PBG overwrites them on retry).
    pub partial: Vec<FileName>,
    /// Partitions expected at the committed version (from the entity path's count files and the config)
    /// without a file.
    pub missing: Vec<(String, u32)>,
    /// Whether `model.v<version>.h5` is missing (for a version above 0).
    pub missing_model: bool,
    /// Files of the committed version that fail to read or validate (including embedding counts that
    /// disagree with the count files, and undecodable optimizer blobs), with the error.
    pub invalid: Vec<(FileName, Error)>,
    /// Files of older versions that no snapshot links to: leaked by a crash between commit and cleanup.
    pub stale: Vec<FileName>,
    /// Snapshot links whose target cannot be found, even by file name in the checkpoint directory.
    pub dangling_links: Vec<PathBuf>,
}

impl VerifyReport {
    /// Whether the committed version is complete and valid (partial, stale files and dangling links are
    /// reported but do not make a checkpoint unusable).
    pub fn is_consistent(&self) -> bool {
        self.missing.is_empty() && !self.missing_model && self.invalid.is_empty()
    }
}

impl FileCheckpointStorage {
    /// Checks the directory against the committed version. Partitions are expected from the count files
    /// of `entities` (when given) and from `config.json` (when present); every file of the committed version
    /// is opened and validated (in parallel), its row count compared with the count file, its optimizer
    /// blob decoded.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be listed, [`Error::BadVersionFile`].
    pub fn verify(&self, entities: Option<&EntityStorage>) -> Result<VerifyReport> {
        let version = self.load_version()?;
        let files = self.list()?;
        let mut report = VerifyReport { version, ..VerifyReport::default() };
        let snapshot_targets: BTreeSet<String> = self.snapshot_targets()?.into_iter().collect();
        let mut present = BTreeSet::new();
        for (name, _) in &files {
            match name.version() {
                Some(v) if v > version => report.partial.push(name.clone()),
                Some(v) if v < version && v > 0 && !snapshot_targets.contains(&name.to_string()) => {
                    report.stale.push(name.clone());
                }
                Some(v) if v == version => {
                    present.insert(name.clone());
                }
                _ => {}
            }
        }

        let mut expected: BTreeSet<(String, u32)> = BTreeSet::new();
        if let Some(es) = entities {
            expected.extend(es.partitions()?);
        }
        if let Ok(config) = Config::read(&self.config_file()) {
            for e in config.entities() {
                expected.extend((0..e.num_partitions).map(|p| (e.name.clone(), p)));
            }
        }
        if version > 0 {
            for (entity, partition) in &expected {
                let name = FileName::Embeddings { entity: entity.clone(), partition: *partition, version };
                if !present.contains(&name) {
                    report.missing.push((entity.clone(), *partition));
                }
            }
            report.missing_model = !present.contains(&FileName::Model { version });
        }

        report.invalid = present
            .par_iter()
            .filter_map(|name| self.check_file(name, entities).err().map(|e| (name.clone(), e)))
            .collect();

        for epoch in self.snapshots()? {
            let snap = self.snapshot(epoch);
            for (name, path) in snap.list()? {
                if name.version().is_some() && !snap.resolve(&path).exists() {
                    report.dangling_links.push(path);
                }
            }
        }
        Ok(report)
    }

    fn check_file(&self, name: &FileName, entities: Option<&EntityStorage>) -> Result<()> {
        match name {
            FileName::Embeddings { entity, partition, version } => {
                let p = self.load_entity_partition(*version, entity, *partition)?;
                if let Some(es) = entities {
                    if es.has_count(entity, *partition) {
                        let expected = es.load_count(entity, *partition)?;
                        if expected != p.len() as u64 {
                            return Err(Error::CountMismatch {
                                path: self.entity_partition_file(*version, entity, *partition),
                                count_file: es.count_file(entity, *partition),
                                entity: entity.clone(),
                                partition: *partition,
                                expected,
                                found: p.len() as u64,
                            });
                        }
                    }
                }
                if let Some(o) = &p.optimizer {
                    o.decode().map_err(|e| with_path(e, self.entity_partition_file(*version, entity, *partition)))?;
                }
                Ok(())
            }
            FileName::Model { version } => {
                let m = self.load_model(*version)?;
                if let Some(o) = &m.optimizer {
                    o.decode().map_err(|e| with_path(e, self.model_file(*version)))?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Attributes an optimizer-blob error to the file that holds the blob.
pub(crate) fn with_path(e: Error, path: PathBuf) -> Error {
    match e {
        Error::OptimizerBlob { source, .. } => Error::OptimizerBlob { path, source },
        other => other,
    }
}
