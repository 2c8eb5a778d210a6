//! Attention patterns as the papers draw them (`variorum pattern`): a query × key grid of what
//! each query may attend to, read from the real modules — never redrawn by hand — so the
//! picture is the mechanism's truth by construction.
//!
//! Two readings, one per kind of mechanism:
//! - **weights**: a kind that forms attention weights hands them to
//!   [`DecoderLm::attention_maps`]; entry (i, j) of head h is reachable when its weight is not
//!   zero (hidden entries are exactly zero after the normaliser: the masked score underflows).
//!   Heads are drawn apart, since patterns differ per head (dilated and strided heads, BigBird's
//!   random blocks are per layer);
//! - **gradient**: a kind without weights (kernelised, sorted buckets, recurrent sums) is read
//!   from its layer alone: key j is reachable from query i when output i's gradient with respect
//!   to input j is not zero. A data-dependent selection (hash buckets, clusters, top-k queries)
//!   is an integer choice the gradient does not pass through, so it reads the keys chosen for
//!   this input — where perturbing input j would move the buckets themselves and reach
//!   everything. One grid for the layer (its heads are mixed by the output projection).
//!
//! Data-dependent kinds (LSH, routing, Sinkhorn, clustered) draw the pattern of the input they
//! are given: random states for a config, or a text through a trained run.

use std::path::Path;

use anyhow::{Result, bail};
use burn::prelude::*;
use plotters::coord::Shift;
use plotters::prelude::*;
use rand::{Rng, SeedableRng};
use variorum_attention::AttentionInput;
use variorum_model::{DecoderLm, ModelConfig};

/// How a pattern was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// From the attention weights the kind forms, per head.
    Weights,
    /// From which inputs each output's gradient reaches, for the layer.
    Gradient,
}

/// The reachable (query, key) entries of one layer.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// `model.attention.kind`.
    pub kind: String,
    /// The block application read (0 = nearest the embeddings).
    pub layer: usize,
    /// Positions on each axis.
    pub len: usize,
    /// How the pattern was read.
    pub reading: Reading,
    /// One `len × len` grid per head (weights) or one for the layer (gradient), row-major
    /// (query i, key j at `i * len + j`).
    pub grids: Vec<Vec<bool>>,
}

impl Pattern {
    /// Whether any grid reaches (query i, key j).
    pub fn reachable(&self, i: usize, j: usize) -> bool {
        self.grids.iter().any(|g| g[i * self.len + j])
    }

    /// The share of reachable entries per grid.
    pub fn densities(&self) -> Vec<f64> {
        self.grids.iter().map(|g| g.iter().filter(|&&r| r).count() as f64 / g.len().max(1) as f64).collect()
    }
}

/// Reads the pattern of `model`'s block application `layer` over `tokens` (`[1, len]`): from the
/// weights when the kind forms them and `reading` allows, else from the layer's gradients.
pub fn read(
    model: &DecoderLm,
    cfg: &ModelConfig,
    tokens: Tensor<2, Int>,
    layer: usize,
    reading: Option<Reading>,
) -> Result<Pattern> {
    let [_, len] = tokens.dims();
    if layer >= model.depth {
        bail!("--layer {layer}: the model has {} layers (0..{})", model.depth, model.depth);
    }
    let kind = cfg.attention.kind().to_string();
    if model.encoder.is_some() {
        bail!("an encoder–decoder's decoder reads a source beside its text: its patterns are not drawn yet");
    }
    let maps = if reading == Some(Reading::Gradient) { None } else { model.attention_maps(tokens.clone()).ok() };
    if let Some(Some(w)) = maps.and_then(|m| m.into_iter().nth(layer)) {
        let [_, h, lq, lk] = w.dims();
        let values = w.into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default();
        if (lq, lk) != (len, len) || values.len() != h * len * len {
            bail!("the weights of layer {layer} are {lq} × {lk}, not {len} × {len}: this model cannot be drawn");
        }
        let grids = (0..h)
            .map(|head| values[head * lq * lk..(head + 1) * lq * lk].iter().map(|&v| v != 0.0).collect())
            .collect();
        return Ok(Pattern { kind, layer, len, reading: Reading::Weights, grids });
    }
    if reading == Some(Reading::Weights) {
        bail!("model.attention.kind = \"{kind}\" forms no attention weights in layer {layer}: read it from gradients");
    }
    let grid = gradient_reach(model, cfg, tokens, layer)?;
    Ok(Pattern { kind, layer, len, reading: Reading::Gradient, grids: vec![grid] })
}

/// Key j reaches query i when the gradient of output i (projected on a fixed random direction, so
/// one text gives one picture) with respect to the layer's input at j is not zero. The input is
/// the one the model hands the layer for `tokens` (the blocks below it run first, under the
/// model's own mask), so a data-dependent selection is the one this text gets; the layer then
/// runs on an autodiff copy of the device, with the same mask.
fn gradient_reach(model: &DecoderLm, cfg: &ModelConfig, tokens: Tensor<2, Int>, layer: usize) -> Result<Vec<bool>> {
    let kind = cfg.attention.kind();
    if model.global_embedding.is_some() {
        bail!("model.attention.kind = \"{kind}\" adds global tokens beside the sequence: its pattern is not drawn yet");
    }
    if cfg.attention.capabilities().cross_layer {
        bail!(
            "model.attention.kind = \"{kind}\" reads the previous layer's maps and forms no weights here: its pattern is not drawn"
        );
    }
    if model.reversible.is_some() && layer > 0 {
        bail!("--layer {layer}: a reversible stack's layers above the first are drawn from weights only");
    }
    if cfg.attention.dropout() > 0.0 {
        // the autodiff copy would drop a different set of weights for every query
        bail!(
            "model.attention.dropout = {} would punch random holes in a pattern read from gradients: draw a config with 0",
            cfg.attention.dropout()
        );
    }
    let [_, len] = tokens.dims();
    let plain = tokens.device();
    let (mask, dense) = model.mask(len, None, &plain);
    let mut x = model.embed(tokens, 0);
    let mut carried = variorum_attention::CarriedMaps::default();
    for i in 0..layer {
        x = model.layer(i, x, &mask, dense.clone(), None, &mut carried).x;
    }
    let x = match model.layer_positions.get(layer) {
        Some(p) => p.forward(x, 0),
        None => x,
    };
    let block = &model.blocks[layer % model.blocks.len()];
    let x = if block.pre_norm { block.attn_norm.forward(x) } else { x };
    let device = plain.autodiff();
    let x: Tensor<3> = Tensor::from_data(x.into_data(), &device);
    let (mask, dense) = model.mask(len, None, &device);
    let attn = block.attn.clone().to_device(&device);
    let d = x.dims()[2];
    // seeded apart from the device's generator, so one text gives one picture
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    let values: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let direction: Tensor<3> = Tensor::from_data(TensorData::new(values, [1, 1, d]), &device);
    let mut grid = vec![false; len * len];
    for i in 0..len {
        // one forward per query: Burn's backward consumes its graph
        let x = x.clone().require_grad();
        let input = AttentionInput::self_attention(x.clone(), &mask).with_dense_mask(dense.clone());
        let out = attn.forward(input, None).context;
        let grads = (out.narrow(1, i, 1) * direction.clone()).sum().backward();
        let Some(g) = x.grad(&grads) else { continue };
        let reach = g.abs().sum_dim(2).reshape([len]).into_data().convert::<f32>().try_to_vec::<f32>();
        let reach = reach.map_err(|e| anyhow::anyhow!("cannot read the gradients of layer {layer}: {e:?}"))?;
        for (j, r) in reach.into_iter().enumerate() {
            grid[i * len + j] = r > 0.0;
        }
    }
    Ok(grid)
}

/// The pattern of `cfg`'s layer `layer` at `len` positions, from a freshly initialised model on
/// random tokens (seeded): what the kind may attend to, as a paper's pattern figure shows it.
pub fn of_config(cfg: &ModelConfig, len: usize, layer: usize, device: &Device) -> Result<Pattern> {
    let mut cfg = cfg.clone();
    if cfg.vocab_size.is_none() {
        // any vocabulary: the pattern of a config does not depend on it
        cfg.vocab_size = Some(64);
    }
    if len == 0 || len > cfg.seq_len.min(512) {
        bail!("--len {len} must be in 1..={} (model.seq_len, and at most 512 for a picture)", cfg.seq_len.min(512));
    }
    cfg.validate()?;
    device.seed(0);
    let model = cfg.init(device);
    let tokens = variorum_model::harness::tokens(1, 1, len, cfg.vocab(), device);
    read(&model, &cfg, tokens, layer, None)
}

/// Draws `pattern` (one grid per head, reachable entries dark) to `path`, PNG or SVG by its
/// extension.
pub fn draw(pattern: &Pattern, path: &Path) -> Result<()> {
    let n = pattern.grids.len();
    let cols = n.min(4);
    let rows = n.div_ceil(cols);
    let cell = (256 / pattern.len.max(1)).clamp(2, 16) as u32;
    let side = cell * pattern.len as u32;
    // wide enough for the title line above a single grid
    let (w, h) = ((cols as u32 * (side + 24) + 24).max(620), rows as u32 * (side + 40) + 40);
    crate::pictures::plot::draw_to_file!(path, (w, h), |area| paint(pattern, &area, cols, cell))
}

fn paint<DB: DrawingBackend>(pattern: &Pattern, area: &DrawingArea<DB, Shift>, cols: usize, cell: u32) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    area.fill(&WHITE).map_err(err)?;
    let font = crate::pictures::plot::has_font();
    if font {
        let title = format!(
            "{}, layer {}, {} positions ({})",
            pattern.kind,
            pattern.layer,
            pattern.len,
            match pattern.reading {
                Reading::Weights => "non-zero weights per head",
                Reading::Gradient => "inputs each output's gradient reaches",
            }
        );
        area.draw(&Text::new(title, (12, 10), ("sans-serif", 16).into_font())).map_err(err)?;
    }
    let side = (cell as usize * pattern.len) as i32;
    for (k, grid) in pattern.grids.iter().enumerate() {
        let (x0, y0) = (24 + (k % cols) as i32 * (side + 24), 40 + (k / cols) as i32 * (side + 40));
        if font && pattern.grids.len() > 1 {
            area.draw(&Text::new(format!("head {k}"), (x0, y0 - 4 - 12), ("sans-serif", 12).into_font()))
                .map_err(err)?;
        }
        for i in 0..pattern.len {
            for j in 0..pattern.len {
                let (x, y) = (x0 + (j as u32 * cell) as i32, y0 + (i as u32 * cell) as i32);
                let colour = if grid[i * pattern.len + j] { RGBColor(30, 60, 140) } else { RGBColor(235, 238, 245) };
                area.draw(&Rectangle::new([(x, y), (x + cell as i32, y + cell as i32)], colour.filled()))
                    .map_err(err)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use variorum_attention::AttentionConfig;
    use variorum_model::zoo;

    fn config(attention: &str) -> ModelConfig {
        let attention: AttentionConfig = toml::from_str(attention).unwrap();
        ModelConfig { attention, seq_len: 16, ..zoo::tiny() }
    }

    fn both(cfg: &ModelConfig) -> (Pattern, Pattern) {
        let dev = Device::flex();
        dev.seed(0);
        let model = cfg.clone().init(&dev);
        let tokens = variorum_model::harness::tokens(1, 1, 16, cfg.vocab(), &dev);
        let w = read(&model, cfg, tokens.clone(), 0, Some(Reading::Weights)).unwrap();
        let p = read(&model, cfg, tokens, 0, Some(Reading::Gradient)).unwrap();
        (w, p)
    }

    #[test]
    fn full_causal_attention_reaches_the_lower_triangle() {
        let cfg = config("kind = \"full\"\nn_heads = 2");
        let p = of_config(&cfg, 12, 1, &Device::flex()).unwrap();
        assert_eq!((p.reading, p.grids.len()), (Reading::Weights, 2));
        for g in &p.grids {
            for i in 0..12 {
                for j in 0..12 {
                    assert_eq!(g[i * 12 + j], j <= i, "entry ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn a_sliding_window_reaches_its_band() {
        let cfg = config("kind = \"sliding-window\"\nn_heads = 2\nwindow = 4");
        let p = of_config(&cfg, 16, 0, &Device::flex()).unwrap();
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(p.reachable(i, j), j <= i && i - j < 4, "entry ({i}, {j})");
            }
        }
    }

    #[test]
    fn the_weights_drawn_are_the_reach_of_the_layer() {
        // two readings that share nothing: the union of the heads' non-zero weights, and which
        // inputs each output's gradient reaches
        for attention in [
            "kind = \"full\"\nn_heads = 2",
            "kind = \"sliding-window\"\nn_heads = 2\nwindow = 3",
            "kind = \"strided\"\nn_heads = 2\nstride = 4",
            "kind = \"bigbird\"\nn_heads = 2\nblock = 2\nglobal_tokens = 1",
        ] {
            let cfg = config(attention);
            cfg.validate().unwrap_or_else(|e| panic!("{attention}: {e}"));
            let (w, p) = both(&cfg);
            let union: Vec<bool> = (0..16 * 16).map(|e| w.reachable(e / 16, e % 16)).collect();
            assert_eq!(union, p.grids[0], "{attention}: the weights and the gradients disagree");
            assert!(w.densities().iter().all(|&d| d > 0.0 && d <= 17.0 / 32.0 + 1e-9), "{attention}: causal densities");
        }
    }

    #[test]
    fn kinds_without_weights_are_read_from_gradients_and_drawn() {
        let cfg = config("kind = \"linear\"\nn_heads = 2");
        let p = of_config(&cfg, 8, 0, &Device::flex()).unwrap();
        assert_eq!(p.reading, Reading::Gradient);
        for i in 0..8 {
            for j in 0..8 {
                assert_eq!(p.reachable(i, j), j <= i, "causal linear attention, entry ({i}, {j})");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        for name in ["p.png", "p.svg"] {
            let path = dir.path().join(name);
            draw(&p, &path).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 100, "{name} is empty");
        }
        let e = of_config(&cfg, 99, 0, &Device::flex()).unwrap_err().to_string();
        assert!(e.contains("--len 99"), "{e}");
    }

    #[test]
    fn a_data_dependent_pattern_is_that_of_the_text_read() {
        let cfg = ModelConfig {
            attention: toml::from_str("kind = \"lsh\"\nn_heads = 2\nbuckets = 4\nrounds = 1\nchunk = 4").unwrap(),
            seq_len: 32,
            vocab_size: Some(40),
            init_std: 0.5,
            ..zoo::tiny()
        };
        let dev = Device::flex();
        dev.seed(3);
        let model = cfg.init(&dev);
        let text = |seed| variorum_model::harness::tokens(seed, 1, 32, 40, &dev);
        let read_layer = |seed, layer| read(&model, &cfg, text(seed), layer, None).unwrap().grids;
        for layer in [0, 1] {
            assert_eq!(read_layer(1, layer), read_layer(1, layer), "layer {layer}: one text, two pictures");
        }
        assert_ne!(read_layer(1, 1), read_layer(5, 1), "two texts hash alike");
    }

    #[test]
    fn hashed_buckets_draw_the_keys_chosen_for_the_input() {
        // one round of 4 buckets in chunks of 4: a query sees its own chunk and the one before
        // in the sorted order, at most 8 keys, however the input hashes, and its own input
        // reaches it through its query (Reformer hides a token's own key): at most 9. A
        // perturbation reading would reach everything (moving one input re-sorts the buckets)
        let cfg = ModelConfig {
            attention: toml::from_str("kind = \"lsh\"\nn_heads = 2\nbuckets = 4\nrounds = 1\nchunk = 4").unwrap(),
            seq_len: 32,
            ..zoo::tiny()
        };
        let p = of_config(&cfg, 32, 0, &Device::flex()).unwrap();
        assert_eq!(p.reading, Reading::Gradient);
        for i in 0..32 {
            let keys = (0..32).filter(|&j| p.reachable(i, j)).count();
            // (a query alone with one key has weight 1 whatever its query: it reaches that key)
            assert!((1..=9).contains(&keys), "query {i} reaches {keys} keys");
            assert!((i + 1..32).all(|j| !p.reachable(i, j)), "query {i} reaches a later key");
        }
    }
}
