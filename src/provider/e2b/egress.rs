//! The mapping between a sandbox's network policy and E2B's egress rules: `allow_internet_access`
//! and `network: {allowOut, denyOut}` at creation, `PUT /sandboxes/{id}/network` at run time.
//! E2B's `allowOut` takes domain names (with `*.` wildcards) only together with a `denyOut` of all
//! traffic, and its `denyOut` takes addresses only: a policy with deny names cannot be expressed,
//! and is refused with that reason. [`from_e2b`] is the inverse, which the emulator enforces.

use crate::egress::policy::Rules;
use crate::egress::Network;
use crate::provider::ProviderError;
use serde_json::{json, Value};

/// E2B's name for every IPv4 destination.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The create fields of `network` (`None`: the platform's default, internet access):
/// `allow_internet_access` and, for an allow list, the `network` object.
pub fn create_fields(network: Option<&Network>) -> Result<(bool, Option<Value>), ProviderError> {
    match network {
        None | Some(Network::Any) => Ok((true, None)),
        Some(Network::Off) => Ok((false, None)),
        Some(policy) => Ok((true, Some(rules(policy)?))),
    }
}

/// The `network` object that puts `network` in force (the body of the update call).
pub fn rules(network: &Network) -> Result<Value, ProviderError> {
    match network {
        Network::Any => Ok(json!({})),
        Network::Off => Ok(json!({"denyOut": [ALL_TRAFFIC]})),
        Network::Rules(Rules { deny, .. }) if !deny.is_empty() => Err(ProviderError::Rejected(format!(
            "E2B cannot express this policy: its deny list takes IP addresses and CIDR ranges only, not names like {:?}; \
use an allow list alone (everything else is denied), or the local provider",
            deny[0]
        ))),
        Network::Rules(Rules { allow: None, .. }) => Ok(json!({})),
        Network::Rules(Rules { allow: Some(allow), .. }) => Ok(json!({"allowOut": allow, "denyOut": [ALL_TRAFFIC]})),
    }
}

/// The policy E2B's fields express, for the emulator: `Err` names what it cannot enforce.
pub fn from_e2b(allow_internet_access: Option<bool>, network: Option<&Value>) -> Result<Network, String> {
    let list = |field: &str| -> Result<Vec<String>, String> {
        match network.and_then(|n| n.get(field)) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => {
                items.iter().map(|i| i.as_str().map(str::to_string).ok_or(format!("network.{field} must be a list of strings"))).collect()
            }
            Some(_) => Err(format!("network.{field} must be a list of strings")),
        }
    };
    let (allow, deny) = (list("allowOut")?, list("denyOut")?);
    let denies_all = deny.iter().any(|d| d == ALL_TRAFFIC);
    if deny.iter().any(|d| d != ALL_TRAFFIC) {
        return Err(format!("this emulator enforces denyOut [{ALL_TRAFFIC:?}] only"));
    }
    match (allow_internet_access, allow.is_empty(), denies_all) {
        (Some(false), true, _) | (_, true, true) => Ok(Network::Off),
        (_, true, false) => Ok(Network::Any),
        (_, false, true) => Network::from_json(&json!({"allow": allow})),
        (_, false, false) => Err("allowOut without denyOut [\"0.0.0.0/0\"] allows everything; this emulator refuses it".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_map_to_e2b_rules_and_back() {
        let allow = Network::from_json(&json!({"allow": ["pkgs.test", "*.mirror.test"]})).unwrap();
        for (policy, fields) in [
            (Network::Off, (false, None)),
            (Network::Any, (true, None)),
            (allow.clone(), (true, Some(json!({"allowOut": ["pkgs.test", "*.mirror.test"], "denyOut": ["0.0.0.0/0"]})))),
        ] {
            let got = create_fields(Some(&policy)).unwrap();
            assert_eq!(got, fields);
            assert_eq!(from_e2b(Some(got.0), got.1.as_ref()).unwrap(), policy);
            assert_eq!(from_e2b(Some(true), Some(&rules(&policy).unwrap())).unwrap(), policy);
        }
        let deny = Network::from_json(&json!({"allow": ["a.test"], "deny": ["b.a.test"]})).unwrap();
        let err = create_fields(Some(&deny)).unwrap_err().to_string();
        assert!(err.contains("\"b.a.test\"") && err.contains("IP addresses"), "{err}");
        assert!(from_e2b(None, Some(&json!({"denyOut": ["10.0.0.0/8"]}))).is_err());
    }
}
