//! In-memory partitions: for tests, examples and notebooks.

use std::sync::Arc;

use highwater_operators::key::Data;

use super::{Offset, PartitionReader, ReadStatus, Source, SourceError};
use crate::dead_letter::DeadLetter;

/// A bounded source whose partitions are vectors of records, read in order.
///
/// The offset of a partition is the index of the next record.
///
/// ```
/// use highwater::source::MemorySource;
/// let source = MemorySource::new(vec![vec![1u64, 2], vec![3]]);
/// # let _ = source;
/// ```
#[derive(Debug)]
pub struct MemorySource<T> {
    partitions: Vec<Arc<Vec<T>>>,
}

impl<T> MemorySource<T> {
    /// A source with one partition per vector.
    pub fn new(partitions: Vec<Vec<T>>) -> Self {
        MemorySource { partitions: partitions.into_iter().map(Arc::new).collect() }
    }
}

impl<T: Data + Sync> Source for MemorySource<T> {
    type Record = T;
    type Reader = MemoryReader<T>;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok((0..self.partitions.len()).map(|i| format!("memory-{i}")).collect())
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<MemoryReader<T>, SourceError> {
        let records = self.partitions.get(index).ok_or_else(|| SourceError::Config(format!("no partition {index}")))?;
        Ok(MemoryReader { records: Arc::clone(records), next: from.unwrap_or(0) as usize })
    }
}

/// Reads one in-memory partition.
#[derive(Debug)]
pub struct MemoryReader<T> {
    records: Arc<Vec<T>>,
    next: usize,
}

impl<T: Clone + 'static> PartitionReader for MemoryReader<T> {
    type Record = T;
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(T),
        _dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        let end = (self.next + max).min(self.records.len());
        self.records[self.next..end].iter().cloned().for_each(out);
        self.next = end;
        Ok(if end == self.records.len() { ReadStatus::End } else { ReadStatus::Data })
    }
    fn offset(&self) -> Offset {
        self.next as Offset
    }
}
