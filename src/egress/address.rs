//! Never the host: the addresses no sandbox reaches through its proxy (unless the operator opts
//! in), checked on the address the proxy actually connects to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Why `ip` is out of a sandbox's reach, or `None` for a public address. The host's own
/// addresses are found by [`is_own`].
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return forbidden_v4(v4);
            }
            let first = v6.segments()[0];
            if v6.is_loopback() || v6.is_unspecified() {
                Some("a loopback address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a private address (fc00::/7)")
            } else if first & 0xff00 == 0xff00 {
                Some("a multicast address")
            } else if first & 0xffc0 == 0xfec0 {
                Some("a site-local address")
            } else if first & 0xe000 != 0x2000 {
                Some("a reserved address (outside the global unicast range 2000::/3)")
            } else if matches!(v6.segments(), [0x2001, 0..=0x1ff, ..] | [0x2001, 0xdb8, ..] | [0x3fff, 0..=0xfff, ..]) {
                Some("a special-purpose address (protocol assignments, Teredo or documentation)")
            } else if first == 0x2002 {
                Some("a 6to4 address (it reaches an IPv4 address unchecked)")
            } else {
                None
            }
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if a == 0 {
        Some("an unspecified address (0.0.0.0/8)")
    } else if ip.is_link_local() {
        Some("a link-local address (169.254.0.0/16, cloud metadata)")
    } else if ip.is_private() {
        Some("a private address (RFC 1918)")
    } else if a == 100 && (64..128).contains(&b) {
        Some("a shared address (CGNAT, 100.64.0.0/10)")
    } else if ip.is_multicast() || a >= 240 {
        Some("a multicast, reserved or broadcast address")
    } else if special_purpose_v4(ip) {
        Some("a special-purpose address (documentation, benchmarking or protocol assignments)")
    } else {
        None
    }
}

/// Whether `ip` is in one of the IANA special-purpose IPv4 ranges that are not globally
/// reachable and not named above: 192.0.0.0/24 (protocol assignments), 192.0.2.0/24,
/// 198.51.100.0/24 and 203.0.113.0/24 (documentation, which some hosts number their own network
/// from), 198.18.0.0/15 (benchmarking, and the fake addresses of some VPN clients' DNS) and
/// 192.88.99.0/24 (the former 6to4 relays).
fn special_purpose_v4(ip: Ipv4Addr) -> bool {
    matches!(ip.octets(), [192, 0, 0 | 2, _] | [198, 51, 100, _] | [203, 0, 113, _] | [198, 18 | 19, ..] | [192, 88, 99, _])
}

/// The IPv4 address an IPv6 address carries (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, ..] => Some(tail),
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(tail),
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(tail),
        _ => None,
    }
}

/// Whether `ip` is an address of this host: only a local address can be bound.
pub fn is_own(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Why the proxy refuses to connect to `ip`, or `None` when it may (always `None` when the
/// operator allowed host services).
pub fn refused(ip: IpAddr, host_services: bool) -> Option<String> {
    if host_services {
        return None;
    }
    if let Some(why) = forbidden(ip) {
        return Some(format!("{ip} is {why}, never reachable from a sandbox"));
    }
    is_own(ip).then(|| format!("{ip} is an address of the host, never reachable from a sandbox"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn host_and_private_ranges_are_refused() {
        for bad in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::10.0.0.1",
            // Special-purpose ranges (found by a review: this very machine's network was
            // 192.0.2.0/24, its gateway 192.0.2.1).
            "192.0.2.1",
            "192.0.0.1",
            "198.18.0.1",
            "198.19.255.254",
            "198.51.100.1",
            "203.0.113.1",
            "192.88.99.1",
            "::ffff:192.0.2.1",
            "2001:db8::1",
            "2001::1",
            "2001:1ff::1",
            "3fff::1",
            "100::1",
            "2002:7f00:1::1",
            "64:ff9b:1::a00:1",
            "4000::1",
        ] {
            assert!(refused(ip(bad), false).is_some(), "{bad} must be refused");
            assert!(refused(ip(bad), true).is_none(), "{bad} is allowed with host services");
        }
        for good in [
            "1.1.1.1",
            "140.82.112.3",
            "100.128.0.1",
            "172.32.0.1",
            "192.0.3.1",
            "198.20.0.1",
            "2606:4700::1111",
            "2001:200::1",
            "2a00:1450::1",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
        ] {
            assert_eq!(forbidden(ip(good)), None, "{good} is public");
        }
        assert!(refused(ip("169.254.169.254"), false).unwrap().contains("cloud metadata"));
    }
}
