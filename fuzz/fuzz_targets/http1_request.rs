//! Pipelined requests from a client, read in pieces: head scanner, head parser and
//! body decoder (length and chunked). A parsed head has one framing, and a body never
//! yields more bytes than arrived for it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice::fuzzing::http1_request(data);
});
