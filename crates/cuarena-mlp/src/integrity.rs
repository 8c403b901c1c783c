//! The last check of a run: every tensor the arena still holds is
//! downloaded, the arena is made to compact (a targeted compaction forced
//! by an allocation, then a full one), and everything is downloaded again
//! after each and compared bit for bit.

use cuarena::CompactionReport;

use super::*;

/// The bytes of a live block, whatever its dtype (brought back first if
/// spilled).
fn bytes_of<E: Exec>(e: &mut E, x: Handle) -> Res<Vec<u8>> {
    e.arena().make_resident(&[x])?;
    Ok(e.arena().read_bytes(x)?)
}

/// Downloads every tensor of `tensors` again and compares it bit for bit
/// with `before`; returns how many differ.
fn changed<E: Exec>(e: &mut E, tensors: &[Handle], before: &[Vec<u8>]) -> Res<usize> {
    let mut n = 0;
    for (&x, b) in tensors.iter().zip(before) {
        if bytes_of(e, x)? != *b {
            n += 1;
        }
    }
    Ok(n)
}

/// "N moves, X moved" of a compaction.
fn moves_line(r: &CompactionReport) -> String {
    format!("{} moves, {} moved", r.moves, fmt_bytes(r.bytes_moved))
}

/// Every live tensor of the run (the student's weights and momentum, the
/// eval inputs and labels, and any other block still live) downloaded
/// before and after a targeted compaction and a full one: the bytes must
/// not change. Nothing to check where the arena holds no bytes.
pub fn check_every_tensor<E: Exec>(e: &mut E, out: &Outcome) -> Res<()> {
    if !e.arena().backend().stores_bytes() {
        return Ok(());
    }
    // The storages dropped at the end of the run (the teacher, the
    // metrics, the prefetched batches) are freed now: what is left is
    // what the run still holds.
    e.arena().reclaim()?;
    let mut tensors: Vec<Handle> = Vec::new();
    for l in &out.net.layers {
        tensors.extend([h(&l.w), h(&l.b)]);
        if let Some((vw, vb)) = &l.momentum {
            tensors.extend([h(vw), h(vb)]);
        }
    }
    tensors.extend([h(&out.eval_x), h(&out.eval_y)]);
    let mut before = Vec::with_capacity(tensors.len());
    for &x in &tensors {
        before.push(bytes_of(e, x)?);
    }
    // Any other live block (none is expected): the arena lists the
    // resident ones, and the run's own are resident after the reads.
    let others: Vec<Handle> = e
        .arena()
        .blocks()
        .into_iter()
        .map(|b| b.handle)
        .filter(|x| !tensors.contains(x))
        .collect();
    let n_others = others.len();
    for x in others {
        before.push(bytes_of(e, x)?);
        tensors.push(x);
    }
    let live = e.arena().stats().live_blocks;
    if tensors.len() as u64 != live {
        return Err(format!(
            "{} live blocks, {} of them found to check (a spilled block the run does not name?)",
            live,
            tensors.len()
        )
        .into());
    }
    let bytes: u64 = before.iter().map(|b| b.len() as u64).sum();

    // A targeted compaction: an allocation one granule larger than the
    // largest hole fits in the free bytes but in no hole (possible while
    // the free bytes are in more than one region, as the run leaves them).
    let st = e.arena().stats();
    let granule = e.arena().config().alignment_bytes;
    let (targeted, after_targeted) = if st.largest_free_bytes + granule <= st.free_bytes {
        let probe = e.arena().alloc_storage(st.largest_free_bytes + granule)?;
        let after = e.arena().stats();
        drop(probe);
        e.arena().reclaim()?;
        let kind = if after.targeted_compactions > st.targeted_compactions {
            "a targeted compaction"
        } else if after.full_compactions > st.full_compactions {
            "a full compaction (no targeted plan fitted)"
        } else {
            "no compaction"
        };
        let line = format!(
            "an allocation of the largest hole + {granule} B ({}; {} free): {kind}, {} moves, {} moved",
            fmt_bytes(st.largest_free_bytes + granule),
            fmt_bytes(st.free_bytes),
            after.moves - st.moves,
            fmt_bytes(after.bytes_moved - st.bytes_moved)
        );
        (line, Some(changed(e, &tensors, &before)?))
    } else {
        (
            "no targeted compaction (the free bytes are one region)".into(),
            None,
        )
    };
    let full = e.arena().compact()?;
    let after_full = changed(e, &tensors, &before)?;
    let bad = after_targeted.unwrap_or(0) + after_full;
    println!(
        "integrity (every tensor): the {} live tensors ({}: weights, momentum, eval inputs and labels{}) downloaded, \
         then again after {targeted} and after a full compact() ({}): {}",
        tensors.len(),
        fmt_bytes(bytes),
        if n_others > 0 {
            format!(", {n_others} others")
        } else {
            String::new()
        },
        moves_line(&full),
        if bad == 0 {
            "bit-exact".to_string()
        } else {
            format!(
                "{} CHANGED after the targeted compaction, {after_full} after the full one",
                after_targeted.unwrap_or(0)
            )
        }
    );
    if bad > 0 {
        return Err("tensors changed while the arena compacted".into());
    }
    Ok(())
}
