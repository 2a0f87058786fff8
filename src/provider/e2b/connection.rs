//! Connection setup for the E2B agent: ureq's own resolver and connector chain (TCP, then TLS),
//! with every failure they report marked as [`NotSent`].
//!
//! ureq reports a failed name lookup (`getaddrinfo`) or a failed TLS handshake as a plain I/O
//! error, the same kind it reports for a connection lost after the request was written. Only
//! where the error arose tells them apart: name resolution and the connector chain both run
//! before a byte of the request is written, so whatever fails there cannot have reached E2B.
//! `reply::transport_error` reads the mark and answers "cannot reach E2B" instead of "sent but
//! its answer was lost", so that no start is ever reported `unknown` when it cannot have started.

use std::fmt;
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{ConnectionDetails, Connector, DefaultConnector, NextTimeout, Transport};

/// Where a request failed before anything was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Looking up the host name.
    Resolve,
    /// Opening the TCP connection or the TLS handshake.
    Connect,
}

/// A failure of connection setup: the request was not sent.
#[derive(Debug)]
pub(super) struct NotSent {
    /// Where it failed.
    pub stage: Stage,
    /// ureq's own error.
    pub cause: ureq::Error,
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.stage {
            Stage::Resolve => write!(f, "the host name could not be resolved ({})", self.cause),
            Stage::Connect => write!(f, "the connection or its TLS handshake failed ({})", self.cause),
        }
    }
}

impl std::error::Error for NotSent {}

fn mark(stage: Stage, cause: ureq::Error) -> ureq::Error {
    ureq::Error::Other(Box::new(NotSent { stage, cause }))
}

/// The connection-setup failure inside `err`, if that is what it is.
pub(super) fn not_sent(err: &ureq::Error) -> Option<&NotSent> {
    match err {
        ureq::Error::Other(inner) => inner.downcast_ref::<NotSent>(),
        _ => None,
    }
}

/// ureq's default resolver, its failures marked.
#[derive(Debug, Default)]
struct MarkingResolver(DefaultResolver);

impl Resolver for MarkingResolver {
    fn resolve(&self, uri: &Uri, config: &Config, timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        self.0.resolve(uri, config, timeout).map_err(|e| mark(Stage::Resolve, e))
    }
}

/// ureq's default connector chain (TCP, then TLS), its failures marked.
#[derive(Debug, Default)]
struct MarkingConnector(DefaultConnector);

impl Connector<()> for MarkingConnector {
    type Out = Box<dyn Transport>;

    fn connect(&self, details: &ConnectionDetails, chained: Option<()>) -> Result<Option<Self::Out>, ureq::Error> {
        self.0.connect(details, chained).map_err(|e| mark(Stage::Connect, e))
    }
}

/// An agent with `config` whose connection-setup failures are marked [`NotSent`].
pub(super) fn agent(config: Config) -> ureq::Agent {
    ureq::Agent::with_parts(config, MarkingConnector::default(), MarkingResolver::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::thread;
    use std::time::Duration;

    fn test_agent() -> ureq::Agent {
        agent(ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(10))).build())
    }

    /// A loopback listener whose one connection is handled by `serve`.
    fn server(serve: impl FnOnce(std::net::TcpStream) + Send + 'static) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            if let Ok((s, _)) = l.accept() {
                serve(s);
            }
        });
        port
    }

    #[test]
    fn a_name_that_does_not_resolve_is_not_sent() {
        // `.invalid` never resolves (RFC 2606), with or without a DNS server.
        let err = test_agent().post("http://api.sandbox-mcp-test.invalid/sandboxes").send("{}").unwrap_err();
        assert_eq!(not_sent(&err).map(|n| n.stage), Some(Stage::Resolve), "{err}");
    }

    #[test]
    fn a_failed_tls_handshake_is_not_sent() {
        // A plain HTTP server answers the ClientHello with text: the handshake fails.
        let port = server(|mut s| {
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        });
        let err = test_agent().post(&format!("https://127.0.0.1:{port}/sandboxes")).send("{}").unwrap_err();
        assert_eq!(not_sent(&err).map(|n| n.stage), Some(Stage::Connect), "{err}");
        // A peer that hangs up during the handshake.
        let port = server(drop);
        let err = test_agent().post(&format!("https://127.0.0.1:{port}/sandboxes")).send("{}").unwrap_err();
        assert_eq!(not_sent(&err).map(|n| n.stage), Some(Stage::Connect), "{err}");
    }

    #[test]
    fn a_refused_connection_is_not_sent() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let err = test_agent().get(&format!("http://127.0.0.1:{port}/")).call().unwrap_err();
        assert!(not_sent(&err).is_some(), "{err}");
    }

    #[test]
    fn an_answer_lost_after_sending_is_not_marked() {
        // The server reads the request, then hangs up without answering: it may have acted.
        let port = server(|mut s| {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
        });
        let err = test_agent().post(&format!("http://127.0.0.1:{port}/sandboxes")).send("{}").unwrap_err();
        assert!(not_sent(&err).is_none(), "{err}");
    }
}
