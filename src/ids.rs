//! Random identifiers (task ids, session ids, local sandbox ids) from the OS generator.
//!
//! This is the only caller of `getrandom`.

/// `n` random bytes as lowercase hex (2n characters).
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    if let Err(err) = getrandom::fill(&mut buf) {
        // The OS generator failing is unrecoverable: handing out predictable ids would be worse.
        panic!("the OS random number generator failed: {err}");
    }
    hex(&buf)
}

/// A random number (for picks that need no secrecy, such as a sandbox's uid).
pub fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    if let Err(err) = getrandom::fill(&mut buf) {
        panic!("the OS random number generator failed: {err}");
    }
    u64::from_le_bytes(buf)
}

/// A task id: 32 lowercase hex characters from 128 random bits.
pub fn task_id() -> String {
    random_hex(16)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// Whether `s` is a well-formed task id (exactly 32 lowercase hex characters).
pub fn is_task_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_32_lowercase_hex_and_distinct() {
        let a = task_id();
        let b = task_id();
        assert!(is_task_id(&a), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn task_id_validation() {
        assert!(is_task_id("0123456789abcdef0123456789abcdef"));
        for bad in [
            "",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "../../../../../../../../../etc/xx",
            "0123456789abcdef0123456789abcdeg",
        ] {
            assert!(!is_task_id(bad), "{bad}");
        }
    }
}
