//! The one error type of memwal and its conversions to and from
//! [`DataFusionError`].

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Result with memwal's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in memwal. Variants say what happened, so a
/// caller can tell "someone else won" from "we do not know whether our write
/// landed" from "the input is wrong".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input is not acceptable (bad name, option, type, URL, ...).
    /// Nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// The object being created exists already. Nothing was written.
    #[error("{0} already exists")]
    AlreadyExists(String),

    /// The object (or its parent) does not exist. Nothing was written.
    #[error("{0} does not exist")]
    NotFound(String),

    /// A namespace still has children and the drop was not `CASCADE`.
    #[error("namespace '{0}' is not empty (use CASCADE to drop it with its contents)")]
    NamespaceNotEmpty(String),

    /// Every attempt to commit a new version lost the race to another writer
    /// until the retry budget ran out. Nothing of this change was written.
    #[error(
        "commit conflict on {what}: gave up after {attempts} attempts, other writers kept winning; nothing was written"
    )]
    CommitConflict {
        /// The object the commit was for.
        what: String,
        /// Attempts made.
        attempts: u32,
    },

    /// A `DELETE` (or `TRUNCATE`) found that rows of the shard at the path
    /// were written while it ran and have since left memory (flushed, or
    /// loaded), so it cannot tell them from the versions it read. Nothing
    /// was deleted in that shard; running the statement again reads them.
    #[error(
        "the rows of {0} changed while this DELETE or TRUNCATE ran and were flushed since, so \
         it cannot tell which it read; nothing was deleted there: run the statement again"
    )]
    DeleteConflict(String),

    /// A version write failed in a way that leaves its outcome unknown (for
    /// example a timeout after the request was sent) and reading it back
    /// could not settle it (the read failed, or found nothing while the
    /// write may still land). The change may or may not be committed.
    #[error(
        "outcome of the commit of {path} is unknown: the write failed ({write}); reading it \
         back: {read_back}"
    )]
    CommitOutcomeUnknown {
        /// The version object written.
        path: String,
        /// Why the write failed.
        write: String,
        /// What reading it back found, or why it failed.
        read_back: String,
    },

    /// A step failed, and nothing of the change is stored or can land
    /// later: a commit whose every attempt failed quickly and whose version
    /// reading back found absent, a write whose shard could not be opened,
    /// a `CREATE TABLE ... AS` whose rows were deleted again. It can be
    /// run again.
    #[error("{what} failed; nothing of it was written: {cause}")]
    NotWritten {
        /// What failed (a commit, a write to a shard).
        what: String,
        /// Why.
        cause: String,
    },

    /// Another writer claimed the shard: a newer epoch's fence (or another
    /// writer's entry) holds the WAL position this writer needed. Nothing of
    /// the rejected write is stored; recovery is to reopen the writer.
    #[error(
        "fenced: {path} is taken by a writer of epoch {by_epoch} (this writer's epoch is {epoch})"
    )]
    Fenced {
        /// The object held by the newer writer.
        path: String,
        /// This writer's epoch.
        epoch: u64,
        /// The newer writer's epoch.
        by_epoch: u64,
    },

    /// A shard writer that acknowledged puts before they were durable
    /// ([`crate::WriterOptions::durable`] `false`) stopped before a WAL
    /// entry held some of them (another process's writer took the shard,
    /// or an append failed): those rows are lost. Reported once, by the
    /// next write of the table in this process (which then writes
    /// nothing) or by closing it.
    #[error(
        "up to {rows} rows acknowledged before they were durable (durable = false) are \
         lost from {shard}: its writer stopped before writing them to the WAL ({cause})"
    )]
    LostRows {
        /// The shard's directory.
        shard: String,
        /// Rows acknowledged and in no WAL entry.
        rows: u64,
        /// Why the writer stopped.
        cause: String,
    },

    /// A write has rows for (or a compaction is of) a shard this process
    /// does not write (see [`crate::WriterOptions::owned_shards`]). Nothing
    /// was written.
    #[error("{0}")]
    NotOwned(String),

    /// A shard writer stopped after a failure it cannot recover from (an
    /// append whose outcome is unknown, exhausted retries): this write and
    /// every later one on it fail, nothing unacknowledged is claimed
    /// durable; a [`crate::Table`]'s next write opens the shard again.
    #[error(
        "shard writer stopped: {0}; the rows it acknowledged as durable are in the WAL, \
         and the table's next write opens the shard again"
    )]
    Poisoned(String),

    /// A write to several shards (a put, a delete, a bulk load) took
    /// effect in some shards, or may have (its outcome is unknown in
    /// some), and failed in others. Each shard's part is in whole or not
    /// at all: the `written` shards hold theirs, the `failed` ones none of
    /// it, the `unknown` ones all or none (the next open of the shard
    /// settles it).
    #[error("{}", partly_written(written, *rows, failed, unknown, cause))]
    PartlyWritten {
        /// Shards whose part took effect.
        written: Vec<u32>,
        /// The rows the `written` shards hold for it.
        rows: u64,
        /// Shards whose part failed.
        failed: Vec<u32>,
        /// Shards whose part's outcome is unknown.
        unknown: Vec<u32>,
        /// The first failure, by shard.
        cause: Box<Error>,
    },

    /// A stored object could not be decoded.
    #[error("corrupt object {path}: {reason}")]
    Corrupt {
        /// The object.
        path: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An object-store call failed. The message names the causes too (a
    /// timeout, a refused connection), and shortens an S3 error document
    /// to its code and message.
    #[error("object store: {}", store_message(.0))]
    Store(#[from] object_store::Error),

    /// Arrow encoding or decoding failed.
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),

    /// Parquet encoding or decoding failed.
    #[error("parquet: {0}")]
    Parquet(#[from] datafusion::parquet::errors::ParquetError),

    /// An error raised inside DataFusion.
    #[error("{0}")]
    DataFusion(Box<DataFusionError>),

    /// Local I/O failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidInput(msg.into())
    }

    /// [`Error::NotFound`] of the table at `location`, dropped (`how`
    /// says when, and what became of the operation that found it so).
    pub(crate) fn table_dropped(location: &str, how: &str) -> Self {
        Error::NotFound(format!("the table at '{location}' ({how})"))
    }

    /// Whether this is a commit whose outcome is unknown, or a writer
    /// stopped by one: the change may have taken effect.
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            Error::CommitOutcomeUnknown { .. } => true,
            Error::Poisoned(reason) => reason.starts_with("outcome of the commit of "),
            _ => false,
        }
    }
}

/// The message of [`Error::PartlyWritten`]: what happened in which
/// shards, then the first failure.
fn partly_written(
    written: &[u32],
    rows: u64,
    failed: &[u32],
    unknown: &[u32],
    cause: &Error,
) -> String {
    let mut parts = Vec::new();
    if !written.is_empty() {
        parts.push(format!("took effect in shards {written:?} ({rows} rows)"));
    }
    if !failed.is_empty() {
        parts.push(format!("failed in shards {failed:?}"));
    }
    if !unknown.is_empty() {
        parts.push(format!("has an unknown outcome in shards {unknown:?}"));
    }
    let last = parts.pop().unwrap_or_default();
    let what = match parts.is_empty() {
        true => last,
        false => format!("{} and {last}", parts.join(", ")),
    };
    format!("the write {what}, each shard's part in whole or not at all: {cause}")
}

/// `e`'s message, followed by each cause its message leaves out (the
/// HTTP client's "error sending request" says nothing of why: "operation
/// timed out", "Connection refused"), with an S3 error document reduced
/// to `Code: Message`.
fn store_message(e: &object_store::Error) -> String {
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = c.source();
    }
    // The S3 client's last resort for credentials is the instance
    // metadata service, whose error alone hides that none were set.
    if message.contains(INSTANCE_METADATA) {
        message.push_str(
            " (no S3 credentials were found: set AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY, or run where the instance metadata service gives them)",
        );
    }
    shorten_s3_error_documents(&message)
}

/// The address of the instance metadata service.
const INSTANCE_METADATA: &str = "169.254.169.254";

/// `message` with every S3 error document (`<?xml ...?><Error><Code>C
/// </Code><Message>M</Message>...</Error>`) in it replaced by `C: M`.
fn shorten_s3_error_documents(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(start) = rest.find("<Error>") {
        let Some(len) = rest[start..].find("</Error>") else {
            break;
        };
        let document = &rest[start..start + len];
        let field = |name: &str| {
            let open = format!("<{name}>");
            let from = document.find(&open)? + open.len();
            let to = document[from..].find(&format!("</{name}>"))?;
            Some(document[from..from + to].to_string())
        };
        let head = &rest[..start];
        let head = head.find("<?xml").map_or(head, |xml| &head[..xml]);
        out.push_str(head.trim_end());
        out.push(' ');
        match (field("Code"), field("Message")) {
            (Some(code), Some(text)) => out.push_str(&format!("{code}: {text}")),
            (Some(code), None) => out.push_str(&code),
            _ => out.push_str(document),
        }
        rest = &rest[start + len + "</Error>".len()..];
    }
    out.push_str(rest);
    out
}

impl From<DataFusionError> for Error {
    fn from(e: DataFusionError) -> Self {
        // Unwrap our own errors that travelled through DataFusion.
        match e {
            DataFusionError::External(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::DataFusion(Box::new(DataFusionError::External(other))),
            },
            other => Error::DataFusion(Box::new(other)),
        }
    }
}

impl From<Error> for DataFusionError {
    fn from(e: Error) -> Self {
        match e {
            Error::DataFusion(inner) => *inner,
            Error::Arrow(inner) => DataFusionError::ArrowError(Box::new(inner), None),
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_datafusion() {
        let df: DataFusionError = Error::NotFound("namespace 'a'".into()).into();
        assert!(df.to_string().contains("namespace 'a' does not exist"));
        let back: Error = df.into();
        assert!(matches!(back, Error::NotFound(ref s) if s == "namespace 'a'"));

        let plan = DataFusionError::Plan("bad".into());
        let ours: Error = plan.into();
        let again: DataFusionError = ours.into();
        assert!(matches!(again, DataFusionError::Plan(ref s) if s == "bad"));
    }

    #[test]
    fn an_s3_error_document_reads_as_its_code_and_message() {
        let raw = "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\" \
                   encoding=\"utf-8\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified \
                   bucket does not exist</Message><BucketName>b</BucketName><RequestId>X\
                   </RequestId></Error> (more)";
        assert_eq!(
            shorten_s3_error_documents(raw),
            "Server returned non-2xx status code: 404 Not Found: NoSuchBucket: \
             The specified bucket does not exist (more)"
        );
        assert_eq!(shorten_s3_error_documents("plain"), "plain");
        assert_eq!(shorten_s3_error_documents("<Error> cut"), "<Error> cut");
    }

    /// Like the HTTP client's error: a message that leaves its cause out.
    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Sending(#[source] std::io::Error);

    #[test]
    fn a_store_error_names_its_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "operation timed out");
        let e = Error::Store(object_store::Error::Generic {
            store: "S3",
            source: Box::new(Sending(io)),
        });
        assert_eq!(
            e.to_string(),
            "object store: Generic S3 error: error sending request: operation timed out"
        );
    }

    /// Found from outside: with no credentials set, the only error was the
    /// instance metadata service's.
    #[test]
    fn a_failed_credentials_lookup_says_none_were_set() {
        let e = Error::Store(object_store::Error::Generic {
            store: "S3",
            source: "Error performing PUT http://169.254.169.254/latest/api/token: 403".into(),
        });
        assert!(
            e.to_string().ends_with(
                "(no S3 credentials were found: set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or run where the instance metadata service gives them)"
            ),
            "{e}"
        );
    }

    /// A shard whose commit's outcome is unknown is not said to have
    /// failed (found from outside: "failed in shards [1]" over a cause
    /// saying the commit's outcome was unknown; its rows were there).
    #[test]
    fn a_partial_write_names_an_unknown_outcome_as_such() {
        let unknown_commit = Error::CommitOutcomeUnknown {
            path: "t/shards/1/wal/4.arrow".into(),
            write: "timed out".into(),
            read_back: "timed out".into(),
        };
        let stopped = Error::Poisoned(unknown_commit.to_string());
        let partly = |written: Vec<u32>, failed: Vec<u32>, unknown: Vec<u32>| {
            Error::PartlyWritten {
                written,
                rows: 4,
                failed,
                unknown,
                cause: Box::new(Error::NotFound("t".into())),
            }
            .to_string()
        };
        let message = partly(vec![0], vec![], vec![1]);
        assert!(
            message.starts_with(
                "the write took effect in shards [0] (4 rows) and has an unknown outcome in \
                 shards [1], each shard's part"
            ),
            "{message}"
        );
        let message = partly(vec![0], vec![1], vec![]);
        assert!(
            message.contains("(4 rows) and failed in shards [1], each"),
            "{message}"
        );
        let message = partly(vec![0], vec![1], vec![2, 3]);
        assert!(
            message.contains(
                "(4 rows), failed in shards [1] and has an unknown outcome in shards [2, 3], each"
            ),
            "{message}"
        );
        let message = partly(vec![], vec![1], vec![2]);
        assert!(
            message.starts_with(
                "the write failed in shards [1] and has an unknown outcome in shards [2], each"
            ),
            "{message}"
        );
        // What says an outcome is unknown.
        assert!(unknown_commit.outcome_unknown() && stopped.outcome_unknown());
        assert!(!Error::NotFound("t".into()).outcome_unknown());
    }
}
