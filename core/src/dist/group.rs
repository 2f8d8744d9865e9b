//! The processes of a multi-node run (torchrun's `--nnodes`, `--node-rank`, `--master-addr`):
//! rendezvous at node 0, liveness, small exchanges of JSON, and the gradient ring.
//!
//! Node 0 listens on the master address; every other node connects (retrying until the
//! timeout), presents its node rank, the run's fingerprint (a hash of the command, config and
//! devices) and the port of its ring listener, and is refused with a one-line reason when any
//! of them disagree. Afterwards the control connections carry heartbeats, gathers (metrics,
//! start state) and aborts: a node whose connection closes or that stays silent past the
//! timeout is named in the error every other node stops with.
//!
//! Only the addresses given are used: node 0 binds the master address itself (127.0.0.1 in
//! the tests) and every ring listener binds the address its node reaches node 0 from.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::local::{Abort, POLL, lock};
use super::ring::{Ring, net_error};
use crate::error::{Error, Result};

/// A multi-node run as seen by one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Processes (nodes) in the run.
    pub nnodes: usize,
    /// This node's rank, `0..nnodes`; node 0 hosts the rendezvous and writes checkpoints.
    pub node_rank: usize,
    /// `HOST:PORT` where node 0 listens.
    pub master: String,
    /// How long nodes wait for each other to join, and for a silent node before it is lost.
    pub timeout: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Message {
    Hello { node: usize, nnodes: usize, fingerprint: String, devices: usize, ring_port: u16 },
    Welcome { ring: Vec<SocketAddr> },
    Refuse { message: String },
    Gather { seq: u64, values: Vec<Value> },
    Gathered { seq: u64, values: Vec<Value> },
    Beat,
    Abort { message: String },
    Bye,
}

/// Gathers in flight: contributions at node 0, results at the other nodes.
#[derive(Default)]
struct Inbox {
    contributions: HashMap<u64, HashMap<usize, Vec<Value>>>,
    results: HashMap<u64, Vec<Value>>,
}

/// This node's connections to the others.
pub(crate) struct Group {
    pub node: usize,
    pub size: usize,
    /// Control connections for writing: to every other node at node 0, to node 0 elsewhere.
    peers: Vec<(usize, Mutex<TcpStream>)>,
    ring: Mutex<Ring>,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    seq: AtomicU64,
    closing: Arc<AtomicBool>,
    /// Whether this node told the others why it stops.
    told: AtomicBool,
    abort: Arc<Abort>,
}

impl Group {
    /// Joins the run described by `spec` (this node has `devices` replicas). Blocks until every
    /// node has joined, or fails with the reason.
    pub fn join(spec: &NodeSpec, fingerprint: &str, devices: usize, abort: Arc<Abort>) -> Result<Arc<Self>> {
        if spec.nnodes < 2 || spec.node_rank >= spec.nnodes {
            return Err(Error::InvalidInput(format!("--node-rank {} must be below --nnodes {} (at least 2 nodes)", spec.node_rank, spec.nnodes)));
        }
        let master = resolve(&spec.master)?;
        let (peers, ring_addrs, ring_listener) = if spec.node_rank == 0 {
            rendezvous_master(spec, master, fingerprint, devices)?
        } else {
            rendezvous_member(spec, master, fingerprint, devices)?
        };
        let token = fingerprint_token(fingerprint);
        let ring = Ring::connect(spec.node_rank, &ring_addrs, &ring_listener, token, spec.timeout, &abort)?;
        let group = Arc::new(Self {
            node: spec.node_rank,
            size: spec.nnodes,
            peers: peers.iter().map(|(node, stream)| Ok((*node, Mutex::new(stream.try_clone().map_err(|e| net_error("control connection", e))?)))).collect::<Result<_>>()?,
            ring: Mutex::new(ring),
            inbox: Mutex::new(Inbox::default()),
            arrived: Condvar::new(),
            seq: AtomicU64::new(0),
            closing: Arc::new(AtomicBool::new(false)),
            told: AtomicBool::new(false),
            abort,
        });
        for (node, stream) in peers {
            let group = group.clone();
            let timeout = spec.timeout;
            std::thread::spawn(move || group.read_loop(node, stream, timeout));
        }
        let beats = group.clone();
        let interval = (spec.timeout / 4).min(Duration::from_secs(1));
        std::thread::spawn(move || {
            while !beats.closing.load(Ordering::Relaxed) && beats.abort.reason().is_none() {
                beats.send_all(&Message::Beat, None);
                std::thread::sleep(interval);
            }
        });
        Ok(group)
    }

    /// Sums `data` over all nodes (see [`Ring`]).
    pub fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let result = lock(&self.ring).all_reduce_sum(data, &self.abort);
        self.ring_result(result)
    }

    /// Every node's chunk of `data` to every node (see [`Ring::all_gather`]).
    pub fn all_gather(&self, data: &mut [f32], chunks: &[std::ops::Range<usize>]) -> Result<()> {
        let result = lock(&self.ring).all_gather(data, chunks, &self.abort);
        self.ring_result(result)
    }

    /// A ring call's result; when a neighbour's connection broke, the control connections usually
    /// say why (which node stopped) a moment later: that reason wins.
    fn ring_result(&self, result: Result<()>) -> Result<()> {
        if let Err(e) = &result {
            let until = Instant::now() + Duration::from_secs(2);
            while self.abort.reason().is_none() && Instant::now() < until {
                std::thread::sleep(POLL / 4);
            }
            self.stop(e.to_string(), None);
            return Err(Error::Distributed(self.abort.reason().unwrap_or_else(|| e.to_string())));
        }
        result
    }

    /// Every node passes its values; every node gets all of them, in node order.
    pub fn gather(&self, values: Vec<Value>) -> Result<Vec<Vec<Value>>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if self.node == 0 {
            let mut inbox = lock(&self.inbox);
            while inbox.contributions.get(&seq).map_or(0, HashMap::len) < self.size - 1 {
                inbox = self.wait(inbox)?;
            }
            let mut theirs = inbox.contributions.remove(&seq).unwrap_or_default();
            drop(inbox);
            let all: Vec<Vec<Value>> = std::iter::once(values).chain((1..self.size).map(|n| theirs.remove(&n).unwrap_or_default())).collect();
            let flat = all.iter().map(|v| Value::Array(v.clone())).collect();
            self.send_all(&Message::Gathered { seq, values: flat }, None);
            Ok(all)
        } else {
            self.send_all(&Message::Gather { seq, values }, None);
            let mut inbox = lock(&self.inbox);
            loop {
                if let Some(all) = inbox.results.remove(&seq) {
                    return Ok(all.into_iter().map(|v| if let Value::Array(v) = v { v } else { Vec::new() }).collect());
                }
                inbox = self.wait(inbox)?;
            }
        }
    }

    /// Stops this node and the others with `message` (unless the run already stopped for
    /// another reason, which is passed on instead).
    pub fn fail(&self, message: &str) {
        self.stop(message.to_string(), None);
    }

    /// Leaves the run after its last exchange.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.send_all(&Message::Bye, None);
    }

    /// Closes every connection of this node at once, as its process dying would (tests).
    #[cfg(test)]
    pub fn sever(&self) {
        self.abort.raise("severed");
        for (_, stream) in &self.peers {
            let _ = lock(stream).shutdown(std::net::Shutdown::Both);
        }
        lock(&self.ring).sever();
    }

    fn wait<'a, T>(&self, guard: std::sync::MutexGuard<'a, T>) -> Result<std::sync::MutexGuard<'a, T>> {
        let (guard, _) = self.arrived.wait_timeout(guard, POLL).unwrap_or_else(|e| e.into_inner());
        self.abort.check()?;
        Ok(guard)
    }

    fn send_all(&self, message: &Message, except: Option<usize>) {
        let line = serde_json::to_string(message).expect("messages serialize") + "\n";
        for (node, stream) in &self.peers {
            if Some(*node) != except {
                // A failed write shows up as a lost connection on the reading side.
                let _ = lock(stream).write_all(line.as_bytes());
            }
        }
    }

    /// Reads `node`'s control messages until it leaves, fails or is lost.
    fn read_loop(self: Arc<Self>, node: usize, stream: TcpStream, timeout: Duration) {
        let _ = stream.set_read_timeout(Some(POLL * 5));
        let mut reader = BufReader::new(stream);
        // Bytes, not a String: a read that times out may stop inside a UTF-8 character.
        let mut line = Vec::new();
        let mut heard = Instant::now();
        let lost = loop {
            if self.abort.reason().is_some() {
                return;
            }
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break format!("{} stopped (its connection closed)", name(node)),
                Ok(_) if line.last() != Some(&b'\n') => break format!("{} stopped (its connection closed)", name(node)),
                Ok(_) => {
                    heard = Instant::now();
                    let message = serde_json::from_slice::<Message>(&line);
                    line.clear();
                    match message {
                        Ok(Message::Bye) => return,
                        Ok(message) => self.receive(node, message),
                        Err(e) => break format!("{} sent an unreadable message ({e})", name(node)),
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    if heard.elapsed() > timeout {
                        break format!("{} sent nothing for {}s: it hangs or the network is down", name(node), timeout.as_secs());
                    }
                }
                Err(e) => break format!("{} broke its connection ({e})", name(node)),
            }
        };
        if !self.closing.load(Ordering::Relaxed) {
            self.stop(lost, Some(node));
        }
    }

    fn receive(&self, node: usize, message: Message) {
        match message {
            Message::Gather { seq, values } => {
                lock(&self.inbox).contributions.entry(seq).or_default().insert(node, values);
                self.arrived.notify_all();
            }
            Message::Gathered { seq, values } => {
                lock(&self.inbox).results.insert(seq, values);
                self.arrived.notify_all();
            }
            Message::Abort { message } => self.stop(message, Some(node)),
            _ => {}
        }
    }

    /// Stops this node with `reason` (or the reason it already stopped for) and tells the
    /// others once: node 0 tells every node but `from`, the others tell node 0, which passes
    /// it on.
    fn stop(&self, reason: String, from: Option<usize>) {
        self.abort.raise(reason);
        if !self.told.swap(true, Ordering::Relaxed) {
            let reason = self.abort.reason().unwrap_or_default();
            self.send_all(&Message::Abort { message: reason }, from);
        }
        self.arrived.notify_all();
    }
}

/// How messages name a node.
fn name(node: usize) -> String {
    if node == 0 { "node 0 (the master)".into() } else { format!("node {node}") }
}

fn resolve(master: &str) -> Result<SocketAddr> {
    let bad = |why: String| Error::InvalidInput(format!("--master-addr {master:?}: {why} (expected HOST:PORT, e.g. 127.0.0.1:29500)"));
    master.to_socket_addrs().map_err(|e| bad(e.to_string()))?.next().ok_or_else(|| bad("no address".into()))
}

/// A number identifying the run on the ring connections.
fn fingerprint_token(fingerprint: &str) -> u64 {
    fingerprint.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

type Rendezvous = (Vec<(usize, TcpStream)>, Vec<SocketAddr>, TcpListener);

fn rendezvous_master(spec: &NodeSpec, master: SocketAddr, fingerprint: &str, devices: usize) -> Result<Rendezvous> {
    let listener = TcpListener::bind(master).map_err(|e| match e.kind() {
        ErrorKind::AddrInUse => Error::Distributed(format!("port {} of {} is in use (another run?): choose another port in --master-addr", master.port(), master.ip())),
        _ => Error::Distributed(format!("cannot listen on {master} ({e}): --master-addr must be an address of node 0")),
    })?;
    let ring_listener = TcpListener::bind((master.ip(), 0)).map_err(|e| net_error("ring listener", e))?;
    listener.set_nonblocking(true).map_err(|e| net_error("master listener", e))?;
    let deadline = Instant::now() + spec.timeout;
    let mut joined: Vec<Option<(TcpStream, SocketAddr)>> = (0..spec.nnodes).map(|_| None).collect();
    let refuse_all = |joined: &mut Vec<Option<(TcpStream, SocketAddr)>>, message: &str| {
        for (stream, _) in joined.iter_mut().flatten() {
            let _ = send(stream, &Message::Refuse { message: message.to_string() });
        }
    };
    while joined.iter().skip(1).any(Option::is_none) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                stream.set_nonblocking(false).map_err(|e| net_error("control connection", e))?;
                let Ok(Message::Hello { node, nnodes, fingerprint: theirs, devices: their_devices, ring_port }) = receive(&stream, Duration::from_secs(10)) else {
                    continue; // not a kiln node: ignore it
                };
                let problem = if nnodes != spec.nnodes {
                    Some(format!("node {node} was started with --nnodes {nnodes}, node 0 with {}", spec.nnodes))
                } else if node == 0 || node >= spec.nnodes {
                    Some(format!("a node joined with --node-rank {node}, outside 1..{}", spec.nnodes))
                } else if joined[node].is_some() {
                    Some(format!("two nodes joined with --node-rank {node}"))
                } else if theirs != fingerprint {
                    Some(format!(
                        "node {node} runs another configuration than node 0 (fingerprint {theirs} vs {fingerprint}): start every node with the same command, config file and devices"
                    ))
                } else if their_devices != devices {
                    Some(format!("node {node} has {their_devices} devices, node 0 has {devices}: every node needs the same number"))
                } else {
                    None
                };
                if let Some(problem) = problem {
                    let _ = send(&mut stream, &Message::Refuse { message: problem.clone() });
                    refuse_all(&mut joined, &problem);
                    return Err(Error::Distributed(problem));
                }
                joined[node] = Some((stream, SocketAddr::new(peer.ip(), ring_port)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (1..spec.nnodes).filter(|&n| joined[n].is_none()).map(|n| n.to_string()).collect();
                    let problem = format!("node(s) {} did not join within {}s (started with --master-addr {}?)", missing.join(", "), spec.timeout.as_secs(), spec.master);
                    refuse_all(&mut joined, &problem);
                    return Err(Error::Distributed(problem));
                }
                std::thread::sleep(POLL / 2);
            }
            Err(e) => return Err(net_error("master listener", e)),
        }
    }
    let ring: Vec<SocketAddr> = std::iter::once(ring_listener.local_addr().map_err(|e| net_error("ring listener", e))?)
        .chain(joined.iter().skip(1).map(|j| j.as_ref().expect("all joined").1))
        .collect();
    let mut peers = Vec::new();
    for (node, entry) in joined.into_iter().enumerate().skip(1) {
        let (mut stream, _) = entry.expect("all joined");
        send(&mut stream, &Message::Welcome { ring: ring.clone() })?;
        peers.push((node, stream));
    }
    Ok((peers, ring, ring_listener))
}

fn rendezvous_member(spec: &NodeSpec, master: SocketAddr, fingerprint: &str, devices: usize) -> Result<Rendezvous> {
    let deadline = Instant::now() + spec.timeout;
    let mut stream = loop {
        match TcpStream::connect_timeout(&master, Duration::from_secs(1)) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::Distributed(format!(
                    "cannot reach node 0 at {} within {}s ({e}): start node 0 (--node-rank 0) with the same --master-addr",
                    spec.master,
                    spec.timeout.as_secs()
                )));
            }
            Err(_) => std::thread::sleep(POLL * 2),
        }
    };
    let own_ip = stream.local_addr().map_err(|e| net_error("control connection", e))?.ip();
    let ring_listener = TcpListener::bind((own_ip, 0)).map_err(|e| net_error("ring listener", e))?;
    let ring_port = ring_listener.local_addr().map_err(|e| net_error("ring listener", e))?.port();
    send(&mut stream, &Message::Hello { node: spec.node_rank, nnodes: spec.nnodes, fingerprint: fingerprint.to_string(), devices, ring_port })?;
    match receive(&stream, spec.timeout + Duration::from_secs(10))? {
        Message::Welcome { ring } if ring.len() == spec.nnodes => Ok((vec![(0, stream)], ring, ring_listener)),
        Message::Refuse { message } => Err(Error::Distributed(message)),
        other => Err(Error::Distributed(format!("node 0 answered the rendezvous with {other:?}"))),
    }
}

fn send(stream: &mut TcpStream, message: &Message) -> Result<()> {
    let line = serde_json::to_string(message).expect("messages serialize") + "\n";
    stream.write_all(line.as_bytes()).map_err(|e| net_error("control connection", e))
}

/// One message, waiting at most `timeout`.
fn receive(stream: &TcpStream, timeout: Duration) -> Result<Message> {
    stream.set_read_timeout(Some(timeout)).map_err(|e| net_error("control connection", e))?;
    let mut line = String::new();
    let read = BufReader::new(stream).read_line(&mut line);
    match read {
        Ok(0) => Err(Error::Distributed("node 0 closed the connection during the rendezvous".into())),
        Ok(_) => serde_json::from_str(line.trim_end()).map_err(|e| Error::Distributed(format!("unreadable rendezvous message ({e})"))),
        Err(e) => Err(Error::Distributed(format!("no answer during the rendezvous within {}s ({e})", timeout.as_secs()))),
    }
}
