//! E2B wire details that need no network: Connect-protocol envelopes, envd process events,
//! signal names, and RFC 3339 timestamps.

use super::loose;
use serde::Deserialize;
use std::io::{self, Read};

/// Envelope flag of the end-stream message.
pub const END_STREAM: u8 = 0x02;

/// Frames one message as a Connect streaming envelope (flags, 4-byte big-endian length, payload).
pub fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads the next envelope: `Ok(None)` at a clean end of input, an error on a cut frame.
pub fn read_envelope(r: &mut impl Read, max_len: usize) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < 5 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stream cut inside an envelope header")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > max_len {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("envelope of {len} bytes is over the {max_len} byte limit")));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// One event of a `process.Process/Start` stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// The process started with this pid.
    Start(u32),
    /// Output on stdout.
    Stdout(Vec<u8>),
    /// Output on stderr.
    Stderr(Vec<u8>),
    /// The process ended.
    End {
        /// Exit code as envd reports it (-1 when killed by a signal).
        exit_code: i32,
        /// `exit status 0`, `signal: killed`, ...
        status: String,
    },
    /// Keepalive, or anything this client does not use.
    Other,
}

/// A Start/Connect response message: `{"event": {...}}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EventMessage {
    #[serde(deserialize_with = "loose::present")]
    event: Option<EventBody>,
}

/// The event, one of `start`, `data`, `end` or `keepalive` (the first present one counts, in
/// that order; a present key counts whatever its value).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EventBody {
    #[serde(deserialize_with = "loose::present")]
    start: Option<StartEvent>,
    #[serde(deserialize_with = "loose::present")]
    data: Option<DataEvent>,
    #[serde(deserialize_with = "loose::present")]
    end: Option<EndEvent>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartEvent {
    #[serde(deserialize_with = "loose::unsigned")]
    pid: Option<u64>,
}

/// Output, base64-encoded; stdout wins when both are there.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DataEvent {
    #[serde(deserialize_with = "loose::string")]
    stdout: Option<String>,
    #[serde(deserialize_with = "loose::string")]
    stderr: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EndEvent {
    #[serde(rename = "exitCode", deserialize_with = "loose::signed")]
    exit_code: Option<i64>,
    #[serde(deserialize_with = "loose::string")]
    status: Option<String>,
}

/// Parses the JSON payload of one Start/Connect response message: `None` when it is not a JSON
/// object with an `event`, or its output is not valid base64. Missing or mistyped fields read
/// as absent (pid 0, exit code 0, empty status); an event of no known kind is `Other`.
pub fn process_event(payload: &[u8]) -> Option<ProcessEvent> {
    let event = loose::parse_object::<EventMessage>(payload)?.event?;
    if let Some(start) = event.start {
        return Some(ProcessEvent::Start(start.pid.unwrap_or(0) as u32));
    }
    if let Some(data) = event.data {
        if let Some(s) = data.stdout {
            return Some(ProcessEvent::Stdout(crate::base64::decode(&s)?));
        }
        if let Some(s) = data.stderr {
            return Some(ProcessEvent::Stderr(crate::base64::decode(&s)?));
        }
        return Some(ProcessEvent::Other);
    }
    if let Some(end) = event.end {
        let exit_code = end.exit_code.unwrap_or(0) as i32;
        return Some(ProcessEvent::End { exit_code, status: end.status.unwrap_or_default() });
    }
    Some(ProcessEvent::Other)
}

/// The exit code this server reports for an envd end event: the code, or 128 + signal number.
pub fn exit_code(code: i32, status: &str) -> i32 {
    let Some(name) = status.strip_prefix("signal: ") else { return code };
    let n = match name {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "aborted" => 6,
        "killed" => 9,
        "segmentation fault" => 11,
        "broken pipe" => 13,
        "alarm clock" => 14,
        "terminated" => 15,
        _ => return if code < 0 { 128 + 9 } else { code },
    };
    128 + n
}

/// Parses an RFC 3339 timestamp (`2026-12-02T16:40:18.123Z`, `...+01:00`) to Unix seconds.
/// Strict: every field is digits within its range, and nothing may follow the offset.
pub fn rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>, max: i64| -> Option<i64> {
        let digits = s.get(r)?;
        if !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        digits.parse::<i64>().ok().filter(|n| *n <= max)
    };
    let (y, mo, d) = (num(0..4, 9999)?, num(5..7, 12)?, num(8..10, 31)?);
    let (h, mi, se) = (num(11..13, 23)?, num(14..16, 59)?, num(17..19, 60)?);
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = match mo {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if y == 0 || mo == 0 || d == 0 || d > month_days {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            // `+HH:MM` and nothing after it.
            let at = s.len() - rest.len();
            if rest.len() != 6 || b[at + 3] != b':' {
                return None;
            }
            sign * (num(at + 1..at + 3, 23)? * 3600 + num(at + 4..at + 6, 59)? * 60)
        }
    };
    // Days from the civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_cut_frames_are_errors() {
        let mut stream = envelope(0, b"{\"a\":1}");
        stream.extend(envelope(END_STREAM, b"{}"));
        let mut r = &stream[..];
        assert_eq!(read_envelope(&mut r, 100).unwrap(), Some((0, b"{\"a\":1}".to_vec())));
        assert_eq!(read_envelope(&mut r, 100).unwrap(), Some((END_STREAM, b"{}".to_vec())));
        assert_eq!(read_envelope(&mut r, 100).unwrap(), None);
        let cut = &stream[..8];
        assert!(read_envelope(&mut &cut[..], 100).is_err());
        assert!(read_envelope(&mut &stream[..], 3).is_err());
    }

    #[test]
    fn process_events() {
        assert_eq!(process_event(br#"{"event":{"start":{"pid":42}}}"#), Some(ProcessEvent::Start(42)));
        assert_eq!(process_event(br#"{"event":{"data":{"stdout":"aGk="}}}"#), Some(ProcessEvent::Stdout(b"hi".to_vec())));
        assert_eq!(process_event(br#"{"event":{"data":{"stderr":"eA=="}}}"#), Some(ProcessEvent::Stderr(b"x".to_vec())));
        assert_eq!(
            process_event(br#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#),
            Some(ProcessEvent::End { exit_code: 0, status: "exit status 0".into() })
        );
        assert_eq!(process_event(br#"{"event":{"keepalive":{}}}"#), Some(ProcessEvent::Other));
        assert_eq!(process_event(b"nope"), None);
    }

    #[test]
    fn process_events_with_extra_or_odd_fields() {
        assert_eq!(process_event(br#"{"event":{"start":{"pid":42,"cmdId":"x"},"extra":1},"other":[1,2]}"#), Some(ProcessEvent::Start(42)));
        assert_eq!(
            process_event(br#"{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed","error":"x"}}}"#),
            Some(ProcessEvent::End { exit_code: -1, status: "signal: killed".into() })
        );
        assert_eq!(
            process_event(br#"{"event":{"data":{"stdout":5,"stderr":"eA==","pty":"eQ=="}}}"#),
            Some(ProcessEvent::Stderr(b"x".to_vec()))
        );
        assert_eq!(process_event(br#"{"event":{"data":{"pty":"eQ=="}}}"#), Some(ProcessEvent::Other));
        assert_eq!(process_event(br#"{"event":{"start":null}}"#), Some(ProcessEvent::Start(0)));
        assert_eq!(process_event(br#"{"event":{"start":{"pid":"7"}}}"#), Some(ProcessEvent::Start(0)));
        assert_eq!(process_event(br#"{"event":null}"#), Some(ProcessEvent::Other));
        assert_eq!(process_event(br#"{"event":{"data":{"stdout":"%%%"}}}"#), None);
        assert_eq!(process_event(br#"{"noevent":{}}"#), None);
        assert_eq!(process_event(br#"[{"event":{}}]"#), None);
    }

    #[test]
    fn exit_codes_and_times() {
        assert_eq!(exit_code(3, "exit status 3"), 3);
        assert_eq!(exit_code(-1, "signal: killed"), 137);
        assert_eq!(exit_code(-1, "signal: terminated"), 143);
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339("2026-12-02T16:40:18.123456Z"), Some(1_796_229_618));
        assert_eq!(rfc3339("2026-12-02T17:40:18+01:00"), Some(1_796_229_618));
        assert_eq!(rfc3339("2024-02-29T00:00:00Z"), Some(1_709_164_800));
        assert_eq!(rfc3339("garbage"), None);
        // Found by fuzzing: signs inside fields, out-of-range fields and trailing bytes passed.
        for bad in [
            "2026-+1-02T16:40:18Z",
            "2026-13-02T16:40:18Z",
            "2026-12-00T16:40:18Z",
            "2026-02-29T16:40:18Z",
            "0000-12-02T16:40:18Z",
            "2026-12-02T24:40:18Z",
            "2026-12-02T16:40:18.Z",
            "2026-12-02T16:40:18+01:00x",
            "2026-12-02T16:40:18+0100",
            "2026-12-02T16:40:18+-1:00",
            "2026-12-02T16:40:18Zjunk",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
    }
}
