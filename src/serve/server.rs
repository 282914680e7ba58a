//! The HTTP server of the views (axum on a tokio runtime of its own thread).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use highwater_operators::table::{AsOfError, ReadHold};
use highwater_operators::time::{Timestamp, END_OF_TIME};
use serde_json::{json, Value};

use super::views::{Scan, View, ViewError, Views};

/// The status page: one HTML file, its script and styles inline, that
/// polls `/status` (with the page's `?token=` as a bearer token, if given).
#[cfg(feature = "metrics")]
const STATUS_PAGE: &str = include_str!("status.html");

/// How often a subscription looks for new changes.
const POLL: Duration = Duration::from_millis(20);

/// How many batches of changes a subscription may have waiting for its
/// client before it is dropped.
const SUBSCRIBER_BUFFER: usize = 256;

/// The most rows a scan returns (and the default, 100, when no `limit`).
const MAX_LIMIT: usize = 10_000;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A non-loopback address without a token.
    #[error("serving views on {0}, which is not a loopback address, needs a bearer token (--serve-token)")]
    TokenRequired(SocketAddr),
    /// The address could not be bound, or the runtime not started.
    #[error("serving on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What the server serves besides the views.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Requests must carry `Authorization: Bearer <token>` (required to
    /// serve views on a non-loopback address; metrics and the status page
    /// alone may go without, as scrape endpoints usually do).
    pub token: Option<String>,
    /// The job's Prometheus metrics at `/metrics` (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub metrics: Option<crate::metrics::JobMetrics>,
}

/// The running server of [`serve_views`]: serves until dropped.
#[derive(Debug)]
pub struct ViewServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ViewServer {
    /// The address the server listens on (the port chosen, if 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ViewServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Shared {
    views: Views,
    token: Option<String>,
}

/// Serves `views` over HTTP/1.1 on `addr` from a thread with a tokio runtime
/// of its own (reads never stop the dataflow):
///
/// | request | answer |
/// | --- | --- |
/// | `GET /views` | every view: name, key and value examples, keys held, watermark, earliest time |
/// | `GET /views?names=a,b&keys=k1,k2[&as_of=T]` | the keys' values in each view, all as of one time |
/// | `POST /views` `{"as_of"?, "reads": [{"view", "key"}, {"view", "from"?, "to"?, "prefix"?, "limit"?}]}` | point reads and scans of several views, all as of one time |
/// | `GET /views/{name}/{key}[?as_of=T]` | the key's value (404 if none) |
/// | `GET /views/{name}?from=K1&to=K2&prefix=P&limit=N[&as_of=T]` | rows in key order: `from` inclusive, `to` exclusive, `prefix` for string keys |
/// | `GET /views/{name}/changes[?since=T]` | a subscription: JSON lines |
/// | `GET /metrics` | the job's Prometheus metrics (with [`ServeOptions::metrics`]) |
/// | `GET /status` | the job's numbers as JSON ([`JobMetrics::status`](crate::metrics::JobMetrics::status)) |
/// | `GET /` | the status page: the dataflow's operators and their rates, sources with their watermarks and lag, checkpoints, late and dead-letter counts, charts of the last minutes |
///
/// Every answer says the time it is as of (`as_of`: every change at or
/// before it, none after; `null` before the first) and the view's
/// `watermark`. `as_of=T` reads the state as of event time `T`, from the
/// retained history ([`Views::table`]); before it, 410 with the earliest
/// time; at or after the watermark, 400. Errors are JSON: `{"error": ...}`.
///
/// A subscription sends the state as of `since` (or now) as changes
/// (`{"time", "key", "value", "diff"}`), then `{"progress": W}` (every change
/// before `W` has been sent), then each later change in time order, with a
/// progress line each time the watermark moves: Materialize's `SUBSCRIBE …
/// WITH (PROGRESS)`. A client that does not keep up is dropped with a last
/// line `{"error": ...}` saying where to resume: it never grows the job's
/// memory beyond a bounded buffer.
///
/// # Errors
/// [`ServeError`]: the address cannot be bound, or is not a loopback
/// address, no token is given and there are views to serve.
pub fn serve_views(addr: SocketAddr, views: Views, options: ServeOptions) -> Result<ViewServer, ServeError> {
    if options.token.is_none() && !addr.ip().is_loopback() && !views.names().is_empty() {
        return Err(ServeError::TokenRequired(addr));
    }
    let io = |source| ServeError::Io { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shared = Arc::new(Shared { views, token: options.token });
    #[allow(unused_mut)]
    let mut app = Router::new()
        .route("/views", get(list).post(batch_post))
        .route("/views/{name}", get(scan))
        .route("/views/{name}/changes", get(subscribe))
        .route("/views/{name}/{key}", get(point))
        .with_state(Arc::clone(&shared));
    #[cfg(feature = "metrics")]
    if let Some(metrics) = options.metrics {
        let metrics = Arc::new(metrics);
        let (m, auth) = (Arc::clone(&metrics), Arc::clone(&shared));
        app = app
            .route(
                "/metrics",
                get(move |headers: HeaderMap| {
                    let answer = authorized(&auth, &headers).then(|| m.render()).ok_or_else(unauthorized);
                    async move {
                        match answer {
                            Ok(body) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
                                .into_response(),
                            Err(e) => e,
                        }
                    }
                }),
            )
            .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], STATUS_PAGE) }));
        let auth = Arc::clone(&shared);
        app = app.route(
            "/status",
            get(move |headers: HeaderMap| {
                let answer = if authorized(&auth, &headers) { ok(metrics.status()) } else { unauthorized() };
                async move { answer }
            }),
        );
    }
    let thread = std::thread::Builder::new()
        .name("highwater-serve".into())
        .spawn(move || {
            if !super::slice::request_slice(super::slice::SERVER_SLICE_NS) {
                tracing::debug!("the scheduler keeps its default slice for the view server");
            }
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(e) => {
                        tracing::error!(%e, "the view server cannot listen");
                        return;
                    }
                };
                let served = axum::serve(listener, app).with_graceful_shutdown(async move {
                    let _ = stopped.await;
                });
                if let Err(e) = served.await {
                    tracing::error!(%e, "the view server failed");
                }
            });
        })
        .map_err(io)?;
    tracing::info!(%addr, "views at http://{addr}/views");
    Ok(ViewServer { addr, stop: Some(stop), thread: Some(thread) })
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    let body = json!({ "error": message.to_string() });
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// A JSON answer, or the error's status and JSON body.
fn respond(answer: Result<Value, ViewError>) -> Response {
    match answer {
        Ok(body) => ok(body),
        Err(e) => e.into_response(),
    }
}

fn ok(body: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

impl IntoResponse for ViewError {
    fn into_response(self) -> Response {
        let status = match &self {
            ViewError::UnknownView(_) | ViewError::NoValue { .. } => StatusCode::NOT_FOUND,
            ViewError::AsOf(AsOfError::BeforeHistory { .. }) => StatusCode::GONE,
            _ => StatusCode::BAD_REQUEST,
        };
        error(status, self)
    }
}

/// Whether the request carries the server's token (or the server has none).
fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(token) = &shared.token else { return true };
    let given =
        headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "));
    // Compared in time independent of where they differ.
    let same = given.is_some_and(|g| {
        g.len() == token.len() && g.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    });
    same
}

fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "a bearer token is required: Authorization: Bearer <token>")
}

/// `as_of=T` (or `since=T`): the hold that reads as of `T`.
fn parse_time(params: &BTreeMap<String, String>, name: &str) -> Result<Option<Timestamp>, ViewError> {
    params
        .get(name)
        .map(|t| {
            t.parse::<Timestamp>()
                .ok()
                .filter(|t| *t < END_OF_TIME)
                .ok_or_else(|| ViewError::BadParameter(format!("{name}={t:?} is not an event time in milliseconds")))
        })
        .transpose()
}

/// A hold as of `as_of`, or at the view's (or timeline's) watermark.
fn hold_for(views: &Views, view: Option<&dyn View>, as_of: Option<Timestamp>) -> ReadHold {
    match (as_of, view) {
        (Some(t), _) => views.timeline().hold(t + 1),
        (None, Some(view)) => view.hold_current(),
        (None, None) => views.timeline().hold_current(),
    }
}

fn times(hold: &ReadHold, watermark: Timestamp) -> (Value, Value) {
    (json!(hold.as_of()), json!(watermark))
}

async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let views = &shared.views;
    if let Some(names) = params.get("names") {
        return respond(batch(views, names, params.get("keys"), &params));
    }
    let list: Vec<Value> = views
        .all()
        .into_iter()
        .map(|(name, view)| {
            let (key, value) = view.example().unzip();
            json!({
                "name": name,
                "key": key,
                "value": value,
                "keys": view.keys_held(),
                "watermark": view.watermark(),
                "earliest": view.earliest(),
            })
        })
        .collect();
    ok(json!({ "watermark": views.timeline().watermark(), "views": list }))
}

/// Several views' keys as of one time.
fn batch(
    views: &Views,
    names: &str,
    keys: Option<&String>,
    params: &BTreeMap<String, String>,
) -> Result<Value, ViewError> {
    let keys: Vec<&str> = keys.map(|k| k.split(',').collect()).unwrap_or_default();
    let as_of = parse_time(params, "as_of")?;
    let chosen: Vec<(&str, Arc<dyn View>)> =
        names.split(',').map(|name| Ok((name, views.view(name)?))).collect::<Result<_, ViewError>>()?;
    let hold = hold_for(views, None, as_of);
    let mut out = serde_json::Map::new();
    for (name, view) in &chosen {
        let mut values = serde_json::Map::new();
        for key in &keys {
            values.insert((*key).to_owned(), view.get(name, &hold, key)?.unwrap_or(Value::Null));
        }
        out.insert((*name).to_owned(), Value::Object(values));
    }
    let (as_of, watermark) = times(&hold, views.timeline().watermark());
    Ok(json!({ "as_of": as_of, "watermark": watermark, "views": out }))
}

/// `POST /views` with `{"as_of": T?, "reads": [{"view", "key"} | {"view",
/// "from"?, "to"?, "prefix"?, "limit"?}, ...]}`: point reads and scans of
/// any views, all as of one time.
async fn batch_post(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    respond(batch_reads(&shared.views, &body))
}

fn batch_reads(views: &Views, body: &str) -> Result<Value, ViewError> {
    let request: Value =
        serde_json::from_str(body).map_err(|e| ViewError::BadParameter(format!("the body is not JSON: {e}")))?;
    let as_of =
        match request.get("as_of") {
            None | Some(Value::Null) => None,
            Some(t) => Some(t.as_u64().filter(|t| *t < END_OF_TIME).ok_or_else(|| {
                ViewError::BadParameter(format!("as_of={t}: expected an event time in milliseconds"))
            })?),
        };
    let reads = request
        .get("reads")
        .and_then(Value::as_array)
        .ok_or_else(|| ViewError::BadParameter("the body needs \"reads\": a list of reads".into()))?;
    // A key or bound given as JSON: a string as its text, anything else as JSON.
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let chosen = reads
        .iter()
        .map(|read| {
            let name = read
                .get("view")
                .and_then(Value::as_str)
                .ok_or_else(|| ViewError::BadParameter(format!("a read needs \"view\", the name of a view: {read}")))?;
            Ok((name, views.view(name)?, read))
        })
        .collect::<Result<Vec<_>, ViewError>>()?;
    let hold = hold_for(views, None, as_of);
    let mut results = Vec::new();
    for (name, view, read) in chosen {
        if let Some(key) = read.get("key") {
            let value = view.get(name, &hold, &text(key))?;
            results.push(json!({ "view": name, "key": key, "value": value }));
            continue;
        }
        let limit = match read.get("limit") {
            None => 100,
            Some(n) => n.as_u64().map(|n| n as usize).filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                ViewError::BadParameter(format!("limit={n}: expected a number from 1 to {MAX_LIMIT}"))
            })?,
        };
        let scan = Scan {
            from: read.get("from").map(text),
            to: read.get("to").map(text),
            prefix: read.get("prefix").map(text),
            limit,
        };
        let rows: Vec<Value> =
            view.scan(name, &hold, &scan)?.into_iter().map(|(k, v)| json!({ "key": k, "value": v })).collect();
        results.push(json!({ "view": name, "rows": rows }));
    }
    let (as_of, watermark) = times(&hold, views.timeline().watermark());
    Ok(json!({ "as_of": as_of, "watermark": watermark, "results": results }))
}

async fn point(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, key)): Path<(String, String)>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let answer = (|| {
        let view = shared.views.view(&name)?;
        let hold = hold_for(&shared.views, Some(view.as_ref()), parse_time(&params, "as_of")?);
        let value =
            view.get(&name, &hold, &key)?.ok_or_else(|| ViewError::NoValue { view: name.clone(), key: key.clone() })?;
        let (as_of, watermark) = times(&hold, view.watermark());
        let key = serde_json::from_str::<Value>(&key).unwrap_or(Value::String(key.clone()));
        Ok::<_, ViewError>(json!({ "key": key, "value": value, "as_of": as_of, "watermark": watermark }))
    })();
    respond(answer)
}

async fn scan(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let answer = (|| {
        let view = shared.views.view(&name)?;
        let limit = match params.get("limit") {
            None => 100,
            Some(n) => n.parse::<usize>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                ViewError::BadParameter(format!("limit={n:?}: expected a number from 1 to {MAX_LIMIT}"))
            })?,
        };
        let request = Scan {
            from: params.get("from").cloned(),
            to: params.get("to").cloned(),
            prefix: params.get("prefix").cloned(),
            limit,
        };
        let hold = hold_for(&shared.views, Some(view.as_ref()), parse_time(&params, "as_of")?);
        let rows: Vec<Value> =
            view.scan(&name, &hold, &request)?.into_iter().map(|(k, v)| json!({ "key": k, "value": v })).collect();
        let (as_of, watermark) = times(&hold, view.watermark());
        Ok::<_, ViewError>(json!({ "as_of": as_of, "watermark": watermark, "rows": rows }))
    })();
    respond(answer)
}

async fn subscribe(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let start = (|| {
        let view = shared.views.view(&name)?;
        let hold = hold_for(&shared.views, Some(view.as_ref()), parse_time(&params, "since")?);
        // The state as of the start, as changes at its time.
        let all = Scan { limit: usize::MAX, ..Scan::default() };
        let rows = view.scan(&name, &hold, &all)?;
        let time = hold.as_of();
        let mut first = String::new();
        for (key, value) in rows {
            first.push_str(&json!({ "time": time, "key": key, "value": value, "diff": 1 }).to_string());
            first.push('\n');
        }
        first.push_str(&json!({ "progress": hold.upto() }).to_string());
        first.push('\n');
        Ok::<_, ViewError>((view, hold, first))
    })();
    let (view, mut hold, first) = match start {
        Ok(start) => start,
        Err(e) => return e.into_response(),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(SUBSCRIBER_BUFFER + 1);
    let _ = tx.try_send(first);
    tokio::spawn(async move {
        loop {
            if hold.upto() == END_OF_TIME || tx.is_closed() {
                return;
            }
            tokio::time::sleep(POLL).await;
            let watermark = view.watermark();
            if watermark <= hold.upto() {
                continue;
            }
            let mut lines = String::new();
            match view.changes(hold.upto(), watermark) {
                Ok(changes) => {
                    for change in changes {
                        lines.push_str(&json!(change).to_string());
                        lines.push('\n');
                    }
                    lines.push_str(&json!({ "progress": watermark }).to_string());
                    lines.push('\n');
                }
                Err(e) => {
                    let _ = tx.try_send(format!("{}\n", json!({ "error": e.to_string() })));
                    return;
                }
            }
            // The last slot is kept for the message that drops a client
            // that does not read.
            if tx.capacity() <= 1 {
                let message = format!(
                    "subscriber too slow: dropped with {SUBSCRIBER_BUFFER} batches unread; resubscribe with since={}",
                    hold.upto().saturating_sub(1)
                );
                tracing::warn!(view = %name, "{message}");
                let _ = tx.try_send(format!("{}\n", json!({ "error": message })));
                return;
            }
            if tx.try_send(lines).is_err() {
                return;
            }
            hold.advance(watermark);
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|line| line.map(Ok::<_, std::io::Error>)));
    (
        [(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-cache")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}
