//! `distlock hold`: take locks and hold them without running a command, for scripts (as
//! `etcdctl lock` without a command does).

use crate::exec::{acquire, LockArgs, Plan, Signals};
use crate::EXIT_LOST;
use std::io::{Read, Write};

#[derive(clap::Args, Debug)]
pub struct HoldArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Anything after `--`: refused (hold runs no command), rather than taken as more locks.
    #[arg(last = true, hide = true, num_args = 0..)]
    command: Vec<String>,
}

/// `distlock hold`.
pub async fn run(args: HoldArgs) -> anyhow::Result<u8> {
    if !args.command.is_empty() {
        anyhow::bail!(
            "hold runs no command (it holds until its standard input closes): to run `{}` under the lock, \
             use distlock exec LOCK -- COMMAND",
            args.command.join(" ")
        );
    }
    hold(args.lock.plan()?).await
}

/// Holds what `plan` takes until standard input closes or INT, TERM or HUP arrives, printing the
/// environment `exec` would give a command.
pub async fn hold(plan: Plan) -> anyhow::Result<u8> {
    let mut signals = Signals::new()?;
    plan.start_record("hold")?;
    let held = match acquire(&plan, &mut signals).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    {
        let mut out = std::io::stdout().lock();
        for (key, value) in held.env() {
            writeln!(out, "{key}={}", crate::shown::text(&value))?;
        }
        out.flush()?;
    }
    // Standard input is read on a thread of its own (a blocking read no runtime has to wait
    // for); its end-of-file is the signal to let go. A background job reading its terminal would
    // be stopped (SIGTTIN) with the lock held; with SIGTTIN ignored the read fails instead, and
    // then only a signal ends the hold.
    // SAFETY: setting a signal disposition to SIG_IGN.
    unsafe {
        libc::signal(libc::SIGTTIN, libc::SIG_IGN);
    }
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::info!(error = %e, "cannot read standard input (a background job?); holding until a signal");
                    return; // the sender drops unsent: never "closed"
                }
            }
        }
        let _ = closed_tx.send(());
    });
    let closed_rx = async move {
        if closed_rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let lost = held.guard.lost();
    tokio::select! {
        _ = closed_rx => tracing::info!("standard input closed; releasing"),
        sig = signals.ending() => tracing::info!(signal = sig, "signal; releasing"),
        reason = lost => {
            crate::shown::say!("distlock: lock {} lost ({reason}); no longer held", held.shown);
            crate::textfile::lost(&reason.to_string());
            held.release().await;
            return Ok(EXIT_LOST);
        }
    }
    Ok(held.release().await.status(0))
}
