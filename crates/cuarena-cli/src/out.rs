//! Output that cannot panic. `println!` panics when stdout is gone
//! (`cuarena replay --help | head -3`); results go through `outln!`
//! instead, which returns the write's error as a [`Failure`] for `?`.
//!
//! A closed pipe (`BrokenPipe`) becomes [`Failure::StdoutClosed`]: the
//! command stops at once, prints nothing more, and exits with status 0, as
//! the reader asked for no more output and nothing failed (a shell's
//! `pipefail` does not see `| head` as an error then). Any other write
//! error (a full disk) is an I/O failure, exit status 3.

use std::fmt;
use std::io::Write;

use crate::{Failure, Res};

/// `println!` that returns [`Res<()>`] instead of panicking.
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

/// Writes `args` and a newline to stdout.
pub(crate) fn line(args: fmt::Arguments<'_>) -> Res<()> {
    writeln!(std::io::stdout().lock(), "{args}").map_err(stdout_failure)
}

/// Flushes stdout (its lines are flushed as written; this is for the end).
pub(crate) fn flush() -> Res<()> {
    std::io::stdout().flush().map_err(stdout_failure)
}

fn stdout_failure(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::StdoutClosed
    } else {
        Failure::Io(format!("cannot write to standard output: {e}"))
    }
}

/// `eprintln!` without its panic: a message on stderr, best effort (with
/// stderr gone there is nowhere to say that it is gone).
pub(crate) fn err_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
