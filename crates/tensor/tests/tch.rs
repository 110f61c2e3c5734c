//! Conversions between ckpt tensors and tch tensors (`--features tch`; needs libtorch, see
//! `scripts/tch-env.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_tensor::tch_interop::{
    CopyMode, TchError, dtype_to_kind, from_tch, from_tch_with, kind_to_dtype, to_tch, to_tch_with,
};
use ckpt_tensor::{Buffer, DType, Fault, Tensor};
use half::{bf16, f16};
use tch::{Device, Kind};

const CPU: Device = Device::Cpu;

/// The dtypes tch 0.26 can hold.
const SUPPORTED: [DType; 17] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::C32,
    DType::C64,
    DType::C128,
    DType::F8E4M3Fn,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];

/// Every other dtype: no tch kind (unsigned 16/32/64-bit, float8_e8m0fnu, float4, bits*) or quantized.
fn unsupported() -> Vec<DType> {
    let u: Vec<DType> = DType::ALL.into_iter().filter(|d| !SUPPORTED.contains(d)).collect();
    for d in [DType::U16, DType::U32, DType::U64, DType::F8E8M0Fnu, DType::F4E2M1FnX2, DType::QInt8, DType::QUInt2x4] {
        assert!(u.contains(&d));
    }
    u
}

/// The bytes of `t`'s elements in row-major order, read by tch itself.
fn tch_bytes(t: &tch::Tensor) -> Vec<u8> {
    let t = t.to_device(CPU).contiguous();
    let mut out = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
    t.copy_data_u8(&mut out, t.numel());
    out
}

/// `n` elements of `dtype` with varied, valid bytes (bools 0/1, everything else a byte pattern that makes
/// finite and non-finite floats alike; NaN payloads must survive too).
fn pattern(dtype: DType, n: usize) -> Vec<u8> {
    (0..n * dtype.size())
        .map(|i| if dtype == DType::Bool { u8::from(i % 3 == 1) } else { (i * 37 + 11) as u8 })
        .collect()
}

fn storage_tensor(dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_buffer(dtype, shape, Buffer::copy_from(&pattern(dtype, n)).unwrap()).unwrap()
}

fn layout(t: &tch::Tensor) -> (Vec<i64>, Vec<i64>, i64) {
    (t.size(), t.stride(), t.storage_offset())
}

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

#[test]
fn dtype_table() {
    for d in SUPPORTED {
        let k = dtype_to_kind(d).unwrap();
        assert_eq!(kind_to_dtype(k).unwrap(), d);
        assert_eq!(k.elt_size_in_bytes(), d.size(), "{d}");
    }
    for d in unsupported() {
        match dtype_to_kind(d) {
            Err(e) if e.fault() == Fault::Unsupported => assert!(e.to_string().contains(d.torch_name()), "{e}"),
            other => panic!("{d}: {other:?}"),
        }
    }
    for k in [Kind::QInt8, Kind::QUInt8, Kind::QInt32] {
        assert!(matches!(kind_to_dtype(k), Err(e) if matches!(e.format_error(), Some(TchError::QuantizedKind { .. }))));
    }
}

#[test]
fn every_dtype_round_trips_from_ckpt() {
    for d in SUPPORTED {
        let t = storage_tensor(d, &[3, 4]);
        let tt = to_tch(&t).unwrap();
        assert_eq!(tt.kind(), dtype_to_kind(d).unwrap());
        assert_eq!(tt.device(), CPU);
        assert_eq!(layout(&tt), (vec![3, 4], vec![4, 1], 0), "{d}");
        assert!(!tt.requires_grad());
        assert_eq!(tch_bytes(&tt), t.data().unwrap().as_ref(), "{d}");
        let back = from_tch(&tt).unwrap();
        assert_eq!(back, t, "{d}");
        assert_eq!(back.strides(), t.strides());
        assert_eq!(back.storage_offset(), 0);
        assert_eq!(back.storage().as_bytes().as_ptr() as usize % 64, 0);

        // A transposed, offset view of the same storage keeps its layout both ways.
        let v = t.narrow(0, 1, 2).unwrap().narrow(1, 0, 3).unwrap().transpose(0, 1).unwrap();
        let tv = to_tch(&v).unwrap();
        assert_eq!(layout(&tv), (vec![3, 2], vec![1, 4], 4), "{d}");
        assert_eq!(tch_bytes(&tv), v.data().unwrap().as_ref(), "{d}");
        let back = from_tch(&tv).unwrap();
        assert_eq!(back, v, "{d}");
        assert_eq!((back.strides(), back.storage_offset()), (&[1, 4][..], 4));
        // The storage up to the view's last element came along (element 10 is the last one addressed).
        assert_eq!(back.storage().as_bytes(), &t.storage().as_bytes()[..11 * d.size()], "{d}");
    }
}

#[test]
fn every_dtype_round_trips_from_tch() {
    for d in SUPPORTED {
        let k = dtype_to_kind(d).unwrap();
        // Made by tch: a permuted, sliced view of a 3-d tensor of varied values.
        let base = tch::Tensor::from_data_size(&pattern(d, 60), &[3, 4, 5], k);
        let v = base.permute([2, 0, 1]).narrow(0, 1, 3).narrow(2, 2, 2);
        let c = from_tch(&v).unwrap();
        assert_eq!(c.dtype(), d);
        assert_eq!(c.shape(), &[3, 3, 2]);
        assert_eq!(i64s(c.strides()), v.stride());
        assert_eq!(c.storage_offset() as i64, v.storage_offset());
        assert_eq!(c.data().unwrap().as_ref(), tch_bytes(&v), "{d}");
        let again = to_tch(&c).unwrap();
        assert_eq!(layout(&again), layout(&v), "{d}");
        assert_eq!(tch_bytes(&again), tch_bytes(&v), "{d}");
    }
}

macro_rules! check_arange {
    ($kind:expr, $t:ty, $conv:expr) => {{
        let tt = tch::Tensor::arange_start(-5, 7, (Kind::Float, CPU)).to_kind($kind).view([3, 4]);
        let c = from_tch(&tt).unwrap();
        let want: Vec<$t> = (-5..7).map($conv).collect();
        assert_eq!(c.to_vec::<$t>().unwrap(), want, "{:?}", $kind);
        // And tch agrees with the values ckpt sends back.
        let back = to_tch(&c).unwrap();
        assert!(back.equal(&tt), "{:?}", $kind);
        // A transposed view made in tch, element by element.
        let ct = from_tch(&tt.tr()).unwrap();
        let want_t: Vec<$t> = (0..12).map(|i| want[(i % 3) * 4 + i / 3]).collect();
        assert_eq!(ct.to_vec::<$t>().unwrap(), want_t, "{:?}", $kind);
    }};
}

#[test]
fn values_made_by_tch_ops() {
    check_arange!(Kind::Int8, i8, |i: i32| i as i8);
    check_arange!(Kind::Int16, i16, |i: i32| i as i16);
    check_arange!(Kind::Int, i32, |i: i32| i);
    check_arange!(Kind::Int64, i64, i64::from);
    check_arange!(Kind::Half, f16, |i: i32| f16::from_f32(i as f32));
    check_arange!(Kind::BFloat16, bf16, |i: i32| bf16::from_f32(i as f32));
    check_arange!(Kind::Float, f32, |i: i32| i as f32);
    check_arange!(Kind::Double, f64, f64::from);
    // uint8 wraps like a C cast in torch: -5 → 251.
    check_arange!(Kind::Uint8, u8, |i: i32| i as u8);

    let b = tch::Tensor::arange(6, (Kind::Int64, CPU)).remainder(3).eq(0);
    let c = from_tch(&b).unwrap();
    assert_eq!(c.dtype(), DType::Bool);
    assert_eq!(c.data().unwrap().as_ref(), &[1, 0, 0, 1, 0, 0]);
    assert!(to_tch(&c).unwrap().equal(&b));
}

#[test]
fn float8_encodings() {
    // 0, 1, 2, -1 in each float8 format, as torch encodes them.
    let cases = [
        (Kind::Float8e4m3fn, DType::F8E4M3Fn, [0x00, 0x38, 0x40, 0xb8]),
        (Kind::Float8e5m2, DType::F8E5M2, [0x00, 0x3c, 0x40, 0xbc]),
        (Kind::Float8e4m3fnuz, DType::F8E4M3Fnuz, [0x00, 0x40, 0x48, 0xc0]),
        (Kind::Float8e5m2fnuz, DType::F8E5M2Fnuz, [0x00, 0x40, 0x44, 0xc0]),
    ];
    for (k, d, bytes) in cases {
        let tt = tch::Tensor::from_slice(&[0.0f32, 1.0, 2.0, -1.0]).to_kind(k);
        let c = from_tch(&tt).unwrap();
        assert_eq!(c.dtype(), d);
        assert_eq!(c.data().unwrap().as_ref(), &bytes, "{d}");
        let back = to_tch(&c).unwrap().to_kind(Kind::Float);
        assert!(back.equal(&tch::Tensor::from_slice(&[0.0f32, 1.0, 2.0, -1.0])), "{d}");
    }
}

#[test]
fn complex_values_and_conjugate_views() {
    let re_im = tch::Tensor::arange(12, (Kind::Double, CPU)).view([6, 2]);
    for (real, ck, d) in
        [(Kind::Float, Kind::ComplexFloat, DType::C64), (Kind::Double, Kind::ComplexDouble, DType::C128)]
    {
        let z = re_im.to_kind(real).view_as_complex().view([2, 3]);
        assert_eq!(z.kind(), ck);
        let c = from_tch(&z).unwrap();
        assert_eq!(c.dtype(), d);
        let parts: Vec<f64> = match d {
            DType::C64 => c
                .reshape(&[6])
                .unwrap()
                .data()
                .unwrap()
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                .collect(),
            _ => c.data().unwrap().chunks(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(),
        };
        assert_eq!(parts, (0..12).map(f64::from).collect::<Vec<_>>());
        assert!(to_tch(&c).unwrap().equal(&z));

        // conj() is lazy in torch (a bit on the tensor); the conversion materialises it.
        let zc = z.conj();
        assert!(zc.is_conj());
        let cc = from_tch(&zc).unwrap();
        let back = to_tch(&cc).unwrap();
        assert!(!back.is_conj());
        assert!(back.equal(&zc.resolve_conj()));
        assert!(!back.equal(&z));
    }
    // complex32 (ComplexHalf) through a cast in tch.
    let zh = re_im.to_kind(Kind::Float).view_as_complex().to_kind(Kind::ComplexHalf);
    let c = from_tch(&zh).unwrap();
    assert_eq!(c.dtype(), DType::C32);
    let halves: Vec<f32> = c.data().unwrap().chunks(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
    assert_eq!(halves, (0..12).map(|i| i as f32).collect::<Vec<_>>());
    assert_eq!(tch_bytes(&to_tch(&c).unwrap()), tch_bytes(&zh));

    // A negative view (the lazy neg bit) is materialised too.
    let neg = re_im.internal_neg_view();
    assert!(neg.is_neg());
    let cn = from_tch(&neg).unwrap();
    assert_eq!(cn.to_vec::<f64>().unwrap(), (0..12).map(|i| -f64::from(i)).collect::<Vec<_>>());
}

#[test]
fn ckpt_views_equal_tch_views() {
    let v: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let t = Tensor::from_slice(&v, &[4, 6]).unwrap();
    let tt = tch::Tensor::from_slice(&v).view([4, 6]);

    let tr = to_tch(&t.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(layout(&tr), layout(&tt.transpose(0, 1)));
    assert!(tr.equal(&tt.transpose(0, 1)));

    let region = to_tch(&t.region(&[1, 2], &[2, 3]).unwrap()).unwrap();
    let tch_region = tt.narrow(0, 1, 2).narrow(1, 2, 3);
    assert_eq!(layout(&region), layout(&tch_region));
    assert!(region.equal(&tch_region));

    // Every other element of rows 0 and 1, from element 1: strides that step over elements.
    let step = Tensor::from_parts(DType::F32, &[2, 3], &[6, 2], 1, t.storage().clone()).unwrap();
    let tch_step = tt.as_strided([2, 3], [6, 2], Some(1));
    let ts = to_tch(&step).unwrap();
    assert_eq!(layout(&ts), layout(&tch_step));
    assert!(ts.equal(&tch_step));

    // Zero strides (an expanded row).
    let row = t.narrow(0, 2, 1).unwrap().reshape(&[6]).unwrap();
    let expanded = Tensor::from_parts(DType::F32, &[3, 6], &[0, 1], 0, row.storage().clone()).unwrap();
    let te = to_tch(&expanded).unwrap();
    let tch_expanded = tt.get(2).expand([3, 6], false);
    assert_eq!(te.stride(), [0, 1]);
    assert!(te.equal(&tch_expanded));
    let ce = from_tch(&tch_expanded).unwrap();
    assert_eq!((ce.strides(), ce.storage_offset()), (&[0, 1][..], 12));
    assert_eq!(ce.to_vec::<f32>().unwrap(), expanded.to_vec::<f32>().unwrap());

    // And the other way: tch's views give ckpt views with the same layout and values as ckpt's own.
    let c = from_tch(&tt.transpose(0, 1).narrow(0, 1, 3)).unwrap();
    let own = t.transpose(0, 1).unwrap().narrow(0, 1, 3).unwrap();
    assert_eq!((c.shape(), c.strides(), c.storage_offset()), (own.shape(), own.strides(), own.storage_offset()));
    assert_eq!(c.to_vec::<f32>().unwrap(), own.to_vec::<f32>().unwrap());
}

#[test]
fn copy_modes() {
    let v: Vec<i32> = (0..100).collect();
    let t = Tensor::from_slice(&v, &[10, 10]).unwrap();
    let view = t.region(&[6, 2], &[3, 4]).unwrap().transpose(0, 1).unwrap(); // first element 62, last 85

    let s = to_tch_with(&view, CopyMode::Storage).unwrap();
    assert_eq!(layout(&s), (vec![4, 3], vec![1, 10], 62));
    let sp = to_tch_with(&view, CopyMode::Span).unwrap();
    assert_eq!(layout(&sp), (vec![4, 3], vec![1, 10], 0));
    let ct = to_tch_with(&view, CopyMode::Contiguous).unwrap();
    assert_eq!(layout(&ct), (vec![4, 3], vec![3, 1], 0));
    for x in [&s, &sp, &ct] {
        assert_eq!(tch_bytes(x), view.data().unwrap().as_ref());
    }

    let tt = tch::Tensor::arange(100, (Kind::Int, CPU)).view([10, 10]).narrow(0, 6, 3).narrow(1, 2, 4).tr();
    let c = from_tch_with(&tt, CopyMode::Storage).unwrap();
    assert_eq!((c.strides(), c.storage_offset(), c.storage().len()), (&[1, 10][..], 62, 86 * 4));
    let c = from_tch_with(&tt, CopyMode::Span).unwrap();
    assert_eq!((c.strides(), c.storage_offset(), c.storage().len()), (&[1, 10][..], 0, 24 * 4));
    assert_eq!(c.to_vec::<i32>().unwrap(), view.to_vec::<i32>().unwrap());
    let c = from_tch_with(&tt, CopyMode::Contiguous).unwrap();
    assert_eq!((c.strides(), c.storage_offset(), c.storage().len()), (&[3, 1][..], 0, 12 * 4));
    assert_eq!(c.to_vec::<i32>().unwrap(), view.to_vec::<i32>().unwrap());
    assert_eq!(CopyMode::default(), CopyMode::Storage);
}

#[test]
fn scalars_and_empty_tensors() {
    let s = Tensor::from_slice(&[2.5f64], &[]).unwrap();
    let ts = to_tch(&s).unwrap();
    assert_eq!(ts.dim(), 0);
    assert_eq!(ts.double_value(&[]), 2.5);
    let c = from_tch(&tch::Tensor::from(-7i64)).unwrap();
    assert_eq!((c.dim(), c.to_vec::<i64>().unwrap()), (0, vec![-7]));
    // A 0-dim view at an offset.
    let one = from_tch(&tch::Tensor::arange(5, (Kind::Int16, CPU)).get(3)).unwrap();
    assert_eq!((one.shape(), one.storage_offset(), one.to_vec::<i16>().unwrap()), (&[][..], 3, vec![3]));
    assert_eq!(to_tch(&one).unwrap().int64_value(&[]), 3);

    for mode in [CopyMode::Storage, CopyMode::Span, CopyMode::Contiguous] {
        for shape in [&[0usize][..], &[0, 3], &[2, 0, 5]] {
            let e = Tensor::zeros(DType::BF16, shape).unwrap();
            let te = to_tch_with(&e, mode).unwrap();
            assert_eq!((te.size(), te.numel(), te.kind()), (i64s(shape), 0, Kind::BFloat16));
            let back = from_tch_with(&te, mode).unwrap();
            assert_eq!(back, e);
            let made = from_tch_with(&tch::Tensor::zeros(i64s(shape), (Kind::Float, CPU)), mode).unwrap();
            assert_eq!((made.shape(), made.numel(), made.dtype()), (shape, 0, DType::F32));
        }
    }
    // An empty view whose offset lies past the end of its (empty) storage: torch allows it too.
    let e = Tensor::from_parts(DType::F32, &[0], &[1], 100, Buffer::copy_from(&[0; 16]).unwrap()).unwrap();
    let te = to_tch(&e).unwrap();
    assert_eq!(layout(&te), (vec![0], vec![1], 100));
    assert_eq!(from_tch(&te).unwrap().storage_offset(), 100);
    assert_eq!(to_tch_with(&e, CopyMode::Span).unwrap().storage_offset(), 0);
}

#[test]
fn requires_grad() {
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap().with_requires_grad(true);
    let tt = to_tch(&t).unwrap();
    assert!(tt.requires_grad());
    assert!(tt.is_leaf());
    // It works as a leaf: gradients flow into it.
    (&tt * &tt).sum(Kind::Float).backward();
    assert_eq!(from_tch(&tt.grad()).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    let back = from_tch(&tt).unwrap();
    assert!(back.requires_grad());
    assert_eq!(back, t);
    assert!(!from_tch(&tt.detach()).unwrap().requires_grad());

    // A strided view keeps the flag too, and a tch result that is not a leaf converts with it.
    let v = t.transpose(0, 0).unwrap().narrow(0, 1, 2).unwrap();
    assert!(to_tch(&v).unwrap().requires_grad());
    let y = &tt * 3.0;
    let cy = from_tch(&y).unwrap();
    assert!(cy.requires_grad());
    assert_eq!(cy.to_vec::<f32>().unwrap(), vec![3.0, 6.0, 9.0]);

    for mode in [CopyMode::Storage, CopyMode::Span, CopyMode::Contiguous] {
        assert!(to_tch_with(&t, mode).unwrap().requires_grad());
        assert!(from_tch_with(&tt, mode).unwrap().requires_grad());
    }
    // torch only lets floating point and complex tensors require grad.
    let i = Tensor::from_slice(&[1i64], &[1]).unwrap().with_requires_grad(true);
    assert!(matches!(to_tch(&i), Err(e) if e.fault() == Fault::Unsupported && e.to_string().contains("int64")));
    for d in [DType::BF16, DType::C64, DType::F8E5M2] {
        assert!(to_tch(&storage_tensor(d, &[2]).with_requires_grad(true)).unwrap().requires_grad(), "{d}");
    }
}

#[test]
fn conversion_copies() {
    let t = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let mut tt = tch::Tensor::try_from(&t).unwrap();
    let _ = tt.fill_(9.0);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    let c = Tensor::try_from(&tt).unwrap();
    let _ = tt.fill_(5.0);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![9.0, 9.0]);
}

#[test]
fn mapped_storage_converts() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let v: Vec<u8> = (0..64).collect();
    std::io::Write::write_all(&mut f, &v).unwrap();
    let b = Buffer::map_file(f.path()).unwrap();
    // Offset 3 (not aligned for anything wider than a byte in the file) is fine: bytes are copied.
    let t = Tensor::from_parts(DType::I16, &[4, 2], &[4, 1], 3, b.slice(1..64).unwrap()).unwrap();
    let tt = to_tch(&t).unwrap();
    assert_eq!(tch_bytes(&tt), t.data().unwrap().as_ref());
    assert_eq!(from_tch(&tt).unwrap(), t);
}

#[test]
fn unsupported_dtypes_are_errors() {
    for d in unsupported() {
        let t = Tensor::zeros(d, &[2]).unwrap();
        match to_tch(&t) {
            Err(e) if e.fault() == Fault::Unsupported => assert!(e.to_string().contains(d.torch_name()), "{e}"),
            other => panic!("{d}: {other:?}"),
        }
        assert!(matches!(tch::Tensor::try_from(&t), Err(e) if e.fault() == Fault::Unsupported));
    }
}

#[test]
fn unsupported_tch_tensors_are_errors() {
    let x = tch::Tensor::from_slice(&[0.0f32, 1.5, 0.0, -2.0]).view([2, 2]);
    let q = x.quantize_per_tensor(0.5, 0, Kind::QInt8);
    assert!(
        matches!(from_tch(&q), Err(e) if e.fault() == Fault::Unsupported && e.to_string().contains("QInt8")),
        "{:?}",
        from_tch(&q)
    );
    for sparse in [x.to_sparse_sparse_dim(2), x.to_sparse_csr(None::<i64>), x.to_sparse_csc(None::<i64>)] {
        assert!(matches!(from_tch(&sparse), Err(e) if e.fault() == Fault::Unsupported), "{:?}", from_tch(&sparse));
    }
    if let Ok(m) = x.f_to_mkldnn(None::<Kind>) {
        assert!(matches!(from_tch(&m), Err(e) if e.fault() == Fault::Unsupported), "{:?}", from_tch(&m));
    }
    assert!(matches!(
        from_tch(&tch::Tensor::new()),
        Err(e) if matches!(e.format_error::<TchError>(), Some(TchError::Undefined))
    ));
}
