//! Arbitrary config text through the lexer, parser and builder: never a panic, and
//! every error or warning points at a line and column inside the text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice::fuzzing::config(data);
});
