//! Derive before apply: the affected tiles of a diff, computed from the
//! store's old state and the diff's new state, before the store moves on.
//!
//! The order is the contract: (1) parse the diff, (2) derive every affected
//! set from old and new state, (3) apply the diff to the store in one
//! transaction, (4) update the derived datasets from the sets of step 2.
//! Step 2 after step 3 would lose every deletion: a deleted feature's
//! geometry exists only in the store before the diff lands. With a live
//! shapes index, step 2 reads the old features from it and the affected
//! set is finished after step 3, in the same transaction, from the rows the
//! apply rewrote ([`Before`]): the old side is still read before the diff.
//! Without one, both sides are assembled in step 2 ([`affected_tiles_touched`]).
//!
//! Tile expiry covers nodes, ways (including ways whose nodes moved),
//! multipolygon and boundary relations (their areas assembled from member
//! ways, when a member or a member's node moved) and route relations, each
//! as [`crate::features`] describes, with a tag filter and a buffer
//! computed at every zoom in the layer's range.

use crate::features::{self, feature, Current, ElementKey, Feature, LowZoom, Overlay};
use crate::geom::{Shape, View};
use crate::model::{Action, Change, Element, MemberKind};
use crate::store::{OsmRead, Store, StoreError, Writer};
use highwater_core::tile::Tile;
use std::collections::{BTreeMap, BTreeSet};

// What a layer reads is the features' concern; re-exported here, where
// callers of expiry have always found it.
pub use crate::features::{TileLayer, METADATA_KEYS};

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
    /// Changes that affected nothing the layer shows: tags it never reads,
    /// an untagged node no way uses, a relation edit that left its shape and
    /// read tags as they were.
    pub filtered: usize,
    /// Features whose tags the layer reads changed (created, deleted or
    /// edited): such a diff deriving no tile is worth a warning (issue 23).
    pub read_tags_changed: usize,
}

/// The elements a diff may change the feature of: its own, the ways through
/// nodes that moved, and the relations of every such way and of the diff's
/// ways.
#[derive(Clone, Debug, Default)]
pub struct Touched {
    pub all: BTreeSet<ElementKey>,
    /// The diff's elements that touched others (a node that moved under a
    /// way, a way in a relation).
    pub with_dependents: BTreeSet<ElementKey>,
}

/// Finds what a diff's merged changes touch, reading the store before they
/// are applied.
pub fn touched(
    store: &(impl OsmRead + ?Sized),
    merged: &BTreeMap<ElementKey, Change>,
) -> Result<Touched, StoreError> {
    let mut t = Touched::default();
    let mut ways: BTreeSet<i64> = BTreeSet::new();
    for ((kind, id), c) in merged {
        t.all.insert((*kind, *id));
        match (kind, &c.element) {
            (MemberKind::Node, Element::Node(n)) => {
                let before = store.node(*id)?.map(|o| (o.lat_e7, o.lon_e7));
                let after = (c.action != Action::Delete).then_some((n.lat_e7, n.lon_e7));
                if before != after {
                    // Every way through this node changes shape.
                    let through = store.ways_of_node(*id)?;
                    if !through.is_empty() {
                        t.with_dependents.insert((*kind, *id));
                    }
                    ways.extend(through);
                }
            }
            (MemberKind::Way, _) => {
                ways.insert(*id);
            }
            _ => {}
        }
    }
    for id in ways {
        t.all.insert((MemberKind::Way, id));
        let of = store.relations_of(MemberKind::Way, id)?;
        if !of.is_empty() && merged.contains_key(&(MemberKind::Way, id)) {
            t.with_dependents.insert((MemberKind::Way, id));
        }
        t.all
            .extend(of.into_iter().map(|r| (MemberKind::Relation, r)));
    }
    Ok(t)
}

/// Brings the shapes index up to date for the touched elements, reading the
/// store after the diff is applied: each one's bounding box, its feature
/// (every key) and the lowest zoom it shows at.
///
/// A way or route the diff did not edit, whose nodes it only moved, is not
/// assembled again: its row is the old one with the moved nodes' points
/// replaced ([`moved`]).
pub(crate) fn index_shapes(
    w: &mut Writer<'_>,
    keys: &BTreeSet<ElementKey>,
    diff: &BTreeMap<ElementKey, Change>,
    low: &LowZoom,
) -> Result<(), StoreError> {
    let every = TileLayer::every_key();
    let mut rows = Vec::with_capacity(keys.len());
    {
        let view = Current::new(&*w);
        for &(kind, id) in keys {
            let f = match moved(&view, &*w, kind, id, diff)? {
                Some(f) => f,
                None => feature(&view, kind, id, &every)?,
            };
            rows.push((
                kind,
                id,
                f.map(|f| (f.shape.bbox(), features::encode(&f), low.min_zoom(&f))),
            ));
        }
    }
    for (kind, id, row) in rows {
        w.set_shape(
            kind,
            id,
            row.as_ref().map(|(b, d, l)| (*b, d.as_slice(), *l)),
        )?;
    }
    Ok(())
}

/// The feature of way or route relation `id` after a diff that did not
/// edit it, from its row in the shapes index before the diff: the points
/// of the nodes the diff changed are replaced by where they are now.
/// `None` when that cannot be exact, and the caller assembles the element
/// from nodes: the element, or a way it is made of, is in the diff; it has
/// no row; a multipolygon (whose rings and their orientation depend on the
/// points); or a way whose points in the row do not line up one for one
/// with its nodes (a node was without a location before, or is now). The
/// row holds the points of every located node in order, bit for bit as
/// assembling computes them, so replacing some is assembling again without
/// reading the others. A minutely diff moves a few thousand nodes under
/// ways and routes of hundreds of nodes each; assembling those read them
/// all.
fn moved(
    view: &Current<'_, Writer<'_>>,
    w: &Writer<'_>,
    kind: MemberKind,
    id: i64,
    diff: &BTreeMap<ElementKey, Change>,
) -> Result<Option<Option<Feature>>, StoreError> {
    if kind == MemberKind::Node || diff.contains_key(&(kind, id)) {
        return Ok(None);
    }
    // The ways whose points make the row's parts, in order.
    let mut ways = match kind {
        MemberKind::Way => {
            let Some(way) = w.way(id)? else {
                return Ok(None);
            };
            vec![way]
        }
        _ => {
            let Some(r) = w.relation(id)? else {
                return Ok(None);
            };
            if features::relation_kind(&r) != Some("route") {
                return Ok(None);
            }
            let mut ways = Vec::new();
            for m in r.members.iter().filter(|m| m.kind == MemberKind::Way) {
                if diff.contains_key(&(MemberKind::Way, m.id)) {
                    return Ok(None);
                }
                // A member way missing from the store is skipped, as
                // assembling skips it.
                ways.extend(w.way(m.id)?);
            }
            ways
        }
    };
    let Some(old) = features::indexed(w, kind, id)? else {
        return Ok(None);
    };
    let (Shape::Lines(mut parts) | Shape::Polygon(mut parts)) = old.shape else {
        return Ok(None);
    };
    // Every way gave a part of all its nodes: assembling again would give
    // the same parts, the moved points aside.
    if parts.len() != ways.len()
        || parts
            .iter()
            .zip(&ways)
            .any(|(p, w)| p.len() != w.refs.len() || w.refs.len() < 2)
    {
        return Ok(None);
    }
    for (part, w) in parts.iter_mut().zip(&ways) {
        for (p, r) in part.iter_mut().zip(&w.refs) {
            if diff.contains_key(&(MemberKind::Node, *r)) {
                match view.loc(*r)? {
                    Some(now) => *p = now,
                    None => return Ok(None),
                }
            }
        }
    }
    let shape = match kind {
        // A way is judged an area by its own tags, as assembling judges it.
        MemberKind::Way => features::way_shape(
            &ways.pop().expect("one way"),
            parts.pop().expect("one part"),
        ),
        _ => Some(Shape::Lines(parts)),
    };
    Ok(Some(shape.map(|shape| Feature {
        tags: old.tags,
        shape,
    })))
}

/// Rebuilds the shapes index from every feature in the store: part of
/// import and of every full rebuild. `low` says which features show at low
/// zooms; its id is recorded, so that apply and drain know the index is
/// theirs.
/// Builds the shapes index if the store has none: an import leaves none,
/// and the first dataset that reads it (a search or aggregates drain; a
/// tile build or drain rebuilds it in any case) builds it.
pub fn ensure_shapes(store: &mut Store) -> Result<(), StoreError> {
    if store.meta("shapes")?.is_none() {
        rebuild_shapes(store, &LowZoom::none())?;
    }
    Ok(())
}

pub fn rebuild_shapes(store: &mut Store, low: &LowZoom) -> Result<usize, StoreError> {
    use rayon::prelude::*;
    let every = TileLayer::every_key();
    // One transaction: the index is emptied and refilled at once, or not at
    // all. The features are read through the writer, a page at a time, so
    // the rebuild holds one page whatever the store's size.
    store.write(|w| {
        w.clear_shapes()?;
        let mut pass = features::Pass::new(&every);
        let mut n = 0;
        while let Some(page) = pass.next_page(&*w)? {
            let rows: Vec<(Vec<u8>, u8)> = page
                .par_iter()
                .map(|(_, f)| (features::encode(f), low.min_zoom(f)))
                .collect();
            w.insert_shapes(
                page.iter()
                    .zip(&rows)
                    .map(|((k, f), (data, l))| (*k, f.shape.bbox(), data.as_slice(), *l)),
            )?;
            n += page.len();
        }
        w.set_meta("shapes", "1")?;
        w.set_meta("shapes_low", &low.id)?;
        Ok(n)
    })
}

/// Derives the tiles a diff affects, from the store as it is now (old) and
/// the store with the merged changes laid over it (new). Reads only; the
/// store is not changed.
///
/// The changed features are the diff's own elements, the ways through nodes
/// that moved, and the relations of every changed way. For each, the old and
/// the new feature (see [`crate::features`]) are compared: equal features
/// expire nothing; otherwise, at every zoom (each with its own buffer), the
/// tiles either one touches expire, or with `diff_expire` and unchanged
/// tags, only the tiles whose content signature changed.
pub fn affected_tiles(
    store: &(impl OsmRead + ?Sized),
    changes: &[Change],
    layer: &TileLayer,
) -> Result<(BTreeSet<Tile>, Stats), StoreError> {
    affected_tiles_touched(store, changes, layer).map(|(t, s, _)| (t.into_keys().collect(), s))
}

/// The sea before and after a diff, when the layer shows it and the diff
/// touches a coastline way (one of its own, old or new, or one through a
/// node it moves): each assembled whole ([`crate::coast`]).
#[allow(clippy::type_complexity)]
fn sea_change<S: OsmRead + ?Sized>(
    store: &S,
    old_view: &Current<'_, S>,
    new_view: &Overlay<'_, S>,
    touched: &Touched,
    layer: &TileLayer,
) -> Result<Option<(Option<Feature>, Option<Feature>)>, StoreError> {
    use crate::features::View;
    if !layer.shows_ocean() {
        return Ok(None);
    }
    let mut hit = false;
    for &(kind, id) in &touched.all {
        if kind != MemberKind::Way {
            continue;
        }
        let coast =
            |w: Option<crate::model::Way>| w.is_some_and(|w| crate::coast::is_coastline(&w.tags));
        if coast(old_view.way(id)?) || coast(new_view.way(id)?) {
            hit = true;
            break;
        }
    }
    if !hit {
        return Ok(None);
    }
    let bounds = crate::coast::bounds_of(store.meta(crate::coast::BOUNDS_META)?.as_deref());
    let before = store.coastline_ways()?;
    let after: BTreeSet<i64> = before
        .iter()
        .copied()
        .chain(
            new_view
                .changes
                .keys()
                .filter(|(k, _)| *k == MemberKind::Way)
                .map(|(_, id)| *id),
        )
        .collect();
    let old = crate::coast::ocean_feature(old_view, before, bounds)?;
    let new = crate::coast::ocean_feature(new_view, after, bounds)?;
    Ok(Some((old, new)))
}

/// The tiles a diff affects, each with the features whose cut in it the
/// diff changes ([`crate::coast::OCEAN_KEY`] for the sea), and the sea
/// after the diff when the diff touched a coastline (`Some(None)`: no sea
/// any more), for the tiles dataset to keep. Every other
/// feature shows in the tile as it did, which is what lets a drain patch a
/// tile instead of re-cutting it ([`crate::tiles::patch`]).
pub fn affected_tiles_touched(
    store: &(impl OsmRead + ?Sized),
    changes: &[Change],
    layer: &TileLayer,
) -> Result<Affected, StoreError> {
    let merged = merge(changes);
    let old_view = Current::new(store);
    let new_view = Overlay {
        store: &old_view,
        changes: &merged,
    };
    let touched = touched(store, &merged)?;
    let mut old = Vec::with_capacity(touched.all.len());
    let mut new = Vec::with_capacity(touched.all.len());
    for &(kind, id) in &touched.all {
        old.push(feature(&old_view, kind, id, layer)?);
        new.push(feature(&new_view, kind, id, layer)?);
    }
    let sea = sea_change(store, &old_view, &new_view, &touched, layer)?;
    let before = Before {
        changed: merged.keys().copied().collect(),
        touched,
        old,
        sea,
    };
    Ok(before.finish(new, layer))
}

/// A diff's affected tiles, each with the features whose cut in it the
/// diff changes; the derivation's stats; and the sea after the diff when it
/// touched a coastline (`Some(None)`: no sea any more).
pub type Affected = (
    BTreeMap<Tile, BTreeSet<ElementKey>>,
    Stats,
    Option<Option<Feature>>,
);

/// What step 1 keeps of a diff for a tile layer when the store's shapes
/// index is live ([`affected_before`]): the touched elements and their
/// features before the diff, read from the index. Step 3 reads their
/// features after it from the index that the apply just rewrote
/// ([`Before::after`]): each touched feature is assembled from nodes once
/// per diff (by the index's upkeep), not once per side and dataset. A
/// deletion's old feature is here, read before the diff removed it.
#[derive(Clone, Debug)]
pub struct Before {
    /// The diff's own elements (its merged changes' keys).
    changed: BTreeSet<ElementKey>,
    touched: Touched,
    /// Per element of `touched.all`, in its order: its feature for the
    /// layer before the diff.
    old: Vec<Option<Feature>>,
    /// The sea before and after, when the diff touched a coastline (as
    /// [`affected_tiles_touched`] assembles them).
    sea: Option<(Option<Feature>, Option<Feature>)>,
}

/// Step 1 of [`affected_tiles_touched`] for a store whose shapes index is
/// live (`shapes` in its meta, kept by [`apply_indexed`] in the same
/// transaction): the old features from the index, narrowed to the layer
/// (equal to assembling them for the layer: a layer reads a subset of
/// every key, and a feature's shape never depends on which keys are read).
/// The sea is still assembled here, before and after, when touched.
pub fn affected_before(
    store: &(impl OsmRead + ?Sized),
    changes: &[Change],
    layer: &TileLayer,
) -> Result<Before, StoreError> {
    let merged = merge(changes);
    let touched = touched(store, &merged)?;
    let old = indexed_for(store, &touched.all, layer)?;
    let old_view = Current::new(store);
    let new_view = Overlay {
        store: &old_view,
        changes: &merged,
    };
    let sea = sea_change(store, &old_view, &new_view, &touched, layer)?;
    Ok(Before {
        changed: merged.keys().copied().collect(),
        touched,
        old,
        sea,
    })
}

/// Each element's feature for `layer` as the shapes index holds it now
/// (every key, narrowed to the layer's), in `keys`' order.
fn indexed_for(
    store: &(impl OsmRead + ?Sized),
    keys: &BTreeSet<ElementKey>,
    layer: &TileLayer,
) -> Result<Vec<Option<Feature>>, StoreError> {
    keys.iter()
        .map(|&(kind, id)| {
            Ok(features::indexed(store, kind, id)?.and_then(|f| layer.narrow_owned(f)))
        })
        .collect()
}

impl Before {
    /// Step 3: the affected tiles (as [`affected_tiles_touched`] gives
    /// them), the features after the diff read from the store's shapes
    /// index as the apply left it.
    pub fn after(
        self,
        store: &(impl OsmRead + ?Sized),
        layer: &TileLayer,
    ) -> Result<Affected, StoreError> {
        let new = indexed_for(store, &self.touched.all, layer)?;
        Ok(self.finish(new, layer))
    }

    /// The affected tiles from each touched feature's old and `new` (in
    /// `touched.all`'s order).
    fn finish(self, new: Vec<Option<Feature>>, layer: &TileLayer) -> Affected {
        debug_assert_eq!(self.old.len(), new.len());
        let mut stats = Stats {
            changes: self.changed.len(),
            ..Stats::default()
        };
        let mut pairs: Vec<(ElementKey, Option<Feature>, Option<Feature>)> = Vec::new();
        for ((&key, old), new) in self.touched.all.iter().zip(self.old).zip(new) {
            let same = old == new;
            if same && self.changed.contains(&key) && !self.touched.with_dependents.contains(&key) {
                stats.filtered += 1;
            }
            if !same {
                if old.as_ref().map(|f| &f.tags) != new.as_ref().map(|f| &f.tags) {
                    stats.read_tags_changed += 1;
                }
                pairs.push((key, old, new));
            }
        }
        if let Some((old, new)) = &self.sea {
            if old != new {
                pairs.push((crate::coast::OCEAN_KEY, old.clone(), new.clone()));
            }
        }
        let tiles = tiles_of(&pairs, layer);
        (tiles, stats, self.sea.map(|(_, new)| new))
    }
}

/// Per tile, the features whose cut in it changed between each pair's old
/// and new feature (pairs that differ). Each pair is placed and signed on
/// its own (in parallel: no store is read here); the tiles are merged
/// after.
fn tiles_of(
    pairs: &[(ElementKey, Option<Feature>, Option<Feature>)],
    layer: &TileLayer,
) -> BTreeMap<Tile, BTreeSet<ElementKey>> {
    use rayon::prelude::*;
    let per: Vec<(ElementKey, Vec<Tile>)> = pairs
        .par_iter()
        .map(|(key, old, new)| (*key, changed_tiles(old, new, layer)))
        .collect();
    let mut tiles: BTreeMap<Tile, BTreeSet<ElementKey>> = BTreeMap::new();
    for (key, list) in per {
        for t in list {
            tiles.entry(t).or_default().insert(key);
        }
    }
    tiles
}

/// The tiles, at every zoom of the layer, where a feature's cut differs
/// between `old` and `new`.
fn changed_tiles(old: &Option<Feature>, new: &Option<Feature>, layer: &TileLayer) -> Vec<Tile> {
    // With a schema, the signatures hash each placement's layer and
    // attributes with its shape, so comparing them is exact whatever
    // changed; without one, only a geometry-only change may be compared.
    let compare = layer.diff_expire
        && (layer.schema.is_some() || matches!((old, new), (Some(o), Some(n)) if o.tags == n.tags));
    let place = |f: &Option<Feature>| f.as_ref().map(|f| layer.place(f)).unwrap_or_default();
    let (po, pn) = (place(old), place(new));
    let mut out = Vec::new();
    if po == pn {
        return out;
    }
    for z in layer.zoom_min..=layer.zoom_max {
        let (a, b) = (layer.signatures(&po, z), layer.signatures(&pn, z));
        let mut add = |(x, y): (u32, u32)| out.push(Tile { z, x, y });
        if compare {
            for (c, h) in &a {
                if b.get(c) != Some(h) {
                    add(*c);
                }
            }
            for c in b.keys().filter(|c| !a.contains_key(c)) {
                add(*c);
            }
        } else {
            a.keys().chain(b.keys()).for_each(|c| add(*c));
        }
    }
    out
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

/// Applies one diff and keeps the shapes index current (when the store has
/// one): the touched elements are found before the diff lands, their new
/// shapes after.
///
/// Bounding boxes and features are kept whatever `low` is (search and
/// aggregates read them too); a low-zoom index built for another set of
/// datasets (its id in `shapes_low` differs from `low`'s) is unmarked, and
/// the next drain or build rebuilds it.
pub(crate) fn apply_indexed(
    w: &mut Writer<'_>,
    changes: &[Change],
    low: &LowZoom,
) -> Result<Touched, StoreError> {
    let live = w.meta("shapes")?.is_some();
    let merged = merge(changes);
    let t = touched(&*w, &merged)?;
    apply_in(w, changes)?;
    if live {
        index_shapes(w, &t.all, &merged, low)?;
        // The rows just written say "low" by this predicate; an index
        // marked for another is now a mix of both: unmark it, so that the
        // next drain rebuilds it rather than trust it.
        if w.meta("shapes_low")?.as_deref() != Some(low.id.as_str()) {
            w.del_meta("shapes_low")?;
        }
    }
    Ok(t)
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
            apply_indexed(w, d, &LowZoom::none())?;
        }
        Ok((tiles, stats))
    })
}
