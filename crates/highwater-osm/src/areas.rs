//! Admin and place areas: the polygons search and aggregates place
//! features in (boundary=administrative at given levels; place=city, town,
//! ... as given), read from the store, kept per dataset in the store's
//! table `agg_areas` as last computed, and recomputed after a diff only for
//! the elements it touched. Shared by the datasets, so it is below them:
//! it names none.

use crate::features::{feature, inside, Current, ElementKey, Feature, Shape, TileLayer, P};
use crate::model::{MemberKind, Tags};
use crate::store::{kind_code, kind_of, rings_blob, rings_from_blob, Store, StoreError, Writer};
use rstar::{RTree, RTreeObject, AABB};
use rusqlite::params;
use std::collections::{BTreeMap, BTreeSet};

/// The areas' table in the store: each dataset's areas as last computed
/// (search keeps its places under `NAME#places`).
pub const TABLES: &str = "
CREATE TABLE IF NOT EXISTS agg_areas(dataset TEXT NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, level INTEGER NOT NULL, minx REAL NOT NULL, miny REAL NOT NULL, maxx REAL NOT NULL, maxy REAL NOT NULL, rings BLOB NOT NULL, PRIMARY KEY(dataset, kind, id)) WITHOUT ROWID;
";

/// An admin or place area as search and aggregates see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Area {
    pub key: ElementKey,
    pub name: Option<String>,
    pub level: u8,
    pub rings: Vec<Vec<P>>,
    pub bbox: (f64, f64, f64, f64),
}

struct Indexed(usize, AABB<[f64; 2]>);

impl RTreeObject for Indexed {
    type Envelope = AABB<[f64; 2]>;
    fn envelope(&self) -> Self::Envelope {
        self.1
    }
}

/// The admin areas with an R*-tree over their bounding boxes.
pub struct Areas {
    pub list: Vec<Area>,
    tree: RTree<Indexed>,
}

impl Areas {
    pub(crate) fn new(list: Vec<Area>) -> Areas {
        let tree = RTree::bulk_load(
            list.iter()
                .enumerate()
                .map(|(i, a)| {
                    Indexed(
                        i,
                        AABB::from_corners([a.bbox.0, a.bbox.1], [a.bbox.2, a.bbox.3]),
                    )
                })
                .collect(),
        );
        Areas { list, tree }
    }

    /// The areas containing a point.
    pub fn containing(&self, p: P) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .tree
            .locate_in_envelope_intersecting(AABB::from_point([p.0, p.1]))
            .map(|i| i.0)
            .filter(|&i| in_rings(p, &self.list[i].rings))
            .collect();
        v.sort();
        v
    }

    /// The areas whose bounding box meets a box.
    pub(crate) fn meeting(&self, b: (f64, f64, f64, f64)) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .tree
            .locate_in_envelope_intersecting(AABB::from_corners([b.0, b.1], [b.2, b.3]))
            .map(|i| i.0)
            .collect();
        v.sort();
        v
    }
}

/// The place area of a feature, if it is one: a way or relation tagged
/// with one of `places`, whose shape is a polygon. Its level is 0.
fn place_area(key: ElementKey, f: &Feature, places: &[String]) -> Option<Area> {
    if key.0 == MemberKind::Node || !f.tags.get("place").is_some_and(|p| places.contains(p)) {
        return None;
    }
    polygon_area(key, f, 0)
}

/// An area of a feature whose shape is a polygon, at `level`.
fn polygon_area(key: ElementKey, f: &Feature, level: u8) -> Option<Area> {
    let Shape::Polygon(rings) = &f.shape else {
        return None;
    };
    Some(Area {
        key,
        name: f.tags.get("name").cloned(),
        level,
        bbox: f.shape.bbox(),
        rings: rings.clone(),
    })
}

/// Reads the place areas (place=city, town, village, ... as given): ways and
/// relations whose shape is a polygon. Their level is 0.
pub fn place_areas(store: &Store, places: &[String]) -> Result<Areas, StoreError> {
    let every = TileLayer::every_key();
    let view = Current::new(store);
    let mut list = Vec::new();
    for (kind, id) in store.tagged_like("\"place\":")? {
        if let Some(f) = feature(&view, kind, id, &every)? {
            list.extend(place_area((kind, id), &f, places));
        }
    }
    Ok(Areas::new(list))
}

/// The place areas after the elements in `dirty` changed: `old`, as last
/// stored, with each dirty element's area recomputed. What a drain reads
/// instead of every place in the store.
pub fn place_areas_after(
    store: &Store,
    old: &[Area],
    dirty: &BTreeSet<ElementKey>,
    places: &[String],
) -> Result<Areas, StoreError> {
    update_areas(store, old, dirty, &|t| t.contains_key("place"), &|k, f| {
        place_area(k, f, places)
    })
}

/// The admin areas after the elements in `dirty` changed (see
/// [`place_areas_after`]). An area's shape, name or level changes only
/// when its element is touched (its own tags, a member way, a node of
/// one), and the touched elements are exactly the dirty keys.
pub fn areas_after(
    store: &Store,
    old: &[Area],
    dirty: &BTreeSet<ElementKey>,
    levels: &[u8],
) -> Result<Areas, StoreError> {
    update_areas(
        store,
        old,
        dirty,
        &|t| t.get("boundary").is_some_and(|b| b == "administrative"),
        &|k, f| admin_area(k, f, levels),
    )
}

fn update_areas(
    store: &Store,
    old: &[Area],
    dirty: &BTreeSet<ElementKey>,
    maybe: &dyn Fn(&Tags) -> bool,
    make: &dyn Fn(ElementKey, &Feature) -> Option<Area>,
) -> Result<Areas, StoreError> {
    let every = TileLayer::every_key();
    let view = Current::new(store);
    let mut by: BTreeMap<ElementKey, Area> = old.iter().map(|a| (a.key, a.clone())).collect();
    for &k in dirty {
        by.remove(&k);
        // Areas are ways and relations, and only those whose tags say so
        // are assembled (most touched elements are not areas).
        let tags = match k.0 {
            MemberKind::Node => continue,
            MemberKind::Way => store.way(k.1)?.map(|w| w.tags),
            MemberKind::Relation => store.relation(k.1)?.map(|r| r.tags),
        };
        if !tags.is_some_and(|t| maybe(&t)) {
            continue;
        }
        if let Some(f) = feature(&view, k.0, k.1, &every)? {
            if let Some(a) = make(k, &f) {
                by.insert(k, a);
            }
        }
    }
    Ok(Areas::new(by.into_values().collect()))
}

/// Whether `p` is inside the rings (even-odd).
pub(crate) fn in_rings(p: P, rings: &[Vec<P>]) -> bool {
    rings.iter().filter(|r| inside(p, r)).count() % 2 == 1
}

/// The admin area of a feature, if it is one: boundary=administrative at
/// one of `levels`, with a polygon shape.
fn admin_area(key: ElementKey, f: &Feature, levels: &[u8]) -> Option<Area> {
    if f.tags.get("boundary").map(String::as_str) != Some("administrative") {
        return None;
    }
    let level = f
        .tags
        .get("admin_level")
        .and_then(|l| l.parse::<u8>().ok())?;
    if !levels.contains(&level) {
        return None;
    }
    polygon_area(key, f, level)
}

/// Reads the admin areas of the given levels: boundary=administrative
/// ways and relations whose shape is a polygon.
pub fn areas(store: &Store, levels: &[u8]) -> Result<Areas, StoreError> {
    let every = TileLayer::every_key();
    let view = Current::new(store);
    let mut list = Vec::new();
    for (kind, id) in store.tagged_like("\"boundary\":\"administrative\"")? {
        if let Some(f) = feature(&view, kind, id, &every)? {
            list.extend(admin_area((kind, id), &f, levels));
        }
    }
    Ok(Areas::new(list))
}

/// A point on the surface: the point itself, a line's middle vertex, or
/// for a polygon the middle of the first inside stretch of the horizontal
/// line through its box's centre.
pub fn surface_point(shape: &Shape) -> Option<P> {
    match shape {
        Shape::Point(p) => Some(*p),
        Shape::Lines(l) => l.first().map(|l| l[l.len() / 2]),
        Shape::Polygon(rings) => {
            let (_, y0, _, y1) = shape.bbox();
            let y = (y0 + y1) / 2.0;
            let mut xs = Vec::new();
            for r in rings {
                for e in r.windows(2) {
                    let (a, b) = (e[0], e[1]);
                    if (a.1 <= y) != (b.1 <= y) {
                        xs.push(a.0 + (y - a.1) / (b.1 - a.1) * (b.0 - a.0));
                    }
                }
            }
            xs.sort_by(f64::total_cmp);
            (xs.len() >= 2).then(|| ((xs[0] + xs[1]) / 2.0, y))
        }
    }
}

/// The bounding box of the segments in one ring set and not the other:
/// the region between an old and a new boundary lies inside it.
pub fn changed_box(old: &[Vec<P>], new: &[Vec<P>]) -> Option<(f64, f64, f64, f64)> {
    let segs = |rings: &[Vec<P>]| -> BTreeSet<[u64; 4]> {
        rings
            .iter()
            .flat_map(|r| r.windows(2))
            .map(|s| {
                let (a, b) = if (s[0].0, s[0].1) <= (s[1].0, s[1].1) {
                    (s[0], s[1])
                } else {
                    (s[1], s[0])
                };
                [a.0.to_bits(), a.1.to_bits(), b.0.to_bits(), b.1.to_bits()]
            })
            .collect()
    };
    let (a, b) = (segs(old), segs(new));
    a.symmetric_difference(&b)
        .flat_map(|s| {
            [
                (f64::from_bits(s[0]), f64::from_bits(s[1])),
                (f64::from_bits(s[2]), f64::from_bits(s[3])),
            ]
        })
        .fold(None, |acc: Option<(f64, f64, f64, f64)>, p| {
            Some(match acc {
                None => (p.0, p.1, p.0, p.1),
                Some(b) => (b.0.min(p.0), b.1.min(p.1), b.2.max(p.0), b.3.max(p.1)),
            })
        })
}

/// The areas' table, read through the store.
pub trait AreasStore {
    /// The admin areas as the dataset last saw them.
    fn agg_areas(&self, dataset: &str) -> Result<Vec<Area>, StoreError>;
}

impl AreasStore for Store {
    fn agg_areas(&self, dataset: &str) -> Result<Vec<Area>, StoreError> {
        let mut st = self
            .conn()
            .prepare_cached("SELECT kind, id, name, level, minx, miny, maxx, maxy, rings FROM agg_areas WHERE dataset = ?1 ORDER BY kind, id")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([dataset], |r| {
                Ok((
                    (kind_of(r.get(0)?), r.get::<_, i64>(1)?),
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, u8>(3)?,
                    (r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?),
                    r.get::<_, Vec<u8>>(8)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (key, name, level, bbox, rings) = row.map_err(|e| self.err(e))?;
            let rings = rings_from_blob(&rings).ok_or_else(|| StoreError::Corrupt {
                path: self.path().to_path_buf(),
                what: format!("agg_areas rings of {key:?} do not decode"),
            })?;
            out.push(Area {
                key,
                name,
                level,
                rings,
                bbox,
            });
        }
        Ok(out)
    }
}

/// The areas' table, written in a write transaction.
pub trait AreasWriter {
    /// Writes only the areas that differ between `old` (as stored) and
    /// `new`: a drain's write costs the areas that changed.
    fn agg_update_areas(
        &mut self,
        dataset: &str,
        old: &[Area],
        new: &[Area],
    ) -> Result<(), StoreError>;
    fn agg_insert_area(&mut self, dataset: &str, a: &Area) -> Result<(), StoreError>;
    fn agg_set_areas(&mut self, dataset: &str, areas: &[Area]) -> Result<(), StoreError>;
}

impl AreasWriter for Writer<'_> {
    fn agg_update_areas(
        &mut self,
        dataset: &str,
        old: &[Area],
        new: &[Area],
    ) -> Result<(), StoreError> {
        let old_by: BTreeMap<ElementKey, &Area> = old.iter().map(|a| (a.key, a)).collect();
        let new_by: BTreeMap<ElementKey, &Area> = new.iter().map(|a| (a.key, a)).collect();
        for (k, o) in &old_by {
            if new_by.get(k) != Some(o) {
                self.tx()
                    .prepare_cached(
                        "DELETE FROM agg_areas WHERE dataset = ?1 AND kind = ?2 AND id = ?3",
                    )
                    .and_then(|mut st| st.execute(params![dataset, kind_code(k.0), k.1]))
                    .map_err(|e| self.err(e))?;
            }
        }
        for (k, n) in &new_by {
            if old_by.get(k) != Some(n) {
                self.agg_insert_area(dataset, n)?;
            }
        }
        Ok(())
    }

    fn agg_insert_area(&mut self, dataset: &str, a: &Area) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached("INSERT INTO agg_areas(dataset, kind, id, name, level, minx, miny, maxx, maxy, rings) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)")
            .and_then(|mut st| {
                st.execute(params![
                    dataset,
                    kind_code(a.key.0),
                    a.key.1,
                    a.name,
                    a.level,
                    a.bbox.0,
                    a.bbox.1,
                    a.bbox.2,
                    a.bbox.3,
                    rings_blob(&a.rings)
                ])
            })
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn agg_set_areas(&mut self, dataset: &str, areas: &[Area]) -> Result<(), StoreError> {
        self.clear_dataset(&["agg_areas"], dataset)?;
        for a in areas {
            self.agg_insert_area(dataset, a)?;
        }
        Ok(())
    }
}
