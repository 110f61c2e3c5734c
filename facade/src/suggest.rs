//! Names near a name that was not found: "did you mean" hints for entry names, selections and keywords.
//!
//! One ranking serves every hint, so the CLI and Python suggest the same names. A name scores by the
//! Damerau-Levenshtein similarity of the whole names, of their last dotted components (a typo in
//! `layers.0.attn.q_proj.weigth` is a typo in `weigth`) and of the name's beginning (`optimizr.*`), and a name that holds the wanted text, or that the
//! wanted text holds, scores as high as a near match. Glob characters (`*`, `?`, `[...]`) are dropped from the
//! wanted text first, so a pattern that matched nothing is compared by its literal parts.

/// How similar a name must be (0 to 1) to be offered by [`did_you_mean`].
const SIMILAR: f64 = 0.6;

/// How far below the best a name may score and still be offered beside it by [`did_you_mean`].
const CLOSE: f64 = 0.1;

/// The literal text of a glob pattern: `*`, `?` and bracket classes removed.
fn literal(pattern: &str) -> String {
    let mut out = String::new();
    let mut in_class = false;
    for c in pattern.chars() {
        match c {
            '[' => in_class = true,
            ']' if in_class => in_class = false,
            '*' | '?' => {}
            _ if !in_class => out.push(c),
            _ => {}
        }
    }
    out
}

/// How near `name` is to `wanted` (already literal and lowercase), from 0 (nothing alike) to 1.
fn score(wanted: &str, name: &str) -> f64 {
    let name = name.to_lowercase();
    if wanted.is_empty() {
        return 0.0;
    }
    if name.contains(wanted) || (name.len() >= 3 && wanted.contains(name.as_str())) {
        // Containment: the nearer the lengths, the better, and never below a near match.
        let (short, long) =
            if name.len() < wanted.len() { (name.len(), wanted.len()) } else { (wanted.len(), name.len()) };
        return 0.8 + 0.2 * short as f64 / long.max(1) as f64;
    }
    let whole = strsim::normalized_damerau_levenshtein(wanted, &name);
    let last = |s: &str| s.rsplit('.').next().unwrap_or(s).to_owned();
    let (wanted_last, name_last) = (last(wanted), last(&name));
    let tail = if wanted.contains('.') && name.contains('.') {
        // Same path but for the last component: a typo in the leaf.
        let stem = |s: &str| s.rsplit_once('.').map_or(String::new(), |(a, _)| a.to_owned());
        if stem(wanted) == stem(&name) { strsim::normalized_damerau_levenshtein(&wanted_last, &name_last) } else { 0.0 }
    } else {
        0.0
    };
    // A misspelled start (`optimizr.*`): the name's beginning, as long as the wanted text or one longer.
    let chars = wanted.chars().count();
    let head = |len: usize| name.chars().take(len).collect::<String>();
    let start = strsim::normalized_damerau_levenshtein(wanted, &head(chars))
        .max(strsim::normalized_damerau_levenshtein(wanted, &head(chars + 1)));
    whole.max(tail).max(0.95 * start)
}

/// `names` ranked by nearness to `wanted` (a name or a glob pattern), best first, ties in `names`' order.
fn ranked<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<(f64, &'a str)> {
    let wanted = literal(wanted).to_lowercase();
    let mut scored: Vec<(f64, &str)> = names.into_iter().map(|n| (score(&wanted, n), n)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored
}

/// Up to `n` of `names` that look like a misspelling of `wanted` (a name or a glob pattern), best first:
/// those near enough to be a likely meaning and about as near as the nearest (a clear best match comes alone),
/// empty when none is.
///
/// ```
/// let names = ["model.layers.0.weight", "model.layers.0.bias", "optimizer.state.0.step"];
/// assert_eq!(ckpt::suggest::did_you_mean("model.layers.0.weigth", names, 3), ["model.layers.0.weight"]);
/// assert_eq!(ckpt::suggest::did_you_mean("optimizr.*", names, 3), ["optimizer.state.0.step"]);
/// assert!(ckpt::suggest::did_you_mean("zzz", names, 3).is_empty());
/// ```
pub fn did_you_mean<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>, n: usize) -> Vec<&'a str> {
    let ranked = ranked(wanted, names);
    let bar = ranked.first().map_or(SIMILAR, |(best, _)| SIMILAR.max(best - CLOSE));
    ranked.into_iter().take_while(|(s, _)| *s >= bar).take(n).map(|(_, name)| name).collect()
}

/// The `n` of `names` nearest to `wanted`, best first, however far: what to show when a selection selected
/// nothing, so that the user sees names that are there.
///
/// ```
/// let names = ["a.weight", "b.bias", "step"];
/// assert_eq!(ckpt::suggest::nearest("nomatch*", names, 2).len(), 2);
/// assert_eq!(ckpt::suggest::nearest("bias", names, 1), ["b.bias"]);
/// ```
pub fn nearest<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>, n: usize) -> Vec<&'a str> {
    ranked(wanted, names).into_iter().take(n).map(|(_, name)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_compare_by_their_literal_parts() {
        assert_eq!(literal("state_dict.*.w[0-9]?"), "state_dict..w");
        let names = ["state_dict.row", "state_dict.col", "epoch"];
        assert_eq!(did_you_mean("stat_dict.*", names, 1), ["state_dict.row"]);
    }

    #[test]
    fn a_prefix_of_names_suggests_them() {
        let names = ["state_dict.row", "state_dict.col", "epoch"];
        assert_eq!(did_you_mean("state_dict", names, 5), ["state_dict.row", "state_dict.col"]);
    }

    #[test]
    fn far_names_are_not_offered_but_are_the_nearest() {
        let names = ["alpha", "beta"];
        assert!(did_you_mean("zzzzzz", names, 5).is_empty());
        assert_eq!(nearest("zzzzzz", names, 5).len(), 2);
        assert!(nearest("x", [], 3).is_empty());
    }
}
