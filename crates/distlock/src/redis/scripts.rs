//! The Lua scripts, each one atomic on the server. Redisson's layout and return codes are kept
//! where interop needs them; the scripts themselves are our own.

use std::sync::LazyLock;

/// A script that publishes a wake-up: PUBLISH on one server, SPUBLISH (sharded, to the node of
/// the lock's slot, as Redisson does on a cluster) on a cluster.
pub(crate) struct Publishing {
    plain: redis::Script,
    sharded: redis::Script,
}

impl Publishing {
    fn new(source: &str) -> Publishing {
        Publishing {
            plain: redis::Script::new(source),
            sharded: redis::Script::new(&source.replace("redis.call('publish',", "redis.call('spublish',")),
        }
    }

    pub(crate) fn pick(&self, sharded: bool) -> &redis::Script {
        if sharded {
            &self.sharded
        } else {
            &self.plain
        }
    }
}

/// Next fencing token of KEYS[n]'s counter: one more than the last, and never less than the
/// server's clock in microseconds, so that the sequence keeps rising when a server without
/// persistence restarts empty or a replica that missed the last increments takes over (as long
/// as the clock does not step back by more than the time since the last grant).
///
/// Two calls in the usual case (`TIME`, then `GETSET` of the clock, which answers the last
/// token): every call inside a script costs the server a few microseconds, the largest part of
/// an uncontended cycle's cost beyond its floor. Only grants within one microsecond of each
/// other (or after the clock stepped back) write the counter a second time.
macro_rules! next_token {
    () => {
        r#"
local function next_token(counter)
  local now = redis.call('time')
  local t = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('getset', counter, string.format('%.0f', t)) or '0')
  if last ~= nil and last >= t then
    t = last + 1
    redis.call('set', counter, string.format('%.0f', t))
  end
  return t
end
"#
    };
}

/// Answers of every acquire script: `{GRANTED, token}` (a new hold), `{REENTERED, 0}` (one
/// more on the hold in progress), `{HELD, pttl}` (someone else's; pttl may be negative: no TTL
/// or none known), `{GONE, 0}` (a re-entry found the hold in progress gone), and the
/// semaphore's `{OTHER_PERMITS, permits}`. Codes never collide with a TTL, however odd the key.
macro_rules! codes {
    () => {
        r#"
local GRANTED, REENTERED, HELD, GONE, OTHER_PERMITS = 1, 2, 0, 3, 4
"#
    };
}

/// A script of its Lua parts, made on first use.
macro_rules! script {
    ($($part:expr),+ $(,)?) => {
        LazyLock::new(|| redis::Script::new(concat!($($part),+)))
    };
}

/// An acquire script: [`next_token!`] and [`codes!`], then its own parts.
macro_rules! acquire_script {
    ($($part:expr),+ $(,)?) => {
        script!(next_token!(), codes!(), $($part),+)
    };
}

/// A [`Publishing`] script of its Lua parts, made on first use.
macro_rules! publishing {
    ($($part:expr),+ $(,)?) => {
        LazyLock::new(|| Publishing::new(concat!($($part),+)))
    };
}

/// Redisson RLock acquire plus a fencing token. KEYS: lock, token counter. ARGV: lease ms,
/// field, mode (`r`: re-enter the hold in progress under this field only; `n`: a new hold
/// under a field no earlier hold used, which, when already there, is this very attempt's grant
/// whose answer was lost, and is answered as granted again without counting twice), and for an
/// election's candidate the value it announces (put in the hash's `value` field with the grant).
pub(crate) static REDISSON_LOCK: LazyLock<redis::Script> = acquire_script!(
    r#"
if redis.call('exists', KEYS[1]) == 0 then
  if ARGV[3] == 'r' then return {GONE, 0} end
  local t = next_token(KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  if ARGV[4] then redis.call('hset', KEYS[1], 'value', ARGV[4]) end
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {GRANTED, t}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  if ARGV[3] == 'n' then return {GRANTED, tonumber(redis.call('get', KEYS[2]) or '0')} end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {REENTERED, 0}
end
if ARGV[3] == 'r' then return {GONE, 0} end
return {HELD, redis.call('pttl', KEYS[1])}
"#
);

/// Redisson RLock unlock. KEYS: lock, channel, latch. ARGV: message, lease ms, field, latch ms,
/// retry (`1` for a second or later try of the same release). Returns nil when the field is not
/// there (not ours), 0 when a re-entrant hold remains, 1 when the lock was deleted (and the
/// message published). A retried decrement returns what the first one did (Redisson's latch,
/// written only then and read only by retries, since a first try cannot have a latch: a
/// retried final release finds the field gone, which is as good, since every hold has a field
/// of its own). The last hold deletes the hash without decrementing it first, as Redisson's
/// decrement to 0 would. A key of another type (someone else's lock in another layout, taken
/// after ours was lost) is not ours either: nil, not an error.
pub(crate) static REDISSON_UNLOCK: LazyLock<Publishing> = publishing!(
    r#"
if ARGV[5] == '1' then
  local done = redis.call('get', KEYS[3])
  if done then return tonumber(done) end
end
local held = redis.pcall('hget', KEYS[1], ARGV[3])
if type(held) ~= 'string' then return nil end
local count = tonumber(held)
if count == nil then return nil end
if count > 1 then
  redis.call('hincrby', KEYS[1], ARGV[3], -1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[4])
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
"#
);

/// The plain `SET K v NX PX lease` plus a fencing token. KEYS: lock, token counter. ARGV:
/// value, lease ms. `{GRANTED, token}` or `{HELD, pttl}`; finding our own value (an earlier
/// attempt of this acquire whose answer was lost) is granted again.
pub(crate) static SIMPLE_LOCK: LazyLock<redis::Script> = acquire_script!(
    r#"
if redis.call('set', KEYS[1], ARGV[1], 'nx', 'px', ARGV[2]) then
  return {GRANTED, next_token(KEYS[2])}
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  return {GRANTED, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {HELD, redis.call('pttl', KEYS[1])}
"#
);

/// Compare-and-delete, then a wake-up for our waiters. KEYS: lock, channel. ARGV: value.
/// 1 if it was ours, nil if not (also for a key of another type).
pub(crate) static SIMPLE_RELEASE: LazyLock<Publishing> = publishing!(
    r#"
if redis.pcall('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], '0')
  return 1
end
return nil
"#
);

/// The watchdog's renewal of up to 100 holds of any kinds at once (Redisson renews up to 100
/// locks per script too; its single renewals are `HEXISTS` then `PEXPIRE`, as the first kind
/// here). ARGV: lease ms, then per hold its kind and its identity; KEYS: each hold's keys in turn:
///
/// - `h` (Redisson's hash: the mutex, the fair lock, a write hold): the lock; our field;
/// - `r` (a read hold, as Redisson's ReadLockTask): the lock and our timeout keys' prefix
///   (`{K}:F:rwlock_timeout`); our field F, whose count says how many timeout keys we have;
/// - `p` (a semaphore permit, expiring by the server's clock): the permit set and the permit
///   count key; our permit id;
/// - `s` (the simple layout, and Redlock's extension): the lock; our value.
///
/// One answer per hold, in order: 1 if it was ours and now runs for another lease, 0 if not (gone,
/// someone else's, a permit already expired, or a key of another type).
pub(crate) static RENEW: LazyLock<redis::Script> = script!(
    r#"
local lease = ARGV[1]
local now
local function renew_hash(lock, field)
  if redis.pcall('hexists', lock, field) ~= 1 then return 0 end
  redis.call('pexpire', lock, lease)
  return 1
end
local function renew_read(lock, timeouts, field)
  local n = redis.pcall('hget', lock, field)
  if type(n) ~= 'string' then return 0 end
  redis.call('pexpire', lock, lease)
  for i = tonumber(n), 1, -1 do
    redis.call('pexpire', timeouts .. ':' .. i, lease)
  end
  return 1
end
local function renew_permit(permits, count, id)
  if now == nil then
    local t = redis.call('time')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local expiry = redis.pcall('zscore', permits, id)
  if type(expiry) ~= 'string' or tonumber(expiry) <= now then return 0 end
  redis.call('zadd', permits, now + tonumber(lease), id)
  redis.call('pexpire', permits, lease)
  redis.call('pexpire', count, lease)
  return 1
end
local function renew_simple(lock, value)
  if redis.pcall('get', lock) ~= value then return 0 end
  redis.call('pexpire', lock, lease)
  return 1
end
local answers, k = {}, 1
for i = 2, #ARGV, 2 do
  local kind, id = ARGV[i], ARGV[i + 1]
  local ours
  if kind == 'h' then
    ours = renew_hash(KEYS[k], id)
    k = k + 1
  elseif kind == 'r' then
    ours = renew_read(KEYS[k], KEYS[k + 1], id)
    k = k + 2
  elseif kind == 'p' then
    ours = renew_permit(KEYS[k], KEYS[k + 1], id)
    k = k + 2
  elseif kind == 's' then
    ours = renew_simple(KEYS[k], id)
    k = k + 1
  else
    return redis.error_reply('RENEW: unknown kind ' .. tostring(kind))
  end
  answers[#answers + 1] = ours
end
return answers
"#
);

/// The kind of lock an acquire script takes, as a user names it (in errors); `None` for a
/// script that is no lock's (a job's write words its own WRONGTYPE).
pub(crate) fn kind_of(script: &redis::Script) -> Option<&'static str> {
    let is = |other: &LazyLock<redis::Script>| other.get_hash() == script.get_hash();
    let kinds: [(&LazyLock<redis::Script>, &str); 6] = [
        (&REDISSON_LOCK, "a mutex"),
        (&SIMPLE_LOCK, "a redis-py lock (layout=simple)"),
        (&READ_LOCK, "a read lock"),
        (&WRITE_LOCK, "a write lock"),
        (&SEMAPHORE_ACQUIRE, "a semaphore"),
        (&FAIR_LOCK, "a fair lock"),
    ];
    kinds.into_iter().find(|(k, _)| is(k)).map(|(_, name)| name)
}

/// Redisson RReadWriteLock read acquire plus a fencing token. KEYS: lock, the read field's
/// timeout key prefix (`{K}:F:rwlock_timeout`), token counter. ARGV: lease ms, F (the read
/// field), the handle's write field in progress (or `-`), mode as [`REDISSON_LOCK`].
pub(crate) static READ_LOCK: LazyLock<redis::Script> = acquire_script!(
    r#"
local again = redis.call('hexists', KEYS[1], ARGV[2]) == 1
if again and ARGV[4] == 'n' then return {GRANTED, tonumber(redis.call('get', KEYS[3]) or '0')} end
if not again and ARGV[4] == 'r' then return {GONE, 0} end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false and redis.call('exists', KEYS[1]) == 1 then
  return {HELD, redis.call('pttl', KEYS[1])} -- not a read/write lock's hash: someone else's
end
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1, 'px', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {GRANTED, next_token(KEYS[3])}
end
if mode == 'read' or again or redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':' .. n, 1, 'px', ARGV[1])
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
  if again then return {REENTERED, 0} end
  if mode == 'write' then return {GRANTED, tonumber(redis.call('get', KEYS[3]) or '0')} end
  return {GRANTED, next_token(KEYS[3])}
end
return {HELD, redis.call('pttl', KEYS[1])}
"#
);

/// The start of both read/write unlocks: `mode` of the lock's hash; nil for a key of another
/// type, and for a lock already gone (after a wake-up for its waiters).
macro_rules! rw_mode {
    () => {
        r#"
local mode = redis.pcall('hget', KEYS[1], 'mode')
if type(mode) == 'table' then return nil end
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return nil
end"#
    };
}

/// Redisson RReadWriteLock read unlock. KEYS: lock, channel, this handle's timeout key prefix,
/// the lock's key prefix (`{K}`). ARGV: message, F. nil when not ours (also for a key of another
/// type), 0 when the lock remains (other holds), 1 when it was deleted (and the message
/// published).
pub(crate) static READ_UNLOCK: LazyLock<Publishing> = publishing!(
    rw_mode!(),
    r#"
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if left == 0 then redis.call('hdel', KEYS[1], ARGV[2]) end
redis.call('del', KEYS[3] .. ':' .. (left + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    local n = tonumber(redis.call('hget', KEYS[1], field))
    if type(n) == 'number' then
      for i = n, 1, -1 do
        longest = math.max(longest, redis.call('pttl', KEYS[4] .. ':' .. field .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return 0
  end
  if mode == 'write' then return 0 end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
"#
);

/// Redisson RReadWriteLock write acquire plus a fencing token. KEYS: lock, token counter.
/// ARGV: lease ms, the write field (`F:write`), mode. Answers as [`REDISSON_LOCK`].
pub(crate) static WRITE_LOCK: LazyLock<redis::Script> = acquire_script!(
    r#"
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  if ARGV[3] == 'n' then return {GRANTED, tonumber(redis.call('get', KEYS[2]) or '0')} end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
  return {REENTERED, 0}
end
if ARGV[3] == 'r' then return {GONE, 0} end
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {GRANTED, next_token(KEYS[2])}
end
return {HELD, redis.call('pttl', KEYS[1])}
"#
);

/// Redisson RReadWriteLock write unlock. KEYS: lock, channel. ARGV: message (`1`: wake every
/// waiter), lease ms, F's write field. nil when not ours (also for a key of another type), 0 when
/// a re-entrant hold remains, 1 when released (the lock deleted, or left to this handle's own
/// read holds).
pub(crate) static WRITE_UNLOCK: LazyLock<Publishing> = publishing!(
    rw_mode!(),
    r#"
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
redis.call('publish', KEYS[2], ARGV[1])
return 1
"#
);

/// Semaphore acquire plus a fencing token. KEYS: permit set, permit count key, token counter.
/// ARGV: permits, permit id, lease ms. Expired permits (scored by the server clock) are dropped
/// first. `{GRANTED, token}` (also when the id is already in: this acquire's earlier attempt
/// whose answer was lost), `{HELD, ms until the first permit expires}` when all are taken,
/// `{OTHER_PERMITS, permits}` when the semaphore has another permit count.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<redis::Script> = acquire_script!(
    r#"
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local permits = redis.call('get', KEYS[2])
if permits ~= false and permits ~= ARGV[1] then return {OTHER_PERMITS, tonumber(permits)} end
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if redis.call('zscore', KEYS[1], ARGV[2]) then
  return {GRANTED, tonumber(redis.call('get', KEYS[3]) or '0')}
end
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('zadd', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('pexpire', KEYS[1], ARGV[3])
  redis.call('set', KEYS[2], ARGV[1], 'px', ARGV[3])
  return {GRANTED, next_token(KEYS[3])}
end
local first = redis.call('zrange', KEYS[1], 0, 0, 'withscores')
return {HELD, math.max(1, tonumber(first[2]) - now)}
"#
);

/// Semaphore release. KEYS: permit set, permit count key, channel. ARGV: permit id. 1 if it was
/// ours, nil if not: not there, or there but expired by the server's clock (not pruned yet, but
/// no longer ours either), or the key is of another type. The last permit out deletes both keys.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<Publishing> = publishing!(
    r#"
local expiry = redis.pcall('zscore', KEYS[1], ARGV[1])
if type(expiry) == 'table' then return nil end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local removed = redis.call('zrem', KEYS[1], ARGV[1])
if redis.call('zcard', KEYS[1]) == 0 then
  redis.call('del', KEYS[1], KEYS[2])
end
redis.call('publish', KEYS[3], '1')
if removed == 0 then return nil end
if tonumber(expiry) <= now then return nil end
return 1
"#
);

/// Drops queue heads whose waiter stopped refreshing its place (judged by the server clock).
/// Needs `now` (server ms) and KEYS[2] (queue), KEYS[3] (liveness zset).
macro_rules! prune_dead_heads {
    () => {
        r#"
local function server_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function prune(now)
  while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then return false end
    local alive = redis.call('zscore', KEYS[3], head)
    if alive and tonumber(alive) > now then return head end
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], head)
  end
end
"#
    };
}

/// Fair lock acquire. KEYS: lock, queue, liveness zset, token counter. ARGV: lease ms, F,
/// enqueue (`1`: join the queue if not granted; `0`: try only), mode as [`REDISSON_LOCK`].
/// Answers `{GRANTED, token, 0, 0}`, `{REENTERED, 0, 0, 0}`, `{GONE, 0, 0, 0}`, or `{HELD,
/// pttl, position, queue length}` (pttl 0 when the lock is free but others are ahead). A waiter's
/// place lasts one lease from its last attempt, by the server's clock; a waiter that stops
/// trying loses it.
pub(crate) static FAIR_LOCK: LazyLock<redis::Script> = acquire_script!(
    prune_dead_heads!(),
    r#"
local now = server_ms()
local head = prune(now)
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  if ARGV[4] == 'n' then return {GRANTED, tonumber(redis.call('get', KEYS[4]) or '0'), 0, 0} end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {REENTERED, 0, 0, 0}
end
if ARGV[4] == 'r' then return {GONE, 0, 0, 0} end
if redis.call('exists', KEYS[1]) == 0 and (head == false or head == ARGV[2]) then
  if head == ARGV[2] then
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], ARGV[2])
  end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {GRANTED, next_token(KEYS[4]), 0, 0}
end
if ARGV[3] == '1' then
  if redis.call('zadd', KEYS[3], now + tonumber(ARGV[1]), ARGV[2]) == 1 then
    redis.call('rpush', KEYS[2], ARGV[2])
  end
  redis.call('pexpire', KEYS[2], ARGV[1])
  redis.call('pexpire', KEYS[3], ARGV[1])
end
local pos = redis.call('lpos', KEYS[2], ARGV[2])
local ttl = redis.call('pttl', KEYS[1])
if ttl == -2 then ttl = 0 end
return {HELD, ttl, (pos or -1) + 1, redis.call('llen', KEYS[2])}
"#
);

/// Fair lock release. KEYS: lock, queue, liveness zset, latch, channel prefix. ARGV: lease ms,
/// F, latch ms, retry. Codes and latch as [`REDISSON_UNLOCK`]; the final release wakes the
/// first live waiter only (on `<channel prefix>:<its id>`).
pub(crate) static FAIR_UNLOCK: LazyLock<Publishing> = publishing!(
    prune_dead_heads!(),
    r#"
if ARGV[4] == '1' then
  local done = redis.call('get', KEYS[4])
  if done then return tonumber(done) end
end
if redis.pcall('hexists', KEYS[1], ARGV[2]) ~= 1 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  redis.call('set', KEYS[4], 0, 'px', ARGV[3])
  return 0
end
redis.call('del', KEYS[1])
local head = prune(server_ms())
if head then redis.call('publish', KEYS[5] .. ':' .. head, '0') end
return 1
"#
);

/// A waiter leaves the fair queue (gave up, or was cancelled). KEYS: lock, queue, liveness zset,
/// channel prefix. ARGV: F. If the lock is free, the new first waiter is woken.
pub(crate) static FAIR_LEAVE: LazyLock<Publishing> = publishing!(
    prune_dead_heads!(),
    r#"
redis.call('lrem', KEYS[2], 0, ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 then
  local head = prune(server_ms())
  if head then redis.call('publish', KEYS[4] .. ':' .. head, '0') end
end
return 1
"#
);

/// An election's leader (distlock's layout over Redisson's RLock: the holder's hash has a
/// `value` field beside its `<uuid>:<n>` field). KEYS: lock, token counter. `{field, value,
/// epoch}` (the epoch is the counter: the last grant's token), or nil with no holder.
pub(crate) static LEADER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local f = redis.call('hgetall', KEYS[1])
local holder, value = false, ''
for i = 1, #f, 2 do
  if f[i] == 'value' then value = f[i + 1] else holder = f[i] end
end
if not holder then return false end
return {holder, value, redis.call('get', KEYS[2]) or '0'}
"#,
    )
});

/// An election leader's new value, put only while its hold (field) is there and its token is the
/// last one granted. KEYS: lock, token counter. ARGV: field, value, token. 1 if put, else 0.
pub(crate) static PROCLAIM: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 and redis.call('get', KEYS[2]) == ARGV[3] then
  redis.call('hset', KEYS[1], 'value', ARGV[2])
  return 1
end
return 0
"#,
    )
});
