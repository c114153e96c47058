//! `distlock hold`: take locks and hold them without running a command, for scripts (as
//! `etcdctl lock` without a command does).

use crate::exec::{acquire, LockArgs, Signals};
use crate::EXIT_LOST;
use std::io::{Read, Write};

#[derive(clap::Args, Debug)]
pub struct HoldArgs {
    #[command(flatten)]
    lock: LockArgs,
}

pub async fn run(args: HoldArgs) -> anyhow::Result<u8> {
    let mut signals = Signals::new()?;
    let held = match acquire(&args.lock, &mut signals).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    {
        let mut out = std::io::stdout().lock();
        for (key, value) in held.env() {
            writeln!(out, "{key}={value}")?;
        }
        out.flush()?;
    }
    // Standard input is read on a thread of its own (a blocking read no runtime has to wait
    // for); its end-of-file is the signal to let go.
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    let lost = held.guard.lost();
    tokio::select! {
        _ = closed_rx => tracing::info!("standard input closed; releasing"),
        sig = signals.ending() => tracing::info!(signal = sig, "signal; releasing"),
        reason = lost => {
            eprintln!("distlock: lock {} lost ({reason}); no longer held", held.shown);
            held.release().await;
            return Ok(EXIT_LOST);
        }
    }
    held.release().await;
    Ok(0)
}
