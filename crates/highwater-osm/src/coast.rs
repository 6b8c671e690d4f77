//! The sea of an extract, assembled from its `natural=coastline` ways
//! (issue 25): the water polygon that Shortbread's `ocean` layer holds.
//!
//! The planet's ocean polygons (osmdata.openstreetmap.de) are made from
//! every coastline on Earth; an extract holds only pieces of them, cut open
//! where the extract ends. Debian's `osmcoastline` closes such an open
//! coastline straight across the land (on Monaco, into a self-intersecting
//! polygon it drops). Here the open ends are closed along the extract's
//! bounds instead, on the water side, using OSM's rule that a coastline
//! way has the land on its left and the water on its right:
//!
//! 1. ways are joined end to end (by node id, keeping their direction: a
//!    way drawn the wrong way round is a data error, not joined);
//! 2. closed chains wholly inside the bounds are rings: counter-clockwise
//!    (land on the left, inside) an island, a hole in the sea; clockwise a
//!    body of sea enclosed by land;
//! 3. every other chain is clipped to the bounds, into pieces that enter
//!    and leave across the bounds' edge (an end that stops inside the
//!    bounds, as an extract cut by its "simple" strategy leaves it, is
//!    taken straight to the nearest edge, unless that puts it on the
//!    land's stretch of the edge: then the stub is dropped, see
//!    [`drop_stubs`]);
//! 4. from where a piece leaves, the water ring follows the edge clockwise
//!    (the box's inside, here the water, stays on the right) to where the
//!    next piece enters, and so on until it closes;
//! 5. without any piece crossing the bounds, the bounds are sea around the
//!    islands, if there are islands.
//!
//! The result is one even-odd polygon (the representation
//! [`crate::geom::Shape::Polygon`] uses). No coastline in the extract:
//! no sea, whatever the extract is (the documented limit: an extract far
//! out at sea with no coast in it shows land).
//!
//! Pure geometry: it reads no store, so that the same function serves a
//! rebuild and both sides of a diff's expiry. [`ocean_feature`] reads the
//! ways through a [`View`] (the store before a diff, or with the diff laid
//! over it); the tiles dataset keeps the result (`tiles::ocean`).
//!
//! The bounds are the extract's, recorded by the import (meta
//! [`BOUNDS_META`]: the PBF header's box, else the nodes' extent); a store
//! imported before they were recorded has none, and no sea.

use crate::geom::{inside, Feature, Shape, View, P};
use crate::model::{MemberKind, Tags};
use crate::store::StoreError;
use std::collections::HashMap;

pub use highwater_osm_store::import::{bounds_text, BOUNDS_META};

/// The sea's key among the features: relation 0, an id OSM never gives
/// (ids start at 1), so it meets no element. Its tile feature id is 2.
pub const OCEAN_KEY: (MemberKind, i64) = (MemberKind::Relation, 0);

/// The one tag of the sea's feature, which a schema's `ocean` layer
/// matches (`shortbread.toml`). Reserved: an element's own tag with this
/// key is dropped by `features::feature`, so that no element
/// lands in the ocean layer.
pub const OCEAN_TAG: (&str, &str) = ("highwater:ocean", "yes");

/// The bounds [`BOUNDS_META`] holds, in world coordinates; `None` for a
/// missing or unreadable row, or an empty box.
pub fn bounds_of(text: Option<&str>) -> Option<Bounds> {
    let v: Vec<i64> = text?
        .split(',')
        .map(|p| p.trim().parse().ok())
        .collect::<Option<_>>()?;
    let [w, s, e, n] = <[i64; 4]>::try_from(v).ok()?;
    let deg = |v: i64| v as f64 / 1e7;
    let (a, c) = (
        highwater_core::tile::world(deg(w), deg(n)),
        highwater_core::tile::world(deg(e), deg(s)),
    );
    (a.0 < c.0 && a.1 < c.1).then_some(Bounds {
        min_x: a.0,
        min_y: a.1,
        max_x: c.0,
        max_y: c.1,
    })
}

/// Whether a way's tags make it coastline.
pub fn is_coastline(tags: &Tags) -> bool {
    tags.get("natural").is_some_and(|v| v == "coastline")
}

/// The sea's feature as `view` sees it: `ways` are candidate ids (those
/// the view does not have, or that are not coastline, are left out).
pub fn ocean_feature(
    view: &dyn View,
    ways: impl IntoIterator<Item = i64>,
    bounds: Option<Bounds>,
) -> Result<Option<Feature>, StoreError> {
    let Some(bounds) = bounds else {
        return Ok(None);
    };
    let mut coast = Vec::new();
    for id in ways {
        let Some(w) = view.way(id)? else { continue };
        if !is_coastline(&w.tags) {
            continue;
        }
        let mut nodes = Vec::with_capacity(w.refs.len());
        for r in &w.refs {
            if let Some(p) = view.loc(*r)? {
                nodes.push((*r, p));
            }
        }
        coast.push(CoastWay { id, nodes });
    }
    if coast.is_empty() {
        return Ok(None);
    }
    // Ways in id order, whatever order the caller found them in: the
    // assembly's rings then come out the same for a rebuild and a diff.
    coast.sort_by_key(|w| w.id);
    coast.dedup_by_key(|w| w.id);
    Ok(assemble(&coast, bounds).shape.map(|shape| Feature {
        tags: [(OCEAN_TAG.0.to_string(), OCEAN_TAG.1.to_string())].into(),
        shape,
    }))
}

/// An extract's bounds in world coordinates ([0, 1), y down, as
/// [`highwater_core::tile::world`] gives them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub min_x: f64,
    pub min_y: f64,
    pub max_x: f64,
    pub max_y: f64,
}

impl Bounds {
    fn contains(&self, p: P) -> bool {
        p.0 >= self.min_x && p.0 <= self.max_x && p.1 >= self.min_y && p.1 <= self.max_y
    }

    /// The bounds as a ring, clockwise as seen on a map (north up).
    fn ring(&self) -> Vec<P> {
        vec![
            (self.min_x, self.min_y),
            (self.max_x, self.min_y),
            (self.max_x, self.max_y),
            (self.min_x, self.max_y),
            (self.min_x, self.min_y),
        ]
    }

    /// Where a point on (or near) the edge is along it, clockwise on a
    /// map from the north-west corner: [0, 1) the north edge, [1, 2) the
    /// east, [2, 3) the south, [3, 4) the west. A point off the edge is
    /// placed where it projects onto the nearest edge.
    fn along(&self, p: P) -> f64 {
        let (w, h) = (self.max_x - self.min_x, self.max_y - self.min_y);
        let d = [
            (p.1 - self.min_y).abs(),
            (self.max_x - p.0).abs(),
            (self.max_y - p.1).abs(),
            (p.0 - self.min_x).abs(),
        ];
        let edge = (0..4).min_by(|a, b| d[*a].total_cmp(&d[*b])).unwrap_or(0);
        let frac = |v: f64| v.clamp(0.0, 1.0);
        match edge {
            0 => frac((p.0 - self.min_x) / w),
            1 => 1.0 + frac((p.1 - self.min_y) / h),
            2 => 2.0 + frac((self.max_x - p.0) / w),
            _ => (3.0 + frac((self.max_y - p.1) / h)).min(3.999_999_999),
        }
    }

    /// The point at position `t` along the edge (see [`Bounds::along`]).
    fn at(&self, t: f64) -> P {
        let (w, h) = (self.max_x - self.min_x, self.max_y - self.min_y);
        let t = t.rem_euclid(4.0);
        let f = t.fract();
        match t as u32 {
            0 => (self.min_x + f * w, self.min_y),
            1 => (self.max_x, self.min_y + f * h),
            2 => (self.max_x - f * w, self.max_y),
            _ => (self.min_x, self.max_y - f * h),
        }
    }
}

/// One coastline way: its id and its nodes with their locations, in way
/// order (nodes missing from the extract left out).
#[derive(Clone, Debug)]
pub struct CoastWay {
    pub id: i64,
    pub nodes: Vec<(i64, P)>,
}

/// What the assembly made of the coastline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ocean {
    /// The sea inside the bounds, even-odd; `None` when there is none.
    pub shape: Option<Shape>,
    /// Islands (closed, land inside) made holes in the sea.
    pub islands: usize,
    /// Pieces of coastline crossing the bounds, closed along them.
    pub pieces: usize,
    /// Ways left out: rings on the wrong side (an island on land, a sea in
    /// the sea: a way drawn the wrong way round), by the first way's id.
    pub skipped: Vec<i64>,
}

/// Twice the signed area; positive for a ring clockwise on a map (world y
/// points down, so the screen's clockwise is the map's).
fn area2(r: &[P]) -> f64 {
    r.windows(2)
        .map(|e| e[0].0 * e[1].1 - e[1].0 * e[0].1)
        .sum()
}

/// A chain being joined: its first way's id, first node, last node, points.
type Chain = (i64, i64, i64, Vec<P>);

/// Joins ways end to end into chains of points, each with the id of its
/// first way and whether it closed. Chains stay in place while they grow,
/// so that a chain met earlier is still there to be appended, whatever
/// order the ways come in.
fn join(ways: &[CoastWay]) -> Vec<(i64, Vec<P>, bool)> {
    let mut chains: Vec<Option<Chain>> = ways
        .iter()
        .map(|w| {
            (w.nodes.len() >= 2).then(|| {
                let pts = w.nodes.iter().map(|n| n.1).collect();
                (w.id, w.nodes[0].0, w.nodes[w.nodes.len() - 1].0, pts)
            })
        })
        .collect();
    let mut by_start: HashMap<i64, usize> = HashMap::new();
    for (i, c) in chains.iter().enumerate() {
        if let Some(c) = c {
            by_start.entry(c.1).or_insert(i);
        }
    }
    for i in 0..chains.len() {
        while let Some((_, first, last, _)) = &chains[i] {
            if first == last {
                break;
            }
            let Some(j) = by_start.get(last).copied().filter(|j| *j != i) else {
                break;
            };
            let Some((_, _, next_last, next)) = chains[j].take() else {
                break;
            };
            if let Some(c) = chains[i].as_mut() {
                c.3.extend_from_slice(&next[1..]);
                c.2 = next_last;
            }
        }
    }
    chains
        .into_iter()
        .flatten()
        .map(|(id, first, last, pts)| {
            let closed = first == last && pts.len() >= 4;
            (id, pts, closed)
        })
        .collect()
}

/// The parameter range of segment a-b inside the bounds (Liang-Barsky).
fn clip_segment(a: P, b: P, bb: &Bounds) -> Option<(f64, f64)> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - bb.min_x),
        (dx, bb.max_x - a.0),
        (-dy, a.1 - bb.min_y),
        (dy, bb.max_y - a.1),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let r = q / p;
            if p < 0.0 {
                t0 = t0.max(r);
            } else {
                t1 = t1.min(r);
            }
        }
    }
    (t0 <= t1).then_some((t0, t1))
}

fn lerp(a: P, b: P, t: f64) -> P {
    (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t)
}

/// A polyline cut to the bounds: the runs inside, in order.
fn clip(line: &[P], bb: &Bounds) -> Vec<Vec<P>> {
    let mut out = Vec::new();
    let mut cur: Vec<P> = Vec::new();
    for s in line.windows(2) {
        let Some((t0, t1)) = clip_segment(s[0], s[1], bb) else {
            if cur.len() >= 2 {
                out.push(std::mem::take(&mut cur));
            }
            cur.clear();
            continue;
        };
        let (p0, p1) = (lerp(s[0], s[1], t0), lerp(s[0], s[1], t1));
        if t0 > 0.0 && cur.len() >= 2 {
            out.push(std::mem::take(&mut cur));
        }
        if cur.is_empty() || t0 > 0.0 {
            cur = vec![p0];
        }
        if cur.last() != Some(&p1) {
            cur.push(p1);
        }
        if t1 < 1.0 {
            if cur.len() >= 2 {
                out.push(std::mem::take(&mut cur));
            }
            cur.clear();
        }
    }
    if cur.len() >= 2 {
        out.push(cur);
    }
    out
}

/// The sea inside `bounds` that the coastline ways enclose.
pub fn assemble(ways: &[CoastWay], bounds: Bounds) -> Ocean {
    let mut ocean = Ocean::default();
    // Rings wholly inside, with the id of their first way.
    let mut rings: Vec<(i64, Vec<P>)> = Vec::new();
    // Pieces crossing the edge: (where they enter, where they leave, points,
    // the chain's first way).
    let mut pieces: Vec<(f64, f64, Vec<P>, i64)> = Vec::new();
    for (id, mut pts, closed) in join(ways) {
        if closed && pts.iter().all(|p| bounds.contains(*p)) {
            rings.push((id, pts));
            continue;
        }
        if closed {
            // Start the ring outside, so that no piece is split at the
            // ring's seam.
            if let Some(k) = pts.iter().position(|p| !bounds.contains(*p)) {
                pts.pop();
                pts.rotate_left(k);
                pts.push(pts[0]);
            }
        }
        for piece in clip(&pts, &bounds) {
            let (a, b) = (piece[0], piece[piece.len() - 1]);
            pieces.push((bounds.along(a), bounds.along(b), piece, id));
        }
    }
    drop_stubs(&mut pieces, &bounds, &mut ocean.skipped);
    ocean.pieces = pieces.len();
    let mut water: Vec<Vec<P>> = Vec::new();
    let mut used = vec![false; pieces.len()];
    for start in 0..pieces.len() {
        if used[start] {
            continue;
        }
        let mut ring: Vec<P> = Vec::new();
        let mut i = start;
        loop {
            used[i] = true;
            let (_, exit, pts, _) = &pieces[i];
            // An end that stopped inside the bounds goes straight to the
            // edge (`along` placed it where it projects).
            if ring.is_empty() && !on_edge(pts[0], &bounds) {
                ring.push(bounds.at(pieces[i].0));
            }
            ring.extend(pts.iter().copied());
            if !on_edge(pts[pts.len() - 1], &bounds) {
                ring.push(bounds.at(*exit));
            }
            // The next entry clockwise along the edge from this exit.
            let gap = |j: usize| {
                let d = (pieces[j].0 - exit).rem_euclid(4.0);
                if d == 0.0 && j != i {
                    0.0
                } else if d == 0.0 {
                    4.0
                } else {
                    d
                }
            };
            let next = (0..pieces.len())
                .filter(|&j| !used[j] || j == start)
                .min_by(|a, b| gap(*a).total_cmp(&gap(*b)));
            let Some(j) = next else { break };
            let d = gap(j);
            // The corners passed on the way, in order.
            let mut corners: Vec<f64> = (0..4)
                .map(|k| k as f64)
                .filter(|k| {
                    let c = (k - exit).rem_euclid(4.0);
                    c > 0.0 && c < d
                })
                .collect();
            corners.sort_by(|a, b| {
                (a - exit)
                    .rem_euclid(4.0)
                    .total_cmp(&(b - exit).rem_euclid(4.0))
            });
            ring.extend(corners.into_iter().map(|k| bounds.at(k)));
            if j == start {
                let entry = if on_edge(pieces[j].2[0], &bounds) {
                    pieces[j].2[0]
                } else {
                    bounds.at(pieces[j].0)
                };
                ring.push(entry);
                break;
            }
            let entry = bounds.at(pieces[j].0);
            if !on_edge(pieces[j].2[0], &bounds) {
                ring.push(entry);
            }
            i = j;
        }
        if ring.len() >= 4 {
            water.push(ring);
        }
    }
    let (islands, seas): (Vec<_>, Vec<_>) = rings.into_iter().partition(|(_, r)| area2(r) < 0.0);
    if water.is_empty() && !islands.is_empty() {
        // No coast crosses the bounds: the sea is all round the islands.
        water.push(bounds.ring());
    }
    // A ring is kept only on its side: an island inside an odd number of
    // the other rings (in the sea), a sea inside an even number (on land).
    let others: Vec<Vec<P>> = water
        .iter()
        .cloned()
        .chain(islands.iter().map(|r| r.1.clone()))
        .chain(seas.iter().map(|r| r.1.clone()))
        .collect();
    let depth = |r: &[P]| {
        others
            .iter()
            .filter(|o| o.as_slice() != r && inside(r[0], o))
            .count()
    };
    let mut all = water;
    for (id, r) in islands {
        if depth(&r) % 2 == 1 {
            ocean.islands += 1;
            all.push(r);
        } else {
            ocean.skipped.push(id);
        }
    }
    for (id, r) in seas {
        if depth(&r) % 2 == 0 {
            all.push(r);
        } else {
            ocean.skipped.push(id);
        }
    }
    ocean.shape = (!all.is_empty()).then_some(Shape::Polygon(all));
    ocean
}

/// Drops pieces whose end stopped inside the bounds (taken straight to
/// the edge) where that puts them on the land's stretch of the edge: then
/// the walk from where the piece leaves meets another piece's exit before
/// any entry. On Monaco, the coast cut by the extract's polygon starts
/// just inside the bounds' south edge, beside a cape the coast rounds
/// outside them: a stub of three points that would turn the whole box
/// into sea.
fn drop_stubs(pieces: &mut Vec<(f64, f64, Vec<P>, i64)>, b: &Bounds, skipped: &mut Vec<i64>) {
    loop {
        let bad = (0..pieces.len()).find(|&i| {
            let (_, exit, pts, _) = &pieces[i];
            let projected = !on_edge(pts[0], b) || !on_edge(pts[pts.len() - 1], b);
            if !projected {
                return false;
            }
            // The first end met going clockwise from this exit.
            let mut first: Option<(f64, bool)> = None;
            for (j, p) in pieces.iter().enumerate() {
                for (t, is_entry) in [(p.0, true), (p.1, false)] {
                    if j == i && !is_entry {
                        continue;
                    }
                    let d = (t - exit).rem_euclid(4.0);
                    let d = if d == 0.0 && j != i {
                        0.0
                    } else if d == 0.0 {
                        4.0
                    } else {
                        d
                    };
                    if first.is_none_or(|f| d < f.0) {
                        first = Some((d, is_entry));
                    }
                }
            }
            first.is_some_and(|(_, is_entry)| !is_entry)
        });
        let Some(i) = bad else { break };
        skipped.push(pieces.remove(i).3);
    }
}

fn on_edge(p: P, b: &Bounds) -> bool {
    p.0 == b.min_x || p.0 == b.max_x || p.1 == b.min_y || p.1 == b.max_y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds (0.1, 0.1)-(0.2, 0.2); points given in tenths of the box
    /// from its north-west corner, `(east, south)`.
    fn b() -> Bounds {
        Bounds {
            min_x: 0.1,
            min_y: 0.1,
            max_x: 0.2,
            max_y: 0.2,
        }
    }

    fn p(e: f64, s: f64) -> P {
        (0.1 + e / 100.0, 0.1 + s / 100.0)
    }

    fn way(id: i64, first_node: i64, pts: &[(f64, f64)]) -> CoastWay {
        CoastWay {
            id,
            nodes: pts
                .iter()
                .enumerate()
                .map(|(i, q)| (first_node + i as i64, p(q.0, q.1)))
                .collect(),
        }
    }

    fn wet(o: &Ocean, q: (f64, f64)) -> bool {
        let Some(Shape::Polygon(rings)) = &o.shape else {
            return false;
        };
        rings.iter().filter(|r| inside(p(q.0, q.1), r)).count() % 2 == 1
    }

    /// One check per case (issue 25): the ways, then which points are sea.
    fn check(name: &str, ways: &[CoastWay], sea: &[(f64, f64)], land: &[(f64, f64)]) -> Ocean {
        let o = assemble(ways, b());
        for q in sea {
            assert!(wet(&o, *q), "{name}: {q:?} should be sea: {o:?}");
        }
        for q in land {
            assert!(!wet(&o, *q), "{name}: {q:?} should be land: {o:?}");
        }
        o
    }

    #[test]
    fn no_coastline_is_no_sea() {
        let o = check("none", &[], &[], &[(5.0, 5.0)]);
        assert_eq!(o.shape, None);
    }

    #[test]
    fn a_closed_island_is_a_hole_in_sea_all_round() {
        // Counter-clockwise on a map (land on the left): north-west,
        // south-west, south-east, north-east.
        let island = way(
            1,
            100,
            &[(4.0, 4.0), (4.0, 6.0), (6.0, 6.0), (6.0, 4.0), (4.0, 4.0)],
        );
        let mut island = island;
        let first = island.nodes[0].0;
        island.nodes.last_mut().unwrap().0 = first;
        let o = check(
            "island",
            &[island],
            &[(1.0, 1.0), (9.0, 9.0), (3.0, 5.0)],
            &[(5.0, 5.0)],
        );
        assert_eq!(o.islands, 1);
    }

    #[test]
    fn an_open_coastline_is_closed_along_the_bounds_on_the_water_side() {
        // West to east across the middle: land on the left (north), sea
        // south; the coast leaves the box on both sides.
        let w = way(1, 10, &[(-2.0, 5.0), (3.0, 4.0), (7.0, 6.0), (12.0, 5.0)]);
        let o = check(
            "west-east",
            &[w],
            &[(5.0, 8.0), (0.5, 9.5), (9.5, 9.5)],
            &[(5.0, 2.0), (0.5, 0.5), (9.5, 0.5)],
        );
        assert_eq!(o.pieces, 1);
        // Drawn the other way round, the sea is north.
        let w = way(1, 10, &[(12.0, 5.0), (7.0, 6.0), (3.0, 4.0), (-2.0, 5.0)]);
        check(
            "east-west",
            &[w],
            &[(5.0, 2.0), (0.5, 0.5), (9.5, 0.5)],
            &[(5.0, 8.0), (0.5, 9.5), (9.5, 9.5)],
        );
    }

    #[test]
    fn ways_join_end_to_end_and_ends_inside_go_to_the_nearest_edge() {
        // The coast comes down from the north edge, then turns west to the
        // west edge, in two ways sharing node 11 (listed in the other
        // order); its ends stop just inside the bounds (an extract cut to
        // its nodes).
        let a = way(1, 10, &[(9.0, 0.2), (8.0, 5.0)]);
        let b_ = way(2, 11, &[(8.0, 5.0), (5.0, 7.0), (0.2, 5.0)]);
        let o = check(
            "bay",
            &[b_, a],
            // Land on the left going south then west: east and south.
            &[(2.0, 2.0), (5.0, 5.0)],
            &[(5.0, 9.0), (9.7, 5.0)],
        );
        assert_eq!(o.pieces, 1);
    }

    #[test]
    fn an_island_beside_an_open_coast_and_a_wrong_way_island_on_land() {
        let coast = way(1, 10, &[(-2.0, 5.0), (12.0, 5.0)]);
        let mut islet = way(
            2,
            20,
            &[(4.0, 7.0), (4.0, 8.0), (5.0, 8.0), (5.0, 7.0), (4.0, 7.0)],
        );
        let f = islet.nodes[0].0;
        islet.nodes.last_mut().unwrap().0 = f;
        // A ring on land, counter-clockwise: it cannot be an island there.
        let mut bogus = way(
            3,
            30,
            &[(4.0, 2.0), (4.0, 3.0), (5.0, 3.0), (5.0, 2.0), (4.0, 2.0)],
        );
        let f = bogus.nodes[0].0;
        bogus.nodes.last_mut().unwrap().0 = f;
        let o = check(
            "islet",
            &[coast, islet, bogus],
            &[(2.0, 7.0), (7.0, 9.0)],
            &[(4.5, 7.5), (4.5, 2.5), (2.0, 2.0)],
        );
        assert_eq!((o.islands, o.skipped.clone()), (1, vec![3]));
    }

    #[test]
    fn a_stub_cut_inside_the_bounds_on_lands_side_is_dropped() {
        // As on Monaco: the coast starts (cut by the extract) just inside
        // the south edge, heads south-west out, rounds a cape outside and
        // comes back in at e=6, north, then east out: the sea is south-
        // east. Taken to the edge, the stub's start would lie on the
        // cape's stretch of the edge.
        let w = way(
            1,
            10,
            &[
                (5.0, 9.99),
                (4.5, 11.0),
                (6.0, 11.0),
                (6.0, 5.0),
                (12.0, 5.0),
            ],
        );
        let o = check(
            "stub",
            &[w],
            &[(8.0, 8.0), (9.5, 9.5)],
            &[(2.0, 2.0), (5.5, 9.5), (8.0, 2.0)],
        );
        assert_eq!((o.pieces, o.skipped.clone()), (1, vec![1]));
    }

    #[test]
    fn a_coast_crossing_the_bounds_twice_makes_two_seas() {
        // An inlet: the coast comes in from the north, loops and goes out
        // north again (land on the left: outside the loop); a second
        // stretch cuts off the south-east corner as sea.
        let a = way(1, 10, &[(6.0, -1.0), (6.0, 4.0), (3.0, 4.0), (3.0, -1.0)]);
        let c = way(2, 20, &[(8.0, 11.0), (11.0, 8.0)]);
        let o = check(
            "two",
            &[a, c],
            &[(4.5, 2.0), (9.8, 9.8)],
            &[(1.0, 1.0), (5.0, 7.0), (8.0, 1.0)],
        );
        assert_eq!(o.pieces, 2);
    }
}

/// Monaco's extract, the real case (issue 25): its coastline ways (complete
/// or cut where the extract's polygon ends) closed along the PBF header's
/// bounds.
#[cfg(test)]
mod monaco {
    use super::*;
    use highwater_core::tile::world;
    use osmpbf::{BlobDecode, BlobReader, Element, ElementReader};

    fn pbf() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/monaco-3047-20210801.osm.pbf")
    }

    fn ocean() -> Ocean {
        let mut bounds = None;
        for blob in BlobReader::from_path(pbf()).expect("the Monaco extract") {
            if let Ok(BlobDecode::OsmHeader(h)) = blob.expect("a blob").decode() {
                let b = h.bbox().expect("Geofabrik's header has bounds");
                let (a, c) = (
                    world(b.left, b.top.max(b.bottom)),
                    world(b.right, b.top.min(b.bottom)),
                );
                bounds = Some(Bounds {
                    min_x: a.0,
                    min_y: a.1,
                    max_x: c.0,
                    max_y: c.1,
                });
                break;
            }
        }
        let mut nodes: HashMap<i64, P> = HashMap::new();
        let mut ways: Vec<(i64, Vec<i64>)> = Vec::new();
        ElementReader::from_path(pbf())
            .expect("the Monaco extract")
            .for_each(|e| match e {
                Element::DenseNode(n) => {
                    nodes.insert(n.id(), world(n.lon(), n.lat()));
                }
                Element::Node(n) => {
                    nodes.insert(n.id(), world(n.lon(), n.lat()));
                }
                Element::Way(w) if w.tags().any(|t| t == ("natural", "coastline")) => {
                    ways.push((w.id(), w.refs().collect()));
                }
                _ => {}
            })
            .expect("a readable extract");
        let ways: Vec<CoastWay> = ways
            .into_iter()
            .map(|(id, refs)| CoastWay {
                id,
                nodes: refs
                    .into_iter()
                    .filter_map(|r| nodes.get(&r).map(|p| (r, *p)))
                    .collect(),
            })
            .collect();
        assert_eq!(ways.len(), 20, "Monaco's extract has 20 coastline ways");
        assemble(&ways, bounds.expect("a header block"))
    }

    #[test]
    fn monacos_sea_is_south_east_of_its_land() {
        let o = ocean();
        let Some(Shape::Polygon(rings)) = &o.shape else {
            panic!("no sea assembled from Monaco's coastline: {o:?}");
        };
        let wet = |lon: f64, lat: f64| {
            let p = world(lon, lat);
            rings.iter().filter(|r| inside(p, r)).count() % 2 == 1
        };
        eprintln!(
            "monaco: {} rings, {} pieces, {} islands, skipped {:?}",
            rings.len(),
            o.pieces,
            o.islands,
            o.skipped
        );
        // Sea off Monte-Carlo and off Fontvieille.
        for (lon, lat) in [(7.440, 43.728), (7.430, 43.7245)] {
            assert!(wet(lon, lat), "{lon},{lat} should be sea");
        }
        // The Casino, the Prince's Palace, Beausoleil (France) up the hill.
        for (lon, lat) in [(7.4286, 43.7396), (7.4200, 43.7314), (7.425, 43.745)] {
            assert!(!wet(lon, lat), "{lon},{lat} should be land");
        }
    }
}
