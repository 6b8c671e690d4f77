//! The highwater command line.
//!
//! It parses arguments (clap), calls the engine, and prints: data to stdout
//! (human text, or JSON with `--json`), progress and logs to stderr. No colour
//! is ever printed, so `NO_COLOR` is respected by construction.
//!
//! Exit codes:
//! - 0: everything finished and nothing failed;
//! - 1: finished, but some items failed (run), differed (verify) or were
//!   refused (adopt);
//! - 2: refused or usage error: bad arguments, a bad config, the guard, a lock
//!   held by another run. Nothing was touched.
//!
//! A closed stdout (`highwater plan | head`) ends the program quietly with 0.

mod output;

use anyhow::Result;
use clap::{Parser, Subcommand};
use highwater_files::{Pipeline, RunOptions};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "highwater",
    version,
    about = "Incremental batch pipelines that are never stale"
)]
struct Cli {
    /// The config file; paths in it are relative to its folder.
    #[arg(long, global = true, default_value = "highwater.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the items that changed, with their reasons. Changes nothing.
    Plan {
        #[arg(long)]
        stage: Option<String>,
        #[arg(long)]
        json: bool,
        /// Read every byte instead of trusting the stat cache.
        #[arg(long)]
        rehash: bool,
    },
    /// Process the changed items and record them.
    Run {
        #[arg(long)]
        stage: Option<String>,
        /// Worker threads (default: the number of cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Run even when the guard refuses a mass rebuild.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        rehash: bool,
        #[arg(long)]
        json: bool,
    },
    /// Record the current inputs and existing outputs as done, running nothing.
    Adopt {
        #[arg(long)]
        stage: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Re-make a sample of unchanged items in a scratch folder and compare bytes.
    Verify {
        #[arg(long)]
        stage: Option<String>,
        /// How many items per stage; 0 means all.
        #[arg(long, default_value_t = 20)]
        sample: usize,
        #[arg(long)]
        json: bool,
    },
    /// Per stage: the last run, the counts, the failures.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Land every closed window of a source since its bookmark, as Parquet.
    Ingest {
        /// The source, as in `[sources.NAME]`.
        source: String,
        /// Re-run exactly this window: START/END in RFC 3339.
        #[arg(long)]
        window: Option<String>,
        /// Backfill from this time (RFC 3339) ...
        #[arg(long)]
        from: Option<String>,
        /// ... to this time (exclusive).
        #[arg(long)]
        to: Option<String>,
        /// Windows extracted at once (bounds the load on the source).
        #[arg(long, default_value_t = 1)]
        max_parallel: usize,
        /// What time it is, for deciding which windows are closed (RFC 3339;
        /// default: the clock). For replays and tests.
        #[arg(long)]
        now: Option<String>,
        /// Wait for another run's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        #[arg(long)]
        json: bool,
    },
    /// The completion grid of a source: one cell per expected window.
    Windows {
        source: String,
        /// How many of the newest windows to show.
        #[arg(long, default_value_t = 168)]
        last: usize,
        #[arg(long)]
        now: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// OpenStreetMap: the primary store, diffs, tile expiry.
    Osm {
        #[command(subcommand)]
        command: OsmCommand,
    },
    /// The state store.
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
}

#[derive(Subcommand)]
enum OsmCommand {
    /// Import an extract (.osm.pbf or .osm) into the store.
    Import {
        extract: PathBuf,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Derive every dataset's affected tiles from the old state, then apply
    /// the diffs in one transaction.
    Apply {
        diffs: Vec<PathBuf>,
        #[arg(long)]
        store: Option<PathBuf>,
        /// Derive and report, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Write the affected tiles in osm2pgsql's z/x/y form.
        #[arg(long)]
        expire_output: Option<PathBuf>,
        /// Write the affected tiles as GeoJSON polygons.
        #[arg(long)]
        geojson: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Apply every diff after the store's sequence from a replication folder.
    Replicate {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        expire_output: Option<PathBuf>,
        #[arg(long)]
        geojson: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The store's sequence, each dataset's marker, gap, dirty set, recipe.
    Status {
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Vector tiles: build the MBTiles file, or drain the dirty set.
    Tiles {
        #[command(subcommand)]
        command: TilesCommand,
    },
    /// Re-cut tiles from a full pass over the store and compare them with
    /// the dataset's file; exit 1 on any difference.
    Verify {
        dataset: String,
        /// Check this many tiles, spread over the whole set (default 200).
        #[arg(long, conflicts_with = "all")]
        sample: Option<usize>,
        /// Check every tile.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Search the named places; each hit carries its street, place and
    /// admin areas.
    Search {
        /// Words to find (tantivy's query syntax); omit with --all.
        #[arg(required_unless_present = "all")]
        query: Option<String>,
        /// List every document instead.
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 10)]
        limit: usize,
        #[arg(long)]
        dataset: Option<String>,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Feature counts, lengths and areas per admin area and class.
    Aggregates {
        #[arg(long)]
        dataset: Option<String>,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a dataset from the store: the always-working path.
    Rebuild {
        dataset: String,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TilesCommand {
    /// Cut every tile of each dataset with an `mbtiles` file (or of one).
    Build {
        #[arg(long)]
        dataset: Option<String>,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Re-cut dirty tiles from the store as it is; report the backlog.
    Drain {
        #[arg(long)]
        dataset: Option<String>,
        /// Re-cut at most this many tiles per dataset.
        #[arg(long)]
        max: Option<usize>,
        #[arg(long, value_enum, default_value = "low-zoom-first")]
        priority: Priority,
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Priority {
    LowZoomFirst,
    MostEdited,
}

#[derive(Subcommand)]
enum StateCommand {
    /// Write the manifest as JSON (to stdout, or to --output).
    Export {
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// Runs the command line and returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return 0;
            }
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            2
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn clock_us(now: Option<&str>) -> Result<i64> {
    Ok(match now {
        Some(t) => highwater_core::window::parse_rfc3339(t)?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros() as i64,
    })
}

fn ingestor(cli_config: &std::path::Path, name: &str) -> Result<highwater_ingest::Ingestor> {
    let spec = highwater_files::config::load(cli_config)?;
    let raw = spec.sources.clone();
    let pipeline = Pipeline::open(spec)?;
    let Some(value) = raw.get(name) else {
        return Err(highwater_ingest::IngestError::UnknownSource {
            name: name.to_string(),
            known: raw.keys().cloned().collect::<Vec<_>>().join(", "),
        }
        .into());
    };
    let source = highwater_ingest::SourceSpec::parse(name, value, cli_config, pipeline.root())?;
    Ok(highwater_ingest::Ingestor::new(
        pipeline.root(),
        pipeline.state_path(),
        source,
    ))
}

fn osm(config: &std::path::Path, command: &OsmCommand, out: &mut impl Write) -> Result<i32> {
    use highwater_osm::ops;
    use highwater_osm::store::DrainOrder;
    // The config is optional for OSM commands: without one, the defaults.
    let (raw, root) = if config.exists() {
        let spec = highwater_files::config::load(config)?;
        let root = std::path::absolute(&spec.root)?;
        (spec.osm, root)
    } else {
        (None, std::env::current_dir()?)
    };
    let cfg = ops::OsmConfig::parse(raw.as_ref(), config, &root)?;
    let store_dir = |s: &Option<PathBuf>| s.clone().unwrap_or_else(|| cfg.store.clone());
    let write_geojson = |path: &Option<PathBuf>,
                         tiles: &std::collections::BTreeSet<highwater_core::tile::Tile>|
     -> Result<()> {
        if let Some(p) = path {
            let tmp = p.with_extension("tmp");
            std::fs::write(&tmp, ops::tiles_geojson(tiles).to_string())?;
            std::fs::rename(&tmp, p)?;
        }
        Ok(())
    };
    let write_expire = |path: &Option<PathBuf>,
                        tiles: &std::collections::BTreeSet<highwater_core::tile::Tile>|
     -> Result<()> {
        if let Some(p) = path {
            let mut text = String::new();
            for t in tiles {
                text.push_str(&t.to_zxy());
                text.push('\n');
            }
            let tmp = p.with_extension("tmp");
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, p)?;
        }
        Ok(())
    };
    // Apply (or rehearse) diffs, write the expire and GeoJSON files, then
    // bring every dataset that drains on apply current, each on its own.
    let apply_then_drain = |st: &mut highwater_osm::store::Store,
                            d: &[ops::Diff],
                            dry_run: bool,
                            expire_output: &Option<PathBuf>,
                            geojson: &Option<PathBuf>,
                            json: bool,
                            mut out: &mut dyn Write|
     -> Result<i32> {
        let r = ops::apply(st, &cfg, d, dry_run)?;
        write_expire(expire_output, &r.tiles)?;
        write_geojson(geojson, &r.tiles)?;
        output::osm_apply(&mut out, &r, json)?;
        if dry_run {
            return Ok(0);
        }
        let on_apply: Vec<_> = cfg
            .tiles
            .iter()
            .filter(|d| d.mbtiles.is_some() && d.drain_on_apply)
            .collect();
        let a = agg_drains(st, &cfg, json, &mut out)?;
        let t = drains(
            st,
            &on_apply,
            usize::MAX,
            DrainOrder::LowZoomFirst,
            json,
            &mut out,
        )?;
        Ok(a.max(t))
    };
    match command {
        OsmCommand::Import { extract, store } => {
            let mut st = highwater_osm::store::Store::open(&store_dir(store))?;
            let s = highwater_osm::import::import(&mut st, extract)?;
            writeln!(
                out,
                "imported {} nodes, {} ways, {} relations; sequence {}",
                s.nodes,
                s.ways,
                s.relations,
                s.sequence.map_or("(none)".into(), |q| q.to_string())
            )?;
            Ok(0)
        }
        OsmCommand::Apply {
            diffs,
            store,
            dry_run,
            expire_output,
            geojson,
            json,
        } => {
            anyhow::ensure!(!diffs.is_empty(), "give at least one diff file");
            let mut st = highwater_osm::store::Store::open(&store_dir(store))?;
            let d = ops::read_diffs(diffs)?;
            apply_then_drain(&mut st, &d, *dry_run, expire_output, geojson, *json, out)
        }
        OsmCommand::Replicate {
            from,
            store,
            expire_output,
            geojson,
            json,
        } => {
            let mut st = highwater_osm::store::Store::open(&store_dir(store))?;
            let files = ops::pending(&st, from)?;
            let d = ops::read_diffs(&files)?;
            apply_then_drain(&mut st, &d, false, expire_output, geojson, *json, out)
        }
        OsmCommand::Status { store, json } => {
            let st = highwater_osm::store::Store::open(&store_dir(store))?;
            let v = ops::status(&st, &cfg)?;
            if *json {
                writeln!(out, "{v}")?;
            } else {
                writeln!(
                    out,
                    "store at sequence {} ({})",
                    v["sequence"],
                    v["timestamp"].as_str().unwrap_or("-")
                )?;
                for d in v["datasets"].as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "  {}: marker {}, gap {}, {} dirty tiles, recipe {}{}",
                        d["name"].as_str().unwrap_or("?"),
                        d["marker"],
                        d["gap"],
                        d["dirty"],
                        d["recipe"].as_str().unwrap_or("?"),
                        d["rebuild"]
                            .as_str()
                            .map_or(String::new(), |r| format!("; rebuild recommended: {r}"))
                    )?;
                }
            }
            Ok(0)
        }
        OsmCommand::Tiles { command } => match command {
            TilesCommand::Build {
                dataset,
                store,
                json,
            } => {
                let mut st = highwater_osm::store::Store::open(&store_dir(store))?;
                for d in tile_datasets(&cfg, dataset.as_deref())? {
                    let t0 = std::time::Instant::now();
                    let r = highwater_osm::tiles::build(&mut st, d)?;
                    output::tiles_build(out, &r, t0.elapsed(), *json)?;
                }
                Ok(0)
            }
            TilesCommand::Drain {
                dataset,
                max,
                priority,
                store,
                json,
            } => {
                let mut st = highwater_osm::store::Store::open(&store_dir(store))?;
                let order = match priority {
                    Priority::LowZoomFirst => DrainOrder::LowZoomFirst,
                    Priority::MostEdited => DrainOrder::MostEdited,
                };
                let sets = tile_datasets(&cfg, dataset.as_deref())?;
                drains(&mut st, &sets, max.unwrap_or(usize::MAX), order, *json, out)
            }
        },
        OsmCommand::Search {
            query,
            all,
            limit,
            dataset,
            store: _,
            json,
        } => {
            let q = cfg
                .search
                .iter()
                .find(|q| dataset.as_ref().is_none_or(|n| *n == q.name))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "no [osm.search.NAME] dataset{} in the config",
                        dataset
                            .as_ref()
                            .map_or(String::new(), |n| format!(" named {n:?}"))
                    )
                })?;
            let hits = match (all, query) {
                (true, _) => highwater_osm::search::all(q)?,
                (false, Some(text)) => highwater_osm::search::search(q, text, *limit)?,
                (false, None) => anyhow::bail!("give a query, or --all"),
            };
            output::search_hits(out, &hits, *json)?;
            Ok(0)
        }
        OsmCommand::Aggregates {
            dataset,
            store,
            json,
        } => {
            let st = highwater_osm::store::Store::open(&store_dir(store))?;
            let sets: Vec<_> = cfg
                .aggregates
                .iter()
                .filter(|a| dataset.as_ref().is_none_or(|n| *n == a.name))
                .collect();
            anyhow::ensure!(
                !sets.is_empty(),
                "no [osm.aggregates.NAME] dataset{} in the config",
                dataset
                    .as_ref()
                    .map_or(String::new(), |n| format!(" named {n:?}"))
            );
            let mut rows = Vec::new();
            for a in sets {
                rows.extend(highwater_osm::aggregates::stored_totals(&st, a)?);
            }
            output::aggregates(out, &rows, *json)?;
            Ok(0)
        }
        OsmCommand::Verify {
            dataset,
            sample,
            all,
            store,
            json,
        } => {
            let st = highwater_osm::store::Store::open(&store_dir(store))?;
            let (checked, differences): (usize, Vec<String>) = match named(&cfg, dataset)? {
                Named::Tiles(d) => {
                    let sample = if *all {
                        None
                    } else {
                        Some(sample.unwrap_or(200))
                    };
                    let r = highwater_osm::tiles::verify(&st, d, sample)?;
                    output::tiles_verify(out, &r, *json)?;
                    return Ok(if r.differences.is_empty() { 0 } else { 1 });
                }
                Named::Aggregates(a) => highwater_osm::aggregates::verify(&st, a)?,
                Named::Search(q) => {
                    let (n, diffs) = highwater_osm::search::verify(&st, q)?;
                    let diffs = diffs
                        .iter()
                        .map(|(k, have, want)| format!("{k}: index {have:?}, rebuild {want:?}"))
                        .collect();
                    (n, diffs)
                }
            };
            if *json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"verify": {"dataset": dataset, "checked": checked, "differences": differences}})
                )?;
            } else {
                writeln!(
                    out,
                    "{dataset}: {checked} checked against a rebuild, {} differ",
                    differences.len()
                )?;
                for d in &differences {
                    writeln!(out, "  {d}")?;
                }
            }
            Ok(if differences.is_empty() { 0 } else { 1 })
        }
        OsmCommand::Rebuild {
            dataset,
            store,
            json,
        } => {
            let mut st = highwater_osm::store::Store::open(&store_dir(store))?;
            let t0 = std::time::Instant::now();
            match named(&cfg, dataset)? {
                Named::Tiles(d) => {
                    let r = highwater_osm::tiles::build(&mut st, d)?;
                    output::tiles_build(out, &r, t0.elapsed(), *json)?;
                }
                Named::Aggregates(a) => {
                    let r = highwater_osm::aggregates::rebuild(&mut st, a)?;
                    output::agg_drain(out, &r, t0.elapsed(), *json)?;
                }
                Named::Search(q) => {
                    let r = highwater_osm::search::rebuild(&mut st, q)?;
                    output::search_drain(out, &r, t0.elapsed(), *json)?;
                }
            }
            Ok(0)
        }
    }
}

/// A dataset of any kind, by name.
enum Named<'c> {
    Tiles(&'c highwater_osm::ops::TileDataset),
    Aggregates(&'c highwater_osm::aggregates::AggDataset),
    Search(&'c highwater_osm::search::SearchDataset),
}

fn named<'c>(cfg: &'c highwater_osm::ops::OsmConfig, name: &str) -> Result<Named<'c>> {
    if let Some(a) = cfg.aggregates.iter().find(|a| a.name == name) {
        return Ok(Named::Aggregates(a));
    }
    if let Some(q) = cfg.search.iter().find(|q| q.name == name) {
        return Ok(Named::Search(q));
    }
    Ok(Named::Tiles(tile_datasets(cfg, Some(name))?[0]))
}

/// The tile datasets with a file: one by name, or all of them.
fn tile_datasets<'c>(
    cfg: &'c highwater_osm::ops::OsmConfig,
    name: Option<&str>,
) -> Result<Vec<&'c highwater_osm::ops::TileDataset>> {
    let with_file: Vec<_> = cfg.tiles.iter().filter(|d| d.mbtiles.is_some()).collect();
    match name {
        None => Ok(with_file),
        Some(n) => match cfg.tiles.iter().find(|d| d.name == n) {
            Some(d) if d.mbtiles.is_some() => Ok(vec![d]),
            Some(_) => Err(highwater_osm::tiles::TilesError::NoFile {
                dataset: n.to_string(),
            }
            .into()),
            None => {
                let names: Vec<&str> = cfg
                    .tiles
                    .iter()
                    .map(|d| d.name.as_str())
                    .chain(cfg.aggregates.iter().map(|a| a.name.as_str()))
                    .chain(cfg.search.iter().map(|q| q.name.as_str()))
                    .collect();
                anyhow::bail!(
                    "no dataset {n:?}: the config declares {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                )
            }
        },
    }
}

/// Brings each search and aggregates dataset current on its own; one failing is
/// reported and the others still run. Exit 1 when any failed.
fn agg_drains(
    st: &mut highwater_osm::store::Store,
    cfg: &highwater_osm::ops::OsmConfig,
    json: bool,
    out: &mut impl Write,
) -> Result<i32> {
    let mut failed = 0;
    for q in &cfg.search {
        let t0 = std::time::Instant::now();
        match highwater_osm::search::drain(st, q) {
            Ok(r) => output::search_drain(out, &r, t0.elapsed(), json)?,
            Err(e) => {
                failed += 1;
                output::tiles_drain_failed(out, &q.name, &e.to_string(), json)?;
            }
        }
    }
    for a in &cfg.aggregates {
        let t0 = std::time::Instant::now();
        let r = if std::env::var("HIGHWATER_FAILPOINT")
            .is_ok_and(|v| v == format!("fail-drain:{}", a.name))
        {
            Err(format!(
                "dataset {}: failed on purpose (HIGHWATER_FAILPOINT)",
                a.name
            ))
        } else {
            highwater_osm::aggregates::drain(st, a).map_err(|e| e.to_string())
        };
        match r {
            Ok(r) => output::agg_drain(out, &r, t0.elapsed(), json)?,
            Err(e) => {
                failed += 1;
                output::tiles_drain_failed(out, &a.name, &e, json)?;
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// Drains each dataset on its own: one failing is reported and the others
/// still drain. Exit 1 when any failed.
fn drains(
    st: &mut highwater_osm::store::Store,
    sets: &[&highwater_osm::ops::TileDataset],
    max: usize,
    order: highwater_osm::store::DrainOrder,
    json: bool,
    out: &mut impl Write,
) -> Result<i32> {
    let mut failed = 0;
    for d in sets {
        let t0 = std::time::Instant::now();
        match highwater_osm::tiles::drain(st, d, max, order) {
            Ok(r) => output::tiles_drain(out, &r, t0.elapsed(), json)?,
            Err(e) => {
                failed += 1;
                output::tiles_drain_failed(out, &d.name, &e.to_string(), json)?;
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

fn run(cli: Cli) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    match &cli.command {
        Command::Ingest {
            source,
            window,
            from,
            to,
            max_parallel,
            now,
            wait,
            json,
        } => {
            let ing = ingestor(&cli.config, source)?;
            anyhow::ensure!(*max_parallel >= 1, "--max-parallel must be at least 1");
            let opts = highwater_ingest::IngestOptions {
                window: window
                    .as_deref()
                    .map(highwater_core::window::Window::parse)
                    .transpose()?,
                from_us: from
                    .as_deref()
                    .map(highwater_core::window::parse_rfc3339)
                    .transpose()?,
                to_us: to
                    .as_deref()
                    .map(highwater_core::window::parse_rfc3339)
                    .transpose()?,
                max_parallel: *max_parallel,
                now_us: clock_us(now.as_deref())?,
                wait: *wait,
            };
            let report = ing.run(&opts)?;
            output::ingest(&mut out, &report, *json)?;
            return Ok(if report.failed() > 0 { 1 } else { 0 });
        }
        Command::Windows {
            source,
            last,
            now,
            json,
        } => {
            let ing = ingestor(&cli.config, source)?;
            let (rows, bookmark) = ing.grid(clock_us(now.as_deref())?, *last)?;
            output::grid(
                &mut out,
                source,
                &rows,
                bookmark.as_ref(),
                ing.spec().grid.interval_us,
                *json,
            )?;
            return Ok(0);
        }
        Command::Osm { command } => return osm(&cli.config, command, &mut out),
        _ => {}
    }
    let pipeline = Pipeline::from_config(&cli.config)?;
    match cli.command {
        Command::Plan {
            stage,
            json,
            rehash,
        } => {
            let plans = pipeline.plan(stage.as_deref(), rehash)?;
            output::plan(&mut out, &plans, json)?;
            Ok(0)
        }
        Command::Run {
            stage,
            jobs,
            force,
            rehash,
            json,
        } => {
            let mut opts = RunOptions {
                stage,
                force,
                rehash,
                ..RunOptions::default()
            };
            if let Some(j) = jobs {
                anyhow::ensure!(j >= 1, "--jobs must be at least 1");
                opts.jobs = j;
            }
            let progress = output::Bars::new();
            let report = pipeline.run(&opts, &progress)?;
            drop(progress);
            output::run(&mut out, &report, json)?;
            Ok(if report.failed() > 0 { 1 } else { 0 })
        }
        Command::Adopt { stage, json } => {
            let report = pipeline.adopt(stage.as_deref())?;
            output::adopt(&mut out, &report, json)?;
            let refused: usize = report.stages.iter().map(|s| s.refused.len()).sum();
            Ok(if refused > 0 { 1 } else { 0 })
        }
        Command::Verify {
            stage,
            sample,
            json,
        } => {
            let items = pipeline.verify(stage.as_deref(), sample)?;
            let bad = output::verify(&mut out, &items, json)?;
            Ok(if bad > 0 { 1 } else { 0 })
        }
        Command::Status { json } => {
            let status = pipeline.status()?;
            output::status(&mut out, &status, json)?;
            Ok(0)
        }
        Command::State {
            command: StateCommand::Export { output },
        } => {
            let v = pipeline.export()?;
            let text = serde_json::to_string_pretty(&v)?;
            match output {
                Some(path) => {
                    // Written beside the target and renamed, so a crash never
                    // leaves half an export.
                    let tmp = path.with_extension("json.tmp");
                    std::fs::write(&tmp, text + "\n")?;
                    std::fs::rename(&tmp, &path)?;
                }
                None => writeln!(out, "{text}")?,
            }
            Ok(0)
        }
        Command::Ingest { .. } | Command::Windows { .. } | Command::Osm { .. } => {
            unreachable!("handled above")
        }
    }
}
