//! Verifying a checkpoint of any format: structure, coverage, checksums, the format's own commit state,
//! and that every entry reads.

use std::path::Path;

use crate::error::At;
use crate::{Checkpoint, EntryKind, Error, Format, Result};

/// What [`verify`] found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The format verified.
    pub format: Format,
    /// Entries (or items, for formats that store several per entry) checked.
    pub checked: usize,
    /// Bytes of tensor data checked.
    pub bytes: u64,
    /// Every problem found, each naming its entry or file. Empty when the checkpoint is sound.
    pub problems: Vec<String>,
    /// Findings that do not make the checkpoint unusable (leftovers of an interrupted save, stale files).
    pub warnings: Vec<String>,
}

impl VerifyReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn new(format: Format) -> Self {
        VerifyReport { format, checked: 0, bytes: 0, problems: Vec::new(), warnings: Vec::new() }
    }
}

/// Progress of a long operation: called with (done, total) units of work.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Verifies the checkpoint at `path` (format detected):
///
/// - torch: the archive's structure, every record's CRC-32, every tensor readable;
/// - safetensors: the header (dtypes, shapes, offsets covering the data) and every tensor readable;
/// - distcp: [`ckpt_distcp::verify`] (chunks covering their tensors, items in their files, CRCs, contents);
/// - hfai: every part's CRCs, the parts complete and consistent, every entry readable;
/// - pbg: [`ckpt_pbg::FileCheckpointStorage::verify`] (the committed version complete, counts against the
///   entity path when it is found, every file valid);
/// - recis: every `.pt` file's CRCs, the index, tensor keys and data files validated, every entry readable.
///
/// ```
/// use ckpt::core::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
/// ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
/// let report = ckpt::verify(&path).unwrap();
/// assert!(report.is_ok(), "{:?}", report.problems);
/// ```
///
/// # Errors
/// When the checkpoint cannot be opened at all (not a checkpoint, unreadable structure, I/O); problems found
/// once it is open are listed in [`VerifyReport::problems`].
pub fn verify(path: &Path) -> Result<VerifyReport> {
    verify_with_progress(path, &|_, _| {})
}

/// [`verify`], reporting progress over the entries read.
///
/// # Errors
/// As [`verify`].
pub fn verify_with_progress(path: &Path, progress: Progress<'_>) -> Result<VerifyReport> {
    let format = crate::detect(path)?;
    if !format.reading_enabled() {
        return Err(Error::FeatureDisabled { path: path.to_path_buf(), format, feature: format.feature() });
    }
    let mut report = VerifyReport::new(format);
    match format {
        #[cfg(feature = "torch")]
        Format::Torch => {
            torch_problems(&ckpt_torch::verify(path).at(path)?, &mut report);
            read_all(&crate::open_as(path, format)?, &mut report, progress);
        }
        #[cfg(feature = "distcp")]
        Format::Distcp => {
            let r = ckpt_distcp::verify(path).at(path)?;
            report.checked = r.items;
            report.bytes = r.bytes;
            report.problems.extend(r.problems.iter().map(ToString::to_string));
        }
        #[cfg(feature = "hfai")]
        Format::Hfai => {
            for part in &ckpt_hfai::verify(path).at(path)?.parts {
                torch_problems(part, &mut report);
            }
            read_all(&crate::open_as(path, format)?, &mut report, progress);
        }
        #[cfg(feature = "pbg")]
        Format::Pbg => pbg(path, &mut report)?,
        #[cfg(feature = "recis")]
        Format::Recis => {
            let ck = crate::open_as(path, format)?;
            for file in &ckpt_recis::verify(path).at(path)?.torch_files {
                torch_problems(file, &mut report);
            }
            read_all(&ck, &mut report, progress);
        }
        _ => read_all(&crate::open_as(path, format)?, &mut report, progress),
    }
    Ok(report)
}

/// The records of a `torch.save` file whose CRC-32 failed, as problems.
#[cfg(feature = "torch")]
fn torch_problems(file: &ckpt_torch::VerifyReport, report: &mut VerifyReport) {
    for (record, e) in &file.problems {
        report.problems.push(format!("{}: record {record}: {e}", file.path.display()));
    }
}

/// Reads every entry: tensors to their last byte, values decoded.
fn read_all(ck: &Checkpoint, report: &mut VerifyReport, progress: Progress<'_>) {
    let entries = ck.entries();
    let total = entries.len() as u64;
    for (i, e) in entries.iter().enumerate() {
        match &e.kind {
            EntryKind::Tensor(_) => match ck.tensor(&e.name).and_then(|t| t.data().map(|d| d.len()).at(ck.path())) {
                Ok(n) => report.bytes += n as u64,
                Err(err) => report.problems.push(format!("{}: {}", e.name, chain(&err))),
            },
            EntryKind::OpaqueTensor(_) => {}
            _ => {
                if let Err(err) = ck.value(&e.name) {
                    report.problems.push(format!("{}: {}", e.name, chain(&err)));
                }
            }
        }
        report.checked += 1;
        progress(i as u64 + 1, total);
    }
}

/// An error's message and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

/// PyTorch-BigGraph: the storage's own check of the committed version.
#[cfg(feature = "pbg")]
fn pbg(path: &Path, report: &mut VerifyReport) -> Result<()> {
    let storage = ckpt_pbg::FileCheckpointStorage::new(path);
    let entities = pbg_entity_path(path).map(ckpt_pbg::EntityStorage::new);
    if entities.is_none() {
        report.warnings.push(
            "entity path not found (config.json's entity_path, relative to the working directory or the \
             checkpoint's parent): embedding counts not checked"
                .into(),
        );
    }
    let r = storage.verify(entities.as_ref()).at(path)?;
    for (entity, part) in &r.missing {
        report.problems.push(format!("version {}: missing partition {part} of entity {entity}", r.version));
    }
    if r.missing_model {
        report.problems.push(format!("version {}: missing model.v{}.h5", r.version, r.version));
    }
    for (name, e) in &r.invalid {
        report.problems.push(format!("{name}: {}", chain(e)));
    }
    for name in &r.partial {
        report.warnings.push(format!("{name}: uncommitted (newer than version {})", r.version));
    }
    for name in &r.stale {
        report.warnings.push(format!("{name}: stale (older version no snapshot links to)"));
    }
    for link in &r.dangling_links {
        report.warnings.push(format!("{}: dangling snapshot link", link.display()));
    }
    // Every file of the committed version, read.
    let ck = ckpt_pbg::PbgReader::open(path).at(path)?;
    let ck = Checkpoint { format: Format::Pbg, path: path.to_path_buf(), inner: Box::new(ck) };
    read_all(&ck, report, &|_, _| {});
    Ok(())
}

/// The entity path of a PBG checkpoint, from its `config.json` ([`ckpt_pbg::ConfigFile`] resolves it), when
/// it is a directory.
#[cfg(feature = "pbg")]
fn pbg_entity_path(path: &Path) -> Option<std::path::PathBuf> {
    ckpt_pbg::ConfigFile::locate(path).ok()?.entity_path().filter(|p| p.is_dir())
}
