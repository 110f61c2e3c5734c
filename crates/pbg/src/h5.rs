//! The HDF5 objects PBG's files are made of, on top of `hdf5-metno` (the system libhdf5): root attributes,
//! numeric datasets, the OPAQUE `optimizer/state_dict` blob, and creation-order-tracked groups.
//!
//! Reading validates every dataset's header (type, rank, storage) before handing out data. Contiguous,
//! unfiltered little-endian datasets — everything PBG and h5py write — are handed out as windows of the
//! file's memory map, so reading a partition copies nothing; anything else (chunked, compressed, big-endian,
//! user-made files) is read through libhdf5 with conversion.
//!
//! Writing builds the file's structure with libhdf5 (attributes, groups, datasets allocated up front, no
//! fill), closes it, then puts every dataset's bytes at its allocated offset outside libhdf5. libhdf5
//! serialises all calls behind one global lock; the data, which is the bulk of a checkpoint, moves outside
//! it, so files are written in parallel. A durable writer ([`Writer::create_durable`]) lets libhdf5 write
//! the structure alone (a sparse skeleton: the datasets' storage is never filled) into the temporary file
//! of a [`FileCommit`], then streams the whole file through the commit's [`DurableWriter`] in file order —
//! the skeleton's bytes between datasets, each dataset's bytes from memory — so the data reaches the disk
//! through reused aligned `O_DIRECT` buffers instead of fresh page-cache pages, and the replaced file is
//! freed off the critical path. The file is byte for byte the one the in-place writer makes.
//!
//! Every file is opened through `open_file`: without libhdf5's advisory lock and with its descriptor
//! closed on exec, so that a program started meanwhile (by any thread) cannot keep a file locked.

use std::ffi::c_void;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ckpt_io::{DurableWriter, FileCommit, FileOptions};
use ckpt_tensor::{Buffer, DType, Tensor, checked_numel};
use hdf5::dataset::{AllocTime, FillTime, Layout};
use hdf5::datatype::ByteOrder;
use hdf5::plist::dataset_create::DatasetCreateBuilder;
use hdf5::types::{FloatSize, IntSize, TypeDescriptor, VarLenAscii, VarLenUnicode};
use hdf5::{Attribute, Dataset, Datatype, File, Group, Location, LocationType};
use hdf5_sys::h5d::{H5Dget_type, H5Dread};
use hdf5_sys::h5f::H5Fget_vfd_handle;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::H5S_ALL;
use hdf5_sys::h5t::{H5T_class_t, H5Tcreate, H5Tget_class, H5Tget_size, H5Tset_tag};

use crate::error::{Error, Result};
use crate::metadata::AttrValue;

/// The 8-byte signature that starts an HDF5 superblock.
pub const HDF5_SIGNATURE: [u8; 8] = *b"\x89HDF\r\n\x1a\n";

/// Where libhdf5 looks for the superblock: offset 0, then 512, 1024, 2048, ... (after a user block).
fn signature_offset(bytes: &[u8]) -> Option<usize> {
    let mut offset = 0usize;
    loop {
        let end = offset.checked_add(8)?;
        if bytes.get(offset..end)? == HDF5_SIGNATURE {
            return Some(offset);
        }
        offset = if offset == 0 { 512 } else { offset.checked_mul(2)? };
    }
}

/// The end-of-file address recorded in the superblock at `base` (versions 0 to 3): the file's size.
fn superblock_eof(bytes: &[u8], base: usize) -> Option<u64> {
    let at = |i: usize| bytes.get(base.checked_add(i)?).copied();
    let version = at(8)?;
    let (size_of_offsets, first_address) = match version {
        0 => (usize::from(at(13)?), 24),
        1 => (usize::from(at(13)?), 28),
        2 | 3 => (usize::from(at(9)?), 12),
        _ => return None,
    };
    if !matches!(size_of_offsets, 2 | 4 | 8) {
        return None;
    }
    // v0/v1: base, free-space, EOF; v2/v3: base, superblock extension, EOF — the third address.
    let start = base.checked_add(first_address)?.checked_add(2 * size_of_offsets)?;
    let raw = bytes.get(start..start.checked_add(size_of_offsets)?)?;
    let mut eof = 0u64;
    for (i, b) in raw.iter().enumerate() {
        eof |= u64::from(*b) << (8 * i);
    }
    let undefined = if size_of_offsets == 8 { u64::MAX } else { (1u64 << (8 * size_of_offsets)) - 1 };
    (eof != undefined).then_some(eof)
}

/// Whether `bytes` (a whole file) carries an HDF5 signature where libhdf5 looks for one.
pub fn is_hdf5(bytes: &[u8]) -> bool {
    signature_offset(bytes).is_some()
}

/// The checks made on a file's bytes before libhdf5 parses it: an HDF5 signature where libhdf5 looks for
/// one, and a superblock end-of-file address no larger than the file. Returns the superblock's offset.
///
/// ```
/// use std::path::Path;
/// assert!(matches!(ckpt_pbg::h5::check_header(Path::new("x.h5"), b"PK\x03\x04"), Err(ckpt_pbg::Error::NotHdf5 { .. })));
/// ```
///
/// # Errors
/// [`Error::NotHdf5`] without a signature, [`Error::Truncated`] when the file is shorter than recorded;
/// both name `path`.
pub fn check_header(path: &Path, bytes: &[u8]) -> Result<usize> {
    let Some(base) = signature_offset(bytes) else {
        let head = bytes.iter().take(8).copied().collect();
        return Err(Error::NotHdf5 { path: path.to_path_buf(), head });
    };
    if let Some(expected) = superblock_eof(bytes, base) {
        // libhdf5 stores the end-of-file address counting the user block (checked with h5py files).
        let found = bytes.len() as u64;
        if found < expected {
            return Err(Error::Truncated { path: path.to_path_buf(), expected, found });
        }
    }
    Ok(base)
}

/// Opens (`create` false: read-only) or creates (truncating) an HDF5 file the way this crate needs it.
///
/// libhdf5 opens files without `O_CLOEXEC` and, from 1.10, takes a `flock` on them. A process started
/// while a file is open (any thread's `Command::spawn` forks) inherits the descriptor, and with it the
/// lock, until that process exits: the file stays locked after it is closed here, and the next open
/// fails with "unable to lock file, errno = 11". So:
///
/// * the lock is not taken (`H5Pset_file_locking(false)`, libhdf5 1.10.7 and later). It guards against
///   concurrent writers, which the crate's commit protocol excludes already: files are written under
///   temporary names and renamed into place once complete, and PBG itself never rewrites a committed
///   version;
/// * the descriptor is made close-on-exec as soon as the file is open, so child processes do not keep
///   the file open either (on a libhdf5 without the locking switch this leaves only the moment between
///   libhdf5's `open` and this call).
///
/// The POSIX (sec2) driver is chosen explicitly: its handle is the descriptor.
fn open_file(path: &Path, create: bool) -> Result<File> {
    let mut builder = File::with_options();
    builder.with_fapl(|fapl| {
        #[cfg(hdf5_file_locking)]
        fapl.file_locking(false);
        fapl.sec2()
    });
    let file = if create { builder.create(path) } else { builder.open(path) }.map_err(|e| Error::hdf5(path, e))?;
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: `file` is an open file id; H5Fget_vfd_handle only stores a pointer into the driver's state.
    let rc = hdf5::sync::sync(|| unsafe { H5Fget_vfd_handle(file.id(), H5P_DEFAULT, &mut handle) });
    if rc < 0 || handle.is_null() {
        return Err(Error::hdf5(path, hdf5::Error::from("no POSIX file handle for an open HDF5 file")));
    }
    // SAFETY: for the sec2 driver (set above) the handle points to the file's descriptor, an `int` that
    // lives as long as the file is open. fcntl with F_GETFD/F_SETFD only changes the descriptor's flags.
    let set = unsafe {
        let fd = *handle.cast::<libc::c_int>();
        let flags = libc::fcntl(fd, libc::F_GETFD);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) >= 0
    };
    if !set {
        return Err(Error::io(path, std::io::Error::last_os_error()));
    }
    Ok(file)
}

fn core_err(path: &Path, e: ckpt_tensor::Error) -> Error {
    match e {
        ckpt_tensor::Error::Io { path, source } if source.kind() == std::io::ErrorKind::NotFound => {
            Error::CouldNotLoad { path }
        }
        ckpt_tensor::Error::Io { path, source } => Error::Io { path, source },
        other => {
            let _ = path;
            Error::Core(other)
        }
    }
}

/// The element type of a dataset or attribute, as far as PBG cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Element {
    /// A number type torch has (`little_endian` false for big-endian files).
    Numeric {
        /// The torch dtype.
        dtype: DType,
        /// Byte order in the file.
        little_endian: bool,
    },
    /// An HDF5 OPAQUE type of `size` bytes (numpy `V<size>`).
    Opaque {
        /// Element size.
        size: usize,
    },
    /// Anything else, described for error messages.
    Other(String),
}

impl Element {
    /// A short description (`float32`, `opaque(1)`, `string`, ...).
    pub fn describe(&self) -> String {
        match self {
            Element::Numeric { dtype, little_endian: true } => dtype.torch_name().to_string(),
            Element::Numeric { dtype, little_endian: false } => format!("{} (big-endian)", dtype.torch_name()),
            Element::Opaque { size } => format!("opaque({size})"),
            Element::Other(s) => s.clone(),
        }
    }
}

fn classify(dt: &Datatype) -> Element {
    let little_endian = !matches!(dt.byte_order(), ByteOrder::BigEndian);
    let numeric = |dtype| Element::Numeric { dtype, little_endian };
    match dt.to_descriptor() {
        Ok(TypeDescriptor::Integer(s)) => numeric(match s {
            IntSize::U1 => DType::I8,
            IntSize::U2 => DType::I16,
            IntSize::U4 => DType::I32,
            IntSize::U8 => DType::I64,
        }),
        Ok(TypeDescriptor::Unsigned(s)) => numeric(match s {
            IntSize::U1 => DType::U8,
            IntSize::U2 => DType::U16,
            IntSize::U4 => DType::U32,
            IntSize::U8 => DType::U64,
        }),
        Ok(TypeDescriptor::Float(FloatSize::U4)) => numeric(DType::F32),
        Ok(TypeDescriptor::Float(FloatSize::U8)) => numeric(DType::F64),
        Ok(TypeDescriptor::Boolean) => numeric(DType::Bool),
        Ok(other) => Element::Other(format!("{other}")),
        Err(_) => {
            // Classes hdf5-metno does not describe: OPAQUE, half floats, bitfields, references, ...
            let id = dt.id();
            // SAFETY: `id` is a valid, open datatype id owned by `dt`; the calls only query it.
            let (class, size) = hdf5::sync::sync(|| unsafe { (H5Tget_class(id), H5Tget_size(id)) });
            match class {
                H5T_class_t::H5T_OPAQUE => Element::Opaque { size },
                H5T_class_t::H5T_FLOAT if size == 2 => numeric(DType::F16),
                H5T_class_t::H5T_FLOAT => Element::Other(format!("float of {size} bytes")),
                H5T_class_t::H5T_BITFIELD => Element::Other(format!("bitfield of {size} bytes")),
                H5T_class_t::H5T_REFERENCE => Element::Other("reference".into()),
                other => Element::Other(format!("{other:?}")),
            }
        }
    }
}

/// A dataset's header facts, read before any data.
#[derive(Debug, Clone)]
pub struct DatasetInfo {
    /// Path inside the file.
    pub name: String,
    /// Element type.
    pub element: Element,
    /// Shape.
    pub shape: Vec<usize>,
    /// File offset of the data when it is one contiguous run the map can hand out (contiguous layout,
    /// allocated, no filters, no user block).
    pub contiguous_offset: Option<u64>,
}

/// An HDF5 file open for reading, with its memory map.
pub struct Reader {
    path: PathBuf,
    file: File,
    map: Buffer,
    /// Offset of the superblock (0 unless the file has a user block).
    base: usize,
}

impl Reader {
    /// Opens `path`: [`Error::CouldNotLoad`] if it does not exist, [`Error::NotHdf5`] without an HDF5
    /// signature, [`Error::Hdf5`] if libhdf5 refuses it.
    ///
    /// # Errors
    /// As above.
    pub fn open(path: impl AsRef<Path>) -> Result<Reader> {
        let path = path.as_ref();
        let map = Buffer::map_file(path).map_err(|e| core_err(path, e))?;
        let base = check_header(path, map.as_bytes())?;
        let file = open_file(path, false)?;
        Ok(Reader { path: path.to_path_buf(), file, map, base })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root group.
    pub fn root(&self) -> &Group {
        &self.file
    }

    /// The file's memory map.
    #[cfg(test)]
    pub fn map(&self) -> &Buffer {
        &self.map
    }

    fn h5<T>(&self, r: hdf5::Result<T>) -> Result<T> {
        r.map_err(|e| Error::hdf5(&self.path, e))
    }

    /// Whether a link called `name` exists (intermediate groups included, like h5py's `name in hf`).
    pub fn exists(&self, name: &str) -> bool {
        let mut group: Group = (*self.file).clone();
        let mut parts = name.split('/').filter(|p| !p.is_empty()).peekable();
        while let Some(part) = parts.next() {
            if !group.link_exists(part) {
                return false;
            }
            if parts.peek().is_some() {
                match group.group(part) {
                    Ok(g) => group = g,
                    Err(_) => return false,
                }
            }
        }
        true
    }

    /// The root attributes in libhdf5's name order (what h5py's `hf.attrs` shows).
    ///
    /// # Errors
    /// [`Error::Hdf5`] if an attribute cannot be read.
    pub fn root_attrs(&self) -> Result<Vec<(String, AttrValue)>> {
        read_attrs(&self.file, &self.path)
    }

    /// Opens dataset `name`; [`Error::MissingDataset`] if there is none.
    ///
    /// # Errors
    /// As above.
    pub fn dataset(&self, name: &str) -> Result<Dataset> {
        if !self.exists(name) {
            return Err(Error::MissingDataset { path: self.path.clone(), name: name.to_owned() });
        }
        match self.file.loc_type_by_name(name) {
            Ok(LocationType::Dataset) => self.h5(self.file.dataset(name)),
            _ => Err(Error::MissingDataset { path: self.path.clone(), name: name.to_owned() }),
        }
    }

    /// The header facts of a dataset.
    ///
    /// # Errors
    /// [`Error::Hdf5`] if the header cannot be read.
    pub fn info(&self, name: &str, ds: &Dataset) -> Result<DatasetInfo> {
        let element = classify(&self.h5(ds.dtype())?);
        let shape = ds.shape();
        let contiguous_offset = if self.base == 0 && ds.layout() == Layout::Contiguous && ds.filters().is_empty() {
            ds.offset()
        } else {
            None
        };
        Ok(DatasetInfo { name: name.to_owned(), element, shape, contiguous_offset })
    }

    /// The window of the map holding `nbytes` at `offset`, checked against the file's size.
    fn window(&self, name: &str, offset: u64, nbytes: usize) -> Result<Buffer> {
        let start = usize::try_from(offset).ok();
        let window = start.and_then(|s| self.map.slice_len(s, nbytes).ok());
        window.ok_or_else(|| Error::BadStorage {
            path: self.path.clone(),
            name: name.to_owned(),
            reason: format!(
                "{nbytes} bytes at offset {offset} reach past the end of the file ({} bytes): truncated?",
                self.map.len()
            ),
        })
    }

    /// Reads a numeric dataset as a tensor of its own dtype: a window of the map when possible (copied only
    /// if misaligned for the dtype), else through libhdf5 with conversion to native byte order.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] for non-numeric data, [`Error::BadStorage`] for storage outside the file,
    /// [`Error::Hdf5`] if libhdf5 fails.
    pub fn read_tensor(&self, ds: &Dataset, info: &DatasetInfo) -> Result<Tensor> {
        let Element::Numeric { dtype, little_endian } = info.element else {
            return Err(Error::WrongDtype {
                path: self.path.clone(),
                name: info.name.clone(),
                expected: "a numeric type",
                found: info.element.describe(),
            });
        };
        let nbytes =
            checked_numel(&info.shape).and_then(|n| n.checked_mul(dtype.size())).ok_or_else(|| Error::BadStorage {
                path: self.path.clone(),
                name: info.name.clone(),
                reason: format!("shape {:?} overflows", info.shape),
            })?;
        if nbytes == 0 {
            return Ok(Tensor::zeros(dtype, &info.shape)?);
        }
        if let (Some(offset), true) = (info.contiguous_offset, little_endian) {
            let mut window = self.window(&info.name, offset, nbytes)?;
            if window.as_bytes().as_ptr().align_offset(dtype.size()) != 0 {
                window = Buffer::copy_from(window.as_bytes())?;
            }
            return Ok(Tensor::from_buffer(dtype, &info.shape, window)?);
        }
        self.read_converted(ds, info, dtype, nbytes)
    }

    /// Reads a floating-point dataset as float32, like PBG's `read_direct` into a float32 buffer: zero copy
    /// for contiguous little-endian float32, libhdf5's conversion for other float types.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] for non-float data, as [`Reader::read_tensor`] otherwise.
    pub fn read_f32(&self, ds: &Dataset, info: &DatasetInfo) -> Result<Tensor> {
        match info.element {
            Element::Numeric { dtype: DType::F32, .. } => self.read_tensor(ds, info),
            Element::Numeric { dtype: DType::F64 | DType::F16, .. } => {
                let nbytes = checked_numel(&info.shape).and_then(|n| n.checked_mul(4)).unwrap_or(usize::MAX);
                self.check_declared_size(ds, &info.name, nbytes)?;
                let v: Vec<f32> = self.h5(ds.read_raw::<f32>())?;
                Ok(Tensor::from_slice(&v, &info.shape)?)
            }
            _ => Err(Error::WrongDtype {
                path: self.path.clone(),
                name: info.name.clone(),
                expected: "float32 (or another float type, converted)",
                found: info.element.describe(),
            }),
        }
    }

    fn read_converted(&self, ds: &Dataset, info: &DatasetInfo, dtype: DType, nbytes: usize) -> Result<Tensor> {
        self.check_declared_size(ds, &info.name, nbytes)?;
        macro_rules! conv {
            ($t:ty) => {{
                let v: Vec<$t> = self.h5(ds.read_raw::<$t>())?;
                Tensor::from_slice(&v, &info.shape)?
            }};
        }
        let t = match dtype {
            DType::F32 => conv!(f32),
            DType::F64 => conv!(f64),
            DType::I8 => conv!(i8),
            DType::I16 => conv!(i16),
            DType::I32 => conv!(i32),
            DType::I64 => conv!(i64),
            DType::U8 => conv!(u8),
            DType::U16 => conv!(u16),
            DType::U32 => conv!(u32),
            DType::U64 => conv!(u64),
            DType::Bool => {
                let v: Vec<bool> = self.h5(ds.read_raw::<bool>())?;
                let bytes: Vec<u8> = v.into_iter().map(u8::from).collect();
                Tensor::from_buffer(DType::Bool, &info.shape, Buffer::copy_from(&bytes)?)?
            }
            _ => {
                // Half floats: libhdf5 reads them in their own type (little-endian on this host only).
                let bytes = self.read_bytes_raw(ds, &info.name, nbytes)?;
                Tensor::from_buffer(dtype, &info.shape, bytes)?
            }
        };
        Ok(t)
    }

    /// Reads a dataset's bytes in its own file type, without conversion (what numpy's `.tobytes()` of
    /// `ds[...]` gives for OPAQUE data): a window of the map when contiguous, else through libhdf5.
    ///
    /// # Errors
    /// [`Error::BadStorage`] for storage outside the file, [`Error::Hdf5`] if libhdf5 fails.
    pub fn read_bytes(&self, ds: &Dataset, info: &DatasetInfo, element_size: usize) -> Result<Buffer> {
        let nbytes =
            checked_numel(&info.shape).and_then(|n| n.checked_mul(element_size)).ok_or_else(|| Error::BadStorage {
                path: self.path.clone(),
                name: info.name.clone(),
                reason: format!("shape {:?} overflows", info.shape),
            })?;
        if nbytes == 0 {
            return Ok(Buffer::zeroed(0)?);
        }
        match info.contiguous_offset {
            Some(offset) => self.window(&info.name, offset, nbytes),
            None => self.read_bytes_raw(ds, &info.name, nbytes),
        }
    }

    /// Refuses to allocate for data that is not in the file: a dataset read through libhdf5 (chunked,
    /// compressed, converted) may declare any shape; its logical size is what gets allocated. It must not
    /// exceed the file's size by more than a 1000x compression ratio (1 MiB always allowed).
    fn check_declared_size(&self, ds: &Dataset, name: &str, nbytes: usize) -> Result<()> {
        let cap = (self.map.len() as u64).saturating_mul(1000).max(1 << 20);
        if nbytes as u64 > cap && ds.storage_size() < nbytes as u64 {
            return Err(Error::BadStorage {
                path: self.path.clone(),
                name: name.to_owned(),
                reason: format!("{nbytes} bytes declared in a file of {} bytes", self.map.len()),
            });
        }
        Ok(())
    }

    fn read_bytes_raw(&self, ds: &Dataset, name: &str, nbytes: usize) -> Result<Buffer> {
        self.check_declared_size(ds, name, nbytes)?;
        let numel = checked_numel(&ds.shape()).unwrap_or(usize::MAX);
        let mut out = ckpt_tensor::AlignedBytes::zeroed(nbytes)?;
        let id = ds.id();
        // SAFETY: the type id comes from libhdf5 and is owned (closed) by `dt`. `H5Dread` with the file's
        // own type as memory type and H5S_ALL writes exactly numel × H5Tget_size(type) bytes, which is
        // checked to be `out.len()` before the call; variable-length types (which would write pointers)
        // are refused. All calls run under hdf5-metno's global lock.
        let rc = hdf5::sync::sync(|| unsafe {
            let tid = H5Dget_type(id);
            if tid < 0 {
                return Ok(-1);
            }
            let Ok(dt) = hdf5::from_id::<Datatype>(tid) else { return Ok(-1) };
            let class = H5Tget_class(dt.id());
            let size = H5Tget_size(dt.id());
            if matches!(class, H5T_class_t::H5T_VLEN) || hdf5_sys::h5t::H5Tis_variable_str(dt.id()) > 0 {
                return Err(format!("variable-length data ({class:?})"));
            }
            if numel.checked_mul(size) != Some(out.len()) {
                return Err(format!("{numel} elements of {size} bytes do not make {} bytes", out.len()));
            }
            Ok(H5Dread(id, dt.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.as_mut_bytes().as_mut_ptr().cast::<c_void>()))
        });
        match rc {
            Err(reason) => Err(Error::BadStorage { path: self.path.clone(), name: name.to_owned(), reason }),
            Ok(code) => {
                self.h5(hdf5::h5check(code))?;
                Ok(Buffer::from_owner(out))
            }
        }
    }

    /// Every dataset below `group`, visited like h5py's `visititems`: depth first, each level in name
    /// order, soft and external links skipped, each object once.
    ///
    /// # Errors
    /// [`Error::Hdf5`] if a group cannot be listed.
    pub fn datasets_below(&self, group: &Group) -> Result<Vec<(String, Dataset)>> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        self.visit(group, "", &mut out, &mut seen, 0)?;
        Ok(out)
    }

    fn visit(
        &self,
        group: &Group,
        prefix: &str,
        out: &mut Vec<(String, Dataset)>,
        seen: &mut Vec<hdf5::LocationToken>,
        depth: usize,
    ) -> Result<()> {
        if depth > 64 {
            return Err(Error::BadStorage {
                path: self.path.clone(),
                name: prefix.to_owned(),
                reason: "groups nested more than 64 deep".into(),
            });
        }
        let links = self.h5(group.links(hdf5::IndexType::Name, hdf5::IterationOrder::Increasing))?;
        for (name, info) in links {
            if info.link_type != hdf5::LinkType::Hard {
                continue;
            }
            let full = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            let loc = self.h5(group.loc_info_by_name(&name))?;
            if seen.contains(&loc.token) {
                continue;
            }
            seen.push(loc.token);
            match loc.loc_type {
                LocationType::Dataset => out.push((full, self.h5(group.dataset(&name))?)),
                LocationType::Group => {
                    let g = self.h5(group.group(&name))?;
                    self.visit(&g, &full, out, seen, depth + 1)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Reads every attribute of `loc` in name order.
fn read_attrs(loc: &Location, path: &Path) -> Result<Vec<(String, AttrValue)>> {
    let names = loc.attr_names().map_err(|e| Error::hdf5(path, e))?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let attr = loc.attr(&name).map_err(|e| Error::hdf5(path, e))?;
        out.push((name, read_attr(&attr)));
    }
    Ok(out)
}

/// Reads one attribute: scalars of integer, float and string types (fixed or variable length, ASCII or
/// UTF-8) become values; anything else is described in [`AttrValue::Other`].
pub fn read_attr(attr: &Attribute) -> AttrValue {
    let Ok(dt) = attr.dtype() else { return AttrValue::Other("unreadable type".into()) };
    let shape = attr.shape();
    let descriptor = dt.to_descriptor();
    if !shape.is_empty() {
        let d = descriptor.map(|d| d.to_string()).unwrap_or_else(|_| classify(&dt).describe());
        return AttrValue::Other(format!("array {shape:?} of {d}"));
    }
    let other = |what: &str| AttrValue::Other(what.to_owned());
    match descriptor {
        Ok(TypeDescriptor::Integer(_)) => attr.read_scalar::<i64>().map_or_else(|_| other("integer"), AttrValue::Int),
        Ok(TypeDescriptor::Unsigned(_)) => match attr.read_scalar::<u64>() {
            Ok(v) => i64::try_from(v).map_or_else(|_| AttrValue::Other(format!("uint64 {v}")), AttrValue::Int),
            Err(_) => other("unsigned integer"),
        },
        Ok(TypeDescriptor::Float(_)) => attr.read_scalar::<f64>().map_or_else(|_| other("float"), AttrValue::Float),
        Ok(TypeDescriptor::Boolean) => {
            attr.read_scalar::<bool>().map_or_else(|_| other("bool"), |b| AttrValue::Other(format!("bool {b}")))
        }
        Ok(TypeDescriptor::VarLenUnicode) => attr
            .read_scalar::<VarLenUnicode>()
            .map_or_else(|_| other("string"), |s| AttrValue::Str(s.as_str().to_owned())),
        Ok(TypeDescriptor::VarLenAscii) => match attr.read_scalar::<VarLenAscii>() {
            Ok(s) => AttrValue::Str(s.as_str().to_owned()),
            Err(_) => other("ascii string"),
        },
        Ok(TypeDescriptor::FixedAscii(n) | TypeDescriptor::FixedUnicode(n)) => match read_fixed_string(attr, &dt, n) {
            Some(s) => AttrValue::Str(s),
            None => other("fixed-length string"),
        },
        Ok(d) => AttrValue::Other(d.to_string()),
        Err(_) => AttrValue::Other(classify(&dt).describe()),
    }
}

/// A scalar fixed-length string attribute's text, without its NUL or space padding.
fn read_fixed_string(attr: &Attribute, dt: &Datatype, n: usize) -> Option<String> {
    if n > (1 << 20) {
        return None;
    }
    let mut buf = vec![0u8; n];
    let (aid, tid) = (attr.id(), dt.id());
    // SAFETY: a scalar attribute of fixed-length string type `dt` of size `n` reads exactly `n` bytes into
    // `buf` (checked: the caller passes the type's size, the dataspace is scalar).
    let rc = hdf5::sync::sync(|| unsafe { hdf5_sys::h5a::H5Aread(aid, tid, buf.as_mut_ptr().cast::<c_void>()) });
    if rc < 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf.truncate(end);
    while buf.last() == Some(&b' ') {
        buf.pop();
    }
    String::from_utf8(buf).ok()
}

/// An HDF5 file under construction: structure through libhdf5, data queued for positioned writes.
pub struct Writer<'a> {
    path: PathBuf,
    file: Option<File>,
    raw: Vec<(u64, Queued<'a>)>,
    /// [`Writer::create_durable`]: the commit whose temporary file holds libhdf5's skeleton.
    commit: Option<FileCommit>,
}

/// The HDF5 type of a torch dtype, for the dtypes h5py can hold (bool as h5py's int8 enum).
fn datatype_of(dtype: DType) -> Option<TypeDescriptor> {
    Some(match dtype {
        DType::Bool => TypeDescriptor::Boolean,
        DType::I8 => TypeDescriptor::Integer(IntSize::U1),
        DType::I16 => TypeDescriptor::Integer(IntSize::U2),
        DType::I32 => TypeDescriptor::Integer(IntSize::U4),
        DType::I64 => TypeDescriptor::Integer(IntSize::U8),
        DType::U8 => TypeDescriptor::Unsigned(IntSize::U1),
        DType::U16 => TypeDescriptor::Unsigned(IntSize::U2),
        DType::U32 => TypeDescriptor::Unsigned(IntSize::U4),
        DType::U64 => TypeDescriptor::Unsigned(IntSize::U8),
        DType::F32 => TypeDescriptor::Float(FloatSize::U4),
        DType::F64 => TypeDescriptor::Float(FloatSize::U8),
        _ => return None,
    })
}

fn contiguous_no_fill(dcpl: &mut DatasetCreateBuilder) -> &mut DatasetCreateBuilder {
    dcpl.no_chunk().alloc_time(Some(AllocTime::Early)).fill_time(FillTime::Never).obj_track_times(false)
}

impl<'a> Writer<'a> {
    /// Creates (truncates) `path` with libhdf5's default (earliest-format) properties, as h5py's `"w"`.
    ///
    /// # Errors
    /// [`Error::Hdf5`] if the file cannot be created.
    pub fn create(path: &Path) -> Result<Writer<'a>> {
        let file = open_file(path, true)?;
        Ok(Writer { path: path.to_path_buf(), file: Some(file), raw: Vec::new(), commit: None })
    }

    /// Creates a writer of `path` that commits durably ([`FileCommit`]): libhdf5 writes the structure into
    /// the commit's temporary file, [`Writer::finish`] streams the whole file through the commit's
    /// [`DurableWriter`] (`O_DIRECT` where the file system allows it), `fdatasync`s it, renames it over
    /// `path` and fsyncs the directory. Until then `path` is untouched; on error it stays so.
    ///
    /// # Errors
    /// The commit's errors ([`Error::Core`]: the destination locked by another save, permission denied,
    /// ...); [`Error::Hdf5`] if libhdf5 cannot create the file.
    pub fn create_durable(path: &Path) -> Result<Writer<'a>> {
        let commit = FileCommit::create(path, &FileOptions::default()).map_err(|e| Error::Core(e.into()))?;
        let file = open_file(commit.temp_path(), true)?;
        Ok(Writer { path: path.to_path_buf(), file: Some(file), raw: Vec::new(), commit: Some(commit) })
    }

    fn h5<T>(&self, r: hdf5::Result<T>) -> Result<T> {
        r.map_err(|e| Error::hdf5(&self.path, e))
    }

    /// The root group.
    ///
    /// # Errors
    /// Never in practice (the file is open until [`Writer::finish`]).
    pub fn root(&self) -> Result<Group> {
        match &self.file {
            Some(f) => Ok((**f).clone()),
            None => {
                Err(Error::InvalidInput { what: self.path.display().to_string(), reason: "file already closed".into() })
            }
        }
    }

    /// Sets a scalar attribute the way h5py stores Python values: `int` as int64, `float` as float64,
    /// `str` as a variable-length UTF-8 string.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for [`AttrValue::Other`] or strings with NUL, [`Error::Hdf5`].
    pub fn set_attr(&self, loc: &Location, name: &str, value: &AttrValue) -> Result<()> {
        if loc.attr_names().map(|n| n.iter().any(|x| x == name)).unwrap_or(false) {
            self.h5(loc.delete_attr(name))?;
        }
        match value {
            AttrValue::Int(v) => self.h5(loc.new_attr::<i64>().create(name).and_then(|a| a.write_scalar(v))),
            AttrValue::Float(v) => self.h5(loc.new_attr::<f64>().create(name).and_then(|a| a.write_scalar(v))),
            AttrValue::Str(s) => {
                let v: VarLenUnicode = s.parse().map_err(|_| Error::InvalidInput {
                    what: format!("attribute {name:?}"),
                    reason: "strings stored in HDF5 cannot contain NUL".into(),
                })?;
                self.h5(loc.new_attr::<VarLenUnicode>().create(name).and_then(|a| a.write_scalar(&v)))
            }
            AttrValue::Other(d) => Err(Error::InvalidInput {
                what: format!("attribute {name:?}"),
                reason: format!("values of kind {d} cannot be written"),
            }),
        }
    }

    /// Creates a group whose links and attributes are tracked in creation order (h5py's
    /// `create_group(name, track_order=True)`).
    ///
    /// # Errors
    /// [`Error::Hdf5`].
    pub fn create_tracked_group(&self, parent: &Group, name: &str) -> Result<Group> {
        use hdf5::plist::group_create::{AttrCreationOrder, LinkCreationOrder};
        // h5py's track_order=True: creation order tracked and indexed, for links and attributes.
        let order_l = LinkCreationOrder::Indexed;
        let order_a = AttrCreationOrder::Indexed;
        self.h5(parent
            .create_group_builder()
            .with_gcpl(|p| p.link_creation_order(order_l).attr_creation_order(order_a).obj_track_times(false))
            .create(name))
    }

    /// The group at `path` below `parent`, creating missing groups as libhdf5 and h5py do for
    /// `parent.create_dataset("a/b/c/x")`: the groups above the dataset's parent (`a`, `a/b`) inherit the
    /// link creation order tracking of `parent`; the dataset's own parent (`a/b/c`) gets default properties.
    ///
    /// # Errors
    /// [`Error::Hdf5`].
    pub fn group_path(&self, parent: &Group, path: &str) -> Result<Group> {
        use hdf5::plist::group_create::LinkCreationOrder;
        let tracked = parent.gcpl().map(|p| p.link_creation_order()).unwrap_or_default();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let mut g = parent.clone();
        for (i, part) in parts.iter().enumerate() {
            g = if g.link_exists(part) {
                self.h5(g.group(part))?
            } else {
                let order = if i + 1 < parts.len() { tracked } else { LinkCreationOrder::Untracked };
                self.h5(g
                    .create_group_builder()
                    .with_gcpl(|p| p.link_creation_order(order).obj_track_times(false))
                    .create(*part))?
            };
        }
        Ok(g)
    }

    /// Creates a contiguous dataset `name` (which may contain `/`) holding `tensor`, and queues its bytes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for dtypes h5py cannot hold, [`Error::Hdf5`].
    pub fn add_tensor(&mut self, parent: &Group, name: &str, tensor: &'a Tensor) -> Result<Dataset> {
        let desc = datatype_of(tensor.dtype()).ok_or_else(|| Error::InvalidInput {
            what: format!("dataset {name:?}"),
            reason: format!("dtype {} has no HDF5 equivalent h5py reads", tensor.dtype()),
        })?;
        let (group, leaf) = self.split(parent, name)?;
        let shape = tensor.shape().to_vec();
        let ds = self.h5(group
            .new_dataset_builder()
            .empty_as(&desc)
            .shape(shape)
            .with_dcpl(|p| contiguous_no_fill(p))
            .create(leaf.as_str()))?;
        if tensor.nbytes() > 0 {
            let offset = self.allocated_offset(&ds, name)?;
            // The bytes are made when the file is written (`finish`), not now: a tensor made on demand (a
            // DCP region, gathered rows) is then in memory only while it is written, a piece at a time
            // where it can be (`Tensor::data_pieces`).
            self.raw.push((offset, Queued::Tensor(tensor)));
        }
        Ok(ds)
    }

    /// Creates a 1-D OPAQUE dataset of 1-byte elements with an empty tag (numpy `V1`, how PBG stores the
    /// optimizer blob) holding `bytes`, and queues them.
    ///
    /// # Errors
    /// [`Error::Hdf5`].
    pub fn add_opaque(&mut self, parent: &Group, name: &str, bytes: &'a [u8]) -> Result<Dataset> {
        let (group, leaf) = self.split(parent, name)?;
        // SAFETY: creates a new datatype; the id is handed to `from_id`, which owns and closes it.
        let tid = hdf5::sync::sync(|| unsafe {
            let tid = H5Tcreate(H5T_class_t::H5T_OPAQUE, 1);
            if tid >= 0 {
                // h5py's numpy "V1" carries an empty tag.
                let _ = H5Tset_tag(tid, c"".as_ptr());
            }
            tid
        });
        // SAFETY: `tid` is a fresh datatype id nobody else owns.
        let dt: Datatype = self.h5(hdf5::h5check(tid).and_then(|t| unsafe { hdf5::from_id::<Datatype>(t) }))?;
        let ds = self.h5(group
            .new_dataset_builder()
            .empty_as(&dt)
            .shape(vec![bytes.len()])
            .with_dcpl(|p| contiguous_no_fill(p))
            .create(leaf.as_str()))?;
        if !bytes.is_empty() {
            let offset = self.allocated_offset(&ds, name)?;
            self.raw.push((offset, Queued::Bytes(bytes)));
        }
        Ok(ds)
    }

    fn split(&self, parent: &Group, name: &str) -> Result<(Group, String)> {
        match name.rsplit_once('/') {
            Some((dir, leaf)) => Ok((self.group_path(parent, dir)?, leaf.to_owned())),
            None => Ok((parent.clone(), name.to_owned())),
        }
    }

    fn allocated_offset(&self, ds: &Dataset, name: &str) -> Result<u64> {
        ds.offset().ok_or_else(|| Error::BadStorage {
            path: self.path.clone(),
            name: name.to_owned(),
            reason: "libhdf5 did not allocate contiguous storage".into(),
        })
    }

    /// Closes the HDF5 structure, then writes every queued dataset's bytes at its offset and fsyncs the
    /// file; a [durable](Writer::create_durable) writer streams the file and commits it instead.
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::Hdf5`], or the commit's errors ([`Error::Core`]).
    pub fn finish(mut self) -> Result<()> {
        if let Some(file) = self.file.take() {
            self.h5(file.flush())?;
            // Dropping the last handle closes the file (every dataset and group handle is gone by now).
            drop(file);
        }
        if let Some(mut commit) = self.commit.take() {
            let streamed = self.stream(commit.temp_path().to_path_buf(), commit.writer());
            if let Err(e) = streamed {
                return Err(match commit.writer().io_error() {
                    Some(io) => Error::io(&self.path, io),
                    None => e,
                });
            }
            return commit.commit().map(|_| ()).map_err(|e| Error::Core(e.into()));
        }
        let f = OpenOptions::new().write(true).open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        for (offset, queued) in &self.raw {
            let mut at = *offset;
            queued.pieces(&self.path, *offset, |d| {
                f.write_all_at(d, at).map_err(|e| Error::io(&self.path, e))?;
                at += d.len() as u64;
                Ok(())
            })?;
        }
        f.sync_all().map_err(|e| Error::io(&self.path, e))
    }

    /// Writes the whole file into `out` in file order: the bytes libhdf5 wrote to `skeleton` between the
    /// queued datasets, and each dataset's bytes at its offset.
    fn stream(&mut self, skeleton: PathBuf, out: &mut DurableWriter) -> Result<()> {
        let io = |e: std::io::Error| Error::io(&self.path, e);
        let skel = std::fs::File::open(&skeleton).map_err(io)?;
        let len = skel.metadata().map_err(io)?.len();
        self.raw.sort_by_key(|(offset, _)| *offset);
        let mut pos = 0u64;
        for (offset, queued) in &self.raw {
            let n = queued.len();
            let end = offset.checked_add(n as u64).filter(|&e| *offset >= pos && e <= len);
            let Some(end) = end else {
                return Err(Error::BadStorage {
                    path: self.path.clone(),
                    name: format!("data at offset {offset}"),
                    reason: format!("{n} bytes overlap other data or end past the file ({len} bytes)"),
                });
            };
            copy_range(&skel, pos, *offset, out).map_err(io)?;
            queued.pieces(&self.path, *offset, |d| out.write_all(d).map_err(io))?;
            pos = end;
        }
        copy_range(&skel, pos, len, out).map_err(io)
    }
}

/// Bytes of a tensor made on demand written at a time (fits the L2 cache).
const STREAM_PIECE: usize = 1 << 20;

/// A dataset's bytes queued for [`Writer::finish`].
enum Queued<'a> {
    /// Borrowed bytes (the optimizer blob).
    Bytes(&'a [u8]),
    /// A tensor's elements, made when written.
    Tensor(&'a Tensor),
}

impl Queued<'_> {
    fn len(&self) -> usize {
        match self {
            Queued::Bytes(b) => b.len(),
            Queued::Tensor(t) => t.nbytes(),
        }
    }

    /// Hands the bytes to `f` in order (a tensor made on demand a piece at a time), and checks that they
    /// are [`len`](Self::len) bytes; `path` and `offset` name them in the error.
    fn pieces(&self, path: &std::path::Path, offset: u64, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let mut written = 0usize;
        let mut count = |d: &[u8]| {
            written += d.len();
            f(d)
        };
        match self {
            Queued::Bytes(b) => count(b)?,
            Queued::Tensor(t) => t.data_pieces(STREAM_PIECE, count)?,
        }
        if written != self.len() {
            return Err(Error::BadStorage {
                path: path.to_path_buf(),
                name: format!("data at offset {offset}"),
                reason: format!("{} bytes were made as {written}", self.len()),
            });
        }
        Ok(())
    }
}

/// Copies bytes `from..to` of `src` into `out`.
fn copy_range(src: &std::fs::File, mut from: u64, to: u64, out: &mut DurableWriter) -> std::io::Result<()> {
    let mut buf = vec![0u8; usize::try_from(to.saturating_sub(from)).unwrap_or(usize::MAX).min(1 << 20)];
    while from < to {
        let n = usize::try_from(to - from).unwrap_or(usize::MAX).min(buf.len());
        let piece = buf.get_mut(..n).unwrap_or_default();
        src.read_exact_at(piece, from)?;
        out.write_all(piece)?;
        from += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn signature_search() {
        let mut bytes = vec![0u8; 4096];
        assert!(!is_hdf5(&bytes));
        bytes[1024..1032].copy_from_slice(&HDF5_SIGNATURE);
        assert_eq!(signature_offset(&bytes), Some(1024));
        bytes[0..8].copy_from_slice(&HDF5_SIGNATURE);
        assert_eq!(signature_offset(&bytes), Some(0));
        assert!(!is_hdf5(&HDF5_SIGNATURE[..7]));
    }

    #[test]
    fn writes_and_maps_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.h5");
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
        let blob = b"hello opaque".to_vec();
        let mut w = Writer::create(&path).unwrap();
        let root = w.root().unwrap();
        w.set_attr(&root, "format_version", &AttrValue::Int(1)).unwrap();
        w.set_attr(&root, "config/json", &AttrValue::Str("{}".into())).unwrap();
        w.add_tensor(&root, "embeddings", &t).unwrap();
        w.add_opaque(&root, "optimizer/state_dict", &blob).unwrap();
        let g = w.create_tracked_group(&root, "model").unwrap();
        w.add_tensor(&g, "relations/0/operator/rhs/real", &t).unwrap();
        drop((root, g));
        w.finish().unwrap();

        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(superblock_eof(&bytes, 0), Some(bytes.len() as u64));
        std::fs::write(dir.path().join("cut.h5"), &bytes[..bytes.len() - 1]).unwrap();
        assert!(matches!(Reader::open(dir.path().join("cut.h5")), Err(Error::Truncated { .. })));
        let r = Reader::open(&path).unwrap();
        let attrs = r.root_attrs().unwrap();
        assert_eq!(attrs[0], ("config/json".to_string(), AttrValue::Str("{}".into())));
        assert_eq!(attrs[1], ("format_version".to_string(), AttrValue::Int(1)));
        let ds = r.dataset("embeddings").unwrap();
        let info = r.info("embeddings", &ds).unwrap();
        assert!(info.contiguous_offset.is_some());
        let back = r.read_tensor(&ds, &info).unwrap();
        assert!(back.storage().same_backing(r.map()));
        assert_eq!(back, t);
        let ds = r.dataset("optimizer/state_dict").unwrap();
        let info = r.info("optimizer/state_dict", &ds).unwrap();
        assert_eq!(info.element, Element::Opaque { size: 1 });
        assert_eq!(r.read_bytes(&ds, &info, 1).unwrap().as_bytes(), blob.as_slice());
        assert!(r.exists("optimizer/state_dict"));
        assert!(!r.exists("optimizer/nothing"));
        assert!(matches!(r.dataset("nothing"), Err(Error::MissingDataset { .. })));
        let model = r.root().group("model").unwrap();
        let all = r.datasets_below(&model).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].0, "relations/0/operator/rhs/real");
    }

    /// The durable writer makes the same file, byte for byte, as the in-place one: skeleton bytes between
    /// and after the datasets, each dataset at its offset, with a dataset larger than the commit's 8 MiB
    /// buffer (so the `O_DIRECT` pipeline runs) and one that ends inside a buffer. It replaces an existing
    /// file, leaves no temporary or lock file, and a writer dropped before `finish` leaves the old file.
    #[test]
    fn durable_writer_makes_the_in_place_file_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<f32> = (0..(3 << 20) + 5).map(|i| (i % 9973) as f32 * 0.5).collect();
        let big = Tensor::from_slice(&values, &[values.len(), 1]).unwrap();
        let small = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
        let blob: Vec<u8> = (0..100_003u32).map(|i| (i * 31 % 251) as u8).collect();
        fn fill<'a>(w: &mut Writer<'a>, big: &'a Tensor, small: &'a Tensor, blob: &'a [u8]) {
            let root = w.root().unwrap();
            w.set_attr(&root, "format_version", &AttrValue::Int(1)).unwrap();
            w.add_tensor(&root, "embeddings", big).unwrap();
            w.add_opaque(&root, "optimizer/state_dict", blob).unwrap();
            let g = w.create_tracked_group(&root, "model").unwrap();
            w.add_tensor(&g, "relations/0/operator/rhs/real", small).unwrap();
        }
        let plain = dir.path().join("plain.h5");
        let mut w = Writer::create(&plain).unwrap();
        fill(&mut w, &big, &small, &blob);
        w.finish().unwrap();
        let durable = dir.path().join("durable.h5");
        std::fs::write(&durable, b"the old file").unwrap();
        let mut w = Writer::create_durable(&durable).unwrap();
        fill(&mut w, &big, &small, &blob);
        drop(w); // never finished: the old file stays, the temporary file goes
        assert_eq!(std::fs::read(&durable).unwrap(), b"the old file");
        let mut w = Writer::create_durable(&durable).unwrap();
        fill(&mut w, &big, &small, &blob);
        w.finish().unwrap();
        let (a, b) = (std::fs::read(&plain).unwrap(), std::fs::read(&durable).unwrap());
        assert!(b.len() > 12 << 20);
        assert!(a == b, "durable file differs from the in-place one ({} vs {} bytes)", a.len(), b.len());
        let names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let r = Reader::open(&durable).unwrap();
        let ds = r.dataset("embeddings").unwrap();
        let info = r.info("embeddings", &ds).unwrap();
        assert_eq!(r.read_tensor(&ds, &info).unwrap(), big);
    }

    /// A child process started while a file is open (another thread spawning a program, as the test
    /// harness does) must not keep the file locked after it is closed here: once `finish` returns, the file
    /// opens again, and a file open for reading does not block a rewrite.
    #[test]
    fn a_child_process_started_meanwhile_does_not_keep_the_file_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.h5");
        let t = Tensor::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap();
        let sleeper = || std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut w = Writer::create(&path).unwrap();
        let root = w.root().unwrap();
        w.add_tensor(&root, "embeddings", &t).unwrap();
        drop(root);
        let mut child = sleeper(); // inherits whatever descriptor is not close-on-exec
        w.finish().unwrap();
        let opened = Reader::open(&path).map(|r| r.dataset("embeddings").is_ok());
        let mut reader_child = sleeper();
        let rewritten = opened.as_ref().ok().map(|_| Writer::create(&path).and_then(Writer::finish));
        for c in [&mut child, &mut reader_child] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert!(matches!(opened, Ok(true)), "reopening after a write: {opened:?}");
        assert!(matches!(rewritten, Some(Ok(()))), "rewriting a file a child saw open: {rewritten:?}");
    }
}
