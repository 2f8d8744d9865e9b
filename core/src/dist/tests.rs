//! The replicas' operations in one process, and the node group on 127.0.0.1 (nodes as threads).

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use serde_json::{Value, json};

use super::group::{Group, NodeSpec};
use super::local::Abort;
use super::*;

/// A port of 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spec(nnodes: usize, node_rank: usize, port: u16, timeout_s: u64) -> NodeSpec {
    NodeSpec { nnodes, node_rank, master: format!("127.0.0.1:{port}"), timeout: Duration::from_secs(timeout_s) }
}

#[test]
fn shards_split_items_contiguously() {
    let replica = |rank| Replica::new(rank, 3, 0, 1, 0, None);
    let shards: Vec<_> = (0..3).map(|r| replica(r).shard(10)).collect();
    assert_eq!(shards, vec![0..4, 4..7, 7..10]);
    assert_eq!(Replica::single().shard(5), 0..5);
}

/// ZeRO-1's partition: every value of every parameter belongs to exactly one replica, each
/// replica holds its `1 / world` of the values even when one tensor is most of the model (a
/// tied embedding), and the input's order does not matter.
#[test]
fn optimizer_shards_cover_every_value_once_in_equal_parts() {
    let params: Vec<(String, usize)> = [("model.embed_tokens.weight", 70_400), ("model.norm.weight", 32), ("model.layers.0.mlp.up_proj.weight", 2048), ("model.layers.0.self_attn.k_proj.bias", 3), ("empty", 0)]
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    let total: usize = params.iter().map(|p| p.1).sum();
    for world in 1..=5 {
        let shards: Vec<OptimizerShard> = (0..world).map(|r| OptimizerShard::new(&params, r, world)).collect();
        for (name, numel) in &params {
            let mut owners = vec![0u8; *numel];
            for shard in &shards {
                for i in shard.range(name, *numel) {
                    owners[i] += 1;
                }
            }
            assert!(owners.iter().all(|&n| n == 1), "world {world}: {name} is not covered exactly once");
        }
        for shard in &shards {
            assert!((shard.held_values() / 2).abs_diff(total / world) <= 1, "world {world}: {} of {total}", shard.held_values() / 2);
        }
    }
    let mut reversed = params.clone();
    reversed.reverse();
    assert_eq!(OptimizerShard::new(&params, 1, 3), OptimizerShard::new(&reversed, 1, 3));
    assert_eq!(OptimizerShard::new(&params, 0, 2).range("not a parameter", 7), 0..7);
}

#[test]
fn records_reduce_by_kind_of_metric() {
    let records = vec![
        json!({"loss": 1.0, "tokens": 10, "reward_mean": 0.5, "advantage_max": 2.0, "advantage_min": -1.0, "rollout_s": 3.0, "rollout_tokens_per_s": 100.0, "note": "a"}),
        json!({"loss": 2.0, "tokens": 30, "reward_mean": 1.0, "advantage_max": 1.0, "advantage_min": -3.0, "rollout_s": 5.0, "rollout_tokens_per_s": 50.0, "note": "b"}),
    ];
    let summed = reduce_records(records.clone(), Reduce::Sum);
    assert_eq!(summed["loss"], json!(3.0));
    let mean = reduce_records(records, Reduce::Mean);
    assert_eq!(mean["loss"], json!(1.5));
    assert_eq!(mean["tokens"], json!(40.0));
    assert_eq!(mean["reward_mean"], json!(0.75));
    assert_eq!(mean["advantage_max"], json!(2.0));
    assert_eq!(mean["advantage_min"], json!(-3.0));
    assert_eq!(mean["rollout_s"], json!(5.0));
    assert_eq!(mean["rollout_tokens_per_s"], json!(150.0));
    assert_eq!(mean["note"], json!("a"));
}

#[test]
fn fingerprints_separate_their_parts() {
    assert_eq!(fingerprint(&["a", "bc"]), fingerprint(&["a", "bc"]));
    assert_ne!(fingerprint(&["a", "bc"]), fingerprint(&["ab", "c"]));
    assert_eq!(fingerprint(&["x"]).len(), 16);
}

/// Three replicas (threads) on the CPU: sums and means of tensors of several buckets, back to
/// back, and gathers in rank order.
#[test]
fn local_replicas_reduce_and_gather() {
    let devices = vec![Default::default(); 3];
    let body = |replica: Replica, device: &burn::tensor::Device<Flex>| -> Result<Vec<Vec<f32>>> {
        let rank = replica.rank() as f32;
        let mut out = Vec::new();
        for k in 0..4 {
            let tensors = vec![
                Tensor::<Flex, 1>::from_data(TensorData::new(vec![rank + k as f32; 5], [5]), device),
                Tensor::<Flex, 1>::from_data(TensorData::new(vec![rank * 2.0; 3], [3]), device),
            ];
            let op = if k % 2 == 0 { Reduce::Sum } else { Reduce::Mean };
            let reduced = replica.all_reduce_many(tensors, op)?;
            out.extend(reduced.into_iter().map(|t| t.into_data().to_vec::<f32>().unwrap()));
        }
        let all = replica.gather(json!(replica.rank()))?;
        assert_eq!(all, vec![json!(0), json!(1), json!(2)]);
        Ok(out)
    };
    let main = launch(&devices, None, "t", |r, d| body(r, d), |r, d| body(r, d)).unwrap();
    // Σ rank = 3, Σ 2·rank = 6; k odd: means.
    assert_eq!(main[0], vec![3.0; 5]);
    assert_eq!(main[1], vec![6.0; 3]);
    assert_eq!(main[2], vec![(3.0 + 3.0) / 3.0; 5]);
    assert_eq!(main[3], vec![2.0; 3]);
    assert_eq!(main[4], vec![3.0 + 6.0; 5]);
}

/// `Err` naming `what` unless `got == want`: a replica's failed check then stops the others
/// (a panic would leave them waiting in their next collective).
fn expect_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: impl std::fmt::Display) -> Result<()> {
    match got == want {
        true => Ok(()),
        false => Err(Error::InvalidInput(format!("{what}: got {got:?}, expected {want:?}"))),
    }
}

/// Three replicas (threads) hand each other their parts of a buffer ([`Replica::all_gather`]):
/// uneven parts, an empty one first, between and last, and a buffer held in bf16 come back in
/// place and exact, whatever the others left in their copies; a cut that does not fit is an
/// error.
#[test]
fn local_replicas_gather_their_parts_in_place() {
    let devices = vec![Default::default(); 3];
    let cuts: [&[usize]; 4] = [&[3, 2, 4], &[0, 4, 0], &[5, 0, 0], &[0, 0, 6]];
    let body = |replica: Replica, device: &burn::tensor::Device<Flex>| -> Result<Vec<Vec<f32>>> {
        let rank = replica.rank();
        let mut out = Vec::new();
        for (k, parts) in cuts.iter().enumerate() {
            let start: usize = parts[..rank].iter().sum();
            // This replica's part holds its values; the rest, whatever it had.
            let values: Vec<f32> = (0..parts.iter().sum()).map(|i| if (start..start + parts[rank]).contains(&i) { 1.0 + rank as f32 + i as f32 / 8.0 } else { -7.0 }).collect();
            let mut data = Tensor::<Flex, 1>::from_data(TensorData::new(values.clone(), [values.len()]), device);
            if k == 0 {
                data = crate::model::proj::to_dtype(data, burn::tensor::DType::BF16);
            }
            let gathered = replica.all_gather(data, parts)?;
            expect_eq(gathered.dtype(), if k == 0 { burn::tensor::DType::BF16 } else { burn::tensor::DType::F32 }, "dtype")?;
            let gathered = crate::model::proj::to_dtype(gathered, burn::tensor::DType::F32).into_data().to_vec::<f32>().unwrap();
            // Every replica gets every part (1 + owner + i/8 is exact in bf16 at these sizes).
            let owner = |i: usize| (0..3).find(|&r| i < parts[..=r].iter().sum()).unwrap();
            let want: Vec<f32> = (0..gathered.len()).map(|i| 1.0 + owner(i) as f32 + i as f32 / 8.0).collect();
            expect_eq(&gathered, &want, format!("cut {k} on replica {rank}"))?;
            out.push(gathered);
        }
        let wrong = replica.all_gather(Tensor::<Flex, 1>::zeros([4], device), &[2, 2]).unwrap_err().to_string();
        expect_eq(wrong.contains("4 values cut into [2, 2] for 3 replicas"), true, &wrong)?;
        Ok(out)
    };
    let main = launch(&devices, None, "t", |r, d| body(r, d), |r, d| body(r, d)).unwrap();
    for (k, parts) in cuts.iter().enumerate() {
        let mut at = 0;
        for (rank, &n) in parts.iter().enumerate() {
            for (i, value) in main[k].iter().enumerate().skip(at).take(n) {
                // 1 + rank + i/8 is exact in bf16 at these sizes.
                assert_eq!(*value, 1.0 + rank as f32 + i as f32 / 8.0, "cut {k}, value {i}");
            }
            at += n;
        }
        assert_eq!(main[k].len(), at);
    }
}

/// ZeRO-1's weights after an update: three replicas, each holding only its own values right
/// (the rest -1), gather in rounds of 4 values and of 2 (slices of 2 and of 1 per replica and
/// round: parameters span rounds and replicas, and the last round of 31 values over 3 replicas
/// is uneven), and every replica ends with every value right. The moments before a checkpoint
/// the same way: rank 0 ends with every parameter's whole moments (zeros where an owner had
/// none), the others with their own ranges.
#[test]
fn owned_weights_are_gathered_in_rounds_across_parameters() {
    use burn::backend::Autodiff;
    use burn::module::{Module, Param};
    #[derive(Module, Debug)]
    struct Three<B: Backend> {
        wide: Param<Tensor<B, 2>>,
        odd: Param<Tensor<B, 1>>,
        long: Param<Tensor<B, 1>>,
    }
    type AB = Autodiff<Flex>;
    let sizes = [("long", 11usize), ("odd", 5), ("wide", 15)];
    let value = |name: &str, j: usize| (name.len() * 100 + j) as f32;
    let devices = vec![Default::default(); 3];
    let body = |replica: Replica, device: &burn::tensor::Device<Flex>| -> Result<()> {
        let params: Vec<(String, usize)> = sizes.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let shard = OptimizerShard::new(&params, replica.rank(), replica.world());
        let mine = |name: &str, numel: usize| -> Vec<f32> {
            let range = shard.range(name, numel);
            (0..numel).map(|j| if range.contains(&j) { value(name, j) } else { -1.0 }).collect()
        };
        for bucket in [4, 2] {
            let model = Three::<AB> {
                wide: Param::from_data(TensorData::new(mine("wide", 15), [3, 5]), device),
                odd: Param::from_data(TensorData::new(mine("odd", 5), [5]), device),
                long: Param::from_data(TensorData::new(mine("long", 11), [11]), device),
            };
            let names: std::collections::HashMap<_, _> = [(model.wide.id, "wide"), (model.odd.id, "odd"), (model.long.id, "long")].into_iter().map(|(id, n)| (id, n.to_string())).collect();
            // Moments of its own ranges, but none for `odd` (as for a parameter without gradient).
            let mut optimizer = crate::train::adamw::AdamW::<Flex>::new(Default::default());
            optimizer.step = 1;
            for (name, numel) in [("wide", 15), ("long", 11)] {
                let range = shard.range(name, numel);
                let values = |scale: f32| Tensor::<Flex, 1>::from_data(TensorData::new(range.clone().map(|j| scale * value(name, j)).collect::<Vec<f32>>(), [range.len()]), device);
                if !range.is_empty() {
                    optimizer.moments.insert(name.to_string(), crate::train::adamw::Moments { exp_avg: values(1.0), exp_avg_sq: values(2.0) });
                }
            }
            optimizer.shard = Some(shard.clone());
            params::gather_owned_moments_by::<AB, _>(&replica, &model, &names, &mut optimizer, bucket)?;
            for (name, numel) in sizes {
                let (avg, sq) = match optimizer.moments.get(name) {
                    Some(m) => (m.exp_avg.clone().into_data().to_vec::<f32>().unwrap(), m.exp_avg_sq.clone().into_data().to_vec::<f32>().unwrap()),
                    None => (Vec::new(), Vec::new()),
                };
                let range = if replica.is_main() { 0..numel } else { shard.range(name, numel) };
                let want = |scale: f32| -> Vec<f32> { range.clone().map(|j| if name == "odd" { 0.0 } else { scale * value(name, j) }).collect() };
                let held = name != "odd" || replica.is_main();
                let expected = if held { (want(1.0), want(2.0)) } else { (Vec::new(), Vec::new()) };
                expect_eq((avg, sq), expected, format!("{name} moments on replica {}, bucket {bucket}", replica.rank()))?;
            }
            let model = params::gather_owned_weights_by::<AB, _>(&replica, model, &names, &shard, bucket)?;
            let got = [("wide", model.wide.val().into_data()), ("odd", model.odd.val().into_data()), ("long", model.long.val().into_data())];
            for (name, data) in got {
                let want: Vec<f32> = (0..data.num_elements()).map(|j| value(name, j)).collect();
                expect_eq(data.to_vec::<f32>().unwrap(), want, format!("{name} on replica {}, bucket {bucket}", replica.rank()))?;
            }
        }
        Ok(())
    };
    launch(&devices, None, "t", |r, d| body(r, d), |r, d| body(r, d)).unwrap();
}

/// A replica thread stopped by a device failure (a tensor too large for the device) ends the
/// run with that failure, named, not with an anonymous panic.
#[test]
fn a_device_failure_in_a_replica_thread_is_the_runs_error() {
    let devices = vec![Default::default(); 2];
    let main = |replica: Replica, _: &burn::tensor::Device<Flex>| -> Result<()> { replica.gather(json!(0)).map(|_| ()) };
    let other = |_: Replica, _: &burn::tensor::Device<Flex>| -> Result<()> {
        std::panic::panic_any(kiln_backends::device::DeviceError::TooLarge {
            device: "the test device".into(),
            what: "attention scores [1, 4, 4096, 4096] f32".into(),
            bytes: 1 << 28,
            limit: 1 << 27,
            hint: String::new(),
        })
    };
    let err = launch(&devices, None, "t", main, other).unwrap_err();
    assert!(matches!(err, Error::Device(_)), "{err:?}");
    assert!(err.to_string().contains("attention scores [1, 4, 4096, 4096] f32"), "{err}");
}

/// Runs `body` as node `n` of a group of `nnodes` on 127.0.0.1, one thread per node.
fn nodes<T: Send>(nnodes: usize, timeout_s: u64, fingerprints: &[&str], body: impl Fn(Arc<Group>) -> T + Sync) -> Vec<Result<T>> {
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..nnodes)
            .map(|n| {
                let (body, fingerprint) = (&body, fingerprints[n.min(fingerprints.len() - 1)]);
                s.spawn(move || Group::join(&spec(nnodes, n, port, timeout_s), fingerprint, 1, Arc::new(Abort::default())).map(body))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn three_nodes_gather_and_sum_on_loopback() {
    let results = nodes(3, 20, &["same"], |group| {
        let mut sums = Vec::new();
        for k in 0..5 {
            let mut data = vec![(group.node + k) as f32; 7];
            group.all_reduce_sum(&mut data).unwrap();
            sums.push(data[6]);
        }
        let all = group.gather(vec![json!(group.node)]).unwrap();
        group.close();
        (sums, all)
    });
    for result in results {
        let (sums, all) = result.unwrap();
        assert_eq!(sums, vec![3.0, 6.0, 9.0, 12.0, 15.0]);
        assert_eq!(all, vec![vec![json!(0)], vec![json!(1)], vec![json!(2)]]);
    }
}

#[test]
fn nodes_with_another_config_are_refused() {
    let results = nodes(2, 20, &["one", "two"], |_| ());
    for result in results {
        let err = result.expect_err("both nodes fail").to_string();
        assert!(err.contains("node 1 runs another configuration than node 0"), "{err}");
    }
}

#[test]
fn a_missing_node_is_an_error_within_the_timeout() {
    let port = free_port();
    let began = Instant::now();
    let err = Group::join(&spec(3, 0, port, 1), "f", 1, Arc::new(Abort::default())).err().unwrap().to_string();
    assert!(err.contains("node(s) 1, 2 did not join within 1s"), "{err}");
    let err = Group::join(&spec(2, 1, port, 1), "f", 1, Arc::new(Abort::default())).err().unwrap().to_string();
    assert!(err.contains(&format!("cannot reach node 0 at 127.0.0.1:{port} within 1s")), "{err}");
    assert!(began.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_master_port_in_use_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let err = Group::join(&spec(2, 0, port, 1), "f", 1, Arc::new(Abort::default())).err().unwrap().to_string();
    assert!(err.contains(&format!("port {port} of 127.0.0.1 is in use")), "{err}");
}

/// A node whose connections close without a goodbye (its process died) stops the others, named.
#[test]
fn a_lost_node_stops_the_others() {
    let results = nodes(3, 20, &["same"], |group| {
        if group.node == 2 {
            group.sever();
            return Ok(Value::Null);
        }
        let mut data = vec![1.0; 4];
        group.all_reduce_sum(&mut data)?;
        group.gather(vec![]).map(|_| Value::Null)
    });
    let dropped = results.into_iter().take(2).map(|r| r.unwrap().unwrap_err().to_string());
    for err in dropped {
        assert!(err.contains("node 2"), "{err}");
    }
}

/// Buckets take whole tensors while they fit in `BUCKET` values; a longer tensor goes alone.
#[test]
fn buckets_take_whole_tensors_up_to_the_limit() {
    use super::{BUCKET, buckets};
    assert!(buckets(&[]).is_empty());
    let one = buckets(&[3, 4, 5]);
    assert!(one.len() == 1 && one[0] == (0..3), "{one:?}");
    assert_eq!(buckets(&[BUCKET / 2, BUCKET / 2, 1]), [0..2, 2..3]);
    assert_eq!(buckets(&[1, 2 * BUCKET, 1]), [0..1, 1..2, 2..3]);
    assert_eq!(buckets(&[BUCKET, 0, 1]), [0..2, 2..3]);
}
