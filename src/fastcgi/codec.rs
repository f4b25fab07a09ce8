//! FastCGI 1 records: what sluice writes (BEGIN_REQUEST, PARAMS, STDIN) and the
//! incremental reader of what the application sends back (STDOUT, STDERR,
//! END_REQUEST).
//!
//! Our own, because the protocol is small and its limits are the product's: every
//! length is checked before anything is allocated for it, a name or value longer than a
//! PARAMS record can carry is refused, and the reader never buffers more than one
//! record's content.

use bytes::{Buf, Bytes, BytesMut};

pub(crate) const VERSION: u8 = 1;
pub(crate) const BEGIN_REQUEST: u8 = 1;
pub(crate) const END_REQUEST: u8 = 3;
pub(crate) const PARAMS: u8 = 4;
pub(crate) const STDIN: u8 = 5;
pub(crate) const STDOUT: u8 = 6;
pub(crate) const STDERR: u8 = 7;
/// The one request id sluice uses: one request at a time on a connection.
pub(crate) const REQUEST_ID: u16 = 1;
/// The most content one record carries.
pub(crate) const MAX_CONTENT: usize = 65_535;
/// The most PARAMS content sluice puts in one record: with its padding to 8 bytes the
/// record stays within 65,535 bytes, which php-fpm checks.
const MAX_PARAMS_RECORD: usize = 65_528;
const RESPONDER: u16 = 1;
const KEEP_CONN: u8 = 1;

/// Why a record stream or a PARAMS set is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    #[error("a FastCGI record of version {0}")]
    Version(u8),
    #[error("a record for request {0}, not ours")]
    RequestId(u16),
    #[error("an unexpected record type {0}")]
    Type(u8),
    #[error("a malformed END_REQUEST record")]
    EndRequest,
    #[error("a parameter longer than a record can carry")]
    ParamTooLong,
    #[error("the parameters are larger than the cap")]
    ParamsTooLarge,
}

fn header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.extend_from_slice(&header_bytes(kind, len));
}

fn header_bytes(kind: u8, len: usize) -> [u8; 8] {
    let pad = (8 - len % 8) % 8;
    [
        VERSION,
        kind,
        (REQUEST_ID >> 8) as u8,
        REQUEST_ID as u8,
        (len >> 8) as u8,
        len as u8,
        pad as u8,
        0,
    ]
}

fn padding(out: &mut Vec<u8>, len: usize) {
    let pad = (8 - len % 8) % 8;
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// BEGIN_REQUEST, role responder, keep the connection.
pub(crate) fn begin_request(out: &mut Vec<u8>) {
    header(out, BEGIN_REQUEST, 8);
    out.extend_from_slice(&[
        (RESPONDER >> 8) as u8,
        RESPONDER as u8,
        KEEP_CONN,
        0,
        0,
        0,
        0,
        0,
    ]);
}

/// Name-value pairs as PARAMS records of at most [`MAX_CONTENT`] bytes each, then the
/// empty PARAMS record. `cap`: the most encoded bytes in all.
#[cfg(test)]
pub(crate) fn params(out: &mut Vec<u8>, pairs: &[(&[u8], &[u8])], cap: usize) -> Result<(), Error> {
    let mut p = Params::new(out, cap);
    for (name, value) in pairs {
        p.pair(&[name], &[value]);
    }
    p.finish()
}

/// PARAMS records written pair by pair straight into the request's buffer (no pair is
/// built anywhere else first): whole pairs per record, each record's content within
/// `MAX_PARAMS_RECORD`, then the empty record. A pair that no record can carry, or
/// pairs over `cap` in all, make [`finish`](Params::finish) fail and leave the buffer
/// as it was.
pub(crate) struct Params<'a> {
    out: &'a mut Vec<u8>,
    /// The buffer's length before the first record.
    begin: usize,
    /// Where the open record's header is.
    record: usize,
    /// Where the last pair's name and value start.
    last: (usize, usize),
    total: usize,
    cap: usize,
    failed: Option<Error>,
}

impl<'a> Params<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>, cap: usize) -> Params<'a> {
        let begin = out.len();
        out.extend_from_slice(&[0; 8]);
        Params {
            out,
            begin,
            record: begin,
            last: (begin, begin),
            total: 0,
            cap,
            failed: None,
        }
    }

    /// One pair, its name and its value each given in pieces that are written one
    /// after the other.
    pub(crate) fn pair(&mut self, name: &[&[u8]], value: &[&[u8]]) {
        if self.failed.is_some() {
            return;
        }
        let name_len: usize = name.iter().map(|p| p.len()).sum();
        let value_len: usize = value.iter().map(|p| p.len()).sum();
        let size = len_size(name_len) + len_size(value_len) + name_len + value_len;
        // A pair must fit one record: php-fpm reads each record's pairs on their own.
        if size > MAX_PARAMS_RECORD {
            self.failed = Some(Error::ParamTooLong);
            return;
        }
        self.total += size;
        if self.total > self.cap {
            self.failed = Some(Error::ParamsTooLarge);
            return;
        }
        // Room for the pair and a record header at once: the writes below never grow.
        self.out.reserve(size + 8);
        if self.out.len() - self.record - 8 + size > MAX_PARAMS_RECORD {
            self.close_record();
            self.record = self.out.len();
            self.out.extend_from_slice(&[0; 8]);
        }
        push_len(self.out, name_len);
        push_len(self.out, value_len);
        let at_name = self.out.len();
        for piece in name {
            self.out.extend_from_slice(piece);
        }
        let at_value = self.out.len();
        for piece in value {
            self.out.extend_from_slice(piece);
        }
        self.last = (at_name, at_value);
    }

    /// The last pair's name and value, to change in place (their lengths are written).
    pub(crate) fn last_mut(&mut self) -> (&mut [u8], &mut [u8]) {
        let (name, value) = self.last;
        let (head, tail) = self.out.split_at_mut(value);
        (&mut head[name..], tail)
    }

    /// Fills in the open record's header and pads it.
    fn close_record(&mut self) {
        let len = self.out.len() - self.record - 8;
        self.out[self.record..self.record + 8].copy_from_slice(&header_bytes(PARAMS, len));
        padding(self.out, len);
    }

    pub(crate) fn finish(mut self) -> Result<(), Error> {
        if let Some(e) = self.failed {
            self.out.truncate(self.begin);
            return Err(e);
        }
        if self.out.len() == self.record + 8 {
            self.out.truncate(self.record);
        } else {
            self.close_record();
        }
        header(self.out, PARAMS, 0);
        Ok(())
    }
}

fn len_size(n: usize) -> usize {
    if n < 128 {
        1
    } else {
        4
    }
}

fn push_len(out: &mut Vec<u8>, n: usize) {
    if n < 128 {
        out.push(n as u8);
    } else {
        out.extend_from_slice(&((n as u32) | 0x8000_0000).to_be_bytes());
    }
}

/// The request body as STDIN records, then the empty STDIN record.
pub(crate) fn stdin(out: &mut Vec<u8>, body: &[u8]) {
    for piece in body.chunks(MAX_CONTENT) {
        stdin_piece(out, piece);
    }
    stdin_end(out);
}

/// One STDIN record holding `piece` (at most [`MAX_CONTENT`] bytes).
pub(crate) fn stdin_piece(out: &mut Vec<u8>, piece: &[u8]) {
    header(out, STDIN, piece.len());
    out.extend_from_slice(piece);
    padding(out, piece.len());
}

/// The empty STDIN record that ends the body.
pub(crate) fn stdin_end(out: &mut Vec<u8>) {
    header(out, STDIN, 0);
}

/// One record's worth of what the application sent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record {
    Stdout(Bytes),
    Stderr(Bytes),
    /// END_REQUEST: the application's exit status and the protocol status (0: the
    /// request completed).
    End {
        app_status: u32,
        protocol_status: u8,
    },
}

/// Reads records out of a buffer as bytes arrive; holds no more than one record's
/// content.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// The current record: (type, content bytes still to come, padding still to come).
    current: Option<(u8, usize, usize)>,
    /// END_REQUEST's content, gathered.
    end: Vec<u8>,
}

impl Decoder {
    /// The next record (or piece of a STDOUT/STDERR record's content) in `buf`;
    /// `Ok(None)` when more bytes are needed.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Record>, Error> {
        loop {
            let Some((kind, left, pad)) = self.current else {
                if buf.len() < 8 {
                    return Ok(None);
                }
                let h = &buf[..8];
                if h[0] != VERSION {
                    return Err(Error::Version(h[0]));
                }
                let id = u16::from_be_bytes([h[2], h[3]]);
                let kind = h[1];
                let len = u16::from_be_bytes([h[4], h[5]]) as usize;
                let pad = h[6] as usize;
                if id != REQUEST_ID {
                    return Err(Error::RequestId(id));
                }
                if !matches!(kind, STDOUT | STDERR | END_REQUEST) {
                    return Err(Error::Type(kind));
                }
                if kind == END_REQUEST && len != 8 {
                    return Err(Error::EndRequest);
                }
                buf.advance(8);
                self.current = Some((kind, len, pad));
                continue;
            };
            if left > 0 {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = left.min(buf.len());
                self.current = Some((kind, left - n, pad));
                match kind {
                    END_REQUEST => {
                        self.end.extend_from_slice(&buf[..n]);
                        buf.advance(n);
                        continue;
                    }
                    _ => {
                        let data = buf.split_to(n).freeze();
                        return Ok(Some(if kind == STDOUT {
                            Record::Stdout(data)
                        } else {
                            Record::Stderr(data)
                        }));
                    }
                }
            }
            if pad > 0 {
                let n = pad.min(buf.len());
                if n == 0 {
                    return Ok(None);
                }
                buf.advance(n);
                self.current = Some((kind, 0, pad - n));
                continue;
            }
            self.current = None;
            if kind == END_REQUEST {
                let e = std::mem::take(&mut self.end);
                return Ok(Some(Record::End {
                    app_status: u32::from_be_bytes([e[0], e[1], e[2], e[3]]),
                    protocol_status: e[4],
                }));
            }
            // An empty STDOUT or STDERR record: the end of that stream; nothing to hand on.
        }
    }

    /// Between records: nothing half-read.
    pub(crate) fn is_idle(&self) -> bool {
        self.current.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_split_and_length_forms() {
        let long = vec![b'v'; 200];
        let mut out = Vec::new();
        params(&mut out, &[(b"A", b"1"), (b"LONG", &long)], 1 << 20).unwrap();
        // One PARAMS record with content, then the empty one.
        assert_eq!(&out[..2], &[1, PARAMS]);
        let len = u16::from_be_bytes([out[4], out[5]]) as usize;
        assert_eq!(len, 1 + 1 + 1 + 1 + 1 + 4 + 4 + 200);
        assert_eq!(&out[8..12], &[1, 1, b'A', b'1']);
        assert_eq!(&out[12..17], &[4, 0x80, 0, 0, 200]);
        let tail = &out[out.len() - 8..];
        assert_eq!(tail, &[1, PARAMS, 0, 1, 0, 0, 0, 0]);
        assert_eq!(out.len() % 8, 0);
        // Pairs never straddle records, and no record passes 65,535 bytes with padding.
        let big = vec![b'b'; 40_000];
        let mut out = Vec::new();
        params(
            &mut out,
            &[(b"A", &big), (b"B", &big), (b"C", b"c")],
            1 << 20,
        )
        .unwrap();
        let first = u16::from_be_bytes([out[4], out[5]]) as usize;
        assert_eq!(first, 1 + 4 + 1 + 40_000);
        let mut at = 0;
        while at < out.len() {
            let len = u16::from_be_bytes([out[at + 4], out[at + 5]]) as usize;
            let pad = out[at + 6] as usize;
            assert!(len + pad <= 65_535);
            at += 8 + len + pad;
        }
        // A value a record cannot carry, and an aggregate over the cap.
        let huge = vec![b'x'; MAX_PARAMS_RECORD];
        assert_eq!(
            params(&mut Vec::new(), &[(b"H", &huge)], 1 << 20),
            Err(Error::ParamTooLong)
        );
        assert_eq!(
            params(&mut Vec::new(), &[(b"A", &long)], 100),
            Err(Error::ParamsTooLarge)
        );
    }

    #[test]
    fn stdin_records_carry_exact_lengths() {
        let body = vec![7u8; MAX_CONTENT + 10];
        let mut out = Vec::new();
        stdin(&mut out, &body);
        assert_eq!(u16::from_be_bytes([out[4], out[5]]) as usize, MAX_CONTENT);
        let second = 8 + MAX_CONTENT + (8 - MAX_CONTENT % 8) % 8;
        assert_eq!(u16::from_be_bytes([out[second + 4], out[second + 5]]), 10);
        assert_eq!(&out[out.len() - 8..], &[1, STDIN, 0, 1, 0, 0, 0, 0]);
    }

    fn record(kind: u8, content: &[u8], pad: u8) -> Vec<u8> {
        let mut r = vec![
            1,
            kind,
            0,
            1,
            (content.len() >> 8) as u8,
            content.len() as u8,
            pad,
            0,
        ];
        r.extend_from_slice(content);
        r.extend(std::iter::repeat_n(0u8, pad as usize));
        r
    }

    #[test]
    fn decoder_reads_across_any_split() {
        let mut wire = record(STDOUT, b"Status: 200\r\n\r\nhello", 3);
        wire.extend(record(STDERR, b"warn", 4));
        wire.extend(record(STDOUT, b"", 0));
        wire.extend(record(END_REQUEST, &[0, 0, 0, 0, 0, 0, 0, 0], 0));
        for step in 1..wire.len() {
            let mut d = Decoder::default();
            let mut buf = BytesMut::new();
            let (mut out, mut err, mut end) = (Vec::new(), Vec::new(), None);
            for piece in wire.chunks(step) {
                buf.extend_from_slice(piece);
                while let Some(r) = d.decode(&mut buf).unwrap() {
                    match r {
                        Record::Stdout(b) => out.extend_from_slice(&b),
                        Record::Stderr(b) => err.extend_from_slice(&b),
                        Record::End {
                            app_status,
                            protocol_status,
                        } => end = Some((app_status, protocol_status)),
                    }
                }
            }
            assert_eq!(out, b"Status: 200\r\n\r\nhello", "step {step}");
            assert_eq!(err, b"warn");
            assert_eq!(end, Some((0, 0)));
            assert!(d.is_idle());
        }
    }

    #[test]
    fn decoder_refuses_what_is_not_ours() {
        let mut buf = BytesMut::from(&[2u8, STDOUT, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(Decoder::default().decode(&mut buf), Err(Error::Version(2)));
        let mut buf = BytesMut::from(&[1u8, STDOUT, 0, 2, 0, 0, 0, 0][..]);
        assert_eq!(
            Decoder::default().decode(&mut buf),
            Err(Error::RequestId(2))
        );
        let mut buf = BytesMut::from(&[1u8, 9, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(Decoder::default().decode(&mut buf), Err(Error::Type(9)));
        let mut buf = BytesMut::from(&[1u8, END_REQUEST, 0, 1, 0, 4, 0, 0][..]);
        assert_eq!(Decoder::default().decode(&mut buf), Err(Error::EndRequest));
    }
}
