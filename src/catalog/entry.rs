//! Names and rows of the catalog: [`ObjectPath`] and [`Entry`].

use std::fmt;

use crate::error::{Error, Result};

/// Separator of path levels inside an `object_id` (DESIGN.md §5).
pub const ID_SEPARATOR: char = '$';

/// Longest name of one level.
const MAX_NAME_LEN: usize = 128;

/// The path of a namespace or table from the root, e.g. `shop.eu.items`.
/// The root namespace is the empty path. Every level is a valid name: not
/// empty, at most 128 characters, none of `$ . /`, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ObjectPath(Vec<String>);

impl ObjectPath {
    /// The root namespace.
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// A path from its levels, validated.
    pub fn new<I, S>(levels: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let levels: Vec<String> = levels.into_iter().map(Into::into).collect();
        for level in &levels {
            validate_name(level)?;
        }
        Ok(Self(levels))
    }

    /// Parses the dotted form used in SQL schema names: `shop.eu`.
    pub fn parse_dotted(dotted: &str) -> Result<Self> {
        Self::new(dotted.split('.'))
    }

    /// Parses an `object_id` (`shop$eu$items`).
    pub fn from_object_id(id: &str) -> Result<Self> {
        if id.is_empty() {
            return Ok(Self::root());
        }
        Self::new(id.split(ID_SEPARATOR))
    }

    /// The id stored in the catalog: levels joined by `$`.
    pub fn object_id(&self) -> String {
        self.0.join("$")
    }

    /// The levels, root first.
    pub fn levels(&self) -> &[String] {
        &self.0
    }

    /// Whether this is the root namespace.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The last level (empty for the root).
    pub fn name(&self) -> &str {
        self.0.last().map(String::as_str).unwrap_or("")
    }

    /// The enclosing namespace (the root is its own parent).
    pub fn parent(&self) -> Self {
        let mut levels = self.0.clone();
        levels.pop();
        Self(levels)
    }

    /// This path extended by one validated level.
    pub fn child(&self, name: &str) -> Result<Self> {
        validate_name(name)?;
        let mut levels = self.0.clone();
        levels.push(name.to_string());
        Ok(Self(levels))
    }
}

impl fmt::Display for ObjectPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("empty name"));
    }
    let length = name.chars().count();
    if length > MAX_NAME_LEN {
        let start: String = name.chars().take(32).collect();
        return Err(Error::invalid(format!(
            "name '{start}...' ({length} characters) is longer than {MAX_NAME_LEN} characters"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '$' | '.' | '/') || c.is_control())
    {
        return Err(Error::invalid(format!(
            "name '{name}' contains {c:?}; names may not contain '$', '.', '/' or control characters"
        )));
    }
    Ok(())
}

/// What a catalog row describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectType {
    /// A namespace: holds namespaces and tables.
    Namespace,
    /// A table.
    Table,
}

impl ObjectType {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectType::Namespace => "namespace",
            ObjectType::Table => "table",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "namespace" => Some(ObjectType::Namespace),
            "table" => Some(ObjectType::Table),
            _ => None,
        }
    }
}

/// One catalog row (DESIGN.md §5). Immutable once in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path levels joined by `$`; the sort key.
    pub object_id: String,
    /// Whether the row is a namespace or a table.
    pub object_type: ObjectType,
    /// For a table: where its data lives, relative to the root.
    pub location: Option<String>,
    /// JSON; for a table a [`crate::schema::TableMeta`].
    pub metadata: String,
    /// Objects this one is derived from (reserved; empty today).
    pub base_objects: Vec<String>,
}

impl Entry {
    /// The entry's path.
    pub fn path(&self) -> ObjectPath {
        // Ids in a snapshot were validated when they were created.
        ObjectPath(
            self.object_id
                .split(ID_SEPARATOR)
                .map(str::to_string)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_validate_and_round_trip() {
        let p = ObjectPath::parse_dotted("shop.eu").unwrap();
        assert_eq!(p.object_id(), "shop$eu");
        assert_eq!(p.to_string(), "shop.eu");
        assert_eq!(ObjectPath::from_object_id("shop$eu").unwrap(), p);
        assert_eq!(p.parent(), ObjectPath::new(["shop"]).unwrap());
        assert_eq!(p.child("items").unwrap().name(), "items");
        for bad in ["", "a..b", "a$b", "a/b", "tab\there"] {
            assert!(ObjectPath::parse_dotted(bad).is_err(), "{bad:?}");
        }
        assert!(ObjectPath::new(["x".repeat(128)]).is_ok());
        // The error quotes the start of a long name, not all of it.
        let err = ObjectPath::new(["x".repeat(5000)]).unwrap_err().to_string();
        assert!(
            err.contains("(5000 characters) is longer than 128"),
            "{err}"
        );
        assert!(err.len() < 200, "{err}");
    }
}
