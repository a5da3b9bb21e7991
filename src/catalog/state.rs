//! One catalog version in memory and the mutations that make the next one.
//! Every mutation is all-or-nothing: it validates completely before it
//! changes anything, so a rejected mutation in a group commit leaves the
//! others untouched.

use std::sync::Arc;

use super::entry::{Entry, ObjectPath, ObjectType};
use crate::error::{Error, Result};
use crate::schema::TableMeta;

/// The entries of one catalog version, sorted by `object_id`; lookups are
/// binary searches.
#[derive(Debug, Clone, Default)]
pub struct CatalogState {
    entries: Vec<Arc<Entry>>,
}

/// A change to the catalog.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Creates the namespace `path`; an existing one is a conflict unless
    /// `if_not_exists`.
    CreateNamespace {
        /// The namespace.
        path: ObjectPath,
        /// An existing namespace is no error.
        if_not_exists: bool,
    },
    /// Drops the namespace `path`: with `cascade` its children too,
    /// otherwise only if it is empty.
    DropNamespace {
        /// The namespace.
        path: ObjectPath,
        /// A missing namespace is no error.
        if_exists: bool,
        /// Drop its namespaces and tables too.
        cascade: bool,
    },
    /// Creates the table `path` described by `meta`.
    CreateTable {
        /// The table.
        path: ObjectPath,
        /// Its schema, key, shards and options.
        meta: Box<TableMeta>,
        /// Chosen once, so every rebase of this mutation writes the same.
        location: String,
        /// An existing table is no error.
        if_not_exists: bool,
    },
    /// Drops the table `path` (its data is deleted later, see
    /// [`crate::Catalog::collect_dropped_tables`]).
    DropTable {
        /// The table.
        path: ObjectPath,
        /// A missing table is no error.
        if_exists: bool,
    },
}

/// What a successful mutation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The object was created.
    Created,
    /// `IF NOT EXISTS` and the object was there already: nothing changed.
    AlreadyThere,
    /// Entries were removed: the object and, with `CASCADE`, everything
    /// below it.
    Dropped {
        /// How many entries were removed.
        entries: usize,
        /// The data locations of the tables among them.
        tables: Vec<String>,
    },
    /// `IF EXISTS` and the object was not there: nothing changed.
    NotThere,
}

impl Outcome {
    /// Whether the catalog changed.
    pub fn changed(&self) -> bool {
        matches!(self, Outcome::Created | Outcome::Dropped { .. })
    }
}

impl CatalogState {
    /// A state from entries sorted by `object_id`.
    pub fn from_sorted(entries: Vec<Arc<Entry>>) -> Self {
        Self { entries }
    }

    /// All entries, sorted by `object_id`.
    pub fn entries(&self) -> &[Arc<Entry>] {
        &self.entries
    }

    /// The entry at `path` (never the root, which has no row).
    pub fn get(&self, path: &ObjectPath) -> Option<&Arc<Entry>> {
        if path.is_root() {
            return None;
        }
        let id = path.object_id();
        self.entries
            .binary_search_by(|e| e.object_id.as_str().cmp(&id))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Whether `path` is an existing namespace (the root always is).
    pub fn is_namespace(&self, path: &ObjectPath) -> bool {
        path.is_root()
            || self
                .get(path)
                .is_some_and(|e| e.object_type == ObjectType::Namespace)
    }

    /// The index range of every entry strictly below `path`.
    fn descendants(&self, path: &ObjectPath) -> std::ops::Range<usize> {
        if path.is_root() {
            return 0..self.entries.len();
        }
        let prefix = format!("{}$", path.object_id());
        let start = self
            .entries
            .partition_point(|e| e.object_id.as_str() < prefix.as_str());
        let len = self.entries[start..]
            .iter()
            .take_while(|e| e.object_id.starts_with(&prefix))
            .count();
        start..start + len
    }

    /// The direct children of namespace `path`.
    pub fn children(&self, path: &ObjectPath) -> Vec<Arc<Entry>> {
        let depth = path.levels().len() + 1;
        self.entries[self.descendants(path)]
            .iter()
            .filter(|e| e.object_id.split('$').count() == depth)
            .cloned()
            .collect()
    }

    /// Applies one mutation in place, or changes nothing and fails.
    pub fn apply(&mut self, mutation: &Mutation) -> Result<Outcome> {
        match mutation {
            Mutation::CreateNamespace {
                path,
                if_not_exists,
            } => self.create(
                path,
                ObjectType::Namespace,
                None,
                "{}".into(),
                *if_not_exists,
            ),
            Mutation::CreateTable {
                path,
                meta,
                location,
                if_not_exists,
            } => self.create(
                path,
                ObjectType::Table,
                Some(location.clone()),
                meta.to_json(),
                *if_not_exists,
            ),
            Mutation::DropNamespace {
                path,
                if_exists,
                cascade,
            } => {
                if path.is_root() {
                    return Err(Error::invalid("the root namespace cannot be dropped"));
                }
                let Some(index) = self.index_of(path, ObjectType::Namespace, *if_exists)? else {
                    return Ok(Outcome::NotThere);
                };
                let below = self.descendants(path);
                if !below.is_empty() && !cascade {
                    return Err(Error::NamespaceNotEmpty(path.to_string()));
                }
                let entries = below.len() + 1;
                // Other ids (`a!`) may sort between `a` and `a$...`.
                let tables = self
                    .entries
                    .drain(below)
                    .filter_map(|e| e.location.clone())
                    .collect();
                self.entries.remove(index);
                Ok(Outcome::Dropped { entries, tables })
            }
            Mutation::DropTable { path, if_exists } => {
                match self.index_of(path, ObjectType::Table, *if_exists)? {
                    Some(index) => Ok(Outcome::Dropped {
                        entries: 1,
                        tables: self
                            .entries
                            .remove(index)
                            .location
                            .clone()
                            .into_iter()
                            .collect(),
                    }),
                    None => Ok(Outcome::NotThere),
                }
            }
        }
    }

    /// The index of the entry at `path` of type `want`; `None` if absent and
    /// `if_exists`; an error if absent otherwise or of the other type.
    fn index_of(
        &self,
        path: &ObjectPath,
        want: ObjectType,
        if_exists: bool,
    ) -> Result<Option<usize>> {
        let id = path.object_id();
        match self
            .entries
            .binary_search_by(|e| e.object_id.as_str().cmp(&id))
        {
            Ok(i) if self.entries[i].object_type == want => Ok(Some(i)),
            Ok(i) => Err(Error::invalid(format!(
                "'{path}' is a {}, not a {}",
                self.entries[i].object_type.as_str(),
                want.as_str()
            ))),
            Err(_) if if_exists => Ok(None),
            Err(_) => Err(Error::NotFound(format!("{} '{path}'", want.as_str()))),
        }
    }

    fn create(
        &mut self,
        path: &ObjectPath,
        object_type: ObjectType,
        location: Option<String>,
        metadata: String,
        if_not_exists: bool,
    ) -> Result<Outcome> {
        if path.is_root() {
            return Err(Error::invalid("the root namespace cannot be created"));
        }
        let parent = path.parent();
        if !self.is_namespace(&parent) {
            return Err(Error::NotFound(format!(
                "parent namespace '{parent}' of '{path}'"
            )));
        }
        let id = path.object_id();
        match self
            .entries
            .binary_search_by(|e| e.object_id.as_str().cmp(&id))
        {
            Ok(i) => {
                let existing = self.entries[i].object_type;
                if existing == object_type && if_not_exists {
                    Ok(Outcome::AlreadyThere)
                } else {
                    Err(Error::AlreadyExists(format!(
                        "{} '{path}'",
                        existing.as_str()
                    )))
                }
            }
            Err(i) => {
                self.entries.insert(
                    i,
                    Arc::new(Entry {
                        object_id: id,
                        object_type,
                        location,
                        metadata,
                        base_objects: Vec::new(),
                    }),
                );
                Ok(Outcome::Created)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(dotted: &str) -> ObjectPath {
        ObjectPath::parse_dotted(dotted).unwrap()
    }

    fn create_ns(path: &str) -> Mutation {
        Mutation::CreateNamespace {
            path: ns(path),
            if_not_exists: false,
        }
    }

    #[test]
    fn namespace_rules() {
        let mut s = CatalogState::default();
        assert!(matches!(
            s.apply(&create_ns("a.b")),
            Err(Error::NotFound(_))
        ));
        assert_eq!(s.apply(&create_ns("a")).unwrap(), Outcome::Created);
        assert_eq!(s.apply(&create_ns("a.b")).unwrap(), Outcome::Created);
        assert_eq!(s.apply(&create_ns("a.b.c")).unwrap(), Outcome::Created);
        assert_eq!(s.apply(&create_ns("a0")).unwrap(), Outcome::Created);
        assert_eq!(s.apply(&create_ns("a!")).unwrap(), Outcome::Created);
        assert!(matches!(
            s.apply(&create_ns("a")),
            Err(Error::AlreadyExists(_))
        ));
        let again = Mutation::CreateNamespace {
            path: ns("a"),
            if_not_exists: true,
        };
        assert_eq!(s.apply(&again).unwrap(), Outcome::AlreadyThere);
        assert_eq!(s.children(&ns("a")).len(), 1);
        assert_eq!(s.children(&ObjectPath::root()).len(), 3);

        let drop = |cascade| Mutation::DropNamespace {
            path: ns("a"),
            if_exists: false,
            cascade,
        };
        assert!(matches!(
            s.apply(&drop(false)),
            Err(Error::NamespaceNotEmpty(_))
        ));
        assert_eq!(s.entries().len(), 5, "a failed drop changed the state");
        assert_eq!(
            s.apply(&drop(true)).unwrap(),
            Outcome::Dropped {
                entries: 3,
                tables: vec![]
            }
        );
        let ids: Vec<_> = s.entries().iter().map(|e| e.object_id.clone()).collect();
        assert_eq!(ids, vec!["a!", "a0"]);
        assert!(matches!(s.apply(&drop(true)), Err(Error::NotFound(_))));
        let if_exists = Mutation::DropNamespace {
            path: ns("a"),
            if_exists: true,
            cascade: false,
        };
        assert_eq!(s.apply(&if_exists).unwrap(), Outcome::NotThere);
    }

    #[test]
    fn tables_and_namespaces_do_not_mix() {
        let mut s = CatalogState::default();
        s.apply(&create_ns("a")).unwrap();
        let schema = datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "id",
                datafusion::arrow::datatypes::DataType::Int64,
                true,
            ),
        ]);
        let table = Mutation::CreateTable {
            path: ns("a.t"),
            meta: Box::new(TableMeta::new(&schema, vec!["id".into()], &[]).unwrap()),
            location: "tables/t-0".into(),
            if_not_exists: true,
        };
        assert_eq!(s.apply(&table).unwrap(), Outcome::Created);
        assert_eq!(s.apply(&table).unwrap(), Outcome::AlreadyThere);
        assert!(matches!(
            s.apply(&create_ns("a.t")),
            Err(Error::AlreadyExists(_))
        ));
        let drop_as_ns = Mutation::DropNamespace {
            path: ns("a.t"),
            if_exists: false,
            cascade: false,
        };
        assert!(
            s.apply(&drop_as_ns)
                .unwrap_err()
                .to_string()
                .contains("is a table")
        );
        let drop = Mutation::DropTable {
            path: ns("a.t"),
            if_exists: false,
        };
        assert_eq!(
            s.apply(&drop).unwrap(),
            Outcome::Dropped {
                entries: 1,
                tables: vec!["tables/t-0".into()]
            }
        );
    }
}
