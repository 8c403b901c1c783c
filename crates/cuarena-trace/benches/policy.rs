//! Bytes moved by cuarena's compaction policy against naive compact-on-
//! failure, per trace, at 1.00, 1.01 and 1.05 x peak live: the table of
//! BENCHMARKS.md. Metadata replays (placement and planning, no bytes).
//!
//!     cargo bench -p cuarena-trace --bench policy     # the traces in tests/data
//!     CUARENA_TRACES=corpus cargo bench -p cuarena-trace --bench policy   # a folder of your own
//!
//! A trace's half (design or report) is looked up in the folder's
//! `manifest.json` or `corpus_manifest.json` (as `scripts/record-corpus.sh`
//! writes them); other traces are listed as `other`.

use std::path::{Path, PathBuf};

use cuarena::{fmt_bytes, ArenaConfig};
use cuarena_trace::trace::{replay_with, Allocator, ReplayOptions, Trace};

const ALIGN: u64 = 256;
const RATIOS: [f64; 3] = [1.00, 1.01, 1.05];

/// `file -> half` from the folder's manifest.
fn halves(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in ["manifest.json", "corpus_manifest.json"] {
        let Ok(text) = std::fs::read_to_string(dir.join(name)) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        for t in v["traces"].as_array().into_iter().flatten() {
            if let (Some(f), Some(h)) = (t["file"].as_str(), t["half"].as_str()) {
                out.push((f.to_owned(), h.to_owned()));
            }
        }
    }
    out
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("policy: bench");
        return;
    }
    let dir = PathBuf::from(
        std::env::var("CUARENA_TRACES")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data").to_owned()),
    );
    let halves = halves(&dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("a folder of traces")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle") || n.ends_with(".pickle.gz") || n.ends_with(".csv.gz")
        })
        .collect();
    files.sort();
    println!(
        "| trace | half | capacity | auto moved | naive moved | auto / naive | targeted moved | targeted / naive | budgeted moved | budgeted / naive | non-moving best fit |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    let mut ratios: Vec<(String, f64)> = Vec::new();
    let mut targeted_ratios: Vec<(String, f64)> = Vec::new();
    let mut budgeted_ratios: Vec<(String, f64)> = Vec::new();
    let mut budgeted_over = 0;
    let mut targeted_over = 0;
    let mut over = 0;
    let mut still_moved = 0;
    for p in &files {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let half = halves
            .iter()
            .find(|(f, _)| *f == name)
            .map_or("other", |(_, h)| h.as_str())
            .to_owned();
        let t = match Trace::read(p) {
            Ok(t) => t,
            Err(e) => {
                println!("| {name} | {half} | unreadable: {e} | | | | |");
                continue;
            }
        };
        let Some(&device) = t.devices().first() else {
            continue;
        };
        let ops = t.ops(device).unwrap();
        let peak = ops.peak_live_rounded(ALIGN);
        for r in RATIOS {
            let cap = ((peak as f64 * r).ceil() as u64).div_ceil(ALIGN) * ALIGN;
            let config = ArenaConfig::new(cap.max(ALIGN)).with_alignment_bytes(ALIGN);
            let run = |a| {
                replay_with(&ops, &config, &ReplayOptions::default().with_allocator(a)).unwrap()
            };
            let ours = run(Allocator::Compacting);
            let targeted = run(Allocator::Targeted);
            let budgeted = run(Allocator::Budgeted);
            let naive = run(Allocator::NaiveCompacting);
            let fixed = run(Allocator::NonMoving);
            let ratio =
                (naive.bytes_moved > 0).then(|| ours.bytes_moved as f64 / naive.bytes_moved as f64);
            if ours.bytes_moved > naive.bytes_moved {
                over += 1;
            }
            if fixed.completed() && ours.bytes_moved > 0 {
                still_moved += 1;
            }
            let t_ratio = (naive.bytes_moved > 0)
                .then(|| targeted.bytes_moved as f64 / naive.bytes_moved as f64);
            if let Some(x) = ratio {
                ratios.push((half.clone(), x));
            }
            let b_ratio = (naive.bytes_moved > 0)
                .then(|| budgeted.bytes_moved as f64 / naive.bytes_moved as f64);
            if let Some(x) = b_ratio {
                budgeted_ratios.push((half.clone(), x));
                if x > 1.0 {
                    budgeted_over += 1;
                }
            }
            if let Some(x) = t_ratio {
                targeted_ratios.push((half.clone(), x));
                if x > 1.0 {
                    targeted_over += 1;
                }
            }
            println!(
                "| {name} | {half} | {r:.2} | {}{} | {} | {} | {} | {} | {}{} | {} | {} |",
                fmt_bytes(ours.bytes_moved),
                if ours.completed() { "" } else { " (failed)" },
                fmt_bytes(naive.bytes_moved),
                ratio.map_or("-".to_owned(), |x| format!("{x:.3}")),
                fmt_bytes(targeted.bytes_moved),
                t_ratio.map_or("-".to_owned(), |x| format!("{x:.3}")),
                fmt_bytes(budgeted.bytes_moved),
                if budgeted.completed() {
                    ""
                } else {
                    " (failed)"
                },
                b_ratio.map_or("-".to_owned(), |x| format!("{x:.3}")),
                if fixed.completed() {
                    "completes"
                } else {
                    "fails"
                }
            );
        }
    }
    println!();
    for (policy, rs) in [
        ("auto", &ratios),
        ("targeted", &targeted_ratios),
        ("budgeted", &budgeted_ratios),
    ] {
        for h in ["design", "report", "other", "all"] {
            let mut v: Vec<f64> = rs
                .iter()
                .filter(|(x, _)| h == "all" || x == h)
                .map(|r| r.1)
                .collect();
            if v.is_empty() {
                continue;
            }
            v.sort_by(f64::total_cmp);
            let n = v.len();
            let median = if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            };
            println!(
                "{policy}, {h}: {n} cases where naive moves anything; median ratio {median:.3}, worst {:.3}",
                v[n - 1]
            );
        }
    }
    println!("cases where targeted moved more than naive: {targeted_over}");
    println!("cases where budgeted moved more than naive: {budgeted_over}");
    println!("cases where cuarena moved more than naive: {over}");
    println!(
        "cases where a non-moving best fit completes and cuarena moved anything: {still_moved}"
    );
}
