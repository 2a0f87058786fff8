//! Documentation checks: the README's configuration table is the options table of `src/config.rs`,
//! its defaults are what the server uses, and the limits table of docs/contract.md (the one place
//! the documents state the limits) is `src/limits.rs`, row for row.

use std::path::Path;

fn doc(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

fn readme() -> String {
    doc("README.md")
}

/// The rows of the first Markdown table after `heading` (a whole line) in `text`, each as its
/// cells with the Markdown backticks removed; `cells` is how many each row must have.
fn table_rows(text: &str, heading: &str, cells: usize) -> Vec<Vec<String>> {
    let section = text.split(&format!("{heading}\n")).nth(1).unwrap_or_else(|| panic!("no {heading:?} section"));
    let table = section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|'));
    let mut rows = Vec::new();
    for line in table.skip(2) {
        let row: Vec<String> = line.trim_matches('|').split(" | ").map(|c| c.trim().replace('`', "")).collect();
        assert_eq!(row.len(), cells, "row {line:?} under {heading:?} has {} cells, not {cells}", row.len());
        rows.push(row);
    }
    rows
}

/// The rows of the README's configuration table, each as its four cells (flag, environment,
/// default, what) with the Markdown backticks removed.
fn readme_option_rows(readme: &str) -> Vec<[String; 4]> {
    table_rows(readme, "### Configuration", 4).into_iter().map(|r| r.try_into().unwrap()).collect()
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
    assert_eq!((defaults.http_token, defaults.e2b.api_key, defaults.e2b.api_url), (None, None, None));
}

/// `65536` as `65,536`.
fn thousands(n: impl Into<i64>) -> String {
    let digits = n.into().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A whole number of KiB or MiB, as the documents write sizes.
fn size(bytes: usize) -> String {
    match bytes {
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => panic!("{b} bytes is not a whole number of KiB"),
    }
}

/// The limits table as `src/limits.rs` says it must read: (what, limit), backticks removed.
fn limits_from_the_code() -> Vec<(&'static str, String)> {
    use sandbox_mcp::limits::*;
    let i = |n: usize| i64::try_from(n).unwrap();
    vec![
        ("command", format!("{} characters", thousands(i(MAX_COMMAND_CHARS)))),
        ("encoded request to the sandbox", size(MAX_SANDBOX_REQUEST_BYTES)),
        ("create_sandbox timeout", format!("{SANDBOX_TIMEOUT_MIN_S}–{SANDBOX_TIMEOUT_MAX_S} s, default {SANDBOX_TIMEOUT_DEFAULT_S}")),
        ("create_sandbox limits.memory_mb", format!("{SANDBOX_MEMORY_MB_MIN}–{SANDBOX_MEMORY_MB_MAX}")),
        ("create_sandbox limits.processes", format!("{SANDBOX_PROCESSES_MIN}–{SANDBOX_PROCESSES_MAX}")),
        ("create_sandbox limits.disk_mb", format!("{SANDBOX_DISK_MB_MIN}–{SANDBOX_DISK_MB_MAX}")),
        ("run_command timeout", format!("{COMMAND_TIMEOUT_MIN_S}–{COMMAND_TIMEOUT_MAX_S} s, default {COMMAND_TIMEOUT_DEFAULT_S}")),
        ("task timeout", format!("{TASK_TIMEOUT_MIN_S}–{TASK_TIMEOUT_MAX_S} s, default {TASK_TIMEOUT_DEFAULT_S}")),
        ("log saved per stream", size(MAX_LOG_BYTES)),
        ("run_command output kept per stream", size(MAX_LOG_BYTES)),
        (
            "run_command max_output",
            format!("{}–{} bytes, default {}", thousands(MAX_OUTPUT_MIN), thousands(i(MAX_LOG_BYTES)), thousands(MAX_OUTPUT_DEFAULT)),
        ),
        ("read offset", format!("0–{}", thousands(MAX_READ_OFFSET))),
        ("read limit", format!("{}–{}, default {}", thousands(READ_LIMIT_MIN), thousands(READ_LIMIT_MAX), thousands(READ_LIMIT_DEFAULT))),
        ("send_input data", format!("{} per call (UTF-8 bytes)", size(MAX_INPUT_BYTES))),
        ("send_input wait for room in the task's input", format!("{} s (then a tool error)", INPUT_WRITE_WAIT.as_secs())),
        ("pty rows and cols", format!("{PTY_SIZE_MIN}–{PTY_SIZE_MAX}")),
        ("task directories per OS user per sandbox", MAX_TASKS.to_string()),
        ("cancel confirmation", format!("{} s", CANCEL_CONFIRM.as_secs())),
        ("HTTP body (and one stdio message)", size(MAX_BODY_BYTES)),
        (
            "HTTP request head, body and answer over time",
            format!(
                "the head whole within --http-stall of the connection's last answer; a body and an answer each at {}/s on average after a first --http-stall and one second (else the connection is ended)",
                size(HTTP_MIN_RATE)
            ),
        ),
        ("read_file size", size(MAX_FILE_BYTES)),
        (
            "write_file content",
            format!(
                "{} (characters; escaped at worst, {WORST_ESCAPED_CHAR_BYTES} bytes each, the whole message fits in {})",
                size(MAX_WRITE_CHARS),
                size(MAX_BODY_BYTES)
            ),
        ),
        ("list_files entries", thousands(i(MAX_DIR_ENTRIES))),
        (
            "memory for large answers being made or sent",
            format!(
                "{} at once, {} of one client's (an answer larger than that fits alone); answers under {} take none; one that finds no room waits for it while others are being made or give theirs back, up to {} s after the last did and {} s in all, then its call fails and says so (run_command's answer is sent instead with each stream cut to {} bytes and a warning)",
                size(ANSWER_BUDGET),
                size(ANSWER_BUDGET_PER_CLIENT),
                size(ANSWER_FREE),
                ANSWER_WAIT.as_secs(),
                ANSWER_WAIT_MOST.as_secs(),
                MAX_OUTPUT_DEFAULT
            ),
        ),
        ("shortest masked secret", format!("{MIN_SECRET_BYTES} bytes")),
        ("open subscriptions/listen streams (HTTP)", format!("{MAX_HTTP_SUBSCRIPTIONS} (503 beyond)")),
        ("open subscriptions/listen streams of one client (HTTP)", format!("{MAX_HTTP_SUBSCRIPTIONS_PER_CLIENT} (503 beyond)")),
        ("task ids per subscriptions/listen", format!("{MAX_SUBSCRIBED_TASKS} (-32602 beyond)")),
        ("get_task wait", format!("0–{MAX_WAIT_S} s")),
        ("calls waiting at once", format!("{MAX_WAITING_CALLS} (one more is answered at once)")),
        ("calls of one client waiting at once", format!("{MAX_WAITING_CALLS_PER_CLIENT} (one more is answered at once)")),
        (
            "run_command calls running outside the worker pool",
            format!(
                "{RUNNING_CALLS_PER_WORKER} × --workers at once, at most {MAX_RUNNING_CALLS}; {RUNNING_CALLS_PER_CLIENT_PER_WORKER} × --workers of one client, at most {MAX_RUNNING_CALLS_PER_CLIENT} (more hold a worker)"
            ),
        ),
        ("network policy", format!("{NETWORK_POLICY_MAX_ENTRIES} entries, {} of JSON", size(NETWORK_POLICY_MAX_BYTES))),
        ("egress proxy connections per sandbox", format!("{EGRESS_MAX_CONNECTIONS} at once (closed beyond)")),
        ("egress proxy request head", format!("{} within {} s", size(EGRESS_MAX_HEAD_BYTES), EGRESS_HEAD_BUDGET.as_secs())),
        ("egress proxy idle connection", format!("{} s (no byte either way)", EGRESS_IDLE_BUDGET.as_secs())),
        ("network_blocked entries per result", NETWORK_BLOCKED_MAX.to_string()),
        ("exposed ports per sandbox", EXPOSED_PORTS_MAX.to_string()),
        ("connections per exposed port", format!("{EXPOSED_PORT_MAX_CONNECTIONS} at once (closed beyond)")),
        ("exposed port idle connection", format!("{} s (no byte either way)", EXPOSED_PORT_IDLE_BUDGET.as_secs())),
        (
            "relay buffers (egress proxy and exposed ports together, per keeper)",
            format!(
                "{} per direction of a connection, growing to {} while a transfer fills it; {} of growth at once beyond the first buffers",
                size(RELAY_BUFFER_START),
                size(RELAY_BUFFER_MAX),
                size(RELAY_GROWTH_BUDGET)
            ),
        ),
    ]
}

#[test]
fn the_contracts_limits_table_is_limits_rs() {
    let documented: Vec<(String, String)> =
        table_rows(&doc("docs/contract.md"), "## Limits", 2).into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    let code: Vec<(String, String)> = limits_from_the_code().into_iter().map(|(w, l)| (w.to_string(), l)).collect();
    for (row, expected) in documented.iter().zip(&code) {
        assert_eq!(row, expected, "docs/contract.md's Limits row (left) differs from src/limits.rs (right)");
    }
    assert_eq!(documented.len(), code.len(), "docs/contract.md has {} limit rows, this test knows {}", documented.len(), code.len());
}

#[test]
fn the_limits_are_stated_only_in_the_contract() {
    // The figures no other fact shares; each document links to docs/contract.md, "Limits".
    for path in ["README.md", "SECURITY.md", "ARCHITECTURE.md", "tests/README.md"] {
        let text = doc(path);
        for figure in ["65,536", "1,048,576", "16,384", "96 KiB", "| what | limit |"] {
            assert!(!text.contains(figure), "{path} states the limit {figure:?}: link to docs/contract.md, \"Limits\" instead");
        }
    }
}
