//! Opening a checkpoint of any format: detected from its contents, or declared; read under the call's
//! limits and source options.

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::format::Format;
use crate::formats::{self, detect};
use crate::limits::ReadLimits;
use crate::source::SourceOptions;

/// Opens a checkpoint of any enabled format, detecting it from the path's contents. The path is anything
/// that names one (`&str`, `String`, `&Path`, `PathBuf`), as in `std::fs`:
///
/// ```no_run
/// let ck = ckpt::open("model.pt")?;
/// for e in ck.entries() {
///     println!("{} {:?}", e.name, e.kind);
/// }
/// # Ok::<(), ckpt::Error>(())
/// ```
///
/// # Errors
/// [`Error::UnknownFormat`](crate::Error::UnknownFormat), [`Error::FeatureDisabled`](crate::Error::FeatureDisabled) naming the feature to enable, or the format's own
/// error.
pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
    open_with(path, &ReadLimits::default())
}

/// [`open`] under the resource `limits` of this call ([`ReadLimits`]: the pickle decoder's, header and
/// metadata sizes, inflated sizes), instead of the defaults.
///
/// # Errors
/// As [`open`]; a limit exceeded is an error of [`Fault::Limit`](crate::Fault::Limit) naming it.
pub fn open_with(path: impl AsRef<Path>, limits: &ReadLimits) -> Result<Checkpoint> {
    let path = path.as_ref();
    let format = detect(path)?;
    open_as_with(path, format, limits)
}

/// Opens a checkpoint as the given format.
///
/// # Errors
/// As [`open`].
pub fn open_as(path: impl AsRef<Path>, format: Format) -> Result<Checkpoint> {
    let path = path.as_ref();
    open_as_with(path, format, &ReadLimits::default())
}

/// [`open_as`] under the resource `limits` of this call.
///
/// # Errors
/// As [`open_with`].
pub fn open_as_with(path: impl AsRef<Path>, format: Format, limits: &ReadLimits) -> Result<Checkpoint> {
    let path = path.as_ref();
    open_source(path, Some(format), limits, &SourceOptions::default())
}

/// Opens a checkpoint (of `format`, or detected) under `limits`, read as `source` says: a DeepSpeed root's
/// tag, Megatron's layers unstacked, a name map ([`SourceOptions`]).
///
/// # Errors
/// As [`open_with`]; [`crate::Error::OptionNotApplicable`] for a source option of another format than the
/// checkpoint's ([`crate::options::named::check_source`]).
pub fn open_source(
    path: impl AsRef<Path>,
    format: Option<Format>,
    limits: &ReadLimits,
    source: &SourceOptions,
) -> Result<Checkpoint> {
    let path = path.as_ref();
    formats::refuse_special(path)?;
    let format = match format {
        Some(f) => f,
        None => detect(path)?,
    };
    crate::options::named::check_source(source, format)?;
    let inner = formats::adaptor(format, path)?.open_source(path, limits, source)?;
    Ok(Checkpoint::new(format, path, inner))
}
