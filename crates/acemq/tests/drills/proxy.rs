//! A TCP proxy for the network-cut drill, pure tokio.
//!
//! [`Proxy::start`] listens on `127.0.0.1:0` and forwards every accepted connection to a
//! target address, byte for byte, in both directions. The controls:
//!
//! * [`Proxy::cut`]: stop forwarding in both directions **without closing** any socket. Bytes
//!   stay unread in the kernel buffers, closes from either side go unnoticed, new
//!   connections are accepted but nothing passes: to both peers it looks like a network
//!   that went silent, so only heartbeats can notice.
//! * [`Proxy::restore`]: forward again (what was held back is delivered).
//! * [`Proxy::close_all`]: close every connection open now (both sides); new ones are
//!   accepted as usual.
//!
//! Dropping the proxy stops it and closes everything.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running proxy; see the module docs.
pub struct Proxy {
    port: u16,
    cut: watch::Sender<bool>,
    /// Cancelled by `close_all` (then replaced): every connection holds a child of it.
    generation: Arc<Mutex<CancellationToken>>,
    shutdown: CancellationToken,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, cut_rx) = watch::channel(false);
        let generation = Arc::new(Mutex::new(CancellationToken::new()));
        let shutdown = CancellationToken::new();
        let accept = tokio::spawn(accept_loop(
            listener,
            target,
            cut_rx,
            generation.clone(),
            shutdown.clone(),
        ));
        Ok(Proxy {
            port,
            cut,
            generation,
            shutdown,
            accept,
        })
    }

    /// The port the proxy listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding in both directions; no socket is closed.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// Whether forwarding is cut now.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }

    /// Closes every connection open now, both sides.
    pub fn close_all(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        g.cancel();
        *g = CancellationToken::new();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: watch::Receiver<bool>,
    generation: Arc<Mutex<CancellationToken>>,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => return,
        };
        let Ok((client, _)) = accepted else {
            continue;
        };
        let token = {
            let g = generation.lock().unwrap_or_else(|e| e.into_inner());
            g.child_token()
        };
        let stop = shutdown.child_token();
        let cut = cut.clone();
        tokio::spawn(async move {
            // Not even the upstream connect happens while the network is cut.
            if !wait_uncut(&cut, &token, &stop).await {
                return;
            }
            let upstream = tokio::select! {
                u = TcpStream::connect(target) => u,
                _ = token.cancelled() => return,
                _ = stop.cancelled() => return,
            };
            let Ok(upstream) = upstream else {
                return; // the client sees its connection closed, as with a refused connect
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (ur, uw) = upstream.into_split();
            let both = CancellationToken::new();
            let a = tokio::spawn(pump(cr, uw, cut.clone(), token.clone(), both.clone()));
            let b = tokio::spawn(pump(ur, cw, cut, token.clone(), both.clone()));
            tokio::select! {
                _ = token.cancelled() => {}
                _ = stop.cancelled() => {}
                _ = both.cancelled() => {}
            }
            // Dropping the halves closes both sockets.
            a.abort();
            b.abort();
        });
    }
}

/// Waits until forwarding is allowed; false when the connection is closed meanwhile.
async fn wait_uncut(
    cut: &watch::Receiver<bool>,
    token: &CancellationToken,
    stop: &CancellationToken,
) -> bool {
    let mut cut = cut.clone();
    tokio::select! {
        r = cut.wait_for(|c| !*c) => r.is_ok(),
        _ = token.cancelled() => false,
        _ = stop.cancelled() => false,
    }
}

/// Copies `from` to `to` while not cut; cancels `both` when either side ends.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cut: watch::Receiver<bool>,
    token: CancellationToken,
    both: CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut cut_changed = cut.clone();
    loop {
        if !wait_uncut(&cut, &token, &both).await {
            return;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    // Seen only while forwarding; held back while cut (see below).
                    if !wait_uncut(&cut, &token, &both).await {
                        return;
                    }
                    both.cancel();
                    return;
                }
                Ok(n) => n,
            },
            // A cut while waiting to read: stop reading, so nothing (not even a close)
            // is noticed until forwarding resumes.
            open = async { cut_changed.wait_for(|c| *c).await.is_ok() } => {
                if !open {
                    return;
                }
                continue;
            }
            _ = token.cancelled() => return,
            _ = both.cancelled() => return,
        };
        // Bytes read just before a cut are held until forwarding resumes.
        if !wait_uncut(&cut, &token, &both).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            both.cancel();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An echo server on 127.0.0.1:0; returns its address.
    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(within, s.read_exact(&mut got))
            .await
            .ok()?
            .ok()?;
        Some(got)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forwards_cuts_without_closing_restores_and_closes_all() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        assert_ne!(proxy.port(), 0);
        let mut s = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        let ok = Duration::from_secs(5);
        assert_eq!(
            roundtrip(&mut s, b"hello", ok).await.as_deref(),
            Some(&b"hello"[..])
        );

        proxy.cut();
        assert!(proxy.is_cut());
        // Nothing passes, and the socket stays open (a read neither returns data nor EOF).
        assert_eq!(
            roundtrip(&mut s, b"lost?", Duration::from_millis(300)).await,
            None
        );
        // A connection made during the cut is accepted but silent too.
        let mut during = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        assert_eq!(
            roundtrip(&mut during, b"x", Duration::from_millis(300)).await,
            None
        );

        proxy.restore();
        // What was held back arrives, then traffic flows again.
        let mut held = [0u8; 5];
        tokio::time::timeout(ok, s.read_exact(&mut held))
            .await
            .expect("held bytes arrive after restore")
            .unwrap();
        assert_eq!(&held, b"lost?");
        assert_eq!(
            roundtrip(&mut s, b"again", ok).await.as_deref(),
            Some(&b"again"[..])
        );
        let mut x = [0u8; 1];
        tokio::time::timeout(ok, during.read_exact(&mut x))
            .await
            .expect("the connection made during the cut works after restore")
            .unwrap();

        proxy.close_all();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(ok, s.read_to_end(&mut rest))
            .await
            .expect("close_all closes the client side")
            .unwrap_or(0);
        assert_eq!(n, 0);
        // New connections still work after close_all.
        let mut fresh = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        assert_eq!(
            roundtrip(&mut fresh, b"new", ok).await.as_deref(),
            Some(&b"new"[..])
        );
    }
}
