//! `distlock inspect`.

use crate::shown::text;
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
    /// (PostgreSQL, MariaDB, SQLite, etcd), shown in the table (or JSON) of --all. With --all,
    /// a name prefix.
    #[arg(value_name = "LOCK", required_unless_present = "all")]
    lock: Option<String>,
}

pub async fn run(args: InspectArgs) -> anyhow::Result<u8> {
    let client = args.backend.connect_to_look().await?;
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
            println!("{}", crate::shown::json(serde_json::to_string(&listing)?));
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
            println!(
                "{}",
                crate::shown::json(serde_json::json!({ "job": lock, "last_run": last, "taken": taken }).to_string())
            );
        } else {
            match &last {
                Some(run) => println!("{}", text(&run.to_string())),
                None => println!("{}: no run recorded", text(&lock)),
            }
            match &taken {
                Some(t) => println!("{}", text(&t.to_string())),
                None => println!("{}: free to run now", text(&lock)),
            }
        }
        return Ok(());
    }
    // One lock, in the same shape as --all on every backend.
    let listing = client.inspect(&lock).await?;
    let one = &listing.locks[0];
    if args.json {
        println!("{}", crate::shown::json(serde_json::to_string(&listing)?));
    } else if one.entries.is_empty() {
        let token =
            one.last_token.map(|t| format!("last fencing token {t}")).unwrap_or("no fencing token recorded".into());
        println!("{}: free (no holder, no waiter); {token}", text(&one.name));
        if listing.truncated {
            println!(
                "(more than {} locks share this name as a prefix: it may be among those left out)",
                distlock::listing::MAX_LOCKS
            );
        }
        for what in &listing.unseen {
            println!("not recorded by {}: {}", listing.backend, text(what));
        }
    } else {
        print!("{}", table(&listing, usize::MAX, None));
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
    let width = listing.locks.iter().map(|l| text(&l.name).chars().count()).max().unwrap_or(4).clamp(4, 48);
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
            let (name, recipe) = if i == 0 { (text(&lock.name), text(&lock.recipe)) } else { ("".into(), "".into()) };
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
                text(&e.mode),
                clip_owner(&text(&e.owner), 24),
                e.since_ms.map(ms_text).unwrap_or_else(|| "-".into()),
                e.token.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                e.lease_left_ms.map(ms_text).unwrap_or_else(|| "-".into()),
                text(&e.id)
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
        if listing.prefix.is_empty() { String::new() } else { format!(" under \"{}\"", text(&listing.prefix)) },
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
        let _ = writeln!(out, "not recorded by {}: {}", listing.backend, text(what));
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
