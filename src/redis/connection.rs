//! The store's connection to Redis: the `redis` crate's `ConnectionManager`
//! (replaced when it goes silent), or a connection of the caller's own, and
//! what a failed call to Redis was.

use crate::log::Throttle;
use crate::store::{StoreError, StoreErrorKind};
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, ErrorKind, RedisError, ServerErrorKind};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::RwLock;
use std::time::Duration;

/// Timeouts in a row after which the managed connection is replaced: a
/// connection gone silent without closing (a peer vanished without a reset) is
/// otherwise kept until the OS gives up on it, many minutes later.
const REPLACE_AFTER_TIMEOUTS: u32 = 3;
/// At most one replacement per this interval, so a Redis that is merely slow
/// under load is not also flooded with new connections.
const REPLACE_INTERVAL: Duration = Duration::from_secs(1);

/// An async `redis` crate connection a [`RedisStore`](super::RedisStore) can decide over, given to
/// [`RedisStoreBuilder::connection`](super::RedisStoreBuilder::connection). Implemented for every cloneable
/// `redis::aio::ConnectionLike` (a `MultiplexedConnection`, a
/// `ConnectionManager`, a `cluster_async::ClusterConnection`, …).
pub trait AsyncConnection: Send + Sync {
    /// A handle to the same connection, for one request.
    fn clone_box(&self) -> Box<dyn AsyncConnectionHandle>;
}

/// One request's handle on an [`AsyncConnection`].
pub trait AsyncConnectionHandle: ::redis::aio::ConnectionLike + Send {}

impl<C: ::redis::aio::ConnectionLike + Send> AsyncConnectionHandle for C {}

impl<C> AsyncConnection for C
where
    C: ::redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn clone_box(&self) -> Box<dyn AsyncConnectionHandle> {
        Box::new(self.clone())
    }
}

/// The store's connection: managed (reconnects by itself) or the caller's own.
pub(super) enum Connection {
    Managed(Box<Managed>),
    Custom(Box<dyn AsyncConnection>),
}

/// The `redis` crate's `ConnectionManager`, which reconnects when its
/// connection drops or errors, replaced by a fresh one after
/// [`REPLACE_AFTER_TIMEOUTS`] timeouts in a row or a silent one (it does not
/// reconnect on a timeout, so a connection gone silent would be kept).
pub(super) struct Managed {
    client: Client,
    config: ConnectionManagerConfig,
    current: RwLock<ConnectionManager>,
    timeouts_in_a_row: AtomicU32,
    replacements: Throttle,
}

impl Connection {
    /// A managed connection to `client`, made lazily (on its first request).
    pub(super) fn managed(
        client: Client,
        config: ConnectionManagerConfig,
    ) -> Result<Connection, RedisError> {
        let current = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(Connection::Managed(Box::new(Managed {
            client,
            config,
            current: RwLock::new(current),
            timeouts_in_a_row: AtomicU32::new(0),
            replacements: Throttle::new(REPLACE_INTERVAL),
        })))
    }

    pub(super) fn is_managed(&self) -> bool {
        matches!(self, Connection::Managed(_))
    }

    pub(super) fn handle(&self) -> Handle {
        match self {
            Connection::Managed(m) => {
                let current = m.current.read().unwrap_or_else(|e| e.into_inner());
                Handle::Managed(current.clone())
            }
            Connection::Custom(conn) => Handle::Custom(conn.clone_box()),
        }
    }

    /// A reply came back in time.
    pub(super) fn answered(&self) {
        if let Connection::Managed(m) = self {
            if m.timeouts_in_a_row.load(Relaxed) != 0 {
                m.timeouts_in_a_row.store(0, Relaxed);
            }
        }
    }

    /// A request timed out; after enough in a row, start a fresh connection.
    pub(super) fn timed_out(&self) {
        let Connection::Managed(m) = self else {
            return;
        };
        if m.timeouts_in_a_row.fetch_add(1, Relaxed) + 1 < REPLACE_AFTER_TIMEOUTS
            || m.replacements.admit().is_none()
        {
            return;
        }
        m.replace();
    }
}

impl Connection {
    /// A call timed out while nothing was answered: replace a managed
    /// connection now (at most once per [`REPLACE_INTERVAL`]) instead of
    /// after [`REPLACE_AFTER_TIMEOUTS`] in a row, which the open breaker's
    /// probes would take a few cool-downs to reach.
    pub(super) fn stalled(&self) {
        if let Connection::Managed(m) = self {
            if m.replacements.admit().is_some() {
                m.replace();
            }
        }
    }
}

impl Managed {
    /// A fresh connection (lazily: it connects on its first request).
    /// Requests already sent on the old one finish or time out there.
    fn replace(&self) {
        self.timeouts_in_a_row.store(0, Relaxed);
        if let Ok(fresh) =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
        {
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        }
    }
}

/// A per-request handle (the `redis` crate takes connections by `&mut`).
pub(super) enum Handle {
    Managed(ConnectionManager),
    Custom(Box<dyn AsyncConnectionHandle>),
}

impl ::redis::aio::ConnectionLike for Handle {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match self {
            Handle::Managed(conn) => conn.req_packed_command(cmd),
            Handle::Custom(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Handle::Managed(conn) => conn.req_packed_commands(pipeline, offset, count),
            Handle::Custom(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Handle::Managed(conn) => conn.get_db(),
            Handle::Custom(conn) => conn.get_db(),
        }
    }
}

/// Why Redis could not decide.
pub(super) enum Failure {
    Timeout,
    Redis(RedisError),
    Reply,
}

impl Failure {
    /// The failure as a store error, keeping the `redis` crate's error as its
    /// source.
    pub(super) fn into_error(self, retry_after: Duration) -> StoreError {
        match self {
            Failure::Timeout => StoreError::new(StoreErrorKind::Timeout, retry_after),
            Failure::Redis(e) => StoreError::new(kind_of(&e), retry_after).with_source(e),
            Failure::Reply => StoreError::new(StoreErrorKind::Script, retry_after)
                .with_source("unexpected reply from the decision script"),
        }
    }
}

/// What kind of failure a `redis` crate error is.
fn kind_of(e: &RedisError) -> StoreErrorKind {
    if e.is_connection_refusal() {
        return StoreErrorKind::ConnectionRefused;
    }
    if e.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    match e.code() {
        Some("OOM") => return StoreErrorKind::OutOfMemory,
        Some("NOAUTH" | "WRONGPASS") => return StoreErrorKind::Unauthorized,
        _ => {}
    }
    match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Connection,
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            StoreErrorKind::Unauthorized
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain,
        ) => StoreErrorKind::Unavailable,
        ErrorKind::Server(
            ServerErrorKind::ResponseError | ServerErrorKind::ExecAbort | ServerErrorKind::NoScript,
        )
        | ErrorKind::Parse
        | ErrorKind::UnexpectedReturnType => StoreErrorKind::Script,
        _ => StoreErrorKind::Other,
    }
}
