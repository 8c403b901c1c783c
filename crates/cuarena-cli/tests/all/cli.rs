//! The `cuarena` command: figures on the shipped ResNet-50 trace, help,
//! and the exit status of each kind of failure.

use std::process::{Command, Output};

/// The `cuarena` command, run in the trace crate's folder so that the
/// fixtures' paths (`tests/data/...`) read as in that crate's tests.
pub(crate) fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cuarena"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../cuarena-trace"));
    c
}

/// Runs `cuarena ARGS` (see [`command`]) to completion.
pub(crate) fn cuarena(args: &[&str]) -> Output {
    command()
        .args(args)
        .output()
        .expect("the cuarena binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const RESNET: &str = "tests/data/resnet50_varbatch.csv.gz";

#[test]
fn cli_replay_find_min_resnet50() {
    let o = cuarena(&["replay", RESNET, "--find-min"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("85078 events"), "{out}");
    assert!(
        out.contains("(13.70 GiB) with sizes rounded to 256 B"),
        "{out}"
    );
    assert!(
        out.contains("smallest capacity / peak live = 1.0000"),
        "{out}"
    );
    let non_moving = out
        .lines()
        .find(|l| l.starts_with("non-moving segregated fit, smallest"))
        .unwrap_or_default();
    assert!(non_moving.contains("1.0093"), "{out}");
    // The tables' columns line up: right-aligned under headers of their
    // width, every line of a table is as long as its header.
    for header in ["allocator ", "  device "] {
        let at = out.lines().position(|l| l.starts_with(header)).unwrap();
        let table: Vec<&str> = out
            .lines()
            .skip(at)
            .take_while(|l| !l.is_empty() && !l.starts_with('(') && !l.starts_with("device "))
            .collect();
        assert!(table.len() >= 2, "{out}");
        let width = table[0].chars().count();
        for l in &table {
            assert_eq!(l.chars().count(), width, "`{l}` under `{}`", table[0]);
        }
    }
    assert!(
        out.contains("(cap/peak: capacity / peak live; compactions t/f: targeted / full"),
        "{out}"
    );
}

#[test]
fn capacities_with_units() {
    // 13.70 GiB live: 12GB (decimal) and 11000MiB are too small (exit 1),
    // 15GB is enough; the message says the capacity in the screen's units.
    for (cap, code) in [("12GB", 1), ("11000MiB", 1), ("15GB", 0), ("14.5GiB", 0)] {
        let o = cuarena(&["replay", RESNET, "--capacity", cap]);
        assert_eq!(o.status.code(), Some(code), "{cap}: {}", stderr(&o));
    }
    let o = cuarena(&["replay", RESNET, "--capacity", "12GB"]);
    assert!(
        stderr(&o).contains("at 11.18 GiB (0.8158 x peak live)"),
        "{}",
        stderr(&o)
    );
    let o = cuarena(&["replay", RESNET, "--capacity", "12 gigs"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("KiB, MiB, GiB, TiB"), "{}", stderr(&o));
}

#[test]
fn cli_help_and_exit_codes() {
    for args in [&["--help"][..], &["help", "replay"], &["replay", "--help"]] {
        let o = cuarena(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(stdout(&o).contains("exit status:"), "{args:?}");
    }
    // The arena fails at a capacity below peak live.
    let o = cuarena(&["replay", RESNET, "--capacity", "12GiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("did not complete the trace"));
    // Bad usage.
    for args in [&[][..], &["replay"], &["replay", RESNET, "--bogus"]] {
        assert_eq!(cuarena(args).status.code(), Some(2), "{args:?}");
    }
    // Unreadable trace.
    let o = cuarena(&["replay", "tests/data/no-such-trace.csv"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        !stderr(&o).contains("Trace {"),
        "Debug formatting: {}",
        stderr(&o)
    );
}

/// Stdout closed by its reader (`cuarena replay --help | head -3`): every
/// command stops quietly with exit status 0 (documented in `--help`), where
/// `println!` panicked with "failed printing to stdout: Broken pipe".
#[cfg(target_os = "linux")]
#[test]
fn cli_closed_stdout_is_a_quiet_exit() {
    use std::io::{BufRead, BufReader};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::process::Stdio;

    // A pipe whose read end is closed before the command starts, so that
    // its first write fails with EPIPE every time (a reader dropped after
    // the spawn would race the command's writes). O_CLOEXEC: the tests run
    // in parallel, and a child spawned by another one must not inherit the
    // read end and keep the pipe open.
    let closed_pipe = || {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors are new and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        Stdio::from(write)
    };
    let runs: [&[&str]; 6] = [
        &["--help"],
        &["replay", "--help"],
        &["--version"],
        &["replay", RESNET],
        &["replay", RESNET, "--find-min"],
        // Stops at its first line, before the arena fails: the reader asked
        // for no more, so no verdict either.
        &["replay", RESNET, "--capacity", "12GiB"],
    ];
    for args in runs {
        let o = command()
            .args(args)
            .stdout(closed_pipe())
            .output()
            .expect("the cuarena binary runs");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }

    // As `| head -1`: one line read, then the pipe closed while the command
    // still replays (or has just finished: status 0 as well).
    let mut child = command()
        .args(["replay", RESNET])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the cuarena binary runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("cuarena replay: "), "{first}");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");

    // Any other write error is one: exit status 3 with a message.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full opens");
    let o = command()
        .arg("--help")
        .stdout(full)
        .output()
        .expect("the cuarena binary runs");
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("cuarena: cannot write to standard output:"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}
