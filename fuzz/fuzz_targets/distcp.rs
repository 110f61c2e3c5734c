//! A DCP checkpoint directory built from the input (a file-set; bytes before the first separator are
//! `.metadata`): every metadata pickle decoded in memory with the per-chunk templates and without (the
//! pickle machine makes every object), which must give the same metadata or the same error; then the
//! directory opened (mapped or read), every entry read, a region of every tensor, the state dict; then either
//! `verify`, or the metadata re-encoded (in one of the two profiles) and decoded again. The input's last byte
//! chooses.
#![no_main]

use std::path::Path;

use ckpt_distcp::{DcpReader, Metadata, Profile, ReadOptions, StorageMetadata};
use ckpt_pickle::Limits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let files = ckpt_fuzz::split_files(data, ".metadata");
    // The input's last byte picks the variants, so that each input decodes the metadata about twice.
    let flags = data.last().copied().unwrap_or(0);
    let limits = Limits::default();
    let profile = if flags & 4 == 0 { Profile::MaxCompat } else { Profile::Torch213 };
    for f in files.iter().filter(|f| f.name.ends_with(".metadata")) {
        let path = Path::new(&f.name);
        Metadata::templates_agree(f.bytes, &limits);
        let Ok(md) = Metadata::from_pickle_with(f.bytes, path, &limits) else { continue };
        if flags & 2 == 0
            && let Ok(bytes) = md.to_pickle(profile)
        {
            Metadata::from_pickle(&bytes, path).expect("re-encoded metadata decodes");
        }
    }
    let dir = ckpt_fuzz::write_dir("distcp", &files);
    if let Ok(r) = DcpReader::open_with(&dir, &ReadOptions::default().with_mmap(flags & 1 == 0)) {
        ckpt_fuzz::read_all(&r);
        for (key, md) in &r.metadata().state_dict_metadata {
            if let StorageMetadata::Tensor(t) = md {
                // The middle of the tensor: crosses chunk boundaries in every dimension.
                let offsets: Vec<usize> = t.size.iter().map(|d| d / 4).collect();
                let sizes: Vec<usize> = t.size.iter().map(|d| d / 2).collect();
                if let Ok(region) = r.read_region(key, &offsets, &sizes) {
                    ckpt_fuzz::read_tensor(&region);
                }
            }
        }
        let _ = r.state_dict().map(|v| ckpt_fuzz::read_value(&v));
    }
    if flags & 2 != 0 {
        let _ = ckpt_distcp::verify(&dir);
    }
});
