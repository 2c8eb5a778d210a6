//! Shared by the integration tests of this crate.

/// Burn's CPU backends seed one process-wide RNG: tests that rely on seeded initialisation or
/// dropout must not run concurrently with each other.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}
