//! Exact-value secret masking (docs/contract.md, "Secrets"), with the same rules as the
//! sandbox-side awk masker (`supervisor/mask.awk`): every occurrence of every value is found
//! (overlaps included), overlapping or touching ranges are merged, and each merged range becomes
//! `***`.
//!
//! Used on the host for the server's own configuration values (every page it returns) and for
//! `run_command` output on the local provider, where the sandbox environment is known here.

use crate::limits::MIN_SECRET_BYTES;

/// What replaces a masked range.
pub const MASK: &str = "***";

/// A set of secret values to mask.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Masker {
    /// Invariant: sorted, unique, each at least `MIN_SECRET_BYTES` long and without `\n`.
    secrets: Vec<Vec<u8>>,
}

/// Whether an environment variable's name marks its value as a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD"].iter().any(|w| upper.contains(w))
}

impl Masker {
    /// Masks the given values. Multi-line values are registered line by line, each line trimmed
    /// of surrounding whitespace; pieces shorter than `MIN_SECRET_BYTES` are skipped.
    pub fn from_values<'a>(values: impl IntoIterator<Item = &'a str>) -> Masker {
        let mut secrets: Vec<Vec<u8>> = values
            .into_iter()
            .flat_map(|v| v.split('\n'))
            .map(|line| line.trim_matches(|c: char| c == ' ' || c == '\t' || c == '\r'))
            .filter(|line| line.len() >= MIN_SECRET_BYTES)
            .map(|line| line.as_bytes().to_vec())
            .collect();
        secrets.sort();
        secrets.dedup();
        Masker { secrets }
    }

    /// Masks the values of variables whose names contain KEY, TOKEN, SECRET or PASSWORD.
    pub fn from_env<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Masker {
        Masker::from_values(env.into_iter().filter(|(k, _)| is_secret_name(k)).map(|(_, v)| v))
    }

    /// Adds the secrets of `other`.
    pub fn merged(&self, other: &Masker) -> Masker {
        let mut secrets = self.secrets.clone();
        secrets.extend(other.secrets.iter().cloned());
        secrets.sort();
        secrets.dedup();
        Masker { secrets }
    }

    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Masks `text`. Secrets never contain `\n`, so this equals masking line by line.
    ///
    /// A secret that contains `*` can line up with the `***` of a mask (`x***yz` when `***yz` is
    /// a secret): the text is masked again until no secret is left. Every pass that finds one
    /// makes the text shorter (at least 6 bytes become 3), so this ends.
    pub fn mask_bytes(&self, text: &[u8]) -> Vec<u8> {
        let Some(mut out) = self.mask_once(text) else {
            return text.to_vec();
        };
        if self.secrets.iter().any(|s| s.contains(&b'*')) {
            while let Some(again) = self.mask_once(&out) {
                out = again;
            }
        }
        out
    }

    /// One masking pass: `None` when no secret occurs in `text`.
    fn mask_once(&self, text: &[u8]) -> Option<Vec<u8>> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for secret in &self.secrets {
            let first = secret[0];
            let mut i = 0;
            while i + secret.len() <= text.len() {
                match text[i..=text.len() - secret.len()].iter().position(|b| *b == first) {
                    None => break,
                    Some(off) => {
                        let at = i + off;
                        if text[at..].starts_with(secret) {
                            ranges.push((at, at + secret.len()));
                        }
                        i = at + 1;
                    }
                }
            }
        }
        if ranges.is_empty() {
            return None;
        }
        ranges.sort_unstable();
        let mut out = Vec::with_capacity(text.len());
        let mut pos = 0;
        let mut iter = ranges.into_iter().peekable();
        while let Some((start, mut end)) = iter.next() {
            while let Some(&(s, e)) = iter.peek() {
                // Overlapping or touching ranges become one `***` (as in mask.awk).
                if s <= end {
                    end = end.max(e);
                    iter.next();
                } else {
                    break;
                }
            }
            out.extend_from_slice(&text[pos..start]);
            out.extend_from_slice(MASK.as_bytes());
            pos = end;
        }
        out.extend_from_slice(&text[pos..]);
        Some(out)
    }

    fn occurs_in(&self, text: &[u8]) -> bool {
        self.secrets.iter().any(|sec| text.windows(sec.len()).any(|w| w == sec.as_slice()))
    }

    /// Masks a string (UTF-8 in, UTF-8 out: masks only replace whole occurrences).
    pub fn mask_str(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_string();
        }
        String::from_utf8_lossy(&self.mask_bytes(text.as_bytes())).into_owned()
    }

    /// Masks every string inside a JSON value, object keys included, in place.
    pub fn mask_json(&self, value: &mut serde_json::Value) {
        if self.is_empty() {
            return;
        }
        match value {
            serde_json::Value::String(s) if self.occurs_in(s.as_bytes()) => *s = self.mask_str(s),
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| self.mask_json(v)),
            serde_json::Value::Object(map) => {
                map.values_mut().for_each(|v| self.mask_json(v));
                if map.keys().any(|k| self.occurs_in(k.as_bytes())) {
                    *map = std::mem::take(map).into_iter().map(|(k, v)| (self.mask_str(&k), v)).collect();
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(secrets: &[&str], input: &str, expected: &str) {
        let m = Masker::from_values(secrets.iter().copied());
        assert_eq!(String::from_utf8(m.mask_bytes(input.as_bytes())).unwrap(), expected, "{secrets:?} {input:?}");
    }

    #[test]
    fn masks_exact_values() {
        check(&["hunter22"], "pw=hunter22 ok", "pw=*** ok");
        check(&["hunter22"], "hunter22hunter22", "***");
        check(&["hunter22"], "hunter22 hunter22", "*** ***");
        check(&["short"], "short stays", "short stays");
        check(&["abcdef", "defghi"], "xabcdefghiy", "x***y");
        check(&["aaaaaa"], "aaaaaaaa", "***");
        check(&["line-one\n  line-two  "], "a line-one b\nline-two", "a *** b\n***");
        check(&["a.b*c+d"], "x a.b*c+d y", "x *** y");
        check(&[], "nothing", "nothing");
    }

    /// Found by fuzzing (log_page): a secret with `*` in it reappeared around a mask's `***`.
    #[test]
    fn no_secret_lines_up_with_a_mask() {
        check(&["***yz1", "SECRET"], "xSECRETyz1", "x***");
        check(&["*yz123", "SECRET"], "SECRETyz123 SECRET", "***** ***");
        check(&["a*****", "bbbbbb"], "abbbbbb**", "***");
        check(&["******"], "**********", "***");
    }

    #[test]
    fn picks_secret_names() {
        let m = Masker::from_env([("DB_PASSWORD", "pa55word"), ("api_key", "k-123456"), ("HOME", "/home/user1"), ("MY_TOKEN", "tiny")]);
        assert_eq!(m.mask_str("pa55word k-123456 /home/user1 tiny"), "*** *** /home/user1 tiny");
    }

    #[test]
    fn masks_json_strings() {
        let m = Masker::from_values(["sekret-value"]);
        let mut v = serde_json::json!({"a": ["x sekret-value", 3], "b": {"c": "sekret-value", "k sekret-value": 1}});
        m.mask_json(&mut v);
        assert_eq!(v, serde_json::json!({"a": ["x ***", 3], "b": {"c": "***", "k ***": 1}}));
    }
}
