//! Inputs shared by ckpt's benchmarks: synthetic state dicts shaped like real models.

use ckpt_core::{Buffer, DType, Dict, DictKind, Tensor, Value};

/// A GPT-2-shaped state dict of about `total_bytes` bytes of float32 weights (layers of a 4:1 mix of
/// matrices and vectors), deterministic contents.
///
/// # Errors
/// If the allocation fails.
pub fn model_state_dict(total_bytes: usize) -> ckpt_core::Result<Value> {
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

pub mod reads;
