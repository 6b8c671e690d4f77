//! OpenStreetMap for highwater: the primary store kept current from
//! replication diffs, the affected set of each diff derived before it is
//! applied, and the derived datasets (vector tiles, a search index,
//! aggregates) kept equal to their rebuilds.
//!
//! This crate is where OSM formats are parsed and nowhere else. Layout:
//!
//! - [`model`]: nodes, ways, relations and the actions of a change file.
//! - [`xml`]: a streaming reader for `.osm` and `.osc` (optionally gzipped)
//!   whose errors name the file, line and element.
//! - [`import`]: extracts (PBF in parallel, or XML) gathered in memory and
//!   written in bulk into an unseen file, published whole; replication
//!   state files.
//! - [`store`]: the primary store (SQLite): elements, the member→relations
//!   index, the shapes index, dirty sets, markers. It knows no dataset:
//!   each kind creates its own tables ([`dataset::tables`]).
//! - [`nodeblocks`]: nodes and the ways through them, in blocks of
//!   consecutive ids.
//! - [`cells`]: the shapes index's spatial key (a flattened loose quadtree).
//! - [`coast`]: the sea of an extract from its coastline ways, closed along
//!   its bounds (the import records them); the tiles' `ocean` layer
//!   ([`tiles::ocean`]).
//! - [`features`]: what a layer sees of an element, and per-tile content
//!   signatures; expiry and the cutter both read features from here.
//! - [`derive`](mod@derive): derive-before-apply (affected tiles from old
//!   and new state), the touched set, and the shapes index's upkeep.
//! - [`dataset`]: the one trait every derived dataset implements, with
//!   the order `ops::apply` calls it in.
//! - [`tiles`]: the MBTiles dataset (build, drain, verify), with
//!   [`tiles::schema`] (Shortbread 1.0 bundled), [`tiles::cut`] and
//!   [`tiles::mvt`].
//! - [`search`]: the tantivy dataset with denormalised context.
//! - [`aggregates`]: counts, lengths and areas per admin area and class.
//! - [`flatnodes`]: untagged nodes' locations in a flat file indexed by id
//!   (`[osm] flat_nodes`), behind the store's node reads.
//! - [`fetch`]: replication over HTTP (the pyosmium/osmosis protocol), each
//!   failure classed: retried, refused, or needing an operator.
//! - [`ops`]: config, apply (dry run, dirty sets, markers), replicate, status.
//!
//! Tile math lives in `highwater_core::tile`, since it is pure.

pub mod aggregates;
pub mod cells;
pub mod coast;
pub mod dataset;
pub mod derive;
pub mod features;
pub mod fetch;
pub mod flatnodes;
pub mod import;
pub mod model;
pub mod nodeblocks;
pub mod ops;
pub mod search;
pub mod spill;
pub mod store;
pub mod tiles;
pub mod xml;

pub use model::{Action, Change, Element, Member, MemberKind, Node, Relation, Tags, Way};
pub use xml::{read_changes, read_osm, OsmError};
