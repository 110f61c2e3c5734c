//! The builders of this crate: [`ValueBuilder`] makes a [`Value`](crate::Value) tree, [`GraphBuilder`] an
//! arena [`Graph`] with one node per object (the reference the other builders are checked against).

mod graph;
mod value;

pub use graph::{Graph, GraphBuilder, Item, Node};
pub use value::ValueBuilder;
