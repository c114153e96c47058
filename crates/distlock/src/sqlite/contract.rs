//! The one lock contract ([`crate::contract`]) on SQLite's lease-table mutex; other kinds are refused.

use super::{Client, Mutex, MutexGuard};

crate::contract::mutex_only_backend!(Client, "sqlite", Mutex, MutexGuard, "the SQLite lease table has the mutex only");
