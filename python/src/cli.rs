//! The `ckpt` command of the Python package: the Rust tool itself (`facade/src/bin/ckpt.rs`, compiled into
//! this extension), run on `sys.argv`. maturin cannot put a binary and an extension into one wheel, so the
//! wheel's `ckpt` script calls this function (`ckpt._cli:main`), as maturin's guide advises: the same code,
//! flags, output and exit codes as the `ckpt` binary built by cargo.

use std::ffi::OsString;

use pyo3::prelude::*;

// The tool's source, as a module of this crate: its `#[cfg(feature = ...)]` lines ask this crate's features,
// which mirror the facade's (Cargo.toml). Its `main` is the binary's entry point, unused here.
#[allow(dead_code, unreachable_pub, clippy::all)]
#[path = "../../facade/src/bin/ckpt.rs"]
mod tool;

/// Runs the `ckpt` command on `argv` (the program's name first) with the GIL released, and returns its exit
/// code. Usage errors and `--help` print and exit the process, as the binary does.
#[pyfunction]
pub(crate) fn main(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.detach(|| tool::run(argv))
}
