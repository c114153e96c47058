//! Every lock under a prefix, read from the keys (the neutral form is
//! [`crate::listing::Listing`]).

use super::{backend, token_key, Client};
use crate::listing::{Entry, Found, Listing, LockInfo, MAX_LOCKS};
use crate::{Error, Result};
use std::collections::BTreeSet;

/// What a Redis listing cannot show.
fn unseen() -> Vec<String> {
    vec![
        "owners: Redis records a holder's client id, not its host or pid".into(),
        "waiters: they wait on a channel, which Redis does not list (a fair lock's queue is not read yet)".into(),
    ]
}

/// Most `SCAN` rounds (of up to 1,000 keys each) one listing makes.
const MAX_SCANS: usize = 1000;

impl Client {
    /// Every lock whose key starts with `prefix`: Redisson-layout hashes (mutexes and
    /// read/write locks), simple-layout strings and semaphores' sorted sets, with their holders,
    /// hold counts and time to live. Refused on a cluster (`SCAN` sees one node's keys).
    pub async fn locks(&self, prefix: &str) -> Result<Listing> {
        if self.inner.url.cluster.is_some() {
            return Err(Error::Unsupported {
                backend: "redis",
                what: "listing the locks of a Redis Cluster (SCAN reaches one node's keys); inspect one lock by name"
                    .into(),
            });
        }
        let mut conn = self.conn();
        let pattern = format!("{}*", glob_escape(prefix));
        let mut keys = BTreeSet::new();
        let (mut cursor, mut rounds) = (0u64, 0usize);
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| backend("SCAN", prefix, e))?;
            keys.extend(batch.into_iter().filter(|k| is_lock_key(k)));
            cursor = next;
            rounds += 1;
            if cursor == 0 || rounds == MAX_SCANS {
                break;
            }
        }
        let mut listing = Listing {
            backend: "redis",
            prefix: prefix.to_string(),
            locks: vec![],
            truncated: cursor != 0,
            unseen: unseen(),
        };
        let (now_s, now_us): (u64, u64) =
            redis::cmd("TIME").query_async(&mut conn).await.map_err(|e| backend("TIME", prefix, e))?;
        let now_ms = now_s * 1000 + now_us / 1000;
        for key in keys {
            if let Some(info) = self.lock_info(&key, now_ms).await? {
                if listing.locks.len() == MAX_LOCKS {
                    listing.truncated = true;
                    break;
                }
                listing.locks.push(info);
            }
        }
        Ok(listing)
    }

    /// The lock at `key` as [`Client::locks`] shows each, or free with its last token (for
    /// [`crate::Client::inspect`]; one key, so also on a cluster).
    pub(crate) async fn one_lock(&self, key: &str) -> Result<Listing> {
        let mut conn = self.conn();
        let (now_s, now_us): (u64, u64) =
            redis::cmd("TIME").query_async(&mut conn).await.map_err(|e| backend("TIME", key, e))?;
        let found = match self.lock_info(key, now_s * 1000 + now_us / 1000).await? {
            Some(info) => Found::Lock(info),
            None => {
                let token: Option<String> = redis::cmd("GET")
                    .arg(token_key(key))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| backend("GET", key, e))?;
                Found::Free { recipe: "mutex", last_token: token.and_then(|t| t.parse().ok()) }
            }
        };
        Ok(Listing::one("redis", key, found, unseen()))
    }

    async fn lock_info(&self, key: &str, now_ms: u64) -> Result<Option<LockInfo>> {
        let mut conn = self.conn();
        let fail = |op| move |e: redis::RedisError| backend(op, key, e);
        let (kind, pttl, token): (String, i64, Option<String>) = redis::pipe()
            .cmd("TYPE")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .cmd("GET")
            .arg(token_key(key))
            .query_async(&mut conn)
            .await
            .map_err(fail("TYPE"))?;
        let last_token = token.and_then(|t| t.parse().ok());
        let ttl = (pttl >= 0).then_some(pttl as u64);
        let held = |mode: &str, id: String, count: u64| {
            let mut e = Entry::new(true, mode, "-".into(), if count > 1 { format!("{id} (x{count})") } else { id });
            e.lease_left_ms = ttl;
            e
        };
        let (recipe, permits, mut entries) = match kind.as_str() {
            "hash" => {
                let fields: Vec<(String, String)> =
                    redis::cmd("HGETALL").arg(key).query_async(&mut conn).await.map_err(fail("HGETALL"))?;
                let rw = fields.iter().any(|(f, _)| f == "mode");
                // `value`: an election leader's announced value, beside its holder field.
                if !fields.iter().all(|(f, _)| f == "mode" || f == "value" || is_holder_field(f)) {
                    return Ok(None); // an application's hash, not a lock
                }
                let entries: Vec<Entry> = fields
                    .into_iter()
                    .filter(|(f, _)| f != "mode" && f != "value")
                    .map(|(f, n)| {
                        let mode = match (rw, f.ends_with(":write")) {
                            (false, _) => "exclusive",
                            (true, true) => "write",
                            (true, false) => "read",
                        };
                        held(mode, f, n.parse().unwrap_or(1))
                    })
                    .collect();
                (if rw { "rwlock" } else { "mutex" }, None, entries)
            }
            "string" => {
                let v: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await.map_err(fail("GET"))?;
                (
                    "mutex",
                    None,
                    v.into_iter().filter(|v| is_token_value(v)).map(|id| held("exclusive", id, 1)).collect(),
                )
            }
            "zset" => {
                let (members, permits): (Vec<(String, f64)>, Option<u32>) = redis::pipe()
                    .cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .cmd("GET")
                    .arg(super::suffix_name(key, "permits"))
                    .query_async(&mut conn)
                    .await
                    .map_err(fail("ZRANGE"))?;
                if permits.is_none() {
                    return Ok(None); // a semaphore's set has its permit count beside it
                }
                let entries: Vec<Entry> = members
                    .into_iter()
                    .filter(|(_, until)| *until as u64 > now_ms)
                    .map(|(id, until)| {
                        let mut e = Entry::new(true, "permit", "-".into(), id);
                        e.lease_left_ms = Some(until as u64 - now_ms);
                        e
                    })
                    .collect();
                ("semaphore", permits, entries)
            }
            _ => return Ok(None),
        };
        if entries.is_empty() {
            return Ok(None);
        }
        // A mutex's holder took the last token handed out for it.
        if recipe == "mutex" {
            entries.iter_mut().for_each(|e| e.token = last_token);
        }
        Ok(Some(LockInfo { name: key.to_string(), recipe: recipe.into(), permits, last_token, entries }))
    }
}

/// Whether `key` is a lock's own key, not one of the keys kept beside it (fencing counters,
/// unlock latches, fair queues, read/write timeouts, semaphore permit counts).
fn is_lock_key(key: &str) -> bool {
    !(key.starts_with("redisson_")
        || key.starts_with("distlock_")
        || key.contains(":rwlock_timeout")
        || key.ends_with(":permits"))
}

/// A Redisson-layout hash field: `<client uuid>:<thread or handle>` (`:write` for a writer).
fn is_holder_field(field: &str) -> bool {
    let mut parts = field.splitn(2, ':');
    let (id, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') && !rest.is_empty()
}

/// A simple-layout lock's value: 32 hex digits (redis-py's `uuid1().hex`, distlock's own).
fn is_token_value(value: &str) -> bool {
    value.len() == 32 && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `prefix` with `SCAN MATCH`'s special characters escaped.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_keys_are_not_locks() {
        assert!(is_lock_key("orders"));
        assert!(!is_lock_key("redisson_lock_token:{orders}"));
        assert!(!is_lock_key("{orders}:permits"));
        assert!(!is_lock_key("distlock_fair_queue:{orders}"));
        assert!(!is_lock_key("{orders}:6f1c:3:rwlock_timeout:1"));
        assert!(is_holder_field("6f1c2a8e-7d3b-4e0f-9a51-0c2d4b6e8f10:12"));
        assert!(is_holder_field("6f1c2a8e-7d3b-4e0f-9a51-0c2d4b6e8f10:12:write"));
        assert!(!is_holder_field("name"));
        assert!(is_token_value("0123456789abcdef0123456789abcdef"));
        assert!(!is_token_value("some application value"));
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
