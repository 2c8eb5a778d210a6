//! The README's example config lists, beside each axis's table, the kinds a user can choose: every
//! registered kind must be there (the list was once written by hand and fell behind the registry).

use std::collections::BTreeSet;

/// The words in the comments of the README's config block from `[axis]` to the next blank line.
fn listed(readme: &str, axis: &str) -> Option<BTreeSet<String>> {
    let header = format!("[{axis}]");
    let start = readme.lines().position(|l| l.trim_start().starts_with(&header))?;
    let mut words = BTreeSet::new();
    for line in readme.lines().skip(start).take_while(|l| !l.trim().is_empty()) {
        let Some((_, comment)) = line.split_once('#') else { continue };
        let is_word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        words.extend(comment.split(|c: char| !is_word(c)).filter(|w| !w.is_empty()).map(String::from));
    }
    Some(words)
}

#[test]
fn the_readme_lists_every_registered_kind_beside_its_axis() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let mut missing = Vec::new();
    for kind in variorum_model::zoo::kinds() {
        let words = listed(&readme, kind.axis).unwrap_or_else(|| panic!("README has no [{}] table", kind.axis));
        if !words.contains(kind.kind) {
            missing.push(format!("{} = \"{}\"", kind.axis, kind.kind));
        }
    }
    assert!(missing.is_empty(), "kinds the README's config block does not list: {}", missing.join(", "));
}

#[test]
fn a_kind_left_out_of_the_list_is_found() {
    let readme = "```toml\n[model.attention]   # full | linear\nkind = \"full\"   # | performer\n\n[model.block]\n";
    let words = listed(readme, "model.attention").unwrap();
    assert!(words.contains("performer") && words.contains("linear"));
    assert!(!words.contains("fnet"));
    assert!(listed(readme, "model.depth").is_none());
}
