//! The fewest calls that still diverge: delta debugging over the sequence (remove a chunk,
//! keep the removal if the rest still diverges; chunks halve down to one call), then each
//! remaining call made simpler where it can be (fewer lines). The runner drives it: it asks
//! for a candidate, runs it against the server in a namespace of its own, and reports.

use crate::call::Call;

/// A shrink in progress.
#[derive(Debug)]
pub struct Shrinker {
    best: Vec<Call>,
    chunk: usize,
    at: usize,
    pending: Option<Vec<Call>>,
    attempts: usize,
}

impl Shrinker {
    /// `calls`: a sequence that diverges (up to and including the call that diverged).
    pub fn new(calls: Vec<Call>) -> Shrinker {
        let chunk = (calls.len() / 2).max(1);
        Shrinker {
            best: calls,
            chunk,
            at: 0,
            pending: None,
            attempts: 0,
        }
    }

    /// The next sequence to try, or `None` when no removal is left to try.
    pub fn candidate(&mut self) -> Option<Vec<Call>> {
        loop {
            if self.best.len() <= 1 {
                return None;
            }
            // The last call is the one that diverged: it stays.
            let removable = self.best.len() - 1;
            if self.at >= removable {
                if self.chunk == 1 {
                    return None;
                }
                self.chunk = (self.chunk / 2).max(1);
                self.at = 0;
                continue;
            }
            let end = (self.at + self.chunk).min(removable);
            let mut candidate = self.best[..self.at].to_vec();
            candidate.extend_from_slice(&self.best[end..]);
            self.pending = Some(candidate.clone());
            self.attempts += 1;
            return Some(candidate);
        }
    }

    /// What the last candidate did: `diverged` keeps it (and `upto`, the calls up to the one
    /// that diverged, becomes the sequence to shrink further).
    pub fn report(&mut self, diverged: Option<usize>) {
        let candidate = self.pending.take().expect("a candidate was asked for");
        match diverged {
            Some(upto) => {
                self.best = candidate[..=upto].to_vec();
                // Try the same place again: what follows moved into it.
            }
            None => self.at += self.chunk,
        }
    }

    pub fn best(&self) -> &[Call] {
        &self.best
    }

    pub fn attempts(&self) -> usize {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use super::Shrinker;
    use crate::call::Call;

    fn get(n: usize) -> Call {
        Call::GetReservation {
            reservation: format!("k{n}"),
        }
    }

    /// Diverges when both calls 3 and 7 are there, at the last of them.
    fn diverges(calls: &[Call]) -> Option<usize> {
        let a = calls.iter().position(|c| *c == get(3))?;
        let b = calls.iter().position(|c| *c == get(7))?;
        Some(a.max(b))
    }

    #[test]
    fn shrinks_to_the_calls_that_matter() {
        let calls: Vec<Call> = (0..10).map(get).collect();
        let upto = diverges(&calls).unwrap();
        let mut shrinker = Shrinker::new(calls[..=upto].to_vec());
        while let Some(candidate) = shrinker.candidate() {
            shrinker.report(diverges(&candidate));
        }
        assert_eq!(shrinker.best(), &[get(3), get(7)]);
    }
}
