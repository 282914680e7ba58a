//! Shared strings for values that repeat (a channel name, a URL): a value
//! seen recently on this thread is handed out again as the same `Arc<str>`
//! (a hash, a comparison and a reference count instead of an allocation and
//! a copy), and the records in flight share one copy of it.
//!
//! Each thread keeps a small direct-mapped table ([`SLOTS`] values, no lock:
//! a worker decodes on its own thread); a value whose slot holds another
//! one replaces it. So values that repeat often (Nexmark's four hot
//! channels, half of all bids) stay, rare ones cost what they cost without
//! the table, and the table never holds more than [`SLOTS`] values.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::Arc;

use rustc_hash::FxBuildHasher;

/// The number of values a thread's table holds.
pub(crate) const SLOTS: usize = 256;

thread_local! {
    static TABLE: RefCell<Vec<Option<Arc<str>>>> = RefCell::new(vec![None; SLOTS]);
}

/// `value` as an `Arc<str>`, the same one as last time if its slot still
/// holds it.
#[inline]
pub(crate) fn shared(value: &str) -> Arc<str> {
    let slot = FxBuildHasher.hash_one(value) as usize % SLOTS;
    TABLE.with_borrow_mut(|table| match &mut table[slot] {
        Some(shared) if **shared == *value => Arc::clone(shared),
        entry => Arc::clone(entry.insert(Arc::from(value))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_the_table_stays_bounded() {
        let a = shared("Google");
        let b = shared("Google");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*shared("Apple"), "Apple");
        let many: Vec<Arc<str>> = (0..4 * SLOTS).map(|i| shared(&i.to_string())).collect();
        for (i, value) in many.iter().enumerate() {
            assert_eq!(**value, *i.to_string());
        }
        let held = TABLE.with_borrow(|t| t.iter().flatten().count());
        assert!(held <= SLOTS);
        drop(many);
        // The table holds one reference to each value; a value it replaces
        // is freed with the last record holding it.
        TABLE.with_borrow(|t| {
            for value in t.iter().flatten() {
                let records = if Arc::ptr_eq(value, &a) { 2 } else { 0 };
                assert_eq!(Arc::strong_count(value), 1 + records);
            }
        });
    }
}
