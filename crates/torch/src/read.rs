//! Reading `torch.save` files: ZIP archives (zero copy over a memory map) and the legacy pickle stream.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

use ckpt_tensor::flatten::LeafIndex;
use ckpt_tensor::flatten::leaf_names;
use ckpt_tensor::{Buffer, CheckpointRead, Entry, Tensor, Value, entry_kind, leaves};

use crate::detect::{Container, detect};
use crate::error::{Error, Result};
use crate::legacy;
use crate::module::{module_classes, module_state_dict};
use crate::read_options::ReadOptions;
use crate::rebuild::rebuild;
use crate::zip::{Archive, HeaderSource};
use crate::zip_storages::{ZipStorages, fill_record};

/// A `torch.save` file, read.
///
/// Tensors are windows of the file's memory map: nothing is copied, and a storage shared by several tensors
/// is one window.
///
/// ```no_run
/// use ckpt_tensor::CheckpointRead;
/// let f = ckpt_torch::TorchReader::open("model.pt").unwrap();
/// for e in f.entries() {
///     println!("{} {:?}", e.name, e.kind);
/// }
/// let w = f.tensor("layer.weight").unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct TorchReader {
    value: Value,
    container: Container,
    prefix: Option<String>,
    version: Option<u64>,
    /// The ZIP archive's central directory (none for a legacy file).
    archive: Option<Box<Archive>>,
    /// Its record names, made on the first call of [`TorchReader::records`].
    records: OnceLock<Vec<String>>,
    /// For a whole pickled `nn.Module`: the state dict its entries are named by ([`module_state_dict`]); for
    /// a TorchScript archive, its module's tensors and constants.
    state_dict: Option<Value>,
    /// What a TorchScript archive declares (code, parameters, buffers).
    script: Option<Box<crate::torchscript::Script>>,
    /// What a torch.package archive holds (resources, modules, extern and mocked modules).
    package: Option<Box<crate::package::Package>>,
    /// Leaves by name, built on the first look-up (reading every entry stays linear).
    leaf_index: OnceLock<Option<LeafIndex>>,
}

impl TorchReader {
    /// Maps and reads a file with default options.
    ///
    /// # Errors
    /// [`Error::At`] naming the path, with the cause.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::open_with(path, &ReadOptions::default())
    }

    /// Maps and reads a file.
    ///
    /// # Errors
    /// [`Error::At`] naming the path, with the cause.
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
        let buffer = Buffer::map(&file, path).map_err(|e| match e {
            ckpt_tensor::Error::Io { path, source } => Error::Io { path, source },
            e => Error::Core(e),
        })?;
        if options.fill.is_some() && options.fill_file.is_none() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let options = options.clone().with_fill_file(name);
            return Self::from_map(&file, &buffer, &options).map_err(|e| e.at(path));
        }
        Self::from_map(&file, &buffer, options).map_err(|e| e.at(path))
    }

    /// Reads `buffer`, a map of the whole of `file` ([`Buffer::map`]), as [`TorchReader::from_buffer`] does,
    /// but reads the ZIP archive's local headers from `file` with positioned reads, which map no page (a
    /// header is a page of its own when records are 10 KiB; one read of it costs half of what mapping that
    /// page and unmapping it later cost).
    ///
    /// # Errors
    /// A specific [`Error`] for each kind of wrong or malformed input.
    pub fn from_map(file: &std::fs::File, buffer: &Buffer, options: &ReadOptions) -> Result<Self> {
        Self::read(buffer, Some(file), options)
    }

    /// Reads a `torch.save` output held in `buffer` (a whole file, or an item embedded in a bigger file as
    /// DCP stores them: ZIP offsets are relative to the buffer's start).
    ///
    /// # Errors
    /// A specific [`Error`] for each kind of wrong or malformed input.
    pub fn from_buffer(buffer: &Buffer, options: &ReadOptions) -> Result<Self> {
        Self::read(buffer, None, options)
    }

    /// Reads `buffer`, which maps the whole of `file` when there is one.
    fn read(buffer: &Buffer, file: Option<&std::fs::File>, options: &ReadOptions) -> Result<Self> {
        // The rebuilder reads the `torch.save` streams nested in a pickle with this reader.
        let options = &ReadOptions { nested_read: Some(read_nested), ..options.clone() };
        match detect(buffer.as_bytes())? {
            Container::Zip => read_zip(buffer, file, options),
            container @ (Container::Legacy | Container::Pickle) => {
                // (The legacy stream's pickle is followed by its storages: the tree is walked, not the bytes.)
                let value = match container {
                    Container::Legacy => legacy::read(buffer, options)?,
                    _ => crate::plain_pickle::read(buffer, options)?,
                };
                Ok(TorchReader {
                    state_dict: module_state_dict(&value),
                    script: None,
                    package: None,
                    value,
                    container,
                    prefix: None,
                    version: None,
                    archive: None,
                    records: OnceLock::new(),
                    leaf_index: OnceLock::new(),
                })
            }
        }
    }

    /// What entries are named by: the saved object, or a whole module's state dict.
    fn root(&self) -> &Value {
        self.state_dict.as_ref().unwrap_or(&self.value)
    }

    /// For a file written by `torch.save(model)`: the state dict `model.state_dict()` would return (parameters
    /// and persistent buffers named `0.weight`, `1.running_mean`, ...), which [`CheckpointRead::entries`]
    /// lists; `None` for any other file. [`TorchReader::value`] is still the whole module object.
    pub fn module_state_dict(&self) -> Option<&Value> {
        self.state_dict.as_ref()
    }

    /// For a TorchScript archive (`torch.jit.save`): the code records, parameters, buffers and constants it
    /// declares (its tensors are the entries, as [`TorchReader::module_state_dict`]); `None` for a
    /// `torch.save` file.
    pub fn script(&self) -> Option<&crate::Script> {
        self.script.as_deref()
    }

    /// For a torch.package archive (`torch.package.PackageExporter`): its resources and the modules it
    /// holds, externs and mocks (its tensors are the entries, each pickled resource's under its path);
    /// `None` for a `torch.save` file.
    pub fn package(&self) -> Option<&crate::Package> {
        self.package.as_deref()
    }

    /// The saved object.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The saved object, by value.
    pub fn into_value(self) -> Value {
        self.value
    }

    /// ZIP or legacy.
    pub fn container(&self) -> Container {
        self.container
    }

    /// The ZIP record prefix (`archive`, or the file stem torch saved under).
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// The archive's `version` record.
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// Record names in the archive (without the prefix), in archive order.
    pub fn records(&self) -> &[String] {
        self.records
            .get_or_init(|| self.archive.iter().flat_map(|a| a.records()).map(|r| r.short_name().to_owned()).collect())
    }

    /// The leaf named `name` (every dict, list and tuple is descended into; keys joined by `.`).
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`].
    pub fn get(&self, name: &str) -> Result<&Value> {
        match self.leaf_index.get_or_init(|| LeafIndex::new(self.root()).ok()) {
            Some(index) => index.get(self.root(), name).ok_or_else(|| Error::NoSuchEntry(name.to_owned())),
            // A key whose str() is not reproduced: leaves() names the error.
            None => Err(leaves(self.root()).err().map_or_else(|| Error::NoSuchEntry(name.to_owned()), Error::from)),
        }
    }
}

impl CheckpointRead for TorchReader {
    fn format_name(&self) -> &'static str {
        match (self.container, &self.package) {
            (Container::Pickle, _) => "pickle",
            (_, Some(_)) => "package",
            _ => "torch",
        }
    }

    fn entries(&self) -> Vec<Entry> {
        leaf_names(self.root())
            .map(|l| l.into_iter().map(|(name, v)| Entry { kind: entry_kind(v), name }).collect())
            .unwrap_or_default()
    }

    fn details(&self) -> Vec<(String, String)> {
        let mut d = vec![(
            "container".to_owned(),
            match self.container {
                Container::Zip => "zip".to_owned(),
                Container::Legacy => "legacy".to_owned(),
                Container::Pickle => "plain pickle (pickle.dump, not torch.save)".to_owned(),
            },
        )];
        if let Some(p) = &self.prefix {
            d.push(("prefix".into(), p.clone()));
        }
        if let Some(v) = self.version {
            d.push(("version".into(), v.to_string()));
        }
        d.push(("top level".into(), self.value.type_name().to_owned()));
        if let Some(script) = &self.script {
            d.push(("torchscript".into(), format!("{} code files (listed, never run)", script.code.len())));
            d.push(("code".into(), script.code.join(", ")));
            d.push(("parameters".into(), script.parameters.join(", ")));
            d.push(("buffers".into(), script.buffers.join(", ")));
            d.push(("constants".into(), script.constants.to_string()));
            if !script.attributes.is_empty() {
                d.push(("other tensor attributes".into(), script.attributes.join(", ")));
            }
            d.push((
                "outside the state dict".into(),
                "attributes.* and constants.* are listed and read, and converted only with --include".into(),
            ));
        }
        if let Some(package) = &self.package {
            d.push(("torch.package".into(), format!("{} pickled resources", package.pickles.len())));
            d.push((
                "resources".into(),
                package.pickles.iter().chain(&package.resources).cloned().collect::<Vec<_>>().join(", "),
            ));
            d.push(("modules (code listed, never run)".into(), package.modules.join(", ")));
            d.push(("extern modules (not in the package)".into(), package.extern_modules.join(", ")));
            d.push(("mocked modules".into(), package.mocked_modules.join(", ")));
            d.push(("torchscript modules (as their weights)".into(), package.scripts.to_string()));
        }
        let classes = module_classes(&self.value);
        if let Some(top) = classes.first() {
            d.push(("module".into(), top.clone()));
            d.push(("module classes".into(), classes.join(", ")));
        }
        d
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        let v = self.get(name)?;
        if let Some(reason) = ckpt_tensor::value::numpy_unsupported(v) {
            return Err(Error::UnsupportedNumpy { name: name.to_owned(), reason }.into());
        }
        match v {
            Value::OpaqueTensor { kind, .. } => Err(Error::OpaqueTensor { name: name.to_owned(), kind: *kind }.into()),
            Value::Composite(c) => Err(Error::CompositeTensor { name: name.to_owned(), layout: c.layout }.into()),
            other => other.as_tensor().cloned().ok_or_else(|| Error::NoSuchTensor(name.to_owned()).into()),
        }
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        Ok(self.get(name)?.clone())
    }
}

/// The `data.pkl` of the ZIP archive in `buffer` rebuilt with the tensor records read straight from the
/// bytes (templates) and all run by the pickle machine: panics unless both give the same value or the same
/// error (the fuzz targets' oracle).
#[cfg(fuzzing)]
pub fn templates_agree(buffer: &Buffer) {
    let Ok(archive) = Archive::parse(buffer.as_bytes()) else { return };
    let Some(pkl) = archive.get("data.pkl").and_then(|rec| archive.data(buffer.as_bytes(), rec).ok()) else {
        return;
    };
    let options = ckpt_pickle::Options::default();
    let run = |templates| {
        let (r, _) = crate::rebuild::rebuild_with(
            pkl,
            &options,
            &mut ZipStorages::new(&archive, buffer),
            templates,
            read_nested,
        );
        match r {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("{e:?}"),
        }
    };
    assert_eq!(run(true), run(false), "the tensor record template and the machine rebuild differently");
}

fn read_zip(buffer: &Buffer, file: Option<&std::fs::File>, options: &ReadOptions) -> Result<TorchReader> {
    // The local headers are read on a second thread while the pickle is decoded on this one. From the file
    // the buffer maps, where there is one: positioned reads map no page (a header is a page of its own when
    // records are 10 KiB), and cost half of what mapping those pages and unmapping them do.
    let read_at = |at: u64, out: &mut [u8]| file.is_some_and(|f| f.read_exact_at(out, at).is_ok());
    // Otherwise from the buffer; a memory map then drops the pages of each batch it read, which would
    // otherwise be unmapped when the file is closed.
    let forget = |range: std::ops::Range<u64>| {
        if let (Ok(start), Ok(end)) = (usize::try_from(range.start), usize::try_from(range.end)) {
            buffer.forget_mapped_pages(start..end);
        }
    };
    let headers = if file.is_some() { HeaderSource::ReadAt(&read_at) } else { HeaderSource::Slice(&forget) };
    let (archive, decoded) = if let Some(fill) = &options.fill {
        // A partial copy: the central directory is present, the local headers of the tensors' records not.
        let archive = Archive::parse_predicted(buffer.as_bytes())?;
        let file = options.fill_file.as_deref().unwrap_or_default();
        for rec in archive.records() {
            if options.verify_crc || !rec.short_name().starts_with("data/") {
                fill_record(buffer, rec, fill.as_ref(), file)?;
            }
        }
        let decoded = decode_zip(&archive, buffer, options);
        (archive, decoded)
    } else if options.trust_layout {
        let archive = Archive::parse_predicted(buffer.as_bytes())?;
        archive.check_predicted(buffer.as_bytes(), "data.pkl")?;
        let decoded = decode_zip(&archive, buffer, options);
        (archive, decoded)
    } else {
        Archive::parse_overlapped(buffer.as_bytes(), headers, |archive| decode_zip(archive, buffer, options))?
    };
    let Decoded { value, version, script, package } = decoded?;
    let (state_dict, script) = match script {
        Some((sd, script)) => (Some(sd), Some(Box::new(script))),
        None => (module_state_dict(&value), None),
    };
    Ok(TorchReader {
        state_dict,
        script,
        package: package.map(Box::new),
        value,
        container: Container::Zip,
        prefix: Some(archive.prefix().to_owned()),
        version: Some(version),
        archive: Some(Box::new(archive)),
        records: OnceLock::new(),
        leaf_index: OnceLock::new(),
    })
}

/// What a ZIP archive holds.
struct Decoded {
    /// The saved object (a TorchScript archive's module).
    value: Value,
    /// The `version` record.
    version: u64,
    /// A TorchScript archive's state dict and what it declares.
    script: Option<(Value, crate::torchscript::Script)>,
    /// What a torch.package archive holds besides its pickles.
    package: Option<crate::package::Package>,
}

/// The saved object of a ZIP archive and its `version` record.
fn decode_zip(archive: &Archive, buffer: &Buffer, options: &ReadOptions) -> Result<Decoded> {
    let bytes = buffer.as_bytes();
    if options.verify_crc {
        for rec in archive.records() {
            archive.verify_crc(bytes, rec)?;
        }
    }
    let mut storages = ZipStorages { max_inflated: options.max_inflated_bytes, ..ZipStorages::new(archive, buffer) }
        .with_fill(options);
    let version_name = if archive.get(".data/version").is_some() { ".data/version" } else { "version" };
    let version_text = storages.record(version_name)?;
    let version_str = String::from_utf8_lossy(version_text.as_bytes()).trim_end_matches(['\n', '\r']).to_owned();
    let version = version_str
        .parse::<u64>()
        .ok()
        .filter(|v| (1..=10).contains(v))
        .ok_or(Error::BadVersion { found: version_str })?;
    if archive.get("byteorder").is_some() {
        let order = storages.record("byteorder")?;
        let order = String::from_utf8_lossy(order.as_bytes()).into_owned();
        if order != "little" {
            return Err(Error::BigEndian { found: order });
        }
    }
    if crate::package::is_package(archive) {
        let (value, package) = crate::package::read(archive, buffer, options)?;
        return Ok(Decoded { value, version, script: None, package: Some(package) });
    }
    let pkl = storages.record("data.pkl")?;
    let value = rebuild(pkl.as_bytes(), options, &mut storages, "data.pkl")?;
    if archive.get("constants.pkl").is_some() {
        // A TorchScript archive: the module's tensor constants are pickled apart, their storages under
        // `constants/`.
        let mut constants = ZipStorages { dir: "constants/", ..ZipStorages::new(archive, buffer) }.with_fill(options);
        constants.max_inflated = options.max_inflated_bytes;
        let pkl = constants.record("constants.pkl")?;
        let table = rebuild(pkl.as_bytes(), options, &mut constants, "constants.pkl")?;
        let (state_dict, script) = crate::torchscript::read(archive, bytes, &value, &table);
        return Ok(Decoded { value, version, script: Some((state_dict, script)), package: None });
    }
    Ok(Decoded { value, version, script: None, package: None })
}

/// A `torch.save` stream inside a pickle (`torch.storage._load_from_bytes`), read whole: the reader the
/// rebuilder is handed in [`ReadOptions`] (it cannot name this module, which calls it).
pub(crate) fn read_nested(buffer: &Buffer, options: &ReadOptions) -> Result<Value> {
    Ok(TorchReader::from_buffer(buffer, options)?.into_value())
}

/// Reads a `torch.save` file and returns the saved object (a convenience for [`TorchReader::open`]).
///
/// # Errors
/// As [`TorchReader::open`].
pub fn load(path: &Path) -> Result<Value> {
    TorchReader::open(path).map(TorchReader::into_value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;
    use std::sync::Arc;

    use ckpt_io::storage::RangeFill;

    use super::*;
    use ckpt_tensor::DType;

    /// `data.pkl` of `archive` rebuilt with tensor records read straight from the bytes and without: the same
    /// value (same Debug rendering: dtypes, shapes, strides, offsets, storages) or the same error. Returns
    /// whether it read.
    fn agree(buffer: &Buffer, archive: &Archive, pkl: &[u8]) -> bool {
        let options = ckpt_pickle::Options::default();
        let (fast, _) =
            crate::rebuild::rebuild_with(pkl, &options, &mut ZipStorages::new(archive, buffer), true, read_nested);
        let (slow, _) =
            crate::rebuild::rebuild_with(pkl, &options, &mut ZipStorages::new(archive, buffer), false, read_nested);
        let render = |r: &std::result::Result<Value, crate::rebuild::Failure>| match r {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("{e:?}"),
        };
        assert_eq!(render(&fast), render(&slow));
        fast.is_ok()
    }

    fn fixtures() -> Vec<Buffer> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/torch");
        let mut out = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        for p in names {
            if p.extension().is_some_and(|e| e == "pt") {
                let b = Buffer::map_file(&p).unwrap();
                if detect(b.as_bytes()).ok() == Some(Container::Zip) {
                    out.push(b);
                }
            }
        }
        out
    }

    /// A fill hook over a copy of `from` whose `data/` records are zeroed: copies each range asked for in.
    #[derive(Debug)]
    struct CopyIn {
        from: std::path::PathBuf,
        to: std::path::PathBuf,
        asked: std::sync::Mutex<Vec<(String, std::ops::Range<u64>)>>,
    }

    impl RangeFill for CopyIn {
        fn fill(&self, file: &str, range: std::ops::Range<u64>) -> std::io::Result<()> {
            self.asked.lock().unwrap().push((file.to_owned(), range.clone()));
            let bytes = std::fs::read(&self.from)?;
            let part = bytes.get(range.start as usize..range.end as usize).ok_or(std::io::ErrorKind::UnexpectedEof)?;
            std::fs::OpenOptions::new().write(true).open(&self.to)?.write_all_at(part, range.start)
        }
    }

    #[test]
    fn a_partial_copy_is_filled_storage_by_storage() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("full.pt");
        let to = dir.path().join("m.pt");
        let a = Tensor::from_slice(&(0..1000).map(|i| i as f32).collect::<Vec<_>>(), &[10, 100]).unwrap();
        let b = Tensor::from_slice(&[7u8, 8, 9], &[3]).unwrap();
        let mut d = ckpt_tensor::Dict::new(ckpt_tensor::DictKind::Dict);
        d.insert("a", Value::Tensor(a.clone()));
        d.insert("b", Value::Tensor(b.clone()));
        crate::save(&Value::Dict(d), &from, &crate::WriteOptions::default()).unwrap();
        let mut bytes = std::fs::read(&from).unwrap();
        let archive = Archive::parse(&bytes).unwrap();
        let data: Vec<crate::zip::Record> =
            archive.records().iter().filter(|r| r.short_name().starts_with("data/")).cloned().collect();
        for r in &data {
            bytes[r.local_header_offset() as usize..r.data_range().end as usize].fill(0);
        }
        std::fs::write(&to, &bytes).unwrap();
        let hook = Arc::new(CopyIn { from: from.clone(), to: to.clone(), asked: Default::default() });
        let fill: Arc<dyn RangeFill> = hook.clone();
        let reader = TorchReader::open_with(&to, &ReadOptions::default().with_fill(Some(fill))).unwrap();
        let opened = hook.asked.lock().unwrap().len();
        assert!(
            hook.asked.lock().unwrap().iter().all(|(f, r)| f == "m.pt"
                && data.iter().all(|d| r.end <= d.local_header_offset() || r.start >= d.data_range().end)),
            "opening fills no tensor record: {:?}",
            hook.asked.lock().unwrap()
        );
        assert_eq!(reader.tensor("b").unwrap(), b);
        let rb = data.iter().find(|r| r.short_name() == "data/1").unwrap();
        let asked = hook.asked.lock().unwrap()[opened..].to_vec();
        assert_eq!(
            asked,
            vec![
                ("m.pt".to_string(), rb.local_header_offset()..rb.data_range().end),
                ("m.pt".to_string(), rb.data_range())
            ]
        );
        assert_eq!(reader.tensor("a").unwrap(), a);
        assert_eq!(std::fs::read(&to).unwrap(), std::fs::read(&from).unwrap());
        // A local header that puts the data elsewhere than predicted is an error, never wrong bytes.
        let mut moved = std::fs::read(&from).unwrap();
        let lh = rb.local_header_offset() as usize;
        moved[lh + 28] = moved[lh + 28].wrapping_add(4); // the local extra field's length
        std::fs::write(&from, &moved).unwrap();
        for r in &data {
            bytes[r.local_header_offset() as usize..r.data_range().end as usize].fill(0);
        }
        std::fs::write(&to, &bytes).unwrap();
        let fill: Arc<dyn RangeFill> = Arc::new(CopyIn { from, to: to.clone(), asked: Default::default() });
        let reader = TorchReader::open_with(&to, &ReadOptions::default().with_fill(Some(fill))).unwrap();
        let e = reader.tensor("b").unwrap().to_vec::<u8>().unwrap_err();
        assert!(e.to_string().contains("not where torch's writer puts it"), "{e}");
    }

    #[test]
    fn entries_name_leaves_like_core_and_lookups_find_them() {
        use ckpt_tensor::{Dict, DictKind, leaves};
        let t = Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap());
        let mut inner = Dict::new(DictKind::OrderedDict);
        inner.insert(Value::Int(3), t.clone());
        inner.insert("", Value::List(vec![]));
        inner.insert("x.y", Value::Tuple(vec![Value::Bool(true), t.clone()]));
        let mut root = Dict::new(DictKind::Dict);
        root.insert("model", Value::Dict(inner));
        root.insert("empty", Value::Dict(Dict::new(DictKind::Dict)));
        root.insert(Value::Tuple(vec![Value::Int(1), Value::Str("a".into())]), Value::Int(7));
        root.insert("model", Value::Int(9)); // a duplicate name: the first wins
        let root = Value::Dict(root);
        let core: Vec<(String, Value)> = leaves(&root).unwrap().into_iter().map(|e| (e.key, e.value.clone())).collect();
        let f = TorchReader {
            value: root,
            container: Container::Zip,
            prefix: None,
            version: None,
            archive: None,
            records: OnceLock::new(),
            state_dict: None,
            script: None,
            package: None,
            leaf_index: OnceLock::new(),
        };
        let names: Vec<String> = f.entries().into_iter().map(|e| e.name).collect();
        assert_eq!(names, core.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>());
        for (k, v) in &core {
            if k != "model" {
                assert_eq!(f.get(k).unwrap(), v, "{k}");
            }
        }
        assert_eq!(f.get("model.3").unwrap().as_tensor().unwrap().shape(), &[2]);
        assert!(matches!(f.get("nope"), Err(Error::NoSuchEntry(_))));
        let bad = TorchReader {
            value: Value::Dict(Dict {
                kind: DictKind::Dict,
                items: vec![(Value::List(vec![]), Value::Int(1))],
                attrs: None,
            }),
            ..f.clone()
        };
        assert!(bad.get("x").is_err());
        assert!(bad.entries().is_empty());
    }

    /// Dicts with a repeated key (a fuzzer finding, `tests/fuzz_regressions.rs`): the last value, in the first
    /// position, with and without tensor records read from the bytes.
    #[test]
    fn a_repeated_dict_key_keeps_the_last_value() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/duplicate_key.pt");
        let b = Buffer::map_file(&path).unwrap();
        let archive = Archive::parse(b.as_bytes()).unwrap();
        let rec = archive.get("data.pkl").unwrap();
        let pkl = archive.data(b.as_bytes(), rec).unwrap().to_vec();
        assert!(agree(&b, &archive, &pkl));
        let v = TorchReader::from_buffer(&b, &ReadOptions::default()).unwrap().into_value();
        let Value::Dict(d) = v else { panic!("{v:?}") };
        let keys: Vec<&str> = d.items.iter().filter_map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["w", "n"]);
        assert_eq!(d.items[0].1.as_tensor().unwrap().shape(), [3]);
    }

    #[test]
    fn every_fixture_reads_alike_with_and_without_templates() {
        let fixtures = fixtures();
        assert!(fixtures.len() >= 15, "{}", fixtures.len());
        for b in &fixtures {
            let archive = Archive::parse(b.as_bytes()).unwrap();
            let Some(rec) = archive.get("data.pkl") else { continue };
            let pkl = archive.data(b.as_bytes(), rec).unwrap().to_vec();
            assert!(agree(b, &archive, &pkl));
        }
    }

    /// numpy values and whole modules: the reader's value is the rebuilt pickle with numpy lifted, and reads
    /// alike with and without templates.
    #[test]
    fn numpy_values_and_modules_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/values");
        let mut numpy_values = 0;
        for name in ["numpy.pt", "numpy_unsupported.pt", "module_whole.pt", "lightning.ckpt"] {
            let b = Buffer::map_file(&dir.join(name)).unwrap();
            let archive = Archive::parse(b.as_bytes()).unwrap();
            let pkl = archive.data(b.as_bytes(), archive.get("data.pkl").unwrap()).unwrap().to_vec();
            assert!(agree(&b, &archive, &pkl), "{name}");
            let reader = TorchReader::from_buffer(&b, &ReadOptions::default()).unwrap();
            if let Value::Dict(d) = reader.value() {
                numpy_values += d.items.iter().filter(|(_, v)| matches!(v, Value::Numpy(_))).count();
            }
            if name == "module_whole.pt" {
                assert!(reader.module_state_dict().is_some());
            }
        }
        // numpy.pt: 7 scalars, 4 arrays; numpy_unsupported.pt: 1 scalar (its two arrays stay objects).
        assert_eq!(numpy_values, 12);
    }

    /// A legacy stream whose protocol-version pickle is a memo bomb (tuples of one tuple, copied thrice at
    /// each of 40 levels; fuzz/artifacts/torch_legacy/oom-7481bec6...): refused at the header's small limit in
    /// a moment, instead of built to the general limit (33 million nodes) and printed whole in the error.
    #[test]
    fn a_memo_bomb_in_a_legacy_header_is_refused_at_once() {
        let mut bytes = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e".to_vec();
        bytes.extend_from_slice(b"\x80\x02K\x01");
        for _ in 0..40 {
            bytes.extend_from_slice(b"22\x87");
        }
        bytes.push(b'.');
        let e = TorchReader::from_buffer(&Buffer::from_vec(bytes), &ReadOptions::default()).unwrap_err();
        assert!(e.to_string().contains("protocol version") && e.to_string().contains("exceeds 4096"), "{e}");
        assert!(e.to_string().len() < 300, "{e}");
    }

    /// A tuple holding an object, fetched from the memo twice (`t = (Thing(),)` in `{"a": t, "b": t}`): the
    /// tuple is a copy at both places, the object inside one shared object, as `torch.load` makes it.
    #[test]
    fn an_object_inside_a_tuple_fetched_twice_is_one_object() {
        // {'a': (some.module.Thing(),) memoized as 0, 'b': memo 0}
        let mut pkl = b"\x80\x02}(X\x01\x00\x00\x00acsome.module\nThing\n)R\x85q\x00".to_vec();
        pkl.extend_from_slice(b"X\x01\x00\x00\x00bh\x00u.");
        let buffer = archive_of(&[("data.pkl", &pkl), ("version", b"3\n")]);
        let archive = Archive::parse(buffer.as_bytes()).unwrap();
        assert!(agree(&buffer, &archive, &pkl));
        let reader = TorchReader::from_buffer(&buffer, &ReadOptions::default()).unwrap();
        let Value::Dict(d) = reader.value() else { panic!("{:?}", reader.value()) };
        let items: Vec<&Value> = d.items.iter().map(|(_, v)| v).collect();
        assert!(matches!(items[0], Value::Tuple(t) if matches!(t[0], Value::Shared { id: 0, .. })), "{items:?}");
        assert!(matches!(items[1], Value::Tuple(t) if t[0] == Value::Ref(0)), "{items:?}");
    }

    /// An object given its state twice (CPython never writes it; `__dict__.update` twice) beside a numpy
    /// value: the states merge, and the numpy value reads.
    #[test]
    fn an_object_built_twice_merges_its_states() {
        use ckpt_pickle::Pickler;
        let mut p = Pickler::new(Vec::new(), 2).unwrap();
        // {'acc': numpy.float64(0.5), 'o': <an object given its state twice>}
        p.empty_dict().unwrap();
        p.mark().unwrap();
        p.str("acc").unwrap();
        p.global("numpy._core.multiarray", "scalar").unwrap();
        p.global("numpy", "dtype").unwrap();
        p.str("f8").unwrap();
        p.bool(false).unwrap();
        p.bool(true).unwrap();
        p.tuple(3).unwrap();
        p.reduce().unwrap();
        p.begin_tuple(8).unwrap();
        p.int(3).unwrap();
        p.str("<").unwrap();
        p.none().unwrap();
        p.none().unwrap();
        p.none().unwrap();
        p.int(-1).unwrap();
        p.int(-1).unwrap();
        p.int(0).unwrap();
        p.tuple(8).unwrap();
        p.build().unwrap();
        p.bytes(&0.5f64.to_le_bytes()).unwrap();
        p.tuple(2).unwrap();
        p.reduce().unwrap();
        p.str("o").unwrap();
        p.global("some.module", "Thing").unwrap();
        p.empty_tuple().unwrap();
        p.reduce().unwrap();
        p.empty_dict().unwrap();
        p.str("a").unwrap();
        p.int(1).unwrap();
        p.setitem().unwrap();
        p.build().unwrap();
        p.empty_dict().unwrap();
        p.str("b").unwrap();
        p.int(2).unwrap();
        p.setitem().unwrap();
        p.build().unwrap();
        p.setitems().unwrap();
        let pkl = p.finish().unwrap();
        let buffer = archive_of(&[("data.pkl", &pkl), ("version", b"3\n")]);
        let reader = TorchReader::from_buffer(&buffer, &ReadOptions::default()).unwrap();
        let Value::Numpy(n) = reader.get("acc").unwrap() else { panic!("{:?}", reader.value()) };
        assert_eq!((n.dtype, &n.value, n.module.as_str()), (DType::F64, &Value::Float(0.5), "numpy._core.multiarray"));
        let Value::Dict(d) = reader.value() else { panic!() };
        let Some(Value::Object(o)) = d.get("o") else { panic!("{:?}", reader.value()) };
        let Some(Value::Dict(state)) = &o.state else { panic!("{o:?}") };
        assert_eq!(state.items, [(Value::from("a"), Value::Int(1)), (Value::from("b"), Value::Int(2))]);
    }

    /// A torch ZIP archive (prefix `archive`, 64-byte aligned) of these records.
    fn archive_of(records: &[(&str, &[u8])]) -> Buffer {
        let mut zip = crate::zip::ZipWriter::with_options(
            Vec::new(),
            "archive",
            crate::zip::WriterOptions { alignment: 64, compute_crc32: true },
        );
        for (name, data) in records {
            zip.write_record(name, data).unwrap();
        }
        Buffer::from_vec(zip.finish().unwrap())
    }

    /// A pickle of `{'t': <tensor call>, 'p': _rebuild_parameter(<tensor call>, True, OrderedDict())}` over one
    /// 16-byte float storage, where `then` may add to the pickle right after the first tensor's call (before
    /// the dict's items are set).
    fn tensor_pickle(then: impl FnOnce(&mut ckpt_pickle::Pickler<Vec<u8>>)) -> (Buffer, Vec<u8>) {
        use ckpt_pickle::Pickler;
        let tensor = |p: &mut Pickler<Vec<u8>>| {
            p.global("torch._utils", "_rebuild_tensor_v2").unwrap();
            p.mark().unwrap();
            p.mark().unwrap();
            p.str("storage").unwrap();
            p.global("torch", "FloatStorage").unwrap();
            p.str("0").unwrap();
            p.str("cpu").unwrap();
            p.int(4).unwrap();
            p.tuple(5).unwrap();
            p.binpersid().unwrap();
            p.int(0).unwrap();
            p.int(2).unwrap();
            p.int(2).unwrap();
            p.tuple(2).unwrap();
            p.int(2).unwrap();
            p.int(1).unwrap();
            p.tuple(2).unwrap();
            p.bool(false).unwrap();
            p.global("collections", "OrderedDict").unwrap();
            p.empty_tuple().unwrap();
            p.reduce().unwrap();
            p.tuple(6).unwrap();
            p.reduce().unwrap();
        };
        let mut p = Pickler::new(Vec::new(), 2).unwrap();
        p.empty_dict().unwrap();
        p.mark().unwrap();
        p.str("t").unwrap();
        tensor(&mut p);
        then(&mut p);
        p.str("p").unwrap();
        p.global("torch._utils", "_rebuild_parameter").unwrap();
        tensor(&mut p);
        p.bool(true).unwrap();
        p.global("collections", "OrderedDict").unwrap();
        p.empty_tuple().unwrap();
        p.reduce().unwrap();
        p.tuple(3).unwrap();
        p.reduce().unwrap();
        p.setitems().unwrap();
        let pkl = p.finish().unwrap();
        (archive_of(&[("data.pkl", &pkl), ("data/0", &[0u8; 16]), ("version", b"3\n")]), pkl)
    }

    /// Tensor rebuilds run as soon as their call is read: a parameter takes the finished tensor, and a state
    /// set on a rebuilt tensor (`Tensor.__setstate__`) gives the tensor with that state.
    #[test]
    fn tensors_rebuilt_at_their_reduce_take_a_later_state() {
        let (buffer, pkl) = tensor_pickle(|_| {});
        let archive = Archive::parse(buffer.as_bytes()).unwrap();
        assert!(agree(&buffer, &archive, &pkl));
        let reader = TorchReader::from_buffer(&buffer, &ReadOptions::default()).unwrap();
        assert!(matches!(reader.get("t").unwrap(), Value::Tensor(t) if t.shape() == [2, 2]));
        assert!(matches!(reader.get("p").unwrap(), Value::Parameter { tensor, .. } if tensor.requires_grad()));

        let (buffer, pkl) = tensor_pickle(|p| {
            p.empty_dict().unwrap();
            p.str("note").unwrap();
            p.int(1).unwrap();
            p.setitem().unwrap();
            p.build().unwrap();
        });
        let archive = Archive::parse(buffer.as_bytes()).unwrap();
        assert!(agree(&buffer, &archive, &pkl));
        let reader = TorchReader::from_buffer(&buffer, &ReadOptions::default()).unwrap();
        let Value::TensorWithState { tensor, state, .. } = reader.get("t").unwrap() else {
            panic!("{:?}", reader.value())
        };
        assert!(matches!(&**tensor, Value::Tensor(t) if t.shape() == [2, 2]));
        assert!(matches!(&**state, Value::Dict(d) if d.get("note") == Some(&Value::Int(1))));
        assert!(matches!(reader.get("p").unwrap(), Value::Parameter { .. }));
    }

    #[test]
    fn mutated_pickles_read_alike_with_and_without_templates() {
        let mut state = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let mut fixtures = fixtures();
        fixtures.push(many_tensors(60));
        let (mut read, mut failed) = (0, 0);
        for _ in 0..4000 {
            let b = &fixtures[next() as usize % fixtures.len()];
            let archive = Archive::parse(b.as_bytes()).unwrap();
            let Some(rec) = archive.get("data.pkl") else { continue };
            let mut pkl = archive.data(b.as_bytes(), rec).unwrap().to_vec();
            for _ in 0..=(next() % 2) {
                let at = next() as usize % pkl.len();
                match next() % 3 {
                    0 => pkl[at] = next() as u8,
                    1 => pkl[at] ^= 1 << (next() % 8),
                    _ => {
                        pkl.remove(at);
                    }
                }
            }
            if agree(b, &archive, &pkl) {
                read += 1;
            } else {
                failed += 1;
            }
        }
        assert!(read > 100 && failed > 100, "{read} read, {failed} failed");
    }

    /// A state dict written by ckpt's writer (torch's layout): `n` tensors of every rank from 0 to 9, with
    /// offsets into shared storages, `requires_grad` on some, float and integer dtypes, parameters and nested
    /// dicts among them, and sizes and strides that need 4-byte ints.
    fn many_tensors(n: usize) -> Buffer {
        use ckpt_tensor::{Dict, DictKind};
        let mut sd = Dict::new(DictKind::OrderedDict);
        let f32s = ckpt_tensor::Buffer::copy_from(&[7u8; 4 * 4096]).unwrap();
        let i64s = ckpt_tensor::Buffer::copy_from(&[3u8; 8 * 512]).unwrap();
        for i in 0..n {
            let rank = i % 10;
            let shape: Vec<usize> = (0..rank).map(|d| 1 + (i + d) % 3).collect();
            let numel: usize = shape.iter().product();
            let (dtype, storage, cap) =
                if i % 3 == 0 { (DType::I64, i64s.clone(), 512) } else { (DType::F32, f32s.clone(), 4096) };
            let offset = (i * 13) % (cap - numel);
            let strides = ckpt_tensor::tensor::contiguous_strides(&shape);
            let t =
                Tensor::from_parts(dtype, &shape, &strides, offset, storage).unwrap().with_requires_grad(i % 4 == 1);
            let v = if i % 17 == 5 {
                Value::Parameter { tensor: t, state: None }
            } else if i % 23 == 7 {
                let mut inner = Dict::new(DictKind::Dict);
                inner.insert("w", Value::Tensor(t));
                Value::Dict(inner)
            } else {
                Value::Tensor(t)
            };
            sd.insert(format!("layers.{i}.w"), v);
        }
        // A tensor of more than 65535 elements (4-byte int sizes), and a view of it with a larger stride.
        let big = ckpt_tensor::Buffer::copy_from(&vec![1u8; 140_000]).unwrap();
        sd.insert("big", Value::Tensor(Tensor::from_parts(DType::U8, &[70_000], &[1], 0, big.clone()).unwrap()));
        sd.insert("wide", Value::Tensor(Tensor::from_parts(DType::U8, &[2, 3], &[66_000, 1], 7, big).unwrap()));
        let bytes =
            crate::save_to_writer(&Value::Dict(sd), Vec::new(), "archive", &crate::WriteOptions::default()).unwrap();
        Buffer::from_vec(bytes)
    }

    /// `data.pkl` of an archive, and the archive.
    fn pickle_of(b: &Buffer) -> (Archive, Vec<u8>) {
        let archive = Archive::parse(b.as_bytes()).unwrap();
        let pkl = archive.data(b.as_bytes(), archive.get("data.pkl").unwrap()).unwrap().to_vec();
        (archive, pkl)
    }

    /// `data.pkl` rebuilt with and without tensor records read straight from the bytes: the value (Debug
    /// rendering: dtypes, shapes, strides, offsets, storages), or `None` for an error; and how many records
    /// were read that way.
    fn both_ways(
        b: &Buffer,
        archive: &Archive,
        pkl: &[u8],
        limits: &ckpt_pickle::Limits,
    ) -> (Option<String>, Option<String>, usize) {
        let options = ckpt_pickle::Options::from(*limits);
        let mut storages = ZipStorages::new(archive, b);
        let (fast, read) = crate::rebuild::rebuild_with(pkl, &options, &mut storages, true, read_nested);
        let mut storages = ZipStorages::new(archive, b);
        let (slow, none) = crate::rebuild::rebuild_with(pkl, &options, &mut storages, false, read_nested);
        assert_eq!(none, 0);
        (fast.ok().map(|v| format!("{v:?}")), slow.ok().map(|v| format!("{v:?}")), read)
    }

    #[test]
    fn tensor_records_read_from_the_bytes_build_what_the_vm_builds() {
        let limits = ckpt_pickle::Limits::default();
        let mut read_total = 0;
        let mut files = fixtures();
        files.push(many_tensors(700));
        for b in &files {
            let (archive, pkl) = pickle_of(b);
            let (fast, slow, read) = both_ways(b, &archive, &pkl, &limits);
            assert!(fast.is_some(), "failed");
            assert_eq!(fast, slow);
            read_total += read;
        }
        // Every tensor record after the first of its kind, in the generated file (the other records are the
        // first tensor, whose globals are new, and the parameter's and nested ones, read the same way).
        assert!(read_total > 600, "{read_total} records read from the bytes");
        let reader = TorchReader::from_buffer(files.last().unwrap(), &ReadOptions::default()).unwrap();
        assert!(matches!(reader.get("layers.1.w").unwrap(), Value::Tensor(t) if t.requires_grad()));
        assert!(matches!(reader.get("big").unwrap(), Value::Tensor(t) if t.shape() == [70_000]));
    }

    /// A file opened by path reads its local headers from the file (positioned reads), one read from a
    /// buffer from the map: the same value (tensor windows at the same offsets of the same map), the same
    /// records, the same error. Also where a local header moves its record's data (not torch's layout), and
    /// where one is broken.
    #[test]
    fn a_file_opened_by_path_reads_its_local_headers_as_a_buffer_does() {
        // 700 tensors of their own storages (700 records, and more than the 512 of a second thread).
        let mut sd = ckpt_tensor::Dict::new(ckpt_tensor::DictKind::OrderedDict);
        for i in 0..700usize {
            let bytes: Vec<u8> = (0..4 * (1 + i % 37)).map(|j| (i * 31 + j) as u8).collect();
            let storage = Buffer::copy_from(&bytes).unwrap();
            sd.insert(
                format!("t.{i}"),
                Value::Tensor(Tensor::from_buffer(DType::F32, &[1 + i % 37], storage).unwrap()),
            );
        }
        let good =
            crate::save_to_writer(&Value::Dict(sd), Vec::new(), "archive", &crate::WriteOptions::default()).unwrap();
        let archive = Archive::parse(&good).unwrap();
        // A storage whose `FB` padding has at least 8 bytes: 4 bytes less of it puts its data 4 bytes earlier.
        let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        let rec = archive
            .records()
            .iter()
            .find(|r| r.short_name().starts_with("data/") && u16_at(&good, r.local_header_offset() as usize + 28) >= 8)
            .unwrap();
        let lho = rec.local_header_offset() as usize;
        let mut moved = good.clone();
        moved[lho + 28..lho + 30].copy_from_slice(&(u16_at(&good, lho + 28) - 4).to_le_bytes());
        let mut broken = good.clone();
        broken[archive.get("data/500").unwrap().local_header_offset() as usize] ^= 0xFF;
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("good", &good), ("moved", &moved), ("broken", &broken)] {
            let path = dir.path().join(format!("{name}.pt"));
            std::fs::write(&path, bytes).unwrap();
            let by_path = TorchReader::open(&path);
            let by_buffer = TorchReader::from_buffer(&Buffer::map_file(&path).unwrap(), &ReadOptions::default());
            match (by_path, by_buffer) {
                (Ok(a), Ok(b)) => {
                    assert_ne!(name, "broken");
                    assert_eq!(format!("{:?}", a.value()), format!("{:?}", b.value()), "{name}");
                    assert_eq!(a.records(), b.records());
                    // and data.pkl, .format_version, .storage_alignment, byteorder, version, .data/serialization_id
                    assert_eq!(a.records().len(), 700 + 6);
                }
                (Err(e), Err(f)) => {
                    assert_eq!(name, "broken");
                    assert_eq!(e.to_string(), f.at(&path).to_string());
                }
                (a, b) => panic!("{name}: by path {:?}, by buffer {:?}", a.err(), b.err()),
            }
        }
        // The moved record's tensor reads its bytes from where its header says.
        let good_reader = TorchReader::from_buffer(&Buffer::from_vec(good), &ReadOptions::default()).unwrap();
        let moved_reader = TorchReader::open(dir.path().join("moved.pt")).unwrap();
        let (mut same, mut other) = (0, 0);
        for e in good_reader.entries() {
            let (a, b) = (good_reader.tensor(&e.name).unwrap(), moved_reader.tensor(&e.name).unwrap());
            if a.bitwise_eq(&b) { same += 1 } else { other += 1 }
        }
        assert!(same > 0 && other > 0, "{same} tensors read the same, {other} others");
    }

    /// Every limit of the pickle machine, at and around the smallest value the machine accepts the file at:
    /// with tensor records read from the bytes it accepts exactly when it does without, and builds the same
    /// value.
    #[test]
    fn tensor_records_read_from_the_bytes_count_every_limit_as_the_vm() {
        use ckpt_pickle::Limits;
        type Field = fn(&mut Limits) -> &mut usize;
        let fields: [(&str, Field); 7] = [
            ("max_depth", |l| &mut l.max_depth),
            ("max_mark_depth", |l| &mut l.max_mark_depth),
            ("max_memo", |l| &mut l.max_memo),
            ("max_container_len", |l| &mut l.max_container_len),
            ("max_nodes", |l| &mut l.max_nodes),
            ("max_alloc_bytes", |l| &mut l.max_alloc_bytes),
            ("max_int_digits", |l| &mut l.max_int_digits),
        ];
        let mut files: Vec<Buffer> = fixtures()
            .into_iter()
            .filter(|b| {
                let (archive, pkl) = pickle_of(b);
                both_ways(b, &archive, &pkl, &Limits::default()).2 > 0
            })
            .collect();
        assert!(files.len() >= 3, "{} fixtures with tensor records read from the bytes", files.len());
        files.push(many_tensors(120));
        let mut checked = 0;
        for b in &files {
            let (archive, pkl) = pickle_of(b);
            for (name, field) in fields {
                let accepts = |v: usize| {
                    let mut l = Limits::default();
                    *field(&mut l) = v;
                    let (fast, slow, _) = both_ways(b, &archive, &pkl, &l);
                    assert_eq!(fast, slow, "{name} = {v}");
                    slow.is_some()
                };
                // The smallest value the VM accepts (acceptance grows with every limit).
                let (mut lo, mut hi) = (0usize, *field(&mut Limits::default()));
                if !accepts(hi) {
                    continue;
                }
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if accepts(mid) { hi = mid } else { lo = mid + 1 }
                }
                for v in lo.saturating_sub(3)..=lo + 3 {
                    accepts(v);
                }
                checked += 1;
            }
        }
        assert!(checked >= 20, "{checked}");
    }
}
