//! The PROXY protocol (HAProxy's, versions 1 and 2): the header a load balancer puts
//! before a connection's first byte to say whose connection it is, read on `listen …
//! proxy_protocol` listeners and written to backends of pools with `proxy_protocol
//! v1|v2`.
//!
//! Written here rather than taken from a crate: it is two small fixed formats, and the
//! reading side must take exactly the header's bytes off the socket (peeked first),
//! never a byte of what follows, which the crates' buffered readers do not promise.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The version 2 signature.
const SIG: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The header for the proxy's own connection (a health probe), naming no client:
/// `LOCAL` (v2) or `UNKNOWN` (v1).
pub(crate) fn local(version: Version) -> &'static [u8] {
    match version {
        Version::V1 => b"PROXY UNKNOWN\r\n",
        Version::V2 => b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00",
    }
}

/// A version 1 header's most bytes (`PROXY TCP6 …\r\n`).
const V1_MAX: usize = 107;
/// The most address and TLV bytes a version 2 header may carry here.
const V2_MAX: usize = 2048;
/// How long a client has to send the whole header.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// What the start of a connection says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// Not a valid header: why.
    Invalid(&'static str),
    /// A header of `len` bytes naming the client (`None`: `LOCAL` or `UNKNOWN`, the
    /// connection's own peer stands).
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
}

/// The client of a connection the balancer relayed without an address: `0.0.0.0`,
/// which no `allow` admits and whose forwarding fields are not believed.
pub(crate) const UNKNOWN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// Parses a header at the start of `buf`.
pub(crate) fn parse(buf: &[u8]) -> Parsed {
    if buf.len() >= SIG.len() && buf[..SIG.len()] == SIG {
        return parse_v2(buf);
    }
    if SIG.starts_with(buf) && !buf.is_empty() {
        return Parsed::Incomplete;
    }
    let prefix = b"PROXY ";
    let n = buf.len().min(prefix.len());
    if buf[..n] != prefix[..n] {
        return Parsed::Invalid("no PROXY protocol header");
    }
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Parsed::Invalid("a version 1 header longer than 107 bytes")
        } else {
            Parsed::Incomplete
        };
    };
    if end + 2 > V1_MAX {
        return Parsed::Invalid("a version 1 header longer than 107 bytes");
    }
    match parse_v1(&buf[..end]) {
        Some(source) => Parsed::Header {
            len: end + 2,
            source,
        },
        None => Parsed::Invalid("a malformed version 1 header"),
    }
}

/// `PROXY TCP4|TCP6 SRC DST SPORT DPORT` or `PROXY UNKNOWN …`.
fn parse_v1(line: &[u8]) -> Option<Option<SocketAddr>> {
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    if parts.next()? != "PROXY" {
        return None;
    }
    let family = parts.next()?;
    if family == "UNKNOWN" {
        return Some(Some(UNKNOWN));
    }
    let (src, dst, sport, dport) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let ip: IpAddr = match family {
        "TCP4" => IpAddr::V4(src.parse().ok()?),
        "TCP6" => IpAddr::V6(src.parse().ok()?),
        _ => return None,
    };
    let (source_port, _) = (port(sport)?, port(dport)?);
    match (family, dst.parse::<IpAddr>().ok()?) {
        ("TCP4", IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_)) => {
            Some(Some(SocketAddr::new(ip, source_port)))
        }
        _ => None,
    }
}

/// A port as version 1 writes it: 0..65535, no leading zeros, no sign.
fn port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_v2(buf: &[u8]) -> Parsed {
    if buf.len() < 16 {
        return Parsed::Incomplete;
    }
    let (ver_cmd, family) = (buf[12], buf[13]);
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if ver_cmd >> 4 != 2 {
        return Parsed::Invalid("a version 2 signature with another version");
    }
    if len > V2_MAX {
        return Parsed::Invalid("a version 2 header over 2 KiB");
    }
    if buf.len() < 16 + len {
        return Parsed::Incomplete;
    }
    let body = &buf[16..16 + len];
    let total = 16 + len;
    match ver_cmd & 0x0f {
        // LOCAL: the balancer's own connection (a health check); the peer stands.
        0 => Parsed::Header {
            len: total,
            source: None,
        },
        1 => match family {
            0x11 if body.len() >= 12 => {
                let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
                let port = u16::from_be_bytes([body[8], body[9]]);
                Parsed::Header {
                    len: total,
                    source: Some(SocketAddr::new(ip.into(), port)),
                }
            }
            0x21 if body.len() >= 36 => {
                let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&body[..16]).expect("16 bytes"));
                let port = u16::from_be_bytes([body[32], body[33]]);
                Parsed::Header {
                    len: total,
                    source: Some(SocketAddr::new(ip.into(), port)),
                }
            }
            // UNSPEC, or AF_UNIX: a client without an address sluice could use.
            0x00 | 0x31 | 0x32 => Parsed::Header {
                len: total,
                source: Some(UNKNOWN),
            },
            0x11 | 0x21 => Parsed::Invalid("a version 2 header shorter than its addresses"),
            _ => Parsed::Invalid("a version 2 header with an unknown address family"),
        },
        _ => Parsed::Invalid("a version 2 header with an unknown command"),
    }
}

/// Reads a header off `stream`, taking exactly its bytes: `Ok(source)` (`None`: the
/// peer stands), `Err(why)` for a missing, malformed or late one.
pub(crate) async fn read(stream: &mut TcpStream) -> Result<Option<SocketAddr>, String> {
    let got = tokio::time::timeout(HEADER_TIMEOUT, async {
        let mut buf = vec![0u8; 16 + V2_MAX];
        let mut seen = 0;
        loop {
            let n = stream.peek(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("closed before a PROXY protocol header".to_string());
            }
            match parse(&buf[..n]) {
                Parsed::Header { len, source } => {
                    let mut take = vec![0u8; len];
                    stream
                        .read_exact(&mut take)
                        .await
                        .map_err(|e| e.to_string())?;
                    return Ok(source);
                }
                Parsed::Invalid(why) => return Err(why.to_string()),
                // A header split across segments: peek again once more arrived.
                Parsed::Incomplete if n == seen => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Parsed::Incomplete => seen = n,
            }
        }
    })
    .await;
    got.unwrap_or_else(|_| Err("no whole PROXY protocol header within 5s".to_string()))
}

/// The header telling a backend that `client` connected to `local`.
pub(crate) fn encode(version: Version, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    // One family for both: a v4 client of a dual-stack listener is v4-mapped there.
    let (src, dst) = match (client.ip().to_canonical(), local.ip().to_canonical()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (IpAddr::V4(s), IpAddr::V4(d)),
        (s, d) => (IpAddr::V6(v6(s)), IpAddr::V6(v6(d))),
    };
    match version {
        Version::V1 => {
            let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {family} {src} {dst} {} {}\r\n",
                client.port(),
                local.port()
            )
            .into_bytes()
        }
        Version::V2 => {
            let mut out = SIG.to_vec();
            out.push(0x21);
            match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    out.push(0x11);
                    out.extend_from_slice(&12u16.to_be_bytes());
                    out.extend_from_slice(&s.octets());
                    out.extend_from_slice(&d.octets());
                }
                (s, d) => {
                    out.push(0x21);
                    out.extend_from_slice(&36u16.to_be_bytes());
                    out.extend_from_slice(&v6(s).octets());
                    out.extend_from_slice(&v6(d).octets());
                }
            }
            out.extend_from_slice(&client.port().to_be_bytes());
            out.extend_from_slice(&local.port().to_be_bytes());
            out
        }
    }
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn both_versions_read_what_they_write() {
        let c: SocketAddr = "203.0.113.7:51000".parse().unwrap();
        let l: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let c6: SocketAddr = "[2001:db8::7]:51000".parse().unwrap();
        for v in [Version::V1, Version::V2] {
            for (client, want) in [(c, c), (c6, c6)] {
                let mut h = encode(v, client, l);
                let len = h.len();
                h.extend_from_slice(b"GET / HTTP/1.1\r\n");
                assert_eq!(
                    parse(&h),
                    Parsed::Header {
                        len,
                        source: Some(want)
                    },
                    "{v:?}"
                );
                for cut in 1..len {
                    assert_eq!(parse(&h[..cut]), Parsed::Incomplete, "{v:?} cut at {cut}");
                }
            }
        }
        assert_eq!(
            encode(Version::V1, c, l),
            b"PROXY TCP4 203.0.113.7 10.0.0.1 51000 443\r\n"
        );
    }

    #[test]
    fn local_unknown_and_malformed_headers() {
        let mut local = SIG.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(
            parse(&local),
            Parsed::Header {
                len: 16,
                source: None
            }
        );
        assert_eq!(
            parse(super::local(Version::V1)),
            Parsed::Header {
                len: 15,
                source: Some(UNKNOWN)
            }
        );
        assert_eq!(
            parse(super::local(Version::V2)),
            Parsed::Header {
                len: 16,
                source: None
            }
        );
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80\r\n",
            b"PROXY TCP4 1.2.3.4 ::1 80 80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 080 80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 70000 80\r\n",
            b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        ] {
            assert!(
                matches!(parse(bad), Parsed::Invalid(_)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(parse(&[b'P'; 120]), Parsed::Invalid(_)));
    }

    proptest! {
        /// Whatever a client sends first, the parser answers without panicking, and a
        /// header it accepts is never longer than what it was given.
        #[test]
        fn any_bytes_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Parsed::Header { len, .. } = parse(&bytes) {
                prop_assert!(len <= bytes.len());
            }
        }

        #[test]
        fn every_address_round_trips(a in any::<[u8; 4]>(), p in 1u16.., v2 in any::<bool>()) {
            let client = SocketAddr::from((a, p));
            let v = if v2 { Version::V2 } else { Version::V1 };
            let h = encode(v, client, "127.0.0.1:80".parse().unwrap());
            prop_assert_eq!(parse(&h), Parsed::Header { len: h.len(), source: Some(client) });
        }
    }
}
