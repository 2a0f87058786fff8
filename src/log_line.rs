//! What reaches the log: a record's text with every character that could act on a terminal or
//! hide text written as an escape (`\u{1b}`).
//!
//! Log lines carry text from sandboxes (a snippet's error line, a dial's failure) and from
//! clients, and the log is often the operator's terminal: an escape sequence there could set the
//! window title, clear the screen, or forge log lines, and a newline or a bidirectional override
//! could make one line read as another. Every record the binary logs passes through [`clean`].

use std::borrow::Cow;

/// Whether `c` is written as an escape: control characters (C0, DEL, C1: line breaks included)
/// and the invisible formatting ones (bidirectional controls, zero-width characters, tags).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}'
            | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}')
}

/// `text` with each hidden character written as its escape; borrowed when there is none.
pub fn clean(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_and_invisible_characters_become_escapes() {
        assert!(matches!(clean("sandbox local-1: could not adopt (exit 3) → waiting"), Cow::Borrowed(_)));
        assert_eq!(clean("\u{1b}]0;PWNED\u{7}\u{1b}[2J"), "\\u{1b}]0;PWNED\\u{7}\\u{1b}[2J");
        assert_eq!(clean("a\nINFO forged\r"), "a\\u{a}INFO forged\\u{d}");
        assert_eq!(clean("x\u{9b}31m \u{202e}txt.exe \u{200b}"), "x\\u{9b}31m \\u{202e}txt.exe \\u{200b}");
        assert_eq!(clean("tab\there \u{e0041}"), "tab\\u{9}here \\u{e0041}");
    }
}
