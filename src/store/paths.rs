//! Every object name memwal writes, in one place (DESIGN.md §3).
//!
//! Names are fixed-width and sortable, so a listing returns them in order.

use object_store::path::Path;

/// Directory of the catalog's versions: `<root>/__manifest/`.
pub const CATALOG_DIR: &str = "__manifest";

/// Extension of a catalog version (an Arrow IPC file).
pub const CATALOG_EXT: &str = "arrow";

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

/// A fresh, unique location for a table's data: `tables/<name>-<16 hex>`.
/// Unique so that a table dropped and created again never sees old data.
pub fn new_table_location(name: &str) -> String {
    format!("{TABLES_DIR}/{name}-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
