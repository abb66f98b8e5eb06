//! High availability: carrying out an id's [`HaPolicy`] when the path of a connected id
//! changes under it (`migrate` to the alternate path, `rails` between two devices, `lap`
//! for LAP/APR). The policy itself is a value (`ha_policy.rs`). See docs/CM.md, "Policies".

pub(crate) mod lap;
pub(crate) mod migrate;
pub(crate) mod rails;
