//! The Connect protocol pieces the emulator speaks (JSON codec over HTTP/1.1): envelope framing,
//! error codes with their HTTP statuses, and the end-stream message.
//!
//! An envelope is one flags byte (`0x01` compressed, `0x02` end of stream), a 4-byte big-endian
//! length, then the payload. A server stream is a sequence of envelopes ending with exactly one
//! end-stream envelope whose payload is `{}` or `{"error":{"code","message"}}`.

use serde_json::{json, Value};

/// Flag bit of a compressed envelope (never produced; refused on input).
pub const FLAG_COMPRESSED: u8 = 0x01;

/// Flag bit of the end-stream envelope.
pub const FLAG_END_STREAM: u8 = sandbox_mcp::provider::e2b::wire::END_STREAM;

/// Bytes before an envelope's payload.
pub const HEADER_LEN: usize = 5;

/// Framing is shared with the e2b client.
pub use sandbox_mcp::provider::e2b::wire::envelope;

/// One ordinary stream message.
pub fn message(value: &Value) -> Vec<u8> {
    envelope(0, value.to_string().as_bytes())
}

/// The end-stream envelope: `{}` on success, `{"error":{...}}` otherwise.
pub fn end_stream(error: Option<&ConnectError>) -> Vec<u8> {
    let body = match error {
        None => json!({}),
        Some(err) => json!({ "error": err.to_json() }),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Splits `buf` into whole envelopes `(flags, payload)`. Fails on a truncated envelope.
pub fn decode_all(buf: &[u8]) -> Result<Vec<(u8, &[u8])>, String> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < HEADER_LEN {
            return Err(format!("truncated envelope header: {} of {HEADER_LEN} bytes", rest.len()));
        }
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let body = &rest[HEADER_LEN..];
        if body.len() < len {
            return Err(format!("truncated envelope: announced {len} bytes, got {}", body.len()));
        }
        out.push((flags, &body[..len]));
        rest = &body[len..];
    }
    Ok(out)
}

/// The single request message of a server-streaming call: exactly one uncompressed envelope.
pub fn decode_request(body: &[u8]) -> Result<&[u8], ConnectError> {
    let frames = decode_all(body).map_err(|e| ConnectError::new(Code::InvalidArgument, format!("protocol error: {e}")))?;
    match frames.as_slice() {
        [(flags, _)] if flags & FLAG_COMPRESSED != 0 => {
            Err(ConnectError::new(Code::Internal, "protocol error: received compressed message without a Connect-Content-Encoding"))
        }
        [(flags, _)] if flags & FLAG_END_STREAM != 0 => {
            Err(ConnectError::new(Code::InvalidArgument, "protocol error: request message has the end-stream flag"))
        }
        [(_, payload)] => Ok(payload),
        [] => Err(ConnectError::new(Code::Unimplemented, "unary stream has no messages")),
        _ => Err(ConnectError::new(Code::Unimplemented, "unary stream has multiple messages")),
    }
}

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `canceled`
    Canceled,
    /// `unknown`
    Unknown,
    /// `invalid_argument`
    InvalidArgument,
    /// `deadline_exceeded`
    DeadlineExceeded,
    /// `not_found`
    NotFound,
    /// `already_exists`
    AlreadyExists,
    /// `permission_denied`
    PermissionDenied,
    /// `resource_exhausted`
    ResourceExhausted,
    /// `failed_precondition`
    FailedPrecondition,
    /// `aborted`
    Aborted,
    /// `out_of_range`
    OutOfRange,
    /// `unimplemented`
    Unimplemented,
    /// `internal`
    Internal,
    /// `unavailable`
    Unavailable,
    /// `data_loss`
    DataLoss,
    /// `unauthenticated`
    Unauthenticated,
}

impl Code {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (Connect protocol table).
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }
}

/// A Connect error: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// The message.
    pub message: String,
}

impl ConnectError {
    /// Builds an error.
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError { code, message: message.into() }
    }

    /// `{"code":"<name>","message":...}`, the body of a unary error and of an end-stream error.
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code.as_str(), "message": self.message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_layout() {
        let e = envelope(0, b"{}");
        assert_eq!(e, vec![0, 0, 0, 0, 2, b'{', b'}']);
        let e = envelope(FLAG_END_STREAM, &[7u8; 300]);
        assert_eq!(&e[..5], &[2, 0, 0, 1, 44]);
        assert_eq!(e.len(), 305);
    }

    #[test]
    fn round_trip_and_truncation() {
        let mut buf = message(&json!({"a": 1}));
        buf.extend(end_stream(None));
        let frames = decode_all(&buf).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0], (0, &b"{\"a\":1}"[..]));
        assert_eq!(frames[1], (FLAG_END_STREAM, &b"{}"[..]));
        assert!(decode_all(&buf[..3]).is_err());
        assert!(decode_all(&buf[..buf.len() - 1]).is_err());
        assert_eq!(decode_all(&[]).unwrap(), vec![]);
    }

    #[test]
    fn request_must_be_one_plain_envelope() {
        assert_eq!(decode_request(&envelope(0, b"{\"x\":1}")).unwrap(), b"{\"x\":1}");
        assert_eq!(decode_request(&[]).unwrap_err().code, Code::Unimplemented);
        let mut two = envelope(0, b"{}");
        two.extend(envelope(0, b"{}"));
        assert_eq!(decode_request(&two).unwrap_err().code, Code::Unimplemented);
        assert_eq!(decode_request(&envelope(FLAG_COMPRESSED, b"x")).unwrap_err().code, Code::Internal);
        assert_eq!(decode_request(&[0, 0, 0, 0, 9, b'{']).unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn end_stream_error_shape() {
        let err = ConnectError::new(Code::NotFound, "process with pid 7 not found");
        let frame = end_stream(Some(&err));
        assert_eq!(frame[0], FLAG_END_STREAM);
        let v: Value = serde_json::from_slice(&frame[5..]).unwrap();
        assert_eq!(v, json!({"error": {"code": "not_found", "message": "process with pid 7 not found"}}));
    }

    #[test]
    fn statuses() {
        assert_eq!(Code::NotFound.http_status(), 404);
        assert_eq!(Code::InvalidArgument.http_status(), 400);
        assert_eq!(Code::Unauthenticated.http_status(), 401);
        assert_eq!(Code::Unimplemented.http_status(), 501);
        assert_eq!(Code::DeadlineExceeded.as_str(), "deadline_exceeded");
    }
}
