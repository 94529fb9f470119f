//! Conductor's test harness: what the workspace's tests and experiments share and the products
//! (the `conductor` library, the server, the CLI) do not ship.

pub mod faults;
