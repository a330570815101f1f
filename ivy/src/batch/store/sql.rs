//! One SQL text for both databases the store runs on: the embedded SQLite
//! and PostgreSQL for a cluster. Statements are written in SQLite's
//! spelling (`?N` parameters, `rowid`) with three markers PostgreSQL needs
//! for concurrent holders: `{lock}` (the rows read are locked until the
//! transaction ends), `{skip}` and `{skip_s}` (a claim passes over rows
//! another holder is claiming, all tables or only `s`). Values are
//! integers, text or NULL, all the store keeps.

use std::borrow::Cow;

/// A parameter or a column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Text(String),
    Null,
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}

impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}

impl From<&String> for Val {
    fn from(v: &String) -> Self {
        Val::Text(v.clone())
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_string())
    }
}

impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Self {
        v.map_or(Val::Null, Into::into)
    }
}

/// Parameters of one statement, each converted by `Val::from`.
macro_rules! vals {
    ($($v:expr),* $(,)?) => { &[$($crate::batch::store::sql::Val::from($v)),*][..] };
}
pub(crate) use vals;

/// A row read back: its values in the statement's column order.
pub struct Row(pub Vec<Val>);

impl Row {
    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, String> {
        match self.0.get(i) {
            Some(Val::Int(v)) => Ok(Some(*v)),
            Some(Val::Null) => Ok(None),
            other => Err(format!("column {i}: expected an integer, got {other:?}")),
        }
    }

    pub fn int(&self, i: usize) -> Result<i64, String> {
        self.opt_int(i)?
            .ok_or_else(|| format!("column {i}: NULL where an integer belongs"))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, String> {
        match self.0.get(i) {
            Some(Val::Text(v)) => Ok(Some(v.clone())),
            Some(Val::Null) => Ok(None),
            other => Err(format!("column {i}: expected text, got {other:?}")),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, String> {
        self.opt_text(i)?
            .ok_or_else(|| format!("column {i}: NULL where text belongs"))
    }
}

/// A transaction the store's statements run in.
pub trait Sql {
    /// Runs a statement; the number of rows it changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String>;
    /// Runs a query (or a statement with `RETURNING`); every row.
    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String>;

    /// The first row, if any.
    fn row(&mut self, sql: &str, params: &[Val]) -> Result<Option<Row>, String> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The statement as this database spells it.
    pub fn render(self, sql: &str) -> Cow<'_, str> {
        match self {
            Dialect::Sqlite => {
                if !sql.contains('{') {
                    return Cow::Borrowed(sql);
                }
                Cow::Owned(
                    sql.replace("{lock}", "")
                        .replace("{skip_s}", "")
                        .replace("{skip}", ""),
                )
            }
            Dialect::Postgres => {
                let sql = sql
                    .replace("{lock}", " FOR UPDATE")
                    .replace("{skip_s}", " FOR UPDATE OF s SKIP LOCKED")
                    .replace("{skip}", " FOR UPDATE SKIP LOCKED")
                    .replace("rowid", "seq");
                // `?N` → `$N` (no statement holds a literal `?`).
                Cow::Owned(sql.replace('?', "$"))
            }
        }
    }
}

/// The tables, in either dialect (`{seq}`: PostgreSQL's insertion order,
/// which SQLite keeps as `rowid`; BIGINT is SQLite's INTEGER affinity).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files ({seq}
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes BIGINT NOT NULL, created_at BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS batches ({seq}
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, metadata TEXT, model TEXT, status TEXT NOT NULL, errors TEXT,
    output_file_id TEXT, error_file_id TEXT,
    created_at BIGINT NOT NULL, in_progress_at BIGINT, expires_at BIGINT NOT NULL,
    finalizing_at BIGINT, completed_at BIGINT, failed_at BIGINT, expired_at BIGINT,
    cancelling_at BIGINT, cancelled_at BIGINT,
    total BIGINT NOT NULL DEFAULT 0, completed BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0, input_tokens BIGINT NOT NULL DEFAULT 0,
    ending TEXT, holder TEXT, lease_until BIGINT, epoch BIGINT NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS shards ({seq}
    batch_id TEXT NOT NULL, shard BIGINT NOT NULL, byte_start BIGINT NOT NULL,
    byte_end BIGINT NOT NULL, lines BIGINT NOT NULL, done_lines BIGINT NOT NULL DEFAULT 0,
    holder TEXT, lease_until BIGINT, epoch BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, shard));
CREATE TABLE IF NOT EXISTS chunks (
    batch_id TEXT NOT NULL, shard BIGINT NOT NULL, first_line BIGINT NOT NULL,
    lines BIGINT NOT NULL, out_key TEXT, err_key TEXT,
    PRIMARY KEY (batch_id, shard, first_line));
";

pub fn schema(d: Dialect) -> String {
    SCHEMA.replace(
        "{seq}",
        match d {
            Dialect::Sqlite => "",
            Dialect::Postgres => "seq BIGSERIAL,",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_spelling() {
        let sql = "SELECT id FROM batches WHERE a = ?1 AND rowid < ?12 ORDER BY rowid{lock}";
        assert_eq!(
            Dialect::Postgres.render(sql),
            "SELECT id FROM batches WHERE a = $1 AND seq < $12 ORDER BY seq FOR UPDATE"
        );
        assert_eq!(
            Dialect::Sqlite.render(sql),
            "SELECT id FROM batches WHERE a = ?1 AND rowid < ?12 ORDER BY rowid"
        );
        assert!(Dialect::Postgres
            .render("LIMIT 1{skip_s})")
            .ends_with("FOR UPDATE OF s SKIP LOCKED)"));
        assert!(schema(Dialect::Postgres).contains("(seq BIGSERIAL,"));
        assert!(!schema(Dialect::Sqlite).contains("seq"));
    }

    #[test]
    fn rows_read_as_declared() {
        let r = Row(vec![Val::Int(3), Val::Null, Val::Text("a".into())]);
        assert_eq!(r.int(0), Ok(3));
        assert_eq!(r.opt_int(1), Ok(None));
        assert_eq!(r.opt_text(1), Ok(None));
        assert_eq!(r.text(2), Ok("a".into()));
        assert!(r.int(1).is_err());
        assert!(r.text(0).is_err());
        assert_eq!(Val::from(Some(4i64)), Val::Int(4));
        assert_eq!(Val::from(None::<String>), Val::Null);
    }
}
