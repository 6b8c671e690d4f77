//! The OSM data model, as far as highwater needs it. Coordinates are fixed
//! point (degrees times 10^7) as in OSM's own database, so that a coordinate
//! read from XML and one read from PBF compare equal.

use std::collections::BTreeMap;

pub type Tags = BTreeMap<String, String>;

/// Degrees times 10^7.
pub const COORD_SCALE: f64 = 1e7;

/// The largest element id (in absolute value) the store takes: an id keeps
/// its type in two more bits in the shapes index and in MVT feature ids,
/// and those must not wrap. OSM's ids are near 2^34 today.
pub const ID_ABS_MAX: i64 = 1 << 60;

/// Why a negative id is refused (issue 50), said after it: an editor's
/// placeholder is no OSM id, and applying it would store objects that a
/// second such file, reusing -1, -2, ..., silently replaces.
pub const NEGATIVE_ID_ADVICE: &str = "negative ids are what an editor (JOSM) gives objects not yet uploaded, so this is not a replication diff or an extract, and a second such file would reuse the same ids for other objects; upload the edit to OpenStreetMap and apply the diff replication then publishes (or import a current extract)";

/// Whether an element id (or a reference) is within [`ID_ABS_MAX`].
pub fn id_in_range(id: i64) -> bool {
    id.checked_abs().is_some_and(|a| a < ID_ABS_MAX)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: i64,
    /// `None` in a delete that carries no coordinates.
    pub lat_e7: Option<i32>,
    pub lon_e7: Option<i32>,
    pub tags: Tags,
}

impl Node {
    /// (lon, lat) in degrees, if the node has a location.
    pub fn lonlat(&self) -> Option<(f64, f64)> {
        Some((
            self.lon_e7? as f64 / COORD_SCALE,
            self.lat_e7? as f64 / COORD_SCALE,
        ))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Way {
    pub id: i64,
    pub refs: Vec<i64>,
    pub tags: Tags,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemberKind {
    Node,
    Way,
    Relation,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub kind: MemberKind,
    pub id: i64,
    pub role: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub id: i64,
    pub members: Vec<Member>,
    pub tags: Tags,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Element {
    Node(Node),
    Way(Way),
    Relation(Relation),
}

impl Element {
    /// `n123`, `w45`, `r6`: how errors and outputs name an element.
    pub fn key(&self) -> String {
        match self {
            Element::Node(n) => format!("n{}", n.id),
            Element::Way(w) => format!("w{}", w.id),
            Element::Relation(r) => format!("r{}", r.id),
        }
    }
}

/// What a change file does to an element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Create,
    Modify,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub action: Action,
    pub element: Element,
}
