//! The few operations a format does by path outside a commit, on a local path or an object-store URL spelled
//! as a path (as the commits take them): reading a small file (a list, a version file), removing a tree (a
//! checkpoint rotated out).

use std::path::Path;

use crate::error::CommitError;

/// The bytes of the small file at `path` (a local path, or an object-store URL spelled as a path), or
/// `None` where there is none.
///
/// # Errors
/// [`CommitError::Refused`] for a file larger than `limit` bytes, or a URL in a build without the `remote`
/// feature; [`CommitError::Storage`] for the store's errors; [`CommitError::Io`] for the local ones.
pub fn read_small_file(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, CommitError> {
    let too_large = |size: u64| CommitError::Refused {
        path: path.to_path_buf(),
        reason: format!("{size} bytes, more than the {limit} bytes this file may have"),
    };
    if let Some(url) = super::url_of_path(path)? {
        return remote::read(&url, limit, too_large);
    }
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CommitError::from_io(path, e)),
    };
    let size = file.metadata().map_err(|e| CommitError::from_io(path, e))?.len();
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::io::Read::read_to_end(&mut std::io::Read::take(file, limit.saturating_add(1)), &mut bytes)
        .map_err(|e| CommitError::from_io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(Some(bytes))
}

/// Removes the directory tree at `path`: a local directory and everything in it, or every object under
/// the URL's prefix. A tree that is not there is removed already.
///
/// # Errors
/// [`CommitError::Refused`] for a URL in a build without the `remote` feature; [`CommitError::Storage`]
/// for the store's errors; [`CommitError::Io`] for the local ones.
pub fn remove_tree(path: &Path) -> Result<(), CommitError> {
    if let Some(url) = super::url_of_path(path)? {
        return remote::remove(&url);
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CommitError::from_io(path, e)),
    }
}

#[cfg(feature = "remote")]
mod remote {
    use crate::error::CommitError;
    use crate::storage::{RemoteUrl, StorageError, StorageOptions, Store};

    fn storage(source: StorageError) -> CommitError {
        CommitError::Storage { source }
    }

    pub(super) fn read(
        url: &RemoteUrl,
        limit: u64,
        too_large: impl Fn(u64) -> CommitError,
    ) -> Result<Option<Vec<u8>>, CommitError> {
        let Some((parent, name)) = url.parent() else {
            let reason = "a file needs a key under the bucket".into();
            return Err(storage(StorageError::InvalidUrl { url: url.redacted(), reason }));
        };
        let store = Store::open(&parent, &StorageOptions::process_default()).map_err(storage)?;
        let Some(info) = store.head(&name).map_err(storage)? else { return Ok(None) };
        if info.size > limit {
            return Err(too_large(info.size));
        }
        Ok(Some(store.read(&name, 0..info.size).map_err(storage)?.to_vec()))
    }

    pub(super) fn remove(url: &RemoteUrl) -> Result<(), CommitError> {
        let store = Store::open(url, &StorageOptions::process_default()).map_err(storage)?;
        for object in store.list().map_err(storage)? {
            store.delete(&object.name).map_err(storage)?;
        }
        Ok(())
    }
}

#[cfg(not(feature = "remote"))]
mod remote {
    use crate::error::CommitError;
    use crate::storage::RemoteUrl;

    fn refused(url: &RemoteUrl) -> CommitError {
        CommitError::Refused { path: url.redacted().into(), reason: crate::storage::NO_REMOTE.into() }
    }

    pub(super) fn read(
        url: &RemoteUrl,
        _: u64,
        _: impl Fn(u64) -> CommitError,
    ) -> Result<Option<Vec<u8>>, CommitError> {
        Err(refused(url))
    }

    pub(super) fn remove(url: &RemoteUrl) -> Result<(), CommitError> {
        Err(refused(url))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn small_files_and_trees_on_a_local_path() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("checkpoint");
        assert_eq!(read_small_file(&list, 16).unwrap(), None, "no file: nothing");
        std::fs::write(&list, b"ckpt_1\n").unwrap();
        assert_eq!(read_small_file(&list, 16).unwrap().as_deref(), Some(&b"ckpt_1\n"[..]));
        let e = read_small_file(&list, 4).unwrap_err();
        assert!(matches!(&e, CommitError::Refused { reason, .. } if reason.contains("7 bytes")), "{e}");
        let tree = dir.path().join("ckpt_1");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/index"), b"x").unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        remove_tree(&tree).unwrap();
    }

    #[cfg(not(feature = "remote"))]
    #[test]
    fn a_url_needs_the_remote_feature() {
        let url = Path::new("s3://bucket/run/checkpoint");
        assert!(matches!(read_small_file(url, 16), Err(CommitError::Refused { .. })));
        assert!(matches!(remove_tree(url), Err(CommitError::Refused { .. })));
    }
}
