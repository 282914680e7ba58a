//! Calls to JSON-over-HTTP services as they are (feature `http`): a
//! function for [`enrich_async`](super::EnrichAsync::enrich_async) from a
//! URL template and a response type, on one connection pool per process.
//!
//! ```no_run
//! use highwater::enrich::http::get_json;
//! use highwater::enrich::{AsyncOptions, EnrichAsync};
//! use highwater::prelude::*;
//!
//! #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
//! struct Profile { name: String, country: String }
//!
//! fn profiles<'s>(user_ids: &EventStream<'s, u64>) -> EventStream<'s, (u64, Profile)> {
//!     let lookup = get_json::<u64, Profile>("http://profiles.internal/users/{}", |id| vec![id.to_string()]);
//!     user_ids.enrich_async(AsyncOptions::new("Profiles"), lookup).results
//! }
//! # let _ = profiles;
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

/// Why a call failed: the request (connection, timeout of the client), a
/// status that is not a success, or a body that is not the JSON expected.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The request did not complete.
    #[error("request to {url} failed: {source}")]
    Request {
        /// The URL called.
        url: String,
        /// The client's error.
        source: reqwest::Error,
    },
    /// The service answered with an error status.
    #[error("{url} answered {status}")]
    Status {
        /// The URL called.
        url: String,
        /// The status, e.g. 503.
        status: u16,
    },
    /// The body did not decode.
    #[error("{url} answered with a body that does not decode: {reason}")]
    Body {
        /// The URL called.
        url: String,
        /// serde_json's message.
        reason: String,
    },
}

/// The process's HTTP client: one connection pool for every call.
pub fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(reqwest::Client::new)
}

/// `template` with each `{}` replaced, in order, by the next of `values`,
/// percent-encoded as a path segment (unreserved characters stay).
///
/// ```
/// use highwater::enrich::http::fill;
/// assert_eq!(fill("http://h/u/{}/x?q={}", &["a b/c".into(), "7".into()]), "http://h/u/a%20b%2Fc/x?q=7");
/// ```
pub fn fill(template: &str, values: &[String]) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut values = values.iter();
    let mut rest = template;
    while let Some(at) = rest.find("{}") {
        out.push_str(&rest[..at]);
        for b in values.next().map(String::as_bytes).unwrap_or_default() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(*b as char),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    out
}

/// The future of one [`get_json`] call.
pub type HttpCall<D, T> = Pin<Box<dyn Future<Output = Result<(D, T), HttpError>> + Send>>;

/// A function that `GET`s `template` filled with `values(record)` ([`fill`])
/// and decodes the JSON body as `T`: the record with its answer, or an
/// [`HttpError`] (a status that is not 2xx is one).
pub fn get_json<D, T>(
    template: &str,
    values: impl Fn(&D) -> Vec<String> + Send + Sync + 'static,
) -> impl Fn(D) -> HttpCall<D, T> + Send + Sync + 'static
where
    D: Send + 'static,
    T: DeserializeOwned + Send + 'static,
{
    let template = template.to_owned();
    move |record: D| {
        let url = fill(&template, &values(&record));
        Box::pin(async move {
            let response =
                client().get(&url).send().await.map_err(|source| HttpError::Request { url: url.clone(), source })?;
            let status = response.status();
            if !status.is_success() {
                return Err(HttpError::Status { url, status: status.as_u16() });
            }
            let body = response.bytes().await.map_err(|source| HttpError::Request { url: url.clone(), source })?;
            let answer = serde_json::from_slice(&body)
                .map_err(|e| HttpError::Body { url: url.clone(), reason: e.to_string() })?;
            Ok((record, answer))
        })
    }
}
