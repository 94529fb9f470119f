//! The cores of this machine and their classes (big, mid, little).
//!
//! Linux tells core classes apart by `cpu_capacity` (ARM's relative performance, 1024 for the
//! fastest) and `cpufreq/cpuinfo_max_freq`. Cores with equal values form a class; classes are
//! named from the fastest down: one class is `all`, two are `big` and `little`, three are `big`,
//! `mid` and `little` (PowerInfer-2's phones), more are `class0`, `class1`, …

use conductor_runtime::plan::Topology;
use std::path::Path;

/// The cores this process may run on, with their classes.
pub fn detect_topology() -> Topology {
    let cores: Vec<u32> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id as u32)
        .collect();
    let cores = if cores.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        (0..n).collect()
    } else {
        cores
    };
    topology_from_sysfs(Path::new("/sys/devices/system/cpu"), &cores)
}

/// Reads `cpu_capacity` and `cpuinfo_max_freq` of `cores` under `root` (a sysfs cpu folder);
/// missing files count as equal.
pub fn topology_from_sysfs(root: &Path, cores: &[u32]) -> Topology {
    let read = |core: u32, file: &str| -> u64 {
        std::fs::read_to_string(root.join(format!("cpu{core}")).join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let keyed: Vec<(u32, (u64, u64))> = cores
        .iter()
        .map(|&c| {
            (
                c,
                (read(c, "cpu_capacity"), read(c, "cpufreq/cpuinfo_max_freq")),
            )
        })
        .collect();
    let mut keys: Vec<(u64, u64)> = keyed.iter().map(|(_, k)| *k).collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    keys.dedup();
    let name = |rank: usize| -> String {
        match (keys.len(), rank) {
            (1, _) => "all".into(),
            (2, 0) | (3, 0) => "big".into(),
            (2, 1) | (3, 2) => "little".into(),
            (3, 1) => "mid".into(),
            (_, r) => format!("class{r}"),
        }
    };
    let mut out: Vec<(u32, String)> = Vec::with_capacity(keyed.len());
    for (rank, key) in keys.iter().enumerate() {
        let mut ids: Vec<u32> = keyed
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(c, _)| *c)
            .collect();
        ids.sort_unstable();
        out.extend(ids.into_iter().map(|id| (id, name(rank))));
    }
    Topology { cores: out }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs(cores: &[(u32, u64, u64)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "conductor-sysfs-{}-{}",
            std::process::id(),
            cores.len()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for &(id, cap, freq) in cores {
            let dir = root.join(format!("cpu{id}/cpufreq"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                root.join(format!("cpu{id}/cpu_capacity")),
                format!("{cap}\n"),
            )
            .unwrap();
            std::fs::write(dir.join("cpuinfo_max_freq"), format!("{freq}\n")).unwrap();
        }
        root
    }

    #[test]
    fn a_phone_has_big_mid_and_little_cores() {
        // Snapdragon 8 Gen 3 as PowerInfer-2 describes it: 1 + 5 + 2 cores.
        let mut cores = vec![(0, 400, 2_200_000), (1, 400, 2_200_000)];
        cores.extend((2..7).map(|i| (i, 900, 3_000_000)));
        cores.push((7, 1024, 3_300_000));
        let root = fake_sysfs(&cores);
        let t = topology_from_sysfs(&root, &(0..8).collect::<Vec<_>>());
        assert_eq!(t.classes(), vec!["big", "mid", "little"]);
        assert_eq!(t.class_of(7), Some("big"));
        assert_eq!(t.class_of(3), Some("mid"));
        assert_eq!(t.class_of(1), Some("little"));
        assert_eq!(t.cores[0], (7, "big".to_string()));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn identical_cores_or_no_sysfs_make_one_class() {
        let t = topology_from_sysfs(Path::new("/nonexistent"), &[0, 1, 2]);
        assert_eq!(t.classes(), vec!["all"]);
        assert_eq!(t.cores.len(), 3);
        let detected = detect_topology();
        assert!(!detected.cores.is_empty());
    }
}
