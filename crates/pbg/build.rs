//! Tells the crate what the libhdf5 it links can do. hdf5-metno-sys announces the detected library as
//! `DEP_HDF5_VERSION_<major>_<minor>_<micro>`, once for every release up to and including it.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(hdf5_file_locking)");
    let at_least = |v: &str| std::env::var_os(format!("DEP_HDF5_VERSION_{v}")).is_some();
    // H5Pset_file_locking: 1.10.7 and the later 1.10 releases, 1.12.1 and later (not 1.12.0).
    if (at_least("1_10_7") && !at_least("1_12_0")) || at_least("1_12_1") {
        println!("cargo::rustc-cfg=hdf5_file_locking");
    }
}
