//! hfai part merging: several `PART_*.pt` files built from the input, opened and merged, every entry read.
//!
//! Two input modes. An input starting with `S` is structure-aware: the rest drives `arbitrary` to build each
//! part's value (header, model shares with whole and chunked tensors, optimizer shares, `others`, with keys
//! chosen to collide across parts the way Python's `dict.update` sees them: `1`, `1.0`, `True`), which is
//! then written with ckpt-torch's `torch.save` writer; this reaches the merge rules directly. Any other input
//! is a raw file-set (bytes before the first separator are `PART_000.pt`), seeded from the golden parts.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ckpt_hfai::{HfaiReader, part_file_name};
use ckpt_tensor::{Buffer, DType, Dict, DictKind, Tensor, Value};
use ckpt_torch::{WriteOptions, save_to_writer};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Part {
    /// Rank in the file name (`None`: this part's position).
    rank: Option<u8>,
    nshards: Nshards,
    version: Version,
    models: Vec<ModelShare>,
    optimizers: Vec<OptimizerShare>,
    others: Vec<(Key, Leaf)>,
}

#[derive(Arbitrary, Debug)]
enum Nshards {
    /// The number of parts built.
    Parts,
    Int(i8),
    Missing,
    Str,
}

#[derive(Arbitrary, Debug)]
enum Version {
    V2,
    Missing,
    Other(u8),
}

#[derive(Arbitrary, Debug)]
struct ModelShare {
    params: Vec<(Key, Leaf)>,
    large: Vec<(Key, Large)>,
}

#[derive(Arbitrary, Debug)]
struct OptimizerShare {
    state: Vec<(Key, Vec<(Key, Leaf)>)>,
    groups: u8,
    large: Vec<(Key, Key, Large)>,
}

#[derive(Arbitrary, Debug)]
enum Key {
    Name(u8),
    Int(i8),
    Float(i8),
    Bool(bool),
    Pair(u8, u8),
}

#[derive(Arbitrary, Debug)]
enum Leaf {
    Int(i64),
    Float(f64),
    Str(u8),
    None,
    Tensor(TensorSpec),
    List(u8),
}

#[derive(Arbitrary, Debug)]
struct TensorSpec {
    dtype: DTypeSpec,
    shape: Vec<u8>,
    fill: u8,
    transposed: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum DTypeSpec {
    F32,
    F16,
    BF16,
    I64,
    U8,
    Bool,
}

#[derive(Arbitrary, Debug)]
struct Large {
    /// The stored `torch.Size`.
    shape: Vec<u8>,
    chunk: Chunk,
}

#[derive(Arbitrary, Debug)]
enum Chunk {
    Flat(DTypeSpec, u8),
    Tensor(TensorSpec),
    SizeAsList,
    NotATensor(Leaf),
}

fn dtype(d: DTypeSpec) -> DType {
    match d {
        DTypeSpec::F32 => DType::F32,
        DTypeSpec::F16 => DType::F16,
        DTypeSpec::BF16 => DType::BF16,
        DTypeSpec::I64 => DType::I64,
        DTypeSpec::U8 => DType::U8,
        DTypeSpec::Bool => DType::Bool,
    }
}

fn tensor(d: DTypeSpec, shape: &[usize], fill: u8) -> Option<Tensor> {
    let dt = dtype(d);
    let numel: usize = shape.iter().product();
    let fill = if dt == DType::Bool { fill & 1 } else { fill };
    Tensor::from_buffer(dt, shape, Buffer::from_vec(vec![fill; numel * dt.size()])).ok()
}

fn small_shape(dims: &[u8]) -> Vec<usize> {
    dims.iter().take(3).map(|&d| usize::from(d % 9)).collect()
}

fn tensor_value(s: &TensorSpec) -> Value {
    let shape = small_shape(&s.shape);
    match tensor(s.dtype, &shape, s.fill) {
        Some(t) if s.transposed && t.dim() >= 2 => t.transpose(0, 1).map_or(Value::None, Value::Tensor),
        Some(t) => Value::Tensor(t),
        None => Value::None,
    }
}

fn key(k: &Key) -> Value {
    match k {
        Key::Name(n) => Value::Str(format!("w{}", n % 6)),
        Key::Int(i) => Value::Int(i64::from(i % 4)),
        Key::Float(f) => Value::Float(f64::from(f % 4) / 2.0),
        Key::Bool(b) => Value::Bool(*b),
        Key::Pair(a, b) => Value::Tuple(vec![Value::Int(i64::from(a % 3)), Value::Str(format!("s{}", b % 3))]),
    }
}

fn leaf(l: &Leaf) -> Value {
    match l {
        Leaf::Int(i) => Value::Int(*i),
        Leaf::Float(f) => Value::Float(*f),
        Leaf::Str(n) => Value::Str(format!("v{n}")),
        Leaf::None => Value::None,
        Leaf::Tensor(t) => tensor_value(t),
        Leaf::List(n) => Value::List((0..i64::from(n % 4)).map(Value::Int).collect()),
    }
}

fn large(l: &Large) -> Value {
    let shape: Vec<i64> = l.shape.iter().take(3).map(|&d| i64::from(d % 17)).collect();
    let chunk = match &l.chunk {
        Chunk::Flat(d, n) => tensor(*d, &[usize::from(n % 33)], 1).map_or(Value::None, Value::Tensor),
        Chunk::Tensor(t) => tensor_value(t),
        Chunk::SizeAsList => return Value::Tuple(vec![Value::List(shape.into_iter().map(Value::Int).collect())]),
        Chunk::NotATensor(x) => leaf(x),
    };
    Value::Tuple(vec![Value::Size(shape), chunk])
}

fn dict(items: impl IntoIterator<Item = (Value, Value)>) -> Value {
    let mut d = Dict::new(DictKind::Dict);
    d.items.extend(items);
    Value::Dict(d)
}

fn part_value(p: &Part, nparts: usize) -> Value {
    let mut top = Dict::new(DictKind::Dict);
    match p.nshards {
        Nshards::Parts => top.insert("__nshards__", Value::Int(nparts as i64)),
        Nshards::Int(n) => top.insert("__nshards__", Value::Int(i64::from(n))),
        Nshards::Str => top.insert("__nshards__", Value::Str("1".into())),
        Nshards::Missing => {}
    }
    match p.version {
        Version::V2 => top.insert("__version__", Value::Str("2.0.0".into())),
        Version::Other(v) => top.insert("__version__", Value::Str(format!("{}.0.0", v % 4))),
        Version::Missing => {}
    }
    let models = p.models.iter().take(3).map(|m| {
        let params = dict(m.params.iter().take(8).map(|(k, v)| (key(k), leaf(v))));
        let large = dict(m.large.iter().take(4).map(|(k, l)| (key(k), large(l))));
        Value::Tuple(vec![params, large])
    });
    top.insert("model", Value::List(models.collect()));
    let optimizers = p.optimizers.iter().take(3).map(|o| {
        let state = dict(
            o.state
                .iter()
                .take(6)
                .map(|(k, entries)| (key(k), dict(entries.iter().take(4).map(|(k2, v)| (key(k2), leaf(v)))))),
        );
        let groups = (0..o.groups % 3).map(|g| {
            dict([
                (Value::Str("lr".into()), Value::Float(0.1)),
                (Value::Str("params".into()), Value::List((0..i64::from(g) + 1).map(Value::Int).collect())),
            ])
        });
        let sd = dict([
            (Value::Str("state".into()), state),
            (Value::Str("param_groups".into()), Value::List(groups.collect())),
        ]);
        let large = dict(o.large.iter().take(4).map(|(k1, k2, l)| (Value::Tuple(vec![key(k1), key(k2)]), large(l))));
        Value::Tuple(vec![sd, large])
    });
    top.insert("optimizer", Value::List(optimizers.collect()));
    for (k, v) in p.others.iter().take(4) {
        top.items.push((key(k), leaf(v)));
    }
    Value::Dict(top)
}

/// The files of a structure-aware input.
fn structured(data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut u = Unstructured::new(data);
    let Ok(parts) = Vec::<Part>::arbitrary(&mut u) else { return Vec::new() };
    let parts = &parts[..parts.len().min(4)];
    let mut files = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let name = part_file_name(p.rank.map_or(i, |r| usize::from(r % 6)));
        if let Ok(bytes) = save_to_writer(&part_value(p, parts.len()), Vec::new(), "archive", &WriteOptions::default())
        {
            files.push((name, bytes));
        }
    }
    files
}

fuzz_target!(|data: &[u8]| {
    let owned;
    let files: Vec<ckpt_fuzz::FileEntry<'_>> = match data.split_first() {
        Some((b'S', rest)) => {
            owned = structured(rest);
            owned.iter().map(|(n, b)| ckpt_fuzz::FileEntry { name: n.clone(), bytes: b }).collect()
        }
        _ => ckpt_fuzz::split_files(data, "PART_000.pt"),
    };
    let dir = ckpt_fuzz::write_dir("hfai", &files);
    if let Ok(ck) = HfaiReader::open(&dir) {
        ckpt_fuzz::read_all(&ck);
        let _ = (ck.models().len(), ck.optimizers().len(), ck.others().count(), ck.chunked().len());
    }
});
