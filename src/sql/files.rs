//! What SQL in a [`MemwalSession`](super::MemwalSession) may do with files
//! that are not memwal tables: read them as URL tables (`SELECT ... FROM
//! '<path>'`) and write them (`COPY ... TO`, `INSERT INTO '<path>'`).
//!
//! Rules:
//! - the root is memwal's data, never a scratch space: a write whose target
//!   lies inside the root is refused, whatever the session allows (for a
//!   local root after resolving `..` and symbolic links; for any other root,
//!   a URL under the root's URL);
//! - every other file read or write is opt-in
//!   ([`SessionBuilder::allow_file_access`](super::SessionBuilder::allow_file_access));
//!   the `memwal` shell opts in, an embedded session does not;
//! - `CREATE EXTERNAL TABLE` is refused before anything is read (the memwal
//!   catalog holds memwal tables only, and inferring a file's schema first
//!   would leak its shape in the error).

use std::path::{Component, Path, PathBuf};

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::{ListingTable, ListingTableUrl};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{LogicalPlan, WriteOp};
use datafusion::sql::parser::Statement as DFStatement;
use url::Url;

use super::MemwalTable;
use crate::error::{Error, Result};
use crate::store::ObjectRoot;

/// The file policy of one session.
#[derive(Debug, Clone)]
pub(crate) struct FileAccess {
    /// Whether SQL may read and write files outside the root.
    allowed: bool,
    root: RootLocation,
}

/// Where the root lives, in the form write targets are compared with.
#[derive(Debug, Clone)]
enum RootLocation {
    /// A local directory, canonical.
    Local(PathBuf),
    /// Any other store: its URL.
    Url(Url),
    /// A root given as an opaque name (a store handed to
    /// [`ObjectRoot::new`]): no file URL can point into it.
    Opaque,
}

impl FileAccess {
    /// The policy for a session on `root`; `allowed` opts in to files
    /// outside the root.
    pub(crate) fn new(root: &ObjectRoot, allowed: bool) -> Self {
        let root = match Url::parse(root.url()) {
            Ok(url) if url.scheme() == "file" => match url.to_file_path() {
                Ok(path) => RootLocation::Local(resolve(&path)),
                Err(()) => RootLocation::Opaque,
            },
            Ok(url) => RootLocation::Url(url),
            Err(_) => RootLocation::Opaque,
        };
        Self { allowed, root }
    }

    /// Whether SQL may read files as URL tables.
    pub(crate) fn allowed(&self) -> bool {
        self.allowed
    }

    /// Refuses statements that would touch files before they are planned:
    /// `CREATE EXTERNAL TABLE` (also under `EXPLAIN`).
    pub(crate) fn check_statement(&self, statement: &DFStatement) -> Result<()> {
        match statement {
            DFStatement::CreateExternalTable(create) => Err(Error::invalid(format!(
                "CREATE EXTERNAL TABLE is not supported ('{}' was not read): \
                 the memwal catalog holds memwal tables only; create one with CREATE TABLE{}",
                create.locations.join("', '"),
                if self.allowed {
                    ", or query the file directly with SELECT ... FROM '<path>'"
                } else {
                    ""
                }
            ))),
            DFStatement::Explain(explain) => self.check_statement(&explain.statement),
            _ => Ok(()),
        }
    }

    /// Refuses a plan that writes files it may not: `COPY ... TO` and
    /// inserts into tables that are not memwal tables (URL tables).
    pub(crate) fn check_plan(&self, plan: &LogicalPlan) -> Result<()> {
        let mut result = Ok(());
        plan.apply(|node| {
            let checked = match node {
                LogicalPlan::Copy(copy) => self.check_write("COPY ... TO", &copy.output_url),
                LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Insert(_)) => {
                    self.check_insert(dml)
                }
                _ => Ok(()),
            };
            match checked {
                Ok(()) => Ok(TreeNodeRecursion::Continue),
                Err(e) => {
                    result = Err(e);
                    Ok(TreeNodeRecursion::Stop)
                }
            }
        })?;
        result
    }

    fn check_insert(&self, dml: &datafusion::logical_expr::DmlStatement) -> Result<()> {
        let provider = source_as_provider(&dml.target)?;
        if provider.downcast_ref::<MemwalTable>().is_some() {
            return Ok(());
        }
        if let Some(listing) = provider.downcast_ref::<ListingTable>() {
            for path in listing.table_paths() {
                self.check_write("INSERT INTO", path.as_str())?;
            }
            return Ok(());
        }
        Err(Error::invalid(format!(
            "INSERT INTO {}: only memwal tables{} can be written",
            dml.table_name,
            if self.allowed { " and files" } else { "" }
        )))
    }

    /// Refuses a write to `target` (a path or URL as DataFusion takes it)
    /// inside the root, or anywhere when files are not allowed.
    fn check_write(&self, what: &str, target: &str) -> Result<()> {
        let url = ListingTableUrl::parse(target)?;
        let url: &Url = url.as_ref();
        if self.inside_root(url) {
            return Err(Error::invalid(format!(
                "{what} '{target}' would write inside the memwal root; \
                 the root holds memwal's data, write somewhere else"
            )));
        }
        if !self.allowed {
            return Err(Error::invalid(format!(
                "{what} '{target}' writes files, and this session does not allow file access \
                 (open it with MemwalSession::builder(..).allow_file_access(true) in Rust, \
                 memwal.open(.., allow_file_access=True) in Python)"
            )));
        }
        Ok(())
    }

    fn inside_root(&self, target: &Url) -> bool {
        match &self.root {
            RootLocation::Local(root) => {
                target.scheme() == "file"
                    && target
                        .to_file_path()
                        .is_ok_and(|path| resolve(&path).starts_with(root))
            }
            RootLocation::Url(root) => {
                let root = root.as_str().trim_end_matches('/');
                let target = target.as_str();
                target == root
                    || target
                        .strip_prefix(root)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            RootLocation::Opaque => false,
        }
    }
}

/// `path` as the file system will resolve it: the longest existing prefix
/// canonicalized (symbolic links and `..` resolved), the rest (directories
/// a write would create) normalized lexically.
fn resolve(path: &Path) -> PathBuf {
    let parts: Vec<Component> = path.components().collect();
    for split in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..split].iter().collect();
        if let Ok(mut out) = prefix.canonicalize() {
            for part in &parts[split..] {
                match part {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::CurDir => {}
                    other => out.push(other),
                }
            }
            return out;
        }
    }
    path.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &Path, allowed: bool) -> FileAccess {
        FileAccess::new(&ObjectRoot::open(dir.to_str().unwrap()).unwrap(), allowed)
    }

    #[test]
    fn writes_inside_a_local_root_are_refused_however_spelled() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let files = local(&root, true);
        let other = dir.path().join("out.csv");
        files.check_write("COPY", other.to_str().unwrap()).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        for target in [
            root.join("__manifest/v9.arrow"),
            root.clone(),
            dir.path().join("root/new/../__manifest/x.csv"),
            dir.path().join("elsewhere/../root/x.csv"),
            link.join("__manifest/x.csv"),
        ] {
            let err = files
                .check_write("COPY", target.to_str().unwrap())
                .unwrap_err();
            assert!(err.to_string().contains("inside the memwal root"), "{err}");
        }
        let url = format!("file://{}/__manifest/x", root.display());
        assert!(files.check_write("COPY", &url).is_err());
    }

    #[test]
    fn other_writes_need_file_access() {
        let dir = tempfile::tempdir().unwrap();
        let files = local(&dir.path().join("root"), false);
        let err = files
            .check_write("COPY", dir.path().join("out.csv").to_str().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("allow_file_access(true)"), "{err}");
    }

    #[test]
    fn urls_under_a_remote_root_are_refused() {
        let root = ObjectRoot::open("memory://files-test/data").unwrap();
        let files = FileAccess::new(&root, true);
        assert!(
            files
                .check_write("COPY", "memory://files-test/data/__manifest/x")
                .is_err()
        );
        files
            .check_write("COPY", "memory://files-test/database/x")
            .unwrap();
    }
}
