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

pub mod landed;
mod output;

use anyhow::Result;
use clap::{Parser, Subcommand};
use highwater_files::{Pipeline, RunOptions};
use highwater_osm::dataset::{Dataset, DrainLimits};
use highwater_osm::tiles::TileDataset;
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "highwater",
    version,
    about = "Incremental batch pipelines that are never stale"
)]
struct Cli {
    /// The config file (default: highwater.toml); paths in it are relative
    /// to its folder. One named here must exist.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the items that changed, with their reasons. Changes nothing.
    Plan {
        /// Only this stage (and nothing downstream).
        #[arg(long)]
        stage: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Read every byte instead of trusting the stat cache.
        #[arg(long)]
        rehash: bool,
    },
    /// Process the changed items and record them.
    Run {
        /// Only this stage.
        #[arg(long)]
        stage: Option<String>,
        /// Worker threads (default: the number of cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Run even when the guard refuses a mass rebuild or mass deletion.
        #[arg(long)]
        force: bool,
        /// Read every byte instead of trusting the stat cache.
        #[arg(long)]
        rehash: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Record the current inputs and existing outputs as done, running nothing.
    Adopt {
        /// Only this stage.
        #[arg(long)]
        stage: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Re-make a sample of unchanged items in a scratch folder and compare bytes.
    Verify {
        /// Only this stage.
        #[arg(long)]
        stage: Option<String>,
        /// How many items per stage; 0 means all.
        #[arg(long, default_value_t = 20)]
        sample: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The files each item's command was observed to read, execute, look
    /// up or list, and which of them changed since (issue 24).
    Deps {
        /// The stage.
        stage: String,
        /// Only this item (an input path, as `plan` prints it).
        item: Option<String>,
        /// Only the dependencies that changed.
        #[arg(long)]
        changed: bool,
        /// One line per distinct dependency with how many items read it
        /// (and how many of those see it changed), instead of every item's.
        #[arg(long)]
        summary: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Per stage: the last run, the counts, the failures.
    Status {
        /// Print JSON instead of text.
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
        /// Windows extracted at once (bounds the load on the source); for a
        /// source with `chunk_by`, the chunks of a window read at once.
        #[arg(long, default_value_t = 1)]
        max_parallel: usize,
        /// What time it is, for deciding which windows are closed (RFC 3339;
        /// default: the clock). For replays and tests.
        #[arg(long)]
        now: Option<String>,
        /// Wait for another run's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Re-land windows published under another recipe even past the guard.
        #[arg(long)]
        force: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Roll the published windows of closed periods up into files near
    /// the target size (`[sources.NAME.compact]`), swapped in atomically.
    Compact {
        /// The source, as in `[sources.NAME]`.
        source: String,
        /// Only periods from this time (RFC 3339) ...
        #[arg(long)]
        from: Option<String>,
        /// ... to this time (exclusive).
        #[arg(long)]
        to: Option<String>,
        /// What time it is, for deciding which periods are closed (RFC 3339;
        /// default: the clock).
        #[arg(long)]
        now: Option<String>,
        /// Wait for an ingest's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The completion grid of a source: one cell per expected window.
    Windows {
        /// The source, as in `[sources.NAME]`.
        source: String,
        /// How many of the newest windows to show.
        #[arg(long, default_value_t = 168)]
        last: usize,
        /// What time it is (RFC 3339; default: the clock).
        #[arg(long)]
        now: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Serve read-only pages and endpoints: `/` (is everything fresh?),
    /// `/map`, `/tiles/NAME/{z}/{x}/{y}.pbf`, `/tiles/NAME.json`,
    /// `/metrics`, `/api/status`, `/api/aggregates/NAME`, `/search?q=` and
    /// `/reverse?lat=&lon=` (Photon's GeoJSON). Stops on SIGTERM or SIGINT.
    Serve {
        /// The address to listen on; a loopback one unless --public.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback --listen (the pages show paths, errors and
        /// sources to whoever can reach them).
        #[arg(long)]
        public: bool,
        /// The address clients reach this server at (https://host/prefix):
        /// the absolute URLs in TileJSON and styles start with it. Without
        /// it they start with the address listened on; never the
        /// request's Host.
        #[arg(long)]
        public_url: Option<String>,
        /// An origin (https://host[:port]) whose pages may read the answers
        /// (CORS); repeat for more. Without it, every origin may
        /// (`Access-Control-Allow-Origin: *`).
        #[arg(long = "cors-origin", value_name = "ORIGIN")]
        cors_origins: Vec<String>,
        /// Seconds a request's head may take, from its first byte.
        #[arg(long, default_value_t = 10)]
        header_read_timeout_s: u64,
        /// Seconds a connection may stay idle (no request under way, no
        /// byte either way) before it is closed.
        #[arg(long, default_value_t = 60)]
        idle_timeout_s: u64,
        /// Open connections at most; by default RLIMIT_NOFILE less the
        /// descriptors kept for files.
        #[arg(long)]
        connections_max: Option<u64>,
        /// Seconds between checks of the replication server, made in the
        /// background: the pages show the last one and its age.
        #[arg(long, default_value_t = 60)]
        refresh_s: u64,
        /// A dirty tile is cut fresh from the store; past this many
        /// milliseconds the stored (stale) tile is served instead, with an
        /// `X-Highwater-Stale` header (issue 23).
        #[arg(long, default_value_t = highwater_serve::FRESH_CUT_TIMEOUT_MS_DEFAULT)]
        fresh_cut_timeout_ms: u64,
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
    /// Print a shell completion script to stdout (issue 51), e.g.
    /// `highwater completions bash > ~/.local/share/bash-completion/completions/highwater`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Write a man page per command (highwater.1, highwater-run.1,
    /// highwater-osm-tiles-drain.1, ...) into a folder (issue 51).
    Man {
        /// The folder to write into (created when missing), e.g.
        /// ~/.local/share/man/man1.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Subcommand)]
enum OsmCommand {
    /// Import an extract (.osm.pbf or .osm): creates the store. Only into
    /// an empty place, or with --replace.
    Import {
        /// The extract file.
        extract: PathBuf,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Build a new store from the extract beside the old one and swap it in.
        #[arg(long)]
        replace: bool,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
    },
    /// Derive every dataset's affected tiles from the old state, then apply
    /// the diffs in one transaction. A diff with a state file applies only
    /// as the store's next sequence.
    Apply {
        /// The .osc or .osc.gz files, in order.
        diffs: Vec<PathBuf>,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Derive and report, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Write the affected tiles in osm2pgsql's z/x/y form (durable
        /// before the store commits).
        #[arg(long)]
        expire_output: Option<PathBuf>,
        /// Write the affected tiles as GeoJSON polygons (durable before the
        /// store commits).
        #[arg(long)]
        geojson: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// After these diffs the store is at this replication sequence: for
        /// diffs without state files (osmium derive-changes) whose result
        /// you vouch for. The store then follows a sequence again.
        #[arg(long)]
        sequence: Option<i64>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Apply every diff after the store's sequence from a replication folder.
    Replicate {
        /// A local replication folder (AAA/BBB/CCC.osc.gz with state files)
        /// instead of a server.
        #[arg(long, conflicts_with = "url")]
        from: Option<PathBuf>,
        /// The replication server (default: [osm] replication_url, else the
        /// URL the extract's header named at import).
        #[arg(long)]
        url: Option<String>,
        /// Diffs applied in one commit, by unpacked size (MB); one diff
        /// that unpacks past it is refused, found while unpacking.
        #[arg(long, default_value_t = 500)]
        max_diff_mb: u64,
        /// Keep going: wait for the server's next state, apply it, repeat,
        /// until SIGTERM or SIGINT (then exit 0 between batches).
        #[arg(long = "loop")]
        keep_going: bool,
        /// How often --loop asks the server for a new state.
        #[arg(long, default_value = "60s")]
        interval: String,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Write the affected tiles in osm2pgsql's z/x/y form.
        #[arg(long)]
        expire_output: Option<PathBuf>,
        /// Write the affected tiles as GeoJSON polygons.
        #[arg(long)]
        geojson: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The store's sequence, each dataset's marker, gap, dirty set, recipe.
    Status {
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Print JSON instead of text.
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
        /// The dataset, as in `[osm.tiles.NAME]`, `[osm.search.NAME]` or
        /// `[osm.aggregates.NAME]`.
        dataset: String,
        /// Check this many tiles, spread over the whole set (default 200).
        #[arg(long, conflicts_with = "all")]
        sample: Option<usize>,
        /// Check every tile.
        #[arg(long)]
        all: bool,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Print JSON instead of text.
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
        /// How many hits at most (1 or more).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// The search dataset (default: the first).
        #[arg(long)]
        dataset: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Feature counts, lengths and areas per admin area and class.
    Aggregates {
        /// The aggregates dataset (default: all).
        #[arg(long)]
        dataset: Option<String>,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Bring datasets of every kind (tiles, search, aggregates) current
    /// from their dirty keys: one by name, or all of them.
    Drain {
        /// The dataset (default: every dataset).
        dataset: Option<String>,
        /// Drain a dataset the affected-set guard holds (after looking at
        /// the diff it names), and end the hold.
        #[arg(long)]
        force: bool,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a dataset from the store: the always-working path.
    Rebuild {
        /// The dataset to rebuild.
        dataset: String,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TilesCommand {
    /// Cut every tile of each dataset with an `mbtiles` file (or of one).
    Build {
        /// Only this tile dataset.
        #[arg(long)]
        dataset: Option<String>,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Publish a tile dataset as a PMTiles v3 archive to a folder or a
    /// bucket (`NAME:prefix/base.pmtiles` on a `[storage.NAME]`): whole the
    /// first time, then only what drains re-cut since; readers follow
    /// `base.pmtiles.json` to the current version.
    Publish {
        /// The tile dataset, as in `[osm.tiles.NAME]`.
        dataset: String,
        /// Where: `DIR/NAME.pmtiles`, or `STORAGE:prefix/NAME.pmtiles`.
        #[arg(long, value_name = "PATH_OR_STORAGE:KEY")]
        to: String,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Re-cut dirty tiles from the store as it is; report the backlog.
    Drain {
        /// Only this tile dataset.
        #[arg(long)]
        dataset: Option<String>,
        /// Re-cut at most this many tiles per dataset.
        #[arg(long)]
        max: Option<usize>,
        /// Which dirty tiles first. Default: `requested` once `serve` has
        /// counted requests, else `low-zoom-first`.
        #[arg(long, value_enum)]
        priority: Option<Priority>,
        /// Drain a dataset the affected-set guard holds (after looking at
        /// the diff it names), and end the hold.
        #[arg(long)]
        force: bool,
        /// The store folder (default: [osm] store, or .highwater/osm).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Wait for another writer's lease instead of exiting.
        #[arg(long)]
        wait: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Priority {
    /// Coarse tiles first: the most people see them.
    LowZoomFirst,
    /// Tiles dirtied by the most diffs first.
    MostEdited,
    /// The dirty tiles `serve` was asked for most first (issue 23), then
    /// low zoom first.
    Requested,
}

#[derive(Subcommand)]
enum StateCommand {
    /// Write the manifest as JSON (to stdout, or to --output).
    Export {
        /// The file to write (durably: temp file, fsync, rename).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Copy the embedded SQLite state into an empty PostgreSQL database
    /// (its URL in the variable named), checking every table after; then
    /// set `[state] url_env` to that name.
    Migrate {
        /// The environment variable holding the postgres:// URL.
        #[arg(long, value_name = "VAR")]
        to_env: String,
        /// Print the tables copied (rows, checksums) as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The command line's definition, as clap builds it: the parser, the
/// completions and the man pages all come from it (issue 51).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

/// Writes one man page per command and subcommand into `dir` (created when
/// missing): `highwater.1`, `highwater-osm.1`, `highwater-osm-tiles-drain.1`,
/// ... Each file is written to a temp name and renamed into place. Returns
/// the paths written, parents before their subcommands.
pub fn write_man_pages(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    use anyhow::Context;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{}: cannot create the man page folder", dir.display()))?;
    let mut root = command();
    root.build();
    let mut written = Vec::new();
    fn walk(
        cmd: &clap::Command,
        name: &str,
        dir: &std::path::Path,
        written: &mut Vec<PathBuf>,
    ) -> Result<()> {
        use anyhow::Context;
        // A subcommand's page is titled by its full name, as `man` finds it.
        // clap takes a `&'static str` name without its `string` feature;
        // a page per command is a few dozen short strings, once.
        let title: &'static str = Box::leak(name.to_string().into_boxed_str());
        let page = cmd.clone().name(title).bin_name(name.replace('-', " "));
        let mut text = Vec::new();
        clap_mangen::Man::new(page).render(&mut text)?;
        let path = dir.join(format!("{name}.1"));
        let tmp = dir.join(format!(".{name}.1.tmp"));
        std::fs::write(&tmp, &text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .with_context(|| format!("{}: cannot write the man page", path.display()))?;
        written.push(path);
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            walk(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
        }
        Ok(())
    }
    walk(&root, "highwater", dir, &mut written)?;
    Ok(written)
}

/// Ends the process with `code` once stdout and stderr are flushed,
/// without the exit handlers: the allocator's (mimalloc) returns every
/// freed page to the system page by page before the process goes, which
/// the system does at once anyway. That was 74 `madvise` calls, a tenth
/// of a no-change plan over 1,000 landed windows (issue 49). Nothing of
/// ours runs at exit: files are closed and synced where they are written.
pub fn exit(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes an int and does not return; nothing is left
    // half done in this process that an exit handler would complete.
    unsafe { libc::_exit(code) }
}

/// Runs the command line and returns the exit code.
pub fn main() -> i32 {
    main_from(std::env::args_os())
}

/// [`main`] with the arguments given, program name first: the Python
/// package's `highwater` console script runs inside an interpreter whose own
/// argv is not the command's (issue 22).
pub fn main_from<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
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
            let _ = writeln!(std::io::stderr(), "error: {}", message(&e));
            exit_code_of(&e)
        }
    }
}

/// Copies the SQLite state into the PostgreSQL database in `var`, under the
/// SQLite store's run lock (no run can write meanwhile), then dumps both and
/// compares each table's rows and checksum. The SQLite file is not changed.
fn migrate_state(pipeline: &Pipeline, var: &str) -> Result<serde_json::Value> {
    use highwater_store::StateStore;
    anyhow::ensure!(
        !pipeline.is_shared(),
        "the config's state is already in PostgreSQL ([state] url_env); there is nothing to migrate"
    );
    let from = pipeline.state_path();
    anyhow::ensure!(
        from.exists(),
        "{}: no SQLite state store there to migrate; check --config, or run once first",
        from.display()
    );
    let _lock = pipeline.lock_state()?;
    let source = highwater_store::SqliteStore::open(from)?;
    let mut target = highwater_store::PgStore::open_env(var)?;
    let dump = source.dump()?;
    target.restore(&dump)?;
    let copied = target.dump()?;
    let checksum =
        |v: serde_json::Value| blake3::hash(v.to_string().as_bytes()).to_hex()[..16].to_string();
    let mut tables = Vec::new();
    for ((name, rows), part) in dump.counts().into_iter().zip([
        "entries",
        "dirs",
        "runs",
        "bookmarks",
        "windows",
        "deps",
        "dep_sets",
    ]) {
        let a = checksum(serde_json::to_value(&dump)?[part].take());
        let b = checksum(serde_json::to_value(&copied)?[part].take());
        anyhow::ensure!(
            a == b,
            "table {name}: the copy differs from the source (checksum {b} against {a}); the PostgreSQL database now holds a partial copy: drop its tables (or use a new database) before trying again"
        );
        tables.push(serde_json::json!({"table": name, "rows": rows, "checksum": a}));
    }
    Ok(serde_json::json!({
        "from": from.display().to_string(),
        "to_env": var,
        "config": pipeline.root().join("highwater.toml").display().to_string(),
        "tables": tables,
    }))
}

/// 2 (refused) for most errors; 1 for a replication failure the next run
/// may get past (the server was down, a diff not there yet), so that a
/// supervisor can tell "try again" from "an operator is needed".
fn exit_code_of(e: &anyhow::Error) -> i32 {
    use highwater_osm::fetch::FetchError;
    use highwater_osm::ops::OpsError;
    let fetch = e.downcast_ref::<FetchError>().or_else(|| {
        e.downcast_ref::<OpsError>().and_then(|o| match o {
            OpsError::Fetch(f) => Some(f),
            _ => None,
        })
    });
    if let Some(f) = e.downcast_ref::<highwater_files::FilesError>() {
        return f.exit_code();
    }
    match fetch {
        Some(f) if !f.needs_operator() => 1,
        _ => 2,
    }
}

/// The error with its causes, each said once: errors that embed their
/// source in their own message are not repeated by the chain.
fn message(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

/// A closed stdout: only a bare I/O error, never one inside another error.
/// A lost connection to the state store is a broken pipe too (issue 20),
/// and must be reported with its exit code, not swallowed as exit 0.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `--from`/`--to` as µs, refusing a range that holds no `what`.
fn time_range(
    from: &Option<String>,
    to: &Option<String>,
    what: &str,
) -> Result<(Option<i64>, Option<i64>)> {
    let parse = |v: &Option<String>| {
        v.as_deref()
            .map(highwater_core::window::parse_rfc3339)
            .transpose()
    };
    let (f, t) = (parse(from)?, parse(to)?);
    if let (Some(a), Some(b)) = (f, t) {
        anyhow::ensure!(
            a < b,
            "--from {} is not before --to {}: the range [from, to) holds no {what}",
            from.as_deref().unwrap_or(""),
            to.as_deref().unwrap_or("")
        );
    }
    Ok((f, t))
}

fn clock_us(now: Option<&str>) -> Result<i64> {
    Ok(match now {
        Some(t) => highwater_core::window::parse_rfc3339(t)?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros() as i64,
    })
}

/// Loads the config and validates it whole: stages, the OSM table, and that
/// no two places it names (config, state store, OSM store, MBTiles files,
/// indexes, output roots) overlap.
fn load_config(
    config: &std::path::Path,
) -> Result<(
    Pipeline,
    highwater_osm::ops::OsmConfig,
    highwater_files::PipelineSpec,
)> {
    let mut spec = highwater_files::config::load(config)?;
    let root = std::path::absolute(&spec.root)?;
    let cfg = highwater_osm::ops::OsmConfig::parse(spec.osm.as_ref(), config, &root)?;
    if spec.osm.is_some() {
        spec.places.extend(cfg.paths());
    }
    spec.places.extend(source_outputs(&spec, config, &root)?);
    read_landed_windows(&mut spec, config, &root);
    let pipeline = Pipeline::open(spec.clone())?;
    Ok((pipeline, cfg, spec))
}

/// Stages over landed windows (issue 49) read them through ingestion:
/// every way the CLI opens a pipeline gives it this port.
fn read_landed_windows(
    spec: &mut highwater_files::PipelineSpec,
    config: &std::path::Path,
    root: &std::path::Path,
) {
    spec.providers.landed = Some(std::sync::Arc::new(landed::IngestLanded::new(
        spec, config, root,
    )));
}

/// The pipeline of `config` with the stages a Python pipeline recorded
/// beside its state (`python-stages.json`, issue 48) added: those of names
/// the config does not declare (a name declared in both is refused by the
/// plan, naming both). In a folder with no config, only those, with the
/// default state store. Each recorded stage is planned with the code recipe
/// its last Python plan or run computed, and a note on stderr says so.
fn load_with_python(config: &std::path::Path) -> Result<Pipeline> {
    let mut spec = match highwater_files::config::load(config) {
        Ok(s) => s,
        Err(e) if !config.exists() => {
            let root = match config.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            let spec = highwater_files::PipelineSpec::new(root);
            let record = highwater_files::declared::record_path(&spec.root.join(&spec.state));
            if !record.exists() {
                return Err(e.into());
            }
            spec
        }
        Err(e) => return Err(e.into()),
    };
    let record = highwater_files::declared::record_path(&spec.root.join(&spec.state));
    for v in highwater_files::declared::load(&record)? {
        let name = v["name"].as_str().unwrap_or_default();
        if spec.stages.iter().any(|s| s.name == name) {
            continue;
        }
        let declared_in = v["declared_in"].as_str().unwrap_or("python");
        let stage = highwater_files::declared::stage_from_json(
            &v,
            highwater_files::declared::not_here(declared_in),
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", record.display()))?;
        eprintln!(
            "note: stage `{name}` is declared in Python ({declared_in}): planned with the code recipe its last Python plan or run recorded ({}); a code edit since then shows in the Python plan only",
            record.display()
        );
        spec.stages.push(stage);
    }
    let root = std::path::absolute(&spec.root)?;
    read_landed_windows(&mut spec, config, &root);
    Ok(Pipeline::open(spec)?)
}

/// The output roots of the config's sources, as places that no other
/// place (another source's output, a stage's output root, the state
/// store) may overlap (issue 46). Sources in object storage are compared
/// here among themselves, by storage name and key prefix. A source whose
/// table does not parse is left to its own command's error.
fn source_outputs(
    spec: &highwater_files::PipelineSpec,
    config: &std::path::Path,
    root: &std::path::Path,
) -> Result<Vec<(String, std::path::PathBuf)>> {
    let mut local = Vec::new();
    let mut remote: Vec<(String, String, String)> = Vec::new();
    for (name, value) in &spec.sources {
        let Ok(s) = highwater_ingest::SourceSpec::parse(name, value, config, root) else {
            continue;
        };
        let what = format!("the output of source `{name}`");
        match &s.output_place {
            // A template that starts with a placeholder lands across the
            // project's root, where the config itself lives: not a place
            // of its own to compare.
            None if s.output_root().is_empty() => {}
            None => local.push((what, root.join(s.output_root()))),
            Some(place) => {
                let prefix = s.output_root();
                for (other, p, q) in &remote {
                    let within = |a: &str, b: &str| {
                        a == b || b.is_empty() || a.starts_with(&format!("{b}/"))
                    };
                    if p == place && (within(&prefix, q) || within(q, &prefix)) {
                        anyhow::bail!(
                            "{}: {other} `{place}:{q}` and {what} `{place}:{prefix}` are the same place, or one lies inside the other: one would destroy the other. Give them separate paths",
                            config.display()
                        );
                    }
                }
                remote.push((what, place.clone(), prefix));
            }
        }
    }
    Ok(local)
}

fn ingestor(cli_config: &std::path::Path, name: &str) -> Result<highwater_ingest::Ingestor> {
    let (pipeline, _, spec) = load_config(cli_config)?;
    let raw = spec.sources.clone();
    let Some(value) = raw.get(name) else {
        return Err(highwater_ingest::IngestError::UnknownSource {
            name: name.to_string(),
            known: raw.keys().cloned().collect::<Vec<_>>().join(", "),
        }
        .into());
    };
    let source = highwater_ingest::SourceSpec::parse(name, value, cli_config, pipeline.root())?;
    let place = source.output_place.clone();
    let ing = highwater_ingest::Ingestor::new(pipeline.root(), pipeline.state_location(), source);
    Ok(match place {
        None => ing,
        Some(p) => {
            let Some(storage) = spec.storage.get(&p) else {
                anyhow::bail!(
                    "{}: [sources.{name}] output names storage `{p}`, which the config does not define; add a [storage.{p}] table{}",
                    cli_config.display(),
                    if spec.storage.is_empty() {
                        String::new()
                    } else {
                        format!(" (defined: {})", spec.storage.keys().cloned().collect::<Vec<_>>().join(", "))
                    }
                )
            };
            ing.with_objects(std::sync::Arc::new(highwater_objects::Objects::open(
                &p, storage,
            )?))
        }
    })
}

/// Writes `bytes` to `path` durably: a temp file beside it, fsynced, renamed
/// into place, the folder fsynced. Errors name the path.
fn write_durably(path: &std::path::Path, bytes: &[u8]) -> Result<(), highwater_osm::ops::OpsError> {
    let bad = |e: std::io::Error| highwater_osm::ops::OpsError::Output {
        path: path.to_path_buf(),
        message: format!("cannot write it ({e}); nothing was applied"),
    };
    let name = path
        .file_name()
        .ok_or_else(|| highwater_osm::ops::OpsError::Output {
            path: path.to_path_buf(),
            message: "not a file name".into(),
        })?;
    let tmp = path.with_file_name(format!(
        ".{}.hw-tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(bad)
}

/// The replication server's state, or why it could not be had.
type ServerTop = Result<highwater_osm::import::State, String>;

/// `osm status --json`: the store, each dataset, the applied HTTP diffs,
/// and the server's side when one is known (one quick request; an
/// unreachable server is reported, not fatal).
fn osm_status(
    st: &highwater_osm::store::Store,
    cfg: &highwater_osm::ops::OsmConfig,
) -> Result<serde_json::Value> {
    osm_status_with(st, cfg, &|base| Some(server_top(base, cfg)))
}

/// One quick request for the server's newest state.
fn server_top(base: &str, cfg: &highwater_osm::ops::OsmConfig) -> ServerTop {
    let quick = highwater_osm::fetch::RetryPolicy {
        retries_max: 0,
        timeout_s: cfg.retry.timeout_s.min(10),
        ..cfg.retry.clone()
    };
    highwater_osm::fetch::Server::new(base, quick)
        .and_then(|mut s| s.top())
        .map_err(|e| e.to_string())
}

/// The server the store follows: the config names it, or the store has
/// fetched from it. A store fed from a local folder follows none.
/// The configured URL carries credentials (from `replication_url_env`);
/// one read from the log is stored redacted and carries none.
fn followed_base(
    st: &highwater_osm::store::Store,
    cfg: &highwater_osm::ops::OsmConfig,
) -> Result<Option<String>, highwater_osm::ops::OpsError> {
    Ok(cfg.server_url()?.or_else(|| {
        let last = st.replication_log(1).ok()?.into_iter().next()?;
        // `BASE/AAA/BBB/CCC.osc.gz`: the base is what precedes the path.
        Some(last.1.rsplitn(4, '/').nth(3)?.to_string())
    }))
}

/// `osm_status` with the server's state from `server` (`None`: not known
/// yet), so that `serve` can answer from its cache.
fn osm_status_with(
    st: &highwater_osm::store::Store,
    cfg: &highwater_osm::ops::OsmConfig,
    server: &dyn Fn(&str) -> Option<ServerTop>,
) -> Result<serde_json::Value> {
    use highwater_osm::ops;
    let mut v = ops::status(st, cfg)?;
    v["replicated"] = serde_json::json!(st
        .replication_log(REPLICATION_LOG_SHOWN)?
        .into_iter()
        .map(|(seq, url, sha256, ts, at)| serde_json::json!({
            "sequence": seq, "url": url, "sha256": sha256, "timestamp": ts,
            "applied_at": highwater_core::window::format_rfc3339(at / 1000),
        }))
        .collect::<Vec<_>>());
    // URLs are stored redacted; redacted again here for stores made
    // before that (issue 20: no credential is ever shown).
    let redact = highwater_osm::fetch::redact_url;
    if let Some(log) = v["replicated"].as_array_mut() {
        for row in log {
            if let Some(u) = row["url"].as_str() {
                row["url"] = serde_json::json!(redact(u));
            }
        }
    }
    v["replication_url_from_extract"] =
        serde_json::json!(st.meta("replication_url")?.map(|u| redact(&u)));
    // The server's side, when the store follows one: an unreachable server
    // is reported, not fatal.
    let followed = match followed_base(st, cfg) {
        Ok(f) => f,
        Err(e) => {
            v["server"] = serde_json::json!({"error": e.to_string()});
            return Ok(v);
        }
    };
    if let Some(base) = followed {
        // Requests carry the credentials; what is shown never does.
        let shown = redact(&base);
        v["server"] = match server(&base) {
            None => serde_json::json!({"url": shown}),
            Some(Ok(t)) => {
                let lag = |ts: &serde_json::Value| {
                    let a = highwater_core::window::parse_rfc3339(&t.timestamp).ok()?;
                    let b = highwater_core::window::parse_rfc3339(ts.as_str()?).ok()?;
                    Some((a - b) / 1_000_000)
                };
                // A store that took diffs without state files is at no
                // known sequence: its lag is unknown, not 0 (issue 50).
                let lag_s = if v["unsequenced"].is_i64() {
                    None
                } else {
                    lag(&v["timestamp"])
                };
                if let Some(ds) = v["datasets"].as_array_mut() {
                    for d in ds {
                        let behind = d["marker"].as_i64().map(|m| t.sequence - m);
                        d["behind_server"] = serde_json::json!(behind);
                    }
                }
                serde_json::json!({"url": shown, "sequence": t.sequence, "timestamp": t.timestamp, "lag_s": lag_s})
            }
            Some(Err(e)) => serde_json::json!({"url": shown, "error": e}),
        };
    }
    Ok(v)
}

/// The project as `highwater serve` shows it. Every read guards against
/// creating what is not there: a state store or OSM store that does not
/// exist is reported, never made.
struct ServedProject {
    config: PathBuf,
    pipeline: Pipeline,
    cfg: highwater_osm::ops::OsmConfig,
    spec: highwater_files::PipelineSpec,
    /// The last check of the replication server, made in the background
    /// (`refresh`): a page never waits on the network (issue 20).
    server_check: std::sync::Mutex<Option<ServerCheck>>,
    /// Issue 23: the store's generation and dirty sets, read again only
    /// when the store changed (opened at the first tile request).
    /// One view per event-loop thread (`highwater_serve::event_threads`),
    /// so that two clean tiles answered at once never send one of them to
    /// the blocking path for want of the view.
    fresh: Vec<std::sync::Mutex<Option<highwater_osm::tiles::fresh::FreshView>>>,
    /// Moves, under the view's lock, whenever a view is read again after a
    /// commit to the store (`Project::clean_epoch`).
    epoch: std::sync::atomic::AtomicU64,
    /// Issue 50: each search dataset's index as `/search` reads it, the
    /// last commit kept open until the next.
    search: Vec<highwater_osm::search::live::LiveIndex>,
}

#[derive(Clone)]
struct ServerCheck {
    base: String,
    at_us: i64,
    top: ServerTop,
}

/// Windows per source on the status page: a week of hourly windows.
const SERVE_WINDOWS_SHOWN: usize = 168;

/// A search dataset that cannot answer `/search` or `/reverse` yet: built
/// by older code, or never.
fn stale_search(d: &highwater_osm::search::SearchDataset) -> String {
    format!(
        "the search dataset {} was not built by this version (its documents have no points or no sequence): run `highwater osm rebuild {}`, or `highwater osm drain {}`, which rebuilds it",
        d.name, d.name, d.name
    )
}

/// A search error as the HTTP status it is.
fn search_unanswered(
    d: &highwater_osm::search::SearchDataset,
    e: &highwater_osm::search::SearchError,
) -> highwater_serve::geocode::Unanswered {
    use highwater_osm::search::SearchError;
    use highwater_serve::geocode::Unanswered;
    match e {
        SearchError::Query { .. } => Unanswered::BadRequest(format!("q: {e}")),
        SearchError::Missing { .. } => Unanswered::Unavailable(e.to_string()),
        _ => Unanswered::Failed(format!("search dataset {}: {e}", d.name)),
    }
}

impl ServedProject {
    /// The search dataset a request names, or the first.
    fn live_index(
        &self,
        name: Option<&str>,
    ) -> Result<&highwater_osm::search::live::LiveIndex, highwater_serve::geocode::Unanswered> {
        self.search
            .iter()
            .find(|l| name.is_none_or(|n| l.dataset().name == n))
            .ok_or_else(|| {
                highwater_serve::geocode::Unanswered::NotFound(match name {
                    Some(n) => format!("no [osm.search.{n}] dataset in the config"),
                    None => "no [osm.search.NAME] dataset in the config".into(),
                })
            })
    }

    /// What a missing OSM store is said as, on every surface: the path and
    /// the fix.
    fn missing_store(&self) -> String {
        format!(
            "the OSM store {} does not exist: create it with `highwater osm import EXTRACT.osm.pbf` (or point [osm] store in {} at it)",
            self.cfg.store.display(),
            self.config.display()
        )
    }

    /// The `osm` part of the status: null when no [osm] is configured, an
    /// `error` naming the path and the fix when the store is missing or
    /// unreadable, the server's side from the background check.
    fn osm(&self, errors: &mut Vec<String>) -> serde_json::Value {
        if self.spec.osm.is_none() {
            return serde_json::Value::Null;
        }
        let store = self.cfg.store.display().to_string();
        if !self.cfg.store.exists() {
            let e = self.missing_store();
            errors.push(e.clone());
            return serde_json::json!({"store": store, "error": e, "datasets": []});
        }
        let check = self.server_check.lock().expect("not poisoned").clone();
        // The check used, if it was of the server the store follows now.
        let used = std::cell::RefCell::new(None);
        let r = highwater_osm::open_store(&self.cfg.store)
            .map_err(anyhow::Error::from)
            .and_then(|st| {
                osm_status_with(&st, &self.cfg, &|base| {
                    let c = check.clone().filter(|c| c.base == base);
                    *used.borrow_mut() = c.clone();
                    c.map(|c| c.top)
                })
            });
        match r {
            Ok(mut v) => {
                let now = highwater_store::lease::now_ns() / 1000;
                if let Some(sv) = v.get_mut("server").and_then(|s| s.as_object_mut()) {
                    let c = used.into_inner();
                    sv.insert(
                        "checked_at".into(),
                        serde_json::json!(c
                            .as_ref()
                            .map(|c| highwater_core::window::format_rfc3339(c.at_us))),
                    );
                    sv.insert(
                        "age_s".into(),
                        serde_json::json!(c.map(|c| (now - c.at_us).max(0) / 1_000_000)),
                    );
                }
                v
            }
            Err(e) => {
                let e = format!("the OSM store {store}: {}", message(&e));
                errors.push(e.clone());
                serde_json::json!({"store": store, "error": e, "datasets": []})
            }
        }
    }

    fn sources(&self, errors: &mut Vec<String>) -> Vec<serde_json::Value> {
        let now = highwater_store::lease::now_ns() / 1000;
        let mut out = Vec::new();
        for name in self.spec.sources.keys() {
            let r = (|| -> Result<serde_json::Value> {
                let ing = ingestor(&self.config, name)?;
                let view = ing.grid(now, SERVE_WINDOWS_SHOWN)?;
                let lease = ing.lease_holder()?.filter(|l| l.expires_at_ns > now * 1000);
                Ok(serde_json::json!({
                    "name": name,
                    "bookmark": view.bookmark.as_ref().map(|b| highwater_core::window::format_rfc3339(b.last_end_us)),
                    "interval": highwater_core::window::format_duration(ing.spec().grid.interval_us),
                    "lease": lease.map(|l| serde_json::json!({
                        "owner": l.owner, "host": l.host, "pid": l.pid,
                        "expires": highwater_core::window::format_rfc3339(l.expires_at_ns / 1000),
                    })),
                    "windows": view.rows,
                    "layout": view.layout,
                }))
            })();
            match r {
                Ok(v) => out.push(v),
                Err(e) => {
                    errors.push(format!("source {name}: {}", message(&e)));
                    out.push(
                        serde_json::json!({"name": name, "error": message(&e), "windows": []}),
                    );
                }
            }
        }
        out
    }
}

impl highwater_serve::Project for ServedProject {
    fn status(&self) -> serde_json::Value {
        let mut errors = Vec::new();
        let stages = if self.pipeline.state_location().exists() {
            match self.pipeline.status() {
                Ok(v) => v["stages"].clone(),
                Err(e) => {
                    errors.push(format!("file stages: {e}"));
                    serde_json::json!([])
                }
            }
        } else {
            serde_json::json!([])
        };
        let sources = if self.pipeline.state_location().exists() {
            self.sources(&mut errors)
        } else {
            Vec::new()
        };
        let osm = self.osm(&mut errors);
        // Issue 50: a dataset whose last drain failed is an error of the
        // whole status until a drain succeeds, not a detail of its row.
        for d in osm["datasets"].as_array().into_iter().flatten() {
            if let Some(f) = d["last_failed_drain"].as_object() {
                errors.push(format!(
                    "osm dataset {}: the last drain failed at {}: {}",
                    d["name"].as_str().unwrap_or("?"),
                    f.get("at").and_then(|v| v.as_str()).unwrap_or("?"),
                    f.get("error").and_then(|v| v.as_str()).unwrap_or("?")
                ));
            }
        }
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "generated_at": highwater_core::window::format_rfc3339(highwater_store::lease::now_ns() / 1000),
            "stages": stages,
            "sources": sources,
            "osm": osm,
            "errors": errors,
        })
    }

    fn tilesets(&self) -> Vec<highwater_serve::Tileset> {
        self.cfg
            .of::<TileDataset>()
            .into_iter()
            .filter_map(|d| {
                let mb = d.mbtiles.clone()?;
                mb.exists().then(|| highwater_serve::Tileset {
                    name: d.name.clone(),
                    mbtiles: mb,
                    zoom_min: d.layer.zoom_min,
                    zoom_max: d.layer.zoom_max,
                })
            })
            .collect()
    }

    fn dirty_tiles(&self, dataset: &str) -> Result<Vec<(u8, u32, u32)>, String> {
        if !self.cfg.store.exists() {
            return Ok(Vec::new());
        }
        let st = highwater_osm::open_store(&self.cfg.store).map_err(|e| e.to_string())?;
        let tiles = st
            .dirty_tiles(
                dataset,
                highwater_osm::store::DrainOrder::LowZoomFirst,
                SERVE_DIRTY_TILES_MAX,
            )
            .map_err(|e| e.to_string())?;
        Ok(tiles.into_iter().map(|t| (t.z, t.x, t.y)).collect())
    }

    fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.spec.osm.is_some() && !self.cfg.store.exists() {
            out.push(self.missing_store());
        }
        for d in self.cfg.of::<TileDataset>() {
            if let Some(mb) = d.mbtiles.as_ref().filter(|m| !m.exists()) {
                out.push(format!(
                    "[osm.tiles.{}] mbtiles {} does not exist: build it with `highwater osm tiles build`",
                    d.name,
                    mb.display()
                ));
            }
        }
        out
    }

    fn tile_state(&self, dataset: &str, z: u8, x: u32, y: u32) -> Option<(i64, bool)> {
        if !self.cfg.store.exists() {
            return None;
        }
        // Every view is brought up to date, so that the event loop's
        // `tile_state_now` finds whichever it tries current; each reads the
        // dirty sets again only when the store moved.
        let t = highwater_core::tile::Tile { z, x, y };
        let mut answer = None;
        for slot in &self.fresh {
            let mut v = slot.lock().expect("not poisoned");
            let before = v.as_ref().map(|v| v.version());
            if v.is_none() {
                *v = highwater_osm::tiles::fresh::FreshView::open(
                    &self.cfg.store,
                    &highwater_osm::store_extension(),
                )
                .ok();
            }
            if let Some(view) = v.as_mut() {
                match view.state(dataset, t) {
                    Ok(s) => {
                        answer.get_or_insert(s);
                    }
                    // A store replaced under us (import --replace): open again next time.
                    Err(_) => *v = None,
                }
            }
            // Still under the view's lock: the event loop reads the epoch
            // around its own use of a view (`Project::clean_epoch`).
            if v.as_ref().map(|v| v.version()) != before {
                self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        answer
    }

    fn tile_state_now(&self, dataset: &str, z: u8, x: u32, y: u32) -> Option<Option<(i64, bool)>> {
        // Never waits: a view busy elsewhere (re-reading a dirty set) or
        // not open yet sends the request to the blocking path. No stat of
        // the store first: a store removed under an open view leaves its
        // probe still (the file stays open), so its dirty tiles go to the
        // blocking path, which finds no store and serves them as stored,
        // as it serves every tile of a project without one.
        let t = highwater_core::tile::Tile { z, x, y };
        let mut opened = false;
        for slot in &self.fresh {
            let Ok(mut v) = slot.try_lock() else {
                opened = true;
                continue;
            };
            opened |= v.is_some();
            if let Some(Ok(Some(s))) = v.as_mut().map(|v| v.state_now(dataset, t)) {
                return Some(Some(s));
            }
        }
        if !opened && !self.cfg.store.exists() {
            return Some(None);
        }
        None
    }

    fn clean_epoch(&self) -> Option<u64> {
        Some(self.epoch.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn cut_fresh(
        &self,
        dataset: &str,
        z: u8,
        x: u32,
        y: u32,
    ) -> Result<(i64, Option<Vec<u8>>), String> {
        let d = self
            .cfg
            .of::<TileDataset>()
            .into_iter()
            .find(|d| d.name == dataset)
            .ok_or_else(|| format!("no tile dataset named {dataset:?}"))?;
        let st = highwater_osm::open_store(&self.cfg.store).map_err(|e| e.to_string())?;
        let f =
            highwater_osm::tiles::fresh::cut_fresh(&st, d, highwater_core::tile::Tile { z, x, y })
                .map_err(|e| highwater_osm::dataset::error_text(&e))?;
        Ok((f.generation, f.gz))
    }

    fn aggregates(&self, name: &str) -> Result<Option<serde_json::Value>, String> {
        let Some(d) = self
            .cfg
            .of::<highwater_osm::aggregates::AggDataset>()
            .into_iter()
            .find(|a| a.name == name)
        else {
            return Ok(None);
        };
        // Read only, and never creating a store that is not there.
        if !self.cfg.store.exists() {
            return Err(self.missing_store());
        }
        let st = highwater_osm::open_store(&self.cfg.store).map_err(|e| e.to_string())?;
        let (rows, sequence, dirty) = highwater_osm::aggregates::stored_totals_at(&st, d)
            .map_err(|e| highwater_osm::dataset::error_text(&e))?;
        Ok(Some(serde_json::json!({
            "dataset": name,
            "sequence": sequence,
            "dirty": dirty,
            "rows": rows,
        })))
    }

    fn search(
        &self,
        ask: &highwater_serve::geocode::SearchAsk,
    ) -> Result<serde_json::Value, highwater_serve::geocode::Unanswered> {
        use highwater_serve::geocode::Unanswered;
        let live = self.live_index(ask.dataset.as_deref())?;
        let d = live.dataset();
        let snap = live.snapshot().map_err(|e| search_unanswered(d, &e))?;
        match &snap.state {
            Some(st) if st.recipe == d.recipe => {}
            _ => return Err(Unanswered::Unavailable(stale_search(d))),
        }
        let hits = snap
            .search(&ask.q, ask.limit)
            .map_err(|e| search_unanswered(d, &e))?;
        let sequence = snap.state.as_ref().and_then(|s| s.sequence);
        Ok(highwater_osm::search::photon::collection(
            &hits, &d.name, sequence,
        ))
    }

    fn reverse(
        &self,
        ask: &highwater_serve::geocode::ReverseAsk,
    ) -> Result<serde_json::Value, highwater_serve::geocode::Unanswered> {
        use highwater_serve::geocode::Unanswered;
        let d = self.live_index(ask.dataset.as_deref())?.dataset();
        // Read only, and never creating a store that is not there.
        if !self.cfg.store.exists() {
            return Err(Unanswered::Unavailable(self.missing_store()));
        }
        let st = highwater_osm::open_store(&self.cfg.store)
            .map_err(|e| Unanswered::Failed(e.to_string()))?;
        let near = highwater_osm::search::near::nearest(
            &st,
            d,
            (ask.lat, ask.lon),
            ask.radius_m,
            ask.limit,
        )
        .map_err(|e| search_unanswered(d, &e))?;
        if !near.current {
            return Err(Unanswered::Unavailable(stale_search(d)));
        }
        Ok(highwater_osm::search::photon::collection(
            near.docs.iter().map(|(doc, _)| doc),
            &d.name,
            near.sequence,
        ))
    }

    fn load_requests(&self, dataset: &str) -> Option<highwater_serve::TileRequests> {
        let r = highwater_osm::tiles::fresh::load_requests(&self.cfg.store, dataset).ok()??;
        Some(highwater_serve::TileRequests {
            tiles: r.tiles,
            fresh: r.fresh,
            stale: r.stale,
        })
    }

    fn save_requests(
        &self,
        dataset: &str,
        r: &highwater_serve::TileRequests,
    ) -> Result<(), String> {
        if !self.cfg.store.is_dir() {
            return Ok(());
        }
        let r = highwater_osm::tiles::fresh::Requests {
            tiles: r.tiles.clone(),
            fresh: r.fresh,
            stale: r.stale,
        };
        highwater_osm::tiles::fresh::save_requests(&self.cfg.store, dataset, &r)
            .map_err(|e| e.to_string())
    }

    /// The replication server's state, into the cache `status` reads.
    fn refresh(&self) {
        if !self.cfg.store.exists() {
            return;
        }
        let Some(base) = highwater_osm::open_store(&self.cfg.store)
            .ok()
            .and_then(|st| followed_base(&st, &self.cfg).ok().flatten())
        else {
            return;
        };
        let top = server_top(&base, &self.cfg);
        let at_us = highwater_store::lease::now_ns() / 1000;
        *self.server_check.lock().expect("not poisoned") = Some(ServerCheck { base, at_us, top });
    }
}

/// Dirty tiles the map outlines at most: bounds the GeoJSON's size.
const SERVE_DIRTY_TILES_MAX: usize = 20_000;

/// The newest applied HTTP diffs `osm status` lists.
const REPLICATION_LOG_SHOWN: usize = 10;

/// Set by SIGTERM or SIGINT: `osm replicate --loop` stops between batches.
static TERMINATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    TERMINATE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Installs the SIGTERM/SIGINT handler and returns the flag it sets.
fn termination_flag() -> &'static std::sync::atomic::AtomicBool {
    // SAFETY: the handler only stores to an atomic; sigaction is given a
    // zeroed, then filled, struct.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_terminate as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
    &TERMINATE
}

/// Sleeps `us` in short steps; `true` when a termination signal came.
fn sleep_unless_stopped(stop: &std::sync::atomic::AtomicBool, us: i64) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_micros(us.max(0) as u64);
    while std::time::Instant::now() < until {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    stop.load(std::sync::atomic::Ordering::SeqCst)
}

fn osm(
    config: &std::path::Path,
    named_config: bool,
    command: &OsmCommand,
    out: &mut impl Write,
) -> Result<i32> {
    use highwater_osm::ops;
    use highwater_osm::store::{DrainOrder, Store};
    // The config is optional for OSM commands: without one, the defaults.
    // One named with --config must exist: running on the defaults instead
    // would record no dirty set for the datasets it declares.
    let (cfg, storage) = if config.exists() || named_config {
        let (_, cfg, spec) = load_config(config)?;
        (cfg, spec.storage)
    } else {
        (
            ops::OsmConfig::parse(None, config, &std::env::current_dir()?)?,
            Default::default(),
        )
    };
    let store_dir = |s: &Option<PathBuf>| s.clone().unwrap_or_else(|| cfg.store.clone());
    // Opens the store for writing: the writer lease first (or exit 2
    // naming its holder), so no other writer interleaves with this command.
    // Every open checks the store's flat node file against the config's
    // `flat_nodes` (exit 2 when they differ).
    let open = |s: &Option<PathBuf>| -> Result<Store> {
        let st = highwater_osm::open_store(&store_dir(s))?;
        ops::check_flat_nodes(&cfg, &st)?;
        Ok(st)
    };
    let writer = |s: &Option<PathBuf>, wait: bool| -> Result<Store> {
        let mut st = open(s)?;
        st.set_lease_duration_s(cfg.lease_duration_s);
        st.lease_writer(wait)?;
        Ok(st)
    };
    // Apply (or rehearse) diffs; the expire and GeoJSON files are durable
    // before the store commits (or nothing is applied); then bring every
    // dataset that drains on apply current, each on its own.
    // Diffs fetched over HTTP (`fetched`) are logged with their URL and
    // sha256 in the transaction that applies them.
    // `declare`: the sequence the store stands at after these diffs
    // (`osm apply --sequence`), set in the same transaction.
    let apply_then_drain = |st: &mut Store,
                            d: &[ops::Diff],
                            dry_run: bool,
                            declare: Option<i64>,
                            fetched: &[highwater_osm::fetch::Fetched],
                            expire_output: &Option<PathBuf>,
                            geojson: &Option<PathBuf>,
                            json: bool,
                            mut out: &mut dyn Write|
     -> Result<i32> {
        let mut publish = |w: &mut highwater_osm::store::Writer<'_>,
                           r: &ops::ApplyReport|
         -> Result<(), ops::OpsError> {
            // Each diff's origin, in the transaction that applies it.
            for f in fetched {
                w.log_replication(f.sequence, &f.url, &f.sha256, &f.state.timestamp)?;
            }
            if let Some(p) = expire_output {
                let mut text = String::new();
                for t in &r.tiles {
                    text.push_str(&t.to_zxy());
                    text.push('\n');
                }
                write_durably(p, text.as_bytes())?;
            }
            if let Some(p) = geojson {
                write_durably(p, ops::tiles_geojson(&r.tiles).to_string().as_bytes())?;
            }
            Ok(())
        };
        let r = match declare {
            Some(n) => ops::apply_declaring(st, &cfg, d, n, &mut publish)?,
            None => ops::apply_with(st, &cfg, d, dry_run, &mut publish)?,
        };
        for w in &r.warnings {
            eprintln!("warning: {w}");
        }
        output::osm_apply(&mut out, &r, json)?;
        if dry_run {
            return Ok(0);
        }
        let on_apply: Vec<_> = cfg
            .datasets()
            .into_iter()
            .filter(|d| d.drains_on_apply())
            .collect();
        // A held dataset's refusal beside an applied diff: finished, with
        // a failure (exit 1), not refused.
        let code = drains(st, &on_apply, DrainLimits::default(), json, &mut out)?;
        Ok(if code == 2 { 1 } else { code })
    };
    match command {
        OsmCommand::Import {
            extract,
            store,
            replace,
            wait,
        } => {
            // The new store's writer tokens continue past every token the
            // project's MBTiles files recorded (issue 20): a store made
            // again beside them must not be fenced out by them.
            let mut used = 0;
            for d in cfg.of::<TileDataset>() {
                used = used.max(highwater_osm::tiles::recorded_writer_token(d)?.unwrap_or(0));
            }
            let s = highwater_osm::import::import_into_with(
                &store_dir(store),
                extract,
                *replace,
                *wait,
                used,
                &cfg.import,
                &highwater_osm::store_extension(),
            )?;
            let (warn, note) =
                highwater_osm::import::node_storage_note(&s, cfg.import.flat_nodes.as_deref());
            eprintln!("{}{note}", if warn { "warning: " } else { "" });
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
            wait,
            sequence,
            json,
        } => {
            anyhow::ensure!(!diffs.is_empty(), "give at least one diff file");
            let mut st = if *dry_run {
                open(store)?
            } else {
                writer(store, *wait)?
            };
            let d = ops::read_diffs(diffs)?;
            if let Some(s) = sequence {
                anyhow::ensure!(
                    d.iter().all(|(_, state)| state.is_none()),
                    "--sequence is for diffs without state files; these carry their own sequence"
                );
                anyhow::ensure!(!*dry_run, "--sequence with --dry-run would declare nothing");
                return apply_then_drain(
                    &mut st,
                    &d,
                    false,
                    Some(*s),
                    &[],
                    expire_output,
                    geojson,
                    *json,
                    out,
                );
            }
            apply_then_drain(
                &mut st,
                &d,
                *dry_run,
                None,
                &[],
                expire_output,
                geojson,
                *json,
                out,
            )
        }
        OsmCommand::Replicate {
            from,
            url,
            max_diff_mb,
            keep_going,
            interval,
            store,
            expire_output,
            geojson,
            wait,
            json,
        } => {
            let mut st = writer(store, *wait)?;
            if let Some(from) = from {
                anyhow::ensure!(
                    !*keep_going,
                    "--loop follows a server; a local folder is replicated once"
                );
                let files = ops::pending(&st, from)?;
                let d = ops::read_diffs_max(&files, max_diff_mb.saturating_mul(1 << 20))?;
                return apply_then_drain(
                    &mut st,
                    &d,
                    false,
                    None,
                    &[],
                    expire_output,
                    geojson,
                    *json,
                    out,
                );
            }
            let interval_us = highwater_core::window::parse_duration(interval)?;
            anyhow::ensure!(
                interval_us >= 1_000_000,
                "--interval {interval}: give at least 1s"
            );
            let base = ops::replication_url(&st, &cfg, url.as_deref())?;
            let mut server = highwater_osm::fetch::Server::new(&base, cfg.retry.clone())?;
            let cache = store_dir(store).join(".fetch");
            let stop = termination_flag();
            let mut code = 0;
            loop {
                let batch = ops::fetch_batch(
                    &st,
                    &mut server,
                    &cache,
                    max_diff_mb.saturating_mul(1 << 20),
                );
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&cache);
                        return Err(e.into());
                    }
                };
                if batch.fetched.is_empty() {
                    if !*keep_going {
                        writeln!(
                            out,
                            "{}",
                            if *json {
                                serde_json::json!({"diffs": 0, "sequence": batch.top.sequence, "server": server.base()}).to_string()
                            } else {
                                format!(
                                    "up to date at sequence {} ({})",
                                    batch.top.sequence, batch.top.timestamp
                                )
                            }
                        )?;
                        return Ok(code);
                    }
                    if sleep_unless_stopped(stop, interval_us) {
                        return Ok(code);
                    }
                    continue;
                }
                // Parsed and checked as they were fetched: not read again.
                let mut fetched = batch.fetched;
                let d: Vec<ops::Diff> = fetched
                    .iter_mut()
                    .map(|f| (std::mem::take(&mut f.changes), Some(f.state.clone())))
                    .collect();
                let r = apply_then_drain(
                    &mut st,
                    &d,
                    false,
                    None,
                    &fetched,
                    expire_output,
                    geojson,
                    *json,
                    out,
                );
                let _ = std::fs::remove_dir_all(&cache);
                code = code.max(r?);
                if let Some(e) = batch.stopped {
                    // What was fetched before it is applied; the rest is
                    // the next run's.
                    return Err(e.into());
                }
                if !*keep_going && fetched.last().map(|f| f.sequence) >= Some(batch.top.sequence) {
                    return Ok(code);
                }
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return Ok(code);
                }
            }
        }
        OsmCommand::Status { store, json } => {
            let st = open(store)?;
            let v = osm_status(&st, &cfg)?;
            if *json {
                writeln!(out, "{v}")?;
            } else {
                writeln!(
                    out,
                    "store at sequence {} ({})",
                    v["sequence"],
                    v["timestamp"].as_str().unwrap_or("-")
                )?;
                if let Some(n) = v["unsequenced"].as_i64() {
                    writeln!(
                        out,
                        "  the store no longer follows a replication sequence: {n} diff(s) without a state file were applied after it (import a current extract with --replace to follow one again)"
                    )?;
                }
                if let Some(sv) = v["server"].as_object() {
                    match sv.get("error").and_then(|e| e.as_str()) {
                        Some(e) => writeln!(
                            out,
                            "  server {}: unreachable ({e})",
                            sv["url"].as_str().unwrap_or("?")
                        )?,
                        None => writeln!(
                            out,
                            "  server {}: sequence {} ({}), the store is {} behind",
                            sv["url"].as_str().unwrap_or("?"),
                            sv["sequence"],
                            sv["timestamp"].as_str().unwrap_or("-"),
                            sv["lag_s"].as_i64().map_or("-".into(), |s| {
                                highwater_core::window::format_duration(s * 1_000_000)
                            }),
                        )?,
                    }
                }
                if let Some(w) = v["writer"].as_object() {
                    writeln!(
                        out,
                        "  writer: {} (pid {} on {}), lease until {}",
                        w["owner"].as_str().unwrap_or("?"),
                        w["pid"],
                        w["host"].as_str().unwrap_or("?"),
                        w["expires"].as_str().unwrap_or("?")
                    )?;
                }
                for d in v["datasets"].as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "  {}: marker {}, gap {}, {} {}, recipe {}{}",
                        d["name"].as_str().unwrap_or("?"),
                        d["marker"],
                        d["gap"],
                        d["dirty"],
                        if d["kind"].is_string() {
                            "dirty keys"
                        } else {
                            "dirty tiles"
                        },
                        d["recipe"].as_str().unwrap_or("?"),
                        d["rebuild"]
                            .as_str()
                            .map_or(String::new(), |r| format!("; rebuild recommended: {r}"))
                    )?;
                    // Issue 50: each PMTiles place and what it reflects.
                    for p in d["pmtiles"].as_array().into_iter().flatten() {
                        writeln!(
                            out,
                            "    PMTiles {}: version {}, reflects sequence {} ({} dirty tiles then); {} tiles drained since wait for the next publish; {} bytes, {} dead{}",
                            p["target"].as_str().unwrap_or("?"),
                            p["version"],
                            p["sequence"],
                            p["dirty"],
                            p["changed_since"],
                            p["archive_bytes"],
                            p["dead_bytes"],
                            if p["stale"].as_bool() == Some(true) {
                                "; the MBTiles file was rebuilt since: the next publish is whole"
                            } else {
                                ""
                            }
                        )?;
                    }
                    // Issue 50: a failing drain is said until one succeeds.
                    if let Some(f) = d["last_failed_drain"].as_object() {
                        writeln!(
                            out,
                            "    DRAIN FAILED at {}: {} (said until a drain or rebuild succeeds)",
                            f.get("at").and_then(|v| v.as_str()).unwrap_or("?"),
                            f.get("error").and_then(|v| v.as_str()).unwrap_or("?")
                        )?;
                    }
                    // Issue 23: the hold, the measured crossover, serve's
                    // requests.
                    if d["held"].is_object() {
                        writeln!(out, "    HELD by the affected-set guard: diff {}, {} units against a median of {}", d["held"]["diff"].as_str().unwrap_or("?"), d["held"]["size"], d["held"]["median"])?;
                    }
                    let c = &d["crossover"];
                    if !c["backlog_predicted_s"].is_null() || !c["last_rebuild_s"].is_null() {
                        writeln!(
                            out,
                            "    backlog predicted {} s to drain (measured {} s per unit), last rebuild {} s: {}",
                            c["backlog_predicted_s"].as_f64().map_or("-".into(), |v| format!("{v:.3}")),
                            c["drain_s_per_unit"].as_f64().map_or("-".into(), |v| format!("{v:.5}")),
                            c["last_rebuild_s"].as_f64().map_or("-".into(), |v| format!("{v:.3}")),
                            c["advice"].as_str().unwrap_or("not measured yet")
                        )?;
                    }
                    if let Some(n) = c["prediction_note"].as_str() {
                        writeln!(out, "    backlog {n}")?;
                    }
                    if let Some(w) = c["trend_warning"].as_str() {
                        writeln!(out, "    warning: {w}")?;
                    }
                    let q = &d["requests"];
                    if q.is_object() {
                        writeln!(
                            out,
                            "    serve: {} dirty tiles requested; dirty tiles served fresh {}, stale {}",
                            q["dirty_requested"], q["served_fresh"], q["served_stale"]
                        )?;
                    }
                }
            }
            Ok(0)
        }
        OsmCommand::Tiles { command } => match command {
            TilesCommand::Build {
                dataset,
                store,
                wait,
                json,
            } => {
                let mut st = writer(store, *wait)?;
                for d in tile_datasets(&cfg, dataset.as_deref())? {
                    let o = highwater_osm::dataset::rebuild_recorded(d, &mut st)
                        .map_err(anyhow::Error::msg)?;
                    output::outcome(out, &o, *json)?;
                }
                Ok(0)
            }
            TilesCommand::Publish {
                dataset,
                to,
                store,
                wait,
                json,
            } => {
                let mut st = writer(store, *wait)?;
                let d = tile_datasets(&cfg, Some(dataset))?[0];
                let place = publish_place(to, &storage)?;
                let r = highwater_osm::tiles::publish::publish(
                    &mut st,
                    d,
                    place.as_ref(),
                    highwater_osm::tiles::publish::PublishLimits {
                        dead_share_max_pct: d.pmtiles_dead_share_max_pct,
                        versions_kept: d.pmtiles_versions_kept,
                    },
                )?;
                if *json {
                    writeln!(out, "{}", serde_json::to_string(&r)?)?;
                } else {
                    writeln!(out, "{}", highwater_osm::tiles::publish::report_text(&r))?;
                }
                if let Some(e) = &r.sweep_error {
                    eprintln!("warning: published, but older versions were not deleted: {e}");
                    return Ok(1);
                }
                Ok(0)
            }
            TilesCommand::Drain {
                dataset,
                max,
                priority,
                force,
                store,
                wait,
                json,
            } => {
                let mut st = writer(store, *wait)?;
                let tds = tile_datasets(&cfg, dataset.as_deref())?;
                // Popularity decides once there is any (issue 23).
                let priority = match priority {
                    Some(p) => *p,
                    None => {
                        let mut seen = false;
                        for d in &tds {
                            seen |= highwater_osm::tiles::fresh::requests_seen(&st, d)?;
                        }
                        if seen {
                            Priority::Requested
                        } else {
                            Priority::LowZoomFirst
                        }
                    }
                };
                let order = match priority {
                    Priority::LowZoomFirst | Priority::Requested => DrainOrder::LowZoomFirst,
                    Priority::MostEdited => DrainOrder::MostEdited,
                };
                let sets: Vec<&dyn Dataset> = tds.into_iter().map(|d| d as &dyn Dataset).collect();
                let limits = DrainLimits {
                    tiles_max: max.unwrap_or(usize::MAX),
                    order,
                    requested: matches!(priority, Priority::Requested),
                };
                drains_forced(&mut st, &sets, limits, *force, *json, out)
            }
        },
        OsmCommand::Search {
            query,
            all,
            limit,
            dataset,
            json,
        } => {
            let q = cfg
                .of::<highwater_osm::search::SearchDataset>()
                .into_iter()
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
                (false, Some(text)) => highwater_osm::search::search(q, text, *limit as usize)?,
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
            let st = open(store)?;
            let sets: Vec<_> = cfg
                .of::<highwater_osm::aggregates::AggDataset>()
                .into_iter()
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
            let st = open(store)?;
            let d = named(&cfg, dataset)?;
            // Tiles can be checked on a spread sample; the others whole.
            let sample = if *all {
                None
            } else {
                Some(sample.unwrap_or(200))
            };
            let o = d.verify(&st, sample).map_err(anyhow::Error::msg)?;
            output::outcome(out, &o, *json)?;
            Ok(if o.differences == 0 { 0 } else { 1 })
        }
        OsmCommand::Drain {
            dataset,
            force,
            store,
            wait,
            json,
        } => {
            let mut st = writer(store, *wait)?;
            // Issue 50: the command a hold's advice names, for every kind
            // (`osm tiles drain` drains tiles only).
            let sets: Vec<&dyn Dataset> = match dataset {
                Some(n) => vec![named(&cfg, n)?],
                None => cfg
                    .datasets()
                    .into_iter()
                    .filter(|d| {
                        d.as_any()
                            .downcast_ref::<TileDataset>()
                            .is_none_or(|t| t.mbtiles.is_some())
                    })
                    .collect(),
            };
            drains_forced(&mut st, &sets, DrainLimits::default(), *force, *json, out)
        }
        OsmCommand::Rebuild {
            dataset,
            store,
            wait,
            json,
        } => {
            let mut st = writer(store, *wait)?;
            let o = highwater_osm::dataset::rebuild_recorded(named(&cfg, dataset)?, &mut st)
                .map_err(anyhow::Error::msg)?;
            output::outcome(out, &o, *json)?;
            Ok(0)
        }
    }
}

/// Where `osm tiles publish --to` points: `STORAGE:prefix/NAME.pmtiles`
/// on a `[storage.STORAGE]`, else a path.
fn publish_place(
    to: &str,
    storage: &std::collections::BTreeMap<String, highwater_objects::StorageSpec>,
) -> Result<Box<dyn highwater_osm::tiles::publish::Place>> {
    let names: Vec<&str> = storage.keys().map(String::as_str).collect();
    match highwater_objects::split_place(to, &names) {
        Some((name, key)) => {
            let objects = highwater_objects::Objects::open(name, &storage[name])?;
            Ok(Box::new(BucketPlace::new(objects, key, to)?))
        }
        None => {
            if let Some((n, _)) = to.split_once(':').filter(|(n, _)| !n.contains('/')) {
                anyhow::bail!(
                    "--to {to:?}: the config defines no [storage.{n}]{}; add one, or give a path",
                    if names.is_empty() {
                        String::new()
                    } else {
                        format!(" (defined: {})", names.join(", "))
                    }
                );
            }
            Ok(Box::new(highwater_osm::tiles::publish::LocalPlace::new(
                std::path::Path::new(to),
            )?))
        }
    }
}

/// A prefix of a bucket as a place PMTiles archives are published to
/// (issue 50): versions composed with server-side part copies.
struct BucketPlace {
    objects: highwater_objects::Objects,
    /// The folder's key, with its trailing `/` (or empty).
    prefix: String,
    stem: String,
    given: String,
}

impl BucketPlace {
    fn new(objects: highwater_objects::Objects, key: &str, given: &str) -> Result<BucketPlace> {
        let key = key.trim_start_matches('/');
        anyhow::ensure!(
            !key.split('/').any(|p| p == ".." || p == "."),
            "--to {given:?}: no `.` or `..` in a key"
        );
        let (prefix, file) = match key.rsplit_once('/') {
            Some((p, f)) => (format!("{p}/"), f),
            None => (String::new(), key),
        };
        let stem = highwater_osm::tiles::publish::stem_of(file, given)?;
        Ok(BucketPlace {
            objects,
            prefix,
            stem,
            given: given.to_string(),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

impl highwater_osm::tiles::publish::Place for BucketPlace {
    fn describe(&self) -> String {
        self.given.clone()
    }

    fn stem(&self) -> &str {
        &self.stem
    }

    fn read(
        &self,
        name: &str,
    ) -> Result<Option<(Vec<u8>, String)>, highwater_osm::tiles::publish::PlaceError> {
        self.objects
            .get(&self.key(name))
            .map(|o| o.map(|(b, t)| (b.to_vec(), t)))
            .map_err(place_err)
    }

    fn put_if(
        &self,
        name: &str,
        bytes: Vec<u8>,
        expected: Option<&str>,
    ) -> Result<bool, highwater_osm::tiles::publish::PlaceError> {
        self.objects
            .put_if(&self.key(name), bytes, expected)
            .map(|p| matches!(p, highwater_objects::Put::Done(_)))
            .map_err(place_err)
    }

    fn put_file(
        &self,
        from: &std::path::Path,
        name: &str,
    ) -> Result<highwater_osm::tiles::publish::Sent, highwater_osm::tiles::publish::PlaceError>
    {
        let size = std::fs::metadata(from)
            .map_err(|e| {
                highwater_osm::tiles::publish::PlaceError(format!("{}: {e}", from.display()))
            })?
            .len();
        self.objects
            .put_file(from, &self.key(name))
            .map_err(place_err)?;
        Ok(highwater_osm::tiles::publish::Sent {
            uploaded_bytes: size,
            copied_bytes: 0,
        })
    }

    fn compose(
        &self,
        name: &str,
        previous: &str,
        segments: &[highwater_osm::tiles::publish::Segment],
    ) -> Result<highwater_osm::tiles::publish::Sent, highwater_osm::tiles::publish::PlaceError>
    {
        use highwater_objects::compose::Piece;
        use highwater_osm::tiles::publish::Segment;
        let from = self.key(previous);
        let pieces: Vec<Piece> = segments
            .iter()
            .map(|s| match s {
                Segment::Bytes(b) => Piece::Bytes(bytes::Bytes::from(b.clone())),
                Segment::Previous { offset, len } => Piece::Copy {
                    from: from.clone(),
                    offset: *offset,
                    len: *len,
                },
            })
            .collect();
        let c = self
            .objects
            .compose(&self.key(name), &pieces)
            .map_err(place_err)?;
        Ok(highwater_osm::tiles::publish::Sent {
            uploaded_bytes: c.uploaded_bytes,
            copied_bytes: c.copied_bytes,
        })
    }

    fn names(&self) -> Result<Vec<String>, highwater_osm::tiles::publish::PlaceError> {
        let listed = self
            .objects
            .list(self.prefix.trim_end_matches('/'))
            .map_err(place_err)?;
        Ok(listed
            .into_iter()
            .filter_map(|o| o.key.strip_prefix(&self.prefix).map(str::to_string))
            .filter(|n| !n.contains('/'))
            .collect())
    }

    fn delete(&self, name: &str) -> Result<(), highwater_osm::tiles::publish::PlaceError> {
        self.objects.delete(&self.key(name)).map_err(place_err)
    }
}

fn place_err(e: highwater_objects::ObjectsError) -> highwater_osm::tiles::publish::PlaceError {
    highwater_osm::tiles::publish::PlaceError(e.to_string())
}

/// A dataset of any kind, by name (a tile dataset must have a file).
fn named<'c>(cfg: &'c highwater_osm::ops::OsmConfig, name: &str) -> Result<&'c dyn Dataset> {
    match cfg.dataset(name) {
        Some(d) if d.as_any().downcast_ref::<TileDataset>().is_none() => Ok(d),
        _ => Ok(tile_datasets(cfg, Some(name))?[0]),
    }
}

/// The tile datasets with a file: one by name, or all of them.
fn tile_datasets<'c>(
    cfg: &'c highwater_osm::ops::OsmConfig,
    name: Option<&str>,
) -> Result<Vec<&'c TileDataset>> {
    let tiles = cfg.of::<TileDataset>();
    let with_file: Vec<_> = tiles
        .iter()
        .copied()
        .filter(|d| d.mbtiles.is_some())
        .collect();
    match name {
        None => Ok(with_file),
        Some(n) => match tiles.iter().copied().find(|d| d.name == n) {
            Some(d) if d.mbtiles.is_some() => Ok(vec![d]),
            Some(_) => Err(highwater_osm::tiles::TilesError::NoFile {
                dataset: n.to_string(),
            }
            .into()),
            None => {
                let names: Vec<&str> = cfg.all.iter().map(|d| d.name()).collect();
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

/// Drains each dataset on its own: one failing is reported and the others
/// still drain. Exit 1 when any failed.
fn drains(
    st: &mut highwater_osm::store::Store,
    sets: &[&dyn Dataset],
    limits: DrainLimits,
    json: bool,
    out: &mut impl Write,
) -> Result<i32> {
    drains_forced(st, sets, limits, false, json, out)
}

/// [`drains`]; a dataset the affected-set guard holds is refused (named,
/// with the diff, its size and the median) unless `force`, which drains it
/// and ends the hold. Only refusals: exit 2; refusals beside drains: 1.
///
/// The datasets drain at once, each on a thread and store connection of
/// its own ([`highwater_osm::store::Store::beside`], under this process's one writer lease):
/// they share nothing but the store, whose write transactions SQLite
/// serialises, and a search drain waiting on its index's fsyncs no longer
/// holds up the tiles drain's cutting. What they print comes after, in
/// the config's order.
fn drains_forced(
    st: &mut highwater_osm::store::Store,
    sets: &[&dyn Dataset],
    limits: DrainLimits,
    force: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<i32> {
    // Without the lease (another process holds it), each drain says so on
    // its own, one after the other, as a lone drain does.
    let at_once = sets.len() > 1 && st.lease_writer(false).is_ok();
    let drained: Vec<Result<Drained>> = if at_once {
        let mut beside = Vec::with_capacity(sets.len() - 1);
        for _ in 1..sets.len() {
            beside.push(st.beside()?);
        }
        // The last (the tiles, by the kinds' order) drains on this store,
        // whose page cache the apply just filled with the shapes it wrote.
        let (last, rest) = sets.split_last().expect("more than one");
        std::thread::scope(|s| {
            let running: Vec<_> = rest
                .iter()
                .zip(beside.iter_mut())
                .map(|(d, b)| s.spawn(move || drain_one(b, *d, limits, force)))
                .collect();
            let here = drain_one(st, *last, limits, force);
            let mut all: Vec<_> = running
                .into_iter()
                .map(|r| r.join().expect("a drain thread does not panic"))
                .collect();
            all.push(here);
            all
        })
    } else {
        sets.iter()
            .map(|d| drain_one(st, *d, limits, force))
            .collect()
    };
    let mut failed = 0;
    let mut refused = 0;
    for (d, r) in sets.iter().zip(drained) {
        match r? {
            Drained::Refused(h) => {
                refused += 1;
                eprintln!("refused: {}", h.message(d.name()));
                if json {
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({"refused": {"dataset": d.name(), "held": h, "message": h.message(d.name())}})
                    )?;
                }
            }
            Drained::Done { outcome, forced } => {
                if forced {
                    eprintln!("{}: drained under --force; the hold is ended", d.name());
                }
                if let Some(w) = &outcome.warning {
                    eprintln!("warning: {w}");
                }
                output::outcome(out, &outcome, json)?
            }
            Drained::Failed(e) => {
                failed += 1;
                output::drain_failed(out, d.name(), d.dirty_what(), &e, json)?;
            }
        }
    }
    Ok(if refused > 0 && refused == sets.len() {
        2
    } else if failed + refused > 0 {
        1
    } else {
        0
    })
}

/// How one dataset's drain went, for [`drains_forced`] to print.
enum Drained {
    /// Held by the affected-set guard, and not forced.
    Refused(highwater_osm::dataset::Held),
    /// Drained; `forced`: under `--force`, which ended its hold.
    Done {
        outcome: highwater_osm::dataset::Outcome,
        forced: bool,
    },
    Failed(highwater_osm::dataset::DatasetError),
}

/// Drains one dataset on `st` (see [`drains_forced`]); `Err` only when its
/// hold cannot be read or ended.
fn drain_one(
    st: &mut highwater_osm::store::Store,
    d: &dyn Dataset,
    limits: DrainLimits,
    force: bool,
) -> Result<Drained> {
    let held = highwater_osm::dataset::held(st, d.name())?;
    if let (Some(h), false) = (&held, force) {
        return Ok(Drained::Refused(h.clone()));
    }
    let r = highwater_osm::dataset::drain_recorded(d, st, limits);
    Ok(match r {
        Ok(outcome) => {
            if held.is_some() {
                // Forced: the dataset follows the store again.
                highwater_osm::dataset::release_at_store(st, d)?;
            }
            Drained::Done {
                outcome,
                forced: held.is_some(),
            }
        }
        Err(e) => Drained::Failed(e),
    })
}

/// Stdout that a reader may close (`highwater osm replicate | head -1`):
/// once the pipe is broken, output is dropped and the work goes on, so the
/// command still does everything asked and its exit code says how it went.
struct QuietPipe<W> {
    inner: W,
    closed: bool,
}

impl<W: Write> Write for QuietPipe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            r => r,
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            r => r,
        }
    }
}

fn run(cli: Cli) -> Result<i32> {
    let mut out = QuietPipe {
        inner: std::io::stdout().lock(),
        closed: false,
    };
    let named_config = cli.config.is_some();
    let config = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("highwater.toml"));
    if named_config && !config.exists() {
        anyhow::bail!(
            "{}: the config named with --config does not exist (a typo, or a share that is not mounted?)",
            config.display()
        );
    }
    match &cli.command {
        Command::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut command(), "highwater", &mut text);
            out.write_all(&text)?;
            return Ok(0);
        }
        Command::Man { out: dir } => {
            for path in write_man_pages(dir)? {
                writeln!(out, "{}", path.display())?;
            }
            return Ok(0);
        }
        Command::Ingest {
            source,
            window,
            from,
            to,
            max_parallel,
            now,
            wait,
            force,
            json,
        } => {
            let ing = ingestor(&config, source)?;
            anyhow::ensure!(*max_parallel >= 1, "--max-parallel must be at least 1");
            let (from_us, to_us) = time_range(from, to, "window")?;
            let opts = highwater_ingest::IngestOptions {
                window: window
                    .as_deref()
                    .map(highwater_core::window::Window::parse)
                    .transpose()?,
                from_us,
                to_us,
                max_parallel: *max_parallel,
                now_us: clock_us(now.as_deref())?,
                wait: *wait,
                force: *force,
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
            let ing = ingestor(&config, source)?;
            let view = ing.grid(clock_us(now.as_deref())?, *last)?;
            output::grid(&mut out, source, &view, ing.spec().grid.interval_us, *json)?;
            return Ok(0);
        }
        Command::Compact {
            source,
            from,
            to,
            now,
            wait,
            json,
        } => {
            let ing = ingestor(&config, source)?;
            let (from_us, to_us) = time_range(from, to, "period")?;
            let opts = highwater_ingest::CompactOptions {
                from_us,
                to_us,
                now_us: clock_us(now.as_deref())?,
                wait: *wait,
            };
            let report = ing.compact(&opts)?;
            output::compact(&mut out, &report, *json)?;
            return Ok(if report.failed() > 0 { 1 } else { 0 });
        }
        Command::Osm { command } => return osm(&config, named_config, command, &mut out),
        Command::Serve {
            listen,
            public,
            public_url,
            cors_origins,
            header_read_timeout_s,
            idle_timeout_s,
            connections_max,
            refresh_s,
            fresh_cut_timeout_ms,
        } => {
            let (pipeline, cfg, spec) = load_config(&config)?;
            let search = cfg
                .of::<highwater_osm::search::SearchDataset>()
                .into_iter()
                .map(|d| highwater_osm::search::live::LiveIndex::new(d.clone()))
                .collect();
            let project = std::sync::Arc::new(ServedProject {
                config: config.clone(),
                pipeline,
                cfg,
                spec,
                server_check: std::sync::Mutex::new(None),
                fresh: (0..highwater_serve::event_threads())
                    .map(|_| std::sync::Mutex::new(None))
                    .collect(),
                epoch: Default::default(),
                search,
            });
            let opts = highwater_serve::Options {
                public: *public,
                public_url: public_url.clone(),
                cors_origins: cors_origins.clone(),
                header_read_timeout_s: *header_read_timeout_s,
                idle_timeout_s: *idle_timeout_s,
                connections_max: *connections_max,
                refresh_s: *refresh_s,
                fresh_cut_timeout_ms: *fresh_cut_timeout_ms,
                ..highwater_serve::Options::new(*listen)
            };
            let notes = highwater_serve::Project::notes(&*project);
            highwater_serve::serve(opts, project, |addr| {
                // Only what a closed stderr cannot turn into a panic.
                let mut err = std::io::stderr();
                if !addr.ip().is_loopback() {
                    let _ = writeln!(err,
                        "serving on {addr}, beyond this machine (--public): anyone who can reach it sees the pages"
                    );
                }
                let _ = writeln!(err, "listening on http://{addr}/");
                for n in &notes {
                    let _ = writeln!(err, "warning: {n}");
                }
            })?;
            return Ok(0);
        }
        _ => {}
    }
    // `plan`, `status` and `deps` show the stages a Python pipeline
    // recorded beside the state too (issue 48); nothing else runs them.
    let pipeline = if matches!(
        cli.command,
        Command::Plan { .. } | Command::Status { .. } | Command::Deps { .. }
    ) {
        load_with_python(&config)?
    } else {
        load_config(&config)?.0
    };
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
        Command::Deps {
            stage,
            item,
            changed,
            summary,
            json,
        } => {
            let items = pipeline.deps(&stage, item.as_deref())?;
            if summary {
                output::deps_summary(&mut out, &stage, &items, changed, json)?;
            } else {
                output::deps(&mut out, &items, changed, json)?;
            }
            Ok(0)
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
                    // Written beside the target, fsynced and renamed, so a
                    // crash never leaves half an export; errors name it.
                    write_durably(&path, (text + "\n").as_bytes())?;
                }
                None => writeln!(out, "{text}")?,
            }
            Ok(0)
        }
        Command::State {
            command: StateCommand::Migrate { to_env, json },
        } => {
            let report = migrate_state(&pipeline, &to_env)?;
            if json {
                writeln!(out, "{report}")?;
            } else {
                for t in report["tables"].as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "{}: {} rows, checksum {} (source and target equal)",
                        t["table"].as_str().unwrap_or("?"),
                        t["rows"],
                        t["checksum"].as_str().unwrap_or("?")
                    )?;
                }
                writeln!(
                    out,
                    "migrated. Now set `[state] url_env = \"{to_env}\"` in {} (and remove `store`); the SQLite file {} is left as it was",
                    report["config"].as_str().unwrap_or("the config"),
                    report["from"].as_str().unwrap_or("?"),
                )?;
            }
            Ok(0)
        }
        Command::Ingest { .. }
        | Command::Serve { .. }
        | Command::Windows { .. }
        | Command::Compact { .. }
        | Command::Completions { .. }
        | Command::Man { .. }
        | Command::Osm { .. } => {
            unreachable!("handled above")
        }
    }
}
