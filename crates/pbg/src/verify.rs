//! Checking a checkpoint directory: partial (uncommitted) versions, missing or unreadable partitions,
//! embedding counts against the entity path, leaked old versions, broken snapshot links.

use std::collections::BTreeSet;
use std::path::PathBuf;

use ckpt_io::{Problem, ProblemKind, VerifyReport};

use rayon::prelude::*;

use crate::config::Config;
use crate::entity_path::EntityStorage;
use crate::error::{Error, Result};
use crate::names::FileName;
use crate::storage::FileCheckpointStorage;

impl FileCheckpointStorage {
    /// Checks the directory against the committed version. Partitions are expected from the count files
    /// of `entities` (when given) and from `config.json` (when present); every file of the committed version
    /// is opened and validated (in parallel), its row count compared with the count file, its optimizer
    /// blob decoded.
    ///
    /// Problems: a partition or the model file missing at the committed version ([`ProblemKind::Missing`]),
    /// a file of the committed version that fails to read or validate, with embedding counts that disagree
    /// with the count files and undecodable optimizer blobs ([`ProblemKind::Unreadable`], or
    /// [`ProblemKind::Inconsistent`] for a count mismatch); warnings: files of versions newer than the
    /// committed one (an iteration in progress, or the leftovers of one that crashed before its commit,
    /// which PBG overwrites on retry: [`ProblemKind::Unfinished`]), files of older versions no snapshot
    /// links to (leaked by a crash between commit and cleanup: [`ProblemKind::Stale`]), snapshot links whose
    /// target is gone ([`ProblemKind::DanglingLink`]).
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be listed, [`Error::BadVersionFile`].
    pub fn verify(&self, entities: Option<&EntityStorage>) -> Result<VerifyReport> {
        let version = self.load_version()?;
        let files = self.list()?;
        let mut report = VerifyReport::new("pbg", self.path());
        let file = |name: &FileName| self.path().join(name.to_string());
        let snapshot_targets: BTreeSet<String> = self.snapshot_targets()?.into_iter().collect();
        let mut present = BTreeSet::new();
        for (name, _) in &files {
            match name.version() {
                Some(v) if v > version => report.push(
                    Problem::new(ProblemKind::Unfinished, format!("uncommitted (newer than version {version})"))
                        .in_file(file(name)),
                ),
                Some(v) if v < version && v > 0 && !snapshot_targets.contains(&name.to_string()) => report.push(
                    Problem::new(ProblemKind::Stale, "an older version no snapshot links to").in_file(file(name)),
                ),
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
                    let what = format!("version {version}: partition {partition} of entity {entity} has no file");
                    report.push(
                        Problem::new(ProblemKind::Missing, what)
                            .in_file(file(&name))
                            .at_entry(format!("{entity}/{partition}")),
                    );
                }
            }
            let model = FileName::Model { version };
            if !present.contains(&model) {
                report.push(
                    Problem::new(ProblemKind::Missing, format!("version {version}: no model file"))
                        .in_file(file(&model)),
                );
            }
        }

        let invalid: Vec<(FileName, Error)> = present
            .par_iter()
            .filter_map(|name| self.check_file(name, entities).err().map(|e| (name.clone(), e)))
            .collect();
        report.files = present.len();
        report.records = present.len() - invalid.len();
        for (name, e) in &invalid {
            let kind = match e {
                Error::CountMismatch { .. } => ProblemKind::Inconsistent,
                _ => ProblemKind::Unreadable,
            };
            report.push(Problem::from_error(kind, e).in_file(file(name)));
        }

        for epoch in self.snapshots()? {
            let snap = self.snapshot(epoch);
            for (name, path) in snap.list()? {
                if name.version().is_some() && !snap.resolve(&path).exists() {
                    report
                        .push(Problem::new(ProblemKind::DanglingLink, "snapshot link to a missing file").in_file(path));
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
