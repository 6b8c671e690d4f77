//! The SQLite state store: bundled SQLite, WAL, forward-only migrations.

use crate::{
    Batch, Bookmark, DirRecord, Fence, LeaseOutcome, RunRecord, StageEntries, StateStore,
    StoreError, WindowCommit, WindowRecord, WindowStatus,
};
use highwater_core::evidence::Digest;
use highwater_core::{Entries, Entry, EntryKind, Stat, Status};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};

/// The migrations, in order. Migration `i` takes the schema from version `i`
/// to `i + 1`. They only ever move forward, and a new one never changes what
/// an existing entry means: an upgrade must never look like change.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: the manifest.
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE entries(
        stage TEXT NOT NULL,
        kind TEXT NOT NULL,
        item TEXT NOT NULL,
        digest TEXT,
        size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        ctime_ns INTEGER NOT NULL,
        ino INTEGER NOT NULL,
        dev INTEGER NOT NULL,
        observed_at_ns INTEGER NOT NULL,
        recipe TEXT NOT NULL,
        output TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        processed_at_ns INTEGER NOT NULL,
        PRIMARY KEY(stage, kind, item)
     ) WITHOUT ROWID;",
    // 1 -> 2: item durations and the run log.
    "ALTER TABLE entries ADD COLUMN duration_ms INTEGER NOT NULL DEFAULT 0;
     CREATE TABLE runs(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        stage TEXT NOT NULL,
        started_at_ns INTEGER NOT NULL,
        finished_at_ns INTEGER,
        summary TEXT NOT NULL DEFAULT '{}',
        exit_code INTEGER
     );
     CREATE INDEX runs_stage ON runs(stage, id);",
    // 2 -> 3: the output-folder cache.
    "CREATE TABLE output_dirs(
        stage TEXT NOT NULL,
        dir TEXT NOT NULL,
        mtime_ns INTEGER NOT NULL,
        ctime_ns INTEGER NOT NULL,
        ino INTEGER NOT NULL,
        observed_at_ns INTEGER NOT NULL,
        PRIMARY KEY(stage, dir)
     ) WITHOUT ROWID;",
    // 3 -> 4: ingestion: bookmarks, windows, leases.
    "CREATE TABLE bookmarks(
        source TEXT PRIMARY KEY,
        last_end_us INTEGER NOT NULL,
        horizon INTEGER
     );
     CREATE TABLE windows(
        source TEXT NOT NULL,
        start_us INTEGER NOT NULL,
        end_us INTEGER NOT NULL,
        status TEXT NOT NULL,
        rows INTEGER NOT NULL,
        files TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        token TEXT NOT NULL,
        recipe TEXT NOT NULL,
        updated_at_ns INTEGER NOT NULL,
        error TEXT,
        extra TEXT NOT NULL,
        PRIMARY KEY(source, start_us)
     ) WITHOUT ROWID;
     CREATE TABLE leases(
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        acquired_at_ns INTEGER NOT NULL,
        expires_at_ns INTEGER NOT NULL,
        token INTEGER NOT NULL
     );",
    // 4 -> 5: the work queue and the fleet's processes (used only by a
    // shared PostgreSQL store; here so that versions mean the same tables).
    crate::WORK_SQL_SQLITE,
    // 5 -> 6: observed dependency sets (issue 24).
    crate::DEPS_SQL,
    // 6 -> 7: manifest tokens, which validate manifest snapshots (issue 22).
    MANIFEST_TOKENS_SQL,
    // 7 -> 8: each window's head (issue 49): what a plan over landed
    // windows reads of `extra` (`digest`, `path`, `compacted`), kept apart
    // so that a plan parses 100 bytes a window, not the schema and recipe;
    // and an index holding every column `window_heads` reads, so that the
    // plan reads the index's small rows, never the records' pages of file
    // lists and schemas (SQLite keeps it on every write: no writer can
    // forget it).
    "ALTER TABLE windows ADD COLUMN head TEXT;
     UPDATE windows SET head = json_object(
        'digest', json_extract(extra, '$.digest'),
        'path', json_extract(extra, '$.path'),
        'compacted', json(json_extract(extra, '$.compacted')));
     CREATE INDEX windows_heads ON windows(source, start_us, end_us, status, rows,
        duration_ms, token, recipe, updated_at_ns, error, head);",
    // 8 -> 9: window tokens, which validate window-heads snapshots
    // (issue 49), as manifest tokens validate manifest snapshots.
    WINDOW_TOKENS_SQL,
];

/// Each stage's manifest token: a random number replaced, by a trigger in
/// the writing transaction, whenever any row a load of that stage returns
/// is inserted, updated or deleted (a dependency set's body renews the
/// tokens of the stages whose items name it; an unnamed set is in no load). A snapshot is used only at its stage's token
/// (see [`crate::snapshot`]), so no writer can leave one standing that the
/// rows no longer match: the invariant lives in the schema, not in each
/// writer. Stages with rows get a token now, so an upgraded store
/// snapshots from its first plan.
/// Renews the token in `$tokens` of `$row`'s `$key` (`NEW` or `OLD`),
/// creating it.
macro_rules! renew_token {
    ($tokens:literal, $key:literal, $row:literal) => {
        concat!(
            "INSERT INTO ",
            $tokens,
            "(",
            $key,
            ", token) VALUES(",
            $row,
            ".",
            $key,
            ", random()) ON CONFLICT(",
            $key,
            ") DO UPDATE SET token = excluded.token;"
        )
    };
}

/// The three triggers that renew `$tokens`' token of a `$table` row's
/// `$key` on every insert, update and delete.
macro_rules! token_triggers {
    ($tokens:literal, $key:literal, $table:literal) => {
        concat!(
            "CREATE TRIGGER ",
            $table,
            "_token_ins AFTER INSERT ON ",
            $table,
            " BEGIN ",
            renew_token!($tokens, $key, "NEW"),
            " END;\n",
            "CREATE TRIGGER ",
            $table,
            "_token_upd AFTER UPDATE ON ",
            $table,
            " BEGIN ",
            renew_token!($tokens, $key, "OLD"),
            renew_token!($tokens, $key, "NEW"),
            " END;\n",
            "CREATE TRIGGER ",
            $table,
            "_token_del AFTER DELETE ON ",
            $table,
            " BEGIN ",
            renew_token!($tokens, $key, "OLD"),
            " END;\n",
        )
    };
}

const MANIFEST_TOKENS_SQL: &str = concat!(
    "CREATE TABLE manifest_tokens(
        stage TEXT PRIMARY KEY,
        token INTEGER NOT NULL
     ) WITHOUT ROWID;
     INSERT INTO manifest_tokens(stage, token)
        SELECT stage, random() FROM (SELECT stage FROM entries UNION SELECT stage FROM output_dirs
                                     UNION SELECT stage FROM item_deps);\n",
    token_triggers!("manifest_tokens", "stage", "entries"),
    token_triggers!("manifest_tokens", "stage", "output_dirs"),
    token_triggers!("manifest_tokens", "stage", "item_deps"),
    "CREATE TRIGGER dep_sets_token_upd AFTER UPDATE ON dep_sets BEGIN
        UPDATE manifest_tokens SET token = random() WHERE stage IN
            (SELECT stage FROM item_deps WHERE set_id IN (OLD.id, NEW.id)); END;
     CREATE TRIGGER dep_sets_token_del AFTER DELETE ON dep_sets BEGIN
        UPDATE manifest_tokens SET token = random() WHERE stage IN
            (SELECT stage FROM item_deps WHERE set_id = OLD.id); END;"
);

/// Each source's window token: a random number replaced, by a trigger in
/// the writing transaction, whenever any of the source's `windows` rows is
/// inserted, updated or deleted. A heads snapshot is used only at its
/// source's token (see [`crate::heads`]). Sources with windows get a token
/// now.
const WINDOW_TOKENS_SQL: &str = concat!(
    "CREATE TABLE window_tokens(
        source TEXT PRIMARY KEY,
        token INTEGER NOT NULL
     ) WITHOUT ROWID;
     INSERT INTO window_tokens(source, token)
        SELECT source, random() FROM (SELECT DISTINCT source FROM windows);\n",
    token_triggers!("window_tokens", "source", "windows"),
);

/// How much of the database file SQLite may map into memory for reads.
/// Bounds address space, not memory: pages are the page cache's.
pub const MMAP_SIZE_BYTES: i64 = 1 << 30;

/// How often opening a store retries when another process holds the lock
/// while creating or migrating it (20 ms apart): bounds the wait to seconds.
pub const OPEN_BUSY_RETRIES_MAX: u32 = 250;

/// The most entries a load reserves room for up front on its last run's
/// word: a summary that claims more only grows the list as rows arrive.
const ENTRIES_HINT_MAX: i64 = 100_000_000;

/// The schema version this highwater writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

/// The columns [`SqliteStore::row_to_entry`] reads, in its order.
const ENTRY_COLUMNS: &str = "kind, item, digest, size, mtime_ns, ctime_ns, ino, dev, \
     observed_at_ns, recipe, output, error, status, processed_at_ns, duration_ms";

impl SqliteStore {
    /// Every window record of `source`, by start; with `heads`, `files`
    /// is empty and `extra` holds only the strings `digest`, `path` and
    /// `compacted.path` (from the `head` column `put_window` writes beside
    /// it, see [`crate::heads::kept_extra`]): a no-change
    /// plan over 1,000 windows spent more on parsing each record's file
    /// list and schema into `serde_json::Value`s than on the plan itself
    /// (issue 49, bench/windows_plan.sh).
    fn load_windows(&self, source: &str, heads: bool) -> Result<Vec<WindowRecord>, StoreError> {
        let sql = if heads {
            "SELECT start_us, end_us, status, rows, duration_ms, token, recipe, updated_at_ns,
                    error, NULL, head
             FROM windows INDEXED BY windows_heads WHERE source = ?1 ORDER BY start_us"
        } else {
            "SELECT start_us, end_us, status, rows, duration_ms, token, recipe, updated_at_ns,
                    error, files, extra
             FROM windows WHERE source = ?1 ORDER BY start_us"
        };
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let mut rows = stmt.query([source]).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let row = (|| -> rusqlite::Result<_> {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, i64>(7)?,
                    r.get::<_, Option<String>>(8)?,
                ))
            })()
            .map_err(|e| self.err(e))?;
            let (start_us, end_us, status, nrows, duration_ms, token, recipe, updated, error) = row;
            let corrupt = |what: String| StoreError::Corrupt {
                path: self.path.clone(),
                stage: source.to_string(),
                item: format!("window starting {start_us}"),
                what,
            };
            let text = |i: usize| -> Result<&str, StoreError> {
                match r.get_ref(i).map_err(|e| self.err(e))? {
                    rusqlite::types::ValueRef::Text(t) => std::str::from_utf8(t)
                        .map_err(|e| corrupt(format!("column {i} is not UTF-8: {e}"))),
                    other => Err(corrupt(format!(
                        "column {i} holds {:?}, not JSON text",
                        other.data_type()
                    ))),
                }
            };
            let (files, extra) = if heads {
                let h: serde_json::Value =
                    serde_json::from_str(text(10)?).map_err(|e| corrupt(e.to_string()))?;
                (serde_json::json!([]), crate::heads::kept_extra(&h))
            } else {
                let parse = |i: usize| -> Result<serde_json::Value, StoreError> {
                    serde_json::from_str(text(i)?).map_err(|e| corrupt(e.to_string()))
                };
                (parse(9)?, parse(10)?)
            };
            let status = WindowStatus::parse(status.as_str())
                .ok_or_else(|| corrupt(format!("unknown window status `{}`", status.as_str())))?;
            if end_us <= start_us {
                return Err(corrupt("window end is not after its start".into()));
            }
            out.push(WindowRecord {
                source: source.to_string(),
                start_us,
                end_us,
                status,
                rows: nrows,
                files,
                duration_ms,
                token,
                recipe,
                updated_at_ns: updated,
                error,
                extra,
            });
        }
        Ok(out)
    }
    /// Opens (creating if needed) the store at `path` and migrates it forward.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        Self::open_at(path, SCHEMA_VERSION)
    }

    /// Opens and migrates only up to `version`. Exists so that tests can
    /// build a store as an older highwater left it.
    #[doc(hidden)]
    pub fn open_at(path: &Path, version: u32) -> Result<SqliteStore, StoreError> {
        // Switching a fresh file to WAL and migrating it can meet another
        // process doing the same; SQLite then answers "busy" without
        // waiting, so the open is retried a bounded number of times.
        let mut attempt = 0;
        loop {
            match Self::open_once(path, version) {
                Err(StoreError::Sqlite { source, .. })
                    if attempt < OPEN_BUSY_RETRIES_MAX
                        && matches!(
                            source.sqlite_error_code(),
                            Some(
                                rusqlite::ErrorCode::DatabaseBusy
                                    | rusqlite::ErrorCode::DatabaseLocked
                            )
                        ) =>
                {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn open_once(path: &Path, version: u32) -> Result<SqliteStore, StoreError> {
        assert!(version <= SCHEMA_VERSION);
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|source| StoreError::Io {
                    path: parent.to_path_buf(),
                    source,
                })?;
            }
        }
        let err = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(err)?;
        ensure_wal(&conn, std::time::Duration::from_secs(30)).map_err(err)?;
        // FULL: a commit is durable before we report it, as the outputs are.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        let mut store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        store.migrate(version)?;
        Ok(store)
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn current_version(&self) -> Result<u32, StoreError> {
        let has_meta: bool = self
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='meta'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(|e| self.err(e))?
            > 0;
        if !has_meta {
            return Ok(0);
        }
        let v: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key='schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(v.and_then(|s| s.parse().ok()).unwrap_or(0))
    }

    fn migrate(&mut self, target: u32) -> Result<(), StoreError> {
        let found = self.current_version()?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        if found >= target {
            return Ok(());
        }
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        // Each step re-reads the version inside its write transaction:
        // another process may have migrated the store since we looked.
        loop {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err)?;
            let has_meta: bool = tx
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='meta'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(err)?
                > 0;
            let v: u32 = if has_meta {
                tx.query_row(
                    "SELECT value FROM meta WHERE key='schema_version'",
                    [],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(err)?
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
            } else {
                0
            };
            if v >= target {
                return Ok(());
            }
            tx.execute_batch(MIGRATIONS[v as usize]).map_err(err)?;
            tx.execute(
                "INSERT INTO meta(key, value) VALUES('schema_version', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![(v + 1).to_string()],
            )
            .map_err(err)?;
            tx.commit().map_err(err)?;
        }
    }

    /// Decodes one manifest row, checking it as it goes. This runs once per
    /// entry on every plan, so text columns that are only compared (kind,
    /// status, digest) are read borrowed, without an allocation.
    fn row_to_entry(&self, stage: &str, row: &rusqlite::Row<'_>) -> Result<Entry, StoreError> {
        let get = |e| self.err(e);
        let item: String = row.get(1).map_err(get)?;
        let corrupt = |what: String| StoreError::Corrupt {
            path: self.path.clone(),
            stage: stage.to_string(),
            item: item.clone(),
            what,
        };
        let text = |i: usize| -> Result<Option<&str>, StoreError> {
            match row.get_ref(i).map_err(get)? {
                rusqlite::types::ValueRef::Null => Ok(None),
                v => v
                    .as_str()
                    .map(Some)
                    .map_err(|e| corrupt(format!("column {i}: {e}"))),
            }
        };
        let kind = match text(0)? {
            Some("item") => EntryKind::Item,
            Some("member") => EntryKind::Member,
            other => return Err(corrupt(format!("unknown kind {other:?}"))),
        };
        let status = match text(12)? {
            Some("ok") => Status::Ok,
            Some("failed") => Status::Failed,
            other => return Err(corrupt(format!("unknown status {other:?}"))),
        };
        // A digest in a format this version does not know is dropped: the
        // item then counts as changed, which is the safe side.
        let digest = text(2)?.and_then(Digest::parse);
        let size: i64 = row.get(3).map_err(get)?;
        if size < 0 {
            return Err(corrupt(format!("negative size {size}")));
        }
        let duration: i64 = row.get(14).map_err(get)?;
        let stat = Stat {
            size: size as u64,
            mtime_ns: row.get(4).map_err(get)?,
            ctime_ns: row.get(5).map_err(get)?,
            ino: row.get::<_, i64>(6).map_err(get)? as u64,
            dev: row.get::<_, i64>(7).map_err(get)? as u64,
        };
        let observed_at_ns = row.get(8).map_err(get)?;
        let recipe = row.get(9).map_err(get)?;
        let output = row.get(10).map_err(get)?;
        let error = row.get(11).map_err(get)?;
        let processed_at_ns = row.get(13).map_err(get)?;
        Ok(Entry {
            kind,
            item,
            digest,
            stat,
            observed_at_ns,
            recipe,
            output,
            error,
            status,
            processed_at_ns,
            duration_ms: duration.max(0) as u64,
        })
    }

    fn select(
        &self,
        where_clause: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        let sql = format!(
            "SELECT {ENTRY_COLUMNS}, stage FROM entries {where_clause} ORDER BY stage, kind, item"
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt.query(args).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| self.err(e))? {
            let stage: String = row.get(15).map_err(|e| self.err(e))?;
            let entry = self.row_to_entry(&stage, row)?;
            out.push((stage, entry));
        }
        Ok(out)
    }
}

impl SqliteStore {
    /// Loads `stage` from its rows, never from a snapshot: what a snapshot
    /// must equal.
    pub fn load_rows(&self, stage: &str) -> Result<StageEntries, StoreError> {
        // A no-change plan of a large stage is mostly this load (issue 24).
        // Rows arrive sorted by (kind, item), the primary key, and go in one
        // pass straight into the two sorted lists: no stage column, no list
        // of rows in between. The lists are sized first: a large stage's is
        // tens of megabytes, and growing it by doubling copies it and
        // touches fresh pages each time. The size is what the stage's last
        // run discovered, one indexed row, not a count of its entries,
        // which reads them all once more (a tenth of a no-change plan). It
        // is only a hint: a wrong one (a later commit, a summary that is
        // not ours) costs only the lists' growth, never an error.
        let hint: i64 = self
            .conn
            .prepare_cached(
                "SELECT CASE WHEN json_valid(summary)
                    THEN json_extract(summary, '$.discovered') END
                 FROM runs WHERE stage = ?1 ORDER BY id DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row([stage], |r| {
                    Ok(match r.get_ref(0)? {
                        rusqlite::types::ValueRef::Integer(n) => n,
                        _ => 0,
                    })
                })
                .optional()
            })
            .map_err(|e| self.err(e))?
            .unwrap_or(0);
        let hint = hint.clamp(0, ENTRIES_HINT_MAX) as usize;
        let mut items = Vec::with_capacity(hint);
        let mut members = Vec::new();
        {
            let mut stmt = self
                .conn
                .prepare_cached(&format!(
                    "SELECT {ENTRY_COLUMNS} FROM entries WHERE stage = ?1 ORDER BY kind, item"
                ))
                .map_err(|e| self.err(e))?;
            let mut rows = stmt.query([stage]).map_err(|e| self.err(e))?;
            while let Some(row) = rows.next().map_err(|e| self.err(e))? {
                let e = self.row_to_entry(stage, row)?;
                match e.kind {
                    EntryKind::Item => items.push(e),
                    EntryKind::Member => {
                        // Members come after the items (the key's order):
                        // an aggregate's inputs are the rest of the hint.
                        if members.capacity() == 0 {
                            members.reserve(hint.saturating_sub(items.len()));
                        }
                        members.push(e)
                    }
                };
            }
        }
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT dir, mtime_ns, ctime_ns, ino, observed_at_ns FROM output_dirs WHERE stage = ?1",
            )
            .map_err(|e| self.err(e))?;
        let dirs = stmt
            .query_map([stage], |r| {
                Ok(DirRecord {
                    dir: r.get(0)?,
                    mtime_ns: r.get(1)?,
                    ctime_ns: r.get(2)?,
                    ino: r.get::<_, i64>(3)? as u64,
                    observed_at_ns: r.get(4)?,
                })
            })
            .map_err(|e| self.err(e))?
            .map(|r| r.map(|d| (d.dir.clone(), d)))
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        let items = Entries::from_sorted(items);
        // The links in item order (the table's key), paired with the
        // entries by one merge and each text read borrowed: a million
        // rows are a million steps, not a million names and set bodies.
        let mut linker = crate::DepLinker::new(&items);
        let mut stmt = self
            .conn
            .prepare_cached("SELECT item, set_id FROM item_deps WHERE stage = ?1 ORDER BY item")
            .map_err(|e| self.err(e))?;
        let mut rows = stmt.query([stage]).map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let text = |i: usize| -> Result<&str, StoreError> {
                r.get_ref(i)
                    .map_err(|e| self.err(e))?
                    .as_str()
                    .map_err(|e| StoreError::Corrupt {
                        path: self.path.clone(),
                        stage: stage.to_string(),
                        item: String::new(),
                        what: format!("item_deps column {i}: {e}"),
                    })
            };
            linker.push(text(0)?, text(1)?);
        }
        let (item_sets, ids) = linker.finish();
        let mut body_of = self
            .conn
            .prepare_cached("SELECT body FROM dep_sets WHERE id = ?1")
            .map_err(|e| self.err(e))?;
        let mut dep_sets = Vec::with_capacity(ids.len());
        for (id, item) in ids {
            let body: Option<String> = body_of
                .query_row([&id], |r| r.get(0))
                .optional()
                .map_err(|e| self.err(e))?;
            let Some(body) = body else {
                return Err(StoreError::Corrupt {
                    path: self.path.clone(),
                    stage: stage.to_string(),
                    item,
                    what: format!("its dependency set {id} is not stored"),
                });
            };
            dep_sets.push((id, body));
        }
        Ok(StageEntries {
            items,
            members: Entries::from_sorted(members),
            dirs,
            item_sets,
            dep_sets,
        })
    }
}

impl SqliteStore {
    /// Leaves `stage`'s snapshot at its current token: only the file's head
    /// is read when it is.
    pub fn refresh_snapshot(&self, stage: &str) -> Result<(), StoreError> {
        let token = self.token(MANIFEST_TOKEN_SQL, stage)?;
        let path = crate::snapshot::path_for(&self.path, stage);
        match token {
            Some(t) if !crate::snapshot::is_current(&path, t, stage) => self.load(stage).map(drop),
            _ => Ok(()),
        }
    }
}

/// A stage's manifest token (see `MANIFEST_TOKENS_SQL`).
const MANIFEST_TOKEN_SQL: &str = "SELECT token FROM manifest_tokens WHERE stage = ?1";
/// A source's window token (see `WINDOW_TOKENS_SQL`).
const WINDOW_TOKEN_SQL: &str = "SELECT token FROM window_tokens WHERE source = ?1";

impl SqliteStore {
    /// The token `sql` reads for `key`, if it has one.
    fn token(&self, sql: &str, key: &str) -> Result<Option<i64>, StoreError> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.query_row([key], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))
    }

    /// What a cache file holds at `key`'s current token (`sql` reads it),
    /// else what the rows hold, then cached at that token. The token and
    /// the rows are read in one transaction, so a cache file is never
    /// tagged with a token its rows are not of.
    fn through_cache<T>(
        &self,
        sql: &str,
        key: &str,
        cached: impl FnOnce(i64) -> Option<T>,
        rows: impl FnOnce() -> Result<T, StoreError>,
        cache: impl FnOnce(i64, &T),
    ) -> Result<T, StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        let token = self.token(sql, key)?;
        if let Some(hit) = token.and_then(cached) {
            return Ok(hit);
        }
        let read = rows()?;
        tx.finish().map_err(|e| self.err(e))?;
        if let Some(t) = token {
            cache(t, &read);
        }
        Ok(read)
    }
}

impl StateStore for SqliteStore {
    /// From the stage's snapshot when it is at the stage's manifest token,
    /// else from the rows, leaving a snapshot at that token for the next
    /// load (issue 22). The token and the rows are read in one transaction,
    /// so a snapshot is never tagged with a token its rows are not of.
    fn load(&self, stage: &str) -> Result<StageEntries, StoreError> {
        let snap = crate::snapshot::path_for(&self.path, stage);
        self.through_cache(
            MANIFEST_TOKEN_SQL,
            stage,
            |t| crate::snapshot::read(&snap, t, stage),
            || self.load_rows(stage),
            // A cache: a folder we may not write (a read-only mount for
            // `serve`) costs the next load its speed, never its answer.
            |t, entries| drop(crate::snapshot::write(&snap, t, stage, entries)),
        )
    }

    fn snapshot_later(&self, stage: &str) -> Result<Option<crate::snapshot::Later>, StoreError> {
        Ok(self
            .token(MANIFEST_TOKEN_SQL, stage)?
            .map(|token| crate::snapshot::Later {
                path: crate::snapshot::path_for(&self.path, stage),
                token,
                stage: stage.to_string(),
            }))
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        {
            let mut del = tx
                .prepare_cached("DELETE FROM entries WHERE stage = ?1 AND kind = ?2 AND item = ?3")
                .map_err(err)?;
            let mut del_deps = tx
                .prepare_cached("DELETE FROM item_deps WHERE stage = ?1 AND item = ?2")
                .map_err(err)?;
            for (stage, kind, item) in &batch.deletes {
                del.execute(params![stage, kind.as_str(), item])
                    .map_err(err)?;
                if *kind == EntryKind::Item {
                    del_deps.execute(params![stage, item]).map_err(err)?;
                }
            }
            let mut put_set = tx
                .prepare_cached("INSERT OR IGNORE INTO dep_sets(id, body) VALUES(?1, ?2)")
                .map_err(err)?;
            for (id, body) in &batch.dep_sets {
                put_set.execute(params![id, body]).map_err(err)?;
            }
            let mut put_deps = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO item_deps(stage, item, set_id) VALUES(?1, ?2, ?3)",
                )
                .map_err(err)?;
            for (stage, item, set) in &batch.deps {
                match set {
                    Some(id) => put_deps.execute(params![stage, item, id]),
                    None => del_deps.execute(params![stage, item]),
                }
                .map_err(err)?;
            }
            let mut up = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO entries(stage, kind, item, digest, size, mtime_ns,
                        ctime_ns, ino, dev, observed_at_ns, recipe, output, status, error,
                        processed_at_ns, duration_ms)
                     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                )
                .map_err(err)?;
            for (stage, e) in &batch.upserts {
                // Our own invariants, checked before they are written.
                assert!(!e.item.is_empty(), "empty item name in stage {stage}");
                assert!(e.status == Status::Failed || e.error.is_none());
                up.execute(params![
                    stage,
                    e.kind.as_str(),
                    e.item,
                    e.digest.as_ref().map(|d| d.to_string()),
                    e.stat.size as i64,
                    e.stat.mtime_ns,
                    e.stat.ctime_ns,
                    e.stat.ino as i64,
                    e.stat.dev as i64,
                    e.observed_at_ns,
                    e.recipe,
                    e.output,
                    e.status.as_str(),
                    e.error,
                    e.processed_at_ns,
                    e.duration_ms as i64,
                ])
                .map_err(err)?;
            }
            for (stage, dirs) in &batch.dirs {
                tx.execute("DELETE FROM output_dirs WHERE stage = ?1", [stage])
                    .map_err(err)?;
                let mut ins = tx
                    .prepare_cached(
                        "INSERT INTO output_dirs(stage, dir, mtime_ns, ctime_ns, ino, observed_at_ns)
                         VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
                    )
                    .map_err(err)?;
                for d in dirs {
                    ins.execute(params![
                        stage,
                        d.dir,
                        d.mtime_ns,
                        d.ctime_ns,
                        d.ino as i64,
                        d.observed_at_ns
                    ])
                    .map_err(err)?;
                }
            }
        }
        tx.commit().map_err(err)
    }

    fn begin_run(&mut self, stage: &str, started_at_ns: i64) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO runs(stage, started_at_ns) VALUES(?1, ?2)",
                params![stage, started_at_ns],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    fn finish_run(
        &mut self,
        run: i64,
        finished_at_ns: i64,
        summary: &serde_json::Value,
        exit_code: i32,
    ) -> Result<(), StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE runs SET finished_at_ns = ?2, summary = ?3, exit_code = ?4 WHERE id = ?1",
                params![run, finished_at_ns, summary.to_string(), exit_code],
            )
            .map_err(|e| self.err(e))?;
        assert_eq!(n, 1, "run {run} was begun by this store");
        // Dependency sets no item names any more. Here, where one process
        // holds the state (a shared PostgreSQL store prunes them under an
        // advisory lock: a concurrent commit may be about to name one).
        self.conn
            .execute(
                "DELETE FROM dep_sets WHERE id NOT IN (SELECT set_id FROM item_deps)",
                [],
            )
            .map_err(|e| self.err(e))?;
        // The plan after a run reads the snapshot the run leaves: a run
        // that changed the stage pays its reload here, not the next plan.
        // Only a cache: a failure here is met again, and reported, by the
        // next load.
        let stage: Option<String> = self
            .conn
            .query_row("SELECT stage FROM runs WHERE id = ?1", [run], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        if let Some(stage) = stage {
            let _ = self.refresh_snapshot(&stage);
        }
        Ok(())
    }

    fn last_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.runs_where("WHERE id IN (SELECT max(id) FROM runs GROUP BY stage) ORDER BY stage")
    }

    fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.runs_where("WHERE finished_at_ns IS NULL ORDER BY id DESC")
    }

    fn export(&self) -> Result<Vec<(String, Entry)>, StoreError> {
        self.select("", &[])
    }

    fn schema_version(&self) -> Result<u32, StoreError> {
        self.current_version()
    }

    fn bookmark(&self, source: &str) -> Result<Option<Bookmark>, StoreError> {
        self.conn
            .query_row(
                "SELECT last_end_us, horizon FROM bookmarks WHERE source = ?1",
                [source],
                |r| {
                    Ok(Bookmark {
                        source: source.to_string(),
                        last_end_us: r.get(0)?,
                        horizon: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    fn windows(&self, source: &str) -> Result<Vec<WindowRecord>, StoreError> {
        self.load_windows(source, false)
    }

    /// From the source's heads snapshot when it is at the source's window
    /// token, else from the rows, leaving a snapshot at that token for the
    /// next read; token and rows read in one transaction, as in `load`.
    fn window_heads(&self, source: &str) -> Result<Vec<WindowRecord>, StoreError> {
        let snap = crate::heads::path_for(&self.path, source);
        self.through_cache(
            WINDOW_TOKEN_SQL,
            source,
            |t| crate::heads::read(&snap, t, source),
            || self.load_windows(source, true),
            |t, heads| drop(crate::heads::write(&snap, t, source, heads)),
        )
    }

    fn commit_window(
        &mut self,
        record: &WindowRecord,
        advance: Option<(Option<i64>, &Bookmark)>,
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        assert!(record.end_us > record.start_us, "window bounds are ours");
        self.fenced(fence, |tx| {
            if let Some((expected, new)) = advance {
                assert_eq!(new.source, record.source);
                let changed = match expected {
                    Some(prev) => tx.execute(
                        "UPDATE bookmarks SET last_end_us = ?2, horizon = ?3
                         WHERE source = ?1 AND last_end_us = ?4",
                        params![new.source, new.last_end_us, new.horizon, prev],
                    )?,
                    None => tx.execute(
                        "INSERT INTO bookmarks(source, last_end_us, horizon) VALUES(?1, ?2, ?3)
                         ON CONFLICT(source) DO NOTHING",
                        params![new.source, new.last_end_us, new.horizon],
                    )?,
                };
                if changed != 1 {
                    return Ok(WindowCommit::BookmarkMoved);
                }
            }
            put_window(tx, record)?;
            Ok(WindowCommit::Done)
        })
    }

    fn commit_windows(
        &mut self,
        records: &[WindowRecord],
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        self.fenced(fence, |tx| {
            for r in records {
                assert!(r.end_us > r.start_us, "window bounds are ours");
                put_window(tx, r)?;
            }
            Ok(WindowCommit::Done)
        })
    }

    fn advance_horizon(
        &mut self,
        source: &str,
        expected_end: i64,
        horizon: i64,
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        self.fenced(fence, |tx| {
            let n = tx.execute(
                "UPDATE bookmarks SET horizon = ?3 WHERE source = ?1 AND last_end_us = ?2",
                params![source, expected_end, horizon],
            )?;
            Ok(if n == 1 {
                WindowCommit::Done
            } else {
                WindowCommit::BookmarkMoved
            })
        })
    }

    fn acquire_lease(
        &mut self,
        name: &str,
        owner: &str,
        host: &str,
        pid: i64,
        now_ns: i64,
        duration_ns: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        crate::lease::acquire(&mut self.conn, name, owner, host, pid, now_ns, duration_ns)
            .map_err(|e| self.err(e))
    }

    fn renew_lease(
        &mut self,
        fence: &Fence,
        now_ns: i64,
        duration_ns: i64,
    ) -> Result<bool, StoreError> {
        crate::lease::renew(&self.conn, fence, now_ns, duration_ns).map_err(|e| self.err(e))
    }

    fn release_lease(&mut self, fence: &Fence) -> Result<(), StoreError> {
        crate::lease::release(&self.conn, fence).map_err(|e| self.err(e))
    }

    fn lease(&self, name: &str) -> Result<Option<crate::Lease>, StoreError> {
        crate::lease::current(&self.conn, name).map_err(|e| self.err(e))
    }

    fn dump(&self) -> Result<crate::StateDump, StoreError> {
        let e = |e| self.err(e);
        let mut d = crate::StateDump {
            entries: self.export()?,
            runs: self.runs_where("ORDER BY id")?,
            ..Default::default()
        };
        let mut stmt = self
            .conn
            .prepare("SELECT stage, dir, mtime_ns, ctime_ns, ino, observed_at_ns FROM output_dirs ORDER BY stage, dir")
            .map_err(e)?;
        d.dirs = stmt
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    DirRecord {
                        dir: r.get(1)?,
                        mtime_ns: r.get(2)?,
                        ctime_ns: r.get(3)?,
                        ino: r.get::<_, i64>(4)? as u64,
                        observed_at_ns: r.get(5)?,
                    },
                ))
            })
            .map_err(e)?
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let mut stmt = self
            .conn
            .prepare("SELECT source FROM bookmarks UNION SELECT source FROM windows ORDER BY 1")
            .map_err(e)?;
        let sources: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .map_err(e)?
            .collect::<Result<_, _>>()
            .map_err(e)?;
        for src in sources {
            d.bookmarks.extend(self.bookmark(&src)?);
            d.windows.extend(self.windows(&src)?);
        }
        let mut stmt = self
            .conn
            .prepare("SELECT stage, item, set_id FROM item_deps ORDER BY stage, item")
            .map_err(e)?;
        d.deps = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(e)?
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let mut stmt = self
            .conn
            .prepare("SELECT id, body FROM dep_sets ORDER BY id")
            .map_err(e)?;
        d.dep_sets = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(e)?
            .collect::<Result<_, _>>()
            .map_err(e)?;
        Ok(d)
    }

    fn leases(&self, prefix: &str) -> Result<Vec<crate::Lease>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name FROM leases WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name")
            .map_err(|e| self.err(e))?;
        let names = stmt
            .query_map([prefix], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for n in names {
            out.extend(crate::lease::current(&self.conn, &n).map_err(|e| self.err(e))?);
        }
        Ok(out)
    }
}

/// Puts the database file in write-ahead-log mode, waiting up to `wait`
/// for other connections.
///
/// Switching a file from a rollback journal to WAL takes an exclusive lock
/// that SQLite asks for inside the pragma's own read transaction, where the
/// busy handler is not called: a second process opening the same file at
/// that moment gets "database is locked" at once, whatever `busy_timeout`
/// says. A file already in WAL is left alone (no lock asked); otherwise the
/// switch is retried until `wait` has passed.
pub fn ensure_wal(conn: &Connection, wait: std::time::Duration) -> rusqlite::Result<()> {
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let mode = conn.pragma_query_value(None, "journal_mode", |r| r.get::<_, String>(0));
        let r = match mode {
            Ok(m) if m.eq_ignore_ascii_case("wal") => Ok(()),
            // The mode the pragma answers is not checked: in-memory files
            // keep their own, and there is nothing to wait for.
            Ok(_) => conn.pragma_update(None, "journal_mode", "WAL"),
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => return Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && started.elapsed() < wait =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

fn put_window(tx: &rusqlite::Transaction<'_>, record: &WindowRecord) -> rusqlite::Result<usize> {
    let head = serde_json::json!({
        "digest": record.extra.get("digest"),
        "path": record.extra.get("path"),
        "compacted": record.extra.get("compacted"),
    });
    tx.execute(
        "INSERT OR REPLACE INTO windows(source, start_us, end_us, status, rows, files,
            duration_ms, token, recipe, updated_at_ns, error, extra, head)
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params![
            record.source,
            record.start_us,
            record.end_us,
            record.status.as_str(),
            record.rows,
            record.files.to_string(),
            record.duration_ms,
            record.token,
            record.recipe,
            record.updated_at_ns,
            record.error,
            record.extra.to_string(),
            head.to_string(),
        ],
    )
}

impl SqliteStore {
    /// Runs `body` in a write transaction if the fence still holds, and
    /// commits only when it says `Done`; any other outcome (or an error)
    /// rolls back. `Fenced` when the lease was taken over.
    fn fenced(
        &mut self,
        fence: &Fence,
        body: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<WindowCommit>,
    ) -> Result<WindowCommit, StoreError> {
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let Some(tx) = self.fenced_transaction(fence)? else {
            return Ok(WindowCommit::Fenced);
        };
        let outcome = body(&tx).map_err(err)?;
        if outcome == WindowCommit::Done {
            tx.commit().map_err(err)?;
        }
        Ok(outcome)
    }

    /// A write transaction, if the fence still holds (`None` otherwise).
    fn fenced_transaction(
        &mut self,
        fence: &Fence,
    ) -> Result<Option<rusqlite::Transaction<'_>>, StoreError> {
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let held: Option<i64> = tx
            .query_row(
                "SELECT token FROM leases WHERE name = ?1",
                [&fence.name],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)?;
        Ok((held == Some(fence.token)).then_some(tx))
    }

    fn runs_where(&self, clause: &str) -> Result<Vec<RunRecord>, StoreError> {
        let sql = format!(
            "SELECT id, stage, started_at_ns, finished_at_ns, summary, exit_code FROM runs {clause}"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| {
                let summary: String = r.get(4)?;
                Ok(RunRecord {
                    id: r.get(0)?,
                    stage: r.get(1)?,
                    started_at_ns: r.get(2)?,
                    finished_at_ns: r.get(3)?,
                    summary: serde_json::from_str(&summary).unwrap_or(serde_json::Value::Null),
                    exit_code: r.get(5)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh rollback-journal files opened by several connections at once,
    /// each switching to WAL while the others read: every switch succeeds.
    /// A lone `PRAGMA journal_mode = WAL` gets "database is locked" at once
    /// when another connection holds the reserved lock for the same switch
    /// (SQLite calls no busy handler where waiting could deadlock): what
    /// made two processes opening a fresh OSM store fail.
    #[test]
    fn switching_to_wal_at_once_from_many_connections_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..20 {
            let path = dir.path().join(format!("s{round}.db"));
            Connection::open(&path)
                .unwrap()
                .execute_batch(
                    "PRAGMA journal_mode = DELETE; CREATE TABLE t(x); INSERT INTO t VALUES (1);",
                )
                .unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
            let threads: Vec<_> = (0..6)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let c = Connection::open(&path).unwrap();
                        c.busy_timeout(std::time::Duration::from_secs(30)).unwrap();
                        barrier.wait();
                        ensure_wal(&c, std::time::Duration::from_secs(30))?;
                        c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                    })
                })
                .collect();
            for t in threads {
                assert_eq!(t.join().unwrap().unwrap(), 1, "round {round}");
            }
            let mode: String = Connection::open(&path)
                .unwrap()
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
        }
    }

    fn entry(item: &str) -> Entry {
        Entry {
            kind: EntryKind::Item,
            item: item.to_string(),
            digest: Digest::parse(&format!("b3:{}", "0f".repeat(32))),
            stat: Stat {
                size: 3,
                mtime_ns: 10,
                ctime_ns: 11,
                ino: u64::MAX,
                dev: 7,
            },
            observed_at_ns: 99,
            recipe: "r1:ab".into(),
            output: format!("out/{item}"),
            status: Status::Ok,
            error: None,
            processed_at_ns: 100,
            duration_ms: 5,
        }
    }

    /// Issue 24: dependency sets are stored once, named by items, removed
    /// with their items, and pruned when no item names them.
    #[test]
    fn dependency_sets_are_shared_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        let mut b = Batch::default();
        for item in ["a", "b", "c"] {
            b.upserts.push(("st".into(), entry(item)));
            let set = if item == "c" { "set2" } else { "set1" };
            b.deps.push(("st".into(), item.into(), Some(set.into())));
        }
        b.dep_sets.push(("set1".into(), "[1]".into()));
        b.dep_sets.push(("set2".into(), "[2]".into()));
        s.commit(&b).unwrap();
        let l = s.load("st").unwrap();
        let linked: Vec<(&str, &str, &str)> = l
            .item_deps()
            .map(|(e, (id, body))| (e.item.as_str(), id.as_str(), body.as_str()))
            .collect();
        assert_eq!(
            linked,
            vec![
                ("a", "set1", "[1]"),
                ("b", "set1", "[1]"),
                ("c", "set2", "[2]")
            ]
        );
        assert_eq!(l.dep_sets.len(), 2, "each set is loaded once");
        // c goes with its entry; b's set is cleared; set2 is then unnamed.
        s.commit(&Batch {
            deletes: vec![("st".into(), EntryKind::Item, "c".into())],
            deps: vec![("st".into(), "b".into(), None)],
            ..Batch::default()
        })
        .unwrap();
        let run = s.begin_run("st", 1).unwrap();
        s.finish_run(run, 2, &serde_json::json!({}), 0).unwrap();
        let l = s.load("st").unwrap();
        let linked: Vec<&str> = l.item_deps().map(|(e, _)| e.item.as_str()).collect();
        assert_eq!(linked, vec!["a"]);
        assert_eq!(
            s.dump().unwrap().dep_sets,
            vec![("set1".into(), "[1]".into())]
        );
    }

    /// Issue 22: a load sizes its lists by the last run's `discovered`, a
    /// hint only. Whatever the last run's summary says (nothing, too few,
    /// too many, not a number, not JSON), the load is the same.
    #[test]
    fn a_loads_size_hint_never_changes_what_it_loads() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        let mut b = Batch::default();
        for item in ["a", "b", "c"] {
            b.upserts.push(("st".into(), entry(item)));
            let mut m = entry(&format!("m{item}"));
            m.kind = EntryKind::Member;
            b.upserts.push(("st".into(), m));
        }
        s.commit(&b).unwrap();
        let loaded = s.load("st").unwrap();
        assert_eq!((loaded.items.len(), loaded.members.len()), (3, 3));
        // StageEntries has no equality of its own; its Debug shows it all.
        let want = format!("{loaded:?}");
        let summaries = [
            Some(serde_json::json!({"discovered": 0})),
            Some(serde_json::json!({"discovered": 1})),
            Some(serde_json::json!({"discovered": 6})),
            Some(serde_json::json!({"discovered": 1_000_000_000_000_i64})),
            Some(serde_json::json!({"discovered": -5})),
            Some(serde_json::json!({"discovered": "many"})),
            Some(serde_json::json!({"discovered": 2.5})),
            Some(serde_json::json!([1, 2])),
            None, // begun, never finished: the summary is '{}'
        ];
        for summary in summaries {
            let run = s.begin_run("st", 1).unwrap();
            if let Some(summary) = &summary {
                s.finish_run(run, 2, summary, 0).unwrap();
            }
            let got = format!("{:?}", s.load("st").unwrap());
            assert_eq!(got, want, "after summary {summary:?}");
        }
        // Not JSON at all (written by hand, or by something else).
        s.conn
            .execute(
                "UPDATE runs SET summary = 'not json {' WHERE stage = 'st'",
                [],
            )
            .unwrap();
        assert_eq!(format!("{:?}", s.load("st").unwrap()), want);
    }

    #[test]
    fn round_trips_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        assert_eq!(s.schema_version().unwrap(), SCHEMA_VERSION);
        let batch = Batch {
            upserts: vec![("st".into(), entry("a")), ("st".into(), entry("b"))],
            ..Batch::default()
        };
        s.commit(&batch).unwrap();
        let got = s.load("st").unwrap();
        assert_eq!(got.items["a"], entry("a"));
        s.commit(&Batch {
            deletes: vec![("st".into(), EntryKind::Item, "a".into())],
            ..Batch::default()
        })
        .unwrap();
        let got = s.load("st").unwrap();
        assert_eq!(got.items.keys().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn migrates_forward_keeping_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let s = SqliteStore::open_at(&path, 1).unwrap();
            assert_eq!(s.schema_version().unwrap(), 1);
            s.conn
                .execute(
                    "INSERT INTO entries VALUES('st','item','a','b3:0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f',3,10,11,-1,7,99,'r1:ab','out/a','ok',NULL,100)",
                    [],
                )
                .unwrap();
        }
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.schema_version().unwrap(), SCHEMA_VERSION);
        let mut want = entry("a");
        want.duration_ms = 0;
        assert_eq!(s.load("st").unwrap().items["a"], want);
    }

    fn window(start: i64, status: WindowStatus) -> WindowRecord {
        WindowRecord {
            source: "orders".into(),
            start_us: start,
            end_us: start + 10,
            status,
            rows: 3,
            files: serde_json::json!([]),
            duration_ms: 1,
            token: "t".into(),
            recipe: "r".into(),
            updated_at_ns: 0,
            error: None,
            extra: serde_json::json!({}),
        }
    }

    /// The fence of `owner`'s fresh lease on source `orders` (free).
    fn fence_of(s: &mut SqliteStore, owner: &str) -> Fence {
        let LeaseOutcome::Acquired(lease) =
            s.acquire_lease("orders", owner, "h", 1, 0, 100).unwrap()
        else {
            panic!("free lease")
        };
        Fence {
            name: "orders".into(),
            token: lease.token,
        }
    }

    /// Issue 49: a plan reads each window's head; after a migration from
    /// a store whose windows have no head column, and after every write,
    /// the heads say what the whole records say.
    #[test]
    fn window_heads_agree_with_whole_records_before_and_after_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let extras = [
            serde_json::json!({"digest": "rd1:3:ab", "path": "raw/a", "schema": [{"name": "id"}],
                               "recipe_parts": {"kind": "Sqlite"}}),
            serde_json::json!({"digest": "rd1:4:cd", "compacted": {"path": "raw/p", "token": "x"}}),
            serde_json::json!({}),
            // Other types than strings read as absent, in both.
            serde_json::json!({"digest": 5, "path": {"x": "y"}, "compacted": {"path": ["p"]}}),
            serde_json::json!({"digest": "d\"q\u{e9}", "path": null, "compacted": 7}),
            serde_json::json!({"digest": [1, {"a": null}], "path": true, "compacted": null}),
        ];
        {
            let s = SqliteStore::open_at(&path, 7).unwrap();
            for (i, extra) in extras.iter().enumerate() {
                s.conn
                    .execute(
                        "INSERT INTO windows(source, start_us, end_us, status, rows, files,
                            duration_ms, token, recipe, updated_at_ns, error, extra)
                         VALUES('orders', ?1, ?2, 'published', 3, '[{\"path\":\"part-0.parquet\"}]',
                                1, 't', 'r', 0, NULL, ?3)",
                        params![i as i64 * 10, i as i64 * 10 + 10, extra.to_string()],
                    )
                    .unwrap();
            }
        }
        let mut s = SqliteStore::open(&path).unwrap();
        let check = |s: &SqliteStore| {
            let whole = s.windows("orders").unwrap();
            // Read from the rows, then from the snapshot the first left.
            let heads = s.window_heads("orders").unwrap();
            assert!(crate::heads::path_for(&s.path, "orders").is_file());
            assert_eq!(s.window_heads("orders").unwrap(), heads, "the snapshot");
            assert_eq!(whole.len(), heads.len());
            for (w, h) in whole.iter().zip(&heads) {
                assert_eq!(
                    (w.start_us, w.end_us, w.status, &w.token),
                    (h.start_us, h.end_us, h.status, &h.token)
                );
                for key in ["digest", "path"] {
                    assert_eq!(
                        w.extra[key].as_str(),
                        h.extra[key].as_str(),
                        "{key} of window {}",
                        w.start_us
                    );
                }
                assert_eq!(
                    w.extra["compacted"]["path"].as_str(),
                    h.extra["compacted"]["path"].as_str()
                );
                assert!(h.extra.get("schema").is_none());
            }
        };
        check(&s);
        let mut w = window(100, WindowStatus::Published);
        w.extra = serde_json::json!({"digest": "rd1:9:ef", "path": "raw/b", "schema": []});
        let fence = fence_of(&mut s, "a");
        assert_eq!(
            s.commit_window(&w, None, &fence).unwrap(),
            WindowCommit::Done
        );
        check(&s);
        assert_eq!(s.window_heads("orders").unwrap().len(), 7);
        // Any writer's change renews the token: never a stale snapshot.
        s.conn
            .execute(
                "UPDATE windows SET status = 'failed', error = 'late' WHERE start_us = 0",
                [],
            )
            .unwrap();
        check(&s);
        assert_eq!(
            s.window_heads("orders").unwrap()[0].status,
            WindowStatus::Failed
        );
        s.conn
            .execute("DELETE FROM windows WHERE start_us = 10", [])
            .unwrap();
        check(&s);
        assert_eq!(s.window_heads("orders").unwrap().len(), 6);
    }

    #[test]
    fn bookmarks_move_by_compare_and_set_under_a_fence() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        let fa = fence_of(&mut s, "a");
        let b10 = Bookmark {
            source: "orders".into(),
            last_end_us: 10,
            horizon: None,
        };
        let w0 = window(0, WindowStatus::Published);
        assert_eq!(
            s.commit_window(&w0, Some((None, &b10)), &fa).unwrap(),
            WindowCommit::Done
        );
        // A second first-advance, or an advance from a stale value, fails.
        assert_eq!(
            s.commit_window(&w0, Some((None, &b10)), &fa).unwrap(),
            WindowCommit::BookmarkMoved
        );
        let b20 = Bookmark {
            last_end_us: 20,
            ..b10.clone()
        };
        assert_eq!(
            s.commit_window(
                &window(10, WindowStatus::Published),
                Some((Some(0), &b20)),
                &fa
            )
            .unwrap(),
            WindowCommit::BookmarkMoved
        );
        assert_eq!(s.bookmark("orders").unwrap().unwrap().last_end_us, 10);
        // Another owner waits while the lease lives, then takes it over.
        assert!(matches!(
            s.acquire_lease("orders", "b", "h", 2, 50, 100).unwrap(),
            LeaseOutcome::Held(_)
        ));
        let LeaseOutcome::Acquired(b) = s.acquire_lease("orders", "b", "h", 2, 150, 100).unwrap()
        else {
            panic!("expired lease")
        };
        assert!(b.token > fa.token);
        // The old owner is fenced: it can neither publish nor advance.
        assert_eq!(
            s.commit_window(
                &window(10, WindowStatus::Published),
                Some((Some(10), &b20)),
                &fa
            )
            .unwrap(),
            WindowCommit::Fenced
        );
        assert!(!s.renew_lease(&fa, 160, 100).unwrap());
        let fb = Fence {
            name: "orders".into(),
            token: b.token,
        };
        assert_eq!(
            s.commit_window(
                &window(10, WindowStatus::Published),
                Some((Some(10), &b20)),
                &fb
            )
            .unwrap(),
            WindowCommit::Done
        );
        assert_eq!(s.windows("orders").unwrap().len(), 2);
        s.release_lease(&fb).unwrap();
        let LeaseOutcome::Acquired(c) = s.acquire_lease("orders", "c", "h", 3, 170, 100).unwrap()
        else {
            panic!("released lease")
        };
        assert!(c.token > b.token, "tokens never go back");
    }

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let s = SqliteStore::open(&path).unwrap();
        s.conn
            .execute(
                "UPDATE meta SET value = '999' WHERE key = 'schema_version'",
                [],
            )
            .unwrap();
        drop(s);
        assert!(matches!(
            SqliteStore::open(&path),
            Err(StoreError::TooNew { found: 999, .. })
        ));
    }
}
