//! The tiny_http servers on the HTTP listening socket, and the next one when the accept loop of
//! the current one ends.
//!
//! tiny_http 0.12 accepts on one thread, which ends for good when an accept fails (it reports
//! that once, through `recv`) and when it panics (an accepted connection whose descriptor cannot
//! be cloned, a thread for its pool that cannot be made: the process out of descriptors or
//! threads, which idle connections can cause). The port would then refuse every client while the
//! process lives on. Here a watchdog hears of either end (the error from a handler thread, the
//! panic through a panic hook), checks that the port really stopped answering, and starts a new
//! server on the same socket (a spare descriptor of it) once descriptors and a thread are free.
//! Every server, replaced or not, is a source of the handler threads ([`Handlers`]) until
//! shutdown, so the connections it has keep being served.

use super::connection_guard::ConnectionGuard;
use super::handlers::{Handlers, Next, Source};
use crossbeam_channel::{Receiver, Sender};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;
use tiny_http::{Request, Server};

/// Descriptors that must be free before a new server takes over the socket (an accept takes one,
/// and tiny_http a second for each connection).
const HEADROOM: usize = 16;

/// How often the watchdog gives starved handler sources a thread ([`Handlers::replenish`]),
/// tiny_http's pool a connection to end ([`Acceptor::nudge`]) and the connection guard a sweep
/// ([`ConnectionGuard::sweep`]); more often when the stall time is short ([`tick`]).
const TICK: Duration = Duration::from_millis(500);

/// The watchdog's period for a stall time of `stall`: [`TICK`], or a quarter of `stall` when that
/// is shorter, so that a nudge comes well within every accept's receive timeout.
fn tick(stall: Duration) -> Duration {
    TICK.min(stall / 4).max(Duration::from_millis(10))
}

/// How long the watchdog's own request to the port may take before the port counts as not
/// answering.
const PROBE: Duration = Duration::from_secs(2);

/// The servers on one listening socket.
pub struct Acceptor {
    /// Every server started, the current one last.
    servers: Mutex<Vec<Arc<Server>>>,
    stopping: AtomicBool,
    /// A descriptor of the listening socket: keeps the port listening between servers.
    spare: TcpListener,
    /// Where the watchdog's probe connects (the port on loopback).
    probe: SocketAddr,
    handlers: Arc<Handlers<Request>>,
    /// Asks the watchdog to look whether the current server still accepts.
    wake: Sender<()>,
}

impl Acceptor {
    /// Serves `socket` with tiny_http, each request handled by `handlers`, the connections'
    /// heads bounded by `guard`, every accept and connection timed out after `stall` (the
    /// socket's receive timeout, see `http::bind`); the bound address.
    pub fn start(
        socket: TcpListener,
        handlers: Arc<Handlers<Request>>,
        guard: Arc<ConnectionGuard>,
        stall: Duration,
    ) -> anyhow::Result<(Arc<Acceptor>, SocketAddr)> {
        let addr = socket.local_addr()?;
        let spare = socket.try_clone()?;
        let server = Server::from_listener(socket, None).map_err(|err| anyhow::anyhow!("serving on {addr}: {err}"))?;
        let (wake, woken) = crossbeam_channel::unbounded();
        let probe = match addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], a.port())),
            SocketAddr::V6(a) if a.ip().is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port())),
            other => other,
        };
        let acceptor =
            Arc::new(Acceptor { servers: Mutex::new(Vec::new()), stopping: AtomicBool::new(false), spare, probe, handlers, wake });
        watch_panics(acceptor.wake.clone());
        if !acceptor.adopt(Arc::new(server))? {
            anyhow::bail!("serving on {addr}: shutdown began");
        }
        let watched = acceptor.clone();
        guard.guard(addr, stall);
        thread::Builder::new()
            .name("http-watchdog".into())
            .stack_size(256 * 1024)
            .spawn(move || watched.watch(&woken, &guard, tick(stall)))?;
        Ok((acceptor, addr))
    }

    /// Stops accepting, and ends every server's handler threads (the connections they hold get
    /// no more answers).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.wake.send(());
        // A listening socket shut down for reading fails every accept, on every descriptor of it.
        let _ = rustix::net::shutdown(&self.spare, rustix::net::Shutdown::Read);
        // Each unblock wakes one thread waiting in a server; a thread that wakes sees `stopping`.
        let threads = self.handlers.live();
        for server in self.servers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            for _ in 0..=threads {
                server.unblock();
            }
        }
    }

    /// Records `server` and gives it to the handler threads; `false` when shutdown began
    /// meanwhile (the server is then dropped).
    fn adopt(self: &Arc<Self>, server: Arc<Server>) -> std::io::Result<bool> {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        if self.stopping.load(Ordering::SeqCst) {
            return Ok(false);
        }
        self.handlers.serve(Arc::new(Served { server: server.clone(), acceptor: self.clone() }))?;
        servers.push(server);
        Ok(true)
    }

    /// The watchdog: on each wake-up, if the port does not answer, starts the next server; every
    /// `tick`, gives starved sources a thread where one can be made now, nudges the pool, and
    /// ends connections that send without end or too slowly ([`ConnectionGuard::sweep`]).
    fn watch(self: &Arc<Self>, woken: &Receiver<()>, guard: &ConnectionGuard, tick: Duration) {
        loop {
            match woken.recv_timeout(tick) {
                Ok(()) => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    // Before the nudge, whose connect may wait while the backlog is full.
                    self.tend(guard);
                    self.nudge();
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
            // Wake-ups that came together are one.
            thread::sleep(Duration::from_millis(100));
            while woken.try_recv().is_ok() {}
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            if answers(self.probe) {
                continue;
            }
            log::error!("the HTTP listener does not accept connections; it starts again once descriptors and a thread are free");
            if self.restart(guard, tick) {
                log::info!("the HTTP listener accepts connections again");
            }
        }
    }

    /// Gives starved sources a thread where one can be made now, and ends connections that send
    /// without end or too slowly.
    fn tend(&self, guard: &ConnectionGuard) {
        self.handlers.replenish();
        guard.sweep(&|| self.handlers.last_starved());
    }

    /// Opens a connection to the port and closes it at once, for two reasons:
    /// - tiny_http's pool can leave a new connection queued with no thread to take it: when two
    ///   arrive together while one thread waits, it counts that thread as free for both, and the
    ///   second waits until some thread ends a connection (for up to `--http-stall` if every
    ///   thread holds a quiet one). A connection that opens when no thread waits gets a new
    ///   thread, which takes the queued connection once this one ends; so a connection left
    ///   queued waits at most about one tick;
    /// - the listening socket's receive timeout (`--http-stall`, see `http::bind`) also bounds an
    ///   accept's wait, and tiny_http's accept loop ends at the first that times out: with a
    ///   connection every tick (a quarter of the stall time at most), no accept waits that
    ///   long while the watchdog runs.
    fn nudge(&self) {
        let _ = TcpStream::connect_timeout(&self.probe, PROBE);
    }

    /// Starts a new server on the socket, retrying every `tick` until it runs or shutdown begins;
    /// meanwhile the connections that are open are tended as usual (idle ones that used up the
    /// descriptors may well be what keeps the server from starting).
    fn restart(self: &Arc<Self>, guard: &ConnectionGuard, tick: Duration) -> bool {
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return false;
            }
            if descriptors_free(HEADROOM) {
                if let Ok(socket) = self.spare.try_clone() {
                    // tiny_http makes its accept thread with `thread::spawn`, which panics when
                    // no thread can be made.
                    match panic::catch_unwind(AssertUnwindSafe(|| Server::from_listener(socket, None))) {
                        Ok(Ok(server)) => match self.adopt(Arc::new(server)) {
                            Ok(adopted) => return adopted,
                            Err(err) => log::warn!("the HTTP listener could not start again yet: {err}"),
                        },
                        Ok(Err(err)) => log::warn!("the HTTP listener could not start again yet: {err}"),
                        Err(_) => log::warn!("the HTTP listener could not start again yet: no thread could be made"),
                    }
                }
            }
            thread::sleep(tick);
            self.tend(guard);
        }
    }
}

/// A server as the handler threads' source. An error from it is the end of its accept loop:
/// the watchdog hears of it, and its threads go on with the requests of the connections it has.
struct Served {
    server: Arc<Server>,
    acceptor: Arc<Acceptor>,
}

impl Source<Request> for Served {
    fn next(&self, wait: Duration) -> Next<Request> {
        match self.server.recv_timeout(wait) {
            // (During shutdown too: it is answered that the server is shutting down.)
            Ok(Some(req)) => Next::Job(req),
            _ if self.acceptor.stopping.load(Ordering::SeqCst) => Next::Ended,
            Ok(None) => Next::Quiet,
            Err(err) => {
                log::error!("the HTTP listener stopped accepting connections: {err}");
                let _ = self.acceptor.wake.send(());
                Next::Quiet
            }
        }
    }
}

/// Whether something accepts and answers HTTP on `addr` within [`PROBE`].
fn answers(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, PROBE) else { return false };
    let _ = s.set_read_timeout(Some(PROBE));
    let _ = s.set_write_timeout(Some(PROBE));
    let mut head = [0u8; 8];
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.")
}

/// Whether this process can open `n` more descriptors now.
fn descriptors_free(n: usize) -> bool {
    let probes: Vec<_> = (0..n).map_while(|_| std::fs::File::open("/dev/null").ok()).collect();
    probes.len() == n
}

/// Wakes the watchdog of every acceptor when any thread panics (a panic in tiny_http's accept
/// thread may be reported at a location in the standard library: `thread::spawn`); wake-ups are
/// cheap, and the watchdog restarts nothing while the port answers. Every panic still goes to
/// the hook before.
fn watch_panics(wake: Sender<()>) {
    static WAKES: OnceLock<Mutex<Vec<Sender<()>>>> = OnceLock::new();
    let mut first = false;
    let wakes = WAKES.get_or_init(|| {
        first = true;
        Mutex::new(Vec::new())
    });
    wakes.lock().unwrap_or_else(|p| p.into_inner()).push(wake);
    if !first {
        return;
    }
    let before = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        before(info);
        if let Some(wakes) = WAKES.get() {
            for wake in wakes.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                let _ = wake.send(());
            }
        }
    }));
}
