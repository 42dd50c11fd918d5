#![no_std]
// Exists so that cargo sees a library target; the programs live in the `stallscope` binary.
