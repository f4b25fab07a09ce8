//! A DNS server for tests, on loopback: answers A and AAAA queries from a table the
//! test changes while sluice runs, and counts the queries it gets. UDP answers are
//! limited to 512 bytes (EDNS is ignored): a longer answer is sent truncated, and the
//! same port answers over TCP, as a real server would.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// (priority, weight, port, target).
type SrvRecord = (u16, u16, u16, String);

#[derive(Default)]
struct Table {
    /// Lower-case name without the final dot → (addresses, TTL).
    names: HashMap<String, (Vec<IpAddr>, u32)>,
    /// Queries by name, both types, both transports.
    queries: HashMap<String, usize>,
    /// (name, query type) answered SERVFAIL.
    failing: std::collections::HashSet<(String, u16)>,
    /// Names answered with this many CNAME records before their addresses.
    cnames: HashMap<String, usize>,
    /// SRV records by name: (priority, weight, port, target), and their TTL.
    srv: HashMap<String, (Vec<SrvRecord>, u32)>,
    tcp_queries: usize,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    table: Arc<Mutex<Table>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl DnsServer {
    pub async fn start() -> DnsServer {
        // One port for both transports: find one free for both.
        let (udp, tcp) = loop {
            let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let port = udp.local_addr().unwrap().port();
            if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().unwrap();
        let table: Arc<Mutex<Table>> = Arc::default();
        let t = table.clone();
        let udp_task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(reply) = answer(&t, &buf[..n], Some(512)) {
                    let _ = udp.send_to(&reply, from).await;
                }
            }
        });
        let t = table.clone();
        let tcp_task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = tcp.accept().await else {
                    return;
                };
                let t = t.clone();
                tokio::spawn(async move {
                    loop {
                        let mut len = [0u8; 2];
                        if s.read_exact(&mut len).await.is_err() {
                            return;
                        }
                        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                        if s.read_exact(&mut q).await.is_err() {
                            return;
                        }
                        t.lock().unwrap().tcp_queries += 1;
                        let Some(reply) = answer(&t, &q, None) else {
                            return;
                        };
                        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(&reply);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        DnsServer {
            addr,
            table,
            tasks: vec![udp_task, tcp_task],
        }
    }

    /// `name` answers with `addrs` (IPv4 for A, IPv6 for AAAA), cached for `ttl` seconds.
    /// No addresses: NXDOMAIN.
    pub fn set(&self, name: &str, addrs: &[&str], ttl: u32) {
        let ips = addrs.iter().map(|a| a.parse().unwrap()).collect();
        self.table
            .lock()
            .unwrap()
            .names
            .insert(name.to_ascii_lowercase(), (ips, ttl));
    }

    /// `name` answers SRV queries with `records` (priority, weight, port, target),
    /// cached for `ttl` seconds. No records: NXDOMAIN.
    pub fn set_srv(&self, name: &str, records: &[(u16, u16, u16, &str)], ttl: u32) {
        let records = records
            .iter()
            .map(|&(p, w, port, t)| (p, w, port, t.to_string()))
            .collect();
        self.table
            .lock()
            .unwrap()
            .srv
            .insert(name.to_ascii_lowercase(), (records, ttl));
    }

    /// Queries of type `qtype` (1: A, 28: AAAA) for `name` get SERVFAIL.
    pub fn fail(&self, name: &str, qtype: u16) {
        self.table
            .lock()
            .unwrap()
            .failing
            .insert((name.to_ascii_lowercase(), qtype));
    }

    /// `name`'s answers start with `n` CNAME records (`name` → `c1.name` → …), the
    /// addresses owned by the last.
    pub fn cnames(&self, name: &str, n: usize) {
        self.table
            .lock()
            .unwrap()
            .cnames
            .insert(name.to_ascii_lowercase(), n);
    }

    /// Queries for `name` so far (A and AAAA, UDP and TCP).
    pub fn queries(&self, name: &str) -> usize {
        let t = self.table.lock().unwrap();
        t.queries
            .get(&name.to_ascii_lowercase())
            .copied()
            .unwrap_or(0)
    }

    pub fn tcp_queries(&self) -> usize {
        self.table.lock().unwrap().tcp_queries
    }
}

/// An SRV record's data: priority, weight, port, and the target's labels.
fn srv_rdata(priority: u16, weight: u16, port: u16, target: &str) -> Vec<u8> {
    let mut v = Vec::new();
    for n in [priority, weight, port] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    for label in target
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        v.push(label.len() as u8);
        v.extend_from_slice(label.as_bytes());
    }
    v.push(0);
    v
}

/// The reply to one query, or `None` for a packet that is not one.
fn answer(table: &Mutex<Table>, q: &[u8], limit: Option<usize>) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    // The question: labels, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = &q[12..i + 4];
    let name = labels.join(".");
    let (ips, mut ttl, failing, cnames, srv) = {
        let mut t = table.lock().unwrap();
        *t.queries.entry(name.clone()).or_default() += 1;
        let (ips, ttl) = t.names.get(&name).cloned().unwrap_or_default();
        let failing = t.failing.contains(&(name.clone(), qtype));
        let srv = t.srv.get(&name).cloned();
        (
            ips,
            ttl,
            failing,
            t.cnames.get(&name).copied().unwrap_or(0),
            srv,
        )
    };
    if failing {
        let mut out = q[..12].to_vec();
        out[2] = 0x80 | (q[2] & 0x01);
        out[3] = 0x80 | 2;
        out[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
        out.truncate(12);
        out.extend_from_slice(question);
        return Some(out);
    }
    let mut records: Vec<Vec<u8>> = ips
        .iter()
        .filter_map(|ip| match (ip, qtype) {
            (IpAddr::V4(v4), 1) => Some(v4.octets().to_vec()),
            (IpAddr::V6(v6), 28) => Some(v6.octets().to_vec()),
            _ => None,
        })
        .collect();
    let known = !ips.is_empty() || srv.as_ref().is_some_and(|s| !s.0.is_empty());
    if let (Some((list, srv_ttl)), 33) = (&srv, qtype) {
        ttl = *srv_ttl;
        records = list
            .iter()
            .map(|(p, w, port, target)| srv_rdata(*p, *w, *port, target))
            .collect();
    }
    let rcode = if known { 0 } else { 3 };
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&q[..2]);
    // QR, AA, the query's RD; RA.
    out.push(0x84 | (q[2] & 0x01));
    out.push(0x80 | rcode);
    out.extend_from_slice(&[0, 1]);
    let cnames = if records.is_empty() { 0 } else { cnames };
    out.extend_from_slice(&((records.len() + cnames) as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    // A chain name → c1.name → c2.name …: each CNAME's target is one label ("cK")
    // before a pointer to the question's name; the addresses are the last target's.
    let mut owner = 12u16;
    for k in 1..=cnames {
        out.extend_from_slice(&(0xc000 | owner).to_be_bytes());
        out.extend_from_slice(&[0, 5, 0, 1]);
        out.extend_from_slice(&ttl.to_be_bytes());
        let label = format!("c{k}");
        out.extend_from_slice(&((label.len() + 3) as u16).to_be_bytes());
        owner = out.len() as u16;
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
        out.extend_from_slice(&[0xc0, 12]);
    }
    for rdata in &records {
        out.extend_from_slice(&(0xc000 | owner).to_be_bytes());
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&[0, 1]);
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
    }
    if records.is_empty() {
        // A negative answer carries the zone's SOA, whose minimum is its TTL.
        out[9] = 1;
        out.extend_from_slice(&[0xc0, 12, 0, 6, 0, 1]);
        out.extend_from_slice(&ttl.max(1).to_be_bytes());
        out.extend_from_slice(&24u16.to_be_bytes());
        out.extend_from_slice(&[0xc0, 12, 0xc0, 12]);
        for v in [1u32, 3600, 600, 86400, ttl.max(1)] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    if limit.is_some_and(|l| out.len() > l) {
        // Truncated: the header and question only, TC set.
        out.truncate(12 + question.len());
        out[2] |= 0x02;
        out[6] = 0;
        out[7] = 0;
    }
    Some(out)
}
