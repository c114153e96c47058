//! The one lock contract ([`crate::contract`]) on MariaDB's `GET_LOCK` mutex; other kinds are refused.

use super::{Client, Mutex, MutexGuard};

crate::contract::mutex_only_backend!(Client, "mysql", Mutex, MutexGuard, "MariaDB's GET_LOCK gives the mutex only");
