//! Reading a model's weights from a `.bpk` file, with an error that says what went wrong.

use std::path::Path;

use burn::module::Module;
use burn::store::RecordError;

/// `model` with the weights of `path`, or a one-line error naming the file and what it lacks.
/// Weights written by an older variorum may lack parameters a kind has gained since (GTrXL's
/// learned gate bias, RFA's learned scale, Longformer's global projections): the message says
/// so, and docs/upgrading.md lists the option that loads them as trained.
pub fn load_weights<M: Module>(model: M, path: &Path, what: &str) -> anyhow::Result<M> {
    let file = || format!("{what} {}", path.display());
    model.try_load_file(path).map_err(|e| match e {
        // Burn reports these as one debug-printed list of every tensor: a model of another size
        // gives a line per tensor. Count them and name the first.
        RecordError::Validation(msg) if msg.starts_with("Missing tensors") && !quoted(&msg).is_empty() => {
            let missing = quoted(&msg);
            anyhow::anyhow!(
                "{} lacks {} parameter(s) the config expects (first: {}): written by an older \
                 variorum or for another config; docs/upgrading.md lists the options that load older runs",
                file(),
                missing.len(),
                missing.first().map_or("?", |s| s.as_str())
            )
        }
        RecordError::Validation(msg) if msg.starts_with("Apply errors") && !quoted(&msg).is_empty() => {
            let errors = quoted(&msg);
            let first = errors.first().map_or("?".to_string(), |e| shapes_in_words(e));
            anyhow::anyhow!(
                "{} does not fit the config: {} tensor(s) differ (first: {first}); the weights were \
                 written for another config",
                file(),
                errors.len()
            )
        }
        RecordError::Validation(msg) if msg.starts_with("Unused tensors") && !quoted(&msg).is_empty() => {
            let unused = quoted(&msg);
            anyhow::anyhow!(
                "{} holds {} tensor(s) the config has no place for (first: {}): the weights were \
                 written for another config",
                file(),
                unused.len(),
                unused.first().map_or("?", |s| s.as_str())
            )
        }
        e => {
            // one line, and short: a message may quote names from the file
            let e: String = e.to_string().replace('\n', " ").chars().take(300).collect();
            anyhow::anyhow!("{} cannot be loaded: {e}", file())
        }
    })
}

/// The strings of a debug-printed `Vec<String>` inside `msg` (`["a", "b\"c", "d\u{1b}"]`).
/// Burn gives these lists only as text, and Rust's debug format is not JSON (`\u{…}` escapes),
/// nor has it a parser crate: a few lines read it. An escape is kept as the escaped character,
/// `\u{…}` and `\n` as `?`; each name is cut to 120 characters (names come from the file).
fn quoted(msg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let mut chars = msg[msg.find('[').unwrap_or(msg.len())..].chars();
    while let Some(c) = chars.next() {
        match (&mut current, c) {
            (None, '"') => current = Some(String::new()),
            (None, _) => {}
            (Some(s), '"') => {
                out.push(std::mem::take(s));
                current = None;
            }
            (Some(s), '\\') => match chars.next() {
                Some('u') => {
                    chars.by_ref().take_while(|&c| c != '}').for_each(drop);
                    s.push('?');
                }
                Some('n') => s.push('?'),
                Some(e) => s.push(e),
                None => {}
            },
            (Some(s), c) => {
                if s.chars().count() < 120 {
                    s.push(c)
                }
            }
        }
    }
    out
}

/// `path: shape mismatch, expected Shape { dims: [a, b] } but record has Shape { dims: [c, d] }`
/// as `path: the config has [a, b], the file [c, d]`; anything else as it is.
fn shapes_in_words(error: &str) -> String {
    let dims: Vec<&str> = error.split("dims: ").skip(1).filter_map(|s| s.split(']').next()).collect();
    match (error.split_once(": shape mismatch"), dims.as_slice()) {
        (Some((path, _)), [expected, found]) => format!("{path}: the config has {expected}], the file {found}]"),
        _ => error.to_string(),
    }
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

    #[test]
    fn debug_printed_lists_are_read_with_their_escapes() {
        let msg = r#"Unused tensors: ["a\u{1b}b", "c\"d", "e\\f", "g\nh", "plain.weight"]"#;
        assert_eq!(quoted(msg), ["a?b", "c\"d", "e\\f", "g?h", "plain.weight"]);
        assert!(quoted("Missing tensors: []").is_empty());
        let long = format!("Unused tensors: [\"{}\"]", "x".repeat(10_000));
        assert_eq!(quoted(&long)[0].len(), 120);
    }

    #[test]
    fn weights_of_another_size_are_summed_up_in_one_short_line() {
        let dev = Device::flex();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bpk");
        LinearConfig::new(3, 2).init(&dev).save_file(&path).unwrap();
        // every tensor another shape: one line that counts them and names the first
        let err = load_weights(LinearConfig::new(300, 200).init(&dev), &path, "weights").unwrap_err().to_string();
        assert!(err.contains("does not fit the config: 2 tensor(s) differ"), "{err}");
        assert!(
            err.contains("the config has [200], the file [2]")
                || err.contains("the config has [300, 200], the file [3, 2]"),
            "{err}"
        );
        assert!(!err.contains('\n') && err.len() < 300, "{err}");
        // tensors the model has no place for
        let err = load_weights(LinearConfig::new(3, 2).with_bias(false).init(&dev), &path, "weights")
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds 1 tensor(s) the config has no place for (first: bias)"), "{err}");
    }
}
