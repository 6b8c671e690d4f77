//! Aggregates: feature counts, lengths and areas per admin area and feature
//! class, in the store's own SQLite file (`agg_contrib`, `agg_areas`).
//!
//! Each feature's contribution is stored on its own (`agg_contrib`: one row
//! per feature, area and class), and totals are sums over contributions.
//! A contribution is a pure function of the feature and of the admin areas,
//! so keeping it current needs only to recompute the contributions that may
//! have changed:
//! - of every element a diff touched (the dirty keys, recorded at apply);
//! - for an admin area that changed (shape, name, level, or gone), of the
//!   features that contributed to it before (the contributions are the
//!   reverse index) and of those whose shape meets its new bounding box
//!   (the shapes index); a point-in-polygon test settles each.
//!
//! Contributions are integers (millimetres, square decimetres), so sums do
//! not depend on the order rows are added in, and incremental totals equal
//! a rebuild's exactly. A feature counts in the areas containing a point on
//! its surface; a line's length is clipped to each area it crosses.

pub use crate::areas::{
    areas, areas_after, place_areas, place_areas_after, surface_point, Area, Areas,
};
use crate::areas::{changed_box, in_rings, AreasStore, AreasWriter};
use crate::features::{self, ElementKey, Feature, Shape, TileLayer, P};
use crate::model::MemberKind;
use crate::store::{built_recipe_key, kind_code, kind_of, Store, StoreError, Writer};
use rusqlite::params;
use std::collections::{BTreeMap, BTreeSet};

/// The Earth's circumference at the equator, in metres (WGS84), the length
/// of one world unit at latitude 0.
const EARTH_M: f64 = 40_075_016.686;

/// The table aggregates keep in the store: each feature's contribution
/// per area and class (the admin areas as last computed are
/// [`crate::areas`]' table).
pub const TABLES: &str = "
CREATE TABLE IF NOT EXISTS agg_contrib(dataset TEXT NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, area_kind INTEGER NOT NULL, area_id INTEGER NOT NULL, class TEXT NOT NULL, count INTEGER NOT NULL, length_mm INTEGER NOT NULL, area_dm2 INTEGER NOT NULL, PRIMARY KEY(dataset, kind, id, area_kind, area_id, class)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS agg_contrib_area ON agg_contrib(dataset, area_kind, area_id);
";

/// The kind, for the registry.
pub const KIND: crate::dataset::Kind = crate::dataset::Kind {
    name: "aggregates",
    tables: &[TABLES, crate::areas::TABLES],
    order: 0,
    configure,
};

/// The version of the aggregates code (features, areas, contributions):
/// part of every aggregates dataset's recipe.
pub const AGGREGATES_CODE_VERSION: &str = "aggregates-1";

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregates {
    classes: Vec<String>,
    admin_levels: Option<Vec<u8>>,
    affected_guard: Option<f64>,
    affected_guard_min: Option<usize>,
}

/// Every `[osm.aggregates.NAME]`, by name.
fn configure(
    _root: &std::path::Path,
    sections: BTreeMap<String, toml::Value>,
) -> Result<Vec<crate::dataset::Configured>, String> {
    let mut out = Vec::new();
    for (name, v) in sections {
        let a: RawAggregates = crate::dataset::section(KIND.name, &name, v)?;
        let mut classes = Vec::new();
        for c in &a.classes {
            classes.push(ClassSpec::parse(c).ok_or_else(|| {
                format!("[osm.aggregates.{name}] classes: {c:?} is not a key or key=*")
            })?);
        }
        let admin_levels = a.admin_levels.clone().unwrap_or_else(|| vec![2, 4, 6, 8]);
        let recipe = format!(
            "r1:{}",
            &highwater_core::recipe::recipe_id(&highwater_core::recipe::RecipeParts {
                version: AGGREGATES_CODE_VERSION.into(),
                config: serde_json::json!({"classes": a.classes, "admin_levels": admin_levels}),
                ..Default::default()
            })[3..]
        );
        out.push(crate::dataset::Configured {
            dataset: std::sync::Arc::new(AggDataset {
                name,
                classes,
                admin_levels,
                recipe,
            }),
            affected_guard: a.affected_guard,
            affected_guard_min: a.affected_guard_min,
        });
    }
    Ok(out)
}

/// One declared class: features with `key`, or with `key` split by value
/// (`key=*`, giving classes like `highway=residential`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSpec {
    pub key: String,
    pub by_value: bool,
}

impl ClassSpec {
    pub fn parse(s: &str) -> Option<ClassSpec> {
        let (key, by_value) = match s.strip_suffix("=*") {
            Some(k) => (k, true),
            None => (s, false),
        };
        (!key.is_empty() && !key.contains(['=', '*'])).then(|| ClassSpec {
            key: key.to_string(),
            by_value,
        })
    }
}

/// One aggregates dataset.
#[derive(Clone, Debug)]
pub struct AggDataset {
    pub name: String,
    pub classes: Vec<ClassSpec>,
    pub admin_levels: Vec<u8>,
    pub recipe: String,
}

/// One contribution: (area, class) -> (count, length in mm, area in dm²).
pub type Contribution = BTreeMap<(ElementKey, String), (i64, i64, i64)>;

/// A feature and what it contributes.
pub type Contributed = (ElementKey, Contribution);

fn classes_of(tags: &BTreeMap<String, String>, specs: &[ClassSpec]) -> Vec<String> {
    specs
        .iter()
        .filter_map(|c| {
            tags.get(&c.key).map(|v| {
                if c.by_value {
                    format!("{}={v}", c.key)
                } else {
                    c.key.clone()
                }
            })
        })
        .collect()
}

/// Metres per world unit at a world y (Web Mercator's scale factor).
fn metres_per_unit(y: f64) -> f64 {
    let lat = (std::f64::consts::PI * (1.0 - 2.0 * y)).sinh().atan();
    EARTH_M * lat.cos()
}

/// The length of the part of a segment inside the rings (even-odd), in
/// world units.
fn clipped_length(a: P, b: P, rings: &[Vec<P>]) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let mut ts = vec![0.0, 1.0];
    for r in rings {
        for e in r.windows(2) {
            let (c, d) = (e[0], e[1]);
            let (ex, ey) = (d.0 - c.0, d.1 - c.1);
            let den = dx * ey - dy * ex;
            if den == 0.0 {
                continue;
            }
            let t = ((c.0 - a.0) * ey - (c.1 - a.1) * ex) / den;
            let u = ((c.0 - a.0) * dy - (c.1 - a.1) * dx) / den;
            if (0.0..=1.0).contains(&t) && (0.0..=1.0).contains(&u) {
                ts.push(t);
            }
        }
    }
    ts.sort_by(f64::total_cmp);
    let len = (dx * dx + dy * dy).sqrt();
    ts.windows(2)
        .filter(|w| w[1] > w[0])
        .filter(|w| {
            let m = (w[0] + w[1]) / 2.0;
            in_rings((a.0 + dx * m, a.1 + dy * m), rings)
        })
        .map(|w| (w[1] - w[0]) * len)
        .sum()
}

fn polygon_area_m2(rings: &[Vec<P>]) -> f64 {
    let mut a = 0.0;
    let mut ys = 0.0;
    let mut n = 0.0;
    for (r, (depth, _)) in rings.iter().zip(features::nesting(rings)) {
        let mut s = 0.0;
        for e in r.windows(2) {
            s += e[0].0 * e[1].1 - e[1].0 * e[0].1;
            ys += e[0].1;
            n += 1.0;
        }
        // Even-odd: a ring inside an odd number of others is a hole.
        a += s.abs() / 2.0 * if depth % 2 == 0 { 1.0 } else { -1.0 };
    }
    let m = metres_per_unit(if n > 0.0 { ys / n } else { 0.5 });
    a.abs() * m * m
}

/// What one feature adds to the totals.
pub fn contribution(f: &Feature, specs: &[ClassSpec], areas: &Areas) -> Contribution {
    let mut out = Contribution::new();
    let classes = classes_of(&f.tags, specs);
    if classes.is_empty() {
        return out;
    }
    let counted: BTreeSet<usize> = surface_point(&f.shape)
        .map(|p| areas.containing(p).into_iter().collect())
        .unwrap_or_default();
    let mut lengths: BTreeMap<usize, f64> = BTreeMap::new();
    if let Shape::Lines(lines) = &f.shape {
        for i in areas.meeting(f.shape.bbox()) {
            let mut m = 0.0;
            for l in lines {
                for s in l.windows(2) {
                    let mid = (s[0].1 + s[1].1) / 2.0;
                    m += clipped_length(s[0], s[1], &areas.list[i].rings) * metres_per_unit(mid);
                }
            }
            if m > 0.0 {
                lengths.insert(i, m);
            }
        }
    }
    let area_dm2 = match &f.shape {
        Shape::Polygon(rings) => (polygon_area_m2(rings) * 100.0).round() as i64,
        _ => 0,
    };
    let touched: BTreeSet<usize> = counted.iter().chain(lengths.keys()).copied().collect();
    for i in touched {
        let count = i64::from(counted.contains(&i));
        let mm = lengths.get(&i).map_or(0, |m| (m * 1000.0).round() as i64);
        for c in &classes {
            out.insert(
                (areas.list[i].key, c.clone()),
                (count, mm, if count == 1 { area_dm2 } else { 0 }),
            );
        }
    }
    out
}

/// One row of the output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    pub area_osm_type: &'static str,
    pub area_osm_id: i64,
    pub area_name: Option<String>,
    pub admin_level: u8,
    pub class: String,
    pub count: i64,
    pub length_m: f64,
    pub area_m2: f64,
}

fn type_letter(k: MemberKind) -> &'static str {
    match k {
        MemberKind::Node => "n",
        MemberKind::Way => "w",
        MemberKind::Relation => "r",
    }
}

/// Totals from contributions, one row per (area, class), ordered.
pub fn totals(areas: &[Area], contrib: &[(ElementKey, Contribution)]) -> Vec<Row> {
    let mut sums: BTreeMap<(ElementKey, String), (i64, i64, i64)> = BTreeMap::new();
    for (_, c) in contrib {
        for (k, v) in c {
            let e = sums.entry(k.clone()).or_default();
            e.0 += v.0;
            e.1 += v.1;
            e.2 += v.2;
        }
    }
    let by_key: BTreeMap<ElementKey, &Area> = areas.iter().map(|a| (a.key, a)).collect();
    sums.into_iter()
        .filter_map(|((ak, class), (count, mm, dm2))| {
            let a = by_key.get(&ak)?;
            Some(Row {
                area_osm_type: type_letter(ak.0),
                area_osm_id: ak.1,
                area_name: a.name.clone(),
                admin_level: a.level,
                class,
                count,
                length_m: mm as f64 / 1000.0,
                area_m2: dm2 as f64 / 100.0,
            })
        })
        .collect()
}

/// Every feature's contribution, from a full pass: the rebuild. The pass
/// reads a page of features at a time ([`features::Pass`]); what is held is
/// the contributions, not the features.
pub fn rebuild_contributions(
    store: &Store,
    d: &AggDataset,
) -> Result<(Areas, Vec<(ElementKey, Contribution)>), StoreError> {
    store.snapshot(|s| {
        let areas = areas(s, &d.admin_levels)?;
        let layer = TileLayer::every_key();
        let mut pass = features::Pass::new(&layer);
        let mut out = Vec::new();
        while let Some(page) = pass.next_page(s)? {
            for (key, f) in page {
                let c = contribution(&f, &d.classes, &areas);
                if !c.is_empty() {
                    out.push((key, c));
                }
            }
        }
        Ok((areas, out))
    })
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AggReport {
    pub dataset: String,
    /// Features whose contribution was recomputed.
    pub recomputed: usize,
    /// Of those, the ones whose contribution changed.
    pub changed: usize,
    /// Admin areas that changed (shape, name, level, appeared, went).
    pub areas_changed: usize,
    pub rebuilt: bool,
    /// Why a drain rebuilt instead, if it did.
    pub reason: Option<String>,
}

/// Rebuilds the dataset's contributions and areas from the store.
pub fn rebuild(store: &mut Store, d: &AggDataset) -> Result<AggReport, StoreError> {
    store.lease_writer(false)?;
    let (sequence, generation) = store.snapshot(|s| Ok((s.meta("sequence")?, s.generation()?)))?;
    let (areas, contrib) = rebuild_contributions(store, d)?;
    store.write(|w| {
        w.agg_clear(&d.name)?;
        for (k, c) in &contrib {
            w.agg_put(&d.name, *k, c)?;
        }
        w.agg_set_areas(&d.name, &areas.list)?;
        w.clear_dirty_keys(&d.name, generation)?;
        w.set_meta(&built_recipe_key(&d.name), &d.recipe)?;
        set_drained(w, &d.name, sequence.as_deref())?;
        w.set_marker(&d.name, sequence.and_then(|s| s.parse().ok()), &d.recipe)
    })?;
    Ok(AggReport {
        dataset: d.name.clone(),
        recomputed: contrib.len(),
        changed: contrib.len(),
        areas_changed: areas.list.len(),
        rebuilt: true,
        reason: None,
    })
}

/// Recomputes what the dirty keys and changed areas may have changed, in
/// one store transaction (contributions, areas and the dirty keys commit
/// together, so a crash repeats the whole drain or none of it).
pub fn drain(store: &mut Store, d: &AggDataset) -> Result<AggReport, StoreError> {
    store.lease_writer(false)?;
    // The shapes index finds the features near a changed area.
    crate::derive::ensure_shapes(store)?;
    let built = store.meta(&built_recipe_key(&d.name))?;
    if built.as_deref() != Some(d.recipe.as_str()) {
        let mut r = rebuild(store, d)?;
        r.reason = Some(match built {
            None => "it was never built".to_string(),
            Some(old) => format!(
                "its recipe changed ({old} -> {}): new logic must not mix with old totals",
                d.recipe
            ),
        });
        return Ok(r);
    }
    let (sequence, generation) = store.snapshot(|s| Ok((s.meta("sequence")?, s.generation()?)))?;
    // The areas as last stored, with the touched ones recomputed: never a
    // scan of every boundary in the store.
    let (new_areas, old_areas, dirty) = store.snapshot(|s| {
        let old = s.agg_areas(&d.name)?;
        let dirty = s.dirty_keys(&d.name)?;
        Ok((areas_after(s, &old, &dirty, &d.admin_levels)?, old, dirty))
    })?;
    let old_by: BTreeMap<ElementKey, &Area> = old_areas.iter().map(|a| (a.key, a)).collect();
    let new_by: BTreeMap<ElementKey, &Area> = new_areas.list.iter().map(|a| (a.key, a)).collect();
    // Contributions name areas by key, so a name or level change alone
    // recomputes nothing; a shape change recomputes the features whose
    // shape meets the box of the segments that changed (the region between
    // the old and the new boundary lies inside it); an area that appeared
    // or went recomputes everything it covers or covered.
    let mut candidates: BTreeSet<ElementKey> = dirty.iter().copied().collect();
    let mut changed = 0;
    for k in old_by.keys().chain(new_by.keys()).collect::<BTreeSet<_>>() {
        let (old, new) = (old_by.get(k), new_by.get(k));
        if old == new {
            continue;
        }
        changed += 1;
        match (old, new) {
            (Some(o), Some(n)) if o.rings == n.rings => {}
            (Some(o), Some(n)) => {
                if let Some(b) = changed_box(&o.rings, &n.rings) {
                    candidates.extend(store.shapes_in(b, None)?);
                }
            }
            (Some(o), None) => {
                candidates.extend(store.agg_contributors(&d.name, o.key)?);
            }
            (None, Some(n)) => candidates.extend(store.shapes_in(n.bbox, None)?),
            (None, None) => unreachable!("k came from one of the maps"),
        }
    }
    let mut report = AggReport {
        dataset: d.name.clone(),
        areas_changed: changed,
        ..Default::default()
    };
    let mut updates: Vec<(ElementKey, Contribution)> = Vec::new();
    store.snapshot(|s| {
        // Features from the shapes index (kept by apply, live after
        // `ensure_shapes` above), not assembled from nodes again.
        for &k in &candidates {
            let c = match crate::features::indexed(s, k.0, k.1)? {
                Some(f) => contribution(&f, &d.classes, &new_areas),
                None => Contribution::new(),
            };
            updates.push((k, c));
        }
        Ok(())
    })?;
    report.recomputed = updates.len();
    store.write(|w| {
        for (k, c) in &updates {
            if w.agg_get(&d.name, *k)? != *c {
                report.changed += 1;
                w.agg_del(&d.name, *k)?;
                w.agg_put(&d.name, *k, c)?;
            }
        }
        w.agg_update_areas(&d.name, &old_areas, &new_areas.list)?;
        w.clear_dirty_keys(&d.name, generation)?;
        set_drained(w, &d.name, sequence.as_deref())?;
        w.set_marker(&d.name, sequence.and_then(|s| s.parse().ok()), &d.recipe)
    })?;
    Ok(report)
}

/// The stored totals, one row per (area, class).
pub fn stored_totals(store: &Store, d: &AggDataset) -> Result<Vec<Row>, StoreError> {
    store.snapshot(|s| {
        let areas = s.agg_areas(&d.name)?;
        let contrib = s.agg_all(&d.name)?;
        Ok(totals(&areas, &contrib))
    })
}

/// The sequence the store stood at when the dataset was last drained or
/// rebuilt: what its totals reflect. The marker says less: `apply` moves
/// it to each diff's sequence while the touched keys wait in the dirty
/// set for the drain (issue 50).
fn drained_key(name: &str) -> String {
    format!("agg_drained:{name}")
}

fn set_drained(
    w: &mut crate::store::Writer<'_>,
    name: &str,
    sequence: Option<&str>,
) -> Result<(), StoreError> {
    match sequence {
        Some(s) => w.set_meta(&drained_key(name), s),
        None => w.del_meta(&drained_key(name)),
    }
}

/// [`stored_totals`], with the sequence they reflect (the store's when
/// the dataset was last drained or rebuilt) and its dirty keys, read in
/// one snapshot (issue 50, serve's `/api/aggregates`): a reader while a
/// drain commits gets the totals before it or after it, with their own
/// sequence, never a mix.
pub fn stored_totals_at(
    store: &Store,
    d: &AggDataset,
) -> Result<(Vec<Row>, Option<i64>, usize), StoreError> {
    store.snapshot(|s| {
        let dirty = s.dirty_keys(&d.name)?.len();
        // A store drained before the drained sequence was kept: the
        // marker is what the totals reflect only when nothing waits.
        let marker = match s.meta(&drained_key(&d.name))? {
            Some(v) => v.parse().ok(),
            None if dirty == 0 => s
                .datasets()?
                .into_iter()
                .find(|(n, ..)| *n == d.name)
                .and_then(|(_, seq, ..)| seq),
            None => None,
        };
        let areas = s.agg_areas(&d.name)?;
        let contrib = s.agg_all(&d.name)?;
        Ok((totals(&areas, &contrib), marker, dirty))
    })
}

/// Rows that differ between the stored totals and a rebuild's.
pub fn verify(store: &Store, d: &AggDataset) -> Result<(usize, Vec<String>), StoreError> {
    let (areas, contrib) = rebuild_contributions(store, d)?;
    let want = totals(&areas.list, &contrib);
    let have = stored_totals(store, d)?;
    let key = |r: &Row| (r.area_osm_type, r.area_osm_id, r.class.clone());
    let a: BTreeMap<_, &Row> = have.iter().map(|r| (key(r), r)).collect();
    let b: BTreeMap<_, &Row> = want.iter().map(|r| (key(r), r)).collect();
    let mut diffs = Vec::new();
    for k in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        if a.get(k) != b.get(k) {
            diffs.push(format!(
                "{}{} {}: stored {:?}, rebuild {:?}",
                k.0,
                k.1,
                k.2,
                a.get(k).map(|r| (r.count, r.length_m, r.area_m2)),
                b.get(k).map(|r| (r.count, r.length_m, r.area_m2))
            ));
        }
    }
    Ok((want.len().max(have.len()), diffs))
}

// ---- the aggregates' tables in the OSM store ----

/// This dataset's tables, read and written through the store (an extension
/// trait: the store crate knows no dataset).
pub trait AggStore {
    /// The features that contributed to an area (the reverse index).
    fn agg_contributors(
        &self,
        dataset: &str,
        area: (MemberKind, i64),
    ) -> Result<Vec<(MemberKind, i64)>, StoreError>;
    /// Every stored contribution of a dataset, by feature.
    fn agg_all(&self, dataset: &str) -> Result<Vec<Contributed>, StoreError>;
}

impl AggStore for Store {
    fn agg_contributors(
        &self,
        dataset: &str,
        area: (MemberKind, i64),
    ) -> Result<Vec<(MemberKind, i64)>, StoreError> {
        self.keys_of_area(
            "SELECT DISTINCT kind, id FROM agg_contrib WHERE dataset = ?1 AND area_kind = ?2 AND area_id = ?3",
            dataset,
            area,
        )
    }
    fn agg_all(&self, dataset: &str) -> Result<Vec<Contributed>, StoreError> {
        let mut st = self
            .conn()
            .prepare_cached("SELECT kind, id, area_kind, area_id, class, count, length_mm, area_dm2 FROM agg_contrib WHERE dataset = ?1 ORDER BY kind, id")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([dataset], |r| {
                Ok((
                    (kind_of(r.get(0)?), r.get::<_, i64>(1)?),
                    (kind_of(r.get(2)?), r.get::<_, i64>(3)?),
                    r.get::<_, String>(4)?,
                    (r.get(5)?, r.get(6)?, r.get(7)?),
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out: Vec<Contributed> = Vec::new();
        for row in rows {
            let (key, area, class, v) = row.map_err(|e| self.err(e))?;
            if out.last().map(|l| l.0) != Some(key) {
                out.push((key, Default::default()));
            }
            out.last_mut().expect("pushed").1.insert((area, class), v);
        }
        Ok(out)
    }
}

/// This dataset's tables, written in a write transaction (an extension
/// trait: the store crate knows no dataset).
pub trait AggWriter {
    fn agg_clear(&mut self, dataset: &str) -> Result<(), StoreError>;
    fn agg_get(&self, dataset: &str, key: (MemberKind, i64)) -> Result<Contribution, StoreError>;
    fn agg_del(&mut self, dataset: &str, key: (MemberKind, i64)) -> Result<(), StoreError>;
    fn agg_put(
        &mut self,
        dataset: &str,
        key: (MemberKind, i64),
        c: &Contribution,
    ) -> Result<(), StoreError>;
}

impl AggWriter for Writer<'_> {
    fn agg_clear(&mut self, dataset: &str) -> Result<(), StoreError> {
        self.clear_dataset(&["agg_contrib"], dataset)
    }
    fn agg_get(&self, dataset: &str, key: (MemberKind, i64)) -> Result<Contribution, StoreError> {
        let mut st = self
            .tx()
            .prepare_cached("SELECT area_kind, area_id, class, count, length_mm, area_dm2 FROM agg_contrib WHERE dataset = ?1 AND kind = ?2 AND id = ?3")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![dataset, kind_code(key.0), key.1], |r| {
                Ok((
                    (
                        (kind_of(r.get(0)?), r.get::<_, i64>(1)?),
                        r.get::<_, String>(2)?,
                    ),
                    (r.get(3)?, r.get(4)?, r.get(5)?),
                ))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }
    fn agg_del(&mut self, dataset: &str, key: (MemberKind, i64)) -> Result<(), StoreError> {
        self.tx()
            .execute(
                "DELETE FROM agg_contrib WHERE dataset = ?1 AND kind = ?2 AND id = ?3",
                params![dataset, kind_code(key.0), key.1],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }
    fn agg_put(
        &mut self,
        dataset: &str,
        key: (MemberKind, i64),
        c: &Contribution,
    ) -> Result<(), StoreError> {
        let mut st = self
            .tx()
            .prepare_cached("INSERT INTO agg_contrib(dataset, kind, id, area_kind, area_id, class, count, length_mm, area_dm2) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
            .map_err(|e| self.err(e))?;
        for ((area, class), (n, mm, dm2)) in c {
            st.execute(params![
                dataset,
                kind_code(key.0),
                key.1,
                kind_code(area.0),
                area.1,
                class,
                n,
                mm,
                dm2
            ])
            .map_err(|e| self.err(e))?;
        }
        Ok(())
    }
}

impl crate::dataset::Dataset for AggDataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn recipe(&self) -> &str {
        &self.recipe
    }

    // No unit key: its outcome counts features recomputed, not units
    // built, so its rebuilds record 0 units (as they always did).

    fn drain(
        &self,
        store: &mut Store,
        _limits: crate::dataset::DrainLimits,
    ) -> Result<crate::dataset::Outcome, crate::dataset::DatasetError> {
        let t0 = std::time::Instant::now();
        let r = drain(store, self).map_err(|e| crate::dataset::error_text(&e))?;
        Ok(outcome(&r, t0))
    }

    fn rebuild(
        &self,
        store: &mut Store,
    ) -> Result<crate::dataset::Outcome, crate::dataset::DatasetError> {
        let t0 = std::time::Instant::now();
        let r = rebuild(store, self).map_err(|e| crate::dataset::error_text(&e))?;
        Ok(outcome(&r, t0))
    }

    fn verify(
        &self,
        store: &Store,
        _sample: Option<usize>,
    ) -> Result<crate::dataset::Outcome, crate::dataset::DatasetError> {
        let t0 = std::time::Instant::now();
        let (n, diffs) = verify(store, self).map_err(|e| crate::dataset::error_text(&e))?;
        Ok(crate::dataset::verified(&self.name, t0, n, diffs))
    }
}

fn outcome(r: &AggReport, t0: std::time::Instant) -> crate::dataset::Outcome {
    crate::dataset::Outcome::new("aggregates", serde_json::json!(r), t0, |s| {
        if r.rebuilt {
            format!(
                "{}: rebuilt from {} contributing features in {s:.2} s{}",
                r.dataset,
                r.recomputed,
                r.reason
                    .as_ref()
                    .map_or(String::new(), |why| format!(" (because {why})"))
            )
        } else {
            format!(
                "{}: recomputed {} features ({} changed), {} admin areas changed, in {s:.2} s",
                r.dataset, r.recomputed, r.changed, r.areas_changed
            )
        }
    })
}
