//! The TCP socket under each AMQP connection: dialled by us (plain, or TLS through
//! [`super::tls`]) inside [`lapin::Connection::connector`], with a second handle on the
//! socket kept beside the connection, so a socket lapin stopped using can still be ended.
//!
//! Why the second handle: when the broker closes a connection (`connection.close`, e.g.
//! `rabbitmqctl close_connection`, a node shutting down), lapin answers `close-ok` and marks
//! the connection failed from another task than its I/O loop. In a race seen in the TLS
//! drill about one time in five, the I/O loop is then parked waiting for socket events
//! and nothing wakes it: the `close-ok` is never written, the socket stays open, and the
//! broker keeps listing the connection (state `closed`) until its own 30 s closing timeout.
//! A service that is force-closed now and then would carry such half-dead connections (and
//! their descriptors and lapin threads) around. Once a connection is lost (and after a
//! short grace in which lapin may finish on its own), [`SocketHandle::retire`] shuts the
//! socket down both ways: the broker sees it close, and lapin's I/O loop wakes and exits.
//!
//! `shutdown(2)` acts on the socket, not on one descriptor, so shutting it through our
//! duplicate ends lapin's use of it too. Holding the duplicate also keeps the socket open
//! after lapin drops its own, so every path that ends a connection retires its handle
//! (loss, replacement, close); dropping the handle closes the duplicate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::tcp::AsyncTcpStream;
use lapin::uri::AMQPUri;

/// How long a lost connection's socket is left to lapin (to write its `close-ok` and close
/// the socket itself) before it is shut from our side.
const GRACE: Duration = Duration::from_millis(500);

/// A second handle on one connection's TCP socket (none off unix, where the race above is
/// left to the broker's closing timeout).
#[derive(Debug, Default)]
pub(crate) struct SocketHandle(Option<std::net::TcpStream>);

impl SocketHandle {
    /// Ends the socket now: shut down both ways, then the duplicate closed.
    pub(crate) fn shut(self) {
        if let Some(socket) = self.0 {
            // Already shut or reset by the peer: nothing left to end.
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Ends the socket of a lost connection after [`GRACE`], without waiting for it.
    pub(crate) fn retire(self) {
        if self.0.is_none() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(GRACE).await;
                    self.shut();
                });
            }
            Err(_) => self.shut(),
        }
    }
}

/// Opens a lapin connection to `uri` over a TCP socket we dial (TLS on top when `tls` is
/// given: the connector and the name verified), and returns it with a [`SocketHandle`] on
/// that socket.
pub(crate) async fn connect(
    uri: AMQPUri,
    properties: lapin::ConnectionProperties,
    tls: Option<(lapin::tcp::RustlsConnector, String)>,
) -> lapin::Result<(lapin::Connection, SocketHandle)> {
    let runtime = lapin::runtime::default_runtime()?;
    let tls = Arc::new(tls);
    // lapin may call the dial more than once (its own retries); the last socket is the one
    // the connection runs on.
    let latest: Arc<Mutex<SocketHandle>> = Arc::default();
    let keep = Arc::clone(&latest);
    let conn = lapin::Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let addrs = runtime.to_socket_addrs((uri.authority.host.clone(), uri.authority.port));
            let stream = AsyncTcpStream::connect(&runtime, addrs)
                .await
                .map_err(lapin::Error::from)?;
            // A duplicate descriptor of the socket (none when it cannot be made: the
            // connection then relies on lapin and the broker alone to end its socket).
            #[cfg(unix)]
            if let AsyncTcpStream::Plain(plain) = &stream {
                use std::os::fd::AsFd;
                let copy = plain.get_ref().as_fd().try_clone_to_owned();
                *keep.lock().unwrap_or_else(|e| e.into_inner()) =
                    SocketHandle(copy.ok().map(std::net::TcpStream::from));
            }
            #[cfg(not(unix))]
            let _ = &keep;
            match tls.as_ref() {
                Some((connector, server_name)) => stream
                    .into_rustls(connector, server_name)
                    .await
                    .map_err(lapin::Error::from),
                None => Ok(stream),
            }
        },
        properties,
    )
    .await?;
    let socket = std::mem::take(&mut *latest.lock().unwrap_or_else(|e| e.into_inner()));
    Ok((conn, socket))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Shutting the duplicate ends the socket for its other holder and the peer: the peer
    /// reads end-of-stream although the original descriptor is still open.
    #[test]
    fn shutting_the_duplicate_ends_the_socket_for_the_peer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let original =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut peer, _) = listener.accept().expect("accept");
        let copy = original.try_clone().expect("dup");
        SocketHandle(Some(copy)).shut();
        peer.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = [0u8; 8];
        assert_eq!(
            peer.read(&mut buf).expect("read"),
            0,
            "the peer sees the close"
        );
        drop(original);
    }

    /// Retiring inside a runtime shuts the socket after the grace, not before.
    #[tokio::test(start_paused = true)]
    async fn retiring_shuts_after_the_grace() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let original =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut peer, _) = listener.accept().expect("accept");
        peer.set_nonblocking(true).expect("nonblocking");
        SocketHandle(Some(original.try_clone().expect("dup"))).retire();
        tokio::time::sleep(GRACE / 2).await;
        let mut buf = [0u8; 8];
        assert_eq!(
            peer.read(&mut buf).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "still open inside the grace"
        );
        tokio::time::sleep(GRACE).await;
        tokio::task::yield_now().await;
        peer.set_nonblocking(false).expect("blocking");
        peer.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(
            peer.read(&mut buf).expect("read"),
            0,
            "shut after the grace"
        );
        drop(original);
    }
}
