//! The seeded fault harness's runner (`conductor::faults`; docs/reliability.md): S seeds × 64
//! decode steps on the inline driver, the actor driver and the simulator, with the count of
//! faults injected of each kind, wrong outputs, hangs and leaks.
//!
//! ```text
//! cargo run --release --example fault_injection -- [--seeds 1000] [--first 0]
//!     [--drivers inline,actors,simulator] [--store STORE.gguf --memory 50%]
//!     [--io-engine pread|uring] [--io-threads N] [--dir DIR]
//! ```
//!
//! By default the model is a small synthetic store (random weights) made in `--dir`
//! (default: a temporary directory), with a cache of half its streamed units; `--store` runs a
//! neuron store under `--memory` instead (the budget split `--memory` gives the engine). Reads
//! go through `pread` from one I/O thread unless `--io-engine`/`--io-threads` say otherwise
//! (the simulator models neither). Exits
//! 1 if any seed broke an invariant, after printing each such seed with its schedule (run it
//! alone again with `--first SEED --seeds 1`).

use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::plan::IoEngine;
use conductor_testkit::faults::{
    quiet_injected_panics, sim_profile, Fixture, Schedule, Totals, Watchdog, Which,
};
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let mut seeds = 1000u64;
    let mut first = 0u64;
    let mut drivers = vec![Which::Inline, Which::Actors, Which::Simulator];
    let mut store: Option<PathBuf> = None;
    let mut memory = MemoryBudget::PercentOfModel(50.0);
    let mut engine = IoEngine::Pread;
    let mut io_threads = 1u32;
    let mut dir = std::env::temp_dir().join(format!("conductor-faults-{}", std::process::id()));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--seeds" => seeds = value().parse().unwrap_or_else(|_| usage("--seeds N")),
            "--first" => first = value().parse().unwrap_or_else(|_| usage("--first SEED")),
            "--store" => store = Some(PathBuf::from(value())),
            "--memory" => memory = value().parse().unwrap_or_else(|e: String| usage(&e)),
            "--dir" => dir = PathBuf::from(value()),
            "--io-engine" => {
                engine = match value().as_str() {
                    "pread" => IoEngine::Pread,
                    "uring" => IoEngine::Uring,
                    e => usage(&format!("unknown I/O engine `{e}`")),
                }
            }
            "--io-threads" => {
                io_threads = value()
                    .parse()
                    .ok()
                    .filter(|&n| (1..=16).contains(&n))
                    .unwrap_or_else(|| usage("--io-threads N (1 to 16)"))
            }
            "--drivers" => {
                drivers = value()
                    .split(',')
                    .map(|d| match d {
                        "inline" => Which::Inline,
                        "actors" => Which::Actors,
                        "simulator" => Which::Simulator,
                        _ => usage(&format!("unknown driver `{d}`")),
                    })
                    .collect()
            }
            _ => usage(&format!("unknown argument `{a}`")),
        }
    }
    let started = Instant::now();
    let fixture = match &store {
        Some(path) => Fixture::store(path, memory),
        None => Fixture::synthetic(&dir),
    }
    .and_then(|f| match (engine, io_threads) {
        (IoEngine::Pread, 1) => Ok(f),
        _ => f.with_storage(engine, io_threads),
    })
    .unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    println!("model: {}", fixture.describe);
    println!(
        "fault-free run: a {}-token prompt and {} decode steps, {} reads of the store in all; deadline {} ms",
        fixture.prompt.len(),
        fixture.reads.len() - 1,
        fixture.reads.iter().map(|&r| u64::from(r)).sum::<u64>(),
        fixture.plan.step_deadline_ms
    );
    let watchdog = Watchdog::new();
    quiet_injected_panics();
    let profile = sim_profile();
    let mut totals: Vec<Totals> = drivers.iter().map(|_| Totals::default()).collect();
    let mut times = vec![0f64; drivers.len()];
    for seed in first..first + seeds {
        let schedule = Schedule::from_seed(seed, &fixture.reads);
        for (i, &which) in drivers.iter().enumerate() {
            let t = Instant::now();
            let report = match which {
                Which::Simulator => fixture.simulate(&profile, &schedule),
                _ => fixture.run(which, &schedule, &watchdog),
            };
            times[i] += t.elapsed().as_secs_f64();
            if !report.ok() {
                println!(
                    "FAILED: {} driver: {}\n{schedule}",
                    which.name(),
                    report.violations.join("; ")
                );
            }
            totals[i].add(&report);
        }
        let done = seed - first + 1;
        if done.is_multiple_of(100) {
            println!("{done} seeds, {:.0} s", started.elapsed().as_secs_f64());
        }
    }
    let mut bad = false;
    for ((which, t), secs) in drivers.iter().zip(&totals).zip(&times) {
        println!("{} ({secs:.0} s): {}", which.name(), t.summary());
        bad |= !t.failing.is_empty();
        for (seed, why) in &t.failing {
            println!("  failing seed {seed}: {why}");
        }
    }
    println!(
        "seeds {first}..{}: {:.0} s in all",
        first + seeds,
        started.elapsed().as_secs_f64()
    );
    if store.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::process::exit(i32::from(bad));
}

fn usage(why: &str) -> ! {
    eprintln!(
        "error: {why}\nusage: fault_injection [--seeds N] [--first SEED] [--drivers inline,actors,simulator] [--store STORE.gguf --memory 50%] [--io-engine pread|uring] [--io-threads N] [--dir DIR]"
    );
    std::process::exit(2)
}
