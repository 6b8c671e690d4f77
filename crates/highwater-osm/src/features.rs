//! Features: what a tile layer sees of an element. One function builds a
//! feature from a view of the data (the store before a diff, the store with
//! the diff laid over it, or the store after), and both expiry and the tile
//! cutter use it, so the two can never disagree about what a layer shows.
//!
//! A feature is the element's tags as far as the layer reads them, and its
//! shape in world coordinates:
//! - a node with tags the layer reads is a point;
//! - a way is a polygon when it is closed and tagged as an area, a line
//!   otherwise;
//! - a multipolygon or boundary relation is a polygon when every chain of
//!   its member ways closes into a ring, and lines when some chain does not
//!   (an extract cuts a country's border open: drawing its chains is honest,
//!   closing them with a made-up edge is not);
//! - a route relation is the lines of its member ways.
//!
//! Everything else has no feature. Nodes and ways missing from the store
//! (outside an extract) are skipped, the way osm2pgsql skips them.

pub use crate::geom::{inside, nesting, ElementKey, Feature, Shape, View, P};
use crate::model::{Action, Change, Element, MemberKind, Relation, Tags, Way};
use crate::mvt::Value;
use crate::schema::{Placement, Schema};
use crate::store::{OsmRead, StoreError};
use highwater_core::tile;
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
    /// When only a feature's geometry changed (the tags the layer reads did
    /// not), expire only the tiles whose content changed: those where the
    /// segments touching the tile, or (for an area) whether the tile's
    /// centre is inside, differ before and after. Off: every tile the old
    /// or the new feature touches.
    pub diff_expire: bool,
    /// The tile schema, when the tiles follow one (`schema = "..."`): then
    /// `keys` are the keys it reads, and features go into its layers with
    /// its attributes, zooms and simplification. `None`: one layer named
    /// after the dataset, showing each feature's tags as they are.
    pub schema: Option<std::sync::Arc<Schema>>,
}

impl TileLayer {
    /// A layer reading every key but metadata: whatever any layer can see
    /// has a feature here, so the shapes index built with it covers all.
    pub fn every_key() -> TileLayer {
        TileLayer {
            zoom_min: 0,
            zoom_max: 0,
            keys: None,
            buffer: 0.0,
            diff_expire: false,
            schema: None,
        }
    }

    /// A layer following `schema` over all its zooms, with its buffer, its
    /// keys and exact (signature-comparing) expiry.
    pub fn from_schema(schema: Schema) -> TileLayer {
        TileLayer {
            zoom_min: 0,
            zoom_max: schema.zoom_max,
            keys: Some(schema.keys.clone()),
            buffer: schema.buffer,
            diff_expire: true,
            schema: Some(std::sync::Arc::new(schema)),
        }
    }

    /// Where a feature goes in the tiles: its placements (see
    /// [`crate::schema`]); without a schema, one placement in layer 0 with
    /// its tags as string attributes.
    pub fn place(&self, f: &Feature) -> Vec<Placement> {
        match &self.schema {
            Some(s) => s.classify(f),
            None => vec![Placement {
                layer: 0,
                zoom: self.zoom_min,
                attrs: f
                    .tags
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
                shape: f.shape.clone(),
            }],
        }
    }

    /// What a placement shows at zoom `z`, if anything.
    pub fn shape_at(&self, p: &Placement, z: u8) -> Option<Shape> {
        if z < self.zoom_min || z > self.zoom_max {
            return None;
        }
        match &self.schema {
            Some(s) => p.at(s, z),
            None => Some(p.shape.clone()),
        }
    }

    /// The names of the tile layers, by placement layer index.
    pub fn layer_names<'a>(&'a self, dataset: &'a str) -> Vec<&'a str> {
        match &self.schema {
            Some(s) => s.layers.iter().map(|l| l.name.as_str()).collect(),
            None => vec![dataset],
        }
    }

    /// Per tile of zoom `z`, a hash of everything the placements show in
    /// it: each shown shape's [`signatures`] with its layer and attributes.
    /// Equal hashes in a tile: the element cuts to the same thing there.
    pub fn signatures(&self, placements: &[Placement], z: u8) -> HashMap<(u32, u32), u64> {
        let mut out: HashMap<(u32, u32), u64> = HashMap::new();
        for p in placements {
            let Some(shape) = self.shape_at(p, z) else {
                continue;
            };
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(&p.attrs, &mut h);
            let attrs = std::hash::Hasher::finish(&h);
            for (c, sig) in signatures(&shape, z, self.buffer) {
                let e = out.entry(c).or_insert(5);
                *e = mix(*e, &[p.layer as u64, attrs, sig]);
            }
        }
        out
    }

    /// Whether the layer shows the sea ([`crate::coast`]): it follows a
    /// schema that reads [`crate::coast::OCEAN_TAG`] (Shortbread's `ocean`
    /// layer). Layers without a schema show elements' tags only.
    pub fn shows_ocean(&self) -> bool {
        self.schema.is_some()
            && self
                .keys
                .as_ref()
                .is_some_and(|k| k.contains(crate::coast::OCEAN_TAG.0))
    }

    pub fn relevant<'t>(&self, tags: &'t Tags) -> BTreeMap<&'t str, &'t str> {
        tags.iter()
            // Metadata never shows, whatever a layer lists: the shape index
            // (`store::shapes`) relies on it to cover every layer's features.
            .filter(|(k, _)| !METADATA_KEYS.contains(&k.as_str()))
            .filter(|(k, _)| match &self.keys {
                Some(keys) => keys.contains(*k),
                None => true,
            })
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// The store as it is, with the nodes it has read kept: deriving reads the
/// same nodes for the old and the new shape of a way and of its relations.
pub struct Current<'a, S: OsmRead + ?Sized> {
    store: &'a S,
    nodes: std::cell::RefCell<HashMap<i64, Option<crate::model::Node>>>,
    cache: bool,
}

impl<'a, S: OsmRead + ?Sized> Current<'a, S> {
    /// Keeps every node read: for deriving, which reads few nodes often.
    pub fn new(store: &'a S) -> Self {
        Current {
            store,
            nodes: Default::default(),
            cache: true,
        }
    }

    /// Keeps nothing: for a full pass over the store, whose nodes would not
    /// fit a bounded memory.
    pub fn uncached(store: &'a S) -> Self {
        Current {
            cache: false,
            ..Current::new(store)
        }
    }

    fn node<T>(
        &self,
        id: i64,
        f: impl FnOnce(Option<&crate::model::Node>) -> T,
    ) -> Result<T, StoreError> {
        if let Some(n) = self.nodes.borrow().get(&id) {
            return Ok(f(n.as_ref()));
        }
        let n = self.store.node(id)?;
        let out = f(n.as_ref());
        if self.cache {
            self.nodes.borrow_mut().insert(id, n);
        }
        Ok(out)
    }
}

impl<S: OsmRead + ?Sized> View for Current<'_, S> {
    fn loc(&self, node: i64) -> Result<Option<P>, StoreError> {
        self.node(node, |n| n.and_then(world_of))
    }
    fn node_tags(&self, node: i64) -> Result<Option<Tags>, StoreError> {
        self.node(node, |n| n.map(|n| n.tags.clone()))
    }
    fn way(&self, id: i64) -> Result<Option<Way>, StoreError> {
        self.store.way(id)
    }
    fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError> {
        self.store.relation(id)
    }
}

/// The store with a diff's merged changes laid over it: the state the
/// store will have once the diff is applied, read before it is.
pub struct Overlay<'a, S: OsmRead + ?Sized> {
    pub store: &'a Current<'a, S>,
    pub changes: &'a BTreeMap<(MemberKind, i64), Change>,
}

impl<S: OsmRead + ?Sized> Overlay<'_, S> {
    fn changed(&self, kind: MemberKind, id: i64) -> Option<Option<&Element>> {
        self.changes
            .get(&(kind, id))
            .map(|c| (c.action != Action::Delete).then_some(&c.element))
    }
}

impl<S: OsmRead + ?Sized> View for Overlay<'_, S> {
    fn loc(&self, node: i64) -> Result<Option<P>, StoreError> {
        match self.changed(MemberKind::Node, node) {
            Some(Some(Element::Node(n))) => Ok(world_of(n)),
            Some(_) => Ok(None),
            None => self.store.loc(node),
        }
    }
    fn node_tags(&self, node: i64) -> Result<Option<Tags>, StoreError> {
        match self.changed(MemberKind::Node, node) {
            Some(Some(Element::Node(n))) => Ok(Some(n.tags.clone())),
            Some(_) => Ok(None),
            None => self.store.node_tags(node),
        }
    }
    fn way(&self, id: i64) -> Result<Option<Way>, StoreError> {
        match self.changed(MemberKind::Way, id) {
            Some(Some(Element::Way(w))) => Ok(Some(w.clone())),
            Some(_) => Ok(None),
            None => self.store.way(id),
        }
    }
    fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError> {
        match self.changed(MemberKind::Relation, id) {
            Some(Some(Element::Relation(r))) => Ok(Some(r.clone())),
            Some(_) => Ok(None),
            None => self.store.relation(id),
        }
    }
}

pub(crate) fn world_of(n: &crate::model::Node) -> Option<P> {
    n.lonlat().map(|(lon, lat)| tile::world(lon, lat))
}

/// Keys that make a closed way an area, whatever their value.
const AREA_KEYS: [&str; 8] = [
    "building",
    "landuse",
    "natural",
    "leisure",
    "amenity",
    "place",
    "military",
    "area:aeroway",
];

/// Keys that make a closed way an area with some values only: a closed
/// `waterway=river` or `man_made=embankment` is a loop, a closed dock or
/// pier is a surface (as osm2pgsql's and planetiler's area rules have it).
const AREA_VALUES: [(&str, &[&str]); 3] = [
    ("waterway", &["riverbank", "dock", "dam", "boatyard"]),
    ("man_made", &["pier", "breakwater", "groyne", "bridge"]),
    ("aeroway", &["aerodrome", "apron", "helipad"]),
];

/// The sea of the store as `s` reads it, from every coastline way.
pub fn assemble_sea(s: &(impl OsmRead + ?Sized)) -> Result<Option<Feature>, StoreError> {
    let bounds = crate::coast::bounds_of(s.meta(crate::coast::BOUNDS_META)?.as_deref());
    if bounds.is_none() {
        return Ok(None);
    }
    let view = Current::uncached(s);
    crate::coast::ocean_feature(&view, s.coastline_ways()?, bounds)
}

/// Whether a closed way is an area, judged on all its tags (not only the
/// ones a layer reads, so that every layer sees the same shape).
pub fn is_area(w: &Way) -> bool {
    w.refs.len() > 3
        && w.refs.first() == w.refs.last()
        && w.tags.get("area").is_none_or(|v| v != "no")
        && (w.tags.get("area").is_some_and(|v| v == "yes")
            || AREA_KEYS.iter().any(|k| w.tags.contains_key(*k))
            || AREA_VALUES
                .iter()
                .any(|(k, vs)| w.tags.get(*k).is_some_and(|v| vs.contains(&v.as_str()))))
}

fn points(view: &dyn View, refs: &[i64]) -> Result<Vec<P>, StoreError> {
    let mut pts = Vec::with_capacity(refs.len());
    for r in refs {
        if let Some(p) = view.loc(*r)? {
            pts.push(p);
        }
    }
    Ok(pts)
}

/// A way's shape from the points of its located nodes, in order: an area
/// when closed and tagged as one, else a line when it has two points.
pub(crate) fn way_shape(w: &Way, pts: Vec<P>) -> Option<Shape> {
    if is_area(w) && pts.len() > 3 && pts.first() == pts.last() {
        Some(Shape::Polygon(vec![pts]))
    } else if pts.len() >= 2 {
        Some(Shape::Lines(vec![pts]))
    } else {
        None
    }
}

/// What kind of feature a relation makes, if any.
pub(crate) fn relation_kind(r: &Relation) -> Option<&'static str> {
    match r.tags.get("type").map(String::as_str) {
        Some("multipolygon") | Some("boundary") => Some("area"),
        Some("route") => Some("route"),
        _ => None,
    }
}

/// Whether a relation can have a feature: the callers use it to skip
/// relations without reading their members.
pub fn relation_has_shape(r: &Relation) -> bool {
    relation_kind(r).is_some()
}

/// The feature of one element as `view` sees it, for `layer`.
pub fn feature(
    view: &dyn View,
    kind: MemberKind,
    id: i64,
    layer: &TileLayer,
) -> Result<Option<Feature>, StoreError> {
    let (tags, shape) = match kind {
        MemberKind::Node => {
            let Some(tags) = view.node_tags(id)? else {
                return Ok(None);
            };
            let tags = own_tags(layer.relevant(&tags));
            if tags.is_empty() {
                return Ok(None);
            }
            (tags, view.loc(id)?.map(Shape::Point))
        }
        MemberKind::Way => {
            let Some(w) = view.way(id)? else {
                return Ok(None);
            };
            let tags = own_tags(layer.relevant(&w.tags));
            if tags.is_empty() {
                return Ok(None);
            }
            (tags, way_shape(&w, points(view, &w.refs)?))
        }
        MemberKind::Relation => {
            let Some(r) = view.relation(id)? else {
                return Ok(None);
            };
            let Some(k) = relation_kind(&r) else {
                return Ok(None);
            };
            let tags = own_tags(layer.relevant(&r.tags));
            if tags.is_empty() {
                return Ok(None);
            }
            let shape = if k == "route" {
                let mut lines = Vec::new();
                for m in r.members.iter().filter(|m| m.kind == MemberKind::Way) {
                    if let Some(w) = view.way(m.id)? {
                        let pts = points(view, &w.refs)?;
                        if pts.len() >= 2 {
                            lines.push(pts);
                        }
                    }
                }
                (!lines.is_empty()).then_some(Shape::Lines(lines))
            } else {
                assemble(view, &r)?
            };
            (tags, shape)
        }
    };
    Ok(shape.map(|shape| Feature { tags, shape }))
}

/// Every feature in the store for `layer`, ordered by type and id: the
/// full rebuild that incremental work is compared against. Holds them all:
/// for what fits in memory (tests, verify); a rebuild at any size reads
/// them through a [`Pass`].
pub fn all(
    store: &crate::store::Store,
    layer: &TileLayer,
) -> Result<Vec<(ElementKey, Feature)>, StoreError> {
    store.snapshot(|store| {
        let mut pass = Pass::new(layer);
        let mut out = Vec::new();
        while let Some(page) = pass.next_page(store)? {
            out.extend(page);
        }
        Ok(out)
    })
}

/// Tagged elements a [`Pass`] reads at a time.
pub const PASS_PAGE_LEN: usize = 8192;

/// A full pass over the store's features for a layer, a page at a time,
/// ordered by type and id, the sea last (for a schema with an ocean layer:
/// assembled from every coastline way, as the drain's kept copy must
/// equal). What it holds is one page, whatever the store's size. The
/// caller keeps one transaction open across pages, so the pass reads one
/// state of the store.
pub struct Pass<'l> {
    layer: &'l TileLayer,
    ids: TaggedPages,
    sea_done: bool,
}

/// The store's tagged elements' ids, a page at a time: nodes, then ways,
/// then relations, each in id order. The walk a [`Pass`] makes, for callers
/// that read something other than features per id (search documents).
pub struct TaggedPages {
    kind: usize,
    after: i64,
    page_len: usize,
}

impl TaggedPages {
    const KINDS: [MemberKind; 3] = [MemberKind::Node, MemberKind::Way, MemberKind::Relation];

    pub fn new(page_len: usize) -> Self {
        assert!(page_len > 0, "a page holds at least one element");
        TaggedPages {
            kind: 0,
            after: i64::MIN,
            page_len,
        }
    }

    /// The next ids of one type, at least one; `None` when the walk is
    /// done.
    pub fn next_page<S: OsmRead + ?Sized>(
        &mut self,
        store: &S,
    ) -> Result<Option<(MemberKind, Vec<i64>)>, StoreError> {
        while let Some(&kind) = Self::KINDS.get(self.kind) {
            let ids = store.tagged_page(kind, self.after, self.page_len)?;
            let Some(&last) = ids.last() else {
                self.kind += 1;
                self.after = i64::MIN;
                continue;
            };
            self.after = last;
            return Ok(Some((kind, ids)));
        }
        Ok(None)
    }
}

impl<'l> Pass<'l> {
    pub fn new(layer: &'l TileLayer) -> Self {
        Pass {
            layer,
            ids: TaggedPages::new(PASS_PAGE_LEN),
            sea_done: false,
        }
    }

    /// The next features, at least one; `None` when the pass is done.
    pub fn next_page<S: OsmRead + ?Sized>(
        &mut self,
        store: &S,
    ) -> Result<Option<Vec<(ElementKey, Feature)>>, StoreError> {
        let view = Current::uncached(store);
        while let Some((kind, ids)) = self.ids.next_page(store)? {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(f) = feature(&view, kind, id, self.layer)? {
                    out.push(((kind, id), f));
                }
            }
            if !out.is_empty() {
                return Ok(Some(out));
            }
        }
        if !std::mem::replace(&mut self.sea_done, true) && self.layer.shows_ocean() {
            if let Some(f) = assemble_sea(store)? {
                return Ok(Some(vec![(crate::coast::OCEAN_KEY, f)]));
            }
        }
        Ok(None)
    }
}

/// An element's tags as a feature holds them: the sea's reserved tag
/// ([`crate::coast::OCEAN_TAG`]) is never an element's.
fn own_tags(mut tags: BTreeMap<&str, &str>) -> BTreeMap<String, String> {
    tags.remove(crate::coast::OCEAN_TAG.0);
    owned(tags)
}

fn owned(tags: BTreeMap<&str, &str>) -> BTreeMap<String, String> {
    tags.into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Joins a relation's member ways end to end into chains, in member order.
/// All chains closed: a polygon. Otherwise: the chains as lines.
fn assemble(view: &dyn View, r: &Relation) -> Result<Option<Shape>, StoreError> {
    let mut pieces: Vec<Vec<i64>> = Vec::new();
    for m in r.members.iter().filter(|m| m.kind == MemberKind::Way) {
        if let Some(w) = view.way(m.id)? {
            if w.refs.len() >= 2 {
                pieces.push(w.refs);
            }
        }
    }
    // Take pieces from the front so the result follows member order.
    pieces.reverse();
    let mut chains = Vec::new();
    while let Some(mut chain) = pieces.pop() {
        while chain.first() != chain.last() {
            let end = *chain.last().expect("a chain has at least two nodes");
            let Some(i) = pieces
                .iter()
                .rposition(|p| p.first() == Some(&end) || p.last() == Some(&end))
            else {
                break;
            };
            let mut next = pieces.remove(i);
            if next.first() != Some(&end) {
                next.reverse();
            }
            chain.extend_from_slice(&next[1..]);
        }
        chains.push(chain);
    }
    let closed = chains.iter().all(|c| c.len() > 3 && c.first() == c.last());
    let mut out = Vec::new();
    for c in &chains {
        let pts = points(view, c)?;
        let usable = if closed {
            pts.len() > 3 && pts.first() == pts.last()
        } else {
            pts.len() >= 2
        };
        if usable {
            out.push(pts);
        }
    }
    Ok(match (out.is_empty(), closed) {
        (true, _) => None,
        (false, true) => Some(Shape::Polygon(out)),
        (false, false) => Some(Shape::Lines(out)),
    })
}

/// Folds values into a running signature. splitmix64's finaliser after each
/// value: cheap, and every input bit reaches every output bit, so an
/// accidental equality of two different sequences (which would hide a
/// changed tile) is as unlikely as for a 64-bit random value.
fn mix(state: u64, values: &[u64]) -> u64 {
    let mut h = state;
    for v in values {
        h = (h ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
    }
    h
}

/// What one tile of one zoom shows of a feature, as a hash: the feature's
/// segments that touch the tile grown by `buffer`, in order, with their
/// line or ring, and for a polygon whether the area (even-odd) contains the
/// tile's centre (which, with the segments, fixes the area's part in the
/// tile); a polygon's inside tile that no segment touches has only the
/// latter, and a tile inside a hole that no segment touches has none. Two shapes with equal signatures in a tile
/// cut to the same thing in that tile, so a geometry-only change expires
/// exactly the tiles whose signature changed.
pub fn signatures(shape: &Shape, z: u8, buffer: f64) -> HashMap<(u32, u32), u64> {
    let mut sig: HashMap<(u32, u32), u64> = HashMap::new();
    // Each segment is hashed with what its line or ring is (index, and for
    // rings the nesting), so that joining or splitting lines, or a ring
    // turning into a hole, changes the tiles it touches.
    let segs = |lines: &[Vec<P>], tags: &[[u64; 3]], sig: &mut HashMap<(u32, u32), u64>| {
        for (l, t) in lines.iter().zip(tags) {
            for s in l.windows(2) {
                let bits = [
                    t[0],
                    t[1],
                    t[2],
                    s[0].0.to_bits(),
                    s[0].1.to_bits(),
                    s[1].0.to_bits(),
                    s[1].1.to_bits(),
                ];
                tile::segment_cells(s[0], s[1], z, buffer, &mut |c| {
                    let e = sig.entry(c).or_insert(1);
                    *e = mix(*e, &bits);
                });
            }
        }
    };
    match shape {
        Shape::Point(p) => {
            let mut cells = tile::Cells::new();
            tile::add_point(*p, z, buffer, &mut cells);
            for c in cells {
                sig.insert(c, mix(2, &[p.0.to_bits(), p.1.to_bits()]));
            }
        }
        Shape::Lines(lines) => {
            let tags: Vec<[u64; 3]> = (0..lines.len()).map(|i| [i as u64, 0, 0]).collect();
            segs(lines, &tags, &mut sig)
        }
        Shape::Polygon(rings) => {
            let tags: Vec<[u64; 3]> = nesting(rings)
                .iter()
                .enumerate()
                .map(|(i, (d, p))| [i as u64, *d as u64, p.map_or(u64::MAX, |p| p as u64)])
                .collect();
            segs(rings, &tags, &mut sig);
            // Whether the area (even-odd over all rings) contains the
            // tile's centre: with the segments and their rings' nesting,
            // that fixes the area's part in the tile. A tile inside a hole
            // that no segment touches shows nothing and gets no signature,
            // so it is never expired for this feature.
            tile::fill_cells(rings, z, &mut |c| {
                let e = sig.entry(c).or_insert(3);
                *e = mix(*e, &[4]);
            });
        }
    }
    sig
}

/// Below this zoom a tile's candidates come from the low-zoom index: the
/// features that some dataset shows below it (the store's constant).
pub use crate::store::{LOW_ZOOM, ZOOM_NONE};

/// From which zoom features show, for the tile datasets of a config: the
/// predicate of the shapes index's zooms (each shape's lowest zoom, and the
/// low-zoom index of those below [`LOW_ZOOM`]). `id` names it, so that an
/// index built for another set of datasets is seen as stale and rebuilt.
#[derive(Clone, Debug)]
pub struct LowZoom {
    layers: Vec<TileLayer>,
    pub id: String,
}

/// The version of what the shapes index holds (bump when the feature
/// encoding or the index's meaning changes: an old index is rebuilt).
const SHAPES_VERSION: &str = "shapes-3";

impl LowZoom {
    pub fn new(layers: Vec<TileLayer>, recipes: &[&str]) -> LowZoom {
        let layers: Vec<TileLayer> = layers
            .into_iter()
            .filter(|l| l.zoom_min <= l.zoom_max)
            .collect();
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&recipes, &mut h);
        LowZoom {
            id: format!("{SHAPES_VERSION}:{:016x}", std::hash::Hasher::finish(&h)),
            layers,
        }
    }

    /// For a store without tile datasets (import, tests of expiry alone).
    pub fn none() -> LowZoom {
        LowZoom::new(Vec::new(), &[])
    }

    /// The lowest zoom at which a feature (with every key) shows in some
    /// dataset: its placements' zooms, each no lower than its layer's
    /// range; [`ZOOM_NONE`] when no dataset shows it. No tile below it can
    /// show the feature, so a tile's cut need not read it; sizes and
    /// simplification are not looked at (they only ever hide more).
    pub fn min_zoom(&self, every: &Feature) -> u8 {
        self.layers
            .iter()
            .filter_map(|l| {
                let f = l.narrow(every)?;
                l.place(&f)
                    .iter()
                    .map(|p| p.zoom.max(l.zoom_min))
                    .filter(|z| *z <= l.zoom_max)
                    .min()
            })
            .min()
            .unwrap_or(ZOOM_NONE)
    }
}

impl TileLayer {
    /// A feature read with every key, as this layer reads it: its tags cut
    /// to the layer's keys; `None` when none is left (the layer does not
    /// see it), exactly as [`feature`] would build it for the layer.
    pub fn narrow(&self, every: &Feature) -> Option<Feature> {
        let tags = owned(self.relevant(&every.tags));
        (!tags.is_empty()).then(|| Feature {
            tags,
            shape: every.shape.clone(),
        })
    }

    /// [`TileLayer::narrow`], taking the feature: its shape is moved, not
    /// copied.
    pub fn narrow_owned(&self, every: Feature) -> Option<Feature> {
        let tags = owned(self.relevant(&every.tags));
        (!tags.is_empty()).then_some(Feature {
            tags,
            shape: every.shape,
        })
    }
}

/// An element's feature with every key, as the shapes index keeps it:
/// what [`feature`] assembles from nodes with [`TileLayer::every_key`],
/// read without a node. For a store whose index is live (`shapes` in its
/// meta, [`crate::derive::ensure_shapes`]): each apply rewrites an
/// element's row in the transaction that changes it, so the row is the
/// element's feature as of the reader's snapshot. Drains that read it
/// still equal a rebuild, which assembles from nodes (`osm verify`).
pub fn indexed(
    s: &(impl OsmRead + ?Sized),
    kind: MemberKind,
    id: i64,
) -> Result<Option<Feature>, StoreError> {
    let Some(bytes) = s.shape_data(kind, id)? else {
        return Ok(None);
    };
    decode(&bytes).map(Some).ok_or_else(|| StoreError::Corrupt {
        path: s.file().to_path_buf(),
        what: format!(
            "the shapes index holds unreadable bytes for {kind:?} {id}; rebuild a tile dataset (`highwater osm rebuild NAME`), which rebuilds the index"
        ),
    })
}

/// A feature as bytes, exactly (the floats' bits): the shapes index keeps
/// it, so that a re-cut never assembles ways and relations from nodes and
/// still cuts what a rebuild from nodes cuts.
pub fn encode(f: &Feature) -> Vec<u8> {
    let mut out = Vec::new();
    let u32_ = |out: &mut Vec<u8>, v: usize| out.extend_from_slice(&(v as u32).to_le_bytes());
    u32_(&mut out, f.tags.len());
    for (k, v) in &f.tags {
        for s in [k, v] {
            u32_(&mut out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
    }
    let (kind, parts): (u8, Vec<&[P]>) = match &f.shape {
        Shape::Point(p) => (0, vec![std::slice::from_ref(p)]),
        Shape::Lines(l) => (1, l.iter().map(Vec::as_slice).collect()),
        Shape::Polygon(r) => (2, r.iter().map(Vec::as_slice).collect()),
    };
    out.push(kind);
    u32_(&mut out, parts.len());
    for part in parts {
        u32_(&mut out, part.len());
        for p in part {
            out.extend_from_slice(&p.0.to_le_bytes());
            out.extend_from_slice(&p.1.to_le_bytes());
        }
    }
    out
}

/// The feature [`encode`] wrote; `None` for bytes it did not write (a
/// damaged index: the caller rebuilds it).
pub fn decode(b: &[u8]) -> Option<Feature> {
    struct Cursor<'a>(&'a [u8]);
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if n > self.0.len() {
                return None;
            }
            let (a, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(a)
        }
        fn len(&mut self) -> Option<usize> {
            Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
        }
        fn string(&mut self) -> Option<String> {
            let n = self.len()?;
            String::from_utf8(self.take(n)?.to_vec()).ok()
        }
    }
    let mut c = Cursor(b);
    let mut tags = BTreeMap::new();
    for _ in 0..c.len()? {
        let k = c.string()?;
        let v = c.string()?;
        tags.insert(k, v);
    }
    let kind = c.take(1)?[0];
    let mut parts = Vec::new();
    for _ in 0..c.len()? {
        let n = c.len()?;
        let raw = c.take(n.checked_mul(16)?)?;
        parts.push(
            raw.chunks_exact(16)
                .map(|c| {
                    (
                        f64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                        f64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
                    )
                })
                .collect::<Vec<P>>(),
        );
    }
    let shape = match kind {
        0 => Shape::Point(*parts.first()?.first()?),
        1 => Shape::Lines(parts),
        2 => Shape::Polygon(parts),
        _ => return None,
    };
    Some(Feature { tags, shape })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feature_survives_its_encoding_bit_for_bit() {
        let tags: BTreeMap<String, String> = [
            ("name".into(), "Ä;b".into()),
            ("building".into(), "yes".into()),
        ]
        .into();
        for shape in [
            Shape::Point((0.1 + 0.2, 1.0 / 3.0)),
            Shape::Lines(vec![
                vec![(0.5, 0.25), (0.75, 0.125)],
                vec![(0.0, 1e-300), (1.0, 0.0)],
            ]),
            Shape::Polygon(vec![vec![(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)]]),
        ] {
            let f = Feature {
                tags: tags.clone(),
                shape,
            };
            let b = encode(&f);
            assert_eq!(decode(&b), Some(f));
            assert_eq!(decode(&b[..b.len() - 1]), None, "a cut record is refused");
        }
    }
}
