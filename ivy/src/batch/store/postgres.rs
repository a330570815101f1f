//! The cluster database: PostgreSQL, shared by every Ivy replica. One
//! connection per Ivy (the blocking client, on the blocking pool like
//! SQLite), opened again after it breaks. Claims skip rows another replica
//! is claiming; checks made under a lease lock the rows they read
//! (`sql.rs`'s markers), so READ COMMITTED is enough.

use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use postgres::{Client, NoTls};

use super::sql::{schema, Dialect, Row, Sql, Val};

impl ToSql for Val {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
            Val::Int(v) => v.to_sql(ty, out),
            Val::Text(v) => v.as_str().to_sql(ty, out),
            Val::Null => Ok(IsNull::Yes),
        }
    }

    fn accepts(ty: &Type) -> bool {
        [Type::INT8, Type::INT4, Type::TEXT, Type::VARCHAR].contains(ty)
    }

    to_sql_checked!();
}

/// A connection string (`postgres://user:password@host:port/database`, or
/// libpq's `key=value` form), and the client while it works.
pub struct Pg {
    url: String,
    client: Option<Client>,
}

impl Pg {
    /// Connects and creates the tables (once, whichever replica is first).
    pub fn open(url: &str) -> Result<Self, String> {
        let mut pg = Self {
            url: url.to_string(),
            client: None,
        };
        pg.run(|tx| {
            // Replicas starting together would race on CREATE TABLE.
            tx.exec("SELECT pg_advisory_xact_lock(7301178)", &[])?;
            for statement in schema(Dialect::Postgres).split(';') {
                if !statement.trim().is_empty() {
                    tx.exec(statement, &[])?;
                }
            }
            Ok(())
        })
        .map_err(|e| format!("--batch-database-url: {e}"))?;
        Ok(pg)
    }

    fn client(&mut self) -> Result<&mut Client, String> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let client = Client::connect(&self.url, NoTls).map_err(|e| message(&e))?;
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// Runs `f` in one transaction, committed if it returns `Ok`.
    pub fn run<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Sql) -> Result<R, String>,
    ) -> Result<R, String> {
        let tx = self.client()?.transaction().map_err(|e| message(&e))?;
        let mut tx = Tx(tx);
        let r = f(&mut tx)?;
        tx.0.commit().map_err(|e| message(&e))?;
        Ok(r)
    }
}

struct Tx<'a>(postgres::Transaction<'a>);

/// The server's own message (and SQLSTATE) rather than "db error".
fn message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

fn refs(params: &[Val]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl Sql for Tx<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        self.0
            .execute(Dialect::Postgres.render(sql).as_ref(), &refs(params))
            .map_err(|e| message(&e))
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String> {
        let rows = self
            .0
            .query(Dialect::Postgres.render(sql).as_ref(), &refs(params))
            .map_err(|e| message(&e))?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| {
                        let ty = r.columns()[i].type_();
                        let v = if *ty == Type::INT8 {
                            r.try_get::<_, Option<i64>>(i).map(Val::from)
                        } else if *ty == Type::INT4 {
                            r.try_get::<_, Option<i32>>(i)
                                .map(|v| Val::from(v.map(i64::from)))
                        } else {
                            r.try_get::<_, Option<String>>(i).map(Val::from)
                        };
                        v.map_err(|e| format!("column {i}: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Row)
            })
            .collect()
    }
}
