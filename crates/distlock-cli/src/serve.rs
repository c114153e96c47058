//! `distlock serve`: the embedded ZooKeeper-protocol server, standalone.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; see --addr-file).
    #[arg(long, default_value = "127.0.0.1:2181")]
    listen: SocketAddr,
    /// Keep a transaction log and snapshots here, so nodes and sessions survive a restart.
    /// Without it, everything is in memory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// When to fsync the transaction log: always (before each reply) or never (the OS decides).
    #[arg(long, default_value = "always", value_parser = ["always", "never"])]
    fsync: String,
    /// ZooKeeper's tickTime: session timeouts are bounded to 2..20 ticks.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "2s")]
    tick: Duration,
    /// Largest accepted frame in bytes (jute.maxbuffer).
    #[arg(long, default_value_t = 1 << 20)]
    max_frame: usize,
    /// Most simultaneous connections.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Most watches per session.
    #[arg(long, default_value_t = 100_000)]
    max_watches: usize,
    /// Write the bound address to this file once listening (for scripts using port 0).
    #[arg(long, value_name = "FILE")]
    addr_file: Option<PathBuf>,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<u8> {
    if args.tick.is_zero() {
        anyhow::bail!("invalid --tick: must be greater than zero");
    }
    let config = distlock_server::Config {
        tick: args.tick,
        max_frame: args.max_frame,
        max_connections: args.max_connections,
        max_watches_per_session: args.max_watches,
        data_dir: args.data_dir.clone(),
        fsync: args.fsync.parse().map_err(anyhow::Error::msg)?,
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    if let Some(f) = &args.addr_file {
        std::fs::write(f, format!("{addr}\n"))?;
    }
    eprintln!(
        "distlock serve: ZooKeeper protocol on {addr} ({})",
        match &args.data_dir {
            Some(d) => format!("data in {}, fsync {}", d.display(), args.fsync),
            None => "in memory".to_string(),
        }
    );
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    distlock_server::run(listener, config, shutdown).await?;
    Ok(0)
}
