//! One request's decision over every policy of a layer, all-or-nothing, and
//! what to do with the request then. Both paths call it: the one that decides
//! in `call` (and its remote-store continuation) and the waiting modes.

use super::rejection::{Rejection, RejectionMode};
use super::response::RateLimitHeaders;
use super::shared::{Policies, Shared, MAX_POLICIES};
use crate::decision::{Decision, Outcome};
use crate::extract::{KeyOf, Keyed};
use crate::store::{Store, StoreError, StoreErrorKind};
use std::time::Duration;
use tower_service::Service;

/// Each policy's answer; `None` for a store not asked (yet).
pub(crate) type Answers = [Option<Result<Decision, StoreError>>; MAX_POLICIES];

/// The all-or-nothing outcome over every policy, naming the policy to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed(usize),
    Limited(usize),
    StoreDown(usize),
    /// No policy answered at all: a bug. The request is rejected, not forwarded.
    Unanswered,
}

/// What to do with the request.
// Short-lived: the headers move straight into the response future.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Action<T, E> {
    Forward(Option<RateLimitHeaders>),
    Reject(Result<T, E>),
}

/// Ask every store that answers at once (the in-memory limiter always does;
/// a remote one from its deny cache). True when some store must still be
/// asked through its future, and no answer so far denies the request: only
/// then is a remote store worth a round trip.
pub(crate) fn ask_now<K, St: Store<K>>(
    policies: &Policies<St>,
    key: &K,
    cost: u32,
    answers: &mut Answers,
) -> bool {
    let mut later = false;
    let mut settled = false;
    for (answer, limit) in answers.iter_mut().zip(policies.limits.iter()) {
        if answer.is_some() {
            continue;
        }
        match limit.store.check_now(key, cost) {
            Some(result) => {
                settled |= !matches!(result, Ok(d) if d.is_allowed());
                *answer = Some(result);
            }
            None => later = true,
        }
    }
    later && !settled
}

/// Ask every policy's in-memory limiter (the waiting modes' stores, which
/// always answer at once). Without them (a bug) nothing is asked, and the
/// request is left undecided, so it is rejected.
pub(crate) fn ask_now_local<X: Keyed, St, M>(
    shared: &Shared<X, St, M>,
    key: &KeyOf<X>,
    cost: u32,
    answers: &mut Answers,
) {
    let Some(local) = shared.local else {
        return;
    };
    for (answer, limit) in answers.iter_mut().zip(shared.policies.limits.iter()) {
        *answer = Some(Ok(local(&limit.store).check_n(key, cost)));
    }
}

/// True when denial `d` holds a request back longer than `than`: a cost no
/// wait helps (no `retry_after`) counts as the longest.
pub(crate) fn waits_longer(d: &Decision, than: &Decision) -> bool {
    match (d.retry_after(), than.retry_after()) {
        (_, None) => false,
        (None, _) => true,
        (wait, longest) => wait > longest,
    }
}

/// All-or-nothing: if any policy denies (or its store fails), give back what
/// the others counted, and name the policy to report: for a denial the denying
/// one with the longest wait; for an admission the one with the lowest
/// remaining share of its limit.
pub(crate) fn decide<K, St: Store<K>>(
    policies: &Policies<St>,
    key: &K,
    answers: &Answers,
) -> Verdict {
    let mut allowed: Option<(usize, Decision)> = None;
    let mut denied: Option<(usize, Decision)> = None;
    let mut failed: Option<usize> = None;
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            None => {}
            Some(Err(_)) => {
                failed.get_or_insert(i);
            }
            Some(Ok(d)) if d.is_allowed() => {
                let closer = allowed.is_none_or(|(_, best)| {
                    match (d.is_unchecked(), best.is_unchecked()) {
                        // A store that failed open knows nothing of the key:
                        // report a checked policy whenever there is one.
                        (false, true) => true,
                        (true, false) => false,
                        // remaining / limit < best.remaining / best.limit, without division
                        _ => {
                            u64::from(d.remaining()) * u64::from(best.limit())
                                < u64::from(best.remaining()) * u64::from(d.limit())
                        }
                    }
                });
                if closer {
                    allowed = Some((i, *d));
                }
            }
            Some(Ok(d)) if denied.is_none_or(|(_, longest)| waits_longer(d, &longest)) => {
                denied = Some((i, *d));
            }
            Some(Ok(_)) => {}
        }
    }
    let verdict = match (denied, failed, allowed) {
        // A definite denial beats a store that could not answer.
        (Some((i, _)), _, _) => Verdict::Limited(i),
        (None, Some(i), _) => Verdict::StoreDown(i),
        (None, None, Some((i, _))) => return Verdict::Allowed(i),
        (None, None, None) => {
            debug_assert!(false, "a request was decided without any answer");
            Verdict::Unanswered
        }
    };
    give_back(policies, key, answers.iter().map(admitted));
    verdict
}

/// The decision an answer admitted, if it did.
pub(crate) fn admitted(answer: &Option<Result<Decision, StoreError>>) -> Option<&Decision> {
    match answer {
        Some(Ok(d)) if d.is_allowed() => Some(d),
        _ => None,
    }
}

/// Give back every unit these admissions counted, policy by policy
/// (all-or-nothing: the request does not go through).
pub(crate) fn give_back<'d, K, St: Store<K>>(
    policies: &Policies<St>,
    key: &K,
    admissions: impl IntoIterator<Item = Option<&'d Decision>>,
) {
    for (decision, limit) in admissions.into_iter().zip(policies.limits.iter()) {
        if let Some(decision) = decision {
            limit.store.undo(key, decision);
        }
    }
}

/// What the verdict means for the request: forward it (with the headers of
/// the reported policy, if the mode writes any) or reject it, counting and
/// logging as the layer is configured.
pub(crate) fn act<Req, S, X, St, M>(
    shared: &Shared<X, St, M>,
    policies: &Policies<St>,
    req: &Req,
    key: &KeyOf<X>,
    verdict: Verdict,
    answers: &Answers,
) -> Action<M::Response, M::Error>
where
    S: Service<Req>,
    X: Keyed,
    M: RejectionMode<Req, S>,
{
    let report = |i: usize| {
        let decision = match &answers[i] {
            Some(Ok(d)) => *d,
            _ => Decision::allow_unchecked(0),
        };
        policies.report(i, decision)
    };
    match verdict {
        Verdict::Allowed(i) => Action::Forward(shared.mode.allowed_headers(|| report(i))),
        Verdict::Limited(i) => {
            let report = report(i);
            let name = &policies.limits[i].name;
            let d = &report.decision;
            let logged = shared.loggable_key(key);
            let logged = logged.as_ref().map(|k| k as &dyn std::fmt::Display);
            shared
                .events
                .limited(name, d.limit(), d.retry_after(), logged, shared.dry_run);
            if shared.dry_run {
                return Action::Forward(shared.mode.allowed_headers(|| report));
            }
            let violated = policies.violated(answers);
            Action::Reject(
                shared
                    .mode
                    .reject(req, Rejection::Limited(report, name, violated)),
            )
        }
        Verdict::StoreDown(i) => {
            let Some(Err(error)) = &answers[i] else {
                debug_assert!(false, "StoreDown names a policy whose store answered");
                return unanswered(shared, req);
            };
            shared
                .events
                .store_down(&policies.limits[i].name, error, shared.dry_run);
            if shared.dry_run {
                return Action::Forward(None);
            }
            Action::Reject(shared.mode.reject(req, Rejection::StoreUnavailable(error)))
        }
        Verdict::Unanswered => unanswered(shared, req),
    }
}

/// A request the layer failed to decide (a bug): rejected as if its store
/// were down, never forwarded unchecked.
fn unanswered<Req, S, X, St, M>(
    shared: &Shared<X, St, M>,
    req: &Req,
) -> Action<M::Response, M::Error>
where
    S: Service<Req>,
    X: Keyed,
    M: RejectionMode<Req, S>,
{
    shared.events.undecided();
    let error = StoreError::new(StoreErrorKind::Other, Duration::from_secs(1))
        .with_source("the rate limiter left a request undecided");
    Action::Reject(shared.mode.reject(req, Rejection::StoreUnavailable(&error)))
}

/// The verdict of a wait queue's outcome, as the reject path would reach it:
/// the admissions (reported as the policy closest to its limit), or the
/// denial of policy `policy`.
pub(crate) fn queued_verdict<K, St: Store<K>>(
    policies: &Policies<St>,
    key: &K,
    outcome: Result<&[Option<Decision>; MAX_POLICIES], (usize, Decision)>,
    answers: &mut Answers,
) -> Verdict {
    match outcome {
        Ok(admitted) => {
            for (answer, decision) in answers.iter_mut().zip(admitted) {
                *answer = decision.map(Ok);
            }
            decide(policies, key, answers)
        }
        Err((policy, decision)) => {
            debug_assert!(policy < policies.limits.len(), "policy {policy} of a queue");
            if policy >= policies.limits.len() {
                return Verdict::Unanswered;
            }
            debug_assert!(decision.outcome() != Outcome::Allowed);
            answers[policy] = Some(Ok(decision));
            Verdict::Limited(policy)
        }
    }
}
