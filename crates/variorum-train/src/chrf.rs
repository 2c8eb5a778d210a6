//! chrF, the character n-gram F-score of a translation against its reference (Popović 2015),
//! computed as sacreBLEU computes it (`sacrebleu.corpus_chrf`, the tool papers quote chrF from):
//! for each n-gram order n ≤ `char_order`, the counts of hypothesis n-grams, reference n-grams
//! and their clipped matches are summed over the corpus; precision and recall are averaged over
//! the orders, and
//!
//! chrF_β = 100 · (1 + β²) · P · R / (β² · P + R).
//!
//! Whitespace is removed before the n-grams are taken (sacreBLEU's default). Orders for which
//! the hypothesis or the reference has no n-gram leave the averages ("effective order",
//! sacreBLEU's default); with `eps_smoothing` every order counts, as chrF++.py, NLTK and Moses do,
//! by averaging the orders' F-scores with 1e-16 for an empty precision or recall.
//!
//! Written here rather than taken from a crate: the `chrf` crate scores one sentence at a time
//! with whitespace included and averages F-scores over orders, which is neither sacreBLEU's
//! corpus score nor its default averaging, and exposes no counts to sum over a corpus. The tests
//! hold this one to sacreBLEU's published test values.

use std::collections::HashMap;

/// chrF's settings; the default is sacreBLEU's `chrF2` (6 character orders, β = 2, effective
/// order, whitespace removed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chrf {
    /// The largest character n-gram order. Default 6.
    pub char_order: usize,
    /// β: recall counts β times as much as precision. Default 2.
    pub beta: f64,
    /// Average every order's F-score, 1e-16 for an empty precision or recall (chrF++.py, NLTK,
    /// Moses), instead of the effective order. Default false.
    pub eps_smoothing: bool,
    /// Keep whitespace in the n-grams. Default false: removed, as sacreBLEU does.
    pub keep_whitespace: bool,
}

impl Default for Chrf {
    fn default() -> Self {
        Self { char_order: 6, beta: 2.0, eps_smoothing: false, keep_whitespace: false }
    }
}

/// Per order: hypothesis n-grams, reference n-grams, clipped matches.
type Counts = Vec<[usize; 3]>;

impl Chrf {
    /// The corpus score (0–100) of `hypotheses` against their `references`, pair by pair.
    pub fn corpus(&self, hypotheses: &[&str], references: &[&str]) -> f64 {
        let mut total: Counts = vec![[0; 3]; self.char_order];
        for (h, r) in hypotheses.iter().zip(references) {
            for (t, c) in total.iter_mut().zip(self.counts(h, r)) {
                for k in 0..3 {
                    t[k] += c[k];
                }
            }
        }
        self.score(&total)
    }

    /// One sentence's score (0–100).
    pub fn sentence(&self, hypothesis: &str, reference: &str) -> f64 {
        self.score(&self.counts(hypothesis, reference))
    }

    fn counts(&self, hypothesis: &str, reference: &str) -> Counts {
        let chars = |s: &str| -> Vec<char> {
            if self.keep_whitespace { s.chars().collect() } else { s.chars().filter(|c| !c.is_whitespace()).collect() }
        };
        let (h, r) = (chars(hypothesis), chars(reference));
        (1..=self.char_order)
            .map(|n| {
                let (hn, rn) = (ngrams(&h, n), ngrams(&r, n));
                let matched = hn.iter().map(|(g, &c)| c.min(rn.get(g).copied().unwrap_or(0))).sum();
                [hn.values().sum(), rn.values().sum(), matched]
            })
            .collect()
    }

    fn score(&self, counts: &Counts) -> f64 {
        const EPS: f64 = 1e-16;
        let b2 = self.beta * self.beta;
        let f = |p: f64, r: f64| {
            let d = b2 * p + r;
            if d > 0.0 { (1.0 + b2) * p * r / d } else { 0.0 }
        };
        if self.eps_smoothing {
            let sum: f64 = counts
                .iter()
                .map(|&[h, r, m]| {
                    let p = if h > 0 { m as f64 / h as f64 } else { EPS };
                    let rec = if r > 0 { m as f64 / r as f64 } else { EPS };
                    if b2 * p + rec > 0.0 { f(p, rec) } else { EPS }
                })
                .sum();
            return 100.0 * sum / counts.len() as f64;
        }
        let effective: Vec<(f64, f64)> = counts
            .iter()
            .filter(|&&[h, r, _]| h > 0 && r > 0)
            .map(|&[h, r, m]| (m as f64 / h as f64, m as f64 / r as f64))
            .collect();
        if effective.is_empty() {
            return 0.0;
        }
        let n = effective.len() as f64;
        let (p, r) = effective.iter().fold((0.0, 0.0), |(a, b), (p, r)| (a + p / n, b + r / n));
        100.0 * f(p, r)
    }
}

fn ngrams(chars: &[char], n: usize) -> HashMap<&[char], usize> {
    let mut out = HashMap::new();
    if chars.len() >= n {
        for w in chars.windows(n) {
            *out.entry(w).or_insert(0) += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sacreBLEU's test values (test/test_chrf.py, sacreBLEU 2.x).
    #[test]
    fn matches_sacrebleu_published_values() {
        let close = |got: f64, want: f64, what: &str| assert!((got - want).abs() < 1e-4, "{what}: {got} ≠ {want}");
        // β = 3, ε-smoothing
        let eps = Chrf { beta: 3.0, eps_smoothing: true, ..Default::default() };
        let cases: &[(&[&str], &[&str], f64)] = &[
            (&["abcdefg"], &["hijklmnop"], 0.0),
            (&["a"], &["b"], 0.0),
            (&[""], &["b"], 0.0),
            (&[""], &["reference"], 0.0),
            (&["aa"], &["ab"], 8.3333),
            (&["a", "b"], &["a", "c"], 8.3333),
            (&["a"], &["a"], 16.6667),
            (&["a b c"], &["a b c"], 50.0),
            (&["a b c"], &["abc"], 50.0),
            (
                &[
                    " risk assessment must be made of those who are qualified and expertise in the sector - these are the scientists .",
                ],
                &[
                    "risk assessment has to be undertaken by those who are qualified and expert in that area - that is the scientists .",
                ],
                63.361730,
            ),
            (
                &[" Die    Beziehung zwischen  Obama und Netanjahu ist nicht gerade  freundlich. "],
                &["Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."],
                64.1302698,
            ),
            (
                &["Niemand hat die Absicht, eine Mauer zu errichten"],
                &["Niemand hat die Absicht, eine Mauer zu errichten"],
                100.0,
            ),
        ];
        for (h, r, want) in cases {
            close(eps.corpus(h, r), *want, &format!("ε-smoothed {h:?}"));
        }
        // β = 3, effective order
        let eff = Chrf { beta: 3.0, ..Default::default() };
        let cases: &[(&[&str], &[&str], f64)] = &[
            (&["a"], &["a"], 100.0),
            (&[""], &["reference"], 0.0),
            (&["a b c"], &["a b c"], 100.0),
            (&["a b c"], &["abc"], 100.0),
            (&[""], &["c"], 0.0),
            (&["a", "b"], &["a", "c"], 50.0),
            (&["aa"], &["ab"], 25.0),
        ];
        for (h, r, want) in cases {
            close(eff.corpus(h, r), *want, &format!("effective order {h:?}"));
        }
        // β = 3, whitespace kept (effective order)
        let ws = Chrf { beta: 3.0, keep_whitespace: true, ..Default::default() };
        close(
            ws.corpus(
                &["Die Beziehung zwischen Obama und Netanjahu ist nicht gerade freundlich."],
                &["Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."],
            ),
            67.3481606,
            "whitespace kept",
        );
        // sentence level, β = 2, ε-smoothing
        let sentence = Chrf { eps_smoothing: true, ..Default::default() };
        close(
            sentence.sentence(
                "Co nás nejvíc trápí, protože lékaři si vybírají, kdo bude žít a kdo zemře.",
                "Nejvíce smutní jsme z toho, že musíme rozhodovat o tom, kdo bude žít a kdo zemře.",
            ),
            39.14078509,
            "sentence 1",
        );
        close(
            sentence.sentence(
                "Lapali po dechu, jejich životy skončily dřív, než skutečně začaly.",
                "Lapali po dechu a pak jejich život skončil - dřív, než skutečně mohl začít, připomněli.",
            ),
            57.15704367,
            "sentence 3",
        );
    }

    /// sacreBLEU's default `corpus_chrf` (chrF2, effective order), as sacreBLEU 2.6.0 computes it.
    #[test]
    fn matches_sacrebleu_default_corpus_score() {
        let got = Chrf::default().corpus(
            &["Die Beziehung zwischen Obama und Netanjahu ist nicht gerade freundlich.", "Wir gehen heute nach Hause"],
            &[
                "Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich.",
                "Wir fahren heute heim",
            ],
        );
        assert!((got - 59.766893616202786).abs() < 1e-9, "{got}");
        assert!(
            (Chrf::default().corpus(&["the cat sat", "a"], &["the cat sat", "b"]) - 98.33333333333334).abs() < 1e-9
        );
    }

    /// The corpus score sums counts over sentences: it is not the mean of sentence scores.
    #[test]
    fn the_corpus_score_sums_counts_before_scoring() {
        let c = Chrf::default();
        let (h, r) = (["the cat sat", "a"], ["the cat sat", "b"]);
        let corpus = c.corpus(&h, &r);
        let mean = (c.sentence(h[0], r[0]) + c.sentence(h[1], r[1])) / 2.0;
        assert!(corpus > mean + 1.0, "corpus {corpus}, mean of sentences {mean}");
    }
}
