//! Writing safetensors files: tensors (strided views gathered) and the header `__metadata__`, in memory, to a
//! writer, or durably to a file, with ckpt's per-tensor checksums in the header when asked.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use ckpt_io::{Algorithm, DurableWriter, FileOptions};
use ckpt_tensor::{Error, Result, Tensor};

use crate::dtype::safetensors_dtype;
use crate::error::SafetensorsError;

/// A tensor as the `safetensors` crate's `View`: contiguous data is borrowed, strided views are gathered.
/// The shape is the header's: a packed dtype's last dimension counts values ([`ckpt_tensor::DType::safetensors_shape`]).
struct StView<'a> {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    tensor: &'a Tensor,
}

impl safetensors::View for StView<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        // Borrows contiguous tensors; gathers strided views and bytes made on demand.
        self.tensor.data().unwrap_or(Cow::Borrowed(&[]))
    }
    fn data_len(&self) -> usize {
        self.tensor.nbytes()
    }
}

fn prepared<'a>(tensors: &'a [(String, Tensor)]) -> Result<Vec<(String, StView<'a>)>> {
    tensors
        .iter()
        .map(|(name, t)| {
            let dtype = safetensors_dtype(t.dtype())?;
            let shape = t
                .dtype()
                .safetensors_shape(t.shape())
                .ok_or_else(|| SafetensorsError::PackedScalar { name: name.clone(), dtype: t.dtype() })?;
            Ok((name.clone(), StView { dtype, shape, tensor: t }))
        })
        .collect()
}

/// Makes every tensor contiguous (zero copy for those already contiguous).
///
/// Safetensors cannot express views or shared storage: tensors that share a storage are each written as
/// their own contiguous bytes (as `safetensors.torch.save_model` does after de-duplication; a shared
/// storage is never written as overlapping ranges, which safetensors readers reject).
fn contiguous(tensors: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
    tensors.iter().map(|(n, t)| Ok((n.clone(), t.to_contiguous()?))).collect()
}

/// Serializes tensors and metadata to safetensors bytes. The layout is the `safetensors` crate's (tensors
/// sorted by dtype alignment then name, header padded to 8 bytes).
///
/// # Errors
/// [`SafetensorsError::UnstorableDtype`] for dtypes safetensors lacks (complex128, complex32, quantized, bits),
/// [`SafetensorsError::PackedScalar`] for a 0-dimensional float4 or float6 tensor;
/// [`Error::Format`] holding the `SafeTensorError` for duplicate names.
pub fn to_bytes(tensors: &[(String, Tensor)], metadata: Option<HashMap<String, String>>) -> Result<Vec<u8>> {
    let owned = contiguous(tensors)?;
    safetensors::serialize(prepared(&owned)?, metadata).map_err(codec)
}

/// The header the `safetensors` crate writes for `views` (its `prepare`: tensors sorted by descending dtype
/// alignment, then name; JSON padded with spaces to 8 bytes), and the views in data order.
fn header<'a>(
    mut views: Vec<(String, StView<'a>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(Vec<u8>, Vec<StView<'a>>)> {
    use safetensors::View;
    views.sort_by(|(ln, l), (rn, r)| r.dtype().cmp(&l.dtype()).then(ln.cmp(rn)));
    let mut infos = Vec::with_capacity(views.len());
    let mut ordered = Vec::with_capacity(views.len());
    let mut offset = 0usize;
    for (name, v) in views {
        let n = v.data_len();
        let end = offset.checked_add(n).ok_or(SafetensorsError::DataSizeOverflow)?;
        infos.push((
            name,
            safetensors::tensor::TensorInfo {
                dtype: v.dtype(),
                shape: v.shape().to_vec(),
                data_offsets: (offset, end),
            },
        ));
        offset = end;
        ordered.push(v);
    }
    let meta = safetensors::tensor::Metadata::new(metadata, infos).map_err(codec)?;
    let mut json = serde_json::to_vec(&meta).map_err(|source| SafetensorsError::HeaderJson { source })?;
    json.resize(json.len().next_multiple_of(8), b' ');
    if json.len() > 100_000_000 {
        return Err(codec(safetensors::SafeTensorError::HeaderTooLarge));
    }
    Ok((json, ordered))
}

/// The `__metadata__` key of the per-tensor checksums ckpt writes ([`write_file_checksummed`]): the CRC32C
/// of each tensor's bytes as 8 hex digits, concatenated in the order of the tensors' data in the file.
pub const CHECKSUMS_KEY: &str = "ckpt.crc32c";

/// Hash-then-write step (fits the L2 cache: the writer's copy reads the bytes the hash just read).
const HASH_PIECE: usize = 1 << 20;
/// Bytes of a tensor made on demand that are made and written at a time ([`Tensor::data_pieces`]).
const STREAM_PIECE: usize = 1 << 20;

/// [`write_file`] with the CRC32C of every tensor's bytes in the header's `__metadata__`
/// ([`CHECKSUMS_KEY`]), so that `ckpt verify --deep` detects a changed byte of tensor data ([`checksums`](crate::checksums)).
/// The file stays one atomic file that every safetensors reader loads (the checksums are one more string
/// of the metadata map): the header is written with a fixed-width placeholder, each tensor is hashed in
/// 1 MiB pieces just before the writer copies them, and the placeholder is overwritten in the temporary
/// file before it is synced and renamed ([`DurableWriter::patch`]).
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_safetensors as safetensors;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.safetensors");
/// let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// safetensors::write_file_checksummed(&[("w".to_string(), w)], None, &path).unwrap();
/// let back = safetensors::read_file(&path).unwrap();
/// assert_eq!(safetensors::checksums(&back).unwrap().unwrap(), Vec::<String>::new());
/// ```
///
/// # Errors
/// As [`write_file`].
pub fn write_file_checksummed(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<()> {
    write_file_with(tensors, metadata, path, &ckpt_io::Durability::default())
}

/// [`write_file`] with `durability`: the file's commit syncs and uses `O_DIRECT` as it says, and
/// [`Durability::checksums`](ckpt_io::Durability::checksums) records per-tensor checksums
/// ([`write_file_checksummed`]).
///
/// # Errors
/// As [`write_file`].
pub fn write_file_with(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
    path: &Path,
    durability: &ckpt_io::Durability,
) -> Result<()> {
    let options = FileOptions::default().with_durability(*durability);
    if durability.checksums {
        ckpt_io::write_file(path, &options, |w| write_checksummed_to(tensors, metadata, w, path))?;
    } else {
        ckpt_io::write_file(path, &options, |w| write_to(tensors, metadata, w, path))?;
    }
    Ok(())
}

/// [`write_to`] into a durable writer, with per-tensor checksums ([`write_file_checksummed`]).
///
/// # Errors
/// As [`write_to`].
pub fn write_checksummed_to(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
    w: &mut DurableWriter,
    path: &Path,
) -> Result<()> {
    use std::io::Write;
    let owned = contiguous(tensors)?;
    let n = owned.len();
    let mut metadata = metadata.unwrap_or_default();
    if n > 0 {
        metadata.insert(CHECKSUMS_KEY.to_owned(), "0".repeat(8 * n));
    }
    let (header, ordered) = header(prepared(&owned)?, Some(metadata))?;
    let io = |e: std::io::Error| Error::io(path, e);
    // Where the placeholder's digits are: right after the key (unique: a key or value holding the same text
    // is escaped, `\"`, by JSON).
    let needle = format!("\"{CHECKSUMS_KEY}\":\"");
    let at = if n > 0 {
        let pos = header
            .windows(needle.len())
            .position(|win| win == needle.as_bytes())
            .ok_or(SafetensorsError::ChecksumPlaceholderMissing)?;
        Some(w.position() + 8 + (pos + needle.len()) as u64)
    } else {
        None
    };
    w.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&header).map_err(io)?;
    let mut digits = String::with_capacity(8 * n);
    for v in &ordered {
        let mut crc = 0u32;
        // Bytes made on demand stream out a piece at a time (`Tensor::data_pieces`).
        v.tensor.data_pieces(HASH_PIECE, |data| {
            for piece in data.chunks(HASH_PIECE) {
                crc = Algorithm::Crc32c.append(crc, piece);
                w.write_all(piece).map_err(io)?;
            }
            Ok::<(), Error>(())
        })?;
        digits.push_str(&format!("{crc:08x}"));
    }
    if let Some(at) = at {
        w.patch(at, digits.as_bytes()).map_err(io)?;
    }
    Ok(())
}

/// Writes a safetensors file durably through [`ckpt_io`] (lock, temporary file, `O_DIRECT` writes
/// straight from each tensor, `fdatasync`, rename, directory fsync), byte for byte what the `safetensors`
/// crate's `serialize` produces.
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_safetensors as safetensors;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.safetensors");
/// let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// safetensors::write_file(&[("w".to_string(), w.transpose(0, 1).unwrap())], None, &path).unwrap();
/// let back = safetensors::read_file(&path).unwrap();
/// assert_eq!(back.get("w").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
/// ```
///
/// # Errors
/// As [`to_bytes`], plus [`Error::Io`] naming the path, or [`Error::Format`] holding `ckpt_io::CommitError` for a full disk, a
/// read-only file system, a permission error or a concurrent save.
pub fn write_file(tensors: &[(String, Tensor)], metadata: Option<HashMap<String, String>>, path: &Path) -> Result<()> {
    write_file_with(tensors, metadata, path, &ckpt_io::Durability::default().with_checksums(false))
}

/// Serializes a safetensors file into `w` (a [`ckpt_io`] writer of a directory's staged file, for
/// example), streaming each tensor's bytes from its memory; the bytes are [`write_file`]'s. `path` names
/// the file in I/O errors.
///
/// # Errors
/// As [`to_bytes`], plus [`Error::Io`] naming `path`.
pub fn write_to<W: std::io::Write>(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
    w: &mut W,
    path: &Path,
) -> Result<()> {
    // Each tensor's bytes are borrowed, or gathered (a strided view, bytes made on demand) just before
    // they are written, so that at most one gathered tensor is held at a time.
    let (header, ordered) = header(prepared(tensors)?, metadata)?;
    let io = |e: std::io::Error| Error::io(path, e);
    w.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&header).map_err(io)?;
    for v in &ordered {
        v.tensor.data_pieces(STREAM_PIECE, |data| w.write_all(data).map_err(io))?;
    }
    Ok(())
}

/// A `safetensors` crate error as the tensor model's: its I/O errors are the operating system's fault, the
/// rest the file's; the error itself is kept as the source.
pub(crate) fn codec(e: safetensors::SafeTensorError) -> Error {
    let fault = match e {
        safetensors::SafeTensorError::IoError(_) => ckpt_tensor::Fault::Io,
        _ => ckpt_tensor::Fault::Malformed,
    };
    Error::format(fault, e)
}
