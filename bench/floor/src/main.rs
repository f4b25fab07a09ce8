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
//! - `uring-multi`: the same ring with one multishot receive per direction, armed once
//!   for the connection's life, into buffers the kernel picks from a registered ring of
//!   16 KiB buffers shared by every connection (given back once their bytes are sent).
//!
//! - `epoll-pool`: for a load that opens a new connection a request (`Connection:
//!   close`), where a byte relay is no floor (the client's `Connection: close` would
//!   reach the backend, and a pooling proxy keeps its backend connections). The least
//!   a pooling proxy can do over tokio's sockets, as sluice uses them (registered when
//!   accepted, removed before `close`): accept, read the request's head, send one fixed
//!   request (`GET /small`) on an idle backend connection (one is dialled when none is
//!   idle), read the answer to its `Content-Length`, pass it on with `Connection:
//!   close`, close the client's connection and keep the backend's. Its accept loop
//!   yields after every 16 connections, as sluice's do.
//!
//! Not part of sluice (its own workspace; `bench/floor.sh` builds and runs it).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: sluice-floor epoll|epoll-pool|uring|uring-multi LISTEN BACKEND";
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
        "epoll-pool" => pool::run(listen, backend),
        "uring" => uring::run(listen, backend),
        "uring-multi" => multi::run(listen, backend),
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

/// Runs `serve` on the listener on one thread (tokio's current-thread runtime, tasks
/// local to it): the two epoll modes.
fn on_one_thread<F>(
    listen: SocketAddr,
    serve: impl FnOnce(tokio::net::TcpListener) -> F,
) -> io::Result<()>
where
    F: std::future::Future<Output = io::Result<()>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let l = std::net::TcpListener::bind(listen)?;
        l.set_nonblocking(true)?;
        serve(tokio::net::TcpListener::from_std(l)?).await
    })
}

/// The backend connection for a new client: a blocking connect (loopback, at once).
fn dial(backend: SocketAddr) -> io::Result<TcpStream> {
    let b = TcpStream::connect(backend)?;
    b.set_nodelay(true)?;
    Ok(b)
}

/// What the two io_uring relays share: the ring, the submit-and-wait turn, accepting.
mod ring {
    use super::*;
    use io_uring::{squeue, IoUring};
    use std::os::fd::FromRawFd;

    /// Ends the process where it stands: returning would free the connections'
    /// buffers while their operations are still in the kernel's hands.
    pub fn fail(e: io::Error) -> ! {
        eprintln!("sluice-floor: {e}");
        std::process::exit(1)
    }

    /// One ring for the one thread: single issuer, completions run when it waits.
    pub fn new() -> io::Result<IoUring> {
        IoUring::<squeue::Entry>::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_defer_taskrun()
            .build(1024)
    }

    /// Queues `queue`'s entries, submits them and waits for one completion at least.
    ///
    /// # Safety
    /// Every buffer an entry points into must stay put until its completion is seen.
    pub unsafe fn turn(
        submitter: &io_uring::Submitter<'_>,
        sq: &mut io_uring::SubmissionQueue<'_>,
        queue: &mut Vec<squeue::Entry>,
    ) {
        for e in queue.drain(..) {
            while sq.push(&e).is_err() {
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
    }

    /// A multishot accept's result: the client and its backend connection.
    pub fn accepted(res: i32, backend: SocketAddr) -> Option<[TcpStream; 2]> {
        if res < 0 {
            return None;
        }
        // SAFETY: the accept's result is a new descriptor nothing else owns.
        let c = unsafe { TcpStream::from_raw_fd(res) };
        let b = c.set_nodelay(true).and_then(|_| dial(backend)).ok()?;
        Some([c, b])
    }

    /// A free slot in `conns`.
    pub fn slot<T>(conns: &mut Vec<Option<T>>, free: &mut Vec<usize>) -> usize {
        free.pop().unwrap_or_else(|| {
            conns.push(None);
            conns.len() - 1
        })
    }
}

mod epoll {
    use super::*;
    use tokio::io::unix::AsyncFd;

    pub fn run(listen: SocketAddr, backend: SocketAddr) -> io::Result<()> {
        on_one_thread(listen, |l| async move {
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

mod pool {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// What is asked of the backend for every client's request.
    const REQUEST: &[u8] = b"GET /small HTTP/1.1\r\nHost: floor\r\n\r\n";

    type Idle = Rc<RefCell<Vec<TcpStream>>>;

    pub fn run(listen: SocketAddr, backend: SocketAddr) -> io::Result<()> {
        on_one_thread(listen, |l| async move {
            let idle: Idle = Rc::default();
            let mut taken = 0u32;
            loop {
                let (c, _) = l.accept().await?;
                let idle = idle.clone();
                tokio::task::spawn_local(async move {
                    let _ = serve(c, backend, idle).await;
                });
                // As sluice's accept loops pace themselves: the connections taken run
                // before a full backlog is all taken.
                taken += 1;
                if taken % 16 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    }

    /// One client connection, one request; the backend connection goes back to `idle`
    /// when its answer was read whole.
    async fn serve(mut c: TcpStream, backend: SocketAddr, idle: Idle) -> io::Result<()> {
        let mut buf = [0u8; 4096];
        let mut len = 0;
        while find(&buf[..len], b"\r\n\r\n").is_none() {
            len += read_more(&mut c, &mut buf[len..]).await?;
        }
        let popped = idle.borrow_mut().pop();
        let mut b = match popped {
            Some(b) => b,
            None => {
                let b = TcpStream::connect(backend).await?;
                b.set_nodelay(true)?;
                b
            }
        };
        b.write_all(REQUEST).await?;
        let mut len = 0;
        let (head, body) = loop {
            len += read_more(&mut b, &mut buf[len..]).await?;
            if let Some(end) = find(&buf[..len], b"\r\n\r\n") {
                break (end + 4, length(&buf[..end]).ok_or_else(bad)?);
            }
        };
        while len < head + body {
            len += read_more(&mut b, &mut buf[len..]).await?;
        }
        // The answer as it came, but for its `Connection` field; a backend connection
        // that did not say `keep-alive` is not kept.
        let kept = b"Connection: keep-alive\r\n";
        let at = find(&buf[..head], kept).ok_or_else(bad)?;
        idle.borrow_mut().push(b);
        let parts = [
            io::IoSlice::new(&buf[..at]),
            io::IoSlice::new(b"Connection: close\r\n"),
            io::IoSlice::new(&buf[at + kept.len()..len]),
        ];
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let n = c.write_vectored(&parts).await?;
        if n < total {
            return Err(bad()); // 13 bytes of body and a head: a socket takes them whole
        }
        Ok(())
    }

    async fn read_more(s: &mut TcpStream, room: &mut [u8]) -> io::Result<usize> {
        match s.read(room).await? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            n => Ok(n),
        }
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    /// The `Content-Length` of a response head (as nginx spells it).
    fn length(head: &[u8]) -> Option<usize> {
        let name = b"\r\nContent-Length: ";
        let at = find(head, name)? + name.len();
        let digits = head[at..].iter().take_while(|b| b.is_ascii_digit());
        Some(digits.fold(0, |n, d| n * 10 + (d - b'0') as usize))
    }

    fn bad() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, "unexpected answer")
    }
}

mod uring {
    use super::*;
    use io_uring::{opcode, squeue, types};
    use std::os::fd::AsRawFd;

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

    pub fn run(listen: SocketAddr, backend: SocketAddr) -> io::Result<()> {
        let l = std::net::TcpListener::bind(listen)?;
        let mut ring = ring::new()?;
        let (submitter, mut sq, mut cq) = ring.split();
        let mut conns: Vec<Option<Conn>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let accept = opcode::AcceptMulti::new(types::Fd(l.as_raw_fd()))
            .build()
            .user_data(ACCEPT);
        let mut queue: Vec<squeue::Entry> = vec![accept.clone()];
        loop {
            // SAFETY: every buffer an entry points into is a boxed slice owned by a
            // connection that is kept until none of its operations is in flight.
            unsafe { ring::turn(&submitter, &mut sq, &mut queue) };
            cq.sync();
            for cqe in &mut cq {
                let (ud, res) = (cqe.user_data(), cqe.result());
                if ud == ACCEPT {
                    if !io_uring::cqueue::more(cqe.flags()) {
                        queue.push(accept.clone());
                    }
                    let Some(socks) = ring::accepted(res, backend) else {
                        continue;
                    };
                    let dir = || Dir {
                        buf: vec![0u8; BUF].into_boxed_slice(),
                        len: 0,
                        at: 0,
                        reading: true,
                        done: false,
                    };
                    let slot = ring::slot(&mut conns, &mut free);
                    let mut conn = Conn {
                        socks,
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

mod multi {
    use super::*;
    use io_uring::types::BufRingEntry;
    use io_uring::{cqueue, opcode, squeue, types};
    use std::collections::VecDeque;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU16, Ordering};

    const BUFS: u16 = 4096;
    const BUF: usize = 16 * 1024;
    const GROUP: u16 = 0;
    const ACCEPT: u64 = u64::MAX;

    /// The registered ring of provided buffers, and the buffers (never freed: the
    /// process exits with them).
    struct Bufs {
        base: *mut BufRingEntry,
        tail: u16,
        mem: &'static mut [u8],
    }

    impl Bufs {
        fn new() -> Bufs {
            let layout = std::alloc::Layout::from_size_align(BUFS as usize * 16, 4096).unwrap();
            // SAFETY: a non-zero size; zeroed memory is a valid empty ring.
            let base = unsafe { std::alloc::alloc_zeroed(layout) } as *mut BufRingEntry;
            assert!(!base.is_null());
            let mem = vec![0u8; BUFS as usize * BUF].leak();
            let mut b = Bufs { base, tail: 0, mem };
            for bid in 0..BUFS {
                b.give(bid);
            }
            b.publish();
            b
        }

        /// Puts buffer `bid` back in the ring (seen by the kernel after `publish`).
        fn give(&mut self, bid: u16) {
            // SAFETY: the index is masked into the ring's entries.
            let e = unsafe { &mut *self.base.add((self.tail & (BUFS - 1)) as usize) };
            e.set_addr(self.mem.as_ptr() as u64 + bid as u64 * BUF as u64);
            e.set_len(BUF as u32);
            e.set_bid(bid);
            self.tail = self.tail.wrapping_add(1);
        }

        fn publish(&self) {
            // SAFETY: the ring's tail is a u16 the kernel reads; it is written atomically.
            unsafe {
                let tail = BufRingEntry::tail(self.base) as *const AtomicU16;
                (*tail).store(self.tail, Ordering::Release);
            }
        }

        fn bytes(&self, bid: u16, from: usize, to: usize) -> &[u8] {
            &self.mem[bid as usize * BUF..][from..to]
        }
    }

    #[derive(Default)]
    struct Dir {
        /// Received buffers not yet sent on: (buffer id, length).
        queue: VecDeque<(u16, usize)>,
        /// How much of the front buffer is sent.
        at: usize,
        sending: bool,
        /// The receive side ended (end of stream or an error).
        ended: bool,
    }

    struct Conn {
        socks: [TcpStream; 2],
        dirs: [Dir; 2],
        in_flight: u32,
    }

    fn ud(slot: usize, d: usize, send: bool) -> u64 {
        (slot as u64) << 2 | (d as u64) << 1 | send as u64
    }

    fn recv(conn: &mut Conn, slot: usize, d: usize) -> squeue::Entry {
        conn.in_flight += 1;
        opcode::RecvMulti::new(types::Fd(conn.socks[d].as_raw_fd()), GROUP)
            .build()
            .user_data(ud(slot, d, false))
    }

    fn send(conn: &mut Conn, bufs: &Bufs, slot: usize, d: usize) -> squeue::Entry {
        let dir = &mut conn.dirs[d];
        let (bid, len) = dir.queue[0];
        let rest = bufs.bytes(bid, dir.at, len);
        dir.sending = true;
        conn.in_flight += 1;
        opcode::Send::new(
            types::Fd(conn.socks[1 - d].as_raw_fd()),
            rest.as_ptr(),
            rest.len() as u32,
        )
        .flags(libc::MSG_NOSIGNAL)
        .build()
        .user_data(ud(slot, d, true))
    }

    pub fn run(listen: SocketAddr, backend: SocketAddr) -> io::Result<()> {
        let l = std::net::TcpListener::bind(listen)?;
        let mut ring = ring::new()?;
        let mut bufs = Bufs::new();
        // SAFETY: the ring memory is page-aligned, BUFS entries, and lives forever.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufs.base as u64, BUFS, GROUP, 0)?
        };
        let (submitter, mut sq, mut cq) = ring.split();
        let mut conns: Vec<Option<Conn>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let accept = opcode::AcceptMulti::new(types::Fd(l.as_raw_fd()))
            .build()
            .user_data(ACCEPT);
        let mut queue: Vec<squeue::Entry> = vec![accept.clone()];
        loop {
            bufs.publish();
            // SAFETY: sends point into the never-freed buffer pool, at buffers not
            // given back to the ring until the send completes.
            unsafe { ring::turn(&submitter, &mut sq, &mut queue) };
            cq.sync();
            for cqe in &mut cq {
                let (ud, res, flags) = (cqe.user_data(), cqe.result(), cqe.flags());
                if ud == ACCEPT {
                    if !cqueue::more(flags) {
                        queue.push(accept.clone());
                    }
                    let Some(socks) = ring::accepted(res, backend) else {
                        continue;
                    };
                    let slot = ring::slot(&mut conns, &mut free);
                    let mut conn = Conn {
                        socks,
                        dirs: Default::default(),
                        in_flight: 0,
                    };
                    queue.push(recv(&mut conn, slot, 0));
                    queue.push(recv(&mut conn, slot, 1));
                    conns[slot] = Some(conn);
                    continue;
                }
                let (slot, d, is_send) = ((ud >> 2) as usize, (ud >> 1 & 1) as usize, ud & 1 == 1);
                let Some(conn) = conns[slot].as_mut() else {
                    continue;
                };
                if is_send {
                    conn.in_flight -= 1;
                    let dir = &mut conn.dirs[d];
                    dir.sending = false;
                    if res < 0 {
                        dir.ended = true;
                        let _ = conn.socks[0].shutdown(Shutdown::Both);
                        let _ = conn.socks[1].shutdown(Shutdown::Both);
                        for (bid, _) in dir.queue.drain(..) {
                            bufs.give(bid);
                        }
                    } else {
                        dir.at += res as usize;
                        if dir.at == dir.queue[0].1 {
                            let (bid, _) = dir.queue.pop_front().unwrap();
                            bufs.give(bid);
                            dir.at = 0;
                        }
                        if !dir.queue.is_empty() {
                            queue.push(send(conn, &bufs, slot, d));
                        } else if dir.ended {
                            let _ = conn.socks[1 - d].shutdown(Shutdown::Write);
                        }
                    }
                } else {
                    if !cqueue::more(flags) {
                        conn.in_flight -= 1;
                    }
                    if res > 0 {
                        let bid = cqueue::buffer_select(flags).expect("a provided buffer");
                        conn.dirs[d].queue.push_back((bid, res as usize));
                        if !conn.dirs[d].sending {
                            queue.push(send(conn, &bufs, slot, d));
                        }
                        if !cqueue::more(flags) {
                            queue.push(recv(conn, slot, d));
                        }
                    } else if res == -libc::ENOBUFS {
                        // The ring ran dry: arm again (buffers come back as sends end).
                        queue.push(recv(conn, slot, d));
                    } else {
                        // The end of this direction: pass the close on once sent; on an
                        // error, end both.
                        let dir = &mut conn.dirs[d];
                        dir.ended = true;
                        if res < 0 {
                            let _ = conn.socks[0].shutdown(Shutdown::Both);
                            let _ = conn.socks[1].shutdown(Shutdown::Both);
                        } else if !dir.sending && dir.queue.is_empty() {
                            let _ = conn.socks[1 - d].shutdown(Shutdown::Write);
                        }
                    }
                }
                let idle = |dir: &Dir| dir.ended && !dir.sending && dir.queue.is_empty();
                if conn.dirs.iter().all(idle) && conn.in_flight == 0 {
                    conns[slot] = None;
                    free.push(slot);
                }
            }
        }
    }
}
