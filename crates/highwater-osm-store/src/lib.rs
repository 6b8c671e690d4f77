//! OpenStreetMap for highwater, the bottom layer: the elements, their
//! readers, the import of an extract and the primary store kept current
//! from diffs. It knows no derived dataset and no feature: the crates
//! above it (`highwater_osm`: features, derive-before-apply, the datasets,
//! replication and ops) give what they add to a store as a
//! [`store::Extension`] (their tables, the shapes index's rebuild).
//! Nothing here imports them; Cargo rules out the reverse.
//!
//! Layout:
//!
//! - [`model`]: nodes, ways, relations and the actions of a change file.
//! - [`xml`]: a streaming reader for `.osm` and `.osc` (optionally gzipped)
//!   whose errors name the file, line and element.
//! - [`import`]: extracts (PBF in parallel, or XML) gathered in memory and
//!   written in bulk into an unseen file, published whole; replication
//!   state files; the extract's bounds.
//! - [`store`]: the primary store (SQLite): elements, the member→relations
//!   index, the shapes index, dirty sets, markers.
//! - [`nodeblocks`]: nodes and the ways through them, in blocks of
//!   consecutive ids.
//! - [`flatnodes`]: untagged nodes' locations in a flat file indexed by id
//!   (`[osm] flat_nodes`), behind the store's node reads.
//! - [`spill`]: way references sorted in bounded memory during an import.
//! - [`cells`]: the shapes index's spatial key (a flattened loose quadtree).
//! - [`redact`]: replication URLs with their credentials replaced by `***`.

pub mod cells;
pub mod flatnodes;
pub mod import;
pub mod model;
pub mod nodeblocks;
pub mod redact;
pub mod spill;
pub mod store;
pub mod xml;

pub use model::{Action, Change, Element, Member, MemberKind, Node, Relation, Tags, Way};
pub use xml::{read_changes, read_osm, OsmError};
