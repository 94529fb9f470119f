//! Where a plan's processor groups run: cores of a machine, real (detected by the actors) or
//! described by a hardware profile (simulated).

use super::{CoreSet, ExecutionPlan, GroupPlan, HardwareProfile, Share, XpuKind};

/// The cores of a machine and their classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// `(core id, class name)`, ordered by class (fastest first), then id.
    pub cores: Vec<(u32, String)>,
}

/// A plan group placed on cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedGroup {
    pub name: String,
    pub kind: XpuKind,
    /// The group's cores; worker `i` runs on `cores[i % cores.len()]`.
    pub cores: Vec<u32>,
    pub threads: u32,
}

/// A plan that does not fit the machine. Each error names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("plan field `{field}`: this machine has no core class `{class}` (classes: {known})")]
    UnknownClass {
        field: String,
        class: String,
        known: String,
    },
    #[error("plan field `{field}`: core {core} does not exist (cores: {known})")]
    UnknownCore {
        field: String,
        core: u32,
        known: String,
    },
    #[error("plan field `{field}` lists no cores")]
    NoCores { field: String },
    #[error("-t must be at least 1")]
    ZeroThreads,
}

impl Topology {
    /// The machine a profile describes.
    pub fn of_profile(profile: &HardwareProfile) -> Topology {
        let mut cores = Vec::new();
        for class in &profile.core_classes {
            for &id in &class.cores {
                cores.push((id, class.name.clone()));
            }
        }
        Topology { cores }
    }

    /// `n` identical cores of class `all` (tests, or when nothing can be detected).
    pub fn uniform(n: u32) -> Topology {
        Topology {
            cores: (0..n.max(1)).map(|id| (id, "all".to_string())).collect(),
        }
    }

    /// Class names, fastest first.
    pub fn classes(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (_, class) in &self.cores {
            if !out.contains(&class.as_str()) {
                out.push(class);
            }
        }
        out
    }

    /// The class of core `id`.
    pub fn class_of(&self, id: u32) -> Option<&str> {
        self.cores
            .iter()
            .find(|(c, _)| *c == id)
            .map(|(_, class)| class.as_str())
    }

    fn ids(&self) -> String {
        let ids: Vec<String> = self.cores.iter().map(|(id, _)| id.to_string()).collect();
        ids.join(", ")
    }

    /// Places every group of `plan`. `threads` (the command line's `-t`) sets the threads of
    /// groups whose plan leaves them at 0; without it such a group gets one thread per core.
    pub fn place(
        &self,
        plan: &ExecutionPlan,
        threads: Option<u32>,
    ) -> Result<Vec<PlacedGroup>, PlacementError> {
        if threads == Some(0) {
            return Err(PlacementError::ZeroThreads);
        }
        plan.groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let field = format!("groups[{i}].cores");
                let cores: Vec<u32> = match &g.cores {
                    CoreSet::Class(class) if class == "all" => {
                        self.cores.iter().map(|(id, _)| *id).collect()
                    }
                    CoreSet::Class(class) => {
                        let cores: Vec<u32> = self
                            .cores
                            .iter()
                            .filter(|(_, c)| c == class)
                            .map(|(id, _)| *id)
                            .collect();
                        if cores.is_empty() {
                            return Err(PlacementError::UnknownClass {
                                field,
                                class: class.clone(),
                                known: self.classes().join(", "),
                            });
                        }
                        cores
                    }
                    CoreSet::Ids(ids) => {
                        if let Some(&core) = ids.iter().find(|id| self.class_of(**id).is_none()) {
                            return Err(PlacementError::UnknownCore {
                                field,
                                core,
                                known: self.ids(),
                            });
                        }
                        ids.clone()
                    }
                };
                if cores.is_empty() {
                    return Err(PlacementError::NoCores { field });
                }
                let threads = match (g.threads, threads) {
                    (0, Some(t)) => t,
                    (0, None) => cores.len() as u32,
                    (t, _) => t,
                };
                Ok(PlacedGroup {
                    name: g.name.clone(),
                    kind: g.kind,
                    cores,
                    threads,
                })
            })
            .collect()
    }
}

impl ExecutionPlan {
    /// The default plan fitted to a machine: one CPU group per core class sharing decode in
    /// proportion to its cores, and the dense backend over every core for prefill. On a
    /// machine with one class this is [`ExecutionPlan::default`].
    pub fn for_topology(topology: &Topology) -> ExecutionPlan {
        let mut plan = ExecutionPlan::default();
        let classes = topology.classes();
        if classes.len() <= 1 {
            return plan;
        }
        let npu = plan
            .groups
            .pop()
            .expect("the default plan has an npu group");
        plan.groups.clear();
        plan.decode_on.clear();
        for class in classes {
            plan.groups.push(GroupPlan {
                name: class.to_string(),
                kind: XpuKind::Cpu,
                cores: CoreSet::Class(class.to_string()),
                threads: 0,
            });
            plan.decode_on.push(Share {
                group: class.to_string(),
                weight: topology.cores.iter().filter(|(_, c)| c == class).count() as u32,
            });
        }
        plan.groups.push(npu);
        plan
    }
}

/// Which host thread each placed group runs on: groups on the same cores share one host (and
/// its worker threads), so handing work between them is a local message, not a wake-up of
/// another thread. Returns the host index of each group, hosts numbered in order of first use.
pub fn hosts_of(groups: &[PlacedGroup]) -> Vec<usize> {
    let mut host_cores: Vec<&[u32]> = Vec::new();
    groups
        .iter()
        .map(|g| {
            host_cores
                .iter()
                .position(|c| *c == g.cores.as_slice())
                .unwrap_or_else(|| {
                    host_cores.push(&g.cores);
                    host_cores.len() - 1
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::GroupPlan;

    fn phone() -> Topology {
        let mut cores = vec![(7, "big".to_string())];
        cores.extend((2..7).map(|id| (id, "mid".to_string())));
        cores.extend((0..2).map(|id| (id, "little".to_string())));
        Topology { cores }
    }

    #[test]
    fn groups_are_placed_by_class_ids_or_all() {
        let mut plan = ExecutionPlan::default();
        plan.groups.push(GroupPlan {
            name: "little".into(),
            kind: XpuKind::Cpu,
            cores: CoreSet::Class("little".into()),
            threads: 0,
        });
        plan.groups.push(GroupPlan {
            name: "two".into(),
            kind: XpuKind::Cpu,
            cores: CoreSet::Ids(vec![7, 3]),
            threads: 1,
        });
        let placed = phone().place(&plan, None).unwrap();
        assert_eq!(placed[0].cores, vec![7, 2, 3, 4, 5, 6, 0, 1]);
        assert_eq!(placed[0].threads, 8);
        assert_eq!(placed[2].cores, vec![0, 1]);
        assert_eq!(placed[2].threads, 2);
        assert_eq!(placed[3].cores, vec![7, 3]);
        assert_eq!(placed[3].threads, 1);
        let placed = phone().place(&plan, Some(3)).unwrap();
        assert_eq!(placed[0].threads, 3);
        assert_eq!(
            placed[3].threads, 1,
            "a plan's own thread count wins over -t"
        );
    }

    #[test]
    fn the_fitted_plan_has_a_cpu_group_per_core_class() {
        assert_eq!(
            ExecutionPlan::for_topology(&Topology::uniform(4)),
            ExecutionPlan::default()
        );
        let plan = ExecutionPlan::for_topology(&phone());
        plan.validate().unwrap();
        let names: Vec<&str> = plan.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, vec!["big", "mid", "little", "npu"]);
        let weights: Vec<u32> = plan.decode_on.iter().map(|s| s.weight).collect();
        assert_eq!(weights, vec![1, 5, 2]);
        let placed = phone().place(&plan, None).unwrap();
        assert_eq!(placed[1].cores, vec![2, 3, 4, 5, 6]);
        assert_eq!(hosts_of(&placed), vec![0, 1, 2, 3]);
    }

    #[test]
    fn groups_on_the_same_cores_share_a_host() {
        let mut plan = ExecutionPlan::default();
        plan.groups.push(GroupPlan {
            name: "little".into(),
            kind: XpuKind::Cpu,
            cores: CoreSet::Class("little".into()),
            threads: 0,
        });
        let placed = phone().place(&plan, None).unwrap();
        assert_eq!(hosts_of(&placed), vec![0, 0, 1]);
    }

    #[test]
    fn groups_that_do_not_fit_the_machine_name_the_field() {
        let mut plan = ExecutionPlan::default();
        plan.groups[1].cores = CoreSet::Class("big".into());
        let err = Topology::uniform(2).place(&plan, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "plan field `groups[1].cores`: this machine has no core class `big` (classes: all)"
        );
        plan.groups[1].cores = CoreSet::Ids(vec![0, 9]);
        let err = Topology::uniform(2).place(&plan, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "plan field `groups[1].cores`: core 9 does not exist (cores: 0, 1)"
        );
        plan.groups[1].cores = CoreSet::Ids(vec![]);
        assert!(matches!(
            Topology::uniform(2).place(&plan, None),
            Err(PlacementError::NoCores { .. })
        ));
        assert_eq!(
            Topology::uniform(2).place(&ExecutionPlan::default(), Some(0)),
            Err(PlacementError::ZeroThreads)
        );
    }
}
