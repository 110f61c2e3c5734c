//! How to reach a store: configuration keys (as the CLI's `--storage-option KEY=VALUE` gives them), and how
//! ckpt drives it (retries, timeouts, parallel requests, part size).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How to reach and drive an object store.
///
/// `config` holds the store's own configuration keys, applied over the standard environment variables of
/// each cloud (`AWS_*`, `GOOGLE_*`, `AZURE_*`): for S3 `aws_endpoint`, `aws_region`, `aws_allow_http`,
/// `aws_access_key_id`, …, the keys (and their short aliases such as `endpoint`, `region`,
/// `allow_http`) that `object_store`'s builders take. Values are secret: [`Debug`](fmt::Debug) and every
/// error show keys only.
///
/// ```
/// use ckpt_io::storage::StorageOptions;
/// let options = StorageOptions::default().with("aws_endpoint", "http://127.0.0.1:9000").with("allow_http", "true");
/// assert!(!format!("{options:?}").contains("127.0.0.1"));
/// let parsed = StorageOptions::default().with_pair("region=us-east-1").unwrap();
/// assert_eq!(parsed.config.get("region").map(String::as_str), Some("us-east-1"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StorageOptions {
    /// The store's configuration keys and values.
    pub config: BTreeMap<String, String>,
    /// Retries of a failed request (5xx, throttling, timeouts, broken connections) before giving up.
    pub max_retries: usize,
    /// The longest time from a request's first try to its last retry.
    pub retry_timeout: Duration,
    /// The first backoff between retries; it doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest backoff between retries.
    pub max_backoff: Duration,
    /// The longest a single request may take (including its body).
    pub request_timeout: Duration,
    /// The longest connecting may take.
    pub connect_timeout: Duration,
    /// Requests in flight at once, per transfer (ranged reads, upload parts).
    pub concurrency: usize,
    /// The size of one ranged read or upload part (≥ 5 MiB, S3's smallest part).
    pub part_size: usize,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            config: BTreeMap::new(),
            max_retries: 5,
            retry_timeout: Duration::from_secs(180),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            request_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            concurrency: 8,
            part_size: 16 << 20,
        }
    }
}

impl fmt::Debug for StorageOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageOptions")
            .field("config", &self.config.keys().map(|k| format!("{k}=<redacted>")).collect::<Vec<_>>())
            .field("max_retries", &self.max_retries)
            .field("retry_timeout", &self.retry_timeout)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("concurrency", &self.concurrency)
            .field("part_size", &self.part_size)
            .finish()
    }
}

/// Why a `KEY=VALUE` storage option could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage option `{given}`: {reason}")]
pub struct OptionSyntax {
    /// The text as given, up to its `=` (never its value).
    pub given: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// A duration as `<n>`, `<n>s` or `<n>ms`.
fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    if let Some(ms) = t.strip_suffix("ms") {
        return ms.trim().parse().ok().map(Duration::from_millis);
    }
    let secs: f64 = t.strip_suffix('s').unwrap_or(t).trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// The options of stores opened without explicit options ([`StorageOptions::process_default`]).
static PROCESS_DEFAULT: std::sync::RwLock<Option<StorageOptions>> = std::sync::RwLock::new(None);

impl StorageOptions {
    /// The options a store is opened with when the caller names none: a format crate's writer saving to
    /// a URL path (`ckpt_distcp::save(&state, "s3://bucket/step100", ..)`) opens its store with these.
    /// [`StorageOptions::default`] (the environment's configuration) unless
    /// [`StorageOptions::set_process_default`] set others.
    pub fn process_default() -> StorageOptions {
        PROCESS_DEFAULT.read().ok().and_then(|o| o.clone()).unwrap_or_default()
    }

    /// Sets what [`StorageOptions::process_default`] returns for the rest of the process (the `ckpt`
    /// command sets its `--storage-option`s so).
    pub fn set_process_default(options: StorageOptions) {
        if let Ok(mut o) = PROCESS_DEFAULT.write() {
            *o = Some(options);
        }
    }

    /// Sets the configuration key `key` to `value`.
    #[must_use]
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.config.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets an option from `KEY=VALUE`, as the CLI's `--storage-option` gives it: ckpt's own keys
    /// `max_retries` (a count), `retry_timeout` (`<n>s`, `<n>ms`), `concurrency` (a count) and `part_size`
    /// (bytes) set those fields; every other key is the store's.
    ///
    /// # Errors
    /// [`OptionSyntax`] when there is no `=`, no key, or one of ckpt's keys has a value it cannot read.
    pub fn with_pair(self, pair: &str) -> Result<Self, OptionSyntax> {
        let Some((k, v)) = pair.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
            return Err(OptionSyntax {
                given: pair.split('=').next().unwrap_or_default().to_owned(),
                reason: "not KEY=VALUE",
            });
        };
        let key = k.trim();
        let bad = |reason| OptionSyntax { given: key.to_owned(), reason };
        let count = || v.trim().parse::<usize>().map_err(|_| bad("expected a whole number"));
        Ok(match key {
            "max_retries" => self.with_max_retries(count()?),
            "concurrency" => self.with_concurrency(count()?),
            "part_size" => self.with_part_size(count()?),
            "retry_timeout" => {
                let d = parse_duration(v).ok_or_else(|| bad("expected a duration (30s, 500ms)"))?;
                StorageOptions { retry_timeout: d, ..self }
            }
            _ => self.with(key, v),
        })
    }

    /// Sets the retries of a failed request.
    #[must_use]
    pub fn with_max_retries(mut self, retries: usize) -> Self {
        self.max_retries = retries;
        self
    }

    /// Sets the longest time a request may take, and the time its retries may take (four times as long).
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self.retry_timeout = timeout.saturating_mul(4);
        self
    }

    /// Sets the first and the longest backoff between retries.
    #[must_use]
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets the requests in flight at once per transfer (at least 1).
    #[must_use]
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Sets the size of one ranged read or upload part (at least 5 MiB).
    #[must_use]
    pub fn with_part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes.max(5 << 20);
        self
    }

    /// The values that must never appear in a message: every configuration value, and the secrets of the
    /// environment (`*SECRET*`, `*TOKEN*`, `*KEY*`, `*PASSWORD*`, `*SAS*` variables of `AWS_`, `GOOGLE_`,
    /// `AZURE_`), at least four characters long.
    #[cfg(feature = "remote")]
    pub(crate) fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = self.config.values().cloned().collect();
        for (k, v) in std::env::vars() {
            let upper = k.to_ascii_uppercase();
            let cloud = ["AWS_", "GOOGLE_", "AZURE_"].iter().any(|p| upper.starts_with(p));
            let secret = ["SECRET", "TOKEN", "KEY", "PASSWORD", "SAS", "CREDENTIAL"].iter().any(|s| upper.contains(s));
            if cloud && secret {
                out.push(v);
            }
        }
        out.retain(|v| v.len() >= 4);
        out.sort_by_key(|v| std::cmp::Reverse(v.len()));
        out
    }
}

/// `message` with every secret replaced by `<redacted>`.
#[cfg(feature = "remote")]
pub(crate) fn redact(message: &str, secrets: &[String]) -> String {
    let mut out = message.to_owned();
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "<redacted>");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    #[cfg(feature = "remote")]
    fn pairs_and_redaction() {
        let o = StorageOptions::default().with_pair("aws_secret_access_key=hunter22").unwrap();
        assert!(!format!("{o:?}").contains("hunter22"));
        assert_eq!(redact("signed with hunter22!", &o.secrets()), "signed with <redacted>!");
        assert_eq!(StorageOptions::default().with_pair("=x").unwrap_err().given, "");
        assert!(StorageOptions::default().with_pair("novalue").is_err());
        let tuned = StorageOptions::default()
            .with_pair("max_retries=1")
            .and_then(|o| o.with_pair("retry_timeout=1.5s"))
            .and_then(|o| o.with_pair("concurrency=2"))
            .unwrap();
        assert_eq!((tuned.max_retries, tuned.retry_timeout, tuned.concurrency), (1, Duration::from_millis(1500), 2));
        assert!(tuned.config.is_empty());
        assert!(StorageOptions::default().with_pair("max_retries=lots").is_err());
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(StorageOptions::default().with_part_size(1).part_size, 5 << 20);
    }
}
