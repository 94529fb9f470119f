//! The processor-group actors: [`CpuGroup`] (decode's sparse work on a core class) and [`Npu`]
//! (the dense backend, prefill's role).
//!
//! A group receives one [`Compute`] message per phase — a contiguous range of clusters — and
//! splits it among its worker threads without further messages (the host thread is worker 0).
//! When done it tells the scheduler. Supervision: a panic inside a compute is caught by kameo
//! and reported to the scheduler by `on_panic`, which fails the step in flight; the actor keeps
//! running, its state intact, for the next step. An actor that stops (killed, or its host gone)
//! reports that from its destructor, so the scheduler never waits for work that will not come.

use crate::pool::WorkerPool;
use crate::protocol::{ClusterDone, GroupFailed, GroupReplies};
pub use crate::protocol::{Compute, InjectPanic};
use crate::step::{lock, read, StepShared};
use conductor_runtime::exec::DenseBackend;
use conductor_runtime::schedule::{ClusterWork, XpuId};
use kameo::actor::{Actor, ActorRef, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible, PanicError};
use kameo::message::{Context, Message};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What both kinds of group are made of.
pub struct GroupCore {
    pub(crate) xpu: XpuId,
    pub(crate) name: String,
    pub(crate) shared: Arc<StepShared>,
    pub(crate) pool: Arc<WorkerPool>,
    pub(crate) dense: Box<dyn DenseBackend + Send>,
    pub(crate) scheduler: GroupReplies,
    /// The work being computed, for the panic report.
    current: Option<ClusterWork>,
    panic_next: bool,
}

impl GroupCore {
    pub(crate) fn new(
        xpu: XpuId,
        name: String,
        shared: Arc<StepShared>,
        pool: Arc<WorkerPool>,
        dense: Box<dyn DenseBackend + Send>,
        scheduler: GroupReplies,
    ) -> GroupCore {
        GroupCore {
            xpu,
            name,
            shared,
            pool,
            dense,
            scheduler,
            current: None,
            panic_next: false,
        }
    }

    fn compute(&mut self, work: ClusterWork) {
        let shared = Arc::clone(&self.shared);
        let timed = shared.recording.load(Ordering::Relaxed);
        let started_ns = if timed { shared.now_ns() } else { 0 };
        let started = std::time::Instant::now();
        let decode = work.shape == conductor_runtime::schedule::StepShape::Decode;
        {
            let state = read(&shared.state);
            if state.request().step != work.step {
                // Left over from a step that failed: its inputs are gone; report and move on.
                drop(state);
                self.done(work, 0, 0);
                return;
            }
            let kv = read(&shared.kv);
            let mut out = lock(&shared.outputs[usize::from(self.xpu.0)]);
            self.current = Some(work.clone());
            if std::mem::take(&mut self.panic_next) {
                panic!("injected fault in group `{}`", self.name);
            }
            state.compute(
                &shared.model,
                &kv,
                shared.program(work.shape),
                &work,
                &*self.pool,
                &*self.dense,
                &mut out,
            );
            self.current = None;
        }
        if decode {
            let ns = started.elapsed().as_nanos() as u64;
            shared
                .counters
                .decode_compute_ns
                .fetch_add(ns, Ordering::Relaxed);
        }
        let finished_ns = if timed { shared.now_ns() } else { 0 };
        self.done(work, started_ns, finished_ns);
    }

    fn done(&self, work: ClusterWork, started_ns: u64, finished_ns: u64) {
        // If the scheduler is gone the driver already sees its reply channel closed.
        let _ = self
            .scheduler
            .done
            .tell(ClusterDone {
                xpu: self.xpu,
                work,
                started_ns,
                finished_ns,
            })
            .try_send();
    }

    fn report(&mut self, why: String) {
        let step = self.current.take().map(|w| w.step);
        let _ = self
            .scheduler
            .failed
            .tell(GroupFailed {
                xpu: self.xpu,
                step,
                why,
            })
            .try_send();
    }
}

impl Drop for GroupCore {
    fn drop(&mut self) {
        self.report(format!("group `{}` stopped", self.name));
    }
}

fn describe(err: &PanicError) -> String {
    err.with_str(|s| format!("panicked: {s}"))
        .unwrap_or_else(|| format!("{err:?}"))
}

/// Defines a group actor around [`GroupCore`]: the two kinds differ only in the dense backend
/// they are built with and in their names in traces.
macro_rules! group_actor {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name(pub(crate) GroupCore);

        impl Actor for $name {
            type Args = GroupCore;
            type Error = Infallible;

            async fn on_start(core: GroupCore, _: ActorRef<Self>) -> Result<Self, Infallible> {
                Ok($name(core))
            }

            async fn on_panic(
                &mut self,
                _: WeakActorRef<Self>,
                err: PanicError,
            ) -> Result<ControlFlow<ActorStopReason>, Infallible> {
                self.0.report(describe(&err));
                Ok(ControlFlow::Continue(()))
            }
        }

        impl Message<Compute> for $name {
            type Reply = ();

            async fn handle(&mut self, msg: Compute, _: &mut Context<Self, ()>) {
                self.0.compute(msg.0);
            }
        }

        impl Message<InjectPanic> for $name {
            type Reply = ();

            async fn handle(&mut self, _: InjectPanic, _: &mut Context<Self, ()>) {
                self.0.panic_next = true;
            }
        }
    };
}

group_actor!(
    /// CPU cores of one class computing clusters with the quantized kernels.
    CpuGroup
);

group_actor!(
    /// The dense backend: fixed-shape launches (here a chunked int8 GEMM on CPU cores).
    Npu
);
