//! Tool argument specifications: one table per tool gives both its `inputSchema` and the strict
//! validation of its arguments (unknown names, wrong types, out-of-range values), and [`Args`],
//! the validated arguments, whose lookups are checked against that table.
//!
//! Handlers read arguments through the [`Param`] constants of their table ([`Args::text`],
//! [`Args::required_text`], [`Args::integer`], [`Args::map`]), never by a string name. A lookup
//! of a parameter the tool does not declare, or with the accessor of another kind, is a bug in
//! the handler: it panics in debug builds (so every test that reaches it fails) and is a tool
//! error in release builds, never a silent default.

use super::ToolError;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::mem::discriminant;

/// The type of one argument.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A string of at most `max_chars` characters.
    Str {
        /// Upper bound in characters.
        max_chars: usize,
    },
    /// One of a fixed set of strings.
    Enum(&'static [&'static str]),
    /// An integer in `min..=max`.
    Int {
        /// Lower bound.
        min: i64,
        /// Upper bound.
        max: i64,
        /// Value when not given.
        default: Option<i64>,
    },
    /// An object whose values are all strings.
    StrMap,
    /// `true` or `false`.
    Bool,
    /// An object of optional integer fields, each with its own range; no other field.
    IntFields(&'static [IntField]),
    /// A network policy: `true`, `false`, or `{"allow": [...], "deny": [...]}` of domain names.
    Network,
}

/// One field of a [`Kind::IntFields`] object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntField {
    /// Field name.
    pub name: &'static str,
    /// Lower bound.
    pub min: i64,
    /// Upper bound.
    pub max: i64,
}

/// One argument of a tool.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Wire name.
    pub name: &'static str,
    /// Type and range.
    pub kind: Kind,
    /// Whether it must be given.
    pub required: bool,
    /// What it means, for the model.
    pub description: &'static str,
}

/// The JSON Schema of a parameter table (no `$schema`, no `$ref`, `additionalProperties: false`).
pub fn input_schema(params: &[Param]) -> Value {
    let mut props = Map::new();
    for p in params {
        let mut s = match p.kind {
            // Identifiers' and paths' lengths are checked, not advertised: maxLength is for the
            // long texts (commands, file content) a message must have room for.
            Kind::Str { max_chars } if max_chars <= 4096 => json!({"type": "string"}),
            Kind::Str { max_chars } => json!({"type": "string", "maxLength": max_chars}),
            Kind::Enum(values) => json!({"type": "string", "enum": values}),
            // A floor of 0 or 1 goes without saying (tools/list stays small); the error of a value
            // out of range names the range.
            Kind::Int { min, max, default } => {
                let mut s = int_field(min, max);
                // (A default of 0 goes without saying too.)
                if let Some(d) = default.filter(|d| *d != 0) {
                    s["default"] = json!(d);
                }
                s
            }
            Kind::StrMap => json!({"type": "object", "additionalProperties": {"type": "string"}}),
            Kind::Bool => json!({"type": "boolean"}),
            // A switch or a policy of domain lists; create_sandbox's description of `network` says
            // its form (tools/list stays small).
            Kind::Network => json!({"type": ["boolean", "object"]}),
            Kind::IntFields(fields) => {
                let props: Map<String, Value> = fields.iter().map(|f| (f.name.to_string(), int_field(f.min, f.max))).collect();
                json!({"type": "object", "properties": props})
            }
        };
        if !p.description.is_empty() {
            s["description"] = json!(p.description);
        }
        props.insert(p.name.into(), s);
    }
    let required: Vec<&str> = params.iter().filter(|p| p.required).map(|p| p.name).collect();
    let mut schema = json!({"type": "object", "properties": props, "additionalProperties": false});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// An integer field's schema: its maximum, and its minimum unless it is 0 or 1.
fn int_field(min: i64, max: i64) -> Value {
    let mut s = json!({"type": "integer", "maximum": max});
    if min > 1 {
        s["minimum"] = json!(min);
    }
    s
}

/// Validated arguments with typed getters. Defaults are already applied.
#[derive(Debug, Default)]
pub struct Args {
    /// The tool, for messages.
    tool: String,
    /// The tool's parameter table: the only names that may be looked up.
    declared: Vec<Param>,
    values: BTreeMap<&'static str, Value>,
}

/// The accessor a lookup used, to match against the parameter's [`Kind`].
#[derive(Debug, Clone, Copy)]
enum Access {
    Text,
    Integer,
    Map,
    Flag,
    Fields,
    Network,
}

impl Access {
    fn fits(self, kind: Kind) -> bool {
        matches!(
            (self, kind),
            (Access::Text, Kind::Str { .. } | Kind::Enum(_))
                | (Access::Integer, Kind::Int { .. })
                | (Access::Map, Kind::StrMap)
                | (Access::Flag, Kind::Bool)
                | (Access::Fields, Kind::IntFields(_))
                | (Access::Network, Kind::Network)
        )
    }
}

impl Args {
    /// Checks that `p` is one of the tool's parameters (same name and kind) and that `access`
    /// reads its kind.
    fn lookup(&self, p: &Param, access: Access) -> Result<Option<&Value>, ToolError> {
        let declared = self.declared.iter().any(|d| d.name == p.name && discriminant(&d.kind) == discriminant(&p.kind));
        if !declared {
            return Err(self.misuse(p.name, "which it does not declare"));
        }
        if !access.fits(p.kind) {
            return Err(self.misuse(p.name, &format!("with the accessor for another kind ({access:?}, declared {:?})", p.kind)));
        }
        Ok(self.values.get(p.name))
    }

    /// A handler bug: a panic in debug builds, a tool error in release builds.
    fn misuse(&self, name: &str, how: &str) -> ToolError {
        let msg = format!(
            "internal error: the {} handler read argument {name:?} {how}; this is a bug in sandbox-mcp, not in the call, please report it",
            self.tool
        );
        if cfg!(debug_assertions) {
            panic!("{msg}");
        }
        ToolError::new(msg)
    }

    /// A string (or enum) argument, if given.
    pub fn text(&self, p: &Param) -> Result<Option<&str>, ToolError> {
        Ok(self.lookup(p, Access::Text)?.and_then(Value::as_str))
    }

    /// A required string (or enum) argument.
    pub fn required_text(&self, p: &Param) -> Result<&str, ToolError> {
        if !p.required {
            return Err(self.misuse(p.name, "as required, but it is optional"));
        }
        self.text(p)?.ok_or_else(|| self.misuse(p.name, "as given, but validation let it be missing"))
    }

    /// An integer argument, or its declared default; the parameter must be required or have one.
    pub fn integer(&self, p: &Param) -> Result<i64, ToolError> {
        if !p.required && !matches!(p.kind, Kind::Int { default: Some(_), .. }) {
            return Err(self.misuse(p.name, "as always present, but it is optional without a default"));
        }
        self.lookup(p, Access::Integer)?.and_then(Value::as_i64).ok_or_else(|| self.misuse(p.name, "but no value was kept"))
    }

    /// A string-map argument (empty when not given).
    pub fn map(&self, p: &Param) -> Result<BTreeMap<String, String>, ToolError> {
        Ok(string_map(self.lookup(p, Access::Map)?))
    }

    /// A boolean argument, if given.
    pub fn flag(&self, p: &Param) -> Result<Option<bool>, ToolError> {
        Ok(self.lookup(p, Access::Flag)?.and_then(Value::as_bool))
    }

    /// A network policy argument, if given (validated already).
    pub fn network(&self, p: &Param) -> Result<Option<crate::egress::Network>, ToolError> {
        match self.lookup(p, Access::Network)? {
            None => Ok(None),
            Some(v) => crate::egress::Network::from_json(v).map(Some).map_err(|why| ToolError::new(format!("argument {:?} {why}", p.name))),
        }
    }

    /// The integer fields given in an [`Kind::IntFields`] argument (none when it was not given).
    pub fn int_fields(&self, p: &Param) -> Result<BTreeMap<String, i64>, ToolError> {
        Ok(int_fields(self.lookup(p, Access::Fields)?))
    }

    /// The integer fields of an [`Kind::IntFields`] argument, `None` when it was not given.
    pub fn int_fields_given(&self, p: &Param) -> Result<Option<BTreeMap<String, i64>>, ToolError> {
        Ok(self.lookup(p, Access::Fields)?.filter(|v| !v.is_null()).map(|v| int_fields(Some(v))))
    }

    /// Whether `name` is declared; a lookup of any other name is a bug in the caller (a panic in
    /// debug builds).
    fn by_name(&self, name: &str) -> Option<&Value> {
        if !self.declared.iter().any(|d| d.name == name) {
            // The value is absent either way; in release builds this is the whole answer.
            let _ = self.misuse(name, "which it does not declare");
        }
        self.values.get(name)
    }

    /// A string argument by wire name, for code that walks the parameter table (tests, the fuzz
    /// harness). Handlers use [`Args::text`].
    pub fn str(&self, name: &str) -> Option<&str> {
        self.by_name(name).and_then(Value::as_str)
    }

    /// An integer argument (or its default) by wire name, for code that walks the parameter
    /// table. Handlers use [`Args::integer`].
    pub fn int(&self, name: &str) -> Option<i64> {
        self.by_name(name).and_then(Value::as_i64)
    }

    /// A string-map argument (empty when not given) by wire name, for code that walks the
    /// parameter table. Handlers use [`Args::map`].
    pub fn str_map(&self, name: &str) -> BTreeMap<String, String> {
        string_map(self.by_name(name))
    }

    /// A boolean argument by wire name, for code that walks the parameter table. Handlers use
    /// [`Args::flag`].
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.by_name(name).and_then(Value::as_bool)
    }

    /// An integer-fields argument by wire name, for code that walks the parameter table.
    /// Handlers use [`Args::int_fields`].
    pub fn fields(&self, name: &str) -> BTreeMap<String, i64> {
        int_fields(self.by_name(name))
    }
}

fn int_fields(value: Option<&Value>) -> BTreeMap<String, i64> {
    match value {
        Some(Value::Object(m)) => m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_i64()?))).collect(),
        _ => BTreeMap::new(),
    }
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    match value {
        Some(Value::Object(m)) => m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect(),
        _ => BTreeMap::new(),
    }
}

/// Arguments that do not fit a tool's table: a sentence for the model, starting with the tool's
/// name, that says which argument is wrong and what it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidArguments(pub String);

impl std::fmt::Display for InvalidArguments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidArguments {}

/// Checks `arguments` against `params`.
pub fn validate(tool: &str, params: &[Param], arguments: &Map<String, Value>) -> Result<Args, InvalidArguments> {
    check_all(tool, params, arguments).map_err(InvalidArguments)
}

/// [`validate`], its errors as sentences.
fn check_all(tool: &str, params: &[Param], arguments: &Map<String, Value>) -> Result<Args, String> {
    let mut unknown: Vec<&str> = arguments.keys().map(String::as_str).filter(|k| !params.iter().any(|p| p.name == *k)).collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        let known: Vec<&str> = params.iter().map(|p| p.name).collect();
        return Err(format!(
            "{tool}: unknown argument{} {}; valid arguments are: {}",
            if unknown.len() > 1 { "s" } else { "" },
            unknown.iter().map(|k| format!("{:?}", truncate(k, 60))).collect::<Vec<_>>().join(", "),
            known.join(", ")
        ));
    }
    let mut args = Args { tool: tool.to_string(), declared: params.to_vec(), values: BTreeMap::new() };
    for p in params {
        // JSON null counts as "not given": several clients send null for omitted optionals.
        let value = arguments.get(p.name).filter(|v| !v.is_null());
        let Some(value) = value else {
            if p.required {
                return Err(format!("{tool}: missing required argument {:?} ({})", p.name, p.description));
            }
            if let Kind::Int { default: Some(d), .. } = p.kind {
                args.values.insert(p.name, json!(d));
            }
            continue;
        };
        let checked = check(p, value).map_err(|why| format!("{tool}: argument {:?} {why}", p.name))?;
        args.values.insert(p.name, checked);
    }
    Ok(args)
}

fn check(p: &Param, value: &Value) -> Result<Value, String> {
    match p.kind {
        Kind::Str { max_chars } => {
            let s = value.as_str().ok_or_else(|| format!("must be a string, got {}", describe(value)))?;
            let n = s.chars().count();
            if n > max_chars {
                return Err(format!("is {n} characters long; the limit is {max_chars}"));
            }
            Ok(value.clone())
        }
        Kind::Enum(allowed) => match value.as_str() {
            Some(s) if allowed.contains(&s) => Ok(value.clone()),
            _ => Err(format!("must be one of {}, got {}", allowed.join(", "), describe(value))),
        },
        Kind::Int { min, max, .. } => {
            let n = as_integer(value).ok_or_else(|| format!("must be an integer from {min} to {max}, got {}", describe(value)))?;
            if n < min || n > max {
                return Err(format!("must be from {min} to {max}, got {n}"));
            }
            Ok(json!(n))
        }
        Kind::StrMap => {
            let obj = value.as_object().ok_or_else(|| format!("must be an object of strings, got {}", describe(value)))?;
            if let Some((k, v)) = obj.iter().find(|(_, v)| !v.is_string()) {
                return Err(format!("must map names to strings, but {:?} is {}", truncate(k, 60), describe(v)));
            }
            Ok(value.clone())
        }
        Kind::Bool => match value {
            Value::Bool(_) => Ok(value.clone()),
            _ => Err(format!("must be true or false, got {}", describe(value))),
        },
        Kind::Network => crate::egress::Network::from_json(value).map(|n| n.to_json()),
        Kind::IntFields(fields) => {
            let names = || fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ");
            let obj = value.as_object().ok_or_else(|| format!("must be an object with fields {}, got {}", names(), describe(value)))?;
            let mut out = Map::new();
            for (k, v) in obj {
                let Some(f) = fields.iter().find(|f| f.name == k) else {
                    return Err(format!("has an unknown field {:?}; its fields are {}", truncate(k, 60), names()));
                };
                if v.is_null() {
                    continue;
                }
                let n = as_integer(v)
                    .ok_or_else(|| format!("field {:?} must be an integer from {} to {}, got {}", f.name, f.min, f.max, describe(v)))?;
                if n < f.min || n > f.max {
                    return Err(format!("field {:?} must be from {} to {}, got {n}", f.name, f.min, f.max));
                }
                out.insert(k.clone(), json!(n));
            }
            Ok(Value::Object(out))
        }
    }
}

/// An integer, also accepting integral floats (`5.0`) that some clients produce.
fn as_integer(value: &Value) -> Option<i64> {
    if let Some(n) = value.as_i64() {
        return Some(n);
    }
    let f = value.as_f64()?;
    (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {:?}", truncate(s, 40)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

/// Validated arguments for `params` as handlers may meet them: every parameter given, then only
/// the required ones. For tests that run each handler's argument reading against its table.
#[cfg(test)]
pub(crate) fn samples(tool: &str, params: &[Param]) -> Vec<Args> {
    let value = |p: &Param| match p.kind {
        Kind::Str { .. } => json!("a"),
        Kind::Enum(values) => json!(values.first().copied().unwrap_or_default()),
        Kind::Int { min, .. } => json!(min),
        Kind::StrMap => json!({"K": "v"}),
        Kind::Bool => json!(true),
        Kind::Network => json!({"allow": ["example.org"]}),
        Kind::IntFields(fields) => Value::Object(fields.iter().map(|f| (f.name.to_string(), json!(f.min))).collect()),
    };
    let all: Map<String, Value> = params.iter().map(|p| (p.name.to_string(), value(p))).collect();
    let required: Map<String, Value> = params.iter().filter(|p| p.required).map(|p| (p.name.to_string(), value(p))).collect();
    [all, required].iter().map(|a| validate(tool, params, a).expect("sample arguments are valid")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: &[Param] = &[
        Param { name: "command", kind: Kind::Str { max_chars: 5 }, required: true, description: "the command" },
        Param { name: "timeout", kind: Kind::Int { min: 1, max: 10, default: Some(3) }, required: false, description: "s" },
        Param { name: "envs", kind: Kind::StrMap, required: false, description: "env" },
        Param { name: "encoding", kind: Kind::Enum(&["utf8", "base64"]), required: false, description: "enc" },
    ];

    fn run(args: Value) -> Result<Args, String> {
        validate("t", PARAMS, args.as_object().unwrap()).map_err(|e| e.0)
    }

    #[test]
    fn accepts_valid_and_applies_defaults() {
        let a = run(json!({"command": "ls", "envs": {"A": "b"}})).unwrap();
        assert_eq!(a.str("command"), Some("ls"));
        assert_eq!(a.int("timeout"), Some(3));
        assert_eq!(a.str_map("envs").get("A").map(String::as_str), Some("b"));
        assert_eq!(run(json!({"command": "ls", "timeout": 4.0})).unwrap().int("timeout"), Some(4));
        assert_eq!(run(json!({"command": "ls", "timeout": null})).unwrap().int("timeout"), Some(3));
    }

    #[test]
    fn rejects_with_useful_messages() {
        let cases = [
            (json!({}), "missing required argument \"command\""),
            (json!({"command": "ls", "bogus": 1}), "unknown argument \"bogus\"; valid arguments are: command, timeout, envs, encoding"),
            (json!({"command": 7}), "must be a string, got the number 7"),
            (json!({"command": "toolong"}), "is 7 characters long; the limit is 5"),
            (json!({"command": "ls", "timeout": 0}), "must be from 1 to 10, got 0"),
            (json!({"command": "ls", "timeout": "5"}), "must be an integer from 1 to 10, got the string \"5\""),
            (json!({"command": "ls", "timeout": 1.5}), "must be an integer"),
            (json!({"command": "ls", "envs": {"A": 1}}), "must map names to strings"),
            (json!({"command": "ls", "envs": []}), "must be an object of strings, got an array"),
            (json!({"command": "ls", "encoding": "hex"}), "must be one of utf8, base64"),
        ];
        for (input, want) in cases {
            let err = run(input.clone()).unwrap_err();
            assert!(err.contains(want), "{input}: {err}");
        }
    }

    #[test]
    fn checked_lookups_read_declared_parameters() {
        let a = run(json!({"command": "ls", "envs": {"A": "b"}, "encoding": "base64"})).unwrap();
        assert_eq!(a.required_text(&PARAMS[0]).unwrap(), "ls");
        assert_eq!(a.integer(&PARAMS[1]).unwrap(), 3);
        assert_eq!(a.map(&PARAMS[2]).unwrap().get("A").map(String::as_str), Some("b"));
        assert_eq!(a.text(&PARAMS[3]).unwrap(), Some("base64"));
    }

    #[test]
    #[should_panic(expected = "read argument \"cwd\" which it does not declare")]
    fn an_undeclared_lookup_is_a_bug() {
        let cwd = Param { name: "cwd", kind: Kind::Str { max_chars: 5 }, required: false, description: "d" };
        let _ = run(json!({"command": "ls"})).unwrap().text(&cwd);
    }

    #[test]
    #[should_panic(expected = "with the accessor for another kind")]
    fn a_lookup_of_the_wrong_kind_is_a_bug() {
        let _ = run(json!({"command": "ls"})).unwrap().text(&PARAMS[1]);
    }

    #[test]
    #[should_panic(expected = "read argument \"comand\" which it does not declare")]
    fn a_misspelt_name_is_a_bug() {
        let _ = run(json!({"command": "ls"})).unwrap().str("comand");
    }

    #[test]
    fn samples_are_valid() {
        let [all, required] = <[Args; 2]>::try_from(samples("t", PARAMS)).unwrap();
        assert_eq!(all.values.len(), PARAMS.len());
        assert_eq!(required.str("command"), Some("a"));
        assert_eq!(required.str_map("envs").len(), 0);
    }

    #[test]
    fn schema_shape() {
        let s = input_schema(PARAMS);
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["required"], json!(["command"]));
        assert_eq!(s["properties"]["timeout"]["default"], 3);
        assert!(s.get("$schema").is_none());
    }
}
