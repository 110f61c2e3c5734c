//! Plain pickles of objects holding tensors (`pickle.dump(obj)`, any protocol): not a `torch.save` stream,
//! one pickle whose tensors carry their own storages. Each tensor reduces to
//! `torch._utils._rebuild_tensor_v2(storage, ...)` whose storage reduces to
//! `torch.storage._load_from_bytes(b"...")`: the bytes of a whole `torch.save` stream (legacy, or ZIP) of the
//! storage alone, read by this crate's reader (the rebuild rule in `rebuild.rs`). Nothing is imported or run.

use ckpt_tensor::{Buffer, DType, Value};

use crate::error::{Error, Result};
use crate::read_options::ReadOptions;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use ckpt_pickle::Pickler;

    use super::*;

    fn pickle(protocol: u8, f: impl FnOnce(&mut Pickler<Vec<u8>>)) -> Vec<u8> {
        let mut p = Pickler::new(Vec::new(), protocol).unwrap();
        f(&mut p);
        p.finish().unwrap()
    }

    /// A legacy `torch.save` stream whose object pickle is `object`, without storages.
    fn legacy(object: &[u8]) -> Vec<u8> {
        let magic = [0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19];
        let mut out = pickle(2, |p| p.big_int(&magic).unwrap());
        out.extend(pickle(2, |p| p.int(1001).unwrap()));
        out.extend(pickle(2, |p| p.empty_dict().unwrap()));
        out.extend_from_slice(object);
        out.extend(pickle(2, |p| p.empty_list().unwrap()));
        out
    }

    /// `torch.storage._load_from_bytes(inner)`, pickled.
    fn load_from_bytes(inner: &[u8]) -> Vec<u8> {
        pickle(3, |p| {
            p.global("torch.storage", "_load_from_bytes").unwrap();
            p.bytes(inner).unwrap();
            p.tuple(1).unwrap();
            p.reduce().unwrap();
        })
    }

    /// A plain pickle read with the reader of the streams nested in it, as the reader's entry point hands it
    /// down.
    fn read_bytes(bytes: Vec<u8>) -> Result<Value> {
        let options = ReadOptions { nested_read: Some(crate::read::read_nested), ..ReadOptions::default() };
        read(&Buffer::from_vec(bytes), &options)
    }

    /// `_load_from_bytes` streams inside each other read to the bound, and beyond it are refused.
    #[test]
    fn nested_streams_are_read_to_their_bound() {
        let nest = |depth: usize| {
            let mut object = pickle(2, |p| p.int(7).unwrap());
            for _ in 0..depth {
                object = load_from_bytes(&legacy(&object));
            }
            object
        };
        for depth in 1..=crate::rebuild::MAX_NESTING {
            assert_eq!(read_bytes(nest(depth)).unwrap(), Value::Int(7), "{depth}");
        }
        let e = read_bytes(nest(crate::rebuild::MAX_NESTING + 1)).unwrap_err();
        // The innermost refusal, inside every stream around it.
        let mut inner = &e;
        while let Error::LoadFromBytes { source, .. } = inner {
            inner = source;
        }
        assert!(matches!(inner, Error::NestedTooDeep { .. }), "{e:?}");
    }

    /// A persistent id has no storage to name in a plain pickle; bytes that are not a torch stream inside
    /// `_load_from_bytes` (a plain pickle among them) are refused as such.
    #[test]
    fn what_a_plain_pickle_cannot_hold() {
        let pid = pickle(2, |p| {
            p.mark().unwrap();
            p.str("storage").unwrap();
            p.global("torch", "FloatStorage").unwrap();
            p.str("0").unwrap();
            p.str("cpu").unwrap();
            p.int(1).unwrap();
            p.tuple(5).unwrap();
            p.binpersid().unwrap();
        });
        let e = read_bytes(pid);
        assert!(matches!(&e, Err(Error::PersistentIdInPickle { key }) if key == "0"), "{e:?}");
        for inner in [b"junk".to_vec(), pickle(2, |p| p.int(1).unwrap())] {
            let e = read_bytes(load_from_bytes(&inner)).unwrap_err();
            assert!(
                matches!(&e, Error::LoadFromBytes { source, .. } if matches!(**source, Error::Unrecognized { .. })),
                "{e:?}"
            );
        }
    }
}
