//! The checkpoint formats ckpt knows, and telling them apart from files and directories.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::Error;

/// A checkpoint format. Exists whatever features are enabled; [`Format::reading_enabled`] says whether this
/// build can read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// `torch.save` files (ZIP or legacy).
    Torch,
    /// `.safetensors` files.
    Safetensors,
    /// `torch.distributed.checkpoint` directories.
    Distcp,
    /// hfai `PART_*.pt` directories.
    Hfai,
    /// PyTorch-BigGraph HDF5 checkpoints.
    Pbg,
    /// RecIS sparse/dense checkpoints.
    Recis,
}

impl Format {
    /// Every format.
    pub const ALL: [Format; 6] =
        [Format::Torch, Format::Safetensors, Format::Distcp, Format::Hfai, Format::Pbg, Format::Recis];

    /// The name used on the command line and in features.
    pub fn name(self) -> &'static str {
        match self {
            Format::Torch => "torch",
            Format::Safetensors => "safetensors",
            Format::Distcp => "distcp",
            Format::Hfai => "hfai",
            Format::Pbg => "pbg",
            Format::Recis => "recis",
        }
    }

    /// The format called `name`.
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The cargo feature that enables this format.
    pub fn feature(self) -> &'static str {
        self.name()
    }

    /// Whether this build can read the format.
    pub fn reading_enabled(self) -> bool {
        match self {
            Format::Torch => cfg!(feature = "torch"),
            Format::Safetensors => cfg!(feature = "safetensors"),
            Format::Distcp => cfg!(feature = "distcp"),
            Format::Pbg => cfg!(feature = "pbg"),
            Format::Recis => cfg!(feature = "recis"),
            Format::Hfai => cfg!(feature = "hfai"),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Magic bytes of single-file formats: `(offset, bytes, format)`, checked in order.
const MAGIC: &[(usize, &[u8], Format)] = &[
    (0, b"PK\x03\x04", Format::Torch),
    (0, &[0x80, 0x02, 0x8A, 0x0A, 0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19], Format::Torch),
];

/// Marker files of directory formats: a file name (or prefix with `*`) and the format it implies.
const MARKERS: &[(&str, Format)] = &[
    (".metadata", Format::Distcp),
    ("model.safetensors.index.json", Format::Distcp),
    ("__*.metadata", Format::Distcp),
    ("shard-*-model-*-of-*.safetensors", Format::Distcp),
    ("PART_*.pt", Format::Hfai),
    ("checkpoint_version.txt", Format::Pbg),
    ("tensorkey.json", Format::Recis),
    ("index", Format::Recis),
    ("checkpoint", Format::Recis),
];

/// Whether `name` matches a pattern where `*` stands for any run of characters.
fn marker_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Detects the format of a file or directory from its contents (magic bytes, marker files).
///
/// # Errors
/// [`Error::Io`] if the path cannot be read, [`Error::UnknownFormat`] if nothing matches.
pub fn detect(path: &Path) -> Result<Format, Error> {
    let io = |e| Error::Io { path: path.to_path_buf(), source: e };
    if path.is_dir() {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            names.push(entry.map_err(io)?.file_name().to_string_lossy().into_owned());
        }
        for (pattern, format) in MARKERS {
            if names.iter().any(|n| marker_matches(pattern, n)) {
                return Ok(*format);
            }
        }
        return Err(Error::UnknownFormat {
            path: path.to_path_buf(),
            reason: "no marker file in the directory".into(),
        });
    }
    let mut head = Vec::new();
    File::open(path).map_err(io)?.take(4096).read_to_end(&mut head).map_err(io)?;
    for (offset, magic, format) in MAGIC {
        if head.get(*offset..offset + magic.len()) == Some(*magic) {
            return Ok(*format);
        }
    }
    if let Some(len) = head.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes) {
        if head.get(8) == Some(&b'{') && len > 1 {
            return Ok(Format::Safetensors);
        }
    }
    // Let the torch codec name the wrong-file cases (git-LFS pointer, HTML, TAR-era, empty ...).
    #[cfg(feature = "torch")]
    if let Err(e) = ckpt_torch::detect(&head) {
        return Err(crate::error::Cause::at(e, path));
    }
    Err(Error::UnknownFormat { path: path.to_path_buf(), reason: "unrecognised leading bytes".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        assert!(marker_matches("PART_*.pt", "PART_000.pt"));
        assert!(!marker_matches("PART_*.pt", "PART_000.pth"));
        assert!(marker_matches("__*.metadata", "__0.metadata"));
        assert!(!marker_matches("__*.metadata", ".metadata"));
        assert!(marker_matches("shard-*-model-*-of-*.safetensors", "shard-00001-model-00001-of-00001.safetensors"));
        assert!(!marker_matches("shard-*-model-*-of-*.safetensors", "model-00001-of-00002.safetensors"));
        assert!(marker_matches("index", "index"));
        assert!(!marker_matches("index", "index.json"));
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.name()), Some(f));
        }
    }
}
