//! No password in any error: every URL shape a user may get wrong (no `://`, a keyword string,
//! percent-encoded userinfo, `?`/`#`/`/` in a password, password-like query keys) on every
//! scheme, an unknown one and none, connected to a closed port. The marker password must not be
//! in the error's Display or Debug, nor in a client's Debug where the URL connects.

use distlock::ConnectOptions;
use std::time::Duration;

const MARK: &str = "S3cr3tMarker";

/// Every scheme of the registry, an unknown one and none.
fn schemes() -> Vec<&'static str> {
    distlock::schemes().map(|(scheme, _)| scheme).chain(["bogus", ""]).collect()
}

/// The URL shapes, with `S` for the scheme and `M` for the marker password.
const SHAPES: &[&str] = &[
    "S://user:M@127.0.0.1:1/db",
    "S://:M@127.0.0.1:1",
    "S//user:M@127.0.0.1:1/db",
    "S:/user:M@127.0.0.1:1/db",
    "S:user:M@127.0.0.1:1/db",
    "S:///user:M@127.0.0.1:1/db",
    "S://user%3aM@127.0.0.1:1/db",
    "S://user%3AM@127.0.0.1:1/db",
    "S://user%3aM%40127.0.0.1:1/db",
    "S://user:M%zz@127.0.0.1:1/db",
    "S://user:M@127.0.0.1:notaport/db",
    "S://user:M@/db",
    "S://user:M@@127.0.0.1:1/db",
    "S://user:M@127.0.0.1:1,user:M@127.0.0.1:2/db",
    "S://user:M@[::1:1/db",
    "S://us er:M@127.0.0.1:1/db",
    "S://user:M/x@127.0.0.1:1/db",
    "S://user:M?x@127.0.0.1:1/db",
    "S://user:M#x@127.0.0.1:1/db",
    "S://user:M@127.0.0.1:1/db#frag",
    "S://user:M@127.0.0.1:1/db?bogus_key=1",
    "S://user:M@127.0.0.1:1/db?lease=bogus",
    "S://user:M@127.0.0.1:1/db?sslmode=bogus",
    "S://127.0.0.1:1/db?password=M&lease=5s",
    "S://127.0.0.1:1/db?PASSWORD=M",
    "S://127.0.0.1:1/db?Pwd=M",
    "S://127.0.0.1:1/db?pass=M",
    "S://127.0.0.1:1/db?sentinel_password=M",
    "S://127.0.0.1:1/db?user=u&password=M",
    "S://127.0.0.1:1/db?password=M?x",
    "S://127.0.0.1:1/db?x=1&&password=M&",
    "S host=127.0.0.1 port=1 user=app password=M dbname=x",
    "S host=127.0.0.1 user=app password = 'M' dbname=x",
    "S://host=127.0.0.1 PASSWORD=M",
];

/// Every shape on every scheme, and the keyword strings without a scheme.
fn urls() -> Vec<String> {
    let mut urls = Vec::new();
    for scheme in schemes() {
        for shape in SHAPES {
            let url = match scheme {
                "" => shape.trim_start_matches("S://").trim_start_matches("S ").trim_start_matches('S').to_string(),
                s => shape.replacen('S', s, 1),
            };
            urls.push(url.replace('M', MARK));
        }
    }
    urls.push(format!("host=127.0.0.1 port=1 user=app password={MARK} dbname=x"));
    urls.push(format!("user=app PassWord={MARK}"));
    urls
}

async fn attempt(url: String) -> Option<String> {
    let options = ConnectOptions::new().connect_timeout(Duration::from_millis(500)).setup(false);
    let shown = match tokio::time::timeout(Duration::from_secs(20), distlock::connect_with(&url, &options)).await {
        Err(_) => return Some(format!("{}: no answer within 20 s", distlock::redact_url(&url))),
        Ok(Ok(client)) => format!("{client:?}"),
        Ok(Err(e)) => format!("{e}\n{e:?}"),
    };
    let redacted = distlock::redact_url(&url);
    (shown.contains(MARK) || redacted.contains(MARK)).then(|| format!("{redacted}\n  -> {shown}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_url_shape_shows_its_password() {
    let urls = urls();
    let total = urls.len();
    let leaks: Vec<String> =
        futures::future::join_all(urls.into_iter().map(attempt)).await.into_iter().flatten().collect();
    assert!(leaks.is_empty(), "{} of {total} URLs showed the password:\n{}", leaks.len(), leaks.join("\n"));
}
