//! Requests waiting for their streaming client, each under a random single-use token that
//! expires (as upstream's request cache: one minute, a bounded number in flight).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runtime_types::{Code, Error, Result, cri};

/// A request parked until its client connects.
#[derive(Debug, Clone, PartialEq)]
pub enum Pending {
    Exec(cri::ExecRequest),
    Attach(cri::AttachRequest),
    PortForward(cri::PortForwardRequest),
}

/// The token cache. Time is passed in, so expiry is testable without waiting.
#[derive(Debug)]
pub struct Cache {
    ttl: Duration,
    max: usize,
    entries: HashMap<String, (Pending, Instant)>,
}

impl Cache {
    pub fn new(ttl: Duration, max: usize) -> Self {
        Cache {
            ttl,
            max,
            entries: HashMap::new(),
        }
    }

    /// Parks `req` and returns its new token; `ResourceExhausted` when too many are waiting.
    pub fn insert(&mut self, req: Pending, now: Instant) -> Result<String> {
        self.entries.retain(|_, (_, expires)| *expires > now);
        if self.entries.len() >= self.max {
            return Err(Error::new(
                Code::ResourceExhausted,
                "too many streaming requests in flight",
            ));
        }
        let token = loop {
            let t = new_token()?;
            if !self.entries.contains_key(&t) {
                break t;
            }
        };
        self.entries.insert(token.clone(), (req, now + self.ttl));
        Ok(token)
    }

    /// Takes the request parked under `token`, if it has not expired; a token works once.
    pub fn consume(&mut self, token: &str, now: Instant) -> Option<Pending> {
        let (req, expires) = self.entries.remove(token)?;
        (expires > now).then_some(req)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Locks the cache; a poisoned lock still holds consistent data (every change is one call).
pub fn lock(m: &Mutex<Cache>) -> MutexGuard<'_, Cache> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// 16 random bytes, URL-safe (hex).
fn new_token() -> Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| Error::internal(format!("reading /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(id: &str) -> Pending {
        Pending::Exec(cri::ExecRequest {
            container_id: id.into(),
            cmd: vec!["true".into()],
            ..Default::default()
        })
    }

    #[test]
    fn a_token_works_once() {
        let mut c = Cache::new(Duration::from_secs(60), 10);
        let now = Instant::now();
        let t = c.insert(exec("a"), now).unwrap();
        assert_eq!(t.len(), 32);
        assert_eq!(c.consume(&t, now), Some(exec("a")));
        assert_eq!(c.consume(&t, now), None);
        assert_eq!(c.consume("nonsense", now), None);
    }

    #[test]
    fn tokens_expire_after_the_ttl() {
        let mut c = Cache::new(Duration::from_secs(60), 10);
        let now = Instant::now();
        let early = c.insert(exec("a"), now).unwrap();
        let late = c.insert(exec("b"), now).unwrap();
        assert_ne!(early, late);
        assert_eq!(
            c.consume(&early, now + Duration::from_secs(59)),
            Some(exec("a"))
        );
        assert_eq!(c.consume(&late, now + Duration::from_secs(60)), None);
    }

    #[test]
    fn too_many_in_flight_is_resource_exhausted_until_some_expire() {
        let mut c = Cache::new(Duration::from_secs(60), 2);
        let now = Instant::now();
        c.insert(exec("a"), now).unwrap();
        c.insert(exec("b"), now).unwrap();
        let err = c.insert(exec("c"), now).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        let later = now + Duration::from_secs(61);
        c.insert(exec("c"), later).unwrap();
        assert_eq!(c.len(), 1);
    }
}
