//! Documentation checks: the README quotes every limit and every configuration option.

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

#[test]
fn readme_lists_every_option() {
    let readme = readme();
    for o in sandbox_mcp::config::OPTIONS {
        if let Some(flag) = o.flag {
            assert!(readme.contains(&format!("`{flag}`")), "README is missing {flag}");
        }
        if let Some(env) = o.env {
            assert!(readme.contains(&format!("`{env}`")), "README is missing {env}");
        }
    }
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
}
