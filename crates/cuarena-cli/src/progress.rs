//! One progress line on stderr, rewritten in place, while long work runs.
//! Only when stderr is a terminal: logs and pipes get the results alone.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    enabled: bool,
    started: Instant,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            enabled: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last: None,
            shown: false,
        }
    }

    /// Shows `msg` (with the time since this progress began), at most
    /// ten times a second.
    pub(crate) fn show(&mut self, msg: &str) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        let secs = now.duration_since(self.started).as_secs_f64();
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the work.
        let _ = write!(err, "\r\x1b[2K{msg} ({secs:.1} s)");
        let _ = err.flush();
        self.shown = true;
    }

    /// Erases the line (before results are printed).
    pub(crate) fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
        self.last = None;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
