//! `distlock inspect`.

use crate::BackendArg;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Every lock in use whose name starts with LOCK (all of them if LOCK is left out): holders
    /// and waiters in queue order, in one table for every backend.
    #[arg(long)]
    all: bool,
    /// LOCK is a scheduled job's name (`exec --once-per`, ShedLock's): show its last run's
    /// record (holder, pid and process start, start, end, exit status, token, slot) and whether
    /// it is taken now.
    #[arg(long, conflicts_with = "all")]
    job: bool,
    /// The lock: a znode path or a bare name (ZooKeeper), a key (Redis), or a lock name
    /// (PostgreSQL, MariaDB, SQLite, etcd). With --all, a name prefix.
    #[arg(value_name = "LOCK", required_unless_present = "all")]
    lock: Option<String>,
}

pub async fn run(args: InspectArgs) -> anyhow::Result<u8> {
    let client = args.backend.connect().await?;
    // Closed on every path, an error's too: a ZooKeeper session or an etcd lease of ours must not
    // outlive the command until its timeout.
    let shown = show(&client, &args).await;
    client.close(Duration::from_secs(2)).await;
    shown.map(|()| 0)
}

async fn show(client: &distlock::Client, args: &InspectArgs) -> anyhow::Result<()> {
    if args.all {
        let listing = client.locks(args.lock.as_deref().unwrap_or("")).await?;
        if args.json {
            println!("{}", serde_json::to_string(&listing)?);
        } else {
            print!("{}", table(&listing, usize::MAX, None));
        }
        return Ok(());
    }
    let lock = args.lock.clone().expect("clap requires LOCK without --all");
    if args.job {
        let job = client.schedule(&lock)?;
        let (last, taken) = (job.last_run().await?, job.check().await?);
        if args.json {
            let taken = taken.as_ref().map(|t| {
                serde_json::json!({
                    "reason": format!("{:?}", t.reason),
                    "locked_by": t.locked_by,
                    "lock_until_ms": t.lock_until_ms,
                    "now_ms": t.now_ms,
                })
            });
            println!("{}", serde_json::json!({ "job": lock, "last_run": last, "taken": taken }));
        } else {
            match &last {
                Some(run) => println!("{run}"),
                None => println!("{lock}: no run recorded"),
            }
            match &taken {
                Some(t) => println!("{t}"),
                None => println!("{lock}: free to run now"),
            }
        }
        return Ok(());
    }
    if let Some(redis) = client.redis() {
        let view = redis.inspect(&lock).await?;
        if args.json {
            println!("{}", serde_json::to_string(&view)?);
        } else if view.holders.is_empty() {
            println!("{}: free (no holder; last fencing token {})", view.key, token_text(view.last_token));
        } else {
            let ttl = view.ttl_ms.map(|t| format!("{t} ms")).unwrap_or_else(|| "no TTL".into());
            println!(
                "{} ({} layout): expires in {ttl}; fencing token {}",
                view.key,
                view.layout,
                token_text(view.last_token)
            );
            println!("{:<6} {:>5}  HOLDER", "ROLE", "COUNT");
            for h in &view.holders {
                println!("{:<6} {:>5}  {}", "holder", h.count, h.id);
            }
        }
        return Ok(());
    }
    if let Some(pg) = client.postgres() {
        let view = pg.inspect(&lock).await?;
        if args.json {
            println!("{}", serde_json::to_string(&view)?);
        } else if view.sessions.is_empty() {
            println!(
                "{} (advisory key {}): free; last fencing token {}",
                view.name,
                view.key,
                token_text(view.last_token)
            );
        } else {
            println!("{} (advisory key {}): fencing token {}", view.name, view.key, token_text(view.last_token));
            println!("{:<7} {:<10} {:>8}  {:<16} APPLICATION", "ROLE", "MODE", "PID", "CLIENT");
            for s in &view.sessions {
                println!(
                    "{:<7} {:<10} {:>8}  {:<16} {}",
                    if s.granted { "holder" } else { "waiter" },
                    s.mode,
                    s.pid,
                    s.client_addr.as_deref().unwrap_or("local"),
                    s.application_name
                );
            }
        }
        return Ok(());
    }
    if let Some(db) = client.mysql() {
        let view = db.inspect(&lock).await?;
        if args.json {
            println!("{}", serde_json::to_string(&view)?);
        } else {
            match view.holder_connection {
                Some(id) => {
                    println!("{}: held by connection {id}; fencing token {}", view.name, token_text(view.last_token))
                }
                None => println!("{}: free; last fencing token {}", view.name, token_text(view.last_token)),
            }
        }
        return Ok(());
    }
    if let Some(etcd) = client.etcd() {
        let view = etcd.inspect(&lock).await?;
        if args.json {
            println!("{}", serde_json::to_string(&view)?);
        } else if view.keys.is_empty() {
            println!("{}: free (no key under {}/ at revision {})", view.name, view.name, view.revision);
        } else {
            println!(
                "{}: {} key(s) under {}/ at revision {}, oldest first:",
                view.name,
                view.keys.len(),
                view.name,
                view.revision
            );
            for k in &view.keys {
                println!("  {} create revision {} lease {:x}", k.key, k.create_revision, k.lease);
            }
        }
        return Ok(());
    }
    if let Some(db) = client.sqlite() {
        let view = db.mutex(&lock)?.inspect().await?;
        match view {
            _ if args.json => println!("{}", serde_json::to_string(&view)?),
            None => println!("{}: free (never taken)", lock),
            Some(v) if v.held => println!(
                "{}: held by {} since {} until {} UTC; fencing token {}",
                v.name, v.locked_by, v.locked_at, v.lock_until, v.fencing_token
            ),
            Some(v) => println!(
                "{}: free (last held by {} until {} UTC); last fencing token {}",
                v.name, v.locked_by, v.lock_until, v.fencing_token
            ),
        }
        return Ok(());
    }
    let Some(zk) = client.zookeeper() else {
        anyhow::bail!("inspect does not support {} yet", client.backend());
    };
    let path = client.lock_name(&lock)?;
    let view = zk.inspect(&path).await?;
    if args.json {
        println!("{}", serde_json::to_string(&view)?);
    } else if view.contenders.is_empty() {
        println!("{}: free (no holder, no waiters)", view.path);
    } else {
        let permits =
            view.permits.map(|n| format!(", {n} permit{}", if n == 1 { "" } else { "s" })).unwrap_or_default();
        let n = view.contenders.len();
        println!("{} ({}{permits}): {n} node{}", view.path, view.kind, if n == 1 { "" } else { "s" });
        println!("{:<4} {:<7} {:<6} {:<28} {:<20} {:>8}  NODE", "POS", "ROLE", "MODE", "OWNER", "SESSION", "AGE");
        for c in &view.contenders {
            let owner = match &c.owner {
                Some(o) => o.to_string(),
                None if c.raw_data.is_empty() => "-".to_string(),
                None => format!("raw: {}", c.raw_data.chars().take(22).collect::<String>()),
            };
            let age = humantime::format_duration(Duration::from_millis(c.age_ms / 100 * 100)).to_string();
            println!(
                "{:<4} {:<7} {:<6} {:<28} {:<20} {:>8}  {}",
                c.position,
                if c.holds { "holder" } else { "waiter" },
                c.mode,
                owner,
                c.session,
                age,
                c.node
            );
        }
    }
    if !args.json && !view.others.is_empty() {
        println!("not lock nodes (ignored by the queue): {}", view.others.join(", "));
    }
    Ok(())
}

/// A column of `top` (its header and its text on a lock's first row).
pub type Column<'a> = (&'a str, &'a dyn Fn(&distlock::listing::LockInfo) -> String);

/// A listing as a table: one row per holder or waiter, the lock's name on its first row, then
/// what the backend cannot show. At most `rows` rows (a screen's worth in `top`); `extra` adds a
/// column before ID.
pub fn table(listing: &distlock::listing::Listing, rows: usize, extra: Option<Column<'_>>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let width = listing.locks.iter().map(|l| l.name.len()).max().unwrap_or(4).clamp(4, 48);
    let _ = writeln!(
        out,
        "{:<width$}  {:<9} {:<6} {:>3} {:<9} {:<24} {:>8} {:>12} {:>8}  {}ID",
        "LOCK",
        "RECIPE",
        "ROLE",
        "POS",
        "MODE",
        "OWNER",
        "SINCE",
        "TOKEN",
        "LEASE",
        extra.map(|(h, _)| format!("{h}  ")).unwrap_or_default()
    );
    let mut shown = 0;
    'locks: for lock in &listing.locks {
        for (i, e) in lock.entries.iter().enumerate() {
            if shown == rows {
                break 'locks;
            }
            shown += 1;
            let (name, recipe) = if i == 0 { (lock.name.as_str(), lock.recipe.as_str()) } else { ("", "") };
            let column = match extra {
                Some((h, f)) => {
                    let text = if i == 0 { f(lock) } else { String::new() };
                    format!("{:<w$}  ", text, w = h.chars().count())
                }
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "{:<width$}  {:<9} {:<6} {:>3} {:<9} {:<24} {:>8} {:>12} {:>8}  {column}{}",
                name,
                recipe,
                if e.holds { "holder" } else { "waiter" },
                i,
                e.mode,
                clip_owner(&e.owner, 24),
                e.since_ms.map(ms_text).unwrap_or_else(|| "-".into()),
                e.token.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                e.lease_left_ms.map(ms_text).unwrap_or_else(|| "-".into()),
                e.id
            );
        }
    }
    let entries: usize = listing.locks.iter().map(|l| l.entries.len()).sum();
    let _ = writeln!(
        out,
        "{} lock{} in use on {}{}, {} holder{}, {} waiter{}",
        listing.locks.len(),
        if listing.locks.len() == 1 { "" } else { "s" },
        listing.backend,
        if listing.prefix.is_empty() { String::new() } else { format!(" under {:?}", listing.prefix) },
        listing.locks.iter().map(|l| l.holders().count()).sum::<usize>(),
        plural(listing.locks.iter().map(|l| l.holders().count()).sum::<usize>()),
        listing.locks.iter().map(|l| l.waiters().count()).sum::<usize>(),
        plural(listing.locks.iter().map(|l| l.waiters().count()).sum::<usize>()),
    );
    if shown < entries {
        let _ = writeln!(out, "({} more rows not shown)", entries - shown);
    }
    if listing.truncated {
        let _ = writeln!(out, "(more than {} locks: the rest are left out)", distlock::listing::MAX_LOCKS);
    }
    for what in &listing.unseen {
        let _ = writeln!(out, "not recorded by {}: {what}", listing.backend);
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `owner` in at most `n` characters: a long host is cut, its ` pid N` kept.
fn clip_owner(owner: &str, n: usize) -> String {
    if owner.chars().count() <= n {
        return owner.to_string();
    }
    let (head, tail) = match owner.rfind(" pid ") {
        Some(i) if owner.len() - i < n => (&owner[..i], &owner[i..]),
        _ => (owner, ""),
    };
    let room = n.saturating_sub(tail.chars().count() + 1);
    format!("{}…{tail}", head.chars().take(room).collect::<String>())
}

/// Milliseconds as `850ms`, `12.3s`, `4m05s` or `2h07m`.
pub fn ms_text(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

fn token_text(token: Option<u64>) -> String {
    token.map(|t| t.to_string()).unwrap_or_else(|| "none yet".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_owner_keeps_its_pid() {
        use super::clip_owner;
        assert_eq!(clip_owner("vm pid 42", 24), "vm pid 42");
        let c = clip_owner("ip-172-31-22-10.ec2.internal pid 4242", 24);
        assert_eq!(c.chars().count(), 24);
        assert!(c.ends_with("… pid 4242"), "{c}");
        assert_eq!(clip_owner("127.0.0.1:35894 (distlock-cli-application)", 24).chars().count(), 24);
        assert_eq!(clip_owner("x", 0), "…", "no room: no panic either");
    }
}
