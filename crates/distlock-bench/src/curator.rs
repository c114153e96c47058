//! Apache Curator beside distlock in `distlock bench --curator`: a small Java program
//! (`peers/CuratorBench.java`, built into distlock-bench and compiled on first use against Debian's
//! Curator jars) that runs InterProcessMutex cycles on command, so that both are measured on the
//! same server, through the same proxy, in turns.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const SOURCE: &str = include_str!("../peers/CuratorBench.java");

/// A running Curator peer.
pub(crate) struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

/// One contended run of the peer.
pub(crate) struct Contended {
    pub handoffs: u64,
    pub elapsed: Duration,
    pub min: u64,
    pub max: u64,
}

fn classpath() -> anyhow::Result<String> {
    distlock_faults::peers::curator_classpath().map_err(|missing| {
        anyhow::anyhow!(
            "--curator: {missing} is missing (install Debian's libcurator-recipes-java, libslf4j-java and zookeeper)"
        )
    })
}

/// Compiles the peer once per version of its source (kept in the temporary directory).
async fn compiled(cp: &str) -> anyhow::Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    SOURCE.hash(&mut h);
    let dir = std::env::temp_dir().join(format!("distlock-curator-bench-{:016x}", h.finish()));
    if dir.join("CuratorBench.class").exists() {
        return Ok(dir);
    }
    let work = std::env::temp_dir().join(format!("distlock-curator-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&work)?;
    let src = work.join("CuratorBench.java");
    std::fs::write(&src, SOURCE)?;
    let out = Command::new("javac").arg("-d").arg(&work).args(["-cp", cp]).arg(&src).output().await.map_err(|e| {
        anyhow::anyhow!("--curator: cannot run javac ({e}); install a JDK (Debian: default-jdk-headless)")
    })?;
    anyhow::ensure!(out.status.success(), "--curator: javac failed: {}", String::from_utf8_lossy(&out.stderr));
    // Another run may have finished first: either copy is the same.
    if std::fs::rename(&work, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(dir)
}

impl Curator {
    /// Compiles (if needed) and starts the peer, connected to `connect` (ZooKeeper's connect
    /// string: `host:port[/chroot]`).
    pub(crate) async fn start(connect: &str) -> anyhow::Result<Curator> {
        let cp = classpath()?;
        let classes = compiled(&cp).await?;
        let mut child = Command::new("java")
            .args(["-Xmx512m", "-cp", &format!("{}:{cp}", classes.display()), "CuratorBench", connect])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("--curator: cannot run java ({e})"))?;
        let stdin = child.stdin.take().expect("piped");
        let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        Ok(Curator { child, stdin, lines })
    }

    /// Sends one command; its answer's numbers, within `bound`.
    async fn ask(&mut self, command: &str, bound: Duration) -> anyhow::Result<Vec<u64>> {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        let line = match tokio::time::timeout(bound, self.lines.next_line()).await {
            Err(_) => anyhow::bail!("--curator: no answer to {command:?} within {bound:?}"),
            Ok(line) => line?,
        };
        let Some(line) = line else {
            let status = self.child.wait().await?;
            anyhow::bail!("--curator: the Java peer ended ({status}) during {command:?}");
        };
        match line.strip_prefix("ok ") {
            Some(nums) => Ok(nums.split(' ').map(str::parse).collect::<Result<Vec<u64>, _>>()?),
            None => anyhow::bail!("--curator: {command:?}: {line}"),
        }
    }

    /// Acquire+release cycles of one InterProcessMutex on `path`, one at a time, for `duration`.
    pub(crate) async fn uncontended(&mut self, path: &str, duration: Duration) -> anyhow::Result<(u64, Duration)> {
        let r = self.ask(&format!("uncontended {path} {}", duration.as_millis()), duration + BOUND).await?;
        anyhow::ensure!(r.len() == 2, "--curator: unexpected answer {r:?}");
        Ok((r[0], Duration::from_nanos(r[1])))
    }

    /// `clients` sessions taking turns on one InterProcessMutex on `path` for `duration`.
    pub(crate) async fn contended(
        &mut self,
        path: &str,
        clients: u32,
        duration: Duration,
    ) -> anyhow::Result<Contended> {
        let r = self.ask(&format!("contended {path} {clients} {}", duration.as_millis()), duration + BOUND).await?;
        anyhow::ensure!(r.len() == 4, "--curator: unexpected answer {r:?}");
        Ok(Contended { handoffs: r[0], elapsed: Duration::from_nanos(r[1]), min: r[2], max: r[3] })
    }
}

/// Beyond the run itself: the JVM's connects, and an acquire's own 30 s bound.
const BOUND: Duration = Duration::from_secs(60);
