//! Scheduled jobs on etcd ([`crate::schedule`]). ShedLock has no etcd provider, so the layout
//! is distlock's own: one key `distlock/jobs/<job>`, under no lease, whose value is JSON
//! `{"lock": {"lock_until_ms": .., "locked_at_ms": .., "locked_by": ".."} | null, "run": <the
//! record> | null}`: ShedLock's lock row and distlock's record of the last run together. Both
//! versions a read reports are the key's mod revision (none while the key is missing), and a
//! write is one transaction `If ModRevision(key) == seen` (`CreateRevision(key) == 0` for a
//! missing key) `Then Put(key, both)`: a failed compare writes nothing.
//!
//! etcd reports no wall-clock time over gRPC, so the server's time is the `Date` header of the
//! answer to an HTTP/1.1 `GET /version`, which etcd serves on its client port: asked of the
//! URL's first endpoint (the next ones only when it does not answer) before the key is read.
//! The header has whole seconds, so the time read is the `Date`'s second: never later than the
//! server's time when a following write is applied, and up to a second earlier than the read's
//! send (`now_error_ms`, which the bounds allow for). Over TLS (`etcds://`) the request goes
//! over TLS as well, with the URL's CA and client certificate.

use super::Client;
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::Run;
use crate::{Error, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

/// How much earlier than a read's send its server time may be: the `Date` has whole seconds.
const DATE_ERROR_MS: i64 = 1000;

/// The most header bytes read from the HTTP answer.
const MAX_HEAD: usize = 16 * 1024;

/// The job store of an etcd client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
}

/// The value of a job's key.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Stored {
    /// ShedLock's lock row.
    lock: Option<JobLock>,
    /// The record of the last run.
    run: Option<Run>,
}

/// A job's key.
fn key(job: &str) -> String {
    format!("distlock/jobs/{job}")
}

/// A job key's value, or the error naming the key.
fn parse(job: &str, op: &'static str, value: &[u8]) -> Result<Stored> {
    serde_json::from_slice(value).map_err(|e| Error::Backend {
        op,
        path: key(job),
        source: format!("the key holds a value that is not distlock's job JSON: {e}").into(),
    })
}

/// The mod revision a read reported for a job (`None`: the key was missing), and the lock row
/// it read (`Seen.run` keeps the revision, `Seen.lock` the lock row as JSON).
fn seen_of(job: &str, seen: &Seen) -> Result<(Option<i64>, Option<JobLock>)> {
    let bad = |why: String| Error::Backend { op: "write job", path: key(job), source: why.into() };
    let revision = match &seen.run {
        None => None,
        Some(rev) => Some(rev.parse().map_err(|_| bad(format!("version {rev:?} is not a mod revision")))?),
    };
    let lock = match &seen.lock {
        None => None,
        Some(json) => {
            Some(serde_json::from_str(json).map_err(|e| bad(format!("{json:?} is not a lock row read: {e}")))?)
        }
    };
    Ok((revision, lock))
}

impl Jobs {
    /// The server's time, in milliseconds since the Unix epoch: the `Date` of an etcd member's
    /// HTTP answer (the first endpoint's, or the next one's when it does not answer).
    async fn server_ms(&self) -> Result<i64> {
        let url = self.client.url();
        let (mut failures, mut unanswered) = (Vec::new(), true);
        let tls = match url.tls {
            true => {
                let pem = url.tls_files.read()?;
                let config = crate::tls::client_config(&pem, crate::tls::Verify::Full)?;
                Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)))
            }
            false => None,
        };
        for endpoint in &url.endpoints {
            let host = endpoint.split_once("://").map_or(endpoint.as_str(), |(_, rest)| rest);
            let host = host.trim_end_matches('/');
            match tokio::time::timeout(url.timeout, date_of(host, tls.as_ref())).await {
                Ok(Ok(ms)) => return Ok(ms),
                Ok(Err(DateFailure::Io(why))) => failures.push(format!("{endpoint}/version: {why}")),
                Ok(Err(DateFailure::Other(why))) => {
                    unanswered = false;
                    failures.push(format!("{endpoint}/version: {why}"));
                }
                Err(_) => failures.push(format!("{endpoint}/version: no answer within {:?}", url.timeout)),
            }
        }
        let op = "server time (HTTP Date)";
        if failures.is_empty() {
            return Err(Error::Backend { op, path: url.to_string(), source: "the URL has no endpoint".into() });
        }
        // Every endpoint's connection failed: the outcome of a retry may differ.
        Err(match unanswered {
            true => Error::unanswered(op, &url.to_string(), failures.join("; ")),
            false => Error::Backend { op, path: url.to_string(), source: failures.join("; ").into() },
        })
    }
}

/// The `Date` of the answer to `GET /version` from `host` (`host:port`), over TLS with `tls`, in
/// milliseconds since the Unix epoch; else why not.
/// A failure of the connection (`Io`: worth another try) or of anything else.
async fn date_of(host: &str, tls: Option<&tokio_rustls::TlsConnector>) -> std::result::Result<i64, DateFailure> {
    let io = DateFailure::Io;
    let other = DateFailure::Other;
    let stream = TcpStream::connect(host).await.map_err(|e| io(format!("cannot connect: {e}")))?;
    let head = match tls {
        None => ask_version(stream, host).await,
        Some(tls) => {
            let name = host.rsplit_once(':').map_or(host, |(h, _)| h).trim_matches(['[', ']']);
            let name = rustls::pki_types::ServerName::try_from(name.to_string())
                .map_err(|e| other(format!("{name:?} is not a host name: {e}")))?;
            // A connection cut during the handshake is the connection's failure; any other is TLS's.
            let stream = tls.connect(name, stream).await.map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof => io(format!("TLS: {e}")),
                _ => other(crate::tls::explain(format!("TLS: {e}"), true, "")),
            })?;
            ask_version(stream, host).await
        }
    }
    .map_err(io)?;
    date_in(&head).map_err(other)
}

/// Why the server's time could not be read.
enum DateFailure {
    /// The connection failed or dropped.
    Io(String),
    /// Anything else (TLS, an answer that is not HTTP or has no `Date`).
    Other(String),
}

/// Sends `GET /version` and reads the answer's status line and headers (up to the blank line,
/// or the end).
async fn ask_version<S>(mut stream: S, host: &str) -> std::result::Result<String, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(|e| format!("sending the request: {e}"))?;
    stream.flush().await.map_err(|e| format!("sending the request: {e}"))?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            break;
        }
        if head.len() > MAX_HEAD {
            return Err(format!("reading the answer: headers longer than {MAX_HEAD} bytes"));
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The `Date` header of an HTTP answer's head, in milliseconds since the Unix epoch.
fn date_in(head: &str) -> std::result::Result<i64, String> {
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    if !status.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x answer: {:?}", status.chars().take(80).collect::<String>()));
    }
    let date = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("date"))
        .map(|(_, value)| value.trim())
        .ok_or_else(|| format!("the answer ({status}) has no Date header"))?;
    http_date_ms(date).ok_or_else(|| format!("Date {date:?} is not an HTTP date (IMF-fixdate)"))
}

/// An HTTP date in IMF-fixdate form (`Thu, 26 Nov 2026 18:21:31 GMT`, what etcd's Go server
/// sends) as milliseconds since the Unix epoch; `None` if it is not one.
fn http_date_ms(text: &str) -> Option<i64> {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let parts: Vec<&str> = text.split_ascii_whitespace().collect();
    let [weekday, day, month, year, time, "GMT"] = parts.as_slice() else { return None };
    if !DAYS.contains(&weekday.strip_suffix(',')?) {
        return None;
    }
    let number = |s: &str, digits: usize| -> Option<i64> {
        (s.len() == digits && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
    };
    let year = number(year, 4)?;
    let month = MONTHS.iter().position(|m| m == month)? as i64 + 1;
    let day = number(day, 2)?;
    if !(1..=days_in_month(year, month)).contains(&day) {
        return None;
    }
    let hms: Vec<&str> = time.split(':').collect();
    let [h, m, s] = hms.as_slice() else { return None };
    let (h, m, s) = (number(h, 2)?, number(m, 2)?, number(s, 2)?);
    // 60 is a leap second (IMF-fixdate allows it): read as the next second's start.
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s;
    Some(seconds * 1000)
}

/// The days in month `m` (1 to 12) of year `y` of the proleptic Gregorian calendar.
fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 of date `y-m-d` (month 1 to 12) of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = (m + 9) % 12; // March is 0
    let doy = (153 * mp + 2) / 5 + d - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

impl JobStore for Jobs {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            // The time first: a Date is never later than the server's time at a following write.
            let now_ms = self.server_ms().await?;
            let key = key(job);
            let etcd = self.client.etcd();
            let resp = self
                .client
                .call("read job", &key, |_| {
                    let (mut etcd, key) = (etcd.clone(), key.clone());
                    async move { etcd.get(key, None).await }
                })
                .await?;
            let Some(kv) = resp.kvs().first() else {
                return Ok(JobRead {
                    now_ms,
                    now_error_ms: DATE_ERROR_MS,
                    lock: None,
                    run: None,
                    seen: Seen::default(),
                });
            };
            let stored = parse(job, "read job", kv.value())?;
            // The lock row goes into `Seen` too: a write that leaves it as it is puts it back.
            let lock_seen = stored.lock.as_ref().map(|l| serde_json::to_string(l).expect("a lock row serializes"));
            Ok(JobRead {
                now_ms,
                now_error_ms: DATE_ERROR_MS,
                lock: stored.lock,
                run: stored.run,
                seen: Seen { lock: lock_seen, run: Some(kv.mod_revision().to_string()) },
            })
        })
    }

    fn write<'a>(
        &'a self,
        job: &'a str,
        seen: &'a Seen,
        lock: Option<&'a JobLock>,
        run: &'a Run,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let (revision, lock_read) = seen_of(job, seen)?;
            let key = key(job);
            let etcd = self.client.etcd();
            // The transaction's compare makes sure the lock row read is still the one there.
            let lock = lock.cloned().or(lock_read);
            let value = serde_json::to_vec(&Stored { lock, run: Some(run.clone()) }).expect("a job's value serializes");
            let compare = match revision {
                Some(rev) => Compare::mod_revision(key.clone(), CompareOp::Equal, rev),
                None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            };
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(key.clone(), value, None)]);
            // Safe to send again: once a send is applied, the compare fails every later one.
            let resp = self
                .client
                .call("write job", &key, |_| {
                    let (mut etcd, txn) = (etcd.clone(), txn.clone());
                    async move { etcd.txn(txn).await }
                })
                .await?;
            Ok(resp.succeeded())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn days_from_civil_matches_humantime() {
        // Every day from 1970 to 2200, against humantime's formatting.
        for n in 0..84_000i64 {
            let t = UNIX_EPOCH + Duration::from_secs(n as u64 * 86_400);
            let text = humantime::format_rfc3339(t).to_string();
            let (y, m, d) = (&text[0..4], &text[5..7], &text[8..10]);
            let (y, m, d) = (y.parse().unwrap(), m.parse().unwrap(), d.parse().unwrap());
            assert_eq!(days_from_civil(y, m, d), n, "{text}");
            assert!(d <= days_in_month(y, m), "{text}");
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(days_in_month(2100, 2), 28);
        assert_eq!(days_in_month(2024, 2), 29);
    }

    #[test]
    fn http_dates() {
        let ms = |s: &str| humantime::parse_rfc3339(s).map(crate::schedule::epoch_ms).unwrap();
        assert_eq!(http_date_ms("Thu, 26 Nov 2026 18:21:31 GMT"), Some(ms("2026-11-26T18:21:31Z")));
        assert_eq!(http_date_ms("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(http_date_ms("Tue, 29 Feb 2028 23:59:59 GMT"), Some(ms("2028-02-29T23:59:59Z")));
        assert_eq!(http_date_ms("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777_000));
        for bad in [
            "",
            "Thu, 26 Nov 2026 18:21:31",
            "Thu, 26 Nov 2026 18:21:31 UTC",
            "Thu 26 Nov 2026 18:21:31 GMT",
            "Xyz, 26 Nov 2026 18:21:31 GMT",
            "Thu, 26 Foo 2026 18:21:31 GMT",
            "Thu, 31 Nov 2026 18:21:31 GMT",
            "Thu, 29 Feb 2027 18:21:31 GMT",
            "Thu, 00 Nov 2026 18:21:31 GMT",
            "Thu, 6 Nov 2026 18:21:31 GMT",
            "Thu, 26 Nov 26 18:21:31 GMT",
            "Thu, 26 Nov 2026 24:00:00 GMT",
            "Thu, 26 Nov 2026 18:60:00 GMT",
            "Thu, 26 Nov 2026 18:21:61 GMT",
            "Thu, 26 Nov 2026 18:21 GMT",
            "Thu, 26 Nov 2026 +8:21:31 GMT",
            "Thursday, 26-Nov-26 18:21:31 GMT",
            "Thu Nov 26 18:21:31 2026",
        ] {
            assert_eq!(http_date_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn date_headers() {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ndate:  Thu, 26 Nov 2026 18:21:31 GMT\r\n";
        assert_eq!(date_in(head), http_date_ms("Thu, 26 Nov 2026 18:21:31 GMT").ok_or_else(String::new));
        assert!(date_in("HTTP/1.1 200 OK\r\nServer: x").unwrap_err().contains("no Date"));
        assert!(date_in("\u{0}\u{0}\u{4}").unwrap_err().contains("not an HTTP"));
        assert!(date_in("HTTP/1.1 200 OK\r\nDate: soon").unwrap_err().contains("soon"));
    }

    #[test]
    fn values_and_versions() {
        let stored = parse("j", "read job", br#"{"lock":null,"run":null}"#).unwrap();
        assert!(stored.lock.is_none() && stored.run.is_none());
        let stored = parse("j", "read job", br#"{"lock":{"lock_until_ms":2,"locked_at_ms":1,"locked_by":"h"}}"#);
        assert_eq!(stored.unwrap().lock.map(|l| l.locked_by), Some("h".to_string()));
        assert!(parse("j", "read job", b"lock").unwrap_err().to_string().contains("distlock/jobs/j"));
        assert!(parse("j", "read job", br#"{"lock":{"lock_until_ms":"x"}}"#).is_err());
        let seen = |l: Option<&str>, r: Option<&str>| Seen { lock: l.map(Into::into), run: r.map(Into::into) };
        assert_eq!(seen_of("j", &seen(None, None)).unwrap(), (None, None));
        let row = r#"{"lock_until_ms":2,"locked_at_ms":1,"locked_by":"h"}"#;
        let (rev, lock) = seen_of("j", &seen(Some(row), Some("7"))).unwrap();
        assert_eq!((rev, lock.map(|l| (l.lock_until_ms, l.locked_by))), (Some(7), Some((2, "h".to_string()))));
        assert!(seen_of("j", &seen(Some("7"), Some("8"))).is_err(), "a lock row that is not one");
        assert!(seen_of("j", &seen(None, Some("x"))).is_err(), "a revision that is not one");
    }
}
