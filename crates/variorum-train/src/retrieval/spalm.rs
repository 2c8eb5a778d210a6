//! SPALM's retrieval (Yogatama et al. 2021): the neighbour tables a model with a long-term
//! memory (`model.long_term_memory`) reads while it trains and is scored.
//!
//! The paper's keys come from a pretrained model and stay fixed; so do its queries here. A
//! table is therefore searched once per split, with the datastore's own model
//! ([`search_table`]), and a batch looks its rows up by position ([`Retrieved::ids`]). Searching
//! the datastore's own text (the training split of the datastore's run), each position skips the
//! entries within `exclude_radius` positions of its own (0: its own entry alone, which holds the
//! very token it predicts; more keeps the passage around it out too). Any other text (the
//! validation split) searches the whole datastore; one that begins like the datastore's text is
//! refused, since its positions would find their own continuations.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use variorum_data::{Corpus, TokenBatch};
use variorum_retrieval::neighbours::{NONE, TableOrigin};
use variorum_retrieval::{Datastore, NeighbourTable, SearchMode, TableWriter};

use crate::ExperimentConfig;
use crate::eval::sliding_windows;
use crate::retrieval::knn_lm::{check_datastore, forward_group, ids_sha256, overlaps};
use crate::run::Run;

/// The directory of a datastore's neighbour table for a split (`train`, `val`).
pub fn table_dir(datastore: &Path, split: &str) -> PathBuf {
    datastore.join(format!("neighbours-{split}"))
}

/// How a table is searched.
#[derive(Debug, Clone, Copy)]
pub struct SearchSettings {
    /// Neighbours per position.
    pub k: usize,
    /// Searching the datastore's own text: entries within this many positions are skipped (0:
    /// the position's own entry alone).
    pub exclude_radius: u64,
    /// Candidates the HNSW search explores per query.
    pub ef: usize,
    /// Positions searched and committed at a time (an interruption loses at most these).
    pub chunk: usize,
}

/// [`SearchSettings::chunk`]'s usual value.
pub const CHUNK: usize = 16_384;

/// Searches (or finishes) the neighbour table of `ids` (described as `text`) in `out`: for every
/// predicted position, the values of its `k` nearest entries in `store`. The queries are the
/// keys of `store`'s own model: its stored keys when `ids` is its text, computed by `encoder`
/// (the datastore's run) otherwise. `progress(done, total)` hears the rows; `stop` is asked
/// between chunks (returns `false` with everything so far committed).
pub fn search_table(
    store: &Datastore,
    encoder: &Run,
    ids: &[u32],
    text: &str,
    out: &Path,
    settings: SearchSettings,
    mut progress: impl FnMut(u64, u64),
    stop: &dyn Fn() -> bool,
) -> Result<bool> {
    check_datastore(encoder, store)?;
    if ids.len() < 2 {
        bail!("{text} has {} tokens: nothing to retrieve for", ids.len());
    }
    if settings.k == 0 {
        bail!("--k 0: a table needs at least one neighbour per position");
    }
    let o = &store.meta.origin;
    let own = o.text_sha256 == ids_sha256(ids);
    let positions = ids.len() as u64 - 1;
    if own && store.len() as u64 != positions {
        bail!(
            "{} holds {} entries for {positions} positions of its own text: it was not built over every position",
            store.dir.display(),
            store.len()
        );
    }
    // a text that shares a prefix with the datastore's would find its own continuations in it
    if !own && overlaps(store, ids) {
        bail!(
            "{text} and the text of {} ({}) begin alike: a position would retrieve its own continuation; search tables only with a datastore over the whole training split",
            store.dir.display(),
            o.text
        );
    }
    let r = settings.exclude_radius;
    if own && r > 0 && r.saturating_mul(2).saturating_add(1) >= positions / 2 {
        bail!(
            "--exclude-radius {r} leaves out more than half of the {positions} entries for every position of {text}: use a radius below {}, or 0",
            positions / 4
        );
    }
    let origin = TableOrigin {
        datastore: store.dir.canonicalize().unwrap_or_else(|_| store.dir.clone()).display().to_string(),
        datastore_text_sha256: o.text_sha256.clone(),
        weights_sha256: o.weights_sha256.clone(),
        text: text.into(),
        text_sha256: ids_sha256(ids),
        positions,
        k: settings.k,
        exclude_radius: own.then_some(settings.exclude_radius),
        ef: settings.ef,
    };
    let mut writer = TableWriter::create_or_resume(out, origin)?;
    let mode = SearchMode::Approximate { ef: settings.ef };
    let dim = store.dim();
    // the values of each query's neighbours, nearest first, padded with NONE
    let rows = |queries: &[f32], exclude: &[Range<u64>]| -> Result<Vec<u32>> {
        let found = store.search_excluding(queries, settings.k, mode, exclude)?;
        Ok(found_values(store, &found, settings.k).map(|v| v.unwrap_or(NONE)).collect())
    };
    progress(writer.done(), positions);
    if own {
        while writer.done() < positions {
            if stop() {
                return Ok(false);
            }
            let from = writer.done() as usize;
            let to = (from + settings.chunk.max(1)).min(positions as usize);
            let exclude: Vec<Range<u64>> = (from..to)
                .map(|p| (p as u64).saturating_sub(r)..(p as u64).saturating_add(r).saturating_add(1))
                .collect();
            writer.append(&rows(&store.keys()[from * dim..to * dim], &exclude)?)?;
            progress(writer.done(), positions);
        }
        return Ok(true);
    }
    // another text: its keys come from the datastore's model, read with the datastore's windows
    let windows = sliding_windows(ids.len(), o.window, o.stride);
    let len = o.window.min(ids.len() - 1);
    let mut done = 0u64;
    for group in windows.chunks((settings.chunk / len.max(1)).max(1)) {
        let n: u64 = group.iter().map(|w| (len - w.from) as u64).sum();
        if done + n <= writer.done() {
            done += n; // committed by an earlier search
            continue;
        }
        if done != writer.done() {
            bail!(
                "{}: {} rows are committed, which is not where a group of windows ends: the table is damaged; remove it and search again",
                out.display(),
                writer.done()
            );
        }
        if stop() {
            return Ok(false);
        }
        let mut queries = Vec::with_capacity(n as usize * dim);
        for windows in group.chunks(16) {
            let g = forward_group(&encoder.model, ids, windows, len, &encoder.device)?;
            for (row, w) in windows.iter().enumerate() {
                let at = row * len;
                queries.extend_from_slice(&g.features[(at + w.from) * dim..(at + len) * dim]);
            }
        }
        writer.append(&rows(&queries, &[])?)?;
        done += n;
        progress(done, positions);
    }
    Ok(true)
}

/// The values of each query's `k` neighbours in `found`, nearest first, `None` past those found.
fn found_values<'a>(
    store: &'a Datastore,
    found: &'a [Vec<variorum_retrieval::Neighbour>],
    k: usize,
) -> impl Iterator<Item = Option<u32>> + 'a {
    let values = store.values();
    found.iter().flat_map(move |f| (0..k).map(move |i| f.get(i).map(|n| values[n.id as usize])))
}

/// A split's neighbour table and how many of each row a model reads.
pub struct Retrieved {
    /// The split's neighbour table.
    pub table: NeighbourTable,
    /// Neighbours read per position (`model.long_term_memory.k`), at most the table's `k`.
    pub k: usize,
}

impl Retrieved {
    /// `len` positions from each of `starts`, `k` tokens each (negative = none), row-major:
    /// a batch's [`TokenBatch::neighbours`].
    pub fn ids(&self, starts: &[usize], len: usize) -> Vec<i64> {
        let k = self.table.k();
        let mut out = Vec::with_capacity(starts.len() * len * self.k);
        for &s in starts {
            for row in self.table.rows(s, len).chunks_exact(k) {
                out.extend(row[..self.k].iter().map(|&v| if v == NONE { -1 } else { i64::from(v) }));
            }
        }
        out
    }

    /// Gives `batch` its rows' neighbours.
    pub fn attach(&self, batch: &mut TokenBatch) {
        assert_eq!(batch.starts.len(), batch.batch_size, "a batch of windows cut from one text");
        batch.neighbours = self.ids(&batch.starts, batch.seq_len);
    }

    /// The same as a `[batch, len, k]` tensor.
    pub fn tensor(&self, starts: &[usize], len: usize, device: &Device) -> Tensor<3, Int> {
        Tensor::from_data(TensorData::new(self.ids(starts, len), [starts.len(), len, self.k]), device)
    }
}

/// Retrieval as a text grows (generation): each position's neighbours searched when it is fed,
/// with the query computed as the tables' are (the datastore's model over the window of the
/// datastore's length that the position falls in, counted from the text's start; a table's
/// last partial window, which its search aligns with the text's end, is the one exception).
pub struct OnlineNeighbours {
    /// The datastore searched.
    pub store: Datastore,
    /// The datastore's run: its model computes the queries.
    pub encoder: Run,
    /// Neighbours per position (the model's `model.long_term_memory.k`).
    pub k: usize,
    /// Candidates the HNSW search explores per query.
    pub ef: usize,
}

impl OnlineNeighbours {
    /// The datastore a config with a long-term memory names (`data.neighbours`) and the model
    /// that built it, on `device`, for a model over `vocab` tokens.
    pub fn open(config: &ExperimentConfig, vocab: usize, device: &Device, ef: usize) -> Result<Self> {
        let (Some(dir), Some(l)) = (&config.data.neighbours, &config.model.long_term_memory) else {
            bail!("the model has no long-term memory to retrieve for");
        };
        let store = Datastore::open(dir).with_context(|| "data.neighbours".to_string())?;
        let encoder = Run::load(Path::new(&store.meta.origin.run), device)
            .with_context(|| format!("the run that built {}", dir.display()))?;
        check_datastore(&encoder, &store)?;
        let o = &store.meta.origin;
        if o.vocab_size as usize > vocab || encoder.config.data.tokenizer != config.data.tokenizer {
            bail!(
                "data.neighbours: {} was built by {} over another vocabulary ({} tokens, this model has {vocab}) or tokenizer",
                dir.display(),
                o.run,
                o.vocab_size
            );
        }
        // tables read each position's context from the disjoint windows that tile its text;
        // generation does the same, which a datastore of overlapping windows would not match
        if o.stride != o.window {
            bail!(
                "data.neighbours: {} computed its keys with windows of {} every {}; generation queries disjoint windows: build the datastore with the default --stride",
                dir.display(),
                o.window,
                o.stride
            );
        }
        Ok(Self { store, encoder, k: l.k, ef })
    }

    /// The neighbours of `positions` of `text` as a `[1, positions, k]` tensor (negative = none).
    pub fn tensor(&self, text: &[u32], positions: Range<usize>, device: &Device) -> Result<Tensor<3, Int>> {
        let n = positions.len();
        let ids = self.ids(text, positions)?;
        Ok(Tensor::from_data(TensorData::new(ids, [1, n, self.k]), device))
    }

    fn ids(&self, text: &[u32], positions: Range<usize>) -> Result<Vec<i64>> {
        let w = self.store.meta.origin.window.max(1);
        let dim = self.store.dim();
        let mut queries = Vec::with_capacity(positions.len() * dim);
        let mut p = positions.start;
        while p < positions.end {
            // the positions from p that share its window
            let from = p - p % w;
            let end = positions.end.min(from + w);
            let ids: Vec<i64> = text[from..end].iter().map(|&t| i64::from(t)).collect();
            let x = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, end - from]), &self.encoder.device);
            let features = self.encoder.model.forward(x).features;
            let features = features.slice([0..1, p - from..end - from, 0..dim]);
            queries.extend(features.into_data().try_to_vec::<f32>().map_err(|e| anyhow::anyhow!("{e:?}"))?);
            p = end;
        }
        let found = self.store.search(&queries, self.k, SearchMode::Approximate { ef: self.ef }, &[])?;
        Ok(found_values(&self.store, &found, self.k).map(|v| v.map_or(-1, i64::from)).collect())
    }
}

/// The training and validation tables of `datastore` for `corpus`, checked against its splits,
/// read `k` at a time by a model over `vocab` tokens.
pub fn open_tables(datastore: &Path, corpus: &Corpus, vocab: usize, k: usize) -> Result<(Retrieved, Retrieved)> {
    let open = |split: &str, ids: &[u32]| -> Result<Retrieved> {
        let dir = table_dir(datastore, split);
        if !dir.is_dir() {
            bail!(
                "data.neighbours: {} has no {split} table: search it with `variorum datastore neighbours {}`",
                datastore.display(),
                datastore.display()
            );
        }
        let table = NeighbourTable::open(&dir, vocab).with_context(|| "data.neighbours".to_string())?;
        let o = &table.meta.origin;
        if o.text_sha256 != ids_sha256(ids) {
            bail!(
                "data.neighbours: {} was searched for {} ({} positions), which is not this run's {split} split ({} positions): search the tables again for this corpus",
                dir.display(),
                o.text,
                o.positions,
                ids.len().saturating_sub(1)
            );
        }
        if table.k() < k {
            bail!(
                "data.neighbours: {} holds {} neighbours per position, fewer than model.long_term_memory.k = {k}: search it again with --k {k}",
                dir.display(),
                table.k()
            );
        }
        Ok(Retrieved { table, k })
    };
    Ok((open("train", &corpus.train)?, open("val", &corpus.val)?))
}

/// The file of a run directory recording which neighbour tables it trains on (their origins).
pub const RUN_TABLES_FILE: &str = "neighbours.json";

/// The origins of `tables` (training, validation), as a run records them.
fn origins(tables: &(Retrieved, Retrieved)) -> Vec<TableOrigin> {
    vec![tables.0.table.meta.origin.clone(), tables.1.table.meta.origin.clone()]
}

/// Refuses to resume the run in `run` on other tables than it started with (searched again with
/// another k, radius, datastore or model since): a resumed run must read what it read before.
pub fn check_resumed_tables(run: &Path, tables: &(Retrieved, Retrieved)) -> Result<()> {
    let path = run.join(RUN_TABLES_FILE);
    if !path.is_file() {
        return Ok(());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let saved: Vec<TableOrigin> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a list of neighbour table origins: {e}", path.display()))?;
    if saved != origins(tables) {
        bail!(
            "data.neighbours: the tables in {} are not the ones the run started with ({}): search them again as before, or start a new run",
            tables.0.table.dir.parent().unwrap_or(Path::new(".")).display(),
            path.display()
        );
    }
    Ok(())
}

/// Records in `run` which tables it trains on.
pub fn record_tables(run: &Path, tables: &(Retrieved, Retrieved)) -> Result<()> {
    crate::checkpoint::write_atomic(
        &run.join(RUN_TABLES_FILE),
        serde_json::to_string_pretty(&origins(tables))?.as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use variorum_retrieval::neighbours::TableOrigin;

    #[test]
    fn a_batch_reads_the_rows_of_its_windows() {
        let dir = tempfile::tempdir().unwrap();
        let origin = TableOrigin {
            datastore: "ds".into(),
            datastore_text_sha256: "a".into(),
            weights_sha256: "b".into(),
            text: "t".into(),
            text_sha256: "c".into(),
            positions: 6,
            k: 3,
            exclude_radius: None,
            ef: 16,
        };
        let mut w = TableWriter::create_or_resume(dir.path(), origin).unwrap();
        // row p = [10p, 10p + 1, NONE]
        let rows: Vec<u32> = (0..6u32).flat_map(|p| [10 * p, 10 * p + 1, NONE]).collect();
        w.append(&rows).unwrap();
        let r = Retrieved { table: NeighbourTable::open(dir.path(), 100).unwrap(), k: 2 };
        assert_eq!(r.ids(&[3, 0], 2), vec![30, 31, 40, 41, 0, 1, 10, 11]);
        let r = Retrieved { k: 3, ..r };
        assert_eq!(r.ids(&[5], 1), vec![50, 51, -1]);
    }
}
