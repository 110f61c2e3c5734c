//! What an hfai checkpoint holds, independent of how it is split into parts: the models' entries, the
//! optimizers' state dicts and rank 0's `others`, with large tensors possibly still in their chunks.

use ckpt_tensor::{Dict, DictKind, Tensor, Value};
use rayon::prelude::*;

use crate::chunked::Chunked;
use crate::error::Result;

/// A value of a model entry or of an optimizer state entry: an ordinary value, or a large tensor still
/// in the chunks the parts store.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Value(Value),
    Chunked(Chunked),
}

impl Item {
    /// hfai's `count_size` of the item.
    pub(crate) fn size(&self) -> u64 {
        match self {
            Item::Value(v) => crate::partition::count_size(v),
            Item::Chunked(c) => c.nbytes(),
        }
    }
}

/// One model: its entries (state-dict order for a save; merged order for a read) and, for a save, the
/// buffers that go whole into part 0.
#[derive(Debug, Clone, Default)]
pub(crate) struct ModelContents {
    pub(crate) entries: Vec<(Value, Item)>,
    pub(crate) buffers: Vec<(Value, Value)>,
}

/// A per-parameter optimizer state entry: a dict (whose tensors may be chunked) or any other value.
#[derive(Debug, Clone)]
pub(crate) enum StateEntry {
    Map { kind: DictKind, attrs: Option<Box<Value>>, items: Vec<(Value, Item)> },
    Other(Value),
}

impl StateEntry {
    /// The entry for a value of an optimizer's `"state"` dict.
    pub(crate) fn from_value(v: Value) -> Self {
        match v {
            Value::Dict(d) => StateEntry::Map {
                kind: d.kind,
                attrs: d.attrs,
                items: d.items.into_iter().map(|(k, v)| (k, Item::Value(v))).collect(),
            },
            other => StateEntry::Other(other),
        }
    }

    pub(crate) fn size(&self) -> u64 {
        match self {
            StateEntry::Map { items, .. } => items.iter().map(|(_, i)| i.size()).sum(),
            StateEntry::Other(v) => crate::partition::count_size(v),
        }
    }
}

/// One optimizer state dict: every top-level item (the `"state"` item's value is replaced by
/// [`OptimizerContents::state`] when written), and the state entries.
#[derive(Debug, Clone)]
pub(crate) struct OptimizerContents {
    pub(crate) dict: Dict,
    pub(crate) state: Vec<(Value, StateEntry)>,
}

/// Everything but the header.
#[derive(Debug, Clone, Default)]
pub(crate) struct Contents {
    pub(crate) models: Vec<ModelContents>,
    pub(crate) optimizers: Vec<OptimizerContents>,
    pub(crate) others: Vec<(Value, Value)>,
}

/// Bytes copied while concatenating chunks.
pub(crate) type Copied = u64;

impl Contents {
    /// The tensors, tensor bytes and other values of these contents, as a save's report (a chunked tensor
    /// is one tensor).
    pub(crate) fn report(&self) -> ckpt_io::SaveReport {
        let mut report = ckpt_io::SaveReport::default();
        let item = |report: &mut ckpt_io::SaveReport, item: &Item| match item {
            Item::Value(v) => report.count(v),
            Item::Chunked(c) => {
                report.tensors += 1;
                report.bytes += c.nbytes();
            }
        };
        for model in &self.models {
            model.entries.iter().for_each(|(_, i)| item(&mut report, i));
            model.buffers.iter().for_each(|(_, v)| report.count(v));
        }
        for optimizer in &self.optimizers {
            for (k, v) in &optimizer.dict.items {
                if k.as_str() != Some("state") {
                    report.count(v);
                }
            }
            for (_, entry) in &optimizer.state {
                match entry {
                    StateEntry::Map { items, .. } => items.iter().for_each(|(_, i)| item(&mut report, i)),
                    StateEntry::Other(v) => report.count(v),
                }
            }
        }
        self.others.iter().for_each(|(_, v)| report.count(v));
        report
    }

    /// Every chunked item, in a fixed traversal order.
    fn chunked(&self) -> Vec<&Chunked> {
        let mut out = Vec::new();
        for m in &self.models {
            out.extend(m.entries.iter().filter_map(|(_, i)| match i {
                Item::Chunked(c) => Some(c),
                Item::Value(_) => None,
            }));
        }
        for o in &self.optimizers {
            for (_, e) in &o.state {
                if let StateEntry::Map { items, .. } = e {
                    out.extend(items.iter().filter_map(|(_, i)| match i {
                        Item::Chunked(c) => Some(c),
                        Item::Value(_) => None,
                    }));
                }
            }
        }
        out
    }

    /// Concatenates every chunked tensor (in parallel) and returns the plain values: per model its
    /// entries as a `dict`, per optimizer its state dict, and the bytes copied.
    pub(crate) fn materialize(&self) -> Result<(Vec<Value>, Vec<Value>, Copied)> {
        let chunked = self.chunked();
        let whole: Vec<(Tensor, bool)> = chunked.par_iter().map(|c| c.whole()).collect::<Result<_>>()?;
        let copied = chunked.iter().zip(&whole).filter(|(_, (_, copied))| *copied).map(|(c, _)| c.nbytes()).sum();
        // the chunked items come in the order `chunked()` walks them, which is the order below
        let mut whole = whole.into_iter().map(|(t, _)| Value::Tensor(t));
        let mut value = |item: &Item| match item {
            Item::Value(v) => v.clone(),
            Item::Chunked(_) => whole.next().unwrap_or(Value::None),
        };
        let models = self
            .models
            .iter()
            .map(|m| {
                Value::Dict(Dict {
                    kind: DictKind::Dict,
                    items: m.entries.iter().map(|(k, i)| (k.clone(), value(i))).collect(),
                    attrs: None,
                })
            })
            .collect();
        let optimizers = self
            .optimizers
            .iter()
            .map(|o| {
                let state = o
                    .state
                    .iter()
                    .map(|(k, e)| {
                        let v = match e {
                            StateEntry::Map { kind, attrs, items } => Value::Dict(Dict {
                                kind: *kind,
                                items: items.iter().map(|(k2, i)| (k2.clone(), value(i))).collect(),
                                attrs: attrs.clone(),
                            }),
                            StateEntry::Other(v) => v.clone(),
                        };
                        (k.clone(), v)
                    })
                    .collect();
                optimizer_value(&o.dict, state)
            })
            .collect();
        Ok((models, optimizers, copied))
    }
}

/// The optimizer dict with its `"state"` item's value replaced by an `OrderedDict` of `state` (hfai's
/// `split_dict` returns an `OrderedDict`, and the loader keeps rank 0's).
pub(crate) fn optimizer_value(dict: &Dict, state: Vec<(Value, Value)>) -> Value {
    let mut state = Some(state);
    let items = dict
        .items
        .iter()
        .map(|(k, v)| match state.take_if(|_| k.as_str() == Some("state")) {
            Some(s) => (k.clone(), Value::Dict(Dict { kind: DictKind::OrderedDict, items: s, attrs: None })),
            None => (k.clone(), v.clone()),
        })
        .collect();
    Value::Dict(Dict { kind: dict.kind, items, attrs: dict.attrs.clone() })
}
