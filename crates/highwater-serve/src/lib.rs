//! `highwater serve`: read-only pages and endpoints over a project's state.
//!
//! What it serves, all with GET only (OPTIONS answers a CORS preflight,
//! anything else is 405), none writing, every answer readable by pages of
//! other origins ([`cors`]):
//! - `/`: one page that answers "is everything fresh?" (file stages, the
//!   window grid of each source, OSM datasets against store and server);
//! - `/map`: MapLibre GL JS (vendored, [`assets`]) over a tile dataset, with
//!   its dirty tiles outlined;
//! - `/tiles/NAME/{z}/{x}/{y}.pbf` from the MBTiles (TMS row flipped,
//!   `Content-Encoding: gzip` as stored, ETag) and `/tiles/NAME.json`
//!   (TileJSON 3.0);
//! - `/glyphs/{fontstack}/{range}.pbf`: the map's label glyphs ([`glyphs`]);
//! - `/metrics` (Prometheus text, [`metrics`]) and `/api/status` (the data
//!   behind `/`);
//! - `/api/aggregates/NAME?admin_level=&class=`: an aggregates dataset's
//!   totals, one committed state with its sequence (issue 50);
//! - `/search?q=&limit=` (and Photon's `/api?q=`) and
//!   `/reverse?lat=&lon=&radius=&limit=`: a search dataset's documents as
//!   Photon's GeoJSON, one committed state with its sequence (issue 50,
//!   [`geocode`]).
//!
//! Layout: this file is the router and the server; [`pages`] renders HTML
//! with maud (escaped at compile time); [`metrics`] turns the status
//! document into exposition text; [`mbtiles`] reads tiles. What the state
//! *is* comes from the binary through [`Project`], so this crate knows
//! nothing of how files, sources or OSM stores keep it.

pub mod conn;
pub mod cors;
pub mod geocode;
pub mod glyphs;
pub mod mbtiles;
pub mod metrics;
pub mod pages;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One tile dataset the map and the tile endpoints offer.
#[derive(Clone, Debug)]
pub struct Tileset {
    pub name: String,
    pub mbtiles: PathBuf,
    pub zoom_min: u8,
    pub zoom_max: u8,
}

/// What the binary knows of the project. Every method reads; none writes.
pub trait Project: Send + Sync + 'static {
    /// The status document (`/api/status`): `stages`, `sources`, `osm`.
    fn status(&self) -> serde_json::Value;
    fn tilesets(&self) -> Vec<Tileset>;
    /// A tile dataset's dirty tiles, as (z, x, y).
    fn dirty_tiles(&self, dataset: &str) -> Result<Vec<(u8, u32, u32)>, String>;
    /// What keeps the map from showing something (a missing store or
    /// MBTiles file), each naming the path and the fix.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// The slow part of the status (the network: the replication
    /// server's state), fetched into a cache [`Project::status`] reads.
    /// `serve` calls it on a thread of its own, at start and every
    /// `refresh_s`, so that no page waits on it.
    fn refresh(&self) {}
    /// Issue 23: the store's generation now, and whether the tile is in
    /// the dataset's dirty set. `None`: there is no store to ask (the tile
    /// is served as stored).
    fn tile_state(&self, _dataset: &str, _z: u8, _x: u32, _y: u32) -> Option<(i64, bool)> {
        None
    }
    /// [`Project::tile_state`] if it can be said without waiting (no lock
    /// held elsewhere, nothing to read but whether the store moved):
    /// serve's clean-tile path asks it on its event loop. `None`: it would
    /// wait, and serve asks [`Project::tile_state`] on a blocking thread.
    /// `Some(None)`: there is no store to ask.
    fn tile_state_now(
        &self,
        _dataset: &str,
        _z: u8,
        _x: u32,
        _y: u32,
    ) -> Option<Option<(i64, bool)>> {
        None
    }
    /// A counter that moves whenever [`Project::tile_state`] read the
    /// store again after a commit to it, moved under the same lock that
    /// [`Project::tile_state_now`] takes. Serve keeps the bytes of clean
    /// tiles in memory under the epoch they were read at, and uses them
    /// only while the epoch read before and after `tile_state_now` is
    /// still theirs: a tile's stored bytes change only by a drain or a
    /// rebuild, and each writes the MBTiles file before it commits to the
    /// store. `None` (the default): nothing is kept.
    fn clean_epoch(&self) -> Option<u64> {
        None
    }
    /// Issue 23: a dirty tile cut in memory from the store as it is now,
    /// by the drain's code: the generation it was cut at, and its bytes
    /// gzipped as the MBTiles file stores them (`None`: an empty tile).
    /// Reads only.
    fn cut_fresh(
        &self,
        dataset: &str,
        _z: u8,
        _x: u32,
        _y: u32,
    ) -> Result<(i64, Option<Vec<u8>>), String> {
        Err(format!("{dataset}: no store to cut from"))
    }
    /// Issue 50: an aggregates dataset's stored totals as one committed
    /// state: `{"dataset", "sequence", "dirty", "rows": [...]}`, rows as
    /// `osm aggregates --json` prints them. `Ok(None)`: no aggregates
    /// dataset of that name.
    fn aggregates(&self, _name: &str) -> Result<Option<serde_json::Value>, String> {
        Ok(None)
    }
    /// Issue 50: a search query's hits as Photon's GeoJSON
    /// ([`geocode`]): a FeatureCollection with `dataset` and `sequence`.
    fn search(&self, _ask: &geocode::SearchAsk) -> Result<serde_json::Value, geocode::Unanswered> {
        Err(geocode::Unanswered::NotFound(
            "no [osm.search.NAME] dataset in the config".into(),
        ))
    }
    /// Issue 50: the documents nearest a point, as [`Project::search`].
    fn reverse(
        &self,
        _ask: &geocode::ReverseAsk,
    ) -> Result<serde_json::Value, geocode::Unanswered> {
        Err(geocode::Unanswered::NotFound(
            "no [osm.search.NAME] dataset in the config".into(),
        ))
    }
    /// The request counts recorded before (by an earlier serve), if any.
    fn load_requests(&self, _dataset: &str) -> Option<TileRequests> {
        None
    }
    /// Keeps the request counts where the drainer and status read them.
    fn save_requests(&self, _dataset: &str, _r: &TileRequests) -> Result<(), String> {
        Ok(())
    }
}

/// Per-tile request counts of one dataset and its fresh/stale tally
/// (issue 23): what `osm tiles drain --priority requested` ranks by.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TileRequests {
    /// (z, x, y, requests).
    pub tiles: Vec<(u8, u32, u32, u64)>,
    pub fresh: u64,
    pub stale: u64,
}

/// Tiles whose requests are counted at most, per dataset: when full, the
/// least requested half is forgotten (the popular tiles stay).
pub const REQUEST_COUNTS_MAX: usize = 65_536;

/// Fresh tiles kept in memory at most (all datasets): a cut is reused
/// until the store's generation moves.
pub const FRESH_CACHE_TILES_MAX: usize = 4096;

/// Fresh cuts under way at most: past it, a dirty tile is served stale
/// rather than queue behind them.
pub const FRESH_CUTS_MAX: usize = 4;

/// A fresh cut longer than this serves the stale tile (the cut finishes
/// and is cached for the next request). `--fresh-cut-timeout-ms`.
pub const FRESH_CUT_TIMEOUT_MS_DEFAULT: u64 = 2000;

/// The longest `--fresh-cut-timeout-ms` taken.
pub const FRESH_CUT_TIMEOUT_MS_MAX: u64 = 60_000;

/// Event-loop threads at most (one per core below that).
pub const EVENT_THREADS_MAX: usize = 8;

/// The event-loop threads `serve` runs: one per core, at most
/// [`EVENT_THREADS_MAX`]. A [`Project`] that keeps per-thread state sizes
/// it by this.
pub fn event_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, EVENT_THREADS_MAX)
}

/// How often the request counts are saved (and at stop).
const REQUESTS_SAVE_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Counts {
    tiles: std::collections::HashMap<(u8, u32, u32), u64>,
    fresh: u64,
    stale: u64,
    loaded: bool,
    changed: bool,
}

impl Counts {
    fn hit(&mut self, k: (u8, u32, u32)) {
        if self.tiles.len() >= REQUEST_COUNTS_MAX && !self.tiles.contains_key(&k) {
            // Forget the least requested half: bounded memory.
            let mut v: Vec<u64> = self.tiles.values().copied().collect();
            v.sort_unstable();
            let cut = v[v.len() / 2];
            self.tiles.retain(|_, n| *n > cut);
            if self.tiles.len() >= REQUEST_COUNTS_MAX {
                self.tiles.clear();
            }
        }
        *self.tiles.entry(k).or_insert(0) += 1;
        self.changed = true;
    }

    fn snapshot(&self) -> TileRequests {
        let mut tiles: Vec<(u8, u32, u32, u64)> = self
            .tiles
            .iter()
            .map(|(&(z, x, y), &n)| (z, x, y, n))
            .collect();
        tiles.sort_unstable();
        TileRequests {
            tiles,
            fresh: self.fresh,
            stale: self.stale,
        }
    }
}

/// A fresh tile in memory: the generation it was cut at, its gzipped
/// bytes (`None`: empty).
type FreshEntry = (i64, Option<TileBody>);

/// A tile's gzipped bytes ready to send: shared (a response takes a
/// reference, not a copy) with their ETag computed once, when read or cut,
/// not per request. The ETag is the bytes' hash and nothing else (issue
/// 50): a fresh cut and the drain that later stores the same tile gzip it
/// with the same code, so a client that has the fresh tile revalidates
/// the drained one with a 304 (clients revalidate every tile, `no-cache`,
/// so an ETag naming the store's generation bought nothing but refetches).
#[derive(Clone, Debug)]
struct TileBody {
    bytes: axum::body::Bytes,
    etag: HeaderValue,
}

impl TileBody {
    fn new(data: Vec<u8>) -> TileBody {
        let hash = &blake3::hash(&data).to_hex()[..16];
        TileBody {
            bytes: data.into(),
            etag: HeaderValue::from_str(&format!("\"{hash}\"")).expect("hex"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--listen {addr}: not a loopback address; serving beyond this machine needs --public (the pages show paths, errors and sources to whoever can reach them)")]
    NotLoopback { addr: SocketAddr },
    #[error("--listen {addr}: {err}")]
    Bind {
        addr: SocketAddr,
        err: std::io::Error,
    },
    #[error("--cors-origin {origin}: {why}")]
    CorsOrigin { origin: String, why: &'static str },
    #[error("--public-url {url}: {why}")]
    PublicUrl { url: String, why: &'static str },
    #[error("{what} {value}: give 1 to {max} seconds")]
    Timeout {
        what: &'static str,
        value: u64,
        max: u64,
    },
    #[error("RLIMIT_NOFILE is {nofile}: after the {reserved} descriptors kept for files, {allowed} are left for connections, fewer than {min}; raise `ulimit -n` to at least {need}")]
    TooFewDescriptors {
        nofile: u64,
        reserved: u64,
        allowed: u64,
        min: u64,
        need: u64,
    },
    #[error("--fresh-cut-timeout-ms {value}: give 1 to {max} milliseconds")]
    FreshCutTimeout { value: u64, max: u64 },
    #[error("--connections-max {asked}: {why}")]
    ConnectionsMax { asked: u64, why: String },
    #[error("the server stopped: {0}")]
    Io(#[from] std::io::Error),
}

/// How `serve` listens and what it allows each connection.
#[derive(Clone, Debug)]
pub struct Options {
    pub listen: SocketAddr,
    /// Allow a non-loopback `listen`.
    pub public: bool,
    /// The address clients reach the server at (`https://host/prefix`),
    /// for absolute URLs in TileJSON and styles; without it they are
    /// root-relative. Never taken from a request's `Host` header: behind a
    /// shared cache, one client's Host would be served to all.
    pub public_url: Option<String>,
    /// From a request's first byte to the end of its head.
    pub header_read_timeout_s: u64,
    /// A connection with no request under way and no byte either way.
    pub idle_timeout_s: u64,
    /// Open connections at most; `None`: RLIMIT_NOFILE less what files need.
    pub connections_max: Option<u64>,
    /// How often [`Project::refresh`] runs (the replication server's state).
    pub refresh_s: u64,
    /// A dirty tile's fresh cut past this serves the stale tile (issue 23).
    pub fresh_cut_timeout_ms: u64,
    /// Issue 50: the origins (`https://host[:port]`) whose pages may read
    /// the answers (`--cors-origin`); empty: every origin (`*`), as
    /// martin and tileserver-gl answer.
    pub cors_origins: Vec<String>,
}

/// Timeouts above this many seconds are refused: a limit on everything.
pub const TIMEOUT_MAX_S: u64 = 3600;

impl Options {
    pub fn new(listen: SocketAddr) -> Options {
        Options {
            listen,
            public: false,
            public_url: None,
            header_read_timeout_s: 10,
            idle_timeout_s: 60,
            connections_max: None,
            refresh_s: 60,
            fresh_cut_timeout_ms: FRESH_CUT_TIMEOUT_MS_DEFAULT,
            cors_origins: Vec::new(),
        }
    }
}

/// `https://host[:port][/prefix]`, without a trailing slash; no user
/// info, query or fragment.
pub fn check_public_url(url: &str) -> Result<String, ServeError> {
    // The refusal names the URL, but never a password given in it.
    let shown = match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://***{}", &rest[at..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    };
    let bad = |why| ServeError::PublicUrl {
        url: shown.clone(),
        why,
    };
    let u = url.trim_end_matches('/');
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))
        .ok_or_else(|| bad("give an http:// or https:// URL"))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains('@') {
        return Err(bad(
            "user info (user:password@) has no place in a URL every client is sent",
        ));
    }
    if u.contains(['?', '#']) || u.contains(char::is_whitespace) || u.contains(['"', '<', '>']) {
        return Err(bad("no query, fragment, spaces or quotes"));
    }
    Ok(u.to_string())
}

/// The connection limit: `asked`, or what RLIMIT_NOFILE leaves after the
/// descriptors files need; refused when it would not fit.
pub fn connections_max(asked: Option<u64>, nofile: Option<u64>) -> Result<usize, ServeError> {
    let reserved = conn::fds_reserved();
    let allowed = match nofile {
        Some(n) => n.saturating_sub(reserved),
        None => conn::CONNECTIONS_UNLIMITED_MAX.max(asked.unwrap_or(0)),
    };
    if allowed < conn::CONNECTIONS_MIN {
        return Err(ServeError::TooFewDescriptors {
            nofile: nofile.unwrap_or(0),
            reserved,
            allowed,
            min: conn::CONNECTIONS_MIN,
            need: reserved + conn::CONNECTIONS_MIN,
        });
    }
    match asked {
        None => Ok(allowed as usize),
        Some(0) => Err(ServeError::ConnectionsMax {
            asked: 0,
            why: "give at least 1".into(),
        }),
        Some(a) if a > allowed => Err(ServeError::ConnectionsMax {
            asked: a,
            why: format!(
                "RLIMIT_NOFILE is {} and {reserved} descriptors are kept for files, so at most {allowed} fit; raise `ulimit -n` or ask for fewer",
                nofile.unwrap_or(0)
            ),
        }),
        Some(a) => Ok(a as usize),
    }
}

pub(crate) struct App {
    pub(crate) project: Arc<dyn Project>,
    /// Where the absolute URLs in TileJSON and styles start (issue 50:
    /// TileJSON 3.0 wants them absolute): `--public-url`, else the bound
    /// address; set once bound, never from a request.
    origin: std::sync::OnceLock<String>,
    /// Handler reads at once: each holds descriptors the limit counts on.
    reads: tokio::sync::Semaphore,
    /// Open MBTiles connections, reused (see [`mbtiles::Pool`]).
    pool: mbtiles::Pool,
    /// Request counts per dataset (issue 23).
    counts: std::sync::Mutex<std::collections::HashMap<String, Counts>>,
    /// Fresh cuts, keyed by (dataset, z, x, y).
    fresh: std::sync::Mutex<std::collections::HashMap<(String, u8, u32, u32), FreshEntry>>,
    cuts: std::sync::atomic::AtomicUsize,
    fresh_cut_timeout: Duration,
    /// [`Project::tilesets`] as last listed, for the clean-tile path.
    tilesets: std::sync::RwLock<Arc<Vec<Tileset>>>,
    /// Clean tiles' stored bytes, by the epoch they were read at
    /// ([`Project::clean_epoch`]); at most `CLEAN_CACHE_BYTES_MAX`.
    clean: std::sync::Mutex<CleanCache>,
}

/// Bytes of clean tiles kept in memory at most; past it the cache starts
/// again empty.
pub const CLEAN_CACHE_BYTES_MAX: usize = 64 << 20;

/// Kept tiles of one dataset, by (z, x, y).
type KeptTiles = std::collections::HashMap<(u8, u32, u32), Option<TileBody>>;

#[derive(Default)]
struct CleanCache {
    epoch: u64,
    bytes: usize,
    /// By dataset first, so that a lookup borrows the name.
    tiles: std::collections::HashMap<String, KeptTiles>,
}

impl CleanCache {
    fn get(&self, epoch: u64, dataset: &str, t: (u8, u32, u32)) -> Option<Option<TileBody>> {
        if self.epoch != epoch {
            return None;
        }
        self.tiles.get(dataset)?.get(&t).cloned()
    }

    fn put(&mut self, epoch: u64, dataset: &str, t: (u8, u32, u32), data: Option<TileBody>) {
        // An older epoch's read never enters a newer cache.
        if epoch < self.epoch {
            return;
        }
        let size = data.as_ref().map_or(0, |d| d.bytes.len()) + 64;
        if epoch != self.epoch || self.bytes + size > CLEAN_CACHE_BYTES_MAX {
            self.tiles.clear();
            self.bytes = 0;
            self.epoch = epoch;
        }
        self.bytes += size;
        match self.tiles.get_mut(dataset) {
            Some(m) => m.insert(t, data),
            None => self
                .tiles
                .entry(dataset.to_string())
                .or_default()
                .insert(t, data),
        };
    }
}

impl App {
    fn new(project: Arc<dyn Project>, fresh_cut_timeout: Duration) -> App {
        App {
            project,
            origin: Default::default(),
            reads: tokio::sync::Semaphore::new(conn::BLOCKING_READS_MAX),
            pool: mbtiles::Pool::default(),
            counts: Default::default(),
            fresh: Default::default(),
            cuts: Default::default(),
            fresh_cut_timeout,
            tilesets: Default::default(),
            clean: Default::default(),
        }
    }

    /// Where absolute URLs start (set once bound).
    fn origin(&self) -> &str {
        self.origin.get().map_or("", String::as_str)
    }

    /// Counts a request, and how a dirty tile was served.
    fn count(&self, dataset: &str, k: (u8, u32, u32), served: Option<bool>) {
        let mut all = self.counts.lock().expect("not poisoned");
        let c = all.entry(dataset.to_string()).or_default();
        if !c.loaded {
            // Counts survive a restart of serve: start from the saved ones.
            c.loaded = true;
            if let Some(r) = self.project.load_requests(dataset) {
                c.tiles = r.tiles.iter().map(|&(z, x, y, n)| ((z, x, y), n)).collect();
                c.fresh = r.fresh;
                c.stale = r.stale;
            }
        }
        c.hit(k);
        match served {
            Some(true) => c.fresh += 1,
            Some(false) => c.stale += 1,
            None => {}
        }
    }

    /// [`App::count`] of a clean tile if the counts' lock is free and they
    /// are loaded; `false`: nothing was counted.
    fn count_now(&self, dataset: &str, k: (u8, u32, u32)) -> bool {
        let Ok(mut all) = self.counts.try_lock() else {
            return false;
        };
        match all.get_mut(dataset) {
            Some(c) if c.loaded => {
                c.hit(k);
                true
            }
            _ => false,
        }
    }

    /// Saves the counts that changed.
    fn save_counts(&self) {
        let todo: Vec<(String, TileRequests)> = {
            let mut all = self.counts.lock().expect("not poisoned");
            all.iter_mut()
                .filter(|(_, c)| c.changed)
                .map(|(n, c)| {
                    c.changed = false;
                    (n.clone(), c.snapshot())
                })
                .collect()
        };
        for (n, r) in todo {
            if let Err(e) = self.project.save_requests(&n, &r) {
                conn::log(&format!(
                    "serve: cannot save the request counts of {n}: {e}"
                ));
            }
        }
    }
}

pub(crate) type Shared = Arc<App>;

/// Serves until SIGTERM or SIGINT. `ready` gets the bound address (port 0
/// picks a free one).
pub fn serve(
    opts: Options,
    project: Arc<dyn Project>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let listen = opts.listen;
    if !listen.ip().is_loopback() && !opts.public {
        return Err(ServeError::NotLoopback { addr: listen });
    }
    let public_url = match &opts.public_url {
        Some(u) => Some(check_public_url(u)?),
        None => None,
    };
    let cors = Arc::new(cors::Cors::new(&opts.cors_origins)?);
    for (what, value) in [
        ("--header-read-timeout-s", opts.header_read_timeout_s),
        ("--idle-timeout-s", opts.idle_timeout_s),
        ("--refresh-s", opts.refresh_s),
    ] {
        if !(1..=TIMEOUT_MAX_S).contains(&value) {
            return Err(ServeError::Timeout {
                what,
                value,
                max: TIMEOUT_MAX_S,
            });
        }
    }
    if !(1..=FRESH_CUT_TIMEOUT_MS_MAX).contains(&opts.fresh_cut_timeout_ms) {
        return Err(ServeError::FreshCutTimeout {
            value: opts.fresh_cut_timeout_ms,
            max: FRESH_CUT_TIMEOUT_MS_MAX,
        });
    }
    let nofile = conn::nofile();
    let max = connections_max(opts.connections_max, nofile)?;
    let timeouts = conn::Timeouts {
        header_read: Duration::from_secs(opts.header_read_timeout_s),
        idle: Duration::from_secs(opts.idle_timeout_s),
    };
    // One event loop per core, at most EVENT_THREADS_MAX, each a runtime
    // of its own on its own thread: clean tiles are answered on the loop
    // (`clean_tile_now`), so a busy machine gives the server one share of
    // the CPU per loop thread (issue 23's bench against martin, whose
    // workers are one per core, each with its own connections). A
    // connection stays on the loop it was handed to: no loop wakes
    // another (a work-stealing runtime did, a futex call per tile or so).
    // The accepting loop (and the signals) run on this thread.
    let loops = EventLoops::start(event_threads())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let refresh = refresher(project.clone(), Duration::from_secs(opts.refresh_s));
    let shared = Arc::new(App::new(
        project,
        Duration::from_millis(opts.fresh_cut_timeout_ms.max(1)),
    ));
    let saver = {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let a = shared.clone();
        let _ = std::thread::Builder::new()
            .name("hw-requests".into())
            .spawn(move || loop {
                match rx.recv_timeout(REQUESTS_SAVE_EVERY) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => a.save_counts(),
                    _ => return,
                }
            });
        tx
    };
    let app_for_stop = shared.clone();
    let loops_ref = &loops;
    let r = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|err| ServeError::Bind { addr: listen, err })?;
        // The handlers are in place before anyone is told we listen: a
        // SIGTERM right after "listening" stops us cleanly.
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let bound = listener.local_addr()?;
        let (origin, warning) = match public_url {
            Some(u) => (u, None),
            None => origin_of(bound),
        };
        let _ = shared.origin.set(origin);
        ready(bound);
        if let Some(w) = warning {
            conn::log(&w);
        }
        let why = match (opts.connections_max, nofile) {
            (Some(_), _) => "--connections-max".to_string(),
            (None, Some(n)) => format!(
                "RLIMIT_NOFILE {n} less {} descriptors kept for files",
                conn::fds_reserved()
            ),
            (None, None) => "RLIMIT_NOFILE is unlimited".to_string(),
        };
        conn::log(&format!(
            "serve: at most {max} connections ({why}); a request head must arrive within {} s of its first byte, an idle connection closes after {} s",
            opts.header_read_timeout_s,
            opts.idle_timeout_s
        ));
        let app = router(shared);
        let app = Served { router: app, cors };
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        accept(
            listener,
            app,
            conn::Conns::new(max, why),
            timeouts,
            loops_ref,
            stop,
        )
        .await;
        Ok(())
    });
    loops.stop();
    // The refresh thread may be inside a request that hangs: it is told to
    // stop, not waited for.
    drop(refresh);
    drop(saver);
    // What was counted since the last save is kept.
    app_for_stop.save_counts();
    r
}

/// The origin absolute URLs start with when no `--public-url` is given:
/// the address bound (issue 50). An unspecified address (0.0.0.0, ::) is
/// no place a client can ask for: its loopback is named, and the second
/// value is the warning to log (clients elsewhere need `--public-url`).
pub fn origin_of(bound: SocketAddr) -> (String, Option<String>) {
    let mut a = bound;
    if !a.ip().is_unspecified() {
        return (format!("http://{a}"), None);
    }
    a.set_ip(match a {
        SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    });
    (
        format!("http://{a}"),
        Some(format!(
            "warning: TileJSON and styles name http://{a} (listening on {bound}, which no client can ask for): give --public-url with the address clients reach this server at"
        )),
    )
}

/// Runs [`Project::refresh`] now and then every `every`, on a thread of
/// its own, until the returned sender is dropped.
fn refresher(project: Arc<dyn Project>, every: Duration) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let _ = std::thread::Builder::new()
        .name("hw-refresh".into())
        .spawn(move || loop {
            project.refresh();
            match rx.recv_timeout(every) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        });
    tx
}

/// The event loops connections are handed to, in turn: each a
/// current-thread runtime on a thread of its own, running until
/// [`EventLoops::stop`].
struct EventLoops {
    handles: Vec<tokio::runtime::Handle>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    next: std::sync::atomic::AtomicUsize,
}

impl EventLoops {
    fn start(n: usize) -> std::io::Result<EventLoops> {
        let mut me = EventLoops {
            handles: Vec::new(),
            stops: Vec::new(),
            threads: Vec::new(),
            next: Default::default(),
        };
        for _ in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            me.handles.push(rt.handle().clone());
            me.stops.push(tx);
            me.threads
                .push(
                    std::thread::Builder::new()
                        .name("hw-serve".into())
                        .spawn(move || {
                            let _ = rt.block_on(rx);
                        })?,
                );
        }
        Ok(me)
    }

    /// The loop the next connection goes to.
    fn next(&self) -> &tokio::runtime::Handle {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.handles[i % self.handles.len()]
    }

    /// Ends every loop (their connections have ended) and waits for them.
    fn stop(self) {
        drop(self.stops);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Accepts connections while there is room, until `stop`; then lets the
/// open ones finish their request and waits for them.
async fn accept(
    listener: tokio::net::TcpListener,
    app: Served,
    conns: Arc<conn::Conns>,
    timeouts: conn::Timeouts,
    loops: &EventLoops,
    stop: impl std::future::Future<Output = ()>,
) {
    let (bye, _) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    'outer: loop {
        while conns.len() >= conns.max {
            conns.evict();
            tokio::select! {
                _ = conns.freed.notified() => {}
                _ = &mut stop => break 'outer,
            }
        }
        tokio::select! {
            r = listener.accept() => match r {
                // Handed to a loop as a plain socket: it is registered with
                // that loop's reactor, not this one's.
                Ok((stream, _)) => match stream.into_std() {
                    Ok(stream) => {
                        let (c, slot) = conns.open();
                        let (app, bye) = (app.clone(), bye.subscribe());
                        loops.next().spawn(async move {
                            if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
                                connection(stream, app, c, slot, timeouts, bye).await;
                            }
                        });
                    }
                    Err(e) => conn::log(&format!("serve: cannot take a connection: {e}")),
                },
                // Out of descriptors or the like: wait a little rather than
                // spin; the open connections' deadlines free some.
                Err(e) => {
                    conn::log(&format!("serve: cannot accept a connection: {e}"));
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = &mut stop => break 'outer,
                    }
                }
            },
            _ = &mut stop => break 'outer,
        }
    }
    drop(listener);
    let _ = bye.send(true);
    while !conns.is_empty() {
        conns.freed.notified().await;
    }
}

/// One connection, closed at its deadline (see [`conn`]), when evicted, or
/// after its request when the server stops.
async fn connection(
    stream: tokio::net::TcpStream,
    app: Served,
    c: Arc<conn::Conn>,
    _slot: conn::Slot,
    timeouts: conn::Timeouts,
    mut bye: tokio::sync::watch::Receiver<bool>,
) {
    let io = hyper_util::rt::TokioIo::new(conn::Watched {
        inner: stream,
        conn: c.clone(),
    });
    let svc = Tracked {
        router: app.router,
        cors: app.cors,
        conn: c.clone(),
    };
    let mut b = hyper::server::conn::http1::Builder::new();
    // The deadlines are ours: hyper's starts at the wait for a request, so
    // it would count an idle connection's wait as a slow head.
    b.header_read_timeout(None);
    let http = b.serve_connection(io, svc);
    tokio::pin!(http);
    let mut stopping = false;
    loop {
        let look = c.next_look(timeouts, Instant::now());
        tokio::select! {
            _ = http.as_mut() => return,
            _ = c.kill.notified() => return,
            _ = tokio::time::sleep_until(look.into()) => {
                if c.deadline(timeouts).is_some_and(|d| d <= Instant::now()) {
                    return;
                }
            }
            // Stopping: half a head is dropped (no request was taken);
            // a request being answered is finished first.
            _ = bye.changed(), if !stopping => {
                if c.mid_head() {
                    return;
                }
                stopping = true;
                http.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The router and who may read its answers, as each connection gets them.
#[derive(Clone)]
struct Served {
    router: Router,
    cors: Arc<cors::Cors>,
}

/// The router, telling the connection when it has a request and when it
/// answered; CORS is added here, around the router (issue 50), so that
/// every answer has it, a 404 or a 405 too, and an `OPTIONS` is answered
/// without a route of its own.
#[derive(Clone)]
struct Tracked {
    router: Router,
    cors: Arc<cors::Cors>,
    conn: Arc<conn::Conn>,
}

impl hyper::service::Service<axum::http::Request<hyper::body::Incoming>> for Tracked {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, Self::Error>> + Send>>;

    fn call(&self, req: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        self.conn.handling();
        if cors::Cors::is_options(req.method()) {
            let r = self.cors.preflight(req.headers());
            self.conn.answered();
            return Box::pin(std::future::ready(Ok(r)));
        }
        let origin = req.headers().get(header::ORIGIN).cloned();
        let answer = tower_service::Service::call(&mut self.router.clone(), req);
        let (c, cors) = (self.conn.clone(), self.cors.clone());
        Box::pin(async move {
            let mut r = answer.await;
            if let Ok(r) = &mut r {
                cors.decorate(origin.as_ref(), r);
            }
            c.answered();
            r
        })
    }
}

fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/map", get(map_page))
        .route("/api/status", get(api_status))
        .route("/api/dirty/{file}", get(dirty))
        .route("/api/aggregates/{name}", get(aggregates))
        .route("/search", get(geocode::search))
        .route("/api", get(geocode::search))
        .route("/reverse", get(geocode::reverse))
        .route("/metrics", get(metrics_text))
        .route("/tiles/{file}", get(tilejson))
        .route("/tiles/{name}/style.json", get(style))
        .route("/tiles/{name}/{z}/{x}/{file}", get(tile))
        .route("/assets/{file}", get(asset))
        .route("/glyphs/{fontstack}/{file}", get(glyph_range))
        .with_state(app)
}

/// Runs blocking reads (SQLite, files) off the event loop, at most
/// [`conn::BLOCKING_READS_MAX`] at once: the connection limit leaves
/// descriptors for that many.
pub(crate) async fn blocking<T: Send + 'static>(
    app: &Shared,
    f: impl FnOnce(Shared) -> T + Send + 'static,
) -> T {
    let _permit = app.reads.acquire().await.expect("never closed");
    let a = app.clone();
    tokio::task::spawn_blocking(move || f(a))
        .await
        .expect("status readers do not panic")
}

async fn index(State(app): State<Shared>) -> Html<String> {
    let status = blocking(&app, |app| {
        // The counts on the page are the ones just served (issue 23).
        app.save_counts();
        app.project.status()
    })
    .await;
    Html(pages::index(&status))
}

async fn map_page(State(app): State<Shared>) -> Response {
    let (sets, notes) = blocking(&app, |app| (app.project.tilesets(), app.project.notes())).await;
    Html(pages::map(&sets, &notes)).into_response()
}

async fn api_status(State(app): State<Shared>) -> Response {
    let status = blocking(&app, |app| {
        // The counts on the page are the ones just served (issue 23).
        app.save_counts();
        app.project.status()
    })
    .await;
    (
        [(header::CONTENT_TYPE, "application/json")],
        status.to_string(),
    )
        .into_response()
}

async fn metrics_text(State(app): State<Shared>) -> Response {
    let status = blocking(&app, |app| {
        // The counts on the page are the ones just served (issue 23).
        app.save_counts();
        app.project.status()
    })
    .await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&status),
    )
        .into_response()
}

pub(crate) fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, what).into_response()
}

fn tileset(app: &App, name: &str) -> Option<Tileset> {
    let all = app.project.tilesets();
    let t = all.iter().find(|t| t.name == name).cloned();
    if let Ok(mut known) = app.tilesets.write() {
        *known = Arc::new(all);
    }
    t
}

async fn dirty(State(app): State<Shared>, UrlPath(file): UrlPath<String>) -> Response {
    let Some(name) = file.strip_suffix(".geojson").map(str::to_string) else {
        return not_found(format!("{file}: ask for NAME.geojson"));
    };
    blocking(&app, move |app| {
        if tileset(&app, &name).is_none() {
            return not_found(format!("no tile dataset named `{name}`"));
        }
        match app.project.dirty_tiles(&name) {
            Ok(tiles) => (
                [(header::CONTENT_TYPE, "application/geo+json")],
                mbtiles::tiles_geojson(&tiles).to_string(),
            )
                .into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    })
    .await
}

/// `/api/aggregates/NAME?admin_level=N&class=C` (issue 50): the stored
/// totals of one committed state, with the sequence they reflect, the
/// rows filtered by admin level and class when asked.
async fn aggregates(
    State(app): State<Shared>,
    UrlPath(name): UrlPath<String>,
    uri: axum::http::Uri,
) -> Response {
    let mut level: Option<u64> = None;
    let mut class: Option<String> = None;
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "admin_level" => match v.parse() {
                Ok(n) => level = Some(n),
                Err(_) => {
                    return (
                        StatusCode::BAD_REQUEST,
                        format!("admin_level={v}: give a number (2 to 11)"),
                    )
                        .into_response()
                }
            },
            "class" => class = Some(v),
            other => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("{other}: ask with admin_level= and class= only"),
                )
                    .into_response()
            }
        }
    }
    blocking(&app, move |app| match app.project.aggregates(&name) {
        Ok(Some(mut doc)) => {
            if let Some(rows) = doc["rows"].as_array_mut() {
                rows.retain(|r| {
                    level.is_none_or(|l| r["admin_level"].as_u64() == Some(l))
                        && class.as_ref().is_none_or(|c| r["class"] == c.as_str())
                });
            }
            (
                [(header::CONTENT_TYPE, "application/json")],
                doc.to_string(),
            )
                .into_response()
        }
        Ok(None) => not_found(format!("no aggregates dataset named `{name}`")),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    })
    .await
}

/// `%XX` and `+` of a query value decoded (invalid escapes kept as they
/// are); the bytes read as UTF-8, lossily.
pub(crate) fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/tiles/NAME.json`. Its URLs are root-relative, or under `public_url`:
/// never built from the request's Host (issue 20).
async fn tilejson(State(app): State<Shared>, UrlPath(file): UrlPath<String>) -> Response {
    let Some(name) = file.strip_suffix(".json").map(str::to_string) else {
        return not_found(format!("{file}: ask for NAME.json"));
    };
    blocking(&app, move |app| {
        let Some(t) = tileset(&app, &name) else {
            return not_found(format!("no tile dataset named `{name}`"));
        };
        match mbtiles::tilejson(&t, app.origin()) {
            Ok(j) => ([(header::CONTENT_TYPE, "application/json")], j.to_string()).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    })
    .await
}

/// `/tiles/NAME/style.json`: for a dataset cut with the Shortbread schema,
/// the vendored VersaTiles style pointed at it (see assets/SOURCE.md).
async fn style(State(app): State<Shared>, UrlPath(name): UrlPath<String>) -> Response {
    blocking(&app, move |app| {
        let Some(t) = tileset(&app, &name) else {
            return not_found(format!("no tile dataset named `{name}`"));
        };
        let tj = match mbtiles::tilejson(&t, app.origin()) {
            Ok(j) => j,
            Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        };
        if tj["tile_schema"] != "shortbread" {
            return not_found(format!(
                "`{name}` is not cut with schema = \"shortbread\": there is no style for its layers"
            ));
        }
        let have: Vec<&str> = tj["vector_layers"]
            .as_array()
            .map(|v| v.iter().filter_map(|l| l["id"].as_str()).collect())
            .unwrap_or_default();
        let style = mbtiles::shortbread_style(
            &format!("{}/tiles/{name}.json", app.origin()),
            &format!("{}/glyphs/{{fontstack}}/{{range}}.pbf", app.origin()),
            &have,
        );
        (
            [(header::CONTENT_TYPE, "application/json")],
            style.to_string(),
        )
            .into_response()
    })
    .await
}

async fn tile(
    State(app): State<Shared>,
    headers: HeaderMap,
    UrlPath((name, z, x, file)): UrlPath<(String, u8, u32, String)>,
) -> Response {
    let Some(y) = file
        .strip_suffix(".pbf")
        .and_then(|y| y.parse::<u32>().ok())
    else {
        return not_found(format!("{file}: ask for Y.pbf"));
    };
    // Coordinates no tile can have are not an empty tile (issue 20).
    if z > highwater_core::tile::ZOOM_MAX || x >= 1 << z || y >= 1 << z {
        return not_found(format!(
            "no tile {z}/{x}/{y}: zooms run 0 to {}, and at zoom {z} x and y run 0 to {}",
            highwater_core::tile::ZOOM_MAX,
            (1u64 << z.min(63)).saturating_sub(1)
        ));
    }
    let if_none: Vec<String> = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .map(str::to_string)
        .collect();
    let gz = accepts_gzip(&headers);
    let if_none = Asked { if_none, gz };
    if let Some(r) = clean_tile_now(&app, &name, z, x, y, &if_none) {
        return r;
    }
    blocking(&app, move |app| {
        let Some(t) = tileset(&app, &name) else {
            return not_found(format!("no tile dataset named `{name}`"));
        };
        if z < t.zoom_min || z > t.zoom_max {
            return not_found(format!(
                "no tile {z}/{x}/{y}: `{name}` is cut for zooms {} to {}",
                t.zoom_min, t.zoom_max
            ));
        }
        // Issue 23: a dirty tile is cut fresh from the store (or served
        // stale, saying so, when that fails or takes too long).
        let state = app.project.tile_state(&name, z, x, y);
        let mut stale: Option<String> = None;
        if let Some((generation, true)) = state {
            match fresh_tile(&app, &name, z, x, y, generation) {
                Ok((g, data)) => {
                    app.count(&name, (z, x, y), Some(true));
                    return tile_response(data, Some(g), None, &if_none);
                }
                Err(why) => {
                    app.count(&name, (z, x, y), Some(false));
                    stale = Some(why);
                }
            }
        } else if state.is_some() {
            app.count(&name, (z, x, y), None);
        }
        match app.pool.read_tile(&t.mbtiles, z, x, y) {
            Ok(data) => tile_response(data.map(TileBody::new), None, stale.as_deref(), &if_none),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    })
    .await
}

/// Issue 23: a clean tile answered on the event loop, without the hand-off
/// to a blocking thread and back (most of what a clean tile cost: the
/// bench in bench/README.md). Only when nothing has to wait: the fresh
/// view answers from the store's WAL-index header or, when that moved or
/// is in doubt, its version probe (one or the other on every request, so
/// a tile dirtied by a commit is never taken for clean), and the tile's
/// bytes are kept or an idle pooled MBTiles connection gets its read lock
/// at once. Anything else (a dirty
/// tile, a store that moved, a drain committing, an error, the first
/// requests) is `None`: the blocking path answers it as before (and says
/// any error). The request is counted as the blocking path counts it.
fn clean_tile_now(
    app: &Shared,
    name: &str,
    z: u8,
    x: u32,
    y: u32,
    if_none: &Asked,
) -> Option<Response> {
    // The datasets as the blocking path last listed them (the config does
    // not change while serve runs; a file that went away fails the pooled
    // read's stat, and the blocking path answers and lists again).
    let known = app.tilesets.try_read().ok()?.clone();
    let t = known.iter().find(|t| t.name == name)?;
    if z < t.zoom_min || z > t.zoom_max {
        return None;
    }
    let before = app.project.clean_epoch();
    let state = app.project.tile_state_now(name, z, x, y)?;
    if matches!(state, Some((_, true))) {
        return None;
    }
    // Kept bytes only while no commit was seen in between (see
    // `Project::clean_epoch`), and only for tiles of a store.
    let epoch = before.filter(|e| state.is_some() && app.project.clean_epoch() == Some(*e));
    let kept = epoch.and_then(|e| {
        app.clean
            .lock()
            .expect("not poisoned")
            .get(e, name, (z, x, y))
    });
    let data = match kept {
        Some(d) => d,
        None => {
            let d = app
                .pool
                .read_tile_now(&t.mbtiles, z, x, y)?
                .map(TileBody::new);
            if let Some(e) = epoch {
                app.clean
                    .lock()
                    .expect("not poisoned")
                    .put(e, name, (z, x, y), d.clone());
            }
            d
        }
    };
    if state.is_some() && !app.count_now(name, (z, x, y)) {
        // The counts are busy (being saved, or loaded the first time):
        // counted on a blocking thread, the tile not held back for it.
        let (a, name) = (app.clone(), name.to_string());
        tokio::task::spawn_blocking(move || a.count(&name, (z, x, y), None));
    }
    Some(tile_response(data, None, None, if_none))
}

/// The fresh bytes of a dirty tile: from memory when cut at `generation`,
/// else cut now, within the time limit and the limit on cuts under way.
/// `Err` says why the stale tile is served instead.
fn fresh_tile(
    app: &Shared,
    name: &str,
    z: u8,
    x: u32,
    y: u32,
    generation: i64,
) -> Result<FreshEntry, String> {
    let key = (name.to_string(), z, x, y);
    if let Some(e) = app.fresh.lock().expect("not poisoned").get(&key) {
        if e.0 == generation {
            return Ok(e.clone());
        }
    }
    use std::sync::atomic::Ordering;
    if app.cuts.fetch_add(1, Ordering::SeqCst) >= FRESH_CUTS_MAX {
        app.cuts.fetch_sub(1, Ordering::SeqCst);
        return Err(format!(
            "{FRESH_CUTS_MAX} fresh cuts are under way; served as stored"
        ));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let a = app.clone();
    let spawned = std::thread::Builder::new()
        .name("hw-fresh-cut".into())
        .spawn(move || {
            let r = a
                .project
                .cut_fresh(&key.0, z, x, y)
                .map(|(g, data)| (g, data.map(TileBody::new)));
            if let Ok((g, data)) = &r {
                let mut cache = a.fresh.lock().expect("not poisoned");
                if cache.len() >= FRESH_CACHE_TILES_MAX {
                    // Older generations first; then everything.
                    cache.retain(|_, e| e.0 >= *g);
                    if cache.len() >= FRESH_CACHE_TILES_MAX {
                        cache.clear();
                    }
                }
                cache.insert(key, (*g, data.clone()));
            }
            a.cuts.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        app.cuts.fetch_sub(1, Ordering::SeqCst);
        return Err(format!("cannot start the fresh cut: {e}"));
    }
    match rx.recv_timeout(app.fresh_cut_timeout) {
        Ok(r) => r.map_err(|e| format!("the fresh cut failed: {e}")),
        Err(_) => Err(format!(
            "the fresh cut took longer than {} ms",
            app.fresh_cut_timeout.as_millis()
        )),
    }
}

/// What a tile request asks beyond the tile: the ETags it has, and
/// whether it takes gzip.
struct Asked {
    if_none: Vec<String>,
    gz: bool,
}

/// Whether a request's `Accept-Encoding` takes gzip (RFC 9110 12.5.3):
/// `gzip` or `x-gzip` or `*` with a non-zero weight, `gzip` named with
/// weight 0 refusing it. A request without the header gets the tile
/// inflated: the RFC leaves the choice to the server, and a client that
/// sends none (curl without --compressed, a script's plain GET) is one
/// that would otherwise be handed bytes it cannot read.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut named: Option<bool> = None;
    let mut star = false;
    for v in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(v) = v.to_str() else { continue };
        for item in v.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            match coding.as_str() {
                "gzip" | "x-gzip" => named = Some(named.unwrap_or(false) || q > 0.0),
                "*" => star = q > 0.0,
                _ => {}
            }
        }
    }
    named.unwrap_or(star)
}

/// Gzip's first two bytes: MBTiles files written elsewhere may hold
/// tiles uncompressed, which are then sent without a Content-Encoding.
fn is_gzip(b: &[u8]) -> bool {
    b.starts_with(&[0x1f, 0x8b])
}

/// `bytes` inflated; `None` when they do not inflate (sent as stored).
fn gunzip(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(bytes.len() * 4);
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// A tile's response: MVT with its ETag ([`TileBody`]), gzipped as
/// stored for a client that takes gzip and inflated for one that does not
/// (issue 50; its ETag then says `-identity`: another representation),
/// `no-cache` (clients revalidate: the tile may be re-cut at any diff), and
/// for a stale dirty tile a header saying why. An empty tile is 204.
fn tile_response(
    data: Option<TileBody>,
    generation: Option<i64>,
    stale: Option<&str>,
    asked: &Asked,
) -> Response {
    let mut r = match data {
        Some(TileBody { bytes, etag }) => {
            let zipped = is_gzip(&bytes);
            let (bytes, etag, encoding) = if zipped && !asked.gz {
                match gunzip(&bytes) {
                    Some(plain) => {
                        let tag = etag.to_str().expect("hex and quotes");
                        let tag = format!("{}-identity\"", &tag[..tag.len() - 1]);
                        (
                            axum::body::Bytes::from(plain),
                            HeaderValue::from_str(&tag).expect("hex and quotes"),
                            None,
                        )
                    }
                    None => (bytes, etag, Some("gzip")),
                }
            } else {
                (bytes, etag, zipped.then_some("gzip"))
            };
            let tag = etag.to_str().expect("hex and quotes");
            if asked.if_none.iter().any(|h| none_match(h, tag)) {
                let mut r = StatusCode::NOT_MODIFIED.into_response();
                let h = r.headers_mut();
                h.insert(header::ETAG, etag);
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
                return r;
            }
            let mut r = Response::new(axum::body::Body::from(bytes));
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/vnd.mapbox-vector-tile"),
            );
            if let Some(e) = encoding {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(e));
            }
            h.insert(header::ETAG, etag);
            r
        }
        // An empty tile: no content, which every client reads as empty.
        None => StatusCode::NO_CONTENT.into_response(),
    };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if let Some(g) = generation {
        h.insert(
            "x-highwater-fresh",
            HeaderValue::from_str(&format!("cut at store generation {g}")).expect("ascii"),
        );
    }
    if let Some(why) = stale {
        let why: String = why
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .take(300)
            .collect();
        h.insert(
            "x-highwater-stale",
            HeaderValue::from_str(&format!("dirty tile served as stored: {why}"))
                .unwrap_or_else(|_| HeaderValue::from_static("dirty tile served as stored")),
        );
    }
    r
}

/// Whether an `If-None-Match` field value matches `etag` (RFC 9110
/// 13.1.2): `*` matches any current representation, a list matches when
/// one of its entity tags does, by weak comparison (`W/` ignored). A value
/// that does not parse matches nothing, and the tile is sent.
pub fn none_match(field: &str, etag: &str) -> bool {
    let ours = etag.strip_prefix("W/").unwrap_or(etag);
    let mut rest = field.trim();
    if rest == "*" {
        return true;
    }
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return false;
        }
        let tag = rest.strip_prefix("W/").unwrap_or(rest);
        let Some(inner) = tag.strip_prefix('"') else {
            return false;
        };
        let Some(end) = inner.find('"') else {
            return false;
        };
        if tag[..end + 2] == *ours {
            return true;
        }
        rest = &inner[end + 1..];
    }
}

/// The vendored MapLibre files, compiled in.
pub mod assets {
    pub const MAPLIBRE_JS: &[u8] = include_bytes!("../assets/maplibre-gl.mjs");
    pub const MAPLIBRE_WORKER_JS: &[u8] = include_bytes!("../assets/maplibre-gl-worker.mjs");
    pub const MAPLIBRE_SHARED_JS: &[u8] = include_bytes!("../assets/maplibre-gl-shared.mjs");
    pub const MAPLIBRE_CSS: &[u8] = include_bytes!("../assets/maplibre-gl.css");
    /// `@versatiles/style`'s colorful style for Shortbread tiles.
    pub const SHORTBREAD_STYLE: &str = include_str!("../assets/versatiles-colorful.json");
}

/// `/glyphs/{fontstack}/{range}.pbf`, compiled in ([`glyphs`]).
async fn glyph_range(UrlPath((fontstack, file)): UrlPath<(String, String)>) -> Response {
    let cache = (header::CACHE_CONTROL, "public, max-age=86400");
    let pbf = (header::CONTENT_TYPE, "application/x-protobuf");
    match glyphs::glyphs(&fontstack, &file) {
        glyphs::Glyphs::Gzipped(body) => {
            ([pbf, cache, (header::CONTENT_ENCODING, "gzip")], body).into_response()
        }
        glyphs::Glyphs::Empty(body) => ([pbf, cache], body).into_response(),
        glyphs::Glyphs::NotFound(why) => not_found(why),
    }
}

async fn asset(UrlPath(file): UrlPath<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "maplibre-gl.mjs" => (assets::MAPLIBRE_JS, "text/javascript"),
        "maplibre-gl-worker.mjs" => (assets::MAPLIBRE_WORKER_JS, "text/javascript"),
        "maplibre-gl-shared.mjs" => (assets::MAPLIBRE_SHARED_JS, "text/javascript"),
        "maplibre-gl.css" => (assets::MAPLIBRE_CSS, "text/css"),
        _ => return not_found(format!("no asset `{file}`")),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    /// Issue 20: `If-None-Match` as RFC 9110 has it.
    #[test]
    fn if_none_match_takes_star_lists_and_weak_tags() {
        let ours = "\"0123abcd\"";
        for (field, want) in [
            ("\"0123abcd\"", true),
            ("*", true),
            (" * ", true),
            ("W/\"0123abcd\"", true),
            ("\"x\", \"0123abcd\"", true),
            ("\"x\",W/\"0123abcd\" ", true),
            ("\"a,b\", \"0123abcd\"", true),
            ("\"x\"", false),
            ("\"x\", \"y\"", false),
            ("\"0123abc\"", false),
            ("0123abcd", false),
            ("\"0123abcd", false),
            ("", false),
            ("\"a,\"0123abcd\"\"", false),
        ] {
            assert_eq!(super::none_match(field, ours), want, "{field:?}");
        }
    }

    #[test]
    fn public_urls_are_checked() {
        for (url, want) in [
            ("https://maps.example.org", Some("https://maps.example.org")),
            (
                "https://maps.example.org/hw/",
                Some("https://maps.example.org/hw"),
            ),
            ("http://127.0.0.1:8080", Some("http://127.0.0.1:8080")),
            ("maps.example.org", None),
            ("https://", None),
            ("https://u:p@maps.example.org", None),
            ("https://maps.example.org/?a=b", None),
            ("ftp://maps.example.org", None),
        ] {
            assert_eq!(super::check_public_url(url).ok().as_deref(), want, "{url}");
        }
        // A refused URL is named without its password (issue 20).
        let e = super::check_public_url("https://u:s3cret@maps.example.org/x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("https://***@maps.example.org/x"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn the_connection_limit_leaves_descriptors_for_files() {
        let r = super::conn::fds_reserved();
        assert_eq!(super::connections_max(None, Some(r + 100)).unwrap(), 100);
        assert_eq!(super::connections_max(Some(50), Some(r + 100)).unwrap(), 50);
        assert!(super::connections_max(Some(101), Some(r + 100)).is_err());
        assert!(super::connections_max(None, Some(r + 1)).is_err());
        assert!(super::connections_max(None, None).unwrap() >= 1000);
    }
}
