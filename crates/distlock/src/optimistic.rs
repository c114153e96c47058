//! Optimistic locking with a version column, the first technique, without a lock: read the row and its
//! version, compute the new value, write it only if the version is still the one read
//! (`UPDATE … SET …, version = version + 1 WHERE id = ? AND version = ?`), and when the write
//! changed nothing, someone else got there first: read again and retry, a bounded number of times.
//!
//! No lock is held at all, so nothing can be left behind and nobody waits; the price is retries
//! under contention. The loop is written once here; the statements are the caller's, for any
//! database (see `examples/optimistic_account.rs` for PostgreSQL).

/// How an optimistic update ended, when it did not succeed.
///
/// # Examples
///
/// ```
/// use distlock::optimistic::OptimisticError;
/// let e: OptimisticError<std::io::Error> = OptimisticError::Conflict { attempts: 3 };
/// assert!(e.to_string().contains("3 attempts"));
/// ```
#[derive(Debug, thiserror::Error)]
pub enum OptimisticError<E: std::error::Error + 'static> {
    /// Every attempt found the version changed by someone else before its write.
    #[error("gave up after {attempts} attempts: the row's version changed before every write (conflicting updates)")]
    Conflict {
        /// How many read-compute-write rounds were tried.
        attempts: u32,
    },
    /// A read or a write failed.
    #[error(transparent)]
    Failed(#[from] E),
}

/// A successful optimistic update.
///
/// # Examples
///
/// ```
/// let u = distlock::optimistic::Updated { value: 1050, version: 3, attempts: 2 };
/// assert_eq!(u.attempts - 1, 1, "one conflict, one retry");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Updated<T> {
    /// The value written.
    pub value: T,
    /// The row's version after the write (the version read + 1).
    pub version: i64,
    /// Rounds it took: 1 without a conflict.
    pub attempts: u32,
}

/// Runs read → compute → conditional write until a write succeeds, at most `max_attempts`
/// rounds (at least 1).
///
/// - `read()` returns the current value and version;
/// - `compute(&value)` the new value, or `None` to stop without writing (a withdrawal the
///   balance cannot cover, say): the result is then `Ok(None)`;
/// - `write(&new, version_read)` writes `new` with version `version_read + 1` only where the
///   version is still `version_read`, and returns whether it did (one row updated).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use distlock::optimistic::optimistic_update;
/// use std::sync::Mutex;
/// let row = Mutex::new((1000i64, 1i64)); // (balance, version)
/// let updated = optimistic_update(
///     5,
///     || async { Ok::<_, std::io::Error>(*row.lock().unwrap()) },
///     |balance: &i64| Some(balance + 100),
///     |new: &i64, seen: i64| {
///         let mut r = row.lock().unwrap();
///         let ok = r.1 == seen;
///         if ok { *r = (*new, seen + 1); }
///         async move { Ok(ok) }
///     },
/// )
/// .await
/// .unwrap()
/// .unwrap();
/// assert_eq!((updated.value, updated.version, updated.attempts), (1100, 2, 1));
/// # }
/// ```
pub async fn optimistic_update<T, E, R, RF, C, W, WF>(
    max_attempts: u32,
    mut read: R,
    mut compute: C,
    mut write: W,
) -> Result<Option<Updated<T>>, OptimisticError<E>>
where
    E: std::error::Error + 'static,
    R: FnMut() -> RF,
    RF: std::future::Future<Output = Result<(T, i64), E>>,
    C: FnMut(&T) -> Option<T>,
    W: FnMut(&T, i64) -> WF,
    WF: std::future::Future<Output = Result<bool, E>>,
{
    let max_attempts = max_attempts.max(1);
    for attempt in 1..=max_attempts {
        let (value, version) = read().await?;
        let Some(new) = compute(&value) else { return Ok(None) };
        if write(&new, version).await? {
            return Ok(Some(Updated { value: new, version: version + 1, attempts: attempt }));
        }
        tracing::debug!(attempt, version, "optimistic update conflicted; reading again");
    }
    Err(OptimisticError::Conflict { attempts: max_attempts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test]
    async fn a_row_that_keeps_changing_is_a_conflict_after_the_bound() {
        let version = Cell::new(1i64);
        let writes = Cell::new(0u32);
        let r = optimistic_update(
            3,
            || {
                let v = version.get();
                async move { Ok::<_, std::io::Error>((10i64, v)) }
            },
            |x: &i64| Some(x + 1),
            |_: &i64, seen: i64| {
                writes.set(writes.get() + 1);
                version.set(seen + 1); // someone else wrote first, every time
                async { Ok(false) }
            },
        )
        .await;
        assert!(matches!(r, Err(OptimisticError::Conflict { attempts: 3 })), "{r:?}");
        assert_eq!(writes.get(), 3);
    }

    #[tokio::test]
    async fn computing_none_writes_nothing() {
        let r = optimistic_update(
            3,
            || async { Ok::<_, std::io::Error>((40i64, 7)) },
            |balance: &i64| (*balance >= 50).then(|| balance - 50),
            |_: &i64, _| async { panic!("nothing to write") },
        )
        .await
        .unwrap();
        assert_eq!(r, None);
    }
}
