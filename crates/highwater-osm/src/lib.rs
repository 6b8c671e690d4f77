//! OpenStreetMap for highwater.
//!
//! This crate is where OSM formats are parsed and nowhere else. It is being
//! built in steps (see issue 4); what exists now:
//!
//! - [`model`]: nodes, ways, relations and the actions of a change file.
//! - [`import`]: extracts (PBF in parallel, or XML) into the store; replication state files.
//! - [`derive`]: derive-before-apply: affected tiles from old and new state.
//! - [`ops`]: config, apply (dry run, dirty sets, markers), replicate, status.
//! - [`store`]: the primary store (SQLite) with its reverse indexes.
//! - [`xml`]: a streaming reader for `.osm` and `.osc` (optionally gzipped)
//!   whose errors name the file, line and element.
//!
//! Tile math lives in `highwater_core::tile`, since it is pure.

pub mod aggregates;
pub mod cut;
pub mod derive;
pub mod features;
pub mod import;
pub mod model;
pub mod mvt;
pub mod ops;
pub mod search;
pub mod store;
pub mod tiles;
pub mod xml;

pub use model::{Action, Change, Element, Member, MemberKind, Node, Relation, Tags, Way};
pub use xml::{read_changes, read_osm, OsmError};
