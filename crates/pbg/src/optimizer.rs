//! The `optimizer/state_dict` blob: `torch.save(optimizer.state_dict(), BytesIO)` stored as OPAQUE bytes,
//! decoded and re-encoded through ckpt-torch.
//!
//! Embedding partitions carry PBG's `RowAdagrad` state (`state[0]["sum"]`: one accumulator per row); the
//! model carries `torch.optim.Adagrad`'s (`state[i]` = `{"step", "sum"}` per parameter, in
//! `model.parameters()` order).

use std::fmt;
use std::path::PathBuf;

use ckpt_tensor::{Buffer, Dict, DictKind, Tensor, Value};
use ckpt_torch::{ReadOptions, TorchReader, WriteOptions, save_to_writer};

use crate::error::{Error, Result};

/// The raw bytes of an `optimizer/state_dict` dataset (a `torch.save` archive with record prefix
/// `archive/`, or a legacy torch < 1.6 stream in 2019-era files). Cloning is cheap; bytes read from a file
/// are a window of its memory map.
#[derive(Clone, PartialEq)]
pub struct OptimizerState {
    blob: Buffer,
}

impl fmt::Debug for OptimizerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OptimizerState").field("bytes", &self.blob.len()).finish()
    }
}

impl OptimizerState {
    /// Wraps blob bytes as found in a file (not checked until decoded).
    pub fn from_bytes(blob: impl Into<Buffer>) -> Self {
        OptimizerState { blob: blob.into() }
    }

    /// The blob.
    pub fn bytes(&self) -> &Buffer {
        &self.blob
    }

    /// Decodes the blob like `torch.load(BytesIO(blob))`, into the Python value (tensors are windows of the
    /// blob, hence of the file's map).
    ///
    /// # Errors
    /// [`Error::OptimizerBlob`] for anything torch could not load.
    pub fn decode_value(&self) -> Result<Value> {
        self.decode_value_with(&ckpt_pickle::Limits::default())
    }

    /// [`OptimizerState::decode_value`] under the pickle decoder's `limits`.
    ///
    /// # Errors
    /// As [`OptimizerState::decode_value`].
    pub fn decode_value_with(&self, limits: &ckpt_pickle::Limits) -> Result<Value> {
        TorchReader::from_buffer(&self.blob, &ReadOptions::default().with_limits(*limits))
            .map(TorchReader::into_value)
            .map_err(|source| Error::OptimizerBlob { path: PathBuf::new(), source })
    }

    /// Decodes the blob and checks that it is an optimizer `state_dict()`.
    ///
    /// # Errors
    /// [`Error::OptimizerBlob`] for a corrupt blob, [`Error::OptimizerLayout`] for a readable one that is not
    /// shaped like a state dict.
    pub fn decode(&self) -> Result<StateDict> {
        self.decode_with(&ckpt_pickle::Limits::default())
    }

    /// [`OptimizerState::decode`] under the pickle decoder's `limits`.
    ///
    /// # Errors
    /// As [`OptimizerState::decode`].
    pub fn decode_with(&self, limits: &ckpt_pickle::Limits) -> Result<StateDict> {
        StateDict::from_value(self.decode_value_with(limits)?)
    }

    /// Encodes a value as `torch.save` to a buffer does (prefix `archive/`, torch 2.13's records), so that
    /// PBG's `torch.load` (weights-only) reads it back.
    ///
    /// # Errors
    /// [`Error::OptimizerBlob`] for values torch.save cannot hold.
    pub fn encode_value(value: &Value) -> Result<Self> {
        let bytes = save_to_writer(value, Vec::new(), "archive", &WriteOptions::default())
            .map_err(|source| Error::OptimizerBlob { path: PathBuf::new(), source })?;
        Ok(OptimizerState { blob: Buffer::from_vec(bytes) })
    }

    /// Encodes a state dict.
    ///
    /// # Errors
    /// As [`OptimizerState::encode_value`].
    pub fn encode(state: &StateDict) -> Result<Self> {
        Self::encode_value(state.value())
    }
}

/// A decoded optimizer `state_dict()`: `{"state": {index: {...}}, "param_groups": [{..., "params": [...]}]}`
/// (or `{}`, PBG's `DummyOptimizer`), kept as the lossless Python value with typed accessors.
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_pbg::{OptimizerState, StateDict};
/// let sum = Tensor::from_slice(&[0.5f32, 1.5, 2.5], &[3]).unwrap();
/// let sd = StateDict::row_adagrad(sum.clone(), 0.1);
/// let blob = OptimizerState::encode(&sd).unwrap();
/// let back = blob.decode().unwrap();
/// assert_eq!(back.sum(0), Some(&sum));
/// assert_eq!(back.lr(0), Some(0.1));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StateDict {
    value: Value,
}

fn layout(msg: impl Into<String>) -> Error {
    Error::OptimizerLayout(msg.into())
}

impl StateDict {
    /// Checks that `value` is shaped like a torch optimizer state dict: a dict whose `state` maps integer
    /// parameter indices to dicts and whose `param_groups` is a list of dicts each with a `params` list.
    /// The empty dict (PBG's `DummyOptimizer`) is accepted.
    ///
    /// # Errors
    /// [`Error::OptimizerLayout`] naming the first violation.
    pub fn from_value(value: Value) -> Result<Self> {
        let d = value.as_dict().ok_or_else(|| layout(format!("a {} instead of a dict", value.type_name())))?;
        if d.items.is_empty() {
            return Ok(StateDict { value });
        }
        let state = d.get("state").ok_or_else(|| layout("no \"state\" key"))?;
        let state = state.as_dict().ok_or_else(|| layout(format!("\"state\" is a {}", state.type_name())))?;
        for (k, v) in &state.items {
            if k.as_int().is_none() {
                return Err(layout(format!("\"state\" key {} is a {}, not an int", python_repr(k), k.type_name())));
            }
            if v.as_dict().is_none() {
                return Err(layout(format!("state[{}] is a {}", python_repr(k), v.type_name())));
            }
        }
        let groups = d.get("param_groups").ok_or_else(|| layout("no \"param_groups\" key"))?;
        let groups =
            groups.as_sequence().ok_or_else(|| layout(format!("\"param_groups\" is a {}", groups.type_name())))?;
        for (i, g) in groups.iter().enumerate() {
            let g = g.as_dict().ok_or_else(|| layout(format!("param_groups[{i}] is a {}", g.type_name())))?;
            let params = g.get("params").ok_or_else(|| layout(format!("param_groups[{i}] has no \"params\"")))?;
            if params.as_sequence().is_none_or(|p| p.iter().any(|x| x.as_int().is_none())) {
                return Err(layout(format!("param_groups[{i}][\"params\"] is not a list of ints")));
            }
        }
        Ok(StateDict { value })
    }

    /// PBG's `RowAdagrad` state for one embedding partition, as torch 2.13 saves it:
    /// `{"state": {0: {"step": 0, "sum": sum}}, "param_groups": [{"lr": lr, "lr_decay": 0, "weight_decay": 0,
    /// "params": [0]}]}`.
    pub fn row_adagrad(sum: Tensor, lr: f64) -> Self {
        let param = Value::dict([("step", Value::Int(0)), ("sum", Value::Tensor(sum))]);
        let mut state = Dict::new(DictKind::Dict);
        state.insert(Value::Int(0), param);
        let group = Value::dict([
            ("lr", Value::Float(lr)),
            ("lr_decay", Value::Int(0)),
            ("weight_decay", Value::Int(0)),
            ("params", Value::List(vec![Value::Int(0)])),
        ]);
        StateDict { value: Value::dict([("state", Value::Dict(state)), ("param_groups", Value::List(vec![group]))]) }
    }

    /// The Python value.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The Python value, by value.
    pub fn into_value(self) -> Value {
        self.value
    }

    fn state(&self) -> Option<&Dict> {
        self.value.as_dict()?.get("state")?.as_dict()
    }

    fn state_mut(&mut self) -> Option<&mut Dict> {
        let Value::Dict(d) = &mut self.value else { return None };
        match d.items.iter_mut().find(|(k, _)| k.as_str() == Some("state")) {
            Some((_, Value::Dict(s))) => Some(s),
            _ => None,
        }
    }

    /// Parameter indices that have state, in order.
    pub fn indices(&self) -> Vec<i64> {
        self.state().map(|s| s.items.iter().filter_map(|(k, _)| k.as_int()).collect()).unwrap_or_default()
    }

    /// The state of parameter `index` (`{"step": ..., "sum": ...}` for Adagrad).
    pub fn param_state(&self, index: i64) -> Option<&Dict> {
        self.state()?.items.iter().find(|(k, _)| k.as_int() == Some(index)).and_then(|(_, v)| v.as_dict())
    }

    /// Adagrad's accumulator `sum` of parameter `index` (for `RowAdagrad`, one value per embedding row).
    pub fn sum(&self, index: i64) -> Option<&Tensor> {
        self.param_state(index)?.get("sum")?.as_tensor()
    }

    /// The `step` of parameter `index`: a Python number (old torch, and PBG's `RowAdagrad`) or a 0-d tensor
    /// (newer `torch.optim.Adagrad`).
    pub fn step(&self, index: i64) -> Option<f64> {
        match self.param_state(index)?.get("step")? {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            v => {
                let t = v.as_tensor()?;
                match t.dtype() {
                    ckpt_tensor::DType::F32 => t.to_vec::<f32>().ok()?.first().map(|&x| f64::from(x)),
                    ckpt_tensor::DType::F64 => t.to_vec::<f64>().ok()?.first().copied(),
                    ckpt_tensor::DType::I64 => t.to_vec::<i64>().ok()?.first().map(|&x| x as f64),
                    _ => None,
                }
            }
        }
    }

    /// The parameter groups.
    pub fn param_groups(&self) -> &[Value] {
        self.value.as_dict().and_then(|d| d.get("param_groups")).and_then(Value::as_sequence).unwrap_or_default()
    }

    /// The learning rate of group `group`.
    pub fn lr(&self, group: usize) -> Option<f64> {
        self.param_groups().get(group)?.as_dict()?.get("lr")?.as_f64()
    }

    /// Replaces the `sum` of parameter `index`, keeping everything else.
    ///
    /// # Errors
    /// [`Error::OptimizerLayout`] if parameter `index` has no state with a `sum`, or the new tensor's dtype
    /// or shape differ from the old one's.
    pub fn set_sum(&mut self, index: i64, sum: Tensor) -> Result<()> {
        let state = self.state_mut().ok_or_else(|| layout("no \"state\" dict"))?;
        let param = state
            .items
            .iter_mut()
            .find(|(k, _)| k.as_int() == Some(index))
            .and_then(|(_, v)| if let Value::Dict(d) = v { Some(d) } else { None })
            .ok_or_else(|| layout(format!("no state for parameter {index}")))?;
        let slot = param
            .items
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some("sum"))
            .map(|(_, v)| v)
            .ok_or_else(|| layout(format!("state[{index}] has no \"sum\"")))?;
        let old = slot.as_tensor().ok_or_else(|| layout(format!("state[{index}][\"sum\"] is not a tensor")))?;
        if old.dtype() != sum.dtype() || old.shape() != sum.shape() {
            return Err(layout(format!(
                "new sum for parameter {index} is {} {:?}, the old one {} {:?}",
                sum.dtype(),
                sum.shape(),
                old.dtype(),
                old.shape()
            )));
        }
        *slot = Value::Tensor(sum);
        Ok(())
    }
}

fn python_repr(v: &Value) -> String {
    ckpt_tensor::flatten::python_str(v).unwrap_or_else(|_| v.type_name().to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rejects_corrupt_and_misshapen_blobs() {
        let corrupt = OptimizerState::from_bytes(b"PK\x03\x04 not really a zip".to_vec());
        assert!(matches!(corrupt.decode(), Err(Error::OptimizerBlob { .. })));
        let list = OptimizerState::encode_value(&Value::List(vec![])).unwrap();
        assert!(matches!(list.decode(), Err(Error::OptimizerLayout(_))));
        let bad_key = Value::dict([
            ("state", Value::dict([("x", Value::dict::<&str>([]))])),
            ("param_groups", Value::List(vec![])),
        ]);
        assert!(matches!(StateDict::from_value(bad_key), Err(Error::OptimizerLayout(_))));
        assert!(StateDict::from_value(Value::dict::<&str>([])).is_ok());
    }

    #[test]
    fn replaces_sums() {
        let mut sd = StateDict::row_adagrad(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap(), 0.01);
        assert_eq!(sd.indices(), vec![0]);
        assert_eq!(sd.step(0), Some(0.0));
        sd.set_sum(0, Tensor::from_slice(&[3.0f32, 4.0], &[2]).unwrap()).unwrap();
        assert_eq!(sd.sum(0).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
        assert!(sd.set_sum(0, Tensor::from_slice(&[3.0f32], &[1]).unwrap()).is_err());
        assert!(sd.set_sum(1, Tensor::from_slice(&[3.0f32, 4.0], &[2]).unwrap()).is_err());
    }
}
