//! Graph data (`[data.graph]`): examples that come with their own graph, for graph-masked
//! attention. The file is JSON lines, one example per line:
//!
//! ```text
//! {"nodes": ["7", "3", "4"], "edges": [[0, 1], [0, 2]]}
//! ```
//!
//! `nodes` are strings, each cut into tokens by the run's tokenizer and laid end to end, in
//! order, as the example's token sequence; `edges` are pairs of node indices. The tokens of one
//! node read one another; an edge `[a, b]` lets every token of node a read every token of node b
//! and, unless `data.graph.directed`, the other way round (GAT's undirected graphs). Every token
//! reads itself. Blank lines are skipped; any other line that is not such an object is refused
//! with its line number.
//!
//! The last `val_fraction` of the examples (by line) are the validation split. A training batch
//! is `batch_size` examples drawn at random per step (a pure function of the step, as for text
//! windows), each padded to `seq_len`: row inputs are the example's tokens, targets the next
//! token within the example and [`NO_TARGET`] after its last token (padding included).

use std::path::Path;
use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::batch::TokenBatch;
use crate::error::DataError;
use crate::tokenizer::Tokenizer;

/// The target of a position that predicts nothing (after an example's last token); the loss
/// skips it.
pub const NO_TARGET: i64 = -1;

/// The `[data.graph]` section: present = the data file is graph examples.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GraphDataConfig {
    /// An edge `[a, b]` lets a read b only (true), or each read the other (false, default).
    pub directed: bool,
    /// Every token of an example reads every other token of it, whatever the edges say (the
    /// complete graph: an ablation that keeps the examples and drops their structure). Default
    /// false.
    pub ignore_edges: bool,
}

/// One line of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    nodes: Vec<String>,
    #[serde(default)]
    edges: Vec<[usize; 2]>,
}

/// One example: its tokens and, per token, the tokens it reads besides itself (ascending).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphExample {
    /// The line of the file it comes from (1-based), for messages.
    pub line: usize,
    /// The tokens of its nodes, end to end in node order.
    pub tokens: Vec<u32>,
    /// Per token, the positions (within the example) it reads besides itself, ascending.
    pub adjacency: Arc<Vec<Vec<u32>>>,
}

/// The examples of a graph data file, split by line.
#[derive(Debug, Clone)]
pub struct GraphSplits {
    /// The training examples: all but the last `val_fraction` of the lines.
    pub train: Arc<Vec<GraphExample>>,
    /// The validation examples: the last `val_fraction` of the lines.
    pub val: Arc<Vec<GraphExample>>,
}

/// The parsed lines of `text` (`path` labels messages): `(line, nodes, edges)`, each edge within
/// its example's nodes, no node empty.
pub(crate) fn parse(text: &str, path: &Path) -> Result<Vec<(usize, Vec<String>, Vec<[usize; 2]>)>, DataError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let at = |what: String| DataError::Graph(format!("{} line {line_no}: {what}", path.display()));
        let record: Record = serde_json::from_str(line)
            .map_err(|e| at(format!("{e}; a line is {{\"nodes\": [\"text\", ...], \"edges\": [[0, 1], ...]}}")))?;
        if record.nodes.is_empty() {
            return Err(at("the example has no nodes".into()));
        }
        if let Some(n) = record.nodes.iter().position(String::is_empty) {
            return Err(at(format!("node {n} is the empty string; every node needs text")));
        }
        let n = record.nodes.len();
        if let Some([a, b]) = record.edges.iter().find(|[a, b]| *a >= n || *b >= n) {
            return Err(at(format!("edge [{a}, {b}] names a node past the example's {n} (nodes count from 0)")));
        }
        out.push((line_no, record.nodes, record.edges));
    }
    if out.is_empty() {
        return Err(DataError::Graph(format!("{} holds no examples (one JSON object per line)", path.display())));
    }
    Ok(out)
}

/// The example of `nodes` and `edges` under `tokenizer`.
pub(crate) fn example(
    line: usize,
    nodes: &[String],
    edges: &[[usize; 2]],
    cfg: &GraphDataConfig,
    tokenizer: &Tokenizer,
    path: &Path,
) -> Result<GraphExample, DataError> {
    let mut tokens = Vec::new();
    let mut spans = Vec::with_capacity(nodes.len());
    for node in nodes {
        let ids =
            tokenizer.encode(node).map_err(|e| DataError::Graph(format!("{} line {line}: {e}", path.display())))?;
        spans.push(tokens.len()..tokens.len() + ids.len());
        tokens.extend(ids);
    }
    if tokens.len() < 2 {
        return Err(DataError::Graph(format!(
            "{} line {line}: the example is {} token long; an example needs at least 2",
            path.display(),
            tokens.len()
        )));
    }
    let mut adjacency = vec![Vec::new(); tokens.len()];
    let mut link = |a: usize, b: usize| {
        for i in spans[a].clone() {
            adjacency[i].extend(spans[b].clone().filter(|&j| j != i).map(|j| j as u32));
        }
    };
    for n in 0..nodes.len() {
        link(n, n);
    }
    if cfg.ignore_edges {
        for a in 0..nodes.len() {
            (0..nodes.len()).filter(|&b| b != a).for_each(|b| link(a, b));
        }
    }
    for &[a, b] in edges {
        link(a, b);
        if !cfg.directed {
            link(b, a);
        }
    }
    for list in &mut adjacency {
        list.sort_unstable();
        list.dedup();
    }
    Ok(GraphExample { line, tokens, adjacency: Arc::new(adjacency) })
}

/// Random examples, `batch_size` per step, each padded to `seq_len`.
#[derive(Debug, Clone)]
pub struct GraphBatches {
    examples: Arc<Vec<GraphExample>>,
    seq_len: usize,
    batch_size: usize,
    seed: u64,
}

impl GraphBatches {
    /// Fails if an example is longer than `seq_len` (the message names its line in `path`).
    pub fn new(
        examples: Arc<Vec<GraphExample>>,
        path: &Path,
        seq_len: usize,
        batch_size: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        check_lengths(&examples, path, seq_len)?;
        if examples.is_empty() {
            return Err(DataError::Graph(format!("{}: no training examples", path.display())));
        }
        if batch_size == 0 {
            return Err(DataError::Config("batch_size = 0 must be at least 1, e.g. 32".into()));
        }
        Ok(Self { examples, seq_len, batch_size, seed })
    }

    /// The batch for training step `step`.
    pub fn batch(&self, step: u64) -> TokenBatch {
        let mut rng = step_rng(self.seed, step);
        let picks: Vec<&GraphExample> =
            (0..self.batch_size).map(|_| &self.examples[rng.random_range(0..self.examples.len())]).collect();
        padded_batch(&picks, self.seq_len)
    }
}

/// Evaluation batches: the first `max_rows` examples of `examples` (all, if fewer), in order,
/// `batch_size` per batch (the last may be smaller), padded to `seq_len`.
pub fn graph_eval_batches(
    examples: &[GraphExample],
    path: &Path,
    seq_len: usize,
    max_rows: usize,
    batch_size: usize,
) -> Result<Vec<TokenBatch>, DataError> {
    check_lengths(examples, path, seq_len)?;
    let take = &examples[..examples.len().min(max_rows)];
    Ok(take.chunks(batch_size.max(1)).map(|c| padded_batch(&c.iter().collect::<Vec<_>>(), seq_len)).collect())
}

fn check_lengths(examples: &[GraphExample], path: &Path, seq_len: usize) -> Result<(), DataError> {
    match examples.iter().find(|e| e.tokens.len() > seq_len) {
        Some(e) => Err(DataError::Graph(format!(
            "{} line {}: the example is {} tokens long, more than model.seq_len = {seq_len}: raise \
             model.seq_len or split the example",
            path.display(),
            e.line,
            e.tokens.len()
        ))),
        None => Ok(()),
    }
}

fn padded_batch(examples: &[&GraphExample], seq_len: usize) -> TokenBatch {
    let b = examples.len();
    let mut inputs = vec![0i64; b * seq_len];
    let mut targets = vec![NO_TARGET; b * seq_len];
    for (r, e) in examples.iter().enumerate() {
        for (t, &id) in e.tokens.iter().enumerate() {
            inputs[r * seq_len + t] = i64::from(id);
            if t > 0 {
                targets[r * seq_len + t - 1] = i64::from(id);
            }
        }
    }
    TokenBatch {
        inputs,
        targets,
        batch_size: b,
        seq_len,
        reset: vec![true; b],
        tags: Vec::new(),
        graphs: examples.iter().map(|e| e.adjacency.clone()).collect(),
        sources: Vec::new(),
        starts: Vec::new(),
        neighbours: Vec::new(),
        hidden: Vec::new(),
    }
}

fn step_rng(seed: u64, step: u64) -> ChaCha8Rng {
    crate::batch::keyed_rng(b"variorum/graph-examples/v1", &[seed, step])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::TokenizerConfig;

    fn chars() -> Tokenizer {
        Tokenizer::train(&TokenizerConfig::Char, "abcdefgh0123456789").expect("trains")
    }

    fn one(line: &str, directed: bool) -> GraphExample {
        let p = Path::new("g.jsonl");
        let parsed = parse(line, p).expect("parses");
        let (l, nodes, edges) = &parsed[0];
        let cfg = GraphDataConfig { directed, ..Default::default() };
        example(*l, nodes, edges, &cfg, &chars(), p).expect("builds")
    }

    #[test]
    fn nodes_lie_end_to_end_and_edges_join_their_tokens() {
        // node 0 = "ab" (tokens 0, 1), node 1 = "c" (2), node 2 = "de" (3, 4)
        let e = one(r#"{"nodes": ["ab", "c", "de"], "edges": [[0, 1]]}"#, false);
        assert_eq!(e.tokens.len(), 5);
        let want: Vec<Vec<u32>> = vec![vec![1, 2], vec![0, 2], vec![0, 1], vec![4], vec![3]];
        assert_eq!(*e.adjacency, want);
        let d = one(r#"{"nodes": ["ab", "c", "de"], "edges": [[0, 1]]}"#, true);
        let want: Vec<Vec<u32>> = vec![vec![1, 2], vec![0, 2], vec![], vec![4], vec![3]];
        assert_eq!(*d.adjacency, want, "directed: c does not read ab");
        let p = Path::new("g.jsonl");
        let parsed = parse(r#"{"nodes": ["ab", "c"], "edges": []}"#, p).expect("parses");
        let cfg = GraphDataConfig { ignore_edges: true, ..Default::default() };
        let all = example(1, &parsed[0].1, &parsed[0].2, &cfg, &chars(), p).expect("builds");
        let want: Vec<Vec<u32>> = vec![vec![1, 2], vec![0, 2], vec![0, 1]];
        assert_eq!(*all.adjacency, want, "ignore_edges: the complete graph");
    }

    #[test]
    fn bad_lines_are_refused_with_their_line_number() {
        let p = Path::new("g.jsonl");
        let cases = [
            ("{\"nodes\": [\"a\"]}\n\nnot json", "g.jsonl line 3"),
            (r#"{"nodes": ["a", "b"], "edges": [[0, 2]]}"#, "edge [0, 2] names a node past the example's 2"),
            (r#"{"nodes": ["a", ""]}"#, "node 1 is the empty string"),
            (r#"{"nodes": []}"#, "no nodes"),
            (r#"{"nodes": ["a"], "edge": []}"#, "unknown field"),
            ("\n  \n", "holds no examples"),
        ];
        for (text, want) in cases {
            let msg = parse(text, p).expect_err(text).to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        let parsed = parse(r#"{"nodes": ["a"]}"#, p).expect("parses");
        let err = example(1, &parsed[0].1, &parsed[0].2, &Default::default(), &chars(), p).expect_err("one token");
        assert!(err.to_string().contains("at least 2"), "{err}");
    }

    #[test]
    fn batches_pad_examples_and_predict_within_them() {
        let e = one(r#"{"nodes": ["ab", "c"], "edges": [[0, 1]]}"#, false);
        let examples = Arc::new(vec![e.clone()]);
        let p = Path::new("g.jsonl");
        let b = GraphBatches::new(examples.clone(), p, 5, 2, 0).expect("fits").batch(3);
        assert_eq!(b.batch_size, 2);
        // the char vocabulary is sorted: digits first, so a = 10
        assert_eq!(&b.inputs[..5], &[10, 11, 12, 0, 0]);
        assert_eq!(&b.targets[..5], &[11, 12, NO_TARGET, NO_TARGET, NO_TARGET]);
        assert_eq!(b.graphs.len(), 2);
        assert_eq!(b, GraphBatches::new(examples.clone(), p, 5, 2, 0).unwrap().batch(3), "a pure function of the step");
        let err = GraphBatches::new(examples, p, 2, 2, 0).expect_err("3 tokens > 2").to_string();
        assert!(err.contains("g.jsonl line 1: the example is 3 tokens long, more than model.seq_len = 2"), "{err}");
    }
}
