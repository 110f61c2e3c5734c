//! The tensor module of the tensor model, through its public API.

#![allow(clippy::unwrap_used)]

use ckpt_tensor::*;

fn arange(n: usize, shape: &[usize]) -> Tensor {
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    Tensor::from_slice(&v, shape).unwrap()
}

#[test]
fn contiguity() {
    let t = arange(24, &[2, 3, 4]);
    assert!(t.is_contiguous());
    assert_eq!(t.strides(), &[12, 4, 1]);
    assert!(!t.transpose(0, 2).unwrap().is_contiguous());
    let one = Tensor::from_parts(DType::F32, &[1, 4], &[99, 1], 0, t.storage().clone()).unwrap();
    assert!(one.is_contiguous());
    assert!(Tensor::zeros(DType::F32, &[0, 3]).unwrap().is_contiguous());
    assert!(Tensor::zeros(DType::F32, &[]).unwrap().is_contiguous());
    assert_eq!(Tensor::zeros(DType::F32, &[]).unwrap().numel(), 1);
}

#[test]
fn gathers_views() {
    let t = arange(24, &[4, 6]);
    let v = t.narrow(1, 1, 5).unwrap().narrow(0, 1, 2).unwrap();
    assert_eq!(v.storage_offset(), 7);
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![7., 8., 9., 10., 11., 13., 14., 15., 16., 17.]);
    let step = Tensor::from_parts(DType::F32, &[2, 3], &[6, 2], 1, t.storage().clone()).unwrap();
    assert_eq!(step.to_vec::<f32>().unwrap(), vec![1., 3., 5., 7., 9., 11.]);
    let c = step.to_contiguous().unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.storage().as_bytes().as_ptr() as usize % 64, 0);
    assert_eq!(c.to_vec::<f32>().unwrap(), step.to_vec::<f32>().unwrap());
}

#[test]
fn zero_strides_expand() {
    let base = arange(3, &[3]);
    let e = Tensor::from_parts(DType::F32, &[4, 3], &[0, 1], 0, base.storage().clone()).unwrap();
    assert_eq!(e.to_vec::<f32>().unwrap(), [0., 1., 2.].repeat(4));
    let col = Tensor::from_parts(DType::F32, &[3, 2], &[1, 0], 0, base.storage().clone()).unwrap();
    assert_eq!(col.to_vec::<f32>().unwrap(), vec![0., 0., 1., 1., 2., 2.]);
}

#[test]
fn contiguous_is_zero_copy() {
    let t = arange(10, &[10]);
    let v = t.narrow(0, 2, 5).unwrap();
    let c = v.to_contiguous().unwrap();
    assert!(c.storage().same_backing(t.storage()));
    assert_eq!(c.as_slice::<f32>().unwrap(), &[2., 3., 4., 5., 6.]);
    assert!(t.as_slice::<i32>().is_err());
}

#[test]
fn rejects_out_of_bounds_views() {
    let b = Buffer::copy_from(&[0; 16]).unwrap();
    assert!(Tensor::from_parts(DType::F32, &[4], &[1], 0, b.clone()).is_ok());
    assert!(Tensor::from_parts(DType::F32, &[4], &[1], 1, b.clone()).is_err());
    assert!(Tensor::from_parts(DType::F32, &[2, 2], &[3, 1], 0, b.clone()).is_err());
    let empty = Tensor::from_parts(DType::F32, &[0], &[1], 100, b.clone()).unwrap();
    assert!(empty.data().unwrap().is_empty());
    assert!(empty.to_contiguous().unwrap().data().unwrap().is_empty());
    let narrowed = Tensor::zeros(DType::F32, &[2, 0, 3]).unwrap().narrow(0, 2, 0).unwrap();
    assert!(narrowed.data().unwrap().is_empty());
    assert!(Tensor::from_parts(DType::F32, &[usize::MAX, 2], &[usize::MAX, 1], 0, b.clone()).is_err());
    assert!(Tensor::from_buffer(DType::F32, &[5], b).is_err());
}

#[test]
fn lazy_bits() {
    let z = Tensor::from_slice(&[1.0f32, 2.0, -3.0, 4.0], &[4]);
    // two complex64 values (1+2j, -3+4j) viewed from f32 bytes
    let z = Tensor::from_buffer(DType::C64, &[2], z.unwrap().storage().clone()).unwrap();
    let c = z.clone().with_lazy_bits(true, false).unwrap();
    let back = Tensor::from_buffer(DType::F32, &[4], Buffer::copy_from(&c.data().unwrap()).unwrap()).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), vec![1.0, -2.0, -3.0, -4.0]);
    assert!(c.shares_storage_with(&z));
    let n = Tensor::from_slice(&[1i16, -5, 0], &[3]).unwrap().with_lazy_bits(false, true).unwrap();
    assert_eq!(n.to_vec::<i16>().unwrap(), vec![-1, 5, 0]);
    assert!(n.as_slice::<i16>().is_err());
    assert!(!n.to_contiguous().unwrap().is_neg());
    assert!(Tensor::zeros(DType::F32, &[1]).unwrap().with_lazy_bits(true, false).is_err());
}

#[test]
fn region_and_reshape() {
    let t = arange(24, &[4, 6]);
    let r = t.region(&[1, 2], &[2, 3]).unwrap();
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![8., 9., 10., 14., 15., 16.]);
    assert!(t.region(&[3, 0], &[2, 1]).is_err());
    assert_eq!(r.reshape(&[6]).unwrap().to_vec::<f32>().unwrap(), vec![8., 9., 10., 14., 15., 16.]);
    assert!(r.reshape(&[5]).is_err());
}
