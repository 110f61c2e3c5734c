//! Tensors made of other tensors: quantized (an int representation, scales and zero points), sparse (indices
//! and values) and nested (a buffer and the sizes of its tensors). Each lists as one entry with its layout,
//! dtype and shape, and has named component tensors, which are what formats without such tensors store.
//!
//! ```
//! use ckpt_tensor::{Composite, DType, Layout, Tensor};
//! let q = Composite::new(
//!     Layout::PerTensorAffine,
//!     DType::QUInt8,
//!     vec![3],
//!     vec![
//!         Tensor::from_slice(&[0u8, 10, 20], &[3])?,
//!         Tensor::from_slice(&[0.5f64], &[])?,
//!         Tensor::from_slice(&[10i64], &[])?,
//!     ],
//! )?;
//! assert_eq!(q.component("zero_point").map(|t| t.dtype()), Some(DType::I64));
//! assert_eq!(q.to_dense()?.to_vec::<f32>()?, vec![-5.0, 0.0, 5.0]);
//! # Ok::<(), ckpt_tensor::Error>(())
//! ```

use crate::dtype::DType;
use crate::error::{Error, Result};
pub use crate::layout::Layout;
use crate::tensor::Tensor;

/// The integer dtype a quantized dtype's values are stored as (`quint8` → `uint8`), as `int_repr()` gives.
pub fn int_repr_dtype(quantized: DType) -> Option<DType> {
    Some(match quantized {
        DType::QUInt8 => DType::U8,
        DType::QInt8 => DType::I8,
        DType::QInt32 => DType::I32,
        _ => return None,
    })
}

/// The quantized dtype whose values are stored as `int` (the inverse of [`int_repr_dtype`]).
pub fn quantized_dtype(int: DType) -> Option<DType> {
    Some(match int {
        DType::U8 => DType::QUInt8,
        DType::I8 => DType::QInt8,
        DType::I32 => DType::QInt32,
        _ => return None,
    })
}

/// A tensor made of named component tensors (see the module docs): a quantized, sparse or nested tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Composite {
    /// How the components make the values.
    pub layout: Layout,
    /// The tensor's dtype as torch reports it (`quint8` for a quantized tensor, the values' for the others).
    pub dtype: DType,
    /// The dense shape; a nested tensor's is its number of tensors.
    pub shape: Vec<usize>,
    /// The components, in the order of [`Layout::components`].
    pub components: Vec<Tensor>,
    /// The axis of a per-channel quantized tensor's scales.
    pub axis: Option<usize>,
    /// Whether a sparse COO tensor is coalesced (torch's `is_coalesced()`, kept as saved).
    pub coalesced: Option<bool>,
    /// torch's `requires_grad`.
    pub requires_grad: bool,
}

fn bad(layout: Layout, reason: impl Into<String>) -> Error {
    Error::BadComposite { layout, reason: reason.into() }
}

impl Composite {
    /// A composite of `layout` whose components are `components` (in [`Layout::components`] order).
    ///
    /// # Errors
    /// [`Error::BadComposite`] when the number of components or a quantized tensor's dtypes do not fit the
    /// layout.
    pub fn new(layout: Layout, dtype: DType, shape: Vec<usize>, components: Vec<Tensor>) -> Result<Composite> {
        if components.len() != layout.components().len() {
            let (n, names) = (layout.components().len(), layout.components().join(", "));
            return Err(bad(layout, format!("{} components, expected {n} ({names})", components.len())));
        }
        if layout.is_quantized() {
            let Some(int) = int_repr_dtype(dtype) else {
                return Err(bad(layout, format!("dtype {dtype} is not a quantized dtype (quint8, qint8, qint32)")));
            };
            if components.first().map(Tensor::dtype) != Some(int) {
                return Err(bad(layout, format!("the int representation of a {dtype} tensor must be {int}")));
            }
        }
        Ok(Composite { layout, dtype, shape, components, axis: None, coalesced: None, requires_grad: false })
    }

    /// The component called `name` ([`Layout::components`]).
    pub fn component(&self, name: &str) -> Option<&Tensor> {
        let i = self.layout.components().iter().position(|c| *c == name)?;
        self.components.get(i)
    }

    /// The components with their names.
    pub fn named_components(&self) -> impl Iterator<Item = (&'static str, &Tensor)> {
        self.layout.components().iter().copied().zip(&self.components)
    }

    /// The dense tensor torch makes of it: `dequantize()` (float32, `(int - zero_point) * scale` rounded as
    /// torch rounds it) of a quantized tensor, `to_dense()` of a sparse one (the values added into zeros, as
    /// torch does: repeated indices of an uncoalesced tensor summed, a stored -0.0 made +0.0).
    ///
    /// # Errors
    /// [`Error::NoDenseForm`] for a nested tensor and batched compressed sparse tensors;
    /// [`Error::BadComposite`] for components that do not make a tensor of the shape (an index out of range,
    /// pointers that decrease, ...).
    pub fn to_dense(&self) -> Result<Tensor> {
        match self.layout {
            Layout::PerTensorAffine | Layout::PerChannelAffine => self.dequantize(),
            Layout::SparseCoo => self.coo_dense(),
            Layout::SparseCsr | Layout::SparseCsc | Layout::SparseBsr | Layout::SparseBsc => self.compressed_dense(),
            Layout::Nested => Err(Error::NoDenseForm { layout: self.layout, reason: "its tensors differ in shape" }),
        }
    }

    fn part(&self, i: usize) -> Result<&Tensor> {
        self.components.get(i).ok_or_else(|| bad(self.layout, "missing component"))
    }

    /// A component's elements as i64 (an int representation, zero points, indices).
    fn ints(&self, i: usize) -> Result<Vec<i64>> {
        let t = self.part(i)?.to_contiguous()?;
        Ok(match t.dtype() {
            DType::U8 => t.to_vec::<u8>()?.into_iter().map(i64::from).collect(),
            DType::I8 => t.to_vec::<i8>()?.into_iter().map(i64::from).collect(),
            DType::I32 => t.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
            DType::I64 => t.to_vec::<i64>()?,
            other => return Err(bad(self.layout, format!("{} must be an integer tensor, got {other}", self.name(i)))),
        })
    }

    fn name(&self, i: usize) -> &'static str {
        self.layout.components().get(i).copied().unwrap_or("component")
    }

    fn dequantize(&self) -> Result<Tensor> {
        let q = self.ints(0)?;
        let shape = self.part(0)?.shape().to_vec();
        let scales = self.part(1)?.to_contiguous()?;
        let scales: Vec<f64> = match scales.dtype() {
            DType::F64 => scales.to_vec::<f64>()?,
            DType::F32 => scales.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            other => return Err(bad(self.layout, format!("scale must be a float tensor, got {other}"))),
        };
        let zero_points = self.ints(2)?;
        let mut out = Vec::with_capacity(q.len());
        if self.layout == Layout::PerTensorAffine {
            let (Some(&scale), Some(&zp)) = (scales.first(), zero_points.first()) else {
                return Err(bad(self.layout, "no scale or zero point"));
            };
            // torch's dequantize_val: static_cast<float>(scale) * (value - static_cast<int32_t>(zero_point)).
            let (scale, zp) = (scale as f32, zp as i32);
            out.extend(q.iter().map(|&v| scale * (v as i32).wrapping_sub(zp) as f32));
        } else {
            let axis = self.axis.ok_or_else(|| bad(self.layout, "no axis"))?;
            let Some(&channels) = shape.get(axis) else {
                return Err(bad(self.layout, format!("axis {axis} is outside the shape {shape:?}")));
            };
            if scales.len() != channels || zero_points.len() != channels {
                return Err(bad(
                    self.layout,
                    format!(
                        "{} scales and {} zero points for {channels} channels of axis {axis}",
                        scales.len(),
                        zero_points.len()
                    ),
                ));
            }
            let inner: usize = shape.iter().skip(axis + 1).product();
            // torch's per-channel kernel: (float(value) - zero_point) in float32, times the float64 scale,
            // rounded to float32.
            for (i, &v) in q.iter().enumerate() {
                let c = (i / inner.max(1)) % channels.max(1);
                let (s, z) = (scales.get(c).copied().unwrap_or(0.0), zero_points.get(c).copied().unwrap_or(0));
                out.push((f64::from(v as f32 - z as f32) * s) as f32);
            }
        }
        Tensor::from_slice(&out, &shape)
    }

    /// Where the dense values go: an output of `self.shape` of the values' dtype, filled block by block.
    fn coo_dense(&self) -> Result<Tensor> {
        let indices = self.part(0)?;
        let values = self.part(1)?.to_contiguous()?;
        let [sparse_dims, nnz] = *indices.shape() else {
            return Err(bad(self.layout, format!("indices must be 2-D, got shape {:?}", indices.shape())));
        };
        let idx = self.ints(0)?;
        let mut out = Dense::new(self, values.dtype(), sparse_dims, values.shape().get(1..).unwrap_or_default())?;
        if values.shape().first() != Some(&nnz) {
            return Err(bad(self.layout, format!("{nnz} indices but values of shape {:?}", values.shape())));
        }
        let data = values.data()?;
        for j in 0..nnz {
            let mut at = 0usize;
            for d in 0..sparse_dims {
                let i = idx.get(d * nnz + j).copied().unwrap_or(-1);
                at = at * out.dims[d] + out.index(i, d)?;
            }
            out.add(at, &data, j)?;
        }
        out.finish()
    }

    fn compressed_dense(&self) -> Result<Tensor> {
        let layout = self.layout;
        let (pointers, indices, values) = (self.part(0)?, self.part(1)?, self.part(2)?.to_contiguous()?);
        if pointers.dim() != 1 || indices.dim() != 1 {
            return Err(Error::NoDenseForm { layout, reason: "batched compressed sparse tensors are not supported" });
        }
        let blocked = matches!(layout, Layout::SparseBsr | Layout::SparseBsc);
        let by_rows = matches!(layout, Layout::SparseCsr | Layout::SparseBsr);
        let nnz = indices.numel();
        let vshape = values.shape();
        if vshape.first() != Some(&nnz) {
            return Err(bad(layout, format!("{nnz} indices but values of shape {vshape:?}")));
        }
        let (bh, bw, dense_dims) = if blocked {
            match vshape {
                [_, bh, bw, rest @ ..] => (*bh, *bw, rest),
                _ => return Err(bad(layout, format!("block values must be at least 3-D, got {vshape:?}"))),
            }
        } else {
            (1, 1, vshape.get(1..).unwrap_or_default())
        };
        let mut out = Dense::new(self, values.dtype(), 2, dense_dims)?;
        let (rows, cols) = (out.dims[0], out.dims[1]);
        if bh == 0 || bw == 0 || rows % bh != 0 || cols % bw != 0 {
            return Err(bad(layout, format!("blocks of {bh}x{bw} do not tile the shape {:?}", self.shape)));
        }
        let (outer, inner_n) = if by_rows { (rows / bh, cols / bw) } else { (cols / bw, rows / bh) };
        let ptr = self.ints(0)?;
        let idx = self.ints(1)?;
        if ptr.len() != outer + 1 {
            return Err(bad(layout, format!("{} pointers for {outer} compressed rows or columns", ptr.len())));
        }
        let data = values.data()?;
        for o in 0..outer {
            let (start, end) = (ptr.get(o).copied().unwrap_or(-1), ptr.get(o + 1).copied().unwrap_or(-1));
            let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
                return Err(bad(layout, format!("negative pointer at {o}")));
            };
            if start > end || end > nnz {
                return Err(bad(layout, format!("pointers {start}..{end} at {o} are not within 0..{nnz}")));
            }
            for k in start..end {
                let plain = idx.get(k).copied().unwrap_or(-1);
                let plain = usize::try_from(plain)
                    .ok()
                    .filter(|&p| p < inner_n)
                    .ok_or_else(|| bad(layout, format!("index {plain} out of range 0..{inner_n}")))?;
                let (br, bc) = if by_rows { (o, plain) } else { (plain, o) };
                for i in 0..bh {
                    for jj in 0..bw {
                        let at = (br * bh + i) * cols + bc * bw + jj;
                        out.add(at, &data, (k * bh + i) * bw + jj)?;
                    }
                }
            }
        }
        out.finish()
    }
}

/// A dense output being filled: `dims` are the sparse dimensions, each position holds `inner` elements.
struct Dense {
    layout: Layout,
    dtype: DType,
    shape: Vec<usize>,
    dims: Vec<usize>,
    inner: usize,
    bytes: Vec<u8>,
    set: Vec<bool>,
}

impl Dense {
    fn new(c: &Composite, dtype: DType, sparse_dims: usize, dense_dims: &[usize]) -> Result<Dense> {
        let layout = c.layout;
        if c.shape.len() != sparse_dims + dense_dims.len() || c.shape.get(sparse_dims..) != Some(dense_dims) {
            return Err(bad(
                layout,
                format!("shape {:?} is not {sparse_dims} sparse dimensions then the values' {dense_dims:?}", c.shape),
            ));
        }
        let dims = c.shape.get(..sparse_dims).unwrap_or_default().to_vec();
        let overflow = || Error::ShapeOverflow { shape: c.shape.clone() };
        let positions = crate::tensor::checked_numel(&dims).ok_or_else(overflow)?;
        let inner = crate::tensor::checked_numel(dense_dims).ok_or_else(overflow)?;
        let len = positions.checked_mul(inner).and_then(|n| n.checked_mul(dtype.size())).ok_or_else(overflow)?;
        Ok(Dense {
            layout,
            dtype,
            shape: c.shape.clone(),
            dims,
            inner,
            bytes: vec![0; len],
            set: vec![false; positions],
        })
    }

    fn index(&self, i: i64, d: usize) -> Result<usize> {
        let n = self.dims.get(d).copied().unwrap_or(0);
        usize::try_from(i)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| bad(self.layout, format!("index {i} of dimension {d} is out of range 0..{n}")))
    }

    /// Adds value block `j` of `data` at position `at` (copied the first time, summed after, as torch sums
    /// an uncoalesced tensor's repeated indices).
    fn add(&mut self, at: usize, data: &[u8], j: usize) -> Result<()> {
        let n = self.inner * self.dtype.size();
        let src = j.checked_mul(n).and_then(|s| data.get(s..s.checked_add(n)?));
        let dst = at.checked_mul(n).and_then(|s| self.bytes.get_mut(s..s.checked_add(n)?));
        let (Some(src), Some(dst), Some(set)) = (src, dst, self.set.get_mut(at)) else {
            return Err(bad(self.layout, format!("value {j} or position {at} is outside the tensor")));
        };
        if !*set {
            // torch adds the values into zeros: the same bits, but +0.0 for a stored -0.0.
            dst.copy_from_slice(src);
            *set = true;
            let negative_zero: &[u8] = match self.dtype {
                DType::F64 => &[0, 0, 0, 0, 0, 0, 0, 0x80],
                DType::F32 => &[0, 0, 0, 0x80],
                DType::F16 | DType::BF16 => &[0, 0x80],
                _ => return Ok(()),
            };
            for x in dst.chunks_exact_mut(negative_zero.len()) {
                if x == negative_zero {
                    x.fill(0);
                }
            }
            return Ok(());
        }
        macro_rules! sum {
            ($t:ty) => {{
                const W: usize = std::mem::size_of::<$t>();
                for (d, s) in dst.chunks_exact_mut(W).zip(src.chunks_exact(W)) {
                    let mut a = [0u8; W];
                    let mut b = [0u8; W];
                    a.copy_from_slice(d);
                    b.copy_from_slice(s);
                    d.copy_from_slice(&(<$t>::from_le_bytes(a) + <$t>::from_le_bytes(b)).to_le_bytes());
                }
            }};
        }
        macro_rules! wrapping {
            ($t:ty) => {{
                const W: usize = std::mem::size_of::<$t>();
                for (d, s) in dst.chunks_exact_mut(W).zip(src.chunks_exact(W)) {
                    let mut a = [0u8; W];
                    let mut b = [0u8; W];
                    a.copy_from_slice(d);
                    b.copy_from_slice(s);
                    d.copy_from_slice(&<$t>::from_le_bytes(a).wrapping_add(<$t>::from_le_bytes(b)).to_le_bytes());
                }
            }};
        }
        match self.dtype {
            DType::F32 => sum!(f32),
            DType::F64 => sum!(f64),
            DType::I64 => wrapping!(i64),
            DType::I32 => wrapping!(i32),
            DType::I16 => wrapping!(i16),
            DType::I8 => wrapping!(i8),
            DType::U8 => wrapping!(u8),
            DType::Bool => {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d |= *s;
                }
            }
            other => {
                return Err(Error::NoDenseForm {
                    layout: self.layout,
                    reason: match other {
                        DType::F16 | DType::BF16 => "repeated indices of 16-bit float values are not summed here",
                        _ => "repeated indices of this dtype are not summed here",
                    },
                });
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<Tensor> {
        Tensor::from_buffer(self.dtype, &self.shape, crate::Buffer::from_vec(self.bytes))
    }
}
