//! Rank discovery: which rank of how large a world this process is, from the variables its
//! launcher set.
//!
//! Users start one process per GPU with torchrun (or any launcher that sets torchrun's
//! variables), `mpirun` (OpenMPI) or `srun` (slurm). [`LaunchInfo::from_env`] reads the first of
//! these it finds, in that order, and checks the values; [`LaunchInfo::topology`] turns the result
//! into the `nodes x ranks per node` [`Topology`], and [`crate::bootstrap`] connects the ranks.
//!
//! | | torchrun | OpenMPI | slurm |
//! |---|---|---|---|
//! | rank | `RANK` | `OMPI_COMM_WORLD_RANK` | `SLURM_PROCID` |
//! | world size | `WORLD_SIZE` | `OMPI_COMM_WORLD_SIZE` | `SLURM_NTASKS` |
//! | local rank | `LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_RANK` | `SLURM_LOCALID` |
//! | ranks on this node | `LOCAL_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_SIZE` | `SLURM_STEP_TASKS_PER_NODE`, `SLURM_NTASKS_PER_NODE`, `SLURM_TASKS_PER_NODE` |
//!
//! Rank 0's address comes from `MASTER_ADDR` and `MASTER_PORT` under every launcher (torchrun
//! sets them; scripts export them for `mpirun -x` and `srun`).

use std::fmt;

use crate::{Result, Topology};

/// The program that started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun, or anything else that sets `RANK` / `WORLD_SIZE` / `LOCAL_RANK`.
    Torchrun,
    /// OpenMPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// slurm's `srun` (`SLURM_PROCID`, ...).
    Slurm,
}

impl Launcher {
    /// The launcher's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "mpirun",
            Launcher::Slurm => "slurm",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What is wrong with a launch: a launcher variable (named, with its value) or the configuration
/// against the launch. Every message is one line that names the variable or key to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    // ---- the variables ----
    /// A variable that must be a number is not.
    #[error("{name}={value:?} is not a number")]
    NotANumber {
        name: &'static str,
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
    /// `because` is set but `name`, which that launcher sets with it, is not.
    #[error("{because} is set but {name} is not: the launcher must set both")]
    Missing {
        name: &'static str,
        because: &'static str,
    },
    /// `SLURM_PROCID` without `SLURM_NTASKS`: not a task of an `srun` step.
    #[error(
        "SLURM_PROCID is set but SLURM_NTASKS is not: start the trainer with srun, one task per GPU"
    )]
    NotAnSrunTask,
    /// `MASTER_ADDR` set to nothing.
    #[error("MASTER_ADDR is set but empty")]
    EmptyMasterAddr,
    /// `MASTER_PORT` that is not a port number.
    #[error("MASTER_PORT={value:?} is not a port number (1-65535)")]
    BadPort { value: String },
    /// A slurm tasks-per-node list that does not parse.
    #[error("{name}={value:?} is not a task count list like \"4\", \"4(x2)\" or \"4(x2),3\"")]
    BadTaskList { name: &'static str, value: String },

    // ---- the values against each other ----
    /// A world size of 0.
    #[error("{name}=0: the world needs at least 1 rank")]
    EmptyWorld { name: &'static str },
    /// A node size of 0.
    #[error("{name}=0: a node needs at least 1 rank")]
    EmptyNode { name: &'static str },
    /// `name` = `value` is not below `limit_name` = `limit` (a rank, a local rank).
    #[error("{name}={value} is not below {limit_name}={limit}")]
    NotBelow {
        name: &'static str,
        value: usize,
        limit_name: &'static str,
        limit: usize,
    },
    /// More ranks on a node than in the world.
    #[error("{name}={value} is larger than {world_name}={world}")]
    NodeLargerThanWorld {
        name: &'static str,
        value: usize,
        world_name: &'static str,
        world: usize,
    },
    /// A node count the world's ranks cannot fill.
    #[error("{name}={nodes}: {world} ranks cannot run on {nodes} nodes")]
    BadNodeCount {
        name: &'static str,
        nodes: usize,
        world: usize,
    },

    // ---- the launch against the topology and the configuration ----
    /// Ranks not placed in blocks of `per_node` (rank = host x ranks per host + local rank).
    #[error(
        "rank {rank} is local rank {local_rank} on its node, but with {per_node} ranks per node \
         it should be local rank {}: the launcher ({launcher}) must place ranks in blocks \
         (srun --distribution=block, mpirun --map-by slot)",
        rank % per_node
    )]
    NotInBlocks {
        launcher: Launcher,
        rank: usize,
        local_rank: usize,
        per_node: usize,
    },
    /// `dist.gpus_per_node = 0`.
    #[error("dist.gpus_per_node = 0: a node needs at least 1 GPU")]
    NoGpusPerNode,
    /// `dist.gpus_per_node` that does not divide the launched world.
    #[error(
        "dist.gpus_per_node = {gpus} does not divide the {world} ranks the launcher ({launcher}) \
         started"
    )]
    GpusPerNode {
        gpus: usize,
        world: usize,
        launcher: Launcher,
    },
    /// A host whose rank count does not divide the world, without `dist.gpus_per_node`.
    #[error(
        "the launcher ({launcher}) put {local} ranks on this node, which does not divide the \
         world of {world} ranks (uneven nodes?); set dist.gpus_per_node"
    )]
    UnevenNode {
        launcher: Launcher,
        local: usize,
        world: usize,
    },
    /// Several hosts with unknown (uneven) rank counts, without `dist.gpus_per_node`.
    #[error(
        "the launcher ({launcher}) started {world} ranks on {nodes} nodes but not the same \
         number on each; set dist.gpus_per_node"
    )]
    UnevenNodes {
        launcher: Launcher,
        world: usize,
        nodes: usize,
    },
    /// `dist.world_size` against the processes the launcher started.
    #[error(
        "dist.world_size = {configured} but the launcher ({launcher}) started {world} processes"
    )]
    WorldSize {
        configured: usize,
        launcher: Launcher,
        world: usize,
    },
    /// A world of several ranks without rank 0's address (`missing` names the variables).
    #[error(
        "{missing} not set: the {world} ranks the launcher ({launcher}) started need rank 0's \
         address to connect (torchrun sets both; export them for mpirun and srun, e.g. \
         MASTER_ADDR=<first host> MASTER_PORT=29500)"
    )]
    NoMaster {
        missing: &'static str,
        world: usize,
        launcher: Launcher,
    },
}

/// What the launcher told this process about the world it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This process's rank in the world.
    pub rank: usize,
    /// Number of processes the launcher started.
    pub world_size: usize,
    /// This process's index among the processes of its host: the GPU it should use.
    pub local_rank: usize,
    /// Number of processes on this host, where the launcher says (and, for slurm, every host runs
    /// the same number).
    pub local_world_size: Option<usize>,
    /// Number of hosts, where known.
    pub nodes: Option<usize>,
    /// Rank 0's host (`MASTER_ADDR`), for the bootstrap.
    pub master_addr: Option<String>,
    /// The port rank 0 listens on for the bootstrap (`MASTER_PORT`).
    pub master_port: Option<u16>,
    /// Who set the variables.
    pub launcher: Launcher,
}

/// The variables one launcher sets, for messages.
struct Names {
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    local_size: &'static str,
}

/// Typed access to the variables, with errors that name the variable and its value.
struct Vars<'a, F: Fn(&str) -> Option<String>> {
    get: &'a F,
}

impl<F: Fn(&str) -> Option<String>> Vars<'_, F> {
    fn is_set(&self, name: &str) -> bool {
        (self.get)(name).is_some()
    }

    fn number(&self, name: &'static str) -> Result<Option<usize>, LaunchError> {
        match (self.get)(name) {
            None => Ok(None),
            Some(value) => match value.trim().parse() {
                Ok(n) => Ok(Some(n)),
                Err(source) => Err(LaunchError::NotANumber {
                    name,
                    value,
                    source,
                }),
            },
        }
    }

    /// `name`, which a launch that set `because` must also set.
    fn required(&self, name: &'static str, because: &'static str) -> Result<usize, LaunchError> {
        self.number(name)?
            .ok_or(LaunchError::Missing { name, because })
    }

    fn master(&self) -> Result<(Option<String>, Option<u16>), LaunchError> {
        let addr = match (self.get)("MASTER_ADDR") {
            Some(a) if a.trim().is_empty() => return Err(LaunchError::EmptyMasterAddr),
            a => a.map(|a| a.trim().to_string()),
        };
        let port = match (self.get)("MASTER_PORT") {
            None => None,
            Some(value) => match value.trim().parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => return Err(LaunchError::BadPort { value }),
            },
        };
        Ok((addr, port))
    }
}

impl LaunchInfo {
    /// Reads this process's launch from its environment: `None` for a plain single process.
    pub fn from_env() -> Result<Option<LaunchInfo>> {
        Self::from_vars(&|name: &str| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        })
    }

    /// Reads a launch from the variables `var` gives (the environment, for [`Self::from_env`]):
    /// torchrun's if `RANK` or `WORLD_SIZE` is set, else OpenMPI's if `OMPI_COMM_WORLD_RANK` or
    /// `OMPI_COMM_WORLD_SIZE` is, else slurm's if `SLURM_PROCID` is, else `None`. The values are
    /// checked (numbers, rank below world size, local rank below local size); an error names the
    /// variable and its value.
    ///
    /// Under slurm the ranks per node come from `SLURM_STEP_TASKS_PER_NODE` (the `srun` step's
    /// own layout), else `SLURM_NTASKS_PER_NODE`, else `SLURM_TASKS_PER_NODE` (the allocation's),
    /// each like `4`, `4(x2)` or `4(x2),3`; an uneven layout leaves `local_world_size` unknown.
    pub fn from_vars(var: &impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
        let vars = Vars { get: var };
        let info = if vars.is_set("RANK") || vars.is_set("WORLD_SIZE") {
            Self::named(&vars, Self::TORCHRUN, Launcher::Torchrun)?
        } else if vars.is_set("OMPI_COMM_WORLD_RANK") || vars.is_set("OMPI_COMM_WORLD_SIZE") {
            Self::named(&vars, Self::OPENMPI, Launcher::OpenMpi)?
        } else if vars.is_set("SLURM_PROCID") {
            Self::slurm(&vars)?
        } else {
            return Ok(None);
        };
        Ok(Some(info))
    }

    /// torchrun's variables.
    const TORCHRUN: Names = Names {
        rank: "RANK",
        world: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: "LOCAL_WORLD_SIZE",
    };

    /// OpenMPI's variables.
    const OPENMPI: Names = Names {
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    };

    /// A launch whose rank, world size, local rank and local size are the variables `names`
    /// (torchrun's and OpenMPI's), with `MASTER_ADDR` / `MASTER_PORT`.
    fn named<F: Fn(&str) -> Option<String>>(
        vars: &Vars<F>,
        names: Names,
        launcher: Launcher,
    ) -> Result<LaunchInfo> {
        let rank = vars.required(names.rank, names.world)?;
        let world_size = vars.required(names.world, names.rank)?;
        let local_rank = vars.required(names.local_rank, names.rank)?;
        let local_world_size = vars.number(names.local_size)?;
        let (master_addr, master_port) = vars.master()?;
        let info = LaunchInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            nodes: nodes_from_local(world_size, local_world_size),
            master_addr,
            master_port,
            launcher,
        };
        info.check(&names, None)?;
        Ok(info)
    }

    fn slurm<F: Fn(&str) -> Option<String>>(vars: &Vars<F>) -> Result<LaunchInfo> {
        let rank = vars.required("SLURM_PROCID", "SLURM_PROCID")?;
        let world_size = vars
            .number("SLURM_NTASKS")?
            .ok_or(LaunchError::NotAnSrunTask)?;
        let local_rank = vars.required("SLURM_LOCALID", "SLURM_PROCID")?;
        let mut local_size = "SLURM_NTASKS_PER_NODE";
        let mut layout = None;
        for name in [
            "SLURM_STEP_TASKS_PER_NODE",
            "SLURM_NTASKS_PER_NODE",
            "SLURM_TASKS_PER_NODE",
        ] {
            if let Some(value) = (vars.get)(name) {
                local_size = name;
                layout = Some(parse_tasks_per_node(name, &value)?);
                break;
            }
        }
        // An even layout gives the ranks per node; an uneven one only the node count.
        let local_world_size = layout.as_ref().and_then(|entries| {
            let first = entries[0].0;
            entries.iter().all(|&(n, _)| n == first).then_some(first)
        });
        let listed_nodes = layout
            .as_ref()
            .filter(|_| local_size != "SLURM_NTASKS_PER_NODE")
            .map(|entries| entries.iter().map(|&(_, k)| k).sum::<usize>());
        let mut nodes_name = "SLURM_NNODES";
        let mut nodes = nodes_from_local(world_size, local_world_size);
        for name in ["SLURM_STEP_NUM_NODES", "SLURM_NNODES"] {
            if nodes.is_none() {
                nodes = vars.number(name)?;
                nodes_name = name;
            }
        }
        if nodes.is_none() {
            nodes = listed_nodes;
            nodes_name = local_size;
        }
        let (master_addr, master_port) = vars.master()?;
        let info = LaunchInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            nodes,
            master_addr,
            master_port,
            launcher: Launcher::Slurm,
        };
        let names = Names {
            rank: "SLURM_PROCID",
            world: "SLURM_NTASKS",
            local_rank: "SLURM_LOCALID",
            local_size,
        };
        info.check(&names, Some(nodes_name))?;
        Ok(info)
    }

    /// The checks every launcher's values must pass.
    fn check(&self, names: &Names, nodes_name: Option<&'static str>) -> Result<(), LaunchError> {
        let Names {
            rank,
            world,
            local_rank,
            local_size,
        } = names;
        let not_below = |name, value, limit_name, limit| LaunchError::NotBelow {
            name,
            value,
            limit_name,
            limit,
        };
        if self.world_size == 0 {
            return Err(LaunchError::EmptyWorld { name: world });
        }
        if self.rank >= self.world_size {
            return Err(not_below(rank, self.rank, world, self.world_size));
        }
        match self.local_world_size {
            Some(0) => return Err(LaunchError::EmptyNode { name: local_size }),
            Some(l) if l > self.world_size => {
                return Err(LaunchError::NodeLargerThanWorld {
                    name: local_size,
                    value: l,
                    world_name: world,
                    world: self.world_size,
                })
            }
            Some(l) if self.local_rank >= l => {
                return Err(not_below(local_rank, self.local_rank, local_size, l))
            }
            _ if self.local_rank >= self.world_size => {
                return Err(not_below(
                    local_rank,
                    self.local_rank,
                    world,
                    self.world_size,
                ))
            }
            _ => {}
        }
        if let (Some(n), Some(name)) = (self.nodes, nodes_name) {
            if n == 0 || n > self.world_size {
                return Err(LaunchError::BadNodeCount {
                    name,
                    nodes: n,
                    world: self.world_size,
                });
            }
        }
        Ok(())
    }

    /// The `nodes x ranks per node` topology of this launch. Ranks per node are `gpus_per_node`
    /// where the configuration sets it (so the 8 GPUs of one host can be 2 simulated nodes x 4),
    /// else the launcher's ranks on this host, else all ranks are one node.
    ///
    /// Errors when the world does not divide into such nodes, when the launcher placed ranks
    /// other than in blocks (rank = host x ranks per host + local rank, which the topology's
    /// groups assume), and when the launcher names several hosts with an uneven number of ranks.
    pub fn topology(&self, gpus_per_node: Option<usize>) -> Result<Topology> {
        let world = self.world_size;
        let launcher = self.launcher;
        if let Some(l) = self.local_world_size {
            if l > 0 && self.rank % l != self.local_rank {
                return Err(LaunchError::NotInBlocks {
                    launcher,
                    rank: self.rank,
                    local_rank: self.local_rank,
                    per_node: l,
                }
                .into());
            }
        }
        let per_node = match (gpus_per_node, self.local_world_size, self.nodes) {
            (Some(0), ..) => return Err(LaunchError::NoGpusPerNode.into()),
            (Some(g), ..) => {
                if !world.is_multiple_of(g) {
                    return Err(LaunchError::GpusPerNode {
                        gpus: g,
                        world,
                        launcher,
                    }
                    .into());
                }
                g
            }
            (None, Some(l), _) => {
                if !world.is_multiple_of(l) {
                    return Err(LaunchError::UnevenNode {
                        launcher,
                        local: l,
                        world,
                    }
                    .into());
                }
                l
            }
            (None, None, Some(nodes)) if nodes > 1 => {
                return Err(LaunchError::UnevenNodes {
                    launcher,
                    world,
                    nodes,
                }
                .into());
            }
            (None, None, _) => world,
        };
        Topology::new(world, per_node)
    }

    /// Checks the configuration's `dist.world_size`, if it sets one, against the launch.
    pub fn check_world(&self, configured: Option<usize>) -> Result<()> {
        match configured {
            Some(configured) if configured != self.world_size => Err(LaunchError::WorldSize {
                configured,
                launcher: self.launcher,
                world: self.world_size,
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// Rank 0's `HOST:PORT` for [`crate::bootstrap::rendezvous`], from `MASTER_ADDR` and
    /// `MASTER_PORT`; an error names the ones missing.
    pub fn rendezvous_addr(&self) -> Result<String> {
        let missing = match (&self.master_addr, self.master_port) {
            (Some(addr), Some(port)) => {
                return Ok(if addr.contains(':') && !addr.starts_with('[') {
                    format!("[{addr}]:{port}")
                } else {
                    format!("{addr}:{port}")
                });
            }
            (None, None) => "MASTER_ADDR and MASTER_PORT are",
            (None, Some(_)) => "MASTER_ADDR is",
            (Some(_), None) => "MASTER_PORT is",
        };
        Err(LaunchError::NoMaster {
            missing,
            world: self.world_size,
            launcher: self.launcher,
        }
        .into())
    }
}

/// Nodes when every node runs `local` of the `world` ranks.
fn nodes_from_local(world: usize, local: Option<usize>) -> Option<usize> {
    local
        .filter(|&l| l > 0 && world.is_multiple_of(l))
        .map(|l| world / l)
}

/// Parses slurm's tasks-per-node list (`4`, `4(x2)`, `4(x2),3`) into (tasks, nodes) entries.
fn parse_tasks_per_node(
    name: &'static str,
    value: &str,
) -> Result<Vec<(usize, usize)>, LaunchError> {
    let bad = || LaunchError::BadTaskList {
        name,
        value: value.to_string(),
    };
    let entries = value
        .trim()
        .split(',')
        .map(|entry| {
            let (tasks, repeat) = match entry.split_once("(x") {
                Some((tasks, rest)) => {
                    let repeat = rest.strip_suffix(')').ok_or_else(bad)?;
                    (tasks, repeat.parse().map_err(|_| bad())?)
                }
                None => (entry, 1),
            };
            let tasks: usize = tasks.parse().map_err(|_| bad())?;
            if tasks == 0 || repeat == 0 {
                return Err(bad());
            }
            Ok((tasks, repeat))
        })
        .collect::<Result<Vec<_>, LaunchError>>()?;
    Ok(entries)
}
