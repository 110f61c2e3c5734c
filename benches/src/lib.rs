//! Inputs shared by ckpt's benchmarks: synthetic state dicts shaped like real models.

use ckpt_tensor::{Buffer, DType, Dict, DictKind, Tensor, Value};

/// A GPT-2-shaped state dict of about `total_bytes` bytes of float32 weights (layers of a 4:1 mix of
/// matrices and vectors), deterministic contents.
///
/// # Errors
/// If the allocation fails.
pub fn model_state_dict(total_bytes: usize) -> ckpt_tensor::Result<Value> {
    let hidden = 768usize;
    let per_layer = 4 * hidden * hidden * 4 + 4 * hidden * 4;
    let layers = (total_bytes / per_layer).max(1);
    let mut sd = Dict::new(DictKind::OrderedDict);
    for l in 0..layers {
        for (name, shape) in [
            ("attn.c_attn.weight", vec![hidden, 3 * hidden]),
            ("attn.c_proj.weight", vec![hidden, hidden]),
            ("ln_1.weight", vec![hidden]),
            ("ln_1.bias", vec![hidden]),
            ("mlp.c_fc.bias", vec![3 * hidden]),
        ] {
            let numel: usize = shape.iter().product();
            let bytes: Vec<u8> = (0..numel * 4).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            let t = Tensor::from_buffer(DType::F32, &shape, Buffer::copy_from(&bytes)?)?;
            sd.insert(format!("h.{l}.{name}"), Value::Tensor(t));
        }
    }
    Ok(Value::Dict(sd))
}

pub mod anon;
pub mod reads;
pub mod writes;

/// An Adam optimizer state dict for `n` parameters as the pickle `torch.save` writes for it: `{'state': {i:
/// {'step': tensor, 'exp_avg': tensor, 'exp_avg_sq': tensor}}, 'param_groups': [{'lr': ..., 'params': [0,
/// ..., n-1], ...}]}`, with every tensor a `_rebuild_tensor_v2` call on a storage persistent id.
pub fn optimizer_state_pickle(n: usize) -> ckpt_pickle::Value {
    use ckpt_pickle::{Object, Value as P};
    let s = |t: &str| P::Str(t.to_owned());
    let mut storage = 0usize;
    let mut tensor = |numel: i64, shape: Vec<P>| {
        let key = storage.to_string();
        storage += 1;
        let pid = P::PersistentId(Box::new(P::Tuple(vec![
            s("storage"),
            P::global("torch", "FloatStorage"),
            P::Str(key),
            s("cpu"),
            P::Int(numel),
        ])));
        let stride = match shape.len() {
            2 => vec![P::Int(64), P::Int(1)],
            1 => vec![P::Int(1)],
            _ => vec![],
        };
        P::from(Object::reduce(
            P::global("torch._utils", "_rebuild_tensor_v2"),
            P::Tuple(vec![
                pid,
                P::Int(0),
                P::Tuple(shape),
                P::Tuple(stride),
                P::Bool(false),
                P::from(Object::reduce(P::global("collections", "OrderedDict"), P::Tuple(vec![]))),
            ]),
        ))
    };
    let mut state = Vec::with_capacity(n);
    for i in 0..n {
        let entry = P::Dict(vec![
            (s("step"), tensor(1, vec![])),
            (s("exp_avg"), tensor(4096, vec![P::Int(64), P::Int(64)])),
            (s("exp_avg_sq"), tensor(4096, vec![P::Int(64), P::Int(64)])),
        ]);
        state.push((P::Int(i as i64), entry));
    }
    let group = P::Dict(vec![
        (s("lr"), P::Float(1e-3)),
        (s("betas"), P::Tuple(vec![P::Float(0.9), P::Float(0.999)])),
        (s("eps"), P::Float(1e-8)),
        (s("weight_decay"), P::Float(0.0)),
        (s("amsgrad"), P::Bool(false)),
        (s("params"), P::List((0..n as i64).map(P::Int).collect())),
    ]);
    P::Dict(vec![(s("state"), P::Dict(state)), (s("param_groups"), P::List(vec![group]))])
}

/// The `.metadata` of a large FSDP job: `ranks` row shards of `tensors` bfloat16 tensors (8 per
/// Llama-like layer), with planner data and one data file per rank, as `benches/python/dcp_large_metadata.py`
/// builds it with torch's own classes (`ranks × tensors` chunks and items).
pub fn large_job_metadata(ranks: usize, tensors: usize) -> ckpt_distcp::Metadata {
    use ckpt_distcp::{
        ChunkStorageMetadata, Metadata, MetadataIndex, StorageInfo, StorageMetadata, TensorProperties,
        TensorStorageMetadata,
    };
    use ckpt_tensor::{DType, PathItem};
    let shapes: [(&str, [usize; 2]); 8] = [
        ("attention.wq.weight", [4096, 4096]),
        ("attention.wk.weight", [1024, 4096]),
        ("attention.wv.weight", [1024, 4096]),
        ("attention.wo.weight", [4096, 4096]),
        ("feed_forward.w1.weight", [14336, 4096]),
        ("feed_forward.w2.weight", [4096, 14336]),
        ("feed_forward.w3.weight", [14336, 4096]),
        ("attention_norm.weight", [4096, 1]),
    ];
    let mut state_dict_metadata = Vec::with_capacity(tensors);
    let mut planner = Vec::with_capacity(tensors);
    let mut per_rank: Vec<Vec<(MetadataIndex, StorageInfo)>> = vec![Vec::new(); ranks];
    let mut offsets = vec![0u64; ranks];
    for t in 0..tensors {
        let (name, [rows, cols]) = shapes[t % shapes.len()];
        let rows = rows.div_ceil(ranks) * ranks;
        let name = format!("layers.{}.{name}", t / shapes.len());
        let key = format!("model.{name}");
        let shard = rows / ranks;
        let mut chunks = Vec::with_capacity(ranks);
        for (r, items) in per_rank.iter_mut().enumerate() {
            let c = ChunkStorageMetadata { offsets: vec![r * shard, 0], sizes: vec![shard, cols] };
            let length = (shard * cols * 2) as u64 + 1216;
            items.push((
                MetadataIndex { fqn: key.clone(), offset: Some(c.offsets.clone()), index: Some(r) },
                StorageInfo {
                    relative_path: format!("__{r}_0.distcp"),
                    offset: offsets[r],
                    length,
                    transform_descriptors: Vec::new(),
                },
            ));
            offsets[r] += length;
            chunks.push(c);
        }
        state_dict_metadata.push((
            key.clone(),
            StorageMetadata::Tensor(TensorStorageMetadata {
                properties: TensorProperties::new(DType::BF16),
                size: vec![rows, cols],
                chunks,
            }),
        ));
        planner.push((key, vec![PathItem::Key("model".into()), PathItem::Key(name)]));
    }
    Metadata {
        state_dict_metadata,
        planner_data: Some(planner),
        storage_data: per_rank.into_iter().flatten().collect(),
        storage_meta: None,
        version: None,
    }
}
