//! The geometry features are made of: points in world coordinates, shapes
//! (points, lines, polygons with holes), a feature (tags and a shape), and
//! the [`View`] of the elements a feature is read from. It knows no layer,
//! schema or dataset: the schemas, the sea ([`crate::coast`]) and
//! [`crate::features`] build on it. Re-exported by [`crate::features`].

use crate::model::{MemberKind, Relation, Tags, Way};
use crate::store::StoreError;
use std::collections::BTreeMap;

/// An element's type and id.
pub type ElementKey = (MemberKind, i64);

/// A point in world coordinates ([0, 1) × [0, 1), y down).
pub type P = (f64, f64);

#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Point(P),
    /// One or more polylines, each of at least two points.
    Lines(Vec<Vec<P>>),
    /// Closed rings, even-odd (inner rings are holes).
    Polygon(Vec<Vec<P>>),
}

impl Shape {
    /// (min x, min y, max x, max y) in world coordinates.
    pub fn bbox(&self) -> (f64, f64, f64, f64) {
        let pts: Box<dyn Iterator<Item = &P>> = match self {
            Shape::Point(p) => Box::new(std::iter::once(p)),
            Shape::Lines(v) | Shape::Polygon(v) => Box::new(v.iter().flatten()),
        };
        pts.fold((f64::MAX, f64::MAX, f64::MIN, f64::MIN), |b, p| {
            (b.0.min(p.0), b.1.min(p.1), b.2.max(p.0), b.3.max(p.1))
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Feature {
    /// The tags the layer reads.
    pub tags: BTreeMap<String, String>,
    pub shape: Shape,
}

/// Where features read elements from.
pub trait View {
    fn loc(&self, node: i64) -> Result<Option<P>, StoreError>;
    fn node_tags(&self, node: i64) -> Result<Option<Tags>, StoreError>;
    fn way(&self, id: i64) -> Result<Option<Way>, StoreError>;
    fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError>;
}

/// Whether `p` is inside `ring` (even-odd crossing test).
pub fn inside(p: P, ring: &[P]) -> bool {
    let mut odd = false;
    for e in ring.windows(2) {
        let (a, b) = (e[0], e[1]);
        if (a.1 <= p.1) != (b.1 <= p.1) && p.0 < a.0 + (p.1 - a.1) / (b.1 - a.1) * (b.0 - a.0) {
            odd = !odd;
        }
    }
    odd
}

/// Per ring: how many other rings contain its first point (even: an outer
/// ring, odd: a hole), and its parent, the deepest ring containing it. The
/// tile cutter orients and groups rings by this; signatures include it, so
/// a ring whose nesting changes re-cuts every tile it shows in.
pub fn nesting(rings: &[Vec<P>]) -> Vec<(usize, Option<usize>)> {
    let bbox = |r: &[P]| {
        r.iter()
            .fold((f64::MAX, f64::MAX, f64::MIN, f64::MIN), |b, p| {
                (b.0.min(p.0), b.1.min(p.1), b.2.max(p.0), b.3.max(p.1))
            })
    };
    let boxes: Vec<_> = rings.iter().map(|r| bbox(r)).collect();
    let containers: Vec<Vec<usize>> = rings
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = r[0];
            (0..rings.len())
                .filter(|&j| {
                    let b = boxes[j];
                    j != i
                        && p.0 >= b.0
                        && p.0 <= b.2
                        && p.1 >= b.1
                        && p.1 <= b.3
                        && inside(p, &rings[j])
                })
                .collect()
        })
        .collect();
    let depth: Vec<usize> = containers.iter().map(Vec::len).collect();
    containers
        .iter()
        .enumerate()
        .map(|(i, c)| (depth[i], c.iter().copied().max_by_key(|&j| (depth[j], j))))
        .collect()
}
