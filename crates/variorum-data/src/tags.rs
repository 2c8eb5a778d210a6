//! Example tags: the corpus cut into named sections (e.g. the works of the
//! Complete Shakespeare), so that a model can condition on the section a
//! window comes from — a per-example task prior, as in CAMTL.
//!
//! A regular expression marks where sections start; a section's name is the
//! match's first capture group (else the whole match), trimmed, and sections
//! with the same name share one tag. The text before the first match is tag 0,
//! "(untagged)"; named tags get ids 1, 2, … in order of first appearance.
//!
//! Tags are kept per split as the token offsets where sections start, not one
//! tag per token: a corpus has a few dozen sections and millions of tokens, and
//! a window's tag is then a binary search away.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use crate::error::{DataError, one_line};

/// Name of tag 0: the text before the first section start.
pub const UNTAGGED: &str = "(untagged)";

/// Which part of a tagged corpus is held out for validation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Holdout {
    /// The end of the text, as without tags (`data.val_fraction` of the chars);
    /// the sections that lie wholly in the training part are never validated on.
    #[default]
    End,
    /// The last `data.val_fraction` of every section's chars (at least one char
    /// on each side of a section of two chars or more; a one-char section goes
    /// to training), so that every tag is seen in both splits.
    EachSection,
}

/// The `[data.tags]` section of a run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagConfig {
    /// A regular expression (the `regex` crate's syntax, multi-line mode on, so
    /// `^` and `$` match at line starts and ends); every match starts a section
    /// at the match's start. The section is named by the match's first capture
    /// group when it has one, else by the whole match, trimmed.
    pub section: String,
    /// What is held out for validation.
    #[serde(default)]
    pub holdout: Holdout,
}

impl TagConfig {
    /// Checks that `section` compiles and cannot match the empty string (an
    /// empty match would start a section at every position).
    pub fn validate(&self) -> Result<(), DataError> {
        self.regex().map(drop)
    }

    /// The compiled `section` expression.
    pub(crate) fn regex(&self) -> Result<Regex, DataError> {
        let re = RegexBuilder::new(&self.section).multi_line(true).build().map_err(|e| {
            DataError::Config(format!(
                "data.tags.section = {:?} is not a valid regular expression: {}",
                self.section,
                one_line(e)
            ))
        })?;
        if re.is_match("") {
            return Err(DataError::Config(format!(
                "data.tags.section = {:?} matches the empty string: a section start must be at \
                 least one character, e.g. \"^ACT [IVX]+\" or \"^(.+)\\n\\nby William Shakespeare\"",
                self.section
            )));
        }
        Ok(re)
    }

    /// Cuts `text` into sections; `path` only names the corpus in the error when
    /// `section` matches nowhere.
    pub(crate) fn sections(&self, text: &str, path: &Path) -> Result<Sections, DataError> {
        let re = self.regex()?;
        find_sections(text, &re)?.ok_or_else(|| {
            DataError::Config(format!(
                "data.tags.section = {:?} matches nowhere in corpus {}: check the expression \
                 against the text (multi-line mode is on: ^ and $ match at every line), or \
                 remove data.tags",
                self.section,
                path.display()
            ))
        })
    }
}

/// A stretch of the corpus text (a byte range, never empty) and its tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) bytes: Range<usize>,
    pub(crate) tag: u32,
}

/// The whole text cut into sections, in text order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sections {
    /// Index = tag id; `names[0]` is [`UNTAGGED`].
    pub(crate) names: Vec<String>,
    /// Contiguous, covering the text from byte 0 to its end.
    pub(crate) pieces: Vec<Piece>,
}

/// The sections of `text` started by the matches of `re`; `None` if it matches nowhere.
///
/// A section literally named "(untagged)" shares tag 0, so that a name always
/// identifies one tag. Matches are non-overlapping (the regex crate's
/// `captures_iter`); should an empty match slip past [`TagConfig::validate`]
/// (e.g. `\b`, which does not match the empty text), two starts at one position
/// keep the later name and empty sections are dropped.
pub(crate) fn find_sections(text: &str, re: &Regex) -> Result<Option<Sections>, DataError> {
    let mut names = vec![UNTAGGED.to_string()];
    let mut ids: HashMap<String, u32> = HashMap::from([(UNTAGGED.to_string(), 0)]);
    // (byte offset, tag) of every section start, increasing.
    let mut marks: Vec<(usize, u32)> = Vec::new();
    for caps in re.captures_iter(text) {
        let Some(whole) = caps.get(0) else { continue };
        let name = caps.get(1).unwrap_or(whole).as_str().trim();
        let tag = match ids.get(name) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(names.len()).map_err(|_| {
                    DataError::Config(format!(
                        "data.tags.section names more than {} distinct sections: use an \
                         expression that matches fewer places",
                        u32::MAX
                    ))
                })?;
                names.push(name.to_string());
                ids.insert(name.to_string(), id);
                id
            }
        };
        if marks.last().is_some_and(|&(start, _)| start == whole.start()) {
            marks.pop();
        }
        marks.push((whole.start(), tag));
    }
    let Some(&(first, _)) = marks.first() else { return Ok(None) };
    let mut pieces = Vec::with_capacity(marks.len() + 1);
    if first > 0 {
        pieces.push(Piece { bytes: 0..first, tag: 0 });
    }
    for (i, &(start, tag)) in marks.iter().enumerate() {
        let end = marks.get(i + 1).map_or(text.len(), |&(next, _)| next);
        if start < end {
            pieces.push(Piece { bytes: start..end, tag });
        }
    }
    Ok(Some(Sections { names, pieces }))
}

/// The pieces of a tagged corpus on each side of the split, in text order, with
/// the number of chars on each side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitPieces {
    pub(crate) train: Vec<Piece>,
    pub(crate) val: Vec<Piece>,
    pub(crate) train_chars: usize,
    pub(crate) val_chars: usize,
}

impl Sections {
    /// `end` holdout: the pieces cut at byte `split` (a char boundary), which
    /// leaves `train_chars` chars before it and `val_chars` after.
    pub(crate) fn split_at(&self, split: usize, train_chars: usize, val_chars: usize) -> SplitPieces {
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for p in &self.pieces {
            if p.bytes.start < split {
                train.push(Piece { bytes: p.bytes.start..p.bytes.end.min(split), tag: p.tag });
            }
            if p.bytes.end > split {
                val.push(Piece { bytes: p.bytes.start.max(split)..p.bytes.end, tag: p.tag });
            }
        }
        SplitPieces { train, val, train_chars, val_chars }
    }

    /// `each-section` holdout: the last `val_fraction` of every piece's chars
    /// (rounded, at least one on each side of a piece of two chars or more; a
    /// one-char piece stays whole in training). Nothing is held out only when
    /// every piece is one char long: the caller refuses that.
    pub(crate) fn split_each_section(&self, text: &str, val_fraction: f64) -> SplitPieces {
        let mut split = SplitPieces { train: Vec::new(), val: Vec::new(), train_chars: 0, val_chars: 0 };
        for p in &self.pieces {
            let piece = &text[p.bytes.clone()];
            let n = piece.chars().count();
            let n_val = if n < 2 { 0 } else { ((n as f64) * val_fraction).round().clamp(1.0, (n - 1) as f64) as usize };
            let cut = p.bytes.start + piece.char_indices().nth(n - n_val).map_or(piece.len(), |(i, _)| i);
            split.train.push(Piece { bytes: p.bytes.start..cut, tag: p.tag });
            split.train_chars += n - n_val;
            if n_val > 0 {
                split.val.push(Piece { bytes: cut..p.bytes.end, tag: p.tag });
                split.val_chars += n_val;
            }
        }
        split
    }
}

impl SplitPieces {
    /// The training text: borrowed when the training pieces are one stretch of
    /// `text` (the `end` holdout), else their concatenation.
    pub(crate) fn train_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let contiguous = self.train.windows(2).all(|w| w[0].bytes.end == w[1].bytes.start);
        match (self.train.first(), self.train.last()) {
            (Some(first), Some(last)) if contiguous => Cow::Borrowed(&text[first.bytes.start..last.bytes.end]),
            _ => Cow::Owned(self.train.iter().map(|p| &text[p.bytes.clone()]).collect()),
        }
    }
}

/// The tags of one split's tokens: the token offsets where sections start and
/// their tags. The tag of token `i` is `tags[k]` for the last `k` with
/// `starts[k] <= i`.
///
/// Invariants (checked by [`SplitTags::new`]): as many starts as tags, at least
/// one, `starts[0] == 0`, starts strictly increasing. A value that breaks them
/// (e.g. deserialized from a hand-edited file) does not panic: positions before
/// the first start read as tag 0, a start without a tag as tag 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitTags {
    starts: Vec<usize>,
    tags: Vec<u32>,
}

impl SplitTags {
    /// Tags from explicit section starts; fails unless the invariants above hold.
    pub fn new(starts: Vec<usize>, tags: Vec<u32>) -> Result<Self, DataError> {
        if starts.len() != tags.len() {
            return Err(DataError::Config(format!(
                "split tags: {} section starts but {} tags: give one tag per start",
                starts.len(),
                tags.len()
            )));
        }
        match starts.first() {
            None => {
                return Err(DataError::Config("split tags: no section starts: give at least one, at token 0".into()));
            }
            Some(&first) if first != 0 => {
                return Err(DataError::Config(format!(
                    "split tags: the first section starts at token {first}: it must start at token 0"
                )));
            }
            Some(_) => {}
        }
        if let Some(w) = starts.windows(2).find(|w| w[0] >= w[1]) {
            return Err(DataError::Config(format!(
                "split tags: section starts {} then {} are not strictly increasing",
                w[0], w[1]
            )));
        }
        Ok(SplitTags { starts, tags })
    }

    /// Tags from `(token offset, tag)` marks in increasing offset order, one per
    /// piece, for a split of `len` tokens: a piece that produced no tokens gives
    /// way to the next one at the same offset, consecutive sections with the
    /// same tag are merged, and a start at or past `len` is dropped.
    pub(crate) fn from_marks(marks: impl IntoIterator<Item = (usize, u32)>, len: usize) -> Self {
        let (mut starts, mut tags): (Vec<usize>, Vec<u32>) = (Vec::new(), Vec::new());
        for (start, tag) in marks {
            if starts.last() == Some(&start) {
                starts.pop();
                tags.pop();
            }
            if tags.last() == Some(&tag) {
                continue;
            }
            starts.push(start);
            tags.push(tag);
        }
        while starts.len() > 1 && starts.last().is_some_and(|&s| s >= len) {
            starts.pop();
            tags.pop();
        }
        if starts.first() != Some(&0) {
            starts.insert(0, 0);
            tags.insert(0, 0);
        }
        SplitTags { starts, tags }
    }

    /// Token offsets where sections start (increasing, the first 0).
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }

    /// The tag of each section, parallel to [`SplitTags::starts`].
    pub fn tags(&self) -> &[u32] {
        &self.tags
    }

    /// The tag of (virtual) segment `i`: segment 0 is the stretch before the
    /// first start, segment `i > 0` begins at `starts[i - 1]`.
    fn segment_tag(&self, i: usize) -> u32 {
        i.checked_sub(1).and_then(|k| self.tags.get(k)).copied().unwrap_or(0)
    }

    /// The tag of token `token` (a binary search over the section starts). A
    /// token past the end of the split has the last section's tag.
    pub fn tag_at(&self, token: usize) -> u32 {
        self.segment_tag(self.starts.partition_point(|&s| s <= token))
    }

    /// The tag holding most of the tokens `start..start + len`; between tags
    /// that hold equally many, the one whose last section in the window comes
    /// later. `len == 0` gives the tag of `start`.
    pub fn window_tag(&self, start: usize, len: usize) -> u32 {
        if len == 0 {
            return self.tag_at(start);
        }
        let end = start.saturating_add(len);
        // (tag, tokens in the window, last segment of the tag in the window)
        let mut counts: Vec<(u32, usize, usize)> = Vec::new();
        let mut segment = self.starts.partition_point(|&s| s <= start);
        let mut pos = start;
        while pos < end {
            let segment_end = self.starts.get(segment).copied().unwrap_or(usize::MAX).min(end);
            if segment_end > pos {
                let tag = self.segment_tag(segment);
                let n = segment_end - pos;
                match counts.iter_mut().find(|c| c.0 == tag) {
                    Some(c) => {
                        c.1 += n;
                        c.2 = segment;
                    }
                    None => counts.push((tag, n, segment)),
                }
                pos = segment_end;
            }
            segment += 1;
        }
        counts.into_iter().max_by_key(|&(_, n, last)| (n, last)).map_or(0, |(tag, _, _)| tag)
    }
}

/// The tags of a tagged corpus: the tag names and, per split, where sections start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagSections {
    /// Index = tag id; `names[0]` is "(untagged)", the text before the first section.
    pub names: Vec<String>,
    /// Tags of the training tokens (`Corpus::train`).
    pub train: SplitTags,
    /// Tags of the validation tokens (`Corpus::val`).
    pub val: SplitTags,
}

impl TagSections {
    /// The id of the tag named `name`.
    pub fn id(&self, name: &str) -> Option<u32> {
        self.names.iter().position(|n| n == name).and_then(|i| u32::try_from(i).ok())
    }

    /// The name of tag `tag`.
    pub fn name(&self, tag: u32) -> Option<&str> {
        usize::try_from(tag).ok().and_then(|i| self.names.get(i)).map(String::as_str)
    }

    /// Number of tags, tag 0 included: the size a tag embedding needs.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True only for a value built by hand without names (a loaded corpus always has tag 0).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(section: &str) -> TagConfig {
        TagConfig { section: section.into(), holdout: Holdout::End }
    }

    fn sections(text: &str, section: &str) -> Sections {
        cfg(section).sections(text, Path::new("mem.txt")).expect("matches")
    }

    /// (text of the piece, name of its tag) for every piece.
    fn named<'a>(text: &'a str, s: &'a Sections, pieces: &[Piece]) -> Vec<(&'a str, &'a str)> {
        pieces.iter().map(|p| (&text[p.bytes.clone()], s.names[p.tag as usize].as_str())).collect()
    }

    #[test]
    fn sections_are_named_by_the_capture_group_and_share_tags() {
        let text = "preface\n== One ==\naaa\n== Two ==\nbb\n==  One ==\nc\n";
        let s = sections(text, r"^== (.+) ==$");
        assert_eq!(s.names, ["(untagged)", "One", "Two"]);
        assert_eq!(
            named(text, &s, &s.pieces),
            [
                ("preface\n", "(untagged)"),
                ("== One ==\naaa\n", "One"),
                ("== Two ==\nbb\n", "Two"),
                ("==  One ==\nc\n", "One"),
            ]
        );
        assert_eq!(s.pieces.iter().map(|p| p.tag).collect::<Vec<_>>(), [0, 1, 2, 1]);
    }

    #[test]
    fn without_a_group_the_whole_match_names_the_section() {
        let text = "ACT I\nx\nACT II\ny\nACT I\nz";
        let s = sections(text, r"^ACT [IVX]+$");
        assert_eq!(s.names, ["(untagged)", "ACT I", "ACT II"]);
        assert_eq!(s.pieces.iter().map(|p| p.tag).collect::<Vec<_>>(), [1, 2, 1], "no untagged prefix");
        assert_eq!(s.pieces[0].bytes.start, 0);
        assert_eq!(s.pieces.last().map(|p| p.bytes.end), Some(text.len()));
    }

    #[test]
    fn ids_follow_first_appearance() {
        let text = "xBbbAaCcBbAa";
        let s = sections(text, "[A-Z]");
        assert_eq!(s.names, ["(untagged)", "B", "A", "C"]);
        assert_eq!(s.pieces.iter().map(|p| p.tag).collect::<Vec<_>>(), [0, 1, 2, 3, 1, 2]);
    }

    #[test]
    fn shakespeare_titles() {
        // The Complete Shakespeare glues a title to the previous work's last line.
        let re = r"(?:THE END)?([A-Z][A-Z0-9 ,'\-]*[A-Z])\n\nby William Shakespeare";
        let text = "THE TEMPEST\n\nby William Shakespeare\n\nMIRANDA. O!\n\n[Exeunt.]\n\nTHE ENDKING JOHN\n\n\
                    by William Shakespeare\n\nKING JOHN. Now.\n[Exit.]THE TEMPEST\n\nby William Shakespeare\n\nAgain.";
        let s = sections(text, re);
        assert_eq!(s.names, ["(untagged)", "THE TEMPEST", "KING JOHN"]);
        let pieces = named(text, &s, &s.pieces);
        assert_eq!(pieces.len(), 3);
        assert!(pieces[0].0.ends_with("[Exeunt.]\n\n") && pieces[0].1 == "THE TEMPEST", "{pieces:?}");
        assert!(pieces[1].0.starts_with("THE ENDKING JOHN") && pieces[1].1 == "KING JOHN", "{pieces:?}");
        assert!(pieces[2].0.starts_with("THE TEMPEST") && pieces[2].1 == "THE TEMPEST", "{pieces:?}");
    }

    #[test]
    fn end_holdout_cuts_the_section_that_straddles_the_split() {
        let text = "zzAaaaaBbbbb";
        let s = sections(text, "[A-Z]");
        let split = s.split_at(9, 9, 3);
        assert_eq!(named(text, &s, &split.train), [("zz", "(untagged)"), ("Aaaaa", "A"), ("Bb", "B")]);
        assert_eq!(named(text, &s, &split.val), [("bbb", "B")]);
        assert_eq!(split.train_text(text), "zzAaaaaBb");
        assert!(matches!(split.train_text(text), Cow::Borrowed(_)));
    }

    #[test]
    fn each_section_holdout_puts_every_tag_in_both_splits() {
        let text = "zzzzAaaaaaaaaaBbbbbCÔôôôôô";
        let s = sections(text, "[A-ZÔ]");
        let split = s.split_each_section(text, 0.2);
        assert_eq!(
            named(text, &s, &split.train),
            [("zzz", "(untagged)"), ("Aaaaaaaa", "A"), ("Bbbb", "B"), ("C", "C"), ("Ôôôôô", "Ô")]
        );
        assert_eq!(named(text, &s, &split.val), [("z", "(untagged)"), ("aa", "A"), ("b", "B"), ("ô", "Ô")]);
        assert_eq!(split.train_chars + split.val_chars, text.chars().count());
        assert_eq!(split.train_chars, split.train_text(text).chars().count());
        assert_eq!(split.train_text(text), "zzzAaaaaaaaBbbbCÔôôôô");
        // Extreme fractions still leave a char on each side of every section.
        for vf in [0.001, 0.999] {
            let split = s.split_each_section(text, vf);
            assert_eq!(split.train.len(), 5);
            assert_eq!(split.val.len(), 4, "all but the one-char section C");
            assert_eq!(split.train_chars + split.val_chars, text.chars().count());
        }
    }

    #[test]
    fn tag_at_and_window_tag() {
        let t = SplitTags::new(vec![0, 5, 10], vec![1, 2, 1]).expect("valid");
        let at: Vec<u32> = [0, 4, 5, 9, 10, 1000].into_iter().map(|i| t.tag_at(i)).collect();
        assert_eq!(at, [1, 1, 2, 2, 1, 1]);
        assert_eq!(t.window_tag(2, 4), 1, "3 of 4 tokens in the first section");
        assert_eq!(t.window_tag(3, 4), 2, "a 2-2 tie goes to the later section");
        assert_eq!(t.window_tag(5, 5), 2, "exactly one section");
        assert_eq!(t.window_tag(4, 7), 2);
        assert_eq!(t.window_tag(1, 12), 1, "counts add up over sections of one tag");
        assert_eq!(t.window_tag(7, 0), 2);
        assert_eq!(t.window_tag(998, 5), 1, "past the end: the last section");
        // A tie between a tag that appears before and after another: the later section wins.
        let t = SplitTags::new(vec![0, 1, 3], vec![1, 2, 1]).expect("valid");
        assert_eq!(t.window_tag(0, 4), 1);
        assert_eq!(t.window_tag(0, 3), 2);
    }

    #[test]
    fn from_marks_merges_and_drops_empty_pieces() {
        let t = SplitTags::from_marks([(0, 1), (4, 1), (9, 2), (9, 3), (12, 3), (20, 4)], 20);
        assert_eq!((t.starts(), t.tags()), (&[0, 9][..], &[1, 3][..]));
        let t = SplitTags::from_marks([(0, 0), (0, 2), (3, 0)], 5);
        assert_eq!((t.starts(), t.tags()), (&[0, 3][..], &[2, 0][..]));
    }

    #[test]
    fn split_tags_new_checks_its_invariants() {
        assert!(SplitTags::new(vec![0, 3], vec![1]).is_err());
        assert!(SplitTags::new(vec![1, 3], vec![1, 2]).is_err());
        assert!(SplitTags::new(vec![0, 3, 3], vec![1, 2, 1]).is_err());
        assert!(SplitTags::new(vec![], vec![]).is_err());
        // A broken value (e.g. deserialized) does not panic.
        let broken: SplitTags = serde_json::from_str(r#"{"starts":[2,4],"tags":[5]}"#).expect("parses");
        assert_eq!([broken.tag_at(0), broken.tag_at(2), broken.tag_at(4)], [0, 5, 0]);
        assert_eq!(broken.window_tag(0, 6), 0);
    }

    #[test]
    fn tag_sections_lookups() {
        let t = SplitTags::new(vec![0], vec![0]).expect("valid");
        let s = TagSections { names: vec![UNTAGGED.into(), "A".into(), "B".into()], train: t.clone(), val: t };
        assert_eq!((s.id("B"), s.id("(untagged)"), s.id("C")), (Some(2), Some(0), None));
        assert_eq!((s.name(1), s.name(3)), (Some("A"), None));
        assert_eq!(s.len(), 3);
        assert!(!s.is_empty());
    }

    #[test]
    fn config_errors_name_the_key() {
        let msg = cfg("(unclosed").validate().expect_err("bad regex").to_string();
        assert!(msg.starts_with("data.tags.section = \"(unclosed\" is not a valid regular expression"), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        for empty in ["x*", "^", "(?:ACT)?", r"\s*"] {
            let msg = cfg(empty).validate().expect_err("matches the empty string").to_string();
            assert!(msg.contains("data.tags.section") && msg.contains("matches the empty string"), "{msg}");
        }
        let msg = cfg("^ACT").sections("no acts here", Path::new("x/in.txt")).expect_err("no match").to_string();
        assert!(msg.contains("data.tags.section = \"^ACT\" matches nowhere in corpus x/in.txt"), "{msg}");
        assert!(cfg("^ACT [IVX]+$").validate().is_ok());
    }

    #[test]
    fn config_serde() {
        let c: TagConfig = serde_json::from_str(r#"{"section":"^ACT","holdout":"each-section"}"#).expect("ok");
        assert_eq!(c, TagConfig { section: "^ACT".into(), holdout: Holdout::EachSection });
        let json = serde_json::to_string(&c).expect("serializes");
        assert_eq!(serde_json::from_str::<TagConfig>(&json).expect("round trip"), c);
        assert!(json.contains("\"each-section\""), "{json}");
        let c: TagConfig = serde_json::from_str(r#"{"section":"^ACT"}"#).expect("ok");
        assert_eq!(c.holdout, Holdout::End);
        assert!(serde_json::from_str::<TagConfig>(r#"{"section":"^ACT","hold_out":"end"}"#).is_err());
        assert!(serde_json::from_str::<TagConfig>(r#"{"section":"^ACT","holdout":"EachSection"}"#).is_err());
    }
}
