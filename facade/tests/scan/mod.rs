//! What the source-scanning tests share (`layers.rs`, `format_names.rs`): a file's code without its comments
//! and strings.

/// The code of `text` without comments (doc comments included, which may link anywhere) and string literals.
pub fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().collect();
        let (mut in_str, mut prev) = (false, ' ');
        for (i, &c) in chars.iter().enumerate() {
            if !in_str && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = c;
        }
        out.push('\n');
    }
    out
}
