//! The network policy of a sandbox: `false` (no egress), `true` (any public destination) or
//! `{"allow": [...], "deny": [...]}` of domain names and `*.` wildcards; its validation (the
//! bad-input rules of docs/contract.md) and the decision for one destination name.

use serde_json::{json, Value};
use std::net::IpAddr;

/// At most this many entries in `allow` and `deny` together.
pub const MAX_ENTRIES: usize = crate::limits::NETWORK_POLICY_MAX_ENTRIES;

/// At most this many bytes of JSON for one policy.
pub const MAX_BYTES: usize = crate::limits::NETWORK_POLICY_MAX_BYTES;

/// The network policy of one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    /// No egress at all.
    #[default]
    Off,
    /// Any public destination.
    Any,
    /// Public destinations the rules allow.
    Rules(Rules),
}

/// Domain rules: `deny` wins; with `allow` given, only names it matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Names allowed; `None`: every name not denied.
    pub allow: Option<Vec<String>>,
    /// Names refused.
    pub deny: Vec<String>,
}

/// Why a destination was refused: the reason, said so a model can act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The rule or class that refused it.
    pub reason: String,
    /// Whether a policy change could allow it (false for the never-the-host ranges).
    pub by_policy: bool,
}

impl Network {
    /// Reads a policy from a tool argument or from metadata; the error names the bad entry.
    pub fn from_json(value: &Value) -> Result<Network, String> {
        match value {
            Value::Bool(false) => Ok(Network::Off),
            Value::Bool(true) => Ok(Network::Any),
            Value::Object(obj) => {
                let size = serde_json::to_string(value).map(|s| s.len()).unwrap_or(usize::MAX);
                if size > MAX_BYTES {
                    return Err(format!("is {size} bytes of JSON; a policy may have at most {MAX_BYTES}"));
                }
                if let Some(other) = obj.keys().find(|k| *k != "allow" && *k != "deny") {
                    return Err(format!(
                        "has an unknown field {:?}; a policy has only allow and deny (lists of domain names)",
                        clip(other)
                    ));
                }
                let list = |field: &str| -> Result<Option<Vec<String>>, String> {
                    match obj.get(field) {
                        None | Some(Value::Null) => Ok(None),
                        Some(Value::Array(items)) => items
                            .iter()
                            .map(|item| match item {
                                Value::String(s) => check_pattern(s).map_err(|why| format!("{field} entry {:?} {why}", clip(s))),
                                _ => Err(format!("{field} entries must be strings (domain names)")),
                            })
                            .collect::<Result<Vec<_>, _>>()
                            .map(Some),
                        Some(_) => Err(format!("field {field} must be a list of domain names")),
                    }
                };
                let allow = list("allow")?;
                let deny = list("deny")?.unwrap_or_default();
                let count = allow.as_ref().map_or(0, Vec::len) + deny.len();
                if count > MAX_ENTRIES {
                    return Err(format!("has {count} entries; a policy may have at most {MAX_ENTRIES}"));
                }
                Ok(Network::Rules(Rules { allow, deny }))
            }
            _ => Err("must be true, false, or an object {\"allow\": [...], \"deny\": [...]} of domain names".into()),
        }
    }

    /// The policy as tool results echo it and metadata stores it.
    pub fn to_json(&self) -> Value {
        match self {
            Network::Off => json!(false),
            Network::Any => json!(true),
            Network::Rules(rules) => {
                let mut obj = serde_json::Map::new();
                if let Some(allow) = &rules.allow {
                    obj.insert("allow".into(), json!(allow));
                }
                obj.insert("deny".into(), json!(rules.deny));
                Value::Object(obj)
            }
        }
    }

    /// Whether any destination may be reached.
    pub fn reaches_out(&self) -> bool {
        !matches!(self, Network::Off)
    }

    /// Whether the policy lets the sandbox reach `host` (a lowercase name or an IP literal); the
    /// address a name resolves to is checked separately ([`super::address`]).
    pub fn decide(&self, host: &str) -> Result<(), Refusal> {
        let refuse = |reason: String| Err(Refusal { reason, by_policy: true });
        match self {
            Network::Off => refuse("the sandbox's network is off (network: false)".into()),
            Network::Any => Ok(()),
            Network::Rules(rules) => {
                let is_ip = host.parse::<IpAddr>().is_ok();
                if !is_ip {
                    if let Some(rule) = rules.deny.iter().find(|p| matches(p, host)) {
                        return refuse(format!("denied by the deny rule {rule:?}"));
                    }
                }
                match &rules.allow {
                    None => Ok(()),
                    Some(allow) if !is_ip && allow.iter().any(|p| matches(p, host)) => Ok(()),
                    Some(_) if is_ip => refuse("an IP address matches no name of the allow list".into()),
                    Some(_) => refuse("no entry of the allow list matches it".into()),
                }
            }
        }
    }
}

impl serde::Serialize for Network {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Network, D::Error> {
        let value = Value::deserialize(d)?;
        Network::from_json(&value).map_err(serde::de::Error::custom)
    }
}

/// Whether pattern `p` (a name, or `*.` and a name) matches lowercase name `host`.
fn matches(p: &str, host: &str) -> bool {
    match p.strip_prefix("*.") {
        Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(suffix) && host[..host.len() - suffix.len()].ends_with('.'),
        None => p == host,
    }
}

/// Checks one policy entry and returns it normalized (lowercase, no trailing dot).
fn check_pattern(entry: &str) -> Result<String, String> {
    let lower = entry.trim_end_matches('.').to_ascii_lowercase();
    let name = lower.strip_prefix("*.").unwrap_or(&lower);
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Err("is an IP address; a policy takes domain names (exact, or *. and a name)".into());
    }
    check_name(name)?;
    if ends_numeric(name) {
        return Err("ends in a numeric label, as an IP address does; a policy takes domain names".into());
    }
    Ok(lower)
}

/// Whether `name`'s last label is a number (decimal digits, or `0x` and hex digits): no domain
/// name ends so, while resolvers read such a name as an IPv4 address in a shorthand notation
/// (`127.1`, `2130706433`, `0x7f.1` all mean 127.0.0.1).
pub fn ends_numeric(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or_default();
    let hex = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X"));
    match hex {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Checks a domain name: labels of letters, digits, `-` and `_`, 1 to 63 bytes each, 253 in all.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("is not a domain name (1 to 253 characters)".into());
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err("is not a domain name (labels of letters, digits and -, with *. only in front)".into());
        }
    }
    Ok(())
}

/// At most 60 characters of `s`, for messages.
fn clip(s: &str) -> String {
    if s.chars().count() <= 60 {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(60).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(v: Value) -> Result<Network, String> {
        Network::from_json(&v)
    }

    #[test]
    fn booleans_and_rules_round_trip() {
        assert_eq!(policy(json!(false)), Ok(Network::Off));
        assert_eq!(policy(json!(true)), Ok(Network::Any));
        let p = policy(json!({"allow": ["GitHub.com.", "*.githubusercontent.com"], "deny": ["evil.github.com"]})).unwrap();
        assert_eq!(p.to_json(), json!({"allow": ["github.com", "*.githubusercontent.com"], "deny": ["evil.github.com"]}));
        assert_eq!(policy(p.to_json()), Ok(p));
    }

    #[test]
    fn decisions_follow_the_rules() {
        let p = policy(json!({"allow": ["github.com", "*.githubusercontent.com"], "deny": ["bad.githubusercontent.com"]})).unwrap();
        assert!(p.decide("github.com").is_ok());
        assert!(p.decide("raw.githubusercontent.com").is_ok());
        assert!(p.decide("a.b.githubusercontent.com").is_ok());
        assert!(p.decide("githubusercontent.com").is_err(), "a wildcard does not match its apex");
        assert!(p.decide("evilgithubusercontent.com").is_err());
        assert!(p.decide("api.github.com").is_err());
        assert!(p.decide("bad.githubusercontent.com").unwrap_err().reason.contains("bad.githubusercontent.com"));
        assert!(p.decide("140.82.112.3").is_err());
        let deny_only = policy(json!({"deny": ["*.test"]})).unwrap();
        assert!(deny_only.decide("x.test").is_err());
        assert!(deny_only.decide("example.org").is_ok());
        assert!(deny_only.decide("1.1.1.1").is_ok());
        assert!(Network::Off.decide("example.org").unwrap_err().reason.contains("network: false"));
        assert!(Network::Any.decide("example.org").is_ok());
    }

    #[test]
    fn bad_policies_name_the_entry() {
        let err = policy(json!({"allow": ["ok.test", "10.0.0.1"]})).unwrap_err();
        assert!(err.contains("\"10.0.0.1\"") && err.contains("IP address"), "{err}");
        assert!(policy(json!({"allow": ["[::1]"]})).unwrap_err().contains("IP address"));
        assert!(policy(json!({"allow": ["*.1.2.3"]})).unwrap_err().contains("numeric"));
        let err = policy(json!({"deny": ["bad name.test"]})).unwrap_err();
        assert!(err.contains("deny entry \"bad name.test\""), "{err}");
        assert!(policy(json!({"allow": ["a.*.test"]})).is_err());
        assert!(policy(json!({"allow": ["*"]})).is_err());
        assert!(policy(json!({"allow": [""]})).is_err());
        assert!(policy(json!({"allow": [1]})).unwrap_err().contains("strings"));
        assert!(policy(json!({"allow": "x.test"})).unwrap_err().contains("list"));
        assert!(policy(json!({"allowed": []})).unwrap_err().contains("unknown field"));
        assert!(policy(json!("yes")).is_err());
        assert!(policy(json!(1)).is_err());
        let many: Vec<String> = (0..257).map(|i| format!("h{i}.t")).collect();
        assert!(policy(json!({"allow": many})).unwrap_err().contains("257 entries"));
        let long: Vec<String> = (0..80).map(|i| format!("{}{i}.test", "x".repeat(50))).collect();
        assert!(policy(json!({"deny": long})).unwrap_err().contains("bytes"));
        assert!(policy(json!({"allow": [format!("{}.test", "a".repeat(64))]})).is_err());
    }
}
