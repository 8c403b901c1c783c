//! How numbers read on the screen: bytes in binary units (the exact count
//! beside them where a message needs it), ratios to peak live, plurals.

use cuarena::fmt_bytes;

/// `n` and the noun, singular for one (`1 block`, `2 blocks`).
pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Bytes as the screen shows them, with the exact count: `1.50 GiB
/// (1610612736 B)`; below 1 KiB just `N B`.
pub(crate) fn exact(b: u64) -> String {
    if b < 1024 {
        format!("{b} B")
    } else {
        format!("{} ({b} B)", fmt_bytes(b))
    }
}

/// `a / b` (b at least 1).
pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_and_bytes() {
        assert_eq!(count(1, "block", "blocks"), "1 block");
        assert_eq!(count(0, "block", "blocks"), "0 blocks");
        assert_eq!(exact(512), "512 B");
        assert_eq!(exact(3 << 30), "3.00 GiB (3221225472 B)");
    }
}
