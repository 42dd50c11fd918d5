//! Link settings that make the library pass for the real driver and keep it loaded.
fn main() {
    // The SONAME of the real driver, wherever the name is read back (readelf, a loader cache,
    // a profiler matching libraries).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // cuInit starts engine threads that run for the life of the process: a dlclose must never
    // unmap their code, so the library cannot be unloaded (as with the real driver in practice).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
