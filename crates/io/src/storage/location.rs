//! Where a checkpoint is: a local path or an object-store URL, told apart by the scheme, never guessed.

use std::fmt;
use std::path::{Path, PathBuf};

use super::StorageError;

/// A checkpoint's place: a local path, or a URL of an object store (`s3://bucket/key`, `gs://…`, `az://…`,
/// `https://…`). A string with a scheme (`<letters>://`) is a URL, and a URL is never taken for a relative
/// path: `file://` names a local path, every other scheme must be one the
/// [registry](crate::storage::Registry) knows.
///
/// ```
/// use ckpt_io::storage::Location;
/// assert!(Location::parse("ckpt/model.pt").unwrap().is_local());
/// assert_eq!(Location::parse("file:///tmp/m.pt").unwrap().local(), Some(std::path::Path::new("/tmp/m.pt")));
/// let url = Location::parse("s3://bucket/runs/step-10").unwrap();
/// assert_eq!(url.scheme(), Some("s3"));
/// // Credentials in a URL never reach a message.
/// assert_eq!(Location::parse("s3://key:secret@bucket/x").unwrap().to_string(), "s3://bucket/x");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A path on a local (or locally mounted) file system.
    Local(PathBuf),
    /// An object-store URL, as given.
    Remote(RemoteUrl),
}

/// An object-store URL: its scheme (lower case) and the whole URL as given. Its [`Display`](fmt::Display)
/// drops user information and the query, where credentials travel.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RemoteUrl {
    scheme: String,
    url: String,
}

impl RemoteUrl {
    /// The scheme, lower case (`s3`, `gs`, `az`, `https`, …).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The URL as given, credentials included: pass it to a client, never to a message.
    pub fn as_given(&self) -> &str {
        &self.url
    }

    /// The URL without user information and query: what messages and reports show.
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.url.split_once("://") else { return self.url.clone() };
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        format!("{scheme}://{host}{path}")
    }

    /// This URL with `name` appended as a path segment (`s3://b/ckpt` + `x.distcp` → `s3://b/ckpt/x.distcp`).
    pub fn join(&self, name: &str) -> RemoteUrl {
        let (base, query) = match self.url.find(['?', '#']) {
            Some(i) => self.url.split_at(i),
            None => (self.url.as_str(), ""),
        };
        let sep = if base.ends_with('/') { "" } else { "/" };
        RemoteUrl { scheme: self.scheme.clone(), url: format!("{base}{sep}{name}{query}") }
    }

    /// The URL of the prefix holding this object and the object's name (`s3://b/runs/m.pt` →
    /// `s3://b/runs`, `m.pt`); `None` when the URL names a bucket or host alone.
    pub fn parent(&self) -> Option<(RemoteUrl, String)> {
        let (base, query) = match self.url.find(['?', '#']) {
            Some(i) => self.url.split_at(i),
            None => (self.url.as_str(), ""),
        };
        let trimmed = base.trim_end_matches('/');
        let (dir, name) = trimmed.rsplit_once('/')?;
        if dir.ends_with('/') || !dir.contains("://") || name.is_empty() {
            return None;
        }
        Some((RemoteUrl { scheme: self.scheme.clone(), url: format!("{dir}{query}") }, name.to_owned()))
    }

    /// The last path segment (`s3://b/runs/m.pt` → `m.pt`), if the URL has a path.
    pub fn file_name(&self) -> Option<&str> {
        let rest = self.url.split_once("://")?.1;
        let rest = rest.split(['?', '#']).next()?;
        let path = &rest[rest.find('/')?..];
        path.trim_end_matches('/').rsplit('/').next().filter(|s| !s.is_empty())
    }
}

impl fmt::Debug for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteUrl({})", self.redacted())
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The scheme of `s` when it starts with one (`<letter>(<letter>|<digit>|+|-|.)*://`).
fn scheme_of(s: &str) -> Option<&str> {
    let (scheme, _) = s.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic() && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .then_some(scheme)
}

impl Location {
    /// Reads `s` as a URL when it has a scheme, as a local path otherwise.
    ///
    /// # Errors
    /// [`StorageError::InvalidUrl`] for a `file://` URL with a host, or a URL without a bucket or host.
    pub fn parse(s: &str) -> Result<Location, StorageError> {
        let Some(scheme) = scheme_of(s) else { return Ok(Location::Local(PathBuf::from(s))) };
        let scheme = scheme.to_ascii_lowercase();
        let rest = &s[scheme.len() + 3..];
        if scheme == "file" {
            let (host, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            if !(host.is_empty() || host == "localhost") || path.is_empty() {
                return Err(StorageError::InvalidUrl {
                    url: s.split(['?', '#']).next().unwrap_or_default().to_owned(),
                    reason: "a file URL names an absolute local path: file:///path".into(),
                });
            }
            return Ok(Location::Local(PathBuf::from(path)));
        }
        let url = RemoteUrl { scheme, url: s.to_owned() };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.rsplit_once('@').map_or(authority, |(_, h)| h).is_empty() {
            return Err(StorageError::InvalidUrl {
                url: url.redacted(),
                reason: "names no bucket or host (expected <scheme>://<bucket>/<key>)".into(),
            });
        }
        Ok(Location::Remote(url))
    }

    /// A local path, as it is.
    pub fn from_path(path: impl AsRef<Path>) -> Location {
        Location::Local(path.as_ref().to_path_buf())
    }

    /// Whether this is a local path.
    pub fn is_local(&self) -> bool {
        matches!(self, Location::Local(_))
    }

    /// The local path, if this is one.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            Location::Remote(_) => None,
        }
    }

    /// The URL, if this is one.
    pub fn remote(&self) -> Option<&RemoteUrl> {
        match self {
            Location::Local(_) => None,
            Location::Remote(u) => Some(u),
        }
    }

    /// The URL's scheme; `None` for a local path.
    pub fn scheme(&self) -> Option<&str> {
        self.remote().map(RemoteUrl::scheme)
    }

    /// The last component of the path or URL (`m.pt`), if any.
    pub fn file_name(&self) -> Option<&str> {
        match self {
            Location::Local(p) => p.file_name().and_then(|n| n.to_str()),
            Location::Remote(u) => u.file_name(),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "Local({})", p.display()),
            Location::Remote(u) => write!(f, "Remote({u})"),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote(u) => write!(f, "{u}"),
        }
    }
}

impl std::str::FromStr for Location {
    type Err = StorageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Location::parse(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn schemes_are_never_paths() {
        for s in ["s3://b/k", "S3://b/k", "gs://b/k", "az://c/k", "https://h/p", "weird+x://h/p"] {
            assert!(!Location::parse(s).unwrap().is_local(), "{s}");
        }
        for s in ["a/b", "./s3:/b/k", "/abs/x.pt", "C:/x", "model.pt", "a://"] {
            let parsed = Location::parse(s);
            if s == "a://" {
                assert!(matches!(parsed, Err(StorageError::InvalidUrl { .. })));
            } else {
                assert!(parsed.unwrap().is_local(), "{s}");
            }
        }
        assert!(matches!(Location::parse("file://host/x"), Err(StorageError::InvalidUrl { .. })));
        assert_eq!(Location::parse("file://localhost/x").unwrap().local(), Some(Path::new("/x")));
    }

    #[test]
    fn urls_redact_and_join() {
        let Location::Remote(u) = Location::parse("s3://AKIA:s3cr3t@bucket/ck?X-Amz-Signature=abc").unwrap() else {
            panic!()
        };
        assert_eq!(u.to_string(), "s3://bucket/ck");
        assert!(!format!("{u:?}").contains("s3cr3t"));
        assert_eq!(u.join("a.distcp").as_given(), "s3://AKIA:s3cr3t@bucket/ck/a.distcp?X-Amz-Signature=abc");
        assert_eq!(u.file_name(), Some("ck"));
        let (parent, name) = u.parent().unwrap();
        assert_eq!((parent.as_given(), name.as_str()), ("s3://AKIA:s3cr3t@bucket?X-Amz-Signature=abc", "ck"));
        let Location::Remote(deep) = Location::parse("s3://b/runs/step/m.pt").unwrap() else { panic!() };
        assert_eq!(deep.parent().unwrap().0.as_given(), "s3://b/runs/step");
        let Location::Remote(bare) = Location::parse("gs://bucket").unwrap() else { panic!() };
        assert_eq!(bare.file_name(), None);
        assert_eq!(bare.join("x").as_given(), "gs://bucket/x");
    }
}
