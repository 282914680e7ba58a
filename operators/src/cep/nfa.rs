//! The matcher of one key: partial matches ("runs") advanced event by event,
//! in event-time order.
//!
//! Every run waits for one thing: another event of the step it is in
//! (`Continue`), the first event of a later step (`Enter`), or, for a match
//! whose pattern ends with `not_followed_by`, the end of its time bound
//! (`Pending`). Taking an event makes a new partial match, which branches into
//! everything it may wait for next; whether a run may skip an event depends on
//! the contiguity of what it waits for (strict: never; relaxed: only events
//! that do not match; non-deterministic: always). A new run starts at every
//! event the pattern's first step(s) can take.

use std::sync::Arc;

use smallvec::SmallVec;

use super::pattern::{AfterMatchSkip, Contiguity, Greed, Matched, Pattern, StepKind};
use crate::time::Timestamp;

/// One event taken by a partial match: its step, its position in the key's
/// event-time order, its time, the event.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Taken<E> {
    pub(crate) step: usize,
    pub(crate) seq: u64,
    pub(crate) time: Timestamp,
    pub(crate) event: E,
}

/// The events a partial match has taken, newest first: a persistent list, so
/// that a partial match that takes one more event shares the others.
#[derive(Debug)]
pub(crate) struct Node<E> {
    pub(crate) taken: Taken<E>,
    pub(crate) prev: Option<Arc<Node<E>>>,
    /// The first event's position and time.
    start: (u64, Timestamp),
}

/// Dropped link by link: a long chain would overflow the stack if dropped recursively.
impl<E> Drop for Node<E> {
    fn drop(&mut self) {
        let mut prev = self.prev.take();
        while let Some(rc) = prev {
            match Arc::try_unwrap(rc) {
                Ok(mut node) => prev = node.prev.take(),
                Err(_) => break,
            }
        }
    }
}

impl<E> Node<E> {
    /// The taken events, oldest first.
    pub(crate) fn to_vec(&self) -> Vec<&Taken<E>> {
        let mut out = Vec::new();
        let mut node = Some(self);
        while let Some(n) = node {
            out.push(&n.taken);
            node = n.prev.as_deref();
        }
        out.reverse();
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Target {
    Continue { step: usize, count: u32 },
    Enter(usize),
    Pending,
}

/// A partial match waiting for its next event.
#[derive(Clone, Debug)]
pub(crate) struct Run<E> {
    /// Identifies the taken events: runs that branched from one take share it.
    node: u64,
    taken: Arc<Node<E>>,
    target: Target,
    /// `not_next` steps the next event must not satisfy.
    forbid_next: SmallVec<[usize; 1]>,
    /// `not_followed_by` steps no skipped event may satisfy.
    forbid_between: SmallVec<[usize; 1]>,
    /// Greedy loop step whose events this `Enter` run may neither take nor
    /// skip (the loop takes them: it is left only with a maximal run).
    greedy_guard: Option<usize>,
    /// Steps whose events this reluctant `Continue` run may not take.
    reluctant_guard: SmallVec<[usize; 1]>,
    /// The taken events already form an emitted match (not a time-out).
    complete: bool,
}

impl<E> Run<E> {
    fn start_seq(&self) -> u64 {
        self.taken.start.0
    }
    fn start_time(&self) -> Timestamp {
        self.taken.start.1
    }
}

/// A match or a timed-out partial match, as taken events.
#[derive(Clone, Debug)]
pub(crate) struct Found<E> {
    pub(crate) taken: Arc<Node<E>>,
    /// The event time the result goes out at.
    pub(crate) time: Timestamp,
}

/// What the matcher of one key holds.
///
/// Serialized (for checkpoints) as a table of the runs' taken events, each
/// node once and after the node it links to: events shared by runs stay
/// shared, and a long chain is written and read without recursion.
#[derive(Clone, Debug)]
pub(crate) struct KeyState<E> {
    runs: Vec<Run<E>>,
    next_seq: u64,
    next_node: u64,
}

/// A run as written to a checkpoint: its taken events by index in the node table.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct FlatRun {
    node: u64,
    taken: u32,
    target: Target,
    forbid_next: SmallVec<[usize; 1]>,
    forbid_between: SmallVec<[usize; 1]>,
    greedy_guard: Option<usize>,
    reluctant_guard: SmallVec<[usize; 1]>,
    complete: bool,
}

/// A node as written to a checkpoint: its event, the index of the node it
/// links to (written before it), and the first event's position and time.
type FlatNode<T> = (T, Option<u32>, (u64, Timestamp));

/// A [`KeyState`] as written to a checkpoint (`T` is `Taken<E>` or a reference to one).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct FlatKeyState<T> {
    nodes: Vec<FlatNode<T>>,
    runs: Vec<FlatRun>,
    next_seq: u64,
    next_node: u64,
}

impl<E: serde::Serialize> serde::Serialize for KeyState<E> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut index: crate::key::StateMap<*const Node<E>, u32> = Default::default();
        let mut nodes: Vec<FlatNode<&Taken<E>>> = Vec::new();
        let mut runs = Vec::with_capacity(self.runs.len());
        let mut chain: Vec<&Node<E>> = Vec::new();
        for run in &self.runs {
            // The run's nodes not yet written, newest first; then written oldest first.
            let mut node = Some(&*run.taken);
            while let Some(n) = node.filter(|n| !index.contains_key(&std::ptr::from_ref(*n))) {
                chain.push(n);
                node = n.prev.as_deref();
            }
            while let Some(n) = chain.pop() {
                let prev = n.prev.as_deref().map(|p| index[&std::ptr::from_ref(p)]);
                let at = u32::try_from(nodes.len()).map_err(serde::ser::Error::custom)?;
                index.insert(std::ptr::from_ref(n), at);
                nodes.push((&n.taken, prev, n.start));
            }
            runs.push(FlatRun {
                node: run.node,
                taken: index[&Arc::as_ptr(&run.taken)],
                target: run.target,
                forbid_next: run.forbid_next.clone(),
                forbid_between: run.forbid_between.clone(),
                greedy_guard: run.greedy_guard,
                reluctant_guard: run.reluctant_guard.clone(),
                complete: run.complete,
            });
        }
        FlatKeyState { nodes, runs, next_seq: self.next_seq, next_node: self.next_node }.serialize(serializer)
    }
}

impl<'de, E: serde::Deserialize<'de>> serde::Deserialize<'de> for KeyState<E> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let flat = FlatKeyState::<Taken<E>>::deserialize(deserializer)?;
        let node_at = |built: &[Arc<Node<E>>], i: u32| {
            built.get(i as usize).map(Arc::clone).ok_or_else(|| D::Error::custom("a run's node links to a later one"))
        };
        let mut built: Vec<Arc<Node<E>>> = Vec::with_capacity(flat.nodes.len());
        for (taken, prev, start) in flat.nodes {
            let prev = prev.map(|i| node_at(&built, i)).transpose()?;
            built.push(Arc::new(Node { taken, prev, start }));
        }
        let mut runs = Vec::with_capacity(flat.runs.len());
        for r in flat.runs {
            runs.push(Run {
                node: r.node,
                taken: node_at(&built, r.taken)?,
                target: r.target,
                forbid_next: r.forbid_next,
                forbid_between: r.forbid_between,
                greedy_guard: r.greedy_guard,
                reluctant_guard: r.reluctant_guard,
                complete: r.complete,
            });
        }
        Ok(KeyState { runs, next_seq: flat.next_seq, next_node: flat.next_node })
    }
}

impl<E> Default for KeyState<E> {
    fn default() -> Self {
        KeyState { runs: Vec::new(), next_seq: 0, next_node: 0 }
    }
}

impl<E> KeyState<E> {
    /// Whether nothing is left (the key's state can be released).
    pub(crate) fn is_idle(&self) -> bool {
        self.runs.is_empty()
    }

    /// The earliest time a run of this key expires at, if the pattern has a bound.
    pub(crate) fn next_expiry(&self, within: Option<u64>) -> Option<Timestamp> {
        let w = within?;
        self.runs.iter().map(|r| r.start_time().saturating_add(w)).min()
    }
}

/// Branches made by one take, before they are added to the runs.
struct Branches<E> {
    runs: Vec<Run<E>>,
    /// The take completed a match (immediately).
    complete: bool,
}

/// A pattern prepared for matching.
pub(crate) struct Matcher<E> {
    pattern: Pattern<E>,
    names: Vec<Arc<str>>,
    /// The steps a match can begin with.
    starts: Vec<usize>,
}

impl<E: Clone> Matcher<E> {
    pub(crate) fn new(pattern: Pattern<E>) -> Self {
        let names = pattern.steps.iter().map(|s| Arc::clone(&s.name)).collect();
        let mut starts = Vec::new();
        for (i, s) in pattern.steps.iter().enumerate() {
            if s.kind == StepKind::Take {
                starts.push(i);
                if s.min > 0 {
                    break;
                }
            }
        }
        Matcher { pattern, names, starts }
    }

    pub(crate) fn names(&self) -> &[Arc<str>] {
        &self.names
    }

    pub(crate) fn within(&self) -> Option<u64> {
        self.pattern.within
    }

    fn holds(&self, step: usize, event: &E, taken: Option<&Node<E>>) -> bool {
        (self.pattern.steps[step].predicate)(event, &Matched { names: &self.names, last: taken })
    }

    /// The runs a partial match that has just taken `count` events of `step`
    /// (or nothing yet: `step` is `None`) branches into.
    fn branches(&self, node: u64, taken: &Arc<Node<E>>, step: Option<usize>, count: u32) -> Branches<E> {
        let steps = &self.pattern.steps;
        let mut out = Branches { runs: Vec::new(), complete: false };
        let run = |target| Run {
            node,
            taken: Arc::clone(taken),
            target,
            forbid_next: SmallVec::new(),
            forbid_between: SmallVec::new(),
            greedy_guard: None,
            reluctant_guard: SmallVec::new(),
            complete: false,
        };
        let can_leave = step.is_none_or(|s| count >= steps[s].min);
        let can_stay = step.is_some_and(|s| steps[s].max.is_none_or(|m| count < m));
        let mut enters: SmallVec<[usize; 1]> = SmallVec::new();
        if can_leave {
            let (mut forbid_next, mut forbid_between): (SmallVec<[usize; 1]>, SmallVec<[usize; 1]>) =
                (SmallVec::new(), SmallVec::new());
            let mut k = step.map_or(0, |s| s + 1);
            loop {
                if k == steps.len() {
                    if forbid_between.is_empty() {
                        out.complete = true;
                    } else {
                        let mut pending = run(Target::Pending);
                        pending.forbid_between = forbid_between;
                        out.runs.push(pending);
                    }
                    break;
                }
                match steps[k].kind {
                    StepKind::NotNext => forbid_next.push(k),
                    StepKind::NotFollowedBy => forbid_between.push(k),
                    StepKind::Take => {
                        let mut enter = run(Target::Enter(k));
                        enter.forbid_next = forbid_next.clone();
                        enter.forbid_between = forbid_between.clone();
                        if let Some(s) = step {
                            if steps[s].greed == Greed::Greedy && can_stay {
                                enter.greedy_guard = Some(s);
                            }
                        }
                        enters.push(k);
                        out.runs.push(enter);
                        if steps[k].min > 0 {
                            break;
                        }
                    }
                }
                k += 1;
            }
        }
        if let (Some(s), true) = (step, can_stay) {
            let mut stay = run(Target::Continue { step: s, count });
            if steps[s].greed == Greed::Reluctant && can_leave {
                stay.reluctant_guard = enters.clone();
            }
            out.runs.push(stay);
        }
        if out.complete {
            for r in out.runs.iter_mut() {
                r.complete = true;
            }
        }
        out
    }

    /// Expires the runs whose time bound has passed at `time` (no event before
    /// `time` is still to come): pending matches complete, the others time out.
    pub(crate) fn expire(
        &self,
        state: &mut KeyState<E>,
        time: Timestamp,
        matches: &mut Vec<Found<E>>,
        timeouts: &mut Vec<Found<E>>,
    ) {
        let Some(w) = self.pattern.within else { return };
        if !state.runs.iter().any(|r| r.start_time().saturating_add(w) <= time) {
            return;
        }
        let (mut expired, kept): (Vec<Run<E>>, Vec<Run<E>>) =
            state.runs.drain(..).partition(|r| r.start_time().saturating_add(w) <= time);
        state.runs = kept;
        if expired.is_empty() {
            return;
        }
        expired.sort_by(|a, b| order(&a.taken, &b.taken));
        let mut emitted: Vec<u64> = Vec::new();
        let mut completed = Vec::new();
        for r in expired.iter().filter(|r| r.target == Target::Pending) {
            completed.push(Arc::clone(&r.taken));
        }
        let emitted_here = self
            .emit(completed, &mut state.runs, &mut expired, |taken| taken.start.1.saturating_add(w).saturating_sub(1));
        for (node, found) in emitted_here {
            emitted.push(node);
            matches.push(found);
        }
        let mut reported: Vec<u64> = Vec::new();
        for r in expired.iter().filter(|r| r.target != Target::Pending) {
            if r.complete || emitted.contains(&r.node) || reported.contains(&r.node) {
                continue;
            }
            reported.push(r.node);
            let at = r.start_time().saturating_add(w).saturating_sub(1);
            timeouts.push(Found { taken: Arc::clone(&r.taken), time: at });
        }
    }

    /// Emits `completed` matches in order, applying the skip strategy to the
    /// later ones and to the runs (`runs` and `others`); returns the emitted
    /// matches with the node of their taken events.
    fn emit(
        &self,
        mut completed: Vec<Arc<Node<E>>>,
        runs: &mut Vec<Run<E>>,
        others: &mut Vec<Run<E>>,
        time_of: impl Fn(&Node<E>) -> Timestamp,
    ) -> Vec<(u64, Found<E>)> {
        completed.sort_by(|a, b| order(a, b));
        let mut out = Vec::new();
        let mut barriers: Vec<Box<dyn Fn(u64) -> bool>> = Vec::new();
        for taken in completed {
            let start = taken.start.0;
            if barriers.iter().any(|prune| prune(start)) {
                continue;
            }
            let node =
                others.iter().chain(runs.iter()).find(|r| Arc::ptr_eq(&r.taken, &taken)).map_or(u64::MAX, |r| r.node);
            if let Some(prune) = self.pruning(&taken) {
                runs.retain(|r| !prune(r.start_seq()));
                others.retain(|r| !prune(r.start_seq()));
                barriers.push(prune);
            }
            let time = time_of(&taken);
            out.push((node, Found { taken, time }));
        }
        out
    }

    /// Which start positions the skip strategy discards after `taken` matched.
    fn pruning(&self, taken: &Node<E>) -> Option<Box<dyn Fn(u64) -> bool>> {
        let step_of = |name: &str| self.names.iter().position(|n| &**n == name);
        let taken = taken.to_vec();
        let first = taken[0].seq;
        let last = taken[taken.len() - 1].seq;
        match &self.pattern.skip {
            AfterMatchSkip::NoSkip => None,
            AfterMatchSkip::SkipPastLastEvent => Some(Box::new(move |s| s <= last)),
            AfterMatchSkip::SkipToNext => Some(Box::new(move |s| s <= first)),
            AfterMatchSkip::SkipToFirst(name) => {
                let step = step_of(name)?;
                let at = taken.iter().find(|t| t.step == step)?.seq;
                Some(Box::new(move |s| s < at))
            }
            AfterMatchSkip::SkipToLast(name) => {
                let step = step_of(name)?;
                let at = taken.iter().rev().find(|t| t.step == step)?.seq;
                Some(Box::new(move |s| s < at))
            }
        }
    }

    /// Advances the key's runs by one event (the next in event-time order;
    /// runs expired before `time` must have been expired first).
    pub(crate) fn advance(&self, state: &mut KeyState<E>, event: E, time: Timestamp, matches: &mut Vec<Found<E>>) {
        let seq = state.next_seq;
        state.next_seq += 1;
        let steps = &self.pattern.steps;
        // Runs made by takes; the surviving runs stay in place.
        let mut made: Vec<Run<E>> = Vec::new();
        let mut completed: Vec<Arc<Node<E>>> = Vec::new();
        let mut next_node = state.next_node;
        let mut take = |made: &mut Vec<Run<E>>,
                        completed: &mut Vec<Arc<Node<E>>>,
                        taken: Option<&Arc<Node<E>>>,
                        step: usize,
                        count: u32| {
            let start = taken.map_or((seq, time), |t| t.start);
            let extended =
                Arc::new(Node { taken: Taken { step, seq, time, event: event.clone() }, prev: taken.cloned(), start });
            let node = next_node;
            next_node += 1;
            let branches = self.branches(node, &extended, Some(step), count);
            if branches.complete {
                completed.push(Arc::clone(&extended));
            }
            made.extend(branches.runs);
        };

        state.runs.retain_mut(|run| {
            let taken = Arc::clone(&run.taken);
            let ctx = Some(&*taken);
            if run.target == Target::Pending {
                return !run.forbid_between.iter().any(|n| self.holds(*n, &event, ctx));
            }
            if run.forbid_next.iter().any(|n| self.holds(*n, &event, ctx)) {
                return false;
            }
            let (step, count, contiguity) = match run.target {
                Target::Continue { step, count } => (step, count, steps[step].inner),
                Target::Enter(step) => (step, 0, steps[step].entry),
                Target::Pending => unreachable!("handled above"),
            };
            let matches_step = self.holds(step, &event, ctx);
            let greedy_stop = run.greedy_guard.is_some_and(|g| self.holds(g, &event, ctx));
            let blocked = match run.target {
                Target::Enter(_) => greedy_stop,
                _ => run.reluctant_guard.iter().any(|g| self.holds(*g, &event, ctx)),
            };
            if matches_step && !blocked {
                take(&mut made, &mut completed, Some(&taken), step, count + 1);
            }
            let may_skip = match contiguity {
                Contiguity::Strict => false,
                Contiguity::Relaxed => !matches_step,
                Contiguity::NonDeterministic => true,
            } && !greedy_stop;
            if may_skip && !run.forbid_between.iter().any(|n| self.holds(*n, &event, ctx)) {
                run.forbid_next.clear();
                true
            } else {
                false
            }
        });
        // A new partial match starts at every event a first step can take.
        for &step in &self.starts {
            if self.holds(step, &event, None) {
                take(&mut made, &mut completed, None, step, 1);
            }
        }
        state.next_node = next_node;
        state.runs.append(&mut made);
        if !completed.is_empty() {
            let mut none = Vec::new();
            for (_, found) in self.emit(completed, &mut state.runs, &mut none, |taken| taken.taken.time) {
                matches.push(found);
            }
        }
    }
}

/// The order matches are emitted in: by start position, then by the
/// positions and steps of their events.
fn order<E>(a: &Node<E>, b: &Node<E>) -> std::cmp::Ordering {
    let key = |t: &Node<E>| t.to_vec().iter().map(|x| (x.seq, x.step)).collect::<Vec<_>>();
    key(a).cmp(&key(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{decode, encode};

    /// `s`, one or more `a`, then `b` (right after the last `a` if `strict`).
    fn matcher(strict: bool) -> Matcher<char> {
        let pattern = Pattern::<char>::begin("s").where_(|e| *e == 's').followed_by("a").where_(|e| *e == 'a');
        let pattern = pattern.one_or_more();
        let pattern = if strict { pattern.next("b") } else { pattern.followed_by("b") };
        Matcher::new(pattern.where_(|e| *e == 'b'))
    }

    /// The state after `s` and `n` times `a`.
    fn after(matcher: &Matcher<char>, n: u64) -> KeyState<char> {
        let mut state = KeyState::default();
        let mut found = Vec::new();
        matcher.advance(&mut state, 's', 0, &mut found);
        for t in 1..=n {
            matcher.advance(&mut state, 'a', t, &mut found);
        }
        assert!(found.is_empty());
        state
    }

    fn events(run: &Run<char>) -> Vec<(usize, u64, Timestamp, char)> {
        run.taken.to_vec().iter().map(|t| (t.step, t.seq, t.time, t.event)).collect()
    }

    /// Runs the original and the restored state on `b`: the same match.
    fn same_match(matcher: &Matcher<char>, mut state: KeyState<char>, mut restored: KeyState<char>, at: Timestamp) {
        let (mut left, mut right) = (Vec::new(), Vec::new());
        matcher.advance(&mut state, 'b', at, &mut left);
        matcher.advance(&mut restored, 'b', at, &mut right);
        let events = |f: &Vec<Found<char>>| {
            f.iter().map(|f| f.taken.to_vec().iter().map(|t| (t.seq, t.event)).collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        assert!(!left.is_empty());
        assert_eq!(events(&left), events(&right));
    }

    #[test]
    fn key_state_round_trips_with_its_events_shared() {
        // Every prefix `s a…a` waits for a `b`: n runs over one chain of events.
        let matcher = matcher(false);
        let n = 1_000;
        let state = after(&matcher, n);
        assert!(state.runs.len() as u64 > n);
        let bytes = encode(&state).unwrap();
        // Each event is written once, not once per run that took it.
        assert!(bytes.len() < 200 * n as usize, "{} bytes", bytes.len());
        let restored: KeyState<char> = decode(&bytes).unwrap();
        assert_eq!((restored.next_seq, restored.next_node), (state.next_seq, state.next_node));
        assert_eq!(restored.runs.len(), state.runs.len());
        for (a, b) in state.runs.iter().zip(restored.runs.iter()) {
            assert_eq!((a.node, a.target, a.complete), (b.node, b.target, b.complete));
            assert_eq!(events(a), events(b));
        }
        let shared = |s: &KeyState<char>| {
            s.runs.windows(2).filter(|w| w[1].taken.prev.as_ref().is_some_and(|p| Arc::ptr_eq(p, &w[0].taken))).count()
        };
        assert_eq!(shared(&restored), shared(&state));
        same_match(&matcher, state, restored, n + 1);
    }

    #[test]
    fn key_state_round_trips_a_long_chain_without_recursion() {
        let matcher = matcher(true);
        let n = 200_000;
        let state = after(&matcher, n);
        let restored: KeyState<char> = decode(&encode(&state).unwrap()).unwrap();
        let longest = |s: &KeyState<char>| s.runs.iter().map(|r| r.taken.to_vec().len()).max();
        assert_eq!(longest(&restored), Some(n as usize + 1));
        assert_eq!(longest(&restored), longest(&state));
        same_match(&matcher, state, restored, n + 1);
    }
}
