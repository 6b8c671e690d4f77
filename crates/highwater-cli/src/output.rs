//! Human and JSON output, and progress on stderr.

use highwater_core::plan::StagePlan;
use highwater_files::engine::{AdoptReport, RunReport, StageReport};
use highwater_files::{Progress, VerifyItem, VerifyOutcome};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::io::{self, IsTerminal, Write};
use std::sync::Mutex;

fn reasons_line(counts: impl Iterator<Item = (String, usize)>) -> String {
    counts
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The seed's summary: `discovered 900, 4 changed (896 unchanged, 0 new)`.
fn summary(
    discovered: usize,
    changed: usize,
    unchanged: usize,
    new: usize,
    deleted: usize,
) -> String {
    let mut s =
        format!("discovered {discovered}, {changed} changed ({unchanged} unchanged, {new} new)");
    if deleted > 0 {
        s.push_str(&format!(", {deleted} deleted"));
    }
    s
}

pub fn plan(out: &mut impl Write, plans: &[StagePlan], as_json: bool) -> io::Result<()> {
    if as_json {
        let stages: Vec<_> = plans
            .iter()
            .map(|p| {
                json!({
                    "name": p.stage,
                    "total": p.total,
                    "unchanged": p.unchanged,
                    "counts": p.counts().iter().map(|(r, n)| (r.as_str(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
                    "changed": p.changed.iter().map(|c| {
                        let mut v = json!({
                            "input": c.item, "reason": c.reason, "output": c.output,
                        });
                        if let Some(d) = &c.dependency {
                            v["dependency"] = json!(d);
                        }
                        if let Some(d) = p.details.get(&c.item) {
                            v["detail"] = json!(d);
                        }
                        v
                    }).collect::<Vec<_>>(),
                    "held": p.held,
                    "notes": p.notes,
                    // Unchanged although their bytes changed: compared as
                    // data, only the layout did (issue 49).
                    "layout": p.layout.iter().map(|i| json!({"input": i, "reason": "layout"})).collect::<Vec<_>>(),
                })
            })
            .collect();
        return writeln!(out, "{}", json!({ "stages": stages }));
    }
    for p in plans {
        let deleted = p.count(highwater_core::Reason::Deleted);
        writeln!(
            out,
            "{}: {}",
            p.stage,
            summary(
                p.total,
                p.changed.len() - deleted,
                p.unchanged,
                p.count(highwater_core::Reason::New),
                deleted
            )
        )?;
        for n in &p.notes {
            writeln!(out, "  note: {n}")?;
        }
        if !p.held.is_empty() {
            writeln!(out, "  held {} of {}", p.held.len(), p.total)?;
        }
        for c in &p.changed {
            match c.dependency.as_ref().or(p.details.get(&c.item)) {
                Some(d) => writeln!(out, "  {:<8} {} ({d})", c.reason.as_str(), c.item)?,
                None => writeln!(out, "  {:<8} {}", c.reason.as_str(), c.item)?,
            }
        }
        held_lines(out, &p.held)?;
        if !p.changed.is_empty() {
            writeln!(
                out,
                "  reasons: {}",
                reasons_line(
                    p.counts()
                        .into_iter()
                        .map(|(r, n)| (r.as_str().to_string(), n))
                )
            )?;
            // Per changed dependency, how many items it re-runs (issue 24).
            let mut by_dep: std::collections::BTreeMap<&str, usize> = Default::default();
            for d in p.changed.iter().filter_map(|c| c.dependency.as_deref()) {
                *by_dep.entry(d).or_insert(0) += 1;
            }
            for (d, n) in by_dep {
                writeln!(out, "  dependency {d}: {n}")?;
            }
        }
        // Inputs whose bytes changed and whose data did not (issue 49),
        // with the number of items each leaves unchanged.
        let mut by_input: std::collections::BTreeMap<&str, usize> = Default::default();
        for i in &p.layout {
            *by_input.entry(i.as_str()).or_insert(0) += 1;
        }
        for (i, n) in by_input {
            writeln!(out, "  layout {i}: {n}")?;
        }
    }
    Ok(())
}

/// Items held back (issue 49), one line each.
fn held_lines(out: &mut impl Write, held: &[highwater_core::plan::Held]) -> io::Result<()> {
    for h in held {
        let what = if h.waiting { "waiting" } else { "held" };
        writeln!(out, "  {what:<8} {}: {}", h.item, h.why)?;
    }
    Ok(())
}

fn stage_lines(out: &mut impl Write, s: &StageReport) -> io::Result<()> {
    writeln!(
        out,
        "{}: {}",
        s.name,
        summary(s.discovered, s.changed, s.unchanged, s.new, s.deleted)
    )?;
    if !s.reasons.is_empty() {
        writeln!(
            out,
            "  reasons: {}",
            reasons_line(s.reasons.clone().into_iter())
        )?;
    }
    for i in &s.layout {
        writeln!(out, "  layout {i}: 1")?;
    }
    writeln!(
        out,
        "{}: {} processed, {} skipped, {} deleted, {} failed in {:.1}s",
        s.name,
        s.processed,
        s.unchanged,
        s.deleted,
        s.failed.len(),
        s.duration_ms as f64 / 1000.0
    )?;
    for f in &s.failed {
        writeln!(
            out,
            "  failed {}: {}",
            f.input,
            f.error.replace('\n', "\n    ")
        )?;
    }
    if let Some(b) = &s.blocked {
        writeln!(out, "  {b}")?;
    }
    held_lines(out, &s.held)?;
    Ok(())
}

pub fn run(out: &mut impl Write, r: &RunReport, as_json: bool) -> io::Result<()> {
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::to_string(r).map_err(io::Error::other)?
        );
    }
    for s in &r.stages {
        stage_lines(out, s)?;
    }
    Ok(())
}

pub fn adopt(out: &mut impl Write, r: &AdoptReport, as_json: bool) -> io::Result<()> {
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::to_string(r).map_err(io::Error::other)?
        );
    }
    for s in &r.stages {
        writeln!(
            out,
            "{}: adopted {}, refused {}",
            s.name,
            s.adopted,
            s.refused.len()
        )?;
        for c in &s.refused {
            writeln!(
                out,
                "  refused {}: output {} is missing; `highwater run` will make it",
                c.input, c.output
            )?;
        }
    }
    Ok(())
}

/// Prints verify results; returns how many items differ or failed.
pub fn verify(out: &mut impl Write, items: &[VerifyItem], as_json: bool) -> io::Result<usize> {
    let bad = items
        .iter()
        .filter(|i| i.outcome != VerifyOutcome::Same)
        .count();
    if as_json {
        writeln!(
            out,
            "{}",
            json!({"checked": items.len(), "differ": bad, "items": items})
        )?;
        return Ok(bad);
    }
    for i in items {
        match &i.outcome {
            VerifyOutcome::Same => {}
            VerifyOutcome::Differs { first_difference_at } => writeln!(
                out,
                "{}: {} -> {} differs from a fresh run at byte {first_difference_at}: the transform is not deterministic or the recipe misses a dependency",
                i.stage, i.input, i.output
            )?,
            VerifyOutcome::Failed { error } => {
                writeln!(out, "{}: {} could not be re-made: {error}", i.stage, i.input)?
            }
        }
    }
    writeln!(
        out,
        "verified {} items: {} same, {} differ",
        items.len(),
        items.len() - bad,
        bad
    )?;
    Ok(bad)
}

pub fn status(out: &mut impl Write, v: &serde_json::Value, as_json: bool) -> io::Result<()> {
    if as_json {
        return writeln!(out, "{v}");
    }
    for s in v["sources"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "source {}: bookmark {}; {} windows published, {} failed, {} running (see `highwater windows {}`)",
            s["name"].as_str().unwrap_or("?"),
            s["bookmark"].as_str().unwrap_or("(none)"),
            s["published"],
            s["failed"],
            s["running"],
            s["name"].as_str().unwrap_or("?"),
        )?;
    }
    for s in v["stages"].as_array().into_iter().flatten() {
        let last = match &s["last_run"] {
            serde_json::Value::Null => "never run".to_string(),
            r => format!(
                "last run {} (exit {}), {}",
                r["started_at"].as_str().unwrap_or("?"),
                r["exit_code"],
                r["summary"]
            ),
        };
        // A stage another program declared (a Python pipeline, issue 22).
        let declared = match s["declared_in"].as_str() {
            None | Some("highwater.toml") => String::new(),
            Some(d) => format!(" (declared in {d})"),
        };
        writeln!(
            out,
            "{}{declared}: {} entries, {} failed; recipe {}; {}",
            s["name"].as_str().unwrap_or("?"),
            s["entries"],
            s["failed"].as_array().map_or(0, Vec::len),
            s["recipe"].as_str().unwrap_or("?"),
            last
        )?;
        for f in s["failed"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "  failed {}: {}",
                f["input"].as_str().unwrap_or("?"),
                f["error"].as_str().unwrap_or("")
            )?;
        }
    }
    if let Some(f) = v.get("fleet") {
        writeln!(out, "fleet (shared state):")?;
        for p in f["processes"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "  {} {} pid {} on {}: {}, heartbeat {} ms ago; claimed {}, done {}, took over {}, fenced {}, holding {}",
                p["state"].as_str().unwrap_or("?"),
                p["command"].as_str().unwrap_or("?"),
                p["pid"],
                p["host"].as_str().unwrap_or("?"),
                p["owner"].as_str().unwrap_or("?"),
                p["heartbeat_age_ms"],
                p["claimed"],
                p["done"],
                p["takeovers"],
                p["fenced"],
                p["holding"],
            )?;
        }
        for l in f["leases"].as_array().into_iter().flatten() {
            if l["live"] == true {
                writeln!(
                    out,
                    "  lease {} held by {} (token {}) until {}",
                    l["name"].as_str().unwrap_or("?"),
                    l["owner"].as_str().unwrap_or("?"),
                    l["token"],
                    l["expires_at"].as_str().unwrap_or("?"),
                )?;
            }
        }
        for (name, q) in f["queues"].as_object().into_iter().flatten() {
            writeln!(
                out,
                "  queue {name}: {} todo, {} claimed, {} expired, {} done",
                q["todo"], q["claimed"], q["expired"], q["done"]
            )?;
        }
    }
    Ok(())
}

/// A progress bar on a terminal, plain lines on stderr otherwise.
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
    tty: bool,
}

impl Bars {
    pub fn new() -> Bars {
        Bars {
            bar: Mutex::new(None),
            tty: io::stderr().is_terminal(),
        }
    }
}

impl Progress for Bars {
    fn stage_start(&self, stage: &str, items: usize) {
        if !self.tty {
            eprintln!("{stage}: processing {items} items");
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(items as u64), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed} eta {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(stage.to_string());
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn item_done(&self, _stage: &str, _item: &str, _ok: bool) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            b.inc(1);
        }
    }

    fn stage_done(&self, stage: &str) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            b.finish_and_clear();
        } else if !self.tty {
            eprintln!("{stage}: done");
        }
    }
}

pub fn ingest(
    out: &mut impl Write,
    r: &highwater_ingest::IngestReport,
    as_json: bool,
) -> io::Result<()> {
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::to_string(r).map_err(io::Error::other)?
        );
    }
    writeln!(
        out,
        "{}: bookmark {} -> {}",
        r.source,
        r.bookmark_before.as_deref().unwrap_or("(none)"),
        r.bookmark_after.as_deref().unwrap_or("(none)")
    )?;
    if r.windows.is_empty() {
        writeln!(out, "  no window to run")?;
    }
    for w in &r.windows {
        match &w.error {
            None => writeln!(
                out,
                "  {:<9} [{}, {}) {} rows in {:.1}s -> {}",
                w.status,
                w.start,
                w.end,
                w.rows,
                w.duration_ms as f64 / 1000.0,
                w.path
            )?,
            Some(e) => writeln!(out, "  {:<9} [{}, {}): {e}", w.status, w.start, w.end)?,
        }
        for warn in &w.warnings {
            writeln!(out, "    warning: {warn}")?;
        }
    }
    for l in &r.loads {
        match &l.error {
            None => writeln!(
                out,
                "  {:<9} [{}, {}) {} rows into {} (replaced {}) in {:.1}s",
                l.status,
                l.start,
                l.end,
                l.rows,
                l.table,
                l.replaced_rows,
                l.duration_ms as f64 / 1000.0
            )?,
            Some(e) => writeln!(
                out,
                "  load {:<4} [{}, {}) into {}: {e}",
                l.status, l.start, l.end, l.table
            )?,
        }
    }
    for warn in &r.warnings {
        writeln!(out, "  warning: {warn}")?;
    }
    Ok(())
}

/// The completion grid: one line per UTC day, one cell per window.
pub fn grid(
    out: &mut impl Write,
    source: &str,
    view: &highwater_ingest::engine::GridView,
    interval_us: i64,
    as_json: bool,
) -> io::Result<()> {
    let rows = &view.rows;
    let bookmark = view.bookmark.as_ref();
    if as_json {
        return writeln!(
            out,
            "{}",
            json!({
                "source": source,
                "bookmark": bookmark.map(|b| highwater_core::window::format_rfc3339(b.last_end_us)),
                "windows": rows,
                "layout": view.layout,
            })
        );
    }
    writeln!(
        out,
        "{source}: bookmark {}; interval {}; # published, C published in a compacted period, S stale (another recipe), F failed, R running, . missing",
        bookmark.map_or("(none)".to_string(), |b| {
            highwater_core::window::format_rfc3339(b.last_end_us)
        }),
        highwater_core::window::format_duration(interval_us)
    )?;
    // With a warehouse load, its state is a column of its own beside the
    // windows: L loaded, F failed, - published and not loaded yet.
    let with_load = rows.iter().any(|r| r.load.is_some());
    if with_load {
        writeln!(
            out,
            "load column: L loaded into the warehouse, F load failed, - not loaded yet"
        )?;
    }
    let mut day = String::new();
    let mut line = String::new();
    let mut load_line = String::new();
    let end_day = |out: &mut dyn Write, day: &str, line: &str, load_line: &str| {
        if with_load {
            writeln!(out, "{day} {line}  load {load_line}")
        } else {
            writeln!(out, "{day} {line}")
        }
    };
    for r in rows {
        let d = &r.start[..10];
        if d != day {
            if !line.is_empty() {
                end_day(out, &day, &line, &load_line)?;
            }
            day = d.to_string();
            line.clear();
            load_line.clear();
        }
        load_line.push(match r.load.as_ref().map(|l| l.status) {
            Some("loaded") => 'L',
            Some("failed") => 'F',
            Some(_) => '-',
            None => ' ',
        });
        line.push(match r.status {
            "published" if r.compacted.is_some() => 'C',
            "published" => '#',
            "failed" => 'F',
            "running" => 'R',
            "stale" => 'S',
            _ => '.',
        });
    }
    if !line.is_empty() {
        end_day(out, &day, &line, &load_line)?;
    }
    for r in rows
        .iter()
        .rev()
        .take(5)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        let chunks = r.chunks.as_ref().map_or(String::new(), |c| {
            let total: usize = c.values().sum();
            let parts: Vec<String> = c.iter().map(|(k, v)| format!("{v} {k}")).collect();
            format!("  chunks {total}: {}", parts.join(", "))
        });
        let load = r.load.as_ref().map_or(String::new(), |l| match &l.error {
            Some(e) => format!("  load {}: {e}", l.status),
            None => format!("  load {}", l.status),
        });
        writeln!(
            out,
            "  {} {:<9} rows {:>8}  prior-days median {:>10}  duration {}  files {}{chunks}{load}",
            r.start,
            r.status,
            r.rows.map_or("-".into(), |n| n.to_string()),
            r.prior_rows_median
                .map_or("-".into(), |m| format!("{m:.0}")),
            r.duration_share_of_interval
                .map_or("-".into(), |s| format!("{:.1}% of interval", s * 100.0)),
            match (&r.compacted, r.files) {
                (Some(p), _) => format!("in {p}"),
                (None, Some(n)) => n.to_string(),
                (None, None) => "-".into(),
            }
        )?;
    }
    // Windows shown missing although a record says published: say why.
    let notes: Vec<&highwater_ingest::GridRow> = rows.iter().filter(|r| r.note.is_some()).collect();
    for r in notes.iter().take(10) {
        writeln!(
            out,
            "  {} missing: {}",
            r.start,
            r.note.as_deref().unwrap_or("")
        )?;
    }
    if notes.len() > 10 {
        writeln!(
            out,
            "  ... and {} more missing windows like these",
            notes.len() - 10
        )?;
    }
    let l = &view.layout;
    if let (Some(f), Some(b)) = (l.files_per_window_median, l.file_bytes_median) {
        writeln!(
            out,
            "files per window: median {f:.0}, median file {:.1} MB",
            b as f64 / (1u64 << 20) as f64
        )?;
    }
    for p in &l.compacted_periods {
        writeln!(
            out,
            "compacted {} .. {}: {} files, {:.1} MB in {}",
            p.start,
            p.end,
            p.files,
            p.bytes as f64 / (1u64 << 20) as f64,
            p.path
        )?;
    }
    if let Some(a) = &l.advice {
        writeln!(out, "advice: {a}")?;
    }
    Ok(())
}

pub fn compact(
    out: &mut impl Write,
    r: &highwater_ingest::CompactReport,
    as_json: bool,
) -> io::Result<()> {
    if as_json {
        return writeln!(out, "{}", json!(r));
    }
    if r.periods.is_empty() {
        return writeln!(out, "{}: no closed period in range", r.source);
    }
    for p in &r.periods {
        writeln!(
            out,
            "{} {} .. {} {:<9} windows {} rows {} files {} -> {} ({:.1} -> {:.1} MB) {} ms{}",
            r.source,
            p.start,
            p.end,
            p.status,
            p.windows,
            p.rows,
            p.files_before,
            p.files_after,
            p.bytes_before as f64 / (1u64 << 20) as f64,
            p.bytes_after as f64 / (1u64 << 20) as f64,
            p.duration_ms,
            p.reason
                .as_deref()
                .map_or(String::new(), |x| format!(": {x}"))
        )?;
    }
    Ok(())
}

pub fn osm_apply(
    out: &mut impl Write,
    r: &highwater_osm::ops::ApplyReport,
    as_json: bool,
) -> io::Result<()> {
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::to_string(r).map_err(io::Error::other)?
        );
    }
    writeln!(
        out,
        "{} {} diffs{}; {} tiles affected",
        if r.dry_run {
            "derived (dry run, nothing applied) from"
        } else {
            "applied"
        },
        r.diffs,
        r.sequence
            .map_or(String::new(), |s| format!(", now at sequence {s}")),
        r.tiles.len()
    )?;
    for d in &r.datasets {
        writeln!(
            out,
            "  {}: {} tiles; {} changes, {} ({:.0}%) touched only keys the layer never reads{}",
            d.name,
            d.tiles,
            d.changes,
            d.filtered,
            if d.changes == 0 {
                0.0
            } else {
                d.filtered as f64 * 100.0 / d.changes as f64
            },
            d.zoomed_out_to.map_or(String::new(), |z| format!(
                "; too many tiles: zoomed out to z{z} (tiles_affected_max)"
            ))
        )?;
    }
    Ok(())
}

/// What a dataset's drain, rebuild or verify did: its line, or its JSON
/// (`{KEY: ..., "elapsed_ms": N}`; a verify's without the time). A
/// warning goes to stderr.
pub fn outcome(
    out: &mut impl Write,
    o: &highwater_osm::dataset::Outcome,
    as_json: bool,
) -> io::Result<()> {
    if let Some(w) = &o.warning {
        eprintln!("warning: {w}");
    }
    if as_json {
        if o.key == "verify" {
            return writeln!(out, "{}", serde_json::json!({"verify": o.json}));
        }
        return timed_json(out, o.key, o.json.clone(), o.took);
    }
    writeln!(out, "{}", o.text)
}

/// A dataset whose drain failed; `what` names its dirty set ("dirty
/// tiles", "dirty keys").
pub fn drain_failed(
    out: &mut impl Write,
    dataset: &str,
    what: &str,
    error: &str,
    as_json: bool,
) -> io::Result<()> {
    eprintln!("error: {dataset}: {error}; its {what} stay for the next drain");
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::json!({"drain": {"dataset": dataset, "error": error}})
        );
    }
    Ok(())
}

pub fn aggregates(
    out: &mut impl Write,
    rows: &[highwater_osm::aggregates::Row],
    as_json: bool,
) -> io::Result<()> {
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::to_string(rows).map_err(io::Error::other)?
        );
    }
    for r in rows {
        writeln!(
            out,
            "{}{}\t{}\tadmin_level {}\t{}\tcount {}\tlength {:.3} m\tarea {:.2} m2",
            r.area_osm_type,
            r.area_osm_id,
            r.area_name.as_deref().unwrap_or("(no name)"),
            r.admin_level,
            r.class,
            r.count,
            r.length_m,
            r.area_m2
        )?;
    }
    Ok(())
}

pub fn search_hits(
    out: &mut impl Write,
    hits: &[highwater_osm::search::Doc],
    as_json: bool,
) -> io::Result<()> {
    if as_json {
        return writeln!(
            out,
            "{}",
            serde_json::to_string(hits).map_err(io::Error::other)?
        );
    }
    for h in hits {
        let admin: Vec<&str> = h.admin.values().flatten().map(String::as_str).collect();
        writeln!(
            out,
            "{}{}\t{}\t{}\t{}\t{}",
            h.osm_type,
            h.osm_id,
            h.name,
            h.street.as_deref().unwrap_or("-"),
            h.place.as_deref().unwrap_or("-"),
            admin.join(", ")
        )?;
    }
    Ok(())
}

/// One JSON line for a dataset report: `{"<kind>": report, "elapsed_ms": N}`.
fn timed_json(
    out: &mut impl Write,
    kind: &str,
    report: serde_json::Value,
    took: std::time::Duration,
) -> io::Result<()> {
    let mut v = serde_json::Map::new();
    v.insert(kind.to_string(), report);
    v.insert("elapsed_ms".into(), (took.as_millis() as u64).into());
    writeln!(out, "{}", serde_json::Value::Object(v))
}

/// `highwater deps`: each item's observed dependencies, changed ones marked.
pub fn deps(
    out: &mut impl Write,
    items: &[highwater_files::engine::ItemDeps],
    only_changed: bool,
    as_json: bool,
) -> io::Result<()> {
    let keep = |d: &&highwater_files::engine::DepRow| !only_changed || d.changed;
    if as_json {
        let v: Vec<_> = items
            .iter()
            .map(|i| {
                json!({
                    "stage": i.stage, "item": i.item,
                    "deps": i.deps.iter().filter(keep).collect::<Vec<_>>(),
                })
            })
            .collect();
        return writeln!(out, "{}", json!({ "items": v }));
    }
    for i in items {
        writeln!(out, "{}: {}", i.stage, i.item)?;
        for d in i.deps.iter().filter(keep) {
            let mark = match (&d.recorded_on, d.changed) {
                (Some(h), _) => format!("  (recorded on {h}, checked by a plan there)"),
                (None, true) => "  (changed)".to_string(),
                (None, false) => String::new(),
            };
            writeln!(out, "  {:<7} {}{mark}", d.kind, d.path)?;
        }
    }
    Ok(())
}

/// `deps --summary` (issue 47): the stage's distinct dependencies, each
/// with how many items read it and how many of those see it changed, most
/// read first. A stage of 5,000 Python items prints its few hundred files
/// instead of 415,000 lines.
pub fn deps_summary(
    out: &mut impl Write,
    stage: &str,
    items: &[highwater_files::engine::ItemDeps],
    only_changed: bool,
    as_json: bool,
) -> io::Result<()> {
    let mut by: std::collections::BTreeMap<(&str, &str), (u64, u64)> = Default::default();
    for i in items {
        for d in &i.deps {
            let e = by.entry((d.path.as_str(), d.kind)).or_default();
            e.0 += 1;
            e.1 += u64::from(d.changed);
        }
    }
    let mut rows: Vec<_> = by
        .into_iter()
        .filter(|(_, (_, changed))| !only_changed || *changed > 0)
        .collect();
    rows.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    if as_json {
        let deps: Vec<_> = rows
            .iter()
            .map(|((path, kind), (n, changed))| {
                json!({"path": path, "kind": kind, "items": n, "changed_items": changed})
            })
            .collect();
        return writeln!(
            out,
            "{}",
            json!({"stage": stage, "items": items.len(), "deps": deps})
        );
    }
    writeln!(
        out,
        "{stage}: {} items, {} distinct dependencies",
        items.len(),
        rows.len()
    )?;
    for ((path, kind), (n, changed)) in rows {
        let mark = if changed > 0 {
            format!("  (changed for {changed})")
        } else {
            String::new()
        };
        writeln!(out, "  {n:>6}  {kind:<7} {path}{mark}")?;
    }
    Ok(())
}
