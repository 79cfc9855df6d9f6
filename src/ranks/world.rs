//! The ranks of one run as one value: how this process takes part (the
//! launcher's variables, read once, here), where it runs (placement), and
//! whom it met (the rendezvous: the agreed plan, every member).
//!
//! It is built in steps, because the NCCL backend has GPU work to do
//! between them: [`discover`] before any experiment is loaded or any GPU
//! looked for; [`World::new`] with the plan to agree on and what this rank
//! presents; then, by the backend, [`World::place`] (it knows how many
//! devices this host has) and [`World::meet`] (its payload is NCCL's unique
//! id, which rank 0 creates before the ranks meet). A world of one process
//! (no launcher: the CPU and CUDA backends' emulated ranks, or NCCL's one
//! thread per GPU) is neither placed nor met: it needs no rendezvous.

use super::discover::{self, RankEnv};
use super::placement::{self, Placement};
use super::rendezvous::{self, Agreement, Member, Plan};
use super::{job, RankError};
use std::time::{Duration, Instant};

/// The default bound on the rendezvous and communicator init, in seconds.
pub const DEFAULT_INIT_TIMEOUT_S: u64 = 120;

/// How this process takes part in its world.
#[derive(Debug, Clone)]
pub enum Launch {
    /// No launcher: this process holds every rank (NCCL: `gpus` of them,
    /// one thread and GPU each).
    OneProcess { gpus: usize },
    /// One rank of a job a launcher started, one process per rank.
    PerRank(RankEnv),
}

/// How this process takes part, from the launcher's variables: a variable
/// that is malformed, out of range or contradicts another launcher's is
/// refused here. `gpus`: the ranks of a one-process world.
pub fn discover(gpus: usize) -> Result<Launch, RankError> {
    Ok(match discover::from_process_env()? {
        Some(e) => Launch::PerRank(e),
        None => Launch::OneProcess { gpus },
    })
}

impl Launch {
    /// Refuse a rendezvous address rank 0 could not listen on (unless the
    /// ranks meet in a directory), before anything else is done.
    pub fn check_rendezvous(&self) -> Result<(), RankError> {
        if let Launch::PerRank(e) = self {
            let by_dir = std::env::var("FOLDPRINT_RENDEZVOUS_DIR").is_ok_and(|d| !d.is_empty());
            if !by_dir {
                job::rendezvous_addr(e)?;
            }
        }
        Ok(())
    }
}

/// The world of one run (see the module's doc).
#[derive(Debug, Clone)]
pub struct World {
    launch: Launch,
    /// Bound on the rendezvous and the communicator's start.
    init_timeout: Duration,
    /// What every rank must be about to run.
    plan: Plan,
    /// Ranks share devices by local rank, each its own NCCL host.
    emulate_hosts: bool,
    /// This rank's own file of each set of rank files, presented.
    inputs: Vec<Option<crate::addends::FileFacts>>,
    placement: Option<Placement>,
    /// Why this rank cannot run here, said in the rendezvous.
    problem: Option<String>,
    met: Option<Agreement>,
}

impl World {
    /// A world still to be placed and met.
    pub fn new(launch: Launch, plan: Plan, init_timeout: Duration) -> World {
        World {
            launch,
            init_timeout,
            plan,
            emulate_hosts: false,
            inputs: Vec::new(),
            placement: None,
            problem: None,
            met: None,
        }
    }

    /// A one-process world of `gpus` ranks (the CPU and CUDA backends
    /// emulate their W ranks in it whatever `gpus` is).
    pub fn one_process(gpus: usize, init_timeout: Duration) -> World {
        World::new(
            Launch::OneProcess { gpus },
            Plan::new(&[], String::new()),
            init_timeout,
        )
    }

    /// Ranks share the visible devices by local rank, each its own NCCL
    /// host ([`placement`]).
    pub fn with_emulated_hosts(mut self, emulate: bool) -> World {
        self.emulate_hosts = emulate;
        self
    }

    /// What this rank hashed of its own rank files, in plan order
    /// (`experiment::rank_file_sets`), to present in the rendezvous.
    pub fn presenting(mut self, inputs: Vec<Option<crate::addends::FileFacts>>) -> World {
        self.inputs = inputs;
        self
    }

    pub fn launch(&self) -> &Launch {
        &self.launch
    }

    /// The launcher's account of this rank, in a world of one process per rank.
    pub fn env(&self) -> Option<&RankEnv> {
        match &self.launch {
            Launch::PerRank(e) => Some(e),
            Launch::OneProcess { .. } => None,
        }
    }

    /// This process's rank, in a world of one process per rank.
    pub fn rank(&self) -> Option<usize> {
        self.env().map(|e| e.rank)
    }

    /// How many ranks the world has.
    pub fn size(&self) -> usize {
        match &self.launch {
            Launch::PerRank(e) => e.world,
            Launch::OneProcess { gpus } => (*gpus).max(1),
        }
    }

    /// Whether this process writes the report and prints: rank 0, or the
    /// one process of its world.
    pub fn reports(&self) -> bool {
        self.rank().unwrap_or(0) == 0
    }

    pub fn init_timeout(&self) -> Duration {
        self.init_timeout
    }

    pub fn emulate_hosts(&self) -> bool {
        self.emulate_hosts
    }

    /// Where this rank runs on a host of `devices` visible devices: its
    /// local rank, or with emulated hosts local rank mod devices and an
    /// `NCCL_HOSTID`. A rank without a device is refused here, before the
    /// rendezvous; the refusal is also what this rank says of itself if it
    /// meets the others anyway (`foldprint world`).
    pub fn place(&mut self, devices: usize) -> Result<Placement, RankError> {
        let Launch::PerRank(e) = &self.launch else {
            return Err(RankError::Placement(
                "a world of one process places its ranks itself".into(),
            ));
        };
        let (_, job, _) = job::identity();
        let hostid_set = std::env::var_os("NCCL_HOSTID").is_some_and(|v| !v.is_empty());
        match placement::place(e, devices, self.emulate_hosts, &job, hostid_set) {
            Ok(p) => {
                self.placement = Some(p.clone());
                Ok(p)
            }
            Err(err) => {
                self.problem = Some(err.to_string());
                Err(err)
            }
        }
    }

    /// Meet the other ranks ([`rendezvous::exchange`]) by `deadline`: every
    /// rank presents the plan and itself (host, pid, device, its rank
    /// files), and rank 0's `payload` reaches every rank.
    pub fn meet(&mut self, payload: &[u8], deadline: Instant) -> Result<(), RankError> {
        let Launch::PerRank(e) = &self.launch else {
            return Err(RankError::Rendezvous {
                role: "rank 0".into(),
                message: "a world of one process has no rendezvous".into(),
            });
        };
        let mut me = Member::this(e);
        if let Some(p) = &self.placement {
            me.device = Some(p.device);
            if p.nccl_hostid.is_some() {
                me.nccl_hostid = p.nccl_hostid.clone();
            }
        }
        me.problem = self.problem.clone();
        me.inputs = self.inputs.clone();
        self.met = Some(rendezvous::exchange(e, &me, &self.plan, payload, deadline)?);
        Ok(())
    }

    /// Rank 0's payload as the rendezvous delivered it (empty before).
    pub fn payload(&self) -> &[u8] {
        self.met.as_ref().map_or(&[], |m| &m.payload)
    }

    /// How the ranks met, for the report: `in-process` in a world of one
    /// process.
    pub fn how(&self) -> &str {
        match (&self.launch, &self.met) {
            (Launch::OneProcess { .. }, _) => "in-process",
            (Launch::PerRank(_), Some(m)) => &m.how,
            (Launch::PerRank(_), None) => "",
        }
    }

    /// The ranks as they met: every rank in rank order on rank 0, this
    /// rank alone elsewhere, none in a world of one process.
    pub fn members(&self) -> &[Member] {
        self.met.as_ref().map_or(&[], |m| &m.members)
    }

    /// What this rank says of itself in the rendezvous, if it cannot run here.
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, world: usize) -> RankEnv {
        RankEnv {
            rank,
            world,
            local_rank: rank,
            source: "foldprint",
            master: None,
            variables: Vec::new(),
            others: Vec::new(),
        }
    }

    #[test]
    fn one_process_holds_every_rank_and_reports() {
        let w = World::one_process(3, Duration::from_secs(1));
        assert_eq!((w.size(), w.rank(), w.reports()), (3, None, true));
        assert_eq!(w.how(), "in-process");
        assert!(w.members().is_empty() && w.payload().is_empty());
        // `--gpus 0` is still a world of one rank.
        assert_eq!(World::one_process(0, Duration::ZERO).size(), 1);
    }

    #[test]
    fn only_rank_zero_of_a_launched_world_reports() {
        let plan = Plan::new(&["p".into()], "p");
        let zero = World::new(Launch::PerRank(rank(0, 4)), plan.clone(), Duration::ZERO);
        let two = World::new(Launch::PerRank(rank(2, 4)), plan, Duration::ZERO);
        assert_eq!(
            (zero.size(), zero.rank(), zero.reports()),
            (4, Some(0), true)
        );
        assert_eq!((two.size(), two.rank(), two.reports()), (4, Some(2), false));
        // Not met yet: nothing said of how or whom.
        assert_eq!(two.how(), "");
        assert!(two.members().is_empty());
    }

    #[test]
    fn a_rank_without_a_device_is_refused_and_says_so() {
        let plan = Plan::new(&["p".into()], "p");
        let mut w = World::new(Launch::PerRank(rank(3, 4)), plan, Duration::ZERO);
        let err = w.place(1).unwrap_err().to_string();
        assert!(err.contains("local rank 3"), "{err}");
        assert_eq!(w.problem(), Some(err.as_str()));
        // Negative control: a device of its own places it.
        let mut ok = World::new(
            Launch::PerRank(rank(0, 4)),
            Plan::new(&[], ""),
            Duration::ZERO,
        );
        assert_eq!(ok.place(1).unwrap().device, 0);
        assert_eq!(ok.problem(), None);
        // A world of one process is never placed or met.
        let mut one = World::one_process(2, Duration::ZERO);
        assert!(one.place(2).is_err());
        assert!(one.meet(&[], Instant::now()).is_err());
    }
}
