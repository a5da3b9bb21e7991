//! Opening a root: one URL (or plain path) names one object store prefix
//! under which memwal keeps everything (DESIGN.md §3).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};
use url::Url;

use super::named::NamedReads;
use crate::error::{Error, Result};

/// Refuses a `.` or `..` segment in the path of the root URL `location`:
/// URL parsing resolves them (`s3://b/a/../x` is `s3://b/x`), so the root
/// would silently be another prefix than the one written.
fn refuse_dot_segments(location: &str) -> Result<()> {
    let after_scheme = location
        .split_once("://")
        .map_or(location, |(_, rest)| rest);
    let path = after_scheme.split_once('/').map_or("", |(_, path)| path);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    for segment in path.split('/') {
        let segment = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        if segment == "." || segment == ".." {
            return Err(Error::invalid(format!(
                "root '{location}': a root's path cannot have a '{segment}' segment \
                 (name the prefix as it is)"
            )));
        }
    }
    Ok(())
}

/// How long a request to a remote store may take, retries included, when
/// a root is opened without a timeout of its own: long enough for S3's
/// throttling backoff, short enough that a store that does not answer
/// fails a statement within a minute.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(60);

/// A failed store call that took at least this long was retried by the
/// store's own client already (a remote store retries within its timeout):
/// a caller retries only quicker failures, or its waits multiply.
pub(crate) const QUICK_FAILURE: Duration = Duration::from_secs(1);

/// Whether a store call that failed `failures` times, the last after
/// `failed_after`, is tried again by a caller allowed `retries` retries:
/// only a failure quicker than [`QUICK_FAILURE`].
pub(crate) fn retry_store_call(failures: u32, retries: u32, failed_after: Duration) -> bool {
    failures <= retries && failed_after < QUICK_FAILURE
}

/// The failures of a write that is retried with the same bytes whenever
/// reading it back found nothing. A quick failure is retried as
/// [`retry_store_call`] says. A slow one (a timeout) may still land
/// later: the write is tried once more after it, however slow (that
/// attempt lands first, and the late one meets it, or meets the late
/// one), and once there was one, nothing there is no proof the write
/// failed: its outcome is unknown.
pub(crate) struct SameBytesRetries {
    retries: u32,
    failures: u32,
    /// The first slow failure's words: what leaves the outcome unknown.
    slow_failure: Option<String>,
}

/// What to do after a failure of a [`SameBytesRetries`] write.
pub(crate) enum AfterFailure {
    /// Write the same bytes again (after a backoff).
    Retry,
    /// Give up: nothing landed, nor can later.
    Failed,
    /// Give up: the write may still land; why (the slow failure, then the
    /// last one).
    Unknown(String),
}

impl SameBytesRetries {
    /// A write allowed `retries` retries of quick failures.
    pub(crate) fn new(retries: u32) -> Self {
        Self {
            retries,
            failures: 0,
            slow_failure: None,
        }
    }

    /// Counts a failure (`error`, after `failed_after`) whose read-back
    /// found nothing there.
    pub(crate) fn failed(&mut self, failed_after: Duration, error: String) -> AfterFailure {
        self.failures += 1;
        let slow = failed_after >= QUICK_FAILURE;
        if retry_store_call(self.failures, self.retries, failed_after)
            || (slow && self.slow_failure.is_none())
        {
            if slow {
                self.slow_failure = Some(error);
            }
            return AfterFailure::Retry;
        }
        match self.slow_failure.take() {
            Some(first) => AfterFailure::Unknown(format!("{first}; tried again: {error}")),
            None => AfterFailure::Failed,
        }
    }

    /// The failures counted so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

/// `builder` giving up on a request after about `budget`: each attempt
/// times out after half of it (at most 30 s, `object_store`'s default;
/// `AWS_TIMEOUT` in the environment is kept), and no retry starts once
/// the budget less half an attempt has passed. A store that never
/// answers fails a request after two attempts, the budget; one that
/// fails fast is retried (with backoff) for three quarters of it.
fn with_timeout(builder: AmazonS3Builder, budget: Duration) -> AmazonS3Builder {
    let attempt = (budget / 2).min(Duration::from_secs(30));
    let builder = match std::env::var_os("AWS_TIMEOUT") {
        Some(_) => builder,
        None => builder.with_config(
            AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
            format!("{}ms", attempt.as_millis().max(1)),
        ),
    };
    builder.with_retry(RetryConfig {
        retry_timeout: budget.saturating_sub(attempt / 2),
        ..RetryConfig::default()
    })
}

/// An object store already narrowed to memwal's root prefix: every path
/// memwal uses is relative to it.
#[derive(Debug, Clone)]
pub struct ObjectRoot {
    store: Arc<dyn ObjectStore>,
    url: String,
}

impl ObjectRoot {
    /// Opens a root from a URL or a plain local path (a location with
    /// `://` that is not a valid URL is refused, never taken for a path,
    /// and so are a `.` or `..` segment in a URL's path and a query or
    /// fragment, which would otherwise be dropped). A URL's path is
    /// the prefix, percent-decoded once (`s3://b/m%C3%A9` is `mé`).
    ///
    /// - a plain path or `file:///dir`: a local directory, created if missing;
    /// - `memory://name`: an in-memory store shared by every open of the same
    ///   URL in this process (so a reopen sees the same data);
    /// - `s3://bucket/prefix`: Amazon S3 or an S3-compatible server,
    ///   configured the usual `object_store` way from `AWS_*` variables
    ///   (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `AWS_REGION`, credentials, ...);
    /// - other schemes that `object_store` was built with (`gs`, `az`,
    ///   `http`, ...) through `object_store::parse_url_opts` with the
    ///   environment as options.
    ///
    /// Requests to S3 give up after about 60 s, retries included (see
    /// [`ObjectRoot::open_with_timeout`]).
    pub fn open(location: &str) -> Result<Self> {
        Self::open_with_timeout(location, DEFAULT_STORE_TIMEOUT)
    }

    /// [`ObjectRoot::open`], with requests to an `s3://` root failing once
    /// they have not succeeded within about `store_timeout`, retries
    /// included (each attempt gets at most half of it, and 30 s; an
    /// `AWS_TIMEOUT` set in the environment names the attempt's timeout
    /// instead; the last attempt may end up to a quarter of it later): a
    /// store that does not answer fails a statement in that time, where
    /// `object_store`'s defaults wait 3 minutes. Throttled or failed
    /// requests are retried (up to 10 times) with backoff within it, so a
    /// short budget also gives up on a store that is only slow.
    pub fn open_with_timeout(location: &str, store_timeout: Duration) -> Result<Self> {
        if store_timeout.is_zero() {
            return Err(Error::invalid("the store timeout must be more than zero"));
        }
        if location.is_empty() {
            return Err(Error::invalid("empty root location"));
        }
        let url = match Url::parse(location) {
            Ok(url) if url.scheme().len() > 1 => url,
            // Meant as a URL: never taken for a local path.
            Err(e) if location.contains("://") => {
                return Err(Error::invalid(format!(
                    "root '{location}' is not a valid URL: {e}"
                )));
            }
            // No scheme (or a Windows drive letter): a local path.
            _ => return Self::open_local(std::path::Path::new(location), location),
        };
        if url.scheme() != "file" {
            refuse_dot_segments(location)?;
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(Error::invalid(format!(
                "root '{location}': a root URL has no query or fragment (a '?' or '#' \
                 in a prefix is written %3F or %23)"
            )));
        }
        match url.scheme() {
            "file" => {
                let path = url
                    .to_file_path()
                    .map_err(|_| Error::invalid(format!("not a local path: {location}")))?;
                Self::open_local(&path, location)
            }
            "memory" => Ok(Self::new(shared_memory_store(location), location)),
            "s3" | "s3a" => {
                let bucket = url.host_str().unwrap_or_default();
                if bucket.is_empty() {
                    return Err(Error::invalid(format!("no bucket in {location}")));
                }
                let builder = AmazonS3Builder::from_env().with_url(format!("s3://{bucket}"));
                let builder = with_timeout(builder, store_timeout);
                let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
                let allow_http = AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp);
                if let Some(endpoint) = endpoint.filter(|e| e.starts_with("http://"))
                    && builder.get_config_value(&allow_http).as_deref() != Some("true")
                {
                    return Err(Error::invalid(format!(
                        "root '{location}': the S3 endpoint {endpoint} is plain HTTP, \
                         which the S3 client refuses unless AWS_ALLOW_HTTP=true"
                    )));
                }
                let store = builder.build()?;
                let prefix = Path::from_url_path(url.path())
                    .map_err(|e| Error::invalid(format!("root '{location}': {e}")))?;
                Ok(Self::with_prefix(Arc::new(store), prefix, location))
            }
            _ => {
                let env: Vec<(String, String)> = std::env::vars()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v))
                    .collect();
                // A scheme object_store does not know, or one built
                // without its feature: the root is what is wrong.
                let (store, prefix) = object_store::parse_url_opts(&url, env).map_err(|e| {
                    Error::invalid(format!(
                        "root '{location}' is not one memwal opens (a path, file://, \
                         memory:// or s3://): {e}"
                    ))
                })?;
                Ok(Self::with_prefix(Arc::from(store), prefix, location))
            }
        }
    }

    /// A root over an existing store (for example the fault-injecting store of `memwal::testing`);
    /// `url` is only used in messages. A read's error that names no object
    /// (a response body cut short) is given the object's name.
    pub fn new(store: Arc<dyn ObjectStore>, url: impl Into<String>) -> Self {
        Self {
            store: Arc::new(NamedReads::new(store)),
            url: url.into(),
        }
    }

    /// A root at `prefix` (decoded from the URL's path) of `store`.
    fn with_prefix(store: Arc<dyn ObjectStore>, prefix: Path, url: &str) -> Self {
        if prefix.as_ref().is_empty() {
            Self::new(store, url)
        } else {
            Self::new(Arc::new(PrefixStore::new(store, prefix)), url)
        }
    }

    /// Opens the local directory `dir` (created if missing; an I/O error
    /// names `location`), and starts deleting (on a thread of its own) the
    /// staging files that killed processes left in it.
    fn open_local(dir: &std::path::Path, location: &str) -> Result<Self> {
        let named = |e: std::io::Error| {
            let why = match e.kind() {
                std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
                    "it is a file, or lies under one; a local root must be a directory".to_string()
                }
                _ => e.to_string(),
            };
            Error::invalid(format!("cannot open root '{location}': {why}"))
        };
        std::fs::create_dir_all(dir).map_err(named)?;
        let dir = std::fs::canonicalize(dir).map_err(named)?;
        // Once per directory and process.
        static SWEPT: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
        let first = SWEPT
            .get_or_init(Default::default)
            .lock()
            .expect("swept directories poisoned")
            .insert(dir.clone());
        if first {
            let sweep = dir.clone();
            let _ = std::thread::Builder::new()
                .name("memwal-staging-sweep".into())
                .spawn(move || delete_abandoned_staging(&sweep, STAGING_GRACE));
        }
        let store = LocalFileSystem::new_with_prefix(&dir)?.with_automatic_cleanup(true);
        Ok(Self::new(
            Arc::new(store),
            format!("file://{}", dir.display()),
        ))
    }

    /// The store, with paths relative to the root.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The URL this root was opened from (for messages).
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// How long ago a local staging file must have been written to before an
/// open deletes it: far longer than any one object's write takes.
const STAGING_GRACE: Duration = Duration::from_secs(3600);

/// Deletes the staging files under `dir` not written to within `grace`;
/// returns how many. The local store writes an object to `name#n` and
/// renames it to `name` when complete, so a process killed mid-write
/// leaves `name#n` behind, which the store's listing does not show (and so
/// no sweep of memwal's own reaches). Errors (a file another open deleted
/// first, a directory that went away) skip the file.
fn delete_abandoned_staging(dir: &std::path::Path, grace: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut deleted = 0;
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            deleted += delete_abandoned_staging(&entry.path(), grace);
            continue;
        }
        let name = entry.file_name();
        // The store's own test: what follows the first `#` is all digits.
        let staging = name
            .to_str()
            .and_then(|n| n.split_once('#'))
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !kind.is_file() || !staging {
            continue;
        }
        let idle = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .is_some_and(|idle| idle >= grace);
        if idle && std::fs::remove_file(entry.path()).is_ok() {
            log::info!(
                "deleted {}, left by a write cut short",
                entry.path().display()
            );
            deleted += 1;
        }
    }
    deleted
}

/// One `InMemory` store per `memory://` URL, for the life of the process.
fn shared_memory_store(url: &str) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .expect("memory store registry poisoned");
    stores
        .entry(url.trim_end_matches('/').to_string())
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::{ObjectStoreExt, PutPayload};

    #[tokio::test]
    async fn memory_roots_are_shared_by_url() {
        let a = ObjectRoot::open("memory://root-test").unwrap();
        let b = ObjectRoot::open("memory://root-test/").unwrap();
        let c = ObjectRoot::open("memory://other-root-test").unwrap();
        let p = Path::from("x");
        a.store()
            .put(&p, PutPayload::from_static(b"1"))
            .await
            .unwrap();
        assert!(b.store().head(&p).await.is_ok());
        assert!(c.store().head(&p).await.is_err());
    }

    #[tokio::test]
    async fn plain_paths_and_file_urls_are_local_directories() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("data");
        let a = ObjectRoot::open(sub.to_str().unwrap()).unwrap();
        a.store()
            .put(&Path::from("k/v"), PutPayload::from_static(b"1"))
            .await
            .unwrap();
        assert!(sub.join("k/v").exists());
        let b = ObjectRoot::open(&format!("file://{}", sub.display())).unwrap();
        assert!(b.store().head(&Path::from("k/v")).await.is_ok());
    }

    #[tokio::test]
    async fn staging_files_of_writes_cut_short_are_deleted_once_idle() {
        let dir = tempfile::tempdir().unwrap();
        // The store itself, not a root: opening a root starts a sweep.
        let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let object = Path::from("tables/t/data.parquet");
        store
            .put(&object, PutPayload::from_static(b"1"))
            .await
            .unwrap();
        let at = |name: &str| dir.path().join("tables/t").join(name);
        let old = SystemTime::now() - Duration::from_secs(7200);
        for (name, modified) in [
            ("data.parquet#0", old),
            ("data.parquet#12", SystemTime::now()),
            ("a#b", old),
            ("ends#", old),
            ("x#a#5", old),
        ] {
            let file = std::fs::File::create(at(name)).unwrap();
            file.set_modified(modified).unwrap();
        }
        assert_eq!(delete_abandoned_staging(dir.path(), STAGING_GRACE), 1);
        assert!(!at("data.parquet#0").exists());
        // A write in progress, objects whose names hold a `#`, and the
        // objects themselves stay.
        for name in ["data.parquet#12", "a#b", "ends#", "x#a#5", "data.parquet"] {
            assert!(at(name).exists(), "{name}");
        }
        assert!(store.head(&object).await.is_ok());
    }

    #[test]
    fn bad_locations_are_typed_errors() {
        assert!(matches!(ObjectRoot::open(""), Err(Error::InvalidInput(_))));
        assert!(matches!(
            ObjectRoot::open("s3://"),
            Err(Error::InvalidInput(_))
        ));
        // Not a directory named `s3:` in the working directory.
        for bad in ["s3://bad bucket/x", "s3://[bucket/x"] {
            match ObjectRoot::open(bad) {
                Err(Error::InvalidInput(why)) => assert!(why.contains("not a valid URL"), "{why}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Not quietly the prefix `x`, nor `a`.
        for bad in [
            "s3://b/a/../x",
            "s3://b/a/./x",
            "s3://b/%2e%2e/x",
            "memory://m/..",
        ] {
            match ObjectRoot::open(bad) {
                Err(Error::InvalidInput(why)) => assert!(why.contains("segment"), "{why}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        // A name with dots in it is a name.
        ObjectRoot::open("memory://m/a..b/.x").unwrap();
        // A scheme no store opens (found from outside: "object store:
        // Generic URL error").
        match ObjectRoot::open("ftp://host/path") {
            Err(Error::InvalidInput(why)) => assert!(why.contains("not one memwal opens"), "{why}"),
            other => panic!("ftp: {other:?}"),
        }
        // Not quietly the prefix `q`, nor the directory `fh`.
        for bad in [
            "s3://b/q?x=1",
            "memory://m/h#f",
            "file:///tmp/fh#f",
            "s3://b/q?",
        ] {
            match ObjectRoot::open(bad) {
                Err(Error::InvalidInput(why)) => {
                    assert!(why.contains("no query or fragment"), "{why}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
