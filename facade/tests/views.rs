//! Every writer takes the same input: a state dict whose tensors may come from any library through
//! [`ckpt::tensor::TensorView`].

#![allow(clippy::unwrap_used, clippy::panic)]

use std::borrow::Cow;

use ckpt::Format;
use ckpt::tensor::{DType, TensorView, state_dict_of_views};

/// Another library's tensor: big-endian-free `u16` codes of bfloat16 values, in a `Vec`.
struct Bf16s {
    shape: Vec<usize>,
    bits: Vec<u16>,
}

impl TensorView for Bf16s {
    fn dtype(&self) -> DType {
        DType::BF16
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> ckpt::tensor::Result<Cow<'_, [u8]>> {
        Ok(Cow::Owned(self.bits.iter().flat_map(|b| b.to_le_bytes()).collect()))
    }
}

#[test]
fn a_foreign_tensor_is_saved_by_every_writer() {
    let bits: Vec<u16> = (0..24).map(|i| 0x3f80 + i).collect(); // 1.0, 1.0078125, ...
    let w = Bf16s { shape: vec![4, 6], bits: bits.clone() };
    let b = Bf16s { shape: vec![6], bits: bits[..6].to_vec() };
    let sd = state_dict_of_views([("layer.w", &w), ("layer.b", &b)]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for to in [Format::Torch, Format::Safetensors, Format::Hf, Format::Distcp, Format::Hfai, Format::Recis] {
        let dst = tmp.path().join(to.name());
        let options = ckpt::ConvertOptions::default().with_world_size(if to.is_sharded() { 2 } else { 1 });
        let summary = ckpt::save(&sd, &dst, to, &options).unwrap();
        assert_eq!(summary.tensors, 2, "{to}");
        let ck = ckpt::open(&dst).unwrap();
        let names: Vec<String> = ck.entries().iter().map(|e| e.name.clone()).collect();
        let name = names.iter().find(|n| n.ends_with("layer.w")).unwrap_or_else(|| panic!("{to}: {names:?}"));
        let back = ck.tensor(name).unwrap();
        assert_eq!((back.dtype(), back.shape()), (DType::BF16, &[4, 6][..]), "{to}");
        assert_eq!(back.data().unwrap().as_ref(), w.data().unwrap().as_ref(), "{to}");
    }
}
