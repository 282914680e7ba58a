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
use std::sync::Arc;

/// The number of values a thread's table holds.
pub(crate) const SLOTS: usize = 256;

thread_local! {
    static TABLE: RefCell<Vec<Option<Arc<str>>>> = RefCell::new(vec![None; SLOTS]);
}

/// `value` as an `Arc<str>`, the same one as last time if its slot still
/// holds it.
#[inline]
pub(crate) fn shared(value: &str) -> Arc<str> {
    let slot = slot(value.as_bytes());
    TABLE.with_borrow_mut(|table| match &mut table[slot] {
        Some(shared) if same(shared.as_bytes(), value.as_bytes()) => Arc::clone(shared),
        entry => Arc::clone(entry.insert(Arc::from(value))),
    })
}

/// The eight bytes of `bytes` from `at` on.
#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

/// The slot of `value`: a hash of its length and of three of its words
/// (first, middle, last; all of it if shorter), not of every byte — the
/// words tell apart values such as URLs that share a prefix and a suffix,
/// and a rare collision costs one allocation, not a wrong value.
#[inline]
fn slot(value: &[u8]) -> usize {
    let n = value.len();
    let mixed = if n >= 8 {
        word(value, 0) ^ word(value, n / 2 - 4).rotate_left(21) ^ word(value, n - 8).rotate_left(42)
    } else {
        value.iter().enumerate().fold(0u64, |w, (i, &b)| w | u64::from(b) << (8 * i))
    };
    let hash = (mixed ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (hash >> 32) as usize % SLOTS
}

/// `a == b`, a word at a time, inline (the values are short: a call to
/// `memcmp` costs more than the comparison).
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a == b;
    }
    let mut at = 0;
    while at + 8 <= n {
        if word(a, at) != word(b, at) {
            return false;
        }
        at += 8;
    }
    word(a, n - 8) == word(b, n - 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_compare_as_bytes_and_take_a_slot_in_the_table() {
        let texts: Vec<String> = (0..40)
            .flat_map(|n| ["x".repeat(n), format!("{}y", "x".repeat(n)), format!("y{}", "x".repeat(n))])
            .collect();
        for a in &texts {
            assert!(slot(a.as_bytes()) < SLOTS);
            for b in &texts {
                assert_eq!(same(a.as_bytes(), b.as_bytes()), a == b, "{a:?} {b:?}");
            }
        }
        // Values that differ only in the middle or at the end are told apart.
        let urls: Vec<String> =
            (0..64).map(|n| format!("https://www.nexmark.com/{n:04}/item.htm?query=1&channel_id={n}")).collect();
        let slots: std::collections::HashSet<usize> = urls.iter().map(|u| slot(u.as_bytes())).collect();
        assert!(slots.len() > 32, "{} slots for 64 URLs", slots.len());
    }

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
