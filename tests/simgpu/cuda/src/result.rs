//! CUresult codes (values from cuda.h) and their names and descriptions.
use std::ffi::CStr;

/// `CUresult` is a C enum: an int-sized value.
pub type CUresult = u32;
/// The Rust-side form of a failing call.
pub type CuResult<T> = Result<T, CUresult>;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// (code, name, description) as cuGetErrorName / cuGetErrorString return them.
const TABLE: &[(CUresult, &CStr, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_NOT_READY,
        c"CUDA_ERROR_NOT_READY",
        c"device not ready",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"part or all of the requested memory range is already mapped",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"pointer does not correspond to a registered memory region",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The name of `code`, if it is one this driver knows.
pub fn name(code: CUresult) -> Option<&'static CStr> {
    TABLE.iter().find(|e| e.0 == code).map(|e| e.1)
}

/// The description of `code`, if it is one this driver knows.
pub fn description(code: CUresult) -> Option<&'static CStr> {
    TABLE.iter().find(|e| e.0 == code).map(|e| e.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_names_and_descriptions() {
        assert_eq!(name(CUDA_ERROR_NOT_READY), Some(c"CUDA_ERROR_NOT_READY"));
        assert_eq!(description(CUDA_SUCCESS), Some(c"no error"));
        assert_eq!(name(12345), None);
    }
}
