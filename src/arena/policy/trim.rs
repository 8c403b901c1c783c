//! The default policy under an elastic arena's trim, in free mode: naive
//! trims too (its layout's blocks above the cut evacuated below it, its
//! bytes counted in `N`), and the arena evacuates its own blocks above the
//! cut if the potential `N + 2P - A - R` affords it. In mirror mode the
//! arena's layout is naive's and a trim moves both alike (`note_external`).

use std::time::Instant;

use super::bounded::{fits, Bounded};
use crate::arena::core::Core;
use crate::backend::Backend;
use crate::error::Result;
use crate::plan::Plan;

impl Bounded {
    /// Evacuates naive's layout below `cut`, then runs `plan`, which
    /// brings the arena's below it. Returns whether both now end at or
    /// below `cut`; `false`, with the arena's layout unchanged, where the
    /// potential does not afford the arena's plan.
    pub(crate) fn trim_free<B: Backend>(
        &mut self,
        core: &mut Core<B>,
        cut: u64,
        plan: Plan,
        t0: Instant,
    ) -> Result<bool> {
        let Some(shadow) = self.free.as_mut() else {
            return Ok(false);
        };
        if shadow.index.used_end() > cut {
            // Naive evacuates, or packs its layout where no evacuation fits.
            let Some((moved, bytes)) = shadow
                .naive_evacuation(cut)
                .or_else(|| shadow.naive_compaction(0, 1))
            else {
                return Ok(false);
            };
            if !self.affords_naive(core, &moved, bytes) || !self.naive_moved(core, &moved, bytes)? {
                return Ok(false);
            }
        }
        if core.index.used_end() <= cut {
            return Ok(true);
        }
        // Each moved byte costs once in `A` and, if its block leaves
        // naive's place, twice more in `R`.
        let t = plan.bytes_moved();
        if !fits(self.slack(core), t.saturating_mul(3)) {
            return Ok(false);
        }
        core.run(plan, t0)?;
        self.note_all(core);
        Ok(true)
    }
}
