//! torch.package archives (`torch.package.PackageExporter`): a ZIP of pickled resources under package paths
//! (`models/model.pkl`), the modules' source (`package_classes.py`, `tqdm/__init__.py` for a mocked
//! module), `.data/extern_modules` (the modules left to the importing environment), the storages of every
//! pickle as `.data/<key>.storage`, and the TorchScript modules the pickles hold under `.data/ts_code/<id>/`
//! (their code under `.data/ts_code/code/`).
//!
//! Read as one mapping of resource path to what its pickle holds, so that each tensor is the entry
//! `<resource path>.<attribute path>` and an `nn.Module` lists as its `state_dict()` names; a TorchScript
//! module held by a pickle (`('reduce_package', id, unpackage_script_module, (id,))`) is its weights. The
//! code is listed, never imported or run; a pickle naming a module the package neither holds nor externs
//! is refused, as `PackageImporter` refuses it.

use ckpt_tensor::{Buffer, DType, Dict, DictKind, Value};

use crate::error::{Error, Result};
use crate::read_options::ReadOptions;
use crate::rebuild::{StorageSource, rebuild};
use crate::zip::Archive;
use crate::zip_storages::ZipStorages;

/// What a torch.package archive holds besides its tensors ([`crate::TorchReader::package`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Package {
    /// The pickled resources (`models/model.pkl`), each its entries' prefix, in archive order.
    pub pickles: Vec<String>,
    /// The other resources (`save_text`, `save_binary`), listed.
    pub resources: Vec<String>,
    /// The modules whose source the package holds (`package_classes`): listed, never run.
    pub modules: Vec<String>,
    /// The modules the package leaves to the environment that imports it (`.data/extern_modules`).
    pub extern_modules: Vec<String>,
    /// The modules the package replaces by stubs (`PackageExporter.mock`).
    pub mocked_modules: Vec<String>,
    /// How many TorchScript modules its pickles hold.
    pub scripts: usize,
}

/// The record every torch.package archive has (and `torch.save` archives have not).
pub const EXTERN_MODULES: &str = ".data/extern_modules";

/// The modules `PackageImporter` imports from the environment without their being extern
/// (`IMPLICIT_IMPORT_ALLOWLIST`).
const IMPLICIT_IMPORTS: [&str; 4] = ["numpy", "numpy.core", "numpy.core._multiarray_umath", "builtins"];

/// The most bytes of a module's source read to tell a mocked module (its stub starts with
/// `from _mock import`).
const MOCK_HEAD: usize = 64;

/// Whether `archive` is a torch.package archive: it has `.data/extern_modules` and no `data.pkl`.
pub fn is_package(archive: &Archive) -> bool {
    archive.get(EXTERN_MODULES).is_some() && archive.get("data.pkl").is_none()
}

/// Whether the file at `path` is a torch.package archive ([`is_package`]), from its central directory; `false`
/// for a file that cannot be read or is no ZIP archive.
pub fn is_package_file(path: impl AsRef<std::path::Path>) -> bool {
    let Ok(buffer) = Buffer::map_file(path.as_ref()) else { return false };
    Archive::parse_predicted(buffer.as_bytes()).is_ok_and(|a| is_package(&a))
}

/// Reads the package in `archive` (of `buffer`): every pickled resource rebuilt, by path.
pub(crate) fn read(archive: &Archive, buffer: &Buffer, options: &ReadOptions) -> Result<(Value, Package)> {
    let records = ZipStorages::in_dir(archive, buffer, ".data/", options);
    let externs = records.record(EXTERN_MODULES)?;
    let mut package = Package {
        extern_modules: String::from_utf8_lossy(externs.as_bytes())
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
        ..Package::default()
    };
    for rec in archive.records() {
        let name = rec.short_name();
        if name.starts_with(".data/") || name == "byteorder" || name == "_mock.py" {
            continue;
        }
        if let Some(path) = name.strip_suffix(".py") {
            let module = path.strip_suffix("/__init__").unwrap_or(path).replace('/', ".");
            let source = records.record(name)?;
            let head = source.as_bytes().get(..source.len().min(MOCK_HEAD)).unwrap_or_default();
            if head.starts_with(b"from _mock import") {
                package.mocked_modules.push(module);
            } else {
                package.modules.push(module);
            }
            continue;
        }
        let data = records.record(name)?;
        if crate::detect::looks_like_pickle(data.as_bytes().get(..data.len().min(64)).unwrap_or_default()) {
            package.pickles.push(name.to_owned());
        } else {
            package.resources.push(name.to_owned());
        }
    }
    let mut root = Dict::new(DictKind::Dict);
    for name in package.pickles.clone() {
        let at = |source: Error| Error::PackageResource { resource: name.clone(), source: Box::new(source) };
        let pkl = records.record(&name)?;
        let mut storages = PackageStorages {
            storages: ZipStorages::in_dir(archive, buffer, ".data/", options),
            scripts: Some(Scripts { archive, buffer, options, read: 0 }),
        };
        let value = rebuild(pkl.as_bytes(), options, &mut storages, "package resource").map_err(at)?;
        package.scripts += storages.scripts.map_or(0, |s| s.read);
        if let Some(module) = missing_module(&value, &package) {
            return Err(Error::PackageMissingModule {
                resource: name,
                module,
                extern_modules: package.extern_modules.join(", "),
            });
        }
        root.insert(name, value);
    }
    Ok((Value::Dict(root), package))
}

/// The first module a rebuilt pickle names (a class, a function) that `package` neither holds, mocks nor
/// externs, and `PackageImporter` would not import.
fn missing_module(value: &Value, package: &Package) -> Option<String> {
    let held = |module: &str| {
        let prefixes = module.match_indices('.').map(|(i, _)| &module[..i]).chain([module]);
        IMPLICIT_IMPORTS.contains(&module)
            || package.modules.iter().any(|m| m == module)
            || prefixes.clone().any(|p| package.extern_modules.iter().chain(&package.mocked_modules).any(|m| m == p))
    };
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        if let Value::Global { module, .. } = v {
            if !held(module) {
                return Some(module.clone());
            }
        }
        v.children_into(&mut stack);
    }
    None
}

/// The TorchScript modules a package's pickles hold, read from the archive.
struct Scripts<'a> {
    archive: &'a Archive,
    buffer: &'a Buffer,
    options: &'a ReadOptions,
    /// How many were read.
    read: usize,
}

/// The storages of a package's pickles: `.data/<key>.storage` (a TorchScript module's own pickles name
/// theirs with the suffix); and, for the package's own pickles, the TorchScript modules they hold.
struct PackageStorages<'a> {
    storages: ZipStorages<'a>,
    scripts: Option<Scripts<'a>>,
}

impl StorageSource for PackageStorages<'_> {
    fn storage(&mut self, dtype: DType, key: &str, numel: i64) -> Result<Buffer> {
        if key.ends_with(".storage") {
            self.storages.storage(dtype, key, numel)
        } else {
            self.storages.storage(dtype, &format!("{key}.storage"), numel)
        }
    }

    /// `torch.jit._script.unpackage_script_module(importer, id)`: the TorchScript module of
    /// `.data/ts_code/<id>/`, as its weights.
    fn reduce_package(&mut self, function: (&str, &str), args: &Value) -> Option<Result<Value>> {
        if function != ("torch.jit._script", "unpackage_script_module") {
            return None;
        }
        let scripts = self.scripts.as_mut()?;
        let id = match args {
            Value::Tuple(items) => match items.as_slice() {
                [Value::Str(id)] if !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()) => id,
                _ => return Some(Err(Error::BadPersistentId(format!("unpackage_script_module({args:?})")))),
            },
            _ => return Some(Err(Error::BadPersistentId("unpackage_script_module without its id".into()))),
        };
        let weights = scripts.weights(id);
        if weights.is_ok() {
            scripts.read += 1;
        }
        Some(weights)
    }
}

impl Scripts<'_> {
    /// The weights (parameters and buffers, by `state_dict()` name) of the TorchScript module `id`.
    fn weights(&self, id: &str) -> Result<Value> {
        let dir = format!(".data/ts_code/{id}/");
        let mut storages = PackageStorages {
            storages: ZipStorages::in_dir(self.archive, self.buffer, ".data/", self.options),
            scripts: None,
        };
        let pkl = storages.storages.record(&format!("{dir}data.pkl"))?;
        let module = rebuild(pkl.as_bytes(), self.options, &mut storages, "TorchScript data.pkl")?;
        let constants = match self.archive.get(&format!("{dir}constants.pkl")) {
            Some(_) => {
                let pkl = storages.storages.record(&format!("{dir}constants.pkl"))?;
                rebuild(pkl.as_bytes(), self.options, &mut storages, "TorchScript constants.pkl")?
            }
            None => Value::Tuple(Vec::new()),
        };
        let (state_dict, _) = crate::torchscript::read_in(
            self.archive,
            self.buffer.as_bytes(),
            ".data/ts_code/code/",
            &module,
            &constants,
        );
        let Value::Dict(mut weights) = state_dict else { return Ok(state_dict) };
        weights.items.retain(|(k, _)| !k.as_str().is_some_and(crate::torchscript::Script::is_extra));
        Ok(Value::Dict(weights))
    }
}
