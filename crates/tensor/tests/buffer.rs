//! The buffer module of the tensor model, through its public API.

#![allow(clippy::unwrap_used)]

use ckpt_tensor::*;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// A range-made deferred buffer makes only what is asked: a window's bytes, or one piece at a time;
/// a whole-made one is made whole and handed over in one piece; errors reach the caller.
#[test]
fn ranged_deferred_makes_only_what_is_asked() {
    use std::sync::Mutex;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    let b = Buffer::deferred_ranged(100, move |offset, out: &mut [u8]| {
        log.lock().unwrap().push((offset, out.len()));
        for (i, o) in out.iter_mut().enumerate() {
            *o = (offset + i) as u8;
        }
        Ok(())
    });
    let window = b.slice(10..30).unwrap();
    assert_eq!(&*window.bytes().unwrap(), (10u8..30).collect::<Vec<_>>().as_slice());
    assert_eq!(asked.lock().unwrap().drain(..).collect::<Vec<_>>(), vec![(10, 20)]);
    let mut got = Vec::new();
    window
        .pieces(8, |p| {
            got.extend_from_slice(p);
            Ok::<(), Error>(())
        })
        .unwrap();
    assert_eq!(got, (10u8..30).collect::<Vec<_>>());
    assert_eq!(asked.lock().unwrap().drain(..).collect::<Vec<_>>(), vec![(10, 8), (18, 8), (26, 4)]);
    // Once kept (`as_bytes`), pieces hand over the kept bytes at once.
    assert_eq!(b.as_bytes().len(), 100);
    assert_eq!(asked.lock().unwrap().drain(..).collect::<Vec<_>>(), vec![(0, 100)]);
    let mut calls = 0;
    b.pieces(8, |p| {
        calls += 1;
        assert_eq!(p.len(), 100);
        Ok::<(), Error>(())
    })
    .unwrap();
    assert_eq!((calls, asked.lock().unwrap().len()), (1, 0));

    let whole = Buffer::deferred(10, |out: &mut [u8]| {
        out.fill(7);
        Ok(())
    });
    let mut sizes = Vec::new();
    whole
        .pieces(4, |p| {
            sizes.push(p.len());
            Ok::<(), Error>(())
        })
        .unwrap();
    assert_eq!(sizes, vec![10]);

    let failing = Buffer::deferred_ranged(10, |_, _: &mut [u8]| Err(Error::ViewOutsideStorage));
    assert!(matches!(failing.bytes(), Err(Error::ViewOutsideStorage)));
    assert!(matches!(failing.pieces(4, |_| Ok::<(), Error>(())), Err(Error::ViewOutsideStorage)));
    // The first error of the consumer stops the stream.
    let fresh = Buffer::deferred_ranged(10, |_, out: &mut [u8]| {
        out.fill(1);
        Ok(())
    });
    let mut calls = 0;
    let r = fresh.pieces(2, |_| {
        calls += 1;
        Err(Error::AllocationFailed { bytes: 2 })
    });
    assert!(matches!(r, Err(Error::AllocationFailed { bytes: 2 })));
    assert_eq!(calls, 1);
}

#[test]
fn owned_is_aligned() {
    let b = Buffer::copy_from(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(b.as_bytes().as_ptr() as usize % 64, 0);
    assert_eq!(b.typed::<u32>().unwrap(), &[0x0403_0201, 0x0807_0605]);
    assert!(b.slice(1..5).unwrap().typed::<u32>().is_err());
}

#[test]
fn slices_share_memory() {
    let b = Buffer::copy_from(&[0; 100]).unwrap();
    let a = b.slice(10..20).unwrap();
    let c = b.slice(10..20).unwrap();
    assert!(a.same_storage(&c));
    assert!(!a.same_storage(&b));
    assert!(a.same_backing(&b));
    assert_eq!(a.as_bytes().as_ptr(), c.as_bytes().as_ptr());
    assert!(b.slice_len(usize::MAX, 2).is_err());
    assert_eq!(a.slice(2..4).unwrap().offset_in_backing(), 12);
}

#[test]
fn maps_files() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(b"hello world").unwrap();
    let b = Buffer::map_file(f.path()).unwrap();
    assert!(b.is_mapped());
    assert_eq!(b.slice(6..11).unwrap().as_bytes(), b"world");
    let empty = tempfile::NamedTempFile::new().unwrap();
    assert!(Buffer::map_file(empty.path()).unwrap().is_empty());
    assert!(matches!(Buffer::map_file(Path::new("/nonexistent/x")), Err(Error::Io { .. })));
}

#[test]
fn forgotten_mapped_pages_read_the_same_bytes_again() {
    let bytes: Vec<u8> = (0..5 * 4096 + 123).map(|i| (i * 7 % 251) as u8).collect();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&bytes).unwrap();
    let whole = Buffer::map_file(f.path()).unwrap();
    let window = whole.slice(100..bytes.len() - 50).unwrap();
    assert_eq!(whole.as_bytes(), &bytes[..]); // every page mapped
    for range in [0..window.len(), 4000..9000, 0..1, 5000..5000] {
        window.forget_mapped_pages(range);
        assert_eq!(whole.as_bytes(), &bytes[..]);
        assert_eq!(window.as_bytes(), &bytes[100..bytes.len() - 50]);
    }
    // Outside the window, backwards, or not a map: nothing happens.
    window.forget_mapped_pages(0..window.len() + 1);
    #[allow(clippy::reversed_empty_ranges)]
    window.forget_mapped_pages(9000..4000);
    let owned = Buffer::copy_from(&bytes).unwrap();
    owned.forget_mapped_pages(0..bytes.len());
    assert_eq!(owned.as_bytes(), &bytes[..]);
    assert_eq!(whole.as_bytes(), &bytes[..]);
}
