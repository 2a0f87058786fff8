//! HTTP load: many keep-alive clients sending one request back to back for a measurement
//! window, and a burst of clients connecting at the same instant.

use crate::bench::MAX_ITERATIONS;
use crate::http_client::Http;
use crate::units::secs;
use anyhow::{anyhow, Result};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the clients of one load run saw.
#[derive(Default)]
pub struct Load {
    pub ok: usize,
    pub failed: usize,
    pub busy: usize,
    pub lat: Vec<f64>,
    pub secs: f64,
    /// The first failure, for the note.
    pub first_error: Option<String>,
}

impl Load {
    /// Successful requests per second of the window.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.secs
    }
}

/// `clients` threads, each with its own keep-alive connection and session, sending `method`
/// back to back. Only requests that end inside the measurement window (after `warm`) count.
///
/// The clients connect one after the other: tiny_http 0.12 can leave a connection that arrives
/// together with others unserved while the keep-alive connections ahead of it stay open (see
/// [`connect_storm`], which measures exactly that).
pub fn http_load(
    url: &str,
    clients: usize,
    warm: Duration,
    window: Duration,
    method: &'static str,
    params: Option<String>,
) -> Result<Load> {
    Http::new(url)?;
    let barrier = Arc::new(Barrier::new(clients));
    let turn = Arc::new(Mutex::new(()));
    let params = Arc::new(params);
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (barrier, turn, params, url) = (barrier.clone(), turn.clone(), params.clone(), url.to_string());
        handles.push(thread::Builder::new().stack_size(1024 * 1024).spawn(move || -> Result<Load> {
            let mut c = Http::new(&url)?; // cannot fail: the caller parsed the same URL
            let init = {
                let _turn = turn.lock().map_err(|_| anyhow!("a load thread panicked"));
                c.initialize()
            };
            barrier.wait();
            init?;
            let t0 = Instant::now();
            let (from, until) = (t0 + warm, t0 + warm + window);
            let mut out = Load::default();
            let mut i = 0u64;
            while Instant::now() < until && i < MAX_ITERATIONS {
                let t = Instant::now();
                let r = c.call(method, params.as_deref());
                let end = Instant::now();
                if end >= from && end <= until {
                    match r {
                        Ok((_, None)) => {
                            out.ok += 1;
                            out.lat.push((end - t).as_secs_f64());
                        }
                        Ok((503, _)) => out.busy += 1,
                        Ok((_, Some(err))) => {
                            out.failed += 1;
                            out.first_error.get_or_insert(err);
                        }
                        Err(err) => {
                            out.failed += 1;
                            out.first_error.get_or_insert(format!("{err:#}"));
                        }
                    }
                }
                i += 1;
            }
            c.end();
            Ok(out)
        })?);
    }
    let mut total = Load { secs: window.as_secs_f64(), ..Load::default() };
    for h in handles {
        let part = h.join().map_err(|_| anyhow!("a load thread panicked"))??;
        total.ok += part.ok;
        total.failed += part.failed;
        total.first_error = total.first_error.or(part.first_error);
        total.busy += part.busy;
        total.lat.extend(part.lat);
    }
    Ok(total)
}

/// `clients` connections opened at the same instant, each sending `initialize` with a `limit`
/// and staying open (as keep-alive clients do) until every one is answered or has given up: the
/// latencies of those answered, and how many were not answered in time.
pub fn connect_storm(url: &str, clients: usize, limit: Duration) -> Result<(Vec<f64>, usize)> {
    Http::new(url)?;
    let start = Arc::new(Barrier::new(clients));
    let done = Arc::new(Barrier::new(clients));
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (start, done, url) = (start.clone(), done.clone(), url.to_string());
        handles.push(thread::Builder::new().stack_size(1024 * 1024).spawn(move || -> Option<f64> {
            let mut c = Http::with_timeout(&url, limit).ok()?; // cannot fail: the caller parsed the same URL
            start.wait();
            let t = Instant::now();
            let r = c.initialize().ok().map(|()| secs(t));
            done.wait();
            c.end();
            r
        })?);
    }
    let mut answered = Vec::new();
    let mut stalled = 0;
    for h in handles {
        match h.join().map_err(|_| anyhow!("a connecting thread panicked"))? {
            Some(e) => answered.push(e),
            None => stalled += 1,
        }
    }
    Ok((answered, stalled))
}

/// A note on the failures and 503 answers of a load run, if any.
pub fn load_note(l: &Load) -> Option<String> {
    (l.failed + l.busy > 0).then(|| {
        let first = l.first_error.as_deref().map(|e| format!("; the first failure: {e}")).unwrap_or_default();
        format!("{} requests failed and {} got 503 (queue full) in the window{first}", l.failed, l.busy)
    })
}
