//! The chat page at `/`: static files compiled into the binary (no install, no build step,
//! works offline), served with a Content-Security-Policy that allows only these files.
//!
//! The files are public, with or without `--api-key`: they hold nothing but the page's code.
//! Every API call the page makes carries the key, which it asks for once and keeps in the
//! tab's sessionStorage (docs/serve.md, "The chat page").

use super::error::ApiError;
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// Only the page's own files may run, style or be fetched; no inline script, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The page's files: name (under `/page/`), content type, contents.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("style.css"),
    ),
    ("api.js", JS, include_str!("api.js")),
    ("storage.js", JS, include_str!("storage.js")),
    ("markdown.js", JS, include_str!("markdown.js")),
    ("chat.js", JS, include_str!("chat.js")),
    ("app.js", JS, include_str!("app.js")),
];

const JS: &str = "text/javascript; charset=utf-8";

/// `body` as `content_type`, with the page's security headers.
fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            // Revalidated on each load, so a new binary's page is never mixed with an old one's.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`.
pub async fn index() -> Response {
    file("text/html; charset=utf-8", include_str!("index.html"))
}

/// `GET /page/{name}`: one of [`ASSETS`], else 404.
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => file(content_type, body),
        None => ApiError::not_found("this page file").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file the HTML loads (and the modules those import) is served, each served file is
    /// used, and the HTML has no inline script or style (the CSP would block it).
    #[test]
    fn the_html_loads_only_served_files_and_nothing_inline() {
        let html = include_str!("index.html");
        let mut named = Vec::new();
        for attr in ["src=\"/page/", "href=\"/page/"] {
            named.extend(
                html.split(attr)
                    .skip(1)
                    .map(|p| p.split('"').next().unwrap_or("")),
            );
        }
        for (_, _, body) in ASSETS {
            named.extend(
                body.split("from \"./")
                    .skip(1)
                    .map(|p| p.split('"').next().unwrap_or("")),
            );
        }
        for name in &named {
            assert!(
                ASSETS.iter().any(|(n, _, _)| n == name),
                "{name} not served"
            );
        }
        for (name, _, _) in ASSETS {
            assert!(
                named.contains(name),
                "{name} is served but nothing loads it"
            );
        }
        assert!(!html.contains("<script>"), "inline script");
        assert!(!html.contains("style="), "inline style");
        assert!(!html.contains("onclick"), "inline handler");
    }

    /// Model text must never reach the DOM as HTML.
    #[test]
    fn no_script_inserts_html() {
        for (name, _, body) in ASSETS {
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ] {
                assert!(!body.contains(sink), "{name} uses {sink}");
            }
        }
    }
}
