//! The actor driver: the engine as message flow between kameo actors.
//!
//! ```text
//!   driver thread                host "cpu+npu" (pinned, cores 0..n)         host "storage"
//!   ─────────────                ───────────────────────────────────         ──────────────
//!   RunStep ───────────────────► SchedulerActor ── Compute ──► CpuGroup ─┐   Storage
//!                                      ▲  (FinishPhase here)  Npu      │   (ReadAt: pread,
//!   ◄──────────── StepDone ───────     └──────── ClusterDone ◄─────────┘    O_DIRECT)
//! ```
//!
//! The plan's groups are placed on this machine's cores ([`Topology::place`]); groups on the
//! same cores share a host thread and its worker pool (so on a machine without core classes
//! the CPU group, the NPU and the scheduler all live on one host and their messages are
//! local), the scheduler lives on the host of the first decode group, and storage gets a host
//! of its own. Numerics are those of the inline driver bit for bit: the same executor, the same
//! clusters, the same reduction order.
//!
//! When an actor fails, the step in flight fails with [`StepError::Actor`]; before the next
//! step the driver replaces every actor (the hosts, pools and buffers stay), so the engine
//! serves the next request.

use crate::dense::ChunkedGemm;
use crate::group::{CpuGroup, GroupCore, Npu};
use crate::host::{Host, HostConfig, DEFAULT_SPIN};
use crate::pool::{PoolConfig, WorkerPool};
use crate::protocol::{
    Compute, GroupReplies, InjectPanic, ReadAt, Recording, RunStep, StartRecording, TakeCacheStats,
    TakeHeldSlots, TakeRecording,
};
use crate::scheduler::{SchedulerActor, SchedulerArgs};
use crate::step::{write, Counters, StepShared};
use crate::storage::{QueuedLoads, Storage, StorageArgs, StorageError, StorageFile};
use conductor_runtime::cache::CacheReport;
use conductor_runtime::exec::{
    open_cache, ClusterRunner, DenseBackend, Driver, GroupOutput, Session, StepError, StepState,
    WholeMatmul,
};
use conductor_runtime::model::{KvCache, Model};
use conductor_runtime::plan::{
    hosts_of, ExecutionPlan, FfnPlan, PlacedGroup, PlacementError, Topology, XpuKind,
};
use conductor_runtime::quant::Kernels;
use conductor_runtime::schedule::{
    ScheduleError, Scheduler, StepId, StepRequest, StepShape, XpuId,
};
use conductor_runtime::trace::{Trace, TraceHeader, TRACE_FORMAT_VERSION};
use kameo::actor::{Actor, ActorRef, PreparedActor};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How to set up the actors.
#[derive(Clone, Debug, Default)]
pub struct ActorOptions {
    /// Threads of groups whose plan leaves them at 0 (the command line's `-t`).
    pub threads: Option<u32>,
    /// The machine (default: detected).
    pub topology: Option<Topology>,
    /// Leave threads unpinned (default: pinned to the plan's cores).
    pub no_pinning: bool,
    /// The model file, for the storage actor.
    pub model_path: Option<PathBuf>,
}

/// Why the actors could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("cannot start threads: {0}")]
    Threads(#[from] std::io::Error),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

enum GroupRef {
    Cpu(ActorRef<CpuGroup>),
    Npu(ActorRef<Npu>),
}

impl GroupRef {
    fn kill(&self) {
        match self {
            GroupRef::Cpu(r) => r.kill(),
            GroupRef::Npu(r) => r.kill(),
        }
    }
}

/// The actors of one engine (replaced together after a failure).
struct Actors {
    scheduler: ActorRef<SchedulerActor>,
    groups: Vec<GroupRef>,
    /// One per I/O thread of the plan; the first also serves [`ReadAt`].
    storage: Vec<ActorRef<Storage>>,
}

impl Actors {
    fn kill(&self) {
        self.scheduler.kill();
        for g in &self.groups {
            g.kill();
        }
        for s in &self.storage {
            s.kill();
        }
    }
}

/// A compute host: its thread and its worker pool.
struct ComputeHost {
    host: Host,
    pool: Arc<WorkerPool>,
    /// How it was started, to start it again if its thread dies.
    spec: ComputeHostSpec,
}

/// What a compute host is started with.
#[derive(Clone)]
struct ComputeHostSpec {
    config: HostConfig,
    pool: PoolConfig,
}

impl ComputeHost {
    fn start(
        spec: ComputeHostSpec,
        tokio: tokio::runtime::Handle,
    ) -> Result<ComputeHost, SetupError> {
        let pool_config = spec.pool.clone();
        let (host, pool) = Host::start(spec.config.clone(), tokio, move || {
            WorkerPool::new(pool_config)
        })?;
        Ok(ComputeHost {
            host,
            pool: Arc::new(pool?),
            spec,
        })
    }
}

fn start_storage_host(
    i: usize,
    spin: Duration,
    tokio: tokio::runtime::Handle,
) -> std::io::Result<Host> {
    let config = HostConfig {
        name: format!("storage{i}"),
        cores: Vec::new(),
        spin,
    };
    Host::start(config, tokio, || ()).map(|(host, ())| host)
}

/// How long a restart waits for a host to run a new future before it counts the host as dead
/// or stuck and starts another.
const HOST_RESPONSE: Duration = Duration::from_secs(1);

pub struct ActorDriver {
    model: Arc<Model>,
    plan: ExecutionPlan,
    /// The scheduler's FFN plan (the trace header names it).
    ffn: FfnPlan,
    placed: Vec<PlacedGroup>,
    /// Host index of each group.
    group_hosts: Vec<usize>,
    shared: Arc<StepShared>,
    actors: Actors,
    hosts: Vec<ComputeHost>,
    /// One host per I/O thread of the plan.
    storage_hosts: Vec<Host>,
    /// Spin window of the storage hosts (to start one again).
    storage_spin: Duration,
    /// How long the driver waits for a step (the plan's `step_deadline_ms`).
    deadline: Duration,
    storage_path: Option<PathBuf>,
    max_step_tokens: usize,
    next_step: StepId,
    logits: Vec<f32>,
    /// False after an actor failed: the actors are replaced before the next step.
    healthy: bool,
    /// kameo's background tasks run here; every host entered it. Declared last: dropped after
    /// the hosts.
    _runtime: tokio::runtime::Runtime,
}

/// Prepares an actor, runs it on `host`, and returns its reference.
fn spawn_on<A: Actor>(host: &Host, prepared: PreparedActor<A>, args: A::Args) -> ActorRef<A> {
    let actor_ref = prepared.actor_ref().clone();
    host.spawn(async move {
        let _ = prepared.run(args).await;
    });
    actor_ref
}

fn prepare<A: Actor>() -> PreparedActor<A> {
    PreparedActor::new(kameo::mailbox::unbounded())
}

/// Spin window of hosts under a memory budget (see `ActorDriver::new`).
const IO_BOUND_HOST_SPIN: Duration =
    Duration::from_nanos(conductor_runtime::cache::IO_BOUND_SPIN_NS);
/// Spin iterations of pool helpers under a memory budget.
const IO_BOUND_POOL_SPIN: u32 = 200;

impl ActorDriver {
    /// Actors computing `model` as `plan` says, decode's FFN as `ffn` says (the engine's
    /// `ResolvedPlan` holds both; `exec::ffn_plan_of` resolves one for a model and plan alone).
    pub fn new(
        model: Arc<Model>,
        plan: &ExecutionPlan,
        ffn: FfnPlan,
        kernels: Kernels,
        options: ActorOptions,
    ) -> Result<ActorDriver, SetupError> {
        let scheduler = conductor_runtime::exec::scheduler_for(&model, plan, ffn)?;
        let topology = options
            .topology
            .clone()
            .unwrap_or_else(crate::detect_topology);
        let placed = topology.place(plan, options.threads)?;
        let group_hosts = hosts_of(&placed);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("conductor-kameo")
            .enable_time()
            .build()?;

        // Under a memory budget decode waits on storage most of the time. A waiting thread that
        // spins holds its core, and on a virtual machine the host's disk emulation needs that
        // time: SmolLM2 at 50% on the 2-vCPU build VM read 1.5x slower with the default spin
        // windows (`bench --memory 50% -t 2`: 5.4-6.4 tok/s against 7.2-11.1 with these). Hosts
        // and pool helpers then park almost at once.
        let io_bound = plan.cache.is_some();
        let host_spin = if io_bound {
            IO_BOUND_HOST_SPIN
        } else {
            DEFAULT_SPIN
        };
        let mut hosts: Vec<ComputeHost> = Vec::new();
        for (g, group) in placed.iter().enumerate() {
            if group_hosts[g] < hosts.len() {
                continue;
            }
            // Groups on the same cores share this host; its pool serves the most threads any
            // of them asks for.
            let threads = placed
                .iter()
                .zip(&group_hosts)
                .filter(|(_, &h)| h == group_hosts[g])
                .map(|(p, _)| p.threads)
                .max()
                .unwrap_or(1) as usize;
            let names: Vec<&str> = placed
                .iter()
                .zip(&group_hosts)
                .filter(|(_, &h)| h == group_hosts[g])
                .map(|(p, _)| p.name.as_str())
                .collect();
            let cores = if options.no_pinning {
                Vec::new()
            } else {
                group.cores.clone()
            };
            let config = PoolConfig::new(threads);
            let spec = ComputeHostSpec {
                config: HostConfig {
                    name: names.join("+"),
                    cores: cores.clone(),
                    spin: host_spin,
                },
                pool: PoolConfig {
                    cores: cores.iter().map(|&c| c as usize).collect(),
                    spin_iterations: if io_bound {
                        IO_BOUND_POOL_SPIN
                    } else {
                        config.spin_iterations
                    },
                    ..config
                },
            };
            hosts.push(ComputeHost::start(spec, runtime.handle().clone())?);
        }
        let mut storage_hosts = Vec::new();
        for i in 0..plan.storage.io_threads.max(1) as usize {
            storage_hosts.push(start_storage_host(i, host_spin, runtime.handle().clone())?);
        }

        let cache = open_cache(&model, plan, scheduler.unit_map())?
            .map(|(arena, file)| (arena, Arc::new(file)));
        let state = StepState::reading(
            kernels,
            cache.as_ref().map(|(arena, _)| Arc::clone(arena)),
            ffn,
        );
        let shared = Arc::new(StepShared {
            model: Arc::clone(&model),
            decode: Arc::clone(scheduler.program(StepShape::Decode)),
            prefill: Arc::clone(scheduler.program(StepShape::Prefill)),
            state: RwLock::new(state),
            kv: RwLock::new(vec![KvCache::default()]),
            outputs: (0..placed.len())
                .map(|_| Mutex::new(GroupOutput::default()))
                .collect(),
            epoch: Instant::now(),
            recording: AtomicBool::new(false),
            cache,
            counters: Counters::new(model.config().n_layer),
        });
        let storage_path = options.model_path.clone();
        let actors = start_actors(
            scheduler,
            &shared,
            &placed,
            &group_hosts,
            &hosts,
            &storage_hosts,
            plan,
            open_storage(&storage_path, plan)?,
        );
        Ok(ActorDriver {
            max_step_tokens: plan.prefill_max_tokens.max(plan.decode_max_tokens) as usize,
            model,
            plan: plan.clone(),
            ffn,
            placed,
            group_hosts,
            shared,
            actors,
            hosts,
            storage_hosts,
            storage_spin: host_spin,
            deadline: Duration::from_millis(plan.step_deadline_ms),
            storage_path,
            next_step: 0,
            logits: Vec::new(),
            healthy: true,
            _runtime: runtime,
        })
    }

    /// Where the plan's groups run.
    pub fn placement(&self) -> &[PlacedGroup] {
        &self.placed
    }

    /// Threads of the first decode group.
    pub fn decode_threads(&self) -> u32 {
        let first = &self.plan.decode_on[0].group;
        self.placed
            .iter()
            .find(|g| &g.name == first)
            .map_or(1, |g| g.threads)
    }

    /// Replaces every actor (after a failure). Hosts, pools and buffers stay, except a host
    /// whose thread died or is stuck (a read that never returns): new actors there would
    /// never run, so it is let go and another started in its place.
    fn restart(&mut self) -> Result<(), SetupError> {
        self.actors.kill();
        let tokio = self._runtime.handle().clone();
        for i in 0..self.hosts.len() {
            if !self.hosts[i].host.responds_within(HOST_RESPONSE) {
                let fresh = ComputeHost::start(self.hosts[i].spec.clone(), tokio.clone())?;
                std::mem::replace(&mut self.hosts[i], fresh).host.abandon();
            }
        }
        for i in 0..self.storage_hosts.len() {
            if !self.storage_hosts[i].responds_within(HOST_RESPONSE) {
                let fresh = start_storage_host(i, self.storage_spin, tokio.clone())?;
                std::mem::replace(&mut self.storage_hosts[i], fresh).abandon();
            }
        }
        let mut scheduler =
            conductor_runtime::exec::scheduler_for(&self.model, &self.plan, self.ffn)?;
        // A slot that a read of the replaced actors still holds (a read that does not return)
        // would stall every step given it: the new scheduler leaves it out.
        if let Some((arena, _)) = &self.shared.cache {
            for slot in (0..arena.n_slots()).filter(|&s| arena.is_busy(s)) {
                scheduler.retire_cache_slot(slot);
            }
        }
        let storage = open_storage(&self.storage_path, &self.plan)?;
        self.actors = start_actors(
            scheduler,
            &self.shared,
            &self.placed,
            &self.group_hosts,
            &self.hosts,
            &self.storage_hosts,
            &self.plan,
            storage,
        );
        self.healthy = true;
        Ok(())
    }

    /// The neuron cache's counters, bytes read and time spent (plans with a cache).
    pub fn cache_report(&self) -> Option<CacheReport> {
        self.shared.cache.as_ref()?;
        let layers = self.ask_scheduler(TakeCacheStats)?;
        let c = &self.shared.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        Some(CacheReport {
            layer_bytes: c.layer_bytes.iter().map(get).collect(),
            layers,
            loads: get(&c.loads),
            reads: get(&c.reads),
            bytes_read: get(&c.io_bytes),
            issued: self
                .shared
                .cache
                .as_ref()
                .map(|(_, f)| f.issued())
                .unwrap_or_default(),
            io_ns: get(&c.io_ns),
            decode_compute_ns: get(&c.decode_compute_ns),
        })
    }

    /// Cache slots the scheduler holds now (plans with a cache): 0 between steps, done or
    /// failed; more is a leak. `None` also when the scheduler does not answer within the
    /// step deadline.
    pub fn held_cache_slots(&self) -> Option<u32> {
        self.shared.cache.as_ref()?;
        self.ask_scheduler(TakeHeldSlots)?
    }

    /// Sends the scheduler a query that carries its reply channel, and waits for the answer
    /// up to the step deadline (`None`: not sent, or no answer in time).
    fn ask_scheduler<T, M>(&self, query: impl FnOnce(SyncSender<T>) -> M) -> Option<T>
    where
        SchedulerActor: kameo::message::Message<M>,
        M: Send + 'static,
    {
        let (tx, rx) = sync_channel(1);
        self.actors.scheduler.tell(query(tx)).try_send().ok()?;
        rx.recv_timeout(self.deadline).ok()
    }

    /// Whether the actors will be replaced before the next step (an actor failed).
    pub fn needs_restart(&self) -> bool {
        !self.healthy
    }

    /// Starts recording a trace of every event, command, activation set and timed span.
    pub fn start_trace(&mut self) {
        let _ = self.actors.scheduler.tell(StartRecording).try_send();
    }

    /// Stops recording and returns the trace (empty if the actors were replaced meanwhile).
    pub fn take_trace(&mut self) -> Trace {
        let (tx, rx) = sync_channel(1);
        let recording = match self.actors.scheduler.tell(TakeRecording(tx)).try_send() {
            Ok(()) => rx.recv_timeout(self.deadline).unwrap_or_default(),
            Err(_) => Recording::default(),
        };
        Trace {
            header: TraceHeader {
                version: TRACE_FORMAT_VERSION,
                model: self.model.description(),
                plan: self.plan.clone(),
                ffn: self.ffn,
                driver: "actors".into(),
                threads: self.decode_threads(),
                writer: format!("conductor {}", env!("CARGO_PKG_VERSION")),
            },
            records: recording.records,
            activity: recording.activity,
            spans: recording.spans,
        }
    }

    /// Reads `len` bytes at `offset` of the model file through the storage actor.
    pub fn read_model_bytes(&self, offset: u64, len: usize) -> Result<Vec<u8>, StepError> {
        let (tx, rx) = sync_channel(1);
        let not_running = || StepError::Actor {
            actor: "storage".into(),
            why: "not running".into(),
        };
        self.actors.storage[0]
            .tell(ReadAt {
                offset,
                len,
                reply: tx,
            })
            .try_send()
            .map_err(|_| not_running())?;
        rx.recv_timeout(self.deadline)
            .map_err(|_| StepError::Actor {
                actor: "storage".into(),
                why: format!("no answer within {} ms", self.deadline.as_millis()),
            })?
            .map_err(|e| StepError::Actor {
                actor: "storage".into(),
                why: e.to_string(),
            })
    }

    /// Fault injection for tests: the next compute of group `name` panics. False if there is
    /// no such group.
    pub fn inject_panic(&self, name: &str) -> bool {
        let Some(i) = self.placed.iter().position(|g| g.name == name) else {
            return false;
        };
        match &self.actors.groups[i] {
            GroupRef::Cpu(r) => r.tell(InjectPanic).try_send().is_ok(),
            GroupRef::Npu(r) => r.tell(InjectPanic).try_send().is_ok(),
        }
    }

    /// Fault injection for tests: the next read run of storage actor `i` panics. False if
    /// there is no such actor.
    pub fn inject_storage_panic(&self, i: usize) -> bool {
        self.actors
            .storage
            .get(i)
            .is_some_and(|s| s.tell(InjectPanic).try_send().is_ok())
    }

    /// Fault injection for tests: stops storage actor `i` as if its thread had died.
    pub fn kill_storage(&self, i: usize) -> bool {
        self.actors.storage.get(i).map(|s| s.kill()).is_some()
    }

    /// Fault injection for tests: holds the host thread of group `name`, as a read or a
    /// compute that does not return would (its actors get no message meanwhile), until
    /// `release` gets a message or is dropped. `None` when there is no such group.
    pub fn stall_group_host(
        &self,
        name: &str,
        release: std::sync::mpsc::Receiver<()>,
    ) -> Option<()> {
        let i = self.placed.iter().position(|g| g.name == name)?;
        self.hosts[self.group_hosts[i]].host.spawn(async move {
            let _ = release.recv();
        });
        Some(())
    }

    /// Fault injection for tests: stops group `name` as if its thread had died.
    pub fn kill_group(&self, name: &str) -> bool {
        let Some(i) = self.placed.iter().position(|g| g.name == name) else {
            return false;
        };
        self.actors.groups[i].kill();
        true
    }

    fn run_step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
        resident_only: bool,
    ) -> Result<(), StepError> {
        self.ensure_healthy()?;
        let request = StepRequest {
            step: self.next_step,
            n_tokens: tokens.len() as u32,
            n_past: session.n_past() as u32,
            logits_from,
            sequences: 1,
            resident_only,
        };
        self.next_step += 1;
        // Lend the session's KV cache to the actors for this step.
        session.swap_kv(&mut write(&self.shared.kv)[0]);
        // (The state's lock is let go before the actors need it.)
        let begun =
            write(&self.shared.state).begin_step(&self.model, &request, tokens, session.n_ctx());
        let result = begun
            .map_err(StepError::from)
            .and_then(|()| self.step_with_lent_cache(&request));
        session.swap_kv(&mut write(&self.shared.kv)[0]);
        self.step_ended(result)?;
        session.push(tokens);
        Ok(())
    }

    /// A multi-sequence step ([`Driver::step_sequences`]): every session's cache is lent.
    fn run_multi_step(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<(), StepError> {
        self.ensure_healthy()?;
        let (request, positions, n_ctx) =
            conductor_runtime::exec::multi_step_request(self.next_step, sessions, tokens)?;
        self.next_step += 1;
        {
            let mut kvs = write(&self.shared.kv);
            kvs.resize_with(sessions.len().max(1), KvCache::default);
            for (session, kv) in sessions.iter_mut().zip(kvs.iter_mut()) {
                session.swap_kv(kv);
            }
        }
        let begun = write(&self.shared.state).begin_multi_step(
            &self.model,
            &request,
            tokens,
            &positions,
            n_ctx,
        );
        let result = begun
            .map_err(StepError::from)
            .and_then(|()| self.step_with_lent_cache(&request));
        {
            let mut kvs = write(&self.shared.kv);
            for (session, kv) in sessions.iter_mut().zip(kvs.iter_mut()) {
                session.swap_kv(kv);
            }
            kvs.truncate(1);
        }
        self.step_ended(result)?;
        for (session, &token) in sessions.iter_mut().zip(tokens) {
            session.push(&[token]);
        }
        Ok(())
    }

    /// Replaces the actors before a step if one failed in an earlier one.
    fn ensure_healthy(&mut self) -> Result<(), StepError> {
        if !self.healthy {
            self.restart().map_err(|e| StepError::Actor {
                actor: "driver".into(),
                why: format!("cannot restart the actors: {e}"),
            })?;
        }
        Ok(())
    }

    /// After a step: its logits on success; an actor's failure marks the actors for restart.
    fn step_ended(&mut self, result: Result<(), StepError>) -> Result<(), StepError> {
        match result {
            Ok(()) => {
                write(&self.shared.state).swap_logits(&mut self.logits);
                Ok(())
            }
            Err(e) => {
                if matches!(e, StepError::Actor { .. }) {
                    self.healthy = false;
                }
                // What the actors still do of the step (a step given up at its deadline goes
                // on) is skipped: its KV cache is back with the session.
                write(&self.shared.state).abandon_step();
                Err(e)
            }
        }
    }

    /// Runs a begun step on the actors, with the caches lent.
    fn step_with_lent_cache(&self, request: &StepRequest) -> Result<(), StepError> {
        let (tx, rx) = sync_channel(1);
        let stopped = |why: &str| StepError::Actor {
            actor: "scheduler".into(),
            why: why.into(),
        };
        self.actors
            .scheduler
            .tell(RunStep {
                request: request.clone(),
                reply: tx,
            })
            .try_send()
            .map_err(|_| stopped("not running"))?;
        match rx.recv_timeout(self.deadline) {
            Ok(result) => result,
            Err(RecvTimeoutError::Disconnected) => Err(stopped("stopped during the step")),
            // A stuck read or an actor gone without a word: give the step up; the actors are
            // replaced before the next one.
            Err(RecvTimeoutError::Timeout) => Err(StepError::Actor {
                actor: "driver".into(),
                why: format!(
                    "step {} did not finish within {} ms (the plan's step_deadline_ms)",
                    request.step,
                    self.deadline.as_millis()
                ),
            }),
        }
    }
}

fn open_storage(
    path: &Option<PathBuf>,
    plan: &ExecutionPlan,
) -> Result<Option<StorageFile>, StorageError> {
    path.as_deref()
        .map(|p| StorageFile::open(p, plan.storage.direct_io))
        .transpose()
}

#[allow(clippy::too_many_arguments)]
fn start_actors(
    scheduler: Scheduler,
    shared: &Arc<StepShared>,
    placed: &[PlacedGroup],
    group_hosts: &[usize],
    hosts: &[ComputeHost],
    storage_hosts: &[Host],
    plan: &ExecutionPlan,
    storage: Option<StorageFile>,
) -> Actors {
    let prepared_scheduler = prepare::<SchedulerActor>();
    let scheduler_ref = prepared_scheduler.actor_ref().clone();
    let mut groups = Vec::with_capacity(placed.len());
    let mut recipients = Vec::with_capacity(placed.len());
    for (i, group) in placed.iter().enumerate() {
        let host = &hosts[group_hosts[i]];
        let dense: Box<dyn DenseBackend + Send> = match group.kind {
            XpuKind::Cpu => Box::new(WholeMatmul),
            XpuKind::Npu => Box::new(ChunkedGemm {
                token_chunk: plan.dense.token_chunk as usize,
            }),
        };
        let core = GroupCore::new(
            XpuId(i as u8),
            group.name.clone(),
            Arc::clone(shared),
            Arc::clone(&host.pool),
            dense,
            GroupReplies {
                done: scheduler_ref.clone().recipient(),
                failed: scheduler_ref.clone().recipient(),
            },
        );
        let recipient = match group.kind {
            XpuKind::Cpu => {
                let r = spawn_on(&host.host, prepare::<CpuGroup>(), core);
                groups.push(GroupRef::Cpu(r.clone()));
                r.recipient::<Compute>()
            }
            XpuKind::Npu => {
                let r = spawn_on(&host.host, prepare::<Npu>(), core);
                groups.push(GroupRef::Npu(r.clone()));
                r.recipient::<Compute>()
            }
        };
        recipients.push((group.name.clone(), recipient));
    }
    let decode_group = plan
        .group_index(&plan.decode_on[0].group)
        .expect("validated plan");
    let scheduler_host = &hosts[group_hosts[decode_group]].host;
    let mut file = storage;
    let storage: Vec<(ActorRef<Storage>, QueuedLoads)> = storage_hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let queued = QueuedLoads::default();
            let actor = spawn_on(
                host,
                prepare::<Storage>(),
                StorageArgs {
                    file: file.take(),
                    shared: Some(Arc::clone(shared)),
                    scheduler: Some(scheduler_ref.clone().recipient()),
                    queued: queued.clone(),
                    failed: Some(scheduler_ref.clone().recipient()),
                    name: format!("storage{i}"),
                },
            );
            (actor, queued)
        })
        .collect();
    spawn_on(
        scheduler_host,
        prepared_scheduler,
        SchedulerArgs {
            scheduler,
            shared: Arc::clone(shared),
            groups: recipients,
            storage: storage.clone(),
        },
    );
    Actors {
        scheduler: scheduler_ref,
        groups,
        storage: storage.into_iter().map(|(actor, _)| actor).collect(),
    }
}

impl Driver for ActorDriver {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn rest(&self) {
        for host in &self.hosts {
            ClusterRunner::rest(&*host.pool);
        }
    }

    fn max_step_tokens(&self) -> usize {
        self.max_step_tokens
    }

    fn step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
    ) -> Result<(), StepError> {
        self.run_step(session, tokens, logits_from, false)
    }

    fn step_resident(&mut self, session: &mut Session, token: u32) -> Result<(), StepError> {
        self.run_step(session, &[token], 0, true)
    }

    fn step_many_sequences(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<(), StepError> {
        self.run_multi_step(sessions, tokens)
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }
}

impl Drop for ActorDriver {
    /// Clean shutdown: stop every actor, then join the hosts (and their pools' threads).
    fn drop(&mut self) {
        self.actors.kill();
        // Joins the compute hosts (and their pools); the storage host and the tokio runtime
        // follow as fields, in declaration order.
        self.hosts.clear();
    }
}
