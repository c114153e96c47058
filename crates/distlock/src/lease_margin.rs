//! The one margin rule: how much of a lease a holder does not count on.
//!
//! A guard's lease deadline is the send time of the last request the server confirmed, plus the
//! lease, less this margin:
//!
//! ```text
//! margin = the server's reporting delay + 2 % of the lease + 2 ms
//! ```
//!
//! - **2 % of the lease** covers the difference in rate between the client's clock and the
//!   server's (NTP keeps it under 0.05 %), with room for timers that fire late.
//! - **2 ms** covers scheduling between the reply and the moment the deadline is taken.
//! - **The server's reporting delay** is the time by which the server that runs the lease's timer
//!   may have heard from us *earlier* than the server we talk to answered, so that its timer
//!   started sooner than our send:
//!   - ZooKeeper: **a quarter of the session timeout**. Only the leader expires sessions, and a
//!     follower passes its clients' activity on to the leader with its replies to the leader's
//!     pings, every half tick; the minimum session timeout is two ticks, so that delay is at
//!     most a quarter of any timeout the server accepts (docs/design.md, "The lease deadline").
//!   - Redis, PostgreSQL, MariaDB, etcd: **none**. The timer starts when the server handles our
//!     request (Redis `PEXPIRE`, etcd's leader on a keep-alive, the SQL server's session), which
//!     is after we sent it, so the send time is already a lower bound.
//!   - SQLite: **none**. The lease's end is written in the row from the clock of the process
//!     that wrote it; the processes sharing one database file share one machine's clock.

use std::time::Duration;

/// The part of `lease` a holder does not count on, given the server's reporting delay.
pub(crate) fn margin(lease: Duration, server_delay: Duration) -> Duration {
    server_delay + lease / 50 + Duration::from_millis(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_per_backend() {
        let ms = Duration::from_millis;
        assert_eq!(margin(ms(10_000), Duration::ZERO), ms(202));
        assert_eq!(margin(ms(4_000), ms(4_000) / 4), ms(1_082));
    }
}
