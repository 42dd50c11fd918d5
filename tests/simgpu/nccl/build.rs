//! Link settings that make the library pass for the real NCCL and keep it loaded.
fn main() {
    // The SONAME of the real library, wherever the name is read back.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    // Collectives queue host functions of this library on libcuda's engine threads: a dlclose
    // must never unmap their code while a stream still holds them.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
