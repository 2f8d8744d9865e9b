//! The data-parallel flags of `kiln pretrain|sft|rl|opd`: devices of this process and, for
//! multi-node runs, torchrun's `--nnodes`, `--node-rank`, `--master-addr`.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use kiln::backends::DeviceSpec;
use kiln::dist::NodeSpec;

#[derive(Debug, Args)]
pub struct DistArgs {
    /// Data-parallel devices of this process, one replica each: `cpu,cpu`, `cuda:0,cuda:1`
    /// (overrides `[train] devices` and --backend).
    #[arg(long, value_delimiter = ',', value_parser = super::parse_backend)]
    devices: Vec<DeviceSpec>,
    /// Processes (nodes) of a multi-node run; start one per node with its --node-rank.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This process's rank, 0..nnodes; node 0 hosts the rendezvous and writes checkpoints.
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// HOST:PORT where node 0 listens (needed with --nnodes above 1).
    #[arg(long)]
    master_addr: Option<String>,
    /// Seconds nodes wait for each other to join, and for a silent node before it counts as lost.
    #[arg(long, default_value_t = 300.0)]
    dist_timeout: f64,
}

impl DistArgs {
    /// The devices: --devices, else --backend, else `[train] devices`, else the CPU.
    pub fn devices(&self, backend: Option<DeviceSpec>, config: Option<&[String]>) -> Result<Vec<DeviceSpec>> {
        if !self.devices.is_empty() {
            return Ok(self.devices.clone());
        }
        if let Some(backend) = backend {
            return Ok(vec![backend]);
        }
        match config {
            Some([]) => bail!("[train] devices is empty: name at least one device (e.g. [\"cpu\"])"),
            Some(names) => names
                .iter()
                .map(|name| name.parse::<DeviceSpec>().with_context(|| format!("[train] devices: {name:?}")))
                .collect(),
            None => Ok(vec![DeviceSpec::Cpu]),
        }
    }

    /// The multi-node run this process belongs to, if any.
    pub fn nodes(&self) -> Result<Option<NodeSpec>> {
        if !(self.dist_timeout > 0.0 && self.dist_timeout.is_finite()) {
            bail!("--dist-timeout must be a positive number of seconds");
        }
        match (self.nnodes, &self.master_addr) {
            (0, _) => bail!("--nnodes must be at least 1"),
            (1, _) if self.node_rank > 0 => bail!("--node-rank {} needs --nnodes above it", self.node_rank),
            (1, _) => Ok(None),
            (_, None) => bail!("--nnodes {} needs --master-addr HOST:PORT (where node 0 listens)", self.nnodes),
            (nnodes, Some(master)) => {
                if self.node_rank > 0 {
                    eprintln!("node {} of {nnodes}: progress, evaluation and checkpoints are shown and written by node 0", self.node_rank);
                }
                Ok(Some(NodeSpec {
                    nnodes,
                    node_rank: self.node_rank,
                    master: master.clone(),
                    timeout: Duration::from_secs_f64(self.dist_timeout),
                }))
            }
        }
    }
}
