//! One HTTP exchange with E2B as the provider sees it: the finished reply (status and bounded
//! body), the `{code, message}` error body both the control plane and envd send, and transport
//! failures mapped to provider errors.
//!
//! ureq is configured never to turn an HTTP status into an error, so error bodies are kept and
//! every caller decides what a status means.

use super::connection;
use super::loose;
use crate::provider::ProviderError;
use serde::Deserialize;
use std::time::{Duration, Instant};

/// A finished HTTP exchange: status and (bounded) body.
pub(super) struct Reply {
    /// HTTP status.
    pub status: u16,
    /// The body, cut at the caller's limit.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body read as an error answer.
    pub fn error(&self) -> ErrorBody {
        loose::parse(&self.body)
    }

    /// The `message` of an error body, else the start of the raw text; what a redirect is.
    pub fn message(&self) -> String {
        if (300..400).contains(&self.status) {
            return "a redirect, which sandbox-mcp does not follow".into();
        }
        self.error().message_or(&self.body)
    }
}

/// An error answer: `{"code": "...", "message": "..."}` (both optional).
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub(super) struct ErrorBody {
    /// Connect error code (`not_found`, `unauthenticated`, ...) or the control plane's code.
    #[serde(deserialize_with = "loose::string")]
    pub code: Option<String>,
    /// Human-readable explanation.
    #[serde(deserialize_with = "loose::string")]
    pub message: Option<String>,
}

impl ErrorBody {
    /// The message (its first 300 characters), or the first 300 bytes of `raw` when there is
    /// none: a sandbox's envd chooses it, and the model reads it.
    fn message_or(self, raw: &[u8]) -> String {
        match self.message {
            Some(m) if m.chars().count() > 300 => format!("{}...", m.chars().take(300).collect::<String>()),
            Some(m) => m,
            None => String::from_utf8_lossy(&raw[..raw.len().min(300)]).trim().to_string(),
        }
    }
}

/// Whether a transport error happened before the request could have reached the server: name
/// resolution, the TCP connection and the TLS handshake (marked by `connection`), or a URL that
/// could not be used at all.
pub(super) fn before_sending(err: &ureq::Error) -> bool {
    use ureq::{Error, Timeout};
    connection::not_sent(err).is_some()
        || matches!(
            err,
            Error::HostNotFound | Error::ConnectionFailed | Error::BadUri(_) | Error::Timeout(Timeout::Resolve | Timeout::Connect)
        )
        || matches!(err, Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// Maps a transport error of `what`: unreachable before sending, a timeout, or sent with its
/// answer lost (the request may have been applied).
pub(super) fn transport_error(what: &str, err: &ureq::Error, timeout: Duration) -> ProviderError {
    if before_sending(err) {
        let why = match connection::not_sent(err) {
            Some(n) => n.to_string(),
            None => err.to_string(),
        };
        ProviderError::Unavailable(format!(
            "cannot reach E2B for {what}: {why}; nothing was sent. Check the network and E2B_DOMAIN/E2B_API_URL"
        ))
    } else if matches!(err, ureq::Error::Timeout(_)) {
        ProviderError::Timeout { what: what.to_string(), after: timeout }
    } else {
        ProviderError::Unconfirmed { what: what.to_string(), detail: err.to_string() }
    }
}

/// The timeout of one request: the configured request timeout, cut to what is left before
/// `deadline` (at least 1 ms).
pub(super) fn timeout_for(request_timeout: Duration, deadline: Instant) -> Duration {
    request_timeout.min(deadline.saturating_duration_since(Instant::now())).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Reply {
        Reply { status, body: body.as_bytes().to_vec() }
    }

    #[test]
    fn error_bodies() {
        let minimal = reply(404, r#"{"code":404,"message":"sandbox not found"}"#);
        assert_eq!(minimal.error(), ErrorBody { code: None, message: Some("sandbox not found".into()) });
        assert_eq!(minimal.message(), "sandbox not found");
        let extra = reply(400, r#"{"code":"invalid_argument","message":"bad path","details":[{"type":"x","value":"eQ=="}]}"#);
        assert_eq!(extra.error(), ErrorBody { code: Some("invalid_argument".into()), message: Some("bad path".into()) });
        assert_eq!(reply(200, "{}").error(), ErrorBody::default());
    }

    #[test]
    fn a_body_without_a_message_is_quoted() {
        assert_eq!(reply(502, "  The sandbox was not found\n").message(), "The sandbox was not found");
        assert_eq!(reply(500, r#"{"code":"internal"}"#).message(), r#"{"code":"internal"}"#);
        assert_eq!(reply(500, &"x".repeat(400)).message().len(), 300);
    }

    /// A message is cut, and a redirect says what it is (found by a review: a 15 MiB message
    /// reached the model whole).
    #[test]
    fn long_messages_are_cut_and_redirects_named() {
        let long = format!(r#"{{"code":"internal","message":"{}"}}"#, "é".repeat(100_000));
        assert_eq!(reply(500, &long).message().chars().count(), 303);
        assert!(reply(302, "").message().contains("redirect"));
    }
}
