//! Learned attention heatmaps (`variorum attention`): the weights a trained run gives a text,
//! one `len × len` grid per head and layer, with the text's tokens on the axes, and two
//! statistics per head — the entropy of a query's weights (how spread its attention is) and
//! the mean distance to the keys it weighs (how far back it looks).
//!
//! Where [`crate::pictures::pattern`] draws *what may be attended to* (a boolean pattern, from weights or
//! gradients), this draws *how much* each key is weighed, from the weights the kind forms
//! ([`DecoderLm::attention_maps`]); kinds that form none (kernelised, sorted buckets) are
//! refused and pointed to `variorum pattern`.

use std::path::Path;

use anyhow::{Result, anyhow, bail};
use burn::prelude::*;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use variorum_model::{DecoderLm, ModelConfig};

/// Mean over queries of one head's row statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadStats {
    /// Nats: `−Σ_j w_ij ln w_ij`, mean over queries `i`.
    pub entropy: f64,
    /// `Σ_j w_ij |i − j|`, mean over queries `i`, in tokens.
    pub mean_distance: f64,
}

/// The statistics of one head's weights, row-major `len × len` (query i, key j at `i * len + j`).
/// Zero weights add nothing to either sum (`0 ln 0 = 0`).
pub fn head_stats(weights: &[f32], len: usize) -> HeadStats {
    assert!(weights.len() >= len * len, "{} weights for a {len} × {len} grid", weights.len());
    if len == 0 {
        return HeadStats { entropy: 0.0, mean_distance: 0.0 };
    }
    let (mut entropy, mut distance) = (0.0f64, 0.0f64);
    for i in 0..len {
        for (j, &w) in weights[i * len..(i + 1) * len].iter().enumerate() {
            let w = f64::from(w);
            if w > 0.0 {
                entropy -= w * w.ln();
                distance += w * i.abs_diff(j) as f64;
            }
        }
    }
    HeadStats { entropy: entropy / len as f64, mean_distance: distance / len as f64 }
}

/// The weights of one block application.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// The block application (0 = nearest the embeddings).
    pub layer: usize,
    /// `(head index, len × len weights row-major)`, for the heads read.
    pub heads: Vec<(usize, Vec<f32>)>,
}

/// The learned attention weights of a model on one text.
#[derive(Debug, Clone)]
pub struct Heatmaps {
    /// `model.attention.kind`.
    pub kind: String,
    /// One axis label per token ([`token_labels`]).
    pub tokens: Vec<String>,
    /// The layers read, in order.
    pub layers: Vec<LayerWeights>,
}

impl Heatmaps {
    /// Tokens on each axis.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there is no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// `(layer, head, stats)` for every head read, layer by layer.
    pub fn stats(&self) -> Vec<(usize, usize, HeadStats)> {
        let len = self.len();
        self.layers.iter().flat_map(|l| l.heads.iter().map(move |(h, w)| (l.layer, *h, head_stats(w, len)))).collect()
    }
}

/// The most characters of a label (longer ones end in `…`).
const LABEL_CHARS: usize = 8;

/// A token's text made visible on an axis: ' ' → '␣', '\n' → '↵', '\t' → '→', other control
/// characters → '·', at most [`LABEL_CHARS`] characters.
fn visible(text: &str) -> String {
    let chars: Vec<char> = text
        .chars()
        .map(|c| match c {
            ' ' => '␣',
            '\n' | '\r' => '↵',
            '\t' => '→',
            c if c.is_control() => '·',
            c => c,
        })
        .collect();
    if chars.is_empty() {
        return "∅".into();
    }
    if chars.len() > LABEL_CHARS {
        let mut s: String = chars[..LABEL_CHARS - 1].iter().collect();
        s.push('…');
        s
    } else {
        chars.into_iter().collect()
    }
}

/// Labels for the axes: each token decoded alone, whitespace made visible (' ' → '␣',
/// '\n' → '↵', tabs → '→'), truncated to 8 characters.
pub fn token_labels(tokenizer: &variorum_data::Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&id| visible(&tokenizer.decode(&[id]))).collect()
}

/// The learned weights of `model` on `ids` (one sequence), of block application `layer` or
/// all, head `head` or all. `labels` name the tokens (one per id). Layers whose kind forms no
/// weights are skipped when every layer is read (a layer-wise mix of kinds); a requested layer
/// without weights, or a model whose layers form none, is an error pointing to
/// `variorum pattern`.
pub fn read(
    model: &DecoderLm,
    cfg: &ModelConfig,
    ids: &[u32],
    labels: Vec<String>,
    layer: Option<usize>,
    head: Option<usize>,
    device: &Device,
) -> Result<Heatmaps> {
    let len = ids.len();
    if len == 0 {
        bail!("no tokens to read: the text must have at least one token");
    }
    if labels.len() != len {
        bail!("{} labels for {len} tokens", labels.len());
    }
    let kind = cfg.attention.kind().to_string();
    let depth = model.depth;
    if let Some(l) = layer
        && l >= depth
    {
        bail!("--layer {l} is out of range: the model has {depth} layers (0..={})", depth.saturating_sub(1));
    }
    let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(data, [1, len]), device);
    let maps = model.attention_maps(tokens).map_err(|e| anyhow!("model.attention.kind = \"{kind}\": {e}"))?;
    let no_weights = |at: &str| {
        anyhow!(
            "model.attention.kind = \"{kind}\" forms no attention weights{at} (kernelised or sorted-bucket attention): `variorum pattern RUN --prompt …` draws what it attends to"
        )
    };
    let mut layers = Vec::new();
    for (l, weights) in maps.into_iter().enumerate() {
        if layer.is_some_and(|wanted| wanted != l) {
            continue;
        }
        let Some(weights) = weights else {
            if layer.is_some() {
                return Err(no_weights(&format!(" in layer {l}")));
            }
            continue;
        };
        let [b, h, lq, lk] = weights.dims();
        if (b, lq, lk) != (1, len, len) {
            bail!(
                "the weights of layer {l} are [{b}, {h}, {lq}, {lk}], not [1, heads, {len}, {len}]: model.attention.kind = \"{kind}\" (with its memory or extra keys) cannot be drawn"
            );
        }
        if let Some(wanted) = head
            && wanted >= h
        {
            bail!("--head {wanted} is out of range: layer {l} has {h} heads (0..={})", h.saturating_sub(1));
        }
        let values = weights
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .map_err(|e| anyhow!("cannot read the weights of layer {l}: {e:?}"))?;
        if values.len() != h * len * len {
            bail!("layer {l} gave {} weights for {h} heads of {len} × {len}: it cannot be drawn", values.len());
        }
        let heads = (0..h)
            .filter(|&k| head.is_none_or(|wanted| wanted == k))
            .map(|k| (k, values[k * len * len..(k + 1) * len * len].to_vec()))
            .collect();
        layers.push(LayerWeights { layer: l, heads });
    }
    if layers.is_empty() {
        return Err(match layer {
            Some(l) => no_weights(&format!(" in layer {l}")),
            None => no_weights(""),
        });
    }
    Ok(Heatmaps { kind, tokens: labels, layers })
}

/// Where everything goes, in pixels.
struct Layout {
    len: usize,
    /// One token's side.
    cell: i32,
    /// One heatmap's side.
    side: i32,
    /// Left of the first column (query labels).
    left: i32,
    /// Above the first row (the picture's title).
    top: i32,
    col_w: i32,
    row_h: i32,
    /// Above each heatmap (its title).
    title_h: i32,
    /// Label every this many tokens.
    label_every: usize,
    font_px: f64,
    width: u32,
    height: u32,
}

fn layout(maps: &Heatmaps) -> Layout {
    let len = maps.len().max(1);
    let cols = maps.layers.iter().map(|l| l.heads.len()).max().unwrap_or(1).max(1) as i32;
    let rows = maps.layers.len().max(1) as i32;
    // every token labelled up to 64 (cells tall enough for a line of text), every k-th past it
    let (cell, font_px) = if len <= 64 {
        let cell = (320 / len).clamp(8, 20) as i32;
        (cell, f64::from((cell + 1).min(12)))
    } else {
        ((384 / len).max(2) as i32, 9.0)
    };
    let label_every = if len <= 64 { 1 } else { (10.0 / f64::from(cell)).ceil().max(1.0) as usize };
    let side = cell * len as i32;
    let (left, key_h, title_h, top) = (84, 64, 20, 40);
    // wide enough for the line of statistics above a small heatmap
    let col_w = side.max(300) + 24;
    let row_h = title_h + side + key_h + 12;
    Layout {
        len,
        cell,
        side,
        left,
        top,
        col_w,
        row_h,
        title_h,
        label_every,
        font_px,
        width: (left + cols * col_w) as u32,
        height: (top + rows * row_h) as u32,
    }
}

/// The colour of weight `w`: white at 0 to dark blue at 1 on a square-root scale, so that the
/// small weights of a spread-out head stay visible.
fn colour(w: f32) -> RGBColor {
    let s = f64::from(w).clamp(0.0, 1.0).sqrt();
    let (r, g, b) = (8.0, 48.0, 107.0);
    let mix = |to: f64| (255.0 + (to - 255.0) * s).round() as u8;
    RGBColor(mix(r), mix(g), mix(b))
}

/// Draws `maps` to `path`, PNG or SVG by its extension: one row per layer, one column per head,
/// each a query × key heatmap coloured from white (weight 0) to dark blue (weight 1) on a
/// square-root scale (small weights stay visible), the tokens on the axes (every token up to 64,
/// every k-th past it), and above each its entropy H and mean distance d. Without a font only
/// the heatmaps are drawn.
pub fn draw(maps: &Heatmaps, path: &Path) -> Result<()> {
    let lay = layout(maps);
    crate::pictures::plot::draw_to_file!(path, (lay.width, lay.height), |area| paint(maps, &area, &lay))
}

fn paint<DB: DrawingBackend>(maps: &Heatmaps, area: &DrawingArea<DB, Shift>, lay: &Layout) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    area.fill(&WHITE).map_err(err)?;
    let font = crate::pictures::plot::has_font();
    let len = lay.len.min(maps.len());
    if font {
        let title = format!(
            "{}: attention weights over {} tokens (colour: √weight, white 0 → blue 1; query down, key across)",
            maps.kind, len
        );
        let style = TextStyle::from(("sans-serif", 16.0).into_font());
        area.draw_text(&title, &style, (12, 10)).map_err(err)?;
    }
    let cell_title = TextStyle::from(("sans-serif", 12.0).into_font());
    let query_style = TextStyle::from(("sans-serif", lay.font_px).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    // read top to bottom, centred under its column
    let key_style = TextStyle::from(("sans-serif", lay.font_px).into_font())
        .transform(FontTransform::Rotate90)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let border = RGBColor(190, 190, 200);
    for (r, layer) in maps.layers.iter().enumerate() {
        let y_title = lay.top + r as i32 * lay.row_h;
        let y0 = y_title + lay.title_h;
        for (c, (head, weights)) in layer.heads.iter().enumerate() {
            let x0 = lay.left + c as i32 * lay.col_w;
            for i in 0..len {
                for j in 0..len {
                    let fill = colour(weights[i * len + j]);
                    if fill == RGBColor(255, 255, 255) {
                        continue; // the background already
                    }
                    let (x, y) = (x0 + j as i32 * lay.cell, y0 + i as i32 * lay.cell);
                    area.draw(&Rectangle::new([(x, y), (x + lay.cell, y + lay.cell)], fill.filled())).map_err(err)?;
                }
            }
            area.draw(&Rectangle::new([(x0 - 1, y0 - 1), (x0 + lay.side, y0 + lay.side)], border.stroke_width(1)))
                .map_err(err)?;
            if !font {
                continue;
            }
            let s = head_stats(weights, len);
            let title = format!(
                "layer {} · head {} · H = {:.2} nats · d = {:.1}",
                layer.layer, head, s.entropy, s.mean_distance
            );
            area.draw_text(&title, &cell_title, (x0, y_title + 2)).map_err(err)?;
            for k in (0..len).step_by(lay.label_every) {
                let label = &maps.tokens[k];
                let centre = k as i32 * lay.cell + lay.cell / 2;
                if c == 0 {
                    area.draw_text(label, &query_style, (x0 - 4, y0 + centre)).map_err(err)?;
                }
                area.draw_text(label, &key_style, (x0 + centre, y0 + lay.side + 4)).map_err(err)?;
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

    fn labels(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    fn ids(n: usize) -> Vec<u32> {
        (0..n).map(|i| (i * 7 % 11) as u32).collect()
    }

    #[test]
    fn stats_of_hand_made_weights() {
        let n = 6;
        let mut diagonal = vec![0f32; n * n];
        for i in 0..n {
            diagonal[i * n + i] = 1.0;
        }
        assert_eq!(head_stats(&diagonal, n), HeadStats { entropy: 0.0, mean_distance: 0.0 });

        // row i spreads evenly over keys 0..=i: entropy ln(i + 1), distance i / 2
        let mut uniform = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..=i {
                uniform[i * n + j] = 1.0 / (i + 1) as f32;
            }
        }
        let s = head_stats(&uniform, n);
        let entropy = (0..n).map(|i| ((i + 1) as f64).ln()).sum::<f64>() / n as f64;
        assert!((s.entropy - entropy).abs() < 1e-5, "{s:?} vs {entropy}");
        assert!((s.mean_distance - (n - 1) as f64 / 4.0).abs() < 1e-5, "{s:?}");

        // all on the first key: distance i
        let mut first = vec![0f32; n * n];
        for i in 0..n {
            first[i * n] = 1.0;
        }
        let s = head_stats(&first, n);
        assert!(s.entropy.abs() < 1e-12 && (s.mean_distance - (n - 1) as f64 / 2.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn labels_make_whitespace_visible_and_stay_short() {
        assert_eq!(visible(" "), "␣");
        assert_eq!(visible("a\nb\t"), "a↵b→");
        assert_eq!(visible(""), "∅");
        assert_eq!(visible("abcdefghijk"), "abcdefg…");
        let tok = variorum_data::Tokenizer::Char(variorum_data::CharTokenizer::new(vec!['a', ' ', '\n']).unwrap());
        assert_eq!(token_labels(&tok, &[0, 1, 2]), vec!["a", "␣", "↵"]);
    }

    #[test]
    fn full_attention_gives_causal_rows_that_sum_to_one() {
        let cfg = config("kind = \"full\"\nn_heads = 2");
        let dev = Device::flex();
        dev.seed(0);
        let model = cfg.init(&dev);
        let n = 12;
        let maps = read(&model, &cfg, &ids(n), labels(n), None, None, &dev).unwrap();
        assert_eq!((maps.len(), maps.kind.as_str(), maps.layers.len()), (n, "full", 2));
        for layer in &maps.layers {
            assert_eq!(layer.heads.iter().map(|(h, _)| *h).collect::<Vec<_>>(), vec![0, 1]);
            for (h, w) in &layer.heads {
                assert_eq!(w.len(), n * n);
                for i in 0..n {
                    let row = &w[i * n..(i + 1) * n];
                    let sum: f32 = row.iter().sum();
                    assert!((sum - 1.0).abs() < 1e-4, "layer {} head {h} row {i} sums to {sum}", layer.layer);
                    assert!(
                        row[i + 1..].iter().all(|&v| v.abs() < 1e-7),
                        "layer {} head {h} row {i} sees ahead",
                        layer.layer
                    );
                }
            }
        }
        let stats = maps.stats();
        assert_eq!(stats.len(), 4);
        for (_, _, s) in &stats {
            assert!(s.entropy >= 0.0 && s.entropy <= (n as f64).ln() + 1e-6, "{s:?}");
            assert!(s.mean_distance >= 0.0 && s.mean_distance <= (n - 1) as f64, "{s:?}");
        }

        // one layer, one head
        let one = read(&model, &cfg, &ids(n), labels(n), Some(1), Some(1), &dev).unwrap();
        assert_eq!(one.layers.len(), 1);
        assert_eq!((one.layers[0].layer, one.layers[0].heads.len(), one.layers[0].heads[0].0), (1, 1, 1));
        let same = one.layers[0].heads[0].1.iter().zip(&maps.layers[1].heads[1].1).all(|(a, b)| (a - b).abs() < 1e-6);
        assert!(same, "head 1 of layer 1 read alone differs from the same head read with the others");

        let e = read(&model, &cfg, &ids(n), labels(n), Some(2), None, &dev).unwrap_err().to_string();
        assert!(e.contains("--layer 2") && e.contains("2 layers"), "{e}");
        let e = read(&model, &cfg, &ids(n), labels(n), None, Some(5), &dev).unwrap_err().to_string();
        assert!(e.contains("--head 5") && e.contains("2 heads"), "{e}");
        assert!(read(&model, &cfg, &[], Vec::new(), None, None, &dev).is_err());
    }

    #[test]
    fn kinds_without_weights_are_refused_by_name() {
        let cfg = config("kind = \"linear\"\nn_heads = 2");
        let dev = Device::flex();
        dev.seed(0);
        let model = cfg.init(&dev);
        let e = read(&model, &cfg, &ids(8), labels(8), None, None, &dev).unwrap_err().to_string();
        assert!(e.contains("\"linear\"") && e.contains("variorum pattern"), "{e}");
        let e = read(&model, &cfg, &ids(8), labels(8), Some(0), None, &dev).unwrap_err().to_string();
        assert!(e.contains("\"linear\"") && e.contains("layer 0"), "{e}");
    }

    #[test]
    fn heatmaps_are_drawn_as_png_and_svg() {
        let cfg = config("kind = \"full\"\nn_heads = 2");
        let dev = Device::flex();
        dev.seed(1);
        let model = cfg.init(&dev);
        let maps = read(&model, &cfg, &ids(10), labels(10), None, None, &dev).unwrap();
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.png", "a.svg"] {
            let path = dir.path().join(name);
            draw(&maps, &path).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 100, "{name} is empty");
        }
        let png = std::fs::read(dir.path().join("a.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let s = std::fs::read_to_string(dir.path().join("a.svg")).unwrap();
        assert!(s.contains("<svg"), "not an SVG: {}", &s[..s.len().min(200)]);
        assert!(s.contains("<rect"), "no cells drawn");
    }
}
