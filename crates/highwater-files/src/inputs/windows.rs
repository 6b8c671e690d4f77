//! A source's landed windows as a stage's items (issue 49):
//! `inputs = { source = "orders", by = "window" | "day" | "month" }`.
//!
//! An item is one window, or every window of one UTC day or month. Its
//! parts are its windows, each with the order-free digest of its rows that
//! ingestion recorded when it landed it, so a compaction, a re-land with
//! the same rows or another engine's OPTIMIZE changes no item, and a
//! re-land with changed rows changes exactly the items holding it.
//!
//! Which windows an item covers comes from the source's grid (its `start`
//! and `interval`), up to the newest landed window: an item runs only when
//! every one of them is published, passed its checks and is current. A
//! window missing before the newest one, failed, running or stale holds
//! it; windows after the newest one are not landed yet, and the item waits.
//!
//! The windows are read through [`Landed`], which the binary implements
//! over `highwater-ingest`: this crate names no ingestion type.

use super::{Discovered, Hold, ItemSource, Part, Providers};
use crate::error::FilesError;
use highwater_core::template::Vars;
use highwater_core::time::{civil_from_days, days_from_civil};
use highwater_core::window::{format_rfc3339, push_rfc3339};
use highwater_store::StateStore;
use std::collections::BTreeMap;
use std::sync::Arc;

const DAY_US: i64 = 86_400_000_000;
/// Windows named in a hold or a change, at most; the rest are counted.
const WINDOWS_NAMED_MAX: usize = 3;

/// How a stage groups a source's windows into items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Window,
    Day,
    Month,
}

impl By {
    pub fn as_str(self) -> &'static str {
        match self {
            By::Window => "window",
            By::Day => "day",
            By::Month => "month",
        }
    }
}

/// `inputs = { source = "NAME", by = "..." }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowsSpec {
    pub source: String,
    pub by: By,
}

impl WindowsSpec {
    pub(crate) fn parse(t: toml::Table) -> Result<WindowsSpec, String> {
        let mut source = None;
        let mut by = By::Window;
        for (k, v) in t {
            match (k.as_str(), v) {
                ("source", toml::Value::String(s)) if crate::config::name_ok(&s) => {
                    source = Some(s)
                }
                ("source", v) => {
                    return Err(format!(
                        "source = {v:?}: give the NAME of a [sources.NAME] table"
                    ))
                }
                ("by", toml::Value::String(s)) => {
                    by = match s.as_str() {
                        "window" => By::Window,
                        "day" => By::Day,
                        "month" => By::Month,
                        _ => {
                            return Err(format!(
                                "by = {s:?}: give \"window\" (the default), \"day\" or \"month\""
                            ))
                        }
                    }
                }
                (k, _) => {
                    return Err(format!(
                        "unknown key `{k}`; a source's windows take `source` and `by`"
                    ))
                }
            }
        }
        Ok(WindowsSpec {
            source: source.ok_or("a table of inputs needs `source = \"NAME\"`")?,
            by,
        })
    }
}

/// The grid of a source and where its files live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandedGrid {
    pub start_us: i64,
    pub interval_us: i64,
    /// The local folder under which its files live, relative to the
    /// config folder (`None`: in object storage).
    pub root: Option<String>,
}

/// Where one landed window stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// Published under the source's current recipe, checks passed: the
    /// digest of its rows.
    Ready { digest: String },
    /// Anything else, in words (`failed: ...`, `running`, `stale`, `gone`).
    NotReady(String),
}

/// One window a source has a record of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandedWindow {
    pub start_us: i64,
    pub end_us: i64,
    pub state: WindowState,
}

/// What a stage over windows asks of the landed windows: the narrow
/// interface between file stages and ingestion. The binary implements it
/// over `highwater-ingest`'s public API.
pub trait Landed: Send + Sync {
    /// The grid of source `source`; `Err`: no such source, or its table
    /// does not parse (the message says which and what to do).
    fn grid(&self, source: &str) -> Result<LandedGrid, String>;
    /// Every window `source` has a record of, by start, as its record in
    /// `store` (where the source's state is) says it stands; a published
    /// window's files are not looked for.
    fn windows(&self, source: &str, store: &dyn StateStore) -> Result<Vec<LandedWindow>, String>;
    /// Of the windows starting at `starts`, ready by the last `windows`,
    /// those whose files are gone from the output, with why.
    fn gone(&self, source: &str, starts: &[i64]) -> Result<Vec<(i64, String)>, String>;
    /// The current data files holding the rows of window `[start, end)`:
    /// local paths (absolute) or URLs, one per file.
    fn files(&self, source: &str, start_us: i64, end_us: i64) -> Result<Vec<String>, String>;
}

/// The item source.
pub(crate) struct Windows {
    stage: String,
    spec: WindowsSpec,
    grid: LandedGrid,
    landed: Arc<dyn Landed>,
}

impl Windows {
    pub(crate) fn open(
        stage: &str,
        spec: &WindowsSpec,
        providers: &Providers,
    ) -> Result<Windows, FilesError> {
        let bad = |message: String| FilesError::Inputs {
            stage: stage.to_string(),
            message,
        };
        let landed = providers.landed.clone().ok_or_else(|| {
            bad(format!(
                "its inputs are the windows of source `{}`, and this program reads no [sources] (open the pipeline through the highwater binary or the Python package)",
                spec.source
            ))
        })?;
        let grid = landed.grid(&spec.source).map_err(bad)?;
        if grid.interval_us <= 0 {
            return Err(bad(format!(
                "source `{}` has no window interval",
                spec.source
            )));
        }
        // A window that crosses midnight belongs to two days: refused,
        // rather than run with one of them.
        let aligned = DAY_US % grid.interval_us == 0 && grid.start_us % grid.interval_us == 0;
        if spec.by != By::Window && !aligned {
            return Err(bad(format!(
                "by = \"{}\" needs windows that never cross midnight UTC, and source `{}` has windows of {} s from {}; use by = \"window\", or an interval that divides a day from a start on its boundary",
                spec.by.as_str(),
                spec.source,
                grid.interval_us / 1_000_000,
                format_rfc3339(grid.start_us)
            )));
        }
        Ok(Windows {
            stage: stage.to_string(),
            spec: spec.clone(),
            grid,
            landed,
        })
    }

    /// The item `[start, end)` holding the window that starts at `w`.
    fn bucket(&self, w: i64, end: i64) -> (i64, i64) {
        match self.spec.by {
            By::Window => (w, end),
            By::Day => {
                let d = w.div_euclid(DAY_US) * DAY_US;
                (d, d + DAY_US)
            }
            By::Month => {
                let (y, m, _) = civil_from_days(w.div_euclid(DAY_US));
                let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (
                    days_from_civil(y, m, 1) * DAY_US,
                    days_from_civil(next.0, next.1, 1) * DAY_US,
                )
            }
        }
    }

    /// The grid's windows whose start lies in `[from, to)`.
    fn grid_windows(&self, from: i64, to: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
        let g = &self.grid;
        let first = (from - g.start_us).div_euclid(g.interval_us)
            + i64::from((from - g.start_us).rem_euclid(g.interval_us) != 0);
        let first = first.max(0);
        (first..)
            .map(move |k| {
                (
                    g.start_us + k * g.interval_us,
                    g.start_us + (k + 1) * g.interval_us,
                )
            })
            .take_while(move |(s, _)| *s < to)
    }

    /// The hold of an item some of whose windows are not ready.
    fn held(&self, problems: Vec<String>) -> Hold {
        Hold {
            why: format!(
                "held: window {} (of source `{}`); it runs once every window it covers is published and current",
                named(problems),
                self.spec.source
            ),
            waiting: false,
        }
    }

    fn key(&self, start_us: i64) -> String {
        let mut k = String::with_capacity(self.spec.source.len() + 21);
        k.push_str(&self.spec.source);
        k.push('@');
        push_rfc3339(&mut k, start_us);
        k
    }
}

/// A window's start as people read it: `2026-03-14T09` on the hour.
fn short(key: &str) -> &str {
    let t = key.split_once('@').map_or(key, |(_, t)| t);
    t.strip_suffix(":00:00Z").unwrap_or(t)
}

/// `first, second, third and 4 more`.
fn named(mut what: Vec<String>) -> String {
    let more = what.len().saturating_sub(WINDOWS_NAMED_MAX);
    what.truncate(WINDOWS_NAMED_MAX);
    let mut s = what.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

impl ItemSource for Windows {
    fn vars(&self) -> Vars {
        Vars::Windows
    }

    fn input_globs(&self) -> Vec<String> {
        match &self.grid.root {
            Some(r) if r.is_empty() || r == "." => Vec::new(),
            Some(r) => vec![format!("{r}/**")],
            None => Vec::new(),
        }
    }

    fn discover(&self, store: &dyn StateStore) -> Result<Vec<Discovered>, FilesError> {
        let mut records = self
            .landed
            .windows(&self.spec.source, store)
            .map_err(|message| FilesError::Inputs {
                stage: self.stage.clone(),
                message: format!("the windows of source `{}`: {message}", self.spec.source),
            })?;
        // The newest landed window: windows after it are not landed yet.
        let Some(frontier) = records.iter().map(|r| r.end_us).max() else {
            return Ok(Vec::new());
        };
        // Records come by start, and buckets rise: one cursor finds each,
        // and each window is in one bucket, so its digest is taken, not
        // copied.
        debug_assert!(records.windows(2).all(|w| w[0].start_us < w[1].start_us));
        let mut cursor = 0;
        let source = &self.spec.source;
        let mut out = Vec::new();
        let mut at = self.grid.start_us;
        while at < frontier {
            let (bs, be) = self.bucket(at, at + self.grid.interval_us);
            // `SOURCE/START/END`, whose END begins at `mid`.
            let mut item = String::with_capacity(source.len() + 42);
            item.push_str(source);
            item.push('/');
            push_rfc3339(&mut item, bs);
            let mid = item.len() + 1;
            item.push('/');
            push_rfc3339(&mut item, be);
            let mut parts = Vec::new();
            let mut problems = Vec::new();
            let mut waiting = Vec::new();
            for (ws, _) in self.grid_windows(bs, be) {
                let key = if ws == bs {
                    // The bucket's first window: its start is written.
                    let start = &item[source.len() + 1..mid - 1];
                    let mut k = String::with_capacity(source.len() + 1 + start.len());
                    k.push_str(source);
                    k.push('@');
                    k.push_str(start);
                    k
                } else {
                    self.key(ws)
                };
                while records.get(cursor).is_some_and(|r| r.start_us < ws) {
                    cursor += 1;
                }
                let record = records.get_mut(cursor).filter(|r| r.start_us == ws);
                match record.map(|r| &mut r.state) {
                    Some(WindowState::Ready { digest }) => parts.push(Part {
                        key,
                        digest: std::mem::take(digest),
                    }),
                    Some(WindowState::NotReady(why)) => {
                        problems.push(format!("{} {why}", short(&key)))
                    }
                    None if ws < frontier => problems.push(format!("{} missing", short(&key))),
                    None => waiting.push(short(&key).to_string()),
                }
            }
            let hold = if !problems.is_empty() {
                Some(self.held(problems))
            } else if !waiting.is_empty() {
                Some(Hold {
                    why: format!(
                        "waiting for {} window(s) of source `{}` not landed yet (from {})",
                        waiting.len(),
                        self.spec.source,
                        waiting[0]
                    ),
                    waiting: true,
                })
            } else {
                None
            };
            out.push(Discovered {
                relpath: item[source.len() + 1..].to_string(),
                item,
                parts,
                hold,
            });
            at = be.max(at + self.grid.interval_us);
            // The next bucket starts at the first grid window at or after it.
            if at > self.grid.start_us {
                let k = (at - self.grid.start_us + self.grid.interval_us - 1)
                    .div_euclid(self.grid.interval_us);
                at = self.grid.start_us + k * self.grid.interval_us;
            }
        }
        Ok(out)
    }

    /// A window recorded as published may have lost its files since (a
    /// hand's `rm`, a retention sweep): looked for here, for the items a
    /// plan would run, and never for up-to-date ones, whose outputs were
    /// made when the files were there. A no-change plan over 1,000 windows
    /// spent a third of its time on those lookups (issue 49).
    fn confirm(&self, items: &[&Discovered]) -> Result<Vec<Option<Hold>>, FilesError> {
        let start = |p: &Part| {
            let t = p.key.split_once('@').map_or(p.key.as_str(), |(_, t)| t);
            highwater_core::window::parse_rfc3339(t).ok()
        };
        let starts: Vec<i64> = items
            .iter()
            .flat_map(|d| d.parts.iter().filter_map(start))
            .collect();
        let gone: BTreeMap<i64, String> = self
            .landed
            .gone(&self.spec.source, &starts)
            .map_err(|message| FilesError::Inputs {
                stage: self.stage.clone(),
                message: format!("the windows of source `{}`: {message}", self.spec.source),
            })?
            .into_iter()
            .collect();
        Ok(items
            .iter()
            .map(|d| {
                let problems: Vec<String> = d
                    .parts
                    .iter()
                    .filter_map(|p| Some((p, gone.get(&start(p)?)?)))
                    .map(|(p, why)| format!("{} {why}", short(&p.key)))
                    .collect();
                (!problems.is_empty()).then(|| self.held(problems))
            })
            .collect())
    }

    fn files(&self, relpath: &str) -> Result<Vec<String>, String> {
        let bad = || format!("`{relpath}` is not a window item (START/END)");
        let (s, e) = relpath.split_once('/').ok_or_else(bad)?;
        let parse = |t| highwater_core::window::parse_rfc3339(t).map_err(|e| e.to_string());
        let (from, to) = (parse(s)?, parse(e)?);
        let mut out: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (ws, we) in self.grid_windows(from, to) {
            // A compacted period's files hold many windows: each once.
            for f in self.landed.files(&self.spec.source, ws, we)? {
                if seen.insert(f.clone()) {
                    out.push(f);
                }
            }
        }
        Ok(out)
    }

    fn explain(&self, recorded: &[Part], now: &[Part]) -> Option<String> {
        if let ([], [p]) = (recorded, now) {
            return Some(format!("re-landed {} (rows changed)", short(&p.key)));
        }
        let then: BTreeMap<&str, &str> = recorded
            .iter()
            .map(|p| (p.key.as_str(), p.digest.as_str()))
            .collect();
        let here: BTreeMap<&str, &str> = now
            .iter()
            .map(|p| (p.key.as_str(), p.digest.as_str()))
            .collect();
        let mut what = Vec::new();
        for (k, d) in &here {
            match then.get(k) {
                Some(old) if old != d => {
                    what.push(format!("re-landed {} (rows changed)", short(k)))
                }
                Some(_) => {}
                None => what.push(format!("window {} new", short(k))),
            }
        }
        for k in then.keys().filter(|k| !here.contains_key(*k)) {
            what.push(format!("window {} gone", short(k)));
        }
        (!what.is_empty()).then(|| named(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Landed windows held in memory, and the starts of those whose files
    /// are gone.
    struct Fake(Mutex<Vec<LandedWindow>>, Vec<i64>);

    impl Landed for Fake {
        fn grid(&self, _: &str) -> Result<LandedGrid, String> {
            Ok(LandedGrid {
                start_us: 0,
                interval_us: 3_600_000_000,
                root: Some("raw".into()),
            })
        }
        fn windows(&self, _: &str, _: &dyn StateStore) -> Result<Vec<LandedWindow>, String> {
            Ok(self.0.lock().unwrap().clone())
        }
        fn gone(&self, _: &str, starts: &[i64]) -> Result<Vec<(i64, String)>, String> {
            Ok(starts
                .iter()
                .filter(|s| self.1.contains(s))
                .map(|&s| (s, "gone from the output".to_string()))
                .collect())
        }
        fn files(&self, _: &str, s: i64, _: i64) -> Result<Vec<String>, String> {
            Ok(vec![format!("/raw/{s}.parquet")])
        }
    }

    /// A state store the fake does not read: the windows are in memory.
    fn store() -> highwater_store::sqlite::SqliteStore {
        highwater_store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap()
    }

    fn source(by: By, hours: i64, bad: &[(i64, &str)]) -> Windows {
        source_with_gone(by, hours, bad, &[])
    }

    fn source_with_gone(by: By, hours: i64, bad: &[(i64, &str)], gone: &[i64]) -> Windows {
        let ws = (0..hours)
            .filter_map(|h| {
                let state = match bad.iter().find(|(b, _)| *b == h) {
                    Some((_, "missing")) => return None,
                    Some((_, why)) => WindowState::NotReady(why.to_string()),
                    None => WindowState::Ready {
                        digest: format!("d{h}"),
                    },
                };
                Some(LandedWindow {
                    start_us: h * 3_600_000_000,
                    end_us: (h + 1) * 3_600_000_000,
                    state,
                })
            })
            .collect();
        let providers = Providers {
            landed: Some(Arc::new(Fake(
                Mutex::new(ws),
                gone.iter().map(|h| h * 3_600_000_000).collect(),
            ))),
        };
        Windows::open(
            "s",
            &WindowsSpec {
                source: "orders".into(),
                by,
            },
            &providers,
        )
        .unwrap()
    }

    #[test]
    fn days_cover_their_windows_and_hold_on_any_not_ready() {
        let items = source(By::Day, 48, &[(30, "failed: unique key")])
            .discover(&store())
            .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(
            items[0].item,
            "orders/1970-01-01T00:00:00Z/1970-01-02T00:00:00Z"
        );
        assert_eq!(items[0].parts.len(), 24);
        assert!(items[0].hold.is_none());
        let h = items[1].hold.as_ref().unwrap();
        assert!(
            !h.waiting && h.why.contains("1970-01-02T06 failed"),
            "{h:?}"
        );
    }

    #[test]
    fn confirm_holds_exactly_the_items_whose_files_are_gone() {
        let w = source_with_gone(By::Day, 72, &[], &[30, 31]);
        let items = w.discover(&store()).unwrap();
        assert!(items.iter().all(|d| d.hold.is_none()), "{items:?}");
        let holds = w.confirm(&items.iter().collect::<Vec<_>>()).unwrap();
        assert!(holds[0].is_none() && holds[2].is_none(), "{holds:?}");
        let h = holds[1].as_ref().unwrap();
        assert!(
            !h.waiting
                && h.why.contains("1970-01-02T06 gone from the output")
                && h.why.contains("1970-01-02T07 gone"),
            "{h:?}"
        );
        assert_eq!(w.confirm(&[]).unwrap(), Vec::<Option<Hold>>::new());
    }

    #[test]
    fn a_gap_holds_and_the_frontier_waits() {
        let items = source(By::Day, 30, &[(3, "missing")])
            .discover(&store())
            .unwrap();
        assert!(items[0].hold.as_ref().unwrap().why.contains("T03 missing"));
        let h = items[1].hold.as_ref().unwrap();
        assert!(h.waiting && h.why.contains("18 window(s)"), "{h:?}");
    }

    #[test]
    fn months_and_windows() {
        let items = source(By::Month, 24 * 40, &[]).discover(&store()).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].parts.len(), 31 * 24);
        let items = source(By::Window, 5, &[]).discover(&store()).unwrap();
        assert_eq!(items.len(), 5);
        assert_eq!(
            items[4].relpath,
            "1970-01-01T04:00:00Z/1970-01-01T05:00:00Z"
        );
    }

    #[test]
    fn explain_names_the_changed_window() {
        let w = source(By::Day, 24, &[]);
        let p = |h: i64, d: &str| Part {
            key: w.key(h * 3_600_000_000),
            digest: d.into(),
        };
        let s = w
            .explain(&[p(8, "a"), p(9, "b")], &[p(8, "a"), p(9, "c")])
            .unwrap();
        assert_eq!(s, "re-landed 1970-01-01T09 (rows changed)");
        assert_eq!(w.explain(&[p(8, "a")], &[p(8, "a")]), None);
        // An item of one part keeps no record: its one part changed.
        assert_eq!(
            w.explain(&[], &[p(9, "c")]).as_deref(),
            Some("re-landed 1970-01-01T09 (rows changed)")
        );
        let files = w
            .files("1970-01-01T00:00:00Z/1970-01-01T02:00:00Z")
            .unwrap();
        assert_eq!(files, ["/raw/0.parquet", "/raw/3600000000.parquet"]);
    }
}
