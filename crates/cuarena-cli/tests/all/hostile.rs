//! Hostile traces through the command: each stops with exit status 3 and a
//! message naming the limit, quickly, and the child's peak RSS stays under
//! the readers' stated bound (`cuarena_trace::trace`, "Bounded input")
//! plus what the command takes to fail on a missing file.
//!
//! Peak RSS: `wait4` gives one child's `ru_maxrss`, but Linux carries the
//! high-water mark of the address space a process leaves at `exec` into it,
//! and `Command` spawns through `vfork`, whose address space is this test
//! binary's (hundreds of MB, with the other tests). So each command is
//! spawned by a fresh, small copy of this binary ([`rss_probe`], run with
//! `--exact`), which reports the child's `ru_maxrss` and its own high-water
//! mark (the most that can leak into the child's figure).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuarena_trace::trace::limits::{
    GZIP_RATIO_SLACK_BYTES, MAX_GZIP_RATIO, MEMORY_BASE_BYTES, MEMORY_PER_INPUT_BYTE,
};

use cuarena_testkit::trace::{
    deep_list_pickle, dup_tuple2_pickle, gzip_zeros, long4_pickle, mark_flood_pickle, memo_bomb_gz,
    shared_block_snapshot, short_str, DEEP,
};

const PROBE_FILE: &str = "CUARENA_RSS_PROBE_FILE";
const PROBE_STDERR: &str = "CUARENA_RSS_PROBE_STDERR";
/// Address-space limit (bytes) for the command, when set.
const PROBE_AS: &str = "CUARENA_RSS_PROBE_AS";
/// Seconds the command may run, when not [`timeout`]'s.
const PROBE_TIMEOUT: &str = "CUARENA_RSS_PROBE_TIMEOUT_S";

/// What one run of `cuarena replay FILE` did.
struct Run {
    code: i32,
    stderr: String,
    elapsed: Duration,
    peak_rss_bytes: u64,
    probe_hwm_bytes: u64,
}

fn timeout() -> Duration {
    let set = std::env::var(PROBE_TIMEOUT)
        .ok()
        .and_then(|v| v.parse().ok());
    Duration::from_secs(set.unwrap_or(if cfg!(debug_assertions) { 120 } else { 10 }))
}

/// This process's `VmHWM` in KiB.
fn own_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Not a test of its own: a no-op unless [`PROBE_FILE`] is set, when
/// it runs `cuarena replay $PROBE_FILE` (stderr to [`PROBE_STDERR`]),
/// reaps it with `wait4` and prints what it did on one line.
#[test]
// Reaped by `wait4`, which std cannot see.
#[allow(clippy::zombie_processes)]
fn rss_probe() {
    let (Some(file), Some(err_path)) =
        (std::env::var_os(PROBE_FILE), std::env::var_os(PROBE_STDERR))
    else {
        return;
    };
    let hwm = own_hwm_kib();
    let err = std::fs::File::create(&err_path).unwrap();
    let t0 = Instant::now();
    let mut cmd = crate::cli::command();
    cmd.arg("replay")
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err);
    if let Some(limit) = std::env::var("CUARENA_RSS_PROBE_AS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook only calls `setrlimit`, which is
        // async-signal-safe, on a stack value.
        unsafe {
            cmd.pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: limit as libc::rlim_t,
                    rlim_max: limit as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("the cuarena binary runs");
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our unreaped child; `status` and `ru` are
        // valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid {
            break;
        }
        if t0.elapsed() > timeout() {
            let _ = child.kill();
            // SAFETY: as above; blocks until the killed child is reaped.
            unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            panic!("cuarena replay ran past {:?}", timeout());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    // Linux reports ru_maxrss in KiB.
    println!(
        "rss-probe: code={code} elapsed_us={} maxrss_kib={} probe_hwm_kib={hwm}",
        t0.elapsed().as_micros(),
        ru.ru_maxrss
    );
}

/// Runs `cuarena replay path` from a fresh probe process.
fn replay(path: &Path, dir: &Path) -> Run {
    replay_limited(path, dir, None)
}

/// Like [`replay`], with an address-space limit of `limit` bytes.
fn replay_limited(path: &Path, dir: &Path, limit: Option<u64>) -> Run {
    replay_within(path, dir, limit, None)
}

/// Like [`replay_limited`], the command given `seconds` to finish.
fn replay_within(path: &Path, dir: &Path, limit: Option<u64>, seconds: Option<u64>) -> Run {
    let err_path = dir.join("stderr.txt");
    let mut probe = Command::new(std::env::current_exe().unwrap());
    if let Some(l) = limit {
        probe.env(PROBE_AS, l.to_string());
    }
    if let Some(s) = seconds {
        probe.env(PROBE_TIMEOUT, s.to_string());
    }
    let o = probe
        .args([
            "--exact",
            "hostile::rss_probe",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBE_FILE, path)
        .env(PROBE_STDERR, &err_path)
        .stdin(Stdio::null())
        .output()
        .expect("the test binary runs");
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find_map(|l| Some(l.split_once("rss-probe: ")?.1))
        .unwrap_or_else(|| {
            panic!(
                "no probe report: {out}{}",
                String::from_utf8_lossy(&o.stderr)
            )
        });
    let field = |k: &str| -> u64 {
        line.split(' ')
            .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line}"))
    };
    Run {
        code: line
            .split(' ')
            .find_map(|f| f.strip_prefix("code="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        elapsed: Duration::from_micros(field("elapsed_us")),
        peak_rss_bytes: field("maxrss_kib") << 10,
        probe_hwm_bytes: field("probe_hwm_kib") << 10,
    }
}

/// The readers' bound for `d` decompressed bytes: 2 D + 2 (16 D + 64 MiB).
fn reader_bound(d: u64) -> u64 {
    2 * d + 2 * (MEMORY_PER_INPUT_BYTE * d + MEMORY_BASE_BYTES)
}

/// gzip of a CSV: `prefix_lines` lines of distinct pseudo-random unknown
/// actions (they compress poorly, buying ratio budget, and are skipped),
/// then `n` 9-byte `oom` lines (kept, 40 bytes each in memory).
fn short_line_csv_gz(prefix_lines: usize, n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(b"action,addr,size,stream,time_us\n").unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..prefix_lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        writeln!(enc, "z{x:016x}{:016x},1,1,1,1", x.rotate_left(29)).unwrap();
    }
    let line = b"oom,,1,,\n".repeat(1 << 16);
    let mut left = n;
    while left > 0 {
        let k = left.min(1 << 16);
        enc.write_all(&line[..9 * k]).unwrap();
        left -= k;
    }
    enc.finish().unwrap()
}

#[test]
fn csv_of_short_lines_stays_within_the_event_bound() {
    let dir = std::env::temp_dir().join(format!("cuarena-cli-csv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = replay(&dir.join("no-such-trace.csv"), &dir);

    // 4 million kept events: 160 MB of events at most (an eighth more
    // as the vector grows), none of the 36 MB of text held.
    let n = 4 << 20;
    let path = dir.join("short.csv.gz");
    std::fs::write(&path, short_line_csv_gz(0, n)).unwrap();
    let r = replay(&path, &dir);
    let bound = base.peak_rss_bytes.max(r.probe_hwm_bytes)
        + (n as u64) * cuarena_trace::trace::EVENT_BYTES * 9 / 8
        + (8 << 20);
    println!(
        "short.csv.gz: exit {}, {:?}, peak RSS {} KiB (bound {} KiB)",
        r.code,
        r.elapsed,
        r.peak_rss_bytes >> 10,
        bound >> 10
    );
    // It holds no allocation: an error, after reading every line.
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("no allocations"), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("({n} events on it")),
        "{}",
        r.stderr
    );
    assert!(r.peak_rss_bytes <= bound, "{} > {bound}", r.peak_rss_bytes);

    // The hostile shape under a 256 MiB address-space limit: an
    // incompressible prefix buys budget for 12 million events (480 MB);
    // the events' allocation fails and is an error, never an abort.
    std::fs::write(&path, short_line_csv_gz(12_000, 12_000_000)).unwrap();
    let r = replay_limited(&path, &dir, Some(256 << 20));
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "under 256 MiB: exit {}, {:?}: {}",
        r.code, r.elapsed, r.stderr
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("out of memory: could not allocate"),
        "{}",
        r.stderr
    );
}

/// A snapshot of one segment of `n` blocks that are one block dict
/// (`{"size": 512, "state": "inactive"}`), DUPed: one byte per block.
fn dup_blocks_pickle(n: usize) -> Vec<u8> {
    let mut block = vec![b'}'];
    block.extend(short_str("size"));
    block.extend(b"M\x00\x02s");
    block.extend(short_str("state"));
    block.extend(short_str("inactive"));
    block.extend(b"s\x94");
    shared_block_snapshot(&block, 0, n)
}

#[test]
fn dup_shared_blocks_stay_within_the_memory_bound() {
    // Review finding: each DUP byte becomes a 32-byte `Block` in a
    // vector that doubles, outside the charged budget (1.27 GB of RSS
    // for this 20 MB file on a60c355, over the ~0.85 GB bound; an
    // abort in `segments_of` under an address-space limit).
    let dir = std::env::temp_dir().join(format!("cuarena-cli-dupblk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = replay(&dir.join("no-such-trace.pickle"), &dir);
    let path = dir.join("dup_blocks.pickle");
    let bytes = dup_blocks_pickle(20_000_000);
    let file = bytes.len() as u64;
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    let r = replay(&path, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let bound = base.peak_rss_bytes.max(r.probe_hwm_bytes) + file + reader_bound(file);
    println!(
        "dup_blocks.pickle: {file} B, exit {}, {:?}, peak RSS {} KiB (bound {} KiB)",
        r.code,
        r.elapsed,
        r.peak_rss_bytes >> 10,
        bound >> 10
    );
    assert!(r.code == 0 || r.code == 3, "{}", r.stderr);
    assert!(r.peak_rss_bytes <= bound, "{} > {bound}", r.peak_rss_bytes);
}

#[test]
fn cli_hostile_traces_fail_cleanly_within_the_memory_bound() {
    let dir = std::env::temp_dir().join(format!("cuarena-cli-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // What the command takes to start and fail on a missing file.
    let base = replay(&dir.join("no-such-trace.pickle"), &dir);
    assert_eq!(base.code, 3, "{}", base.stderr);
    let base_rss = base.peak_rss_bytes;

    // ~1 GiB of zeros in 1 MiB members (~1 MB compressed): the reader
    // stops at 256 × the compressed bytes + 64 MiB inflated.
    let gzip = gzip_zeros(1 << 20, 1 << 10);
    let gzip_stop = MAX_GZIP_RATIO * gzip.len() as u64 + GZIP_RATIO_SLACK_BYTES;
    let cases: [(&str, Vec<u8>, &str, u64); 5] = [
        ("deep.pickle", deep_list_pickle(DEEP), "MAX_NESTING", 0),
        (
            "dup_tuple2.pickle",
            dup_tuple2_pickle(DEEP),
            "MAX_NESTING",
            0,
        ),
        ("marks.pickle", mark_flood_pickle(8 << 20), "MAX_MARKS", 0),
        (
            "zeros.pickle.gz",
            gzip,
            "MAX_GZIP_RATIO",
            // The inflated buffer, twice (as it grows); the compressed
            // file is added below.
            2 * gzip_stop,
        ),
        (
            "long4.pickle",
            long4_pickle(0x7fff_ffff),
            "MAX_INT_BYTES",
            0,
        ),
    ];
    let mut failures = Vec::new();
    for (name, bytes, limit, gzip_bound) in cases {
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        let file = bytes.len() as u64;
        drop(bytes);
        let r = replay(&path, &dir);
        let _ = std::fs::remove_file(&path);
        let bound = base_rss.max(r.probe_hwm_bytes) + file + gzip_bound.max(reader_bound(file));
        println!(
            "{name}: {file} B, exit {}, {:?}, peak RSS {} KiB (bound {} KiB, probe {} KiB)",
            r.code,
            r.elapsed,
            r.peak_rss_bytes >> 10,
            bound >> 10,
            r.probe_hwm_bytes >> 10
        );
        if r.code != 3 {
            failures.push(format!("{name}: exit {}: {}", r.code, r.stderr));
        }
        if !r.stderr.contains(limit) || r.stderr.contains("Limit {") {
            failures.push(format!(
                "{name}: stderr does not name {limit}: {}",
                r.stderr
            ));
        }
        if r.elapsed >= timeout() {
            failures.push(format!("{name}: took {:?}", r.elapsed));
        }
        if r.peak_rss_bytes > bound {
            failures.push(format!(
                "{name}: peak RSS {} B over the bound {bound} B",
                r.peak_rss_bytes
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The 31 KB memo bomb: one `alloc` dict shared by 32 million events.
/// It passes the readers' limits; building the alloc/free program was
/// an abort (`memory allocation of 268435456 bytes failed`) under a
/// 4 GiB address-space limit. Now the program's budget refuses it:
/// exit status 3 and a message naming the limit.
#[test]
fn memo_bomb_is_refused_by_the_program_budget() {
    let dir = std::env::temp_dir().join(format!("cuarena-cli-bomb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bomb = memo_bomb_gz(320);
    assert!(bomb.len() < 40 << 10, "{} bytes", bomb.len());
    let path = dir.join("memo_bomb.pickle.gz");
    std::fs::write(&path, &bomb).unwrap();
    // Reading 32 million events takes seconds.
    let seconds = if cfg!(debug_assertions) { 900 } else { 90 };
    let r = replay_within(&path, &dir, Some(4 << 30), Some(seconds));
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "memo_bomb.pickle.gz: {} B, exit {}, {:?}, peak RSS {} KiB: {}",
        bomb.len(),
        r.code,
        r.elapsed,
        r.peak_rss_bytes >> 10,
        r.stderr
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains("memory for the alloc/free program")
            && r.stderr
                .contains("MEMORY_PER_INPUT_BYTE × input bytes + MEMORY_BASE_BYTES"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("memory allocation of"), "{}", r.stderr);
}
