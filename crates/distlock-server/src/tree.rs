//! The data tree and the primitive mutations every write is made of (also the log format).

use crate::proto::{Acl, Stat};
pub use crate::proto::{Data, CONTAINER_OWNER, TTL_MASK};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// The length a stat reports for `data` (0 for null).
pub fn data_len(data: &Data) -> i32 {
    data.as_ref().map_or(0, |d| d.len() as i32)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Node {
    pub data: Data,
    /// Shared, like the data: a copy of the tree shares every node's ACL.
    pub acl: Arc<Vec<Acl>>,
    pub stat: Stat,
    pub children: BTreeSet<String>,
}

impl Node {
    /// The session owning this node, if it is ephemeral (not container or TTL).
    pub fn ephemeral_session(&self) -> Option<i64> {
        let o = self.stat.ephemeral_owner;
        if o == 0 || o == CONTAINER_OWNER || (o & TTL_MASK) == TTL_MASK {
            None
        } else {
            Some(o)
        }
    }

    pub fn is_container(&self) -> bool {
        self.stat.ephemeral_owner == CONTAINER_OWNER
    }

    pub fn ttl_ms(&self) -> Option<i64> {
        let o = self.stat.ephemeral_owner;
        (o != CONTAINER_OWNER && (o & TTL_MASK) == TTL_MASK).then_some(o & !TTL_MASK)
    }
}

/// A primitive change to the tree or the session table. A write request becomes a list of
/// these, applied together under one zxid and logged as one transaction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Mutation {
    Create {
        path: String,
        #[serde(with = "data_text")]
        data: Data,
        acl: Vec<Acl>,
        stat: Stat,
    },
    Delete {
        path: String,
        zxid: i64,
    },
    SetData {
        path: String,
        #[serde(with = "data_text")]
        data: Data,
        zxid: i64,
        time: i64,
    },
    SetAcl {
        path: String,
        acl: Vec<Acl>,
    },
    OpenSession {
        id: i64,
        password: Vec<u8>,
        timeout_ms: i32,
    },
    CloseSession {
        id: i64,
    },
}

/// How node data is written in the log: base64 text (null stays null). Logs of earlier versions
/// wrote arrays of numbers, four times longer; they are still read.
mod data_text {
    use super::Data;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &Data, s: S) -> Result<S::Ok, S::Error> {
        match data {
            Some(d) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(d)),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        Text(String),
        Numbers(Vec<u8>),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Data, D::Error> {
        Ok(match Option::<Form>::deserialize(d)? {
            None => None,
            Some(Form::Numbers(v)) => Some(v.into()),
            Some(Form::Text(t)) => {
                Some(base64::engine::general_purpose::STANDARD.decode(t).map_err(serde::de::Error::custom)?.into())
            }
        })
    }
}

pub fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => "/",
    }
}

pub fn name_of(path: &str) -> &str {
    &path[path.rfind('/').map_or(0, |i| i + 1)..]
}

pub fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// Validates a client path as ZooKeeper does (PathUtils.validatePath).
pub fn valid_path(path: &str, sequential: bool) -> bool {
    if !path.starts_with('/') {
        return false;
    }
    if path == "/" {
        return true;
    }
    if path.ends_with('/') && !sequential {
        return false;
    }
    let body = if sequential && path.ends_with('/') { &path[1..path.len() - 1] } else { &path[1..] };
    for seg in body.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return false;
        }
        if seg.chars().any(|c| c == '\0' || ('\u{1}'..='\u{1f}').contains(&c) || ('\u{7f}'..='\u{9f}').contains(&c)) {
            return false;
        }
    }
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tree {
    pub nodes: HashMap<String, Node>,
}

/// The nodes every server starts with, which no client may delete (ZooKeeper's special paths).
pub fn is_system_path(path: &str) -> bool {
    matches!(path, "/" | "/zookeeper" | "/zookeeper/config" | "/zookeeper/quota")
}

impl Default for Tree {
    /// The tree ZooKeeper starts with, stat for stat: `/zookeeper` with `quota` and `config`, the
    /// latter read-only to everyone.
    fn default() -> Self {
        let open = vec![Acl { perms: crate::proto::perms::ALL, scheme: "world".into(), id: "anyone".into() }];
        let read_only = vec![Acl { perms: crate::proto::perms::READ, scheme: "world".into(), id: "anyone".into() }];
        let mut nodes = HashMap::new();
        let mk = |children: &[&str], acl: &Vec<Acl>, creates: i32, aversion: i32| Node {
            data: Some(Arc::from(&[][..])),
            acl: Arc::new(acl.clone()),
            stat: Stat { num_children: children.len() as i32, cversion: creates, aversion, ..Stat::default() },
            children: children.iter().map(|c| c.to_string()).collect(),
        };
        nodes.insert("/".to_string(), mk(&["zookeeper"], &open, 0, 0));
        nodes.insert("/zookeeper".to_string(), mk(&["config", "quota"], &open, 0, 0));
        nodes.insert("/zookeeper/config".to_string(), mk(&[], &read_only, 0, -1));
        nodes.insert("/zookeeper/quota".to_string(), mk(&[], &open, 0, 0));
        Tree { nodes }
    }
}

impl Tree {
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// Applies a tree mutation (session mutations are handled by the caller).
    pub fn apply(&mut self, m: &Mutation) {
        match m {
            Mutation::Create { path, data, acl, stat } => {
                let parent = parent_of(path).to_string();
                if let Some(p) = self.nodes.get_mut(&parent) {
                    p.children.insert(name_of(path).to_string());
                    p.stat.cversion = p.stat.cversion.wrapping_add(1);
                    p.stat.pzxid = stat.czxid;
                    p.stat.num_children = p.children.len() as i32;
                }
                self.nodes.insert(
                    path.clone(),
                    Node { data: data.clone(), acl: Arc::new(acl.clone()), stat: *stat, children: BTreeSet::new() },
                );
            }
            Mutation::Delete { path, zxid } => {
                self.nodes.remove(path);
                if let Some(p) = self.nodes.get_mut(parent_of(path)) {
                    p.children.remove(name_of(path));
                    // `cversion` counts creates only, as ZooKeeper stores it: clients are shown
                    // creates + deletes (see `proto::Writer::stat`), and a sequential create is
                    // numbered by the creates alone.
                    p.stat.pzxid = *zxid;
                    p.stat.num_children = p.children.len() as i32;
                }
            }
            Mutation::SetData { path, data, zxid, time } => {
                if let Some(n) = self.nodes.get_mut(path) {
                    n.data = data.clone();
                    n.stat.version = n.stat.version.wrapping_add(1);
                    n.stat.mzxid = *zxid;
                    n.stat.mtime = *time;
                    n.stat.data_length = data_len(data);
                }
            }
            Mutation::SetAcl { path, acl } => {
                if let Some(n) = self.nodes.get_mut(path) {
                    n.acl = Arc::new(acl.clone());
                    n.stat.aversion = n.stat.aversion.wrapping_add(1);
                }
            }
            Mutation::OpenSession { .. } | Mutation::CloseSession { .. } => {}
        }
    }

    /// Number of descendants of `path` (not counting itself).
    pub fn descendants(&self, path: &str) -> usize {
        // Iterative: a deep tree must not overflow the stack.
        let mut count = 0;
        let mut stack = vec![path.to_string()];
        while let Some(p) = stack.pop() {
            if let Some(n) = self.nodes.get(&p) {
                count += n.children.len();
                stack.extend(n.children.iter().map(|c| child_path(&p, c)));
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_data_is_text_and_old_number_arrays_still_read() {
        let m = Mutation::SetData { path: "/a".into(), data: Some(Arc::from(&b"hi"[..])), zxid: 1, time: 2 };
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""data":"aGk=""#), "{json}");
        let old = r#"{"SetData":{"path":"/a","data":[104,105],"zxid":1,"time":2}}"#;
        let null = r#"{"SetData":{"path":"/a","data":null,"zxid":1,"time":2}}"#;
        for (text, want) in [(json.as_str(), Some(&b"hi"[..])), (old, Some(&b"hi"[..])), (null, None)] {
            match serde_json::from_str::<Mutation>(text).unwrap() {
                Mutation::SetData { data, .. } => assert_eq!(data.as_deref(), want, "{text}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn paths() {
        assert_eq!(parent_of("/a/b"), "/a");
        assert_eq!(parent_of("/a"), "/");
        assert_eq!(name_of("/a/b"), "b");
        assert!(valid_path("/a/b", false));
        assert!(!valid_path("a", false));
        assert!(!valid_path("/a/", false));
        assert!(valid_path("/a/", true));
        assert!(!valid_path("/a//b", false));
        assert!(!valid_path("/a/./b", false));
    }

    #[test]
    fn create_and_delete_update_the_parent() {
        let mut t = Tree::default();
        let stat = Stat { czxid: 5, mzxid: 5, pzxid: 5, ..Stat::default() };
        t.apply(&Mutation::Create { path: "/x".into(), data: Some(Arc::from(&b"d"[..])), acl: vec![], stat });
        let root = t.get("/").unwrap();
        assert_eq!((root.stat.cversion, root.stat.pzxid, root.stat.num_children), (1, 5, 2));
        t.apply(&Mutation::Delete { path: "/x".into(), zxid: 6 });
        let root = t.get("/").unwrap();
        assert_eq!((root.stat.cversion, root.stat.pzxid, root.stat.num_children), (1, 6, 1));
    }
}
