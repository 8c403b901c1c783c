//! The caching allocator's settings: what `PYTORCH_CUDA_ALLOC_CONF` sets,
//! as a snapshot's `allocator_settings` records them, and how they round a
//! request.

use std::fmt;

/// Bytes in a MiB (the unit of `max_split_size_mb`).
const MIB: u64 = 1 << 20;
/// Every request is rounded to a multiple of this (`kMinBlockSize`).
pub(crate) const MIN_BLOCK: u64 = 512;
/// `roundup_power2_divisions` has one entry per power-of-two interval from
/// 1 MiB (`kRoundUpPowerOfTwoIntervals`).
pub const ROUNDUP_INTERVALS: usize = 16;
/// `max_non_split_rounding_mb`'s default and floor (`kLargeBuffer`).
const LARGE_BUFFER: u64 = 20 * MIB;

/// The settings of PyTorch's CUDA caching allocator that change where
/// blocks go (the others, such as `pinned_*` or `release_lock_on_cudamalloc`,
/// do not). [`Default`] is PyTorch's default.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorSettings {
    /// `max_split_size_mb` in bytes: cached blocks this large or larger are
    /// never split, and serve only requests of at least this size;
    /// `u64::MAX` when unset (PyTorch records -1).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes: how much larger than a
    /// request of at least `max_split_size` an unsplit block may be
    /// (default 20 MiB).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions`: for each power-of-two interval of sizes
    /// from 1 MiB (`[1, 2) MiB`, `[2, 4) MiB`, ... the last one open), how
    /// many steps a request is rounded up to (0 or 1: to 512 B only).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold`: with a per-process memory fraction,
    /// cached blocks are freed once reserved bytes pass this share of it
    /// (0: never).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`: one growing segment per stream and pool,
    /// mapped in pages, instead of one `cudaMalloc` per segment.
    pub expandable_segments: bool,
}

impl Default for AllocatorSettings {
    fn default() -> Self {
        AllocatorSettings {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
        }
    }
}

impl AllocatorSettings {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` value (`key:value` pairs separated
    /// by commas; `roundup_power2_divisions` also as `[256:1,512:2,>:4]`),
    /// starting from the defaults. Keys that do not change placement
    /// (`backend:native`, `pinned_*`, `release_lock_on_cudamalloc`, ...) are
    /// accepted and ignored; `backend:cudaMallocAsync` is refused (a
    /// different allocator).
    pub fn parse_conf(conf: &str) -> Result<AllocatorSettings, String> {
        let mut s = AllocatorSettings::default();
        let tokens = lex(conf);
        let mut i = 0;
        let bad = |what: &str| format!("PYTORCH_CUDA_ALLOC_CONF `{conf}`: {what}");
        while i < tokens.len() {
            let key = tokens[i].as_str();
            if tokens.get(i + 1).map(String::as_str) != Some(":") {
                return Err(bad(&format!("`{key}` is not followed by `:`")));
            }
            i += 2;
            let value = tokens
                .get(i)
                .ok_or_else(|| bad(&format!("`{key}` has no value")))?;
            match key {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| bad(&format!("{key}: `{value}` is not a whole number")))?;
                    if mb < LARGE_BUFFER / MIB {
                        return Err(bad(&format!("{key}: {mb} is below PyTorch's minimum, 20")));
                    }
                    let bytes = mb.saturating_mul(MIB);
                    if key == "max_split_size_mb" {
                        s.max_split_size = bytes;
                    } else {
                        s.max_non_split_rounding = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| bad(&format!("{key}: `{value}` is not a number")))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(&format!("{key}: {t} is not in (0, 1)")));
                    }
                    s.garbage_collection_threshold = t;
                }
                "expandable_segments" => {
                    s.expandable_segments = match value.as_str() {
                        "True" => true,
                        "False" => false,
                        other => {
                            return Err(bad(&format!("{key}: `{other}` is not True or False")))
                        }
                    };
                }
                "roundup_power2_divisions" if value == "[" => {
                    i = parse_divisions_list(&tokens, i, &mut s.roundup_power2_divisions)
                        .map_err(|e| bad(&e))?;
                }
                "roundup_power2_divisions" => {
                    let d = power_of_two(value).map_err(|e| bad(&e))?;
                    s.roundup_power2_divisions = [d; ROUNDUP_INTERVALS];
                }
                "backend" if value != "native" => {
                    return Err(bad(&format!(
                        "backend:{value} is not the caching allocator this models"
                    )))
                }
                _ => {}
            }
            i += 1;
            match tokens.get(i).map(String::as_str) {
                None => {}
                Some(",") => i += 1,
                Some(other) => return Err(bad(&format!("`{other}` where a `,` belongs"))),
            }
        }
        Ok(s)
    }

    /// The request size the allocator hands out for `size` bytes
    /// (`round_size`): at least 512 B, a multiple of 512 B, or the next of
    /// `roundup_power2_divisions` steps in the size's power-of-two interval.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions(size);
        if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
            return next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }

    /// `roundup_power2_divisions` for a request of `size` bytes: the entry
    /// of its power-of-two interval from 1 MiB (below 1 MiB, the first).
    fn divisions(&self, size: u64) -> u64 {
        let log = 63 - u64::from(size.leading_zeros());
        let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS as u64 - 1);
        self.roundup_power2_divisions[index as usize]
    }

    /// The settings as a `PYTORCH_CUDA_ALLOC_CONF` value (empty for the
    /// defaults).
    pub fn conf(&self) -> String {
        let d = AllocatorSettings::default();
        let mut parts = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_owned());
        }
        if self.max_split_size != d.max_split_size {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size / MIB));
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        let r = &self.roundup_power2_divisions;
        if r.iter().all(|&x| x == r[0]) {
            if r[0] != 0 {
                parts.push(format!("roundup_power2_divisions:{}", r[0]));
            }
        } else {
            let items: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, x)| format!("{}:{x}", 1u64 << i))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        parts.join(",")
    }
}

impl fmt::Display for AllocatorSettings {
    /// The `PYTORCH_CUDA_ALLOC_CONF` value, or `default`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.conf() {
            c if c.is_empty() => f.write_str("default"),
            c => f.write_str(&c),
        }
    }
}

/// `size` rounded up to the next of `divisions` equal steps between the
/// powers of two around it (a power of two stays).
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down.saturating_add(step)
    }
}

/// Splits a conf string into words and the punctuation `, : [ ]`, spaces
/// dropped (as PyTorch's lexer does).
fn lex(conf: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in conf.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                out.push(c.to_string());
            }
            ' ' => {}
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn power_of_two(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(d) if d == 0 || d.is_power_of_two() => Ok(d),
        _ => Err(format!(
            "roundup_power2_divisions: `{v}` is not a power of two"
        )),
    }
}

/// `[MB:divisions, ..., >:divisions]` from `tokens[i] == "["`; returns the
/// index of the closing `]`.
fn parse_divisions_list(
    tokens: &[String],
    mut i: usize,
    out: &mut [u64; ROUNDUP_INTERVALS],
) -> Result<usize, String> {
    let mut first = true;
    let mut last = 0usize;
    loop {
        i += 1;
        let key = tokens.get(i).ok_or("roundup_power2_divisions: no `]`")?;
        if key == "]" {
            return Ok(i);
        }
        if tokens.get(i + 1).map(String::as_str) != Some(":") {
            return Err(format!("roundup_power2_divisions: `{key}` without `:`"));
        }
        let value = tokens
            .get(i + 2)
            .ok_or("roundup_power2_divisions: missing value")?;
        let d = power_of_two(value)?;
        i += 2;
        if key == ">" {
            out[last..].fill(d);
        } else {
            let mb: u64 = key
                .parse()
                .ok()
                .filter(|m: &u64| m.is_power_of_two())
                .ok_or_else(|| {
                    format!("roundup_power2_divisions: `{key}` is not a power of two")
                })?;
            let index = ((63 - mb.leading_zeros()) as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                out[..index].fill(d);
                first = false;
            }
            out[index] = d;
            last = index;
        }
        if tokens.get(i + 1).map(String::as_str) == Some(",") {
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_follows_the_divisions() {
        let d = AllocatorSettings::default();
        assert_eq!(d.round_size(1), 512);
        assert_eq!(d.round_size(513), 1024);
        assert_eq!(d.round_size(3 << 20), 3 << 20);
        // 4 divisions between 1 MiB and 2 MiB: 1.25, 1.5, 1.75 MiB.
        let four = AllocatorSettings::parse_conf("roundup_power2_divisions:4").unwrap();
        assert_eq!(four.round_size((1 << 20) + 1), (1 << 20) + (1 << 18));
        assert_eq!(
            four.round_size(1200),
            1536,
            "below 1 MiB: the first interval"
        );
        assert_eq!(four.round_size(1 << 21), 1 << 21);
        assert_eq!(four.conf(), "roundup_power2_divisions:4");
    }

    #[test]
    fn conf_strings_parse_and_print_back() {
        let s = AllocatorSettings::parse_conf(
            "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert!(s.expandable_segments);
        assert_eq!(s.max_split_size, 128 << 20);
        assert_eq!(
            s.conf(),
            "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6"
        );
        let l =
            AllocatorSettings::parse_conf("roundup_power2_divisions:[256:1,512:2,>:8]").unwrap();
        assert_eq!(l.roundup_power2_divisions[7], 1);
        assert_eq!(l.roundup_power2_divisions[8], 1);
        // As in PyTorch, `>` fills from the last interval named, that one
        // included.
        assert_eq!(l.roundup_power2_divisions[9], 8);
        assert_eq!(l.roundup_power2_divisions[15], 8);
        assert_eq!(
            AllocatorSettings::parse_conf("").unwrap(),
            AllocatorSettings::default()
        );
        assert_eq!(AllocatorSettings::default().to_string(), "default");
        for bad in [
            "max_split_size_mb:10",
            "expandable_segments:yes",
            "roundup_power2_divisions:3",
            "backend:cudaMallocAsync",
            "max_split_size_mb",
            "garbage_collection_threshold:1.5",
            "roundup_power2_divisions:[256:1",
        ] {
            assert!(AllocatorSettings::parse_conf(bad).is_err(), "{bad}");
        }
    }
}
