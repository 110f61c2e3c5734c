//! The dense and auxiliary state of a checkpoint directory, written by RecIS's checkpoint manager with
//! `torch.save` and read here through `ckpt-torch`:
//!
//! * `model.pt`: the dense model state dict (shard 0);
//! * `extra.pt`: `{name: state}` of the objects registered for checkpointing (`global_step`, the dense
//!   optimizer, ...; shard 0);
//! * `io_state_<shard>.pt`: `{io name: io state}` of each shard's datasets;
//! * `io_state_count`: the shard count as decimal text without a newline (shard 0). RecIS refuses to load
//!   io states with another worker count, so io states are never resharded.
//!
//! Every write of these functions is atomic (temporary file, fsync, rename); the save functions write the
//! files into their directory commit instead.

use std::path::{Path, PathBuf};

use ckpt_tensor::Value;
use ckpt_torch::{ReadOptions, TorchReader};

use crate::error::{Error, Result};
use crate::name::Shard;
use crate::writer::{Target, write_text};

pub use crate::files::{EXTRA_FILE, IO_STATE_COUNT_FILE, MODEL_FILE};

/// The io-state file of shard `shard`: `io_state_<shard>.pt`.
pub fn io_state_file(shard: usize) -> String {
    format!("io_state_{shard}.pt")
}

fn save(value: &Value, path: &Path) -> Result<()> {
    ckpt_torch::save(value, path, &ckpt_torch::WriteOptions::default())?;
    Ok(())
}

/// Writes `value` as the `torch.save` file `name` of `target`, each record marked for the checksum manifest.
pub(crate) fn write_torch_to(target: Target<'_>, name: &str, value: &Value) -> Result<()> {
    let prefix = ckpt_torch::prefix_for_path(Path::new(name))?;
    target.write(name, |w| Ok(ckpt_torch::save_to_durable(value, w, &prefix, &ckpt_torch::WriteOptions::default())?))
}

/// The value of the `torch.save` file at `path`, if it exists.
pub(crate) fn read_torch(path: &Path, options: &ReadOptions) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    Ok(Some(TorchReader::open_with(path, options)?.into_value()))
}

fn load(path: &Path) -> Result<Option<Value>> {
    read_torch(path, &ReadOptions::default())
}

/// Writes `model.pt` (a `torch.save` file `torch.load(weights_only=True)` reads).
///
/// # Errors
/// [`Error::Torch`] for values torch.save cannot hold or I/O failures.
pub fn write_model(dir: &Path, state: &Value) -> Result<()> {
    save(state, &dir.join(MODEL_FILE))
}

/// Reads `model.pt`, if present (tensors are windows of the mapped file).
///
/// # Errors
/// [`Error::Torch`] for a file that is not a valid torch.save file.
pub fn read_model(dir: &Path) -> Result<Option<Value>> {
    load(&dir.join(MODEL_FILE))
}

/// Writes `extra.pt`.
///
/// # Errors
/// As [`write_model`].
pub fn write_extra(dir: &Path, state: &Value) -> Result<()> {
    save(state, &dir.join(EXTRA_FILE))
}

/// Reads `extra.pt`, if present.
///
/// # Errors
/// As [`read_model`].
pub fn read_extra(dir: &Path) -> Result<Option<Value>> {
    load(&dir.join(EXTRA_FILE))
}

/// Writes `io_state_<shard>.pt`.
///
/// # Errors
/// As [`write_model`].
pub fn write_io_state(dir: &Path, shard: usize, state: &Value) -> Result<()> {
    save(state, &dir.join(io_state_file(shard)))
}

/// Writes `io_state_count`: `shard_num` in decimal, no newline.
///
/// # Errors
/// [`Error::Io`].
pub fn write_io_state_count(dir: &Path, shard_num: usize) -> Result<()> {
    write_text(Target::Dir(dir), IO_STATE_COUNT_FILE, &shard_num.to_string())
}

/// Reads `io_state_count`, if present.
///
/// # Errors
/// [`Error::IoStateCount`] if it does not hold a decimal count; [`Error::Io`].
pub fn read_io_state_count(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join(IO_STATE_COUNT_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let parsed = std::str::from_utf8(&text).ok().map(str::trim).and_then(|t| t.parse::<usize>().ok());
    match parsed {
        Some(n) => Ok(Some(n)),
        None => Err(Error::IoStateCount { path, text: String::from_utf8_lossy(&text).into_owned() }),
    }
}

/// Reads shard `shard.index()`'s io state, as RecIS's loader does: `io_state_count` must exist and equal
/// `shard.num()` (io states are per worker and cannot be resharded). `None` when the shard saved no io
/// state.
///
/// # Errors
/// [`Error::MissingFile`] if the io state exists but the count does not; [`Error::IoStateWorkers`] if the
/// count differs from `shard.num()`; as [`read_model`].
pub fn read_io_state(dir: &Path, shard: Shard) -> Result<Option<Value>> {
    let path = dir.join(io_state_file(shard.index()));
    if !path.is_file() {
        return Ok(None);
    }
    let count_path: PathBuf = dir.join(IO_STATE_COUNT_FILE);
    let count = read_io_state_count(dir)?.ok_or(Error::MissingFile {
        path: count_path.clone(),
        what: "io states are loaded only with the worker count they were saved with",
    })?;
    if count != shard.num() {
        return Err(Error::IoStateWorkers { path: count_path, saved: count, running: shard.num() });
    }
    load(&path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use ckpt_tensor::Tensor;

    #[test]
    fn dense_state_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let model = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
        let extra = Value::dict([("global_step", Value::Tensor(Tensor::from_slice(&[100i64], &[]).unwrap()))]);
        let io = Value::dict([("train_io", Value::dict([("pos", Value::Int(7))]))]);
        assert_eq!(read_model(d).unwrap(), None);
        write_model(d, &model).unwrap();
        write_extra(d, &extra).unwrap();
        write_io_state(d, 1, &io).unwrap();
        assert_eq!(read_model(d).unwrap().unwrap(), model);
        assert_eq!(read_extra(d).unwrap().unwrap(), extra);
        let s = Shard::new(1, 2).unwrap();
        assert!(matches!(read_io_state(d, s), Err(Error::MissingFile { .. })));
        write_io_state_count(d, 2).unwrap();
        assert_eq!(std::fs::read(d.join(IO_STATE_COUNT_FILE)).unwrap(), b"2");
        assert_eq!(read_io_state(d, s).unwrap().unwrap(), io);
        assert_eq!(read_io_state(d, Shard::new(0, 2).unwrap()).unwrap(), None);
        assert!(matches!(
            read_io_state(d, Shard::new(1, 3).unwrap()),
            Err(Error::IoStateWorkers { saved: 2, running: 3, .. })
        ));
        std::fs::write(d.join(IO_STATE_COUNT_FILE), b"two").unwrap();
        assert!(matches!(read_io_state_count(d), Err(Error::IoStateCount { .. })));
    }
}
