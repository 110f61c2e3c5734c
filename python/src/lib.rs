//! The extension module `ckpt._ckpt` of the Python package `ckpt`: ckpt's readers and writers for Python,
//! with numpy arrays (or torch tensors) over ckpt's memory maps, and the `ckpt` command.
//!
//! The Python package (`python/ckpt/`) is the API users call (`ckpt.open`, `ckpt.load`, `ckpt.safe_open`,
//! `ckpt.save`, `ckpt.convert`, ...); this module is what it calls into. Every call that reads, writes or
//! converts runs with the GIL released. Errors come back as the package's exceptions (`ckpt.Error` and its
//! subclasses, `errors`), with the fault and the path.
//!
//! Modules: `arrays` (numpy arrays over ckpt's buffers), `values` (ckpt's `Value` tree to Python objects and
//! back), `checkpoint` (an open checkpoint), `ops` (load, save, convert, verify, reshard, diff), `dcp` (what
//! `ckpt.dcp.Reader` asks of a checkpoint), `dcp_writer` (one rank's part of `ckpt.dcp.Writer`'s save), `hf_writer` (the same for `to="hf"`), `remote` (paths that are object-storage URLs: fetched, or written and
//! published, as the `ckpt` command does), `cli` (the `ckpt` command), `errors` (the exceptions).

mod arrays;
mod checkpoint;
mod cli;
mod dcp;
mod dcp_writer;
mod destination;
mod errors;
mod helpers;
mod hf_writer;
mod ops;
mod remote;
mod values;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _ckpt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<checkpoint::Checkpoint>()?;
    m.add_class::<arrays::MappedBytes>()?;
    m.add_function(wrap_pyfunction!(checkpoint::open, m)?)?;
    m.add_function(wrap_pyfunction!(ops::load, m)?)?;
    m.add_function(wrap_pyfunction!(ops::save, m)?)?;
    m.add_function(wrap_pyfunction!(ops::convert, m)?)?;
    m.add_function(wrap_pyfunction!(ops::verify, m)?)?;
    m.add_function(wrap_pyfunction!(ops::reshard, m)?)?;
    m.add_function(wrap_pyfunction!(ops::diff, m)?)?;
    m.add_function(wrap_pyfunction!(ops::formats, m)?)?;
    m.add_function(wrap_pyfunction!(ops::detect, m)?)?;
    m.add_function(wrap_pyfunction!(ops::did_you_mean, m)?)?;
    m.add_function(wrap_pyfunction!(ops::option_names, m)?)?;
    m.add_function(wrap_pyfunction!(ops::unknown_option, m)?)?;
    m.add_class::<dcp_writer::DcpRankSave>()?;
    m.add_function(wrap_pyfunction!(dcp_writer::dcp_begin, m)?)?;
    m.add_function(wrap_pyfunction!(dcp_writer::dcp_join, m)?)?;
    m.add_class::<hf_writer::HfRankSave>()?;
    m.add_function(wrap_pyfunction!(hf_writer::hf_layout, m)?)?;
    m.add_function(wrap_pyfunction!(hf_writer::hf_parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(hf_writer::hf_begin, m)?)?;
    m.add_function(wrap_pyfunction!(hf_writer::hf_join, m)?)?;
    m.add_function(wrap_pyfunction!(cli::main, m)?)?;
    m.add_function(wrap_pyfunction!(helpers::hand_over, m)?)?;
    Ok(())
}
