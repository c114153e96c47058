//! Fuzzes the embedded server's frame decoding: connect requests and every request opcode.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    distlock_server::decode_for_fuzzing(data);
});
