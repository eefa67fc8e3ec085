//! Listener whose connections can be aborted from a handler (fault `dropConnection`) or all at
//! once (`close()`): each connection's IO fails as soon as its cancellation token fires.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Per-connection info handed to handlers through `ConnectInfo`.
#[derive(Clone, Debug)]
pub(crate) struct ConnHandle {
    #[allow(dead_code)]
    pub peer: SocketAddr,
    pub token: CancellationToken,
}

impl Connected<IncomingStream<'_, EmuListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, EmuListener>) -> Self {
        stream.remote_addr().clone()
    }
}

pub(crate) struct EmuListener {
    pub inner: TcpListener,
    pub root: CancellationToken,
}

impl Listener for EmuListener {
    type Io = KillableIo;
    type Addr = ConnHandle;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let token = self.root.child_token();
                    let io =
                        KillableIo { inner: stream, killed: Box::pin(token.clone().cancelled_owned()), dead: false };
                    return (io, ConnHandle { peer, token });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(ConnHandle { peer: self.inner.local_addr()?, token: CancellationToken::new() })
    }
}

pub(crate) struct KillableIo {
    inner: TcpStream,
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
