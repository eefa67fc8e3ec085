//! The emulator's own accept loop: plain HTTP or TLS (ALPN `h2`/`http/1.1`), an optional
//! emulated round-trip time, and connections that can be aborted from a handler (fault
//! `dropConnection`) or all at once (`close()`): each connection's IO fails as soon as its
//! cancellation token fires.
//!
//! Layering of one connection, from the socket up:
//! `TcpStream` → [`DelayIo`] (only when `rtt_ms > 0`) → TLS (only with `tls`) → [`KillableIo`]
//! → hyper-util's auto builder (HTTP/1.1, or HTTP/2 when ALPN chose `h2` / a plain-HTTP client
//! sent the h2 preface) → the axum router, with the connection's [`ConnHandle`] as a request
//! extension.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::{Bytes, BytesMut};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, PollSender, WaitForCancellationFutureOwned};

/// A TLS handshake that has not finished by then is abandoned (the connection is closed).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest chunk one delayed segment carries.
const SEGMENT: usize = 64 * 1024;
/// Segments in flight per direction of a delayed connection (bounds its memory to ~2 MiB).
const IN_FLIGHT: usize = 32;

/// Per-connection info handed to handlers as a request extension.
#[derive(Clone, Debug)]
pub(crate) struct ConnHandle {
    /// 1-based, in accept order.
    pub id: u64,
    pub token: CancellationToken,
}

/// How connections are served.
pub(crate) struct NetConfig {
    pub tls: Option<TlsAcceptor>,
    /// Offer / accept HTTP/2 (ALPN `h2` with TLS, the h2 preface without).
    pub http2: bool,
    /// Emulated round-trip time; zero = none.
    pub rtt: Duration,
}

/// Accepts until `shutdown` fires, then waits until every connection task ended (their IO
/// fails once `shutdown` fires, since every connection token is a child of it).
pub(crate) async fn serve(
    listener: TcpListener,
    cfg: NetConfig,
    app: Router,
    shutdown: CancellationToken,
    accepted: Arc<AtomicU64>,
) {
    let cfg = Arc::new(cfg);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((tcp, _peer)) => {
                    let id = accepted.fetch_add(1, Ordering::SeqCst) + 1;
                    let handle = ConnHandle { id, token: shutdown.child_token() };
                    conns.spawn(serve_conn(tcp, handle, cfg.clone(), app.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

type BoxIo = Box<dyn Io>;

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

async fn serve_conn(tcp: TcpStream, handle: ConnHandle, cfg: Arc<NetConfig>, app: Router) {
    let _ = tcp.set_nodelay(true);
    let token = handle.token.clone();
    let io: BoxIo = if cfg.rtt.is_zero() {
        Box::new(tcp)
    } else {
        // The TCP handshake this connection would have cost: one round trip before anything
        // is read or written.
        tokio::select! {
            () = tokio::time::sleep(cfg.rtt) => {}
            () = token.cancelled() => return,
        }
        Box::new(DelayIo::new(tcp, cfg.rtt / 2, &token))
    };
    // `Some(true)`: ALPN chose h2; `Some(false)`: HTTP/1.1 (ALPN or none); `None`: plain HTTP.
    let (io, alpn_h2): (BoxIo, Option<bool>) = match &cfg.tls {
        None => (io, None),
        Some(acceptor) => {
            let tls = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)) => r,
                () = token.cancelled() => return,
            };
            let Ok(Ok(tls)) = tls else { return };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            (Box::new(tls), Some(h2))
        }
    };
    let io = KillableIo { inner: io, killed: Box::pin(token.clone().cancelled_owned()), dead: false };
    let svc = TowerToHyperService::new(app.layer(axum::Extension(handle)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder = match alpn_h2 {
        Some(true) => builder.http2_only(),
        Some(false) => builder.http1_only(),
        None if !cfg.http2 => builder.http1_only(),
        None => builder,
    };
    let _ = builder.serve_connection(TokioIo::new(io), svc).await;
}

// ---------------------------------------------------------------- abortable IO

pub(crate) struct KillableIo {
    inner: BoxIo,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
    dead: bool,
}

impl KillableIo {
    fn is_dead(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.dead && self.killed.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        self.dead
    }
}

fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "connection dropped by emulator")
}

impl AsyncRead for KillableIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.is_dead(cx) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.is_dead(cx) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.is_dead(cx) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.is_dead(cx) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------- emulated latency

/// What travels one direction of a delayed connection.
enum Seg {
    Data(Bytes),
    /// The sender shut its side down (FIN).
    Fin,
    Err(io::Error),
}

/// A TCP stream whose bytes reach the other side `delay` after they were sent, in order, in
/// both directions (a link with a one-way latency of `delay` and no bandwidth limit beyond
/// [`IN_FLIGHT`] × [`SEGMENT`] bytes in flight per direction).
///
/// Two tasks own the socket halves: the writer delivers each segment once its time has come,
/// the reader stamps each chunk it reads with `now + delay`, and `poll_read` hands a chunk out
/// only when its stamp has passed. Both tasks end when the connection token fires (the socket
/// closes at once, in-flight bytes are lost, as in an abort), or when this side is dropped
/// (the writer still delivers what is in flight, then closes).
pub(crate) struct DelayIo {
    delay: Duration,
    tx: PollSender<(Instant, Seg)>,
    rx: mpsc::Receiver<(Instant, Seg)>,
    head: Option<(Instant, Seg)>,
    sleep: Pin<Box<Sleep>>,
    eof: bool,
    shut: bool,
}

impl DelayIo {
    pub(crate) fn new(tcp: TcpStream, delay: Duration, token: &CancellationToken) -> DelayIo {
        let (mut rd, mut wr) = tcp.into_split();
        let (out_tx, mut out_rx) = mpsc::channel::<(Instant, Seg)>(IN_FLIGHT);
        let (in_tx, in_rx) = mpsc::channel::<(Instant, Seg)>(IN_FLIGHT);
        let t = token.clone();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    m = out_rx.recv() => m,
                    () = t.cancelled() => return,
                };
                let Some((at, seg)) = item else {
                    let _ = wr.shutdown().await;
                    return;
                };
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = t.cancelled() => return,
                }
                let failed = match seg {
                    Seg::Data(b) => tokio::select! {
                        r = wr.write_all(&b) => r.is_err(),
                        () = t.cancelled() => true,
                    },
                    Seg::Fin => wr.shutdown().await.is_err(),
                    Seg::Err(_) => true,
                };
                if failed {
                    return;
                }
            }
        });
        let t = token.clone();
        tokio::spawn(async move {
            let mut buf = BytesMut::new();
            loop {
                buf.reserve(SEGMENT);
                let r = tokio::select! {
                    r = rd.read_buf(&mut buf) => r,
                    () = t.cancelled() => return,
                    () = in_tx.closed() => return,
                };
                let at = Instant::now() + delay;
                let (seg, last) = match r {
                    Ok(0) => (Seg::Fin, true),
                    Ok(_) => (Seg::Data(buf.split().freeze()), false),
                    Err(e) => (Seg::Err(e), true),
                };
                let sent = tokio::select! {
                    r = in_tx.send((at, seg)) => r.is_ok(),
                    () = t.cancelled() => false,
                };
                if last || !sent {
                    return;
                }
            }
        });
        DelayIo {
            delay,
            tx: PollSender::new(out_tx),
            rx: in_rx,
            head: None,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            eof: false,
            shut: false,
        }
    }
}

fn broken_pipe() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "delayed connection closed")
}

impl AsyncRead for DelayIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if let Some((at, _)) = &this.head {
                let at = *at;
                if Instant::now() < at {
                    this.sleep.as_mut().reset(at);
                    ready!(this.sleep.as_mut().poll(cx));
                }
                match this.head.take() {
                    Some((_, Seg::Data(mut data))) => {
                        let n = data.len().min(buf.remaining());
                        buf.put_slice(&data.split_to(n));
                        if !data.is_empty() {
                            this.head = Some((at, Seg::Data(data)));
                        }
                        return Poll::Ready(Ok(()));
                    }
                    Some((_, Seg::Err(e))) => {
                        this.eof = true;
                        return Poll::Ready(Err(e));
                    }
                    Some((_, Seg::Fin)) | None => {
                        this.eof = true;
                        return Poll::Ready(Ok(()));
                    }
                }
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(item) => this.head = Some(item),
                // The reader task ended without a FIN (connection aborted).
                None => return Poll::Ready(Err(aborted())),
            }
        }
    }
}

impl AsyncWrite for DelayIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(broken_pipe()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.tx.poll_reserve(cx)).map_err(|_| broken_pipe())?;
        let n = buf.len().min(SEGMENT);
        let at = Instant::now() + self.delay;
        self.tx.send_item((at, Seg::Data(Bytes::copy_from_slice(&buf[..n])))).map_err(|_| broken_pipe())?;
        Poll::Ready(Ok(n))
    }

    /// Bytes handed to the link are on the wire: nothing to wait for.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.shut {
            return Poll::Ready(Ok(()));
        }
        ready!(self.tx.poll_reserve(cx)).map_err(|_| broken_pipe())?;
        let at = Instant::now() + self.delay;
        self.tx.send_item((at, Seg::Fin)).map_err(|_| broken_pipe())?;
        self.shut = true;
        Poll::Ready(Ok(()))
    }
}
