//! Sorting: argsort (ascending or descending, stable) and top_k.

use crate::error::Result;
use crate::reference::{Dense, NodeRef};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOrder {
    Asc,
    Desc,
}

pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
