//! dns-01 answers (RFC 8555 §8.4): a TXT record `_acme-challenge.NAME` put up and taken
//! down by RFC 2136 dynamic updates to the zone's primary server, signed with TSIG
//! (RFC 8945) — what BIND, Knot and PowerDNS accept.
//!
//! hickory-proto builds and signs the messages; each update is one UDP exchange (an
//! update's answer is a header and the TSIG record, far below 512 bytes), tried three
//! times. A value is added beside any other (no prerequisite), because a certificate
//! for `x` and `*.x` puts two values under one name, and removed by its exact value
//! (class NONE), so one order never takes down another's answer.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use hickory_proto::dnssec::rdata::tsig::TsigAlgorithm as Mac;
use hickory_proto::dnssec::tsig::TSigner;
use hickory_proto::op::{update_message, Message, ResponseCode};
use hickory_proto::rr::{rdata::TXT, Name, RData, Record, RecordSet};

use crate::config::{DnsUpdate, TsigAlgorithm};

/// How long one exchange waits for the answer, and how many tries an update gets.
const WAIT: Duration = Duration::from_secs(3);
const TRIES: u32 = 3;
/// The TTL of an answer record: short, as resolvers should not keep it.
const TTL: u32 = 60;

/// Where dns-01 answers go, and the key that signs them.
pub(crate) struct Updater {
    server: SocketAddr,
    zone: Name,
    signer: TSigner,
}

impl Updater {
    pub(crate) fn new(u: &DnsUpdate) -> Result<Updater, String> {
        let zone = Name::from_ascii(format!("{}.", u.zone)).map_err(|e| e.to_string())?;
        let key_name = Name::from_ascii(format!("{}.", u.key_name)).map_err(|e| e.to_string())?;
        let mac = match u.algorithm {
            TsigAlgorithm::HmacSha256 => Mac::HmacSha256,
            TsigAlgorithm::HmacSha384 => Mac::HmacSha384,
            TsigAlgorithm::HmacSha512 => Mac::HmacSha512,
        };
        let signer =
            TSigner::new(u.secret.clone(), mac, key_name, 300).map_err(|e| e.to_string())?;
        Ok(Updater {
            server: u.server,
            zone,
            signer,
        })
    }

    /// Puts up `value` at `_acme-challenge.BASE`.
    pub(crate) async fn add(&self, base: &str, value: &str) -> Result<(), String> {
        let rrset = self.record(base, value)?;
        let msg = update_message::append(rrset, self.zone.clone(), false, false);
        self.exchange(msg, base, "adding").await
    }

    /// Takes down `value` at `_acme-challenge.BASE` (other values there stay).
    pub(crate) async fn remove(&self, base: &str, value: &str) -> Result<(), String> {
        let rrset = self.record(base, value)?;
        let msg = update_message::delete_by_rdata(rrset, self.zone.clone(), false);
        self.exchange(msg, base, "removing").await
    }

    /// The one-record set `_acme-challenge.BASE. TXT "value"`, checked to lie in the
    /// zone (hickory's builders assert it).
    fn record(&self, base: &str, value: &str) -> Result<RecordSet, String> {
        let name = Name::from_ascii(format!("_acme-challenge.{}.", base.trim_end_matches('.')))
            .map_err(|e| format!("_acme-challenge.{base}: {e}"))?;
        if !self.zone.zone_of(&name) {
            return Err(format!("{name} is outside the zone {}", self.zone));
        }
        let txt = RData::TXT(TXT::new(vec![value.to_string()]));
        Ok(RecordSet::from(Record::from_rdata(name, TTL, txt)))
    }

    /// Signs `msg`, sends it, and checks the signed answer says NOERROR.
    async fn exchange(&self, mut msg: Message, base: &str, doing: &str) -> Result<(), String> {
        let what = format!(
            "{doing} the TXT record _acme-challenge.{base} at {}",
            self.server
        );
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        msg.set_id(rand_id());
        let mut verify = msg
            .finalize(&self.signer, now as u32)
            .map_err(|e| format!("{what}: signing: {e}"))?
            .ok_or_else(|| format!("{what}: the key gave no signature check"))?;
        let wire = msg.to_vec().map_err(|e| format!("{what}: {e}"))?;
        let answer = self.send(&wire).await.map_err(|e| format!("{what}: {e}"))?;
        match verify(&answer) {
            Ok(r) if r.id() != msg.id() => Err(format!("{what}: an answer to another query")),
            Ok(r) if r.response_code() == ResponseCode::NoError => Ok(()),
            Ok(r) => Err(format!("{what}: {}", refusal(r.response_code()))),
            // A refusal of the key itself comes unsigned: read it only to say why.
            Err(e) => match Message::from_vec(&answer) {
                Ok(r) if r.id() == msg.id() && r.response_code() != ResponseCode::NoError => {
                    Err(format!("{what}: {}", refusal(r.response_code())))
                }
                _ => Err(format!(
                    "{what}: the answer's signature does not check: {e}"
                )),
            },
        }
    }

    /// One request, one answer over UDP, tried [`TRIES`] times. A datagram that is
    /// not an answer to this request (too short, another ID) is skipped.
    async fn send(&self, wire: &[u8]) -> Result<Vec<u8>, String> {
        let local: SocketAddr = if self.server.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let sock = tokio::net::UdpSocket::bind(local)
            .await
            .map_err(|e| e.to_string())?;
        sock.connect(self.server).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        for _ in 0..TRIES {
            sock.send(wire).await.map_err(|e| e.to_string())?;
            let deadline = tokio::time::Instant::now() + WAIT;
            while let Ok(got) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
                let n = got.map_err(|e| e.to_string())?;
                if n >= 12 && buf[..2] == wire[..2] {
                    return Ok(buf[..n].to_vec());
                }
            }
        }
        Err(format!(
            "no answer in {} tries of {}s",
            TRIES,
            WAIT.as_secs()
        ))
    }
}

/// What a refusal means to the operator.
fn refusal(code: ResponseCode) -> String {
    let why = match code {
        ResponseCode::NotAuth => "the server does not accept the key (check key_name, the secret and algorithm, and the clocks) or is not authoritative for the zone",
        ResponseCode::Refused => "the server refused it (does its update-policy or allow-update grant this key TXT records?)",
        ResponseCode::NotZone => "the name is not in the zone the server has",
        ResponseCode::ServFail => "the server failed",
        _ => "refused",
    };
    format!("{code}: {why}")
}

/// A query ID no one can predict (RFC 5452 §9.2).
fn rand_id() -> u16 {
    let mut b = [0u8; 2];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u16::from_be_bytes(b)
}
