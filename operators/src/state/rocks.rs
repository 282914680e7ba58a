//! Keyed state in RocksDB on local disk (feature `rocksdb`): state larger
//! than memory.
//!
//! Each stateful operator on each worker has a RocksDB database of its own
//! (so that its state can be taken at its own cut), in a fresh directory
//! under the configured one, removed when the operator is dropped: the
//! database is working storage, not the durable copy (that is the
//! checkpoint), so it is written without a write-ahead log. The operator's
//! keyed states share the database, each under a tag byte. Every process
//! shares one LRU block cache (index and filter blocks included, so it
//! bounds what reads hold in memory) between its databases; each database
//! has a bounded write buffer.
//!
//! A key is stored as `[tag][key in the order-preserving encoding of
//! `keycode`][routing hash, 8 bytes big-endian]`: one state is a prefix,
//! and keys close in value are close on disk, so that what a stream writes
//! at about the same time (consecutive ids, recent times) lands in a narrow
//! key range and compactions of the older ranges move files rather than
//! rewrite them; a range of keys, and the keys with a string prefix, are a
//! range scan. The routing hash lets a restore onto another worker count
//! skip the keys of other workers before decoding them. (Checkpoints taken
//! before this layout, `[tag][routing hash][postcard key]`, have no layout
//! marker under the reserved tag 255 and are read in their own layout.)
//! Values are postcard; a list state's
//! ([`Appendable`](super::Appendable)) are frames, and an append to a key
//! the activation did not read is a merge operand of one frame, which the
//! database's merge operator concatenates (so it is written without
//! reading the list, and put together when read or compacted). Reads go
//! through a cache of the activation: a value read is decoded once, a
//! value changed is encoded once, and what an activation changed is
//! written as one `WriteBatch` at its end ([`KeyedStateBackend::flush`]);
//! the cache is also written out whenever it holds [`SPILL_AT`] keys, so
//! that an activation (or a restore) touching millions of keys does not
//! hold them all.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rocksdb::merge_operator::MergeOperands;
use rocksdb::{BlockBasedOptions, Cache, DBCompressionType, Options, ReadOptions, WriteBatch, WriteOptions, DB};

use super::backend::{decode_stored, encode_stored, Appender, KeyedStateBackend, StateValue};
use crate::checkpoint::BackendFiles;
use crate::key::{route, Key, StateMap};

/// The number of keys an activation's cache holds before it is written out.
pub const SPILL_AT: usize = 16_384;

/// The environment variable naming the directory of [`RocksDbConfig::from_env`].
pub const STATE_DIR_ENV: &str = "HIGHWATER_STATE_DIR";
/// The environment variable giving the block cache size of
/// [`RocksDbConfig::from_env`] (`256MiB`, `1GiB`, or bytes).
pub const STATE_CACHE_ENV: &str = "HIGHWATER_STATE_CACHE";

/// A size that is not a number of bytes with an optional unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {0:?}: expected bytes with an optional unit (KiB, MiB, GiB), e.g. 256MiB")]
pub struct InvalidSize(pub String);

/// Parses a size such as `256MiB`, `1GiB`, `512KiB`, `64MB` or `1048576`.
///
/// ```
/// use highwater_operators::state::parse_size;
/// assert_eq!(parse_size("256MiB"), Ok(256 << 20));
/// assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
/// assert_eq!(parse_size("4096"), Ok(4096));
/// assert!(parse_size("lots").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<usize, InvalidSize> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits.parse().map_err(|_| InvalidSize(text.to_owned()))?;
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(InvalidSize(text.to_owned())),
    };
    n.checked_mul(scale).ok_or_else(|| InvalidSize(text.to_owned()))
}

/// Where and with how much memory the RocksDB backend keeps state.
///
/// ```
/// use highwater_operators::state::{Backend, RocksDbConfig};
/// let dir = std::env::temp_dir().join("highwater-doc-rocksdb");
/// let mut config = timely::Config::thread();
/// Backend::RocksDb(RocksDbConfig::new(&dir).cache(64 << 20)).configure(&mut config.worker);
/// assert!(matches!(Backend::of_config(&config.worker), Backend::RocksDb(_)));
/// ```
#[derive(Clone)]
pub struct RocksDbConfig {
    dir: PathBuf,
    cache_bytes: usize,
    write_buffer_bytes: usize,
    /// The block cache, made when the first database opens and shared by
    /// every database of this configuration (all the workers of a process).
    cache: Arc<OnceLock<Cache>>,
}

impl std::fmt::Debug for RocksDbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbConfig")
            .field("dir", &self.dir)
            .field("cache_bytes", &self.cache_bytes)
            .field("write_buffer_bytes", &self.write_buffer_bytes)
            .finish()
    }
}

impl PartialEq for RocksDbConfig {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
            && self.cache_bytes == other.cache_bytes
            && self.write_buffer_bytes == other.write_buffer_bytes
    }
}

impl Eq for RocksDbConfig {}

impl RocksDbConfig {
    /// The default block cache: 256 MiB per process.
    pub const DEFAULT_CACHE: usize = 256 << 20;
    /// The default write buffer (memtable) of each database: 16 MiB, at most
    /// three of them (two are written out together as one file).
    pub const DEFAULT_WRITE_BUFFER: usize = 16 << 20;

    /// State in databases under `dir` (made if missing), with the default cache.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RocksDbConfig {
            dir: dir.into(),
            cache_bytes: Self::DEFAULT_CACHE,
            write_buffer_bytes: Self::DEFAULT_WRITE_BUFFER,
            cache: Arc::new(OnceLock::new()),
        }
    }

    /// A block cache of `bytes` (shared by the process's databases).
    pub fn cache(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// A write buffer of `bytes` per database.
    pub fn write_buffer(mut self, bytes: usize) -> Self {
        self.write_buffer_bytes = bytes.max(1 << 20);
        self
    }

    /// The directory the databases are made under.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The block cache's size.
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// The configuration the environment gives: the directory
    /// `HIGHWATER_STATE_DIR` (default: `highwater-state` in the temporary
    /// directory) and the cache `HIGHWATER_STATE_CACHE` (default 256 MiB; a
    /// size that does not parse is warned about and ignored).
    pub fn from_env() -> Self {
        let dir =
            std::env::var_os(STATE_DIR_ENV).map_or_else(|| std::env::temp_dir().join("highwater-state"), PathBuf::from);
        let mut config = RocksDbConfig::new(dir);
        if let Ok(size) = std::env::var(STATE_CACHE_ENV) {
            match parse_size(&size) {
                Ok(bytes) => config.cache_bytes = bytes,
                Err(e) => tracing::warn!(%e, "{STATE_CACHE_ENV} is ignored"),
            }
        }
        config
    }

    fn block_cache(&self) -> &Cache {
        self.cache.get_or_init(|| Cache::new_lru_cache(self.cache_bytes))
    }

    /// Opens a new database for the operator `name` (its directory is removed
    /// when the last of its states is dropped).
    pub(crate) fn open(&self, name: &str) -> Result<Arc<OperatorDb>, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static SWEPT: OnceLock<()> = OnceLock::new();
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot make the state directory {}: {e}", self.dir.display()))?;
        SWEPT.get_or_init(|| sweep(&self.dir));
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let clean: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(48).collect();
        let dir = self.dir.join(format!("highwater-{}-{n}-{clean}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);

        let mut table = BlockBasedOptions::default();
        table.set_block_cache(self.block_cache());
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_bloom_filter(10.0, false);
        table.set_block_size(16 << 10);
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_block_based_table_factory(&table);
        options.set_write_buffer_size(self.write_buffer_bytes);
        options.set_max_write_buffer_number(3);
        // Most reads of a growing state miss (a new key): a bloom filter of
        // the memtables' keys answers them without a skip-list search.
        options.set_memtable_prefix_bloom_ratio(0.1);
        options.set_memtable_whole_key_filtering(true);
        options.set_level_compaction_dynamic_level_bytes(true);
        options.set_level_zero_file_num_compaction_trigger(8);
        options.set_level_zero_slowdown_writes_trigger(24);
        options.set_level_zero_stop_writes_trigger(36);
        options.set_compression_type(DBCompressionType::Lz4);
        // Compression only below the first three levels: the upper ones are
        // small (dynamic level sizes put ~90 % of the data at the bottom)
        // and rewritten soon, and compressing them cost ~15 % of the CPU of
        // an appending join (q20: 0.50 M -> 0.62 M events/s, BENCHMARKS.md).
        {
            use DBCompressionType::{Lz4, None as Uncompressed};
            options.set_compression_per_level(&[Uncompressed, Uncompressed, Uncompressed, Lz4, Lz4, Lz4, Lz4]);
        }
        // Two full memtables are flushed as one level-0 file: the merge
        // operands of a key in both are combined and half as many files
        // are compacted.
        options.set_min_write_buffer_number_to_merge(2);
        options.set_max_background_jobs(2);
        options.set_max_open_files(512);
        options.set_keep_log_file_num(2);
        options.set_merge_operator_associative(APPEND, concatenate);
        let db = DB::open_cf_descriptors(&options, &dir, [default_family(&options)])
            .map_err(|e| format!("cannot open RocksDB in {}: {e}", dir.display()))?;
        db.put(LAYOUT_KEY, ORDERED_LAYOUT).map_err(|e| format!("cannot write to RocksDB in {}: {e}", dir.display()))?;
        tracing::debug!(dir = %dir.display(), "opened a RocksDB state store");
        Ok(Arc::new(OperatorDb { layout: KeyLayout::Ordered, db: Some(db), dir, remove: true, routes: None }))
    }

    /// Opens the database in `dir` (a checkpoint's files) read-only, through
    /// this configuration's block cache; the files stay when it is dropped.
    ///
    /// With `routes`, `(worker, workers)`, iterations over its states pass
    /// only the keys whose routing hash falls on `worker` (a restore reads
    /// its own worker's keys, skipping the others before decoding them).
    pub(crate) fn open_read_only(&self, dir: &Path, routes: Option<(usize, usize)>) -> Result<Arc<OperatorDb>, String> {
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(self.block_cache());
        table.set_cache_index_and_filter_blocks(true);
        let mut options = Options::default();
        options.set_block_based_table_factory(&table);
        options.set_max_open_files(512);
        options.set_merge_operator_associative(APPEND, concatenate);
        let db = DB::open_cf_descriptors_read_only(&options, dir, [default_family(&options)], false)
            .map_err(|e| format!("cannot open the RocksDB checkpoint in {}: {e}", dir.display()))?;
        let layout = match db.get(LAYOUT_KEY) {
            Ok(None) => KeyLayout::RouteFirst,
            Ok(Some(marker)) if marker == ORDERED_LAYOUT => KeyLayout::Ordered,
            Ok(Some(marker)) => {
                return Err(format!(
                    "the RocksDB checkpoint in {} has keys laid out as {:?}, which this highwater does not know",
                    dir.display(),
                    String::from_utf8_lossy(&marker)
                ))
            }
            Err(e) => return Err(format!("cannot read the RocksDB checkpoint in {}: {e}", dir.display())),
        };
        let routes = routes.map(|(worker, workers)| (worker as u64, workers.max(1) as u64));
        Ok(Arc::new(OperatorDb { layout, db: Some(db), dir: dir.to_owned(), remove: false, routes }))
    }
}

/// The default column family with `options`, named when a database is
/// opened so that the handle exists: `batched_multi_get_cf` (the reads of
/// [`KeyedStateBackend::prefetch`]) needs it, and a database opened
/// without naming its families has no handle for it.
fn default_family(options: &Options) -> rocksdb::ColumnFamilyDescriptor {
    rocksdb::ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, options.clone())
}

/// The name of the merge operator of list states.
const APPEND: &str = "highwater.append";

/// The merge operator of list states ([`Appender`]): a value is a sequence
/// of frames, and an append one more frame, so merging is concatenating
/// (associative, so RocksDB also merges operands with each other).
fn concatenate(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let len = existing.map_or(0, <[u8]>::len) + operands.iter().map(<[u8]>::len).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(existing.unwrap_or_default());
    for operand in operands {
        out.extend_from_slice(operand);
    }
    Some(out)
}

/// Removes the databases of processes that are gone (killed before they
/// could remove their own): directories `highwater-<pid>-…` whose process
/// no longer runs (Linux; elsewhere nothing is removed).
fn sweep(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("highwater-")).and_then(|n| n.split('-').next())
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            tracing::info!(dir = %entry.path().display(), "removing the state of a process that is gone");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The key of the marker that names a database's key layout: under tag
/// 255, which no state has.
const LAYOUT_KEY: &[u8] = &[u8::MAX];
/// The marker's value for [`KeyLayout::Ordered`].
const ORDERED_LAYOUT: &[u8] = b"keycode+route";

/// How a database's keys are laid out (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyLayout {
    /// `[tag][keycode key][route]`, marked by [`LAYOUT_KEY`].
    Ordered,
    /// `[tag][route][postcard key]`: databases without a marker (checkpoints
    /// of highwater before the ordered layout), read only.
    RouteFirst,
}

/// One operator's database on one worker; removed from disk when dropped.
pub(crate) struct OperatorDb {
    layout: KeyLayout,
    db: Option<DB>,
    dir: PathBuf,
    /// Whether the directory is removed with the database (working
    /// databases are; a checkpoint's files opened to read are not).
    remove: bool,
    /// Of a checkpoint's files opened to restore one worker of several:
    /// `(worker, workers)`, the keys whose routing hash falls on the worker;
    /// iterations skip the others before decoding them.
    routes: Option<(u64, u64)>,
}

impl OperatorDb {
    fn db(&self) -> &DB {
        self.db.as_ref().expect("open until dropped")
    }

    /// The database's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stored key of `key` in the state tagged `tag`.
    fn key_bytes<K: Key>(&self, tag: u8, key: &K) -> Result<Vec<u8>, String> {
        let mut bytes = Vec::with_capacity(24);
        bytes.push(tag);
        match self.layout {
            KeyLayout::Ordered => {
                super::keycode::encode_into(key, &mut bytes).map_err(|e| e.to_string())?;
                bytes.extend_from_slice(&route(key).to_be_bytes());
                Ok(bytes)
            }
            KeyLayout::RouteFirst => {
                bytes.extend_from_slice(&route(key).to_be_bytes());
                postcard::to_extend(key, bytes).map_err(|e| e.to_string())
            }
        }
    }

    /// The routing hash in a stored key.
    fn route_in(&self, kb: &[u8]) -> Option<u64> {
        let bytes = match self.layout {
            KeyLayout::Ordered => kb.get(kb.len().checked_sub(8)?..)?,
            KeyLayout::RouteFirst => kb.get(1..9)?,
        };
        bytes.try_into().ok().map(u64::from_be_bytes)
    }

    /// The key in a stored key.
    fn decode_key<K: Key>(&self, kb: &[u8]) -> Result<K, String> {
        match self.layout {
            KeyLayout::Ordered => {
                let inner = kb.get(1..kb.len().saturating_sub(8).max(1)).unwrap_or_default();
                super::keycode::decode(inner).map_err(|e| e.to_string())
            }
            KeyLayout::RouteFirst => crate::checkpoint::decode_in::<K>(
                crate::checkpoint::StateEncoding::Postcard,
                kb.get(9..).unwrap_or_default(),
            )
            .map_err(|e| e.to_string()),
        }
    }

    /// The number of keys in the database (of all its keyed states).
    pub(crate) fn count_keys(&self) -> usize {
        let mut read = ReadOptions::default();
        read.set_total_order_seek(true);
        read.set_iterate_upper_bound(LAYOUT_KEY.to_vec());
        self.db().iterator_opt(rocksdb::IteratorMode::Start, read).take_while(Result::is_ok).count()
    }

    /// Takes a RocksDB checkpoint of the database into `dir` (which must not
    /// exist): the memtables are written out, and the live SST files are
    /// hard-linked, not copied, so it takes time proportional to what
    /// changed since the last one. The SST files are immutable and named
    /// uniquely within the database: with the database's identity
    /// ([`BackendFiles::identity`]) they name a file for good, which is what
    /// an incremental checkpoint puts into its store once.
    pub(crate) fn checkpoint(&self, dir: &Path) -> Result<BackendFiles, String> {
        let checkpoint = rocksdb::checkpoint::Checkpoint::new(self.db())
            .map_err(|e| format!("RocksDB checkpoint of {}: {e}", self.dir.display()))?;
        checkpoint
            .create_checkpoint(dir)
            .map_err(|e| format!("RocksDB checkpoint of {} into {}: {e}", self.dir.display(), dir.display()))?;
        let identity = std::fs::read_to_string(self.dir.join("IDENTITY"))
            .map_err(|e| format!("reading the identity of {}: {e}", self.dir.display()))?
            .trim()
            .to_owned();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| format!("listing {}: {e}", dir.display()))? {
            let entry = entry.map_err(|e| format!("listing {}: {e}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let size = entry.metadata().map_err(|e| format!("{}: {e}", entry.path().display()))?.len();
            files.push((name, size));
        }
        files.sort();
        Ok(BackendFiles { dir: dir.to_owned(), identity, files })
    }
}

impl Drop for OperatorDb {
    fn drop(&mut self) {
        drop(self.db.take());
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What the cache of an activation holds for a key.
struct Slot<V> {
    /// The value (`None`: absent, or removed).
    value: Option<V>,
    /// Whether it was (or may have been) changed: written back at the flush.
    dirty: bool,
}

/// Keyed state in a RocksDB database ([`Backend::RocksDb`](super::Backend::RocksDb)):
/// see the module's documentation.
pub struct RocksDbState<K, V> {
    db: Arc<OperatorDb>,
    tag: u8,
    /// The keys the activation touched.
    cache: StateMap<K, Slot<V>>,
    /// The number of keys, counting the cache's changes.
    len: usize,
    /// The first failure (reported by the next flush).
    failed: Mutex<Option<String>>,
    /// Of a list state: values are frames, appends merges ([`Appender`]).
    appender: Option<Appender<V>>,
    /// Appends of keys the activation did not read: stored key to the
    /// items' frames, written as one merge per key at the flush (or before
    /// the next read).
    pending: StateMap<Vec<u8>, Vec<u8>>,
    /// Stored keys of a list state known to exist (appended to, at most
    /// [`KNOWN_AT_MOST`], then forgotten at once): an append to one is not
    /// a new key, so only the others are looked up to count keys.
    known: rustc_hash::FxHashSet<Vec<u8>>,
    /// Keys written so far: the first [`KEYS_CHECKED`] and one in
    /// [`KEYS_CHECKED_EVERY`] after them are read back (see `flush`).
    keys_written: usize,
}

/// See [`RocksDbState`]'s `keys_written`.
const KEYS_CHECKED: usize = 8;
/// See [`KEYS_CHECKED`].
const KEYS_CHECKED_EVERY: usize = 1024;

/// How many keys a list state remembers as existing ([`RocksDbState`]'s
/// `known`): about 4 MiB of keys.
const KNOWN_AT_MOST: usize = 1 << 16;

impl<K, V> std::fmt::Debug for RocksDbState<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbState")
            .field("dir", &self.db.dir)
            .field("tag", &self.tag)
            .field("cached", &self.cache.len())
            .field("len", &self.len)
            .finish()
    }
}

impl<K: Key, V: StateValue> RocksDbState<K, V> {
    /// The state tagged `tag` (below 255) in `db` (empty: the database is new).
    pub(crate) fn new(db: Arc<OperatorDb>, tag: u8) -> Self {
        assert!(tag < u8::MAX, "at most 255 keyed states in an operator");
        RocksDbState {
            db,
            tag,
            cache: StateMap::default(),
            len: 0,
            failed: Mutex::new(None),
            keys_written: 0,
            appender: None,
            pending: StateMap::default(),
            known: rustc_hash::FxHashSet::default(),
        }
    }

    /// A list state ([`Appendable`](super::Appendable)): values are stored
    /// as frames, and appends to keys not read in the activation are
    /// written as merge operands (one frame each), without reading the value.
    ///
    /// The number of keys ([`len`](KeyedStateBackend::len)) counts a key first
    /// made by such an append when RocksDB's filters rule out that it exists
    /// (`key_may_exist`, no read; asked only for keys not appended to
    /// lately): a new key they cannot rule out (their false positives, about
    /// 1 %) is not counted until a pass over the whole state
    /// ([`retain`](KeyedStateBackend::retain)) counts again. It feeds the
    /// state's gauges, nothing the operator decides.
    pub fn with_appender(mut self, appender: Option<Appender<V>>) -> Self {
        self.appender = appender;
        self
    }

    fn decode_value(&self, bytes: &[u8]) -> Result<V, String> {
        decode_stored(self.appender.as_ref(), bytes)
    }

    fn encode_value(&self, value: &V) -> Result<Vec<u8>, String> {
        encode_stored(self.appender.as_ref(), value)
    }

    /// Writes the pending appends (before a read, which must see them).
    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut batch = WriteBatch::default();
        for (kb, frames) in self.pending.drain() {
            batch.merge(kb, frames);
        }
        if let Err(e) = self.write(batch) {
            self.fail(e);
        }
    }

    /// Takes a RocksDB checkpoint of this state's database (every keyed
    /// state of its operator) into `dir`, which must not exist, by hard
    /// links: see [`BackendFiles`]. What was changed since the last
    /// [`flush`](KeyedStateBackend::flush) is not in it.
    ///
    /// # Errors
    /// RocksDB's, or the file system's, as a message.
    pub fn checkpoint_database(&self, dir: &Path) -> Result<BackendFiles, String> {
        self.db.checkpoint(dir)
    }

    fn fail(&self, reason: String) {
        let mut failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        failed.get_or_insert(reason);
    }

    fn key_bytes(&self, key: &K) -> Option<Vec<u8>> {
        match self.db.key_bytes(self.tag, key) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.fail(format!("a key of the state does not encode: {e} ({key:?})"));
                None
            }
        }
    }

    /// Reads `key` from the database.
    fn read(&self, key: &K) -> Option<V> {
        let kb = self.key_bytes(key)?;
        match self.db.db().get_pinned(&kb) {
            Ok(Some(bytes)) => match self.decode_value(&bytes) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail(format!("a stored value does not decode: {e} (key {key:?})"));
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                self.fail(format!("RocksDB read failed: {e}"));
                None
            }
        }
    }

    /// Brings `key` into the cache (marked `dirty` if it is to change);
    /// whether it has a value.
    fn load(&mut self, key: &K, dirty: bool) -> bool {
        if let Some(slot) = self.cache.get_mut(key) {
            slot.dirty |= dirty;
            return slot.value.is_some();
        }
        if self.cache.len() >= SPILL_AT {
            if let Err(e) = self.flush() {
                self.fail(e);
            }
        }
        self.write_pending();
        let value = self.read(key);
        let present = value.is_some();
        self.cache.insert(key.clone(), Slot { value, dirty });
        present
    }

    /// The bounds of this state's keys.
    fn bounds(&self) -> ReadOptions {
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(vec![self.tag]);
        read.set_iterate_upper_bound(vec![self.tag + 1]);
        read.fill_cache(false);
        read.set_total_order_seek(true);
        read
    }

    /// Calls `each` with every stored key and value the cache does not hold,
    /// decoded, with the stored key's bytes and value's bytes; what does not
    /// decode is reported by the next flush.
    fn for_each_stored(&self, mut each: impl FnMut(&[u8], &[u8], K, V)) {
        let mut it = self.db.db().raw_iterator_opt(self.bounds());
        it.seek_to_first();
        while it.valid() {
            let (Some(kb), Some(vb)) = (it.key(), it.value()) else { break };
            if let Some((worker, workers)) = self.db.routes {
                if self.db.route_in(kb).is_some_and(|r| r % workers != worker) {
                    it.next();
                    continue;
                }
            }
            match self.db.decode_key::<K>(kb) {
                Ok(key) if self.cache.contains_key(&key) => {}
                Ok(key) => match self.decode_value(vb) {
                    Ok(v) => each(kb, vb, key, v),
                    Err(e) => self.fail(format!("a stored value does not decode: {e} (key {key:?})")),
                },
                Err(e) => self.fail(format!("a stored key does not decode: {e}")),
            }
            it.next();
        }
        if let Err(e) = it.status() {
            self.fail(format!("RocksDB iteration failed: {e}"));
        }
    }

    /// Writes `batch`, without the write-ahead log (see the module).
    fn write(&self, batch: WriteBatch) -> Result<(), String> {
        let mut options = WriteOptions::default();
        options.disable_wal(true);
        self.db.db().write_opt(batch, &options).map_err(|e| format!("RocksDB write failed: {e}"))
    }

    /// A pass over every stored key not in the cache: `visit` may change the
    /// value (written back if its encoding changed) or return false to
    /// remove it. Written in batches as it goes; the cache's keys are the
    /// caller's. Counts the keys again: those the cache holds and those the
    /// pass kept.
    fn pass_stored(&mut self, visit: &mut dyn FnMut(&K, &mut V) -> bool) {
        self.write_pending();
        self.known.clear();
        let mut batch = WriteBatch::default();
        let mut kept = 0;
        let mut failures = Vec::new();
        self.for_each_stored(|kb, vb, k, mut v| {
            if !visit(&k, &mut v) {
                batch.delete(kb);
            } else {
                kept += 1;
                match self.encode_value(&v) {
                    Ok(new) if new != vb => batch.put(kb, new),
                    Ok(_) => {}
                    Err(e) => failures.push(format!("a value of the state does not encode: {e} (key {k:?})")),
                }
            }
            if batch.len() >= 4096 {
                if let Err(e) = self.write(std::mem::take(&mut batch)) {
                    failures.push(e);
                }
            }
        });
        if !batch.is_empty() {
            if let Err(e) = self.write(batch) {
                failures.push(e);
            }
        }
        self.len = kept + self.cache.values().filter(|slot| slot.value.is_some()).count();
        for f in failures {
            self.fail(f);
        }
    }
}

impl<K: Key, V: StateValue> KeyedStateBackend<K, V> for RocksDbState<K, V> {
    fn get(&mut self, key: &K) -> Option<&V> {
        self.load(key, false);
        self.cache.get(key).and_then(|s| s.value.as_ref())
    }
    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.load(key, true);
        self.cache.get_mut(key).and_then(|s| s.value.as_mut())
    }
    fn get_or_insert_with(&mut self, key: K, make: &mut dyn FnMut() -> V) -> &mut V {
        if !self.load(&key, true) {
            self.len += 1;
        }
        let slot = self.cache.entry(key).or_insert(Slot { value: None, dirty: true });
        slot.value.get_or_insert_with(make)
    }
    fn insert(&mut self, key: K, value: V) -> Option<V> {
        if !self.load(&key, true) {
            self.len += 1;
        }
        let slot = self.cache.entry(key).or_insert(Slot { value: None, dirty: true });
        slot.value.replace(value)
    }
    fn remove(&mut self, key: &K) -> Option<V> {
        if !self.load(key, true) {
            return None;
        }
        if !self.known.is_empty() {
            if let Some(kb) = self.key_bytes(key) {
                self.known.remove(&kb);
            }
        }
        self.len = self.len.saturating_sub(1);
        self.cache.get_mut(key).and_then(|s| s.value.take())
    }
    fn len(&self) -> usize {
        self.len
    }
    fn reserve(&mut self, n: usize) {
        self.cache.reserve(n.min(SPILL_AT));
    }
    fn appends_blindly(&self) -> bool {
        self.appender.is_some()
    }
    fn append_encoded(&mut self, key: &K, item: &[u8]) {
        let Some(appender) = self.appender else { return };
        if let Some(slot) = self.cache.get_mut(key) {
            slot.dirty = true;
            if slot.value.is_none() {
                self.len += 1;
            }
            if let Err(e) = appender.apply(slot.value.get_or_insert_with(|| appender.make()), item) {
                self.fail(e);
            }
            return;
        }
        let Some(kb) = self.key_bytes(key) else { return };
        if let Some(frames) = self.pending.get_mut(&kb) {
            Appender::<V>::item_frame(frames, item);
            return;
        }
        if self.pending.len() >= SPILL_AT {
            self.write_pending();
        }
        if !self.known.contains(&kb) {
            if !self.db.db().key_may_exist(&kb) {
                self.len += 1;
            }
            if self.known.len() >= KNOWN_AT_MOST {
                self.known.clear();
            }
            self.known.insert(kb.clone());
        }
        let mut frames = Vec::with_capacity(item.len() + 4);
        Appender::<V>::item_frame(&mut frames, item);
        self.pending.insert(kb, frames);
    }
    /// From the first stored entries (the bytes as stored: key without
    /// its tag and route, value), as [`sampled_bytes`](super::backend::sampled_bytes) does.
    fn approximate_bytes(&self) -> Option<u64> {
        let mut it = self.db.db().raw_iterator_opt(self.bounds());
        it.seek_to_first();
        let (mut n, mut bytes) = (0u64, 0u64);
        while it.valid() && n < super::backend::SAMPLE as u64 {
            let (Some(kb), Some(vb)) = (it.key(), it.value()) else { break };
            bytes += (kb.len().saturating_sub(9) + vb.len()) as u64;
            n += 1;
            it.next();
        }
        Some(if n == 0 { 0 } else { (bytes as f64 / n as f64 * self.len as f64).round() as u64 })
    }
    fn database_checkpoint(&self, dir: &Path) -> Option<Result<BackendFiles, String>> {
        Some(self.checkpoint_database(dir))
    }
    fn prefetch(&mut self, keys: &mut dyn Iterator<Item = &K>) {
        let mut wanted: Vec<(K, Vec<u8>)> = Vec::new();
        for key in keys {
            if self.cache.len() + wanted.len() >= SPILL_AT {
                break;
            }
            if !self.cache.contains_key(key) {
                if let Some(kb) = self.key_bytes(key) {
                    wanted.push((key.clone(), kb));
                }
            }
        }
        if wanted.is_empty() {
            return;
        }
        self.write_pending();
        wanted.sort_unstable_by(|a, b| a.1.cmp(&b.1));
        wanted.dedup_by(|a, b| a.1 == b.1);
        let db = self.db.db();
        let Some(cf) = db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME) else {
            self.fail("RocksDB has no handle of its default column family".into());
            return;
        };
        let read = db.batched_multi_get_cf(cf, wanted.iter().map(|(_, kb)| kb), true);
        let mut failures = Vec::new();
        let mut found = Vec::with_capacity(wanted.len());
        for ((key, _), result) in wanted.into_iter().zip(read) {
            let value = match result {
                Ok(Some(bytes)) => match self.decode_value(&bytes) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        failures.push(format!("a stored value does not decode: {e} (key {key:?})"));
                        None
                    }
                },
                Ok(None) => None,
                Err(e) => {
                    failures.push(format!("RocksDB read failed: {e}"));
                    None
                }
            };
            found.push((key, value));
        }
        for f in failures {
            self.fail(f);
        }
        for (key, value) in found {
            self.cache.entry(key).or_insert(Slot { value, dirty: false });
        }
    }
    fn for_each(&self, each: &mut dyn FnMut(&K, &V)) {
        match self.appender.filter(|_| !self.pending.is_empty()) {
            None => self.for_each_stored(|_, _, k, v| each(&k, &v)),
            Some(appender) => {
                // The pending appends, onto the stored values or on their
                // own (the keys applied are borrowed from `pending`).
                let mut applied = rustc_hash::FxHashSet::<&[u8]>::default();
                self.for_each_stored(|kb, _, k, v| match self.pending.get_key_value(kb) {
                    None => each(&k, &v),
                    Some((pending_key, frames)) => match appender.extend(Some(v), frames) {
                        Ok(v) => {
                            applied.insert(pending_key);
                            each(&k, &v);
                        }
                        Err(e) => self.fail(e),
                    },
                });
                for (kb, frames) in &self.pending {
                    if applied.contains(kb.as_slice()) {
                        continue;
                    }
                    let key = self.db.decode_key::<K>(kb);
                    match (key, appender.decode(frames)) {
                        (Ok(k), Ok(v)) => each(&k, &v),
                        (Err(e), _) => self.fail(format!("a pending key does not decode: {e}")),
                        (_, Err(e)) => self.fail(e),
                    }
                }
            }
        }
        for (k, slot) in &self.cache {
            if let Some(v) = &slot.value {
                each(k, v);
            }
        }
    }
    fn for_each_mut(&mut self, each: &mut dyn FnMut(&K, &mut V)) {
        for (k, slot) in &mut self.cache {
            if let Some(v) = &mut slot.value {
                slot.dirty = true;
                each(k, v);
            }
        }
        self.pass_stored(&mut |k, v| {
            each(k, v);
            true
        });
    }
    fn retain(&mut self, keep: &mut dyn FnMut(&K, &mut V) -> bool) {
        for (k, slot) in &mut self.cache {
            if let Some(v) = &mut slot.value {
                slot.dirty = true;
                if !keep(k, v) {
                    slot.value = None;
                }
            }
        }
        self.pass_stored(keep);
    }
    fn clear(&mut self) {
        self.cache.clear();
        self.pending.clear();
        self.known.clear();
        self.len = 0;
        let mut batch = WriteBatch::default();
        // Tags stop below 255 (the opener's limit): `tag + 1` bounds them.
        batch.delete_range(vec![self.tag], vec![self.tag + 1]);
        if let Err(e) = self.write(batch) {
            self.fail(e);
        }
    }
    fn flush(&mut self) -> Result<(), String> {
        let appender = self.appender;
        let mut first_error = None;
        let mut kept = StateMap::default();
        let mut batch = WriteBatch::default();
        for (k, slot) in self.cache.drain() {
            if !slot.dirty {
                continue;
            }
            let Ok(kb) = self.db.key_bytes(self.tag, &k) else {
                first_error.get_or_insert_with(|| format!("a key of the state does not encode ({k:?})"));
                kept.insert(k, slot);
                continue;
            };
            // A sample of the keys must read back from the key encoding
            // (ordered, not self-describing): a key type that cannot fails
            // here, when it is written, not when a checkpoint is restored.
            self.keys_written += 1;
            if self.keys_written <= KEYS_CHECKED || self.keys_written % KEYS_CHECKED_EVERY == 0 {
                if let Err(e) = self.db.decode_key::<K>(&kb) {
                    first_error.get_or_insert_with(|| {
                        format!(
                            "a key of type `{}` does not read back from the RocksDB backend's ordered key \
                             encoding, which is not self-describing: {e} (key {k:?}); key the state by \
                             integers, strings, tuples, structs or enums of them (a `Decimal` as its string, \
                             say), or use the memory backend",
                            std::any::type_name::<K>()
                        )
                    });
                    kept.insert(k, slot);
                    continue;
                }
            }
            match &slot.value {
                None => batch.delete(kb),
                Some(v) => match encode_stored(appender.as_ref(), v) {
                    Ok(vb) => batch.put(kb, vb),
                    Err(e) => {
                        first_error
                            .get_or_insert_with(|| format!("a value of the state does not encode: {e} (key {k:?})"));
                        kept.insert(k, slot);
                    }
                },
            }
        }
        self.cache = kept;
        for (kb, frames) in self.pending.drain() {
            batch.merge(kb, frames);
        }
        if !batch.is_empty() {
            if let Err(e) = self.write(batch) {
                first_error.get_or_insert(e);
            }
        }
        let failed = self.failed.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match failed.or(first_error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_config(name: &str) -> RocksDbConfig {
        let dir = std::env::temp_dir().join(format!("highwater-rocks-unit-{name}-{}", std::process::id()));
        RocksDbConfig::new(dir).cache(8 << 20)
    }

    /// A key type that does not read back from the ordered key encoding
    /// (`Decimal` asks for a self-describing format) fails the flush that
    /// writes it, naming the type; values of any serde type are kept.
    #[test]
    fn keys_that_do_not_read_back_fail_when_written() {
        let config = temp_config("keys-read-back");
        let db = config.open("keys").expect("opens");
        let mut by_decimal = RocksDbState::<rust_decimal::Decimal, u32>::new(Arc::clone(&db), 0);
        by_decimal.insert(rust_decimal::Decimal::new(1999, 2), 1);
        let error = by_decimal.flush().expect_err("a Decimal key cannot be read back");
        assert!(error.contains("Decimal") && error.contains("memory backend"), "{error}");
        let mut of_decimal = RocksDbState::<String, rust_decimal::Decimal>::new(db, 1);
        of_decimal.insert("a".into(), rust_decimal::Decimal::new(1999, 2));
        of_decimal.flush().expect("values of any serde type");
        of_decimal.cache.clear();
        assert_eq!(of_decimal.get(&"a".to_owned()), Some(&rust_decimal::Decimal::new(1999, 2)));
    }

    /// The RocksDB backend against a hash map, through random operations
    /// with flushes, prefetches and whole-state passes in between, on two
    /// states of one database, more keys than the cache spills at.
    #[test]
    fn rocksdb_agrees_with_a_map() {
        let config = temp_config("agree");
        let db = config.open("agree").expect("opens");
        let dir = db.dir.clone();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut states = [RocksDbState::<u32, Vec<u32>>::new(Arc::clone(&db), 0), RocksDbState::new(db, 1)];
        let mut models = [std::collections::HashMap::<u32, Vec<u32>>::new(), std::collections::HashMap::new()];
        for step in 0..60_000u32 {
            let which = (next() % 2) as usize;
            let (st, model) = (&mut states[which], &mut models[which]);
            let k = (next() % 40_000) as u32;
            match next() % 100 {
                0..=29 => assert_eq!(st.insert(k, vec![step]), model.insert(k, vec![step])),
                30..=39 => assert_eq!(st.remove(&k), model.remove(&k)),
                40..=59 => assert_eq!(st.get(&k), model.get(&k)),
                60..=79 => {
                    st.get_or_insert_with(k, &mut Vec::new).push(step);
                    model.entry(k).or_default().push(step);
                }
                80..=89 => {
                    if let Some(v) = st.get_mut(&k) {
                        v.push(step);
                    }
                    if let Some(v) = model.get_mut(&k) {
                        v.push(step);
                    }
                }
                90 => {
                    let keys: Vec<u32> = (0..50).map(|_| (next() % 40_000) as u32).collect();
                    st.prefetch(&mut keys.iter());
                }
                91 if step % 7 == 0 => {
                    let m = next() % 5;
                    st.retain(&mut |k, v| (*k as u64 + v.len() as u64) % 5 != m);
                    model.retain(|k, v| (*k as u64 + v.len() as u64) % 5 != m);
                }
                93 if step % 53 == 0 => {
                    st.clear();
                    model.clear();
                }
                92 if step % 7 == 0 => {
                    st.for_each_mut(&mut |_, v| v.push(1));
                    model.values_mut().for_each(|v| v.push(1));
                }
                _ => st.flush().expect("flushes"),
            }
            assert_eq!(st.len(), model.len());
        }
        for (st, model) in states.iter_mut().zip(models) {
            st.flush().expect("flushes");
            let mut listed = Vec::new();
            st.for_each(&mut |k, v| listed.push((*k, v.clone())));
            listed.sort();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort();
            assert_eq!(listed.len(), expected.len());
            assert_eq!(listed, expected);
        }
        assert!(dir.exists());
        drop(states);
        assert!(!dir.exists(), "the database is removed with its last state");
    }

    /// RocksDB checkpoints by hard link: the second one, after a small
    /// change to a large state, shares all but a small part of its SST
    /// bytes with the first; its files reopen as a database with the state.
    #[test]
    fn a_checkpoint_after_a_small_change_adds_few_new_bytes() {
        let config = temp_config("checkpoint");
        let db = config.open("checkpoint").expect("opens");
        let scratch = db.dir.with_extension("checkpoints");
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).unwrap();
        let mut state = RocksDbState::<u64, String>::new(Arc::clone(&db), 0);
        let value = |k: u64| format!("{k:08}-{}", "x".repeat(200));
        for k in 0..100_000u64 {
            state.insert(k, value(k));
            if k % 5000 == 0 {
                state.flush().unwrap();
            }
        }
        state.flush().unwrap();
        let first = state.checkpoint_database(&scratch.join("1")).expect("checkpoint 1");
        let total: u64 = first.new_since(None).iter().map(|(_, size)| size).sum();
        for k in 100_000..101_000u64 {
            state.insert(k, value(k));
        }
        state.flush().unwrap();
        let second = state.checkpoint_database(&scratch.join("2")).expect("checkpoint 2");
        let new: u64 = second.new_since(Some(&first)).iter().map(|(_, size)| size).sum();
        let all: u64 = second.files.iter().filter(|(n, _)| BackendFiles::is_shared(n)).map(|(_, s)| s).sum();
        assert!(total > 1_000_000, "the state is large: {total} bytes");
        assert!(new * 10 < all, "a 1% change added {new} of {all} bytes");
        assert_eq!(first.identity, second.identity);
        // The second checkpoint's files are a database holding the state
        // (and the marker of its key layout).
        let reopened = DB::open_for_read_only(&Options::default(), scratch.join("2"), false).expect("reopens");
        assert_eq!(reopened.iterator(rocksdb::IteratorMode::Start).count(), 101_001);
        assert_eq!(reopened.get(LAYOUT_KEY).unwrap().as_deref(), Some(ORDERED_LAYOUT));
        drop(reopened);
        drop(state);
        drop(db);
        let _ = std::fs::remove_dir_all(&scratch);
    }

    /// A list state on RocksDB: appends to keys not read in the activation
    /// are merges, and every read, listing (with merges not yet written)
    /// and whole-state pass sees them; its checkpoint's files, holding
    /// merge operands, read back as the same lists.
    #[test]
    fn rocksdb_list_state_agrees_with_a_map() {
        use crate::state::backend::list_testing::{self, Seen};
        let config = temp_config("list");
        let db = config.open("list").expect("opens");
        let scratch = db.dir.with_extension("checkpoint");
        let _ = std::fs::remove_dir_all(&scratch);
        let mut state = RocksDbState::<u32, Seen>::new(Arc::clone(&db), 0).with_appender(Some(Appender::of()));
        assert!(state.appends_blindly());
        list_testing::agrees_with_a_map(&mut state, 20_000, false);
        // Appends the reopened files hold as merge operands.
        for k in 0..100u32 {
            state.append_encoded(&k, &crate::checkpoint::encode(&1_000_000u32).unwrap());
        }
        state.flush().unwrap();
        let mut expected = Vec::new();
        state.for_each(&mut |k, v| expected.push((*k, v.clone())));
        expected.sort_by_key(|(k, _)| *k);
        state.checkpoint_database(&scratch).expect("checkpoint");
        let files = config.open_read_only(&scratch, None).expect("reopens");
        let reopened = RocksDbState::<u32, Seen>::new(files, 0).with_appender(Some(Appender::of()));
        let mut listed = Vec::new();
        reopened.for_each(&mut |k, v| listed.push((*k, v.clone())));
        listed.sort_by_key(|(k, _)| *k);
        assert_eq!(listed, expected);
        drop(reopened);
        drop(state);
        drop(db);
        let _ = std::fs::remove_dir_all(&scratch);
    }

    /// A prefetch reads the keys into the activation's cache in one
    /// call, present and absent ones alike, so that the reads after it do
    /// not go to the database.
    #[test]
    fn a_prefetch_brings_the_keys_into_the_cache() {
        let config = temp_config("prefetch");
        let db = config.open("prefetch").expect("opens");
        let mut state = RocksDbState::<u32, String>::new(db, 0);
        for k in 0..100u32 {
            state.insert(k, format!("v{k}"));
        }
        state.flush().unwrap();
        assert!(state.cache.is_empty());
        let keys: Vec<u32> = (50..150).collect();
        state.prefetch(&mut keys.iter());
        assert_eq!(state.cache.len(), 100, "every key prefetched is in the cache");
        assert_eq!(state.cache.values().filter(|slot| slot.value.is_some()).count(), 50);
        assert!(state.cache.values().all(|slot| !slot.dirty));
        assert_eq!(state.get(&70).map(String::as_str), Some("v70"));
        assert_eq!(state.get(&120), None);
        state.flush().expect("no failure");
    }

    /// Checkpoints taken before the ordered key layout (no layout marker,
    /// keys `[tag][route][postcard key]`) restore as they were, one worker's
    /// keys at a time; a marker this version does not know is an error.
    #[test]
    fn checkpoints_of_the_route_first_layout_read_back() {
        let config = temp_config("legacy");
        let dir = config.dir().join("legacy-checkpoint");
        let _ = std::fs::remove_dir_all(&dir);
        let mut options = Options::default();
        options.create_if_missing(true);
        let raw = DB::open(&options, &dir).expect("opens");
        let model: std::collections::BTreeMap<u64, String> = (0..500u64).map(|k| (k * 7, format!("v{k}"))).collect();
        for (k, v) in &model {
            let mut kb = vec![0u8];
            kb.extend_from_slice(&route(k).to_be_bytes());
            let kb = postcard::to_extend(k, kb).unwrap();
            raw.put(kb, postcard::to_allocvec(v).unwrap()).unwrap();
        }
        drop(raw);
        for worker in 0..2 {
            let db = config.open_read_only(&dir, Some((worker, 2))).expect("opens read-only");
            assert_eq!(db.layout, KeyLayout::RouteFirst);
            let state = RocksDbState::<u64, String>::new(db, 0);
            let mut seen = std::collections::BTreeMap::new();
            // The route-first layout is that of checkpoints before format 5,
            // whose values are postcard.
            crate::checkpoint::reading_stored(crate::checkpoint::StateEncoding::Postcard, || {
                state.for_each(&mut |k, v| {
                    seen.insert(*k, v.clone());
                })
            });
            let expected: std::collections::BTreeMap<u64, String> =
                model.iter().filter(|(k, _)| route(*k) % 2 == worker as u64).map(|(k, v)| (*k, v.clone())).collect();
            assert!(!expected.is_empty());
            assert_eq!(seen, expected);
        }
        let raw = DB::open(&options, &dir).expect("opens");
        raw.put(LAYOUT_KEY, b"from the future").unwrap();
        drop(raw);
        let err = config.open_read_only(&dir, None).err().expect("refused");
        assert!(err.contains("from the future"), "{err}");
        let _ = std::fs::remove_dir_all(config.dir());
    }

    /// Keys of the ordered layout: consecutive ids are stored next to each
    /// other, and a restore of one worker of several passes exactly its keys.
    #[test]
    fn ordered_keys_are_adjacent_and_split_by_route() {
        let config = temp_config("ordered");
        let db = config.open("ordered").expect("opens");
        let mut state = RocksDbState::<(u32, u64), u8>::new(Arc::clone(&db), 3);
        let keys: Vec<(u32, u64)> = (0..300u64).map(|i| ((i % 3) as u32, 1000 + i)).collect();
        for k in &keys {
            state.insert(*k, 1);
        }
        state.flush().unwrap();
        let mut stored = Vec::new();
        state.for_each_stored(|kb, _, k, _| stored.push((kb.to_vec(), k)));
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(stored.iter().map(|(_, k)| *k).collect::<Vec<_>>(), sorted, "stored in key order");
        assert!(stored.iter().all(|(kb, k)| kb[0] == 3 && db.route_in(kb) == Some(route(k))));
        let scratch = db.dir.with_extension("checkpoint");
        let _ = std::fs::remove_dir_all(&scratch);
        state.checkpoint_database(&scratch).expect("checkpoint");
        let mut union = Vec::new();
        for worker in 0..3 {
            let read = config.open_read_only(&scratch, Some((worker, 3))).expect("opens read-only");
            assert_eq!(read.layout, KeyLayout::Ordered);
            let restored = RocksDbState::<(u32, u64), u8>::new(read, 3);
            restored.for_each(&mut |k, _| {
                assert_eq!(route(k) % 3, worker as u64);
                union.push(*k);
            });
        }
        union.sort();
        assert_eq!(union, sorted);
        drop(state);
        drop(db);
        let _ = std::fs::remove_dir_all(&scratch);
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_an_error() {
        let file = std::env::temp_dir().join(format!("highwater-rocks-unit-file-{}", std::process::id()));
        std::fs::write(&file, b"not a directory").expect("writes");
        let err = RocksDbConfig::new(file.join("state")).open("x").err().expect("fails");
        assert!(err.contains("cannot make the state directory"), "{err}");
        let _ = std::fs::remove_file(file);
    }
}
