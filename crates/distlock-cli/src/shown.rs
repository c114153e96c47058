//! Text from a server or a user, made safe to print: what anyone who can write a lock's owner
//! data or name a lock could otherwise do to the reader's terminal (rename its window with an
//! OSC sequence, clear it, print fake rows with a newline, reorder a line with a bidi override).
//!
//! One rule for every human format (tables, `top`, `-b`, `leader`, every message on stderr):
//! a backslash is `\\`; `\n`, `\r` and `\t` are themselves; any other C0 control and DEL is
//! `\xNN`; C1 controls (U+0080–U+009F) and the bidi controls (U+061C, U+200E, U+200F,
//! U+202A–U+202E, U+2066–U+2069) are `\u{NNNN}`. Everything else is printed as it is. JSON output
//! keeps serde's escapes and adds `\u` escapes for DEL, C1 and the bidi controls ([`json`]).
//! Lists of names in one value (`DISTLOCK_KEY`, the textfile's `lock` label) join them with `,`
//! after writing `\` as `\\` and `,` as `\,` in each ([`list`]).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` would act on a terminal (or reorder its line) rather than be shown.
fn acts(c: char) -> bool {
    matches!(c, '\0'..='\x1f' | '\x7f'..='\u{9f}' | '\u{61c}' | '\u{200e}' | '\u{200f}')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character escaped, and `\` as `\\`.
///
/// ```text
/// "a\x1b]2;pwned\x07b"  ->  a\x1b]2;pwned\x07b   (as printable characters)
/// ```
pub fn text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || acts(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && acts(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if acts(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// JSON text (serde's, which escapes C0 controls, `"` and `\`) with DEL, C1 and the bidi
/// controls written as `\uNNNN` too: the same value, nothing a terminal acts on. Such characters
/// can only stand inside strings of valid JSON, where the escape means the same.
pub fn json(json: String) -> String {
    if !json.chars().any(acts) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if acts(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// Several names in one value: each with `\` written `\\` and `,` written `\,`, joined by `,`
/// (so a `,` not after a `\` always separates two names).
pub fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let escaped: Vec<String> = names.into_iter().map(|n| n.replace('\\', "\\\\").replace(',', "\\,")).collect();
    escaped.join(",")
}

/// `eprintln!` with the message escaped by [`text`]: for every message printed on stderr, which
/// may quote a lock's name, a server's error or owner data.
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::shown::text(&format!($($arg)*)))
    };
}
pub(crate) use say;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_the_rest_is_kept() {
        assert_eq!(text("orders"), "orders");
        assert_eq!(text("a\x1b]2;pwned\x07b"), "a\\x1b]2;pwned\\x07b");
        assert_eq!(text("x\x1b[2J\ny"), "x\\x1b[2J\\ny");
        assert_eq!(text("\u{9b}31m \u{202e}cba \u{2066}"), "\\u{9b}31m \\u{202e}cba \\u{2066}");
        assert_eq!(text("a\\x1b"), "a\\\\x1b", "a backslash is escaped, so escapes are unambiguous");
        assert_eq!(text("\x7f\t\r"), "\\x7f\\t\\r");
        assert_eq!(text("größe ✓ 注文"), "größe ✓ 注文");
    }

    #[test]
    fn json_gets_escapes_for_what_serde_leaves() {
        let raw = serde_json::to_string(&"a\u{9b}b\u{202e}c\x1bd\x7f").unwrap();
        let safe = json(raw);
        assert!(!safe.chars().any(acts), "{safe}");
        assert_eq!(serde_json::from_str::<String>(&safe).unwrap(), "a\u{9b}b\u{202e}c\x1bd\x7f");
    }

    #[test]
    fn a_list_of_names_splits_back_into_the_same_names() {
        let names = ["a,b", "c\\", "d", ""];
        let joined = list(names);
        assert_eq!(joined, "a\\,b,c\\\\,d,");
        let mut split = vec![String::new()];
        let mut chars = joined.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => split.last_mut().unwrap().push(chars.next().unwrap()),
                ',' => split.push(String::new()),
                c => split.last_mut().unwrap().push(c),
            }
        }
        assert_eq!(split, names);
    }
}
