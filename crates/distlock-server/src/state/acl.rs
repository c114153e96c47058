//! Access control: checking a session's permissions and validating the ACLs of writes.

use super::{OpResult, State};
use crate::proto::{err, perms, Acl};
use std::collections::HashSet;
use std::net::IpAddr;

impl State {
    // ---- access control ---------------------------------------------------------------------

    pub(super) fn allowed(&self, sid: i64, acl: &[Acl], perm: i32) -> bool {
        let session = self.sessions.get(&sid);
        if session.is_some_and(|s| s.auth.iter().any(|(scheme, _)| scheme == "super")) {
            return true;
        }
        acl.iter().any(|a| {
            a.perms & perm != 0
                && match a.scheme.as_str() {
                    "world" => a.id == "anyone",
                    "ip" => session.and_then(|s| s.addr).is_some_and(|ip| ip_matches(&a.id, ip)),
                    scheme => session.is_some_and(|s| s.auth.iter().any(|(sc, id)| sc == scheme && *id == a.id)),
                }
        })
    }

    /// Validates ACLs of a create/setACL, expanding the `auth` scheme to the session's ids.
    ///
    /// As ZooKeeper's `fixupACL` does, the list as sent is first rid of repeated entries (same
    /// perms, scheme and id; the first of each is kept, in order). Only the list as sent: entries
    /// that the `auth` expansion happens to repeat stay, as they do in ZooKeeper.
    pub(super) fn fix_acl(&self, sid: i64, acl: Vec<Acl>) -> OpResult<Vec<Acl>> {
        let acl = without_repeats(acl);
        if acl.is_empty() {
            return Err(err::INVALID_ACL);
        }
        let mut out = Vec::new();
        for a in acl {
            if a.perms & !perms::ALL != 0 {
                return Err(err::INVALID_ACL);
            }
            match a.scheme.as_str() {
                "world" if a.id == "anyone" => out.push(a),
                "auth" => {
                    let ids: Vec<Acl> = self
                        .sessions
                        .get(&sid)
                        .map(|s| {
                            s.auth
                                .iter()
                                .map(|(sc, id)| Acl { perms: a.perms, scheme: sc.clone(), id: id.clone() })
                                .collect()
                        })
                        .unwrap_or_default();
                    if ids.is_empty() {
                        return Err(err::INVALID_ACL);
                    }
                    out.extend(ids);
                }
                "digest" if a.id.contains(':') => out.push(a),
                "ip" if a.id.split('/').next().is_some_and(|ip| ip.parse::<IpAddr>().is_ok()) => out.push(a),
                _ => return Err(err::INVALID_ACL),
            }
        }
        Ok(out)
    }
}

/// `acl` with every entry equal to an earlier one left out, order otherwise kept (ZooKeeper's
/// `PrepRequestProcessor.removeDuplicates`). A frame may carry tens of thousands of entries, so
/// earlier ones are looked up in a set rather than by scanning the list for each.
fn without_repeats(acl: Vec<Acl>) -> Vec<Acl> {
    if acl.len() < 2 {
        return acl;
    }
    let mut seen: HashSet<(i32, &str, &str)> = HashSet::with_capacity(acl.len());
    let first: Vec<bool> = acl.iter().map(|a| seen.insert((a.perms, a.scheme.as_str(), a.id.as_str()))).collect();
    drop(seen); // it borrows from `acl`, which is taken apart next
    acl.into_iter().zip(first).filter_map(|(a, keep)| keep.then_some(a)).collect()
}

fn ip_matches(spec: &str, ip: IpAddr) -> bool {
    let (addr, bits) = match spec.split_once('/') {
        Some((a, b)) => (a, b.parse::<u32>().ok()),
        None => (spec, None),
    };
    match (addr.parse::<IpAddr>(), ip) {
        (Ok(IpAddr::V4(a)), IpAddr::V4(b)) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            (u32::from(a) & mask) == (u32::from(b) & mask)
        }
        (Ok(a), b) => a == b,
        _ => false,
    }
}
