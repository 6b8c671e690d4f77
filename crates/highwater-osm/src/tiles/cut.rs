//! Cutting one tile: features (world coordinates) in, a vector tile out.
//!
//! The cut of a tile is a function of what each feature shows in it and of
//! nothing else, which is what makes re-cutting only dirty tiles equal to a
//! rebuild: lines are clipped segment by segment to the tile grown by the
//! buffer; rings are clipped one by one (Sutherland–Hodgman against the
//! box), then made canonical (integer tile coordinates, no repeated or
//! collinear points, a fixed starting point), oriented by their nesting
//! (outer rings clockwise, holes counter-clockwise, as the MVT
//! specification asks) and each hole follows its outer ring.

use crate::features::{nesting, ElementKey, Shape, TileLayer, P};
use crate::model::MemberKind;
use crate::mvt::{self, GeomType, TileFeature, Value, EXTENT};
use crate::schema::Placement;
use highwater_core::tile::{self, Tile};
use std::collections::{BTreeMap, BTreeSet};

/// A feature's id in a tile: the OSM id with its type in the low two bits
/// (node 0, way 1, relation 2), as several OSM tile schemas do.
pub fn feature_id(key: ElementKey) -> u64 {
    let t = match key.0 {
        MemberKind::Node => 0,
        MemberKind::Way => 1,
        MemberKind::Relation => 2,
    };
    ((key.1 as u64) << 2) | t
}

/// The box a tile is cut to, in tile units (0..EXTENT), grown by `buffer`
/// tile widths.
struct Frame {
    z: u8,
    x: f64,
    y: f64,
    lo: f64,
    hi: f64,
}

impl Frame {
    fn new(t: Tile, buffer: f64) -> Frame {
        let e = EXTENT as f64;
        Frame {
            z: t.z,
            x: t.x as f64,
            y: t.y as f64,
            lo: -buffer * e,
            hi: e + buffer * e,
        }
    }
    fn local(&self, p: P) -> (f64, f64) {
        let n = (1u64 << self.z) as f64;
        let e = EXTENT as f64;
        ((p.0 * n - self.x) * e, (p.1 * n - self.y) * e)
    }
}

fn quantize(p: (f64, f64)) -> (i32, i32) {
    (p.0.round() as i32, p.1.round() as i32)
}

fn dedupe(v: &mut Vec<(i32, i32)>) {
    v.dedup();
}

fn clip_line(f: &Frame, line: &[P]) -> Vec<Vec<(i32, i32)>> {
    let mut pieces = Vec::new();
    let mut cur: Vec<(i32, i32)> = Vec::new();
    for s in line.windows(2) {
        let (a, b) = (f.local(s[0]), f.local(s[1]));
        match tile::clip_segment(a, b, (f.lo, f.lo, f.hi, f.hi)) {
            Some((ca, cb)) => {
                let (qa, qb) = (quantize(ca), quantize(cb));
                // A piece continues while the line stays inside: the clipped
                // start is the previous segment's unclipped end.
                if ca != a || cur.is_empty() {
                    if cur.len() > 1 {
                        pieces.push(std::mem::take(&mut cur));
                    }
                    cur.clear();
                    cur.push(qa);
                }
                cur.push(qb);
                if cb != b {
                    pieces.push(std::mem::take(&mut cur));
                }
            }
            None => {
                if !cur.is_empty() {
                    pieces.push(std::mem::take(&mut cur));
                }
            }
        }
    }
    if !cur.is_empty() {
        pieces.push(cur);
    }
    pieces
        .into_iter()
        .filter_map(|mut p| {
            dedupe(&mut p);
            (p.len() >= 2).then_some(p)
        })
        .collect()
}

/// Sutherland–Hodgman against the four sides of the box.
fn clip_ring(f: &Frame, ring: &[P]) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = ring.iter().map(|p| f.local(*p)).collect();
    if pts.first() == pts.last() {
        pts.pop();
    }
    type Side = (
        fn((f64, f64), f64) -> bool,
        fn((f64, f64), (f64, f64), f64) -> (f64, f64),
    );
    let x_at =
        |a: (f64, f64), b: (f64, f64), x: f64| (x, a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0));
    let y_at =
        |a: (f64, f64), b: (f64, f64), y: f64| (a.0 + (b.0 - a.0) * (y - a.1) / (b.1 - a.1), y);
    let sides: [(Side, f64); 4] = [
        ((|p, v| p.0 >= v, x_at), f.lo),
        ((|p, v| p.0 <= v, x_at), f.hi),
        ((|p, v| p.1 >= v, y_at), f.lo),
        ((|p, v| p.1 <= v, y_at), f.hi),
    ];
    for ((inside, cross), v) in sides {
        if pts.is_empty() {
            break;
        }
        let mut out = Vec::with_capacity(pts.len() + 4);
        let mut prev = *pts.last().expect("non-empty");
        for &p in &pts {
            match (inside(prev, v), inside(p, v)) {
                (true, true) => out.push(p),
                (true, false) => out.push(cross(prev, p, v)),
                (false, true) => {
                    out.push(cross(prev, p, v));
                    out.push(p);
                }
                (false, false) => {}
            }
            prev = p;
        }
        pts = out;
    }
    pts
}

fn area2(r: &[(i32, i32)]) -> i64 {
    let mut a = 0i64;
    for i in 0..r.len() {
        let (p, q) = (r[i], r[(i + 1) % r.len()]);
        a += p.0 as i64 * q.1 as i64 - q.0 as i64 * p.1 as i64;
    }
    a
}

/// Integer ring without repeats, without collinear points (which also
/// removes Sutherland–Hodgman's zero-width bridges along the box), oriented
/// as asked, starting at its smallest rotation. `None` when nothing with an
/// area is left.
fn canonical(pts: &[(f64, f64)], clockwise: bool) -> Option<Vec<(i32, i32)>> {
    let mut r: Vec<(i32, i32)> = pts.iter().map(|p| quantize(*p)).collect();
    loop {
        let before = r.len();
        r.dedup();
        while r.len() > 1 && r.first() == r.last() {
            r.pop();
        }
        let n = r.len();
        if n < 3 {
            return None;
        }
        let keep: Vec<bool> = (0..n)
            .map(|i| {
                let (a, b, c) = (r[(i + n - 1) % n], r[i], r[(i + 1) % n]);
                let cross = (b.0 - a.0) as i64 * (c.1 - b.1) as i64
                    - (b.1 - a.1) as i64 * (c.0 - b.0) as i64;
                cross != 0
            })
            .collect();
        // Drop one collinear point at a time: dropping all at once could
        // remove both ends of a spike's base.
        if let Some(i) = keep.iter().position(|k| !k) {
            r.remove(i);
        }
        if r.len() == before {
            break;
        }
    }
    if r.len() < 3 || area2(&r) == 0 {
        return None;
    }
    if (area2(&r) > 0) != clockwise {
        r.reverse();
    }
    let best = (0..r.len())
        .filter(|&i| r[i] == *r.iter().min().expect("non-empty"))
        .min_by(|&a, &b| {
            let ra = r[a..].iter().chain(&r[..a]);
            let rb = r[b..].iter().chain(&r[..b]);
            ra.cmp(rb)
        })
        .expect("a minimum exists");
    r.rotate_left(best);
    Some(r)
}

fn cut_polygon(f: &Frame, rings: &[Vec<P>]) -> Vec<Vec<(i32, i32)>> {
    let nest = nesting(rings);
    // MVT's "exterior": positive area in tile coordinates (y down).
    let clipped: Vec<Option<Vec<(i32, i32)>>> = rings
        .iter()
        .zip(&nest)
        .map(|(r, (depth, _))| canonical(&clip_ring(f, r), depth % 2 == 0))
        .collect();
    let mut out = Vec::new();
    for (i, (depth, _)) in nest.iter().enumerate() {
        if depth % 2 != 0 {
            continue;
        }
        let Some(outer) = &clipped[i] else { continue };
        let holes: Vec<&Vec<(i32, i32)>> = nest
            .iter()
            .enumerate()
            .filter(|(_, (d, parent))| d % 2 == 1 && *parent == Some(i))
            .filter_map(|(j, _)| clipped[j].as_ref())
            .collect();
        // A hole that covers its outer ring's whole part in the tile (the
        // tile lies inside the hole) leaves nothing of it: the tile shows
        // no part of this ring, as the expiry's even-odd fill says.
        if holes.iter().any(|h| same_ring(h, outer)) {
            continue;
        }
        out.push(outer.clone());
        out.extend(holes.into_iter().cloned());
    }
    out
}

/// Two clipped rings with the same vertices (whatever their direction).
fn same_ring(a: &[(i32, i32)], b: &[(i32, i32)]) -> bool {
    let sorted = |r: &[(i32, i32)]| {
        let mut v = r.to_vec();
        v.sort_unstable();
        v
    };
    a.len() == b.len() && sorted(a) == sorted(b)
}

/// What one shape shows in one tile, if anything.
pub fn cut_shape(
    t: Tile,
    buffer: f64,
    key: ElementKey,
    shape: &Shape,
    attrs: &BTreeMap<String, Value>,
) -> Option<TileFeature> {
    let f = Frame::new(t, buffer);
    let (kind, parts) = match shape {
        Shape::Point(p) => {
            let mut cells = tile::Cells::new();
            tile::add_point(*p, t.z, buffer, &mut cells);
            if !cells.contains(&(t.x, t.y)) {
                return None;
            }
            (GeomType::Point, vec![vec![quantize(f.local(*p))]])
        }
        Shape::Lines(lines) => (
            GeomType::LineString,
            lines.iter().flat_map(|l| clip_line(&f, l)).collect(),
        ),
        Shape::Polygon(rings) => (GeomType::Polygon, cut_polygon(&f, rings)),
    };
    (!parts.is_empty()).then(|| TileFeature {
        id: feature_id(key),
        kind,
        tags: attrs.clone(),
        parts,
    })
}

/// Cuts a tile from the placements of the features that may touch it
/// (sorted by key), as MVT bytes with one layer per tile layer that shows
/// something, in the schema's order; `None` when nothing shows, so the
/// tile is deleted. Within a layer, features keep key order unless the
/// layer sorts by an attribute (a stable sort: ties keep key order).
pub fn cut(
    t: Tile,
    layer: &TileLayer,
    dataset: &str,
    features: &[(ElementKey, &[Placement])],
) -> Option<Vec<u8>> {
    let names = layer.layer_names(dataset);
    let mut per: Vec<Vec<(f64, ElementKey, TileFeature)>> = vec![Vec::new(); names.len()];
    add_cuts(t, layer, features, &mut per);
    encode_layers(&names, per)
}

/// Each placement's cut in `t`, with its layer's sort key, to its layer.
fn add_cuts(
    t: Tile,
    layer: &TileLayer,
    features: &[(ElementKey, &[Placement])],
    per: &mut [Vec<(f64, ElementKey, TileFeature)>],
) {
    for (k, placements) in features {
        for p in placements.iter() {
            let Some(shape) = layer.shape_at(p, t.z) else {
                continue;
            };
            if let Some(tf) = cut_shape(t, layer.buffer, *k, &shape, &p.attrs) {
                per[p.layer].push((sort_key(layer, p.layer, &p.attrs), *k, tf));
            }
        }
    }
}

fn sort_key(layer: &TileLayer, index: usize, attrs: &BTreeMap<String, Value>) -> f64 {
    match &layer.schema {
        Some(s) => s.sort_key(index, attrs).unwrap_or(0.0),
        None => 0.0,
    }
}

/// The layers that show something, in the schema's order, features sorted
/// stably by their sort key.
fn encode_layers(names: &[&str], per: Vec<Vec<(f64, ElementKey, TileFeature)>>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for (name, mut fs) in names.iter().zip(per) {
        if fs.is_empty() {
            continue;
        }
        fs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let fs: Vec<TileFeature> = fs.into_iter().map(|(_, _, f)| f).collect();
        // A tile is its layers' messages one after another (field 3,
        // repeated), so encoding each and joining them is the whole tile.
        out.extend(mvt::encode(name, &fs));
    }
    (!out.is_empty()).then_some(out)
}

/// The element key a tile feature's id names (see [`feature_id`]), if it
/// names one.
fn key_of(id: u64) -> Option<ElementKey> {
    let kind = match id & 3 {
        0 => MemberKind::Node,
        1 => MemberKind::Way,
        2 => MemberKind::Relation,
        _ => return None,
    };
    // Arithmetic shift: negative ids (new elements in local edits) too.
    let key = (kind, (id as i64) >> 2);
    (feature_id(key) == id).then_some(key)
}

/// What [`patch`] made of a tile.
#[derive(Debug, PartialEq, Eq)]
pub enum PatchOutcome {
    /// The tile's bytes (`None`: nothing shows any more).
    Patched(Option<Vec<u8>>),
    /// The old tile is not one this layer cuts (a layer it does not have, a
    /// feature id that names no element): cut it whole instead.
    NotOurs,
}

/// Patches a tile: `old` (its decoded layers) without the `touched`
/// features, and `features` (the touched ones that may show in it, sorted
/// by key) cut anew, each layer in the order [`cut`] gives. Equal to
/// [`cut`] from every candidate when `old` is such a cut and every feature
/// whose cut in the tile changed since is in `touched`
/// ([`crate::tiles::patch`]).
pub fn patch(
    t: Tile,
    layer: &TileLayer,
    dataset: &str,
    old: Vec<(String, Vec<TileFeature>)>,
    touched: &BTreeSet<ElementKey>,
    features: &[(ElementKey, &[Placement])],
) -> PatchOutcome {
    debug_assert!(features.iter().all(|(k, _)| touched.contains(k)));
    debug_assert!(features.windows(2).all(|w| w[0].0 < w[1].0));
    let names = layer.layer_names(dataset);
    let mut per: Vec<Vec<(f64, ElementKey, TileFeature)>> = vec![Vec::new(); names.len()];
    for (name, fs) in old {
        let Some(index) = names.iter().position(|n| *n == name) else {
            return PatchOutcome::NotOurs;
        };
        for f in fs {
            let Some(key) = key_of(f.id) else {
                return PatchOutcome::NotOurs;
            };
            if !touched.contains(&key) {
                per[index].push((sort_key(layer, index, &f.tags), key, f));
            }
        }
    }
    add_cuts(t, layer, features, &mut per);
    // A cut sorts a layer stably by sort key over key order, so the kept
    // features are in (sort key, key) order, placements of one feature in
    // their order; the new ones join them there. No key is in both lists,
    // so ties are within one feature and keep their order.
    for fs in &mut per {
        fs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    }
    PatchOutcome::Patched(encode_layers(&names, per))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::Feature;

    fn cut_feature(t: Tile, buffer: f64, key: ElementKey, f: &Feature) -> Option<TileFeature> {
        cut_shape(t, buffer, key, &f.shape, &BTreeMap::new())
    }

    fn t() -> Tile {
        Tile { z: 1, x: 0, y: 0 }
    }

    /// One version of a test feature: class, position and size in tile
    /// widths, named or not.
    type Version = (u8, f64, f64, u8, bool);

    fn feature_of(t: Tile, v: Version) -> Feature {
        let (class, x, y, size, named) = v;
        let n = (1u64 << t.z) as f64;
        let w = |dx: f64, dy: f64| ((t.x as f64 + x + dx) / n, (t.y as f64 + y + dy) / n);
        let s = f64::from(size) * 0.1;
        let square = vec![w(0.0, 0.0), w(s, 0.0), w(s, s), w(0.0, s), w(0.0, 0.0)];
        let (tags, shape): (&[(&str, &str)], Shape) = match class {
            0 => (&[("natural", "water")], Shape::Polygon(vec![square])),
            1 => (&[("building", "yes")], Shape::Polygon(vec![square])),
            2 => (
                &[("highway", "residential")],
                Shape::Lines(vec![vec![w(0.0, 0.0), w(s, s / 2.0), w(2.0 * s, 0.0)]]),
            ),
            _ => (&[("amenity", "cafe")], Shape::Point(w(0.0, 0.0))),
        };
        let mut tags: BTreeMap<String, String> = tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if named {
            tags.insert("name".into(), format!("n{class}{size}"));
        }
        Feature { tags, shape }
    }

    fn version() -> impl proptest::strategy::Strategy<Value = Version> {
        use proptest::prelude::*;
        (0u8..4, -0.2f64..1.2, -0.2f64..1.2, 1u8..4, any::<bool>())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, failure_persistence: None, ..Default::default() })]

        /// Issue 25: a tile cut from the old features, patched with the
        /// touched ones, is the tile cut from the new features, byte for
        /// byte: Shortbread's sorted layers (ties in way_area), features
        /// with two placements (named water and its label), features
        /// moving in, out and within the tile, created and deleted.
        #[test]
        fn a_patched_tile_is_the_tile_cut_anew(
            elements in proptest::collection::vec(
                (proptest::option::of(version()), proptest::option::of(proptest::option::of(version()))),
                1..30,
            )
        ) {
            let layer = TileLayer::from_schema(crate::schema::Schema::bundled("shortbread").unwrap());
            let t = Tile { z: 14, x: 8500, y: 5900 };
            let kinds = [MemberKind::Node, MemberKind::Way, MemberKind::Relation];
            let mut olds = Vec::new();
            let mut news = Vec::new();
            let mut touched = BTreeSet::new();
            for (i, (old, change)) in elements.iter().enumerate() {
                // Ids of both signs: new elements of local edits are negative.
                let key: ElementKey = (kinds[i % 3], (i as i64 - 5) * 7919);
                let new = change.unwrap_or(*old);
                let place = |v: Option<Version>| v.map(|v| layer.place(&feature_of(t, v)));
                if let Some(p) = place(*old) {
                    olds.push((key, p));
                }
                if let Some(p) = place(new) {
                    news.push((key, p));
                }
                if change.is_some() {
                    touched.insert(key);
                }
            }
            olds.sort_by_key(|(k, _)| *k);
            news.sort_by_key(|(k, _)| *k);
            let cut_of = |fs: &[(ElementKey, Vec<Placement>)]| {
                let v: Vec<(ElementKey, &[Placement])> = fs.iter().map(|(k, p)| (*k, p.as_slice())).collect();
                cut(t, &layer, "d", &v)
            };
            let before = cut_of(&olds);
            let after = cut_of(&news);
            let changed: Vec<(ElementKey, &[Placement])> = news
                .iter()
                .filter(|(k, _)| touched.contains(k))
                .map(|(k, p)| (*k, p.as_slice()))
                .collect();
            let old = before.map(|b| mvt::decode(&b).unwrap()).unwrap_or_default();
            proptest::prop_assert_eq!(
                patch(t, &layer, "d", old, &touched, &changed),
                PatchOutcome::Patched(after)
            );
        }
    }

    #[test]
    fn a_feature_id_names_its_element_and_nothing_else() {
        for key in [
            (MemberKind::Node, 1),
            (MemberKind::Way, 13_155_339_321),
            (MemberKind::Relation, 0),
            (MemberKind::Node, -42),
            (MemberKind::Relation, -1),
        ] {
            assert_eq!(key_of(feature_id(key)), Some(key));
        }
        assert_eq!(key_of(7 << 2 | 3), None);
    }

    /// A tile holding a layer this schema does not have is not patched.
    #[test]
    fn a_tile_of_another_layer_is_not_patched() {
        let layer = TileLayer::from_schema(crate::schema::Schema::bundled("shortbread").unwrap());
        let old = vec![("not_shortbread".to_string(), Vec::new())];
        assert_eq!(
            patch(t(), &layer, "d", old, &BTreeSet::new(), &[]),
            PatchOutcome::NotOurs
        );
    }

    #[test]
    fn a_line_through_a_tile_is_cut_at_its_edges() {
        let f = Feature {
            tags: [("highway".into(), "primary".into())].into(),
            shape: Shape::Lines(vec![vec![(-0.1, 0.25), (0.25, 0.25), (0.75, 0.25)]]),
        };
        let c = cut_feature(t(), 0.0, (MemberKind::Way, 7), &f).unwrap();
        assert_eq!(c.parts, vec![vec![(0, 2048), (2048, 2048), (4096, 2048)]]);
        assert_eq!(c.id, 7 << 2 | 1);
    }

    #[test]
    fn a_square_around_the_tile_is_the_tile_and_its_hole_is_a_hole() {
        let sq = |a: f64, b: f64| vec![(a, a), (b, a), (b, b), (a, b), (a, a)];
        let f = Feature {
            tags: [("landuse".into(), "forest".into())].into(),
            shape: Shape::Polygon(vec![sq(-0.5, 0.9), sq(0.1, 0.2)]),
        };
        let c = cut_feature(t(), 0.0, (MemberKind::Relation, 1), &f).unwrap();
        assert_eq!(c.parts.len(), 2);
        assert_eq!(c.parts[0], vec![(0, 0), (4096, 0), (4096, 4096), (0, 4096)]);
        assert!(area2(&c.parts[0]) > 0 && area2(&c.parts[1]) < 0);
        // A square far away shows nothing.
        let g = Feature {
            tags: f.tags.clone(),
            shape: Shape::Polygon(vec![sq(0.7, 0.8)]),
        };
        assert!(cut_feature(t(), 0.0, (MemberKind::Way, 2), &g).is_none());
    }

    /// Issue 10's hole case: a tile inside a multipolygon's hole shows
    /// nothing of it, and its signature is empty, so it is never expired.
    #[test]
    fn issue10_a_tile_inside_a_hole_shows_nothing_and_is_not_expired() {
        let sq = |a: f64, b: f64| vec![(a, a), (b, a), (b, b), (a, b), (a, a)];
        let f = Feature {
            tags: [("landuse".into(), "forest".into())].into(),
            shape: Shape::Polygon(vec![sq(0.05, 0.95), sq(0.15, 0.6)]),
        };
        // z3 tile (2, 2) spans 0.25..0.375 in world units: inside the hole.
        let tt = Tile { z: 3, x: 2, y: 2 };
        assert!(cut_feature(tt, 0.0, (MemberKind::Relation, 1), &f).is_none());
        // Inside the area but outside the hole: the whole tile.
        let inside = Tile { z: 3, x: 6, y: 6 };
        let c = cut_feature(inside, 0.0, (MemberKind::Relation, 1), &f).unwrap();
        assert_eq!(
            c.parts,
            vec![vec![(0, 0), (4096, 0), (4096, 4096), (0, 4096)]]
        );
        let sig = crate::features::signatures(&f.shape, tt.z, 0.0);
        assert!(!sig.contains_key(&(tt.x, tt.y)), "{sig:?}");
        assert!(sig.contains_key(&(inside.x, inside.y)), "{sig:?}");
    }
}
