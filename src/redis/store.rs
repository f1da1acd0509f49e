//! [`RedisStore`] as a [`Store`]: a check answered locally (deny cache,
//! lease, open breaker) or by the script, the failure policy applied to what
//! Redis could not decide, undos, and the decision's future.

use super::*;

impl Inner {
    /// A decision that needs no round trip: a cost that can never pass, or a
    /// deny-cache hit.
    pub(super) fn local_answer(&self, user: &[u8], cost: u32) -> Option<Decision> {
        if cost > self.limit {
            // It can never pass: no need to ask Redis (remaining and reset unknown).
            self.events.decided(false);
            return Some(Decision::cost_exceeds_limit(
                self.limit,
                self.limit,
                Duration::ZERO,
            ));
        }
        let d = self
            .deny_cache
            .as_ref()?
            .check(user, cost, Instant::now())?;
        self.events.deny_cache_hit();
        Some(d)
    }

    pub(super) fn full_key(&self, user: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + user.len() + 2);
        key.extend_from_slice(&self.prefix);
        key.push(b'{');
        key.extend_from_slice(user);
        key.push(b'}');
        key
    }

    /// A remote decision for a request: the script (with a lease's part when
    /// `ask` has one), the deny cache fed with its denials, the circuit
    /// breaker told how it went (`probe`: this decision is the half-open
    /// breaker's probe), and the failure policy applied to its failures.
    pub(super) async fn decide(
        self: Arc<Self>,
        user: Vec<u8>,
        cost: u32,
        probe: bool,
        ask: Option<(u64, Ask)>,
    ) -> Result<Decision, StoreError> {
        // Dropped with the future before Redis answers, it lets the next decision probe.
        let probe = probe
            .then(|| self.breaker.as_deref().map(Probe::new))
            .flatten();
        // Likewise, it lets the next check of the key ask for a grant.
        let fetch = ask
            .filter(|(_, ask)| ask.rate > 0.0)
            .and_then(|(hash, _)| Some(Fetch::new(self.leases.as_ref()?, &user, hash)));
        let sent = Instant::now();
        let generation = self.deny_cache.as_ref().map(|c| c.generation(&user));
        let (lease, back) = match ask {
            Some((_, ask)) => (
                (ask.rate > 0.0).then_some(LeaseArgs {
                    rate: ask.rate,
                    have: ask.have,
                }),
                ask.back,
            ),
            None => (None, None),
        };
        match self.call(&user, cost, None, lease, back, false).await {
            Ok(answer) => {
                self.redis_answered(probe);
                if let Some(back) = back {
                    self.handed_back(&user, back, answer.handed_back);
                }
                let mut decision = answer.decision;
                if let (Some(()), Some((hash, _))) = (fetch.map(Fetch::done), ask) {
                    let extra = answer.granted.saturating_sub(cost);
                    let received = Instant::now();
                    self.merged(&user, hash, &answer, extra, sent, received, false);
                    // The units this instance now holds are this key's to use.
                    decision.remaining = decision.remaining.saturating_add(extra);
                }
                self.events.decided(decision.is_allowed());
                if let (Some(cache), Some(generation), Outcome::Denied) =
                    (&self.deny_cache, generation, decision.outcome())
                {
                    cache.insert(user.into_boxed_slice(), sent, generation, cost, &decision);
                }
                Ok(decision)
            }
            Err(failure) => {
                if let Some(back) = back {
                    self.events.unreturned(back.units);
                }
                let error = self.note_failure(failure, probe, sent);
                self.apply_policy(&user, cost, || error)
            }
        }
    }

    /// The failure policy's answer to a decision Redis could not make;
    /// failing closed, the error `error` makes.
    pub(super) fn apply_policy(
        &self,
        user: &Vec<u8>,
        cost: u32,
        error: impl FnOnce() -> StoreError,
    ) -> Result<Decision, StoreError> {
        match &self.failure {
            FailurePolicy::Open => {
                self.events.failed(true);
                Ok(Decision::allow_unchecked(self.limit))
            }
            FailurePolicy::Closed => {
                self.events.failed(false);
                Err(error())
            }
            FailurePolicy::Fallback(_) => Ok(self.fallback_decision(user, cost)),
        }
    }

    /// A decision of the fallback limiter, its slot marked as such.
    pub(super) fn fallback_decision(&self, user: &Vec<u8>, cost: u32) -> Decision {
        let Some(limiter) = &self.fallback else {
            return Decision::allow_unchecked(self.limit);
        };
        let mut d = limiter.check_n(user, cost);
        d.slot |= FALLBACK_SLOT;
        self.events.fallback(d.is_allowed());
        d
    }

    /// The open breaker's answer, at once: the failure policy applied to the
    /// failure that opened it. Failing closed, `Retry-After` is at least the
    /// rest of the cool-down.
    #[cold]
    pub(super) fn breaker_answer(
        &self,
        user: &Vec<u8>,
        cost: u32,
        breaker: &Breaker,
        remaining: Duration,
    ) -> Result<Decision, StoreError> {
        bump(&breaker.answered);
        self.apply_policy(user, cost, || {
            let retry_after = self.closed_retry_after.max(remaining);
            match breaker.cause() {
                Some(cause) => cause.with_retry_after(retry_after),
                None => StoreError::new(StoreErrorKind::Other, retry_after)
                    .with_source("the Redis circuit breaker is open"),
            }
        })
    }

    /// Redis answered a call: the breaker's run of failures ends, and a probe
    /// closes it.
    pub(super) fn redis_answered(&self, probe: Option<Probe<'_>>) {
        match (probe, &self.breaker) {
            (Some(probe), _) => {
                probe.finish(None);
                self.breaker_changed();
            }
            (None, Some(breaker)) => breaker.succeeded(),
            (None, None) => {}
        }
    }

    /// Count a failure of a call sent at `sent`, tell the breaker (a failed
    /// probe opens it again), and warn, at most once a second: a Redis
    /// outage under load must not turn into a flood of log lines.
    pub(super) fn note_failure(
        &self,
        failure: Failure,
        probe: Option<Probe<'_>>,
        sent: Instant,
    ) -> StoreError {
        let error = failure.into_error(self.closed_retry_after);
        match (probe, &self.breaker) {
            (Some(probe), _) => probe.finish(Some(&error)),
            (None, Some(breaker)) => {
                if breaker.failed(&error, sent) {
                    // Nothing came back on the connection for a whole timeout:
                    // it may be one gone silent, which the breaker's probes
                    // would otherwise keep waiting on.
                    self.conn.stalled();
                }
            }
            (None, None) => {}
        }
        self.breaker_changed();
        let breaker = self
            .breaker
            .as_deref()
            .map_or(BreakerState::Off, Breaker::state);
        self.events.failure(&error, breaker, &self.failure);
        error
    }

    /// Hand the breaker's state and openings to the metrics recorder.
    pub(super) fn breaker_changed(&self) {
        if let Some(breaker) = &self.breaker {
            self.events
                .breaker(breaker.state(), breaker.opens.load(Relaxed));
        }
    }

    /// Whether calls go to Redis now (no breaker, or a closed one).
    pub(super) fn redis_in_use(&self) -> bool {
        self.breaker
            .as_deref()
            .is_none_or(|b| b.state() == BreakerState::Closed)
    }

    /// What an undo of `decision` gives back (nothing unless it counted units), after
    /// dropping the key from the local deny cache.
    pub(super) fn undo_target<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        decision: &Decision,
    ) -> Option<(Vec<u8>, Counted)> {
        if !decision.is_allowed()
            || decision.cost == 0
            || decision.is_unchecked()
            || decision.slot & CHARGED_SLOT != 0
        {
            return None;
        }
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        if decision.slot & FALLBACK_SLOT != 0 {
            // Decided by the fallback limiter: undone there.
            if let Some(limiter) = &self.fallback {
                let mut local = *decision;
                local.slot &= !FALLBACK_SLOT;
                limiter.undo(&user, &local);
            }
            return None;
        }
        if let Some(cache) = &self.deny_cache {
            cache.remove(&user);
        }
        let back = Counted {
            slot: decision.slot,
            incarnation: decision.incarnation,
            units: decision.cost,
        };
        // Back into this instance's grant while it is in force.
        if let Some(table) = &self.leases {
            if table.give_back(&user, back) {
                self.events.lease_undone(back.units);
                return None;
            }
        }
        Some((user, back))
    }

    /// Count `units` for `user` whether they fit or not, handing back the
    /// key's grant here in the same call.
    pub(super) async fn run_charge(&self, user: Vec<u8>, units: u32, back: Option<Counted>) {
        let sent = Instant::now();
        match self.call(&user, units, None, None, back, true).await {
            Ok(answer) => {
                self.redis_answered(None);
                if let Some(back) = back {
                    self.handed_back(&user, back, answer.handed_back);
                }
                // A grant asked for before the charge may have come back
                // meanwhile: it goes back too.
                if let Some(late) = self.leases.as_ref().and_then(|t| t.take_key(&user)) {
                    self.hand_back(&user, late).await;
                }
            }
            Err(failure) => {
                if let Some(back) = back {
                    self.events.unreturned(back.units);
                }
                self.note_failure(failure, None, sent);
            }
        }
    }

    /// Give units back (at `now_us` or Redis' time).
    pub(super) async fn run_undo(&self, user: Vec<u8>, back: Counted, now_us: Option<u64>) {
        self.events.undo();
        let sent = Instant::now();
        match self.call(&user, 0, now_us, None, Some(back), false).await {
            Ok(_) => self.redis_answered(None),
            Err(failure) => {
                self.note_failure(failure, None, sent);
            }
        }
        // A check sent before the undo reached Redis may have been denied and
        // cached meanwhile: the units are back now, so forget it again.
        if let Some(cache) = &self.deny_cache {
            cache.remove(&user);
        }
    }
}

impl<K: RedisKey + Send + Sync + 'static> Store<K> for RedisStore {
    type Future = RedisFuture;

    fn check_n(&self, key: &K, cost: u32) -> RedisFuture {
        let inner = &self.inner;
        inner.events.asked();
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        if let Some(d) = inner.local_answer(&user, cost) {
            return RedisFuture::ready(Ok(d));
        }
        let ask = match inner.leased(&user, cost) {
            Ok(d) => return RedisFuture::ready(Ok(d)),
            Err(ask) => ask,
        };
        let probe = match inner.breaker.as_deref().map(|b| (b, b.admit(true))) {
            None | Some((_, Admit::Ask)) => false,
            Some((_, Admit::Probe)) => {
                inner.breaker_changed();
                true
            }
            Some((breaker, Admit::Refuse { remaining })) => {
                inner.lease_not_asked(&user, ask);
                return RedisFuture::ready(inner.breaker_answer(&user, cost, breaker, remaining));
            }
        };
        RedisFuture {
            state: State::Remote(Box::pin(inner.clone().decide(user, cost, probe, ask))),
        }
    }

    /// Answers without Redis when it can: a cost above the limit, a key the
    /// deny cache knows is over its limit, units of a lease, or any key while
    /// the circuit breaker is open (per the failure policy). `None` otherwise
    /// (nothing counted).
    fn check_now(&self, key: &K, cost: u32) -> Option<Result<Decision, StoreError>> {
        let inner = &self.inner;
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        let answer = match inner.local_answer(&user, cost) {
            Some(d) => Ok(d),
            None => match inner.leased_now(&user, cost) {
                Some(d) => Ok(d),
                None => match inner.breaker.as_deref().map(|b| (b, b.admit(false))) {
                    Some((breaker, Admit::Refuse { remaining })) => {
                        inner.breaker_answer(&user, cost, breaker, remaining)
                    }
                    _ => return None,
                },
            },
        };
        inner.events.asked();
        Some(answer)
    }

    /// Give the units back: into this instance's grant while it is in force,
    /// into the fallback limiter for its decisions, else in Redis, in a
    /// background task (fire and forget), dropping the key from the local deny
    /// cache. While the circuit breaker is not closed the units stay counted
    /// in Redis (the safe side).
    fn undo(&self, key: &K, decision: &Decision) {
        let Some((user, back)) = self.inner.undo_target(key, decision) else {
            return;
        };
        if !self.inner.redis_in_use() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.events.undo_not_sent();
            return;
        };
        let inner = self.inner.clone();
        runtime.spawn(async move { inner.run_undo(user, back, None).await });
    }

    /// Counts `units` in Redis whether they fit or not, in a background task
    /// (fire and forget, like [`undo`](Store::undo)), at the bucket Redis'
    /// clock is in when the script runs; this instance's grant of the key
    /// goes back in the same call, so that its next checks ask Redis, which
    /// denies them until the window is back under the limit. The answer
    /// stands for the units counted, but an [`undo`](Store::undo) of it gives
    /// nothing back (Redis chose the bucket): a later, lower settlement keeps
    /// the charge, the safe side. `None` (nothing counted) while the circuit
    /// breaker is not closed, or outside a tokio runtime.
    fn charge(&self, key: &K, units: u32) -> Option<Decision> {
        let inner = &self.inner;
        if units == 0 || !inner.redis_in_use() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        let back = inner.leases.as_ref().and_then(|t| t.take_key(&user));
        let task = inner.clone();
        runtime.spawn(async move { task.run_charge(user, units, back).await });
        let mut d = Decision::from_parts(
            Outcome::Allowed,
            inner.limit,
            0,
            Duration::ZERO,
            Duration::ZERO,
        );
        d.cost = units;
        d.slot = CHARGED_SLOT;
        Some(d)
    }

    fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// See [`RedisStore::reconfigured`].
    fn reconfigured(&self, policy: Policy) -> Result<Self, ConfigError> {
        RedisStore::reconfigured(self, policy)
    }
}

type RemoteDecision = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

/// A [`RedisStore`] decision in flight: ready at once when answered locally (a
/// cost above the limit, a deny-cache hit), otherwise one round trip to Redis.
#[must_use = "futures do nothing unless polled"]
pub struct RedisFuture {
    state: State,
}

enum State {
    Ready(Option<Result<Decision, StoreError>>),
    Remote(RemoteDecision),
}

impl RedisFuture {
    pub(super) fn ready(result: Result<Decision, StoreError>) -> RedisFuture {
        RedisFuture {
            state: State::Ready(Some(result)),
        }
    }
}

impl Future for RedisFuture {
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            State::Ready(result) => Poll::Ready(result.take().unwrap_or_else(|| {
                Err(StoreError::new(StoreErrorKind::Other, Duration::ZERO)
                    .with_source("decision polled after completion"))
            })),
            State::Remote(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for RedisFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready(_) => "ready",
            State::Remote(_) => "remote",
        };
        f.debug_struct("RedisFuture")
            .field("state", &state)
            .finish()
    }
}
