//! Exact-value secret masking (docs/contract.md, "Secrets"), with the same rules as the
//! sandbox-side awk masker (`supervisor/mask.awk`): every occurrence of every value is found
//! (overlaps included), overlapping or touching ranges are merged, and each merged range becomes
//! `***`.
//!
//! Used on the host for the server's own configuration values (every page it returns) and for
//! `run_command` output on the local provider, where the sandbox environment is known here.

use crate::limits::MIN_SECRET_BYTES;
use std::collections::{HashMap, VecDeque};

/// What replaces a masked range.
pub const MASK: &str = "***";

/// A set of secret values to mask.
#[derive(Debug, Clone, Default)]
pub struct Masker {
    /// Invariant: sorted, unique, each at least `MIN_SECRET_BYTES` long and without `\n`.
    secrets: Vec<Vec<u8>>,
    /// Finds them all in one pass.
    finder: Finder,
}

impl PartialEq for Masker {
    fn eq(&self, other: &Masker) -> bool {
        self.secrets == other.secrets
    }
}

/// Where the secrets occur in a text, found in one pass whatever their number and length
/// (Aho–Corasick): a trie of the secrets whose nodes also link to the longest proper suffix of
/// theirs that is a node (`fail`). Masking costs time in proportion to the text, where a search
/// for each secret in turn cost the text's length times theirs (found by a review: a sandbox
/// whose environment held 66 000 secret-named values took 5 s to mask 32 KiB).
#[derive(Debug, Clone)]
struct Finder {
    /// The trie's edges: (node, byte) → child; node 0 is the root.
    edges: HashMap<(u32, u8), u32>,
    /// Each node's longest proper suffix that is also a node.
    fail: Vec<u32>,
    /// The length of the longest secret that ends each node's bytes (0: none).
    longest: Vec<u32>,
}

/// The node reached from `node` by byte `b`: its child by `b`, else that of its longest suffix
/// that has one, else the root.
fn step(edges: &HashMap<(u32, u8), u32>, fail: &[u32], mut node: u32, b: u8) -> u32 {
    loop {
        if let Some(&to) = edges.get(&(node, b)) {
            return to;
        }
        if node == 0 {
            return 0;
        }
        node = fail[node as usize];
    }
}

impl Default for Finder {
    fn default() -> Finder {
        Finder::new(&[])
    }
}

impl Finder {
    fn new(secrets: &[Vec<u8>]) -> Finder {
        let mut edges = HashMap::new();
        let mut longest = vec![0u32];
        for secret in secrets {
            let mut node = 0;
            for &b in secret {
                let next = longest.len() as u32;
                node = *edges.entry((node, b)).or_insert(next);
                if node == next {
                    longest.push(0);
                }
            }
            longest[node as usize] = secret.len() as u32;
        }
        let mut children = vec![Vec::new(); longest.len()];
        for (&(from, b), &to) in &edges {
            children[from as usize].push((b, to));
        }
        // Breadth first: a node's suffix link is shallower, so it is complete before the node.
        let mut fail = vec![0u32; longest.len()];
        let mut queue = VecDeque::from([0u32]);
        while let Some(node) = queue.pop_front() {
            for &(b, child) in &children[node as usize] {
                if node != 0 {
                    fail[child as usize] = step(&edges, &fail, fail[node as usize], b);
                }
                let inherited = longest[fail[child as usize] as usize];
                longest[child as usize] = longest[child as usize].max(inherited);
                queue.push_back(child);
            }
        }
        Finder { edges, fail, longest }
    }

    /// Where secrets occur in `text`: every occurrence, overlaps included, as ranges of which
    /// overlapping or touching ones are merged, in order.
    fn ranges(&self, text: &[u8]) -> Vec<(usize, usize)> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        if self.edges.is_empty() {
            return ranges;
        }
        let mut node = 0u32;
        for (i, &b) in text.iter().enumerate() {
            node = step(&self.edges, &self.fail, node, b);
            // The longest secret ending here covers every other one that does.
            let len = self.longest[node as usize] as usize;
            if len > 0 {
                let (mut start, end) = (i + 1 - len, i + 1);
                while let Some(&(s, e)) = ranges.last() {
                    if start > e {
                        break;
                    }
                    start = start.min(s);
                    ranges.pop();
                }
                ranges.push((start, end));
            }
        }
        ranges
    }
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
        Masker::of(secrets)
    }

    /// A masker of `secrets`, which keep the invariant.
    fn of(secrets: Vec<Vec<u8>>) -> Masker {
        let finder = Finder::new(&secrets);
        Masker { secrets, finder }
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
        Masker::of(secrets)
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
        let ranges = self.finder.ranges(text);
        if ranges.is_empty() {
            return None;
        }
        // Overlapping or touching occurrences are one range, one `***` (as in mask.awk).
        let mut out = Vec::with_capacity(text.len());
        let mut pos = 0;
        for (start, end) in ranges {
            out.extend_from_slice(&text[pos..start]);
            out.extend_from_slice(MASK.as_bytes());
            pos = end;
        }
        out.extend_from_slice(&text[pos..]);
        Some(out)
    }

    fn occurs_in(&self, text: &[u8]) -> bool {
        !self.finder.ranges(text).is_empty()
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

    /// The ranges a search for each secret in turn finds (what masking did before the finder),
    /// merged the same way.
    fn ranges_one_by_one(secrets: &[Vec<u8>], text: &[u8]) -> Vec<(usize, usize)> {
        let mut found: Vec<(usize, usize)> = Vec::new();
        for secret in secrets {
            for at in 0..text.len() {
                if text[at..].starts_with(secret) {
                    found.push((at, at + secret.len()));
                }
            }
        }
        found.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (s, e) in found {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }

    /// The one-pass finder finds what a search for each secret finds, on many small random
    /// cases over a three-letter alphabet (where secrets overlap, nest and share prefixes and
    /// suffixes most).
    #[test]
    fn the_finder_agrees_with_a_search_for_each_secret() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..3000 {
            let mut secrets: Vec<Vec<u8>> =
                (0..1 + next(6)).map(|_| (0..1 + next(5)).map(|_| b"abc"[next(3) as usize]).collect()).collect();
            secrets.sort();
            secrets.dedup();
            let text: Vec<u8> = (0..next(40)).map(|_| b"abc"[next(3) as usize]).collect();
            let finder = Finder::new(&secrets);
            assert_eq!(finder.ranges(&text), ranges_one_by_one(&secrets, &text), "{secrets:?} {text:?}");
        }
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
