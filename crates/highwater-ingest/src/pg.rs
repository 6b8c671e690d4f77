//! A blocking PostgreSQL connection over tokio-postgres on a current-thread
//! runtime of its own, as the `postgres` crate is, with one difference that
//! matters for speed: a COPY stream is drained inside one `block_on`, not
//! one per message. The server sends a CopyData message per row, so the
//! per-message runtime entry of a blocking reader cost about a sixth of
//! the client's time.

use postgres::types::ToSql;
use postgres::{Error, Row, SimpleQueryMessage, Statement};

/// What went wrong, in the server's words where the server said it: the
/// client's own text for a server error is only "db error", with the
/// reason (`relation "orders" does not exist`, `password authentication
/// failed for user "x"`) in the error's source. Neither holds the
/// connection string.
pub fn reason(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut out = db.message().to_string();
        if let Some(d) = db.detail() {
            out.push_str(&format!(" ({d})"));
        }
        if let Some(h) = db.hint() {
            out.push_str(&format!("; hint: {h}"));
        }
        return out;
    }
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(&format!(": {c}"));
        cause = c.source();
    }
    out
}

pub struct Pg {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Pg {
    /// Connects; the error never contains the connection string.
    pub fn connect(url: &str) -> Result<Pg, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the client runtime: {e}"))?;
        let (client, connection) = rt
            .block_on(tokio_postgres::connect(url, postgres::NoTls))
            .map_err(|e| reason(&e))?;
        // The connection task runs whenever the runtime does (inside every
        // block_on below); its end is seen by the next call as an error.
        rt.spawn(connection);
        Ok(Pg { rt, client })
    }

    pub fn batch_execute(&mut self, sql: &str) -> Result<(), Error> {
        self.rt.block_on(self.client.batch_execute(sql))
    }

    pub fn prepare(&mut self, sql: &str) -> Result<Statement, Error> {
        self.rt.block_on(self.client.prepare(sql))
    }

    pub fn query(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        self.rt.block_on(self.client.query(sql, params))
    }

    pub fn query_one(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error> {
        self.rt.block_on(self.client.query_one(sql, params))
    }

    pub fn simple_query(&mut self, sql: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        self.rt.block_on(self.client.simple_query(sql))
    }

    /// Runs a `COPY … TO STDOUT` and hands each chunk of the stream to `f`,
    /// all inside one `block_on`. An error of `f` stops the stream.
    pub fn copy_out(
        &mut self,
        sql: &str,
        mut f: impl FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        use futures_util::TryStreamExt;
        self.rt.block_on(async {
            let stream = self.client.copy_out(sql).await.map_err(|e| reason(&e))?;
            let mut stream = std::pin::pin!(stream);
            while let Some(chunk) = stream.try_next().await.map_err(|e| reason(&e))? {
                f(&chunk)?;
            }
            Ok(())
        })
    }

    /// Runs a `COPY … FROM STDIN`, sending each chunk `next` gives until it
    /// gives `None`, all inside one `block_on`; returns the rows the server
    /// counted. An error of `next` aborts the COPY (the server discards it).
    pub fn copy_in(
        &mut self,
        sql: &str,
        mut next: impl FnMut() -> Result<Option<bytes::Bytes>, String>,
    ) -> Result<u64, String> {
        use futures_util::SinkExt;
        self.rt.block_on(async {
            let sink = self
                .client
                .copy_in::<_, bytes::Bytes>(sql)
                .await
                .map_err(|e| reason(&e))?;
            let mut sink = std::pin::pin!(sink);
            loop {
                match next() {
                    Ok(Some(chunk)) => sink.send(chunk).await.map_err(|e| reason(&e))?,
                    Ok(None) => break,
                    // Dropped unfinished, the sink fails the COPY.
                    Err(e) => return Err(e),
                }
            }
            sink.as_mut().finish().await.map_err(|e| reason(&e))
        })
    }
}
