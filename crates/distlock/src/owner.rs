//! What distlock writes into its lock nodes: who holds them.

use serde::{Deserialize, Serialize};

/// The owner record written as the data of every lock node distlock creates, so a person (or
/// `distlock inspect`) can see who holds or waits for a lock.
///
/// Stored as compact JSON, e.g. `{"host":"web-1","pid":4242,"client":"distlock 0.1.0"}`.
/// Foreign nodes (Curator writes its IP address as text) do not parse; tools show their raw
/// data instead.
///
/// # Examples
///
/// ```
/// use distlock::Owner;
/// let me = Owner::current();
/// let parsed = Owner::parse(&me.encode()).unwrap();
/// assert_eq!(parsed.pid, std::process::id());
/// assert!(Owner::parse(b"10.0.0.7").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Host name of the owning process.
    pub host: String,
    /// Process id of the owning process.
    pub pid: u32,
    /// Client library and version.
    pub client: String,
    /// For a semaphore's lease: the semaphore's permit count, as its holder sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
}

impl Owner {
    /// The owner record for this process.
    pub fn current() -> Owner {
        let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".into());
        Owner {
            host,
            pid: std::process::id(),
            client: format!("distlock {}", env!("CARGO_PKG_VERSION")),
            permits: None,
        }
    }

    /// Serializes the record as node data.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("owner record serializes")
    }

    /// Parses node data written by distlock; `None` for anything else.
    pub fn parse(data: &[u8]) -> Option<Owner> {
        serde_json::from_slice(data).ok()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} pid {}", self.host, self.pid)
    }
}
