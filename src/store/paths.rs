//! Every object name memwal writes, in one place (DESIGN.md §3).
//!
//! Names are fixed-width and sortable, so a listing returns them in order.
//! Every part of a name is plain ASCII (`[A-Za-z0-9_.-]`) and short, whatever
//! names a user gives tables and columns ([`safe_part`]): no store encodes,
//! escapes or rejects them, and a path stored as text (an SSTable's, in a
//! shard manifest) reads back as the same object ([`stored`]).

use object_store::path::Path;

use crate::error::{Error, Result};

/// Directory of the catalog's versions: `<root>/__manifest/`.
pub const CATALOG_DIR: &str = "__manifest";

/// Extension of a catalog version or checkpoint (an Arrow IPC file).
pub const CATALOG_EXT: &str = "arrow";

/// Directory of the catalog's checkpoints: `<root>/__manifest/checkpoints/`,
/// `v<20-digit version>.arrow` each (the full catalog as of that version).
pub const CATALOG_CHECKPOINTS_DIR: &str = "__manifest/checkpoints";

/// Name of the best-effort "latest version" hint inside a versioned directory.
pub const HINT_FILE: &str = "_hint";

/// Directory holding every table's data, below the root.
pub const TABLES_DIR: &str = "tables";

/// `<dir>/v<20-digit version>.<ext>`: one immutable version.
pub fn version_file(dir: &Path, version: u64, ext: &str) -> Path {
    dir.clone().join(format!("v{version:020}.{ext}").as_str())
}

/// The version number encoded in a file name made by [`version_file`].
pub fn parse_version_file(name: &str, ext: &str) -> Option<u64> {
    let digits = name
        .strip_prefix('v')?
        .strip_suffix(ext)?
        .strip_suffix('.')?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `<dir>/_hint`.
pub fn hint_file(dir: &Path) -> Path {
    dir.clone().join(HINT_FILE)
}

/// Longest user-derived part of an object name, in bytes.
const MAX_PART: usize = 48;

/// A character every store takes as it is in a name.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `name` as one part of an object name: itself if it is short plain ASCII
/// (letters, digits, `_`, `-`), otherwise its first such characters (others
/// become `_`) followed by `-` and 16 hex digits of a hash of the whole
/// name, so different names stay different parts. At most 48 bytes.
pub fn safe_part(name: &str) -> String {
    if !name.is_empty() && name.len() <= MAX_PART && name.chars().all(plain) {
        return name.to_string();
    }
    let prefix: String = name
        .chars()
        .map(|c| if plain(c) { c } else { '_' })
        .take(MAX_PART - 17)
        .collect();
    let hash = twox_hash::XxHash64::oneshot(0, name.as_bytes());
    format!("{prefix}-{hash:016x}")
}

/// The object at a path stored as text (made by `Path::to_string`, so
/// already in the store's encoding): parsed, never encoded a second time.
/// A text that is not a valid path is [`Error::Corrupt`].
pub fn stored(path: &str) -> Result<Path> {
    Path::parse(path).map_err(|e| Error::Corrupt {
        path: path.to_string(),
        reason: format!("not an object path: {e}"),
    })
}

/// Of a table's objects, the newest of each shard's WAL entries and of
/// each shard's manifest versions: what seals a dropped shard against a
/// writer still running elsewhere (its next append collides with the
/// fence at the WAL's tip; its reopen reads the manifest's `dropped`).
pub fn newest_per_shard_log<'a>(
    objects: impl Iterator<Item = &'a Path>,
) -> std::collections::HashSet<Path> {
    let mut newest: std::collections::HashMap<String, (u64, &Path)> = Default::default();
    for path in objects {
        let parts: Vec<_> = path.parts().collect();
        let [.., shards, _, log, file] = parts.as_slice() else {
            continue;
        };
        if shards.as_ref() != "shards" || !matches!(log.as_ref(), "wal" | "manifest") {
            continue;
        }
        let number = file.as_ref().trim_start_matches('v').split('.').next();
        let Some(number) = number.and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        let dir = parts[..parts.len() - 1]
            .iter()
            .map(|p| p.as_ref())
            .collect::<Vec<_>>()
            .join("/");
        let entry = newest.entry(dir).or_insert((number, path));
        if number > entry.0 {
            *entry = (number, path);
        }
    }
    newest.into_values().map(|(_, p)| p.clone()).collect()
}

/// `<table location>/shards`: the table's shard directories.
pub fn shards_dir(table_location: &str) -> Path {
    Path::from(format!("{table_location}/shards"))
}

/// The table location an object of a table's shard directory belongs to
/// (see [`shard_dir`]); `None` for any other path.
pub fn table_of(path: &str) -> Option<&str> {
    path.rsplit_once("/shards/").map(|(table, _)| table)
}

/// The shard an object of a table's shard directory belongs to (see
/// [`shard_dir`]); `None` for any other path.
pub fn shard_of(path: &str) -> Option<u32> {
    let (_, rest) = path.rsplit_once("/shards/")?;
    rest.split('/').next()?.parse().ok()
}

/// The SSTable directory (see [`sstable_dir`]) of an object in a shard's
/// SSTables or loads (a file, its graphs, its deletion vectors); `None`
/// for any other path.
pub fn sstable_dir_of_object(path: &str) -> Option<&str> {
    let (_, rest) = path.rsplit_once("/shards/")?;
    let mut parts = rest.split('/');
    let (_shard, kind, _sstable) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next()?;
    matches!(kind, "sst" | "load").then(|| sstable_dir(path))
}

/// `<table location>/shards/<shard>`: everything of one shard.
pub fn shard_dir(table_location: &str, shard: u32) -> Path {
    shards_dir(table_location).join(shard.to_string())
}

/// `<shard dir>/wal`: the shard's WAL entries.
pub fn wal_dir(shard_dir: &Path) -> Path {
    shard_dir.clone().join("wal")
}

/// `<shard dir>/manifest`: the shard manifest's versions (`v<N>.json`).
pub fn shard_manifest_dir(shard_dir: &Path) -> Path {
    shard_dir.clone().join("manifest")
}

/// `<shard dir>/sst`: the shard's SSTables.
pub fn sstables_dir(shard_dir: &Path) -> Path {
    shard_dir.clone().join("sst")
}

/// `<shard dir>/sst/<20-digit generation>-<20-digit epoch>-<16 hex>/data.parquet`:
/// a fresh name for an SSTable of `generation` written by the writer of
/// `epoch` (random, so a retried or raced flush never overwrites one a
/// manifest may already name).
pub fn new_sstable_file(shard_dir: &Path, generation: u64, epoch: u64) -> Path {
    sstables_dir(shard_dir)
        .join(
            format!(
                "{generation:020}-{epoch:020}-{:016x}",
                rand::random::<u64>()
            )
            .as_str(),
        )
        .join(SSTABLE_DATA)
}

/// `<shard dir>/blobs`: the shard's blob packs.
pub fn blobs_dir(shard_dir: &Path) -> Path {
    shard_dir.clone().join("blobs")
}

/// `<shard dir>/blobs/<20-digit position>-<20-digit epoch>.pack`: the blob
/// pack of the WAL append at `position` by the writer of `epoch` (the
/// epoch keeps a fenced writer's pack apart from its successor's at the
/// same position).
pub fn blob_pack(shard_dir: &Path, position: u64, epoch: u64) -> Path {
    blobs_dir(shard_dir).join(format!("{position:020}-{epoch:020}.pack").as_str())
}

/// The position and epoch in a pack's file name made by [`blob_pack`].
pub fn parse_blob_pack(name: &str) -> Option<(u64, u64)> {
    let (position, epoch) = name.strip_suffix(".pack")?.split_once('-')?;
    let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(position) || !digits(epoch) {
        return None;
    }
    Some((position.parse().ok()?, epoch.parse().ok()?))
}

/// `<shard dir>/load`: the sorted runs of bulk loads, written before any
/// manifest names them. Apart from `sst/` so that a writer that opens the
/// shard meanwhile (and deletes the unnamed SSTables of older epochs in
/// `sst/`) leaves a running load's runs alone.
pub fn loads_dir(shard_dir: &Path) -> Path {
    shard_dir.clone().join("load")
}

/// `<shard dir>/load/<16 hex load>-<20-digit seq>-<20-digit epoch>-<16 hex>/data.parquet`:
/// a fresh name for run `seq` of bulk load `load` (see [`loads_dir`]); an
/// SSTable like any other once a manifest names it.
pub fn new_load_run(shard_dir: &Path, load: u64, seq: u64, epoch: u64) -> Path {
    let name = format!(
        "{load:016x}-{seq:020}-{epoch:020}-{:016x}",
        rand::random::<u64>()
    );
    loads_dir(shard_dir).join(name.as_str()).join(SSTABLE_DATA)
}

/// `<shard dir>/load/<16 hex load>-<grace ms>.alive`: rewritten while
/// bulk load `load` runs, so that its runs are not taken for a crashed
/// load's before the marker is `grace_ms` old.
pub fn load_marker(shard_dir: &Path, load: u64, grace_ms: u64) -> Path {
    loads_dir(shard_dir).join(format!("{load:016x}-{grace_ms}.alive").as_str())
}

/// The grace (ms) a [`load_marker`] names.
pub fn marker_grace(path: &str) -> Option<u64> {
    let name = path.strip_suffix(".alive")?.rsplit_once("/load/")?.1;
    name.split_once('-')?.1.parse().ok()
}

/// The load a run or marker under [`loads_dir`] belongs to (`None` for a
/// run named by an older build, without one).
pub fn load_of(path: &str) -> Option<u64> {
    let name = path.rsplit_once("/load/")?.1;
    let id = name.split(['-', '.']).next()?;
    (id.len() == 16).then(|| u64::from_str_radix(id, 16).ok())?
}

/// The data object's name inside an SSTable directory.
const SSTABLE_DATA: &str = "data.parquet";

/// The directory an SSTable of [`new_sstable_file`] has to itself; `None`
/// for an SSTable named otherwise (by an older build), which has none.
pub fn own_sstable_dir(path: &str) -> Option<&str> {
    path.strip_suffix(SSTABLE_DATA)?.strip_suffix('/')
}

/// The epoch of the writer that made an SSTable path of
/// [`new_sstable_file`] (0 for a name without one).
pub fn sstable_epoch(path: &str) -> u64 {
    path.rsplit('/')
        .nth(1)
        .and_then(|dir| dir.split('-').nth(1))
        .filter(|e| e.len() == 20)
        .and_then(|e| e.parse().ok())
        .unwrap_or(0)
}

/// The directory of an SSTable path of [`new_sstable_file`]: everything
/// of that SSTable is in it.
pub fn sstable_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// `<SSTable dir>/<column>.hnsw`: the persisted graph of vector column
/// `column` of the SSTable at `sstable` (a stored path; the column name as
/// a [`safe_part`]).
pub fn graph_file(sstable: &str, column: &str) -> Result<Path> {
    Ok(stored(sstable_dir(sstable))?.join(format!("{}.hnsw", safe_part(column)).as_str()))
}

/// `<SSTable dir>/deletions-<20-digit epoch>-<16 hex>.bin`: a fresh name
/// for a deletion vector of the SSTable at `sstable` (a stored path)
/// written by the writer of `epoch` (random: a retried or raced write never
/// overwrites one a manifest may already name).
pub fn new_deletions_file(sstable: &str, epoch: u64) -> Result<Path> {
    Ok(stored(sstable_dir(sstable))?.join(
        format!(
            "{DELETIONS_PREFIX}{epoch:020}-{:016x}.bin",
            rand::random::<u64>()
        )
        .as_str(),
    ))
}

/// The epoch of the writer that made `path`, if it is a name made by
/// [`new_deletions_file`].
pub fn deletions_epoch(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    let rest = name.strip_prefix(DELETIONS_PREFIX)?.strip_suffix(".bin")?;
    rest.split('-').next()?.parse().ok()
}

const DELETIONS_PREFIX: &str = "deletions-";

/// `<wal dir>/<20-digit position>.arrow`: one WAL entry.
pub fn wal_file(wal_dir: &Path, position: u64) -> Path {
    wal_dir
        .clone()
        .join(format!("{position:020}.arrow").as_str())
}

/// The position encoded in a WAL file name made by [`wal_file`].
pub fn parse_wal_file(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".arrow")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `location` is one [`new_table_location`] makes (a name that is
/// the same in every encoding).
pub fn is_table_location(location: &str) -> bool {
    let Some(name) = location
        .strip_prefix(TABLES_DIR)
        .and_then(|rest| rest.strip_prefix('/'))
    else {
        return false;
    };
    let Some((part, random)) = name.rsplit_once('-') else {
        return false;
    };
    random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && !part.is_empty()
        && part.len() <= MAX_PART
        && part.chars().all(plain)
}

/// A fresh, unique location for a table's data: `tables/<name>-<16 hex>`
/// (the name as a [`safe_part`]). Unique so that a table dropped and created
/// again never sees old data.
pub fn new_table_location(name: &str) -> String {
    format!(
        "{TABLES_DIR}/{}-{:016x}",
        safe_part(name),
        rand::random::<u64>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_shard_is_read_from_its_path() {
        let sstable = new_sstable_file(&shard_dir("ns/shards/t", 12), 3, 1);
        assert_eq!(shard_of(sstable.as_ref()), Some(12));
        assert_eq!(shard_of("t/shards/x/sst/a/data.parquet"), None);
        assert_eq!(shard_of("__manifest/v00000000000000000001.arrow"), None);
        let dir = sstable_dir(sstable.as_ref());
        assert_eq!(sstable_dir_of_object(sstable.as_ref()), Some(dir));
        assert_eq!(
            sstable_dir_of_object(&format!("/root/{dir}/emb.hnsw")),
            Some(&*format!("/root/{dir}"))
        );
        let marker = load_marker(&shard_dir("t", 0), 1, 1000);
        assert_eq!(sstable_dir_of_object(marker.as_ref()), None);
        assert_eq!(
            sstable_dir_of_object("t/shards/0/wal/00000000000000000001.arrow"),
            None
        );
    }

    #[test]
    fn load_runs_and_markers_name_their_load() {
        let shard = shard_dir("t", 1);
        let run = new_load_run(&shard, 0xab, 3, 7);
        assert_eq!(load_of(run.as_ref()), Some(0xab));
        let marker = load_marker(&shard, u64::MAX, 3_600_000);
        assert_eq!(load_of(marker.as_ref()), Some(u64::MAX));
        assert_eq!(marker_grace(marker.as_ref()), Some(3_600_000));
        assert_eq!(marker_grace(run.as_ref()), None);
        let older = "t/shards/1/load/00000000000000000003-00000000000000000007-00000000000000ab/data.parquet";
        assert_eq!(load_of(older), None);
        assert_eq!(load_of("t/shards/1/sst/x/data.parquet"), None);
    }

    #[test]
    fn version_names_sort_and_parse() {
        let dir = Path::from("__manifest");
        let a = version_file(&dir, 9, "arrow");
        let b = version_file(&dir, 10, "arrow");
        assert!(a.as_ref() < b.as_ref());
        assert_eq!(a.as_ref(), "__manifest/v00000000000000000009.arrow");
        assert_eq!(parse_version_file(b.filename().unwrap(), "arrow"), Some(10));
        assert_eq!(parse_version_file("v12.arrow", "arrow"), None);
        assert_eq!(parse_version_file("_hint", "arrow"), None);
        assert_eq!(
            parse_version_file("v00000000000000000001.json", "arrow"),
            None
        );
        let wal = wal_dir(&shard_dir("tables/t-1", 3));
        let f = wal_file(&wal, 42);
        assert_eq!(
            f.as_ref(),
            "tables/t-1/shards/3/wal/00000000000000000042.arrow"
        );
        assert_eq!(parse_wal_file(f.filename().unwrap()), Some(42));
        assert_eq!(parse_wal_file("42.arrow"), None);
    }

    #[test]
    fn user_names_become_short_plain_parts_that_stay_distinct() {
        assert_eq!(safe_part("items"), "items");
        assert_eq!(safe_part("emb_2-x"), "emb_2-x");
        let names = [
            "café",
            "caf_",
            "a b",
            "a_b",
            "%",
            "%25",
            "#",
            "\\",
            "~",
            "\"",
            ".",
            "..",
            "",
            "日本語の名前",
            &"é".repeat(128),
            &"x".repeat(128),
            &"x".repeat(49),
        ];
        let parts: Vec<String> = names.iter().map(|n| safe_part(n)).collect();
        for (name, part) in names.iter().zip(&parts) {
            assert!(part.len() <= MAX_PART, "{name:?} -> {part}");
            assert!(!part.is_empty());
            assert!(
                part.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{name:?} -> {part}"
            );
            // A store takes it as it is.
            assert_eq!(Path::from(part.as_str()).as_ref(), part);
        }
        let distinct: std::collections::HashSet<&String> = parts.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{parts:?}");
        for name in names {
            assert!(is_table_location(&new_table_location(name)), "{name:?}");
        }
        for other in [
            "tables/café-0123456789abcdef",
            "tables/caf%C3%A9-0123456789abcdef",
            "tables/t-0123",
            "tables/-0123456789abcdef",
            "tables/t",
            "other/t-0123456789abcdef",
        ] {
            assert!(!is_table_location(other), "{other}");
        }
    }

    #[test]
    fn stored_paths_read_back_as_the_same_object() {
        let location = new_table_location("café #1 ~ 100%");
        let sstable = new_sstable_file(&shard_dir(&location, 0), 7, 3);
        let text = sstable.to_string();
        assert_eq!(stored(&text).unwrap(), sstable);
        assert_eq!(sstable_epoch(&text), 3);
        let graph = graph_file(&text, "vectör").unwrap();
        assert_eq!(stored(graph.as_ref()).unwrap(), graph);
        assert!(graph.as_ref().starts_with(sstable_dir(&text)));
        // Text already in the store's encoding is not encoded again.
        let encoded = "tables/caf%C3%A9-0000000000000001/shards/0/sst/x/data.parquet";
        assert_eq!(stored(encoded).unwrap().as_ref(), encoded);
    }
}
