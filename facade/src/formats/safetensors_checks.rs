//! What the adaptors that read safetensors files (safetensors, hf, and distcp's Hugging Face layout) check of
//! those files through `ckpt-safetensors`: a header's declared length against the limits before it is
//! parsed, and the per-tensor checksums ckpt records.

use std::path::Path;

use crate::error::{At, Error, Result};
use crate::limits::ReadLimits;
#[cfg(any(feature = "safetensors", feature = "hf"))]
use crate::report::{Problem, ProblemKind, VerifyReport};

/// Checks the per-tensor checksums ckpt records in a safetensors header
/// ([`ckpt_safetensors::checksums`]) of the file at `file`, reading every byte of its tensors; a file
/// without them (written by another library) has nothing to check.
#[cfg(any(feature = "safetensors", feature = "hf"))]
pub(crate) fn check_safetensors_checksums(file: &Path, report: &mut VerifyReport) {
    match ckpt_safetensors::SafetensorsReader::open(file).and_then(|r| ckpt_safetensors::checksums(&r)) {
        Ok(None) => {}
        Ok(Some(problems)) => report
            .problems
            .extend(problems.into_iter().map(|p| Problem::new(ProblemKind::ChecksumMismatch, p).in_file(file))),
        Err(e) => report.push(Problem::from_error(ProblemKind::Unreadable, &e).in_file(file)),
    }
}

/// [`Error::LimitExceeded`] when the safetensors file `path`, or a `.safetensors` file of the directory
/// `path`, declares a header longer than [`ReadLimits::max_header_bytes`] of `limits`; checked from the 8-byte length
/// prefix, before anything parses the header. Files too short to have a prefix are left to the parser.
#[cfg(any(feature = "safetensors", feature = "hf", feature = "distcp"))]
pub(crate) fn check_safetensors_headers(limits: &ReadLimits, path: &Path) -> Result<()> {
    if !path.is_dir() {
        return check_safetensors_header(limits, path);
    }
    for entry in std::fs::read_dir(path).at(path)? {
        let file = entry.at(path)?.path();
        if file.extension().is_some_and(|e| e == "safetensors") && file.is_file() {
            check_safetensors_header(limits, &file)?;
        }
    }
    Ok(())
}

#[cfg(any(feature = "safetensors", feature = "hf", feature = "distcp"))]
fn check_safetensors_header(limits: &ReadLimits, path: &Path) -> Result<()> {
    let mut file = std::fs::File::open(path).at(path)?;
    // A file too short to have a length prefix is left to the parser, which names the rule it breaks.
    let Some(len) = ckpt_safetensors::header::declared_len(&mut file).at(path)? else { return Ok(()) };
    if len > limits.max_header_bytes {
        return Err(Error::LimitExceeded {
            path: path.to_path_buf(),
            limit: "max_header_bytes",
            what: "safetensors header",
            value: len,
            max: limits.max_header_bytes,
        });
    }
    Ok(())
}
