//! What moving work between actors costs on this machine (for `conductor profile-hw`): the
//! simulator charges these for every message it models.

use crate::host::{Host, HostConfig, DEFAULT_SPIN};
use crate::pool::{PoolConfig, WorkerPool};
use conductor_runtime::exec::ClusterRunner;
use conductor_runtime::plan::MessagingProfile;
use conductor_runtime::quant::{activation_type, quantize_row, GgmlType, Kernels, MatRef};
use kameo::actor::{Actor, ActorRef, PreparedActor};
use kameo::error::Infallible;
use kameo::message::{Context, Message};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::{Duration, Instant};

/// Passes a ball back and forth; reports when the count runs out.
struct Echo {
    peer: Option<ActorRef<Echo>>,
    done: SyncSender<()>,
}

struct SetPeer(ActorRef<Echo>);
struct Ball(u32);

impl Actor for Echo {
    type Args = SyncSender<()>;
    type Error = Infallible;

    async fn on_start(done: SyncSender<()>, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(Echo { peer: None, done })
    }
}

impl Message<SetPeer> for Echo {
    type Reply = ();

    async fn handle(&mut self, msg: SetPeer, _: &mut Context<Self, ()>) {
        self.peer = Some(msg.0);
    }
}

impl Message<Ball> for Echo {
    type Reply = ();

    async fn handle(&mut self, Ball(left): Ball, _: &mut Context<Self, ()>) {
        match (&self.peer, left) {
            (Some(peer), 1..) => {
                let _ = peer.tell(Ball(left - 1)).try_send();
            }
            _ => {
                let _ = self.done.send(());
            }
        }
    }
}

fn echo_on(host: &Host, done: SyncSender<()>) -> ActorRef<Echo> {
    let prepared = PreparedActor::<Echo>::new(kameo::mailbox::unbounded());
    let r = prepared.actor_ref().clone();
    host.spawn(async move {
        let _ = prepared.run(done).await;
    });
    r
}

/// Nanoseconds per one-way message between two echo actors (`same_host`: one host thread).
fn ping_pong(tokio: &tokio::runtime::Handle, same_host: bool, messages: u32) -> f64 {
    let config = |name: &str| HostConfig {
        name: name.into(),
        cores: Vec::new(),
        spin: DEFAULT_SPIN,
    };
    let (a, ()) = Host::start(config("echo-a"), tokio.clone(), || ()).expect("host thread");
    let b = if same_host {
        None
    } else {
        Some(
            Host::start(config("echo-b"), tokio.clone(), || ())
                .expect("host thread")
                .0,
        )
    };
    let (done, finished) = sync_channel(4);
    let ra = echo_on(&a, done.clone());
    let rb = echo_on(b.as_ref().unwrap_or(&a), done);
    let _ = ra.tell(SetPeer(rb.clone())).try_send();
    let _ = rb.tell(SetPeer(ra.clone())).try_send();
    // Warm up, then measure.
    let _ = ra.tell(Ball(1000)).try_send();
    let _ = finished.recv();
    let start = Instant::now();
    let _ = ra.tell(Ball(messages)).try_send();
    let _ = finished.recv();
    let ns = start.elapsed().as_nanos() as f64 / f64::from(messages);
    ra.kill();
    rb.kill();
    ns
}

/// Nanoseconds from a message to a parked host until it answers, minus a spinning host's
/// answer time: what waking a parked thread adds.
fn wakeup(tokio: &tokio::runtime::Handle, rounds: u32, spinning_ns: f64) -> f64 {
    let config = HostConfig {
        name: "echo-parked".into(),
        cores: Vec::new(),
        spin: DEFAULT_SPIN,
    };
    let (host, ()) = Host::start(config, tokio.clone(), || ()).expect("host thread");
    let (done, finished) = sync_channel(1);
    let r = echo_on(&host, done);
    let mut samples = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        // Longer than the spin window: the host is parked when the message comes.
        std::thread::sleep(DEFAULT_SPIN * 4);
        let start = Instant::now();
        let _ = r.tell(Ball(0)).try_send();
        while finished.try_recv().is_err() {
            std::hint::spin_loop();
        }
        samples.push(start.elapsed().as_nanos() as f64);
    }
    r.kill();
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2] - 2.0 * spinning_ns).max(1.0)
}

/// Nanoseconds a phase on `threads` workers takes beyond its work shared perfectly: a decode
/// phase's worth of small clusters (4 per worker, each a one-head matvec, 64 rows of a 576-wide
/// Q4_1 matrix, in cache) on the pool, against the same clusters on one thread divided by the
/// thread count. Handing the job out, workers noticing it and joining them is what remains.
fn dispatch(threads: usize, rounds: u32) -> f64 {
    let kernels = Kernels::best();
    let (rows, cols) = (64, 576);
    let ty = GgmlType::Q4_1;
    let row_bytes = ty.bytes_for(cols as u64).expect("whole blocks") as usize;
    let mut weights = vec![0u8; rows * row_bytes];
    for (r, dst) in weights.chunks_exact_mut(row_bytes).enumerate() {
        let src: Vec<f32> = (0..cols)
            .map(|i| ((r * 7 + i * 13) % 17) as f32 / 8.0 - 1.0)
            .collect();
        quantize_row(ty, &src, dst).expect("a supported type");
    }
    let x: Vec<f32> = (0..cols).map(|i| (i % 11) as f32 / 5.0 - 1.0).collect();
    let mut act = vec![
        0u8;
        activation_type(ty)
            .bytes_for(cols as u64)
            .expect("whole blocks") as usize
    ];
    kernels.quantize_activations(ty, &x, &mut act);
    let clusters = 4 * threads;
    let mut buf = vec![0f32; clusters * rows];
    let mut time = |pool: &WorkerPool| {
        let start = Instant::now();
        for _ in 0..rounds {
            let mut outs: Vec<&mut [f32]> = buf.chunks_mut(rows).collect();
            pool.run(&mut outs, &|_, _, out| {
                let m = MatRef::new(ty, &weights, rows, cols).expect("valid geometry");
                kernels.matvec(m, 0..cols, &act, out);
            });
        }
        start.elapsed().as_nanos() as f64 / f64::from(rounds)
    };
    let one = time(&WorkerPool::new(PoolConfig::new(1)).expect("worker threads"));
    let many = time(&WorkerPool::new(PoolConfig::new(threads)).expect("worker threads"));
    many - one / threads as f64
}

/// Measures message, wake-up and dispatch costs on this machine (about a second).
pub fn measure_messaging() -> MessagingProfile {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("tokio runtime");
    let tokio = runtime.handle();
    let local = ping_pong(tokio, true, 200_000);
    let remote = ping_pong(tokio, false, 200_000);
    let wake = wakeup(tokio, 200, remote);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dispatch_ns = if threads > 1 {
        dispatch(threads, 5_000)
    } else {
        0.0
    };
    drop(runtime);
    std::thread::sleep(Duration::from_millis(1));
    MessagingProfile {
        local_message_ns: local,
        remote_message_ns: remote,
        wakeup_ns: wake,
        dispatch_ns: dispatch_ns.max(1.0),
    }
}
