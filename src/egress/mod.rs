//! Egress by policy: a sandbox's network leaves only through a proxy that runs on the host side
//! for that sandbox and enforces its [`Network`] policy, never reaching the host or private
//! ranges ([`address`]), directly or through an operator's parent proxy ([`Upstream`]). Knows
//! nothing of namespaces: whoever owns a sandbox hands [`proxy::serve`] a listening socket that
//! only the sandbox can reach (see ARCHITECTURE.md, "Egress").

pub mod address;
pub mod blocks;
pub mod dial;
pub mod policy;
pub mod proxy;
pub mod request;
pub mod socks;

pub use policy::Network;

/// The port of the proxy on a sandbox's own loopback interface (HTTP and SOCKS5 on one port).
pub const PROXY_PORT: u16 = 3128;

/// The proxy variables every command of a sandbox with a proxy gets.
pub fn proxy_env() -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut env = Vec::new();
    for (name, value) in [("HTTP_PROXY", &http), ("HTTPS_PROXY", &http), ("ALL_PROXY", &socks), ("NO_PROXY", &no_proxy)] {
        env.push((name.to_string(), value.clone()));
        env.push((name.to_ascii_lowercase(), value.clone()));
    }
    env
}

/// What the operator decided for every sandbox's proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// The parent HTTP proxy allowed traffic goes through.
    pub upstream: Option<Upstream>,
    /// Whether sandboxes may reach the host's own and private addresses.
    pub host_services: bool,
}

/// The environment variable that carries [`Settings::upstream`] to a sandbox's keeper.
pub const UPSTREAM_VAR: &str = "SANDBOX_MCP_EGRESS_PROXY";

/// The environment variable that carries [`Settings::host_services`] to a sandbox's keeper.
pub const HOST_SERVICES_VAR: &str = "SANDBOX_MCP_EGRESS_ALLOW_HOST_SERVICES";

impl Settings {
    /// The environment that hands these settings to a keeper.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(up) = &self.upstream {
            env.push((UPSTREAM_VAR, up.url.clone()));
        }
        if self.host_services {
            env.push((HOST_SERVICES_VAR, "1".to_string()));
        }
        env
    }

    /// The settings a keeper was handed.
    pub fn from_env() -> Settings {
        let upstream = std::env::var(UPSTREAM_VAR).ok().and_then(|u| Upstream::parse(&u).ok());
        Settings { upstream, host_services: std::env::var(HOST_SERVICES_VAR).is_ok_and(|v| v == "1" || v == "true") }
    }
}

/// A parent HTTP proxy: `http://[user:password@]host:port`.
#[derive(Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The URL as given.
    pub url: String,
    /// Its host (a name or an address).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// `Basic` credentials, when the URL has them.
    pub auth: Option<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        write!(f, "Upstream({}:{})", self.host, self.port)
    }
}

impl Upstream {
    /// Parses `http://[user:password@]host[:port][/]` (port 80 when none is given).
    pub fn parse(url: &str) -> Result<Upstream, String> {
        let rest = url.strip_prefix("http://").ok_or("the egress proxy must be an http:// URL (http://host:port)")?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('#') {
            return Err("the egress proxy URL must be http://[user:password@]host:port, without a path".into());
        }
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((cred, hp)) => (Some(crate::base64::encode(cred.as_bytes())), hp),
            None => (None, rest),
        };
        let (host, port) =
            request::split_host_port(hostport, 80).ok_or("the egress proxy URL must name a host and a port (http://host:port)")?;
        Ok(Upstream { url: url.to_string(), host, port, auth })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let up = Upstream::parse("http://127.0.0.1:3128").unwrap();
        assert_eq!((up.host.as_str(), up.port, up.auth.as_deref()), ("127.0.0.1", 3128, None));
        let up = Upstream::parse("http://u:p@proxy.corp/").unwrap();
        assert_eq!((up.host.as_str(), up.port, up.auth.as_deref()), ("proxy.corp", 80, Some("dTpw")));
        assert!(!format!("{up:?}").contains("dTpw"));
        assert!(Upstream::parse("https://proxy:1").is_err());
        assert!(Upstream::parse("http://proxy:1/path").is_err());
        assert!(Upstream::parse("http://[::1]:8080").is_ok());
        assert!(Upstream::parse("http://proxy:notaport").is_err());
    }
}
