//! [`Layout`]: how a composite tensor's components make its values (quantized, sparse, nested), the kinds torch
//! has beside strided tensors.

/// How a [`Composite`](crate::Composite)'s components make its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// Quantized with one scale and zero point (`torch.per_tensor_affine`).
    PerTensorAffine,
    /// Quantized with a scale and zero point per index of one axis (`torch.per_channel_affine`).
    PerChannelAffine,
    /// `torch.sparse_coo`: indices `[sparse dims, nnz]` and values `[nnz, dense dims...]`.
    SparseCoo,
    /// `torch.sparse_csr`: row pointers, column indices and values.
    SparseCsr,
    /// `torch.sparse_csc`: column pointers, row indices and values.
    SparseCsc,
    /// `torch.sparse_bsr`: CSR of blocks (values `[nnz, block rows, block columns, ...]`).
    SparseBsr,
    /// `torch.sparse_bsc`: CSC of blocks.
    SparseBsc,
    /// A nested tensor: its tensors' elements in one buffer, with each tensor's sizes, strides and offset.
    Nested,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 8] = [
        Layout::PerTensorAffine,
        Layout::PerChannelAffine,
        Layout::SparseCoo,
        Layout::SparseCsr,
        Layout::SparseCsc,
        Layout::SparseBsr,
        Layout::SparseBsc,
        Layout::Nested,
    ];

    /// torch's name: the qscheme (`per_tensor_affine`), the layout (`sparse_csr`), or `nested`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::PerTensorAffine => "per_tensor_affine",
            Layout::PerChannelAffine => "per_channel_affine",
            Layout::SparseCoo => "sparse_coo",
            Layout::SparseCsr => "sparse_csr",
            Layout::SparseCsc => "sparse_csc",
            Layout::SparseBsr => "sparse_bsr",
            Layout::SparseBsc => "sparse_bsc",
            Layout::Nested => "nested",
        }
    }

    /// The layout [`Layout::name`] names.
    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Whether this is a quantization scheme.
    pub fn is_quantized(self) -> bool {
        matches!(self, Layout::PerTensorAffine | Layout::PerChannelAffine)
    }

    /// The names of the components, in their order (torch's accessor names: `int_repr`, `crow_indices`, ...).
    pub fn components(self) -> &'static [&'static str] {
        match self {
            Layout::PerTensorAffine | Layout::PerChannelAffine => &["int_repr", "scale", "zero_point"],
            Layout::SparseCoo => &["indices", "values"],
            Layout::SparseCsr | Layout::SparseBsr => &["crow_indices", "col_indices", "values"],
            Layout::SparseCsc | Layout::SparseBsc => &["ccol_indices", "row_indices", "values"],
            Layout::Nested => &["buffer", "sizes", "strides", "storage_offsets"],
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
