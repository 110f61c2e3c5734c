//! `model.v<version>.h5`: every parameter that is not an entity embedding (relation operators, global
//! embeddings) under public names, the model's `Adagrad` state and the metadata attributes.

use std::path::{Path, PathBuf};

use ckpt_tensor::Tensor;

use crate::error::{Error, Result};
use crate::h5::{Reader, Writer, read_attr};
use crate::metadata::{AttrValue, FORMAT_VERSION, FORMAT_VERSION_ATTR, Metadata};
use crate::optimizer::OptimizerState;
use crate::partition::{OPTIMIZER_DATASET, check_format_version, read_optimizer};

/// Name of the group holding the parameters (created with tracked creation order).
pub const MODEL_GROUP: &str = "model";
/// Attribute on each parameter dataset holding its private (state-dict) name.
pub const STATE_DICT_KEY_ATTR: &str = "state_dict_key";

/// A PBG name field (`[^./]+`).
fn field(s: &str) -> Option<&str> {
    (!s.is_empty() && !s.contains(['.', '/'])).then_some(s)
}

/// Maps a public dataset name to the model's state-dict key, as PBG's `MODEL_STATE_DICT_MAPPINGS` do:
/// `relations/{idx}/operator/{side}/{param}` ↔ `{side}_operators.{idx}.{param}` and
/// `entities/{type}/global_embedding` ↔ `global_embs.emb_{type}`.
///
/// ```
/// use ckpt_pbg::model::{private_to_public, public_to_private};
/// assert_eq!(public_to_private("relations/0/operator/rhs/real").as_deref(), Some("rhs_operators.0.real"));
/// assert_eq!(private_to_public("global_embs.emb_user").as_deref(), Some("entities/user/global_embedding"));
/// assert_eq!(public_to_private("relations/0/rhs/real"), None);
/// ```
pub fn public_to_private(public: &str) -> Option<String> {
    let parts: Vec<&str> = public.split('/').collect();
    match parts.as_slice() {
        ["relations", idx, "operator", side, param] => {
            Some(format!("{}_operators.{}.{}", field(side)?, field(idx)?, field(param)?))
        }
        ["entities", ty, "global_embedding"] => Some(format!("global_embs.emb_{}", field(ty)?)),
        _ => None,
    }
}

/// The inverse of [`public_to_private`].
pub fn private_to_public(private: &str) -> Option<String> {
    let parts: Vec<&str> = private.split('.').collect();
    match parts.as_slice() {
        [ops, idx, param] => {
            let side = ops.strip_suffix("_operators")?;
            Some(format!("relations/{}/operator/{}/{}", field(idx)?, field(side)?, field(param)?))
        }
        ["global_embs", emb] => Some(format!("entities/{}/global_embedding", field(emb.strip_prefix("emb_")?)?)),
        _ => None,
    }
}

/// One model parameter: its public (dataset) name, its private (state-dict) name and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParameter {
    /// The dataset path under `model/` (`relations/0/operator/rhs/real`).
    pub public_name: String,
    /// The state-dict key (`rhs_operators.0.real`), stored in the `state_dict_key` attribute.
    pub private_name: String,
    /// The value (float32 for every PBG parameter); read from a file, a window of its map.
    pub tensor: Tensor,
}

impl ModelParameter {
    /// A parameter named by its state-dict key; the public name comes from PBG's mapping.
    ///
    /// # Errors
    /// [`Error::UnmappedParameter`] if the key matches no mapping (PBG raises "Couldn't find a match for
    /// state dict key").
    pub fn new(private_name: &str, tensor: Tensor) -> Result<Self> {
        let public_name = private_to_public(private_name)
            .ok_or_else(|| Error::UnmappedParameter { path: PathBuf::new(), name: private_name.to_owned() })?;
        Ok(ModelParameter { public_name, private_name: private_name.to_owned(), tensor })
    }
}

/// The contents of a model file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Model {
    /// The parameters, or `None` when the file has no `model` group (PBG then loads no state dict). Read
    /// from a file they come in h5py's `visititems` order (depth first, names sorted at each level).
    pub parameters: Option<Vec<ModelParameter>>,
    /// The `Adagrad` state blob, if any.
    pub optimizer: Option<OptimizerState>,
    /// The root attributes besides `format_version`.
    pub metadata: Metadata,
}

impl Model {
    /// The parameter with public name `public_name`.
    pub fn get(&self, public_name: &str) -> Option<&ModelParameter> {
        self.parameters.as_deref()?.iter().find(|p| p.public_name == public_name)
    }

    /// The parameter with state-dict key `private_name`.
    pub fn get_private(&self, private_name: &str) -> Option<&ModelParameter> {
        self.parameters.as_deref()?.iter().find(|p| p.private_name == private_name)
    }

    /// The global embedding of an entity type (`entities/<type>/global_embedding`).
    pub fn global_embedding(&self, entity: &str) -> Option<&Tensor> {
        self.get(&format!("entities/{entity}/global_embedding")).map(|p| &p.tensor)
    }

    /// The parameters of relation `index`'s operator on `side` (`lhs`/`rhs`), as `(param name, tensor)` in
    /// the order of the model file.
    pub fn operator_parameters(&self, index: usize, side: &str) -> Vec<(&str, &Tensor)> {
        let prefix = format!("relations/{index}/operator/{side}/");
        self.parameters
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.public_name.strip_prefix(&prefix).map(|n| (n, &p.tensor)))
            .collect()
    }
}

/// Reads a model file like PBG's `load_model`: `format_version` must be 1; the `model` group is optional;
/// every dataset below it becomes a parameter named by its path, whose private name comes from PBG's mapping
/// (or, for names the mapping does not cover, from the dataset's `state_dict_key` attribute).
///
/// # Errors
/// [`Error::CouldNotLoad`], [`Error::NotHdf5`], [`Error::FormatVersion`], [`Error::UnmappedParameter`] for a
/// name PBG could not load, [`Error::WrongDtype`] for non-numeric parameters, [`Error::BadStorage`],
/// [`Error::Hdf5`].
pub fn read_model_file(path: &Path) -> Result<Model> {
    let r = Reader::open(path)?;
    let metadata = check_format_version(path, r.root_attrs()?)?;
    let parameters = if r.exists(MODEL_GROUP) {
        let group = r.root().group(MODEL_GROUP).map_err(|e| Error::hdf5(path, e))?;
        let mut params = Vec::new();
        for (public_name, ds) in r.datasets_below(&group)? {
            let private_name = match public_to_private(&public_name) {
                Some(p) => p,
                None => match ds.attr(STATE_DICT_KEY_ATTR).ok().map(|a| read_attr(&a)) {
                    Some(AttrValue::Str(s)) => s,
                    _ => return Err(Error::UnmappedParameter { path: path.to_path_buf(), name: public_name }),
                },
            };
            let info = r.info(&format!("{MODEL_GROUP}/{public_name}"), &ds)?;
            let tensor = r.read_tensor(&ds, &info)?;
            params.push(ModelParameter { public_name, private_name, tensor });
        }
        Some(params)
    } else {
        None
    };
    let optimizer = read_optimizer(&r)?;
    Ok(Model { parameters, optimizer, metadata })
}

fn check_public_name(name: &str) -> Result<()> {
    if name.is_empty() || name.split('/').any(|p| p.is_empty() || p == "." || p == "..") || name.contains('\0') {
        return Err(Error::InvalidName {
            what: "model parameter",
            name: name.to_owned(),
            reason: "empty path segment",
        });
    }
    Ok(())
}

/// Writes a model file like PBG's `save_model` (`format_version`, metadata, the creation-order-tracked
/// `model` group with one dataset per parameter and its `state_dict_key` attribute, then
/// `optimizer/state_dict`), directly at `path`.
///
/// # Errors
/// [`Error::InvalidName`] for unusable public names, [`Error::InvalidInput`] for duplicate names or dtypes
/// HDF5 cannot hold; [`Error::Hdf5`], [`Error::Io`].
pub fn write_model_file(path: &Path, model: &Model) -> Result<()> {
    if let Some(params) = &model.parameters {
        for (i, p) in params.iter().enumerate() {
            check_public_name(&p.public_name)?;
            let clash = params.iter().take(i).find(|q| {
                q.public_name == p.public_name
                    || p.public_name.starts_with(&format!("{}/", q.public_name))
                    || q.public_name.starts_with(&format!("{}/", p.public_name))
            });
            if let Some(q) = clash {
                return Err(Error::InvalidInput {
                    what: format!("model parameter {:?}", p.public_name),
                    reason: format!("its name clashes with {:?}", q.public_name),
                });
            }
        }
    }
    let mut w = Writer::create(path)?;
    let root = w.root()?;
    w.set_attr(&root, FORMAT_VERSION_ATTR, &AttrValue::Int(FORMAT_VERSION))?;
    for (k, v) in &model.metadata.attrs {
        w.set_attr(&root, k, v)?;
    }
    if let Some(params) = &model.parameters {
        let group = w.create_tracked_group(&root, MODEL_GROUP)?;
        for p in params {
            let ds = w.add_tensor(&group, &p.public_name, &p.tensor)?;
            w.set_attr(&ds, STATE_DICT_KEY_ATTR, &AttrValue::Str(p.private_name.clone()))?;
        }
    }
    if let Some(opt) = &model.optimizer {
        w.add_opaque(&root, OPTIMIZER_DATASET, opt.bytes().as_bytes())?;
    }
    drop(root);
    w.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn mappings_are_inverse() {
        for private in ["rhs_operators.2.linear_transformation", "lhs_operators.0.real", "global_embs.emb_a_b"] {
            let public = private_to_public(private).unwrap();
            assert_eq!(public_to_private(&public).unwrap(), private);
        }
        assert_eq!(private_to_public("lhs_embs.emb_x"), None);
        assert_eq!(private_to_public("global_embs.x"), None);
        assert_eq!(private_to_public("rhs_operators.0.a.b"), None);
        assert_eq!(private_to_public("_operators.0.a"), None);
        assert_eq!(public_to_private("entities/a.b/global_embedding"), None);
        assert!(ModelParameter::new("weird", Tensor::zeros(ckpt_tensor::DType::F32, &[1]).unwrap()).is_err());
    }
}
