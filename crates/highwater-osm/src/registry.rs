//! The registry: every dataset kind, in one list ([`KINDS`]). A kind is its
//! own folder (its [`Dataset`](crate::dataset::Dataset) implementation and
//! its [`Kind`]); this list is the one line that adds it. It sits above the
//! datasets and below `ops`: the trait ([`crate::dataset`]) names no
//! dataset, the store crate knows none, and both get the kinds from here.
//!
//! Also here, since they need the kinds: the [`Extension`] every store is
//! opened with (the kinds' tables; the shapes index's rebuild), and
//! [`open_store`] and [`create_store`], which open one with it.

use crate::dataset::Kind;
use crate::store::{Extension, Store, StoreError};
use std::path::Path;

/// Every dataset kind. Their tables are created with the store in this
/// order.
pub const KINDS: [Kind; 3] = [
    crate::tiles::KIND,
    crate::search::KIND,
    crate::aggregates::KIND,
];

/// What highwater-osm adds to every store: each kind's tables (each
/// once, in the order of the list), and the
/// shapes index rebuilt from the features (every key; no low-zoom layer)
/// when a migration dropped it.
pub fn store_extension() -> Extension {
    Extension {
        tables: KINDS.iter().fold(Vec::new(), |mut all, k| {
            for t in k.tables {
                if !all.contains(t) {
                    all.push(*t);
                }
            }
            all
        }),
        rebuild_shapes: |store| {
            crate::derive::rebuild_shapes(store, &crate::features::LowZoom::none())
        },
    }
}

/// Opens the store in `dir` ([`Store::open`]) with [`store_extension`].
pub fn open_store(dir: &Path) -> Result<Store, StoreError> {
    Store::open(dir, &store_extension())
}

/// Opens or creates the store in `dir` ([`Store::create`]) with
/// [`store_extension`].
pub fn create_store(dir: &Path) -> Result<Store, StoreError> {
    Store::create(dir, &store_extension())
}
