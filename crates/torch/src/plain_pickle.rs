//! Plain pickles of objects holding tensors (`pickle.dump(obj)`, any protocol): not a `torch.save` stream,
//! one pickle whose tensors carry their own storages. Each tensor reduces to
//! `torch._utils._rebuild_tensor_v2(storage, ...)` whose storage reduces to
//! `torch.storage._load_from_bytes(b"...")`: the bytes of a whole `torch.save` stream (legacy, or ZIP) of the
//! storage alone, read by this crate's reader (the rebuild rule in `rebuild.rs`). Nothing is imported or run.

use ckpt_tensor::{Buffer, DType, Value};

use crate::error::{Error, Result};
use crate::read::ReadOptions;
use crate::rebuild::{StorageSource, rebuild};

/// A plain pickle has no storage records: a persistent id in it is not something `pickle.load` reads.
struct NoStorages;

impl StorageSource for NoStorages {
    fn storage(&mut self, _dtype: DType, key: &str, _numel: i64) -> Result<Buffer> {
        Err(Error::PersistentIdInPickle { key: key.to_owned() })
    }
}

/// Reads the first pickle of `buffer`, as `pickle.load` would without running anything.
pub(crate) fn read(buffer: &Buffer, options: &ReadOptions) -> Result<Value> {
    rebuild(buffer.as_bytes(), options, &mut NoStorages, "pickle")
}
