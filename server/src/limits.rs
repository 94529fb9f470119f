//! Who may call and how much they may send: the API key (compared in constant time) and the
//! request size cap.

use super::error::ApiError;
use super::AppState;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The largest request body by default: far more than a full context of text.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// Whether `given` is the key. The comparison takes the same time wherever the first
/// difference lies (only the length can show).
pub fn key_matches(expected: &str, given: &str) -> bool {
    expected.as_bytes().ct_eq(given.as_bytes()).into()
}

/// Middleware: with `--api-key`, requests must carry `Authorization: Bearer KEY`.
pub async fn require_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = &state.api_key else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if key_matches(expected, given.trim()) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_key_matches() {
        assert!(key_matches("sk-abc", "sk-abc"));
        assert!(!key_matches("sk-abc", "sk-abd"));
        assert!(!key_matches("sk-abc", "sk-ab"));
        assert!(!key_matches("sk-abc", ""));
    }
}
