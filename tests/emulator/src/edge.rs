//! How the emulated edge proxy finds the sandbox a request is for ([`Routing`]): by the
//! `E2b-Sandbox-Id` header (E2B's shared host; a `<port>-<id>.<domain>` Host also works), by the
//! Host alone (host-style: a custom domain with wildcard DNS, or a client that sends its requests
//! through this emulator as its HTTP proxy), or by a `/proxy/<id>/<port>` path prefix
//! (path-style, for deployments without wildcard DNS). The strict modes ignore the header, so a
//! client that works against them builds its URLs the way the mode says.

use crate::control;
use crate::http::{HttpReply, HttpRequest};

/// The path prefix of path-style routing.
pub const PATH_PREFIX: &str = "/proxy/";

/// How envd requests are routed to sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`), else a `<port>-<id>.<domain>` Host.
    #[default]
    Header,
    /// A `<port>-<id>.<domain>` Host only.
    Host,
    /// `/proxy/<id>/<port>/<envd path>` only.
    Path,
}

impl Routing {
    /// Parses `--routing`.
    pub fn parse(text: &str) -> Result<Routing, String> {
        match text {
            "header" => Ok(Routing::Header),
            "host" => Ok(Routing::Host),
            "path" => Ok(Routing::Path),
            other => Err(format!("--routing: {other:?} is not header, host or path")),
        }
    }
}

/// Rewrites `req` as the edge proxy routes it: in the strict modes the routing headers are
/// replaced by what the Host or the path says (and a path-style prefix is removed). Control-plane
/// and test-API requests pass unchanged.
pub fn route(routing: Routing, req: &mut HttpRequest) -> Result<(), HttpReply> {
    if control::is_control_path(&req.path) || req.path.starts_with("/_emulator/") {
        return Ok(());
    }
    let strip = |req: &mut HttpRequest| {
        req.headers.retain(|(k, _)| !k.eq_ignore_ascii_case("E2b-Sandbox-Id") && !k.eq_ignore_ascii_case("E2b-Sandbox-Port"))
    };
    match routing {
        Routing::Header => Ok(()),
        Routing::Host => {
            strip(req);
            Ok(())
        }
        Routing::Path => {
            strip(req);
            let Some(rest) = req.path.strip_prefix(PATH_PREFIX) else {
                return Err(control::error(404, format!("path-style routing: envd is at {PATH_PREFIX}<sandbox id>/<port>{}", req.path)));
            };
            let mut parts = rest.splitn(3, '/');
            let (id, port, tail) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if id.is_empty() || port.parse::<u16>().is_err() {
                return Err(control::error(404, format!("path-style routing: {} is not {PATH_PREFIX}<sandbox id>/<port>/…", req.path)));
            }
            req.headers.push(("E2b-Sandbox-Id".into(), id.into()));
            req.headers.push(("E2b-Sandbox-Port".into(), port.into()));
            req.path = format!("/{tail}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, headers: &[(&str, &str)]) -> HttpRequest {
        HttpRequest {
            path: path.into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn strict_modes_ignore_the_header() {
        let mut r = req("/health", &[("E2b-Sandbox-Id", "i1"), ("Host", "49983-i2.sb.test")]);
        route(Routing::Host, &mut r).unwrap();
        assert_eq!((r.header("E2b-Sandbox-Id"), r.header("Host")), (None, Some("49983-i2.sb.test")));
        let mut r = req("/proxy/i3/49983/process.Process/Start", &[("E2b-Sandbox-Id", "i1")]);
        route(Routing::Path, &mut r).unwrap();
        assert_eq!(
            (r.path.as_str(), r.header("E2b-Sandbox-Id"), r.header("E2b-Sandbox-Port")),
            ("/process.Process/Start", Some("i3"), Some("49983"))
        );
        assert!(route(Routing::Path, &mut req("/health", &[("E2b-Sandbox-Id", "i1")])).is_err());
        assert!(route(Routing::Path, &mut req("/proxy/i1/x/health", &[])).is_err());
        let mut r = req("/sandboxes/i1/timeout", &[]);
        route(Routing::Path, &mut r).unwrap();
        assert_eq!(r.path, "/sandboxes/i1/timeout");
    }
}
