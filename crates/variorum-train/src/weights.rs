//! Reading a model's weights from a `.bpk` file, with an error that says what went wrong.

use std::path::Path;

use burn::module::Module;
use burn::store::RecordError;

/// `model` with the weights of `path`, or a one-line error naming the file and what it lacks.
/// Weights written by an older variorum may lack parameters a kind has gained since (GTrXL's
/// learned gate bias, RFA's learned scale, Longformer's global projections): the message says
/// so, and docs/upgrading.md lists the option that loads them as trained.
pub fn load_weights<M: Module>(model: M, path: &Path, what: &str) -> anyhow::Result<M> {
    model.try_load_file(path).map_err(|e| match e {
        RecordError::Validation(msg) if msg.starts_with("Missing tensors") => {
            let missing: Vec<&str> = msg.split('"').skip(1).step_by(2).collect();
            anyhow::anyhow!(
                "{what} {} lacks {} parameter(s) the config expects (first: {}): written by an older \
                 variorum or for another config; docs/upgrading.md lists the options that load older runs",
                path.display(),
                missing.len(),
                missing.first().copied().unwrap_or("?")
            )
        }
        e => anyhow::anyhow!("{what} {} cannot be loaded: {e}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::LinearConfig;
    use burn::prelude::*;

    #[test]
    fn missing_parameters_are_named_in_one_line() {
        let dev = Device::flex();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.bpk");
        LinearConfig::new(3, 2).with_bias(false).init(&dev).save_file(&path).unwrap();
        let err = load_weights(LinearConfig::new(3, 2).init(&dev), &path, "weights").unwrap_err().to_string();
        assert!(err.contains("lacks 1 parameter(s)") && err.contains("(first: bias)"), "{err}");
        assert!(err.contains("docs/upgrading.md") && !err.contains('\n'), "{err}");
        // what matches loads
        let back = load_weights(LinearConfig::new(3, 2).with_bias(false).init(&dev), &path, "weights");
        assert!(back.is_ok());
        let garbage = dir.path().join("garbage.bpk");
        std::fs::write(&garbage, b"not a burnpack").unwrap();
        let err = load_weights(LinearConfig::new(3, 2).init(&dev), &garbage, "weights").unwrap_err().to_string();
        assert!(err.starts_with("weights ") && err.contains("cannot be loaded"), "{err}");
    }
}
