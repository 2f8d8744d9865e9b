//! Ring all-reduce and all-gather of f32 buffers between the processes of a run, over TCP.
//!
//! Node `i` sends to node `i + 1` and receives from node `i − 1` (mod P). A buffer is cut into
//! P chunks; P − 1 steps of reduce-scatter leave node `i` with the full sum of chunk `i + 1`,
//! and P − 1 steps of all-gather copy every summed chunk to every node, so all nodes end with
//! bitwise the same result. Each node sends and receives 2 (P − 1)/P of the buffer per call.
//! The all-gather alone ([`Ring::all_gather`]) hands out chunks that each node already has
//! (ZeRO-1's updated weights): (P − 1)/P of the buffer.
//!
//! Every read and write polls the run's abort flag, so a stopped run never leaves a thread
//! blocked here; a peer that closes its connection is an error naming it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::local::{Abort, POLL};
use crate::error::{Error, Result};

/// This node's two ring connections.
pub(crate) struct Ring {
    pub node: usize,
    pub size: usize,
    next: TcpStream,
    prev: TcpStream,
}

impl Ring {
    /// Connects node `node` of `addrs.len()` to its neighbours: connects to the next node's
    /// listener and accepts the previous node on `listener`, both within `timeout`. `token`
    /// identifies the run (a stray connection is refused).
    pub fn connect(node: usize, addrs: &[SocketAddr], listener: &TcpListener, token: u64, timeout: Duration, abort: &Abort) -> Result<Self> {
        let size = addrs.len();
        let (next_node, prev_node) = ((node + 1) % size, (node + size - 1) % size);
        let deadline = Instant::now() + timeout;
        let mut next = loop {
            abort.check()?;
            match TcpStream::connect_timeout(&addrs[next_node], POLL * 10) {
                Ok(stream) => break stream,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::Distributed(format!("cannot reach node {next_node} at {} for the gradient ring: {e}", addrs[next_node])));
                }
                Err(_) => std::thread::sleep(POLL),
            }
        };
        setup(&next)?;
        let check = || abort.check();
        write_all(&mut next, &hello(token, node), &check, next_node)?;
        listener.set_nonblocking(true).map_err(|e| net_error("ring listener", e))?;
        let prev = loop {
            abort.check()?;
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).map_err(|e| net_error("ring connection", e))?;
                    setup(&stream)?;
                    let mut stream = stream;
                    let mut greeting = [0u8; 16];
                    read_exact(&mut stream, &mut greeting, &check, prev_node)?;
                    if greeting == hello(token, prev_node) {
                        break stream;
                    }
                    // Not our previous node (another run, or a stray client): ignore it.
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Distributed(format!("node {prev_node} did not connect to this node's gradient ring within {}s", timeout.as_secs())));
                    }
                    std::thread::sleep(POLL / 4);
                }
                Err(e) => return Err(net_error("ring listener", e)),
            }
        };
        Ok(Self { node, size, next, prev })
    }

    /// Sums `data` element-wise over all nodes, in place (every node passes the same length).
    pub fn all_reduce_sum(&mut self, data: &mut [f32], abort: &Abort) -> Result<()> {
        let p = self.size;
        if p == 1 {
            return Ok(());
        }
        self.agree_on_length(data.len(), "reduces", abort)?;
        let chunks = chunk_ranges(data.len(), p);
        let (node, next_node, prev_node) = (self.node, (self.node + 1) % p, (self.node + p - 1) % p);
        let mut incoming: Vec<f32> = Vec::new();
        for step in 0..p - 1 {
            // Reduce-scatter: send chunk (i − s), add chunk (i − s − 1) into this node's.
            let send = (node + p - step) % p;
            let recv = (send + p - 1) % p;
            let (sent, received) = (chunks[send].clone(), chunks[recv].clone());
            // The chunks differ, but both live in `data`: receive aside, then add.
            incoming.resize(received.len(), 0.0);
            exchange(&mut self.next, &mut self.prev, wire(&data[sent]), wire_mut(&mut incoming), abort, (next_node, prev_node))?;
            data[received].iter_mut().zip(&incoming).for_each(|(value, other)| *value += other);
        }
        // Node i now holds the whole sum of chunk i + 1: pass the sums round.
        self.circulate(data, &chunks, (node + 1) % p, abort)
    }

    /// Every node's chunk of `data` to every node, in place: node `i` fills `data[chunks[i]]`
    /// and ends with every other node's chunk in its place (`chunks` tile `data` in node order,
    /// maybe with empty ones; every node passes the same). Each node sends and receives
    /// (P − 1)/P of the buffer, half an all-reduce's traffic.
    pub fn all_gather(&mut self, data: &mut [f32], chunks: &[Range<usize>], abort: &Abort) -> Result<()> {
        let p = self.size;
        let tiled = chunks.len() == p && chunks.first().is_some_and(|c| c.start == 0) && chunks.last().is_some_and(|c| c.end == data.len()) && chunks.windows(2).all(|w| w[0].end == w[1].start) && chunks.iter().all(|c| c.start <= c.end);
        if !tiled {
            return Err(Error::Distributed(format!("all-gather: {chunks:?} do not cut {} values into {p} chunks in order", data.len())));
        }
        if p == 1 {
            return Ok(());
        }
        self.agree_on_length(data.len(), "gathers", abort)?;
        self.circulate(data, chunks, self.node, abort)
    }

    /// P − 1 steps in which each node passes on the chunk it got last, starting with chunk
    /// `held`: afterwards every node has every chunk.
    fn circulate(&mut self, data: &mut [f32], chunks: &[Range<usize>], held: usize, abort: &Abort) -> Result<()> {
        let p = self.size;
        let (next_node, prev_node) = ((self.node + 1) % p, (self.node + p - 1) % p);
        for step in 0..p - 1 {
            let send = (held + p - step) % p;
            let recv = (send + p - 1) % p;
            let (sent, received) = (chunks[send].clone(), chunks[recv].clone());
            // Disjoint ranges of `data` (either may be empty): split between them.
            let (outgoing, target) = if sent.end <= received.start {
                let (head, tail) = data.split_at_mut(received.start);
                (&head[sent], &mut tail[..received.len()])
            } else {
                let (head, tail) = data.split_at_mut(sent.start);
                (&tail[..sent.len()], &mut head[received])
            };
            exchange(&mut self.next, &mut self.prev, wire(outgoing), wire_mut(target), abort, (next_node, prev_node))?;
        }
        Ok(())
    }

    /// Checks that the previous node passes `len` values too (or the chunks would not line up).
    fn agree_on_length(&mut self, len: usize, verb: &str, abort: &Abort) -> Result<()> {
        let (next_node, prev_node) = ((self.node + 1) % self.size, (self.node + self.size - 1) % self.size);
        let length = (len as u64).to_le_bytes();
        let mut theirs = [0u8; 8];
        exchange(&mut self.next, &mut self.prev, &length, &mut theirs, abort, (next_node, prev_node))?;
        if theirs != length {
            return Err(Error::Distributed(format!(
                "node {prev_node} {verb} {} values where this node {verb} {len}: the nodes run different models or configs",
                u64::from_le_bytes(theirs)
            )));
        }
        Ok(())
    }
}

impl Ring {
    /// Closes both connections (tests).
    #[cfg(test)]
    pub fn sever(&self) {
        let _ = self.next.shutdown(std::net::Shutdown::Both);
        let _ = self.prev.shutdown(std::net::Shutdown::Both);
    }
}

/// `n` values cut into `p` contiguous chunks (the first ones one longer).
fn chunk_ranges(n: usize, p: usize) -> Vec<Range<usize>> {
    let (base, extra) = (n / p, n % p);
    let mut start = 0;
    (0..p)
        .map(|i| {
            let len = base + usize::from(i < extra);
            start += len;
            start - len..start
        })
        .collect()
}

/// The bytes sent for `values`: f32 in memory order, little-endian on every target kiln builds
/// for (sent and received without a copy).
#[cfg(target_endian = "little")]
fn wire(values: &[f32]) -> &[u8] {
    bytemuck::cast_slice(values)
}

#[cfg(target_endian = "little")]
fn wire_mut(values: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

fn hello(token: u64, node: usize) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&token.to_le_bytes());
    bytes[8..].copy_from_slice(&(node as u64).to_le_bytes());
    bytes
}

fn setup(stream: &TcpStream) -> Result<()> {
    stream.set_nodelay(true).map_err(|e| net_error("ring connection", e))?;
    stream.set_read_timeout(Some(POLL)).map_err(|e| net_error("ring connection", e))?;
    stream.set_write_timeout(Some(POLL)).map_err(|e| net_error("ring connection", e))
}

/// Sends `outgoing` to the next node while receiving `incoming` from the previous one.
fn exchange(next: &mut TcpStream, prev: &mut TcpStream, outgoing: &[u8], incoming: &mut [u8], abort: &Abort, nodes: (usize, usize)) -> Result<()> {
    // A failed read stops the writer too (its peer may never read again).
    let failed = AtomicBool::new(false);
    let check = || match failed.load(Ordering::Relaxed) {
        true => Err(Error::Distributed("the ring exchange failed".into())),
        false => abort.check(),
    };
    std::thread::scope(|s| {
        let writer = s.spawn(|| write_all(next, outgoing, &check, nodes.0));
        let read = read_exact(prev, incoming, &check, nodes.1);
        failed.store(read.is_err(), Ordering::Relaxed);
        let written = writer.join().unwrap_or_else(|_| Err(Error::Distributed("the ring writer panicked".into())));
        read.and(written)
    })
}

fn read_exact(stream: &mut TcpStream, buffer: &mut [u8], check: &dyn Fn() -> Result<()>, node: usize) -> Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        match stream.read(&mut buffer[done..]) {
            Ok(0) => return Err(lost(node, "closed its ring connection")),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => check()?,
            Err(e) => return Err(lost(node, &format!("broke its ring connection ({e})"))),
        }
    }
    Ok(())
}

fn write_all(stream: &mut TcpStream, mut bytes: &[u8], check: &dyn Fn() -> Result<()>, node: usize) -> Result<()> {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(0) => return Err(lost(node, "closed its ring connection")),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => check()?,
            Err(e) => return Err(lost(node, &format!("broke its ring connection ({e})"))),
        }
    }
    Ok(())
}

fn lost(node: usize, what: &str) -> Error {
    Error::Distributed(format!("node {node} {what}: it stopped or the network failed"))
}

pub(crate) fn net_error(what: &str, e: std::io::Error) -> Error {
    Error::Distributed(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer() {
        assert_eq!(chunk_ranges(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(chunk_ranges(2, 3), vec![0..1, 1..2, 2..2]);
    }

    /// `body(node, ring, abort)` on each of three nodes on 127.0.0.1 (threads here), ring
    /// connected with `token`; their results in node order.
    fn on_three_nodes<T: Send>(token: u64, body: impl Fn(usize, &mut Ring, &Abort) -> T + Sync) -> Vec<T> {
        let listeners: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = listeners
                .iter()
                .enumerate()
                .map(|(node, listener)| {
                    let (addrs, body) = (&addrs, &body);
                    s.spawn(move || {
                        let abort = Abort::default();
                        let mut ring = Ring::connect(node, addrs, listener, token, Duration::from_secs(10), &abort).unwrap();
                        body(node, &mut ring, &abort)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Three nodes on 127.0.0.1 gather chunks of uneven sizes (empty ones first, between and
    /// last: a bucket of ZeRO-1 weights that one replica owns alone) between two sums, and each
    /// ends with every node's chunk in its place.
    #[test]
    fn three_nodes_gather_uneven_chunks_on_loopback() {
        let cuts: [&[usize]; 5] = [&[0, 3, 5, 9], &[0, 0, 4, 4], &[0, 4, 4, 4], &[0, 0, 0, 6], &[0, 1000, 1001, 2001]];
        let chunks = |cut: &[usize]| -> Vec<Range<usize>> { cut.windows(2).map(|w| w[0]..w[1]).collect() };
        let results = on_three_nodes(9, |node, ring, abort| {
            let mut out = Vec::new();
            for cut in cuts {
                let chunks = chunks(cut);
                // Only this node's chunk holds its values; the rest is left over.
                let mut data = vec![-1.0f32; *cut.last().unwrap()];
                data[chunks[node].clone()].iter_mut().enumerate().for_each(|(j, v)| *v = (node * 10_000 + j) as f32);
                ring.all_gather(&mut data, &chunks, abort).unwrap();
                out.push(data);
                let mut sum = vec![node as f32; 5];
                ring.all_reduce_sum(&mut sum, abort).unwrap();
                assert_eq!(sum, vec![3.0; 5]);
            }
            let wrong = ring.all_gather(&mut [0.0; 4], &chunks(&[0, 2, 4]), abort).unwrap_err().to_string();
            assert!(wrong.contains("do not cut 4 values into 3 chunks"), "{wrong}");
            out
        });
        for (k, cut) in cuts.iter().enumerate() {
            let expected: Vec<f32> = (0..3).flat_map(|node| (0..cut[node + 1] - cut[node]).map(move |j| (node * 10_000 + j) as f32)).collect();
            for (node, result) in results.iter().enumerate() {
                assert_eq!(result[k], expected, "cut {k} on node {node}");
            }
        }
    }

    /// Three nodes on 127.0.0.1 (threads here) sum buffers back to back, lengths shorter than
    /// the node count included, and agree bit for bit.
    #[test]
    fn three_nodes_sum_back_to_back_on_loopback() {
        let results = on_three_nodes(7, |node, ring, abort| {
            [1usize, 2, 1000, 7, 3]
                .iter()
                .enumerate()
                .map(|(k, &len)| {
                    let mut data: Vec<f32> = (0..len).map(|j| (node * 100 + j + k) as f32 * 0.1).collect();
                    ring.all_reduce_sum(&mut data, abort).unwrap();
                    data
                })
                .collect::<Vec<_>>()
        });
        for (k, &len) in [1usize, 2, 1000, 7, 3].iter().enumerate() {
            for (j, value) in results[0][k].iter().enumerate() {
                let expected: f32 = (0..3).map(|node| (node * 100 + j + k) as f32 * 0.1).sum();
                assert!((value - expected).abs() <= 1e-4 * expected.abs().max(1.0), "call {k} value {j}");
            }
            assert_eq!(results[0][k].len(), len);
            assert_eq!(results[0][k], results[1][k]);
            assert_eq!(results[0][k], results[2][k]);
        }
    }
}
