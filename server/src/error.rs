//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the status
//! OpenAI gives the same fault.

use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds, for `Retry-After` (queue full, shutting down).
    pub retry_after: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A request that cannot be served as written (400).
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// [`ApiError::invalid`], naming the field at fault.
    pub fn invalid_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param),
            ..ApiError::invalid(message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect API key provided.",
        )
        .with_code("invalid_api_key")
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("{what} not found"),
        )
    }

    /// The queue is full: try again shortly (429, `Retry-After`).
    pub fn busy(queue: usize) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server is busy: {queue} requests are waiting already; retry shortly"),
            )
            .with_code("queue_full")
        }
    }

    /// The server is shutting down or its engine stopped (503).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// Something failed inside the engine (500).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body as serialized (also what a stream sends as its error event).
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        })
        .unwrap_or_default()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A body axum could not read as the request type: bad JSON, a field of the wrong type, the
/// wrong content type, too large.
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let status = rejection.status();
        let message = rejection.body_text();
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(status, "invalid_request_error", message)
                    .with_code("request_too_large")
            }
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                ApiError::new(status, "invalid_request_error", message)
            }
            _ => ApiError::invalid(message).with_code("invalid_json"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_has_openais_four_fields() {
        let e = ApiError::invalid_param("messages", "empty").with_code("empty_messages");
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {"message": "empty", "type": "invalid_request_error",
                "param": "messages", "code": "empty_messages"}})
        );
        let r = ApiError::busy(4).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
