//! The digest of a sequence of rows, each already hashed to 128 bits: in
//! order (a BLAKE3 of the row hashes) or as a multiset (the wrapping sum of
//! the row hashes and their count, so any order of the same rows gives the
//! same digest). The multiset form detects accidents, not adversaries.

use super::Order;

pub struct Rows {
    order: Order,
    ordered: blake3::Hasher,
    sum: u128,
    count: u64,
}

impl Rows {
    pub fn new(order: Order) -> Rows {
        Rows {
            order,
            ordered: blake3::Hasher::new(),
            sum: 0,
            count: 0,
        }
    }

    pub fn push(&mut self, row: u128) {
        self.count += 1;
        match self.order {
            Order::Ordered => {
                self.ordered.update(&row.to_le_bytes());
            }
            Order::Free => self.sum = self.sum.wrapping_add(row),
        }
    }

    /// Feeds the digest of the rows into `h`.
    pub fn finish_into(self, h: &mut blake3::Hasher) {
        h.update(&self.count.to_le_bytes());
        match self.order {
            Order::Ordered => h.update(self.ordered.finalize().as_bytes()),
            Order::Free => h.update(&self.sum.to_le_bytes()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(order: Order, rows: &[u128]) -> blake3::Hash {
        let mut r = Rows::new(order);
        rows.iter().for_each(|x| r.push(*x));
        let mut h = blake3::Hasher::new();
        r.finish_into(&mut h);
        h.finalize()
    }

    #[test]
    fn free_order_ignores_order_and_ordered_does_not() {
        let (a, b) = ([1u128, 2, 3], [3u128, 1, 2]);
        assert_eq!(digest(Order::Free, &a), digest(Order::Free, &b));
        assert_ne!(digest(Order::Ordered, &a), digest(Order::Ordered, &b));
        // A repeated row counts (a multiset, not a set).
        assert_ne!(
            digest(Order::Free, &[1, 2]),
            digest(Order::Free, &[1, 2, 2])
        );
    }
}
