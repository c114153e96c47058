//! `distlock top`: a live view of every lock under a prefix, on the terminal or as a web page.
//! Both draw from `Client::locks` (the listing `inspect --all` prints once).

use crate::{duration_arg, inspect, BackendArg};
use distlock::listing::{Listing, LockInfo};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Samples kept per lock for its sparkline: a minute at the default refresh.
const HISTORY: usize = 60;
/// Refreshes the ACQUIRED column shows, and `--sort acquired` counts.
const SHOWN: usize = 20;

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Refresh every DURATION (100ms to 1s).
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = refresh_arg)]
    interval: Duration,
    /// Sort locks by: name, waiters (most first), holders (most first), held (longest hold
    /// first) or acquired (most acquisitions over the last 20 refreshes, as the column shows,
    /// first). Keys: s cycles, r reverses, q quits.
    #[arg(long, value_enum, default_value = "name")]
    sort: SortKey,
    /// Batch mode, as top(1)'s -b: print the view as plain text every refresh, for a log or
    /// another program, with no terminal needed; until --iterations views, a signal, or a
    /// closed output.
    #[arg(short = 'b', long, conflicts_with = "http")]
    batch: bool,
    /// With --batch: stop after N views (as top(1)'s -n).
    #[arg(short = 'n', long, value_name = "N", requires = "batch", value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Serve the live view as a web page at ADDR instead of the terminal: IP:PORT, HOST:PORT or a
    /// bare PORT (loopback), as `serve --metrics` takes it (e.g. 9500 or 127.0.0.1:9500). It
    /// answers GET and HEAD only, to loopback Host names only (see --allow-remote).
    #[arg(long, value_name = "ADDR", value_parser = crate::serve::listen_arg)]
    http: Option<crate::serve::Listen>,
    /// With --http: write the address it listens on (port 0 picks a free one) to FILE.
    #[arg(long, value_name = "FILE", requires = "http")]
    http_addr_file: Option<std::path::PathBuf>,
    /// Let --http listen on an address other hosts can reach (the page has no authentication and
    /// shows every lock's holders), and answer requests for any Host name (without it: only
    /// localhost, 127.0.0.1, [::1] and the address it listens on, against DNS rebinding).
    #[arg(long, requires = "http")]
    allow_remote: bool,
    /// Also show scheduled job NAME (`exec --once-per`): its state now and its last run
    /// (repeat for several jobs).
    #[arg(long = "job", value_name = "NAME")]
    jobs: Vec<String>,
    /// The locks whose names start with PREFIX (all if left out); as `inspect --all` takes it.
    #[arg(value_name = "PREFIX")]
    prefix: Option<String>,
}

/// The `--job` lines: each job's state now and its last run, read again every refresh.
async fn job_lines(schedules: &[distlock::schedule::Schedule]) -> Vec<String> {
    let mut lines = Vec::new();
    for job in schedules {
        let read = async { Ok::<_, distlock::Error>((job.check().await?, job.last_run().await?)) };
        lines.push(match tokio::time::timeout(Duration::from_secs(5), read).await {
            Ok(Ok((Some(taken), _))) => format!("{taken}"),
            Ok(Ok((None, Some(run)))) => format!("{}: free to run; last: {run}", job.name()),
            Ok(Ok((None, None))) => format!("{}: free to run; no run recorded", job.name()),
            Ok(Err(e)) => format!("{}: {e}", job.name()),
            Err(_) => format!("{}: no answer within 5 s", job.name()),
        });
    }
    lines.into_iter().map(|l| crate::shown::text(&l).into_owned()).collect()
}

fn refresh_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(1) {
        return Err(format!("{s}: the refresh interval is from 100ms to 1s"));
    }
    Ok(d)
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Name,
    Waiters,
    Holders,
    Held,
    Acquired,
}

impl SortKey {
    const ALL: [SortKey; 5] = [SortKey::Name, SortKey::Waiters, SortKey::Holders, SortKey::Held, SortKey::Acquired];

    fn next(self) -> SortKey {
        let i = Self::ALL.iter().position(|k| *k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }

    fn label(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Waiters => "waiters",
            SortKey::Holders => "holders",
            SortKey::Held => "held",
            SortKey::Acquired => "acquired",
        }
    }
}

/// Acquisitions seen per refresh, per lock: a holder id not among the last refresh's holders is
/// one acquisition (the first refresh counts none: those holders took the lock before).
#[derive(Default)]
struct History {
    locks: HashMap<String, (HashSet<String>, VecDeque<u32>)>,
    primed: bool,
}

impl History {
    fn record(&mut self, listing: &Listing) {
        let mut now: HashMap<&str, HashSet<String>> = HashMap::new();
        for lock in &listing.locks {
            now.insert(&lock.name, lock.holders().map(|e| e.id.clone()).collect());
        }
        for (name, holders) in &now {
            if !self.locks.contains_key(*name) {
                let seen = if self.primed { HashSet::new() } else { holders.clone() };
                self.locks.insert(name.to_string(), (seen, VecDeque::new()));
            }
        }
        self.primed = true;
        self.locks.retain(|name, (seen, samples)| {
            let holders = now.get(name.as_str()).cloned().unwrap_or_default();
            let new = holders.difference(seen).count() as u32;
            samples.push_back(new);
            if samples.len() > HISTORY {
                samples.pop_front();
            }
            *seen = holders;
            !seen.is_empty() || samples.iter().any(|n| *n > 0)
        });
    }

    /// Acquisitions over the refreshes the sparkline shows.
    fn acquired(&self, name: &str) -> u32 {
        self.locks.get(name).map_or(0, |(_, s)| s.iter().rev().take(SHOWN).sum())
    }

    /// The last minute as a sparkline, oldest on the left.
    fn sparkline(&self, name: &str) -> String {
        const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        let Some((_, samples)) = self.locks.get(name) else { return String::new() };
        let max = samples.iter().copied().max().unwrap_or(0).max(1);
        let start = samples.len().saturating_sub(SHOWN);
        samples
            .iter()
            .skip(start)
            .map(|n| if *n == 0 { '·' } else { BARS[((*n * 8 - 1) / max).min(7) as usize] })
            .collect()
    }
}

/// Sorts the listing's locks by `key` (ties by name).
fn sort(listing: &mut Listing, key: SortKey, reverse: bool, history: &History) {
    let held = |l: &LockInfo| l.holders().filter_map(|e| e.since_ms).max().unwrap_or(0);
    listing.locks.sort_by(|a, b| {
        let order = match key {
            SortKey::Name => std::cmp::Ordering::Equal,
            SortKey::Waiters => b.waiters().count().cmp(&a.waiters().count()),
            SortKey::Holders => b.holders().count().cmp(&a.holders().count()),
            SortKey::Held => held(b).cmp(&held(a)),
            SortKey::Acquired => history.acquired(&b.name).cmp(&history.acquired(&a.name)),
        };
        order.then_with(|| a.name.cmp(&b.name))
    });
    if reverse {
        listing.locks.reverse();
    }
}

/// The screen (or page) text: a title line, the table with the sparkline column, the notes.
fn render(listing: &Listing, history: &History, title: &str, rows: usize, jobs: &[String]) -> String {
    let spark = |l: &LockInfo| history.sparkline(&l.name);
    let column: inspect::Column<'_> = ("ACQUIRED (last 20 refreshes)", &spark);
    let mut text = format!("{title}\n{}", inspect::table(listing, rows, Some(column)));
    if !jobs.is_empty() {
        text.push_str("\nJOBS\n");
        for line in jobs {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

pub async fn run(args: TopArgs) -> anyhow::Result<u8> {
    // Bound first: an address in use or not allowed is said before connecting.
    let listener = match &args.http {
        Some(listen) => {
            let listener = crate::serve::bind(listen).await.map_err(|e| anyhow::anyhow!("--http: {e}"))?;
            crate::only_loopback_unless_allowed("top --http", listener.local_addr()?, args.allow_remote)?;
            Some(listener)
        }
        None => None,
    };
    let client = args.backend.connect_to_look().await?;
    let prefix = args.prefix.clone().unwrap_or_default();
    // A backend that cannot list says so now, before the screen is taken.
    let first = client.locks(&prefix).await?;
    let schedules = args.jobs.iter().map(|j| client.schedule(j)).collect::<distlock::Result<Vec<_>>>()?;
    let url = distlock::redact_url(&args.backend.url()?);
    let code = match listener {
        Some(listener) => http(client.clone(), prefix, first, &schedules, &args, &url, listener).await,
        None if args.batch => batch(&client, prefix, first, &schedules, &args, &url).await,
        None => terminal(client.clone(), prefix, first, &schedules, &args, &url).await,
    };
    drop(schedules);
    client.close(Duration::from_secs(2)).await;
    code
}

/// One refresh: the new listing, recorded in `history`; or the error to show, the last listing
/// kept.
async fn refresh(
    client: &distlock::Client,
    prefix: &str,
    history: &mut History,
    listing: &mut Listing,
) -> Option<String> {
    match tokio::time::timeout(Duration::from_secs(5), client.locks(prefix)).await {
        Ok(Ok(l)) => {
            history.record(&l);
            *listing = l;
            None
        }
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 5 s".into()),
    }
}

/// The view's first line; `keys` adds the terminal's key help (not on a page or in batch output).
fn title(backend: &str, prefix: &str, key: SortKey, reverse: bool, keys: bool, error: Option<&str>) -> String {
    let time = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let mut t = format!(
        "distlock top: {}{} at {time}; sort {}{}{}",
        crate::shown::text(backend),
        if prefix.is_empty() { String::new() } else { format!(" under \"{}\"", crate::shown::text(prefix)) },
        key.label(),
        if reverse { ", reversed" } else { "" },
        if keys { " (s next, r reverse, q quit)" } else { "" }
    );
    if let Some(e) = error {
        t.push_str(&format!("\nlast refresh failed: {}", crate::shown::text(e)));
    }
    t
}

/// `--batch`: the view as plain text on stdout every refresh, a blank line between views.
async fn batch(
    client: &distlock::Client,
    prefix: String,
    first: Listing,
    schedules: &[distlock::schedule::Schedule],
    args: &TopArgs,
    url: &str,
) -> anyhow::Result<u8> {
    use std::io::Write;
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut hup, mut int) =
        (signal(SignalKind::terminate())?, signal(SignalKind::hangup())?, signal(SignalKind::interrupt())?);
    let mut history = History::default();
    history.record(&first);
    let (mut listing, mut error, mut shown) = (first, None::<String>, 0u64);
    let mut jobs = job_lines(schedules).await;
    loop {
        sort(&mut listing, args.sort, false, &history);
        let title = title(url, &prefix, args.sort, false, false, error.as_deref());
        let text = render(&listing, &history, &title, usize::MAX, &jobs);
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
            return Ok(0); // the reader went away (`| head`): done, as top -b is
        }
        drop(out);
        shown += 1;
        if args.iterations.is_some_and(|n| shown >= n) {
            return Ok(0);
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {
                error = refresh(client, &prefix, &mut history, &mut listing).await;
                jobs = job_lines(schedules).await;
            }
            _ = term.recv() => return Ok(0),
            _ = hup.recv() => return Ok(0),
            _ = int.recv() => return Ok(0),
        }
    }
}

async fn terminal(
    client: distlock::Client,
    prefix: String,
    first: Listing,
    schedules: &[distlock::schedule::Schedule],
    args: &TopArgs,
    url: &str,
) -> anyhow::Result<u8> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use ratatui::widgets::Paragraph;
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        anyhow::bail!("top needs a terminal (use `top --batch` for text views, `inspect --all` for one listing, or `top --http ADDR`)");
    }
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || loop {
        match event::poll(Duration::from_millis(100)) {
            Ok(true) => match event::read() {
                Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                    if keys_tx.blocking_send(k).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            },
            Ok(false) if keys_tx.is_closed() => return,
            Ok(false) => {}
            Err(_) => return,
        }
    });
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut hup, mut int) =
        (signal(SignalKind::terminate())?, signal(SignalKind::hangup())?, signal(SignalKind::interrupt())?);
    let mut terminal = ratatui::init();
    let (mut key, mut reverse, mut error) = (args.sort, false, None::<String>);
    let mut history = History::default();
    history.record(&first);
    let mut listing = first;
    let mut jobs = job_lines(schedules).await;
    let mut next = tokio::time::Instant::now() + args.interval;
    let result = loop {
        sort(&mut listing, key, reverse, &history);
        let drawn = terminal.draw(|frame| {
            let area = frame.area();
            let notes = listing.unseen.len() + usize::from(error.is_some()) + usize::from(listing.truncated);
            let job_rows = if jobs.is_empty() { 0 } else { jobs.len() + 1 };
            let rows = (area.height as usize).saturating_sub(4 + notes + job_rows);
            let text =
                render(&listing, &history, &title(url, &prefix, key, reverse, true, error.as_deref()), rows, &jobs);
            frame.render_widget(Paragraph::new(text), area);
        });
        if let Err(e) = drawn {
            break Err(e.into());
        }
        tokio::select! {
            k = keys.recv() => match k {
                None => break Ok(0),
                Some(k) => match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => break Ok(0),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => break Ok(0),
                    KeyCode::Char('s') => key = key.next(),
                    KeyCode::Char('r') => reverse = !reverse,
                    _ => {}
                },
            },
            // TERM, HUP and INT end the view like q, so the terminal is given back.
            _ = term.recv() => break Ok(0),
            _ = hup.recv() => break Ok(0),
            _ = int.recv() => break Ok(0),
            _ = tokio::time::sleep_until(next) => {
                next = tokio::time::Instant::now() + args.interval;
                error = refresh(&client, &prefix, &mut history, &mut listing).await;
                jobs = job_lines(schedules).await;
            }
        }
    };
    ratatui::restore();
    drop(keys);
    result
}

/// The page `top --http` serves: it asks for `/view` every refresh and shows the text.
const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>distlock top</title>
<style>body{background:#111;color:#ddd;font:14px monospace;margin:1em}pre{margin:0}
#error{color:#f77}</style></head>
<body><pre id="view">loading…</pre><pre id="error"></pre>
<script>
async function refresh() {
  try {
    const r = await fetch('/view', {cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    document.getElementById('view').textContent = await r.text();
    document.getElementById('error').textContent = '';
  } catch (e) {
    document.getElementById('error').textContent = 'distlock top is not answering: ' + e.message;
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
</script></body></html>
"#;

async fn http(
    client: distlock::Client,
    prefix: String,
    first: Listing,
    schedules: &[distlock::schedule::Schedule],
    args: &TopArgs,
    url: &str,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<u8> {
    let bound = listener.local_addr()?;
    let gate = distlock_server::http::Gate { bound, allow_remote: args.allow_remote };
    if let Some(file) = &args.http_addr_file {
        std::fs::write(file, format!("{bound}\n")).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    }
    crate::shown::say!("distlock top: serving http://{bound}/");
    let mut history = History::default();
    history.record(&first);
    let key = args.sort;
    let view = |listing: &mut Listing, history: &History, error: Option<&str>, jobs: &[String]| {
        sort(listing, key, false, history);
        let title = title(url, &prefix, key, false, false, error);
        render(listing, history, &title, 500, jobs)
    };
    let mut listing = first;
    let text = Arc::new(Mutex::new(view(&mut listing, &history, None, &job_lines(schedules).await)));
    let page = PAGE.replace("REFRESH_MS", &args.interval.as_millis().to_string());
    let served = text.clone();
    let accept = tokio::spawn(async move {
        let connections = Arc::new(tokio::sync::Semaphore::new(16));
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
            let (served, page) = (served.clone(), page.clone());
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), answer(socket, &gate, &served, &page)).await;
                drop(permit);
            });
        }
    });
    // One listener for the whole run, so an INT that arrives during a refresh is not lost.
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut ticks = tokio::time::interval(args.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = int.recv() => break,
            _ = term.recv() => break,
        }
        let error = tokio::select! {
            e = refresh(&client, &prefix, &mut history, &mut listing) => e,
            _ = int.recv() => break,
            _ = term.recv() => break,
        };
        let jobs = job_lines(schedules).await;
        let t = view(&mut listing, &history, error.as_deref(), &jobs);
        *text.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }
    accept.abort();
    Ok(0)
}

/// Answers one request the gate lets through: `/` the page, `/view` the text now, anything else
/// 404.
async fn answer(
    mut socket: tokio::net::TcpStream,
    gate: &distlock_server::http::Gate,
    text: &Mutex<String>,
    page: &str,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return Ok(());
        }
        let n = socket.read(&mut buf[len..]).await?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let reply = match gate.judge(&String::from_utf8_lossy(&buf[..len])) {
        Ok(request) => page_reply(&request, text, page),
        Err(refused) => refused,
    };
    socket.write_all(reply.as_bytes()).await?;
    socket.shutdown().await
}

/// The reply to an allowed request.
fn page_reply(request: &distlock_server::http::Request, text: &Mutex<String>, page: &str) -> String {
    let (status, kind, body) = match request.path.as_str() {
        "/" | "/index.html" => ("200 OK", "text/html; charset=utf-8", page.to_string()),
        "/view" => ("200 OK", "text/plain; charset=utf-8", text.lock().unwrap_or_else(|e| e.into_inner()).clone()),
        _ => ("404 Not Found", "text/plain; charset=utf-8", "not found\n".to_string()),
    };
    distlock_server::http::reply(status, kind, &body, request.head_only, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::listing::Entry;

    fn listing(holders: &[(&str, &str)]) -> Listing {
        let locks = holders
            .iter()
            .map(|(name, id)| LockInfo {
                name: name.to_string(),
                recipe: "mutex".into(),
                permits: None,
                last_token: None,
                entries: vec![Entry {
                    holds: true,
                    mode: "exclusive".into(),
                    owner: "-".into(),
                    id: id.to_string(),
                    since_ms: None,
                    token: None,
                    lease_left_ms: None,
                }],
            })
            .collect();
        Listing { backend: "sqlite", prefix: String::new(), locks, truncated: false, unseen: vec![] }
    }

    #[test]
    fn a_new_holder_is_one_acquisition_and_a_gone_lock_fades_out() {
        let mut h = History::default();
        h.record(&listing(&[("a", "1")]));
        assert_eq!(h.acquired("a"), 0, "holders seen first are not counted");
        h.record(&listing(&[("a", "2")]));
        h.record(&listing(&[("a", "2")]));
        assert_eq!(h.acquired("a"), 1);
        assert_eq!(h.sparkline("a"), "·█·");
        h.record(&listing(&[]));
        assert_eq!(h.acquired("a"), 1, "kept while its minute shows an acquisition");
        for _ in 0..HISTORY {
            h.record(&listing(&[]));
        }
        assert!(!h.locks.contains_key("a"));
        h.record(&listing(&[("b", "1")]));
        assert_eq!(h.acquired("b"), 1, "a lock first seen later was taken since");
    }

    #[test]
    fn sort_keys_cycle_and_order() {
        assert_eq!(SortKey::Acquired.next(), SortKey::Name);
        let mut l = listing(&[("b", "1"), ("a", "2")]);
        sort(&mut l, SortKey::Name, false, &History::default());
        assert_eq!(l.locks[0].name, "a");
        sort(&mut l, SortKey::Name, true, &History::default());
        assert_eq!(l.locks[0].name, "b");
        assert!(refresh_arg("2s").is_err() && refresh_arg("50ms").is_err() && refresh_arg("500ms").is_ok());
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(distlock::redact_url("postgres://u:pw@db:5432/x?lease=5s"), "postgres://u:***@db:5432/x?lease=5s");
        assert_eq!(distlock::redact_url("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(distlock::redact_url("zk://h:2181/chroot"), "zk://h:2181/chroot");
        assert_eq!(distlock::redact_url("mysql://u@h/db?x=a@b"), "mysql://u@h/db?x=a@b");
        assert_eq!(distlock::redact_url("sqlite:///tmp/l.db"), "sqlite:///tmp/l.db");
    }
}
