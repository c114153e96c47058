//! Scheduled jobs on Redis ([`crate::schedule`]), in ShedLock's `RedisLockProvider` layout so
//! that Java services using ShedLock and distlock exclude each other by job name: the lock row
//! is the string `job-lock:default:<job>` holding `ADDED:<locked_at>@<locked_by>` (RFC 3339 UTC,
//! milliseconds) and expiring (PX) at `lock_until` (no key: free); distlock's record of the last
//! run is the string `{job-lock:default:<job>}:run` holding the [`Run`] as JSON, without expiry
//! (its hash tag is the lock key's whole name: both keys share a cluster slot). A read is one
//! script that answers the server's `TIME` with both keys; a write is one script that compares
//! both values with the read's and sets both (the lock key's TTL counted from the server's
//! `TIME` in the script) only if neither changed.

use super::{Client, Replication};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::{parse_ms, stored_time, Run, FOREVER_MS};
use crate::{Error, Result};
use std::sync::LazyLock;

/// The server's time in milliseconds, then the lock key's value and `PTTL`, and the record's
/// value (`false`, a nil reply, for a missing key). A key of another type is an error naming it.
static READ: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
for i = 1, 2 do
  local kind = redis.call('type', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= 'string' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind .. ', not the string of a job')
  end
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]), redis.call('get', KEYS[2])}
"#,
    )
});

/// Compares the lock key (unless ARGV[1] is `0`: left as it is) and the record with the read's
/// values (ARGV[2..3], ARGV[4..5]: `1` and the value, or `0` for no key) and answers 0 if one
/// differs. Else sets the lock key to ARGV[7] expiring at ARGV[6] (server ms; deleted if that is
/// not in the future) and the record to ARGV[8], and answers 1.
static WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local function same(key, present, was)
  local now = redis.call('get', key)
  if present == '1' then
    return now == was
  end
  return now == false
end
if ARGV[1] == '1' and not same(KEYS[1], ARGV[2], ARGV[3]) then
  return 0
end
if not same(KEYS[2], ARGV[4], ARGV[5]) then
  return 0
end
if ARGV[1] == '1' then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ttl = tonumber(ARGV[6]) - now
  if ttl > 0 then
    redis.call('set', KEYS[1], ARGV[7], 'PX', string.format('%.0f', ttl))
  else
    redis.call('del', KEYS[1])
  end
end
redis.call('set', KEYS[2], ARGV[8])
return 1
"#,
    )
});

/// The job store of a Redis client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
}

/// ShedLock's lock key of `job` (its default key prefix and environment).
fn lock_key(job: &str) -> String {
    format!("job-lock:default:{job}")
}

/// The record's key: the lock key's whole name as the hash tag, so both share a slot.
fn record_key(job: &str) -> String {
    format!("{{{}}}:run", lock_key(job))
}

/// `locked_at` and `locked_by` of a lock value `ADDED:<locked_at>@<locked_by>`; a value of
/// another shape is someone's mark, taken at `now`.
fn parse_value(value: &str, now: i64) -> (i64, String) {
    if let Some((at, by)) = value.strip_prefix("ADDED:").and_then(|rest| rest.split_once('@')) {
        if let Some(at) = parse_ms(at) {
            return (at, by.to_string());
        }
    }
    (now, value.to_string())
}

/// A key's value as text, or an error naming the key.
fn text(job: &str, key: &str, value: Option<Vec<u8>>) -> Result<Option<String>> {
    value
        .map(|v| {
            String::from_utf8(v).map_err(|_| Error::Backend {
                op: "read job",
                path: job.to_string(),
                source: format!("{key} holds bytes that are not UTF-8 text: not a job's key").into(),
            })
        })
        .transpose()
}

impl Jobs {
    /// Refuses a name whose keys would fall in different slots on a cluster: the record key's
    /// hash tag ends at the name's first `}` (and a `{...}` in the name moves the lock key).
    fn check(&self, job: &str) -> Result<()> {
        if self.client.sharded() && job.contains(['{', '}']) {
            return Err(Error::InvalidArgument {
                what: "job name",
                reason: format!(
                    "{job:?}: on a Redis cluster a job name cannot hold '{{' or '}}' (its lock key and its record \
                     would fall in different slots)"
                ),
            });
        }
        Ok(())
    }
}

impl JobStore for Jobs {
    fn transient(&self, e: &Error) -> bool {
        super::is_transient(e) || e.is_unanswered()
    }

    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            self.check(job)?;
            let (lock_key, record_key) = (lock_key(job), record_key(job));
            let (now, lock, pttl, record): (i64, Option<Vec<u8>>, i64, Option<Vec<u8>>) =
                self.client.eval(&READ, &[&lock_key, &record_key], &[], "read job", job).await?;
            let lock = text(job, &lock_key, lock)?;
            let record = text(job, &record_key, record)?;
            let run = record.as_ref().map(|r| Run::from_stored(job, &record_key, r.as_bytes())).transpose()?;
            let row = lock.as_deref().map(|value| {
                let (locked_at_ms, locked_by) = parse_value(value, now);
                // -1: no expiry; -2 (the key went between the GET and the PTTL, which a script
                // does not see happen): treated as now.
                let lock_until_ms = match pttl {
                    -1 => FOREVER_MS,
                    ttl => now.saturating_add(ttl.max(0)),
                };
                JobLock { lock_until_ms, locked_at_ms, locked_by }
            });
            Ok(JobRead { now_ms: now, now_error_ms: 0, lock: row, run, seen: Seen { lock, run: record } })
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
            self.check(job)?;
            let (lock_key, record_key) = (lock_key(job), record_key(job));
            let record = run.stored();
            let was = |v: &Option<String>| match v {
                Some(v) => ["1".to_string(), v.clone()],
                None => ["0".to_string(), String::new()],
            };
            let [lock_there, lock_was] = was(&seen.lock);
            let [record_there, record_was] = was(&seen.run);
            let (write_lock, until, value) = match lock {
                Some(l) => (
                    "1",
                    l.lock_until_ms.to_string(),
                    format!("ADDED:{}@{}", stored_time(job, l.locked_at_ms)?, l.locked_by),
                ),
                None => ("0", String::new(), String::new()),
            };
            let args = [write_lock.to_string(), lock_there, lock_was, record_there, record_was, until, value, record];
            let keys = [lock_key.as_str(), record_key.as_str()];
            let written: i64 = if self.client.url().replicas == 0 {
                self.client.eval(&WRITE, &keys, &args, "write job", job).await?
            } else {
                let (written, replication): (i64, Replication) =
                    self.client.eval_acquire(&WRITE, &keys, &args, job).await?;
                if written == 1 {
                    self.replicated(job, lock, run, replication)?;
                }
                written
            };
            Ok(written == 1)
        })
    }
}

impl Jobs {
    /// With `?replicas=N`: a start that fewer replicas confirmed is an error (a failover could
    /// lose it and let the job run twice in its slot; the job stays taken on this master without
    /// a run); a finish so confirmed is only logged.
    fn replicated(&self, job: &str, lock: Option<&JobLock>, run: &Run, replication: Replication) -> Result<()> {
        let Err(Error::NotReplicated { wanted, acked, .. }) = replication.check(job) else { return Ok(()) };
        let why = format!("only {acked} of {wanted} replicas confirmed the write in time");
        match lock {
            Some(l) if run.ended_ms.is_none() => Err(Error::Backend {
                op: "start job",
                path: job.to_string(),
                source: format!(
                    "{why}; the job stays taken until {} without a run",
                    stored_time(job, l.lock_until_ms)?
                )
                .into(),
            }),
            _ => {
                tracing::warn!(job, token = run.token, "{why} (the end of the run)");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_slot() {
        assert_eq!(lock_key("nightly"), "job-lock:default:nightly");
        assert_eq!(record_key("nightly"), "{job-lock:default:nightly}:run");
        // Redis hashes the part between the first '{' and the next '}' when it is not empty.
        fn hashed(key: &str) -> &str {
            match key.find('{').and_then(|open| Some((open, key[open + 1..].find('}')?))) {
                Some((open, len)) if len > 0 => &key[open + 1..open + 1 + len],
                _ => key,
            }
        }
        for job in ["nightly", "a:b", "x y"] {
            assert_eq!(hashed(&lock_key(job)), hashed(&record_key(job)), "{job}");
        }
        // What the cluster check refuses: a '}' ends the record key's tag early.
        assert_ne!(hashed(&lock_key("a}b")), hashed(&record_key("a}b")));
        assert_ne!(hashed(&lock_key("a{b}")), hashed(&record_key("a{b}")));
    }

    #[test]
    fn values_parse() {
        assert_eq!(parse_value("ADDED:2023-11-14T22:13:20.123Z@host-1", 5), (1_700_000_000_123, "host-1".into()));
        assert_eq!(parse_value("ADDED:2023-11-14T22:13:20.123Z@a@b", 5), (1_700_000_000_123, "a@b".into()));
        assert_eq!(parse_value("ADDED:soon@host", 5), (5, "ADDED:soon@host".into()));
        assert_eq!(parse_value("someone", 5), (5, "someone".into()));
        assert!(stored_time("j", FOREVER_MS).is_err());
        assert_eq!(stored_time("j", 1_700_000_000_123).unwrap(), "2023-11-14T22:13:20.123Z");
    }
}
