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
    /// The lock: a znode path or a bare name (ZooKeeper), a key (Redis), or a lock name (PostgreSQL, MariaDB, SQLite).
    #[arg(value_name = "LOCK")]
    lock: String,
}

pub async fn run(args: InspectArgs) -> anyhow::Result<u8> {
    let client = args.backend.connect().await?;
    if let Some(redis) = client.redis() {
        let view = redis.inspect(&args.lock).await?;
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
        return Ok(0);
    }
    if let Some(pg) = client.postgres() {
        let view = pg.inspect(&args.lock).await?;
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
        return Ok(0);
    }
    if let Some(db) = client.mysql() {
        let view = db.inspect(&args.lock).await?;
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
        return Ok(0);
    }
    if let Some(etcd) = client.etcd() {
        let view = etcd.inspect(&args.lock).await?;
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
        return Ok(0);
    }
    if let Some(db) = client.sqlite() {
        let view = db.mutex(&args.lock)?.inspect().await?;
        match view {
            _ if args.json => println!("{}", serde_json::to_string(&view)?),
            None => println!("{}: free (never taken)", args.lock),
            Some(v) if v.held => println!(
                "{}: held by {} since {} until {} UTC; fencing token {}",
                v.name, v.locked_by, v.locked_at, v.lock_until, v.fencing_token
            ),
            Some(v) => println!(
                "{}: free (last held by {} until {} UTC); last fencing token {}",
                v.name, v.locked_by, v.lock_until, v.fencing_token
            ),
        }
        return Ok(0);
    }
    let Some(zk) = client.zookeeper() else {
        anyhow::bail!("inspect does not support {} yet", client.backend());
    };
    let path = client.lock_name(&args.lock)?;
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
    client.close(Duration::from_secs(2)).await;
    Ok(0)
}

fn token_text(token: Option<u64>) -> String {
    token.map(|t| t.to_string()).unwrap_or_else(|| "none yet".into())
}
