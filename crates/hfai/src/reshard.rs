//! Resharding: rewriting an N-part checkpoint as M parts, offline, from one process.

use std::fs;
use std::path::Path;

use ckpt_core::Value;
use ckpt_torch::ReadOptions;

use crate::contents::Item;
use crate::error::{Error, Result};
use crate::reader::read_merged;
use crate::writer::{Plan, WriteOptions};

/// Options for [`reshard`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReshardOptions {
    /// How the source parts are read.
    pub read: ReadOptions,
    /// How the new parts are written (the chunking threshold, torch options).
    pub write: WriteOptions,
    /// Per model (in save order), the names of its buffers, which go whole into part 0 as hfai puts them.
    /// An hfai checkpoint does not record which entries are buffers; entries not named here are spread over
    /// the parts like parameters, which every loader accepts (it takes the union of the parts).
    pub buffers: Vec<Vec<String>>,
}

impl ReshardOptions {
    /// These options with `write` as the write options.
    #[must_use]
    pub fn with_write(mut self, write: WriteOptions) -> Self {
        self.write = write;
        self
    }

    /// These options with `names` as model `model`'s buffers.
    #[must_use]
    pub fn with_buffers<S: Into<String>>(mut self, model: usize, names: impl IntoIterator<Item = S>) -> Self {
        if self.buffers.len() <= model {
            self.buffers.resize(model + 1, Vec::new());
        }
        if let Some(b) = self.buffers.get_mut(model) {
            b.extend(names.into_iter().map(Into::into));
        }
        self
    }
}

/// What [`reshard`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReshardSummary {
    /// Parts read.
    pub from: usize,
    /// Parts written.
    pub to: usize,
    /// Tensors written in chunks.
    pub chunked: usize,
    /// Tensor bytes copied: new chunks that span stored chunks, and formerly chunked tensors now written
    /// whole. Everything else is written straight from the source parts' memory maps.
    pub copied_bytes: u64,
}

/// Rewrites the checkpoint in `src` as `nshards` parts in `dst` (a different directory), from one process.
///
/// The result is what hfai's `save` would write on `nshards` ranks for the same state: small entries
/// re-partitioned over the new parts, large tensors re-chunked with `torch.chunk`, `others` in part 0.
/// Nothing is materialised that does not need it: small entries are written straight from the source's
/// memory maps, and a new chunk that lies inside one stored chunk is a window of it; only new chunks
/// spanning stored chunks are copied (see [`ReshardSummary::copied_bytes`]).
///
/// # Errors
/// Any error of [`HfaiReader::open`](crate::HfaiReader::open) for `src` or of [`save`](crate::save)
/// for `dst`; [`Error::SameDirectory`] if `dst` is `src`; [`Error::UnknownBuffer`] for a buffer name that is
/// not an entry of its model.
pub fn reshard(src: &Path, dst: &Path, nshards: usize, options: &ReshardOptions) -> Result<ReshardSummary> {
    let merged = read_merged(src, &options.read)?;
    fs::create_dir_all(dst).map_err(|e| Error::io(dst, e))?;
    let same = fs::canonicalize(src).map_err(|e| Error::io(src, e))?
        == fs::canonicalize(dst).map_err(|e| Error::io(dst, e))?;
    if same {
        return Err(Error::SameDirectory { path: dst.to_path_buf() });
    }
    let mut contents = merged.contents;
    for (m, names) in options.buffers.iter().enumerate() {
        let Some(model) = contents.models.get_mut(m) else {
            if let Some(name) = names.first() {
                return Err(Error::UnknownBuffer { model: m, name: name.clone() });
            }
            continue;
        };
        for name in names {
            let i = model
                .entries
                .iter()
                .position(|(k, _)| k.as_str() == Some(name))
                .ok_or_else(|| Error::UnknownBuffer { model: m, name: name.clone() })?;
            let (k, item) = model.entries.remove(i);
            let v = match item {
                Item::Value(v) => v,
                Item::Chunked(c) => Value::Tensor(c.whole()?.0),
            };
            model.buffers.push((k, v));
        }
    }
    let plan = Plan::new(contents, nshards, options.write.large_size)?;
    plan.write_all(dst, &options.write)?;
    Ok(ReshardSummary {
        from: merged.nshards,
        to: nshards,
        chunked: plan.chunked_count(),
        copied_bytes: plan.copied_bytes(),
    })
}
