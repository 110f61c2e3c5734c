//! Checkpoints on object storage by URL (`s3://`, `gs://`, `az://`, `http(s)://`; feature `remote`).
//!
//! The writers take URLs where they take paths; the readers read local paths, and this module puts URLs in
//! front of them:
//! - a URL source is fetched into a private temporary directory ([`fetch`]): every object under the
//!   prefix (or the one object the URL names), with parallel ranged reads of the part size, so memory
//!   stays within `concurrency × part_size`; the local readers then read it as they read any path. For a
//!   listing ([`Fetch::Index`], what `ckpt inspect` uses) a DCP checkpoint's `.metadata`, the headers
//!   of safetensors files and Hugging Face shards, and a `.pt`'s central directory and small records
//!   (`data.pkl`, `version`, …) are fetched alone. For reading some tensors of a DCP checkpoint
//!   ([`Fetch::Lazy`], what `ckpt cat` and `ckpt diff` use), of a safetensors file or Hugging Face
//!   shards (headers fetched first), of a `.pt` file and an hfai directory (ZIP indexes fetched first),
//!   and of a RecIS directory (headers and ZIP indexes fetched first), the data files
//!   are fetched as they are read:
//!   sparse local files that a [`SparseMirror`] fills with the byte ranges each read needs (ranged,
//!   coalesced, parallel requests, memory within `concurrency × part_size`), through the hook the source
//!   hands to the reader ([`Source::fill`], `SourceOptions::with_fill`).
//! - a URL target ([`target`]) is the URL itself, given to the format's writer as its path: ckpt-io's
//!   `DirCommit` and `FileCommit` stream each file to its object as it is written (multipart uploads,
//!   bounded buffers, checksums computed on the way) and commit by `ckpt_io::storage::remote_commit`:
//!   each format's commit point last with conditional writes, the destination's lock object refusing a
//!   concurrent writer, the previous checkpoint kept loadable where the new files do not replace its
//!   objects, its and a killed save's objects removed after. Under mpirun every process streams its own
//!   files. [`staged_target`] is for the one writer that opens its files itself (PBG's TSV export).
//!
//! [`Transfer`] reports the requests and bytes each moved.
//!
//! ```no_run
//! use ckpt::storage::{Location, StorageOptions};
//! let options = StorageOptions::default(); // AWS_* variables configure S3
//! let source = ckpt::storage::fetch(&Location::parse("s3://bucket/runs/step-100")?, &options)?;
//! let checkpoint = ckpt::open(source.path())?;
//! println!("{} entries", checkpoint.entries().len());
//! # Ok::<(), ckpt::Error>(())
//! ```

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use ckpt_io::storage::remote_commit::{LOCK_NAME, RemoteCommit, file_lock_name, is_lock, leftovers};
pub use ckpt_io::storage::{
    Location, ObjectInfo, ObjectLayout, PutCondition, RangeFill, RemoteUrl, SparseMirror, StatsSnapshot, StorageError,
    StorageOptions, Store, registry,
};

use crate::error::{Error, Result};
use crate::format::Format;
use crate::report::{Problem, ProblemKind};

/// What one transfer moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Objects read or written.
    pub objects: usize,
    /// Bytes of object data moved.
    pub bytes: u64,
    /// Requests sent.
    pub requests: u64,
}

impl std::fmt::Display for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} object{}, {} bytes, {} requests",
            self.objects,
            if self.objects == 1 { "" } else { "s" },
            self.bytes,
            self.requests
        )
    }
}

/// A checkpoint to read: a local path as it is, or a URL's objects fetched into a temporary directory that
/// lives as long as this value.
#[derive(Debug)]
pub struct Source {
    path: PathBuf,
    /// For a URL: the objects of the copy, and the store they came from (whose counts grow as a lazy
    /// copy is filled).
    fetched: Option<(usize, Store)>,
    fill: Option<Arc<dyn RangeFill>>,
    _dir: Option<tempfile::TempDir>,
}

impl Source {
    /// The local path to read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What fetching moved so far; `None` for a local path. For a lazy copy ([`Fetch::Lazy`]) the counts
    /// include every fill made by the reads until now: ask after reading.
    pub fn transfer(&self) -> Option<Transfer> {
        self.fetched.as_ref().map(|(objects, store)| {
            let stats = store.stats();
            Transfer { objects: *objects, bytes: stats.bytes_read, requests: stats.requests }
        })
    }

    /// The hook that fills a lazy copy's bytes before they are read (`SourceOptions::with_fill`); `None`
    /// for a local path or a copy fetched whole.
    pub fn fill(&self) -> Option<Arc<dyn RangeFill>> {
        self.fill.clone()
    }
}

/// How much of a URL source [`fetch_with`] fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fetch {
    /// Every byte of every object: for reading tensors, verifying, converting.
    #[default]
    Whole,
    /// What listing the entries needs (`inspect`): a DCP checkpoint's `.metadata` (its data files are
    /// left unfetched, as sparse files of their size: the DCP reader opens them only to read a tensor),
    /// the headers of `.safetensors` files and Hugging Face shards (their data left unfetched likewise),
    /// a `torch.save` file's end records, central directory and records but the tensors' (open it with
    /// `SourceOptions::listing_only`, which trusts torch's layout for the rest); anything else whole. The local copy then holds zeros where nothing was fetched: read nothing but
    /// the listing from it.
    Index,
    /// What reading some tensors needs, fetched as they are read: a DCP checkpoint's `.metadata` and other
    /// small files whole, its data files (`*.distcp`) as sparse files of their size that the reader fills
    /// with the byte ranges each read needs ([`Source::fill`]: open the copy with `ckpt::open_source` and
    /// `SourceOptions::with_fill(source.path(), source.fill())`; a region of a tensor fetches its items'
    /// ZIP metadata and the region's bytes). A `.safetensors` file and a Hugging Face shard directory
    /// likewise: each file's header fetched, each tensor's bytes as it is read; and a `torch.save` file
    /// (one object): its end records, central directory and small records fetched as [`Fetch::Index`]
    /// fetches them, each tensor's storage record (local header, checked, and data) as it is read; an
    /// hfai directory's `PART_*.pt` files likewise; a RecIS checkpoint directory (its `index`) or output
    /// root (its `checkpoint` list and `<ckpt_id>/` directories): its small files whole (`index`,
    /// `tensorkey.json`, the lists and counts, the manifest), each data file's header and each `.pt`
    /// file's ZIP index, each block and tensor record as it is read. Only where the copy is detected as
    /// such (a directory of safetensors files another format reads, a ZIP file that is not torch's, are
    /// fetched whole). Anything else (other formats, other directories of `.pt` files) is fetched whole,
    /// as [`Fetch::Whole`].
    Lazy,
}

/// A new private temporary directory named `<prefix>…`, removed when dropped.
fn temp_dir(prefix: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix(prefix).tempdir().map_err(|e| Error::Io { path: std::env::temp_dir(), source: e })
}

/// `location` ready to read: a local path as it is; a URL's objects fetched (the one object it names, or
/// every object under it as a directory) into a temporary directory.
///
/// # Errors
/// [`Error::Storage`]: no object at the URL ([`StorageError::NotFound`]), a missing bucket, refused
/// credentials, a server that fails after retries, …; [`Error::Io`] for the temporary directory.
pub fn fetch(location: &Location, options: &StorageOptions) -> Result<Source> {
    fetch_with(location, options, Fetch::Whole)
}

/// The longest `.safetensors` header [`Fetch::Index`] fetches (the readers' default limit).
const MAX_INDEX_HEADER: u64 = 100_000_000;

/// [`fetch`], fetching what `what` says.
///
/// # Errors
/// As [`fetch`]; [`StorageError::Truncated`] for a `.safetensors` object shorter than its header says.
pub fn fetch_with(location: &Location, options: &StorageOptions, what: Fetch) -> Result<Source> {
    let url = match location {
        Location::Local(path) => return Ok(Source { path: path.clone(), fetched: None, fill: None, _dir: None }),
        Location::Remote(url) => url,
    };
    let store = Store::open(url, options)?;
    let dir = temp_dir("ckpt-fetch-")?;
    let name = url.file_name().unwrap_or("checkpoint").to_owned();
    let local = dir.path().join(&name);
    let listed: Vec<ObjectInfo> =
        store.list()?.into_iter().filter(|o| !o.name.is_empty() && !is_lock(&o.name)).collect();
    if listed.is_empty() {
        // Not a prefix: the URL names one object.
        let Some(object) = store.head("")? else { return Err(StorageError::NotFound { url: url.redacted() }.into()) };
        let part = match what {
            Fetch::Index | Fetch::Lazy if name.ends_with(".safetensors") => Some(Part::Header),
            Fetch::Index | Fetch::Lazy => Some(Part::Zip),
            Fetch::Whole => None,
        };
        let present = fetch_object(&store, "", object.size, &local, part)?;
        let mut fill: Option<Arc<dyn RangeFill>> = None;
        let fetched_whole = present.first() == Some(&(0..object.size));
        if what == Fetch::Lazy && part.is_some() && !fetched_whole {
            // Lazy only where the reader the copy is opened with fills what it reads.
            if lazy_reader(&local) {
                let mut mirror = SparseMirror::new(store.clone());
                mirror.add_partial("", object.size, &local, present);
                fill = Some(Arc::new(OneObject(mirror)));
            } else {
                store.download("", object.size, &local)?;
            }
        }
        return Ok(Source { path: local, fetched: Some((1, store)), fill, _dir: Some(dir) });
    }
    let mut objects = 0;
    let has = |n: &str| listed.iter().any(|o| o.name == n);
    // Only a DCP checkpoint's and Hugging Face shards' readers open their data files lazily.
    let dcp = has(".metadata");
    // A directory of `.pt` files (hfai's parts): each one's ZIP index first.
    let parts = !dcp && has(PART0);
    // A RecIS checkpoint directory or output root: its data files' headers, its `.pt` files' ZIP indexes.
    let recis = !dcp && !parts && (has(RECIS_INDEX) || has(RECIS_LIST));
    let shards = !dcp && !recis && listed.iter().all(|o| !o.name.ends_with(".pt"));
    let mut lazy = (what == Fetch::Lazy && (dcp || shards || parts || recis)).then(|| SparseMirror::new(store.clone()));
    // Where the copy holds only part of an object, the object's name, size and local path.
    let mut partial: Vec<(&str, u64, PathBuf)> = Vec::new();
    for object in &listed {
        let dst = object.name.split('/').fold(local.clone(), |p, part| p.join(part));
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::Io { path: parent.to_path_buf(), source: e })?;
        }
        let part = match what {
            Fetch::Index | Fetch::Lazy if dcp && object.name.ends_with(".distcp") => Some(Part::Nothing),
            Fetch::Index | Fetch::Lazy if shards && object.name.ends_with(".safetensors") => Some(Part::Header),
            Fetch::Lazy if parts && object.name.ends_with(".pt") => Some(Part::Zip),
            Fetch::Lazy if recis && object.name.ends_with(".safetensors") => Some(Part::Header),
            Fetch::Lazy if recis && object.name.ends_with(".pt") => Some(Part::Zip),
            _ => None,
        };
        let present = fetch_object(&store, &object.name, object.size, &dst, part)?;
        if part.is_some() && present.first() != Some(&(0..object.size)) {
            partial.push((&object.name, object.size, dst.clone()));
        }
        if let Some(mirror) = &mut lazy {
            mirror.add_partial(&object.name, object.size, &dst, present);
        }
        objects += 1;
    }
    // Shards, parts and a RecIS directory are read lazily by the readers that fill what they read (the
    // Hugging Face reader's, hfai's, RecIS's; another format's reader of safetensors files, DCP's Hugging
    // Face layout, would read the zeros): anything else gets them whole.
    if what == Fetch::Lazy && !dcp && !lazy_reader(&local) {
        for (name, size, dst) in &partial {
            store.download(name, *size, dst)?;
        }
        lazy = None;
    }
    let fill = lazy.map(|m| Arc::new(m) as Arc<dyn RangeFill>);
    Ok(Source { path: local, fetched: Some((objects, store)), fill, _dir: Some(dir) })
}

/// The first part of an hfai checkpoint, the marker of a directory whose `.pt` files [`Fetch::Lazy`] fetches
/// as they are read.
const PART0: &str = "PART_000.pt";

/// A RecIS checkpoint directory's block index (`ckpt_recis::INDEX_FILE`): with [`RECIS_LIST`], the marker
/// of a directory whose data and `.pt` files [`Fetch::Lazy`] fetches as they are read.
const RECIS_INDEX: &str = "index";

/// A RecIS output root's checkpoint list (`ckpt_recis::CHECKPOINT_LIST`).
const RECIS_LIST: &str = "checkpoint";

/// Whether the partial local copy at `path` is of a format whose reader fills what it reads
/// ([`Adaptor::reads_partial_copy`](crate::adaptor::Adaptor::reads_partial_copy)).
fn lazy_reader(path: &Path) -> bool {
    crate::formats::detect(path).ok().and_then(crate::formats::enabled).is_some_and(|a| a.reads_partial_copy())
}

/// The fill hook of a copy of one object (a URL naming a file, not a prefix): every file name a reader
/// gives is that object.
#[derive(Debug)]
struct OneObject(SparseMirror);

impl RangeFill for OneObject {
    fn fill(&self, _file: &str, range: std::ops::Range<u64>) -> std::io::Result<()> {
        self.0.fill("", range)
    }
}

/// What of an object [`fetch_object`] fetches when not all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Nothing: a sparse file of its size.
    Nothing,
    /// A safetensors file's length prefix and JSON header.
    Header,
    /// A `torch.save` ZIP archive's end records, central directory, and every record but the tensors'
    /// (`data/<key>`) with its local header; anything else (a legacy file) whole.
    Zip,
}

/// Fetches the object `name` of `size` bytes into `dst`: whole, or `part` of it into a sparse file of
/// its size. Returns the byte ranges fetched.
fn fetch_object(store: &Store, name: &str, size: u64, dst: &Path, part: Option<Part>) -> Result<Vec<Range<u64>>> {
    use std::os::unix::fs::FileExt;
    let Some(part) = part else {
        store.download(name, size, dst)?;
        return Ok(std::iter::once(0..size).collect());
    };
    let io = |source| Error::Io { path: dst.to_path_buf(), source };
    let file = std::fs::File::create(dst).map_err(io)?;
    file.set_len(size).map_err(io)?;
    if part == Part::Zip {
        return fetch_zip_index(store, name, size, dst, &file);
    }
    let mut present = Vec::new();
    if part == Part::Header && size >= 8 {
        // The length prefix and, in the same request, the first 64 KiB (most headers are shorter).
        let first = store.read(name, 0..size.min(64 << 10))?;
        let len = first.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, u64::from_le_bytes);
        let end = len.min(MAX_INDEX_HEADER).saturating_add(8).min(size);
        file.write_all_at(&first, 0).map_err(io)?;
        if end > first.len() as u64 {
            let rest = store.read(name, first.len() as u64..end)?;
            file.write_all_at(&rest, first.len() as u64).map_err(io)?;
            present.push(first.len() as u64..first.len() as u64 + rest.len() as u64);
        }
        present.push(0..first.len() as u64);
    }
    Ok(present)
}

/// The end records and central directory of a ZIP archive fetch ([`Part::Zip`]): the last 64 KiB and 98
/// bytes (the longest comment, the end record and zip64's two).
const ZIP_TAIL: u64 = (64 << 10) + 98;

/// Fetches what listing a `torch.save` ZIP archive needs into the sparse file `file` at `dst`: the end
/// records, the central directory, and `data.pkl` with the other small records (each with its local
/// header); the tensor records stay unfetched, which the torch reader trusts its layout rule for
/// (`SourceOptions::listing_only`). An object that is not such an archive is fetched whole.
#[cfg(feature = "torch")]
fn fetch_zip_index(store: &Store, name: &str, size: u64, dst: &Path, file: &std::fs::File) -> Result<Vec<Range<u64>>> {
    use crate::formats::torch::{zip_central_directory, zip_records_but_tensors};
    use std::os::unix::fs::FileExt;
    let io = |source| Error::Io { path: dst.to_path_buf(), source };
    let map = |dst: &Path| {
        ckpt_tensor::Buffer::map_file(dst)
            .map_err(|e| Error::Io { path: dst.to_path_buf(), source: std::io::Error::other(e.to_string()) })
    };
    let tail_start = size.saturating_sub(ZIP_TAIL);
    let tail = store.read(name, tail_start..size)?;
    file.write_all_at(&tail, tail_start).map_err(io)?;
    let mut present: Vec<Range<u64>> = std::iter::once(tail_start..tail_start + tail.len() as u64).collect();
    let whole = || -> Result<Vec<Range<u64>>> {
        store.download(name, size, dst)?;
        Ok(std::iter::once(0..size).collect())
    };
    let Some(cd) = zip_central_directory(map(dst)?.as_bytes()) else { return whole() };
    if cd.start < tail_start && cd.end <= size {
        let rest = store.read(name, cd.start..tail_start)?;
        file.write_all_at(&rest, cd.start).map_err(io)?;
        present.push(cd.start..cd.start + rest.len() as u64);
    }
    let Some(wanted) = zip_records_but_tensors(map(dst)?.as_bytes(), size) else { return whole() };
    for (range, bytes) in wanted.iter().zip(store.read_ranges(name, &wanted)?) {
        file.write_all_at(&bytes, range.start).map_err(io)?;
        present.push(range.start..range.start + bytes.len() as u64);
    }
    Ok(present)
}

/// Without the torch reader, a `.pt` is fetched whole.
#[cfg(not(feature = "torch"))]
fn fetch_zip_index(store: &Store, name: &str, size: u64, dst: &Path, _: &std::fs::File) -> Result<Vec<Range<u64>>> {
    store.download(name, size, dst)?;
    Ok(std::iter::once(0..size).collect())
}

/// Where a checkpoint is written: a local path, or a URL, which the format's writer streams to (its
/// commits take URLs where they take paths: `ckpt_io`'s `DirCommit` and `FileCommit`).
#[derive(Debug)]
pub struct Target {
    location: Location,
    path: PathBuf,
    /// The process's store totals when the target was made, for [`Target::publish`]'s report.
    before: StatsSnapshot,
    /// A URL target written by a writer that takes local paths only ([`staged_target`]): its local
    /// directory, uploaded by [`Target::publish`].
    staged: Option<tempfile::TempDir>,
}

/// `location` ready to write: a local path as it is; a URL as the path every format's writer takes
/// (the stores it opens take `options`, set as the process's default).
///
/// # Errors
/// None today; kept for targets that need preparing.
pub fn target(location: &Location, options: &StorageOptions) -> Result<Target> {
    let path = match location {
        Location::Local(path) => path.clone(),
        Location::Remote(url) => {
            StorageOptions::set_process_default(options.clone());
            PathBuf::from(url.as_given())
        }
    };
    Ok(Target { location: location.clone(), path, before: ckpt_io::storage::totals(), staged: None })
}

/// [`target`] for a writer that takes local paths only (PyTorch-BigGraph's TSV export opens its files
/// itself): a URL gets a path in a private temporary directory, whose file [`Target::publish`] streams to
/// the object, committed as every single file is (one put or a completed multipart upload).
///
/// # Errors
/// [`Error::Io`] for the temporary directory.
pub fn staged_target(location: &Location, options: &StorageOptions) -> Result<Target> {
    let Location::Remote(url) = location else { return target(location, options) };
    StorageOptions::set_process_default(options.clone());
    let dir = temp_dir("ckpt-publish-")?;
    let path = dir.path().join(url.file_name().unwrap_or("checkpoint"));
    Ok(Target { location: location.clone(), path, before: ckpt_io::storage::totals(), staged: Some(dir) })
}

/// A commit error as the facade's: an object store's stays [`Error::Storage`].
fn commit_error(path: &Path, e: ckpt_io::CommitError) -> Error {
    match e {
        ckpt_io::CommitError::Storage { source } => Error::Storage(source),
        e => Error::Io { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) },
    }
}

/// A URL destination checked for a write ([`check_destination`]): with `overwrite`, the objects that stood
/// there before, which [`RemoteDestination::remove_stale`] removes once the new checkpoint is committed.
#[derive(Debug)]
pub struct RemoteDestination {
    store: Store,
    before: Vec<ObjectInfo>,
}

/// Checks what stands under the URL `location` before a write of format `to`, as
/// a local destination is checked: nothing, or a checkpoint of `to` (by its object names), is written
/// over; anything else is refused with [`Error::DestinationTaken`], unless `overwrite`, which returns what
/// to remove after the commit. A local `location`, or a one-file target (replaced by one `PUT`), returns
/// `None`: the writers check local paths themselves.
///
/// # Errors
/// [`Error::DestinationTaken`]; [`Error::Storage`] for the listing.
pub fn check_destination(
    location: &Location,
    to: Format,
    overwrite: bool,
    options: &StorageOptions,
) -> Result<Option<RemoteDestination>> {
    let Location::Remote(url) = location else { return Ok(None) };
    if crate::destination::is_one_file(to) {
        return Ok(None);
    }
    let store = Store::open(url, options)?;
    let objects: Vec<ObjectInfo> = store.list()?.into_iter().filter(|o| !is_lock(&o.name)).collect();
    if objects.is_empty() {
        return Ok(None);
    }
    let mut names: Vec<String> =
        objects.iter().map(|o| o.name.split('/').next().unwrap_or_default().to_owned()).collect();
    names.dedup();
    let found = crate::format::recognise(&crate::format::Probe::Dir(Path::new(url.as_given()), &names));
    // A checkpoint of `to`, or what a save of `to` that did not commit left (its objects only, which the
    // next save removes).
    let owned = layout(to).owned;
    // A Hugging Face model directory without its weights yet (config.json, the tokenizer): shards go in
    // beside them, as on a local path.
    let model_files = crate::destination::joins_directory(to, &names);
    if (found == Some(to) || model_files || objects.iter().all(|o| owned(&o.name))) && !overwrite {
        return Ok(None);
    }
    if overwrite {
        return Ok(Some(RemoteDestination { store, before: objects }));
    }
    let what = match found {
        Some(f) => crate::destination::a_checkpoint(f),
        None => {
            let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
            let more = if names.len() > 3 { ", ..." } else { "" };
            format!("{} objects that are not a checkpoint ({}{more})", objects.len(), shown.join(", "))
        }
    };
    Err(Error::DestinationTaken { path: PathBuf::from(url.redacted()), what, to })
}

impl RemoteDestination {
    /// After the new checkpoint is committed: removes every object that stood there before and was not
    /// rewritten by the write (same name and entity tag as before), so nothing of the old content stays.
    ///
    /// # Errors
    /// [`Error::Storage`] for the listing or a removal.
    pub fn remove_stale(&self) -> Result<()> {
        let now = self.store.list()?;
        for old in &self.before {
            let unchanged = now.iter().any(|o| o.name == old.name && o.etag.is_some() && o.etag == old.etag);
            if unchanged {
                self.store.delete(&old.name)?;
            }
        }
        Ok(())
    }
}

/// How a directory of `format` lies on an object store: the layout its adaptor gives (the format crate's
/// `OBJECT_LAYOUT`), or (for a format without one, or one this build lacks) every object owned and no
/// commit point.
pub fn layout(format: Format) -> ObjectLayout {
    crate::formats::enabled(format).and_then(|a| a.object_layout()).unwrap_or(ObjectLayout {
        format: format.name(),
        owned: |_| true,
        commit_points: &[],
    })
}

impl Target {
    /// The path the writer writes: a local path, or the URL itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the checkpoint goes.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// What writing a URL target moved since [`target`] made it (`None` for a local path): the writer
    /// streamed every file and committed it by the protocol of `ckpt_io::storage::remote_commit` with
    /// `format`'s commit points; this only reports.
    ///
    /// # Errors
    /// None today.
    pub fn publish(self) -> Result<Option<Transfer>> {
        let Location::Remote(url) = &self.location else { return Ok(None) };
        if self.staged.is_some() {
            let dst = PathBuf::from(url.as_given());
            let local = &self.path;
            ckpt_io::write_file(&dst, &ckpt_io::FileOptions::default(), |w| {
                let mut f = std::fs::File::open(local).map_err(|e| ckpt_io::CommitError::from_io(local, e))?;
                std::io::copy(&mut f, w).map(|_| ()).map_err(|e| ckpt_io::CommitError::from_io(local, e))
            })
            .map_err(|e| commit_error(&dst, e))?;
        }
        let now = ckpt_io::storage::totals();
        let bytes = now.bytes_written.saturating_sub(self.before.bytes_written);
        let requests = now.requests.saturating_sub(self.before.requests);
        let objects = usize::try_from(now.objects_written.saturating_sub(self.before.objects_written)).unwrap_or(0);
        Ok(Some(Transfer { objects, bytes, requests }))
    }
}

/// What an unfinished save left at the URL `url` for a checkpoint of `format` (`None`: the format could
/// not be told, so objects any directory format claims count), as problems for `verify`: its lock
/// object, and, when no commit point exists, the objects it wrote.
///
/// # Errors
/// [`Error::Storage`] for the listing.
pub fn unfinished(url: &RemoteUrl, format: Option<Format>, options: &StorageOptions) -> Result<Vec<Problem>> {
    let store = Store::open(url, options)?;
    let layouts: Vec<ObjectLayout> = match format {
        Some(f) => vec![layout(f)],
        None => Format::ALL.iter().map(|f| layout(*f)).filter(|l| !l.commit_points.is_empty()).collect(),
    };
    let mut left: Vec<ObjectInfo> = Vec::new();
    for l in &layouts {
        for o in leftovers(&store, l.commit_points, &l.owned)? {
            if !left.iter().any(|seen| seen.name == o.name) {
                left.push(o);
            }
        }
    }
    left.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(left
        .into_iter()
        .map(|o| {
            let what = if is_lock(&o.name) {
                "the lock of a save that has not finished (or was killed)"
            } else {
                "left by a save that did not commit"
            };
            let mut p =
                Problem::new(ProblemKind::Unfinished, format!("{what} ({} bytes); the next save removes it", o.size));
            p.file = Some(PathBuf::from(store.url_of(&o.name)));
            p
        })
        .collect())
}
