//! `[sources.NAME]` tables into [`SourceSpec`]. Unknown keys are errors.

use crate::error::IngestError;
use highwater_core::window::{format_compact, parse_duration, parse_rfc3339, Grid, Window};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Postgres,
    Sqlite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A timestamp cursor, read with a lookback; consumers dedupe on the key.
    UpdatedAt,
    /// A monotonic id for append-only tables: a window takes the ids that
    /// arrived since the previous window, recorded so a re-run reads the same.
    AppendId,
    /// PostgreSQL only: windows by the timestamp cursor, completeness by
    /// transaction evidence. No lookback is needed.
    CommitOrder,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::UpdatedAt => "updated_at",
            Mode::AppendId => "append_id",
            Mode::CommitOrder => "commit_order",
        }
    }
}

/// How a source's windows land (`format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A folder per window with its `_manifest.json` (the default).
    #[default]
    Parquet,
    /// One Delta Lake table at `output`, a commit per window (see
    /// [`crate::delta`]).
    Delta,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Fail,
    Warn,
    Off,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    pub compare_days: u32,
    pub max_deviation: f64,
    #[serde(default = "warn")]
    pub on_fail: Policy,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Duration {
    pub warn_share_of_interval: f64,
}

fn warn() -> Policy {
    Policy::Warn
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checks {
    #[serde(default = "fail")]
    pub unique_key: Policy,
    #[serde(default = "warn")]
    pub continuity: Policy,
    pub volume: Option<Volume>,
    pub duration: Option<Duration>,
    /// Keys that appear in this window and in the one before it. With a
    /// lookback some are expected (rows updated near the boundary are read
    /// twice); off by default, since it reads the previous window's keys
    /// (8 bytes of memory per row of that window).
    #[serde(default = "off")]
    pub adjacent_duplicates: Policy,
    /// A window whose columns differ from the previous published window's
    /// in a way that does not widen (see [`crate::sink::widens`]): a
    /// reader of the output would see one column with two types.
    #[serde(default = "fail")]
    pub schema: Policy,
}

fn off() -> Policy {
    Policy::Off
}

fn fail() -> Policy {
    Policy::Fail
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            unique_key: Policy::Fail,
            continuity: Policy::Warn,
            volume: None,
            duration: Some(Duration {
                warn_share_of_interval: 0.5,
            }),
            adjacent_duplicates: Policy::Off,
            schema: Policy::Fail,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    kind: Kind,
    url_env: Option<String>,
    path: Option<String>,
    table: Option<String>,
    query: Option<String>,
    key: Vec<String>,
    mode: Mode,
    cursor: String,
    interval: String,
    start: String,
    lookback: Option<String>,
    settle: Option<String>,
    output: String,
    checks: Option<Checks>,
    batch_rows: Option<usize>,
    file_rows_max: Option<usize>,
    lease_duration_s: Option<u64>,
    catch_up_windows_max: Option<usize>,
    chunk_by: Option<String>,
    chunk_rows: Option<usize>,
    compact: Option<RawCompact>,
    version_retention_s: Option<u64>,
    load: Option<crate::load::RawLoad>,
    format: Option<Format>,
    checkpoint_every_commits: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompact {
    into: String,
    target_file_mb: Option<u64>,
}

/// `chunk_by`: a window's extraction split into key ranges.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunking {
    /// An indexed integer column of the table.
    pub by: String,
    /// The target rows per chunk.
    pub rows: usize,
}

/// `[sources.NAME.compact]`: published windows rolled up into periods.
#[derive(Clone, Debug, PartialEq)]
pub struct Compaction {
    /// The period's length, a whole number of intervals.
    pub into_us: i64,
    /// Files of a compacted period roll over near this size.
    pub target_file_bytes: u64,
}

/// What a window reads from.
#[derive(Clone, Debug, PartialEq)]
pub enum Relation {
    /// A table name, optionally schema-qualified (`public.orders`); each
    /// part is quoted as an identifier.
    Table(String),
    /// A query, used as a subquery. It is the user's own SQL; window bounds
    /// are always bound parameters.
    Query(String),
}

/// A validated source.
#[derive(Clone, Debug)]
pub struct SourceSpec {
    pub name: String,
    pub kind: Kind,
    pub url_env: Option<String>,
    pub path: Option<PathBuf>,
    pub relation: Relation,
    pub key: Vec<String>,
    pub mode: Mode,
    pub cursor: String,
    pub grid: Grid,
    pub lookback_us: i64,
    pub settle_us: i64,
    pub output: String,
    /// The object store windows are published to (`output = "NAME:..."`),
    /// if not local; `output` is then the key template without it.
    pub output_place: Option<String>,
    /// In object storage: how long a superseded version of a window stays
    /// readable (a reader may hold the old manifest) before it is deleted.
    pub version_retention_s: u64,
    pub checks: Checks,
    /// Rows per Parquet record batch: bounds memory per worker, whatever
    /// the window's size.
    pub batch_rows: usize,
    /// Rows per Parquet file before the next part starts: bounds file size.
    pub file_rows_max: usize,
    /// How long a lease lives without a heartbeat: bounds how long a dead
    /// run blocks the source.
    pub lease_duration_s: u64,
    /// Windows one run takes on after an outage: bounds the load a catch-up
    /// puts on a source that may still be fragile.
    pub catch_up_windows_max: usize,
    pub chunking: Option<Chunking>,
    pub compaction: Option<Compaction>,
    /// `[sources.NAME.load]`: each published window loaded into a
    /// warehouse table.
    pub load: Option<crate::load::LoadSpec>,
    /// `parquet` (a folder per window) or `delta` (one table).
    pub format: Format,
    /// `format = "delta"`: a Parquet checkpoint of the table's log every
    /// this many commits (Delta's own default, 10), so that readers
    /// replay at most that many JSON commits.
    pub checkpoint_every_commits: u64,
}

/// Rows per chunk unless `chunk_rows` says otherwise.
pub const CHUNK_ROWS_DEFAULT: usize = 1_000_000;

/// The smallest `chunk_rows`: below it a chunk costs more in connections
/// and records than it saves.
pub const CHUNK_ROWS_MIN: usize = 1_000;

/// Quotes an SQL identifier (`a.b` as two parts). Nothing from the config is
/// ever spliced into SQL unquoted.
pub fn quote_ident(name: &str) -> String {
    name.split('.')
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// Quotes one column name (a dot is part of the name here).
pub fn quote_column(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl SourceSpec {
    pub fn parse(
        name: &str,
        value: &toml::Value,
        config_path: &Path,
        root: &Path,
    ) -> Result<SourceSpec, IngestError> {
        let bad = |message: String| IngestError::Config {
            path: config_path.to_path_buf(),
            name: name.to_string(),
            message,
        };
        let raw: Raw = value
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.message().to_string()))?;
        let relation = match (raw.table, raw.query) {
            (Some(t), None) if !t.is_empty() => Relation::Table(t),
            (None, Some(q)) if !q.trim().is_empty() => Relation::Query(q),
            _ => return Err(bad("give exactly one of `table` and `query`".into())),
        };
        match raw.kind {
            Kind::Postgres if raw.url_env.is_none() => {
                return Err(bad(
                    "`url_env` names the variable that holds the connection string".into(),
                ))
            }
            Kind::Sqlite if raw.path.is_none() && raw.url_env.is_none() => {
                return Err(bad("give `path` (the SQLite file) or `url_env`".into()))
            }
            _ => {}
        }
        if raw.mode == Mode::CommitOrder && raw.kind != Kind::Postgres {
            return Err(bad("mode `commit_order` needs PostgreSQL's transaction ids; use `updated_at` with a lookback".into()));
        }
        if raw.mode == Mode::CommitOrder && !matches!(relation, Relation::Table(_)) {
            return Err(bad("mode `commit_order` reads each row's transaction id (xmin), which only a `table` has; use `table`".into()));
        }
        if raw.key.is_empty() {
            return Err(bad("`key` lists the columns that identify a row".into()));
        }
        let dur = |field: &str, v: &str| -> Result<i64, IngestError> {
            parse_duration(v).map_err(|e| bad(format!("{field}: {e}")))
        };
        let interval_us = dur("interval", &raw.interval)?;
        if interval_us <= 0 {
            return Err(bad("interval must be positive".into()));
        }
        let start_us = parse_rfc3339(&raw.start).map_err(|e| bad(format!("start: {e}")))?;
        let lookback_us = raw
            .lookback
            .as_deref()
            .map(|v| dur("lookback", v))
            .transpose()?
            .unwrap_or(0);
        let settle_us = raw
            .settle
            .as_deref()
            .map(|v| dur("settle", v))
            .transpose()?
            .unwrap_or(0);
        let grid = Grid::new(start_us, interval_us);
        let chunking = match (raw.chunk_by, raw.chunk_rows) {
            (None, None) => None,
            (None, Some(_)) => return Err(bad(
                "`chunk_rows` needs `chunk_by`, the indexed integer column to cut the key space on"
                    .into(),
            )),
            (Some(by), rows) => {
                if raw.kind != Kind::Postgres || !matches!(relation, Relation::Table(_)) {
                    return Err(bad("`chunk_by` needs a PostgreSQL `table`: chunk boundaries come from the table's statistics and a sample of its pages, and the chunks share one exported snapshot".into()));
                }
                let rows = rows.unwrap_or(CHUNK_ROWS_DEFAULT);
                if rows < CHUNK_ROWS_MIN {
                    return Err(bad(format!(
                        "`chunk_rows` is {rows}; give at least {CHUNK_ROWS_MIN}"
                    )));
                }
                Some(Chunking { by, rows })
            }
        };
        let compaction = match raw.compact {
            None => None,
            Some(c) => {
                let into_us = dur("compact.into", &c.into)?;
                if into_us <= interval_us || into_us % interval_us != 0 {
                    return Err(bad(format!(
                        "compact.into `{}` must be a whole number of intervals, more than one",
                        c.into
                    )));
                }
                let mb = c.target_file_mb.unwrap_or(128);
                if mb == 0 {
                    return Err(bad("compact.target_file_mb must be at least 1".into()));
                }
                Some(Compaction {
                    into_us,
                    target_file_bytes: mb << 20,
                })
            }
        };
        let (output_place, output) = match raw.output.split_once(':') {
            Some((p, rest)) if !p.is_empty() && !p.contains('/') => {
                // A Delta table in a bucket compacts (one commit of remove +
                // add); Parquet folder versions would need a folder swap.
                if compaction.is_some() && raw.format.unwrap_or_default() != Format::Delta {
                    return Err(bad(format!(
                        "output `{}` is in object storage `{p}`, where compaction of Parquet folder versions is not available (it swaps folders); remove [sources.{name}.compact], publish to a local folder, or land a `format = \"delta\"` table (which compacts in a bucket)",
                        raw.output
                    )));
                }
                (Some(p.to_string()), rest.to_string())
            }
            _ => (None, raw.output.clone()),
        };
        let load = raw
            .load
            .map(|l| crate::load::LoadSpec::parse(l, name))
            .transpose()
            .map_err(bad)?;
        if load.is_some() && compaction.is_some() {
            // A re-landed window inside a compacted period lives in the
            // period's files, mixed with its neighbours: not loaded yet.
            return Err(bad(format!("[sources.{name}.load] and [sources.{name}.compact] together are not supported yet (a failed load of a compacted window would have to be read back out of its period's files); remove one")));
        }
        let spec = SourceSpec {
            name: name.to_string(),
            kind: raw.kind,
            url_env: raw.url_env,
            path: raw.path.map(|p| root.join(p)),
            relation,
            key: raw.key,
            mode: raw.mode,
            cursor: raw.cursor,
            grid,
            lookback_us,
            settle_us,
            output,
            output_place,
            version_retention_s: raw.version_retention_s.unwrap_or(3600),
            checks: raw.checks.unwrap_or_default(),
            batch_rows: raw.batch_rows.unwrap_or(65_536).clamp(1, 1 << 22),
            file_rows_max: raw.file_rows_max.unwrap_or(4_000_000).max(1),
            lease_duration_s: raw.lease_duration_s.unwrap_or(60).max(1),
            catch_up_windows_max: raw.catch_up_windows_max.unwrap_or(720).max(1),
            chunking,
            compaction,
            load,
            format: raw.format.unwrap_or_default(),
            checkpoint_every_commits: raw.checkpoint_every_commits.unwrap_or(10).max(1),
        };
        if spec.format == Format::Delta {
            // The table's root: windows are commits in it, not folders.
            if spec.output.contains('{') {
                return Err(bad(format!(
                    "output `{}` has placeholders, but with format = \"delta\" it is the table's root (each window is a commit in that one table); remove the placeholders",
                    spec.output
                )));
            }
            if spec.output.trim_matches('/').is_empty() || spec.output.split('/').any(|c| c == "..")
            {
                return Err(bad(format!(
                    "output `{}` must name the table's folder, without `..`",
                    spec.output
                )));
            }
            return Ok(spec);
        }
        // The output path must be a pure function of the window, distinct
        // for distinct windows, and stay where it was put.
        if spec.output.split('/').any(|c| c == "..") {
            return Err(bad(format!(
                "output `{}` must not contain `..`",
                spec.output
            )));
        }
        let a = spec.window_path(&grid.window(0)).map_err(bad)?;
        for k in [1, 24, 24 * 7, 24 * 366] {
            if spec.window_path(&grid.window(k)).map_err(bad)? == a {
                return Err(bad(format!(
                    "output `{}` gives two windows the same path; add placeholders ({{date}} {{hour}} {{minute}} {{start}} {{end}})",
                    spec.output
                )));
            }
        }
        if spec.compaction.is_some() {
            // Periods are swapped as one folder: every period must have one
            // that holds its windows and nothing else.
            for p in [0, 1, 2, 30, 365] {
                spec.period_dir(p).map_err(bad)?;
            }
        }
        Ok(spec)
    }

    /// The columns whose values are (nearly) all distinct: the key and the
    /// cursor. Parquet writes them without a dictionary.
    pub fn plain_columns(&self) -> Vec<String> {
        let mut c = self.key.clone();
        c.push(self.cursor.clone());
        c
    }

    /// Windows per compaction period.
    pub fn windows_per_period(&self) -> i64 {
        let c = self
            .compaction
            .as_ref()
            .expect("only asked with compaction");
        c.into_us / self.grid.interval_us
    }

    /// The period (by index) that window `k` lies in.
    pub fn period_of(&self, k: i64) -> i64 {
        k.div_euclid(self.windows_per_period())
    }

    /// The window indices of period `p`.
    pub fn period_windows(&self, p: i64) -> std::ops::Range<i64> {
        let n = self.windows_per_period();
        p * n..(p + 1) * n
    }

    /// The folder that holds period `p`'s windows and nothing else: the
    /// deepest folder common to their paths. Compaction swaps it whole,
    /// so a reader sees the windows or the compacted period, never both.
    pub fn period_dir(&self, p: i64) -> Result<String, String> {
        let ks = self.period_windows(p);
        let paths: Vec<String> = ks
            .clone()
            .map(|k| self.window_path(&self.grid.window(k)))
            .collect::<Result<_, _>>()?;
        let split: Vec<Vec<&str>> = paths.iter().map(|p| p.split('/').collect()).collect();
        let mut common: Vec<&str> = split[0].clone();
        for s in &split[1..] {
            let n = common.iter().zip(s).take_while(|(a, b)| a == b).count();
            common.truncate(n);
        }
        let shared = common.join("/");
        let refuse = || {
            format!(
                "compact.into needs each period's windows in a folder of their own, and output `{}` does not give that (period starting {} would share `{shared}`); put the period first, e.g. `raw/orders/{{date}}/{{hour}}` for hourly windows compacted into days",
                self.output,
                highwater_core::window::format_rfc3339(self.grid.window(ks.start).start_us)
            )
        };
        if common.is_empty() || split.iter().any(|s| s.len() <= common.len()) {
            return Err(refuse());
        }
        for k in [ks.start - 1, ks.end] {
            if k < 0 {
                continue;
            }
            let other = self.window_path(&self.grid.window(k))?;
            if other == shared || other.starts_with(&format!("{shared}/")) {
                return Err(refuse());
            }
        }
        Ok(shared)
    }

    /// The folder every window of this source lands under (relative to
    /// the config folder, or a key prefix in `output_place`): a Delta
    /// table's root, or a Parquet template's fixed part up to its first
    /// placeholder. Two sources, or a source and a file stage, must not
    /// share one (issue 46): the second one's re-lands and vacuums would
    /// remove the first one's files.
    pub fn output_root(&self) -> String {
        let fixed = match self.format {
            Format::Delta => self.output.as_str(),
            Format::Parquet => match self.output.find('{') {
                Some(i) => self.output[..i].rsplit_once('/').map_or("", |(d, _)| d),
                None => self.output.as_str(),
            },
        };
        fixed.trim_end_matches('/').to_string()
    }

    /// The window's output path (relative to the config folder), a pure
    /// function of the window.
    pub fn window_path(&self, w: &Window) -> Result<String, String> {
        if self.format == Format::Delta {
            // The folder of the window's attempts inside the table.
            return Ok(format!(
                "{}/data/{}",
                self.output.trim_end_matches('/'),
                format_compact(w.start_us)
            ));
        }
        let c = highwater_core::window::civil(w.start_us);
        let mut out = String::new();
        let mut rest = self.output.as_str();
        while let Some(i) = rest.find('{') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let j = after
                .find('}')
                .ok_or_else(|| format!("output `{}` has an unclosed `{{`", self.output))?;
            match &after[..j] {
                "date" => out.push_str(&format!("{:04}-{:02}-{:02}", c.year, c.month, c.day)),
                "hour" => out.push_str(&format!("{:02}", c.hour)),
                "minute" => out.push_str(&format!("{:02}", c.minute)),
                "start" => out.push_str(&format_compact(w.start_us)),
                "end" => out.push_str(&format_compact(w.end_us)),
                other => {
                    return Err(format!(
                        "output uses unknown placeholder `{{{other}}}`; known: {{date}} {{hour}} {{minute}} {{start}} {{end}}"
                    ))
                }
            }
            rest = &after[j + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The recipe id: everything that shapes a window's files (never the
    /// connection string).
    pub fn recipe_id(&self) -> String {
        let parts = self.recipe_parts();
        format!(
            "r1:{}",
            &blake3::hash(parts.to_string().as_bytes()).to_hex()[..32]
        )
    }

    /// What the recipe id is made of, each part by name: recorded with
    /// every window, so a changed definition can be named part by part.
    pub fn recipe_parts(&self) -> serde_json::Value {
        let mut parts = serde_json::json!({
            "format": 1,
            "kind": format!("{:?}", self.kind),
            "relation": format!("{:?}", self.relation),
            "key": self.key,
            "mode": self.mode.as_str(),
            "cursor": self.cursor,
            "interval_us": self.grid.interval_us,
            "start_us": self.grid.start_us,
            "lookback_us": self.lookback_us,
            "output": self.output,
        });
        // Only when not the default, so that the recipes of Parquet
        // sources stay what they were.
        if self.format == Format::Delta {
            parts["table_format"] = serde_json::json!("delta");
        }
        parts
    }

    pub fn relation_sql(&self) -> String {
        match &self.relation {
            Relation::Table(t) => quote_ident(t),
            Relation::Query(q) => format!("({q})"),
        }
    }
}
