//! The destination-safety classifier against a table of reference answers (IANA's
//! special-purpose registries and DESIGN §9, longest prefix wins), and the literal
//! parser against the C library's `inet_aton`: every spelling the C library reads as
//! an address, sluice reads as the same address.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use sluice::fuzzing::{classify, parse_ip, Reason};

/// `None` in a row: public. `Some(None)` marks the ranges judged by the IPv4 address
/// they carry.
const TABLE: &[(&str, Option<Option<Reason>>)] = &[
    ("0.0.0.0/0", None),
    ("0.0.0.0/32", Some(Some(Reason::Unspecified))),
    ("0.0.0.0/8", Some(Some(Reason::Reserved))),
    ("127.0.0.0/8", Some(Some(Reason::Loopback))),
    ("169.254.169.254/32", Some(Some(Reason::Metadata))),
    ("100.100.100.200/32", Some(Some(Reason::Metadata))),
    ("169.254.0.0/16", Some(Some(Reason::LinkLocal))),
    ("10.0.0.0/8", Some(Some(Reason::Private))),
    ("172.16.0.0/12", Some(Some(Reason::Private))),
    ("192.168.0.0/16", Some(Some(Reason::Private))),
    ("100.64.0.0/10", Some(Some(Reason::Cgnat))),
    ("192.0.2.0/24", Some(Some(Reason::Documentation))),
    ("198.51.100.0/24", Some(Some(Reason::Documentation))),
    ("203.0.113.0/24", Some(Some(Reason::Documentation))),
    ("192.0.0.0/24", Some(Some(Reason::Reserved))),
    ("192.88.99.0/24", Some(Some(Reason::Reserved))),
    ("198.18.0.0/15", Some(Some(Reason::Reserved))),
    ("224.0.0.0/4", Some(Some(Reason::Multicast))),
    ("240.0.0.0/4", Some(Some(Reason::Reserved))),
    ("255.255.255.255/32", Some(Some(Reason::Broadcast))),
    ("::/0", Some(Some(Reason::Reserved))),
    ("2000::/3", None),
    ("::/128", Some(Some(Reason::Unspecified))),
    ("::1/128", Some(Some(Reason::Loopback))),
    ("::/96", Some(Some(Reason::Mapped))),
    ("::ffff:0:0/96", Some(Some(Reason::Mapped))),
    ("::ffff:0:0:0/96", Some(Some(Reason::Mapped))),
    ("64:ff9b::/96", Some(None)),
    ("64:ff9b:1::/48", Some(Some(Reason::Private))),
    ("2002::/16", Some(None)),
    ("fd00:ec2::254/128", Some(Some(Reason::Metadata))),
    ("fc00::/7", Some(Some(Reason::Private))),
    ("fe80::/10", Some(Some(Reason::LinkLocal))),
    ("fec0::/10", Some(Some(Reason::Reserved))),
    ("ff00::/8", Some(Some(Reason::Multicast))),
    ("2001:db8::/32", Some(Some(Reason::Documentation))),
    ("3fff::/20", Some(Some(Reason::Documentation))),
    ("2001::/23", Some(Some(Reason::Reserved))),
    ("100::/64", Some(Some(Reason::Reserved))),
];

fn reference(ip: IpAddr) -> Option<Reason> {
    let row = TABLE
        .iter()
        .map(|(net, verdict)| (net.parse::<IpNet>().unwrap(), verdict))
        .filter(|(net, _)| net.contains(&ip))
        .max_by_key(|(net, _)| net.prefix_len())
        .map(|(_, v)| *v)
        .unwrap_or(None);
    match row {
        None => None,
        Some(Some(reason)) => Some(reason),
        Some(None) => {
            let IpAddr::V6(v6) = ip else { unreachable!() };
            let o = v6.octets();
            // NAT64 carries it in the last 32 bits, 6to4 in bits 16..48.
            let v4 = if o[0] == 0x20 && o[1] == 0x02 {
                Ipv4Addr::new(o[2], o[3], o[4], o[5])
            } else {
                Ipv4Addr::new(o[12], o[13], o[14], o[15])
            };
            reference(IpAddr::V4(v4))
        }
    }
}

extern "C" {
    fn inet_aton(cp: *const libc::c_char, inp: *mut libc::in_addr) -> libc::c_int;
}

/// What glibc makes of `s`, if it takes it as an address.
fn c_inet_aton(s: &str) -> Option<Ipv4Addr> {
    let c = std::ffi::CString::new(s).ok()?;
    let mut out = libc::in_addr { s_addr: 0 };
    // SAFETY: `c` is a NUL-terminated string and `out` a valid `in_addr`.
    let ok = unsafe { inet_aton(c.as_ptr(), &mut out) };
    (ok != 0).then(|| Ipv4Addr::from(u32::from_be(out.s_addr)))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = <[u8; 16]>::try_from(data.get(..16).unwrap_or(&[])) {
        let ip = IpAddr::V6(Ipv6Addr::from(b));
        assert_eq!(classify(ip), reference(ip), "{ip}");
    }
    if let Ok(b) = <[u8; 4]>::try_from(data.get(..4).unwrap_or(&[])) {
        let ip = IpAddr::V4(Ipv4Addr::from(b));
        assert_eq!(classify(ip), reference(ip), "{ip}");
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let ours = parse_ip(s);
    if s.bytes().all(|b| b.is_ascii_hexdigit() || b"xX.".contains(&b)) {
        if let Some(v4) = c_inet_aton(s) {
            assert_eq!(ours, Some(IpAddr::V4(v4)), "{s:?}");
        }
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        assert_eq!(ours, Some(ip), "{s:?}");
    }
    if let Some(ip) = ours {
        // A literal is judged as the address it names.
        let _ = classify(ip);
    }
});
