//! The one input trait of every writer: [`TensorView`], a tensor of any library seen as a dtype, a shape
//! and its bytes, as the `safetensors` crate's `View`.
//!
//! Every ckpt writer (`torch.save`, distcp, hfai, RecIS, PyTorch-BigGraph, safetensors, Hugging Face shards)
//! takes a state dict: a [`Value`] whose tensors are [`Tensor`]s. A tensor of another library (an ndarray,
//! a buffer from a training framework, a memory-mapped blob) reaches any of them by implementing
//! [`TensorView`]: [`Tensor::from_view`] makes it a [`Tensor`], [`state_dict_of_views`] a whole state dict.
//! [`Tensor`] itself is a view, so code generic over views takes ckpt's own tensors too.

use std::borrow::Cow;

use crate::{DType, Dict, DictKind, Error, Result, Tensor, Value, checked_numel};

/// A tensor as a writer sees it: a dtype, a shape, and `data_len()` bytes in row-major order, little-endian
/// (torch's own layout on every platform ckpt runs on).
///
/// ```
/// use std::borrow::Cow;
/// use ckpt_tensor::{DType, Tensor, TensorView};
/// /// Another library's tensor: f32 values in a Vec.
/// struct Floats { shape: Vec<usize>, values: Vec<f32> }
/// impl TensorView for Floats {
///     fn dtype(&self) -> DType { DType::F32 }
///     fn shape(&self) -> &[usize] { &self.shape }
///     fn data(&self) -> ckpt_tensor::Result<Cow<'_, [u8]>> {
///         Ok(Cow::Owned(self.values.iter().flat_map(|v| v.to_le_bytes()).collect()))
///     }
/// }
/// let t = Tensor::from_view(&Floats { shape: vec![2], values: vec![1.0, 2.0] })?;
/// assert_eq!(t.to_vec::<f32>()?, vec![1.0, 2.0]);
/// # Ok::<(), ckpt_tensor::Error>(())
/// ```
pub trait TensorView {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The shape (empty for a scalar).
    fn shape(&self) -> &[usize];
    /// The bytes, row-major and little-endian: `data_len()` of them.
    ///
    /// # Errors
    /// When the bytes cannot be produced (a view over a file that cannot be read).
    fn data(&self) -> Result<Cow<'_, [u8]>>;
    /// The number of bytes [`TensorView::data`] gives: the shape's element count times the dtype's size
    /// (`None` on overflow).
    fn data_len(&self) -> Option<usize> {
        checked_numel(self.shape())?.checked_mul(self.dtype().size())
    }
}

impl TensorView for Tensor {
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    /// Borrowed for a contiguous tensor; gathered for a strided view.
    fn data(&self) -> Result<Cow<'_, [u8]>> {
        Tensor::data(self)
    }
}

impl<V: TensorView + ?Sized> TensorView for &V {
    fn dtype(&self) -> DType {
        (**self).dtype()
    }
    fn shape(&self) -> &[usize] {
        (**self).shape()
    }
    fn data(&self) -> Result<Cow<'_, [u8]>> {
        (**self).data()
    }
    fn data_len(&self) -> Option<usize> {
        (**self).data_len()
    }
}

impl Tensor {
    /// The tensor `view` describes, owning its bytes (a borrowed view's bytes are copied once; owned ones are
    /// taken as they are).
    ///
    /// # Errors
    /// [`TensorView::data`]'s error; [`Error::BufferSizeMismatch`] when the view gives another number of
    /// bytes than its dtype and shape need, [`Error::ShapeOverflow`] when their size overflows.
    pub fn from_view(view: &impl TensorView) -> Result<Tensor> {
        let need = view.data_len().ok_or_else(|| Error::ShapeOverflow { shape: view.shape().to_vec() })?;
        let data = view.data()?;
        if data.len() != need {
            return Err(Error::BufferSizeMismatch {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                needed: need,
                available: data.len(),
            });
        }
        Tensor::from_buffer(view.dtype(), view.shape(), crate::Buffer::from_vec(data.into_owned()))
    }
}

/// A state dict (a `dict`, as `model.state_dict()` returns it: names to tensors, in order) of the tensors
/// `views` describe, for any writer.
///
/// ```
/// use ckpt_tensor::{Tensor, Value, state_dict_of_views};
/// let w = Tensor::from_slice(&[1.0f32, 2.0], &[2])?;
/// let sd = state_dict_of_views([("w", &w)])?;
/// assert_eq!(sd, Value::dict([("w", Value::Tensor(w.clone()))]));
/// # Ok::<(), ckpt_tensor::Error>(())
/// ```
///
/// # Errors
/// As [`Tensor::from_view`].
pub fn state_dict_of_views<K: Into<String>, V: TensorView>(views: impl IntoIterator<Item = (K, V)>) -> Result<Value> {
    let mut dict = Dict::new(DictKind::Dict);
    for (name, view) in views {
        dict.insert(name.into(), Tensor::from_view(&view)?);
    }
    Ok(Value::Dict(dict))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    struct Short;
    impl TensorView for Short {
        fn dtype(&self) -> DType {
            DType::I64
        }
        fn shape(&self) -> &[usize] {
            &[2]
        }
        fn data(&self) -> Result<Cow<'_, [u8]>> {
            Ok(Cow::Borrowed(&[0; 12]))
        }
    }

    #[test]
    fn a_view_with_the_wrong_byte_count_is_refused() {
        assert!(matches!(Tensor::from_view(&Short), Err(Error::BufferSizeMismatch { needed: 16, available: 12, .. })));
    }

    #[test]
    fn a_strided_tensor_is_a_view_of_its_gathered_bytes() {
        let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap().transpose(0, 1).unwrap();
        let back = Tensor::from_view(&t).unwrap();
        assert_eq!(back.to_vec::<i32>().unwrap(), [1, 3, 2, 4]);
        assert_eq!(back, t);
    }
}
