//! `#[backend_extension(Cube, …)]` gates its cubecl arm on a `cube_backend` cfg of the crate that
//! uses it (Burn sets its own in burn-dispatch's build script): set it here when this crate is
//! built for a cubecl backend.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(cube_backend)");
    if std::env::var_os("CARGO_FEATURE_WGPU").is_some() || std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo::rustc-cfg=cube_backend");
    }
}
