//! Learned absolute positions (Gehring et al. 2017; GPT): a trainable vector per position,
//! `P ∈ R^{max_len × d}`, added to the token embeddings. It cannot encode a position past
//! `max_len`: the model refuses longer sequences with a clear error before reaching here.
//!
//! With `per_layer = true` every block gets its own table, added to its input (Al-Rfou et al.
//! 2018, "Character-Level Language Modeling with Deeper Self-Attention"), instead of one table
//! added to the embeddings.

use crate::AbsolutePosition;
use crate::kind::{AbsoluteSignal, HeadShape, PositionKind};
use burn::module::Param;
use burn::nn::Initializer;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;
use variorum_core::{ConfigError, error::check};

/// `model.position` with `kind = "learned"`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnedPositionConfig {
    /// Size of the table. Default: the model's context length `model.seq_len`.
    pub max_len: Option<usize>,
    /// A separate table before every block instead of one before the first. Default false.
    pub per_layer: bool,
}

impl LearnedPositionConfig {
    /// Checks the table covers the context `model.seq_len`; messages name the config key.
    pub fn validate(&self, context: usize) -> Result<(), ConfigError> {
        if let Some(m) = self.max_len {
            check(m >= context, || {
                format!(
                    "model.position.max_len = {m} is shorter than model.seq_len = {context}: raise max_len or leave it out"
                )
            })?;
        }
        Ok(())
    }

    /// One table, `max_len` (or `context`) rows starting normal with std 0.02.
    pub fn init(&self, d_model: usize, context: usize, device: &Device) -> LearnedPosition {
        let max_len = self.max_len.unwrap_or(context);
        LearnedPosition { table: Initializer::Normal { mean: 0.0, std: 0.02 }.init([max_len, d_model], device) }
    }
}

/// A learned vector per absolute position, added to the residual stream.
#[derive(Module, Debug)]
pub struct LearnedPosition {
    /// `[max_len, d_model]`
    pub table: Param<Tensor<2>>,
}

impl LearnedPosition {
    /// Rows of the table: the longest sequence it encodes.
    pub fn max_len(&self) -> usize {
        self.table.val().dims()[0]
    }

    /// Rows `start..start+len`. Callers check the length first (`DecoderLm` does).
    pub fn encode(&self, start: usize, len: usize) -> Tensor<2> {
        let table = self.table.val();
        let [max_len, d] = table.dims();
        assert!(start + len <= max_len, "learned position table has {max_len} rows, asked for {}", start + len);
        table.slice([start..start + len, 0..d])
    }
}

impl PositionKind for LearnedPositionConfig {
    const SUMMARY: &'static str =
        "a learned vector per absolute position up to max_len, once or before every block (per_layer)";
    const PAPER: &'static str = "Gehring et al. 2017; Radford et al. 2018 (GPT); Al-Rfou et al. 2018 (per layer)";
    const CAPS: Capabilities = Capabilities { absolute: true, variable_length: false, ..Capabilities::NEUTRAL };

    /// A table before every block is a per-layer signal.
    fn capabilities(&self) -> Capabilities {
        Capabilities { per_layer: self.per_layer, ..Self::CAPS }
    }

    fn expanded(&self, context: usize) -> Self {
        Self { max_len: Some(self.max_len.unwrap_or(context)), ..self.clone() }
    }

    fn validate(&self, _heads: HeadShape, context: usize) -> Result<(), ConfigError> {
        LearnedPositionConfig::validate(self, context)
    }

    fn init_input(&self, d_model: usize, context: usize, device: &Device) -> Option<AbsolutePosition> {
        (!self.per_layer).then(|| self.init(d_model, context, device).into())
    }

    fn init_layer(&self, _layer: usize, d_model: usize, context: usize, device: &Device) -> Option<AbsolutePosition> {
        self.per_layer.then(|| self.init(d_model, context, device).into())
    }

    fn max_len(&self, context: usize) -> Option<usize> {
        Some(self.max_len.unwrap_or(context))
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![
            ("table longer than the context", Self { max_len: Some(32), per_layer: false }),
            ("per layer", Self { max_len: None, per_layer: true }),
        ]
    }
}

impl AbsoluteSignal for LearnedPosition {
    fn encode(&self, start: usize, len: usize, _device: &Device) -> Tensor<2> {
        LearnedPosition::encode(self, start, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positions `start..start + len` read rows `start..start + len` of the table, whatever the
    /// start (a cached decoding step reads its own position's row).
    #[test]
    fn positions_read_their_own_rows() {
        let device = Device::default();
        let (rows, d) = (6usize, 3usize);
        let mut learned = LearnedPositionConfig::default().init(d, rows, &device);
        let values: Vec<f32> = (0..rows * d).map(|x| x as f32).collect();
        learned.table = Param::from_tensor(Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, d]), &device));
        for (start, len) in [(0, rows), (2, 3), (5, 1)] {
            let got = learned.encode(start, len).into_data().try_to_vec::<f32>().unwrap();
            assert_eq!(got, values[start * d..(start + len) * d], "rows {start}..{}", start + len);
        }
    }
}
