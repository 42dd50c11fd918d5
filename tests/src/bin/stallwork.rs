//! `stallwork`: workloads with a known time split, for stallscope's end-to-end tests, demo and
//! benchmarks. See `stallwork` without arguments for the commands.
use std::process::ExitCode;

use stallscope_tests::args;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match args::parse(&argv).and_then(stallscope_tests::run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stallwork: {e}");
            ExitCode::FAILURE
        }
    }
}
