//! Arbitrary bytes through what `stallscope report` runs: load, attribute, the text and JSON
//! reports, every flame graph's folded stacks and one SVG. Errors are fine; panics are bugs.
//! See `stallscope_fuzz::report`. A third of the mutations are `stallscope_fuzz::
//! mutate_numbers`, which sets integer fields to edge values; the rest are libFuzzer's own.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

fuzz_target!(|data: &[u8]| {
    let _ = stallscope_fuzz::report(data);
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    if seed.is_multiple_of(3) {
        let mutated = stallscope_fuzz::mutate_numbers(&data[..size], seed);
        if mutated.len() <= max_size && mutated != data[..size] {
            data[..mutated.len()].copy_from_slice(&mutated);
            return mutated.len();
        }
    }
    fuzzer_mutate(data, size, max_size)
});
