//! The checkpoint formats ckpt knows, whatever this build's features: each one's name, what it is, how it
//! is recognised from a file's leading bytes or a directory's file names, whether it splits over ranks and
//! whether ckpt writes it. The bottom of the facade: it imports nothing of it.
//!
//! Adding a format: a variant of [`Format`] with its row in `KNOWN` here, then its adaptor
//! (`formats/<format>.rs`) and its line in the registry (`formats.rs`).

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// A checkpoint format. Exists whatever features are enabled; [`Format::reading_enabled`] says whether this
/// build can read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// `torch.save` files (ZIP or legacy).
    Torch,
    /// `.safetensors` files.
    Safetensors,
    /// Megatron-Core `torch_dist` checkpoints (DCP with `metadata.json` and `common.pt`).
    Megatron,
    /// `torch.distributed.checkpoint` directories.
    Distcp,
    /// hfai `PART_*.pt` directories.
    Hfai,
    /// PyTorch-BigGraph HDF5 checkpoints.
    Pbg,
    /// RecIS sparse/dense checkpoints.
    Recis,
    /// DeepSpeed ZeRO (stages 1-3) and universal checkpoints.
    DeepSpeed,
    /// Hugging Face sharded safetensors directories (`model-0000i-of-0000n.safetensors` +
    /// `model.safetensors.index.json`, or one `model.safetensors`).
    Hf,
    /// Plain pickles of objects holding tensors or modules (`pickle.dump`, protocols 0 to 5), which
    /// `torch.load` refuses.
    Pickle,
    /// torch.package archives (`torch.package.PackageExporter`: pickled resources, their modules' code,
    /// TorchScript modules).
    Package,
    /// GGUF files (llama.cpp, ggml): metadata and tensors, quantized ones dequantized.
    Gguf,
}

/// What the facade knows about a format whether or not this build has it: enough to name it, recognise
/// it, and say which feature reads it.
struct Known {
    format: Format,
    /// The name on the command line, in features and in messages.
    name: &'static str,
    /// What it is, in a few words (the `ckpt` tool's help).
    about: &'static str,
    /// Whether a checkpoint splits over ranks, shards or parts that [`crate::reshard`] can rewrite.
    sharded: bool,
    /// Whether ckpt writes this format (a conversion to a format it only reads is refused).
    writable: bool,
    /// For a format whose checkpoint is one file, the name such a file usually has (what a message
    /// suggests for a directory path); `None` for a directory format.
    file: Option<&'static str>,
    /// Whether a file's leading bytes, or a directory's file names, are this format's.
    detect: fn(&Probe<'_>) -> bool,
    /// Whether this build has the format's adaptor (its feature is on).
    enabled: bool,
}

/// Every format, in [`Format`]'s order, which is also the order detection tries them in.
const KNOWN: [Known; 12] = [
    Known {
        format: Format::Torch,
        name: "torch",
        about: "torch.save files (.pt, .pth, .bin)",
        sharded: false,
        writable: true,
        file: Some("model.pt"),
        detect: |p| p.magic(0, b"PK\x03\x04") || p.magic(0, &LEGACY_TORCH_MAGIC),
        enabled: cfg!(feature = "torch"),
    },
    Known {
        format: Format::Safetensors,
        name: "safetensors",
        about: ".safetensors files",
        sharded: false,
        writable: true,
        file: Some("model.safetensors"),
        detect: |p| p.safetensors_header(),
        enabled: cfg!(feature = "safetensors"),
    },
    Known {
        format: Format::Megatron,
        name: "megatron",
        about: "Megatron-Core torch_dist checkpoints (metadata.json, common.pt, DCP files)",
        sharded: false,
        writable: false,
        file: None,
        // Before distcp: the same `.metadata`, with Megatron's `metadata.json` beside it.
        detect: |p| p.marker("metadata.json") && p.json_field("metadata.json", "sharded_backend").is_some(),
        enabled: cfg!(feature = "megatron"),
    },
    Known {
        format: Format::Distcp,
        name: "distcp",
        about: "torch.distributed.checkpoint directories",
        sharded: true,
        writable: true,
        file: None,
        // DCP's own metadata, or its Hugging Face storage layout (`HuggingFaceStorageWriter`: per-rank
        // `shard-*` files, or transformers' names with `DCP_SHARDING_INFO` in the files' metadata).
        detect: |p| {
            [".metadata", "__*.metadata", "shard-*-model-*-of-*.safetensors"].iter().any(|m| p.marker(m))
                || (HF_MARKERS.iter().any(|m| p.marker(m)) && p.safetensors_metadata_key("DCP_SHARDING_INFO"))
        },
        enabled: cfg!(feature = "distcp"),
    },
    Known {
        format: Format::Hfai,
        name: "hfai",
        about: "hfai PART_*.pt directories",
        sharded: true,
        writable: true,
        file: None,
        detect: |p| p.marker("PART_*.pt"),
        enabled: cfg!(feature = "hfai"),
    },
    Known {
        format: Format::Pbg,
        name: "pbg",
        about: "PyTorch-BigGraph checkpoints",
        sharded: false,
        writable: true,
        file: None,
        detect: |p| p.marker("checkpoint_version.txt"),
        enabled: cfg!(feature = "pbg"),
    },
    Known {
        format: Format::Recis,
        name: "recis",
        about: "RecIS checkpoints (or an output root with a `checkpoint` list)",
        sharded: true,
        writable: true,
        file: None,
        detect: |p| ["tensorkey.json", "index", "checkpoint"].iter().any(|m| p.marker(m)),
        enabled: cfg!(feature = "recis"),
    },
    Known {
        format: Format::DeepSpeed,
        name: "deepspeed",
        about: "DeepSpeed ZeRO checkpoints (latest + global_stepN/, or a tag directory; universal checkpoints)",
        sharded: false,
        writable: false,
        file: None,
        // A root (`latest`, and its tag directories) or a tag directory (model states files, or a universal
        // checkpoint's `zero/` with model states beside it). Before hf: a Trainer's checkpoint directory holds
        // both.
        detect: |p| {
            (["latest", "latest_universal"].iter().any(|m| p.marker(m)) && p.marker("global_step*"))
                || p.marker("*_model_states.pt")
        },
        enabled: cfg!(feature = "deepspeed"),
    },
    Known {
        format: Format::Hf,
        name: "hf",
        about: "Hugging Face sharded safetensors directories (model-0000i-of-0000n.safetensors + index)",
        sharded: false,
        writable: true,
        file: None,
        detect: |p| HF_MARKERS.iter().any(|m| p.marker(m)),
        enabled: cfg!(feature = "hf"),
    },
    Known {
        format: Format::Pickle,
        name: "pickle",
        about: "plain pickles of models and tensors (pickle.dump, .pkl)",
        sharded: false,
        writable: false,
        file: Some("model.pkl"),
        // After torch: a legacy torch.save stream starts with a pickle too.
        detect: |p| p.plain_pickle(),
        enabled: cfg!(feature = "pickle"),
    },
    Known {
        format: Format::Package,
        name: "package",
        about: "torch.package archives (PackageExporter: pickled resources, code listed, never run)",
        sharded: false,
        writable: false,
        file: Some("model.pt"),
        // A ZIP archive as torch.save's: told apart by its central directory (`.data/extern_modules`), which
        // the registry's detection reads for a file recognised as torch.
        detect: |_| false,
        enabled: cfg!(feature = "package"),
    },
    Known {
        format: Format::Gguf,
        name: "gguf",
        about: "GGUF files of llama.cpp and ggml (.gguf; quantized tensors dequantized, written with --quant)",
        sharded: false,
        writable: true,
        file: Some("model.gguf"),
        detect: |p| p.magic(0, b"GGUF"),
        enabled: cfg!(feature = "gguf"),
    },
];

/// The file names of a Hugging Face checkpoint directory (transformers' `save_pretrained`).
const HF_MARKERS: [&str; 3] = ["model.safetensors.index.json", "model.safetensors", "model-*-of-*.safetensors"];

/// The pickle header of a legacy (pre-1.6) `torch.save` file: protocol 2, then the magic number.
const LEGACY_TORCH_MAGIC: [u8; 14] =
    [0x80, 0x02, 0x8A, 0x0A, 0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19];

/// Conversions refused whatever the checkpoint holds: (from, to, why).
const REFUSED: &[(Format, Format, &str)] = &[(
    Format::Recis,
    Format::Pbg,
    "a PyTorch-BigGraph checkpoint is entity embedding partitions and relation operators; a RecIS checkpoint's \
     hash tables and dense state have no such structure to map onto them",
)];

impl Format {
    /// Every format.
    pub const ALL: [Format; 12] = {
        let mut all = [Format::Torch; 12];
        let mut i = 0;
        while i < all.len() {
            all[i] = KNOWN[i].format;
            i += 1;
        }
        all
    };

    fn known(self) -> &'static Known {
        // `KNOWN` lists the formats in declaration order (the `registry_is_in_declaration_order` test).
        &KNOWN[self as usize]
    }

    /// The name used on the command line and in features.
    pub fn name(self) -> &'static str {
        self.known().name
    }

    /// What the format is, in a few words.
    pub fn about(self) -> &'static str {
        self.known().about
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
        self.known().enabled
    }

    /// Whether ckpt writes this format (a target of [`crate::convert`]); DeepSpeed, Megatron, plain pickles and
    /// torch.package archives are read only.
    pub fn writable(self) -> bool {
        self.known().writable
    }

    /// Whether a checkpoint of this format splits over ranks, shards or parts that [`crate::reshard`]
    /// rewrites for another number.
    pub fn is_sharded(self) -> bool {
        self.known().sharded
    }

    /// For a format whose checkpoint is one file (torch, safetensors, gguf, ...), the name such a file
    /// usually has (`model.pt`); `None` for a directory format.
    pub(crate) fn one_file_name(self) -> Option<&'static str> {
        self.known().file
    }

    /// The format of a state dict held in memory ([`crate::save`]): what `torch.save` would hold.
    pub(crate) const IN_MEMORY: Format = Format::Torch;
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no format's ([`Format::from_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown format {name:?}; one of {}", Format::ALL.map(Format::name).join(", "))]
pub struct UnknownFormatName {
    /// The name.
    pub name: String,
}

/// A format by its name: `"torch".parse::<Format>()`.
impl std::str::FromStr for Format {
    type Err = UnknownFormatName;

    fn from_str(name: &str) -> Result<Format, UnknownFormatName> {
        Format::from_name(name).ok_or_else(|| UnknownFormatName { name: name.to_owned() })
    }
}

/// Why `from` cannot be converted to `to` whatever the checkpoint holds, or `None` when it can be (a
/// conversion can still be refused for what a particular checkpoint holds, with
/// `Error::UnsupportedConversion` saying why).
pub fn unsupported_reason(from: Format, to: Format) -> Option<String> {
    if !to.known().writable {
        return Some(format!("ckpt reads {to} checkpoints but does not write them; convert to hf, torch or distcp"));
    }
    REFUSED.iter().find(|(f, t, _)| (*f, *t) == (from, to)).map(|(_, _, why)| (*why).to_owned())
}

/// What detection looks at: the first 4 KiB of a file, or the file names of a directory.
pub(crate) enum Probe<'a> {
    /// A file's leading bytes.
    File(&'a [u8]),
    /// A directory and its file names.
    Dir(&'a Path, &'a [String]),
}

impl Probe<'_> {
    /// Whether a file has `bytes` at `offset`.
    pub(crate) fn magic(&self, offset: usize, bytes: &[u8]) -> bool {
        matches!(self, Probe::File(head) if head.get(offset..offset + bytes.len()) == Some(bytes))
    }

    /// Whether a file starts like a safetensors file: an 8-byte header length, then a JSON object.
    pub(crate) fn safetensors_header(&self) -> bool {
        let Probe::File(head) = self else { return false };
        let len = head.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes);
        head.get(8) == Some(&b'{') && len.is_some_and(|len| len > 1)
    }

    /// Whether a file starts like a plain pickle: a PROTO opcode of protocol 2 to 5, or how protocol 0 and 1
    /// pickles of a dict, a list or an object start (`(dp0`, `(lp0`, `}q`, `]q`, `c<module>\n<name>\n`).
    pub(crate) fn plain_pickle(&self) -> bool {
        let Probe::File(head) = self else { return false };
        let global = |rest: &[u8]| {
            let mut lines = rest.splitn(3, |&b| b == b'\n');
            let ident =
                |s: &[u8]| !s.is_empty() && s.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
            matches!((lines.next(), lines.next(), lines.next()), (Some(m), Some(n), Some(_)) if ident(m) && ident(n))
        };
        match head {
            [0x80, 2..=5, ..] => true,
            [b'(', b'd' | b'l', b'p', d, ..] => d.is_ascii_digit(),
            [b'}' | b']', b'q' | b'r' | b'(' | b'.', ..] => true,
            [b'(', b'c', rest @ ..] | [b'c', rest @ ..] => global(rest),
            _ => false,
        }
    }

    /// The string `field` of the JSON object in the directory's file `name`, when it has one.
    pub(crate) fn json_field(&self, name: &str, field: &str) -> Option<String> {
        let Probe::Dir(dir, _) = self else { return None };
        let mut text = Vec::new();
        File::open(dir.join(name)).ok()?.take(1 << 20).read_to_end(&mut text).ok()?;
        let json: serde_json::Value = serde_json::from_slice(&text).ok()?;
        json.get(field)?.as_str().map(str::to_owned)
    }

    /// Whether a directory holds a file named like `pattern`, where `*` stands for any run of characters.
    pub(crate) fn marker(&self, pattern: &str) -> bool {
        matches!(self, Probe::Dir(_, names) if names.iter().any(|n| marker_matches(pattern, n)))
    }

    /// Whether the first (by name) `.safetensors` file of a directory has `key` in its `__metadata__`
    /// (a file whose header does not parse has none).
    pub(crate) fn safetensors_metadata_key(&self, key: &str) -> bool {
        let Probe::Dir(dir, names) = self else { return false };
        let Some(first) = names.iter().filter(|n| n.ends_with(".safetensors")).min() else { return false };
        ckpt_safetensors::header::read_file(&dir.join(first), ckpt_safetensors::header::MAX_LEN)
            .ok()
            .and_then(|h| h.metadata)
            .is_some_and(|m| m.iter().any(|(k, _)| k == key))
    }
}

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

/// The file names each format's detection looks for in a directory (as `*` patterns), for the message that
/// lists them when none is there.
const DIR_MARKERS: &[(Format, &[&str])] = &[
    (Format::Distcp, &[".metadata", "__*.metadata", "shard-*-model-*-of-*.safetensors"]),
    (Format::Megatron, &["metadata.json"]),
    (Format::Hfai, &["PART_*.pt"]),
    (Format::Pbg, &["checkpoint_version.txt"]),
    (Format::Recis, &["tensorkey.json", "index", "checkpoint"]),
    (Format::DeepSpeed, &["latest", "*_model_states.pt"]),
    (Format::Hf, &HF_MARKERS),
];

/// What a directory holding none of the formats' marker files was searched for: `.metadata, __*.metadata, ...
/// (distcp), PART_*.pt (hfai), ...`.
pub(crate) fn markers_looked_for() -> String {
    let each = DIR_MARKERS.iter().map(|(format, names)| format!("{} ({format})", names.join(", ")));
    each.collect::<Vec<_>>().join("; ")
}

/// What a file that is no checkpoint looks like, from its leading bytes: `an empty file`, `a text file
/// (starts with "# ckpt ...")`, `a gzip file`, `a ZIP archive`, `an HDF5 file`, `a JSON file`, or its first
/// bytes. Every "not a checkpoint" message of detection says it.
///
/// ```
/// use ckpt::looks_like;
/// assert_eq!(looks_like(b""), "an empty file");
/// assert_eq!(looks_like(b"# ckpt\n\nRead, write"), "a text file (starts with \"# ckpt\")");
/// assert_eq!(looks_like(b"\x1f\x8b\x08\x00"), "a gzip file");
/// ```
pub fn looks_like(head: &[u8]) -> String {
    let starts = |magic: &[u8]| head.starts_with(magic);
    if head.is_empty() {
        return "an empty file".into();
    }
    let named = [
        (&b"\x1f\x8b"[..], "a gzip file"),
        (b"PK\x03\x04", "a ZIP archive"),
        (b"PK\x05\x06", "an empty ZIP archive"),
        (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
        (b"BZh", "a bzip2 file"),
        (b"\xfd7zXZ\x00", "an xz file"),
        (b"\x28\xb5\x2f\xfd", "a zstd file"),
        (b"7z\xbc\xaf\x27\x1c", "a 7-zip archive"),
        (b"\x93NUMPY", "a numpy .npy file"),
        (b"\x7fELF", "an executable (ELF)"),
        (b"%PDF", "a PDF document"),
        (b"\x89PNG", "a PNG image"),
        (b"\xff\xd8\xff", "a JPEG image"),
    ];
    if let Some((_, what)) = named.iter().find(|(magic, _)| starts(magic)) {
        return (*what).into();
    }
    if head.get(257..262) == Some(b"ustar") {
        return "a tar archive".into();
    }
    let Ok(text) = std::str::from_utf8(head).or_else(|e| {
        // A text cut inside a multi-byte character at the end of the probe is still text.
        let valid = head.get(..e.valid_up_to()).unwrap_or_default();
        if e.error_len().is_none() { std::str::from_utf8(valid) } else { Err(e) }
    }) else {
        let shown: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return format!("binary data of no format ckpt knows (first bytes {})", shown.join(" "));
    };
    if text.chars().any(|c| c.is_control() && !c.is_whitespace()) {
        let shown: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return format!("binary data of no format ckpt knows (first bytes {})", shown.join(" "));
    }
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return "a JSON file".into();
    }
    if trimmed.starts_with("version https://git-lfs") {
        return "a git-LFS pointer (run `git lfs pull` to fetch the real file)".into();
    }
    let lower = trimmed.get(..15).unwrap_or(trimmed).to_ascii_lowercase();
    if lower.starts_with("<!doctype html") || lower.starts_with("<html") {
        return "an HTML page (a download that returned a web page?)".into();
    }
    let first = trimmed.lines().next().unwrap_or_default();
    let mut shown: String = first.chars().take(24).collect();
    if shown.len() < first.len() {
        // Cut at a word's end where there is one.
        if let Some(space) = shown.rfind(' ') {
            shown.truncate(space);
        }
        shown.push_str(" ...");
    }
    format!("a text file (starts with {shown:?})")
}

/// The format whose recogniser accepts `probe`, trying them in [`Format::ALL`]'s order.
pub(crate) fn recognise(probe: &Probe<'_>) -> Option<Format> {
    KNOWN.iter().find(|k| (k.detect)(probe)).map(|k| k.format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_is_in_declaration_order() {
        for (i, k) in KNOWN.iter().enumerate() {
            assert_eq!(k.format as usize, i, "{}", k.name);
            assert_eq!(Format::ALL[i], k.format);
            assert_eq!(Format::from_name(k.name), Some(k.format));
        }
        let mut names: Vec<&str> = KNOWN.iter().map(|k| k.name).collect();
        names.dedup();
        assert_eq!(names.len(), KNOWN.len());
    }

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
    }

    #[test]
    fn probes() {
        assert!(Probe::File(b"PK\x03\x04rest").magic(0, b"PK\x03\x04"));
        assert!(!Probe::File(b"PK").magic(0, b"PK\x03\x04"));
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}");
        assert!(Probe::File(&st).safetensors_header());
        assert!(!Probe::Dir(Path::new("."), &[]).safetensors_header());
        assert!(Probe::Dir(Path::new("."), &["PART_001.pt".to_owned()]).marker("PART_*.pt"));
        assert!(!Probe::File(b"PART_001.pt").marker("PART_*.pt"));
        for head in [&b"\x80\x04\x95"[..], b"\x80\x02}q\x00", b"(dp0\nS'a'", b"}q\x00(", b"c__main__\nNet\nq\x00"] {
            assert!(Probe::File(head).plain_pickle(), "{head:?}");
        }
        for head in [&b"\x80\x06"[..], b"(dict", b"cat a\n", b"{}", b"PK\x03\x04"] {
            assert!(!Probe::File(head).plain_pickle(), "{head:?}");
        }
        assert_eq!(recognise(&Probe::File(&LEGACY_TORCH_MAGIC)), Some(Format::Torch));
    }

    #[test]
    fn every_marker_listed_is_its_formats() {
        for (format, names) in DIR_MARKERS {
            for name in *names {
                // Megatron's `metadata.json` needs its content (`sharded_backend`); a DeepSpeed root needs a tag
                // directory beside `latest`.
                let alone = [name.replace('*', "0")];
                let found = recognise(&Probe::Dir(Path::new("."), &alone));
                let expected = match (*format, *name) {
                    (Format::Megatron, _) => None,
                    (Format::DeepSpeed, "latest") => None,
                    (f, _) => Some(f),
                };
                assert_eq!(found, expected, "{name}");
            }
        }
        assert!(markers_looked_for().contains("PART_*.pt (hfai)"));
    }

    #[test]
    fn what_files_look_like() {
        assert_eq!(looks_like(b""), "an empty file");
        assert_eq!(looks_like(b"# ckpt\n\nRead, write"), "a text file (starts with \"# ckpt\")");
        assert_eq!(
            looks_like(b"a long first line of text that goes on"),
            "a text file (starts with \"a long first line of ...\")"
        );
        assert_eq!(looks_like(b" {\"a\": 1}"), "a JSON file");
        assert_eq!(looks_like(b"\x89HDF\r\n\x1a\nrest"), "an HDF5 file");
        assert_eq!(looks_like(b"\x1f\x8b\x08"), "a gzip file");
        assert!(looks_like(b"\x00\x01\x02").starts_with("binary data"));
        assert!(looks_like(b"<!DOCTYPE html>").starts_with("an HTML page"));
        // Cut inside a multi-byte character: still text.
        assert!(looks_like("héllo wörld".as_bytes().get(..8).unwrap_or_default()).starts_with("a text file"));
    }
}
