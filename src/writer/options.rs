//! [`WriterOptions`]: how a [`super::ShardWriter`] writes, field by field,
//! and [`WriterOptions::set`], which sets one by name from text (the
//! shell's `--option name=value`).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::{CommitOptions, retry_store_call};

/// The most [`WriterOptions::index_threads`] a writer takes.
const MAX_INDEX_THREADS: usize = 256;

/// How a table's shard writers make puts durable, flush and compact.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WriterOptions {
    /// `true` (default): a put returns once its WAL entry exists and its
    /// vectors are indexed, and rows become visible then. `false`: a put
    /// returns once its vectors are indexed (and is visible then); the WAL
    /// catches up in the background, and rows it has not caught up with
    /// are lost if the process stops, or if another process writes the
    /// shard (its writer takes the shard over): the next write of the
    /// table in this process, or closing it, then fails with
    /// [`crate::Error::LostRows`].
    pub durable: bool,
    /// The group-commit cadence: at most one WAL append starts per interval
    /// while puts keep coming (default 100 ms); a put arriving after a whole
    /// idle interval starts one at once, and so does a put with nothing in
    /// flight after an append of a single batch during which no other
    /// batch was put (one writer putting and waiting, one put at a time).
    /// Zero is latency mode: an append
    /// starts as soon as batches wait and fewer than
    /// `wal_appends_in_flight` are in flight.
    pub wal_flush_interval: Duration,
    /// An append starts early once this many bytes are pending (default
    /// 8 MiB).
    pub wal_flush_bytes: usize,
    /// WAL appends that may be in flight at once (default 2; at least 1).
    /// Puts are acknowledged in append order whatever order the appends
    /// land in, so a second append lets the cadence, not one PUT's
    /// latency, set the rate on a store whose PUTs take longer than the
    /// interval. 1 starts each append after the previous one landed.
    pub wal_appends_in_flight: usize,
    /// Puts wait while more than this many bytes of rows are in memory and
    /// not yet in SSTables (default 256 MiB; at least `memtable_bytes`).
    pub max_unflushed_bytes: usize,
    /// A MemTable freezes (and is flushed to an SSTable) once its rows take
    /// this many bytes (default 64 MiB). Long blob values count only until
    /// their pack has landed: the MemTable then holds their descriptors.
    pub memtable_bytes: usize,
    /// Compaction merges SSTables whenever a shard has more than this many
    /// (default 8).
    pub max_sstables: usize,
    /// SSTables a compaction replaced are deleted this long afterwards, so
    /// queries of other processes that started before can finish reading
    /// them (default 60 s); such a query that runs longer than this (or
    /// any, at zero) can fail with a missing object. Queries of the
    /// writer's own process keep what they read until they end, whatever
    /// this is.
    pub sstable_grace: Duration,
    /// Attempts at one WAL position (and at a blob pack, an SSTable, an
    /// ownership check) after the first fails (default 5). Only a failure
    /// that came within a second is tried again: one that took longer was
    /// retried by the object store's client already, within its store
    /// timeout, so trying again would only multiply the wait of a
    /// statement on a store that does not answer.
    pub append_retries: u32,
    /// Commit behaviour of the shard manifest (and the retry backoff).
    /// Shard manifests are committed a few times per writer, and writers
    /// may be short-lived, so by default their collected versions'
    /// tombstones last 60 s and a sweep runs every 64 versions: a shard's
    /// manifest directory stays small however many writers come and go.
    pub commit: CommitOptions,
    /// [`crate::Table::get`] trusts that this process's writer still owns
    /// its shard for this long after it last confirmed it (by an append or
    /// a check), and reads its MemTable without any store request; a write
    /// another process made to the shard within that window may be missed.
    /// Scans always check. Default 100 ms; zero checks on every read.
    pub owner_check_interval: Duration,
    /// Threads that insert a MemTable's vectors into its graphs (default:
    /// the available parallelism, at most 4; at most 256).
    pub index_threads: usize,
    /// WAL fences are deleted this long after they were written (default
    /// 2 min); a writer re-confirms its ownership of the shard after a
    /// quarter of this without an append, and confirms an append that took
    /// longer than a quarter of this before acknowledging it. The protocol
    /// assumes clocks of writers of one shard differ by less than half of
    /// it, and that a writer's host is not suspended for more than a quarter
    /// of it between a confirmation and an append (the monotonic clock that
    /// measures the lease stops while a machine sleeps). Processes may use
    /// different values: a shard keeps its fences for the longest grace of
    /// any writer that claimed it (recorded in its manifest). At least
    /// 100 ms; on an object store, more than four times an append's
    /// latency.
    pub fence_grace: Duration,
    /// A write given as a stream ([`crate::Table::put_stream`], SQL
    /// `INSERT`) holds at most about this many bytes of rows in memory; a
    /// larger one (counting about 128 bytes more a row, for a put's key
    /// index) is loaded through SSTables (default 256 MiB).
    pub load_memory_bytes: usize,
    /// A bulk load rewrites a marker in each shard every quarter of this
    /// (at most every minute) while it runs, and names this grace in the
    /// marker; a load whose markers are older than their grace crashed,
    /// and the runs of it no manifest names are deleted (by the shard's
    /// writers and by later loads of the table). A loading host must not
    /// stall this long. Default 1 h, at least 1 s.
    pub load_grace: Duration,
    /// Values of a blob column (`'<column>.blob' = 'true'`) longer than
    /// this many bytes are stored out of line, in the blob pack of their
    /// WAL append; shorter ones stay in the rows (default 4 KiB: an
    /// SSTable page of 1,024 such rows stays a few MiB).
    pub blob_inline_bytes: usize,
    /// A group commit's blob pack of at most this many bytes is the front
    /// of its WAL entry's object: one object a group, one request. A
    /// larger pack is an object of its own, written (in parts) before the
    /// entry that names it. Default and most 16 MiB (a pack larger than
    /// that is uploaded in parts); 0: every pack an object of its own.
    pub blob_wal_pack_bytes: usize,
    /// A compaction that merges every SSTable naming a blob pack moves the
    /// values it keeps of that pack into a new pack when they are less
    /// than this share of the pack's bytes (default 0.5; 0 never), so
    /// upserts and deletes of blob rows do not keep dead bytes for ever;
    /// the old pack is then collected.
    pub blob_repack_below: f64,
    /// The memory a repack may hold: the values it moves are read at most
    /// this many bytes at a time and gathered into new packs of at most
    /// this size (a longer value gets a pack of its own), so it holds about
    /// twice this (default 16 MiB).
    pub blob_repack_bytes: usize,
    /// The shards of every table this process writes (default: all). With
    /// several writer processes on one table, give each its own slice
    /// (`0/3`, `1/3`, `2/3`): a put, delete, load or compaction that would
    /// write another shard fails with [`Error::NotOwned`] and writes
    /// nothing, instead of taking the shard over from its writer (which
    /// is safe, fenced, but makes the two trade the shard back and forth).
    /// Rows of an append-only table go to this process's shards in turn.
    pub owned_shards: ShardSlice,
}

/// A slice of every table's shards: see [`WriterOptions::owned_shards`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ShardSlice {
    /// Every shard.
    #[default]
    All,
    /// The shards whose number modulo `of` is `index` (`index < of`).
    Slice {
        /// Which slice.
        index: u32,
        /// Of how many.
        of: u32,
    },
}

impl ShardSlice {
    /// The slice `index` of `of` (`index/of`); an error unless
    /// `index < of`.
    pub fn new(index: u32, of: u32) -> Result<Self> {
        match index < of {
            true => Ok(Self::Slice { index, of }),
            false => Err(bad(
                "owned_shards",
                &format!("{index}/{of}"),
                "i/n with i < n",
            )),
        }
    }

    /// Whether shard `shard` is in the slice.
    pub fn contains(&self, shard: u32) -> bool {
        match *self {
            Self::All => true,
            Self::Slice { index, of } => shard % of == index,
        }
    }
}

impl std::fmt::Display for ShardSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Slice { index, of } => write!(f, "{index}/{of}"),
        }
    }
}

impl std::str::FromStr for ShardSlice {
    type Err = Error;

    /// `all` or `i/n`.
    fn from_str(value: &str) -> Result<Self> {
        let value = value.trim();
        if value.eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        let slice = value
            .split_once('/')
            .and_then(|(i, n)| Some((i.trim().parse().ok()?, n.trim().parse().ok()?)));
        match slice {
            Some((index, of)) => Self::new(index, of),
            None => Err(bad("owned_shards", value, "'all' or i/n (like 1/3)")),
        }
    }
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            durable: true,
            wal_flush_interval: Duration::from_millis(100),
            wal_flush_bytes: 8 << 20,
            wal_appends_in_flight: 2,
            max_unflushed_bytes: 256 << 20,
            memtable_bytes: 64 << 20,
            max_sstables: 8,
            sstable_grace: Duration::from_secs(60),
            append_retries: 5,
            blob_inline_bytes: 4 << 10,
            blob_wal_pack_bytes: crate::blob::PACK_PART_BYTES,
            blob_repack_below: 0.5,
            blob_repack_bytes: 16 << 20,
            commit: CommitOptions {
                tombstone_ttl: Duration::from_secs(60),
                sweep_every: 64,
                ..CommitOptions::default()
            },
            owner_check_interval: Duration::from_millis(100),
            index_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            fence_grace: Duration::from_secs(120),
            load_memory_bytes: 256 << 20,
            load_grace: Duration::from_secs(3600),
            owned_shards: ShardSlice::All,
        }
    }
}

impl WriterOptions {
    /// How long a confirmation of ownership lets the writer append (and
    /// how long an append may take unconfirmed): a quarter of
    /// [`WriterOptions::fence_grace`].
    pub(super) fn lease(&self) -> Duration {
        self.fence_grace / 4
    }

    /// Whether a store call that failed `failures` times, the last after
    /// `failed_after`, is tried again (see
    /// [`WriterOptions::append_retries`]).
    pub(super) fn retry(&self, failures: u32, failed_after: Duration) -> bool {
        retry_store_call(failures, self.append_retries, failed_after)
    }

    /// How often a running bulk load rewrites its markers: a quarter of
    /// [`WriterOptions::load_grace`], at most a minute.
    pub(crate) fn load_heartbeat(&self) -> Duration {
        (self.load_grace / 4).min(Duration::from_secs(60))
    }

    /// The turn a writer that took a shard back from another one holds it
    /// before others take it again: three WAL intervals, at least 250 ms.
    pub fn turn(&self) -> Duration {
        (3 * self.wal_flush_interval).max(Duration::from_millis(250))
    }

    /// Whether the options fit together; a writer opens only with options
    /// that do.
    pub fn check(&self) -> Result<()> {
        let positive = [
            ("wal_flush_bytes", self.wal_flush_bytes),
            ("wal_appends_in_flight", self.wal_appends_in_flight),
            ("memtable_bytes", self.memtable_bytes),
            ("max_sstables", self.max_sstables),
            ("load_memory_bytes", self.load_memory_bytes),
            ("index_threads", self.index_threads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(bad(name, "0", "positive"));
        }
        if self.max_unflushed_bytes < self.memtable_bytes {
            return Err(Error::invalid(format!(
                "options max_unflushed_bytes ({} bytes) and memtable_bytes ({} bytes) \
                 do not fit: max_unflushed_bytes must be at least memtable_bytes",
                self.max_unflushed_bytes, self.memtable_bytes
            )));
        }
        // Shown in milliseconds, the unit `set` reads without one.
        // Below this the lease (a quarter) is shorter than an append to a
        // local disk under load: most appends would need a confirmation,
        // and the clocks of a shard's writers would have to agree to
        // within 50 ms.
        if self.fence_grace < Duration::from_millis(100) {
            let value = format!("{}ms", self.fence_grace.as_millis());
            return Err(bad("fence_grace", &value, "at least 100 ms"));
        }
        // Each a thread of its own while a MemTable's vectors are indexed.
        if self.index_threads > MAX_INDEX_THREADS {
            let value = self.index_threads.to_string();
            return Err(bad(
                "index_threads",
                &value,
                &format!("at most {MAX_INDEX_THREADS}"),
            ));
        }
        if self.blob_wal_pack_bytes > crate::blob::PACK_PART_BYTES {
            let value = self.blob_wal_pack_bytes.to_string();
            return Err(bad("blob_wal_pack_bytes", &value, "at most 16 MiB"));
        }
        if self.load_grace < Duration::from_secs(1) {
            let value = format!("{}ms", self.load_grace.as_millis());
            return Err(bad("load_grace", &value, "at least 1 s"));
        }
        Ok(())
    }

    /// The names [`WriterOptions::set`] takes.
    pub const NAMES: &'static [&'static str] = &[
        "durable",
        "wal_flush_interval",
        "wal_flush_bytes",
        "wal_appends_in_flight",
        "max_unflushed_bytes",
        "memtable_bytes",
        "max_sstables",
        "sstable_grace",
        "append_retries",
        "owner_check_interval",
        "index_threads",
        "fence_grace",
        "load_memory_bytes",
        "load_grace",
        "blob_inline_bytes",
        "blob_wal_pack_bytes",
        "blob_repack_below",
        "blob_repack_bytes",
        "owned_shards",
    ];

    /// The value of option `name` as [`WriterOptions::set`] reads it
    /// (sizes in bytes, durations in milliseconds); `None` for an unknown
    /// name.
    pub fn get(&self, name: &str) -> Option<String> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        Some(match name {
            "durable" => self.durable.to_string(),
            "wal_flush_interval" => ms(self.wal_flush_interval),
            "wal_flush_bytes" => self.wal_flush_bytes.to_string(),
            "wal_appends_in_flight" => self.wal_appends_in_flight.to_string(),
            "max_unflushed_bytes" => self.max_unflushed_bytes.to_string(),
            "memtable_bytes" => self.memtable_bytes.to_string(),
            "max_sstables" => self.max_sstables.to_string(),
            "sstable_grace" => ms(self.sstable_grace),
            "append_retries" => self.append_retries.to_string(),
            "owner_check_interval" => ms(self.owner_check_interval),
            "index_threads" => self.index_threads.to_string(),
            "fence_grace" => ms(self.fence_grace),
            "load_memory_bytes" => self.load_memory_bytes.to_string(),
            "load_grace" => ms(self.load_grace),
            "blob_inline_bytes" => self.blob_inline_bytes.to_string(),
            "blob_wal_pack_bytes" => self.blob_wal_pack_bytes.to_string(),
            "blob_repack_below" => self.blob_repack_below.to_string(),
            "blob_repack_bytes" => self.blob_repack_bytes.to_string(),
            "owned_shards" => self.owned_shards.to_string(),
            _ => return None,
        })
    }

    /// One line on what option `name` does (see the field's documentation).
    pub fn describe(name: &str) -> &'static str {
        match name {
            "durable" => "a put returns once its WAL entry exists (false: once indexed)",
            "wal_flush_interval" => "group commit: at most one WAL append per interval",
            "wal_flush_bytes" => "a WAL append starts early once this many bytes wait",
            "wal_appends_in_flight" => "WAL appends in flight at once, acknowledged in order",
            "max_unflushed_bytes" => "puts wait while more bytes than this are not in SSTables",
            "memtable_bytes" => "a MemTable freezes and flushes at this size",
            "max_sstables" => "compaction merges SSTables above this many per shard",
            "sstable_grace" => "replaced SSTables are deleted this long after",
            "append_retries" => "attempts at one WAL position after the first fails",
            "owner_check_interval" => "point reads trust the writer's ownership this long",
            "index_threads" => "threads inserting vectors into MemTable graphs",
            "fence_grace" => "WAL fences are kept at least this long after they were written",
            "load_memory_bytes" => "a larger INSERT or stream is loaded through SSTables",
            "load_grace" => "runs of a load silent this long are a crashed load's, deleted",
            "blob_inline_bytes" => "longer blob values are stored out of line, in packs",
            "blob_wal_pack_bytes" => "packs up to this size are written inside their WAL entry",
            "blob_repack_below" => "compaction moves the live values of packs less live than this",
            "blob_repack_bytes" => "the memory a repack holds: new packs of at most this size",
            "owned_shards" => "the shards this process writes: all, or i/n (shard % n = i)",
            _ => "unknown option",
        }
    }

    /// Sets the option `name` (a field name, see [`WriterOptions::NAMES`])
    /// from `value`: `true`/`false`, a count, a share (`0.5`), a size in bytes (`65536`,
    /// `64KiB`, `64MiB`, `1GiB`) or a duration (`100ms`, `2s`, `5min`; a bare
    /// number is milliseconds). An unknown name or a value that does not
    /// parse is [`Error::InvalidInput`] naming what was expected; nothing
    /// changes then. Whether the options fit together is checked when a
    /// writer opens.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let value = value.trim();
        match name {
            "durable" => self.durable = parse_bool(name, value)?,
            "wal_flush_interval" => self.wal_flush_interval = parse_duration(name, value)?,
            "wal_flush_bytes" => self.wal_flush_bytes = parse_bytes(name, value)?,
            "wal_appends_in_flight" => self.wal_appends_in_flight = parse_count(name, value)?,
            "max_unflushed_bytes" => self.max_unflushed_bytes = parse_bytes(name, value)?,
            "memtable_bytes" => self.memtable_bytes = parse_bytes(name, value)?,
            "max_sstables" => self.max_sstables = parse_count(name, value)?,
            "sstable_grace" => self.sstable_grace = parse_duration(name, value)?,
            "append_retries" => self.append_retries = parse_count(name, value)?,
            "owner_check_interval" => self.owner_check_interval = parse_duration(name, value)?,
            "index_threads" => self.index_threads = parse_count(name, value)?,
            "fence_grace" => self.fence_grace = parse_duration(name, value)?,
            "load_memory_bytes" => self.load_memory_bytes = parse_bytes(name, value)?,
            "load_grace" => self.load_grace = parse_duration(name, value)?,
            "blob_inline_bytes" => self.blob_inline_bytes = parse_bytes(name, value)?,
            "blob_wal_pack_bytes" => self.blob_wal_pack_bytes = parse_bytes(name, value)?,
            "blob_repack_below" => self.blob_repack_below = parse_share(name, value)?,
            "blob_repack_bytes" => self.blob_repack_bytes = parse_bytes(name, value)?,
            "owned_shards" => self.owned_shards = value.parse()?,
            _ => {
                return Err(Error::invalid(format!(
                    "unknown writer option '{name}'; the options are: {}",
                    Self::NAMES.join(", ")
                )));
            }
        }
        Ok(())
    }
}

fn bad(name: &str, value: &str, expected: &str) -> Error {
    Error::invalid(format!("option {name}: '{value}' is not {expected}"))
}

fn parse_bool(name: &str, value: &str) -> Result<bool> {
    crate::schema::parse_bool(value).ok_or_else(|| bad(name, value, "true or false"))
}

fn parse_share(name: &str, value: &str) -> Result<f64> {
    value
        .parse()
        .ok()
        .filter(|share: &f64| (0.0..=1.0).contains(share))
        .ok_or_else(|| bad(name, value, "a share from 0 to 1"))
}

fn parse_count<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| bad(name, value, "a whole number in range"))
}

/// A number with an optional unit, split: `64MiB` is (64, "mib").
fn split_unit(value: &str) -> Option<(u64, String)> {
    let digits = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let number = value[..digits].parse().ok()?;
    Some((number, value[digits..].trim().to_ascii_lowercase()))
}

fn parse_bytes(name: &str, value: &str) -> Result<usize> {
    let expected = "a size in bytes (65536, 64KiB, 64MiB, 1GiB)";
    let (number, unit) = split_unit(value).ok_or_else(|| bad(name, value, expected))?;
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        _ => return Err(bad(name, value, expected)),
    };
    number
        .checked_mul(scale)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| bad(name, value, expected))
}

/// Reads `value` as a duration the way options are written (`100ms`,
/// `2s`, `5min`, `1h`; a bare number is milliseconds); the error names
/// `name`.
pub fn parse_duration(name: &str, value: &str) -> Result<Duration> {
    let expected = "a duration (100ms, 2s, 5min, 1h; a bare number is milliseconds)";
    let (number, unit) = split_unit(value).ok_or_else(|| bad(name, value, expected))?;
    let millis = match unit.as_str() {
        "" | "ms" => Some(number),
        "s" => number.checked_mul(1_000),
        "min" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        _ => None,
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| bad(name, value, expected))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::QUICK_FAILURE;

    #[test]
    fn only_quick_failures_are_retried_and_only_append_retries_times() {
        let o = WriterOptions::default();
        let quick = Duration::from_millis(20);
        assert!(o.retry(1, quick));
        assert!(o.retry(o.append_retries, quick));
        assert!(!o.retry(o.append_retries + 1, quick));
        // The store's client retried this one already.
        assert!(!o.retry(1, QUICK_FAILURE));
    }

    #[test]
    fn sets_every_named_option_and_refuses_what_does_not_parse() {
        let mut o = WriterOptions::default();
        o.set("durable", "false").unwrap();
        o.set("wal_flush_interval", "250ms").unwrap();
        o.set("fence_grace", "2min").unwrap();
        o.set("sstable_grace", "5s").unwrap();
        o.set("owner_check_interval", "0").unwrap();
        o.set("memtable_bytes", "8MiB").unwrap();
        o.set("load_memory_bytes", "1GiB").unwrap();
        o.set("wal_flush_bytes", "65536").unwrap();
        o.set("max_sstables", "3").unwrap();
        o.set("load_grace", "2h").unwrap();
        assert!(!o.durable);
        assert_eq!(o.load_grace, Duration::from_secs(7200));
        assert_eq!(o.wal_flush_interval, Duration::from_millis(250));
        assert_eq!(o.fence_grace, Duration::from_secs(120));
        assert_eq!(o.sstable_grace, Duration::from_secs(5));
        assert_eq!(o.owner_check_interval, Duration::ZERO);
        assert_eq!(o.memtable_bytes, 8 << 20);
        assert_eq!(o.load_memory_bytes, 1 << 30);
        assert_eq!(o.wal_flush_bytes, 65536);
        assert_eq!(o.max_sstables, 3);
        for name in WriterOptions::NAMES {
            let mut o = WriterOptions::default();
            assert!(o.set(name, "x").is_err(), "{name}");
            assert!(o.set(name, "").is_err(), "{name}");
        }
        let before = format!("{:?}", WriterOptions::default());
        let mut o = WriterOptions::default();
        for (name, value) in [
            ("memtable_bytes", "64TB"),
            ("memtable_bytes", "-1"),
            ("wal_flush_interval", "1d"),
            ("wal_flush_interval", "99999999999999999999"),
            ("max_sstables", "1.5"),
            ("durable", "yes please"),
        ] {
            assert!(o.set(name, value).is_err(), "{name}={value}");
        }
        assert_eq!(format!("{o:?}"), before, "a refused value changes nothing");
        assert!(o.check().is_ok());
        for (name, value) in [
            ("fence_grace", "99ms"),
            ("index_threads", "0"),
            ("index_threads", "257"),
            ("load_grace", "999ms"),
            ("load_memory_bytes", "0"),
            ("max_sstables", "0"),
            ("memtable_bytes", "1GiB"),
        ] {
            let mut bad = WriterOptions::default();
            bad.set(name, value).unwrap();
            // Named in the message, like a value `set` refuses.
            let refused = bad.check().unwrap_err().to_string();
            assert!(refused.contains(&format!(" {name}")), "{refused}");
        }
        let unknown = o.set("memtable_size", "1").unwrap_err().to_string();
        assert!(
            unknown.contains("unknown writer option 'memtable_size'"),
            "{unknown}"
        );
        assert!(unknown.contains("memtable_bytes"), "{unknown}");
    }

    #[test]
    fn owned_shards_reads_all_or_a_slice() {
        let mut o = WriterOptions::default();
        assert!((0..100).all(|s| o.owned_shards.contains(s)));
        o.set("owned_shards", " 1 / 3 ").unwrap();
        assert_eq!(o.owned_shards, ShardSlice::new(1, 3).unwrap());
        assert_eq!(o.get("owned_shards").unwrap(), "1/3");
        let owned: Vec<u32> = (0..8).filter(|&s| o.owned_shards.contains(s)).collect();
        assert_eq!(owned, [1, 4, 7]);
        for bad in ["3/3", "1/0", "-1/3", "1/", "half", "1/3/5"] {
            let refused = o.set("owned_shards", bad).unwrap_err().to_string();
            assert!(refused.contains("owned_shards"), "{bad}: {refused}");
        }
        assert_eq!(
            o.owned_shards.to_string(),
            "1/3",
            "a refused value changes nothing"
        );
        o.set("owned_shards", "ALL").unwrap();
        assert_eq!(o.owned_shards, ShardSlice::All);
    }
}
