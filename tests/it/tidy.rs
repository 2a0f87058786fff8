//! Documentation checks: the README's configuration table is the options table of `src/config.rs`,
//! its defaults are what the server uses, and the README quotes every limit.

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// The rows of the README's configuration table, each as its four cells (flag, environment,
/// default, what) with the Markdown backticks removed.
fn readme_option_rows(readme: &str) -> Vec<[String; 4]> {
    let section = readme.split("### Configuration\n").nth(1).expect("README has a ### Configuration section");
    let table = section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|'));
    let mut rows = Vec::new();
    for line in table.skip(2) {
        let cells: Vec<String> = line.trim_matches('|').split(" | ").map(|c| c.trim().replace('`', "")).collect();
        let cells: [String; 4] =
            cells.try_into().unwrap_or_else(|c: Vec<String>| panic!("README row {line:?} has {} cells, not 4", c.len()));
        rows.push(cells);
    }
    rows
}

#[test]
fn readme_configuration_table_is_the_options_table() {
    let readme = readme();
    let documented = readme_option_rows(&readme);
    let declared: Vec<[String; 4]> = sandbox_mcp::config::OPTIONS
        .iter()
        .map(|o| [o.flag.unwrap_or("–").to_string(), o.env.unwrap_or("–").to_string(), o.default.to_string(), o.help.to_string()])
        .collect();
    assert_eq!(documented.len(), declared.len(), "README has {} option rows, src/config.rs {}", documented.len(), declared.len());
    for (readme_row, option) in documented.iter().zip(&declared) {
        assert_eq!(readme_row, option, "README row (left) differs from OPTIONS in src/config.rs (right)");
    }
}

#[test]
fn readme_defaults_are_what_the_server_uses() {
    use sandbox_mcp::config::{Args, Config, ProviderKind, OPTIONS};
    use std::collections::HashMap;
    let load = |env: &HashMap<&str, String>| Config::load(&Args::default(), &|k| env.get(k).cloned()).unwrap();
    // HOME only: the state root's default is worked out from it.
    let mut env = HashMap::from([("HOME", "/h".to_string())]);
    let defaults = load(&env);
    // Every default the README writes as a value, given as that option's environment variable,
    // goes through the same parser as user input and must change nothing.
    let documented = readme_option_rows(&readme());
    let mut given = 0;
    for (row, option) in documented.iter().zip(OPTIONS) {
        if let (Some(var), Some(_)) = (option.env, option.default.text()) {
            env.insert(var, row[2].clone());
            given += 1;
        }
    }
    assert!(given >= 6, "only {given} written defaults");
    assert_eq!(load(&env), defaults, "a README default differs from what the server uses with nothing set");
    // The defaults worked out from other settings, and the unset ones.
    assert_eq!(defaults.provider, ProviderKind::Local);
    assert_eq!(defaults.home, Path::new("/h/.local/state/sandbox-mcp"));
    assert_eq!((defaults.http_token, defaults.e2b.api_key, defaults.e2b.api_url, defaults.e2b.sandbox_url), (None, None, None, None));
}

#[test]
fn readme_quotes_the_limits() {
    use sandbox_mcp::limits::*;
    let readme = readme();
    for figure in ["65,536", "96 KiB", "1–3600", "1 MiB", "0–1,048,576", "1–65,536", "16,384", "128", "3 s", "4 MiB"] {
        assert!(readme.contains(figure), "README must quote {figure}");
    }
    assert_eq!(MAX_COMMAND_CHARS, 65_536);
    assert_eq!(MAX_SANDBOX_REQUEST_BYTES, 96 * 1024);
    assert_eq!(MAX_LOG_BYTES, 1 << 20);
    assert_eq!(MAX_READ_OFFSET, 1_048_576);
    assert_eq!((READ_LIMIT_MIN, READ_LIMIT_MAX, READ_LIMIT_DEFAULT), (1, 65_536, 16_384));
    assert_eq!(MAX_TASKS, 128);
    assert_eq!(CANCEL_CONFIRM.as_secs(), 3);
    assert_eq!(MAX_BODY_BYTES, 4 << 20);
    assert!(readme.contains("| open `subscriptions/listen` streams (HTTP) | 16 "), "README must quote the subscription limit");
    assert_eq!(MAX_HTTP_SUBSCRIPTIONS, 16);
    assert!(readme.contains("| task ids per `subscriptions/listen` | 16 "), "README must quote the task ids per subscription");
    assert_eq!(MAX_SUBSCRIBED_TASKS, 16);
    assert!(readme.contains("| `get_task` `wait` | 0–60 s |"), "README must quote the longest wait");
    assert!(readme.contains("(`get_task` with `wait`) | 64 "), "README must quote how many calls wait at once");
    assert_eq!((MAX_WAIT_S, MAX_WAITING_CALLS), (60, 64));
}
