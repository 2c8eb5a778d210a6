//! `--device`: the backend is a run-time choice; the library crates never name one.

use anyhow::{Result, bail};
use burn::prelude::*;

/// The backend `--device cpu` means: the faster CPU backend on the reference config, as measured
/// by `scripts/bench-cpu-backends.sh` (see the README's table).
pub const CPU_DEFAULT: &str = "flex";

/// The CPU device `--device cpu` means, where a fresh model's weights are drawn whatever the
/// device, so that a seed gives the same weights on every backend.
pub fn host() -> Device {
    #[cfg(feature = "flex")]
    return Device::flex();
    #[cfg(not(feature = "flex"))]
    Device::default()
}

/// Names accepted by `--device` in this build.
pub fn available() -> Vec<&'static str> {
    let mut v = vec!["cpu"];
    if cfg!(feature = "flex") {
        v.push("flex");
    }
    if cfg!(feature = "ndarray") {
        v.push("ndarray");
    }
    if cfg!(feature = "wgpu") {
        v.push("wgpu");
    }
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    v
}

// `--device NAME` for the commands that take it, flattened into their arguments
// (`#[command(flatten)]`). No `///` here: it would become help text. `train` keeps its own
// field, whose help lists the names.
#[derive(clap::Args, Debug)]
pub struct DeviceArgs {
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

impl DeviceArgs {
    /// The device `--device` names, and its canonical name.
    pub fn select(&self) -> Result<(Device, String)> {
        select(&self.device)
    }
}

/// Resolves a `--device` name to a device and its canonical name.
pub fn select(name: &str) -> Result<(Device, String)> {
    let canonical = if name == "cpu" { CPU_DEFAULT } else { name };
    let device = match canonical {
        #[cfg(feature = "flex")]
        "flex" => Device::flex(),
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        "ndarray" => Device::ndarray(),
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            let d = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
            probe(
                &d,
                "wgpu",
                "install a Vulkan driver (Debian: mesa-vulkan-drivers for the lavapipe software driver) or use --device cpu",
            )?;
            d
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            let d = Device::cuda(0);
            probe(&d, "cuda", "check the NVIDIA driver, or use --device cpu")?;
            d
        }
        // a backend of the CLI's features that this build left out
        off if ["flex", "ndarray", "wgpu", "cuda"].contains(&off) => bail!(
            "--device {off} is not built in: rebuild with `--features {off}`, or use one of {}",
            available().join(", ")
        ),
        other => bail!("--device {other} is not available in this build: use one of {}", available().join(", ")),
    };
    // Burn materialises some state (e.g. reloaded optimizer moments) on `Device::default()`,
    // which would otherwise be the first GPU backend compiled in.
    // SAFETY: called from main before any other thread is started.
    unsafe { std::env::set_var("BURN_DEVICE", canonical) };
    Ok((device, canonical.to_string()))
}

/// Runs a tiny op so that a missing driver is a clear error here, not a panic mid-run.
#[allow(dead_code)]
fn probe(device: &Device, name: &str, hint: &str) -> Result<()> {
    let d = device.clone();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let ok = std::panic::catch_unwind(move || Tensor::<1>::ones([4], &d).sum().into_scalar::<f32>()).ok();
    std::panic::set_hook(hook);
    match ok {
        Some(v) if (v - 4.0).abs() < 1e-6 => Ok(()),
        Some(v) => bail!("--device {name} computed 1+1+1+1 = {v}: the driver is broken; {hint}"),
        None => bail!("--device {name}: no usable adapter found; {hint}"),
    }
}
