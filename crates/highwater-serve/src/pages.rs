//! The HTML pages, rendered on the server with maud (every interpolation is
//! escaped at compile time). The map page's script is the only JavaScript.

use crate::Tileset;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1b1b}
h1{font-size:1.3rem}h2{font-size:1.1rem;margin-top:1.6rem}
table{border-collapse:collapse;margin:.4rem 0}td,th{padding:.15rem .5rem;border-bottom:1px solid #ddd;text-align:left}
.fresh{color:#11701c}.stale{color:#a35c00}.bad{color:#b00020}
.grid td{padding:0;border:0}.cell{display:inline-block;width:10px;height:14px;margin:1px}
.published{background:#2e9e44}.compacted{background:#1f6f30}.stale-cell{background:#e0a100}.running{background:#3a78d8}
.failed{background:#c62828}.missing{background:#d9d9d9}
code{font-size:12px}
";

fn page(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
    .into_string()
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The cell class of a window: what its colour says.
fn cell_class(w: &Value) -> &'static str {
    match w["status"].as_str() {
        Some("published") if w["compacted"].is_string() => "cell compacted",
        Some("published") => "cell published",
        Some("stale") => "cell stale-cell",
        Some("running") => "cell running",
        Some("failed") => "cell failed",
        _ => "cell missing",
    }
}

fn stages(s: &Value) -> Markup {
    let list = s["stages"].as_array().cloned().unwrap_or_default();
    html! {
        h2 { "File stages" }
        @if list.is_empty() { p { "No file stages." } }
        @else {
            table id="stages" {
                tr { th { "stage" } th { "declared in" } th { "last run" } th { "exit" } th { "by reason" } th { "items" } th { "failed" } }
                @for st in &list {
                    @let failed = st["failed"].as_array().cloned().unwrap_or_default();
                    tr data-stage=(text(&st["name"])) {
                        td { (text(&st["name"])) }
                        td { code { (text(&st["declared_in"])) } }
                        td { (text(&st["last_run"]["finished_at"])) }
                        td class=(if st["last_run"]["exit_code"] == 0 { "fresh" } else { "bad" }) { (text(&st["last_run"]["exit_code"])) }
                        td {
                            @if let Some(r) = st["last_run"]["summary"]["reasons"].as_object() {
                                @for (k, v) in r { (k) " " (text(v)) " " }
                            }
                        }
                        td { (text(&st["entries"])) }
                        td class=(if failed.is_empty() { "fresh" } else { "bad" }) { (failed.len()) }
                    }
                    @for f in &failed {
                        tr { td {} td colspan="6" class="bad" { code { (text(&f["input"])) } ": " (text(&f["error"])) } }
                    }
                    // Items the last run held back (issue 49): a window
                    // they cover is not ready; waiting ones are only early.
                    @for h in st["held"].as_array().cloned().unwrap_or_default() {
                        tr class="held" {
                            td {}
                            td colspan="6" class=(if h["waiting"] == true { "missing" } else { "bad" }) {
                                (if h["waiting"] == true { "waiting " } else { "held " })
                                code { (text(&h["item"])) } ": " (text(&h["why"]))
                            }
                        }
                    }
                }
            }
        }
    }
}

fn sources(s: &Value) -> Markup {
    let list = s["sources"].as_array().cloned().unwrap_or_default();
    html! {
        h2 { "Sources" }
        @if list.is_empty() { p { "No sources." } }
        @for src in &list {
            @let windows = src["windows"].as_array().cloned().unwrap_or_default();
            h3 { (text(&src["name"])) }
            p {
                "bookmark " (text(&src["bookmark"]))
                @if let Some(l) = src["lease"].as_object() {
                    " · lease held by " (text(&l["owner"])) " until " (text(&l["expires"]))
                } @else { " · no lease held" }
            }
            @if let Some(e) = src["error"].as_str() { p class="bad" { (e) } }
            // Days by windows: one row per UTC day.
            table class="grid" data-source=(text(&src["name"])) {
                @for day in days(&windows) {
                    tr {
                        th { (day.0) }
                        td {
                            @for w in &day.1 {
                                span class=(cell_class(w)) data-start=(text(&w["start"])) data-status=(text(&w["status"]))
                                    title=(format!("{} {} rows {}", text(&w["start"]), text(&w["status"]), text(&w["rows"]))) {}
                            }
                        }
                    }
                }
            }
            @if let Some(last) = windows.iter().rev().find(|w| w["rows"].is_number()) {
                p { "newest published: " (text(&last["start"])) ", " (text(&last["rows"])) " rows against a prior-days median of " (text(&last["prior_rows_median"])) }
            }
            @if let Some(a) = src["layout"]["advice"].as_str() { p class="stale" { (a) } }
        }
    }
}

/// Windows grouped by their UTC day, in order.
fn days(windows: &[Value]) -> Vec<(String, Vec<Value>)> {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    for w in windows {
        let d = w["start"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(10)
            .collect::<String>();
        match out.last_mut() {
            Some((day, ws)) if *day == d => ws.push(w.clone()),
            _ => out.push((d, vec![w.clone()])),
        }
    }
    out
}

fn osm(s: &Value) -> Markup {
    let o = &s["osm"];
    html! {
        h2 { "OpenStreetMap" }
        @if o.is_null() { p { "No OSM store is configured (an [osm] table in the config)." } }
        @else if let Some(e) = o["error"].as_str() {
            p id="osm-store" class="bad" { (e) }
        }
        @else {
            p id="osm-store" {
                "store at sequence " (text(&o["sequence"])) " (" (text(&o["timestamp"])) ")"
                @if let Some(sv) = o["server"].as_object() {
                    @if sv.get("checked_at").is_some_and(|c| c.is_null()) {
                        " · server " (text(&sv["url"])) ": the first check is under way"
                    } @else if let Some(e) = sv.get("error").and_then(|e| e.as_str()) {
                        span class="bad" { " · server " (text(&sv["url"])) " unreachable: " (e) }
                    } @else if o["unsequenced"].is_i64() {
                        " · server at " (text(&sv["sequence"])) " (" (text(&sv["timestamp"])) "), lag "
                        span class="bad lag-unknown" { "unknown" }
                    } @else {
                        " · server at " (text(&sv["sequence"])) " (" (text(&sv["timestamp"])) "), lag "
                        span class=(if sv["lag_s"] == 0 { "fresh" } else { "stale" }) { (text(&sv["lag_s"])) " s" }
                    }
                    @if let Some(age) = sv.get("age_s").and_then(|a| a.as_i64()) {
                        " · checked " span class="server-age" { (age) } " s ago"
                    }
                }
            }
            // Issue 50: said, and explained, not shown as "lag 0 s".
            @if let Some(n) = o["unsequenced"].as_i64() {
                p id="osm-unsequenced" class="bad" {
                    "The store no longer follows a replication sequence: " (n)
                    " diff(s) without a state file were applied after sequence " (text(&o["sequence"]))
                    ", so which replication diff comes next is unknown and replication refuses to apply. "
                    "Import a current extract with `highwater osm import EXTRACT --replace`, or, if you know the sequence those diffs end at, apply them with `highwater osm apply FILE --sequence N`."
                }
            }
            table id="datasets" {
                tr { th { "dataset" } th { "marker" } th { "behind store" } th { "behind server" } th { "dirty backlog" } th { "last drain" } th { "recipe" } th { "advice" } th { "dirty requested" } th { "served fresh / stale" } th { "backlog vs rebuild" } }
                @for d in o["datasets"].as_array().cloned().unwrap_or_default() {
                    tr data-dataset=(text(&d["name"])) {
                        td { (text(&d["name"])) }
                        td { (text(&d["marker"])) }
                        td class=(if d["gap"] == 0 { "fresh" } else { "stale" }) { (text(&d["gap"])) }
                        td { (text(&d["behind_server"])) }
                        td class=(if d["dirty"] == 0 { "fresh" } else { "stale" }) { (text(&d["dirty"])) }
                        @if let Some(f) = d["last_failed_drain"].as_object() {
                            td class="bad drain-failed" { "FAILED " (text(&f["at"])) ": " (text(&f["error"])) }
                        } @else {
                            td { (text(&d["last_drain"])) }
                        }
                        td { code { (text(&d["recipe"])) } }
                        td class=(if d["held"].is_object() { "bad" } else { "" }) { (text(&d["rebuild"])) }
                        // Issue 23: what serve did with dirty tiles, and
                        // the measured crossover.
                        td { (text(&d["requests"]["dirty_requested"])) }
                        td { (text(&d["requests"]["served_fresh"])) " / " (text(&d["requests"]["served_stale"])) }
                        @if let Some(n) = d["crossover"]["prediction_note"].as_str() {
                            td class="prediction-note" { (n) }
                        } @else {
                            td { (text(&d["crossover"]["backlog_predicted_s"])) " s / " (text(&d["crossover"]["last_rebuild_s"])) " s" }
                        }
                    }
                }
            }
        }
    }
}

/// `/`: is everything fresh?
pub fn index(s: &Value) -> String {
    page(
        "highwater",
        html! {
            h1 { "highwater · " (text(&s["generated_at"])) }
            @for e in s["errors"].as_array().cloned().unwrap_or_default() { p class="bad" { (text(&e)) } }
            (stages(s))
            (sources(s))
            (osm(s))
            p { a href="/map" { "map" } " · " a href="/api/status" { "/api/status" } " · " a href="/metrics" { "/metrics" } }
        },
    )
}

/// `/map`: the first tile dataset, with its dirty tiles outlined; drawn
/// with the vendored VersaTiles style when it is cut with the Shortbread
/// schema, else with plain fills and lines per layer. `?probe=LON,LAT,Z;..`
/// reads the colour at each place into `body[data-probes]`, and the
/// style layers and feature ids drawn there into `body[data-features]`;
/// `?labels` reads what each point label drew (`labels()` in the script).
/// The view opens on TileJSON's `highwater_view`, or on the URL's hash,
/// which follows the map; `body[data-view]` has it after each move. After the map is idle, the page counts the
/// canvas pixels that are not background and puts the count on
/// `body[data-drawn]`: the browser test reads it.
pub fn map(sets: &[Tileset], notes: &[String]) -> String {
    let Some(t) = sets.first() else {
        return page(
            "highwater map",
            html! {
                @if notes.is_empty() {
                    p { "No tile dataset with an MBTiles file is configured ([osm.tiles.NAME] with mbtiles = \"...\")." }
                }
                @for n in notes { p class="bad note" { (n) } }
            },
        );
    };
    // JSON inside a script: `<` escaped, so no name can close the tag.
    let config = serde_json::json!({"name": t.name})
        .to_string()
        .replace('<', "\\u003c");
    let script = format!(
        r#"
window.addEventListener('error', (e) => {{ document.body.dataset.error = String(e.message); }});
window.addEventListener('unhandledrejection', (e) => {{ document.body.dataset.error = String(e.reason); }});
import * as maplibregl from '/assets/maplibre-gl.mjs';
document.body.dataset.stage = 'module';
const cfg = {config};
const tj = await (await fetch(`/tiles/${{cfg.name}}.json`)).json();
document.body.dataset.stage = 'tilejson';
// Probes for tests and for looking: `?probe=LON,LAT,ZOOM;...` reads the
// colour at each place after the map is idle there, into body[data-probes].
const probes = (new URLSearchParams(location.search).get('probe') || '')
  .split(';').filter(Boolean).map((p) => p.split(',').map(Number));
let style;
if (tj.tile_schema === 'shortbread') {{
  // A schema map styles read: draw it with a real Shortbread style.
  style = await (await fetch(`/tiles/${{cfg.name}}/style.json`)).json();
  style.sources.dirty = {{type: 'geojson', data: `/api/dirty/${{cfg.name}}.geojson`}};
}} else {{
  const layers = [{{id: 'bg', type: 'background', paint: {{'background-color': '#ffffff'}}}}];
  for (const l of tj.vector_layers) {{
    layers.push({{id: l.id + '-fill', type: 'fill', source: 't', 'source-layer': l.id, filter: ['==', ['geometry-type'], 'Polygon'], paint: {{'fill-color': '#3a78d8', 'fill-opacity': 0.5}}}});
    layers.push({{id: l.id + '-line', type: 'line', source: 't', 'source-layer': l.id, paint: {{'line-color': '#1b1b1b', 'line-width': 1}}}});
    layers.push({{id: l.id + '-point', type: 'circle', source: 't', 'source-layer': l.id, filter: ['==', ['geometry-type'], 'Point'], paint: {{'circle-radius': 2, 'circle-color': '#c62828'}}}});
  }}
  style = {{version: 8, sources: {{
    t: {{type: 'vector', url: `/tiles/${{cfg.name}}.json`}},
    dirty: {{type: 'geojson', data: `/api/dirty/${{cfg.name}}.geojson`}},
  }}, layers}};
}}
style.layers.push({{id: 'dirty', type: 'line', source: 'dirty', paint: {{'line-color': '#e0a100', 'line-width': 2}}}});
// The opening view: where most of the data is (the server's
// `highwater_view`, not the bounds one long feature can stretch), unless
// the URL's hash (`#zoom/lat/lon`, kept up to date as the map moves) names
// one: MapLibre's `hash` then wins over `bounds`.
const view = probes.length ? {{center: [probes[0][0], probes[0][1]], zoom: probes[0][2]}}
  : {{bounds: tj.highwater_view || tj.bounds, fitBoundsOptions: {{padding: 20}}}};
const map = new maplibregl.Map({{
  container: 'map',
  style,
  ...view,
  hash: !probes.length,
  canvasContextAttributes: {{preserveDrawingBuffer: true}},
}});
const where = () => {{
  const c = map.getCenter();
  document.body.dataset.view = JSON.stringify({{zoom: map.getZoom(), lat: c.lat, lon: c.lng, hash: location.hash}});
}};
map.on('moveend', where);
document.body.dataset.stage = 'map';
map.on('error', (e) => {{ document.body.dataset.error = String(e.error && e.error.message || e); }});
map.once('load', () => {{ document.body.dataset.stage = 'load'; }});
map.once('idle', () => {{
  const gl = map.getCanvas().getContext('webgl2') || map.getCanvas().getContext('webgl');
  const w = gl.drawingBufferWidth, h = gl.drawingBufferHeight;
  const px = new Uint8Array(w * h * 4);
  gl.readPixels(0, 0, w, h, gl.RGBA, gl.UNSIGNED_BYTE, px);
  let drawn = 0;
  for (let i = 0; i < px.length; i += 4) {{
    if (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250) drawn++;
  }}
  document.body.dataset.drawn = String(drawn);
  document.body.dataset.pixels = String(w * h);
  where();
  if (new URLSearchParams(location.search).has('labels')) labels(); else probe();
}});
// `?labels`: the labels placed in view, each with the pixels around its
// anchor (and below it, where a POI's name hangs) or along its line that change
// when the symbol layers are hidden: what the labels themselves drew,
// into body[data-labels].
function pixels() {{
  const gl = map.getCanvas().getContext('webgl2') || map.getCanvas().getContext('webgl');
  const w = gl.drawingBufferWidth, h = gl.drawingBufferHeight;
  const px = new Uint8Array(w * h * 4);
  gl.readPixels(0, 0, w, h, gl.RGBA, gl.UNSIGNED_BYTE, px);
  return {{px, w, h, k: w / map.getCanvas().clientWidth}};
}}
function changed(a, b, x, y) {{
  let n = 0;
  for (let dy = -12; dy <= 36; dy++) for (let dx = -40; dx <= 40; dx++) {{
    const cx = Math.round(x * a.k + dx), cy = a.h - 1 - Math.round(y * a.k + dy);
    if (cx < 0 || cy < 0 || cx >= a.w || cy >= a.h) continue;
    const i = (cy * a.w + cx) * 4;
    if (Math.max(Math.abs(a.px[i] - b.px[i]), Math.abs(a.px[i + 1] - b.px[i + 1]), Math.abs(a.px[i + 2] - b.px[i + 2])) > 30) n++;
  }}
  return n;
}}
// A line label (a street name) is drawn along its line: the pixels within
// 8 px of the line that change, each counted once.
function along(a, b, line) {{
  const seen = new Set();
  for (let j = 1; j < line.length; j++) {{
    const p = line[j - 1], q = line[j];
    const steps = Math.max(1, Math.ceil(Math.hypot(q.x - p.x, q.y - p.y) / 4));
    for (let s = 0; s <= steps; s++) {{
      const x = (p.x + (q.x - p.x) * s / steps) * a.k, y = (p.y + (q.y - p.y) * s / steps) * a.k;
      for (let dy = -8; dy <= 8; dy++) for (let dx = -8; dx <= 8; dx++) {{
        const cx = Math.round(x + dx), cy = a.h - 1 - Math.round(y + dy);
        if (cx < 0 || cy < 0 || cx >= a.w || cy >= a.h) continue;
        const i = (cy * a.w + cx) * 4;
        if (seen.has(i)) continue;
        if (Math.max(Math.abs(a.px[i] - b.px[i]), Math.abs(a.px[i + 1] - b.px[i + 1]), Math.abs(a.px[i + 2] - b.px[i + 2])) > 30) seen.add(i);
      }}
    }}
  }}
  return seen.size;
}}
async function labels() {{
  const ids = map.getStyle().layers.filter((l) => l.type === 'symbol').map((l) => l.id);
  const placed = map.queryRenderedFeatures({{layers: ids}})
    .filter((f) => f.geometry.type === 'Point' || f.geometry.type === 'LineString')
    .map((f) => {{
      const l = {{layer: f.layer.id, name: f.properties.name}};
      if (f.geometry.type === 'Point') {{
        const p = map.project(f.geometry.coordinates);
        l.x = p.x; l.y = p.y;
      }} else {{
        l.line = f.geometry.coordinates.map((c) => map.project(c));
      }}
      return l;
    }});
  const on = pixels();
  for (const id of ids) map.setLayoutProperty(id, 'visibility', 'none');
  await new Promise((r) => map.once('idle', r));
  const off = pixels();
  for (const l of placed) {{
    if (l.line) {{ l.changed = along(on, off, l.line); delete l.line; }}
    else l.changed = changed(on, off, l.x, l.y);
  }}
  for (const id of ids) map.setLayoutProperty(id, 'visibility', 'visible');
  await new Promise((r) => map.once('idle', r));
  document.body.dataset.labels = JSON.stringify(placed);
  document.body.dataset.probed = '1';
}}
async function probe() {{
  const out = [], seen = [];
  for (const [lon, lat, zoom] of probes) {{
    map.jumpTo({{center: [lon, lat], zoom}});
    await new Promise((r) => map.once('idle', r));
    const gl = map.getCanvas().getContext('webgl2') || map.getCanvas().getContext('webgl');
    const p = map.project([lon, lat]);
    const k = gl.drawingBufferWidth / map.getCanvas().clientWidth;
    const px = new Uint8Array(4);
    gl.readPixels(Math.round(p.x * k), gl.drawingBufferHeight - 1 - Math.round(p.y * k), 1, 1, gl.RGBA, gl.UNSIGNED_BYTE, px);
    out.push([px[0], px[1], px[2]]);
    seen.push(map.queryRenderedFeatures(p).map((f) => [f.layer.id, f.id]));
  }}
  document.body.dataset.probes = JSON.stringify(out);
  document.body.dataset.features = JSON.stringify(seen);
  document.body.dataset.probed = '1';
}}
"#
    );
    page(
        "highwater map",
        html! {
            link rel="stylesheet" href="/assets/maplibre-gl.css";
            div id="map" data-dataset=(t.name) style="position:absolute;top:0;bottom:0;left:0;right:0" {}
            @if !notes.is_empty() {
                div id="notes" style="position:absolute;top:0;left:0;right:0;z-index:1;background:#fff;padding:.3rem .6rem" {
                    @for n in notes { p class="bad note" { (n) } }
                }
            }
            script type="module" { (PreEscaped(script)) }
        },
    )
}
