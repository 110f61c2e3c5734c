//! Composite tensors' dense forms and the errors of components that do not make one (the fixtures written
//! by torch are checked in `facade/tests/composite.rs`).
#![allow(clippy::unwrap_used)]

use ckpt_tensor::{Composite, DType, Error, Fault, Layout, Tensor};

fn t<T: ckpt_tensor::Element>(v: &[T], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn malformed(e: &Error) -> bool {
    matches!(e, Error::BadComposite { .. }) && e.fault() == Fault::Malformed
}

#[test]
fn coo_sums_repeated_indices_and_keeps_dense_dimensions() {
    // (0, 1) twice: summed, as torch's to_dense() of an uncoalesced tensor; values of 2 dense elements.
    let indices = t(&[0i64, 0, 1, 1, 1, 0], &[2, 3]);
    let values = t(&[1.0f32, 2.0, 10.0, 20.0, 5.0, 6.0], &[3, 2]);
    let c = Composite::new(Layout::SparseCoo, DType::F32, vec![2, 2, 2], vec![indices, values]).unwrap();
    let d = c.to_dense().unwrap();
    assert_eq!(d.shape(), &[2, 2, 2]);
    assert_eq!(d.to_vec::<f32>().unwrap(), [0.0, 0.0, 11.0, 22.0, 5.0, 6.0, 0.0, 0.0]);
}

#[test]
fn compressed_layouts_place_rows_columns_and_blocks() {
    // [[1, 0, 2], [0, 3, 0]] as CSR and CSC.
    let csr = Composite::new(
        Layout::SparseCsr,
        DType::I64,
        vec![2, 3],
        vec![t(&[0i64, 2, 3], &[3]), t(&[0i64, 2, 1], &[3]), t(&[1i64, 2, 3], &[3])],
    )
    .unwrap();
    assert_eq!(csr.to_dense().unwrap().to_vec::<i64>().unwrap(), [1, 0, 2, 0, 3, 0]);
    let csc = Composite::new(
        Layout::SparseCsc,
        DType::I64,
        vec![2, 3],
        vec![t(&[0i64, 1, 2, 3], &[4]), t(&[0i64, 1, 0], &[3]), t(&[1i64, 3, 2], &[3])],
    )
    .unwrap();
    assert_eq!(csc.to_dense().unwrap().to_vec::<i64>().unwrap(), [1, 0, 2, 0, 3, 0]);
    // One 1x2 block at block row 1, block column 1 of a [2, 4] tensor.
    let bsr = Composite::new(
        Layout::SparseBsr,
        DType::F64,
        vec![2, 4],
        vec![t(&[0i64, 0, 1], &[3]), t(&[1i64], &[1]), t(&[7.0f64, 8.0], &[1, 1, 2])],
    )
    .unwrap();
    assert_eq!(bsr.to_dense().unwrap().to_vec::<f64>().unwrap(), [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0]);
}

#[test]
fn dequantize_rounds_as_torch() {
    // Per tensor: float(scale) * (q - zero_point); 0.1 is not a float32.
    let q = Composite::new(
        Layout::PerTensorAffine,
        DType::QInt8,
        vec![3],
        vec![t(&[-3i8, 0, 7], &[3]), t(&[0.1f64], &[]), t(&[2i64], &[])],
    )
    .unwrap();
    assert_eq!(q.to_dense().unwrap().to_vec::<f32>().unwrap(), [0.1f32 * -5.0, 0.1f32 * -2.0, 0.1f32 * 5.0]);
}

#[test]
fn components_that_do_not_make_the_tensor_are_malformed() {
    // An index beyond the shape.
    let coo =
        Composite::new(Layout::SparseCoo, DType::F32, vec![2], vec![t(&[5i64], &[1, 1]), t(&[1.0f32], &[1])]).unwrap();
    let e = coo.to_dense().unwrap_err();
    assert!(malformed(&e) && e.to_string().contains("index 5 of dimension 0 is out of range 0..2"), "{e}");
    // Row pointers that go back.
    let csr = Composite::new(
        Layout::SparseCsr,
        DType::F32,
        vec![2, 2],
        vec![t(&[0i64, 2, 1], &[3]), t(&[0i64, 1], &[2]), t(&[1.0f32, 2.0], &[2])],
    )
    .unwrap();
    let e = csr.to_dense().unwrap_err();
    assert!(malformed(&e) && e.to_string().contains("pointers 2..1"), "{e}");
    // Per-channel parameters of another length than the axis.
    let mut q = Composite::new(
        Layout::PerChannelAffine,
        DType::QUInt8,
        vec![2],
        vec![t(&[1u8, 2], &[2]), t(&[0.5f64], &[1]), t(&[0i64], &[1])],
    )
    .unwrap();
    q.axis = Some(0);
    let e = q.to_dense().unwrap_err();
    assert!(malformed(&e) && e.to_string().contains("1 scales and 1 zero points for 2 channels"), "{e}");
    // Too few components; an int representation of another dtype.
    let e = Composite::new(Layout::SparseCoo, DType::F32, vec![2], vec![t(&[1.0f32], &[1])]).unwrap_err();
    assert!(malformed(&e) && e.to_string().contains("1 components, expected 2 (indices, values)"), "{e}");
    let parts = vec![t(&[1i8], &[1]), t(&[0.5f64], &[]), t(&[0i64], &[])];
    let e = Composite::new(Layout::PerTensorAffine, DType::QUInt8, vec![1], parts).unwrap_err();
    assert!(malformed(&e) && e.to_string().contains("must be uint8"), "{e}");
}

#[test]
fn nested_tensors_have_no_dense_form() {
    let c = Composite::new(
        Layout::Nested,
        DType::F32,
        vec![1],
        vec![t(&[1.0f32, 2.0], &[2]), t(&[2i64], &[1, 1]), t(&[1i64], &[1, 1]), t(&[0i64], &[1])],
    )
    .unwrap();
    let e = c.to_dense().unwrap_err();
    assert!(matches!(e, Error::NoDenseForm { layout: Layout::Nested, .. }) && e.fault() == Fault::Unsupported);
    assert!(e.to_string().contains("read its components instead"), "{e}");
}

#[test]
fn stored_negative_zeros_become_positive_as_torch_adds_into_zeros() {
    // A 1x2 block holding -0.0 and 1.0: torch's to_dense() gives +0.0 (0.0 + -0.0).
    let bsr = Composite::new(
        Layout::SparseBsr,
        DType::F32,
        vec![1, 2],
        vec![t(&[0i64, 1], &[2]), t(&[0i64], &[1]), t(&[-0.0f32, 1.0], &[1, 1, 2])],
    )
    .unwrap();
    let bits: Vec<u32> = bsr.to_dense().unwrap().to_vec::<f32>().unwrap().iter().map(|f| f.to_bits()).collect();
    assert_eq!(bits, [0, 1.0f32.to_bits()]);
}
