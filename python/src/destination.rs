//! Where a save that `ckpt.dcp.Writer` begins goes, as every other write of the package: a destination is a
//! checkpoint of the target format (replaced, crash-safe) or new; anything else is refused
//! (`ckpt.UsageError`) unless `overwrite=True`, which writes the checkpoint at a staging path beside a local
//! destination and swaps it in whole after the commit ([`ckpt::destination`]), or, under a URL, removes the
//! objects that stood there once the new checkpoint is committed ([`ckpt::storage::check_destination`]).
//! The coordinator checks and decides; the other ranks write where it says ([`Destination::write_path`]).

use std::path::{Path, PathBuf};

use ckpt::Format;
use ckpt::destination::Plan;
use ckpt::storage::{Location, RemoteDestination, StorageOptions, Target};
use pyo3::prelude::*;

use crate::errors::{About, IntoPy};
use crate::remote::{place, target};

/// The coordinator's decision about a save's destination.
pub(crate) enum Destination {
    /// A local destination: written directly or at a staging path ([`Plan`]).
    Local { dst: PathBuf, plan: Plan, sync: bool },
    /// A URL (with `overwrite`, what stood there, removed after the commit), or a local path the facade's
    /// write checks itself ([`Destination::remote`]).
    Remote(Option<Box<RemoteDestination>>),
}

impl Destination {
    /// Checks what stands at `path` for a save of format `to` (refusing what is not a checkpoint of it,
    /// unless `overwrite`).
    pub(crate) fn check(
        path: &Path,
        to: Format,
        overwrite: bool,
        sync: bool,
        storage: &StorageOptions,
    ) -> Result<Destination, About> {
        let location = place(path)?;
        match &location {
            Location::Local(dst) => {
                let plan = ckpt::destination::check(dst, to, overwrite).map_err(|e| About::at(e, &location))?;
                Ok(Destination::Local { dst: dst.clone(), plan, sync })
            }
            Location::Remote(_) => Destination::remote(path, to, overwrite, storage),
        }
    }

    /// For a write whose local destination the facade checks itself (`ckpt.convert`, `ckpt.save`,
    /// `ckpt.reshard`): a URL's objects checked ([`ckpt::storage::check_destination`]); a local path passes,
    /// and its [`Destination::commit`] does nothing.
    pub(crate) fn remote(
        path: &Path,
        to: Format,
        overwrite: bool,
        storage: &StorageOptions,
    ) -> Result<Destination, About> {
        let location = place(path)?;
        let remote =
            ckpt::storage::check_destination(&location, to, overwrite, storage).map_err(|e| About::at(e, &location))?;
        Ok(Destination::Remote(remote.map(Box::new)))
    }

    /// What a rank of a save of format `to` to `path` needs before it starts: on the coordinator (`begin`:
    /// whether to overwrite) the destination checked; on the other ranks (`None`) nothing, `path` being
    /// where the coordinator writes. Returns the check and where this rank writes, and the target to write.
    pub(crate) fn for_rank(
        py: Python<'_>,
        path: &Path,
        to: Format,
        begin: Option<bool>,
        sync: bool,
        storage: &StorageOptions,
    ) -> PyResult<(Option<Destination>, PathBuf, Target)> {
        let destination = match begin {
            Some(overwrite) => Some(py.detach(|| Destination::check(path, to, overwrite, sync, storage)).py()?),
            None => None,
        };
        let write_path = destination.as_ref().map_or(path, |d| d.write_path(path)).to_path_buf();
        let target = target(&write_path, storage).py()?;
        Ok((destination, write_path, target))
    }

    /// Where every rank writes: the destination, or the staging path that replaces it.
    pub(crate) fn write_path<'a>(&'a self, path: &'a Path) -> &'a Path {
        match self {
            Destination::Local { dst, plan, .. } => plan.path(dst),
            Destination::Remote(_) => path,
        }
    }

    /// After the save committed (at [`Destination::write_path`]): swaps a staged checkpoint in, or removes
    /// what stood under the URL.
    pub(crate) fn commit(self, path: &Path) -> Result<(), About> {
        let location = place(path)?;
        match self {
            Destination::Local { dst, plan, sync } => {
                ckpt::destination::commit(&plan, &dst, sync).map_err(|e| About::at(e, &location))
            }
            Destination::Remote(Some(remote)) => remote.remove_stale().map_err(|e| About::at(e, &location)),
            Destination::Remote(None) => Ok(()),
        }
    }

    /// After the save was given up: removes a staging path (the destination is untouched).
    pub(crate) fn abandon(&self) {
        if let Destination::Local { plan, .. } = self {
            ckpt::destination::abandon(plan);
        }
    }
}
