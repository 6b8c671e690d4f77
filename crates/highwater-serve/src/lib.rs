//! `highwater serve`: read-only pages and endpoints over a project's state.
//!
//! What it serves, all with GET only (anything else is 405), none writing:
//! - `/`: one page that answers "is everything fresh?" (file stages, the
//!   window grid of each source, OSM datasets against store and server);
//! - `/map`: MapLibre GL JS (vendored, [`assets`]) over a tile dataset, with
//!   its dirty tiles outlined;
//! - `/tiles/NAME/{z}/{x}/{y}.pbf` from the MBTiles (TMS row flipped,
//!   `Content-Encoding: gzip` as stored, ETag) and `/tiles/NAME.json`
//!   (TileJSON 3.0);
//! - `/metrics` (Prometheus text, [`metrics`]) and `/api/status` (the data
//!   behind `/`).
//!
//! Layout: this file is the router and the server; [`pages`] renders HTML
//! with maud (escaped at compile time); [`metrics`] turns the status
//! document into exposition text; [`mbtiles`] reads tiles. What the state
//! *is* comes from the binary through [`Project`], so this crate knows
//! nothing of how files, sources or OSM stores keep it.

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
    #[error("the server stopped: {0}")]
    Io(#[from] std::io::Error),
}

struct App {
    project: Arc<dyn Project>,
}

type Shared = Arc<App>;

/// Serves until SIGTERM or SIGINT. `ready` gets the bound address (port 0
/// picks a free one).
pub fn serve(
    listen: SocketAddr,
    public: bool,
    project: Arc<dyn Project>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    if !listen.ip().is_loopback() && !public {
        return Err(ServeError::NotLoopback { addr: listen });
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|err| ServeError::Bind { addr: listen, err })?;
        // The handlers are in place before anyone is told we listen: a
        // SIGTERM right after "listening" stops us cleanly.
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        ready(listener.local_addr()?);
        let app = router(Arc::new(App { project }));
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            })
            .await?;
        Ok(())
    })
}

fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/map", get(map_page))
        .route("/api/status", get(api_status))
        .route("/api/dirty/{file}", get(dirty))
        .route("/metrics", get(metrics_text))
        .route("/tiles/{file}", get(tilejson))
        .route("/tiles/{name}/style.json", get(style))
        .route("/tiles/{name}/{z}/{x}/{file}", get(tile))
        .route("/assets/{file}", get(asset))
        .with_state(app)
}

/// Runs blocking reads (SQLite, files) off the event loop.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("status readers do not panic")
}

async fn index(State(app): State<Shared>) -> Html<String> {
    let status = blocking(move || app.project.status()).await;
    Html(pages::index(&status))
}

async fn map_page(State(app): State<Shared>) -> Response {
    let sets = blocking(move || app.project.tilesets()).await;
    Html(pages::map(&sets)).into_response()
}

async fn api_status(State(app): State<Shared>) -> Response {
    let status = blocking(move || app.project.status()).await;
    (
        [(header::CONTENT_TYPE, "application/json")],
        status.to_string(),
    )
        .into_response()
}

async fn metrics_text(State(app): State<Shared>) -> Response {
    let status = blocking(move || app.project.status()).await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&status),
    )
        .into_response()
}

/// The Host the client asked for: absolute URLs in TileJSON and styles
/// point back at the address the client reached.
fn host(headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_string()
}

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, what).into_response()
}

fn tileset(app: &App, name: &str) -> Option<Tileset> {
    app.project.tilesets().into_iter().find(|t| t.name == name)
}

async fn dirty(State(app): State<Shared>, UrlPath(file): UrlPath<String>) -> Response {
    let Some(name) = file.strip_suffix(".geojson").map(str::to_string) else {
        return not_found(format!("{file}: ask for NAME.geojson"));
    };
    blocking(move || {
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

async fn tilejson(
    State(app): State<Shared>,
    headers: HeaderMap,
    UrlPath(file): UrlPath<String>,
) -> Response {
    let Some(name) = file.strip_suffix(".json").map(str::to_string) else {
        return not_found(format!("{file}: ask for NAME.json"));
    };
    let host = host(&headers);
    blocking(move || {
        let Some(t) = tileset(&app, &name) else {
            return not_found(format!("no tile dataset named `{name}`"));
        };
        match mbtiles::tilejson(&t, &format!("http://{host}")) {
            Ok(j) => ([(header::CONTENT_TYPE, "application/json")], j.to_string()).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    })
    .await
}

/// `/tiles/NAME/style.json`: for a dataset cut with the Shortbread schema,
/// the vendored VersaTiles style pointed at it (see assets/SOURCE.md).
async fn style(
    State(app): State<Shared>,
    headers: HeaderMap,
    UrlPath(name): UrlPath<String>,
) -> Response {
    let host = host(&headers);
    blocking(move || {
        let Some(t) = tileset(&app, &name) else {
            return not_found(format!("no tile dataset named `{name}`"));
        };
        let tj = match mbtiles::tilejson(&t, &format!("http://{host}")) {
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
        let style = mbtiles::shortbread_style(&format!("http://{host}/tiles/{name}.json"), &have);
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
    let if_none = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    blocking(move || {
        let Some(t) = tileset(&app, &name) else {
            return not_found(format!("no tile dataset named `{name}`"));
        };
        match mbtiles::read_tile(&t.mbtiles, z, x, y) {
            Ok(Some(data)) => {
                let etag = format!("\"{}\"", &blake3::hash(&data).to_hex()[..16]);
                if if_none.as_deref() == Some(etag.as_str()) {
                    return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
                }
                let mut r = data.into_response();
                let h = r.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/vnd.mapbox-vector-tile"),
                );
                // Stored gzipped (as the MBTiles spec has it): sent as is.
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex"));
                r
            }
            // An empty tile: no content, which every client reads as empty.
            Ok(None) => StatusCode::NO_CONTENT.into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    })
    .await
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
