//! OpenStreetMap for highwater, above the store: the affected set of each
//! diff derived before it is applied, the derived datasets (vector tiles,
//! a search index, aggregates) kept equal to their rebuilds, replication
//! over HTTP and the operations on top.
//!
//! The store below (elements, readers, import, the primary store, node
//! storage) is the crate `highwater_osm_store`, re-exported here under its
//! own module names ([`model`], [`xml`], [`import`], [`store`],
//! [`nodeblocks`], [`flatnodes`], [`spill`], [`cells`]); it knows no
//! dataset. Layers of this crate, each importing only those below it
//! (`tests/layers.rs` checks it):
//!
//! 1. Features and expiry, which know no dataset:
//!    - [`mvt`]: the MVT encoding and a decoder.
//!    - [`geom`]: points, shapes, features, and the views they are read
//!      from.
//!    - [`coast`]: the sea of an extract from its coastline ways, closed
//!      along its bounds (the import records them).
//!    - [`schema`]: tile schemas as data, Shortbread 1.0 bundled.
//!    - [`features`]: what a layer sees of an element, and per-tile content
//!      signatures; expiry and the cutter both read features from here.
//!    - [`areas`]: admin and place areas, shared by search and
//!      aggregates.
//!    - [`derive`](mod@derive): derive-before-apply (affected tiles from old
//!      and new state), the touched set, and the shapes index's upkeep.
//! 2. [`dataset`]: the one trait every derived dataset implements, with
//!    the order `ops::apply` calls it in, and what it returns. It names no
//!    dataset.
//! 3. The datasets, each in its own folder, each importing the trait and
//!    the layers below, never another dataset:
//!    - [`tiles`]: the MBTiles dataset (build, drain, verify), with
//!      [`tiles::cut`], [`tiles::ocean`] (the sea's layer), [`tiles::fresh`]
//!      and [`tiles::wal_index`] (serve's fresh tiles).
//!    - [`search`]: the tantivy dataset with denormalised context.
//!    - [`aggregates`]: counts, lengths and areas per admin area and class.
//! 4. [`registry`]: the one list of dataset kinds; the store's
//!    [`store::Extension`] built from it ([`open_store`], [`create_store`]).
//! 5. On top: [`fetch`] (replication over HTTP, the pyosmium/osmosis
//!    protocol, each failure classed: retried, refused, or needing an
//!    operator) and [`ops`] (config, apply with dry run, dirty sets and
//!    markers, replicate, status).
//!
//! Tile math lives in `highwater_core::tile`, since it is pure.

pub use highwater_osm_store::{cells, flatnodes, import, model, nodeblocks, spill, store, xml};

pub mod aggregates;
pub mod areas;
pub mod coast;
pub mod dataset;
pub mod derive;
pub mod features;
pub mod fetch;
pub mod geom;
pub mod mvt;
pub mod ops;
pub mod registry;
pub mod schema;
pub mod search;
pub mod tiles;

pub use model::{Action, Change, Element, Member, MemberKind, Node, Relation, Tags, Way};
pub use registry::{create_store, open_store, store_extension};
pub use xml::{read_changes, read_osm, OsmError};
