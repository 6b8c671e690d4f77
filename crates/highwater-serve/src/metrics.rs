//! The status document as Prometheus text exposition (version 0.0.4).
//!
//! Names follow the Prometheus naming guide: a `highwater_` prefix, base
//! units (seconds), `_total` for counters, `_timestamp_seconds` for points
//! in time. Labels are bounded by the config (stage, source, dataset names)
//! and by fixed sets (state, status, reason): never a path, window or tile.

use serde_json::Value;
use std::fmt::Write;

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Family<'_> {
    fn start<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let l: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let labels = if l.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", l.join(","))
        };
        let _ = writeln!(self.out, "{name}{labels} {value}");
    }
}

fn seconds(ts: &Value) -> Option<f64> {
    highwater_core::window::parse_rfc3339(ts.as_str()?)
        .ok()
        .map(|us| us as f64 / 1e6)
}

fn arr(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// Renders the status document.
pub fn render(s: &Value) -> String {
    let mut out = String::new();
    let version = s["version"].as_str().unwrap_or("unknown");
    Family::start(
        &mut out,
        "highwater_build_info",
        "gauge",
        "The highwater version serving, as a label; always 1.",
    )
    .sample("highwater_build_info", &[("version", version)], 1.0);

    let stages = arr(&s["stages"]);
    let mut f = Family::start(
        &mut out,
        "highwater_stage_items",
        "gauge",
        "Items recorded per file stage, by state.",
    );
    for st in &stages {
        let name = st["name"].as_str().unwrap_or("");
        let failed = arr(&st["failed"]).len() as f64;
        let ok = st["ok"].as_f64().unwrap_or(0.0);
        f.sample(
            "highwater_stage_items",
            &[("stage", name), ("state", "ok")],
            ok,
        );
        f.sample(
            "highwater_stage_items",
            &[("stage", name), ("state", "failed")],
            failed,
        );
    }
    let mut f = Family::start(
        &mut out,
        "highwater_stage_last_success_timestamp_seconds",
        "gauge",
        "When a file stage's last run that ended with exit 0 finished.",
    );
    for st in &stages {
        if st["last_run"]["exit_code"] == 0 {
            if let Some(t) = seconds(&st["last_run"]["finished_at"]) {
                f.sample(
                    "highwater_stage_last_success_timestamp_seconds",
                    &[("stage", st["name"].as_str().unwrap_or(""))],
                    t,
                );
            }
        }
    }
    let mut f = Family::start(
        &mut out,
        "highwater_items_processed_total",
        "counter",
        "Items a file stage's last run processed, by reason (reset by each run).",
    );
    for st in &stages {
        if let Some(r) = st["last_run"]["summary"]["reasons"].as_object() {
            for (reason, n) in r {
                f.sample(
                    "highwater_items_processed_total",
                    &[
                        ("stage", st["name"].as_str().unwrap_or("")),
                        ("reason", reason),
                    ],
                    n.as_f64().unwrap_or(0.0),
                );
            }
        }
    }
    let mut f = Family::start(
        &mut out,
        "highwater_run_duration_seconds",
        "gauge",
        "How long a file stage's last run took.",
    );
    for st in &stages {
        if let (Some(a), Some(b)) = (
            seconds(&st["last_run"]["started_at"]),
            seconds(&st["last_run"]["finished_at"]),
        ) {
            f.sample(
                "highwater_run_duration_seconds",
                &[("stage", st["name"].as_str().unwrap_or(""))],
                b - a,
            );
        }
    }

    let sources = arr(&s["sources"]);
    let mut f = Family::start(
        &mut out,
        "highwater_source_bookmark_timestamp_seconds",
        "gauge",
        "The end of a source's last contiguous published window.",
    );
    for src in &sources {
        if let Some(t) = seconds(&src["bookmark"]) {
            f.sample(
                "highwater_source_bookmark_timestamp_seconds",
                &[("source", src["name"].as_str().unwrap_or(""))],
                t,
            );
        }
    }
    let mut f = Family::start(
        &mut out,
        "highwater_source_windows",
        "gauge",
        "A source's windows in the grid shown, by status.",
    );
    for src in &sources {
        let name = src["name"].as_str().unwrap_or("");
        for status in ["published", "stale", "running", "failed", "missing"] {
            let n = arr(&src["windows"])
                .iter()
                .filter(|w| w["status"] == status)
                .count();
            f.sample(
                "highwater_source_windows",
                &[("source", name), ("status", status)],
                n as f64,
            );
        }
    }

    let o = &s["osm"];
    if !o.is_null() {
        // Configured: whether the store could be read, so that a missing
        // store is an alert rather than series that vanish (issue 20).
        Family::start(
            &mut out,
            "highwater_osm_store_up",
            "gauge",
            "1 when the configured OSM store could be read, 0 when it is missing or unreadable (see /api/status osm.error).",
        )
        .sample(
            "highwater_osm_store_up",
            &[],
            if o["error"].is_null() { 1.0 } else { 0.0 },
        );
        if let Some(sv) = o["server"].as_object() {
            if !sv.get("checked_at").is_none_or(|c| c.is_null()) {
                Family::start(
                    &mut out,
                    "highwater_osm_server_up",
                    "gauge",
                    "1 when the last check of the replication server got its state, 0 when it failed.",
                )
                .sample(
                    "highwater_osm_server_up",
                    &[],
                    if sv.contains_key("error") { 0.0 } else { 1.0 },
                );
            }
            if let Some(age) = sv.get("age_s").and_then(|a| a.as_f64()) {
                Family::start(
                    &mut out,
                    "highwater_osm_server_check_age_seconds",
                    "gauge",
                    "How old the replication server state shown is: it is fetched in the background.",
                )
                .sample("highwater_osm_server_check_age_seconds", &[], age);
            }
        }
        if let Some(q) = o["sequence"].as_f64() {
            Family::start(
                &mut out,
                "highwater_osm_store_sequence",
                "gauge",
                "The replication sequence of the OSM store.",
            )
            .sample("highwater_osm_store_sequence", &[], q);
        }
        if o["error"].is_null() {
            Family::start(
                &mut out,
                "highwater_osm_unsequenced_diffs",
                "gauge",
                "Diffs without a state file applied since the store's last known replication sequence (issue 50); above 0 the store follows no sequence and replication refuses to apply.",
            )
            .sample(
                "highwater_osm_unsequenced_diffs",
                &[],
                o["unsequenced"].as_f64().unwrap_or(0.0),
            );
        }
        let mut f = Family::start(
            &mut out,
            "highwater_osm_sequence",
            "gauge",
            "The replication sequence each OSM dataset's marker says it reflects.",
        );
        for d in arr(&o["datasets"]) {
            if let Some(m) = d["marker"].as_f64() {
                f.sample(
                    "highwater_osm_sequence",
                    &[("dataset", d["name"].as_str().unwrap_or(""))],
                    m,
                );
            }
        }
        if let Some(q) = o["server"]["sequence"].as_f64() {
            Family::start(
                &mut out,
                "highwater_osm_server_sequence",
                "gauge",
                "The replication server's newest sequence.",
            )
            .sample("highwater_osm_server_sequence", &[], q);
        }
        let mut f = Family::start(
            &mut out,
            "highwater_osm_dirty_items",
            "gauge",
            "Items (tiles, or elements for search and aggregates) waiting to be recomputed, per dataset.",
        );
        for d in arr(&o["datasets"]) {
            f.sample(
                "highwater_osm_dirty_items",
                &[("dataset", d["name"].as_str().unwrap_or(""))],
                d["dirty"].as_f64().unwrap_or(0.0),
            );
        }
        // Issue 23: the rebuild crossover, measured, per dataset; and what
        // serve did with dirty tiles (from the requests it recorded).
        for (name, help, field) in [
            ("highwater_osm_drain_seconds", "The last drain's duration, per dataset (measured).", "last_drain_s"),
            ("highwater_osm_rebuild_seconds", "The last rebuild's duration, per dataset (measured).", "last_rebuild_s"),
            ("highwater_osm_backlog_predicted_seconds", "The dirty backlog's predicted drain time, from the measured cost per dirty unit; compare with highwater_osm_rebuild_seconds.", "backlog_predicted_s"),
        ] {
            let mut f = Family::start(&mut out, name, "gauge", help);
            for d in arr(&o["datasets"]) {
                if let Some(v) = d["crossover"][field].as_f64() {
                    f.sample(name, &[("dataset", d["name"].as_str().unwrap_or(""))], v);
                }
            }
        }
        let mut f = Family::start(
            &mut out,
            "highwater_osm_drain_failed",
            "gauge",
            "1 when the dataset's last drain failed and none has succeeded since (issue 50); its error is on / and in /api/status.",
        );
        for d in arr(&o["datasets"]) {
            f.sample(
                "highwater_osm_drain_failed",
                &[("dataset", d["name"].as_str().unwrap_or(""))],
                if d["last_failed_drain"].is_object() {
                    1.0
                } else {
                    0.0
                },
            );
        }
        let mut f = Family::start(
            &mut out,
            "highwater_osm_held",
            "gauge",
            "1 when the affected-set guard holds the dataset (a diff far outside its recent sizes): its marker stops and its drain refuses until --force or a rebuild.",
        );
        for d in arr(&o["datasets"]) {
            f.sample(
                "highwater_osm_held",
                &[("dataset", d["name"].as_str().unwrap_or(""))],
                if d["held"].is_object() { 1.0 } else { 0.0 },
            );
        }
        let mut f = Family::start(
            &mut out,
            "highwater_osm_dirty_tiles_requested",
            "gauge",
            "Dirty tiles that serve was asked for (and that are still dirty), per tile dataset.",
        );
        for d in arr(&o["datasets"]) {
            if let Some(v) = d["requests"]["dirty_requested"].as_f64() {
                f.sample(
                    "highwater_osm_dirty_tiles_requested",
                    &[("dataset", d["name"].as_str().unwrap_or(""))],
                    v,
                );
            }
        }
        let mut f = Family::start(
            &mut out,
            "highwater_osm_dirty_tiles_served_total",
            "counter",
            "Dirty tiles serve answered, cut fresh or (the cut failed or ran out of time) stale, per tile dataset.",
        );
        for d in arr(&o["datasets"]) {
            for (how, field) in [("fresh", "served_fresh"), ("stale", "served_stale")] {
                if let Some(v) = d["requests"][field].as_f64() {
                    f.sample(
                        "highwater_osm_dirty_tiles_served_total",
                        &[("dataset", d["name"].as_str().unwrap_or("")), ("how", how)],
                        v,
                    );
                }
            }
        }
    }
    out
}
