//! The storages of a ZIP checkpoint: its `data/<key>` records, read zero-copy from the archive's buffer or
//! inflated, and filled from a remote file when only part of it is local.

use std::sync::{Arc, OnceLock};

use ckpt_io::storage::RangeFill;
use ckpt_tensor::{Buffer, DType};

use crate::error::{Error, Result};
use crate::read_options::{DEFAULT_MAX_INFLATED_BYTES, ReadOptions};
use crate::rebuild::StorageSource;
use crate::zip::Archive;

/// Reads the storage records of a ZIP archive.
pub(crate) struct ZipStorages<'a> {
    pub(crate) archive: &'a Archive,
    pub(crate) buffer: &'a Buffer,
    /// Storage key (the name after `data/`) -> record index, built on first use.
    pub(crate) keys: Option<foldhash::HashMap<&'a str, usize>>,
    /// Index of the record `data/0` (`usize::MAX` if none), found on first use.
    pub(crate) first_numbered: Option<usize>,
    /// The window of each storage record read so far, by record index.
    pub(crate) cache: Vec<Option<Buffer>>,
    /// [`ReadOptions::max_inflated_bytes`].
    pub(crate) max_inflated: u64,
    /// The records' directory: `data/` (`data.pkl`), `constants/` (a TorchScript archive's `constants.pkl`).
    pub(crate) dir: &'static str,
    /// [`ReadOptions::fill`] and the file's name for it: storages made on demand, filled first.
    pub(crate) fill: Option<(Arc<dyn RangeFill>, Arc<str>)>,
}

impl<'a> ZipStorages<'a> {
    pub(crate) fn new(archive: &'a Archive, buffer: &'a Buffer) -> Self {
        ZipStorages {
            archive,
            buffer,
            keys: None,
            first_numbered: None,
            cache: Vec::new(),
            max_inflated: DEFAULT_MAX_INFLATED_BYTES,
            dir: "data/",
            fill: None,
        }
    }

    /// These storages filled through `options`' hook ([`ReadOptions::fill`]).
    pub(crate) fn with_fill(mut self, options: &ReadOptions) -> Self {
        self.fill =
            options.fill.as_ref().map(|f| (Arc::clone(f), Arc::from(options.fill_file.as_deref().unwrap_or_default())));
        self
    }

    /// The storages of `archive` (in `buffer`) under `dir` (`data/`; `.data/` in a torch.package archive),
    /// read under `options` (their fill hook, their inflated-size bound).
    pub(crate) fn in_dir(archive: &'a Archive, buffer: &'a Buffer, dir: &'static str, options: &ReadOptions) -> Self {
        ZipStorages { dir, max_inflated: options.max_inflated_bytes, ..ZipStorages::new(archive, buffer) }
            .with_fill(options)
    }

    /// The bytes of the record `name` (without the archive prefix).
    pub(crate) fn record(&self, name: &str) -> Result<Buffer> {
        let rec = self.archive.get(name).ok_or_else(|| Error::MissingRecord { name: name.to_owned() })?;
        self.record_data(rec)
    }

    fn record_data(&self, rec: &crate::zip::Record) -> Result<Buffer> {
        let name = rec.short_name();
        let bytes = self.archive.record_bytes(self.buffer.as_bytes(), rec, self.max_inflated).map_err(|e| match e {
            crate::zip::ZipError::Compressed { method, .. } => Error::Compressed { name: name.to_owned(), method },
            e => Error::Zip(e),
        })?;
        match bytes {
            // A stored record is a subslice of the buffer: a window of the same memory.
            std::borrow::Cow::Borrowed(b) => {
                let start = b.as_ptr() as usize - self.buffer.as_bytes().as_ptr() as usize;
                Ok(self.buffer.slice_len(start, b.len())?)
            }
            std::borrow::Cow::Owned(v) => Ok(Buffer::copy_from(&v)?),
        }
    }
}

/// Fills the bytes `range` of the file `file` through `fill`, for the record `rec`.
fn fill_range(rec: &crate::zip::Record, fill: &dyn RangeFill, file: &str, range: std::ops::Range<u64>) -> Result<()> {
    fill.fill(file, range.clone()).map_err(|source| Error::Fetch {
        name: rec.short_name().to_owned(),
        file: file.to_owned(),
        start: range.start,
        end: range.end,
        source,
    })
}

/// Fills the whole of the record `rec` (local header and data) of the partial copy in `buffer`, and checks
/// that its local header puts the data where the central directory's prediction did.
pub(crate) fn fill_record(buffer: &Buffer, rec: &crate::zip::Record, fill: &dyn RangeFill, file: &str) -> Result<()> {
    fill_range(rec, fill, file, rec.local_header_offset()..rec.data_range().end)?;
    Archive::check_predicted_record(buffer.as_bytes(), rec)?;
    Ok(())
}

/// The stored record `rec` of the partial copy in `buffer`, made on demand: the first read fills its local
/// header and checks it ([`Archive::check_predicted_record`]); each read fills the bytes it reads, then
/// copies them out of `buffer`.
fn filled_record(
    buffer: &Buffer,
    rec: &crate::zip::Record,
    fill: &Arc<dyn RangeFill>,
    file: &Arc<str>,
) -> Result<Buffer> {
    let data = rec.data_range();
    let (start, len) = match (usize::try_from(data.start), usize::try_from(data.end - data.start)) {
        (Ok(s), Ok(l)) => (s, l),
        _ => {
            return Err(Error::Zip(crate::zip::ZipError::Truncated {
                what: "record data",
                offset: data.start,
                needed: data.end - data.start,
                available: (buffer.len() as u64).saturating_sub(data.start),
            }));
        }
    };
    // Checked here, so that every range asked for later lies inside the buffer.
    let window = buffer.slice_len(start, len).map_err(Error::Core)?;
    let whole = buffer.clone();
    let rec = rec.clone();
    let fill = Arc::clone(fill);
    let file = Arc::clone(file);
    // Set once the local header is filled and checked (a failure is retried, and reported, by every read).
    let checked: OnceLock<()> = OnceLock::new();
    Ok(Buffer::deferred_ranged(len, move |at, out: &mut [u8]| {
        let src = window.slice_len(at, out.len())?;
        let from = data.start.saturating_add(at as u64);
        let to = from.saturating_add(out.len() as u64);
        if checked.get().is_none() {
            // A read from the record's start fetches its header with the bytes, in one request.
            let header_to = if at == 0 { to } else { rec.data_offset() };
            fill_range(&rec, fill.as_ref(), &file, rec.local_header_offset()..header_to)?;
            Archive::check_predicted_record(whole.as_bytes(), &rec).map_err(Error::Zip)?;
            let _ = checked.set(());
        }
        fill_range(&rec, fill.as_ref(), &file, from..to)?;
        out.copy_from_slice(src.as_bytes());
        Ok(())
    }))
}

impl StorageSource for ZipStorages<'_> {
    fn storage(&mut self, dtype: DType, key: &str, numel: i64) -> Result<Buffer> {
        let expected = u64::try_from(numel)
            .ok()
            .and_then(|n| n.checked_mul(dtype.size() as u64))
            .ok_or_else(|| Error::BadPersistentId(format!("storage {key}: bad element count {numel}")))?;
        let data = self.data(key)?;
        if data.len() as u64 != expected {
            return Err(Error::StorageSize { key: key.to_owned(), expected, actual: data.len() as u64 });
        }
        Ok(data)
    }
}

impl ZipStorages<'_> {
    /// The bytes of storage `key` (record `data/{key}`), each record's window made once.
    fn data(&mut self, key: &str) -> Result<Buffer> {
        let dir = self.dir;
        let missing = || Error::MissingRecord { name: format!("{dir}{key}") };
        let i = match self.numbered(key) {
            Some(i) => i,
            None => self.keyed(key).ok_or_else(missing)?,
        };
        let archive = self.archive;
        if self.cache.len() <= i {
            self.cache.resize(archive.records().len().max(i + 1), None);
        }
        if let Some(Some(b)) = self.cache.get(i) {
            return Ok(b.clone());
        }
        let rec = archive.records().get(i).ok_or_else(missing)?;
        let b = match &self.fill {
            // A stored record of a partial copy: made on demand. A compressed one is filled now and inflated.
            Some((fill, file)) if rec.method() == 0 => filled_record(self.buffer, rec, fill, file)?,
            Some((fill, file)) => {
                fill_record(self.buffer, rec, fill.as_ref(), file)?;
                self.record_data(rec)?
            }
            None => self.record_data(rec)?,
        };
        if let Some(slot) = self.cache.get_mut(i) {
            *slot = Some(b.clone());
        }
        Ok(b)
    }

    /// Where torch puts storage `key` = `n`: `data/0`, `data/1`, ... written one after the other, so
    /// `data/n` is the record `n` places after `data/0`'s (checked by name; `None` otherwise).
    fn numbered(&mut self, key: &str) -> Option<usize> {
        let n: usize = key.parse().ok()?;
        let records = self.archive.records();
        let dir = self.dir;
        let first = *self.first_numbered.get_or_insert_with(|| {
            records.iter().position(|r| r.short_name().strip_prefix(dir) == Some("0")).unwrap_or(usize::MAX)
        });
        let i = first.checked_add(n)?;
        let name = records.get(i)?.short_name();
        (name.strip_prefix(dir) == Some(key)).then_some(i)
    }

    /// Record index of storage `key` (the name after `data/`), through an index of every such record
    /// built on first use.
    fn keyed(&mut self, key: &str) -> Option<usize> {
        let archive = self.archive;
        let dir = self.dir;
        let keys = self.keys.get_or_insert_with(|| {
            let records = archive.records();
            let mut keys = foldhash::HashMap::with_capacity_and_hasher(records.len(), Default::default());
            for (i, r) in records.iter().enumerate() {
                if let Some(k) = r.short_name().strip_prefix(dir) {
                    keys.insert(k, i);
                }
            }
            keys
        });
        keys.get(key).copied()
    }
}
