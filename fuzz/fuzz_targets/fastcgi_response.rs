//! What a FastCGI application sends back, from anywhere: the record decoder, fed in
//! pieces whose sizes the input chooses, and the response-head parser on the STDOUT it
//! yields. Neither may panic, loop, or hold more than one record's content.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice::fuzzing::fastcgi_response(data);
});
