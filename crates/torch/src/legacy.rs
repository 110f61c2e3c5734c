//! The legacy `torch.save` stream (`_use_new_zipfile_serialization=False`, torch 0.1.10–1.5): five pickles
//! (magic number, protocol version, system info, the object, the storage keys) followed by the raw
//! storages, each an `i64` element count and the bytes.

use std::collections::HashMap;

use ckpt_pickle::Value as P;
use ckpt_tensor::{Buffer, DType, Value};

use crate::error::{Error, Result};
use crate::read_options::ReadOptions;
use crate::rebuild::{StorageSource, rebuild, storage_class_dtype};

/// torch's legacy `MAGIC_NUMBER`, 0x1950A86A20F9469CFC6C, as little-endian two's complement bytes.
const MAGIC: [u8; 10] = [0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19];
/// The only `PROTOCOL_VERSION` torch ever wrote.
const PROTOCOL_VERSION: i64 = 1001;

/// Storage bytes read from the trailer, by key.
struct LegacyStorages {
    data: HashMap<String, Buffer>,
}

impl StorageSource for LegacyStorages {
    fn storage(&mut self, _dtype: DType, key: &str, _numel: i64) -> Result<Buffer> {
        // The whole storage as the trailer holds it (a view's window is taken by the rebuild rules).
        self.data.get(key).cloned().ok_or_else(|| Error::Legacy(format!("storage {key} is not in the storage list")))
    }
}

/// Collects the storages referenced by persistent ids (key → dtype), walking the decoded object pickle
/// without recursion.
fn collect_refs(v: &P, out: &mut HashMap<String, DType>) -> Result<()> {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            P::PersistentId(pid) => {
                if let P::Tuple(items) = pid.as_ref() {
                    if let [P::Str(tag), class, P::Str(key), ..] = items.as_slice() {
                        if tag == "storage" {
                            let (module, name) = class
                                .as_global()
                                .map(|(m, n)| ckpt_pickle::normalize_global(m, n))
                                .ok_or_else(|| Error::BadPersistentId(format!("storage class {class:?}")))?;
                            let dtype = storage_class_dtype(&module, &name)?;
                            out.entry(key.clone()).or_insert(dtype);
                        }
                    }
                }
            }
            P::List(items) | P::Tuple(items) | P::Set(items) | P::FrozenSet(items) => stack.extend(items),
            P::Dict(items) => stack.extend(items.iter().flat_map(|(k, v)| [k, v])),
            P::Shared { value, .. } => stack.push(value),
            P::Object(o) => {
                stack.push(&o.callable);
                stack.push(&o.args);
                stack.extend(o.state.iter());
                stack.extend(o.list_items.iter());
                stack.extend(o.dict_items.iter().flat_map(|(k, v)| [k, v]));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The most objects, container items and payload bytes a header pickle (the magic number, the protocol
/// version, `sys_info`: an int, an int, a dict of three entries) may have; more is not a torch stream, and
/// stops a memo bomb there at a small size.
const HEADER_NODES: usize = 4096;
const HEADER_BYTES: usize = 1 << 20;

/// Decodes the next pickle at `*pos`, advancing it.
fn next_pickle(bytes: &[u8], pos: &mut usize, part: &'static str, options: &ReadOptions) -> Result<P> {
    let mut pickle = options.pickle();
    if matches!(part, "magic number" | "protocol version" | "sys_info") {
        let l = &mut pickle.limits;
        l.max_nodes = l.max_nodes.min(HEADER_NODES);
        l.max_container_len = l.max_container_len.min(HEADER_NODES);
        l.max_alloc_bytes = l.max_alloc_bytes.min(HEADER_BYTES);
    }
    let rest = bytes.get(*pos..).ok_or_else(|| Error::Legacy(format!("stream ends before the {part}")))?;
    let (v, used) = ckpt_pickle::decode_options(rest, &pickle).map_err(|source| Error::Pickle { part, source })?;
    *pos += used;
    Ok(v)
}

/// Reads a legacy stream.
pub(crate) fn read(buffer: &Buffer, options: &ReadOptions) -> Result<Value> {
    let bytes = buffer.as_bytes();
    let mut pos = 0usize;
    match next_pickle(bytes, &mut pos, "magic number", options)? {
        P::BigInt(b) if b == MAGIC => {}
        other => return Err(Error::Legacy(format!("bad magic number {}", ckpt_tensor::brief(&other)))),
    }
    match next_pickle(bytes, &mut pos, "protocol version", options)? {
        P::Int(PROTOCOL_VERSION) => {}
        other => return Err(Error::Legacy(format!("unsupported protocol version {}", ckpt_tensor::brief(&other)))),
    }
    let sys_info = next_pickle(bytes, &mut pos, "sys_info", options)?;
    if let P::Dict(items) = &sys_info {
        let little = items.iter().find(|(k, _)| matches!(k, P::Str(s) if s == "little_endian"));
        if let Some((_, P::Bool(false))) = little {
            return Err(Error::BigEndian { found: "big (sys_info.little_endian = False)".into() });
        }
    }
    // The object pickle refers to storages whose bytes follow the pickles: it is read once for the dtypes of
    // the storages it names (which give their sizes in the trailer), and rebuilt once they are known.
    let object_at = pos;
    let object = next_pickle(bytes, &mut pos, "object", options)?;
    let keys = match next_pickle(bytes, &mut pos, "storage keys", options)? {
        P::List(k) => k,
        other => return Err(Error::Legacy(format!("storage key list expected, got {}", ckpt_tensor::brief(&other)))),
    };
    let mut refs = HashMap::new();
    collect_refs(&object, &mut refs)?;
    drop(object);
    let mut data = HashMap::new();
    for key in &keys {
        let key = match key {
            P::Str(key) => key,
            other => return Err(Error::Legacy(format!("storage key {} is not a str", ckpt_tensor::brief(&other)))),
        };
        let dtype =
            *refs.get(key).ok_or_else(|| Error::Legacy(format!("storage {key} is listed but never referenced")))?;
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
        data.insert(key.clone(), buffer.slice(pos..end)?);
        pos = end;
    }
    let mut storages = LegacyStorages { data };
    let pickle = bytes.get(object_at..).unwrap_or_default();
    rebuild(pickle, options, &mut storages, "object")
}
