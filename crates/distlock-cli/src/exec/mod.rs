//! `distlock exec`: run a command while holding locks, and what `hold` and `elect` share with it.
//! The flags become a [`Plan`] before anything connects (`plan`); the plan is acquired
//! (`acquire`), the command run and supervised under it (`command`), with the signals
//! (`signals`) and the terminal (`terminal`) handled in files of their own.

mod acquire;
mod command;
mod plan;
mod signals;
mod terminal;

pub use acquire::acquire;
pub use command::exec;
pub use plan::{AcquireArgs, LockArgs, Plan};
pub use signals::Signals;

use std::time::Duration;

/// What to do to the command when the lock is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLost {
    /// SIGTERM, then SIGKILL after the grace period.
    Term,
    /// SIGKILL at once.
    Kill,
    /// Keep running (unsafe: the command runs without the lock); a warning is printed.
    Ignore,
}

/// The command to run and how to stop it: shared by `exec` and `elect`.
#[derive(clap::Args, Debug)]
pub struct CommandArgs {
    /// What to do to the command if the lock (`elect`: the lead) is lost while it runs.
    #[arg(long = "on-lost", value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL when the lock is lost; cut to a quarter of the session
    /// timeout, so that SIGKILL always lands before the lock's lease ends.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "5s")]
    grace: Duration,
    /// Run STRING with `sh -c` (as flock -c does) instead of a COMMAND after --.
    #[arg(short = 'c', long = "command", value_name = "STRING", conflicts_with = "command")]
    command_string: Option<String>,
    /// The command and its arguments, after --. (`elect` without one leads until standard input
    /// closes or INT, TERM or HUP arrives, as `hold` does.)
    #[arg(value_name = "COMMAND", last = true, num_args = 1..)]
    command: Vec<String>,
}

impl CommandArgs {
    /// True when neither a COMMAND nor `-c` was given.
    pub fn is_empty(&self) -> bool {
        self.command.is_empty() && self.command_string.is_none()
    }
}

/// `distlock exec`'s flags.
#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    command: CommandArgs,
}

/// `distlock exec`.
pub async fn run(args: ExecArgs) -> anyhow::Result<u8> {
    exec(args.lock.plan()?, args.command).await
}
