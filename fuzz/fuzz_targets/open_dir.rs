//! `ckpt::open` as the `ckpt` tool calls it, on whatever the input describes: a file-set becomes a directory
//! (marker names such as `.metadata`, `PART_000.pt`, `index`, `checkpoint_version.txt` come from the
//! dictionary), and an input with no separator a single file. Format detection, then every entry read, then
//! `ckpt::verify`. Files that would reach libhdf5's parser get their signature broken (see `ckpt_fuzz`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let files = ckpt_fuzz::split_files(data, "file");
    let dir = ckpt_fuzz::write_dir_without_hdf5("open_dir", &files);
    let path = match files.as_slice() {
        [single] if single.name == "file" => dir.join("file"),
        _ => dir,
    };
    if let Ok(ck) = ckpt::open(&path) {
        ckpt_fuzz::read_all(ck.reader());
    }
    let _ = ckpt::verify(&path);
});
