//! One catalog version in memory and the mutations that make the next one.
//! Every mutation is all-or-nothing: it validates completely before it
//! changes anything, so a rejected mutation in a group commit leaves the
//! others untouched. A state is a persistent map: cloning it and applying a
//! mutation cost O(log entries), not O(entries).

use std::ops::Bound;
use std::sync::Arc;

use imbl::{HashSet, OrdMap};

use super::entry::{Entry, ObjectPath, ObjectType};
use crate::error::{Error, Result};
use crate::schema::TableMeta;

/// The entries of one catalog version by `object_id`, and the data
/// locations of its tables.
#[derive(Debug, Clone, Default)]
pub struct CatalogState {
    entries: OrdMap<String, Arc<Entry>>,
    locations: HashSet<String>,
}

/// One change of the entries, as a delta version stores it: mutations are
/// recorded as the changes they made, and a version's changes replay in
/// order onto the version before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An entry that did not exist.
    Put(Arc<Entry>),
    /// The `object_id` of an entry that existed.
    Remove(String),
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
    /// Applies each mutation in order, as one: all of them, or none if
    /// one fails (a `DROP TABLE a, b` that names a missing `b` keeps `a`).
    All(Vec<Mutation>),
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

    /// What two mutations applied one after the other did: the entries
    /// both dropped, or whether either created one.
    fn and(self, next: Outcome) -> Outcome {
        match (self, next) {
            (
                Outcome::Dropped {
                    entries,
                    mut tables,
                },
                Outcome::Dropped {
                    entries: more,
                    tables: more_tables,
                },
            ) => {
                tables.extend(more_tables);
                Outcome::Dropped {
                    entries: entries + more,
                    tables,
                }
            }
            (dropped @ Outcome::Dropped { .. }, _) | (_, dropped @ Outcome::Dropped { .. }) => {
                dropped
            }
            (Outcome::Created, _) | (_, Outcome::Created) => Outcome::Created,
            (_, next) => next,
        }
    }
}

impl CatalogState {
    /// A state from entries (in any order; an id given twice keeps the
    /// last).
    pub fn from_entries(entries: impl IntoIterator<Item = Arc<Entry>>) -> Self {
        let mut state = Self::default();
        for e in entries {
            state.put(e);
        }
        state
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the catalog holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All entries, by `object_id`.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.entries.values()
    }

    /// The entry at `path` (never the root, which has no row).
    pub fn get(&self, path: &ObjectPath) -> Option<&Arc<Entry>> {
        if path.is_root() {
            return None;
        }
        self.entries.get(path.object_id().as_str())
    }

    /// Whether a table of this catalog keeps its data at `location`.
    pub fn holds_location(&self, location: &str) -> bool {
        self.locations.contains(location)
    }

    /// Whether `path` is an existing namespace (the root always is).
    pub fn is_namespace(&self, path: &ObjectPath) -> bool {
        path.is_root()
            || self
                .get(path)
                .is_some_and(|e| e.object_type == ObjectType::Namespace)
    }

    /// Every entry strictly below `path`, by `object_id`, from `from`
    /// (an id below `path`) on, or from the first.
    fn descendants<'a>(
        &'a self,
        path: &ObjectPath,
        from: Option<Bound<&str>>,
    ) -> impl Iterator<Item = &'a Arc<Entry>> + 'a {
        let prefix = match path.is_root() {
            true => String::new(),
            false => format!("{}$", path.object_id()),
        };
        self.entries
            .range::<_, str>((from.unwrap_or(Bound::Included(&prefix)), Bound::Unbounded))
            .map(|(_, e)| e)
            .take_while(move |e| e.object_id.starts_with(&prefix))
    }

    /// The direct children of namespace `path`.
    pub fn children(&self, path: &ObjectPath) -> Vec<Arc<Entry>> {
        self.children_page(path, None, usize::MAX).0
    }

    /// Up to `limit` direct children of namespace `path` by `object_id`,
    /// those after the child named `after` (the last of the page before);
    /// and the name to pass as `after` for the next page, if there may be
    /// one. Costs O(page × log entries), whatever lies below the children.
    pub fn children_page(
        &self,
        path: &ObjectPath,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<Arc<Entry>>, Option<String>) {
        let depth = path.levels().len() + 1;
        // Ids sort a child `c`, then ids such as `c!` (other children),
        // then `c$...` (below `c`), then ids from `c%` on: after a child the
        // next one is searched right after it, and past a grandchild the
        // search jumps to its ancestor child's `c%`.
        let mut from = after.map(|name| match path.is_root() {
            true => Bound::Excluded(name.to_string()),
            false => Bound::Excluded(format!("{}${name}", path.object_id())),
        });
        let mut page = Vec::new();
        'search: while page.len() < limit {
            let start = from.as_ref().map(|b| b.as_ref().map(String::as_str));
            for e in self.descendants(path, start) {
                if e.object_id.split('$').count() == depth {
                    page.push(Arc::clone(e));
                    if page.len() == limit {
                        break 'search;
                    }
                    continue;
                }
                let child: Vec<&str> = e.object_id.split('$').take(depth).collect();
                from = Some(Bound::Included(format!("{}%", child.join("$"))));
                continue 'search;
            }
            break;
        }
        let next = match page.len() == limit {
            true => page.last().map(|e| e.path().name().to_string()),
            false => None,
        };
        (page, next)
    }

    fn put(&mut self, entry: Arc<Entry>) {
        if let Some(location) = &entry.location {
            self.locations.insert(location.clone());
        }
        self.entries.insert(entry.object_id.clone(), entry);
    }

    fn remove(&mut self, id: &str) -> Option<Arc<Entry>> {
        let entry = self.entries.remove(id)?;
        if let Some(location) = &entry.location {
            self.locations.remove(location);
        }
        Some(entry)
    }

    /// Replays a delta version's changes; on a change that does not fit
    /// (a put of an existing id, a removal of a missing one) the reason,
    /// and the state is then partly changed (the caller drops it).
    pub fn replay(&mut self, changes: &[Change]) -> std::result::Result<(), String> {
        for change in changes {
            match change {
                Change::Put(entry) if self.entries.contains_key(entry.object_id.as_str()) => {
                    return Err(format!("puts '{}', which exists", entry.object_id));
                }
                Change::Put(entry) => self.put(Arc::clone(entry)),
                Change::Remove(id) => {
                    if self.remove(id).is_none() {
                        return Err(format!("removes '{id}', which does not exist"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies one mutation in place, appending what it changed to
    /// `changes`, or changes nothing and fails.
    pub fn apply(&mut self, mutation: &Mutation, changes: &mut Vec<Change>) -> Result<Outcome> {
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
                changes,
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
                changes,
            ),
            Mutation::DropNamespace {
                path,
                if_exists,
                cascade,
            } => {
                if path.is_root() {
                    return Err(Error::invalid("the root namespace cannot be dropped"));
                }
                if self
                    .check(path, ObjectType::Namespace, *if_exists)?
                    .is_none()
                {
                    return Ok(Outcome::NotThere);
                }
                let below: Vec<String> = self
                    .descendants(path, None)
                    .map(|e| e.object_id.clone())
                    .collect();
                if !below.is_empty() && !cascade {
                    return Err(Error::NamespaceNotEmpty(path.to_string()));
                }
                let (entries, mut tables) = (below.len() + 1, Vec::new());
                for id in below.into_iter().chain([path.object_id()]) {
                    let removed = self.remove(&id).expect("listed just before");
                    tables.extend(removed.location.clone());
                    changes.push(Change::Remove(id));
                }
                Ok(Outcome::Dropped { entries, tables })
            }
            Mutation::All(mutations) => {
                // A persistent map: the copy costs O(1).
                let (mut next, mut made) = (self.clone(), Vec::new());
                let mut outcome = Outcome::NotThere;
                for mutation in mutations {
                    outcome = outcome.and(next.apply(mutation, &mut made)?);
                }
                *self = next;
                changes.extend(made);
                Ok(outcome)
            }
            Mutation::DropTable { path, if_exists } => {
                if self.check(path, ObjectType::Table, *if_exists)?.is_none() {
                    return Ok(Outcome::NotThere);
                }
                let id = path.object_id();
                let removed = self.remove(&id).expect("checked just before");
                changes.push(Change::Remove(id));
                Ok(Outcome::Dropped {
                    entries: 1,
                    tables: removed.location.clone().into_iter().collect(),
                })
            }
        }
    }

    /// The entry at `path` if it is of type `want`; `None` if absent and
    /// `if_exists`; an error if absent otherwise or of the other type.
    fn check(
        &self,
        path: &ObjectPath,
        want: ObjectType,
        if_exists: bool,
    ) -> Result<Option<&Arc<Entry>>> {
        match self.get(path) {
            Some(e) if e.object_type == want => Ok(Some(e)),
            Some(e) => Err(Error::invalid(format!(
                "'{path}' is a {}, not a {}",
                e.object_type.as_str(),
                want.as_str()
            ))),
            None if if_exists => Ok(None),
            None => Err(Error::NotFound(format!("{} '{path}'", want.as_str()))),
        }
    }

    fn create(
        &mut self,
        path: &ObjectPath,
        object_type: ObjectType,
        location: Option<String>,
        metadata: String,
        if_not_exists: bool,
        changes: &mut Vec<Change>,
    ) -> Result<Outcome> {
        if self.creation(path, object_type, if_not_exists)? == Outcome::AlreadyThere {
            return Ok(Outcome::AlreadyThere);
        }
        let entry = Arc::new(Entry {
            object_id: path.object_id(),
            object_type,
            location,
            metadata,
            base_objects: Vec::new(),
        });
        self.put(Arc::clone(&entry));
        changes.push(Change::Put(entry));
        Ok(Outcome::Created)
    }

    /// What creating `path` as an `object_type` would do in this state:
    /// [`Outcome::Created`], [`Outcome::AlreadyThere`] (only with
    /// `if_not_exists`), or the error.
    pub(crate) fn creation(
        &self,
        path: &ObjectPath,
        object_type: ObjectType,
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
        if let Some(existing) = self.get(path) {
            let existing = existing.object_type;
            return if existing == object_type && if_not_exists {
                Ok(Outcome::AlreadyThere)
            } else {
                Err(Error::AlreadyExists(format!(
                    "{} '{path}'",
                    existing.as_str()
                )))
            };
        }
        Ok(Outcome::Created)
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
            s.apply(&create_ns("a.b"), &mut vec![]),
            Err(Error::NotFound(_))
        ));
        assert_eq!(
            s.apply(&create_ns("a"), &mut vec![]).unwrap(),
            Outcome::Created
        );
        assert_eq!(
            s.apply(&create_ns("a.b"), &mut vec![]).unwrap(),
            Outcome::Created
        );
        assert_eq!(
            s.apply(&create_ns("a.b.c"), &mut vec![]).unwrap(),
            Outcome::Created
        );
        assert_eq!(
            s.apply(&create_ns("a0"), &mut vec![]).unwrap(),
            Outcome::Created
        );
        assert_eq!(
            s.apply(&create_ns("a!"), &mut vec![]).unwrap(),
            Outcome::Created
        );
        assert!(matches!(
            s.apply(&create_ns("a"), &mut vec![]),
            Err(Error::AlreadyExists(_))
        ));
        let again = Mutation::CreateNamespace {
            path: ns("a"),
            if_not_exists: true,
        };
        assert_eq!(s.apply(&again, &mut vec![]).unwrap(), Outcome::AlreadyThere);
        assert_eq!(s.children(&ns("a")).len(), 1);
        assert_eq!(s.children(&ObjectPath::root()).len(), 3);

        let drop = |cascade| Mutation::DropNamespace {
            path: ns("a"),
            if_exists: false,
            cascade,
        };
        assert!(matches!(
            s.apply(&drop(false), &mut vec![]),
            Err(Error::NamespaceNotEmpty(_))
        ));
        assert_eq!(s.len(), 5, "a failed drop changed the state");
        assert_eq!(
            s.apply(&drop(true), &mut vec![]).unwrap(),
            Outcome::Dropped {
                entries: 3,
                tables: vec![]
            }
        );
        let ids: Vec<_> = s.iter().map(|e| e.object_id.clone()).collect();
        assert_eq!(ids, vec!["a!", "a0"]);
        assert!(matches!(
            s.apply(&drop(true), &mut vec![]),
            Err(Error::NotFound(_))
        ));
        let if_exists = Mutation::DropNamespace {
            path: ns("a"),
            if_exists: true,
            cascade: false,
        };
        assert_eq!(s.apply(&if_exists, &mut vec![]).unwrap(), Outcome::NotThere);
    }

    #[test]
    fn tables_and_namespaces_do_not_mix() {
        let mut s = CatalogState::default();
        s.apply(&create_ns("a"), &mut vec![]).unwrap();
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
        assert_eq!(s.apply(&table, &mut vec![]).unwrap(), Outcome::Created);
        assert_eq!(s.apply(&table, &mut vec![]).unwrap(), Outcome::AlreadyThere);
        assert!(matches!(
            s.apply(&create_ns("a.t"), &mut vec![]),
            Err(Error::AlreadyExists(_))
        ));
        let drop_as_ns = Mutation::DropNamespace {
            path: ns("a.t"),
            if_exists: false,
            cascade: false,
        };
        assert!(
            s.apply(&drop_as_ns, &mut vec![])
                .unwrap_err()
                .to_string()
                .contains("is a table")
        );
        let drop = Mutation::DropTable {
            path: ns("a.t"),
            if_exists: false,
        };
        assert_eq!(
            s.apply(&drop, &mut vec![]).unwrap(),
            Outcome::Dropped {
                entries: 1,
                tables: vec!["tables/t-0".into()]
            }
        );
    }

    #[test]
    fn all_applies_every_mutation_or_none() {
        let mut s = CatalogState::default();
        for name in ["a", "b"] {
            s.apply(&create_ns(name), &mut vec![]).unwrap();
        }
        let drop = |name: &str, if_exists| Mutation::DropNamespace {
            path: ns(name),
            if_exists,
            cascade: false,
        };
        let mut changes = Vec::new();
        let failing = Mutation::All(vec![drop("a", false), drop("nowhere", false)]);
        assert!(matches!(
            s.apply(&failing, &mut changes),
            Err(Error::NotFound(_))
        ));
        assert!(changes.is_empty());
        assert_eq!(s.len(), 2);
        let both = Mutation::All(vec![
            drop("a", false),
            drop("nowhere", true),
            drop("b", false),
        ]);
        assert_eq!(
            s.apply(&both, &mut changes).unwrap(),
            Outcome::Dropped {
                entries: 2,
                tables: vec![]
            }
        );
        assert_eq!((s.len(), changes.len()), (0, 2));
    }

    #[test]
    fn pages_of_children_skip_what_lies_below_them() {
        let mut s = CatalogState::default();
        // `a!` sorts between `a` and `a$...`; `a%` after all of `a$...`.
        for ns in [
            "a", "a!", "a!.x", "a.b", "a.b.c", "a.b.c.d", "a.c", "a%", "b", "b.z",
        ] {
            s.apply(&create_ns(ns), &mut vec![]).unwrap();
        }
        let names = |page: &[Arc<Entry>]| -> Vec<String> {
            page.iter().map(|e| e.path().name().to_string()).collect()
        };
        let root = ObjectPath::root();
        assert_eq!(names(&s.children(&root)), ["a", "a!", "a%", "b"]);
        // Page by page, two at a time.
        let (first, next) = s.children_page(&root, None, 2);
        assert_eq!(
            (names(&first), next.as_deref()),
            (vec!["a".into(), "a!".into()], Some("a!"))
        );
        let (second, next) = s.children_page(&root, next.as_deref(), 2);
        assert_eq!(
            (names(&second), next.as_deref()),
            (vec!["a%".into(), "b".into()], Some("b"))
        );
        let (third, next) = s.children_page(&root, next.as_deref(), 2);
        assert!(third.is_empty() && next.is_none());
        assert_eq!(names(&s.children(&ns("a"))), ["b", "c"]);
        assert_eq!(names(&s.children_page(&ns("a"), Some("b"), 5).0), ["c"]);
        assert_eq!(names(&s.children(&ns("a.b.c"))), ["d"]);
        assert!(s.children(&ns("b.z")).is_empty());
    }

    #[test]
    fn changes_replay_to_the_same_state_and_misfits_are_refused() {
        let mut s = CatalogState::default();
        let mut changes = Vec::new();
        for ns in ["a", "a.b", "c"] {
            s.apply(&create_ns(ns), &mut changes).unwrap();
        }
        let cascade = Mutation::DropNamespace {
            path: ns("a"),
            if_exists: false,
            cascade: true,
        };
        s.apply(&cascade, &mut changes).unwrap();
        assert_eq!(changes.len(), 5);
        let mut replayed = CatalogState::default();
        replayed.replay(&changes).unwrap();
        let ids = |s: &CatalogState| s.iter().map(|e| e.object_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&replayed), ids(&s));
        assert_eq!(ids(&s), ["c"]);
        assert!(
            replayed
                .replay(&changes[2..3])
                .unwrap_err()
                .contains("exists")
        );
        let missing = [Change::Remove("zz".into())];
        assert!(
            replayed
                .replay(&missing)
                .unwrap_err()
                .contains("does not exist")
        );
    }
}
