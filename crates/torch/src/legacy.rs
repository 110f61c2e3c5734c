//! The legacy `torch.save` stream (`_use_new_zipfile_serialization=False`, torch 0.1.10–1.5): five pickles
//! (magic number, protocol version, system info, the object, the storage keys) followed by the raw
//! storages, each an `i64` element count and the bytes.

use std::collections::HashMap;

use ckpt_core::{Buffer, DType, Value};
use ckpt_pickle::Value as P;

use crate::error::{Error, Result};
use crate::read::ReadOptions;
use crate::rebuild::{Rebuilder, StorageSource, global_name, storage_class_dtype};

/// torch's legacy `MAGIC_NUMBER`, 0x1950A86A20F9469CFC6C, as little-endian two's complement bytes.
const MAGIC: [u8; 10] = [0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19];
/// The only `PROTOCOL_VERSION` torch ever wrote.
const PROTOCOL_VERSION: i64 = 1001;

/// A storage as the object pickle refers to it.
struct StorageRef {
    dtype: DType,
}

/// Storage bytes read from the trailer, by key.
struct LegacyStorages {
    data: HashMap<String, (Buffer, DType)>,
}

impl StorageSource for LegacyStorages {
    fn storage(&mut self, pid: &P) -> Result<(Buffer, DType)> {
        let items = match pid {
            P::Tuple(items) => items.as_slice(),
            other => return Err(Error::BadPersistentId(format!("expected a tuple, got {other:?}"))),
        };
        match items {
            [P::Str(tag), _class, P::Str(key), _location, P::Int(_numel), view] if tag == "storage" => {
                let (root, dtype) = self
                    .data
                    .get(key)
                    .cloned()
                    .ok_or_else(|| Error::Legacy(format!("storage {key} is not in the storage list")))?;
                match view {
                    P::None => Ok((root, dtype)),
                    P::Tuple(v) => match v.as_slice() {
                        [_view_key, P::Int(offset), P::Int(size)] => {
                            let es = dtype.size() as i64;
                            let start = offset.checked_mul(es).and_then(|s| usize::try_from(s).ok());
                            let len = size.checked_mul(es).and_then(|s| usize::try_from(s).ok());
                            match (start, len) {
                                (Some(s), Some(l)) => Ok((root.slice_len(s, l)?, dtype)),
                                _ => Err(Error::Legacy(format!("storage view of {key} out of range"))),
                            }
                        }
                        _ => Err(Error::BadPersistentId(format!("bad view metadata for storage {key}"))),
                    },
                    other => Err(Error::BadPersistentId(format!("bad view metadata {other:?}"))),
                }
            }
            [P::Str(tag), ..] => Err(Error::BadPersistentId(format!("unsupported legacy persistent id tag {tag:?}"))),
            _ => Err(Error::BadPersistentId(format!("unexpected legacy persistent id with {} items", items.len()))),
        }
    }
}

/// Collects the storages referenced by persistent ids (key → dtype).
fn collect_refs(v: &P, out: &mut HashMap<String, StorageRef>) -> Result<()> {
    match v {
        P::PersistentId(pid) => {
            if let P::Tuple(items) = pid.as_ref() {
                if let [P::Str(tag), class, P::Str(key), ..] = items.as_slice() {
                    if tag == "storage" {
                        let (module, name) = global_name(class)
                            .ok_or_else(|| Error::BadPersistentId(format!("storage class {class:?}")))?;
                        let dtype = storage_class_dtype(&module, &name)?;
                        out.entry(key.clone()).or_insert(StorageRef { dtype });
                    }
                }
            }
        }
        P::List(items) | P::Tuple(items) | P::Set(items) | P::FrozenSet(items) => {
            for i in items {
                collect_refs(i, out)?;
            }
        }
        P::Dict(items) => {
            for (k, v) in items {
                collect_refs(k, out)?;
                collect_refs(v, out)?;
            }
        }
        P::Object(o) => {
            collect_refs(&o.callable, out)?;
            collect_refs(&o.args, out)?;
            if let Some(s) = &o.state {
                collect_refs(s, out)?;
            }
            for i in &o.list_items {
                collect_refs(i, out)?;
            }
            for (k, v) in &o.dict_items {
                collect_refs(k, out)?;
                collect_refs(v, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Decodes the next pickle at `*pos`, advancing it.
fn next_pickle(bytes: &[u8], pos: &mut usize, part: &'static str, options: &ReadOptions) -> Result<P> {
    let rest = bytes.get(*pos..).ok_or_else(|| Error::Legacy(format!("stream ends before the {part}")))?;
    let (v, used) = ckpt_pickle::decode_with(rest, &options.limits).map_err(|source| Error::Pickle { part, source })?;
    *pos += used;
    Ok(v)
}

/// Reads a legacy stream.
pub(crate) fn read(buffer: &Buffer, options: &ReadOptions) -> Result<Value> {
    let bytes = buffer.as_bytes();
    let mut pos = 0usize;
    match next_pickle(bytes, &mut pos, "magic number", options)? {
        P::BigInt(b) if b == MAGIC => {}
        other => return Err(Error::Legacy(format!("bad magic number {other:?}"))),
    }
    match next_pickle(bytes, &mut pos, "protocol version", options)? {
        P::Int(PROTOCOL_VERSION) => {}
        other => return Err(Error::Legacy(format!("unsupported protocol version {other:?}"))),
    }
    let sys_info = next_pickle(bytes, &mut pos, "sys_info", options)?;
    if let P::Dict(items) = &sys_info {
        let little = items.iter().find(|(k, _)| matches!(k, P::Str(s) if s == "little_endian"));
        if let Some((_, P::Bool(false))) = little {
            return Err(Error::BigEndian { found: "big (sys_info.little_endian = False)".into() });
        }
    }
    let object = next_pickle(bytes, &mut pos, "object", options)?;
    let keys = match next_pickle(bytes, &mut pos, "storage keys", options)? {
        P::List(k) => k,
        other => return Err(Error::Legacy(format!("storage key list expected, got {other:?}"))),
    };
    let mut refs = HashMap::new();
    collect_refs(&object, &mut refs)?;
    let mut data = HashMap::new();
    for key in &keys {
        let P::Str(key) = key else {
            return Err(Error::Legacy(format!("storage key {key:?} is not a str")));
        };
        let dtype = refs
            .get(key)
            .map(|r| r.dtype)
            .ok_or_else(|| Error::Legacy(format!("storage {key} is listed but never referenced")))?;
        let header = bytes
            .get(pos..pos + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .ok_or_else(|| Error::Legacy(format!("stream ends in the size of storage {key}")))?;
        pos += 8;
        let numel = i64::from_le_bytes(header);
        let len = u64::try_from(numel)
            .ok()
            .and_then(|n| n.checked_mul(dtype.size() as u64))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| Error::Legacy(format!("storage {key}: bad element count {numel}")))?;
        let end = pos.checked_add(len).filter(|&e| e <= bytes.len()).ok_or_else(|| {
            Error::Legacy(format!("storage {key} claims {len} bytes, only {} remain", bytes.len() - pos))
        })?;
        data.insert(key.clone(), (buffer.slice(pos..end)?, dtype));
        pos = end;
    }
    let mut storages = LegacyStorages { data };
    Rebuilder { source: &mut storages }.value(&object)
}
