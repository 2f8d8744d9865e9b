//! The data-parallel flags of `kiln pretrain|sft|rl|opd` and the evaluations: devices of this
//! process and, for multi-node runs, torchrun's `--nnodes`, `--node-rank`, `--master-addr`.
//! Without `--nnodes`, a process started by a cluster launcher (torchrun, Slurm's srun, Open
//! MPI's mpirun) finds its place in the launcher's environment ([`Launched`], one kiln node per
//! launched process, the device numbered by its local rank); `--node-rank`, `--master-addr` and
//! `--devices` still win over the values they name.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use kiln::backends::DeviceSpec;
use kiln::dist::{Collective, Launched, NodeSpec};

#[derive(Debug, Args)]
pub struct DistArgs {
    /// Data-parallel devices of this process, one replica each: `cpu,cpu`, `cuda:0,cuda:1`
    /// (overrides `[train] devices` and --backend).
    #[arg(long, value_delimiter = ',', value_parser = super::parse_backend)]
    devices: Vec<DeviceSpec>,
    /// Processes (nodes) of a multi-node run; start one per node with its --node-rank [default:
    /// 1, or the launcher's: torchrun's WORLD_SIZE, srun's SLURM_NTASKS, mpirun's
    /// OMPI_COMM_WORLD_SIZE; given, the launcher's environment is not read].
    #[arg(long)]
    nnodes: Option<usize>,
    /// This process's rank, 0..nnodes; node 0 hosts the rendezvous and writes checkpoints
    /// [default: 0, or the launcher's RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK].
    #[arg(long)]
    node_rank: Option<usize>,
    /// HOST:PORT where node 0 listens (needed with --nnodes above 1) [default: the launcher's
    /// MASTER_ADDR:MASTER_PORT, or Slurm's first host].
    #[arg(long)]
    master_addr: Option<String>,
    /// Seconds nodes wait for each other to join, and for a silent node before it counts as lost.
    #[arg(long, default_value_t = 300.0)]
    dist_timeout: f64,
    /// What sums the replicas' gradients: `auto` is NCCL on CUDA devices (libnccl found at run
    /// time; KILN_NCCL_LIB names the file) and kiln's TCP ring elsewhere; `nccl` also for a
    /// single device (a one-rank communicator); `ring` is kiln's TCP ring on every backend.
    #[arg(long, value_enum, default_value_t = CollectiveArg::Auto)]
    collective: CollectiveArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CollectiveArg {
    Auto,
    Nccl,
    Ring,
}

impl DistArgs {
    /// The devices: --devices, else --backend, else `[train] devices`, else the CPU; a process
    /// started by a launcher takes the device of that backend numbered by its local rank
    /// (`cuda:LOCAL_RANK`; `cpu` on the CPU).
    pub fn devices(&self, backend: Option<DeviceSpec>, config: Option<&[String]>) -> Result<Vec<DeviceSpec>> {
        let launched = self.launched()?;
        if !self.devices.is_empty() {
            if let Some(launched) = launched.as_ref().filter(|l| self.devices.len() > 1 && l.local_world.is_some_and(|n| n > 1)) {
                bail!(
                    "{} started {} processes on this machine and --devices names {} devices for each: drive several devices from one process per machine (torchrun --nproc-per-node 1, srun --ntasks-per-node 1, mpirun --npernode 1), or drop --devices (one device per process, by local rank)",
                    launched.launcher.name(),
                    launched.local_world.unwrap_or_default(),
                    self.devices.len()
                );
            }
            return Ok(self.devices.clone());
        }
        let chosen = self.chosen_devices(backend, config)?;
        match launched {
            Some(launched) => Ok(vec![match chosen[0] {
                DeviceSpec::Cpu => DeviceSpec::Cpu,
                DeviceSpec::Wgpu(_) => DeviceSpec::Wgpu(launched.local_rank),
                // A launcher that shows each process one GPU (Slurm's --gpus-per-task 1).
                DeviceSpec::Cuda(_) if std::env::var("CUDA_VISIBLE_DEVICES").is_ok_and(|v| !v.is_empty() && !v.contains(',')) => DeviceSpec::Cuda(0),
                DeviceSpec::Cuda(_) => DeviceSpec::Cuda(launched.local_rank),
            }]),
            None => Ok(chosen),
        }
    }

    fn chosen_devices(&self, backend: Option<DeviceSpec>, config: Option<&[String]>) -> Result<Vec<DeviceSpec>> {
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

    /// The launcher's place for this process: read when --nnodes is not given and a launcher
    /// started more than one process.
    fn launched(&self) -> Result<Option<Launched>> {
        if self.nnodes.is_some() {
            return Ok(None);
        }
        Ok(Launched::from_env(|name| std::env::var(name).ok())?.filter(|l| l.world > 1))
    }

    /// The multi-node run this process belongs to, if any; says on stderr where its place came
    /// from.
    /// Sets the process's collective (`--collective`) too: every command that reads its place
    /// calls this first.
    pub fn nodes(&self) -> Result<Option<NodeSpec>> {
        kiln::dist::set_collective(match self.collective {
            CollectiveArg::Auto => Collective::Auto,
            CollectiveArg::Nccl => Collective::Nccl,
            CollectiveArg::Ring => Collective::Ring,
        });
        // (Bounded: deadlines are the time now plus it.)
        if !(self.dist_timeout > 0.0 && self.dist_timeout <= 1e9) {
            bail!("--dist-timeout must be a positive number of seconds, at most 1e9 (got {})", self.dist_timeout);
        }
        let timeout = Duration::from_secs_f64(self.dist_timeout);
        let spec = if let Some(launched) = self.launched()? {
            let node_rank = match self.node_rank {
                Some(rank) if rank >= launched.world => bail!("--node-rank {rank} must be below the {} processes {} started", launched.world, launched.launcher.name()),
                Some(rank) => rank,
                None => launched.rank,
            };
            // The flags win over the values they name; the line says which.
            let mut shown = launched.clone();
            shown.rank = node_rank;
            if let Some(flag) = &self.master_addr {
                (shown.master, shown.master_from) = (flag.clone(), "--master-addr".into());
            }
            let mut line = shown.describe();
            if self.node_rank.is_some() {
                line += &format!(", rank from --node-rank instead of the environment's {}", launched.rank);
            }
            let master = shown.master;
            announce(&line, node_rank);
            NodeSpec { nnodes: launched.world, node_rank, master, timeout }
        } else {
            let (nnodes, node_rank) = (self.nnodes.unwrap_or(1), self.node_rank.unwrap_or(0));
            match (nnodes, &self.master_addr) {
                (0, _) => bail!("--nnodes must be at least 1"),
                (1, _) if node_rank > 0 => bail!("--node-rank {node_rank} needs --nnodes above it"),
                // (Node 0 would run the whole job alone while the others wait for it.)
                (1, Some(master)) => bail!("--master-addr {master} needs --nnodes above 1 (the number of nodes of the run)"),
                (1, None) => return Ok(None),
                (_, None) => bail!("--nnodes {nnodes} needs --master-addr HOST:PORT (where node 0 listens)"),
                (_, Some(master)) => {
                    announce(&format!("rank {node_rank} of {nnodes} from --nnodes and --node-rank (master {master} from --master-addr)"), node_rank);
                    NodeSpec { nnodes, node_rank, master: master.clone(), timeout }
                }
            }
        };
        Ok(Some(spec))
    }
}

/// The one line saying where this process's place in the run came from.
fn announce(line: &str, node_rank: usize) {
    let note = if node_rank > 0 { "; rank 0 shows progress, evaluates and writes checkpoints" } else { "" };
    eprintln!("kiln: {line}{note}");
}
