//! The registry: the adaptor of every format this build has ([`ADAPTORS`], each `formats/<format>.rs`),
//! detection of a path's format ([`detect`]), and the format crates re-exported ([`crates`]). The
//! operations (`open`, `convert`, `verify`, `reshard`, `diff`, `inspect`) find their adaptor here.
//!
//! Adding a format: its crate, a variant of [`Format`] with its row in `format.rs`, its adaptor file
//! `formats/<format>.rs` (an [`Adaptor`]) with its line in [`ADAPTORS`] and in [`crates`] here, and the
//! manifests (the facade's dependency and feature).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::adaptor::Adaptor;
use crate::error::{At, Error, Result};
use crate::format::{Format, Probe, recognise};

#[cfg(feature = "deepspeed")]
mod deepspeed;
#[cfg(feature = "distcp")]
mod distcp;
#[cfg(feature = "gguf")]
mod gguf;
#[cfg(feature = "hf")]
mod hf;
#[cfg(feature = "hfai")]
mod hfai;
#[cfg(feature = "megatron")]
mod megatron;
#[cfg(feature = "package")]
mod package;
#[cfg(feature = "pbg")]
mod pbg;
#[cfg(feature = "pickle")]
mod pickle;
#[cfg(feature = "recis")]
mod recis;
#[cfg(feature = "safetensors")]
mod safetensors;
#[cfg(any(feature = "safetensors", feature = "distcp"))]
mod safetensors_checks;
#[cfg(feature = "torch")]
pub(crate) mod torch;

/// The crates of the tensor model (`ckpt::tensor`) and of every format, each re-exported under the format's
/// name behind its feature (`ckpt::torch`, ...).
pub mod crates {
    /// Process groups: [`Collective`](ckpt_collective::Collective), threads, MPI (feature `mpi`).
    pub use ckpt_collective as collective;
    #[cfg(feature = "deepspeed")]
    pub use ckpt_deepspeed as deepspeed;
    #[cfg(feature = "distcp")]
    pub use ckpt_distcp as distcp;
    /// GGUF files: the reader, the ggml types, dequantization.
    #[cfg(feature = "gguf")]
    pub use ckpt_gguf as gguf;
    #[cfg(feature = "hfai")]
    pub use ckpt_hfai as hfai;
    /// The durable commit path every writer uses.
    pub use ckpt_io as io;
    #[cfg(feature = "pbg")]
    pub use ckpt_pbg as pbg;
    /// The pickle decoder, whose [`Limits`](ckpt_pickle::Limits) bound what a file can make a reader do.
    #[cfg(feature = "torch")]
    pub use ckpt_pickle as pickle;
    #[cfg(feature = "recis")]
    pub use ckpt_recis as recis;
    /// safetensors files, ckpt's metadata convention, Hugging Face shards.
    pub use ckpt_safetensors as safetensors;
    #[cfg(feature = "hf")]
    pub use ckpt_safetensors::hf;
    /// The tensor model: dtypes, buffers, tensors, values, flattening.
    pub use ckpt_tensor as tensor;
    #[cfg(feature = "torch")]
    pub use ckpt_torch as torch;
}

/// The adaptor of every format this build has, each behind its feature.
const ADAPTORS: &[&dyn Adaptor] = &[
    #[cfg(feature = "torch")]
    &torch::Torch,
    #[cfg(feature = "safetensors")]
    &safetensors::Safetensors,
    #[cfg(feature = "megatron")]
    &megatron::Megatron,
    #[cfg(feature = "distcp")]
    &distcp::Distcp,
    #[cfg(feature = "hfai")]
    &hfai::Hfai,
    #[cfg(feature = "pbg")]
    &pbg::Pbg,
    #[cfg(feature = "recis")]
    &recis::Recis,
    #[cfg(feature = "deepspeed")]
    &deepspeed::DeepSpeed,
    #[cfg(feature = "hf")]
    &hf::Hf,
    #[cfg(feature = "pickle")]
    &pickle::Pickle,
    #[cfg(feature = "package")]
    &package::TorchPackage,
    #[cfg(feature = "gguf")]
    &gguf::Gguf,
];

/// `ckpt convert`'s flags for the target format, each format's own (they live with its adaptor,
/// `formats/<format>.rs`), flattened into one set of flags: the tool's whole knowledge of target options.
///
/// [`TargetArgs::options`] keeps the flags of the conversion's target format and refuses those of another.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct TargetArgs {
    #[cfg(feature = "distcp")]
    #[command(flatten)]
    distcp: distcp::DistcpArgs,
    #[cfg(feature = "hfai")]
    #[command(flatten)]
    hfai: hfai::HfaiArgs,
    #[cfg(feature = "recis")]
    #[command(flatten)]
    recis: recis::RecisArgs,
    #[cfg(feature = "pbg")]
    #[command(flatten)]
    pbg: pbg::PbgArgs,
    #[cfg(feature = "hf")]
    #[command(flatten)]
    hf: hf::HfArgs,
    #[cfg(feature = "gguf")]
    #[command(flatten)]
    gguf: gguf::GgufArgs,
}

#[cfg(feature = "cli")]
impl TargetArgs {
    /// The options of a conversion to `to`: its format's flags, or its defaults when none of them was
    /// given.
    ///
    /// # Errors
    /// [`Error::OptionNotApplicable`] naming a flag given for another format than `to`.
    pub fn options(&self, to: Format) -> Result<crate::options::TargetOptions> {
        let offered: [(crate::options::TargetOptions, Option<&'static str>); 0] = [];
        let offered = offered.into_iter();
        #[cfg(feature = "distcp")]
        let offered = offered.chain([self.distcp.target()]);
        #[cfg(feature = "hfai")]
        let offered = offered.chain([self.hfai.target()]);
        #[cfg(feature = "recis")]
        let offered = offered.chain([self.recis.target()]);
        #[cfg(feature = "pbg")]
        let offered = offered.chain([self.pbg.target()]);
        #[cfg(feature = "hf")]
        let offered = offered.chain([self.hf.target()]);
        #[cfg(feature = "gguf")]
        let offered = offered.chain([self.gguf.target()]);
        crate::options::TargetOptions::pick(to, offered)
    }
}

/// The adaptor of `format`, or `None` when this build lacks it.
pub(crate) fn enabled(format: Format) -> Option<&'static dyn Adaptor> {
    ADAPTORS.iter().copied().find(|a| a.format() == format)
}

/// The adaptor of `format`, or [`Error::FeatureDisabled`] naming `path` when this build lacks it.
pub(crate) fn adaptor(format: Format, path: &Path) -> Result<&'static dyn Adaptor> {
    enabled(format).ok_or_else(|| Error::FeatureDisabled {
        path: path.to_path_buf(),
        format,
        feature: format.feature(),
    })
}

/// Detects the format of a file or directory from its contents (magic bytes, marker files), trying the
/// formats in [`Format::ALL`]'s order. Formats this build cannot read are recognised too, so that opening
/// one names the feature to enable.
///
/// # Errors
/// [`Error::Io`] if the path cannot be read, [`Error::SpecialFile`] for a named pipe, a socket or a device,
/// [`Error::UnknownFormat`] for a directory no format recognises (listing the marker files looked for),
/// [`Error::NotACheckpoint`] for a file (saying what it looks like: [`crate::format::looks_like`]), or the torch
/// codec's error for a torch file of old (TAR-era).
pub fn detect(path: &Path) -> Result<Format> {
    refuse_special(path)?;
    if path.is_dir() {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path).at(path)? {
            names.push(entry.at(path)?.file_name().to_string_lossy().into_owned());
        }
        return recognise(&Probe::Dir(path, &names)).ok_or_else(|| Error::UnknownFormat {
            path: path.to_path_buf(),
            reason: format!(
                "{}: looked for {}; if it is one, name its format: `ckpt convert --from`, Python \
                 `ckpt.open(path, format=...)`",
                if names.is_empty() { "the directory is empty" } else { "no marker file in the directory" },
                crate::format::markers_looked_for()
            ),
        });
    }
    let mut head = Vec::new();
    File::open(path).at(path)?.take(4096).read_to_end(&mut head).at(path)?;
    if let Some(format) = recognise(&Probe::File(&head)) {
        // A torch.package archive is a ZIP archive as torch.save's: its central directory tells.
        #[cfg(feature = "torch")]
        if format == Format::Torch && head.starts_with(b"PK") && ckpt_torch::package::is_package_file(path) {
            return Ok(Format::Package);
        }
        return Ok(format);
    }
    // A torch file of old that ckpt does not read (TAR-era, preview release) says so.
    if let Some(e) = ADAPTORS.iter().find_map(|a| a.explain(&head, path)) {
        return Err(e);
    }
    // What the file looks like instead: a text file, an empty file, a gzip file, ...
    Err(Error::NotACheckpoint { path: path.to_path_buf(), looks_like: crate::format::looks_like(&head) })
}

/// Refuses at once a path that is neither a regular file nor a directory, which a read could block on (a
/// named pipe) or never finish (a device): [`Error::SpecialFile`]. A path that does not exist passes (its
/// open says so).
///
/// # Errors
/// [`Error::SpecialFile`] naming what the path is.
pub(crate) fn refuse_special(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
    let kind = meta.file_type();
    if kind.is_file() || kind.is_dir() {
        return Ok(());
    }
    #[cfg(unix)]
    let what = {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            "a named pipe (FIFO)"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else {
            "a special file"
        }
    };
    #[cfg(not(unix))]
    let what = "a special file";
    Err(Error::SpecialFile { path: path.to_path_buf(), kind: what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_enabled_format_has_one_adaptor() {
        for f in Format::ALL {
            assert_eq!(f.reading_enabled(), ADAPTORS.iter().any(|a| a.format() == f), "{f}");
        }
        for a in ADAPTORS {
            assert!(a.format().reading_enabled());
            assert_eq!(ADAPTORS.iter().filter(|b| b.format() == a.format()).count(), 1, "{}", a.format());
        }
    }
}
