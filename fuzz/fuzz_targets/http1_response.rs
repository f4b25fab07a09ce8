//! Responses from a backend, read in pieces: head scanner, head parser (interim
//! answers skipped) and body decoder (length, chunked, until close). HEAD, 204 and 304
//! answers have no body.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice::fuzzing::http1_response(data);
});
