//! Secrets kept out of every message: what in a backend URL may be a password, found the same
//! way however malformed the URL is, and hidden as `***` in the URL shown and in any error text.
//!
//! A secret is (1) the value of a key that names a password (`password`, `pass`, `pwd`,
//! `passwd`, `sentinel_password`, any case, any key holding `pass`, `pwd` or `secret`) in a query
//! or a libpq keyword string (`host=h password='x y'`); (2) what stands between the first `:` of
//! the user part and its `@` (with `://` or without: `postgres//u:PW@h`, `u:PW@h`), or the whole
//! user part when it holds a `%` escape (`user%3aPW@h`); (3) a host part holding an escaped `:`
//! or `@` (`user%3aPW%40h`). Each is also hidden in its `%`-decoded form. When in doubt, more is
//! hidden.

use std::ops::Range;

/// `url` with every secret replaced by `***` (see the module's rules): the user part's password
/// (`postgres://app:***@db/x`), password-like keys, and a user part written with `%` escapes.
/// A URL with no secret comes back as given.
///
/// # Examples
///
/// ```
/// assert_eq!(distlock::redact_url("redis://:pw@h:6379"), "redis://:***@h:6379");
/// assert_eq!(distlock::redact_url("postgres://u:pw@db/x?lease=5s"), "postgres://u:***@db/x?lease=5s");
/// assert_eq!(distlock::redact_url("mysql://u@h/db?x=a@b"), "mysql://u@h/db?x=a@b");
/// assert_eq!(distlock::redact_url("redis://:pa/ss@h"), "redis://:***@h");
/// assert_eq!(distlock::redact_url("sqlite:///tmp/a@b/l.db"), "sqlite:///tmp/a@b/l.db");
/// // A query key that names a password (the Sentinels' own) is hidden too.
/// assert_eq!(
///     distlock::redact_url("redis+sentinel://s:26379/m?sentinel_password=pw&lease=5s"),
///     "redis+sentinel://s:26379/m?sentinel_password=***&lease=5s"
/// );
/// // However malformed: no `://`, a keyword string, an escaped `:` in the user part.
/// assert_eq!(distlock::redact_url("postgres//app:pw@h/db"), "postgres//app:***@h/db");
/// assert_eq!(distlock::redact_url("host=h user=app PASSWORD='p w' dbname=x"), "host=h user=app PASSWORD=*** dbname=x");
/// assert_eq!(distlock::redact_url("redis://user%3apw@h"), "redis://***@h");
/// ```
pub fn redact_url(url: &str) -> String {
    let mut spans = secret_spans(url);
    spans.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(url.len());
    let mut at = 0;
    for span in spans {
        if span.start < at {
            at = at.max(span.end);
            continue;
        }
        out.push_str(&url[at..span.start]);
        out.push_str("***");
        at = span.end;
    }
    out.push_str(&url[at..]);
    // A secret found by one rule may also stand where no rule looks (`u:PW@x://…`); one too
    // short to tell from the URL's own words is hidden where the rules found it only.
    let long: Vec<String> = secrets(url).into_iter().filter(|s| s.chars().count() >= 4).collect();
    hide_all(&out, &long)
}

/// `text` with every occurrence of each of `url`'s secrets (also `%`-decoded) replaced by `***`:
/// for an error's text, which may quote any part of the URL.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    hide_all(text, &secrets(url))
}

/// `error` with none of `url`'s secrets in its text: as it is when it holds none, else with its
/// text scrubbed (an error other than a URL's or a connection's becomes a connection error
/// carrying its scrubbed text).
pub(crate) fn scrub_error(error: crate::Error, url: &str) -> crate::Error {
    use crate::Error;
    let secrets = secrets(url);
    let shown = format!("{error} {error:?}");
    if !secrets.iter().any(|s| shown.contains(s.as_str())) {
        return error;
    }
    let hide = |t: &str| hide_all(t, &secrets);
    match error {
        Error::InvalidUrl { url, reason } => Error::InvalidUrl { url: hide(&url), reason: hide(&reason) },
        Error::Connect { url, reason } => Error::Connect { url: hide(&url), reason: hide(&reason) },
        Error::NotSetUp { url, what } => Error::NotSetUp { url: hide(&url), what: hide(&what) },
        other => Error::Connect { url: redact_url(url), reason: hide(&other.to_string()) },
    }
}

fn hide_all(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    out
}

/// Every secret of `url` as text, as written and `%`-decoded, longest first.
fn secrets(url: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for span in secret_spans(url) {
        let text = &url[span];
        out.push(text.to_string());
        let decoded = lossy_decode(text);
        // A decoded user part: its password too (after the first `:`, before a last `@`).
        if let Some((_, rest)) = decoded.split_once(':') {
            out.push(rest.rsplit_once('@').map_or(rest, |(p, _)| p).to_string());
        }
        out.push(decoded);
    }
    // A parser may cut a secret where a URL's parts end: each piece is hidden too.
    let pieces: Vec<String> =
        out.iter().flat_map(|s| s.split(['/', '?', '#', '@', '&', '\'', '"'])).map(str::to_string).collect();
    out.extend(pieces);
    out.retain(|s| !s.is_empty() && s != "***");
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// Where `url`'s secrets are written, by the module's rules.
fn secret_spans(url: &str) -> Vec<Range<usize>> {
    let mut spans = keyed_values(url);
    let after_scheme = url.find("://").map(|i| i + 3);
    // The user part follows `://`; with no `@` after it (or no `://`), it starts the text.
    let start = after_scheme.filter(|s| url[*s..].contains('@')).unwrap_or(0);
    let user = user_part_secret(url, start);
    match user {
        Some(span) => spans.push(span),
        None => spans.extend(escaped_host(url, after_scheme.unwrap_or(0))),
    }
    spans
}

/// The secret of the user part that starts at `start`: after its first `:` up to its `@`, or the
/// whole user part if it holds a `%` escape. The user part ends at the last `@` before the query,
/// the query starting at the first `?` after the first `@` (a password may hold `?`, `#`, `/`).
fn user_part_secret(url: &str, start: usize) -> Option<Range<usize>> {
    let first_at = start + url[start..].find('@')?;
    let query = url[first_at..].find(['?', ' ']).map_or(url.len(), |i| first_at + i);
    let at = start + url[start..query].rfind('@')?;
    let user = &url[start..at];
    let user_start = start + user.rfind([' ', '\t']).map_or(0, |i| i + 1);
    let user = &url[user_start..at];
    if user.contains('%') {
        let slashes = user.len() - user.trim_start_matches('/').len();
        return Some(user_start + slashes..at);
    }
    let colon = user.find(':')?;
    (colon + 1 < user.len()).then(|| user_start + colon + 1..at)
}

/// A host part (from `start` to the first `/`, `?` or `#`) with an escaped `:` or `@` in it, as
/// `user%3aPW%40host` is: the whole of it.
fn escaped_host(url: &str, start: usize) -> Option<Range<usize>> {
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    let host = url[start..end].to_ascii_lowercase();
    (host.contains("%3a") || host.contains("%40")).then_some(start..end)
}

/// Whether `value` is an NKey seed (NATS's private keys: `S`, then base32 letters, 58 in all),
/// under any key: a seed pasted where a path belongs (`?nkey=SU…`) is hidden too.
pub(crate) fn looks_like_seed(value: &str) -> bool {
    value.len() >= 50
        && value.starts_with('S')
        && value.bytes().all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
}

/// Whether a key names a password.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["pass", "pwd", "secret"].iter().any(|k| key.contains(k))
}

/// The values of password-like keys: `key=value` with `&`, `?`, `;` or white space around it
/// (a query or a keyword string), `key = 'quoted value'` too.
fn keyed_values(url: &str) -> Vec<Range<usize>> {
    let bytes = url.as_bytes();
    let mut out = Vec::new();
    for (eq, _) in url.match_indices('=') {
        let key_end = url[..eq].trim_end().len();
        let key_start = url[..key_end].rfind(|c: char| !(c.is_ascii_alphanumeric() || "_-.".contains(c))).map_or(0, |i| i + 1);
        let start = eq + 1 + (url[eq + 1..].len() - url[eq + 1..].trim_start().len());
        let end = match bytes.get(start) {
            Some(q @ (b'\'' | b'"')) => url[start + 1..].find(*q as char).map_or(url.len(), |i| start + i + 2),
            _ => url[start..].find(['&', ' ', '\t', ';', '\n']).map_or(url.len(), |i| start + i),
        };
        if !is_secret_key(&url[key_start..key_end]) && !looks_like_seed(&url[start..end]) {
            continue;
        }
        if end > start {
            out.push(start..end);
        }
    }
    out
}

/// `%XX` escapes decoded where they are valid, the rest kept as written.
fn lossy_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%').then(|| text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()));
        match hex.flatten() {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_found_in_every_shape() {
        let cases = [
            ("postgres://u:pw@db/x", "postgres://u:***@db/x"),
            ("postgres:u:pw@db/x", "postgres:***@db/x"),
            ("u:pw@db", "u:***@db"),
            ("redis://u:p?w@h/0", "redis://u:***@h/0"),
            ("redis://u:pw@@h/0", "redis://u:***@h/0"),
            ("redis://u%3Apw%40h:1/0", "redis://***/0"),
            ("zk://h:1/x?Pwd=a&pass=b&lease=5s", "zk://h:1/x?Pwd=***&pass=***&lease=5s"),
            ("password = \"p w\" host=h", "password = *** host=h"),
            ("zk://u:pw@h:1/x?a=b@c", "zk://u:***@h:1/x?a=b@c"),
            ("etcd://h:1,h:2?lease=5s", "etcd://h:1,h:2?lease=5s"),
            (
                "nats://h:1?nkey=SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU&ttl=5s",
                "nats://h:1?nkey=***&ttl=5s",
            ),
            ("nats://h:1?nkey=/run/app.nk", "nats://h:1?nkey=/run/app.nk"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        assert_eq!(scrub("bad host \"u:pw\"", "x://u:pw@h"), "bad host \"u:***\"");
        assert_eq!(scrub("user \"u:pw\"", "x://u%3apw@h"), "user \"***\"");
    }
}
