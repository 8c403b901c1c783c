//! How many moves each chunk of a wave holds: sized from what the host and
//! the device just showed (plain data, tested without a GPU).

/// Moves of the first chunk of a wave: small, so that the GPU starts soon.
pub(crate) const FIRST_CHUNK_MOVES: usize = 1024;

/// Moves of the largest chunk the sizing picks (see
/// [`Chunks`]); a wave's last chunk may hold up to a
/// quarter more (its remainder joins it).
pub(crate) const MAX_CHUNK_MOVES: usize = 65536;

/// Sizes the chunks `(first move, moves)` of a wave of `n` moves, from
/// [`FIRST_CHUNK_MOVES`] up to [`MAX_CHUNK_MOVES`].
///
/// The host lays out chunk k+1 while the GPU runs chunk k, so the GPU idles
/// whenever that takes the host longer. How long depends on the machine:
/// the host's time per move varied severalfold between runs of the same
/// binary on the GPU machines, so a fixed growth either left the GPU idle
/// at chunk boundaries on slow hosts (doubling lost a tenth of the copy
/// rate on 100,000 moves of 4-64 KiB where the host was slow) or paid for
/// needless chunks on fast ones. So each chunk is sized from the last one:
/// as many moves as the host, at the rate it just showed, lays out while
/// the GPU moves the last chunk's bytes at the device's peak copy rate
/// (which copies reach about 90% of: that is the margin), growing by a
/// factor of 5/4 to 4.
/// Where the host is slower than the GPU anyway (small moves), chunks
/// double, which keeps launches few. A remainder of at most a quarter of a
/// chunk joins it (a launch of a few moves costs as much as one of thousands).
#[derive(Debug, Clone)]
pub(crate) struct Chunks {
    n: usize,
    start: usize,
    next: usize,
    /// Bytes per nanosecond the device copies (read plus written); 0:
    /// unknown, chunks double.
    copy_bytes_per_ns: f64,
}

impl Chunks {
    pub(crate) fn new(n: usize, copy_bytes_per_ns: f64) -> Self {
        Self {
            n,
            start: 0,
            next: FIRST_CHUNK_MOVES,
            copy_bytes_per_ns,
        }
    }

    /// The next chunk, or `None` once the wave is covered.
    pub(crate) fn next_chunk(&mut self) -> Option<(usize, usize)> {
        if self.start >= self.n {
            return None;
        }
        let rest = self.n - self.start;
        let len = if rest <= self.next + self.next / 4 {
            rest
        } else {
            self.next
        };
        let chunk = (self.start, len);
        self.start += len;
        self.next = (len * 2).min(MAX_CHUNK_MOVES);
        Some(chunk)
    }

    /// What the chunk just taken cost: its `moves` and `bytes`, and the
    /// host's time `host_ns` for it (laying it out, uploading, launching).
    /// Sizes the next one.
    pub(crate) fn feedback(&mut self, moves: usize, bytes: u64, host_ns: u64) {
        if self.copy_bytes_per_ns <= 0.0 || moves == 0 || host_ns == 0 {
            return;
        }
        let gpu_ns = 2.0 * bytes as f64 / self.copy_bytes_per_ns;
        let host_ns_per_move = host_ns as f64 / moves as f64;
        let fits = gpu_ns / host_ns_per_move;
        let next = if fits < moves as f64 {
            // The host cannot keep up at any size: fewer, larger chunks.
            moves * 2
        } else {
            (fits as usize).clamp(moves + moves / 4, moves * 4)
        };
        self.next = next.clamp(1, MAX_CHUNK_MOVES);
    }
}

/// The chunks of a wave of `n` moves without feedback: each twice the last.
#[cfg(test)]
pub(crate) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut c = Chunks::new(n, 0.0);
    std::iter::from_fn(move || c.next_chunk())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_grow_and_cover_the_wave() {
        let c: Vec<_> = chunks(100_000).collect();
        assert_eq!(c[0], (0, FIRST_CHUNK_MOVES));
        assert_eq!(c[1], (FIRST_CHUNK_MOVES, 2 * FIRST_CHUNK_MOVES));
        assert!(c.iter().all(|&(_, len)| len <= MAX_CHUNK_MOVES));
        assert_eq!(c.iter().map(|&(_, len)| len).sum::<usize>(), 100_000);
        assert!(c.windows(2).all(|p| p[0].0 + p[0].1 == p[1].0));
        assert_eq!(chunks(0).count(), 0);
        assert_eq!(chunks(5).collect::<Vec<_>>(), vec![(0, 5)]);
    }

    #[test]
    fn chunks_follow_the_host_against_the_device() {
        // 10 bytes/ns; each move 17 KB: the GPU takes 3.4 us per move.
        let mut c = Chunks::new(1 << 20, 10.0);
        let (start, len) = c.next_chunk().expect("chunk");
        assert_eq!((start, len), (0, FIRST_CHUNK_MOVES));
        // Host at 2 us per move: it lays out 1.7x as many.
        c.feedback(len, len as u64 * 17_000, len as u64 * 2_000);
        let (start, len) = c.next_chunk().expect("chunk");
        assert_eq!((start, len), (FIRST_CHUNK_MOVES, 1740));
        // A fast host: at most 4x.
        c.feedback(len, len as u64 * 17_000, len as u64 * 100);
        assert_eq!(c.next_chunk().expect("chunk").1, 4 * 1740);
        // A host slower than the GPU: double.
        c.feedback(100, 100 * 17_000, 100 * 5_000);
        assert_eq!(c.next_chunk().expect("chunk").1, 200);
        // Barely faster: at least 1.25x.
        c.feedback(200, 200 * 17_000, 200 * 3_300);
        assert_eq!(c.next_chunk().expect("chunk").1, 250);
        // Never past the largest chunk, nor the wave.
        c.feedback(60_000, 60_000 * 17_000, 60_000 * 100);
        assert_eq!(c.next_chunk().expect("chunk").1, MAX_CHUNK_MOVES);
        let mut small = Chunks::new(3000, 10.0);
        let mut total = 0;
        while let Some((start, len)) = small.next_chunk() {
            assert_eq!(start, total);
            total += len;
            small.feedback(len, len as u64, len as u64);
        }
        assert_eq!(total, 3000);
        // The last 200 of 1224 join the first chunk.
        let mut tail = Chunks::new(FIRST_CHUNK_MOVES + 200, 0.0);
        assert_eq!(tail.next_chunk(), Some((0, FIRST_CHUNK_MOVES + 200)));
        assert_eq!(tail.next_chunk(), None);
        // Unknown device rate, or nothing measured: doubling.
        let mut blind = Chunks::new(1 << 20, 0.0);
        blind.next_chunk();
        blind.feedback(FIRST_CHUNK_MOVES, 1 << 30, 1);
        assert_eq!(blind.next_chunk().expect("chunk").1, 2 * FIRST_CHUNK_MOVES);
    }
}
