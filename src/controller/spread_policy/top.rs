//! The first few of many, in an order, kept as they come: what a policy's status lists of
//! thousands of workloads (its workload statuses, the furthest-off distributions). A plan pushes
//! every workload; [`Top`] sorts and cuts back to what it keeps each time it holds twice that,
//! so memory stays bounded and the work stays linear in the workloads.

use std::cmp::Ordering;

/// At most `keep` items, the first in `order`, of all pushed.
#[derive(Clone, Debug)]
pub struct Top<T> {
    keep: usize,
    order: fn(&T, &T) -> Ordering,
    items: Vec<T>,
}

impl<T> Top<T> {
    pub fn new(keep: usize, order: fn(&T, &T) -> Ordering) -> Self {
        Self {
            keep,
            order,
            items: Vec::new(),
        }
    }

    pub fn push(&mut self, item: T) {
        self.items.push(item);
        if self.items.len() >= 2 * self.keep.max(1) {
            self.trim();
        }
    }

    /// Takes in another's items: the first of both are among the first of each.
    pub fn merge(&mut self, other: Top<T>) {
        self.items.extend(other.items);
        self.trim();
    }

    fn trim(&mut self) {
        self.items.sort_by(self.order);
        self.items.truncate(self.keep);
    }

    /// The kept items, in order.
    pub fn into_vec(mut self) -> Vec<T> {
        self.trim();
        self.items
    }
}

/// Equal when they hold the same items (the order is the owner's, fixed by its type).
impl<T: PartialEq> PartialEq for Top<T> {
    fn eq(&self, other: &Self) -> bool {
        self.keep == other.keep && self.items == other.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_in_order_of_however_many_and_never_holds_more_than_twice() {
        let mut top = Top::new(3, |a: &u32, b: &u32| b.cmp(a));
        for i in 0..1000 {
            top.push((i * 7919) % 1000);
            assert!(top.items.len() < 6);
        }
        assert_eq!(top.into_vec(), vec![999, 998, 997]);
    }

    #[test]
    fn merged_keeps_the_first_of_both() {
        let mut a = Top::new(2, u32::cmp);
        let mut b = Top::new(2, u32::cmp);
        for i in [5, 1, 9] {
            a.push(i);
        }
        for i in [4, 0, 8] {
            b.push(i);
        }
        a.merge(b);
        assert_eq!(a.into_vec(), vec![0, 1]);
        let mut few = Top::new(5, u32::cmp);
        few.push(2);
        assert_eq!(few.into_vec(), vec![2]);
    }
}
