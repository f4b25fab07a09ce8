//! The floor: what the least possible keep-alive proxy costs on this machine, to judge
//! how far below nginx a proxy *can* go before any HTTP work.
//!
//! `sluice-floor epoll|uring LISTEN BACKEND` relays bytes between each client
//! connection and a backend connection of its own, opened when the client connects (so
//! only keep-alive loads are meaningful), both ways, without looking at them. Two
//! kernel interfaces, each reading up to 128 KiB at a time (a smaller buffer makes a
//! 64 KiB response cost more reads and writes than sluice pays, and is no floor):
//!
//! - `epoll`: tokio on one thread, each socket an `AsyncFd`, readiness forgotten after
//!   a short read (as sluice does, so no read ends in `EAGAIN`): a request costs the
//!   same four system calls as nginx or sluice (two `recvfrom`, two `sendto`) plus its
//!   share of `epoll_wait`.
//! - `uring`: one io_uring (single issuer, deferred task running), a receive and a
//!   send in flight per direction; one `io_uring_enter` submits every operation queued
//!   since the last and waits for the next completions.
//!
//! Not part of sluice (its own workspace; `bench/floor.sh` builds and runs it).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: sluice-floor epoll|uring LISTEN BACKEND";
    let [_, mode, listen, backend] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let (Ok(listen), Ok(backend)) = (listen.parse(), backend.parse()) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let result = match mode.as_str() {
        "epoll" => epoll::run(listen, backend),
        "uring" => uring::run(listen, backend),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("sluice-floor: {e}");
        std::process::exit(1);
    }
}

/// The backend connection for a new client: a blocking connect (loopback, at once).
fn dial(backend: SocketAddr) -> io::Result<TcpStream> {
    let b = TcpStream::connect(backend)?;
    b.set_nodelay(true)?;
    Ok(b)
}

mod epoll {
    use super::*;
    use tokio::io::unix::AsyncFd;

    pub fn run(listen: SocketAddr, backend: SocketAddr) -> io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let l = std::net::TcpListener::bind(listen)?;
            l.set_nonblocking(true)?;
            let l = tokio::net::TcpListener::from_std(l)?;
            loop {
                let (c, _) = l.accept().await?;
                tokio::task::spawn_local(async move {
                    let _ = relay(c, backend).await;
                });
            }
        })
    }

    async fn relay(c: tokio::net::TcpStream, backend: SocketAddr) -> io::Result<()> {
        let c = c.into_std()?;
        c.set_nodelay(true)?;
        let b = dial(backend)?;
        b.set_nonblocking(true)?;
        #[allow(deprecated)] // `register` is newer than the tokio sluice locks
        let (c, b) = (AsyncFd::new(c)?, AsyncFd::new(b)?);
        let _ = tokio::join!(pump(&c, &b), pump(&b, &c));
        Ok(())
    }

    async fn pump(from: &AsyncFd<TcpStream>, to: &AsyncFd<TcpStream>) -> io::Result<()> {
        let mut buf = vec![0u8; 128 * 1024];
        let end = |r| {
            let _ = to.get_ref().shutdown(Shutdown::Write);
            r
        };
        loop {
            let mut ready = from.readable().await?;
            let n = match (&mut ready.get_inner()).read(&mut buf) {
                Ok(0) => return end(Ok(())),
                Ok(n) => {
                    // A short read took everything there was: forget the readiness
                    // seen before it (an event since is kept), so the next wait is a
                    // wait and not a read that returns EAGAIN.
                    if n < buf.len() {
                        ready.clear_ready();
                    }
                    n
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready.clear_ready();
                    continue;
                }
                Err(e) => return end(Err(e)),
            };
            let mut at = 0;
            while at < n {
                match (&mut to.get_ref()).write(&buf[at..n]) {
                    Ok(k) => at += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        to.writable().await?.clear_ready();
                    }
                    Err(e) => return end(Err(e)),
                }
            }
        }
    }
}

mod uring {
    use super::*;
    use io_uring::{opcode, squeue, types, IoUring};
    use std::os::fd::{AsRawFd, FromRawFd};

    const BUF: usize = 128 * 1024;
    /// `user_data` of the listener's multishot accept.
    const ACCEPT: u64 = u64::MAX;

    /// One direction of a connection: what it reads from, what it writes to, and the
    /// bytes between.
    struct Dir {
        buf: Box<[u8]>,
        len: usize,
        at: usize,
        reading: bool,
        done: bool,
    }

    struct Conn {
        /// 0: the client, 1: the backend. Direction 0 reads the client and writes the
        /// backend; direction 1 the other way.
        socks: [TcpStream; 2],
        dirs: [Dir; 2],
        in_flight: u32,
    }

    impl Conn {
        fn op(&mut self, slot: usize, d: usize) -> squeue::Entry {
            let (from, to) = (self.socks[d].as_raw_fd(), self.socks[1 - d].as_raw_fd());
            let dir = &mut self.dirs[d];
            self.in_flight += 1;
            let ud = (slot as u64) << 1 | d as u64;
            if dir.reading {
                opcode::Recv::new(types::Fd(from), dir.buf.as_mut_ptr(), BUF as u32)
                    .build()
                    .user_data(ud)
            } else {
                let rest = &dir.buf[dir.at..dir.len];
                opcode::Send::new(types::Fd(to), rest.as_ptr(), rest.len() as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(ud)
            }
        }
    }

    /// Ends the process where it stands: returning would free the connections'
    /// buffers while their receives are still in the kernel's hands.
    fn fail(e: io::Error) -> ! {
        eprintln!("sluice-floor: {e}");
        std::process::exit(1)
    }

    pub fn run(listen: SocketAddr, backend: SocketAddr) -> io::Result<()> {
        let l = std::net::TcpListener::bind(listen)?;
        let mut ring = IoUring::<squeue::Entry>::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_defer_taskrun()
            .build(1024)?;
        let (submitter, mut sq, mut cq) = ring.split();
        let mut conns: Vec<Option<Conn>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let accept = opcode::AcceptMulti::new(types::Fd(l.as_raw_fd()))
            .build()
            .user_data(ACCEPT);
        let mut queue: Vec<squeue::Entry> = vec![accept.clone()];
        loop {
            for e in queue.drain(..) {
                // SAFETY: every buffer an entry points into is a boxed slice owned by a
                // connection that is kept until none of its operations is in flight.
                while unsafe { sq.push(&e) }.is_err() {
                    sq.sync();
                    submitter.submit().unwrap_or_else(|e| fail(e));
                    sq.sync();
                }
            }
            sq.sync();
            match submitter.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => fail(e),
            }
            cq.sync();
            for cqe in &mut cq {
                let (ud, res) = (cqe.user_data(), cqe.result());
                if ud == ACCEPT {
                    if !io_uring::cqueue::more(cqe.flags()) {
                        queue.push(accept.clone());
                    }
                    if res < 0 {
                        continue;
                    }
                    // SAFETY: the accept's result is a new descriptor nothing else owns.
                    let c = unsafe { TcpStream::from_raw_fd(res) };
                    let Ok(b) = c.set_nodelay(true).and_then(|_| dial(backend)) else {
                        continue;
                    };
                    let dir = || Dir {
                        buf: vec![0u8; BUF].into_boxed_slice(),
                        len: 0,
                        at: 0,
                        reading: true,
                        done: false,
                    };
                    let slot = free.pop().unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    let mut conn = Conn {
                        socks: [c, b],
                        dirs: [dir(), dir()],
                        in_flight: 0,
                    };
                    queue.push(conn.op(slot, 0));
                    queue.push(conn.op(slot, 1));
                    conns[slot] = Some(conn);
                    continue;
                }
                let (slot, d) = ((ud >> 1) as usize, (ud & 1) as usize);
                let Some(conn) = conns[slot].as_mut() else {
                    continue;
                };
                conn.in_flight -= 1;
                let dir = &mut conn.dirs[d];
                if res <= 0 {
                    // The end of this direction: pass the close on; on an error, end
                    // both (the other direction's receive then completes).
                    dir.done = true;
                    let how = if res == 0 {
                        Shutdown::Write
                    } else {
                        Shutdown::Both
                    };
                    let _ = conn.socks[1 - d].shutdown(how);
                    if res < 0 {
                        let _ = conn.socks[d].shutdown(Shutdown::Both);
                    }
                } else if dir.reading {
                    (dir.len, dir.at, dir.reading) = (res as usize, 0, false);
                    queue.push(conn.op(slot, d));
                } else {
                    dir.at += res as usize;
                    dir.reading = dir.at == dir.len;
                    queue.push(conn.op(slot, d));
                }
                if conn.dirs.iter().all(|d| d.done) && conn.in_flight == 0 {
                    conns[slot] = None;
                    free.push(slot);
                }
            }
        }
    }
}
