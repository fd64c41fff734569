//! What happens to an event before it is written, with upstream client-go's correlator
//! semantics (tools/record, `EventCorrelator`): similar events are aggregated, identical ones
//! are counted on one Event object, and each involved object has a token bucket against spam.
//! Pure: the caller passes the time, and gets back what to write.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Entries in each of the correlator's caches (upstream `maxLruCacheEntries`).
pub const MAX_CACHE_ENTRIES: usize = 4096;
/// Distinct messages of similar events, within [`AGGREGATE_INTERVAL`] of each other, from
/// which on they are aggregated (upstream `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_EVENTS: usize = 10;
/// upstream `defaultAggregateIntervalInSeconds`.
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// Events an involved object may have at once (upstream `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// One more event per this long (upstream `defaultSpamQPS` 1/300).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// The message prefix of an aggregated event.
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// The correlator's limits; [`Default`] is upstream's.
#[derive(Debug, Clone)]
pub struct Config {
    pub max_entries: usize,
    pub aggregate_max_events: usize,
    pub aggregate_interval: Duration,
    pub spam_burst: u32,
    pub spam_refill: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_entries: MAX_CACHE_ENTRIES,
            aggregate_max_events: AGGREGATE_MAX_EVENTS,
            aggregate_interval: AGGREGATE_INTERVAL,
            spam_burst: SPAM_BURST,
            spam_refill: SPAM_REFILL,
        }
    }
}

/// What to write for an observed event.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A new Event object.
    Create { key: String, event: Event },
    /// The Event object `name` seen before: patch its count, lastTimestamp and message.
    /// `event` is the whole object as it now is, for creating it again when it is gone.
    Patch {
        key: String,
        name: String,
        namespace: String,
        count: i32,
        last_timestamp: Timestamp,
        message: String,
        event: Event,
    },
    /// Over the involved object's rate: nothing is written.
    Drop,
}

/// A map that keeps its `cap` most recently used entries.
#[derive(Debug)]
pub struct Lru<V> {
    cap: usize,
    tick: u64,
    entries: HashMap<String, (V, u64)>,
    /// Last use → key, oldest first.
    order: BTreeMap<u64, String>,
}

impl<V> Lru<V> {
    pub fn new(cap: usize) -> Self {
        Lru {
            cap: cap.max(1),
            tick: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn touch(&mut self, key: &str) -> u64 {
        self.tick += 1;
        if let Some((_, used)) = self.entries.get_mut(key) {
            self.order.remove(used);
            *used = self.tick;
            self.order.insert(self.tick, key.to_string());
        }
        self.tick
    }

    /// The entry, now the most recently used.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.touch(key);
        self.entries.get_mut(key).map(|(v, _)| v)
    }

    /// Whether `key` is held, without using it.
    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// Sets `key` (the most recently used), dropping the least recently used entry when full.
    pub fn insert(&mut self, key: &str, value: V) {
        if let Some(slot) = self.get_mut(key) {
            *slot = value;
            return;
        }
        if self.entries.len() >= self.cap
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.entries.remove(&oldest);
        }
        self.tick += 1;
        self.entries.insert(key.to_string(), (value, self.tick));
        self.order.insert(self.tick, key.to_string());
    }

    /// The entry for `key`, inserted by `make` when missing.
    pub fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        if !self.contains(key) {
            self.insert(key, make());
        }
        self.touch(key);
        match self.entries.get_mut(key) {
            Some((v, _)) => v,
            None => unreachable!("the entry was just inserted"),
        }
    }
}

/// A token bucket that refills as time passes (upstream's passive rate limiter): starts full.
/// Kept in whole nanoseconds of refill time, so that a token is back exactly after `refill`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Refill time banked, at most `burst` tokens' worth.
    credit: i128,
    capacity: i128,
    /// The refill time of one token (at least 1 ns).
    cost: i128,
    last: Timestamp,
}

impl TokenBucket {
    pub fn new(burst: u32, refill: Duration, now: Timestamp) -> Self {
        let cost = i128::try_from(refill.as_nanos())
            .unwrap_or(i128::MAX)
            .max(1);
        let capacity = cost.saturating_mul(i128::from(burst));
        TokenBucket {
            credit: capacity,
            capacity,
            cost,
            last: now,
        }
    }

    /// Takes a token if there is one.
    pub fn try_accept(&mut self, now: Timestamp) -> bool {
        let elapsed = now.duration_since(self.last).as_nanos();
        if elapsed > 0 {
            self.credit = self.credit.saturating_add(elapsed).min(self.capacity);
            self.last = now;
        }
        if self.credit >= self.cost {
            self.credit -= self.cost;
            true
        } else {
            false
        }
    }
}

/// Similar events seen lately: their distinct messages and when the last came.
#[derive(Debug)]
struct Similar {
    messages: VecDeque<String>,
    last: Timestamp,
}

/// An Event object written (or about to be) for one key.
#[derive(Debug, Clone)]
struct Observation {
    count: i32,
    first_timestamp: Option<Time>,
    name: String,
    resource_version: Option<String>,
}

/// Upstream's `EventCorrelator`: aggregation, then dedup, then the spam filter.
#[derive(Debug)]
pub struct Correlator {
    config: Config,
    similar: Lru<Similar>,
    seen: Lru<Observation>,
    buckets: Lru<TokenBucket>,
}

impl Default for Correlator {
    fn default() -> Self {
        Self::new(Config::default())
    }
}

/// Fields joined into a cache key; the separator cannot occur in names, kinds or reasons.
fn key_of(parts: &[&str]) -> String {
    parts.join("\u{1f}")
}

fn object_parts(e: &Event) -> [&str; 7] {
    let src = e.source.as_ref();
    let o = &e.involved_object;
    [
        src.and_then(|s| s.component.as_deref()).unwrap_or(""),
        src.and_then(|s| s.host.as_deref()).unwrap_or(""),
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or(""),
        o.uid.as_deref().unwrap_or(""),
        o.api_version.as_deref().unwrap_or(""),
    ]
}

/// The spam filter's key: source and involved object.
pub fn spam_key(e: &Event) -> String {
    key_of(&object_parts(e))
}

/// Similar events share this key: source, involved object, type, reason and reporter.
pub fn aggregate_key(e: &Event) -> String {
    let mut parts = object_parts(e).to_vec();
    parts.extend([
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.reporting_component.as_deref().unwrap_or(""),
        e.reporting_instance.as_deref().unwrap_or(""),
    ]);
    key_of(&parts)
}

/// Identical events share this key: source, involved object with its field path, type,
/// reason and message.
pub fn event_key(e: &Event) -> String {
    let mut parts = object_parts(e).to_vec();
    parts.extend([
        e.involved_object.field_path.as_deref().unwrap_or(""),
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.message.as_deref().unwrap_or(""),
    ]);
    key_of(&parts)
}

impl Correlator {
    pub fn new(config: Config) -> Self {
        Correlator {
            similar: Lru::new(config.max_entries),
            seen: Lru::new(config.max_entries),
            buckets: Lru::new(config.max_entries),
            config,
        }
    }

    /// Decides what to write for `event`, recorded at `now`. As upstream, an event the spam
    /// filter drops still counts: the next one written carries the count of all of them.
    pub fn observe(&mut self, event: Event, now: Timestamp) -> Decision {
        let (event, key) = self.aggregate(event, now);
        let decision = self.dedup(event, key, now);
        let spam = match &decision {
            Decision::Create { event, .. } | Decision::Patch { event, .. } => spam_key(event),
            Decision::Drop => return Decision::Drop,
        };
        let (burst, refill) = (self.config.spam_burst, self.config.spam_refill);
        let bucket = self
            .buckets
            .get_or_insert_with(&spam, || TokenBucket::new(burst, refill, now));
        if bucket.try_accept(now) {
            decision
        } else {
            Decision::Drop
        }
    }

    /// What the API server answered for the Event object written under `key`: later
    /// observations patch that object, counting on from its count.
    pub fn written(&mut self, key: &str, stored: &Event) {
        let Some(name) = stored.metadata.name.clone() else {
            return;
        };
        self.seen.insert(
            key,
            Observation {
                count: stored.count.unwrap_or(1),
                first_timestamp: stored.first_timestamp.clone(),
                name,
                resource_version: stored.metadata.resource_version.clone(),
            },
        );
    }

    /// The event itself and its dedup key, or, from the `aggregate_max_events`-th distinct
    /// message of similar events on, one combined event under the similar events' key.
    fn aggregate(&mut self, event: Event, now: Timestamp) -> (Event, String) {
        let agg_key = aggregate_key(&event);
        let message = event.message.clone().unwrap_or_default();
        let interval = self.config.aggregate_interval;
        let fresh = || Similar {
            messages: VecDeque::new(),
            last: now,
        };
        let similar = self.similar.get_or_insert_with(&agg_key, fresh);
        let since = now.duration_since(similar.last).as_nanos();
        if since > i128::try_from(interval.as_nanos()).unwrap_or(i128::MAX) {
            *similar = fresh();
        }
        similar.last = now;
        if !similar.messages.contains(&message) {
            similar.messages.push_back(message.clone());
        }
        if similar.messages.len() < self.config.aggregate_max_events {
            let key = event_key(&event);
            return (event, key);
        }
        // Keeps the set below the limit, so one more new message aggregates again.
        similar.messages.pop_front();
        let time = Some(Time(now));
        let combined = Event {
            metadata: super::event_meta(&event.involved_object, now),
            message: Some(format!("{COMBINED_PREFIX}{message}")),
            count: Some(1),
            first_timestamp: time.clone(),
            last_timestamp: time,
            ..event
        };
        (combined, agg_key)
    }

    /// Create the first time a key is seen; afterwards patch the object seen then.
    fn dedup(&mut self, mut event: Event, key: String, now: Timestamp) -> Decision {
        let Some(seen) = self.seen.get_mut(&key) else {
            event.count = Some(1);
            let observed = Observation {
                count: 1,
                first_timestamp: event.first_timestamp.clone(),
                name: event.metadata.name.clone().unwrap_or_default(),
                resource_version: None,
            };
            self.seen.insert(&key, observed);
            return Decision::Create { key, event };
        };
        seen.count = seen.count.saturating_add(1);
        event.metadata.name = Some(seen.name.clone());
        event.metadata.resource_version = seen.resource_version.clone();
        event.first_timestamp = seen.first_timestamp.clone();
        event.last_timestamp = Some(Time(now));
        event.count = Some(seen.count);
        Decision::Patch {
            name: seen.name.clone(),
            namespace: event.metadata.namespace.clone().unwrap_or_default(),
            count: seen.count,
            last_timestamp: now,
            message: event.message.clone().unwrap_or_default(),
            key,
            event,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{EventType, build_event};
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::jiff::SignedDuration;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_700_000_000).expect("a valid timestamp")
    }

    fn at(secs: i64) -> Timestamp {
        t0() + SignedDuration::from_secs(secs)
    }

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn ev(object: &ObjectReference, reason: &str, message: &str, now: Timestamp) -> Event {
        build_event(
            "n1",
            object.clone(),
            EventType::Warning,
            reason,
            message,
            now,
        )
    }

    #[test]
    fn identical_events_patch_the_first_with_growing_counts() {
        let mut c = Correlator::default();
        let web = pod("web");
        let first = match c.observe(ev(&web, "BackOff", "back-off", at(0)), at(0)) {
            Decision::Create { event, .. } => event,
            d => panic!("{d:?}"),
        };
        let name = first.metadata.name.clone().expect("named");
        assert!(name.starts_with("web."), "{name}");
        assert_eq!(first.count, Some(1));
        for (i, secs) in [(2, 5), (3, 9), (4, 20)] {
            match c.observe(ev(&web, "BackOff", "back-off", at(secs)), at(secs)) {
                Decision::Patch {
                    name: n,
                    namespace,
                    count,
                    last_timestamp,
                    message,
                    event,
                    ..
                } => {
                    assert_eq!(n, name);
                    assert_eq!(namespace, "shop");
                    assert_eq!(count, i);
                    assert_eq!(last_timestamp, at(secs));
                    assert_eq!(message, "back-off");
                    assert_eq!(event.first_timestamp, Some(Time(at(0))));
                    assert_eq!(event.count, Some(i));
                }
                d => panic!("{d:?}"),
            }
        }
        // Another message, field path or object is another event.
        assert!(matches!(
            c.observe(ev(&web, "BackOff", "other", at(21)), at(21)),
            Decision::Create { .. }
        ));
        let mut in_container = ev(&web, "BackOff", "back-off", at(22));
        in_container.involved_object.field_path = Some("spec.containers{app}".into());
        assert!(matches!(
            c.observe(in_container, at(22)),
            Decision::Create { .. }
        ));
        assert!(matches!(
            c.observe(ev(&pod("db"), "BackOff", "back-off", at(23)), at(23)),
            Decision::Create { .. }
        ));
    }

    #[test]
    fn counting_goes_on_from_what_the_server_stored() {
        let mut c = Correlator::default();
        let web = pod("web");
        let Decision::Create { key, mut event } =
            c.observe(ev(&web, "Pulled", "pulled", at(0)), at(0))
        else {
            panic!("first is a create")
        };
        event.metadata.name = Some("web.stored".into());
        event.metadata.resource_version = Some("42".into());
        event.count = Some(7);
        c.written(&key, &event);
        match c.observe(ev(&web, "Pulled", "pulled", at(1)), at(1)) {
            Decision::Patch {
                name, count, event, ..
            } => {
                assert_eq!(name, "web.stored");
                assert_eq!(count, 8);
                assert_eq!(event.metadata.resource_version.as_deref(), Some("42"));
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn the_tenth_distinct_similar_message_is_combined() {
        let mut c = Correlator::default();
        let web = pod("web");
        for i in 1..=9 {
            let msg = format!("failed {i}");
            match c.observe(ev(&web, "Failed", &msg, at(i)), at(i)) {
                Decision::Create { event, .. } => {
                    assert_eq!(event.message.as_deref(), Some(msg.as_str()))
                }
                d => panic!("event {i}: {d:?}"),
            }
        }
        let combined = match c.observe(ev(&web, "Failed", "failed 10", at(10)), at(10)) {
            Decision::Create { event, .. } => event,
            d => panic!("{d:?}"),
        };
        assert_eq!(
            combined.message.as_deref(),
            Some("(combined from similar events): failed 10")
        );
        assert_eq!(combined.reason.as_deref(), Some("Failed"));
        assert_eq!(combined.count, Some(1));
        // Later ones patch the combined event with their own message.
        match c.observe(ev(&web, "Failed", "failed 11", at(11)), at(11)) {
            Decision::Patch {
                name,
                count,
                message,
                ..
            } => {
                assert_eq!(Some(name), combined.metadata.name);
                assert_eq!(count, 2);
                assert_eq!(message, "(combined from similar events): failed 11");
            }
            d => panic!("{d:?}"),
        }
        // Another reason is not similar.
        assert!(matches!(
            c.observe(ev(&web, "BackOff", "failed 12", at(12)), at(12)),
            Decision::Create { ref event, .. } if event.message.as_deref() == Some("failed 12")
        ));
    }

    #[test]
    fn similar_events_further_apart_than_the_interval_start_over() {
        let mut c = Correlator::default();
        let web = pod("web");
        for i in 1..=9 {
            c.observe(ev(&web, "Failed", &format!("m{i}"), at(i)), at(i));
        }
        // 601 s after the last similar one: a fresh record, not combined.
        let later = at(9 + 601);
        match c.observe(ev(&web, "Failed", "m10", later), later) {
            Decision::Create { event, .. } => assert_eq!(event.message.as_deref(), Some("m10")),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn the_spam_filter_allows_a_burst_of_25_then_one_per_five_minutes() {
        let mut c = Correlator::default();
        let web = pod("web");
        for i in 0..25 {
            let d = c.observe(ev(&web, &format!("R{i}"), "m", at(0)), at(0));
            assert_ne!(d, Decision::Drop, "event {i}");
        }
        assert_eq!(
            c.observe(ev(&web, "R25", "m", at(1)), at(1)),
            Decision::Drop
        );
        // Other objects have their own bucket.
        assert_ne!(
            c.observe(ev(&pod("db"), "R0", "m", at(1)), at(1)),
            Decision::Drop
        );
        assert_eq!(
            c.observe(ev(&web, "R26", "m", at(299)), at(299)),
            Decision::Drop
        );
        assert_ne!(
            c.observe(ev(&web, "R27", "m", at(300)), at(300)),
            Decision::Drop
        );
        assert_eq!(
            c.observe(ev(&web, "R28", "m", at(301)), at(301)),
            Decision::Drop
        );
        // Two refills' worth of time gives two events, no more.
        assert_ne!(
            c.observe(ev(&web, "R29", "m", at(900)), at(900)),
            Decision::Drop
        );
        assert_ne!(
            c.observe(ev(&web, "R30", "m", at(900)), at(900)),
            Decision::Drop
        );
        assert_eq!(
            c.observe(ev(&web, "R31", "m", at(900)), at(900)),
            Decision::Drop
        );
    }

    #[test]
    fn dropped_events_still_count() {
        let mut c = Correlator::default();
        let web = pod("web");
        for _ in 0..30 {
            c.observe(ev(&web, "BackOff", "same", at(0)), at(0));
        }
        match c.observe(ev(&web, "BackOff", "same", at(300)), at(300)) {
            Decision::Patch { count, .. } => assert_eq!(count, 31),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn the_token_bucket_refills_to_its_burst_only() {
        let mut b = TokenBucket::new(2, Duration::from_secs(10), at(0));
        assert!(b.try_accept(at(0)));
        assert!(b.try_accept(at(0)));
        assert!(!b.try_accept(at(0)));
        assert!(b.try_accept(at(1000)));
        assert!(b.try_accept(at(1000)));
        assert!(!b.try_accept(at(1000)));
        // Time going backwards gives nothing.
        assert!(!b.try_accept(at(500)));
    }

    #[test]
    fn the_lru_keeps_the_most_recently_used() {
        let mut lru = Lru::new(3);
        for k in ["a", "b", "c"] {
            lru.insert(k, k.to_string());
        }
        assert!(lru.get_mut("a").is_some()); // b is now the oldest
        lru.insert("d", "d".into());
        assert_eq!(lru.len(), 3);
        assert!(!lru.contains("b"));
        assert!(lru.contains("a") && lru.contains("c") && lru.contains("d"));
        lru.insert("c", "C".into()); // an update, not a new entry
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.get_mut("c").map(|v| v.clone()), Some("C".to_string()));
    }

    #[test]
    fn the_caches_stay_bounded() {
        let mut c = Correlator::new(Config {
            max_entries: 8,
            ..Config::default()
        });
        for i in 0..100 {
            let o = pod(&format!("p{i}"));
            c.observe(ev(&o, "Started", "started", at(i)), at(i));
        }
        assert_eq!(c.seen.len(), 8);
        assert_eq!(c.similar.len(), 8);
        assert_eq!(c.buckets.len(), 8);
        // An evicted event is created again rather than patched.
        assert!(matches!(
            c.observe(ev(&pod("p0"), "Started", "started", at(200)), at(200)),
            Decision::Create { .. }
        ));
        assert!(matches!(
            c.observe(ev(&pod("p99"), "Started", "started", at(200)), at(200)),
            Decision::Patch { count: 2, .. }
        ));
    }
}
