//! The `cuarena` command: figures on the shipped ResNet-50 trace, help,
//! and the exit status of each kind of failure.

use std::process::{Command, Output};

fn cuarena(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cuarena"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
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
        .find(|l| l.starts_with("non-moving best fit, smallest"))
        .unwrap_or_default();
    assert!(non_moving.contains("1.0093"), "{out}");
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
