//! State time-to-live: bounded state for operators that no watermark
//! releases (unwindowed joins, tables, aggregations by key).
//!
//! A windowed operator forgets a window once the watermark passes it; an
//! unwindowed one keeps every key for ever unless it is told how long an
//! entry stays useful. [`StateTtl`] says so, in **event time**: an entry last
//! written at event time `u` is seen by records up to `u + ttl` and
//! forgotten once the watermark passes `u + ttl`. Because that is decided by
//! event times and watermarks, never by the wall clock, what is kept, and so
//! every result, is the same on any number of workers and after recovery
//! (Flink's TTL runs in processing time: what it keeps depends on how fast
//! the job ran).
//!
//! What expiry means downstream is the user's choice ([`Expiry`]): forget
//! silently (Flink's behaviour: downstream keeps what it was told), or emit
//! retractions of what expired at the time it expired, so that a view or a
//! table built downstream holds only live results.

use crate::key::Data;
use crate::stream::EventStream;
use crate::time::{IntoMillis, Timestamp};

/// What an operator does when an entry of its state expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Expiry {
    /// The entry is forgotten; results it took part in stand (Flink's
    /// `StateTtlConfig` and `table.exec.state.ttl`).
    #[default]
    Silent,
    /// The entry is forgotten and the results it took part in are retracted
    /// at the time it expired: downstream holds only what is live.
    Retract,
}

/// Which accesses to an entry restart its time-to-live.
///
/// In the built-in operators (joins, tables, aggregations by key) every
/// record that touches a key writes it; [`EventStream::process_keyed`]
/// tells reads from writes, so there the choice matters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Refresh {
    /// Writes only (Flink's `OnCreateAndWrite`): an entry read but not
    /// written still expires `ttl` after its last write.
    #[default]
    OnWrite,
    /// Reads and writes (Flink's `OnReadAndWrite`): an entry expires `ttl`
    /// after it was last used.
    OnReadAndWrite,
}

/// Which clock a time-to-live runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Clock {
    /// Event time: an entry expires when the watermark passes its last
    /// refresh plus the TTL; the same on any layout and after recovery.
    #[default]
    EventTime,
    /// Processing time (Flink's `StateTtlConfig`): an entry expires when the
    /// wall clock passes its last refresh plus the TTL, so what is kept
    /// depends on how fast the job ran. Silent only.
    ProcessingTime,
}

/// A time-to-live for the state of an operator that no watermark releases.
///
/// Given to an operator with [`EventStream::state_ttl`](crate::EventStream::state_ttl):
///
/// ```
/// use highwater_operators::prelude::*;
/// use highwater_operators::state::{Expiry, StateTtl};
/// let ttl = StateTtl::event_time(10.minutes()).expiry(Expiry::Retract);
/// assert_eq!(ttl.millis(), 600_000);
/// assert_eq!(ttl.expires_at(1_000), 601_001);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct StateTtl {
    ttl: u64,
    expiry: Expiry,
    #[serde(default)]
    refresh: Refresh,
    #[serde(default)]
    clock: Clock,
}

impl StateTtl {
    /// Entries live for `ttl` of event time after their last write, and are
    /// forgotten silently ([`Expiry::Silent`]).
    pub fn event_time(ttl: impl IntoMillis) -> Self {
        StateTtl { ttl: ttl.into_millis(), expiry: Expiry::Silent, refresh: Refresh::OnWrite, clock: Clock::EventTime }
    }

    /// Entries live for `ttl` of wall-clock time after their last refresh
    /// (Flink's `StateTtlConfig` in the DataStream API), forgotten silently:
    /// an expired entry is never seen again, and it is removed when its key
    /// is next touched or when the operator next runs after its expiry (as
    /// Flink cleans up lazily). What is kept then depends on how fast the
    /// job ran, and a recovered job may keep other entries than an
    /// uninterrupted one; prefer [`event_time`](Self::event_time). Taken by
    /// [`WithTtl::process_keyed`](crate::state::WithTtl::process_keyed) (user
    /// state, where Flink's processing-time TTL applies); the built-in
    /// operators expire in event time only (given this, they expire silently
    /// in event time, and log a warning). [`Expiry::Retract`] is ignored on
    /// this clock (there is no event time to retract at).
    ///
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::{Clock, StateTtl};
    /// let ttl = StateTtl::processing_time(30.minutes());
    /// assert_eq!((ttl.clock(), ttl.millis()), (Clock::ProcessingTime, 1_800_000));
    /// ```
    pub fn processing_time(ttl: impl IntoMillis) -> Self {
        StateTtl { clock: Clock::ProcessingTime, ..StateTtl::event_time(ttl) }
    }

    /// The clock the time-to-live runs on.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Which accesses restart an entry's time-to-live (writes only unless
    /// told otherwise).
    pub fn refresh(mut self, refresh: Refresh) -> Self {
        self.refresh = refresh;
        self
    }

    /// Whether reads restart an entry's time-to-live as writes do.
    pub fn refreshes_on_read(&self) -> bool {
        self.refresh == Refresh::OnReadAndWrite
    }

    /// What expiry does downstream.
    pub fn expiry(mut self, expiry: Expiry) -> Self {
        self.expiry = expiry;
        self
    }

    /// The time-to-live, in milliseconds of event time.
    pub fn millis(&self) -> u64 {
        self.ttl
    }

    /// What expiry does downstream.
    pub fn mode(&self) -> Expiry {
        self.expiry
    }

    /// Whether expiry retracts results ([`Expiry::Retract`], in event time).
    pub fn retracts(&self) -> bool {
        self.expiry == Expiry::Retract && self.clock == Clock::EventTime
    }

    /// Makes this the default time-to-live of the computations run with
    /// `config` (a job-wide default, as Flink's `table.exec.state.ttl`):
    /// the operators whose state no watermark releases and that are not
    /// given a time-to-live of their own ([`EventStream::state_ttl`]) take
    /// it: [`EventStream::join`], [`EventStream::upsert`],
    /// [`EventStream::aggregate_by_key`] and
    /// [`EventStream::process_keyed`]. Each then counts what expired in
    /// the job's totals ([`Totals`](crate::totals::Totals)) as
    /// `<operator>.expired`, and the join its late records as
    /// `<operator>.late`.
    ///
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::StateTtl;
    /// let mut config = timely::WorkerConfig::default();
    /// StateTtl::event_time(1.hours()).configure(&mut config);
    /// assert_eq!(StateTtl::of_config(&config), Some(StateTtl::event_time(1.hours())));
    /// assert_eq!(StateTtl::of_config(&timely::WorkerConfig::default()), None);
    /// ```
    pub fn configure(self, config: &mut timely::WorkerConfig) {
        config.set(DEFAULT_KEY.to_owned(), self);
    }

    /// The default time-to-live a worker's configuration holds, if any.
    pub fn of_config(config: &timely::WorkerConfig) -> Option<StateTtl> {
        config.get::<StateTtl>(DEFAULT_KEY).copied()
    }

    /// The default time-to-live of `scope`'s computation, if any.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<StateTtl> {
        Self::of_config(scope.worker().config())
    }

    /// The first event time at which an entry last written at `written` is
    /// gone: `written + ttl + 1` (saturating).
    pub fn expires_at(&self, written: Timestamp) -> Timestamp {
        written.saturating_add(self.ttl).saturating_add(1)
    }
}

/// For the built-in operators, which expire in event time only: a
/// processing-time TTL given to one runs in event time, and says so.
pub(crate) fn in_event_time(ttl: Option<StateTtl>, operator: &str) -> Option<StateTtl> {
    let ttl = ttl?;
    if ttl.clock == Clock::ProcessingTime {
        tracing::warn!(
            operator,
            ttl_ms = ttl.ttl,
            "a processing-time state TTL runs in event time here: only keyed processes expire in processing time"
        );
        return Some(StateTtl { clock: Clock::EventTime, expiry: Expiry::Silent, ..ttl });
    }
    Some(ttl)
}

/// The key under which a computation's default [`StateTtl`] sits in the
/// timely worker configuration.
const DEFAULT_KEY: &str = "highwater::state_ttl";

/// A stream for an operator whose state expires ([`EventStream::state_ttl`]):
/// its operators ([`join`](WithTtl::join)) are those of the stream, with a
/// time-to-live on what they hold.
#[derive(Debug)]
pub struct WithTtl<'scope, D: 'static> {
    pub(crate) stream: EventStream<'scope, D>,
    pub(crate) ttl: StateTtl,
}

impl<'scope, D: Data> EventStream<'scope, D> {
    /// This stream, for an operator whose state expires after `ttl` of
    /// event time (see [`StateTtl`]).
    pub fn state_ttl(&self, ttl: StateTtl) -> WithTtl<'scope, D> {
        WithTtl { stream: self.clone(), ttl }
    }
}
