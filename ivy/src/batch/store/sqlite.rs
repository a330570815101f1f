//! The embedded database: SQLite compiled in, one file (WAL, synchronous
//! commits), shared by the Ivy processes of one machine. Each call is one
//! `BEGIN IMMEDIATE` transaction, so writers queue on the busy timeout
//! rather than failing when a read turns into a write.

use std::path::Path;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params_from_iter, Connection, TransactionBehavior};

use super::sql::{schema, Dialect, Row, Sql, Val};

impl rusqlite::ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Val::Int(v) => ToSqlOutput::from(*v),
            Val::Text(v) => ToSqlOutput::from(v.as_str()),
            Val::Null => ToSqlOutput::from(rusqlite::types::Null),
        })
    }
}

pub fn open(path: &Path) -> Result<Connection, String> {
    let conn = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .and_then(|()| conn.pragma_update(None, "journal_mode", "WAL"))
        .and_then(|()| conn.pragma_update(None, "synchronous", "FULL"))
        .and_then(|()| conn.execute_batch(&schema(Dialect::Sqlite)))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(conn)
}

struct Tx<'a>(rusqlite::Transaction<'a>);

impl Sql for Tx<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        self.0
            .execute(&Dialect::Sqlite.render(sql), params_from_iter(params))
            .map(|n| n as u64)
            .map_err(|e| e.to_string())
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String> {
        let mut st = self
            .0
            .prepare(&Dialect::Sqlite.render(sql))
            .map_err(|e| e.to_string())?;
        let width = st.column_count();
        let mut rows = st
            .query(params_from_iter(params))
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(|e| e.to_string())? {
            let mut vals = Vec::with_capacity(width);
            for i in 0..width {
                vals.push(match r.get_ref(i).map_err(|e| e.to_string())? {
                    ValueRef::Null => Val::Null,
                    ValueRef::Integer(v) => Val::Int(v),
                    ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                    other => return Err(format!("column {i}: unexpected {:?}", other.data_type())),
                });
            }
            out.push(Row(vals));
        }
        Ok(out)
    }
}

/// Runs `f` in one transaction, committed if it returns `Ok`.
pub fn run<R>(
    conn: &mut Connection,
    f: impl FnOnce(&mut dyn Sql) -> Result<R, String>,
) -> Result<R, String> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| e.to_string())?;
    let mut tx = Tx(tx);
    let r = f(&mut tx)?;
    tx.0.commit().map_err(|e| e.to_string())?;
    Ok(r)
}
