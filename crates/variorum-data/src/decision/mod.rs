//! Data of the Decision Transformer (Chen et al. 2021): an environment written in the project
//! (the key-to-door gridworld), offline trajectories from behaviour policies of mixed quality,
//! and the windows of steps training reads.

mod key_door;
mod trajectories;
mod windows;

pub use key_door::{ACTIONS, KeyDoor, KeyDoorConfig, Step};
pub use trajectories::{
    ActionSpace, Actions, EnvConfig, FORMAT, GenerateConfig, LayoutSplit, Trajectory, TrajectoryHeader, TrajectorySet,
    generate, layout_seed,
};
pub use windows::{BatchActions, StepBatch, StepWindows};
