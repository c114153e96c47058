//! The Lua scripts, each one atomic on the server. Redisson's layout and return codes are kept
//! where interop needs them; the scripts themselves are our own.

use std::sync::LazyLock;

/// Next fencing token of KEYS[n]'s counter: one more than the last, and never less than the
/// server's clock in microseconds, so that the sequence keeps rising when a server without
/// persistence restarts empty or a replica that missed the last increments takes over (as long
/// as the clock does not step back by more than the time since the last grant).
macro_rules! next_token {
    () => {
        r#"
local function next_token(counter)
  local t = redis.call('incr', counter)
  local now = redis.call('time')
  local us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if t < us then
    t = us
    redis.call('set', counter, string.format('%.0f', t))
  end
  return t
end
"#
    };
}

/// Redisson RLock acquire plus a fencing token. KEYS: lock, token counter. ARGV: lease ms,
/// field. Returns `{-1, token}` when acquired, `{-2, token}` when re-entered (the token of the
/// hold in progress, as far as the counter knows), `{pttl, 0}` when someone else holds it.
pub(crate) static REDISSON_LOCK: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        next_token!(),
        r#"
if redis.call('exists', KEYS[1]) == 0 then
  local t = next_token(KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, t}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-2, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {redis.call('pttl', KEYS[1]), 0}
"#
    ))
});

/// Redisson RLock unlock. KEYS: lock, channel, latch. ARGV: message, lease ms, field, latch ms.
/// Returns nil when the field is not there (not ours), 0 when a re-entrant hold remains, 1 when
/// the lock was deleted (and the message published). A retried request returns what the first
/// one did (the latch).
pub(crate) static REDISSON_UNLOCK: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local done = redis.call('get', KEYS[3])
if done then return tonumber(done) end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[4])
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
redis.call('set', KEYS[3], 1, 'px', ARGV[4])
return 1
"#,
    )
});

/// Redisson's watchdog renewal. KEYS: lock. ARGV: lease ms, field. 1 if renewed, 0 if not ours.
pub(crate) static REDISSON_RENEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0
"#,
    )
});

/// The seeds' `SET K v NX PX lease` plus a fencing token. KEYS: lock, token counter. ARGV:
/// value, lease ms. Returns `{-1, token}` when acquired, `{pttl, 0}` otherwise.
pub(crate) static SIMPLE_LOCK: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        next_token!(),
        r#"
if redis.call('set', KEYS[1], ARGV[1], 'nx', 'px', ARGV[2]) then
  return {-1, next_token(KEYS[2])}
end
return {redis.call('pttl', KEYS[1]), 0}
"#
    ))
});

/// Compare-and-delete, then a wake-up for our waiters. KEYS: lock, channel. ARGV: value.
pub(crate) static SIMPLE_RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], '0')
  return 1
end
return 0
"#,
    )
});

/// Compare-and-pexpire. KEYS: lock. ARGV: value, lease ms.
pub(crate) static SIMPLE_RENEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return 0
"#,
    )
});
