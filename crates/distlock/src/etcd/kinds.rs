//! Which keys under a lock's prefix a recipe waits for, which it passes by, and which say the
//! name is in use as another kind of lock (pure logic: the queue reads, this decides).
//!
//! Every key of lock `name` is `name/<rest>`, and [`super::classify`] tells its lock and kind.
//! Two rules come from the contract ([`crate::Error::KindConflict`]):
//! - a mutex, a writer and a reader of one name are one lock: a mutex or writer waits for every
//!   older key of the name, a reader for every older one that is not a reader's;
//! - a semaphore is another kind: a key of the other kind older than ours refuses the acquire
//!   (of two conflicting keys, the later one sees the earlier in its create's read, so the two
//!   are never both held).
//!
//! A key of a longer name (`name/x/…` of lock `name/x`) is another lock and is passed by.

use etcd_client::KeyValue;

/// What a recipe's key is on its name's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A mutex, an election's candidate or a writer: waits for every older key of the name.
    Exclusive,
    /// A reader: waits for the older keys that are not readers'.
    Shared,
    /// A semaphore's permit: waits while `limit` older permits remain.
    Permit,
}

/// An older key as a recipe of some role sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Passed,
    Blocks,
    Conflict(&'static str),
}

fn seen(role: Role, name: &str, key: &[u8]) -> Seen {
    let key = String::from_utf8_lossy(key);
    let Some((parent, recipe, mode)) = super::classify(&key) else { return Seen::Passed };
    if parent != name {
        return Seen::Passed; // a longer name's key: another lock
    }
    match (role, recipe, mode) {
        (Role::Shared, "rwlock", "read") => Seen::Passed,
        (Role::Permit, "semaphore", _) => Seen::Blocks,
        (Role::Exclusive | Role::Shared, "semaphore", _) => Seen::Conflict("a semaphore"),
        (Role::Permit, "rwlock", "read") => Seen::Conflict("a read lock"),
        (Role::Permit, "rwlock", _) => Seen::Conflict("a write lock"),
        (Role::Permit, _, _) => Seen::Conflict("a mutex"),
        _ => Seen::Blocks,
    }
}

/// The key ranges `[start, end)` a recipe of `role` reads for `name`: every key under `name/`,
/// but for a reader the readers' own `name/read/…`, which never block it.
pub(crate) fn ranges(role: Role, name: &str) -> Vec<(String, String)> {
    // `0` is the byte after `/`: `name0` ends the prefix `name/`.
    let (dir, end) = (format!("{name}/"), format!("{name}0"));
    match role {
        Role::Shared => vec![(dir.clone(), format!("{dir}read/")), (format!("{dir}read0"), end)],
        _ => vec![(dir, end)],
    }
}

/// What the keys older than ours say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing older blocks us.
    Free,
    /// Wait for this key's deletion (a permit: any deletion under this prefix).
    Wait(Vec<u8>),
    /// The name is in use as this other kind.
    Conflict(&'static str),
    /// The pages read end before a key that decides: read the keys created before this
    /// revision.
    Unsure(i64),
}

/// One range's answer: its keys with their create revisions, and whether it stopped at its
/// limit (more may lie beyond).
pub(crate) struct Page<'a> {
    pub(crate) keys: Vec<(&'a [u8], i64)>,
    pub(crate) full: bool,
}

impl<'a> Page<'a> {
    /// The keys etcd answered a read of at most `limit` keys with (`0`: no limit).
    pub(crate) fn of(kvs: &'a [KeyValue], limit: usize) -> Page<'a> {
        Page {
            keys: kvs.iter().map(|kv| (kv.key(), kv.create_revision())).collect(),
            full: limit > 0 && kvs.len() >= limit,
        }
    }
}

/// Decides for lock `name` and `role` (`limit` permits for a semaphore, else 1) from the pages
/// read, keeping only keys created before `rev` (ours). A mutex's, writer's or reader's pages
/// are newest first; a semaphore's oldest first (and all of them, or it is unsure).
pub(crate) fn decide<'a>(role: Role, name: &str, limit: u32, pages: &[Page<'a>], rev: i64) -> Verdict {
    let older = |p: &Page<'a>| p.keys.iter().copied().filter(|&(_, r)| r < rev).collect::<Vec<_>>();
    if role == Role::Permit {
        if pages.iter().any(|p| p.full) {
            return Verdict::Unsure(rev);
        }
        let mut permits = 0;
        for (key, _) in pages.iter().flat_map(older) {
            match seen(role, name, key) {
                Seen::Conflict(what) => return Verdict::Conflict(what),
                Seen::Blocks => permits += 1,
                Seen::Passed => {}
            }
        }
        return if permits >= limit { Verdict::Wait(format!("{name}/").into_bytes()) } else { Verdict::Free };
    }
    // Keys down to the newest end of the full pages are all known; below it, only the pages
    // that were not full are.
    let full_end = pages.iter().filter(|p| p.full).filter_map(|p| p.keys.iter().map(|&(_, r)| r).min()).max();
    let mut keys: Vec<(&[u8], i64)> = pages.iter().flat_map(older).collect();
    keys.sort_by_key(|&(_, r)| std::cmp::Reverse(r));
    for (key, _) in keys.into_iter().take_while(|&(_, r)| full_end.is_none_or(|end| r >= end)) {
        match seen(role, name, key) {
            Seen::Blocks => return Verdict::Wait(key.to_vec()),
            Seen::Conflict(what) => return Verdict::Conflict(what),
            Seen::Passed => {}
        }
    }
    match full_end {
        Some(end) => Verdict::Unsure(end.min(rev)),
        None => Verdict::Free,
    }
}

/// How many of these keys are permits of semaphore `name` (a waiter's recount).
pub(crate) fn permits(name: &str, keys: &[KeyValue]) -> usize {
    keys.iter().filter(|kv| seen(Role::Permit, name, kv.key()) == Seen::Blocks).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen_as(role: Role, key: &str) -> Seen {
        seen(role, "orders", key.as_bytes())
    }

    #[test]
    fn each_role_sees_each_kind_of_key_by_the_contract() {
        let (mutex, permit) = ("orders/694d7d1e5c8a1b0f", "orders/694d7d1e5c8a1b0f_0000000000000001");
        let (reader, writer) = ("orders/read/00000000000000a1", "orders/write/00000000000000b2");
        let nested = ["orders/x/694d7d1e5c8a1b0f", "orders/x/read/00000000000000a1", "orders/a_b/1f"];
        for role in [Role::Exclusive, Role::Shared, Role::Permit] {
            for key in nested {
                assert_eq!(seen_as(role, key), Seen::Passed, "{role:?} {key}");
            }
        }
        assert_eq!(seen_as(Role::Exclusive, mutex), Seen::Blocks);
        assert_eq!(seen_as(Role::Exclusive, reader), Seen::Blocks);
        assert_eq!(seen_as(Role::Exclusive, writer), Seen::Blocks);
        assert_eq!(seen_as(Role::Exclusive, permit), Seen::Conflict("a semaphore"));
        assert_eq!(seen_as(Role::Shared, mutex), Seen::Blocks, "a mutex keeps readers out");
        assert_eq!(seen_as(Role::Shared, writer), Seen::Blocks);
        assert_eq!(seen_as(Role::Shared, reader), Seen::Passed);
        assert_eq!(seen_as(Role::Shared, permit), Seen::Conflict("a semaphore"));
        assert_eq!(seen_as(Role::Permit, permit), Seen::Blocks);
        assert_eq!(seen_as(Role::Permit, mutex), Seen::Conflict("a mutex"));
        assert_eq!(seen_as(Role::Permit, reader), Seen::Conflict("a read lock"));
        assert_eq!(seen_as(Role::Permit, writer), Seen::Conflict("a write lock"));
    }

    fn page<'a>(keys: &[(&'a str, i64)], full: bool) -> Page<'a> {
        Page { keys: keys.iter().map(|&(k, r)| (k.as_bytes(), r)).collect(), full }
    }

    #[test]
    fn a_waiter_passes_longer_names_and_pages_on_when_unsure() {
        let ours = 100;
        // Only a longer name's key before ours, in a full page: read on below it.
        let p = [page(&[("orders/1f", 100), ("orders/x/2e", 90)], true)];
        assert_eq!(decide(Role::Exclusive, "orders", 1, &p, ours), Verdict::Unsure(90));
        let p = [page(&[("orders/1f", 100), ("orders/x/2e", 90)], false)];
        assert_eq!(decide(Role::Exclusive, "orders", 1, &p, ours), Verdict::Free);
        let p = [page(&[("orders/x/2e", 90), ("orders/3d", 80)], false)];
        assert_eq!(decide(Role::Exclusive, "orders", 1, &p, ours), Verdict::Wait(b"orders/3d".to_vec()));
        // A reader's two ranges: the newer blocker wins; below a full page's end nothing decides.
        let p = [page(&[("orders/3d", 80)], false), page(&[("orders/write/00000000000000b2", 95)], false)];
        assert_eq!(
            decide(Role::Shared, "orders", 1, &p, ours),
            Verdict::Wait(b"orders/write/00000000000000b2".to_vec())
        );
        let p = [
            page(&[("orders/x/1", 96), ("orders/x/2", 94)], true),
            page(&[("orders/write/00000000000000b2", 90)], false),
        ];
        assert_eq!(decide(Role::Shared, "orders", 1, &p, ours), Verdict::Unsure(94));
        // A permit counts permits only, and refuses a lock's key.
        let sem = |k: &'static str, r| (k, r);
        let p = [page(&[sem("s/a_01", 1), sem("s/x/1f", 2), sem("s/b_02", 3)], false)];
        assert_eq!(decide(Role::Permit, "s", 2, &p, ours), Verdict::Wait(b"s/".to_vec()));
        assert_eq!(decide(Role::Permit, "s", 3, &p, ours), Verdict::Free);
        let p = [page(&[sem("s/a_01", 1), sem("s/1f", 2)], false)];
        assert_eq!(decide(Role::Permit, "s", 3, &p, ours), Verdict::Conflict("a mutex"));
        assert_eq!(decide(Role::Permit, "s", 3, &[page(&[], true)], ours), Verdict::Unsure(ours));
    }

    #[test]
    fn a_readers_ranges_leave_out_only_the_readers_keys() {
        let r = ranges(Role::Shared, "o");
        let within = |k: &str| r.iter().any(|(s, e)| k >= s.as_str() && k < e.as_str());
        assert!(within("o/1f") && within("o/write/00000000000000b2") && within("o/read") && within("o/readx/1"));
        assert!(!within("o/read/00000000000000a1") && !within("o0") && !within("o/"[..1].as_ref()));
        assert_eq!(ranges(Role::Exclusive, "o"), vec![("o/".to_string(), "o0".to_string())]);
    }
}
