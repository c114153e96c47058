//! The terminal: the command's process group is given it while it runs in the foreground, and a
//! status line shows where a wait stands in the queue.

use distlock::QueueStatus;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The controlling terminal, when our process group is its foreground group (we run in the
/// foreground): the command's group is given the terminal, and it is taken back when the command
/// itself ends.
#[derive(Clone, Copy)]
pub struct Terminal {
    our_group: libc::pid_t,
}

impl Terminal {
    pub fn foreground() -> Option<Terminal> {
        // SAFETY: plain queries of our own process group and of stdin's terminal.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            // (In a script the shell shares our group and loses Ctrl-C to the command meanwhile;
            // a command killed by Ctrl-C makes distlock die of SIGINT too, which a shell takes as
            // its own interrupt: its loop stops.)
            let ours = libc::getpgrp();
            (libc::tcgetpgrp(0) == ours).then_some(Terminal { our_group: ours })
        }
    }

    pub fn take_back(self) {
        // SAFETY: a background group may take the terminal back with SIGTTOU ignored.
        unsafe {
            let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, self.our_group);
            libc::signal(libc::SIGTTOU, previous);
        }
    }
}

/// Shows where we stand in the queue, on one line that fits the terminal, from half a second into
/// the wait on (an acquire that succeeds at once prints nothing).
pub async fn show_status(
    path: String,
    mut progress: watch::Receiver<QueueStatus>,
    started: Instant,
    shown: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut tick = tokio::time::interval_at((started + Duration::from_millis(500)).into(), Duration::from_millis(250));
    loop {
        tick.tick().await;
        let s = *progress.borrow_and_update();
        let line = status_text(&path, s, started.elapsed(), terminal_width());
        shown.store(true, std::sync::atomic::Ordering::SeqCst);
        eprint!("\r\x1b[K{line}");
    }
}

/// The status line, at most `width - 1` characters (the last column would wrap on some
/// terminals): the queue position and time first, the path shortened from the left if needed.
pub fn status_text(path: &str, s: QueueStatus, elapsed: Duration, width: usize) -> String {
    let budget = width.saturating_sub(1);
    let tail = if s.queue_len == 0 {
        format!(" ({:.1}s)", elapsed.as_secs_f64())
    } else {
        format!(": {} ahead ({:.1}s)", s.ahead, elapsed.as_secs_f64())
    };
    let head = "distlock: waiting for ";
    let fixed = head.chars().count() + tail.chars().count();
    let path_len = path.chars().count();
    if fixed + path_len <= budget {
        return format!("{head}{path}{tail}");
    }
    if fixed + 4 <= budget {
        let keep = budget - fixed - 1;
        let short: String = path.chars().skip(path_len - keep).collect();
        return format!("{head}…{short}{tail}");
    }
    let minimal = format!("waiting{tail}");
    if minimal.chars().count() <= budget {
        return minimal;
    }
    tail.trim_start_matches([':', ' ']).chars().take(budget).collect()
}

/// Columns of the terminal on stderr (80 when unknown).
fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize struct for a terminal file descriptor.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        size.ws_col as usize
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_fits_the_terminal() {
        let s = QueueStatus { ahead: 3, queue_len: 5 };
        let path = "/locks/a-rather-long-lock-name-for-orders";
        for width in [20, 40, 60, 80, 200] {
            let line = status_text(path, s, Duration::from_millis(12_345), width);
            assert!(line.chars().count() < width, "{width}: {line:?}");
            assert!(line.contains("12.3s"), "{width}: {line:?}");
        }
        assert!(status_text(path, s, Duration::ZERO, 200).contains(path));
        assert!(status_text(path, s, Duration::ZERO, 50).contains("…"));
    }
}
