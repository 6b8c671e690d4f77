//! The search dataset: one document per named element, with its context
//! denormalised into it (its `addr:street`, the names of the admin areas of
//! each configured level and of the place area containing a point on its
//! surface), in a tantivy index.
//!
//! Identity alone cannot find the documents an area's edit touches: a city
//! renamed changes no document's own element. So the store keeps, per
//! search dataset, the reverse index from context area to documents
//! (`search_context`) and each document as last indexed (`search_docs`).
//! A drain recomputes the documents of the elements a diff touched, of the
//! areas that embedded a changed area (the reverse index: a rename
//! reindexes exactly those), and for a boundary that moved, of the elements
//! whose shape meets the box of the changed boundary segments; it writes
//! only documents that actually changed.
//!
//! Order of a drain: write and commit the tantivy index, then commit the
//! store (documents, reverse index, areas, dirty keys). A crash in between
//! leaves the dirty keys, and the next drain writes the same documents
//! again. A rebuild writes a new index beside the old one and swaps them.

use crate::areas::{
    areas_after, changed_box, place_areas, place_areas_after, surface_point, Area, Areas,
    AreasStore, AreasWriter,
};
use crate::features::{feature, Current, ElementKey, Feature, TileLayer, View};
use crate::model::MemberKind;
use crate::store::{built_recipe_key, kind_code, kind_of, Store, StoreError, Writer};
use rusqlite::{params, OptionalExtension};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tantivy::collector::TopDocs;
use tantivy::query::{AllQuery, QueryParser};
use tantivy::schema::{Field, Schema, Value, STORED, STRING, TEXT};
use tantivy::{Index, IndexWriter, TantivyDocument, Term};
use thiserror::Error;

pub mod live;
pub mod near;
pub mod photon;

/// The tables search keeps in the store: each document as stored (to
/// compare before reindexing) and which context areas each embeds.
pub const TABLES: &str = "
CREATE TABLE IF NOT EXISTS search_docs(dataset TEXT NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, doc TEXT NOT NULL, PRIMARY KEY(dataset, kind, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS search_context(dataset TEXT NOT NULL, area_kind INTEGER NOT NULL, area_id INTEGER NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, PRIMARY KEY(dataset, area_kind, area_id, kind, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS search_context_doc ON search_context(dataset, kind, id);
CREATE TABLE IF NOT EXISTS search_points(dataset TEXT NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, cell INTEGER NOT NULL, lon REAL NOT NULL, lat REAL NOT NULL, PRIMARY KEY(dataset, kind, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS search_points_cell ON search_points(dataset, cell, lon, lat);
";

/// The kind, for the registry.
pub const KIND: crate::dataset::Kind = crate::dataset::Kind {
    name: "search",
    tables: &[TABLES, crate::areas::TABLES],
    order: 0,
    configure,
};

/// The version of the search code (documents, context): part of every
/// search dataset's recipe.
pub const SEARCH_CODE_VERSION: &str = "search-2";

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSearch {
    index: String,
    admin_levels: Option<Vec<u8>>,
    places: Option<Vec<String>>,
    affected_guard: Option<f64>,
    affected_guard_min: Option<usize>,
}

/// Every `[osm.search.NAME]`, by name.
fn configure(
    root: &std::path::Path,
    sections: BTreeMap<String, toml::Value>,
) -> Result<Vec<crate::dataset::Configured>, String> {
    let mut out = Vec::new();
    for (name, v) in sections {
        let s: RawSearch = crate::dataset::section(KIND.name, &name, v)?;
        let index = crate::dataset::safe_file(root, &s.index).ok_or_else(|| {
            format!(
                "[osm.search.{name}] index = {:?}: give a folder inside the project (no `..`, not absolute)",
                s.index
            )
        })?;
        let admin_levels = s.admin_levels.clone().unwrap_or_else(|| vec![2, 4, 6, 8]);
        let places = s
            .places
            .clone()
            .unwrap_or_else(|| vec!["city".into(), "town".into(), "village".into()]);
        let recipe = format!(
            "r1:{}",
            &highwater_core::recipe::recipe_id(&highwater_core::recipe::RecipeParts {
                version: SEARCH_CODE_VERSION.into(),
                config: serde_json::json!({"admin_levels": admin_levels, "places": places}),
                ..Default::default()
            })[3..]
        );
        out.push(crate::dataset::Configured {
            dataset: std::sync::Arc::new(SearchDataset {
                name,
                index,
                admin_levels,
                places,
                recipe,
            }),
            affected_guard: s.affected_guard,
            affected_guard_min: s.affected_guard_min,
        });
    }
    Ok(out)
}

/// Memory the tantivy writer may buffer before it flushes a segment, in
/// bytes: bounds a drain's or a rebuild's memory.
pub const SEARCH_WRITER_BYTES: usize = 64 * 1024 * 1024;

/// Hits a query returns at most, whatever `--limit` asks.
pub const SEARCH_HITS_MAX: usize = 10_000;

#[derive(Debug, Error)]
pub enum SearchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("search index {path}: {err}")]
    Index {
        path: PathBuf,
        err: tantivy::TantivyError,
    },
    #[error("search index {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("query {query:?}: {err}; quote words with special characters, e.g. \"\\\"Rue Grimaldi\\\"\"")]
    Query { query: String, err: String },
    #[error("search index {path} does not exist: run `highwater osm rebuild {dataset}`")]
    Missing { path: PathBuf, dataset: String },
    #[error("dataset {dataset}: failed on purpose (HIGHWATER_FAILPOINT)")]
    Injected { dataset: String },
}

/// One search dataset (`[osm.search.NAME]`).
#[derive(Clone, Debug)]
pub struct SearchDataset {
    pub name: String,
    pub index: PathBuf,
    pub admin_levels: Vec<u8>,
    pub places: Vec<String>,
    pub recipe: String,
}

/// A document with the context areas it embeds.
pub type Embedded = (Doc, Vec<ElementKey>);

/// A document that differs: its key, as in the index, as in a rebuild.
pub type DocDiff = (String, Option<Doc>, Option<Doc>);

/// One document, as `osm search --json` prints it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Doc {
    pub osm_type: String,
    pub osm_id: i64,
    pub name: String,
    pub street: Option<String>,
    pub place: Option<String>,
    /// Every configured level, with null when no area of it contains the
    /// element.
    pub admin: BTreeMap<String, Option<String>>,
    /// `addr:housenumber` and `addr:postcode`.
    #[serde(default)]
    pub housenumber: Option<String>,
    #[serde(default)]
    pub postcode: Option<String>,
    /// The element's main tag ([`MAIN_KEYS`]), as Photon's `osm_key` and
    /// `osm_value`.
    #[serde(default)]
    pub osm_key: Option<String>,
    #[serde(default)]
    pub osm_value: Option<String>,
    /// The document's point in WGS84 degrees, rounded to 7 decimals (OSM's
    /// precision): a node's position; for a way or relation the point on
    /// its surface ([`surface_point`]) that the context areas are looked
    /// up at, so the place and admin names it carries contain it. `None`
    /// for an element with no shape (a relation that is not an area).
    #[serde(default)]
    pub lat: Option<f64>,
    #[serde(default)]
    pub lon: Option<f64>,
    /// A way's or relation's bounding box as Photon gives it: [min lon,
    /// max lat, max lon, min lat].
    #[serde(default)]
    pub extent: Option<[f64; 4]>,
}

/// The keys a document's main tag is taken from, first present wins
/// (Nominatim's and Photon's principal tags, most telling first).
pub const MAIN_KEYS: [&str; 20] = [
    "place",
    "amenity",
    "shop",
    "tourism",
    "leisure",
    "historic",
    "office",
    "craft",
    "healthcare",
    "emergency",
    "aeroway",
    "railway",
    "public_transport",
    "highway",
    "waterway",
    "natural",
    "man_made",
    "landuse",
    "boundary",
    "building",
];

/// Degrees rounded to OSM's 7 decimals: a node's own coordinates come back
/// exactly from the world coordinates they were projected to.
fn deg7(v: f64) -> f64 {
    (v * 1e7).round() / 1e7
}

/// A world point as (lon, lat) degrees at 7 decimals; `None` if not finite.
fn degrees(p: crate::geom::P) -> Option<(f64, f64)> {
    let (lon, lat) = highwater_core::tile::lonlat(p);
    (lon.is_finite() && lat.is_finite()).then(|| (deg7(lon), deg7(lat)))
}

fn letter(k: MemberKind) -> &'static str {
    match k {
        MemberKind::Node => "n",
        MemberKind::Way => "w",
        MemberKind::Relation => "r",
    }
}

fn doc_key(k: ElementKey) -> String {
    format!("{}{}", letter(k.0), k.1)
}

/// The context areas: admin areas of the configured levels and places.
pub struct Context {
    pub admin: Areas,
    pub places: Areas,
}

pub fn context(store: &Store, d: &SearchDataset) -> Result<Context, StoreError> {
    store.snapshot(|s| {
        Ok(Context {
            admin: crate::areas::areas(s, &d.admin_levels)?,
            places: place_areas(s, &d.places)?,
        })
    })
}

/// Each element's feature (every key) assembled from nodes through `view`:
/// the rebuild's way, which a drain's is compared with.
pub fn assembled<'v>(
    view: &'v dyn View,
) -> impl Fn(ElementKey) -> Result<Option<Feature>, StoreError> + 'v {
    move |k| feature(view, k.0, k.1, &TileLayer::every_key())
}

/// The document of one element, and the context areas it embeds: its
/// tags from `view`, its point from its feature (every key) as `shape`
/// gives it ([`assembled`] by a rebuild, the shapes index's copy by a
/// drain).
pub fn document(
    view: &dyn View,
    shape: &dyn Fn(ElementKey) -> Result<Option<Feature>, StoreError>,
    key: ElementKey,
    d: &SearchDataset,
    ctx: &Context,
) -> Result<Option<Embedded>, StoreError> {
    let tags = match key.0 {
        MemberKind::Node => view.node_tags(key.1)?,
        MemberKind::Way => view.way(key.1)?.map(|w| w.tags),
        MemberKind::Relation => view.relation(key.1)?.map(|r| r.tags),
    };
    let Some(tags) = tags else { return Ok(None) };
    let Some(name) = tags.get("name") else {
        return Ok(None);
    };
    let feature = shape(key)?;
    let point = feature.as_ref().and_then(|f| surface_point(&f.shape));
    let lonlat = point.and_then(degrees);
    // Photon's extent, for what is more than a point; world y grows
    // southwards, so the box's min y is its north edge.
    let extent = feature
        .as_ref()
        .filter(|_| key.0 != MemberKind::Node)
        .and_then(|f| {
            let (x0, y0, x1, y1) = f.shape.bbox();
            let (w, n) = degrees((x0, y0))?;
            let (e, s) = degrees((x1, y1))?;
            Some([w, n, e, s])
        });
    let main = MAIN_KEYS
        .iter()
        .find_map(|k| tags.get(*k).map(|v| (k.to_string(), v.clone())));
    let mut embeds = Vec::new();
    // The first (lowest key) containing area of each kind: deterministic
    // where areas overlap.
    let mut pick = |areas: &Areas, level: Option<u8>| -> Option<String> {
        let p = point?;
        let i = areas
            .containing(p)
            .into_iter()
            .filter(|&i| level.is_none_or(|l| areas.list[i].level == l))
            .min_by_key(|&i| areas.list[i].key)?;
        embeds.push(areas.list[i].key);
        areas.list[i].name.clone()
    };
    let mut admin = BTreeMap::new();
    for l in &d.admin_levels {
        admin.insert(l.to_string(), pick(&ctx.admin, Some(*l)));
    }
    let place = pick(&ctx.places, None);
    embeds.sort();
    embeds.dedup();
    Ok(Some((
        Doc {
            osm_type: letter(key.0).to_string(),
            osm_id: key.1,
            name: name.clone(),
            street: tags.get("addr:street").cloned(),
            place,
            admin,
            housenumber: tags.get("addr:housenumber").cloned(),
            postcode: tags.get("addr:postcode").cloned(),
            osm_key: main.as_ref().map(|m| m.0.clone()),
            osm_value: main.map(|m| m.1),
            lat: lonlat.map(|p| p.1),
            lon: lonlat.map(|p| p.0),
            extent,
        },
        embeds,
    )))
}

#[derive(Clone, Copy)]
struct Fields {
    key: Field,
    name: Field,
    street: Field,
    place: Field,
    admin: Field,
    json: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let f = Fields {
        key: b.add_text_field("key", STRING | STORED),
        name: b.add_text_field("name", TEXT),
        street: b.add_text_field("street", TEXT),
        place: b.add_text_field("place", TEXT),
        admin: b.add_text_field("admin", TEXT),
        json: b.add_text_field("json", STORED),
    };
    (b.build(), f)
}

fn fields(index: &Index) -> Fields {
    let s = index.schema();
    let get = |n: &str| s.get_field(n).expect("our own schema");
    Fields {
        key: get("key"),
        name: get("name"),
        street: get("street"),
        place: get("place"),
        admin: get("admin"),
        json: get("json"),
    }
}

fn to_tantivy(f: &Fields, doc: &Doc) -> TantivyDocument {
    let mut t = TantivyDocument::default();
    t.add_text(f.key, format!("{}{}", doc.osm_type, doc.osm_id));
    t.add_text(f.name, &doc.name);
    if let Some(s) = &doc.street {
        t.add_text(f.street, s);
    }
    if let Some(p) = &doc.place {
        t.add_text(f.place, p);
    }
    for a in doc.admin.values().flatten() {
        t.add_text(f.admin, a);
    }
    t.add_text(
        f.json,
        serde_json::to_string(doc).expect("documents serialize"),
    );
    t
}

/// The key of the one document in an index that is no element: the state
/// the index was committed at, written in the same commit as the
/// documents, so that whoever reads a snapshot of the index knows which
/// replication sequence it holds (issue 50). Keys of elements start with
/// a letter; this one never matches a query's fields.
const STATE_KEY: &str = "~state";

/// What an index's commit reflects: the store's sequence when it was
/// drained or rebuilt, and the recipe its documents were made by.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexState {
    pub sequence: Option<i64>,
    pub recipe: String,
}

fn state_doc(f: &Fields, st: &IndexState) -> TantivyDocument {
    let mut t = TantivyDocument::default();
    t.add_text(f.key, STATE_KEY);
    t.add_text(f.json, serde_json::to_string(st).expect("states serialize"));
    t
}

fn ierr(path: &Path) -> impl Fn(tantivy::TantivyError) -> SearchError + '_ {
    move |err| SearchError::Index {
        path: path.to_path_buf(),
        err,
    }
}

fn open(d: &SearchDataset) -> Result<Index, SearchError> {
    if !d.index.join("meta.json").exists() {
        return Err(SearchError::Missing {
            path: d.index.clone(),
            dataset: d.name.clone(),
        });
    }
    Index::open_in_dir(&d.index).map_err(ierr(&d.index))
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SearchReport {
    pub dataset: String,
    /// Documents recomputed.
    pub recomputed: usize,
    /// Of those, written to the index (changed, new or deleted).
    pub reindexed: usize,
    pub areas_changed: usize,
    pub documents: usize,
    pub rebuilt: bool,
    /// Why a drain rebuilt instead, if it did.
    pub reason: Option<String>,
}

/// Every document from a full pass over the store, held at once: what
/// `verify` compares the index with. The rebuild itself pages.
pub fn rebuild_documents(
    store: &Store,
    d: &SearchDataset,
) -> Result<(Context, BTreeMap<ElementKey, Embedded>), StoreError> {
    store.snapshot(|s| {
        let ctx = context(s, d)?;
        let view = Current::uncached(s);
        let mut out = BTreeMap::new();
        for key in s.tagged_like("\"name\":")? {
            if let Some(doc) = document(&view, &assembled(&view), key, d, &ctx)? {
                out.insert(key, doc);
            }
        }
        Ok((ctx, out))
    })
}

/// Tagged elements a rebuild reads, computes and writes at a time: what it
/// holds besides the index writer's budget and the context areas.
pub const REBUILD_PAGE_LEN: usize = 8192;

/// Writes a new index from a full pass, swaps it in, and resets the
/// store's documents, reverse index and areas for the dataset. The pass
/// goes a page of tagged elements at a time, each page's documents into
/// the index writer and the store's tables at once, inside the one write
/// transaction that resets them: memory is a page, the index writer's
/// [`SEARCH_WRITER_BYTES`] and the context, whatever the store's size.
pub fn rebuild(store: &mut Store, d: &SearchDataset) -> Result<SearchReport, SearchError> {
    rebuild_paged(store, d, REBUILD_PAGE_LEN)
}

/// [`rebuild`], `page_len` tagged elements at a time (tests cross page
/// boundaries with small pages).
pub fn rebuild_paged(
    store: &mut Store,
    d: &SearchDataset,
    page_len: usize,
) -> Result<SearchReport, SearchError> {
    store.lease_writer(false)?;
    crate::import::sweep_leftovers(&d.index);
    let (sequence, generation) = store.snapshot(|s| Ok((s.meta("sequence")?, s.generation()?)))?;
    let ctx = context(store, d)?;
    let name = d.index.file_name().unwrap_or_default().to_string_lossy();
    let tmp = d
        .index
        .with_file_name(format!(".{name}.hw-tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| SearchError::Io { path, err }
    };
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let (schema, f) = schema();
    let index = Index::create_in_dir(&tmp, schema).map_err(ierr(&tmp))?;
    let mut iw: IndexWriter = index.writer(SEARCH_WRITER_BYTES).map_err(ierr(&tmp))?;
    let count = store.write_then(|w| -> Result<usize, SearchError> {
        w.search_clear(&d.name)?;
        let mut count = 0;
        let mut pages = crate::features::TaggedPages::new(page_len);
        while let Some((kind, ids)) = pages.next_page(&*w)? {
            let docs = {
                let view = Current::uncached(&*w);
                let mut docs = Vec::new();
                for id in ids {
                    if let Some(doc) = document(&view, &assembled(&view), (kind, id), d, &ctx)? {
                        docs.push(((kind, id), doc));
                    }
                }
                docs
            };
            for (key, (doc, embeds)) in &docs {
                iw.add_document(to_tantivy(&f, doc)).map_err(ierr(&tmp))?;
                w.search_put(&d.name, *key, doc, embeds)?;
            }
            count += docs.len();
        }
        let state = IndexState {
            sequence: sequence.as_ref().and_then(|s| s.parse().ok()),
            recipe: d.recipe.clone(),
        };
        iw.add_document(state_doc(&f, &state)).map_err(ierr(&tmp))?;
        iw.commit().map_err(ierr(&tmp))?;
        iw.wait_merging_threads().map_err(ierr(&tmp))?;
        drop(index);
        // Swap: the old index (if any) moves aside, the new one into
        // place; the store's tables commit just after, with the marker.
        let old = d
            .index
            .with_file_name(format!(".{name}.hw-old-{}", std::process::id()));
        let had_old = d.index.exists();
        if had_old {
            std::fs::rename(&d.index, &old).map_err(io(&d.index))?;
        }
        std::fs::rename(&tmp, &d.index).map_err(io(&d.index))?;
        if had_old {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        w.agg_set_areas(&d.name, &ctx.admin.list)?;
        w.agg_set_areas(&format!("{}#places", d.name), &ctx.places.list)?;
        w.clear_dirty_keys(&d.name, generation)?;
        w.set_meta(&built_recipe_key(&d.name), &d.recipe)?;
        w.set_meta(&documents_key(&d.name), &count.to_string())?;
        set_drained(w, &d.name, sequence.as_deref())?;
        w.set_marker(&d.name, sequence.and_then(|s| s.parse().ok()), &d.recipe)?;
        Ok(count)
    })?;
    Ok(SearchReport {
        dataset: d.name.clone(),
        recomputed: count,
        reindexed: count,
        documents: count,
        rebuilt: true,
        ..Default::default()
    })
}

/// The elements an area change may have changed the documents of.
fn affected_by_areas(
    store: &Store,
    d: &SearchDataset,
    old: &[Area],
    new: &[Area],
    out: &mut BTreeSet<ElementKey>,
) -> Result<usize, StoreError> {
    let old_by: BTreeMap<ElementKey, &Area> = old.iter().map(|a| (a.key, a)).collect();
    let new_by: BTreeMap<ElementKey, &Area> = new.iter().map(|a| (a.key, a)).collect();
    let mut changed = 0;
    for k in old_by.keys().chain(new_by.keys()).collect::<BTreeSet<_>>() {
        let (o, n) = (old_by.get(k), new_by.get(k));
        if o == n {
            continue;
        }
        changed += 1;
        // Whoever embedded the area: a rename reaches exactly these.
        out.extend(store.search_embedders(&d.name, *k)?);
        match (o, n) {
            (Some(o), Some(n)) if o.rings != n.rings => {
                if let Some(b) = changed_box(&o.rings, &n.rings) {
                    out.extend(store.shapes_in(b, None)?);
                }
            }
            (None, Some(n)) => out.extend(store.shapes_in(n.bbox, None)?),
            _ => {}
        }
    }
    Ok(changed)
}

/// The sequence the store stood at when the dataset was last drained or
/// rebuilt: what its documents reflect. The marker says less: `apply`
/// moves it to each diff's sequence while the keys the diff touched wait
/// in the dirty set for the drain.
fn drained_key(name: &str) -> String {
    format!("search_drained:{name}")
}

fn set_drained(w: &mut Writer<'_>, name: &str, sequence: Option<&str>) -> Result<(), StoreError> {
    match sequence {
        Some(s) => w.set_meta(&drained_key(name), s),
        None => w.del_meta(&drained_key(name)),
    }
}

/// [`drained_key`]'s sequence, read in the caller's snapshot.
pub fn drained_sequence(store: &Store, name: &str) -> Result<Option<i64>, StoreError> {
    Ok(store.meta(&drained_key(name))?.and_then(|v| v.parse().ok()))
}

fn documents_key(name: &str) -> String {
    format!("search_documents:{name}")
}

/// A dataset's document count, as its last rebuild or drain kept it (a
/// drain must not count an index that grows with the world); counted once
/// for an index built before the count was kept.
pub fn documents(store: &Store, name: &str) -> Result<usize, StoreError> {
    match store
        .meta(&documents_key(name))?
        .and_then(|v| v.parse().ok())
    {
        Some(n) => Ok(n),
        None => store.search_count(name),
    }
}

/// Brings the index current with the elements touched since the last drain
/// and the areas that changed.
pub fn drain(store: &mut Store, d: &SearchDataset) -> Result<SearchReport, SearchError> {
    store.lease_writer(false)?;
    // The shapes index finds the features near a changed area.
    crate::derive::ensure_shapes(store)?;
    let built = store.meta(&built_recipe_key(&d.name))?;
    let reason = match built {
        None => Some("it was never built".to_string()),
        Some(old) if old != d.recipe => Some(format!(
            "its recipe changed ({old} -> {}): new logic must not mix with old documents",
            d.recipe
        )),
        Some(_) if !d.index.join("meta.json").exists() => {
            Some(format!("{} is missing", d.index.display()))
        }
        Some(_) => None,
    };
    if let Some(reason) = reason {
        let mut r = rebuild(store, d)?;
        r.reason = Some(reason);
        return Ok(r);
    }
    let (sequence, generation) = store.snapshot(|s| Ok((s.meta("sequence")?, s.generation()?)))?;
    // The context areas as last stored, with the touched ones recomputed:
    // never a scan of every boundary and place in the store.
    let old_admin = store.agg_areas(&d.name)?;
    let old_places = store.agg_areas(&format!("{}#places", d.name))?;
    let mut candidates: BTreeSet<ElementKey> = store.dirty_keys(&d.name)?;
    let ctx = store.snapshot(|s| {
        Ok(Context {
            admin: areas_after(s, &old_admin, &candidates, &d.admin_levels)?,
            places: place_areas_after(s, &old_places, &candidates, &d.places)?,
        })
    })?;
    let mut report = SearchReport {
        dataset: d.name.clone(),
        ..Default::default()
    };
    report.areas_changed +=
        affected_by_areas(store, d, &old_admin, &ctx.admin.list, &mut candidates)?;
    report.areas_changed +=
        affected_by_areas(store, d, &old_places, &ctx.places.list, &mut candidates)?;
    let mut changes: Vec<(ElementKey, Option<Embedded>)> = Vec::new();
    // Documents gained less documents lost: the kept count moves by it.
    let mut delta: i64 = 0;
    let before = documents(store, &d.name)?;
    store.snapshot(|s| {
        let view = Current::new(s);
        // Points from the shapes index (kept by apply, live after
        // `ensure_shapes` above), not assembled from nodes again.
        let indexed = |k: ElementKey| crate::features::indexed(s, k.0, k.1);
        for &k in &candidates {
            let new = document(&view, &indexed, k, d, &ctx)?;
            let old = s.search_doc(&d.name, k)?;
            if old.as_ref() != new.as_ref() {
                delta += i64::from(new.is_some()) - i64::from(old.is_some());
                changes.push((k, new));
            }
        }
        Ok(())
    })?;
    report.recomputed = candidates.len();
    report.reindexed = changes.len();
    if std::env::var("HIGHWATER_FAILPOINT").is_ok_and(|v| v == format!("fail-drain:{}", d.name)) {
        return Err(SearchError::Injected {
            dataset: d.name.clone(),
        });
    }
    // Committed even when no document changed: the state document moves
    // to the sequence the marker moves to, in the commit readers see.
    {
        let index = open(d)?;
        let f = fields(&index);
        // One indexing thread: a drain's few thousand documents make one
        // segment, and a second thread's arena and segment would be fresh
        // memory and another file for a few hundred of them.
        let mut w: IndexWriter = index
            .writer_with_num_threads(1, SEARCH_WRITER_BYTES)
            .map_err(ierr(&d.index))?;
        w.delete_term(Term::from_field_text(f.key, STATE_KEY));
        let state = IndexState {
            sequence: sequence.as_ref().and_then(|s| s.parse().ok()),
            recipe: d.recipe.clone(),
        };
        w.add_document(state_doc(&f, &state))
            .map_err(ierr(&d.index))?;
        for (k, new) in &changes {
            w.delete_term(Term::from_field_text(f.key, &doc_key(*k)));
            if let Some((doc, _)) = new {
                w.add_document(to_tantivy(&f, doc))
                    .map_err(ierr(&d.index))?;
            }
        }
        w.commit().map_err(ierr(&d.index))?;
        w.wait_merging_threads().map_err(ierr(&d.index))?;
    }
    store.write(|w| {
        for (k, new) in &changes {
            w.search_del(&d.name, *k)?;
            if let Some((doc, embeds)) = new {
                w.search_put(&d.name, *k, doc, embeds)?;
            }
        }
        w.agg_update_areas(&d.name, &old_admin, &ctx.admin.list)?;
        w.agg_update_areas(&format!("{}#places", d.name), &old_places, &ctx.places.list)?;
        report.documents = usize::try_from(before as i64 + delta)
            .expect("a drain removes only documents the index holds");
        w.set_meta(&documents_key(&d.name), &report.documents.to_string())?;
        set_drained(w, &d.name, sequence.as_deref())?;
        w.clear_dirty_keys(&d.name, generation)?;
        w.set_marker(&d.name, sequence.and_then(|s| s.parse().ok()), &d.recipe)
    })?;
    Ok(report)
}

fn stored_doc(f: &Fields, t: &TantivyDocument, path: &Path) -> Result<Doc, SearchError> {
    let json = t
        .get_first(f.json)
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    serde_json::from_str(json).map_err(|e| SearchError::Io {
        path: path.to_path_buf(),
        err: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

/// Runs a query (tantivy's query syntax over name, street, place and admin
/// names; the name counts triple) and returns the hits, best first.
pub fn search(d: &SearchDataset, query: &str, limit: usize) -> Result<Vec<Doc>, SearchError> {
    Snapshot::open(d)?.search(query, limit)
}

/// Every document in the index, ordered by type and id.
pub fn all(d: &SearchDataset) -> Result<Vec<Doc>, SearchError> {
    Snapshot::open(d)?.all()
}

/// One committed state of a search index: what a query reads, with the
/// state committed with it. A server keeps one and answers every query
/// from it until the index commits again ([`live::LiveIndex`]).
pub struct Snapshot {
    index: Index,
    fields: Fields,
    searcher: tantivy::Searcher,
    path: PathBuf,
    /// `None`: an index written before the state was kept.
    pub state: Option<IndexState>,
}

impl Snapshot {
    /// The index's last commit.
    pub fn open(d: &SearchDataset) -> Result<Snapshot, SearchError> {
        let index = open(d)?;
        let fields = fields(&index);
        // No reload thread: a snapshot stays the commit it opened.
        let reader = index
            .reader_builder()
            .reload_policy(tantivy::ReloadPolicy::Manual)
            .try_into()
            .map_err(ierr(&d.index))?;
        let searcher = reader.searcher();
        let mut me = Snapshot {
            index,
            fields,
            searcher,
            path: d.index.clone(),
            state: None,
        };
        me.state = me.read_state()?;
        Ok(me)
    }

    fn read_state(&self) -> Result<Option<IndexState>, SearchError> {
        let q = tantivy::query::TermQuery::new(
            Term::from_field_text(self.fields.key, STATE_KEY),
            tantivy::schema::IndexRecordOption::Basic,
        );
        let hits = self
            .searcher
            .search(&q, &TopDocs::with_limit(1).order_by_score())
            .map_err(ierr(&self.path))?;
        let Some((_, addr)) = hits.first() else {
            return Ok(None);
        };
        let t: TantivyDocument = self.searcher.doc(*addr).map_err(ierr(&self.path))?;
        let json = t
            .get_first(self.fields.json)
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        Ok(serde_json::from_str(json).ok())
    }

    /// The stored document at `addr`; `None` for the state document.
    fn doc_at(&self, addr: tantivy::DocAddress) -> Result<Option<Doc>, SearchError> {
        let t: TantivyDocument = self.searcher.doc(addr).map_err(ierr(&self.path))?;
        if t.get_first(self.fields.key).and_then(|v| v.as_str()) == Some(STATE_KEY) {
            return Ok(None);
        }
        stored_doc(&self.fields, &t, &self.path).map(Some)
    }

    /// A query's hits, best first, at most `limit` (1 to
    /// [`SEARCH_HITS_MAX`]).
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<Doc>, SearchError> {
        let f = self.fields;
        let mut parser =
            QueryParser::for_index(&self.index, vec![f.name, f.street, f.place, f.admin]);
        parser.set_field_boost(f.name, 3.0);
        let q = parser.parse_query(query).map_err(|e| SearchError::Query {
            query: query.to_string(),
            err: e.to_string(),
        })?;
        let limit = limit.clamp(1, SEARCH_HITS_MAX);
        // One more: the state document may be among the hits of a query
        // that names its field.
        let hits = self
            .searcher
            .search(&q, &TopDocs::with_limit(limit + 1).order_by_score())
            .map_err(ierr(&self.path))?;
        let mut out = Vec::new();
        for (_, addr) in hits {
            if let Some(doc) = self.doc_at(addr)? {
                out.push(doc);
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Every document, ordered by type and id.
    pub fn all(&self) -> Result<Vec<Doc>, SearchError> {
        let n = self.searcher.num_docs() as usize;
        let mut out = Vec::with_capacity(n);
        if n > 0 {
            for (_, addr) in self
                .searcher
                .search(&AllQuery, &TopDocs::with_limit(n).order_by_score())
                .map_err(ierr(&self.path))?
            {
                if let Some(doc) = self.doc_at(addr)? {
                    out.push(doc);
                }
            }
        }
        out.sort_by(|a, b| (&a.osm_type, a.osm_id).cmp(&(&b.osm_type, b.osm_id)));
        Ok(out)
    }
}

/// Documents that differ between the index and a rebuild: (key, in the
/// index, in the rebuild).
pub fn verify(store: &Store, d: &SearchDataset) -> Result<(usize, Vec<DocDiff>), SearchError> {
    let (_, want) = rebuild_documents(store, d)?;
    let want: BTreeMap<String, Doc> = want
        .into_iter()
        .map(|(k, (doc, _))| (doc_key(k), doc))
        .collect();
    let have: BTreeMap<String, Doc> = all(d)?
        .into_iter()
        .map(|doc| (format!("{}{}", doc.osm_type, doc.osm_id), doc))
        .collect();
    // The spatial index (what `/reverse` reads) is checked with the
    // documents: a point that differs shows as the index's document with
    // the point the spatial index holds.
    let points = store.search_points(&d.name)?;
    let point = |doc: Option<&Doc>| doc.and_then(|x| Some((x.lon?, x.lat?)));
    let mut diffs = Vec::new();
    let keys: BTreeSet<&String> = have
        .keys()
        .chain(want.keys())
        .chain(points.keys())
        .collect();
    for k in keys {
        let (h, w) = (have.get(k), want.get(k));
        let p = points.get(k).copied();
        if h != w || p != point(w) {
            let shown = h.cloned().map(|mut x| {
                if p != point(h) {
                    (x.lon, x.lat) = (p.map(|p| p.0), p.map(|p| p.1));
                }
                x
            });
            diffs.push((k.clone(), shown, w.cloned()));
        }
    }
    Ok((have.len().max(want.len()), diffs))
}

// ---- the search tables in the OSM store ----

/// This dataset's tables, read and written through the store (an extension
/// trait: the store crate knows no dataset).
pub trait SearchStore {
    /// A search document as last indexed, with the areas it embeds.
    fn search_doc(
        &self,
        dataset: &str,
        key: (MemberKind, i64),
    ) -> Result<Option<Embedded>, StoreError>;
    /// The documents that embed an area's name (the reverse index).
    fn search_embedders(
        &self,
        dataset: &str,
        area: (MemberKind, i64),
    ) -> Result<Vec<(MemberKind, i64)>, StoreError>;
    fn search_count(&self, dataset: &str) -> Result<usize, StoreError>;
    /// The spatial index's points (lon, lat), by document key (`n123`).
    fn search_points(&self, dataset: &str) -> Result<BTreeMap<String, (f64, f64)>, StoreError>;
}

impl SearchStore for Store {
    fn search_doc(
        &self,
        dataset: &str,
        key: (MemberKind, i64),
    ) -> Result<Option<Embedded>, StoreError> {
        let doc: Option<String> = self
            .conn()
            .prepare_cached(
                "SELECT doc FROM search_docs WHERE dataset = ?1 AND kind = ?2 AND id = ?3",
            )
            .and_then(|mut st| {
                st.query_row(params![dataset, kind_code(key.0), key.1], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        let Some(doc) = doc else { return Ok(None) };
        let doc = serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
            path: self.path().to_path_buf(),
            what: format!("search_docs {key:?}: {e}"),
        })?;
        let mut st = self
            .conn()
            .prepare_cached("SELECT area_kind, area_id FROM search_context WHERE dataset = ?1 AND kind = ?2 AND id = ?3 ORDER BY area_kind, area_id")
            .map_err(|e| self.err(e))?;
        let embeds = st
            .query_map(params![dataset, kind_code(key.0), key.1], |r| {
                Ok((kind_of(r.get(0)?), r.get(1)?))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(Some((doc, embeds)))
    }
    fn search_embedders(
        &self,
        dataset: &str,
        area: (MemberKind, i64),
    ) -> Result<Vec<(MemberKind, i64)>, StoreError> {
        self.keys_of_area(
            "SELECT kind, id FROM search_context WHERE dataset = ?1 AND area_kind = ?2 AND area_id = ?3",
            dataset,
            area,
        )
    }
    fn search_points(&self, dataset: &str) -> Result<BTreeMap<String, (f64, f64)>, StoreError> {
        let mut st = self
            .conn()
            .prepare("SELECT kind, id, lon, lat FROM search_points WHERE dataset = ?1")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([dataset], |r| {
                Ok((
                    doc_key((kind_of(r.get(0)?), r.get(1)?)),
                    (r.get(2)?, r.get(3)?),
                ))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }
    fn search_count(&self, dataset: &str) -> Result<usize, StoreError> {
        self.conn()
            .query_row(
                "SELECT count(*) FROM search_docs WHERE dataset = ?1",
                [dataset],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as usize)
            .map_err(|e| self.err(e))
    }
}

/// This dataset's tables, written in a write transaction (an extension
/// trait: the store crate knows no dataset).
pub trait SearchWriter {
    fn search_clear(&mut self, dataset: &str) -> Result<(), StoreError>;
    fn search_del(&mut self, dataset: &str, key: (MemberKind, i64)) -> Result<(), StoreError>;
    fn search_put(
        &mut self,
        dataset: &str,
        key: (MemberKind, i64),
        doc: &Doc,
        embeds: &[(MemberKind, i64)],
    ) -> Result<(), StoreError>;
}

impl SearchWriter for Writer<'_> {
    fn search_clear(&mut self, dataset: &str) -> Result<(), StoreError> {
        self.clear_dataset(&["search_docs", "search_context", "search_points"], dataset)
    }
    fn search_del(&mut self, dataset: &str, key: (MemberKind, i64)) -> Result<(), StoreError> {
        for sql in [
            "DELETE FROM search_docs WHERE dataset = ?1 AND kind = ?2 AND id = ?3",
            "DELETE FROM search_context WHERE dataset = ?1 AND kind = ?2 AND id = ?3",
            "DELETE FROM search_points WHERE dataset = ?1 AND kind = ?2 AND id = ?3",
        ] {
            self.tx()
                .prepare_cached(sql)
                .and_then(|mut st| st.execute(params![dataset, kind_code(key.0), key.1]))
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }
    fn search_put(
        &mut self,
        dataset: &str,
        key: (MemberKind, i64),
        doc: &Doc,
        embeds: &[(MemberKind, i64)],
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(doc).expect("documents serialize");
        self.tx()
            .prepare_cached(
                "INSERT INTO search_docs(dataset, kind, id, doc) VALUES(?1, ?2, ?3, ?4)",
            )
            .and_then(|mut st| st.execute(params![dataset, kind_code(key.0), key.1, text]))
            .map_err(|e| self.err(e))?;
        if let (Some(lon), Some(lat)) = (doc.lon, doc.lat) {
            self.tx()
                .prepare_cached("INSERT INTO search_points(dataset, kind, id, cell, lon, lat) VALUES(?1, ?2, ?3, ?4, ?5, ?6)")
                .and_then(|mut st| {
                    st.execute(params![dataset, kind_code(key.0), key.1, near::cell_of(lon, lat), lon, lat])
                })
                .map_err(|e| self.err(e))?;
        }
        for a in embeds {
            self.tx()
                .prepare_cached("INSERT OR IGNORE INTO search_context(dataset, area_kind, area_id, kind, id) VALUES(?1, ?2, ?3, ?4, ?5)")
                .and_then(|mut st| {
                    st.execute(params![dataset, kind_code(a.0), a.1, kind_code(key.0), key.1])
                })
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }
}

impl crate::dataset::Dataset for SearchDataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn recipe(&self) -> &str {
        &self.recipe
    }

    fn unit_key(&self) -> Option<&'static str> {
        Some("documents")
    }

    fn paths(&self) -> Vec<(String, PathBuf)> {
        vec![(
            format!("[osm.search.{}] index", self.name),
            self.index.clone(),
        )]
    }

    fn status(
        &self,
        store: &Store,
        cx: &crate::dataset::StatusContext,
    ) -> Result<serde_json::Value, StoreError> {
        let documents = documents(store, &self.name)?;
        crate::dataset::keyed_status(
            store,
            cx,
            (KIND.name, &self.name, &self.recipe),
            Some(documents),
        )
    }

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
        // A document whose element is a dirty key is pending, not a
        // difference (issue 50).
        let dirty: BTreeSet<String> = store
            .dirty_keys(&self.name)
            .map_err(|e| crate::dataset::error_text(&e))?
            .into_iter()
            .map(doc_key)
            .collect();
        let (pending, differ): (Vec<_>, Vec<_>) =
            diffs.iter().partition(|(k, _, _)| dirty.contains(k));
        let text = |v: Vec<&DocDiff>| {
            v.iter()
                .map(|(k, have, want)| format!("{k}: index {have:?}, rebuild {want:?}"))
                .collect()
        };
        Ok(crate::dataset::verified_pending(
            &self.name,
            t0,
            n,
            text(differ),
            text(pending),
        ))
    }
}

fn outcome(r: &SearchReport, t0: std::time::Instant) -> crate::dataset::Outcome {
    crate::dataset::Outcome::new("search", serde_json::json!(r), t0, |s| {
        if r.rebuilt {
            format!(
                "{}: rebuilt, {} documents, in {s:.2} s{}",
                r.dataset,
                r.documents,
                r.reason
                    .as_ref()
                    .map_or(String::new(), |why| format!(" (because {why})"))
            )
        } else {
            format!(
                "{}: recomputed {} documents, reindexed {}, {} context areas changed, in {s:.2} s; {} documents",
                r.dataset, r.recomputed, r.reindexed, r.areas_changed, r.documents
            )
        }
    })
}
