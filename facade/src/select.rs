//! Selecting part of a checkpoint: entries kept by glob patterns on their flattened names, names renamed by
//! a prefix, floating-point tensors cast to one dtype — what `ckpt convert --include/--exclude
//! --strip-prefix/--add-prefix --dtype` applies to every entry before any target writes it.
//!
//! Non-tensor structure: a selection works on entries. An entry is kept or dropped whole (a value entry such
//! as `optimizer.param_groups.0.params` is never edited), and nothing is renumbered: an optimizer state
//! refers to its parameters by index, so select an optimizer's state whole (`--include 'optimizer.*'`) or
//! leave it out (`--exclude 'optimizer.*'`); keeping part of it keeps indices that point at parameters
//! that may no longer be there.
//!
//! ```
//! use ckpt::select::Selection;
//! use ckpt_tensor::PathItem;
//! let s = Selection::default().with_include("module.*").with_exclude("*.num_batches_tracked").with_strip_prefix("module.");
//! assert!(s.keeps("module.bn.weight") && !s.keeps("module.bn.num_batches_tracked") && !s.keeps("epoch"));
//! let path = [PathItem::Key("module".into()), PathItem::Key("bn".into()), PathItem::Key("weight".into())];
//! let (name, path) = s.rename("module.bn.weight", &path).unwrap();
//! assert_eq!(name, "bn.weight");
//! assert_eq!(path, [PathItem::Key("bn".into()), PathItem::Key("weight".into())]);
//! ```

use std::path::Path;

use ckpt_tensor::FormatError;
use ckpt_tensor::flatten::join_path;
use ckpt_tensor::{DType, Fault, PathItem, Result};

/// How many names nearest each include pattern that matched nothing an empty selection's error lists.
const NEAREST: usize = 5;

/// A [`Selection`] whose options cannot be applied, one variant per rule; it converts into the core error
/// as [`ckpt_tensor::Error::Format`] of [`Fault::InvalidArgument`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelectionError {
    /// A `--dtype` that is not one of the four float targets.
    #[error("invalid argument: --dtype {dtype}: one of bf16, f16, f32, f64")]
    BadDtype {
        /// The dtype asked for.
        dtype: DType,
    },
    /// An empty `--include` or `--exclude` pattern.
    #[error("invalid argument: an empty --include/--exclude pattern")]
    EmptyPattern,
    /// A `--rename FROM=TO` with an empty `FROM`, or a `TO` with more `*` than `FROM`.
    #[error(
        "invalid argument: --rename {from}={to}: FROM must not be empty, and TO can use at most the {stars} `*` of \
         FROM"
    )]
    BadRename {
        /// The pattern renamed from.
        from: String,
        /// The pattern renamed to.
        to: String,
        /// The `*` of `from`.
        stars: usize,
    },
}

impl FormatError for SelectionError {
    /// Who is at fault: the caller, for every rule.
    fn fault(&self) -> Fault {
        match self {
            SelectionError::BadDtype { .. } | SelectionError::EmptyPattern | SelectionError::BadRename { .. } => {
                Fault::InvalidArgument
            }
        }
    }
}

/// What part of a checkpoint to keep, under which names, in which float dtype. The default keeps everything
/// as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Selection {
    /// Keep only entries whose name matches one of these globs (all entries when empty).
    pub include: Vec<String>,
    /// Drop entries whose name matches one of these globs (after `include`).
    pub exclude: Vec<String>,
    /// Remove this prefix from the names that start with it (and the `.` after it when it ends a name
    /// component: `module` and `module.` both turn `module.fc.weight` into `fc.weight`).
    pub strip_prefix: Option<String>,
    /// Prepend this to every name (after `strip_prefix`).
    pub add_prefix: Option<String>,
    /// Cast every floating-point tensor to this dtype (float16, bfloat16, float32 or float64), as torch's
    /// `.to()` does ([`ckpt_tensor::cast_float`]); other tensors and values are left as they are.
    pub dtype: Option<DType>,
    /// Make every quantized or sparse tensor dense ([`ckpt_tensor::Composite::to_dense`]: dequantized to
    /// float32 as torch's `dequantize()` does, `to_dense()` of a sparse one) before any cast; a nested tensor
    /// has no dense form and is refused.
    pub dense: bool,
    /// Rename rules `(from, to)`, applied after the prefixes; the first rule that matches a name renames
    /// it ([`rename_by_rules`]).
    pub rename: Vec<(String, String)>,
}

impl Selection {
    /// Adds an include glob.
    #[must_use]
    pub fn with_include(mut self, glob: &str) -> Self {
        self.include.push(glob.to_owned());
        self
    }

    /// Adds an exclude glob.
    #[must_use]
    pub fn with_exclude(mut self, glob: &str) -> Self {
        self.exclude.push(glob.to_owned());
        self
    }

    /// Sets the prefix to strip.
    #[must_use]
    pub fn with_strip_prefix(mut self, prefix: &str) -> Self {
        self.strip_prefix = Some(prefix.to_owned());
        self
    }

    /// Sets the prefix to add.
    #[must_use]
    pub fn with_add_prefix(mut self, prefix: &str) -> Self {
        self.add_prefix = Some(prefix.to_owned());
        self
    }

    /// Sets the dtype floating-point tensors are cast to.
    #[must_use]
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Makes quantized and sparse tensors dense ([`Selection::dense`]).
    #[must_use]
    pub fn with_dense(mut self) -> Self {
        self.dense = true;
        self
    }

    /// Adds a rename rule: `from` with `*`s matches a whole name and `to`'s `*`s take what they matched, in
    /// order; `from` without `*` is a prefix that `to` replaces ([`rename_by_rules`]).
    #[must_use]
    pub fn with_rename(mut self, from: &str, to: &str) -> Self {
        self.rename.push((from.to_owned(), to.to_owned()));
        self
    }

    /// Whether this selection keeps everything as it is.
    pub fn is_identity(&self) -> bool {
        *self == Selection::default()
    }

    /// Whether some entries may be left out ([`Selection::keeps`] is not always true: include or exclude
    /// globs are given).
    pub fn filters(&self) -> bool {
        !self.include.is_empty() || !self.exclude.is_empty()
    }

    /// Whether names change ([`Selection::rename`] is not the identity).
    pub fn renames(&self) -> bool {
        self.strip_prefix.as_deref().is_some_and(|p| !p.is_empty())
            || self.add_prefix.as_deref().is_some_and(|p| !p.is_empty())
            || !self.rename.is_empty()
    }

    /// Checks the options: the dtype is one of the four float targets, no pattern is empty.
    ///
    /// # Errors
    /// A [`SelectionError`] saying what is wrong.
    pub fn validate(&self) -> Result<()> {
        if let Some(d) = self.dtype {
            if !matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
                return Err(SelectionError::BadDtype { dtype: d }.into());
            }
        }
        if self.include.iter().chain(&self.exclude).any(String::is_empty) {
            return Err(SelectionError::EmptyPattern.into());
        }
        for (from, to) in &self.rename {
            let (nf, nt) = (from.matches('*').count(), to.matches('*').count());
            if from.is_empty() || nt > nf {
                return Err(SelectionError::BadRename { from: from.clone(), to: to.clone(), stars: nf }.into());
            }
        }
        Ok(())
    }

    /// Checks that this selection selects from the entries `names` of the checkpoint at `path`: every
    /// include pattern matches an entry (a pattern that matches nothing is a typo even when the others
    /// match), and the exclude patterns leave an entry. A selection that filters nothing, or only excludes
    /// from a checkpoint without entries, passes.
    ///
    /// ```
    /// use ckpt::select::Selection;
    /// let names = ["model.w", "model.b", "epoch"];
    /// let path = std::path::Path::new("m.pt");
    /// assert!(Selection::default().with_include("model.*").check_selects(&names, path).is_ok());
    /// let typo = Selection::default().with_include("model.*").with_include("epoc").check_selects(&names, path);
    /// assert!(matches!(typo, Err(ckpt::Error::EmptySelection { nearest, .. }) if nearest[0] == "epoch"));
    /// assert!(Selection::default().with_exclude("*").check_selects(&names, path).is_err());
    /// ```
    ///
    /// # Errors
    /// [`crate::error::Error::EmptySelection`] naming the include patterns that match nothing and the names nearest
    /// them ([`crate::suggest::nearest`]), or how many entries the excludes removed.
    pub fn check_selects(&self, names: &[&str], path: &Path) -> crate::error::Result<()> {
        if !self.filters() || (self.include.is_empty() && names.is_empty()) {
            return Ok(());
        }
        let unmatched: Vec<String> =
            self.include.iter().filter(|g| !names.iter().any(|n| glob_match(g, n))).cloned().collect();
        if !unmatched.is_empty() {
            let mut nearest: Vec<String> = Vec::new();
            for g in &unmatched {
                for n in crate::suggest::nearest(g, names.iter().copied(), NEAREST) {
                    if !nearest.iter().any(|m| m == n) {
                        nearest.push(n.to_owned());
                    }
                }
            }
            return Err(crate::error::Error::EmptySelection {
                path: path.to_path_buf(),
                unmatched,
                removed: 0,
                nearest,
            });
        }
        if names.iter().any(|n| self.keeps(n)) {
            return Ok(());
        }
        let included = |n: &&&str| self.include.is_empty() || self.include.iter().any(|g| glob_match(g, n));
        let removed = names.iter().filter(included).count();
        Err(crate::error::Error::EmptySelection { path: path.to_path_buf(), unmatched, removed, nearest: Vec::new() })
    }

    /// Whether the entry `name` is kept: it matches an include glob (or there are none) and no exclude glob.
    pub fn keeps(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| glob_match(g, name)))
            && !self.exclude.iter().any(|g| glob_match(g, name))
    }

    /// The new name and path of entry `name` at `path` (its path in the nested state dict): the prefix
    /// stripped from both (whole path steps, or the start of a key), then added (to the first key).
    /// `None` when stripping would leave nothing.
    pub fn rename(&self, name: &str, path: &[PathItem]) -> Option<(String, Vec<PathItem>)> {
        let (mut name, mut path) = (name.to_owned(), path.to_vec());
        if let Some(p) = self.strip_prefix.as_deref().filter(|p| !p.is_empty()) {
            if let Some(rest) = name.strip_prefix(p) {
                let rest = match rest.strip_prefix('.') {
                    Some(r) if !p.ends_with('.') => r,
                    _ => rest,
                };
                if rest.is_empty() {
                    return None;
                }
                path = strip_path(&path, name.len() - rest.len(), rest);
                name = rest.to_owned();
            }
        }
        if let Some(p) = self.add_prefix.as_deref().filter(|p| !p.is_empty()) {
            name = format!("{p}{name}");
            path = match path.split_first() {
                Some((PathItem::Key(k), rest)) => {
                    let mut out = vec![PathItem::Key(format!("{p}{k}"))];
                    out.extend_from_slice(rest);
                    out
                }
                _ => vec![PathItem::Key(name.clone())],
            };
        }
        if let Some(renamed) = rename_by_rules(&self.rename, &name) {
            if renamed.is_empty() {
                return None;
            }
            path = vec![PathItem::Key(renamed.clone())];
            name = renamed;
        }
        Some((name, path))
    }
}

/// `name` renamed by the first of `rules` that matches it, or `None` when none does. A rule `(from, to)`
/// whose `from` has `*`s matches the whole name, each `*` any run of characters (the shortest that lets the
/// rest match), and `to`'s `*`s are replaced by those runs in order; a `from` without `*` matches names
/// starting with it, and `to` replaces that prefix.
///
/// ```
/// use ckpt::select::rename_by_rules;
/// let rules = [("decoder.layers.*.mlp.*".to_owned(), "model.layers.*.mlp.*".to_owned()), ("output_layer.".to_owned(), "lm_head.".to_owned())];
/// assert_eq!(rename_by_rules(&rules, "decoder.layers.3.mlp.fc.weight").as_deref(), Some("model.layers.3.mlp.fc.weight"));
/// assert_eq!(rename_by_rules(&rules, "output_layer.weight").as_deref(), Some("lm_head.weight"));
/// assert_eq!(rename_by_rules(&rules, "embedding.weight"), None);
/// ```
pub fn rename_by_rules(rules: &[(String, String)], name: &str) -> Option<String> {
    rules.iter().find_map(|(from, to)| {
        if !from.contains('*') {
            return name.strip_prefix(from.as_str()).map(|rest| format!("{to}{rest}"));
        }
        let captures = wildcard_captures(from, name)?;
        let mut out = String::with_capacity(to.len() + name.len());
        let mut caps = captures.into_iter();
        for (i, part) in to.split('*').enumerate() {
            if i > 0 {
                out.push_str(caps.next().unwrap_or_default());
            }
            out.push_str(part);
        }
        Some(out)
    })
}

/// What each `*` of `pattern` matches when it matches all of `name` (shortest runs first), or `None`.
fn wildcard_captures<'a>(pattern: &str, name: &'a str) -> Option<Vec<&'a str>> {
    fn go<'a>(parts: &[&str], name: &'a str, out: &mut Vec<&'a str>) -> bool {
        let Some((part, rest)) = parts.split_first() else { return name.is_empty() };
        if rest.is_empty() {
            // The last literal must end the name.
            return name.ends_with(part) && {
                out.push(&name[..name.len() - part.len()]);
                true
            };
        }
        let mut from = 0;
        while let Some(i) = name[from..].find(part) {
            let at = from + i;
            out.push(&name[..at]);
            if go(rest, &name[at + part.len()..], out) {
                return true;
            }
            out.pop();
            from = at + name[at..].chars().next().map_or(1, char::len_utf8);
        }
        false
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = parts.split_first()?;
    let tail = name.strip_prefix(first)?;
    let mut out = Vec::new();
    go(rest, tail, &mut out).then_some(out)
}

/// `path` without its first `cut` characters of dotted name (`rest` is what remains of the name): whole
/// steps dropped, and the start of a key when the cut falls inside one. A cut inside an index, or a path
/// whose dotted name is not the entry's name, gives the flat path `[rest]`.
fn strip_path(path: &[PathItem], cut: usize, rest: &str) -> Vec<PathItem> {
    let mut consumed = 0usize;
    for (i, step) in path.iter().enumerate() {
        let text = step.to_string();
        let end = consumed + text.len();
        if cut < end {
            let inner = cut - consumed;
            return match step {
                PathItem::Key(k) if inner > 0 => {
                    let mut out = vec![PathItem::Key(k[inner..].to_owned())];
                    out.extend_from_slice(&path[i + 1..]);
                    if join_path(&out) == rest { out } else { vec![PathItem::Key(rest.to_owned())] }
                }
                _ if inner == 0 => {
                    let out = path[i..].to_vec();
                    if join_path(&out) == rest && matches!(out.first(), Some(PathItem::Key(_))) {
                        out
                    } else {
                        vec![PathItem::Key(rest.to_owned())]
                    }
                }
                _ => vec![PathItem::Key(rest.to_owned())],
            };
        }
        // The separator after this step.
        consumed = end + 1;
        if cut < consumed {
            let out = path[i + 1..].to_vec();
            return if join_path(&out) == rest && matches!(out.first(), Some(PathItem::Key(_))) {
                out
            } else {
                vec![PathItem::Key(rest.to_owned())]
            };
        }
    }
    vec![PathItem::Key(rest.to_owned())]
}

/// Whether `name` matches the glob `pattern`, as Python's `fnmatch.fnmatchcase`: `*` any run of characters
/// (dots included), `?` one character, `[abc]` / `[a-z]` one of a set, `[!abc]` one not in it.
///
/// ```
/// use ckpt::select::glob_match;
/// assert!(glob_match("model.*.weight", "model.layers.0.weight"));
/// assert!(glob_match("layer.[0-3].*", "layer.2.bias") && !glob_match("layer.[!0-3].*", "layer.2.bias"));
/// assert!(!glob_match("model.*", "optimizer.state"));
/// ```
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matching with backtracking to the last `*`.
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => class(&p, pi, n[ni]),
            Some(&c) if c == n[ni] => Some(pi + 1),
            _ => None,
        };
        match step {
            Some(next) => {
                pi = next;
                ni += 1;
            }
            None => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// A `[...]` class at `p[at]` against `c`: the index after the class when `c` is in it, `None` when not.
/// An unclosed `[` is a literal `[`.
fn class(p: &[char], at: usize, c: char) -> Option<usize> {
    let mut i = at + 1;
    let negate = matches!(p.get(i), Some('!'));
    if negate {
        i += 1;
    }
    let start = i;
    let mut hit = false;
    while let Some(&x) = p.get(i) {
        if x == ']' && i > start {
            return (hit != negate).then_some(i + 1);
        }
        if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&y| y != ']') {
            let y = p[i + 2];
            hit |= x <= c && c <= y;
            i += 3;
        } else {
            hit |= x == c;
            i += 1;
        }
    }
    // No closing bracket: a literal `[`.
    (c == '[').then_some(at + 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn keys(parts: &[&str]) -> Vec<PathItem> {
        parts.iter().map(|k| PathItem::Key((*k).to_owned())).collect()
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("*.weight", "a.b.weight"));
        assert!(glob_match("?", "x") && !glob_match("?", "xy"));
        assert!(glob_match("[ab]x", "bx") && !glob_match("[ab]x", "cx"));
        assert!(glob_match("[", "[") && glob_match("a[", "a["));
        assert!(glob_match("[]]", "]"));
    }

    #[test]
    fn strip_whole_steps_and_partial_keys() {
        let s = Selection::default().with_strip_prefix("state_dict.model.");
        // Lightning: state_dict is a flat dict whose keys hold dots.
        let p = [PathItem::Key("state_dict".into()), PathItem::Key("model.layer.weight".into())];
        assert_eq!(
            s.rename("state_dict.model.layer.weight", &p).unwrap(),
            ("layer.weight".into(), keys(&["layer.weight"]))
        );
        // Nested dicts.
        let p = keys(&["state_dict", "model", "layer", "weight"]);
        assert_eq!(s.rename("state_dict.model.layer.weight", &p).unwrap().1, keys(&["layer", "weight"]));
        // Without the dot; names without the prefix are left alone.
        let s = Selection::default().with_strip_prefix("module");
        assert_eq!(s.rename("module.fc.w", &keys(&["module", "fc", "w"])).unwrap().0, "fc.w");
        assert_eq!(s.rename("head.w", &keys(&["head", "w"])).unwrap().0, "head.w");
        assert!(s.rename("module", &keys(&["module"])).is_none());
        // A cut inside an index: the flat name.
        let s = Selection::default().with_strip_prefix("layers.1");
        let p = [PathItem::Key("layers".into()), PathItem::Index(10), PathItem::Key("w".into())];
        assert_eq!(s.rename("layers.10.w", &p).unwrap().1, keys(&["0.w"]));
        // Stripping down to an index: the flat name (a path must start with a key).
        let s = Selection::default().with_strip_prefix("layers.");
        assert_eq!(s.rename("layers.10.w", &p).unwrap().1, keys(&["10.w"]));
    }

    #[test]
    fn add_prefix_goes_to_the_first_key() {
        let s = Selection::default().with_add_prefix("model.");
        assert_eq!(s.rename("a.b", &keys(&["a", "b"])).unwrap(), ("model.a.b".into(), keys(&["model.a", "b"])));
        assert!(Selection::default().with_dtype(DType::I8).validate().is_err());
        assert!(Selection::default().is_identity() && !s.is_identity() && s.renames());
    }
}
