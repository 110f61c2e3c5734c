//! Strided tensors over shared [`Buffer`]s.

use std::borrow::Cow;
use std::fmt;

use smallvec::SmallVec;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A Rust element type that has a torch dtype and can be viewed from bytes without copying.
pub trait Element: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + 'static {
    /// The dtype whose elements have this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DType = DType::$d; })*
    };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64,
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16);

/// A dense tensor: dtype, shape, strides and storage offset (both in elements) over a shared storage
/// [`Buffer`], as torch lays it out.
///
/// Views that share a storage share the `Buffer` (no copy). [`Tensor::is_contiguous`] tells whether the
/// elements are in row-major order without gaps; [`Tensor::to_contiguous`] gathers any strided view
/// (transposes, slices, zero-stride expansions) into a fresh row-major tensor.
///
/// ```
/// use ckpt_tensor::{DType, Tensor};
/// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
/// assert!(t.is_contiguous());
/// let tt = t.transpose(0, 1).unwrap();
/// assert_eq!(tt.shape(), &[3, 2]);
/// assert!(!tt.is_contiguous());
/// assert_eq!(tt.to_vec::<f32>().unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// ```
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Dims,
    strides: Dims,
    storage_offset: usize,
    storage: Buffer,
    requires_grad: bool,
    conj: bool,
    neg: bool,
}

/// A tensor's sizes or strides: inline up to 4 dimensions, so that most tensors allocate for neither.
type Dims = SmallVec<[usize; 4]>;

/// Row-major (C-contiguous) strides for `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    contiguous_dims(shape).into_vec()
}

fn contiguous_dims(shape: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// Number of elements of `shape`, or `None` on overflow.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl Tensor {
    /// A contiguous tensor over the whole of `storage`.
    ///
    /// # Errors
    /// [`Error::ShapeOverflow`]; [`Error::BufferSizeMismatch`] if `storage` is not exactly `numel × dtype.size()` bytes.
    pub fn from_buffer(dtype: DType, shape: &[usize], storage: Buffer) -> Result<Self> {
        let nbytes = checked_numel(shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::ShapeOverflow { shape: shape.to_vec() })?;
        if nbytes != storage.len() {
            return Err(Error::BufferSizeMismatch {
                dtype,
                shape: shape.to_vec(),
                needed: nbytes,
                available: storage.len(),
            });
        }
        Ok(Tensor {
            dtype,
            strides: contiguous_dims(shape),
            shape: Dims::from_slice(shape),
            storage_offset: 0,
            storage,
            requires_grad: false,
            conj: false,
            neg: false,
        })
    }

    /// A strided view of `storage`, validated like torch's `set_`: the last element addressed must lie
    /// inside the storage.
    ///
    /// # Errors
    /// [`Error::StridesLengthMismatch`] if shape and strides differ in length, [`Error::ViewOverflow`] or
    /// [`Error::StorageTooShort`] if the view reaches outside the
    /// storage (or the storage is not a whole number of elements).
    pub fn from_parts(
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        storage_offset: usize,
        storage: Buffer,
    ) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(Error::StridesLengthMismatch { shape: shape.to_vec(), strides: strides.to_vec() });
        }
        let overflow = || Error::ViewOverflow { storage_offset, shape: shape.to_vec(), strides: strides.to_vec() };
        let needed = required_storage_elements(shape, strides, storage_offset).ok_or_else(overflow)?;
        let needed_bytes = needed.checked_mul(dtype.size()).ok_or_else(overflow)?;
        if needed_bytes > storage.len() {
            return Err(Error::StorageTooShort {
                dtype,
                storage_offset,
                shape: shape.to_vec(),
                strides: strides.to_vec(),
                needed: needed_bytes,
                available: storage.len(),
            });
        }
        Ok(Tensor {
            dtype,
            shape: Dims::from_slice(shape),
            strides: Dims::from_slice(strides),
            storage_offset,
            storage,
            requires_grad: false,
            conj: false,
            neg: false,
        })
    }

    /// A contiguous tensor holding a copy of `data` (64-byte aligned).
    ///
    /// # Errors
    /// [`Error::BufferSizeMismatch`] if `shape` does not hold `data.len()` elements.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Self> {
        Self::from_buffer(T::DTYPE, shape, Buffer::copy_from(data.as_bytes())?)
    }

    /// A zero-filled contiguous tensor.
    ///
    /// # Errors
    /// [`Error::ShapeOverflow`] on overflow, [`Error::AllocationFailed`] if the allocation fails.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Self> {
        let nbytes = checked_numel(shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::ShapeOverflow { shape: shape.to_vec() })?;
        Self::from_buffer(dtype, shape, Buffer::zeroed(nbytes)?)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The sizes of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides of each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.storage_offset
    }

    /// The whole storage this tensor views.
    pub fn storage(&self) -> &Buffer {
        &self.storage
    }

    /// Whether autograd tracks this tensor (kept for round trips; `nn.Parameter`s usually have it set).
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// Sets the `requires_grad` flag.
    pub fn set_requires_grad(&mut self, requires_grad: bool) {
        self.requires_grad = requires_grad;
    }

    /// Whether torch's lazy conjugation bit is set: the logical values are the complex conjugates of the
    /// stored ones ([`Tensor::data`] applies it; the storage is untouched and still shared).
    pub fn is_conj(&self) -> bool {
        self.conj
    }

    /// Whether torch's lazy negation bit is set: the logical values are the negated stored ones.
    pub fn is_neg(&self) -> bool {
        self.neg
    }

    /// This view with the conjugation and negation bits set as given (what `_rebuild_tensor_v2`'s
    /// `{'conj': True}` / `{'neg': True}` metadata means).
    ///
    /// # Errors
    /// [`Error::ConjugateNotComplex`] for the conjugation bit on a non-complex dtype.
    pub fn with_lazy_bits(mut self, conj: bool, neg: bool) -> Result<Self> {
        if conj && !self.dtype.is_complex() {
            return Err(Error::ConjugateNotComplex { dtype: self.dtype });
        }
        self.conj = conj;
        self.neg = neg;
        Ok(self)
    }

    /// This tensor with the `requires_grad` flag set to `requires_grad`.
    #[must_use]
    pub fn with_requires_grad(mut self, requires_grad: bool) -> Self {
        self.requires_grad = requires_grad;
        self
    }

    /// Number of dimensions.
    pub fn dim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a 0-dim tensor). Validated at construction, so it cannot overflow.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the tensor's own elements (`numel × element size`), not of its storage.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Whether the elements are laid out row-major without gaps (torch's `is_contiguous()`; dimensions of
    /// size 1 may have any stride, and an empty tensor is contiguous).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 {
                if s != expected {
                    return false;
                }
                expected *= d;
            }
        }
        true
    }

    /// Whether this tensor covers its whole storage, contiguously from offset 0 (what safetensors and the
    /// torch writer can write without copying or writing extra bytes).
    pub fn is_dense_storage(&self) -> bool {
        self.is_contiguous() && self.storage_offset == 0 && self.nbytes() == self.storage.len()
    }

    /// The tensor's elements in row-major order: borrowed from the storage when contiguous, gathered into a
    /// new vector otherwise.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if a gather cannot allocate.
    pub fn data(&self) -> Result<Cow<'_, [u8]>> {
        if self.conj || self.neg {
            let mut raw = self.stored_data()?.into_owned();
            apply_lazy_bits(self.dtype, &mut raw, self.conj, self.neg)?;
            return Ok(Cow::Owned(raw));
        }
        self.stored_data()
    }

    /// Hands the tensor's elements, in row-major order as [`Tensor::data`] gives them, to `f`: in pieces of
    /// at most `piece` bytes, made one at a time, when the tensor is a contiguous view of a range-made
    /// deferred storage ([`Buffer::deferred_ranged`], e.g. rows gathered for a writer); at once otherwise.
    /// A writer streaming such a tensor holds one piece of it instead of all of it.
    ///
    /// # Errors
    /// The first error of `f`, or of making the bytes.
    pub fn data_pieces<E: From<Error>>(
        &self,
        piece: usize,
        mut f: impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        if self.storage.is_deferred() && self.is_contiguous() && !self.conj && !self.neg && self.nbytes() > 0 {
            let window = self.storage.slice_len(self.storage_offset * self.dtype.size(), self.nbytes())?;
            return window.pieces(piece, f);
        }
        f(&self.data()?)
    }

    /// The stored elements in row-major order, without applying the conjugation/negation bits.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if a gather cannot allocate.
    pub fn stored_data(&self) -> Result<Cow<'_, [u8]>> {
        if self.storage.is_deferred() && self.nbytes() > 0 {
            // Bytes made on demand ([`Buffer::deferred`]): made for this call alone, so that a writer holds
            // one such tensor at a time.
            if self.is_contiguous() {
                // Only the tensor's own bytes where the storage can make a range.
                let window = self.storage.slice_len(self.storage_offset * self.dtype.size(), self.nbytes())?;
                return Ok(Cow::Owned(window.bytes()?.into_owned()));
            }
            let made = self.storage.bytes()?.into_owned();
            if self.is_contiguous() && self.storage_offset == 0 && made.len() == self.nbytes() {
                return Ok(Cow::Owned(made));
            }
            let view = Tensor { storage: Buffer::from_vec(made), conj: false, neg: false, ..self.clone() };
            return Ok(Cow::Owned(view.stored_data()?.into_owned()));
        }
        if self.is_contiguous() {
            return self.window().map(Cow::Borrowed);
        }
        let mut out = Vec::new();
        out.try_reserve_exact(self.nbytes()).map_err(|_| Error::AllocationFailed { bytes: self.nbytes() })?;
        self.gather_into(&mut out);
        if out.len() != self.nbytes() {
            return Err(Error::ViewOutsideStorage);
        }
        Ok(Cow::Owned(out))
    }

    /// The storage bytes of a contiguous tensor's elements (callers check contiguity).
    fn window(&self) -> Result<&[u8]> {
        if self.nbytes() == 0 {
            // an empty view may sit at any offset, even past its storage (torch allows it)
            return Ok(&[]);
        }
        let start = self.storage_offset * self.dtype.size();
        self.storage.as_bytes().get(start..start + self.nbytes()).ok_or(Error::ViewOutsideStorage)
    }

    /// Appends the elements in row-major order to `out`.
    fn gather_into(&self, out: &mut Vec<u8>) {
        let es = self.dtype.size();
        let src = self.storage.as_bytes();
        if self.numel() == 0 {
            return;
        }
        // Innermost run: if the last dimension has stride 1, copy whole rows.
        let (outer_dims, run) = match (self.shape.last(), self.strides.last()) {
            (Some(&d), Some(&1)) => (self.shape.len() - 1, d),
            (None, None) => (0, 1),
            _ => (self.shape.len(), 1),
        };
        let run_bytes = run * es;
        let mut index = vec![0usize; outer_dims];
        loop {
            let elem: usize =
                self.storage_offset + index.iter().zip(&self.strides).map(|(&i, &s)| i * s).sum::<usize>();
            let start = elem * es;
            if let Some(chunk) = src.get(start..start + run_bytes) {
                out.extend_from_slice(chunk);
            }
            // Odometer over the outer dimensions.
            let mut d = outer_dims;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }

    /// A row-major tensor with the same values. Zero copy when already contiguous (the result is a window of
    /// the same storage, offset 0); otherwise the elements are gathered into a new aligned buffer.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if a gather cannot allocate.
    pub fn to_contiguous(&self) -> Result<Tensor> {
        let storage = if self.nbytes() == 0 {
            self.storage.slice(0..0)?
        } else if self.is_contiguous() && !self.conj && !self.neg {
            self.storage.slice_len(self.storage_offset * self.dtype.size(), self.nbytes())?
        } else {
            let data = self.data()?;
            Buffer::copy_from(&data)?
        };
        Ok(Tensor {
            dtype: self.dtype,
            strides: contiguous_dims(&self.shape),
            shape: self.shape.clone(),
            storage_offset: 0,
            storage,
            requires_grad: self.requires_grad,
            conj: false,
            neg: false,
        })
    }

    /// The elements as a typed slice, without copying.
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] if `T` is not this tensor's dtype, [`Error::NotContiguous`] if the tensor is not
    /// contiguous, [`Error::Misaligned`] if its
    /// bytes are not aligned for `T` (use [`Tensor::to_vec`] or [`Tensor::to_contiguous`] then).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_dtype::<T>()?;
        if !self.is_contiguous() || self.conj || self.neg {
            return Err(Error::NotContiguous);
        }
        <[T]>::ref_from_bytes(self.window()?).map_err(|_| Error::Misaligned { type_name: std::any::type_name::<T>() })
    }

    /// The elements in row-major order, copied into a vector (works for any layout and alignment).
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] if `T` is not this tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>()?;
        let data = self.data()?;
        Ok(data.chunks_exact(size_of::<T>()).filter_map(|c| T::read_from_bytes(c).ok()).collect())
    }

    fn check_dtype<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DtypeMismatch {
                expected: T::DTYPE,
                found: self.dtype,
                type_name: std::any::type_name::<T>(),
            });
        }
        Ok(())
    }

    /// A view of `len` elements of dimension `dim` starting at `start` (torch's `narrow`), without copying.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`] or [`Error::NarrowOutOfRange`] if `dim` or the range is out of bounds.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let size = *self.shape.get(dim).ok_or_else(|| Error::DimOutOfRange { dim, ndim: self.dim() })?;
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::NarrowOutOfRange { dim, start, len, size });
        }
        let mut t = self.clone();
        if len > 0 {
            t.storage_offset += start * self.strides[dim];
        }
        t.shape[dim] = len;
        Ok(t)
    }

    /// A view of the hyper-rectangle `offsets .. offsets + sizes` (one entry per dimension), without copying.
    ///
    /// # Errors
    /// [`Error::RegionRankMismatch`], [`Error::NarrowOutOfRange`] if the region is not inside the tensor.
    pub fn region(&self, offsets: &[usize], sizes: &[usize]) -> Result<Tensor> {
        if offsets.len() != self.dim() || sizes.len() != self.dim() {
            return Err(Error::RegionRankMismatch { offsets: offsets.len(), sizes: sizes.len(), ndim: self.dim() });
        }
        let mut t = self.clone();
        for (d, (&o, &s)) in offsets.iter().zip(sizes).enumerate() {
            t = t.narrow(d, o, s)?;
        }
        Ok(t)
    }

    /// Swaps two dimensions (a view).
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`] if a dimension is out of range.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        if a >= self.dim() || b >= self.dim() {
            return Err(Error::DimOutOfRange { dim: a.max(b), ndim: self.dim() });
        }
        let mut t = self.clone();
        t.shape.swap(a, b);
        t.strides.swap(a, b);
        Ok(t)
    }

    /// The same elements with another shape; zero copy when contiguous, gathered first otherwise.
    ///
    /// # Errors
    /// [`Error::ReshapeMismatch`] if the element counts differ.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if checked_numel(shape) != Some(self.numel()) {
            return Err(Error::ReshapeMismatch { from: self.shape.to_vec(), numel: self.numel(), to: shape.to_vec() });
        }
        let mut t = self.to_contiguous()?;
        t.strides = contiguous_dims(shape);
        t.shape = Dims::from_slice(shape);
        Ok(t)
    }

    /// Whether both tensors have the same dtype, shape and element bytes (NaNs with equal bits are equal).
    pub fn bitwise_eq(&self, other: &Tensor) -> bool {
        self.dtype == other.dtype
            && self.shape == other.shape
            && match (self.data(), other.data()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            }
    }

    /// Whether `self` and `other` view the same storage.
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        self.storage.same_storage(&other.storage)
    }
}

/// Applies torch's lazy bits to row-major element bytes: conjugation negates imaginary parts, negation
/// negates every element (two's complement wrap for integers, like torch).
fn apply_lazy_bits(dtype: DType, bytes: &mut [u8], conj: bool, neg: bool) -> Result<()> {
    fn flip_sign_bits(bytes: &mut [u8], width: usize, step: usize, first: usize) {
        // IEEE floats (f16/bf16/f32/f64 and the complex parts): negation flips the top bit of each value.
        let mut i = first;
        while i + width <= bytes.len() {
            if let Some(b) = bytes.get_mut(i + width - 1) {
                *b ^= 0x80;
            }
            i += step;
        }
    }
    let es = dtype.size();
    match dtype {
        DType::C32 | DType::C64 | DType::C128 => {
            let half_width = es / 2;
            if conj {
                flip_sign_bits(bytes, half_width, es, half_width);
            }
            if neg {
                flip_sign_bits(bytes, half_width, half_width, 0);
            }
        }
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 if neg => flip_sign_bits(bytes, es, es, 0),
        DType::I8 | DType::I16 | DType::I32 | DType::I64 if neg => {
            for chunk in bytes.chunks_exact_mut(es) {
                // two's complement negation: invert and add one, little-endian
                let mut carry = true;
                for b in chunk.iter_mut() {
                    let (v, c) = (!*b).overflowing_add(u8::from(carry));
                    *b = v;
                    carry = c;
                }
            }
        }
        _ if !neg => {}
        other => return Err(Error::NegationUnsupported { dtype: other }),
    }
    Ok(())
}

/// Elements a view needs in its storage: `offset + Σ (size_i − 1) × stride_i + 1`, or 0 when any size is 0
/// (torch's `computeStorageNbytes`). `None` on overflow.
pub fn required_storage_elements(shape: &[usize], strides: &[usize], storage_offset: usize) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = storage_offset;
    for (&d, &s) in shape.iter().zip(strides) {
        last = last.checked_add((d - 1).checked_mul(s)?)?;
    }
    last.checked_add(1)
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("storage_offset", &self.storage_offset)
            .field("storage", &self.storage)
            .field("requires_grad", &self.requires_grad)
            .field("conj", &self.conj)
            .field("neg", &self.neg)
            .finish()
    }
}

impl PartialEq for Tensor {
    /// Equal dtype, shape, values (bitwise) and `requires_grad`; layout and storage sharing are not compared.
    fn eq(&self, other: &Self) -> bool {
        self.requires_grad == other.requires_grad && self.bitwise_eq(other)
    }
}
