//! The aligned module of the tensor model, through its public API.

#![allow(clippy::unwrap_used)]

use ckpt_tensor::aligned::*;
use ckpt_tensor::*;

#[test]
fn small_and_large_are_zero_aligned_and_writable() {
    for len in [0, 1, 63, 64, 65, 4096, PAGES_MIN - 1, PAGES_MIN, PAGES_MIN + 5, 3 * PAGES_MIN + 17] {
        let mut b = AlignedBytes::zeroed(len).unwrap();
        assert_eq!(b.len(), len);
        assert_eq!(b.is_empty(), len == 0);
        assert_eq!(b.as_ptr() as usize % 64, 0, "len {len}");
        assert!(b.as_bytes().iter().all(|&x| x == 0), "len {len}");
        for (i, x) in b.as_mut_bytes().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        assert!(b.as_bytes().iter().enumerate().all(|(i, &x)| x == (i % 251) as u8), "len {len}");
        let c = AlignedBytes::copy_from(b.as_bytes()).unwrap();
        assert_eq!(c.as_bytes(), b.as_bytes());
    }
}

#[test]
fn zeroed_vectors_are_zero_and_the_asked_length() {
    for len in [0, 1, 4095, PAGES_MIN - 1, PAGES_MIN, PAGES_MIN + 4097] {
        let mut v = zeroed_vec(len).unwrap();
        assert_eq!((v.len(), v.capacity()), (len, len));
        assert!(v.iter().all(|&x| x == 0));
        if let Some(last) = v.last_mut() {
            *last = 7;
        }
        v.push(1); // grows like any vector
        assert_eq!(v.len(), len + 1);
    }
}

#[test]
fn impossible_sizes_are_errors() {
    assert!(matches!(AlignedBytes::zeroed(usize::MAX - 8), Err(Error::AllocationFailed { .. })));
    assert!(matches!(zeroed_vec(usize::MAX - 8), Err(Error::AllocationFailed { .. })));
}
