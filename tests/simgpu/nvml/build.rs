//! Gives the library the SONAME the real driver's has, so it passes for it wherever the name is
//! read back (readelf, a loader cache, a profiler matching libraries).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
