//! `subscriptions/listen` (MCP 2026-07-28): the notification filter a client asks for, the part
//! of it this server honours, the acknowledgement that opens a subscription, the result that
//! closes it, and the subscriptions open on a stdio connection.
//!
//! The server has tools only, and its tool list never changes: it honours `toolsListChanged`
//! (a stream that stays quiet) and leaves out the prompt and resource kinds, which it does not
//! have. Every message of a subscription carries its id (the `subscriptions/listen` request id)
//! in `_meta`.

use crate::envelope::{self, SUBSCRIPTION_ID_KEY};
use crate::jsonrpc::{code, RpcError};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The notification kinds a client may ask for, and whether this server honours them.
const KINDS: &[(&str, bool)] =
    &[("toolsListChanged", true), ("promptsListChanged", false), ("resourcesListChanged", false), ("resourceSubscriptions", false)];

/// The `notifications/subscriptions/acknowledged` message opening subscription `id`, from the
/// request's params: its `notifications` filter must be an object of known kinds (booleans, and
/// a list of strings for `resourceSubscriptions`); unknown kinds are ignored.
pub fn acknowledge(id: &Value, params: Option<&Value>) -> Result<Value, RpcError> {
    let invalid = |m: &str| RpcError::new(code::INVALID_PARAMS, format!("subscriptions/listen: {m}"));
    let Some(Value::Object(filter)) = params.and_then(|p| p.get("notifications")) else {
        return Err(invalid("params.notifications must be an object such as {\"toolsListChanged\": true}"));
    };
    let mut honoured = Map::new();
    for (kind, supported) in KINDS {
        let Some(value) = filter.get(*kind) else { continue };
        let well_typed = if *kind == "resourceSubscriptions" {
            value.as_array().is_some_and(|uris| uris.iter().all(Value::is_string))
        } else {
            value.is_boolean()
        };
        if !well_typed {
            let wants = if *kind == "resourceSubscriptions" { "a list of URI strings" } else { "a boolean" };
            return Err(invalid(&format!("notifications.{kind} must be {wants}")));
        }
        if *supported && value == &Value::Bool(true) {
            honoured.insert(kind.to_string(), Value::Bool(true));
        }
    }
    Ok(json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {SUBSCRIPTION_ID_KEY: id}, "notifications": honoured},
    }))
}

/// The response that ends subscription `id` gracefully (the server is shutting down).
pub fn closing(id: &Value) -> Value {
    let mut result = json!({"_meta": {SUBSCRIPTION_ID_KEY: id}});
    envelope::complete(&mut result);
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The subscriptions open on one stdio connection, by serialized request id.
#[derive(Debug, Default)]
pub struct Open {
    ids: Mutex<BTreeMap<String, Value>>,
}

impl Open {
    /// Records an open subscription; false when one with the same id is already open.
    pub fn open(&self, id: &Value) -> bool {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        let key = id.to_string();
        if ids.contains_key(&key) {
            return false;
        }
        ids.insert(key, id.clone());
        true
    }

    /// Ends a subscription the client cancelled; nothing more is sent for it.
    pub fn cancel(&self, id: &Value) {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).remove(&id.to_string());
    }

    /// Removes and returns every open subscription (shutdown closes them).
    pub fn take_all(&self) -> Vec<Value> {
        std::mem::take(&mut *self.ids.lock().unwrap_or_else(|p| p.into_inner())).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledgement_keeps_only_honoured_kinds() {
        let params = json!({"notifications": {"toolsListChanged": true, "promptsListChanged": true, "resourceSubscriptions": ["file:///x"], "future": 1}});
        let ack = acknowledge(&json!(7), Some(&params)).unwrap();
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID_KEY], 7);
        assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}));
        let quiet = acknowledge(&json!("s"), Some(&json!({"notifications": {"toolsListChanged": false}}))).unwrap();
        assert_eq!(quiet["params"]["notifications"], json!({}));
        assert_eq!(quiet["params"]["_meta"][SUBSCRIPTION_ID_KEY], "s");
        assert!(ack.get("id").is_none(), "a notification has no id");
    }

    #[test]
    fn a_malformed_filter_is_invalid_params() {
        for params in [
            None,
            Some(json!({})),
            Some(json!({"notifications": []})),
            Some(json!({"notifications": {"toolsListChanged": "yes"}})),
            Some(json!({"notifications": {"resourceSubscriptions": [1]}})),
        ] {
            assert_eq!(acknowledge(&json!(1), params.as_ref()).unwrap_err().code, code::INVALID_PARAMS, "{params:?}");
        }
    }

    #[test]
    fn open_subscriptions_are_cancelled_or_taken_at_shutdown() {
        let open = Open::default();
        assert!(open.open(&json!(1)));
        assert!(!open.open(&json!(1)), "one subscription per id");
        assert!(open.open(&json!("1")));
        open.cancel(&json!(1));
        assert_eq!(open.take_all(), vec![json!("1")]);
        assert!(open.take_all().is_empty());
        let closing = closing(&json!(4));
        assert_eq!((closing["id"].as_i64(), closing["result"]["resultType"].as_str()), (Some(4), Some("complete")));
        assert_eq!(closing["result"]["_meta"][SUBSCRIPTION_ID_KEY], 4);
    }
}
