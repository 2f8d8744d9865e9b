//! The data-parallel flags of `kiln pretrain|sft|rl|opd` and the evaluations: devices of this
//! process and, for multi-node runs, torchrun's `--nnodes`, `--node-rank`, `--master-addr`.
//! Without these flags, a process started by a cluster launcher finds its place in the
//! environment the launcher set ([`Launched`]): torchrun, Slurm's srun or Open MPI's mpirun, one
//! process per device.

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
    /// The devices: --devices, else --backend, else `[train] devices`, else the CPU; a process
    /// started by a launcher takes the device of that backend numbered by its local rank
    /// (`cuda:LOCAL_RANK`; `cpu` on the CPU).
    pub fn devices(&self, backend: Option<DeviceSpec>, config: Option<&[String]>) -> Result<Vec<DeviceSpec>> {
        if !self.devices.is_empty() {
            return Ok(self.devices.clone());
        }
        let chosen = self.chosen_devices(backend, config)?;
        match self.launched()? {
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

    /// The launcher's place for this process, when no kiln launch flag (--devices, --nnodes,
    /// --node-rank, --master-addr) is given and a launcher started more than one process.
    fn launched(&self) -> Result<Option<Launched>> {
        let flags = !self.devices.is_empty() || self.nnodes != 1 || self.node_rank != 0 || self.master_addr.is_some();
        if flags {
            return Ok(None);
        }
        Ok(Launched::from_env(|name| std::env::var(name).ok())?.filter(|l| l.world > 1))
    }

    /// The multi-node run this process belongs to, if any.
    pub fn nodes(&self) -> Result<Option<NodeSpec>> {
        if !(self.dist_timeout > 0.0 && self.dist_timeout.is_finite()) {
            bail!("--dist-timeout must be a positive number of seconds");
        }
        if let Some(launched) = self.launched()? {
            if launched.rank > 0 {
                eprintln!(
                    "process {} of {} ({}): progress, evaluation and checkpoints are shown and written by rank 0",
                    launched.rank, launched.world, launched.launcher
                );
            }
            return Ok(Some(NodeSpec {
                nnodes: launched.world,
                node_rank: launched.rank,
                master: launched.master,
                timeout: Duration::from_secs_f64(self.dist_timeout),
            }));
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

/// The rendezvous port when the launcher names none (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

/// Where a cluster launcher put this process: its rank among all processes of the run, how
/// many there are, its rank on this machine (its device) and where rank 0 listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launched {
    pub launcher: &'static str,
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    /// `HOST:PORT` of rank 0's rendezvous.
    pub master: String,
}

impl Launched {
    /// Reads, through `get`, the environment of torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, `MASTER_PORT`), else Slurm's srun (`SLURM_PROCID`, `SLURM_NTASKS`,
    /// `SLURM_LOCALID`, the first host of `SLURM_JOB_NODELIST`, `MASTER_PORT` or 29500), else
    /// Open MPI's (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, with `MASTER_ADDR` or
    /// 127.0.0.1). `None` when none of them started this process; an error naming the variable
    /// when one is malformed.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let number = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(text) => text.trim().parse::<usize>().map(Some).with_context(|| format!("environment variable {name}={text:?} is not a whole number")),
            }
        };
        let port = || -> Result<u16> {
            match get("MASTER_PORT") {
                None => Ok(DEFAULT_PORT),
                Some(text) => text.trim().parse::<u16>().with_context(|| format!("environment variable MASTER_PORT={text:?} is not a port")),
            }
        };
        let launched = if let (Some(rank), Some(world)) = (number("RANK")?, number("WORLD_SIZE")?) {
            let host = get("MASTER_ADDR").context("torchrun's RANK and WORLD_SIZE are set but MASTER_ADDR is not")?;
            let local_rank = number("LOCAL_RANK")?.unwrap_or(0);
            Self { launcher: "torchrun", rank, world, local_rank, master: format!("{host}:{}", port()?) }
        } else if let (Some(rank), Some(world)) = (number("SLURM_PROCID")?, number("SLURM_NTASKS")?) {
            let host = match get("MASTER_ADDR") {
                Some(host) => host,
                None => first_host(&get("SLURM_JOB_NODELIST").context("Slurm's SLURM_PROCID is set but SLURM_JOB_NODELIST is not")?)?,
            };
            let local_rank = number("SLURM_LOCALID")?.unwrap_or(0);
            Self { launcher: "slurm", rank, world, local_rank, master: format!("{host}:{}", port()?) }
        } else if let (Some(rank), Some(world)) = (number("OMPI_COMM_WORLD_RANK")?, number("OMPI_COMM_WORLD_SIZE")?) {
            let host = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
            let local_rank = number("OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
            Self { launcher: "mpirun", rank, world, local_rank, master: format!("{host}:{}", port()?) }
        } else {
            return Ok(None);
        };
        if launched.world == 0 || launched.rank >= launched.world {
            bail!("{}: rank {} is not below the world size {}", launched.launcher, launched.rank, launched.world);
        }
        Ok(Some(launched))
    }
}

/// The first host of a Slurm node list: `gpu[07-09,12],cpu1` → `gpu07`.
fn first_host(list: &str) -> Result<String> {
    let list = list.trim();
    let head = match (list.find(','), list.find('[')) {
        (Some(comma), Some(open)) if comma < open => &list[..comma],
        (Some(comma), None) => &list[..comma],
        _ => list,
    };
    let host = match head.split_once('[') {
        None => head.to_string(),
        Some((prefix, ranges)) => {
            let first = ranges.split([',', '-', ']']).next().unwrap_or_default();
            format!("{prefix}{first}")
        }
    };
    if host.is_empty() {
        bail!("SLURM_JOB_NODELIST={list:?} names no host");
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn each_launcher_is_read_from_its_environment() {
        let torchrun = [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3"), ("MASTER_ADDR", "node0"), ("MASTER_PORT", "1234"), ("SLURM_PROCID", "0")];
        assert_eq!(
            Launched::from_env(env(&torchrun)).unwrap(),
            Some(Launched { launcher: "torchrun", rank: 3, world: 8, local_rank: 3, master: "node0:1234".into() })
        );
        let slurm = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "16"), ("SLURM_LOCALID", "1"), ("SLURM_JOB_NODELIST", "gpu[07-09,12],cpu1")];
        assert_eq!(
            Launched::from_env(env(&slurm)).unwrap(),
            Some(Launched { launcher: "slurm", rank: 5, world: 16, local_rank: 1, master: "gpu07:29500".into() })
        );
        let mpi = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1")];
        assert_eq!(
            Launched::from_env(env(&mpi)).unwrap(),
            Some(Launched { launcher: "mpirun", rank: 1, world: 2, local_rank: 1, master: "127.0.0.1:29500".into() })
        );
        assert_eq!(Launched::from_env(env(&[])).unwrap(), None);
    }

    #[test]
    fn malformed_launcher_variables_are_named() {
        let err = Launched::from_env(env(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err().to_string();
        assert!(err.contains("RANK=\"x\""), "{err}");
        let err = Launched::from_env(env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err().to_string();
        assert!(err.contains("MASTER_ADDR is not"), "{err}");
        let err = Launched::from_env(env(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_NODELIST", "n1")])).unwrap_err().to_string();
        assert!(err.contains("rank 4 is not below the world size 4"), "{err}");
        assert_eq!(first_host("n1,n2").unwrap(), "n1");
        assert_eq!(first_host("a-b[001-004]").unwrap(), "a-b001");
    }
}
