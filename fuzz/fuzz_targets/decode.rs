//! The recording decoder over arbitrary bytes: every record or error, never a panic, a hang
//! or an unbounded allocation, and the same answer whether the bytes come in one slice or a
//! few at a time. See `stallscope_fuzz::decode`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stallscope_fuzz::decode(data);
});
