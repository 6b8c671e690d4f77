//! Derive before apply: the affected tiles of a diff, computed from the
//! store's old state and the diff's new state, before the store moves on.
//!
//! The order is the contract: (1) parse the diff, (2) derive every affected
//! set from old and new state, (3) apply the diff to the store in one
//! transaction, (4) update the derived datasets from the sets of step 2.
//! Step 2 after step 3 would lose every deletion: a deleted feature's
//! geometry exists only in the store before the diff lands.
//!
//! What exists so far: tile expiry for nodes, ways (including ways whose
//! nodes moved) and multipolygon and boundary relations (their areas
//! assembled from member ways, when a member or a member's node moved), with
//! a tag filter and a buffer.

use crate::model::{Action, Change, Element, MemberKind, Node, Relation, Tags, Way};
use crate::store::{OsmRead, Store, StoreError, Writer};
use highwater_core::tile::{self, Cells, Tile};
use std::collections::{BTreeMap, BTreeSet};

/// Keys that never matter to a layer reading "every key".
pub const METADATA_KEYS: [&str; 5] = ["created_by", "source", "note", "fixme", "FIXME"];

/// What a tile layer reads and where.
#[derive(Clone, Debug)]
pub struct TileLayer {
    pub zoom_min: u8,
    pub zoom_max: u8,
    /// `None`: every key but metadata.
    pub keys: Option<BTreeSet<String>>,
    /// In tile widths.
    pub buffer: f64,
    /// When only an area's geometry changed (its tags did not), expire the
    /// tiles its boundary crossed before or after, and the inside tiles of
    /// exactly one of the two shapes; an inside tile of both shapes that no
    /// boundary crosses shows the same thing before and after.
    pub diff_expire: bool,
}

impl TileLayer {
    fn relevant<'t>(&self, tags: &'t Tags) -> BTreeMap<&'t str, &'t str> {
        tags.iter()
            .filter(|(k, _)| match &self.keys {
                Some(keys) => keys.contains(k.as_str()),
                None => !METADATA_KEYS.contains(&k.as_str()),
            })
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// The last version of each element in a diff (or a batch of diffs).
pub fn merge(changes: &[Change]) -> BTreeMap<(MemberKind, i64), Change> {
    let mut out = BTreeMap::new();
    for c in changes {
        let key = match &c.element {
            Element::Node(n) => (MemberKind::Node, n.id),
            Element::Way(w) => (MemberKind::Way, w.id),
            Element::Relation(r) => (MemberKind::Relation, r.id),
        };
        out.insert(key, c.clone());
    }
    out
}

/// How much a derivation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub changes: usize,
    /// Changes that touched only keys the layer never reads.
    pub filtered: usize,
}

/// Geometry of one feature, in world coordinates.
enum Geom {
    Point((f64, f64)),
    Line(Vec<(f64, f64)>),
    Area(Vec<(f64, f64)>),
    /// A relation's rings (outer and inner; even-odd makes holes).
    Rings(Vec<Vec<(f64, f64)>>),
    /// An area whose tags did not change, before and after (`diff_expire`).
    AreaDiff(Vec<Vec<(f64, f64)>>, Vec<Vec<(f64, f64)>>),
}

type WayLookup<'a> = dyn Fn(i64) -> Result<Option<Way>, StoreError> + 'a;
type NodeLookup<'a> = dyn Fn(i64) -> Result<Option<(f64, f64)>, StoreError> + 'a;

/// Joins a relation's member ways end to end into rings. A chain that does
/// not close stays a ring anyway (closed by its first point), which errs
/// towards expiring more, never less.
fn assemble(
    r: &Relation,
    way: &WayLookup<'_>,
    loc: &NodeLookup<'_>,
) -> Result<Vec<Vec<(f64, f64)>>, StoreError> {
    let mut pieces: Vec<Vec<i64>> = Vec::new();
    for m in r.members.iter().filter(|m| m.kind == MemberKind::Way) {
        if let Some(w) = way(m.id)? {
            if w.refs.len() >= 2 {
                pieces.push(w.refs);
            }
        }
    }
    let mut rings = Vec::new();
    while let Some(mut ring) = pieces.pop() {
        while ring.first() != ring.last() {
            let end = *ring.last().expect("non-empty");
            let Some(i) = pieces
                .iter()
                .position(|p| p.first() == Some(&end) || p.last() == Some(&end))
            else {
                break;
            };
            let mut next = pieces.swap_remove(i);
            if next.first() != Some(&end) {
                next.reverse();
            }
            ring.extend_from_slice(&next[1..]);
        }
        let mut pts = Vec::with_capacity(ring.len() + 1);
        for id in &ring {
            if let Some(p) = loc(*id)? {
                pts.push(p);
            }
        }
        if pts.len() >= 3 {
            if pts.first() != pts.last() {
                pts.push(pts[0]);
            }
            rings.push(pts);
        }
    }
    Ok(rings)
}

fn is_area(w: &Way) -> bool {
    w.refs.len() > 3
        && w.refs.first() == w.refs.last()
        && (w.tags.get("area").is_some_and(|v| v == "yes")
            || [
                "building", "landuse", "natural", "leisure", "amenity", "place",
            ]
            .iter()
            .any(|k| w.tags.contains_key(*k)))
}

fn node_world(n: &Node) -> Option<(f64, f64)> {
    n.lonlat().map(|(lon, lat)| tile::world(lon, lat))
}

/// Derives the tiles a diff affects, from the store as it is now (old) and
/// the merged changes (new). Reads only; the store is not changed.
pub fn affected_tiles(
    store: &impl OsmRead,
    changes: &[Change],
    layer: &TileLayer,
) -> Result<(BTreeSet<Tile>, Stats), StoreError> {
    let merged = merge(changes);
    let mut stats = Stats {
        changes: merged.len(),
        ..Stats::default()
    };
    // New node locations from the diff; `None` for a deleted node.
    let mut new_nodes: BTreeMap<i64, Option<&Node>> = BTreeMap::new();
    for ((kind, id), c) in &merged {
        if let (MemberKind::Node, Element::Node(n)) = (kind, &c.element) {
            new_nodes.insert(*id, (c.action != Action::Delete).then_some(n));
        }
    }
    let new_loc = |id: i64| -> Result<Option<(f64, f64)>, StoreError> {
        match new_nodes.get(&id) {
            Some(Some(n)) => Ok(node_world(n)),
            Some(None) => Ok(None),
            None => Ok(store.node(id)?.as_ref().and_then(node_world)),
        }
    };
    let old_loc = |id: i64| -> Result<Option<(f64, f64)>, StoreError> {
        Ok(store.node(id)?.as_ref().and_then(node_world))
    };
    let mut geoms: Vec<Geom> = Vec::new();
    let mut ways: BTreeSet<i64> = BTreeSet::new();
    for ((kind, id), c) in &merged {
        match (kind, &c.element) {
            (MemberKind::Node, Element::Node(n)) => {
                let old = store.node(*id)?;
                let new = (c.action != Action::Delete).then_some(n);
                let moved =
                    old.as_ref().map(|o| (o.lat_e7, o.lon_e7)) != new.map(|n| (n.lat_e7, n.lon_e7));
                if moved {
                    // Every way through this node changes shape.
                    ways.extend(store.ways_of_node(*id)?);
                }
                let old_rel = old
                    .as_ref()
                    .map(|o| layer.relevant(&o.tags))
                    .unwrap_or_default();
                let new_rel = new.map(|n| layer.relevant(&n.tags)).unwrap_or_default();
                if old_rel.is_empty() && new_rel.is_empty() {
                    if !moved {
                        stats.filtered += 1;
                    }
                    continue;
                }
                if !moved && old_rel == new_rel {
                    stats.filtered += 1;
                    continue;
                }
                if let Some(p) = old.as_ref().and_then(node_world) {
                    if !old_rel.is_empty() {
                        geoms.push(Geom::Point(p));
                    }
                }
                if let Some(p) = new.and_then(node_world) {
                    if !new_rel.is_empty() {
                        geoms.push(Geom::Point(p));
                    }
                }
            }
            (MemberKind::Way, _) => {
                ways.insert(*id);
            }
            _ => {}
        }
    }
    let mut relations: BTreeSet<i64> = merged
        .keys()
        .filter(|(k, _)| *k == MemberKind::Relation)
        .map(|(_, id)| *id)
        .collect();
    for &id in &ways {
        relations.extend(store.relations_of(MemberKind::Way, id)?);
    }
    for id in ways {
        let old = store.way(id)?;
        let new: Option<Way> = match merged.get(&(MemberKind::Way, id)) {
            Some(c) if c.action == Action::Delete => None,
            Some(Change {
                element: Element::Way(w),
                ..
            }) => Some(w.clone()),
            _ => old.clone(),
        };
        let old_rel = old
            .as_ref()
            .map(|w| layer.relevant(&w.tags))
            .unwrap_or_default();
        let new_rel = new
            .as_ref()
            .map(|w| layer.relevant(&w.tags))
            .unwrap_or_default();
        if old_rel.is_empty() && new_rel.is_empty() {
            stats.filtered += 1;
            continue;
        }
        let points = |w: &Way,
                      loc: &dyn Fn(i64) -> Result<Option<(f64, f64)>, StoreError>|
         -> Result<Vec<(f64, f64)>, StoreError> {
            let mut pts = Vec::with_capacity(w.refs.len());
            for r in &w.refs {
                if let Some(p) = loc(*r)? {
                    pts.push(p);
                }
            }
            Ok(pts)
        };
        let old_pts = match &old {
            Some(w) => points(w, &old_loc)?,
            None => Vec::new(),
        };
        let new_pts = match &new {
            Some(w) => points(w, &new_loc)?,
            None => Vec::new(),
        };
        // Same shape, and the same keys as far as the layer reads them: a
        // change that touched only other keys expires nothing.
        if old.is_some() && new.is_some() && old_rel == new_rel && old_pts == new_pts {
            stats.filtered += 1;
            continue;
        }
        let geom = |w: &Way, pts: Vec<(f64, f64)>| match pts.len() {
            0 => None,
            _ if is_area(w) => Some(Geom::Area(pts)),
            _ => Some(Geom::Line(pts)),
        };
        if let (true, Some(o), Some(n)) = (layer.diff_expire && old_rel == new_rel, &old, &new) {
            if is_area(o) && is_area(n) && old_pts.len() > 2 && new_pts.len() > 2 {
                geoms.push(Geom::AreaDiff(vec![old_pts], vec![new_pts]));
                continue;
            }
        }
        if let Some(w) = old.as_ref().filter(|_| !old_rel.is_empty()) {
            geoms.extend(geom(w, old_pts));
        }
        if let Some(w) = new.as_ref().filter(|_| !new_rel.is_empty()) {
            geoms.extend(geom(w, new_pts));
        }
    }
    for id in relations {
        let old = store.relation(id)?;
        let new: Option<Relation> = match merged.get(&(MemberKind::Relation, id)) {
            Some(c) if c.action == Action::Delete => None,
            Some(Change {
                element: Element::Relation(r),
                ..
            }) => Some(r.clone()),
            _ => old.clone(),
        };
        let is_area_rel = |r: &Relation| {
            r.tags
                .get("type")
                .is_some_and(|t| t == "multipolygon" || t == "boundary")
        };
        let old_rel = old
            .as_ref()
            .filter(|r| is_area_rel(r))
            .map(|r| layer.relevant(&r.tags))
            .unwrap_or_default();
        let new_rel = new
            .as_ref()
            .filter(|r| is_area_rel(r))
            .map(|r| layer.relevant(&r.tags))
            .unwrap_or_default();
        if old_rel.is_empty() && new_rel.is_empty() {
            continue;
        }
        // Old rings from the store as it is; new rings from the diff's way
        // versions and node locations where it has them.
        let new_way = |wid: i64| -> Result<Option<Way>, StoreError> {
            Ok(match merged.get(&(MemberKind::Way, wid)) {
                Some(c) if c.action == Action::Delete => None,
                Some(Change {
                    element: Element::Way(w),
                    ..
                }) => Some(w.clone()),
                _ => store.way(wid)?,
            })
        };
        let old_rings = match old.as_ref().filter(|_| !old_rel.is_empty()) {
            Some(r) => assemble(r, &|wid| store.way(wid), &old_loc)?,
            None => Vec::new(),
        };
        let new_rings = match new.as_ref().filter(|_| !new_rel.is_empty()) {
            Some(r) => assemble(r, &new_way, &new_loc)?,
            None => Vec::new(),
        };
        if layer.diff_expire && old_rel == new_rel && !old_rings.is_empty() && !new_rings.is_empty()
        {
            geoms.push(Geom::AreaDiff(old_rings, new_rings));
        } else {
            for rings in [old_rings, new_rings] {
                if !rings.is_empty() {
                    geoms.push(Geom::Rings(rings));
                }
            }
        }
    }
    let mut cells = Cells::new();
    for g in &geoms {
        match g {
            Geom::Point(p) => tile::add_point(*p, layer.zoom_max, layer.buffer, &mut cells),
            Geom::Line(pts) => tile::add_line(pts, layer.zoom_max, layer.buffer, &mut cells),
            Geom::Area(pts) => tile::add_polygon(
                std::slice::from_ref(pts),
                layer.zoom_max,
                layer.buffer,
                &mut cells,
            ),
            Geom::Rings(rings) => {
                tile::add_polygon(rings, layer.zoom_max, layer.buffer, &mut cells)
            }
            Geom::AreaDiff(before, after) => {
                for r in before.iter().chain(after) {
                    tile::add_line(r, layer.zoom_max, layer.buffer, &mut cells);
                }
                let (mut a, mut b) = (Cells::new(), Cells::new());
                tile::add_fill(before, layer.zoom_max, &mut a);
                tile::add_fill(after, layer.zoom_max, &mut b);
                cells.extend(a.symmetric_difference(&b).copied());
            }
        }
    }
    Ok((
        tile::with_parents(&cells, layer.zoom_max, layer.zoom_min),
        stats,
    ))
}

/// Applies one diff's merged changes through a writer (last version wins;
/// a modify of something never seen is an upsert).
pub(crate) fn apply_in(w: &mut Writer<'_>, changes: &[Change]) -> Result<(), StoreError> {
    for ((kind, id), c) in &merge(changes) {
        match c.action {
            Action::Delete => w.delete(*kind, *id)?,
            // A modify of something never seen is an upsert.
            Action::Create | Action::Modify => w.put(&c.element)?,
        }
    }
    Ok(())
}

/// Derives and applies a batch of diffs, in order, in one transaction: each
/// diff is derived against the state the previous ones left, so the result
/// is the union of applying them one by one, and the store moves by the
/// whole batch or not at all.
pub fn derive_and_apply(
    store: &mut Store,
    diffs: &[Vec<Change>],
    layer: &TileLayer,
) -> Result<(BTreeSet<Tile>, Stats), StoreError> {
    store.write(|w| {
        let mut tiles = BTreeSet::new();
        let mut stats = Stats::default();
        for d in diffs {
            let (t, s) = affected_tiles(&*w, d, layer)?;
            tiles.extend(t);
            stats.changes += s.changes;
            stats.filtered += s.filtered;
            apply_in(w, d)?;
        }
        Ok((tiles, stats))
    })
}
