//! Deterministic damage to inputs, for the fuzz tests of every crate: a
//! seeded generator and one mutation at a time (truncation, bit flips, a
//! splice, a repeated block, two blocks swapped). Pure: the same seed and
//! input give the same cases on every machine.

/// xorshift64*: small, fast, and fixed by its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        // Zero is xorshift's one fixed point.
        if self.0 == 0 {
            self.0 = 0x9e37_79b9_7f4a_7c15;
        }
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// One mutation of `b` with blocks of at most `block_max` bytes, and its
/// name for the failure message.
pub fn mutate(rng: &mut Rng, b: &[u8], block_max: usize) -> (Vec<u8>, &'static str) {
    let mut v = b.to_vec();
    if v.is_empty() {
        return (v, "empty");
    }
    let block = |rng: &mut Rng| {
        let n = 1 + rng.below(b.len().min(block_max.max(1)));
        (rng.below(b.len() - n + 1), n)
    };
    match rng.below(5) {
        0 => {
            v.truncate(rng.below(v.len()));
            (v, "truncation")
        }
        1 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            (v, "bit flips")
        }
        2 => {
            let (at, n) = block(rng);
            let to = rng.below(v.len());
            v.splice(to..to, b[at..at + n].iter().copied());
            (v, "splice")
        }
        3 => {
            let (at, n) = block(rng);
            v.splice(at..at, b[at..at + n].iter().copied());
            (v, "repeated block")
        }
        _ => {
            let (a, n) = block(rng);
            let (c, m) = block(rng);
            if a + n <= c {
                let mut out = b[..a].to_vec();
                out.extend_from_slice(&b[c..c + m]);
                out.extend_from_slice(&b[a + n..c]);
                out.extend_from_slice(&b[a..a + n]);
                out.extend_from_slice(&b[c + m..]);
                v = out;
            }
            (v, "reordered blocks")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_cases() {
        let input = b"<osmChange><create><node id=\"1\"/></create></osmChange>";
        let run = |seed| {
            let mut r = Rng(seed);
            (0..50)
                .map(|_| mutate(&mut r, input, 16))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // Every kind of mutation comes up.
        let kinds: std::collections::BTreeSet<&str> = run(7).iter().map(|c| c.1).collect();
        assert_eq!(kinds.len(), 5, "{kinds:?}");
    }
}
