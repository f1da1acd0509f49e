//! The decision script's protocol: its arguments, one run of `check.lua`
//! within the timeout, and its reply parsed into a decision, the units it
//! counted and how many units handed back it lowered.

use super::*;

pub(super) const CHECK_SCRIPT: &str = include_str!("check.lua");

/// Pauses between the warm-up's connection attempts: short at first, so a
/// Redis that starts with the app is found at once, then doubling.
pub(super) const WARM_UP_MIN_PAUSE: Duration = Duration::from_millis(10);

pub(super) const WARM_UP_MAX_PAUSE: Duration = Duration::from_millis(200);

/// What the script answered: the decision, the units it counted (its cost,
/// and a lease's), how long its slot lasted then, and how many of the units
/// handed back in the call it lowered.
pub(super) struct Answer {
    pub(super) decision: Decision,
    pub(super) granted: u32,
    pub(super) valid: Duration,
    pub(super) handed_back: u32,
}

/// A lease's part of a call: units a second expected of the key here, and
/// units this instance still holds of it.
#[derive(Clone, Copy)]
pub(super) struct LeaseArgs {
    pub(super) rate: f64,
    pub(super) have: u32,
}

/// What one run of the script at an injected time answered (for tests that
/// play an instance's lease by hand).
#[cfg(all(test, not(tsw_loom)))]
#[derive(Debug)]
pub(crate) struct ScriptAnswer {
    pub(crate) decision: Decision,
    /// Units counted: the cost and a lease's extra units.
    pub(crate) granted: u32,
    /// How long the decision's slot lasted.
    pub(crate) valid: Duration,
    /// Units of the hand-back that Redis lowered.
    pub(crate) handed_back: u32,
}

#[cfg(all(test, not(tsw_loom)))]
impl RedisStore {
    /// One run of the script at Redis time `now`: a check of `cost` units of
    /// `key`, asking for a lease of `rate` units a second while this instance
    /// holds `have` (a rate of 0 asks for none), after handing `back` back.
    pub(crate) async fn script_at<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        now: Duration,
        rate: f64,
        have: u32,
        back: Option<Counted>,
    ) -> Result<ScriptAnswer, String> {
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        let now_us = u64::try_from(now.as_micros()).map_err(|e| e.to_string())?;
        let lease = Some(LeaseArgs { rate, have });
        match self
            .inner
            .call(&user, cost, Some(now_us), lease, back, false)
            .await
        {
            Ok(a) => Ok(ScriptAnswer {
                decision: a.decision,
                granted: a.granted,
                valid: a.valid,
                handed_back: a.handed_back,
            }),
            Err(e) => Err(e.into_error(Duration::ZERO).to_string()),
        }
    }
}

impl Inner {
    /// Load the script, trying again while the connection fails, until
    /// `timeout`.
    pub(super) async fn load_scripts(&self, timeout: Duration) -> Result<(), StoreError> {
        let mut last_connection_error = None;
        let load = async {
            let mut pause = WARM_UP_MIN_PAUSE;
            loop {
                let mut conn = self.conn.handle();
                let loaded = self.check.load_async(&mut conn);
                match loaded.await {
                    Err(e) if e.is_io_error() => {
                        last_connection_error = Some(e);
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(WARM_UP_MAX_PAUSE);
                    }
                    done => return done,
                }
            }
        };
        let failure = match tokio::time::timeout(timeout, load).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => Failure::Redis(e),
            Err(_) => last_connection_error.map_or(Failure::Timeout, Failure::Redis),
        };
        Err(failure.into_error(self.closed_retry_after))
    }

    /// One decision script in Redis, bounded by the timeout; failures are reported
    /// as they are (the failure policy is applied by the caller).
    #[cfg(all(test, not(tsw_loom)))]
    pub(super) async fn run_check(
        &self,
        user: &[u8],
        cost: u32,
        now_us: Option<u64>,
    ) -> Result<Decision, Failure> {
        self.call(user, cost, now_us, None, None, false)
            .await
            .map(|answer| answer.decision)
    }

    /// One run of the script: a check of `cost` units (asking for a lease's
    /// extra units too, with `lease`), with `back` units handed back first,
    /// at `now_us` or Redis' time; with `charge`, `cost` is counted whether
    /// it fits or not.
    pub(super) async fn call(
        &self,
        user: &[u8],
        cost: u32,
        now_us: Option<u64>,
        lease: Option<LeaseArgs>,
        back: Option<Counted>,
        charge: bool,
    ) -> Result<Answer, Failure> {
        let mut invocation = self.check.prepare_invoke();
        invocation
            .key(self.full_key(user))
            .arg(self.limit)
            .arg(self.buckets)
            .arg(self.width_us)
            .arg(cost)
            .arg(u8::from(self.interpolated));
        // The optional arguments are positional: each one given needs those
        // before it.
        let back = back.or(charge.then_some(Counted {
            slot: 0,
            incarnation: 0,
            units: 0,
        }));
        if now_us.is_some() || lease.is_some() || back.is_some() {
            match now_us {
                Some(now_us) => invocation.arg(now_us),
                None => invocation.arg(""),
            };
        }
        if lease.is_some() || back.is_some() {
            let lease = lease.unwrap_or(LeaseArgs { rate: 0.0, have: 0 });
            let share = self.leases.as_ref().map_or(1, LeaseTable::share);
            // Units a second, to the millisecond unit: whole digits for Lua.
            let rate = format!("{:.3}", lease.rate);
            invocation.arg(rate).arg(lease.have).arg(share);
        }
        if let Some(back) = back {
            invocation
                .arg(back.units)
                .arg(back.slot)
                .arg(back.incarnation);
        }
        if charge {
            invocation.arg(1);
        }
        let reply: Vec<i64> = self.invoke(&invocation).await?;
        self.parse(&reply, cost).ok_or(Failure::Reply)
    }

    /// One script call within the timeout, telling the connection whether it
    /// was answered (for its replacement after timeouts in a row).
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Failure> {
        let call = async {
            let mut conn = self.conn.handle();
            // `invoke_async` sends EVALSHA and, on NOSCRIPT, SCRIPT LOAD + EVALSHA.
            match invocation.invoke_async(&mut conn).await {
                // Refused means nothing was sent. The managed connection makes
                // a new attempt only when a request finds the last one failed,
                // and that one may date from before Redis returned: try once
                // more on the attempt this failure has just started.
                Err(e) if e.is_connection_refusal() && self.conn.is_managed() => {
                    invocation.invoke_async(&mut conn).await
                }
                reply => reply,
            }
        };
        let started = self.events.call_started();
        let reply = tokio::time::timeout(self.timeout, call).await;
        self.events.answered(started);
        match reply {
            Ok(reply) => {
                self.conn.answered();
                reply.map_err(Failure::Redis)
            }
            Err(_) => {
                self.conn.timed_out();
                Err(Failure::Timeout)
            }
        }
    }

    /// `{allowed, remaining, retry_after_ns, reset_ns, slot, granted,
    /// valid_us, incarnation, handed_back}` into an answer.
    pub(super) fn parse(&self, reply: &[i64], cost: u32) -> Option<Answer> {
        let &[allowed, remaining, retry_ns, reset_ns, slot, granted, valid_us, incarnation, handed_back] =
            reply
        else {
            return None;
        };
        let micros = |v: i64| u64::try_from(v).ok().map(Duration::from_micros);
        let nanos = |v: i64| u64::try_from(v).ok().map(Duration::from_nanos);
        let outcome = match allowed {
            1 => Outcome::Allowed,
            0 => Outcome::Denied,
            _ => return None,
        };
        let mut d = Decision::from_parts(
            outcome,
            self.limit,
            u32::try_from(remaining).ok()?,
            nanos(retry_ns)?,
            nanos(reset_ns)?,
        );
        d.slot = u64::try_from(slot).ok()?;
        d.incarnation = u64::try_from(incarnation).ok()?;
        if outcome == Outcome::Allowed {
            d.cost = cost;
        }
        Some(Answer {
            decision: d,
            granted: u32::try_from(granted).ok()?,
            valid: micros(valid_us)?,
            handed_back: u32::try_from(handed_back).ok()?,
        })
    }
}
