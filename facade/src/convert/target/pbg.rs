//! Writing a source as a PyTorch-BigGraph checkpoint directory: [`ckpt_pbg::save`] on the source's entries
//! (the crate's `save` documents the names it takes, the re-partitioning and the optimizer rebuild).

use std::path::Path;

use ckpt_core::Value;

use super::super::source::Content;
use super::super::{ConvertOptions, ConvertSummary};
use crate::error::At;
use crate::{Error, Format, Result};

fn unsupported(from: Format, reason: String) -> Error {
    Error::UnsupportedConversion { from, to: Format::Pbg, reason }
}

pub(super) fn write(content: &Content, from: Format, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
    let entries: Vec<(String, Value)> = content.leaves.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
    let mut write = ckpt_pbg::WriteOptions::default();
    if let Some(path) = &options.pbg_config {
        let text = std::fs::read_to_string(path).at(path)?;
        write = write.with_config(ckpt_pbg::Config::parse(&text).at(path)?);
    }
    let config_path = options.pbg_config.clone().unwrap_or_else(|| dst.join(ckpt_pbg::CONFIG_FILE));
    let report = match ckpt_pbg::save(&entries, dst, &write) {
        Ok(r) => r,
        Err(ckpt_pbg::Error::NoEmbeddings) => {
            return Err(unsupported(
                from,
                format!(
                    "a PyTorch-BigGraph checkpoint is entity embedding partitions and relation operators; this \
                     {from} checkpoint has no `embeddings/<entity>/<partition>` or `model/<parameter>` entries (the \
                     names a PBG checkpoint converted to {from} keeps)"
                ),
            ));
        }
        Err(ckpt_pbg::Error::NoConfig) => {
            return Err(unsupported(
                from,
                "the source has no PyTorch-BigGraph `config` entry, and a PBG checkpoint needs the training config \
                 that defines its entities, partitions and relations: give one (ConvertOptions::with_pbg_config, \
                 `ckpt convert --pbg-config config.json`)"
                    .into(),
            ));
        }
        Err(ckpt_pbg::Error::LayoutMismatch { reason }) => {
            return Err(unsupported(from, format!("{reason} (config {})", config_path.display())));
        }
        Err(ckpt_pbg::Error::AlreadyExists { path }) => {
            return Err(Error::AlreadyExists {
                path,
                reason: "the target already holds a PyTorch-BigGraph checkpoint; convert into a new directory".into(),
            });
        }
        Err(e) => return Err(e).at(dst),
    };
    let dropped: std::collections::HashSet<&str> = report.dropped.iter().map(String::as_str).collect();
    let mut s = super::count(content.leaves.iter().filter(|l| !dropped.contains(l.name.as_str())));
    s.dropped = report.dropped;
    Ok(s)
}
