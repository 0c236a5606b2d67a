//! The listening connection: a connection of its own that LISTENs on the lease table's channel
//! and forwards each release to the store's [`LeaseNotices`], made again whenever it is lost.
//!
//! tokio-postgres hands notifications only to whoever polls the connection by
//! `Connection::poll_message`, so this task is the connection's driver as well as its reader.
//! A notification sent while no connection listens is lost for good; that is why every new
//! connection after the first ends with [`LeaseNotice::Missed`], sent once the LISTEN is in
//! place (sent earlier, a waiter could re-read before the LISTEN and miss a release between
//! the two). NOTIFY is a hint: waiters must also retry when a lease would run out.
//!
//! The task stops when the store or the notices are dropped (each holds its abort handle):
//! nobody is left to act on a notice.

use std::convert::Infallible;
use std::fmt;
use std::future::{Future, pending, poll_fn};
use std::pin::pin;
use std::task::Poll;

use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client};

use crate::cluster::error::{BoxError, ClusterError};
use crate::cluster::locking::lease_store::LeaseNotice;
use crate::cluster::locking::notices::{self, LeaseNotices, NoticeSender};
use crate::cluster::postgres::backoff::{self, Backoff};
use crate::cluster::postgres::config::LeaseTable;
use crate::cluster::postgres::connection::{PgConnection, Server};

/// Messages read in one poll before the task yields, so that a burst of notifications cannot
/// hold a runtime worker.
const MESSAGES_PER_POLL: usize = 64;

/// Connects, LISTENs, and spawns the task that forwards releases from then on; returns the
/// notices and the task's abort handle, for the store to stop it when dropped.
///
/// The first connection is made here, so that a server that cannot be listened to fails the
/// store's connect, and no release after the connect is missed.
pub(crate) async fn start(
    server: Server,
    table: &LeaseTable,
    application_name: String,
) -> Result<(LeaseNotices, AbortHandle), ClusterError> {
    let (sender, mut receiver) = notices::channel();
    let channel = table.name().to_owned();
    let connected = listen(&server, &channel, &application_name, &sender).await?;
    let listener = Listener {
        server,
        channel,
        application_name,
        notices: sender,
    };
    let task = tokio::spawn(listener.run(connected));
    receiver.stop_on_drop(task.abort_handle());
    Ok((receiver, task.abort_handle()))
}

struct Listener {
    server: Server,
    channel: String,
    application_name: String,
    notices: NoticeSender,
}

impl Listener {
    /// Forwards releases for ever, reconnecting after every loss.
    async fn run(self, mut connected: (Client, PgConnection)) {
        let mut backoff = Backoff::default();
        loop {
            let connected_at = Instant::now();
            // `connected.0`, the client, is not used again, but must live: dropping it would
            // end the connection.
            let connection = &mut connected.1;
            let forwarding = forward_until(connection, &self.channel, &self.notices, pending());
            let Err::<Infallible, _>(end) = forwarding.await;
            tracing::warn!(error = %end, "lease store: listening connection lost");
            // A connection that lasted resets the backoff; one lost as soon as it is made (a
            // server that drops every session) keeps it growing.
            if connected_at.elapsed() >= backoff::MAX {
                backoff.reset();
            }
            connected = self.reconnect(&mut backoff).await;
            self.notices.send(LeaseNotice::Missed);
        }
    }

    /// Waits out the backoff and tries again, until a new connection listens.
    async fn reconnect(&self, backoff: &mut Backoff) -> (Client, PgConnection) {
        loop {
            tokio::time::sleep(backoff.next_delay()).await;
            match listen(
                &self.server,
                &self.channel,
                &self.application_name,
                &self.notices,
            )
            .await
            {
                Ok(connected) => {
                    tracing::info!(server = self.server.name(), "lease store: listening again");
                    return connected;
                }
                Err(error) => tracing::warn!(%error, "lease store: cannot listen yet"),
            }
        }
    }
}

/// Opens a connection and LISTENs on `channel`. A release announced as soon as the LISTEN
/// takes effect can arrive with its reply; it goes to `notices` like any other.
async fn listen(
    server: &Server,
    channel: &str,
    application_name: &str,
    notices: &NoticeSender,
) -> Result<(Client, PgConnection), ClusterError> {
    let (client, mut connection) = server.open(application_name).await?;
    // The channel is a checked identifier (`LeaseTable`): quoting it is enough.
    let statement = format!("LISTEN \"{channel}\"");
    let listened = forward_until(
        &mut connection,
        channel,
        notices,
        client.batch_execute(&statement),
    );
    let source: BoxError = match tokio::time::timeout(server.connect_timeout(), listened).await {
        Ok(Ok(Ok(()))) => return Ok((client, connection)),
        Err(_elapsed) => return Err(server.timed_out()),
        Ok(Ok(Err(error))) => Box::new(error),
        Ok(Err(end)) => Box::new(end),
    };
    Err(ClusterError::Database {
        action: format!("listening on channel {channel:?}"),
        source,
    })
}

/// Why a connection stopped being readable.
#[derive(Debug)]
enum ConnectionEnd {
    /// It broke: a terminated backend, a reset, a keepalive timeout.
    Failed(tokio_postgres::Error),
    /// It was closed in order.
    Closed,
}

impl fmt::Display for ConnectionEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionEnd::Failed(error) => write!(f, "{error}"),
            ConnectionEnd::Closed => f.write_str("the connection closed"),
        }
    }
}

impl std::error::Error for ConnectionEnd {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectionEnd::Failed(error) => error.source(),
            ConnectionEnd::Closed => None,
        }
    }
}

/// Drives `connection`, forwarding our channel's notifications to `notices`, until `task`
/// completes (`Ok` with its output) or the connection ends (`Err`).
///
/// The connection must be polled for its client's statements to be sent and answered, so a
/// statement on the listening client runs as `task` here.
async fn forward_until<T>(
    connection: &mut PgConnection,
    channel: &str,
    notices: &NoticeSender,
    task: impl Future<Output = T>,
) -> Result<T, ConnectionEnd> {
    let mut task = pin!(task);
    poll_fn(|cx| {
        for _ in 0..MESSAGES_PER_POLL {
            match connection.poll_message(cx) {
                Poll::Pending => return task.as_mut().poll(cx).map(Ok),
                Poll::Ready(None) => return Poll::Ready(Err(ConnectionEnd::Closed)),
                Poll::Ready(Some(Err(error))) => {
                    return Poll::Ready(Err(ConnectionEnd::Failed(error)));
                }
                Poll::Ready(Some(Ok(AsyncMessage::Notification(notification)))) => {
                    if notification.channel() == channel {
                        notices.send(LeaseNotice::Released(notification.payload().to_owned()));
                    }
                }
                // Server notices (warnings sent unasked) concern nobody here.
                Poll::Ready(Some(Ok(_))) => {}
            }
        }
        // The budget is spent with messages still coming: let other tasks run, then go on.
        if let Poll::Ready(output) = task.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}
