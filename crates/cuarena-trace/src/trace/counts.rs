//! How many events of each action a trace held, and those it skipped.

use super::Action;

/// Distinct unknown action names remembered (further ones are counted
/// together), and the longest name kept: a hostile file can hold millions
/// of different names, and each costs memory.
const MAX_UNKNOWN_NAMES: usize = 16;
const MAX_NAME_CHARS: usize = 40;

/// Events per action, as read (every device together).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionCounts {
    /// Kept events, indexed as [`Action::ALL`].
    pub kept: [u64; 8],
    /// `snapshot` events (skipped).
    pub snapshot: u64,
    /// Events of an action this reader does not know (skipped), by name,
    /// first seen first; at most 16 names, of at most 40 characters.
    pub unknown: Vec<(String, u64)>,
    /// Skipped events of unknown actions beyond the named ones.
    pub unknown_unnamed: u64,
}

impl ActionCounts {
    /// Counts a kept event.
    pub(crate) fn keep(&mut self, action: Action) {
        let i = Action::ALL.iter().position(|a| *a == action).unwrap_or(0);
        self.kept[i] += 1;
    }

    /// Counts a skipped event of action `name`.
    pub(crate) fn skip(&mut self, name: &str) {
        if name == "snapshot" {
            self.snapshot += 1;
            return;
        }
        let name: String = name.chars().take(MAX_NAME_CHARS).collect();
        if let Some(slot) = self.unknown.iter_mut().find(|(n, _)| *n == name) {
            slot.1 += 1;
        } else if self.unknown.len() < MAX_UNKNOWN_NAMES {
            self.unknown.push((name, 1));
        } else {
            self.unknown_unnamed += 1;
        }
    }

    /// Events of `action` kept.
    pub fn of(&self, action: Action) -> u64 {
        Action::ALL
            .iter()
            .position(|a| *a == action)
            .map_or(0, |i| self.kept[i])
    }

    /// Events skipped (snapshot and unknown actions).
    pub fn skipped(&self) -> u64 {
        self.snapshot + self.unknown.iter().map(|u| u.1).sum::<u64>() + self.unknown_unnamed
    }

    /// One line: the kept actions with their counts, then what was skipped.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = Action::ALL
            .iter()
            .zip(self.kept)
            .filter(|(_, n)| *n > 0)
            .map(|(a, n)| format!("{n} {a}"))
            .collect();
        if parts.is_empty() {
            parts.push("no events".to_owned());
        }
        let mut line = parts.join(", ");
        if self.skipped() > 0 {
            let mut skipped = Vec::new();
            if self.snapshot > 0 {
                skipped.push(format!("{} snapshot", self.snapshot));
            }
            for (name, n) in &self.unknown {
                skipped.push(format!("{n} `{}`", name.escape_debug()));
            }
            if self.unknown_unnamed > 0 {
                skipped.push(format!("{} of other unknown actions", self.unknown_unnamed));
            }
            line.push_str(&format!("; skipped: {}", skipped.join(", ")));
        }
        line
    }
}
