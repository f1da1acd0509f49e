//! Leases as the store runs them: a check admitted from a grant, what its
//! call to Redis asks for, replies merged into the lease table
//! ([`lease`](super::lease) holds the table and the rules), refills,
//! renewals and hand-backs in the background, and their counters.

use super::*;

impl Inner {
    /// A check admitted from a lease, or (`Err`) what its call to Redis asks
    /// for besides its cost: `None` without leases.
    pub(super) fn leased(
        self: &Arc<Self>,
        user: &[u8],
        cost: u32,
    ) -> Result<Decision, Option<(u64, Ask)>> {
        let Some(table) = &self.leases else {
            return Err(None);
        };
        if cost == 0 {
            return Err(None);
        }
        let hash = table.hash(user);
        match table.take(user, hash, cost) {
            Ok(leased) => Ok(self.lease_decision(user, hash, cost, leased)),
            Err(ask) => Err(Some((hash, ask))),
        }
    }

    /// A check admitted from a lease, if it can be: nothing done otherwise.
    pub(super) fn leased_now(self: &Arc<Self>, user: &[u8], cost: u32) -> Option<Decision> {
        let table = self.leases.as_ref()?;
        if cost == 0 {
            return None;
        }
        let hash = table.hash(user);
        let leased = table.take_held(user, hash, cost)?;
        Some(self.lease_decision(user, hash, cost, leased))
    }

    /// The decision of a check admitted from a lease (and its refill started).
    pub(super) fn lease_decision(
        self: &Arc<Self>,
        user: &[u8],
        hash: u64,
        cost: u32,
        leased: Leased,
    ) -> Decision {
        self.events.lease_decision(cost);
        if let Some(rate) = leased.refill {
            self.spawn_refill(user.to_vec(), hash, rate);
        }
        let mut d = Decision::from_parts(
            Outcome::Allowed,
            self.limit,
            leased.remaining,
            Duration::ZERO,
            leased.reset,
        );
        d.slot = leased.slot;
        d.incarnation = leased.incarnation;
        d.cost = cost;
        d
    }

    /// A check that will not go to Redis after all (the breaker answers it):
    /// undo what [`leased`](Self::leased) set up for its call.
    pub(super) fn lease_not_asked(&self, user: &[u8], ask: Option<(u64, Ask)>) {
        let (Some(table), Some((hash, ask))) = (&self.leases, ask) else {
            return;
        };
        if ask.rate > 0.0 {
            table.fetch_abandoned(user, hash);
        }
        if let Some(back) = ask.back {
            // Still this instance's to use if the grant is in force; else
            // they stay counted in Redis until their slot leaves the window.
            if !table.give_back(user, back) {
                self.events.unreturned(back.units);
            }
        }
    }

    /// Merge a reply that asked for a grant into the lease table, and start
    /// what that leaves to do: hand-backs, a renewal task. The time to renew
    /// the grant now held, if any.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn merged(
        self: &Arc<Self>,
        user: &[u8],
        hash: u64,
        answer: &Answer,
        extra: u32,
        sent: Instant,
        received: Instant,
        ticker: bool,
    ) -> Option<Instant> {
        let table = self.leases.as_ref()?;
        let reply = Reply {
            slot: answer.decision.slot,
            incarnation: answer.decision.incarnation,
            extra,
            valid: answer.valid,
            sent,
            received,
            remaining: answer.decision.remaining,
            reset: answer.decision.reset(),
        };
        if extra > 0 {
            self.events.lease_granted(extra);
        }
        let merged = table.granted(user, hash, reply, ticker);
        if !merged.back.is_empty() {
            let held = merged.back.into_iter().map(|b| (user.into(), b));
            self.spawn_hand_backs(held.collect());
        }
        if let Some(at) = merged.tick {
            self.spawn_renewals(user.to_vec(), hash, at);
        }
        merged.renew_at
    }

    /// Fetch more units of a key whose grant runs low, in the background.
    pub(super) fn spawn_refill(self: &Arc<Self>, user: Vec<u8>, hash: u64, rate: f64) {
        let Some(table) = &self.leases else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            table.fetch_abandoned(&user, hash);
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            let Some(table) = &inner.leases else { return };
            if !inner.redis_in_use() {
                table.fetch_abandoned(&user, hash);
                return;
            }
            let fetch = Fetch::new(table, &user, hash);
            let have = table.have(&user, hash);
            let sent = Instant::now();
            let lease = LeaseArgs { rate, have };
            match inner.call(&user, 0, None, Some(lease), None, false).await {
                Ok(answer) => {
                    inner.redis_answered(None);
                    fetch.done();
                    let received = Instant::now();
                    let extra = answer.granted;
                    inner.merged(&user, hash, &answer, extra, sent, received, false);
                }
                Err(failure) => {
                    inner.note_failure(failure, None, sent);
                }
            }
        });
    }

    /// The task that follows a key's grants: when a grant's bucket has ended,
    /// it hands back what is left and, while the key stays busy here, fetches
    /// the next bucket's grant in the same call, so that a steady hot key
    /// never waits for one.
    pub(super) fn spawn_renewals(self: &Arc<Self>, user: Vec<u8>, hash: u64, at: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            let Some(table) = &inner.leases else { return };
            let mut at = at;
            loop {
                tokio::time::sleep_until(at.into()).await;
                match table.tick(&user, hash) {
                    Tick::Wait(next) => at = next,
                    Tick::End { back } => {
                        if let Some(back) = back {
                            inner.hand_back(&user, back).await;
                        }
                        return;
                    }
                    Tick::Renew { back, rate } => {
                        let fetch = Fetch::new(table, &user, hash);
                        if !inner.redis_in_use() {
                            table.renewal_failed(&user, hash);
                            if let Some(back) = back {
                                inner.events.unreturned(back.units);
                            }
                            return;
                        }
                        let sent = Instant::now();
                        let lease = LeaseArgs { rate, have: 0 };
                        match inner.call(&user, 0, None, Some(lease), back, false).await {
                            Ok(answer) => {
                                inner.redis_answered(None);
                                fetch.done();
                                if let Some(back) = back {
                                    inner.handed_back(&user, back, answer.handed_back);
                                }
                                let received = Instant::now();
                                let extra = answer.granted;
                                match inner
                                    .merged(&user, hash, &answer, extra, sent, received, true)
                                {
                                    Some(next) => at = next,
                                    None => return,
                                }
                            }
                            Err(failure) => {
                                inner.note_failure(failure, None, sent);
                                table.renewal_failed(&user, hash);
                                if let Some(back) = back {
                                    inner.events.unreturned(back.units);
                                }
                                return;
                            }
                        }
                    }
                }
            }
        });
    }

    /// Hand units back to Redis, in the background, concurrently.
    pub(super) fn spawn_hand_backs(self: &Arc<Self>, held: Vec<(Box<[u8]>, Counted)>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            for (_, back) in held {
                self.events.unreturned(back.units);
            }
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move { inner.hand_back_all(held).await });
    }

    /// Hand units back to Redis, concurrently; returns once Redis has
    /// answered each (or its timeout passed).
    pub(super) async fn hand_back_all(self: &Arc<Self>, held: Vec<(Box<[u8]>, Counted)>) {
        let mut hand_backs = tokio::task::JoinSet::new();
        for (user, back) in held {
            let inner = self.clone();
            hand_backs.spawn(async move { inner.hand_back(&user, back).await });
        }
        while hand_backs.join_next().await.is_some() {}
    }

    /// Hand a lease's unused units back to Redis.
    pub(super) async fn hand_back(&self, user: &[u8], back: Counted) {
        if !self.redis_in_use() {
            self.events.unreturned(back.units);
            return;
        }
        let sent = Instant::now();
        match self.call(user, 0, None, None, Some(back), false).await {
            Ok(answer) => {
                self.redis_answered(None);
                self.handed_back(user, back, answer.handed_back);
            }
            Err(failure) => {
                self.events.unreturned(back.units);
                self.note_failure(failure, None, sent);
            }
        }
    }

    /// Redis answered a hand-back of `back`, lowering `taken` of its units:
    /// count them (the rest were refused), and drop a denial of the key this
    /// instance may have cached meanwhile.
    pub(super) fn handed_back(&self, user: &[u8], back: Counted, taken: u32) {
        let taken = taken.min(back.units);
        self.events.handed_back(taken, back.units - taken);
        if taken > 0 {
            if let Some(cache) = &self.deny_cache {
                cache.remove(user);
            }
        }
    }

    /// Stop leasing and hand back every unit held, concurrently.
    pub(super) async fn close_leases(self: &Arc<Self>) {
        let Some(table) = &self.leases else { return };
        self.hand_back_all(table.close()).await;
    }
}

/// A request for a key's grant in flight: dropped before its reply was
/// merged (the request went away, or it failed), it lets the next check of
/// the key ask again.
pub(super) struct Fetch<'a> {
    table: Option<&'a LeaseTable>,
    user: &'a [u8],
    hash: u64,
}

impl<'a> Fetch<'a> {
    pub(super) fn new(table: &'a LeaseTable, user: &'a [u8], hash: u64) -> Fetch<'a> {
        Fetch {
            table: Some(table),
            user,
            hash,
        }
    }

    /// The reply is about to be merged (which ends the fetch).
    pub(super) fn done(mut self) {
        self.table = None;
    }
}

impl Drop for Fetch<'_> {
    fn drop(&mut self) {
        if let Some(table) = self.table {
            table.fetch_abandoned(self.user, self.hash);
        }
    }
}
