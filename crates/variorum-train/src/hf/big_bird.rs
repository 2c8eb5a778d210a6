//! BigBird as a masked language model (`model_type = "big_bird"`, `BigBirdForMaskedLM`; Zaheer et
//! al. 2020) is BERT (its tensors are BERT's, under `bert.`) with the `bigbird` kind for
//! attention; [`super::bert::map`] reads the rest. This file says what its attention settings
//! are in the kind's terms.
//!
//! transformers' block-sparse attention (the authors' ITC layout) gives every query block its
//! block and one each side (`window_blocks = 1`), the first and the last block as global blocks
//! (`global_tokens = block_size`, `global_last_block`), and `num_random_blocks` random blocks —
//! drawn only in training: in eval mode its draw returns block 0 for every one of them, which the
//! kind computes as `random_draw = "first-block"` (block 0's keys counted once more per random
//! block). A text of at most (5 + 2r)·b tokens gets full attention (`full_up_to`). transformers
//! pads the text to a multiple of the block with masked keys, which leaves the text's scores as
//! they are. `attention_type = "original_full"` is BERT's full attention.

use anyhow::{Result, bail};

use super::config::HfConfig;
use super::{int, table};

/// The `[model.attention]` table of a BigBird config: `heads` heads, `dropout` on the weights.
pub(crate) fn attention(cfg: &mut HfConfig, heads: usize, dropout: f64) -> Result<toml::Value> {
    let path = cfg.path().display().to_string();
    if !cfg.bool_or("use_bias", true)? {
        bail!(
            "{path}: use_bias = false is not supported: variorum's attention has biases on q, k, v and the output or none"
        );
    }
    let mut a = vec![("n_heads", int(heads)), ("bias", true.into()), ("dropout", dropout.into())];
    match cfg.str_or("attention_type", "block_sparse")?.as_str() {
        "original_full" => {
            // read only by the block-sparse attention
            cfg.ignore(&["block_size", "num_random_blocks"]);
            a.insert(0, ("kind", "full".into()));
        }
        "block_sparse" => {
            let (block, random) = (cfg.usize("block_size")?, cfg.usize("num_random_blocks")?);
            if block == 0 {
                bail!("{path}: block_size = 0 leaves no block");
            }
            a.insert(0, ("kind", "bigbird".into()));
            a.extend([
                ("block", int(block)),
                ("window_blocks", int(1)),
                ("random_blocks", int(random)),
                ("global_tokens", int(block)),
                ("global_last_block", true.into()),
                ("random_draw", "first-block".into()),
                ("full_up_to", int((5 + 2 * random) * block)),
            ]);
        }
        other => bail!("{path}: attention_type = {other:?} is not supported (block_sparse, original_full)"),
    }
    Ok(table(a))
}
