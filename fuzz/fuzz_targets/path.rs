//! Path and host normalisation: the result is normal, idempotent and never above `/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice::fuzzing::path(data);
});
