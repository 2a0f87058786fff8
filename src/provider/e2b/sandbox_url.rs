//! Where a sandbox's ports are reached (`E2B_SANDBOX_URL`): E2B's own host-per-port form on
//! `E2B_DOMAIN`, one fixed URL for every sandbox (the edge routes by the `E2b-Sandbox-Id`
//! header), or a template with `{sandbox_id}`, `{port}` and optionally `{domain}` in it, which
//! serves self-hosted and E2B-compatible platforms: a custom domain, plain `http`, and path-style
//! routing where wildcard DNS is not available.
//!
//! Examples: `https://{port}-{sandbox_id}.example.com`, `http://10.0.0.5:3000/proxy/{sandbox_id}/{port}`.

use std::fmt;

/// envd's port.
pub(super) const ENVD_PORT: u16 = 49983;

/// Domains whose envd is reached through the shared `sandbox.<domain>` host.
const SHARED_HOST_DOMAINS: &[&str] =
    &["e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev", "e2b-juliett.dev", "foxtrot-2.e2b.dev"];

/// A valid example of each form, for error messages.
pub const EXAMPLES: &str =
    "a fixed URL such as http://10.0.0.5:3000, or a template such as https://{port}-{sandbox_id}.example.com or http://10.0.0.5:3000/proxy/{sandbox_id}/{port}";

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text.
    Text(String),
    /// `{sandbox_id}`.
    SandboxId,
    /// `{port}`.
    Port,
    /// `{domain}`: the sandbox's domain as the control plane said, else `E2B_DOMAIN`.
    Domain,
}

/// How sandbox URLs are built.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SandboxUrl {
    /// E2B's own: `https://{port}-{sandbox_id}.{domain}` (envd on E2B's shared-host domains
    /// through `https://sandbox.{domain}`).
    #[default]
    Platform,
    /// One URL for every sandbox and port (the edge routes by headers); ports cannot be addressed.
    Fixed(String),
    /// A template with `{sandbox_id}` and `{port}`.
    Template(Vec<Piece>),
}

/// Why a template was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTemplate(pub String);

impl fmt::Display for BadTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl SandboxUrl {
    /// Parses the option's value (no I/O).
    pub fn parse(text: &str) -> Result<SandboxUrl, BadTemplate> {
        let text = text.trim();
        let bad = |why: &str| BadTemplate(format!("{why}; use {EXAMPLES}"));
        let rest = text
            .strip_prefix("https://")
            .or_else(|| text.strip_prefix("http://"))
            .ok_or_else(|| bad("it must start with http:// or https://"))?;
        if rest.is_empty() || rest.starts_with('/') || rest.starts_with('{') && rest.len() < 3 {
            return Err(bad("it has no host"));
        }
        if text.contains(['?', '#']) || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("it must not contain a query, a fragment, spaces or control characters"));
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            match c {
                '{' => {
                    let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    let piece = match name.as_str() {
                        "sandbox_id" => Piece::SandboxId,
                        "port" => Piece::Port,
                        "domain" => Piece::Domain,
                        _ => {
                            return Err(bad(&format!(
                            "{{{name}}} is not a placeholder (they are {{sandbox_id}}, {{port}} and {{domain}}), or a brace is unclosed"
                        )))
                        }
                    };
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(piece);
                }
                '}' => return Err(bad("it has a '}' without its '{'")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        let has = |p: &Piece| pieces.contains(p);
        match (has(&Piece::SandboxId), has(&Piece::Port)) {
            (false, false) if !has(&Piece::Domain) => Ok(SandboxUrl::Fixed(text.trim_end_matches('/').to_string())),
            (true, true) => {
                // Request paths are appended with their own '/'.
                if let Some(Piece::Text(last)) = pieces.last_mut() {
                    let trimmed = last.trim_end_matches('/').len();
                    last.truncate(trimmed);
                    if last.is_empty() {
                        pieces.pop();
                    }
                }
                Ok(SandboxUrl::Template(pieces))
            }
            _ => Err(bad("a template needs both {sandbox_id} and {port}")),
        }
    }

    fn fill(pieces: &[Piece], id: &str, port: u16, domain: &str) -> String {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.clone(),
                Piece::SandboxId => id.to_string(),
                Piece::Port => port.to_string(),
                Piece::Domain => domain.to_string(),
            })
            .collect()
    }

    /// The base URL of envd in sandbox `id` under `domain` (no trailing slash).
    pub fn envd(&self, id: &str, domain: &str) -> String {
        match self {
            SandboxUrl::Platform if SHARED_HOST_DOMAINS.contains(&domain) => format!("https://sandbox.{domain}"),
            SandboxUrl::Platform => format!("https://{ENVD_PORT}-{id}.{domain}"),
            SandboxUrl::Fixed(u) => u.clone(),
            SandboxUrl::Template(t) => SandboxUrl::fill(t, id, ENVD_PORT, domain),
        }
    }

    /// The URL of TCP `port` of sandbox `id`, or why it cannot be built.
    pub fn port(&self, id: &str, port: u16, domain: &str) -> Result<String, String> {
        match self {
            SandboxUrl::Platform => Ok(format!("https://{port}-{id}.{domain}")),
            SandboxUrl::Fixed(u) => Err(format!(
                "E2B_SANDBOX_URL is the fixed URL {u}, which reaches envd only; to reach other ports, restart the server with a template such as https://{{port}}-{{sandbox_id}}.example.com"
            )),
            SandboxUrl::Template(t) => Ok(SandboxUrl::fill(t, id, port, domain)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platform_form() {
        let u = SandboxUrl::default();
        assert_eq!(u.envd("i1", "e2b.app"), "https://sandbox.e2b.app");
        assert_eq!(u.envd("i1", "e2b.example.com"), "https://49983-i1.e2b.example.com");
        assert_eq!(u.port("i1", 8080, "e2b.app").unwrap(), "https://8080-i1.e2b.app");
    }

    #[test]
    fn fixed_urls_reach_envd_only() {
        let u = SandboxUrl::parse("http://127.0.0.1:3000/").unwrap();
        assert_eq!(u, SandboxUrl::Fixed("http://127.0.0.1:3000".into()));
        assert_eq!(u.envd("i1", "d"), "http://127.0.0.1:3000");
        assert!(u.port("i1", 80, "d").unwrap_err().contains("{port}-{sandbox_id}"));
    }

    #[test]
    fn host_and_path_templates() {
        let host = SandboxUrl::parse("http://{port}-{sandbox_id}.{domain}:8080").unwrap();
        assert_eq!(host.envd("i1", "sb.test"), "http://49983-i1.sb.test:8080");
        assert_eq!(host.port("i1", 3000, "sb.test").unwrap(), "http://3000-i1.sb.test:8080");
        let path = SandboxUrl::parse("http://10.0.0.5:3000/proxy/{sandbox_id}/{port}/").unwrap();
        assert_eq!(path.envd("i1", "d"), "http://10.0.0.5:3000/proxy/i1/49983");
        assert_eq!(path.port("i1", 8080, "d").unwrap(), "http://10.0.0.5:3000/proxy/i1/8080");
    }

    #[test]
    fn bad_templates_say_why_and_show_examples() {
        for (bad, why) in [
            ("ftp://x/{sandbox_id}/{port}", "http://"),
            ("10.0.0.5:3000", "http://"),
            ("http://", "no host"),
            ("http://x/{sandbox}/{port}", "{sandbox} is not a placeholder"),
            ("http://x/{sandbox_id/{port}", "is not a placeholder"),
            ("http://x/{port}", "both"),
            ("http://{domain}", "both"),
            ("http://x/}{sandbox_id}{port}", "without"),
            ("http://x/{sandbox_id}/{port}?a=b", "query"),
            ("http://x/{sandbox_id} /{port}", "spaces"),
        ] {
            let err = SandboxUrl::parse(bad).unwrap_err().0;
            assert!(err.contains(why) && err.contains(EXAMPLES), "{bad}: {err}");
        }
    }
}
