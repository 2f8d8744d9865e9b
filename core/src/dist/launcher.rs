//! Where a cluster launcher put this process: torchrun (and `torch.distributed.launch
//! --use-env`), Slurm's srun and Open MPI's mpirun each start one process per device and tell it
//! its rank, the number of processes and where rank 0 is in environment variables.
//! [`Launched::from_env`] reads them; the CLI turns the result into a [`super::NodeSpec`]
//! (each launched process is one kiln node) unless kiln's own flags say otherwise.
//!
//! Several kiln processes on one machine are fine: only rank 0 binds the master port, every
//! other listener takes a free port. So the launchers' default of one process per device is the
//! supported form (the device is the one numbered by the local rank); one process per machine
//! driving several devices (`--nproc-per-node 1` and `--devices`) works too.
//!
//! | launcher | rank | processes | local rank | processes on this machine | machine | master |
//! |---|---|---|---|---|---|---|
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` | `GROUP_RANK` | `MASTER_ADDR:MASTER_PORT` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` | – | `MASTER_ADDR:MASTER_PORT`; 127.0.0.1 when all processes are on one machine |
//! | Slurm (srun) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `SLURM_STEP_TASKS_PER_NODE` at `SLURM_NODEID` | `SLURM_NODEID` of `SLURM_STEP_NUM_NODES` (else `SLURM_NNODES`) | `MASTER_ADDR`, else the first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`); port `MASTER_PORT` |
//!
//! The port is [`DEFAULT_PORT`] when `MASTER_PORT` is unset. Under a torchrun whose workers share
//! its agent's TCPStore (`TORCHELASTIC_USE_AGENT_STORE=True`), rank 0's
//! agent already listens on `MASTER_PORT`, so kiln's rendezvous uses `MASTER_PORT + 1`. The first launcher whose variables
//! are present wins, in the table's order (torchrun started inside an srun step, or mpirun
//! inside a Slurm job, sees both). Slurm counts only inside an srun step (`SLURM_STEP_ID` set):
//! a job's batch script or salloc shell also has `SLURM_PROCID=0` and `SLURM_NTASKS`, but it is
//! one process. Empty variables count as unset.

use crate::error::{Error, Result};

/// The rendezvous port when the launcher names none (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

/// The launchers whose environment kiln reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Slurm,
}

impl Launcher {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Torchrun => "torchrun",
            Self::OpenMpi => "Open MPI",
            Self::Slurm => "Slurm",
        }
    }
}

/// This process's place in a launched run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launched {
    pub launcher: Launcher,
    /// Rank among all processes, `0..world`.
    pub rank: usize,
    /// Processes in the run.
    pub world: usize,
    /// Rank among the processes of this machine: the device this process takes.
    pub local_rank: usize,
    /// Processes on this machine, when the launcher says.
    pub local_world: Option<usize>,
    /// This machine's index and the number of machines, when the launcher says.
    pub machine: Option<(usize, Option<usize>)>,
    /// `HOST:PORT` where rank 0 listens.
    pub master: String,
    /// Which variables gave the master address, for the message naming it.
    pub master_from: String,
}

impl Launched {
    /// Reads the launchers' variables through `get` (`std::env::var(name).ok()`). `None` when no
    /// launcher started this process; an error naming the variables when a launcher's set is
    /// incomplete (`RANK` without `WORLD_SIZE`), malformed or inconsistent.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let filtered = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let env = Env(&filtered);
        let launched = if env.any(&["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"]) {
            env.require(Launcher::Torchrun, &["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"])?;
            let (world, local_world) = (env.need("WORLD_SIZE")?, env.number("LOCAL_WORLD_SIZE")?);
            // Recent torchrun (its workers share the agent's TCPStore) has rank 0's agent listen
            // on MASTER_PORT itself: kiln's rendezvous takes the port after it.
            let agent_store = env.text("TORCHELASTIC_USE_AGENT_STORE") == "True";
            let port = match agent_store {
                true => env.port()?.checked_add(1).ok_or_else(|| Error::InvalidInput("MASTER_PORT=65535 leaves no port after torchrun's store".into()))?,
                false => env.port()?,
            };
            Self {
                launcher: Launcher::Torchrun,
                rank: env.need("RANK")?,
                world,
                local_rank: env.need("LOCAL_RANK")?,
                local_world,
                // Machines of equal size (torchrun's --nproc-per-node).
                machine: env.number("GROUP_RANK")?.map(|g| (g, local_world.filter(|&l| l > 0).map(|l| world / l))),
                master: format!("{}:{}", env.text("MASTER_ADDR"), port),
                master_from: if agent_store {
                    format!("MASTER_ADDR and MASTER_PORT+1 (torchrun's agent serves MASTER_PORT={}: TORCHELASTIC_USE_AGENT_STORE=True)", env.text("MASTER_PORT"))
                } else {
                    env.port_source("MASTER_ADDR")
                },
            }
        } else if env.any(&["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"]) {
            env.require(Launcher::OpenMpi, &["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"])?;
            let (world, local_world) = (env.need("OMPI_COMM_WORLD_SIZE")?, env.number("OMPI_COMM_WORLD_LOCAL_SIZE")?);
            let (host, master_from) = if env.is_set("MASTER_ADDR") {
                (env.text("MASTER_ADDR"), env.port_source("MASTER_ADDR"))
            } else if local_world == Some(world) {
                ("127.0.0.1".to_string(), format!("127.0.0.1: all {world} processes are on this machine (OMPI_COMM_WORLD_LOCAL_SIZE){}", env.port_note()))
            } else {
                let spread = local_world.map_or("OMPI_COMM_WORLD_LOCAL_SIZE is unset".to_string(), |l| format!("OMPI_COMM_WORLD_LOCAL_SIZE={l} of OMPI_COMM_WORLD_SIZE={world}"));
                return Err(Error::InvalidInput(format!(
                    "Open MPI's environment names no master: export MASTER_ADDR (rank 0's host; mpirun -x MASTER_ADDR=HOST) since the processes may span machines ({spread})"
                )));
            };
            Self {
                launcher: Launcher::OpenMpi,
                rank: env.need("OMPI_COMM_WORLD_RANK")?,
                world,
                local_rank: env.need("OMPI_COMM_WORLD_LOCAL_RANK")?,
                local_world,
                machine: None,
                master: format!("{host}:{}", env.port()?),
                master_from,
            }
        } else if env.is_set("SLURM_STEP_ID") {
            env.require(Launcher::Slurm, &["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"])?;
            let (host, master_from) = if env.is_set("MASTER_ADDR") {
                (env.text("MASTER_ADDR"), env.port_source("MASTER_ADDR"))
            } else {
                let variable = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"].into_iter().find(|v| env.is_set(v)).ok_or_else(|| {
                    Error::InvalidInput("Slurm's environment is incomplete: SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and MASTER_ADDR are all unset (set MASTER_ADDR to rank 0's host)".into())
                })?;
                let hosts = expand_nodelist(&env.text(variable)).map_err(|e| Error::InvalidInput(format!("{variable}: {e}")))?;
                (hosts[0].clone(), format!("{variable}'s first host{}", env.port_note()))
            };
            Self {
                launcher: Launcher::Slurm,
                rank: env.need("SLURM_PROCID")?,
                world: env.need("SLURM_NTASKS")?,
                local_rank: env.need("SLURM_LOCALID")?,
                local_world: slurm_step_tasks_here(&env)?,
                machine: env
                    .number("SLURM_NODEID")?
                    .map(|n| Ok::<_, Error>((n, env.number("SLURM_STEP_NUM_NODES")?.or(env.number("SLURM_NNODES")?))))
                    .transpose()?,
                master: format!("{host}:{}", env.port()?),
                master_from,
            }
        } else {
            return Ok(None);
        };
        launched.check()?;
        Ok(Some(launched))
    }

    /// One line saying where this process's place came from.
    pub fn describe(&self) -> String {
        let mut place = format!("local rank {}", self.local_rank);
        if let Some(local) = self.local_world {
            place += &format!(" of {local}");
        }
        if let Some((machine, machines)) = self.machine {
            place += &format!(", machine {machine}");
            if let Some(machines) = machines {
                place += &format!(" of {machines}");
            }
        }
        format!("rank {} of {} from {}'s environment ({place}; master {} from {})", self.rank, self.world, self.launcher.name(), self.master, self.master_from)
    }

    fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidInput(format!("{}'s environment: {why}", self.launcher.name())));
        if self.world == 0 || self.rank >= self.world {
            return bad(format!("rank {} is not below the number of processes {}", self.rank, self.world));
        }
        if let Some(local) = self.local_world {
            if self.local_rank >= local {
                return bad(format!("local rank {} is not below the processes on this machine {local}", self.local_rank));
            }
            if local > self.world {
                return bad(format!("{local} processes on this machine but {} in all", self.world));
            }
        }
        if let Some((machine, Some(machines))) = self.machine
            && machine >= machines
        {
            return bad(format!("machine {machine} is not below the number of machines {machines}"));
        }
        Ok(())
    }
}

/// The environment, empty values dropped.
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn is_set(&self, name: &str) -> bool {
        (self.0)(name).is_some()
    }

    fn any(&self, names: &[&str]) -> bool {
        names.iter().any(|n| self.is_set(n))
    }

    fn text(&self, name: &str) -> String {
        (self.0)(name).unwrap_or_default().trim().to_string()
    }

    /// One error naming every variable of `names` that is unset, and those that are set.
    fn require(&self, launcher: Launcher, names: &[&str]) -> Result<()> {
        let (set, unset): (Vec<&str>, Vec<&str>) = names.iter().partition(|n| self.is_set(n));
        if unset.is_empty() {
            return Ok(());
        }
        let set = if set.is_empty() { String::new() } else { format!("{} set but ", set.join(", ")) };
        Err(Error::InvalidInput(format!(
            "{}'s environment is incomplete: {set}{} unset (a launched process needs all of {}; without a launcher use --nnodes, --node-rank and --master-addr)",
            launcher.name(),
            unset.join(", "),
            names.join(", ")
        )))
    }

    fn number(&self, name: &str) -> Result<Option<usize>> {
        match (self.0)(name) {
            None => Ok(None),
            Some(text) => text.trim().parse().map(Some).map_err(|_| Error::InvalidInput(format!("environment variable {name}={text:?} is not a whole number"))),
        }
    }

    fn need(&self, name: &str) -> Result<usize> {
        self.number(name)?.ok_or_else(|| Error::InvalidInput(format!("environment variable {name} is unset")))
    }

    fn port(&self) -> Result<u16> {
        match (self.0)("MASTER_PORT") {
            None => Ok(DEFAULT_PORT),
            Some(text) => text.trim().parse().map_err(|_| Error::InvalidInput(format!("environment variable MASTER_PORT={text:?} is not a port"))),
        }
    }

    fn port_note(&self) -> String {
        if self.is_set("MASTER_PORT") { " and MASTER_PORT".into() } else { format!(", port {DEFAULT_PORT} (MASTER_PORT unset)") }
    }

    fn port_source(&self, host: &str) -> String {
        format!("{host}{}", self.port_note())
    }
}

/// The tasks of this srun step on this node: `SLURM_STEP_TASKS_PER_NODE` (`2(x3),1`: two tasks
/// on each of the first three nodes, one on the fourth) at `SLURM_NODEID`. `None` without them:
/// `SLURM_NTASKS_PER_NODE` is what the job asked for (`--ntasks-per-node`), which a step started
/// inside it with fewer tasks inherits, so it is not read.
fn slurm_step_tasks_here(env: &Env<'_>) -> Result<Option<usize>> {
    let (Some(node), true) = (env.number("SLURM_NODEID")?, env.is_set("SLURM_STEP_TASKS_PER_NODE")) else { return Ok(None) };
    let text = env.text("SLURM_STEP_TASKS_PER_NODE");
    let bad = || Error::InvalidInput(format!("environment variable SLURM_STEP_TASKS_PER_NODE={text:?} is not a list like 2(x3),1"));
    let mut first = 0usize;
    for item in text.split(',') {
        let (count, repeat) = match item.trim().split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')').ok_or_else(bad)?),
            None => (item.trim(), "1"),
        };
        let (count, repeat): (usize, usize) = (count.parse().map_err(|_| bad())?, repeat.parse().map_err(|_| bad())?);
        if node < first.saturating_add(repeat) {
            return Ok(Some(count));
        }
        first = first.saturating_add(repeat);
    }
    Err(Error::InvalidInput(format!("Slurm's environment: SLURM_NODEID={node} is past the {first} nodes of SLURM_STEP_TASKS_PER_NODE={text:?}")))
}

/// The hosts of a Slurm node list, in order: `node[01-03,07]` → node01, node02, node03, node07;
/// `a1,b[2-3]` → a1, b2, b3; `rack[1-2]-n[1-2]` → rack1-n1, rack1-n2, rack2-n1, rack2-n2. A
/// range keeps its first number's zero padding.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::InvalidInput(format!("node list {list:?}: {why}"));
    let mut hosts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    let mut items = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or_else(|| bad("']' without '['"))?,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad("'[' without ']'"));
    }
    items.push(&list[start..]);
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            return Err(bad("an empty host name"));
        }
        expand_item(item, &mut hosts).map_err(|why| bad(&why))?;
    }
    Ok(hosts)
}

/// Appends the hosts of one host expression (no top-level comma).
fn expand_item(item: &str, hosts: &mut Vec<String>) -> std::result::Result<(), String> {
    let Some(open) = item.find('[') else {
        if item.contains(']') {
            return Err("']' without '['".into());
        }
        hosts.push(item.to_string());
        return Ok(());
    };
    let close = open + item[open..].find(']').ok_or("'[' without ']'")?;
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    if ranges.contains('[') {
        return Err("nested '['".into());
    }
    let mut tails = Vec::new();
    expand_item_or_empty(rest, &mut tails)?;
    for range in ranges.split(',') {
        let range = range.trim();
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let parse = |s: &str| s.parse::<u64>().map_err(|_| format!("{range:?} is not a number or a range of numbers"));
        let (low, high) = (parse(lo)?, parse(hi)?);
        if low > high {
            return Err(format!("range {range:?} runs backwards"));
        }
        for n in low..=high {
            for tail in &tails {
                hosts.push(format!("{prefix}{n:0width$}{tail}", width = lo.len()));
            }
        }
    }
    Ok(())
}

fn expand_item_or_empty(rest: &str, hosts: &mut Vec<String>) -> std::result::Result<(), String> {
    if rest.is_empty() {
        hosts.push(String::new());
        Ok(())
    } else {
        expand_item(rest, hosts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'static {
        let map: std::collections::HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    fn launched(pairs: &[(&str, &str)]) -> Launched {
        Launched::from_env(env(pairs)).unwrap().expect("a launcher's environment")
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        Launched::from_env(env(pairs)).unwrap_err().to_string()
    }

    #[test]
    fn torchrun_two_machines_of_four() {
        let got = launched(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
            // torchrun started inside an srun step: torchrun's variables win.
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_NODELIST", "other[1-2]"),
        ]);
        assert_eq!(
            got,
            Launched {
                launcher: Launcher::Torchrun,
                rank: 5,
                world: 8,
                local_rank: 1,
                local_world: Some(4),
                machine: Some((1, Some(2))),
                master: "node0:1234".into(),
                master_from: "MASTER_ADDR and MASTER_PORT".into(),
            }
        );
        assert_eq!(got.describe(), "rank 5 of 8 from torchrun's environment (local rank 1 of 4, machine 1 of 2; master node0:1234 from MASTER_ADDR and MASTER_PORT)");
        let shared = launched(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1234"), ("TORCHELASTIC_USE_AGENT_STORE", "True")]);
        assert_eq!(shared.master, "h:1235");
        assert!(shared.master_from.contains("torchrun's agent serves MASTER_PORT=1234"), "{}", shared.master_from);
        let not_shared = launched(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1234"), ("TORCHELASTIC_USE_AGENT_STORE", "False")]);
        assert_eq!(not_shared.master, "h:1234");
        // Port 65535 is only short of a next port under the agent's store.
        let last = launched(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "65535")]);
        assert_eq!(last.master, "h:65535");
    }

    #[test]
    fn slurm_master_is_the_first_host_of_the_step() {
        let base = [("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "5"), ("SLURM_NTASKS", "16"), ("SLURM_LOCALID", "1"), ("SLURM_NODEID", "1"), ("SLURM_NNODES", "2"), ("SLURM_STEP_TASKS_PER_NODE", "8(x2)")];
        let mut pairs = base.to_vec();
        pairs.push(("SLURM_JOB_NODELIST", "gpu[07-09,12],cpu1"));
        let got = launched(&pairs);
        assert_eq!(
            (got.launcher, got.rank, got.world, got.local_rank, got.local_world, got.machine),
            (Launcher::Slurm, 5, 16, 1, Some(8), Some((1, Some(2))))
        );
        assert_eq!((got.master.as_str(), got.master_from.as_str()), ("gpu07:29500", "SLURM_JOB_NODELIST's first host, port 29500 (MASTER_PORT unset)"));
        // The step's own list (srun on part of the job) comes first, MASTER_ADDR/PORT before both.
        pairs.push(("SLURM_STEP_NODELIST", "gpu[09,12]"));
        assert_eq!(launched(&pairs).master, "gpu09:29500");
        pairs.extend([("MASTER_ADDR", "10.0.0.9"), ("MASTER_PORT", "4000")]);
        assert_eq!(launched(&pairs).master, "10.0.0.9:4000");
        // The step's tasks per node, not the job's request (`--ntasks-per-node 4` inherited by an
        // `srun -n 2` step); uneven steps read their node's count.
        let step = [("SLURM_STEP_ID", "1"), ("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "1"), ("SLURM_NODEID", "0"), ("SLURM_NNODES", "3"), ("MASTER_ADDR", "h")];
        let with = |extra: &[(&'static str, &'static str)]| [&step[..], extra].concat();
        let got = launched(&with(&[("SLURM_NTASKS_PER_NODE", "4"), ("SLURM_STEP_TASKS_PER_NODE", "2"), ("SLURM_STEP_NUM_NODES", "1")]));
        assert_eq!((got.local_world, got.machine), (Some(2), Some((0, Some(1)))));
        assert_eq!(launched(&with(&[("SLURM_NTASKS_PER_NODE", "4")])).local_world, None);
        let uneven = [("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "6"), ("SLURM_NTASKS", "7"), ("SLURM_LOCALID", "0"), ("SLURM_NODEID", "3"), ("SLURM_STEP_TASKS_PER_NODE", "2(x3),1"), ("MASTER_ADDR", "h")];
        assert_eq!(launched(&uneven).local_world, Some(1));
        let err = error(&[&uneven[..6], &[("SLURM_STEP_TASKS_PER_NODE", "2(x3")], &uneven[6..]].concat());
        assert!(err.contains("SLURM_STEP_TASKS_PER_NODE=\"2(x3\" is not a list like 2(x3),1"), "{err}");
        // A batch script's shell has SLURM_PROCID and SLURM_NTASKS but is no srun task.
        assert_eq!(Launched::from_env(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_NODELIST", "n[1-2]")])).unwrap(), None);
        let err = error(&[("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")]);
        assert!(err.contains("SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and MASTER_ADDR are all unset"), "{err}");
        let err = error(&[("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_NODELIST", "n[2-1]")]);
        assert!(err.contains("SLURM_JOB_NODELIST: node list \"n[2-1]\": range \"2-1\" runs backwards"), "{err}");
    }

    #[test]
    fn open_mpi_needs_master_addr_across_machines() {
        let one_machine = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")];
        let got = launched(&one_machine);
        assert_eq!((got.launcher, got.rank, got.world, got.local_rank, got.local_world), (Launcher::OpenMpi, 1, 2, 1, Some(2)));
        assert_eq!(got.master, "127.0.0.1:29500");
        let spread = [("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")];
        let err = error(&spread);
        assert!(err.contains("export MASTER_ADDR") && err.contains("OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4"), "{err}");
        let mut exported = spread.to_vec();
        exported.extend([("MASTER_ADDR", "head"), ("MASTER_PORT", "6000")]);
        assert_eq!(launched(&exported).master, "head:6000");
        // mpirun inside a Slurm job's srun step: Open MPI's variables win.
        exported.extend([("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_LOCALID", "0")]);
        assert_eq!(launched(&exported).rank, 3);
    }

    #[test]
    fn a_half_set_environment_names_the_missing_variables() {
        let err = error(&[("RANK", "1"), ("MASTER_ADDR", "h")]);
        assert_eq!(
            err,
            "torchrun's environment is incomplete: RANK, MASTER_ADDR set but WORLD_SIZE, LOCAL_RANK unset (a launched process needs all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR; without a launcher use --nnodes, --node-rank and --master-addr)"
        );
        assert!(error(&[("WORLD_SIZE", "2")]).contains("WORLD_SIZE set but RANK, LOCAL_RANK, MASTER_ADDR unset"));
        assert!(error(&[("OMPI_COMM_WORLD_SIZE", "2")]).starts_with("Open MPI's environment is incomplete: OMPI_COMM_WORLD_SIZE set but OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK unset"));
        assert!(error(&[("SLURM_STEP_ID", "3"), ("SLURM_NTASKS", "2")]).starts_with("Slurm's environment is incomplete: SLURM_NTASKS set but SLURM_PROCID, SLURM_LOCALID unset"));
        // Empty counts as unset; none at all is no launcher.
        assert!(error(&[("RANK", "0"), ("WORLD_SIZE", ""), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "h")]).contains("but WORLD_SIZE unset"));
        assert_eq!(Launched::from_env(env(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "1")])).unwrap(), None);
    }

    #[test]
    fn malformed_or_inconsistent_values_are_named() {
        let torchrun = |rank: &str, world: &str, local: &str, local_world: &str, port: &str| {
            error(&[("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", local), ("LOCAL_WORLD_SIZE", local_world), ("MASTER_ADDR", "h"), ("MASTER_PORT", port)])
        };
        assert_eq!(torchrun("x", "2", "0", "2", "1"), "environment variable RANK=\"x\" is not a whole number");
        assert_eq!(torchrun("0", "2", "0", "2", "70000"), "environment variable MASTER_PORT=\"70000\" is not a port");
        assert_eq!(torchrun("2", "2", "0", "2", "1"), "torchrun's environment: rank 2 is not below the number of processes 2");
        assert_eq!(torchrun("1", "2", "2", "2", "1"), "torchrun's environment: local rank 2 is not below the processes on this machine 2");
        assert_eq!(torchrun("1", "2", "1", "4", "1"), "torchrun's environment: 4 processes on this machine but 2 in all");
    }

    #[test]
    fn node_lists_expand() {
        let hosts = |list: &str| expand_nodelist(list).unwrap();
        assert_eq!(hosts("node[01-03,07]"), ["node01", "node02", "node03", "node07"]);
        assert_eq!(hosts("a1,b[2-3]"), ["a1", "b2", "b3"]);
        assert_eq!(hosts("host"), ["host"]);
        assert_eq!(hosts("gpu[8-10],cpu1"), ["gpu8", "gpu9", "gpu10", "cpu1"]);
        assert_eq!(hosts("a-b[001-002]"), ["a-b001", "a-b002"]);
        assert_eq!(hosts("rack[1-2]-n[1-2]"), ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]);
        assert_eq!(hosts("127.0.0.1"), ["127.0.0.1"]);
        for (list, why) in [("", "an empty host name"), ("a,,b", "an empty host name"), ("n[1-2", "'[' without ']'"), ("n1]", "']' without '['"), ("n[a-b]", "\"a-b\" is not a number"), ("n[1-[2]]", "nested '['")] {
            let err = expand_nodelist(list).unwrap_err().to_string();
            assert!(err.contains(why), "{list:?}: {err}");
        }
    }
}
