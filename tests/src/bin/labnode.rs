//! Lab traffic tools (std only, run inside a lab namespace):
//!
//! - `labnode serve-id PORT ID`: a TCP server on [::]:PORT (v4 and v6) that writes `ID\n` to
//!   every connection, then echoes what it reads until the peer closes.
//! - `labnode serve-udp-id PORT ID`: a UDP server on [::]:PORT (v4 and v6) that answers every
//!   datagram with `ID\n` (a DNS-like request/response).
//! - `labnode connect-many ADDR PORT COUNT CONCURRENCY TIMEOUT_MS`: COUNT short connections
//!   (connect, read the id line, close); prints JSON `{"ok", "failed", "by_id", "errors"}`.
//! - `labnode hold-ids ADDR PORT COUNT SECONDS INTERVAL_MS [READ_TIMEOUT_S] [FIRST_SPORT]`: COUNT
//!   long-lived connections (connection i from source port FIRST_SPORT + i when given, so a
//!   test can open the same 5-tuples again) that send a line every INTERVAL_MS and expect it
//!   echoed, for SECONDS; JSON
//!   `{"survived_by_id", "failed_by_id", "errors"}` by the backend id each connection got (a
//!   connection that failed before reading its id counts under `"?"`).
//! - `labnode connect-for ADDR PORT SECONDS CONCURRENCY TIMEOUT_MS`: as `connect-many`, but for
//!   SECONDS instead of a count; same JSON.
//! - `labnode connect-from ADDR PORT SRCPORT TIMEOUT_MS`: one connection from source port
//!   SRCPORT (0: any), reading the id line; JSON `{"id", "local_port"}` or `{"error"}`.
//! - `labnode vrrp-send IFACE SRC DSTS VRID PRIO VIPS|- RATE SECS [ttl=N] [from=ADDR] [V2PASS]`: a foreign VRRP
//!   router (see `lb_tests::vrrp_send`); prints `{"sent": N}`.
//!
//! The short-connection JSON also lists `fail_at_ms`: when each failed attempt started (ms since
//! the Unix epoch), so a lab can tell how long after an event new connections failed.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

fn serve_id(port: u16, id: String) {
    let listener = TcpListener::bind(SocketAddr::new("::".parse().unwrap(), port)).expect("bind");
    println!("listening on {port}");
    for stream in listener.incoming() {
        let Ok(mut s) = stream else { continue };
        let id = id.clone();
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            if s.write_all(format!("{id}\n").as_bytes()).is_err() {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
}

fn serve_udp_id(port: u16, id: String) {
    let s = std::net::UdpSocket::bind(SocketAddr::new("::".parse().unwrap(), port)).expect("bind");
    println!("listening on udp {port}");
    let mut buf = [0u8; 1500];
    loop {
        if let Ok((_, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(format!("{id}\n").as_bytes(), from);
        }
    }
}

fn read_line(s: &TcpStream) -> std::io::Result<String> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed before the id",
        ));
    }
    Ok(line.trim().to_string())
}

fn one(addr: SocketAddr, timeout: Duration) -> Result<String, String> {
    let s =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {}", e.kind()))?;
    s.set_read_timeout(Some(timeout)).ok();
    read_line(&s).map_err(|e| format!("read: {}", e.kind()))
}

#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    by_id: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    fail_at_ms: Vec<u128>,
}

fn epoch_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// When a run of short connections stops.
#[derive(Clone, Copy)]
enum Until {
    Count(u64),
    Deadline(Instant),
}

/// Short connections from `conc` threads until `until`; prints the JSON tally.
fn short_connections(addr: SocketAddr, until: Until, conc: u64, timeout: Duration) {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..conc)
        .map(|_| {
            let tally = tally.clone();
            let next = next.clone();
            std::thread::spawn(move || {
                let more = || match until {
                    Until::Count(n) => next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n,
                    Until::Deadline(d) => Instant::now() < d,
                };
                while more() {
                    let at = epoch_ms();
                    let r = one(addr, timeout);
                    let mut t = tally.lock().unwrap();
                    match r {
                        Ok(id) => {
                            t.ok += 1;
                            *t.by_id.entry(id).or_default() += 1;
                        }
                        Err(e) => {
                            t.failed += 1;
                            *t.errors.entry(e).or_default() += 1;
                            t.fail_at_ms.push(at);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let mut t = tally.lock().unwrap();
    t.fail_at_ms.sort_unstable();
    println!(
        "{{\"ok\":{},\"failed\":{},\"by_id\":{:?},\"errors\":{:?},\"elapsed_ms\":{},\"fail_at_ms\":{:?}}}",
        t.ok,
        t.failed,
        t.by_id,
        t.errors,
        start.elapsed().as_millis(),
        t.fail_at_ms
    );
}

/// Long-lived connections: each sends a line every `interval` and expects it echoed back;
/// outcomes tallied per backend id.
fn hold_ids(
    addr: SocketAddr,
    count: u64,
    secs: u64,
    interval: Duration,
    read_timeout: Duration,
    first_sport: Option<u16>,
) {
    type ByKey = BTreeMap<String, u64>;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let results = Arc::new(Mutex::new((ByKey::new(), ByKey::new(), ByKey::new())));
    let threads: Vec<_> = (0..count)
        .map(|i| {
            let results = results.clone();
            std::thread::spawn(move || {
                let mut id = String::from("?");
                let outcome = (|| -> Result<(), String> {
                    let s = match first_sport {
                        Some(p) => connect_bound(addr, p + i as u16, Duration::from_secs(3))?,
                        None => TcpStream::connect_timeout(&addr, Duration::from_secs(3))
                            .map_err(|e| format!("connect: {}", e.kind()))?,
                    };
                    s.set_read_timeout(Some(read_timeout)).ok();
                    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
                    let mut w = s;
                    let mut line = String::new();
                    r.read_line(&mut line)
                        .map_err(|e| format!("id: {}", e.kind()))?;
                    if line.is_empty() {
                        return Err("closed before the id".into());
                    }
                    id = line.trim().to_string();
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let msg = format!("c{i} m{n}\n");
                        w.write_all(msg.as_bytes())
                            .map_err(|e| format!("write: {}", e.kind()))?;
                        let mut back = String::new();
                        r.read_line(&mut back)
                            .map_err(|e| format!("echo: {}", e.kind()))?;
                        if back != msg {
                            return Err(format!("echo mismatch: {back:?}"));
                        }
                        n += 1;
                        std::thread::sleep(interval);
                    }
                    Ok(())
                })();
                let mut g = results.lock().unwrap();
                match outcome {
                    Ok(()) => *g.0.entry(id).or_default() += 1,
                    Err(e) => {
                        *g.1.entry(id).or_default() += 1;
                        *g.2.entry(e).or_default() += 1;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let g = results.lock().unwrap();
    println!(
        "{{\"survived_by_id\":{:?},\"failed_by_id\":{:?},\"errors\":{:?}}}",
        g.0, g.1, g.2
    );
}

/// A connection from source port `sport` (0: any), blocking.
fn connect_bound(addr: SocketAddr, sport: u16, timeout: Duration) -> Result<TcpStream, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sock = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
        .map_err(|e| format!("socket: {e}"))?;
        sock.set_reuseaddr(true)
            .map_err(|e| format!("reuseaddr: {e}"))?;
        let any: IpAddr = if addr.is_ipv4() {
            "0.0.0.0".parse().unwrap()
        } else {
            "::".parse().unwrap()
        };
        sock.bind(SocketAddr::new(any, sport))
            .map_err(|e| format!("bind: {e}"))?;
        let s = tokio::time::timeout(timeout, sock.connect(addr))
            .await
            .map_err(|_| "connect: timed out".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        let s = s.into_std().map_err(|e| e.to_string())?;
        s.set_nonblocking(false).ok();
        Ok(s)
    })
}

/// One connection from a chosen source port (a 5-tuple a test can name in advance).
fn connect_from(addr: SocketAddr, sport: u16, timeout: Duration) {
    let r = (|| -> Result<(String, u16), String> {
        let s = connect_bound(addr, sport, timeout)?;
        let local = s.local_addr().map_err(|e| e.to_string())?.port();
        s.set_read_timeout(Some(timeout)).ok();
        let id = read_line(&s).map_err(|e| format!("read: {}", e.kind()))?;
        Ok((id, local))
    })();
    match r {
        Ok((id, port)) => println!("{}", serde_json::json!({"id": id, "local_port": port})),
        Err(e) => println!("{}", serde_json::json!({"error": e})),
    }
}

/// `conc` keep-alive HTTP/1.1 clients, each asking `path` of `addr` again as soon as the last
/// answer is in, for `secs` (a reconnect after a closed connection); prints the answers.
fn http_loop(addr: SocketAddr, path: String, conc: u64, secs: u64) {
    let until = Instant::now() + Duration::from_secs(secs);
    let answers = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..conc)
        .map(|_| {
            let (path, answers) = (path.clone(), answers.clone());
            std::thread::spawn(move || {
                let req = format!("GET {path} HTTP/1.1\r\nhost: lab\r\n\r\n");
                while Instant::now() < until {
                    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                    else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
                    let mut r = BufReader::new(s.try_clone().unwrap());
                    while Instant::now() < until {
                        if s.write_all(req.as_bytes()).is_err() {
                            break;
                        }
                        let mut len = None;
                        let mut line = String::new();
                        loop {
                            line.clear();
                            match r.read_line(&mut line) {
                                Ok(0) | Err(_) => break,
                                Ok(_) if line == "\r\n" => break,
                                Ok(_) => {
                                    let l = line.to_ascii_lowercase();
                                    if let Some(v) = l.strip_prefix("content-length:") {
                                        len = v.trim().parse::<usize>().ok();
                                    }
                                }
                            }
                        }
                        let Some(len) = len else { break };
                        let mut body = vec![0u8; len];
                        if r.read_exact(&mut body).is_err() {
                            break;
                        }
                        answers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    println!(
        "{{\"answers\":{}}}",
        answers.load(std::sync::atomic::Ordering::Relaxed)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .unwrap_or_else(|| panic!("missing argument {i}; see the source"))
    };
    match args.get(1).map(String::as_str) {
        Some("serve-id") => serve_id(arg(2).parse().unwrap(), arg(3)),
        Some("serve-udp-id") => serve_udp_id(arg(2).parse().unwrap(), arg(3)),
        Some("connect-many") => {
            let ip: IpAddr = arg(2).parse().unwrap();
            short_connections(
                SocketAddr::new(ip, arg(3).parse().unwrap()),
                Until::Count(arg(4).parse().unwrap()),
                arg(5).parse().unwrap(),
                Duration::from_millis(arg(6).parse().unwrap()),
            )
        }
        Some("hold-ids") => {
            let ip: IpAddr = arg(2).parse().unwrap();
            // Optional 7th argument: how long a read may wait (seconds, default 3).
            let read_timeout = args.get(7).map(|s| s.parse().unwrap()).unwrap_or(3);
            hold_ids(
                SocketAddr::new(ip, arg(3).parse().unwrap()),
                arg(4).parse().unwrap(),
                arg(5).parse().unwrap(),
                Duration::from_millis(arg(6).parse().unwrap()),
                Duration::from_secs(read_timeout),
                args.get(8).map(|s| s.parse().unwrap()),
            )
        }
        Some("http-loop") => http_loop(
            arg(2).parse().unwrap(),
            arg(3),
            arg(4).parse().unwrap(),
            arg(5).parse().unwrap(),
        ),
        Some("connect-for") => {
            let ip: IpAddr = arg(2).parse().unwrap();
            let secs: u64 = arg(4).parse().unwrap();
            short_connections(
                SocketAddr::new(ip, arg(3).parse().unwrap()),
                Until::Deadline(Instant::now() + Duration::from_secs(secs)),
                arg(5).parse().unwrap(),
                Duration::from_millis(arg(6).parse().unwrap()),
            )
        }
        Some("connect-from") => {
            let ip: IpAddr = arg(2).parse().unwrap();
            connect_from(
                SocketAddr::new(ip, arg(3).parse().unwrap()),
                arg(4).parse().unwrap(),
                Duration::from_millis(arg(5).parse().unwrap()),
            )
        }
        Some("vrrp-send") => {
            let f = lb_tests::vrrp_send::from_args(&args[1..]);
            let sent = lb_tests::vrrp_send::run(&f).unwrap();
            println!("{{\"sent\": {sent}}}");
        }
        _ => {
            eprintln!(
                "usage: labnode serve-id PORT ID | connect-many ADDR PORT COUNT CONC TIMEOUT_MS | hold-ids ADDR PORT COUNT SECS INTERVAL_MS | connect-for ADDR PORT SECS CONC TIMEOUT_MS"
            );
            std::process::exit(2);
        }
    }
}
