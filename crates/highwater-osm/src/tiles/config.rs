//! A tile dataset's config section, `[osm.tiles.NAME]`, read by the kind
//! itself ([`configure`], the registry's [`KIND`](super::KIND)), and its
//! entry in `osm status`.

use super::TileDataset;
use crate::dataset::{safe_file, section, Configured, StatusContext};
use crate::derive::TileLayer;
use crate::store::{Store, StoreError};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// The version of the code that decides what a tile shows (features,
/// expiry, cutting): part of every tile dataset's recipe, so a change to it
/// forces a rebuild instead of mixing old tiles with new.
pub const TILES_CODE_VERSION: &str = "tiles-5";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTiles {
    zooms: Option<String>,
    /// A bundled schema's name ("shortbread") or a schema file in the
    /// project.
    schema: Option<String>,
    #[serde(default)]
    keys: Vec<String>,
    buffer: Option<f64>,
    diff_expire: Option<bool>,
    tiles_affected_max: Option<usize>,
    mbtiles: Option<String>,
    drain: Option<String>,
    drain_rebuild_share: Option<f64>,
    affected_guard: Option<f64>,
    affected_guard_min: Option<usize>,
    pmtiles_dead_share_max_pct: Option<f64>,
    pmtiles_versions_kept: Option<usize>,
}

/// A tile schema by name (bundled) or project file, with its text (which
/// goes into the recipe: an edited schema rebuilds the tiles).
fn load_schema(
    root: &Path,
    dataset: &str,
    s: &str,
) -> Result<(crate::schema::Schema, String), String> {
    if s == "shortbread" {
        let text = crate::schema::SHORTBREAD.to_string();
        let schema = crate::schema::Schema::parse(&text, "shortbread (bundled)")
            .expect("the bundled schema parses (a unit test checks it)");
        return Ok((schema, text));
    }
    let bad = |msg: String| msg;
    let path = safe_file(root, s).ok_or_else(|| {
        bad(format!(
            "[osm.tiles.{dataset}] schema = {s:?}: give \"shortbread\" or a schema file inside the project (no `..`, not absolute)"
        ))
    })?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        bad(format!(
            "[osm.tiles.{dataset}] schema = {s:?}: cannot read {}: {e}; bundled schemas: \"shortbread\"",
            path.display()
        ))
    })?;
    let schema = crate::schema::Schema::parse(&text, &path.display().to_string())
        .map_err(|e| bad(format!("[osm.tiles.{dataset}] {e}")))?;
    Ok((schema, text))
}

fn parse_zooms(s: &str) -> Option<(u8, u8)> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let (a, b): (u8, u8) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b && b <= highwater_core::tile::ZOOM_MAX).then_some((a, b))
}

/// Every `[osm.tiles.NAME]`, by name; the low-zoom predicate they share
/// is made from all of them.
pub fn configure(
    root: &Path,
    sections: BTreeMap<String, toml::Value>,
) -> Result<Vec<Configured>, String> {
    let bad = |m: String| m;
    let mut tiles = Vec::new();
    let mut guards = Vec::new();
    for (name, v) in sections {
        let t: RawTiles = section(super::KIND.name, &name, v)?;
        guards.push((t.affected_guard, t.affected_guard_min));
        let schema = match t.schema.as_deref() {
            None => None,
            Some(s) => Some(load_schema(root, &name, s).map_err(bad)?),
        };
        if schema.is_some() && !t.keys.is_empty() {
            return Err(bad(format!(
                "[osm.tiles.{name}] gives both schema and keys: the schema says what its layers read; drop keys"
            )));
        }
        let zooms = match (&t.zooms, &schema) {
            (Some(z), _) => z.clone(),
            (None, Some((s, _))) => format!("0-{}", s.zoom_max),
            (None, None) => {
                return Err(bad(format!(
                    "[osm.tiles.{name}] has no zooms: give zooms = \"10-16\" (or a schema = \"shortbread\")"
                )))
            }
        };
        let (zoom_min, zoom_max) = parse_zooms(&zooms).ok_or_else(|| {
            bad(format!(
                "[osm.tiles.{name}] zooms = {zooms:?}: write e.g. \"10-16\" within 0-20"
            ))
        })?;
        if let Some((s, _)) = &schema {
            if zoom_max > s.zoom_max {
                return Err(bad(format!(
                    "[osm.tiles.{name}] zooms = {zooms:?} go above the schema {:?}'s top zoom {}: clients overzoom its z{} tiles; give zooms up to {}",
                    s.name, s.zoom_max, s.zoom_max, s.zoom_max
                )));
            }
        }
        let keys = match &schema {
            Some((s, _)) => Some(s.keys.clone()),
            None => (!(t.keys.is_empty() || t.keys.iter().any(|k| k == "*")))
                .then(|| t.keys.iter().cloned().collect::<BTreeSet<_>>()),
        };
        let buffer = t
            .buffer
            .or(schema.as_ref().map(|(s, _)| s.buffer))
            .unwrap_or(0.0);
        if !(0.0..=4.0).contains(&buffer) {
            return Err(bad(format!(
                "[osm.tiles.{name}] buffer = {buffer}: use 0 to 4 tile widths"
            )));
        }
        // A schema's signatures are exact whatever changed, so its
        // expiry compares them unless told not to.
        let diff_expire = t.diff_expire.unwrap_or(schema.is_some());
        let drain_on_apply = match t.drain.as_deref() {
            None | Some("apply") => true,
            Some("deferred") => false,
            Some(other) => {
                return Err(bad(format!(
                    "[osm.tiles.{name}] drain = {other:?}: use \"apply\" (re-cut dirty tiles after each apply) or \"deferred\" (leave them for `osm tiles drain`)"
                )))
            }
        };
        let drain_rebuild_share = t.drain_rebuild_share.unwrap_or(1.0);
        if !(drain_rebuild_share > 0.0 && drain_rebuild_share.is_finite()) {
            return Err(bad(format!(
                "[osm.tiles.{name}] drain_rebuild_share = {drain_rebuild_share}: give a share above 0 (1: rebuild when more tiles are dirty than the file holds)"
            )));
        }
        let pmtiles_dead_share_max_pct = t.pmtiles_dead_share_max_pct.unwrap_or(25.0);
        if !(0.0..=100.0).contains(&pmtiles_dead_share_max_pct) {
            return Err(bad(format!(
                "[osm.tiles.{name}] pmtiles_dead_share_max_pct = {pmtiles_dead_share_max_pct}: give a percentage from 0 (always rewrite whole) to 100"
            )));
        }
        let pmtiles_versions_kept = t.pmtiles_versions_kept.unwrap_or(3);
        if pmtiles_versions_kept < 2 {
            return Err(bad(format!(
                "[osm.tiles.{name}] pmtiles_versions_kept = {pmtiles_versions_kept}: keep at least 2 (the current archive and the one readers may still be reading)"
            )));
        }
        let mbtiles = match t.mbtiles.as_deref() {
            None => None,
            Some(f) => Some(safe_file(root, f).ok_or_else(|| {
                bad(format!(
                    "[osm.tiles.{name}] mbtiles = {f:?}: give a file name inside the project (no `..`, not absolute)"
                ))
            })?),
        };
        let recipe = format!(
            "r1:{}",
            &highwater_core::recipe::recipe_id(&highwater_core::recipe::RecipeParts {
                version: TILES_CODE_VERSION.into(),
                config: serde_json::json!({"zooms": [zoom_min, zoom_max], "keys": keys, "buffer": buffer, "diff_expire": diff_expire, "schema": schema.as_ref().map(|(_, text)| highwater_core::recipe::recipe_id(&highwater_core::recipe::RecipeParts { config: serde_json::json!(text), ..Default::default() }))}),
                ..Default::default()
            })[3..]
        );
        tiles.push(TileDataset {
            layer: TileLayer {
                zoom_min,
                zoom_max,
                keys,
                buffer,
                diff_expire,
                schema: schema.map(|(s, _)| Arc::new(s)),
            },
            low: Arc::new(crate::features::LowZoom::none()),
            tiles_affected_max: t.tiles_affected_max.unwrap_or(1_000_000).max(1),
            recipe,
            name,
            mbtiles,
            drain_on_apply,
            drain_rebuild_share,
            pmtiles_dead_share_max_pct,
            pmtiles_versions_kept,
        });
    }
    let low = Arc::new(crate::features::LowZoom::new(
        tiles.iter().map(|d| d.layer.clone()).collect(),
        &tiles.iter().map(|d| d.recipe.as_str()).collect::<Vec<_>>(),
    ));
    for d in &mut tiles {
        d.low = low.clone();
    }
    Ok(tiles
        .into_iter()
        .zip(guards)
        .map(|(d, (g, min))| Configured {
            dataset: Arc::new(d),
            affected_guard: g,
            affected_guard_min: min,
        })
        .collect())
}

/// A tile dataset's entry in `osm status`.
pub fn status(
    d: &TileDataset,
    store: &Store,
    cx: &StatusContext,
) -> Result<serde_json::Value, StoreError> {
    let (marker, recipe, dirty) =
        cx.markers
            .get(&d.name)
            .cloned()
            .unwrap_or((None, String::new(), 0));
    let gap = match (cx.sequence, marker) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    let mut rebuild = Vec::new();
    if !recipe.is_empty() && recipe != d.recipe {
        rebuild.push(
            "its recipe changed (zooms, keys, buffer or code): new logic must not mix with old"
                .to_string(),
        );
    }
    if gap.is_some_and(|g| g > cx.rebuild_gap_max) {
        rebuild.push(format!(
            "it is {} sequences behind, more than rebuild_gap_max = {}",
            gap.unwrap_or(0),
            cx.rebuild_gap_max
        ));
    }
    let crossover =
        crate::dataset::crossover(&crate::dataset::costs(store, &d.name)?, dirty.max(0) as u64);
    if let (Some("rebuild"), Some(p), Some(r)) = (
        crossover.advice.as_deref(),
        crossover.backlog_predicted_s,
        crossover.last_rebuild_s,
    ) {
        rebuild.push(format!(
            "draining its {dirty} dirty tiles is predicted to take {p:.2} s (measured), more than its last rebuild's {r:.2} s"
        ));
    }
    let held = crate::dataset::held(store, &d.name)?;
    if let Some(h) = &held {
        rebuild.push(h.message(&d.name));
    }
    // What serve recorded (issue 23): the dirty tiles asked for, and
    // how many dirty tiles it served fresh and stale.
    let requests = if d.mbtiles.is_some() {
        match super::fresh::load_requests(
            store.path().parent().unwrap_or(std::path::Path::new(".")),
            &d.name,
        )
        .and_then(|r| Ok((r, super::fresh::requested_dirty(store, d)?)))
        {
            Ok((r, req)) => serde_json::json!({
                "dirty_requested": req.len(),
                "dirty_requests": req.iter().map(|(_, n)| n).sum::<u64>(),
                "served_fresh": r.as_ref().map_or(0, |r| r.fresh),
                "served_stale": r.as_ref().map_or(0, |r| r.stale),
                "counted_tiles": r.as_ref().map_or(0, |r| r.tiles.len()),
            }),
            Err(e) => serde_json::json!({"error": crate::dataset::error_text(&e)}),
        }
    } else {
        serde_json::Value::Null
    };
    Ok(serde_json::json!({
        "name": d.name,
        "marker": marker,
        "gap": gap,
        "dirty": dirty,
        "held": held,
        "crossover": crossover,
        "requests": requests,
        "recipe": d.recipe,
        "recorded_recipe": recipe,
        "rebuild": if rebuild.is_empty() { serde_json::Value::Null } else { serde_json::json!(rebuild.join("; ")) },
        "last_drain": store.meta(&format!("drained_at:{}", d.name))?,
        "last_failed_drain": crate::dataset::failed_drain(store, &d.name)?,
        "pmtiles": super::publish::published(store, &d.name)?,
    }))
}
